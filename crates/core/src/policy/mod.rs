//! The scaling policy (ConfigMap `kube-system/gpu-node-autoscaler-policy`, key `policy.yaml`):
//! schema, defaults and strict validation with `FILE:LINE:COL` errors.

pub mod cron;
pub mod duration;
pub mod source_map;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use gpu_node_autoscaler_provider::policy::{FieldError, PathKey, PoolFacts, PoolSection};
pub use gpu_node_autoscaler_provider::policy::{NameOnly, ProviderPolicy};
use gpu_node_autoscaler_provider::CapacityType;
use serde::Deserialize;
use serde_json::Value;

use crate::model::constraints::{Effect, Taint};
use crate::model::quantity::parse_quantity;
use crate::model::{gpu, labels};
use source_map::{display_path, path_from_serde, PathSeg, SourceMap};

pub const API_VERSION: &str = "gpu-node-autoscaler.io/v1alpha1";
pub const KIND: &str = "ScalingPolicy";
/// The provider of a pool that names none.
pub const DEFAULT_PROVIDER: &str = "aws";

/// The providers [`parse_policy`] knows when its caller names none (the simulator's, the
/// benchmarks'): every provider by name, their pools' sections accepted as written. A program
/// that builds providers passes its registry to [`parse_policy_with`] instead, so that their
/// sections are checked.
pub static NAMES_ONLY: [&dyn ProviderPolicy; 4] = [
    &NameOnly::with_section("aws", "aws"),
    &NameOnly::with_section("alibaba", "alibaba"),
    &NameOnly::with_section("kwok", "kwok"),
    &NameOnly::new("memory"),
];

/// Defaults, in one place so docs and code agree.
pub mod defaults {
    use std::time::Duration;
    pub const BATCH_IDLE: Duration = Duration::from_secs(1);
    pub const BATCH_MAX: Duration = Duration::from_secs(10);
    pub const MAX_NODE_PROVISION_TIME: Duration = Duration::from_secs(15 * 60);
    pub const INSUFFICIENT_CAPACITY_TTL: Duration = Duration::from_secs(3 * 60);
    pub const MAX_CONCURRENT_DRAINS: u32 = 10;
    pub const SPOT_PRICE_RATIO: f64 = 0.4;
    pub const COOLDOWN_AFTER_SCALE_UP: Duration = Duration::from_secs(10 * 60);
    pub const UNNEEDED_TIME: Duration = Duration::from_secs(10 * 60);
    pub const UTILIZATION_THRESHOLD: f64 = 0.5;
    pub const BACKOFF_AFTER_FAILURE: Duration = Duration::from_secs(3 * 60);
    pub const RESERVED_CPU_MILLI: i64 = 200;
    pub const RESERVED_MEMORY: i64 = 1 << 30;
    pub const MAX_PODS: u32 = 110;
    /// How long before a Capacity Block ends its nodes are replaced and drained.
    pub const CAPACITY_BLOCK_DRAIN_LEAD: Duration = Duration::from_secs(30 * 60);
    pub const SHARED_CORE_PERCENTAGE: u32 = 100;
    /// EKS node monitoring agent: `AcceleratedHardwareReady=False` (Karpenter repairs after 10m).
    pub const HEALTH_CONDITION: &str = "AcceleratedHardwareReady";
    pub const HEALTH_GRACE: Duration = Duration::from_secs(10 * 60);
    pub const MISSING_GPUS_GRACE: Duration = Duration::from_secs(10 * 60);
    pub const MAX_REPLACING_SHARE: f64 = 0.2;
    /// XIDs after which a GPU needs a reset or replacement: double-bit ECC (48), page
    /// retirement / row remapping (63, 64), NVLink (74), fallen off the bus (79), contained and
    /// uncontained ECC (94, 95).
    pub const XID_CODES: &[u32] = &[48, 63, 64, 74, 79, 94, 95];
    pub const XID_GRACE: Duration = Duration::from_secs(2 * 60);
    pub const GPU_METRICS_INTERVAL: Duration = Duration::from_secs(30);
    /// Consolidation: how long every pod of a node must have run before it is repacked, how
    /// often a pool is looked at, the least saving worth a move, how many nodes one move
    /// replaces, and the work a moved pod is assumed to lose.
    pub const CONSOLIDATE_AFTER: Duration = Duration::from_secs(30 * 60);
    pub const CONSOLIDATION_INTERVAL: Duration = Duration::from_secs(5 * 60);
    pub const CONSOLIDATION_MIN_SAVING: f64 = 0.1;
    pub const CONSOLIDATION_MAX_NODES: u32 = 8;
    pub const CONSOLIDATION_RESTART_COST: Duration = Duration::from_secs(10 * 60);
    pub const GPU_METRICS_NODE_LABEL: &str = "Hostname";
    /// Taints an interruption handler sets on a node about to be taken back (the AWS Node
    /// Termination Handler's, in its queue and IMDS modes).
    pub const INTERRUPTION_TAINTS: [&str; 3] = [
        "aws-node-termination-handler/spot-itn",
        "aws-node-termination-handler/scheduled-maintenance",
        "aws-node-termination-handler/asg-lifecycle-termination",
    ];
}

/// A validated policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    pub cluster_name: String,
    pub region: Option<String>,
    pub limits: Limits,
    pub batching: Batching,
    pub max_node_provision_time: Duration,
    pub insufficient_capacity_ttl: Duration,
    pub max_concurrent_drains: u32,
    /// What becomes of the nodes and instances of pools no longer in the policy.
    pub orphans: Orphans,
    /// Spot price as a fraction of on-demand where the catalog has no spot price.
    pub spot_price_ratio: f64,
    /// Taint keys that say a node is about to be taken back (a spot interruption notice, a
    /// scheduled retirement): its replacement is launched and it is drained at once.
    pub interruption_taints: Vec<String>,
    /// Node conditions an interruption handler sets on a node about to be taken back (as
    /// `interruptionTaints`, for handlers that report a condition rather than a taint).
    pub interruption_conditions: Vec<InterruptionCondition>,
    /// URL of the SQS queue EventBridge delivers EC2 interruption and maintenance notices to.
    pub interruption_queue: Option<String>,
    /// Where dcgm-exporter's metrics are read from, when set.
    pub gpu_metrics: Option<GpuMetrics>,
    pub pools: Vec<Pool>,
    /// Where parts of the policy are written, for errors found once the catalog is known.
    pub positions: Positions,
}

/// Where a part of the policy is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    pub line: usize,
    pub col: usize,
    /// As errors show it: `pools[2].migLayout["1g.5gb"]`.
    pub path: String,
}

impl Written {
    /// An error there.
    pub fn error(&self, message: impl fmt::Display) -> PolicyError {
        PolicyError {
            line: self.line,
            col: self.col,
            path: self.path.clone(),
            message: format!("{}: {message}", self.path),
        }
    }
}

/// Where the parts of a policy checked against the catalog are written. Not part of what the
/// policy says: two policies that differ only in their layout on the page are equal.
#[derive(Clone, Debug, Default)]
pub struct Positions {
    /// Each MIG pool's `migLayout` (by the pool's index; `None`) and its profiles
    /// (`Some(profile)`).
    pub mig_layouts: BTreeMap<(usize, Option<String>), Written>,
}

impl PartialEq for Positions {
    fn eq(&self, _: &Positions) -> bool {
        true
    }
}

/// A Node condition that says the node is about to be taken back.
#[derive(Clone, Debug, PartialEq)]
pub struct InterruptionCondition {
    pub type_: String,
    /// The status that means it (`True`, `False` or `Unknown`).
    pub status: String,
}

/// A Prometheus that scrapes dcgm-exporter: its XID series are a health signal.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuMetrics {
    /// Base URL of the Prometheus HTTP API (`http://prometheus.monitoring:9090`).
    pub prometheus_url: String,
    /// Label matchers added to the query (`job="dcgm-exporter"`), empty for none.
    pub selector: String,
    /// The series label that holds the Node's name.
    pub node_label: String,
    /// How often the XID series are read.
    pub interval: Duration,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Limits {
    pub max_gpus: Option<u32>,
    pub max_nodes: Option<u32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Batching {
    pub idle: Duration,
    pub max: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    pub name: String,
    pub provider: String,
    /// Explicit instance types; `None` means "every catalog type meeting `requirements`".
    pub instance_types: Option<Vec<String>>,
    pub requirements: Option<Requirements>,
    pub zones: Vec<String>,
    /// Preference order, e.g. `[spot, on-demand]`.
    pub capacity_types: Vec<CapacityType>,
    pub min_nodes: u32,
    pub max_nodes: u32,
    pub max_gpus: Option<u32>,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// Taints a new node registers with (kubelet `--register-with-taints`, EKS `nodeadm`) so
    /// that no pod lands before the node is registered in its pool; the controller removes them
    /// then. Not part of the node's shape: pods need not tolerate them.
    pub startup_taints: Vec<Taint>,
    /// Existing nodes of other origin (an EKS managed node group, an ACK node pool) that belong
    /// to this pool: every node carrying all these labels and no pool label. They count as the
    /// pool's capacity; one is scaled down only if its instance carries our tags, otherwise it
    /// is only reported.
    pub node_selector: BTreeMap<String, String>,
    pub gpu_mode: GpuMode,
    pub prices: BTreeMap<String, PriceOverride>,
    pub reserved_cpu_milli: i64,
    pub reserved_memory: i64,
    pub max_pods: u32,
    pub priority: i32,
    pub scale_down: ScaleDown,
    pub consolidation: Consolidation,
    pub health: Health,
    /// Node lifecycle: expiry, the drain grace of drift and expiry, disruption budgets.
    pub disruption: Disruption,
    /// Whether a rebalance recommendation (elevated spot interruption risk) replaces a node.
    pub replace_on_rebalance: bool,
    /// How long a pending pod waits for spot capacity before on-demand is launched for it
    /// (zero: on-demand is in every scale-up's fallback list at once).
    pub spot_max_wait: Duration,
    /// The pool's section of its provider (`aws:`, `alibaba:`), as written: the provider checked
    /// it ([`ProviderPolicy::validate_pool`]) and reads it when it is built.
    pub settings: Option<Value>,
    /// The pool's GPUs are published through Dynamic Resource Allocation (`dra:`): its nodes run
    /// a DRA driver instead of the device plugin, and pods claim them with ResourceClaims.
    pub dra: Option<DraPool>,
    /// The capacity reservations the pool launches into (`capacityReservations`), with
    /// `reserved` in `capacity_types`; empty for none.
    pub capacity_reservations: Vec<ReservationSelector>,
    /// An empty node in a reservation stays (`keepReservedWarm`) instead of being removed to
    /// free the reservation for other consumers.
    pub keep_reserved_warm: bool,
    /// How long before a Capacity Block ends its nodes are replaced and drained
    /// (`capacityBlockDrainLead`).
    pub capacity_block_drain_lead: Duration,
    /// How long a pod planned onto the pool is expected to run (`expectedRunTime`), where the
    /// pod does not say (`gpu-node-autoscaler.io/expected-run-time`): such a pod is not planned
    /// onto a Capacity Block that ends before it would when another offering can take it.
    pub expected_run_time: Option<Duration>,
    /// The pool's provider section says its Nodes' shape comes from the cloud (its Auto Scaling
    /// groups' templates): `instanceTypes` and `requirements` may be left out, and fields the
    /// policy leaves out are filled in from [`Pool::cloud_templates`]
    /// ([`Policy::with_cloud_templates`]).
    pub templates_from_cloud: bool,
    /// What the cloud said its groups' Nodes look like, in the pool's order of preference (empty
    /// until [`Policy::with_cloud_templates`]).
    pub cloud_templates: Vec<gpu_node_autoscaler_provider::GroupTemplate>,
}

/// One entry of a pool's `capacityReservations`: a reservation by id, or every reservation
/// carrying all the given tags.
#[derive(Clone, Debug, PartialEq)]
pub enum ReservationSelector {
    Id(String),
    Tags(BTreeMap<String, String>),
}

impl ReservationSelector {
    pub fn matches(&self, r: &gpu_node_autoscaler_provider::Reservation) -> bool {
        match self {
            ReservationSelector::Id(id) => &r.id == id,
            ReservationSelector::Tags(tags) => tags.iter().all(|(k, v)| r.tags.get(k) == Some(v)),
        }
    }
}

impl Pool {
    /// Whether the pool may launch into reservation `r` (`reserved` in its capacity types and a
    /// selector matching it).
    pub fn selects_reservation(&self, r: &gpu_node_autoscaler_provider::Reservation) -> bool {
        self.capacity_types.contains(&CapacityType::Reserved)
            && self.capacity_reservations.iter().any(|s| s.matches(r))
    }
}

/// The account's reservations as the pools of `provider` select them (`check-policy
/// --provider`): one line per pool and reservation selected (its type, instance type, zone,
/// total and available count, start and end), and the problems: a selector that matches no
/// reservation of the account, a reservation of an instance type or zone the pool does not
/// launch.
pub fn reservation_report(
    policy: &Policy,
    provider: &str,
    reservations: &[gpu_node_autoscaler_provider::Reservation],
) -> (Vec<String>, Vec<String>) {
    let when = |ms: Option<i64>, none: &str| {
        ms.map_or(none.to_string(), |t| crate::model::Time(t).to_rfc3339())
    };
    let mut lines = Vec::new();
    let mut problems = Vec::new();
    for p in policy
        .pools
        .iter()
        .filter(|p| p.provider == provider && p.capacity_types.contains(&CapacityType::Reserved))
    {
        for (i, sel) in p.capacity_reservations.iter().enumerate() {
            let found: Vec<_> = reservations.iter().filter(|r| sel.matches(r)).collect();
            if found.is_empty() {
                let what = match sel {
                    ReservationSelector::Id(id) => format!("no capacity reservation {id}"),
                    ReservationSelector::Tags(tags) => format!(
                        "no capacity reservation with the tags {}",
                        tags.iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                problems.push(format!(
                    "pool {}: capacityReservations[{i}]: {what} in the account",
                    p.name
                ));
            }
            for r in found {
                lines.push(format!(
                    "pool {}: reservation {} ({}): {} in {}, {}/{} available, from {} until {}",
                    p.name,
                    r.id,
                    r.kind.as_str(),
                    r.instance_type,
                    r.zone,
                    r.available,
                    r.total,
                    when(r.start_ms, "now"),
                    when(r.end_ms, "no end"),
                ));
                let type_out = p
                    .instance_types
                    .as_ref()
                    .is_some_and(|t| !t.contains(&r.instance_type));
                if type_out || !p.zones.contains(&r.zone) {
                    problems.push(format!(
                        "pool {}: capacityReservations[{i}]: reservation {} is {} in {}, which the \
                         pool does not launch (instanceTypes, zones): it is never used",
                        p.name, r.id, r.instance_type, r.zone
                    ));
                }
            }
        }
    }
    (lines, problems)
}

/// A pool's `dra:` section: the driver its nodes run and what the predicted devices carry beyond
/// what the catalog tells.
#[derive(Clone, Debug, PartialEq)]
pub struct DraPool {
    /// The DRA driver's name (`gpu.nvidia.com`).
    pub driver: String,
    /// Attributes of the driver's domain that every predicted device carries, replacing the
    /// predicted ones of the same name (e.g. `driverVersion`, `productName`).
    pub attributes: BTreeMap<String, crate::model::dra::AttrValue>,
    /// Capacities of the driver's domain that replace the predicted ones (e.g. `memory`).
    pub capacity: BTreeMap<String, crate::model::quantity::Quantity>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Requirements {
    pub gpu_models: Vec<String>,
    pub min_gpus: u32,
    pub max_gpus: u32,
    pub families: Vec<String>,
}

impl Requirements {
    pub fn admits(&self, t: &gpu_node_autoscaler_provider::InstanceType) -> bool {
        let Some(g) = &t.gpu else { return false };
        (self.gpu_models.is_empty() || self.gpu_models.iter().any(|m| m == &g.model))
            && g.count >= self.min_gpus
            && g.count <= self.max_gpus
            && (self.families.is_empty()
                || self
                    .families
                    .iter()
                    .any(|f| t.name.split('.').next() == Some(f.as_str())))
    }
}

/// What becomes of the nodes and instances of ours (this cluster's, by name and identity) whose
/// pool is no longer in the policy (`orphans`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Orphans {
    /// Reported (status, Event), never drained, terminated or launched for.
    #[default]
    Keep,
    /// Reported, then drained and removed as a scale-down is (PodDisruptionBudgets respected,
    /// within `maxConcurrentDrains`); their instances without a Node terminated.
    Drain,
}

impl Orphans {
    pub fn as_str(self) -> &'static str {
        match self {
            Orphans::Keep => "keep",
            Orphans::Drain => "drain",
        }
    }
}

impl Policy {
    /// The policy with what the cloud says of the groups of its pools whose templates come from
    /// the cloud (`found`: pool → its groups' templates, in its order of preference, as
    /// [`gpu_node_autoscaler_provider::CloudProvider::templates`] gives them). What the policy
    /// gives wins: see [`Pool::take_cloud_templates`]. Pools not in `found` are left as they are.
    pub fn with_cloud_templates(
        &self,
        found: &BTreeMap<String, Vec<gpu_node_autoscaler_provider::GroupTemplate>>,
    ) -> Policy {
        let mut out = self.clone();
        for pool in out.pools.iter_mut().filter(|p| p.templates_from_cloud) {
            if let Some(groups) = found.get(&pool.name) {
                pool.take_cloud_templates(groups);
            }
        }
        out
    }
}

impl Pool {
    /// Takes its groups' templates: the pool is then planned from them where its policy leaves
    /// a field out, and constrained by the policy where it gives one.
    ///
    /// - instance types: the policy's `instanceTypes` if listed; else every type its groups
    ///   launch (that its `requirements` admit, if given), see
    ///   [`crate::plan::templates::pool_instance_types`];
    /// - zones: the policy's (the pool's, else the top-level `zones`); else every zone of its
    ///   groups;
    /// - capacity types: the policy's order (left out: spot, then on-demand), less those no group
    ///   buys;
    /// - labels and taints: each offering gets the `node-template` labels of the first group that
    ///   launches it (the policy's `labels` win per key); a template's taints are the policy's
    ///   `taints` if any, else those of every group launching its instance type;
    /// - an offering no group launches is not planned.
    pub fn take_cloud_templates(&mut self, groups: &[gpu_node_autoscaler_provider::GroupTemplate]) {
        if self.zones.is_empty() {
            let zones: BTreeSet<&String> = groups.iter().flat_map(|g| &g.zones).collect();
            self.zones = zones.into_iter().cloned().collect();
        }
        let bought: Vec<CapacityType> = self
            .capacity_types
            .iter()
            .copied()
            .filter(|c| {
                *c == CapacityType::Reserved
                    || groups
                        .iter()
                        .any(|g| g.capacity_type.is_none_or(|x| x == *c))
            })
            .collect();
        if !bought.is_empty() {
            self.capacity_types = bought;
        }
        self.cloud_templates = groups.to_vec();
    }
}

impl Policy {
    /// Why this policy may not replace `old` while the autoscaler runs: a new `clusterName` or
    /// `region` would lose every instance launched under the old ones (they are found by the
    /// cluster's name tag, in the region's API), leaving them running unmanaged and unreported.
    pub fn identity_change(&self, old: &Policy) -> Option<String> {
        let what = if self.cluster_name != old.cluster_name {
            format!(
                "clusterName changed from {:?} to {:?}",
                old.cluster_name, self.cluster_name
            )
        } else if self.region != old.region {
            format!(
                "region changed from {} to {}",
                old.region.as_deref().unwrap_or("(none)"),
                self.region.as_deref().unwrap_or("(none)")
            )
        } else {
            return None;
        };
        Some(format!(
            "{what}: refused on reload (the nodes and instances launched under the old value \
             would be left running, unmanaged and unreported). Put the old value back; to move the cluster, remove what runs under the \
             old value first (`orphans: drain` on its pools), then restart the autoscaler with the \
             new one"
        ))
    }
}

/// How a pool's GPUs are exposed to pods.
#[derive(Clone, Debug, PartialEq)]
pub enum GpuMode {
    /// Whole devices (`nvidia.com/gpu`, `amd.com/gpu`).
    Whole,
    /// Every GPU partitioned with the same MIG layout: `(profile, count per GPU)`.
    Mig(Vec<(String, u32)>),
    /// Shared GPUs (`aliyun.com/gpu-mem`, `aliyun.com/gpu-core.percentage`), with the core
    /// percentage each GPU offers.
    Shared { core_percentage: u32 },
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PriceOverride {
    pub on_demand: Option<f64>,
    pub spot: Option<f64>,
}

/// When a node of a pool counts as broken, and how many may be replaced at once.
#[derive(Clone, Debug, PartialEq)]
pub struct Health {
    pub enabled: bool,
    /// Node conditions that mark a node unhealthy once seen for their grace period.
    pub conditions: Vec<HealthCondition>,
    /// A node that advertised its GPUs and now advertises fewer than its instance type has is
    /// unhealthy after this long.
    pub missing_gpus_grace: Duration,
    /// At most this share of a pool's nodes (at least one) is being replaced at once.
    pub max_replacing_share: f64,
    /// XIDs (the last one a GPU reported, from `gpuMetrics`) that make a node unhealthy.
    pub xid_codes: Vec<u32>,
    pub xid_grace: Duration,
}

#[derive(Clone, Debug, PartialEq)]
pub struct HealthCondition {
    pub type_: String,
    /// The status that means unhealthy (`False`, `True` or `Unknown`).
    pub status: String,
    pub grace: Duration,
}

/// GPU-aware consolidation: repacking a pool's running pods onto cheaper nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct Consolidation {
    pub enabled: bool,
    /// Only pods that have run at least this long move (and only nodes at least this old).
    pub consolidate_after: Duration,
    /// How often the pool's running pods are planned again.
    pub interval: Duration,
    /// The least saving worth a move, as a share of what the replaced nodes cost.
    pub min_saving: f64,
    /// The most nodes one consolidation replaces.
    pub max_nodes: u32,
    /// Pods of batch Jobs, training operators and gangs move too (they must checkpoint);
    /// otherwise only those annotated `gpu-node-autoscaler.io/restartable: "true"`.
    pub move_jobs: bool,
    /// Work a moved pod is assumed to lose (restart, reload, boot of the new node): a move
    /// pays off only if the saving over the pods' expected remaining run time exceeds what the
    /// old and new nodes cost over this long.
    pub restart_cost: Duration,
}

impl Default for Consolidation {
    fn default() -> Consolidation {
        Consolidation {
            enabled: false,
            consolidate_after: defaults::CONSOLIDATE_AFTER,
            interval: defaults::CONSOLIDATION_INTERVAL,
            min_saving: defaults::CONSOLIDATION_MIN_SAVING,
            max_nodes: defaults::CONSOLIDATION_MAX_NODES,
            move_jobs: false,
            restart_cost: defaults::CONSOLIDATION_RESTART_COST,
        }
    }
}

/// A pool's `disruption:` section: how long its nodes live, how long the drain of a drifted or
/// expired node waits for pods that may not be disrupted, and how many of its nodes voluntary
/// disruption may take at once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Disruption {
    /// Nodes older than this are replaced (`None`: `Never`).
    pub expire_after: Option<Duration>,
    /// The most a drifted or expired node is kept by pods that may not be disrupted
    /// (do-not-disrupt, safe-to-evict `"false"`, PodDisruptionBudgets): then it is replaced and
    /// drained all the same. `None`: kept as long as they are there.
    pub termination_grace_period: Option<Duration>,
    /// Disruption budgets; the tightest active one for a reason wins.
    pub budgets: Vec<Budget>,
}

/// Why a node is disrupted by choice, as disruption budgets name it (Karpenter's reasons).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// Scale-down of an empty node.
    Empty,
    /// Scale-down of an underutilized node, or consolidation.
    Underutilized,
    /// Replacement of a node launched differently from what its pool launches today.
    Drifted,
    /// Replacement of a node older than `expireAfter`.
    Expired,
}

impl Reason {
    pub const ALL: [Reason; 4] = [
        Reason::Empty,
        Reason::Underutilized,
        Reason::Drifted,
        Reason::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Empty => "Empty",
            Reason::Underutilized => "Underutilized",
            Reason::Drifted => "Drifted",
            Reason::Expired => "Expired",
        }
    }

    pub fn parse(s: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// How many nodes a budget lets be disrupted at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetNodes {
    Count(u32),
    /// A share of the pool's nodes, rounded up (as Karpenter and PodDisruptionBudgets do).
    Percent(u32),
}

/// One disruption budget.
#[derive(Clone, Debug, PartialEq)]
pub struct Budget {
    pub nodes: BudgetNodes,
    /// The reasons it limits; every reason when none are written.
    pub reasons: Vec<Reason>,
    /// When it is active: from each time the schedule fires, for `duration`; always when
    /// there is no schedule.
    pub schedule: Option<(cron::Cron, Duration)>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ScaleDown {
    pub enabled: bool,
    pub cooldown_after_scale_up: Duration,
    pub unneeded_time: Duration,
    /// How long a node with no pod to move (DaemonSet pods and the like only) must be unneeded
    /// before it is removed; `unneeded_time` unless set.
    pub empty_unneeded_time: Duration,
    pub utilization_threshold: f64,
    pub backoff_after_failure: Duration,
}

impl Policy {
    pub fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| p.name == name)
    }

    /// What is valid but likely a mistake, one message each.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.cluster_name == "default" {
            out.push(
                "clusterName is left at its default \"default\": instances are tagged and listed \
                 by it, so give every cluster its own (terminations also require the cluster's \
                 identity tag, so another cluster's instances are never terminated)"
                    .to_string(),
            );
        }
        out
    }
}

/// One validation error with its position.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyError {
    pub line: usize,
    pub col: usize,
    pub path: String,
    pub message: String,
}

/// Every error found in a policy file.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyErrors {
    pub file: String,
    pub errors: Vec<PolicyError>,
}

impl fmt::Display for PolicyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}:{}:{}: {}", self.file, e.line, e.col, e.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for PolicyErrors {}

// ---- raw, serde-facing schema ----

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawPolicy {
    api_version: Option<String>,
    kind: Option<String>,
    cluster_name: Option<String>,
    region: Option<String>,
    #[serde(default)]
    zones: Vec<String>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    batching: RawBatching,
    max_node_provision_time: Option<Dur>,
    insufficient_capacity_ttl: Option<Dur>,
    max_concurrent_drains: Option<u32>,
    orphans: Option<String>,
    spot_price_ratio: Option<f64>,
    interruption_taints: Option<Vec<String>>,
    interruption_conditions: Option<Vec<RawInterruptionCondition>>,
    interruption_queue: Option<String>,
    gpu_metrics: Option<RawGpuMetrics>,
    /// Pools are decoded one by one so that every pool's errors are reported.
    #[serde(default)]
    pools: Value,
    /// `zones` was present but did not decode (already reported).
    #[serde(skip)]
    zones_invalid: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInterruptionCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawLimits {
    max_gpus: Option<u32>,
    max_nodes: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawBatching {
    idle: Option<Dur>,
    max: Option<Dur>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawPool {
    name: String,
    provider: Option<String>,
    instance_types: Option<Vec<String>>,
    requirements: Option<RawRequirements>,
    zones: Option<Vec<String>>,
    capacity_types: Option<Vec<String>>,
    #[serde(default)]
    min_nodes: u32,
    max_nodes: u32,
    max_gpus: Option<u32>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    taints: Vec<RawTaint>,
    #[serde(default)]
    startup_taints: Vec<RawTaint>,
    #[serde(default)]
    node_selector: BTreeMap<String, String>,
    gpu_mode: Option<String>,
    mig_layout: Option<BTreeMap<String, u32>>,
    shared_gpu: Option<RawSharedGpu>,
    dra: Option<RawDra>,
    #[serde(default)]
    prices: BTreeMap<String, RawPrice>,
    #[serde(default)]
    reserved: RawReserved,
    max_pods: Option<u32>,
    #[serde(default)]
    priority: i32,
    #[serde(default)]
    scale_down: RawScaleDown,
    #[serde(default)]
    consolidation: RawConsolidation,
    #[serde(default)]
    health: RawHealth,
    #[serde(default)]
    disruption: RawDisruption,
    #[serde(default)]
    replace_on_rebalance: bool,
    spot_max_wait: Option<Dur>,
    #[serde(default)]
    capacity_reservations: Vec<RawReservationSelector>,
    keep_reserved_warm: Option<bool>,
    capacity_block_drain_lead: Option<Dur>,
    expected_run_time: Option<Dur>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReservationSelector {
    id: Option<String>,
    tags: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawRequirements {
    #[serde(default)]
    gpu_models: Vec<String>,
    #[serde(default)]
    gpu_count: RawRange,
    #[serde(default)]
    families: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRange {
    min: Option<u32>,
    max: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTaint {
    key: String,
    #[serde(default)]
    value: String,
    effect: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSharedGpu {
    core_percentage: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawDra {
    driver: Option<String>,
    #[serde(default)]
    attributes: BTreeMap<String, RawAttr>,
    #[serde(default)]
    capacity: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawAttr {
    Bool(bool),
    Int(i64),
    String(String),
}

/// Attributes NVIDIA's driver publishes as versions rather than strings.
const VERSION_ATTRIBUTES: [&str; 3] = [
    "driverVersion",
    "cudaDriverVersion",
    "cudaComputeCapability",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawPrice {
    on_demand: Option<f64>,
    spot: Option<f64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawReserved {
    cpu: Option<QuantityText>,
    memory: Option<QuantityText>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawHealth {
    enabled: Option<bool>,
    conditions: Option<Vec<RawHealthCondition>>,
    missing_gpus_grace_period: Option<Dur>,
    max_replacing_share: Option<f64>,
    xid_errors: Option<RawXidErrors>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawXidErrors {
    codes: Option<Vec<u32>>,
    grace_period: Option<Dur>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawGpuMetrics {
    prometheus_url: String,
    selector: Option<String>,
    node_label: Option<String>,
    interval: Option<Dur>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawHealthCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    grace_period: Option<Dur>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConsolidation {
    enabled: Option<bool>,
    consolidate_after: Option<Dur>,
    interval: Option<Dur>,
    min_saving: Option<f64>,
    max_nodes: Option<u32>,
    move_jobs: Option<bool>,
    restart_cost: Option<Dur>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawDisruption {
    expire_after: Option<String>,
    termination_grace_period: Option<Dur>,
    #[serde(default)]
    budgets: Vec<RawBudget>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawBudget {
    nodes: Value,
    #[serde(default)]
    reasons: Vec<String>,
    schedule: Option<String>,
    duration: Option<Dur>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawScaleDown {
    enabled: Option<bool>,
    cooldown_after_scale_up: Option<Dur>,
    unneeded_time: Option<Dur>,
    empty_unneeded_time: Option<Dur>,
    utilization_threshold: Option<f64>,
    backoff_after_failure: Option<Dur>,
}

/// A duration written Go-style (`10m`, `1h30m`, `500ms`). A malformed one is kept as its error
/// and reported during validation, so that the rest of its pool is still checked.
struct Dur(Result<Duration, String>);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Dur, D::Error> {
        let s = String::deserialize(d)?;
        Ok(Dur(duration::parse_duration(&s).map_err(|e| e.to_string())))
    }
}

/// A quantity written as a string or a number.
struct QuantityText(String);

impl<'de> Deserialize<'de> for QuantityText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<QuantityText, D::Error> {
        let v = Value::deserialize(d)?;
        match v {
            Value::String(s) => Ok(QuantityText(s)),
            Value::Number(n) => Ok(QuantityText(n.to_string())),
            _ => Err(serde::de::Error::custom(
                "expected a quantity such as \"500m\" or \"2Gi\"",
            )),
        }
    }
}

struct Collector<'a> {
    map: &'a SourceMap,
    errors: Vec<PolicyError>,
    /// Where the policy sits in its document (empty for a policy file of its own).
    prefix: Vec<PathSeg>,
    /// The providers pools may name, in the order their names are listed.
    providers: &'a [&'a dyn ProviderPolicy],
    /// Where the parts checked once the catalog is known are written.
    positions: Positions,
}

impl Collector<'_> {
    /// The duration at `path`, or `default` when absent; a malformed one is reported.
    fn duration(&mut self, path: &[PathSeg], d: Option<Dur>, default: Duration) -> Duration {
        match d {
            None => default,
            Some(Dur(Ok(v))) => v,
            Some(Dur(Err(e))) => {
                self.at(path, e);
                default
            }
        }
    }

    /// Where `path` is written: its position and its path as errors show it.
    fn written(&self, path: &[PathSeg]) -> Written {
        let mut full = self.prefix.clone();
        full.extend_from_slice(path);
        let loc = self.map.locate_nearest(&full);
        Written {
            line: loc.line,
            col: loc.col,
            path: display_path(&full),
        }
    }

    fn at(&mut self, path: &[PathSeg], message: impl Into<String>) {
        let mut full = self.prefix.clone();
        full.extend_from_slice(path);
        let path = &full[..];
        let loc = self.map.locate_nearest(path);
        let shown = display_path(path);
        let message = message.into();
        let message = if shown.is_empty() {
            message
        } else {
            format!("{shown}: {message}")
        };
        self.errors.push(PolicyError {
            line: loc.line,
            col: loc.col,
            path: shown,
            message,
        });
    }

    fn serde_error<E: fmt::Display>(
        &mut self,
        prefix: &[PathSeg],
        e: serde_path_to_error::Error<E>,
    ) {
        let mut path = prefix.to_vec();
        path.extend(path_from_serde(e.path()));
        self.at(&path, e.inner().to_string());
    }
}

fn key(k: &str) -> PathSeg {
    PathSeg::Key(k.to_string())
}

fn pool_path(i: usize, rest: &[&str]) -> Vec<PathSeg> {
    let mut p = vec![key("pools"), PathSeg::Index(i)];
    p.extend(rest.iter().map(|s| key(s)));
    p
}

/// Parses and validates a policy. `file` names the source in error messages. Pools may name the
/// providers of [`NAMES_ONLY`]; see [`parse_policy_with`].
pub fn parse_policy(text: &str, file: &str) -> Result<Policy, PolicyErrors> {
    parse_policy_with(text, file, &NAMES_ONLY)
}

/// Parses and validates a policy whose pools may name `providers` (a program's registry), each
/// of which checks its pools' section.
pub fn parse_policy_with(
    text: &str,
    file: &str,
    providers: &[&dyn ProviderPolicy],
) -> Result<Policy, PolicyErrors> {
    parse_policy_at_with(text, file, &[], providers)
}

/// Parses the policy found at `at` inside a larger YAML document (a simulation scenario's
/// `policy:`), with positions in that document.
pub fn parse_policy_at(text: &str, file: &str, at: &[PathSeg]) -> Result<Policy, PolicyErrors> {
    parse_policy_at_with(text, file, at, &NAMES_ONLY)
}

/// [`parse_policy_at`] with the providers pools may name.
pub fn parse_policy_at_with(
    text: &str,
    file: &str,
    at: &[PathSeg],
    providers: &[&dyn ProviderPolicy],
) -> Result<Policy, PolicyErrors> {
    let fail = |errors| PolicyErrors {
        file: file.to_string(),
        errors,
    };
    let map = SourceMap::parse(text).map_err(|e| {
        fail(vec![PolicyError {
            line: e.line,
            col: e.col,
            path: String::new(),
            message: format!("invalid YAML: {}", e.message),
        }])
    })?;
    let root = crate::yaml::parse(text).map_err(|e| {
        fail(vec![PolicyError {
            line: e.line,
            col: e.col,
            path: String::new(),
            message: format!("invalid YAML: {}", e.message),
        }])
    })?;
    let mut c = Collector {
        map: &map,
        errors: Vec::new(),
        prefix: at.to_vec(),
        providers,
        positions: Positions::default(),
    };
    let mut root = root;
    for seg in at {
        root = match seg {
            PathSeg::Key(k) => root.get(k.as_str()).cloned(),
            PathSeg::Index(i) => root.get(*i).cloned(),
        }
        .unwrap_or(Value::Null);
    }
    if !root.is_object() {
        c.at(&[], "a policy must be a YAML mapping with a `pools` list");
        return Err(fail(c.errors));
    }
    let raw = decode_top_level(root, &mut c);
    let policy = validate(raw, &mut c);
    if c.errors.is_empty() {
        Ok(policy)
    } else {
        c.errors.sort_by_key(|e| (e.line, e.col));
        c.errors.dedup();
        Err(fail(c.errors))
    }
}

/// Decodes the top level. A field that does not decode is reported and left out, and the rest is
/// decoded again, so that one bad top-level field does not hide the other errors (the pools').
fn decode_top_level(mut root: Value, c: &mut Collector) -> RawPolicy {
    let mut zones_invalid = false;
    loop {
        match serde_path_to_error::deserialize::<_, RawPolicy>(root.clone()) {
            Ok(raw) => {
                return RawPolicy {
                    zones_invalid,
                    ..raw
                }
            }
            Err(e) => {
                let field = match e.path().iter().next() {
                    Some(serde_path_to_error::Segment::Map { key }) => Some(key.clone()),
                    _ => None,
                };
                c.serde_error(&[], e);
                let removed = field.filter(|k| {
                    root.as_object_mut()
                        .is_some_and(|m| m.remove(k.as_str()).is_some())
                });
                match removed {
                    Some(k) => zones_invalid |= k == "zones",
                    None => return RawPolicy::default(),
                }
            }
        }
    }
}

fn validate(raw: RawPolicy, c: &mut Collector) -> Policy {
    if let Some(v) = &raw.api_version {
        if v != API_VERSION {
            c.at(
                &[key("apiVersion")],
                format!("unsupported apiVersion {v:?} (expected {API_VERSION:?})"),
            );
        }
    }
    if let Some(k) = &raw.kind {
        if k != KIND {
            c.at(&[key("kind")], format!("kind must be {KIND:?}, not {k:?}"));
        }
    }
    let spot_price_ratio = raw.spot_price_ratio.unwrap_or(defaults::SPOT_PRICE_RATIO);
    if !(spot_price_ratio > 0.0 && spot_price_ratio <= 1.0) {
        c.at(
            &[key("spotPriceRatio")],
            format!("must be in (0, 1], got {spot_price_ratio}"),
        );
    }
    let batching = Batching {
        idle: c.duration(
            &[key("batching"), key("idle")],
            raw.batching.idle,
            defaults::BATCH_IDLE,
        ),
        max: c.duration(
            &[key("batching"), key("max")],
            raw.batching.max,
            defaults::BATCH_MAX,
        ),
    };
    if batching.idle > batching.max {
        c.at(
            &[key("batching"), key("idle")],
            "idle must not be longer than max",
        );
    }
    let max_concurrent_drains = raw
        .max_concurrent_drains
        .unwrap_or(defaults::MAX_CONCURRENT_DRAINS);
    if max_concurrent_drains == 0 {
        c.at(
            &[key("maxConcurrentDrains")],
            "must be at least 1 (disable scale-down per pool instead)",
        );
    }
    let orphans = match raw.orphans.as_deref() {
        None | Some("keep") => Orphans::Keep,
        Some("drain") => Orphans::Drain,
        Some(other) => {
            c.at(
                &[key("orphans")],
                format!("unknown value {other:?} (expected keep or drain)"),
            );
            Orphans::Keep
        }
    };
    check_zones(&raw.zones, &[key("zones")], c);

    let mut pools = Vec::new();
    match &raw.pools {
        Value::Array(items) => {
            if items.is_empty() {
                c.at(&[key("pools")], "at least one pool is required");
            }
            for (i, item) in items.iter().enumerate() {
                if let Some((rp, sections)) = decode_pool(i, item, c) {
                    let global_zones = (!raw.zones_invalid).then_some(raw.zones.as_slice());
                    if let Some(p) = validate_pool(i, rp, sections, global_zones, c) {
                        pools.push(p);
                    }
                }
            }
        }
        Value::Null => c.at(&[key("pools")], "missing field `pools`"),
        _ => c.at(&[key("pools")], "`pools` must be a list"),
    }
    // Every later pool with a name already used, whether or not either pool has other errors.
    if let Value::Array(items) = &raw.pools {
        let mut seen = BTreeSet::new();
        for (i, item) in items.iter().enumerate() {
            if let Some(name) = item.get("name").and_then(|v| v.as_str()) {
                if !seen.insert(name) {
                    c.at(
                        &pool_path(i, &["name"]),
                        format!("duplicate pool name {name:?}"),
                    );
                }
            }
        }
    }
    // Checks across pools, by each provider over the pools of its own.
    let providers = c.providers;
    for provider in providers {
        let sections: Vec<PoolSection> = pools
            .iter()
            .enumerate()
            .filter(|(_, p)| p.provider == provider.name())
            .filter_map(|(i, p)| {
                Some(PoolSection {
                    index: pool_index(&raw.pools, &p.name).unwrap_or(i),
                    name: &p.name,
                    section: p.settings.as_ref()?,
                })
            })
            .collect();
        if sections.is_empty() {
            continue;
        }
        for (i, e) in provider.validate_pools(&sections) {
            c.at(&in_pool(i, &e), e.message);
        }
    }
    Policy {
        cluster_name: raw.cluster_name.unwrap_or_else(|| "default".to_string()),
        region: raw.region,
        limits: Limits {
            max_gpus: raw.limits.max_gpus,
            max_nodes: raw.limits.max_nodes,
        },
        batching,
        max_node_provision_time: c.duration(
            &[key("maxNodeProvisionTime")],
            raw.max_node_provision_time,
            defaults::MAX_NODE_PROVISION_TIME,
        ),
        insufficient_capacity_ttl: c.duration(
            &[key("insufficientCapacityTtl")],
            raw.insufficient_capacity_ttl,
            defaults::INSUFFICIENT_CAPACITY_TTL,
        ),
        max_concurrent_drains,
        orphans,
        spot_price_ratio,
        interruption_taints: raw.interruption_taints.unwrap_or_else(|| {
            defaults::INTERRUPTION_TAINTS
                .iter()
                .map(|t| t.to_string())
                .collect()
        }),
        interruption_conditions: raw
            .interruption_conditions
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(j, ic)| {
                let path = |f: &str| {
                    vec![
                        key("interruptionConditions"),
                        PathSeg::Index(j),
                        PathSeg::Key(f.into()),
                    ]
                };
                check_condition(&path("type"), &path("status"), &ic.type_, &ic.status, c);
                InterruptionCondition {
                    type_: ic.type_,
                    status: ic.status,
                }
            })
            .collect(),
        gpu_metrics: raw.gpu_metrics.and_then(|g| validate_gpu_metrics(g, c)),
        interruption_queue: raw.interruption_queue.and_then(|u| {
            if u.starts_with("https://") || u.starts_with("http://") {
                Some(u)
            } else {
                c.at(
                    &[key("interruptionQueue")],
                    format!(
                        "{u:?} is not a queue URL (https://sqs.REGION.amazonaws.com/ACCOUNT/NAME)"
                    ),
                );
                None
            }
        }),
        pools,
        positions: std::mem::take(&mut c.positions),
    }
}

/// A Node condition the policy names: a type other than Ready, a status Kubernetes uses.
fn check_condition(
    type_at: &[PathSeg],
    status_at: &[PathSeg],
    type_: &str,
    status: &str,
    c: &mut Collector,
) {
    if type_.is_empty() || type_ == "Ready" {
        c.at(
            type_at,
            "a condition type other than Ready (a node not Ready is the kubelet's and the \
             cloud's business)",
        );
    }
    if !matches!(status, "True" | "False" | "Unknown") {
        c.at(
            status_at,
            format!("must be True, False or Unknown, got {status:?}"),
        );
    }
}

fn validate_health(i: usize, r: RawHealth, c: &mut Collector) -> Health {
    let at = |f: &[&str]| {
        let mut p = vec!["health"];
        p.extend_from_slice(f);
        pool_path(i, &p)
    };
    let conditions = match r.conditions {
        None => vec![HealthCondition {
            type_: defaults::HEALTH_CONDITION.to_string(),
            status: "False".to_string(),
            grace: defaults::HEALTH_GRACE,
        }],
        Some(list) => list
            .into_iter()
            .enumerate()
            .map(|(j, hc)| {
                let mut path = at(&["conditions"]);
                path.push(PathSeg::Index(j));
                let field = |f: &str| {
                    let mut p = path.clone();
                    p.push(PathSeg::Key(f.into()));
                    p
                };
                check_condition(&field("type"), &field("status"), &hc.type_, &hc.status, c);
                let mut pg = path;
                pg.push(PathSeg::Key("gracePeriod".into()));
                HealthCondition {
                    grace: c.duration(&pg, hc.grace_period, defaults::HEALTH_GRACE),
                    type_: hc.type_,
                    status: hc.status,
                }
            })
            .collect(),
    };
    let share = r
        .max_replacing_share
        .unwrap_or(defaults::MAX_REPLACING_SHARE);
    if !(share > 0.0 && share <= 1.0) {
        c.at(
            &at(&["maxReplacingShare"]),
            format!("must be in (0, 1], got {share}"),
        );
    }
    Health {
        enabled: r.enabled.unwrap_or(true),
        conditions,
        missing_gpus_grace: c.duration(
            &at(&["missingGpusGracePeriod"]),
            r.missing_gpus_grace_period,
            defaults::MISSING_GPUS_GRACE,
        ),
        max_replacing_share: share,
        xid_codes: r
            .xid_errors
            .as_ref()
            .and_then(|x| x.codes.clone())
            .unwrap_or_else(|| defaults::XID_CODES.to_vec()),
        xid_grace: c.duration(
            &at(&["xidErrors", "gracePeriod"]),
            r.xid_errors.and_then(|x| x.grace_period),
            defaults::XID_GRACE,
        ),
    }
}

fn validate_gpu_metrics(r: RawGpuMetrics, c: &mut Collector) -> Option<GpuMetrics> {
    let at = |f: &str| vec![key("gpuMetrics"), key(f)];
    let mut ok = true;
    let url = r.prometheus_url.trim_end_matches('/').to_string();
    if !(url.starts_with("http://") || url.starts_with("https://")) || url.contains('?') {
        c.at(
            &at("prometheusUrl"),
            format!(
                "{:?} is not the base URL of a Prometheus (http://prometheus.monitoring:9090)",
                r.prometheus_url
            ),
        );
        ok = false;
    }
    let selector = r.selector.unwrap_or_default();
    if selector.contains(['{', '}']) {
        c.at(
            &at("selector"),
            format!("{selector:?}: label matchers without braces, e.g. job=\"dcgm-exporter\""),
        );
        ok = false;
    }
    let node_label = r
        .node_label
        .unwrap_or_else(|| defaults::GPU_METRICS_NODE_LABEL.to_string());
    let label_ok = node_label
        .chars()
        .next()
        .is_some_and(|ch| ch.is_ascii_alphabetic() || ch == '_')
        && node_label
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '_');
    if !label_ok {
        c.at(
            &at("nodeLabel"),
            format!("{node_label:?} is not a Prometheus label name"),
        );
        ok = false;
    }
    let interval = c.duration(&at("interval"), r.interval, defaults::GPU_METRICS_INTERVAL);
    ok.then_some(GpuMetrics {
        prometheus_url: url,
        selector,
        node_label,
        interval,
    })
}

/// The position in the `pools` list of the pool named `name`.
fn pool_index(pools: &Value, name: &str) -> Option<usize> {
    pools
        .as_array()?
        .iter()
        .position(|p| p.get("name").and_then(|v| v.as_str()) == Some(name))
}

fn check_zones(zones: &[String], path: &[PathSeg], c: &mut Collector) {
    let mut seen = BTreeSet::new();
    for (i, z) in zones.iter().enumerate() {
        let mut p = path.to_vec();
        p.push(PathSeg::Index(i));
        if z.trim().is_empty() {
            c.at(&p, "zone name must not be empty");
        } else if !seen.insert(z) {
            c.at(&p, format!("duplicate zone {z:?}"));
        }
    }
}

/// The path of a provider's error about the pool at `i`.
fn in_pool(i: usize, e: &FieldError) -> Vec<PathSeg> {
    let mut p = vec![key("pools"), PathSeg::Index(i)];
    p.extend(e.path.iter().map(|k| match k {
        PathKey::Key(k) => PathSeg::Key(k.clone()),
        PathKey::Index(n) => PathSeg::Index(*n),
    }));
    p
}

/// Decodes the pool at `i`: its own fields, and each provider's section apart (kept as written
/// for its provider to check). The error reported for a pool that does not decode is the one
/// decoding it in one piece would meet first: the first field in the mapping's order that does
/// not decode, else a missing one.
fn decode_pool(
    i: usize,
    item: &Value,
    c: &mut Collector,
) -> Option<(RawPool, BTreeMap<String, Value>)> {
    let at = [key("pools"), PathSeg::Index(i)];
    let providers = c.providers;
    let section_of = |k: &str| providers.iter().find(|p| p.section() == Some(k)).copied();
    let mut own = item.clone();
    let mut sections = BTreeMap::new();
    if let Value::Object(m) = &mut own {
        let keys: Vec<String> = m
            .keys()
            .filter(|k| section_of(k).is_some())
            .cloned()
            .collect();
        for k in keys {
            if let Some(v) = m.remove(&k) {
                if !v.is_null() {
                    sections.insert(k, v);
                }
            }
        }
    }
    // The first section (in the mapping's order) that does not decode.
    let section_error = sections.iter().find_map(|(k, v)| {
        let e = section_of(k)?.decode(v).err()?;
        let mut path = vec![PathKey::Key(k.clone())];
        path.extend(e.path);
        Some((
            k.clone(),
            FieldError {
                path,
                message: e.message,
            },
        ))
    });
    let own_error = match serde_path_to_error::deserialize::<_, RawPool>(own) {
        Ok(rp) => match section_error {
            None => return Some((rp, sections)),
            Some(_) => None,
        },
        Err(e) => Some(e),
    };
    match (own_error, section_error) {
        (Some(e), s) => {
            let first_key = match e.path().iter().next() {
                Some(serde_path_to_error::Segment::Map { key }) => Some(key.clone()),
                _ => None,
            };
            match s {
                Some((k, se)) if first_key.as_ref().is_none_or(|f| k < *f) => {
                    c.at(&in_pool(i, &se), se.message);
                }
                _ => {
                    let mut path = at.to_vec();
                    path.extend(path_from_serde(e.path()));
                    let mut message = e.inner().to_string();
                    // The pool's own fields are listed as expected: the providers' sections too
                    // (for a field of the pool itself, not of one of its sections).
                    if e.path().iter().count() == 1
                        && message.starts_with("unknown field `")
                        && message.contains("expected one of")
                    {
                        for k in providers.iter().filter_map(|p| p.section()) {
                            message.push_str(&format!(", `{k}`"));
                        }
                    }
                    c.at(&path, message);
                }
            }
        }
        (None, Some((_, se))) => c.at(&in_pool(i, &se), se.message),
        (None, None) => {}
    }
    None
}

/// `global_zones` is `None` when the top-level `zones` did not decode (already reported).
fn validate_pool(
    i: usize,
    r: RawPool,
    mut sections: BTreeMap<String, Value>,
    global_zones: Option<&[String]>,
    c: &mut Collector,
) -> Option<Pool> {
    let before = c.errors.len();
    let at = |rest: &[&str]| pool_path(i, rest);
    if !is_dns_label(&r.name) {
        c.at(
            &at(&["name"]),
            format!(
                "pool name {:?} must be a DNS label (lower-case letters, digits, '-', at most 63)",
                r.name
            ),
        );
    }
    let provider = r.provider.unwrap_or_else(|| DEFAULT_PROVIDER.to_string());
    let providers = c.providers;
    if !providers.iter().any(|p| p.name() == provider) {
        let names: Vec<&str> = providers.iter().map(|p| p.name()).collect();
        c.at(
            &at(&["provider"]),
            format!(
                "unknown provider {provider:?} (expected one of {})",
                names.join(", ")
            ),
        );
    }
    // A pool whose provider section says its Nodes' shape comes from the cloud (an Auto
    // Scaling group's template) may leave its instance types to the cloud.
    let templates_from_cloud = providers
        .iter()
        .find(|p| p.name() == provider)
        .and_then(|p| {
            let section = sections.get(p.section()?)?;
            Some(p.templates_from_cloud(section))
        })
        .unwrap_or(false);
    if r.instance_types.is_none() && r.requirements.is_none() && !templates_from_cloud {
        c.at(
            &at(&[]),
            "a pool needs `instanceTypes` or `requirements` to choose instance types",
        );
    }
    if let Some(types) = &r.instance_types {
        if types.is_empty() {
            c.at(
                &at(&["instanceTypes"]),
                "must list at least one instance type",
            );
        }
        let mut seen = BTreeSet::new();
        for (j, t) in types.iter().enumerate() {
            if !seen.insert(t) {
                let mut p = at(&["instanceTypes"]);
                p.push(PathSeg::Index(j));
                c.at(&p, format!("duplicate instance type {t:?}"));
            }
        }
    }
    let requirements = r.requirements.map(|q| {
        let min = q.gpu_count.min.unwrap_or(1);
        let max = q.gpu_count.max.unwrap_or(u32::MAX);
        if min > max {
            c.at(
                &at(&["requirements", "gpuCount", "min"]),
                format!("min ({min}) is greater than max ({max})"),
            );
        }
        Requirements {
            gpu_models: q.gpu_models,
            min_gpus: min,
            max_gpus: max,
            families: q.families,
        }
    });
    let r_zones_given = r.zones.is_some();
    let zones = match r.zones {
        Some(z) => {
            check_zones(&z, &at(&["zones"]), c);
            z
        }
        None => global_zones.unwrap_or_default().to_vec(),
    };
    // A pool of cloud groups without zones in the policy takes its groups' zones.
    if zones.is_empty() && (r_zones_given || global_zones.is_some() && !templates_from_cloud) {
        c.at(
            &at(&[]),
            "no zones: set `zones` on the pool or at the top level",
        );
    }
    let mut capacity_types = Vec::new();
    match r.capacity_types {
        // From the cloud: whatever its groups buy, spot first (as they are tried).
        None if templates_from_cloud => {
            capacity_types.extend([CapacityType::Spot, CapacityType::OnDemand])
        }
        None => capacity_types.push(CapacityType::OnDemand),
        Some(list) => {
            if list.is_empty() {
                c.at(
                    &at(&["capacityTypes"]),
                    "must list at least one of spot, on-demand, reserved",
                );
            }
            for (j, s) in list.iter().enumerate() {
                let mut p = at(&["capacityTypes"]);
                p.push(PathSeg::Index(j));
                match CapacityType::parse(s) {
                    Some(ct) if capacity_types.contains(&ct) => {
                        c.at(&p, format!("duplicate capacity type {s:?}"))
                    }
                    None => c.at(
                        &p,
                        format!(
                            "unknown capacity type {s:?} (expected spot, on-demand or reserved)"
                        ),
                    ),
                    Some(ct) => {
                        if ct == CapacityType::Reserved && r.capacity_reservations.is_empty() {
                            c.at(
                                &p,
                                "reserved needs `capacityReservations` on the pool (the \
                                 reservations to launch into)",
                            );
                        }
                        capacity_types.push(ct)
                    }
                }
            }
        }
    }
    let capacity_reservations = validate_reservation_selectors(i, &r.capacity_reservations, c);
    let reserved = capacity_types.contains(&CapacityType::Reserved);
    if !r.capacity_reservations.is_empty() && !reserved {
        c.at(
            &at(&["capacityReservations"]),
            "needs `reserved` in `capacityTypes` (e.g. [reserved, on-demand])",
        );
    }
    if r.keep_reserved_warm.is_some() && !reserved {
        c.at(
            &at(&["keepReservedWarm"]),
            "needs `reserved` in `capacityTypes`",
        );
    }
    if r.capacity_block_drain_lead.is_some() && !reserved {
        c.at(
            &at(&["capacityBlockDrainLead"]),
            "needs `reserved` in `capacityTypes`",
        );
    }
    let capacity_block_drain_lead = c.duration(
        &at(&["capacityBlockDrainLead"]),
        r.capacity_block_drain_lead,
        defaults::CAPACITY_BLOCK_DRAIN_LEAD,
    );
    if r.expected_run_time.is_some() && !reserved {
        c.at(
            &at(&["expectedRunTime"]),
            "needs `reserved` in `capacityTypes` (it keeps pods off Capacity Blocks that end \
             before them)",
        );
    }
    let expected_run_time = match r.expected_run_time {
        None => None,
        Some(Dur(Ok(d))) if d.is_zero() => {
            c.at(&at(&["expectedRunTime"]), "must be longer than 0s");
            None
        }
        Some(Dur(Ok(d))) => Some(d),
        Some(Dur(Err(e))) => {
            c.at(&at(&["expectedRunTime"]), e);
            None
        }
    };
    if r.min_nodes > r.max_nodes {
        c.at(
            &at(&["minNodes"]),
            format!(
                "minNodes ({}) is greater than maxNodes ({})",
                r.min_nodes, r.max_nodes
            ),
        );
    }
    for (field, map) in [("labels", &r.labels), ("nodeSelector", &r.node_selector)] {
        for (k, v) in map {
            if k.is_empty() || k.contains(char::is_whitespace) {
                c.at(&at(&[field]), format!("invalid label key {k:?}"));
            }
            if v.len() > 63 {
                c.at(&at(&[field, k]), "label values are at most 63 characters");
            }
        }
    }
    if r.node_selector.contains_key(labels::POOL) {
        c.at(
            &at(&["nodeSelector", labels::POOL]),
            format!(
                "{} is how pool members are known already; nodeSelector adopts nodes without it",
                labels::POOL
            ),
        );
    }
    let mut taints = Vec::new();
    let mut startup_taints = Vec::new();
    for (field, raw, out) in [
        ("taints", &r.taints, &mut taints),
        ("startupTaints", &r.startup_taints, &mut startup_taints),
    ] {
        for (j, t) in raw.iter().enumerate() {
            let mut p = at(&[field]);
            p.push(PathSeg::Index(j));
            if t.key.is_empty() {
                let mut pk = p.clone();
                pk.push(key("key"));
                c.at(&pk, "taint key must not be empty");
            }
            match Effect::parse(&t.effect) {
                Some(effect) => out.push(Taint {
                    key: t.key.clone(),
                    value: t.value.clone(),
                    effect,
                }),
                None => {
                    p.push(key("effect"));
                    c.at(
                    &p,
                    format!(
                        "unknown taint effect {:?} (expected NoSchedule, PreferNoSchedule or NoExecute)",
                        t.effect
                    ),
                );
                }
            }
        }
    }
    for (j, t) in startup_taints.iter().enumerate() {
        if taints
            .iter()
            .any(|x| x.key == t.key && x.effect == t.effect)
        {
            let mut p = at(&["startupTaints"]);
            p.push(PathSeg::Index(j));
            p.push(key("key"));
            c.at(
                &p,
                format!(
                    "{}:{} is also one of the pool's taints; a startup taint is removed once the \
                     node is registered, a pool taint stays",
                    t.key,
                    t.effect.as_str()
                ),
            );
        }
    }
    let gpu_mode = match r.gpu_mode.as_deref().unwrap_or("whole") {
        "whole" => {
            if r.mig_layout.is_some() {
                c.at(&at(&["migLayout"]), "migLayout needs `gpuMode: mig`");
            }
            GpuMode::Whole
        }
        "mig" => match &r.mig_layout {
            None => {
                c.at(
                    &at(&["gpuMode"]),
                    "`gpuMode: mig` needs a `migLayout` (profile: count per GPU, e.g. 1g.5gb: 7)",
                );
                GpuMode::Mig(Vec::new())
            }
            Some(layout) if layout.is_empty() => {
                c.at(
                    &at(&["migLayout"]),
                    "must list at least one MIG profile, e.g. 1g.5gb: 7",
                );
                GpuMode::Mig(Vec::new())
            }
            Some(layout) => {
                let mut compute = 0u32;
                let mut out = Vec::new();
                let written = c.written(&at(&["migLayout"]));
                c.positions.mig_layouts.insert((i, None), written);
                for profile in layout.keys() {
                    let written = c.written(&at(&["migLayout", profile]));
                    c.positions
                        .mig_layouts
                        .insert((i, Some(profile.clone())), written);
                }
                for (profile, n) in layout {
                    match gpu::parse_mig_profile(profile) {
                        Some(p) => compute = compute.saturating_add(p.compute.saturating_mul(*n)),
                        None => c.at(
                            &at(&["migLayout", profile]),
                            format!("invalid MIG profile {profile:?} (expected <g>g.<m>gb, e.g. 1g.5gb)"),
                        ),
                    }
                    if *n == 0 {
                        c.at(&at(&["migLayout", profile]), "count must be at least 1");
                    }
                    if gpu::media_extensions(profile) && r.dra.is_none() {
                        c.at(
                            &at(&["migLayout", profile]),
                            format!(
                                "{profile} is published only through Dynamic Resource Allocation \
                                 (`dra:`): `+` is not allowed in a resource name, so the device \
                                 plugin cannot advertise it"
                            ),
                        );
                    }
                    out.push((profile.clone(), *n));
                }
                if compute > gpu::MIG_COMPUTE_SLICES {
                    c.at(
                        &at(&["migLayout"]),
                        format!(
                            "MIG layout uses {compute} compute slices, a GPU has {}",
                            gpu::MIG_COMPUTE_SLICES
                        ),
                    );
                }
                GpuMode::Mig(out)
            }
        },
        "shared" => {
            if r.mig_layout.is_some() {
                c.at(&at(&["migLayout"]), "migLayout needs `gpuMode: mig`");
            }
            let core = r
                .shared_gpu
                .as_ref()
                .and_then(|s| s.core_percentage)
                .unwrap_or(defaults::SHARED_CORE_PERCENTAGE);
            if core == 0 || core > 100 || !core.is_multiple_of(5) {
                c.at(
                    &at(&["sharedGpu", "corePercentage"]),
                    format!("gpu-core percentage must be a multiple of 5 in 5..=100, got {core}"),
                );
            }
            GpuMode::Shared {
                core_percentage: core,
            }
        }
        other => {
            c.at(
                &at(&["gpuMode"]),
                format!("unknown gpuMode {other:?} (expected whole, mig or shared)"),
            );
            GpuMode::Whole
        }
    };
    if r.shared_gpu.is_some() && !matches!(gpu_mode, GpuMode::Shared { .. }) {
        c.at(&at(&["sharedGpu"]), "sharedGpu needs `gpuMode: shared`");
    }
    let dra = r.dra.map(|d| {
        if matches!(gpu_mode, GpuMode::Shared { .. }) {
            c.at(
                &at(&["dra"]),
                "dra needs `gpuMode: whole` or `mig` (shared GPUs are a device plugin's)",
            );
        }
        let mut attributes = BTreeMap::new();
        for (k, v) in d.attributes {
            let v = match v {
                RawAttr::Bool(b) => crate::model::dra::AttrValue::Bool(b),
                RawAttr::Int(i) => crate::model::dra::AttrValue::Int(i),
                RawAttr::String(s) if VERSION_ATTRIBUTES.contains(&k.as_str()) => {
                    let parts: Vec<&str> = s.split('.').collect();
                    if parts.len() != 3 || parts.iter().any(|p| p.parse::<u64>().is_err()) {
                        c.at(
                            &at(&["dra", "attributes", &k]),
                            format!("{k} is a version: expected major.minor.patch, got {s:?}"),
                        );
                    }
                    crate::model::dra::AttrValue::Version(s)
                }
                RawAttr::String(s) => crate::model::dra::AttrValue::String(s),
            };
            attributes.insert(k, v);
        }
        let mut capacity = BTreeMap::new();
        for (k, v) in d.capacity {
            match crate::model::quantity::parse_quantity(&v) {
                Ok(q) => {
                    capacity.insert(k, q);
                }
                Err(e) => c.at(&at(&["dra", "capacity", &k]), e.to_string()),
            }
        }
        DraPool {
            driver: d
                .driver
                .unwrap_or_else(|| crate::model::dra::NVIDIA_GPU_DRIVER.to_string()),
            attributes,
            capacity,
        }
    });
    let mut prices = BTreeMap::new();
    for (t, p) in r.prices {
        for (field, v) in [("onDemand", p.on_demand), ("spot", p.spot)] {
            if let Some(v) = v {
                if !(v.is_finite() && v >= 0.0) {
                    c.at(
                        &at(&["prices", &t, field]),
                        format!("price must be a non-negative number, got {v}"),
                    );
                }
            }
        }
        prices.insert(
            t,
            PriceOverride {
                on_demand: p.on_demand,
                spot: p.spot,
            },
        );
    }
    let mut quantity = |field: &str, q: Option<QuantityText>, default: i64, milli: bool| -> i64 {
        let Some(QuantityText(s)) = q else {
            return default;
        };
        let parsed = parse_quantity(&s).and_then(|q| {
            if milli {
                q.to_milli_ceil()
            } else {
                q.to_units_ceil()
            }
        });
        match parsed {
            Ok(v) if v >= 0 => v,
            Ok(_) => {
                c.at(&at(&["reserved", field]), "must not be negative");
                default
            }
            Err(e) => {
                c.at(&at(&["reserved", field]), e.to_string());
                default
            }
        }
    };
    let reserved_cpu_milli = quantity("cpu", r.reserved.cpu, defaults::RESERVED_CPU_MILLI, true);
    let reserved_memory = quantity(
        "memory",
        r.reserved.memory,
        defaults::RESERVED_MEMORY,
        false,
    );
    let max_pods = r.max_pods.unwrap_or(defaults::MAX_PODS);
    if max_pods == 0 {
        c.at(&at(&["maxPods"]), "must be at least 1");
    }
    let sd = r.scale_down;
    let utilization_threshold = sd
        .utilization_threshold
        .unwrap_or(defaults::UTILIZATION_THRESHOLD);
    if !(0.0..=1.0).contains(&utilization_threshold) {
        c.at(
            &at(&["scaleDown", "utilizationThreshold"]),
            format!("must be between 0 and 1, got {utilization_threshold}"),
        );
    }
    let sd_path = |f: &str| pool_path(i, &["scaleDown", f]);
    let cooldown_after_scale_up = c.duration(
        &sd_path("cooldownAfterScaleUp"),
        sd.cooldown_after_scale_up,
        defaults::COOLDOWN_AFTER_SCALE_UP,
    );
    let unneeded_time = c.duration(
        &sd_path("unneededTime"),
        sd.unneeded_time,
        defaults::UNNEEDED_TIME,
    );
    let empty_unneeded_time = c.duration(
        &sd_path("emptyUnneededTime"),
        sd.empty_unneeded_time,
        unneeded_time,
    );
    if empty_unneeded_time > unneeded_time {
        c.at(
            &sd_path("emptyUnneededTime"),
            format!(
                "{} is longer than unneededTime ({}): an empty node would wait longer than a \
                 busy one",
                duration::format_duration(empty_unneeded_time),
                duration::format_duration(unneeded_time)
            ),
        );
    }
    let backoff_after_failure = c.duration(
        &sd_path("backoffAfterFailure"),
        sd.backoff_after_failure,
        defaults::BACKOFF_AFTER_FAILURE,
    );
    let spot_max_wait = c.duration(
        &pool_path(i, &["spotMaxWait"]),
        r.spot_max_wait,
        Duration::ZERO,
    );
    let both = capacity_types.contains(&CapacityType::Spot)
        && capacity_types.contains(&CapacityType::OnDemand);
    if !spot_max_wait.is_zero() && !both {
        c.at(
            &pool_path(i, &["spotMaxWait"]),
            "waiting for spot needs capacityTypes with both spot and on-demand",
        );
    }
    let consolidation = validate_consolidation(i, r.consolidation, c);
    let health = validate_health(i, r.health, c);
    let disruption = validate_disruption(i, r.disruption, c);
    // Each provider checks its section, and the pools that name it.
    let facts = PoolFacts {
        name: &r.name,
        provider: &provider,
        zones: &zones,
        capacity_types: &capacity_types,
    };
    for p in providers {
        let section = p.section().and_then(|k| sections.get(k));
        if section.is_none() && p.name() != provider {
            continue;
        }
        for e in p.validate_pool(section, &facts) {
            c.at(&in_pool(i, &e), e.message);
        }
    }
    let settings = providers
        .iter()
        .find(|p| p.name() == provider)
        .and_then(|p| p.section())
        .and_then(|k| sections.remove(k));
    if c.errors.len() > before {
        return None;
    }
    Some(Pool {
        name: r.name,
        provider,
        instance_types: r.instance_types,
        requirements,
        zones,
        capacity_types,
        min_nodes: r.min_nodes,
        max_nodes: r.max_nodes,
        max_gpus: r.max_gpus,
        labels: r.labels,
        taints,
        startup_taints,
        node_selector: r.node_selector,
        gpu_mode,
        prices,
        reserved_cpu_milli,
        reserved_memory,
        max_pods,
        priority: r.priority,
        health,
        disruption,
        replace_on_rebalance: r.replace_on_rebalance,
        spot_max_wait,
        scale_down: ScaleDown {
            enabled: sd.enabled.unwrap_or(true),
            cooldown_after_scale_up,
            unneeded_time,
            empty_unneeded_time,
            utilization_threshold,
            backoff_after_failure,
        },
        consolidation,
        settings,
        dra,
        capacity_reservations,
        keep_reserved_warm: r.keep_reserved_warm.unwrap_or(false),
        capacity_block_drain_lead,
        expected_run_time,
        templates_from_cloud,
        cloud_templates: Vec::new(),
    })
}

/// A pool's `capacityReservations`: each entry is `{id: cr-...}` or `{tags: {...}}`, no id twice.
fn validate_reservation_selectors(
    i: usize,
    raw: &[RawReservationSelector],
    c: &mut Collector,
) -> Vec<ReservationSelector> {
    let mut out = Vec::new();
    let mut ids = BTreeSet::new();
    for (j, s) in raw.iter().enumerate() {
        let at = |f: &[&str]| {
            let mut p = pool_path(i, &["capacityReservations"]);
            p.push(PathSeg::Index(j));
            p.extend(f.iter().map(|k| key(k)));
            p
        };
        match (&s.id, &s.tags) {
            (Some(id), None) => {
                if !id.starts_with("cr-") || id.len() <= 3 {
                    c.at(
                        &at(&["id"]),
                        format!("{id:?} is not a capacity reservation id (cr-...)"),
                    );
                } else if !ids.insert(id.clone()) {
                    c.at(
                        &at(&["id"]),
                        format!("duplicate capacity reservation {id:?}"),
                    );
                } else {
                    out.push(ReservationSelector::Id(id.clone()));
                }
            }
            (None, Some(tags)) => {
                if tags.is_empty() {
                    c.at(
                        &at(&["tags"]),
                        "must name at least one tag (an empty selector would take every \
                         reservation of the account)",
                    );
                } else {
                    out.push(ReservationSelector::Tags(tags.clone()));
                }
            }
            _ => c.at(&at(&[]), "give exactly one of `id` or `tags`"),
        }
    }
    out
}

fn validate_consolidation(i: usize, r: RawConsolidation, c: &mut Collector) -> Consolidation {
    let at = |f: &str| pool_path(i, &["consolidation", f]);
    let d = Consolidation::default();
    let min_saving = r.min_saving.unwrap_or(d.min_saving);
    if !(min_saving > 0.0 && min_saving < 1.0) {
        c.at(
            &at("minSaving"),
            format!("must be a share in (0, 1), got {min_saving}"),
        );
    }
    let max_nodes = r.max_nodes.unwrap_or(d.max_nodes);
    if max_nodes == 0 {
        c.at(&at("maxNodes"), "must be at least 1");
    }
    let interval = c.duration(&at("interval"), r.interval, d.interval);
    if interval.is_zero() {
        c.at(&at("interval"), "must be longer than zero");
    }
    Consolidation {
        enabled: r.enabled.unwrap_or(d.enabled),
        consolidate_after: c.duration(
            &at("consolidateAfter"),
            r.consolidate_after,
            d.consolidate_after,
        ),
        interval,
        min_saving,
        max_nodes,
        move_jobs: r.move_jobs.unwrap_or(d.move_jobs),
        restart_cost: c.duration(&at("restartCost"), r.restart_cost, d.restart_cost),
    }
}

fn validate_disruption(i: usize, r: RawDisruption, c: &mut Collector) -> Disruption {
    let at = |f: &str| pool_path(i, &["disruption", f]);
    let expire_after = match r.expire_after.as_deref() {
        None | Some("Never") => None,
        Some(s) => match duration::parse_duration(s) {
            Ok(d) if d.is_zero() => {
                c.at(&at("expireAfter"), "must be longer than zero, or Never");
                None
            }
            Ok(d) => Some(d),
            Err(e) => {
                c.at(&at("expireAfter"), format!("{e} (or Never)"));
                None
            }
        },
    };
    let termination_grace_period = r
        .termination_grace_period
        .map(|d| c.duration(&at("terminationGracePeriod"), Some(d), Duration::ZERO));
    let mut budgets = Vec::new();
    for (b, raw) in r.budgets.into_iter().enumerate() {
        let bp = |f: &str| {
            let mut p = pool_path(i, &["disruption", "budgets"]);
            p.push(PathSeg::Index(b));
            p.push(key(f));
            p
        };
        let nodes = match &raw.nodes {
            Value::Number(n) => match n.as_u64() {
                Some(v) if v <= u64::from(u32::MAX) => Some(BudgetNodes::Count(v as u32)),
                _ => None,
            },
            Value::String(s) => match s.strip_suffix('%') {
                Some(p) => p
                    .parse::<u32>()
                    .ok()
                    .filter(|p| *p <= 100)
                    .map(BudgetNodes::Percent),
                None => s.parse::<u32>().ok().map(BudgetNodes::Count),
            },
            _ => None,
        };
        let Some(nodes) = nodes else {
            c.at(
                &bp("nodes"),
                format!(
                    "must be a number of nodes (0 or more) or a percentage from \"0%\" to \"100%\", \
                     got {}",
                    raw.nodes
                ),
            );
            continue;
        };
        let mut reasons = Vec::new();
        for (k, s) in raw.reasons.iter().enumerate() {
            match Reason::parse(s) {
                Some(r) => reasons.push(r),
                None => {
                    let mut p = bp("reasons");
                    p.push(PathSeg::Index(k));
                    c.at(
                        &p,
                        format!("unknown reason {s:?} (Empty, Underutilized, Drifted, Expired)"),
                    );
                }
            }
        }
        let duration = raw
            .duration
            .map(|d| c.duration(&bp("duration"), Some(d), Duration::ZERO));
        let schedule = match (raw.schedule, duration) {
            (None, None) => None,
            (Some(_), None) => {
                c.at(&bp("schedule"), "a schedule needs a duration");
                None
            }
            (None, Some(_)) => {
                c.at(&bp("duration"), "a duration needs a schedule");
                None
            }
            (Some(s), Some(d)) => {
                if d < Duration::from_secs(60) {
                    c.at(&bp("duration"), "must be at least 1m");
                }
                match cron::Cron::parse(&s) {
                    Ok(cr) => Some((cr, d)),
                    Err(e) => {
                        c.at(&bp("schedule"), format!("invalid schedule {s:?}: {e}"));
                        None
                    }
                }
            }
        };
        budgets.push(Budget {
            nodes,
            reasons,
            schedule,
        });
    }
    Disruption {
        expire_after,
        termination_grace_period,
        budgets,
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// One line per pool, for `check-policy`.
pub fn summary(policy: &Policy) -> Vec<String> {
    policy
        .pools
        .iter()
        .map(|p| {
            let types = match (&p.instance_types, &p.requirements) {
                (Some(t), _) => t.join(","),
                (None, Some(r)) => {
                    let models = if r.gpu_models.is_empty() {
                        "any GPU".to_string()
                    } else {
                        r.gpu_models.join("|")
                    };
                    if r.max_gpus == u32::MAX {
                        format!("{models} with >={} GPUs", r.min_gpus)
                    } else {
                        format!("{models} with {}-{} GPUs", r.min_gpus, r.max_gpus)
                    }
                }
                (None, None) => String::new(),
            };
            let mode = match &p.gpu_mode {
                GpuMode::Whole => "whole GPUs".to_string(),
                GpuMode::Mig(l) => format!(
                    "MIG {}",
                    l.iter()
                        .map(|(p, n)| format!("{n}x{p}"))
                        .collect::<Vec<_>>()
                        .join("+")
                ),
                GpuMode::Shared { .. } => "shared GPUs".to_string(),
            };
            let caps: Vec<&str> = p.capacity_types.iter().map(|c| c.as_str()).collect();
            let max_gpus = p
                .max_gpus
                .map(|g| format!(", max {g} GPUs"))
                .unwrap_or_default();
            format!(
                "pool {}: {} [{}] in {} ({}), nodes {}..{}{}, {}, priority {}, scale-down {}",
                p.name,
                p.provider,
                types,
                p.zones.join(","),
                caps.join(" > "),
                p.min_nodes,
                p.max_nodes,
                max_gpus,
                mode,
                p.priority,
                if p.scale_down.enabled {
                    format!(
                        "after {} unneeded",
                        duration::format_duration(p.scale_down.unneeded_time)
                    )
                } else {
                    "disabled".to_string()
                }
            )
        })
        .collect()
}

#[cfg(test)]
mod tests;
