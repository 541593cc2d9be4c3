//! The decision core that `run` (the controller) and `simulate` both execute.
//!
//! [`Autoscaler`] owns every piece of decision state — the batching window, the
//! insufficient-capacity cache, per-pool launch back-off, scale-up and scale-down history,
//! launches in flight and given up, drains in progress, what was reported — and holds no I/O:
//! no clock, no client, no runtime. A pass takes an [`Observation`] (the cluster, the cloud's
//! instances, the time) and returns [`Action`]s as plain data; an executor carries them out and
//! answers those that have an outcome (registrations, launches) with [`Feedback`], which may
//! bring more actions (give back a gang's partial launch, plan again at once after an offering
//! ran out of capacity), until a step returns no action. Drains run longer than a pass: their
//! outcome comes back through [`Autoscaler::drain_finished`].
//!
//! The controller executes the actions against the API server and the cloud providers
//! (`controller`), the simulator against its virtual cluster and the in-memory cloud (`sim::ours`).

pub mod batch;
mod disruption;
pub mod drain;
pub mod fleet;
pub mod orphans;
mod refused;
pub mod replace;
mod report;
mod scale_up;
pub mod status;
#[cfg(test)]
mod tests;
mod tracking;
pub mod unclaimed;

pub use batch::Batch;
pub use drain::DrainKind;

use crate::hash::{HashMap, HashSet};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use gpu_node_autoscaler_provider::{
    Catalog, Instance, LaunchRequest, LaunchResult, Notice, OfferingKey, ProviderError,
};

use crate::model::node::GpuXid;
use crate::model::{labels, Node, Snapshot, Time};
use crate::plan::{Plan, Templates};
use crate::policy::Policy;

use fleet::{registrations, FleetView, NodeGauges, NodeIndex, Registration};
use status::{PoolHistory, Status};

/// The `reason` label values of `failed_launches_total`.
pub const LAUNCH_FAILURE_REASONS: [&str; 8] = [
    "insufficient_capacity",
    "quota_exceeded",
    "throttled",
    "invalid_request",
    "not_found",
    "other",
    "provision_timeout",
    "not_recorded",
];

/// Rounds of planning in one pass: an offering newly found short of capacity is avoided and the
/// rest planned again at once, at most this many times.
pub const CAPACITY_ROUNDS: u32 = 3;
/// A launched instance not listed by the cloud yet is remembered this long.
const RECENT_FOR: Duration = Duration::from_secs(300);
/// Given-up launch ids are remembered this long (a re-plan of the same pods uses a new id).
const GIVEN_UP_FOR: Duration = Duration::from_secs(3600);
/// Nodes removed here: a stale cache does not resume their drain for this long.
const REMOVED_FOR: Duration = Duration::from_secs(600);
/// The status is rewritten at least this often while it changes nothing but the time.
const STATUS_EVERY: Duration = Duration::from_secs(10);

/// Settings fixed for the life of the core.
#[derive(Clone, Debug)]
pub struct Config {
    /// Decide and report only: no launch, drain, registration or annotation.
    pub dry_run: bool,
    /// How long a drain may take before the node is given back.
    pub max_graceful_termination: Duration,
    /// Who decides (written into the status).
    pub identity: String,
    /// Seed of the back-off jitter (fixed in the simulator, random in the controller).
    pub seed: u64,
    /// Produce what is only shown to people: pod Events, the status, the kept-node log. The
    /// simulator has no one to show them to and leaves them out (no decision depends on them).
    pub report: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            dry_run: false,
            max_graceful_termination: Duration::from_secs(600),
            identity: String::new(),
            seed: 0,
            report: true,
        }
    }
}

/// What a pass looks at.
#[derive(Clone, Debug, Default)]
pub struct Observation {
    pub now: Time,
    /// Pods, Nodes and PDBs as the API server shows them. In-flight launches, unavailable
    /// offerings and pool history are the core's to fill in.
    pub snapshot: Snapshot,
    /// Every instance the pools' providers list now; `None` when the cloud could not be listed
    /// (then in-flight capacity is unknown and deciding could launch twice: only expired drains
    /// are given back). Shared, so that an executor that keeps its listing between passes
    /// (the simulator) need not copy it.
    pub instances: Option<Arc<Vec<Instance>>>,
    /// providerIDs of Nodes that exist but could not be read: their instances are neither in
    /// flight nor overdue.
    pub other_provider_ids: Vec<String>,
    /// Whether the policy last read was valid (for the status).
    pub policy_valid: bool,
    /// Notices from the cloud's interruption queue received since the last pass (each is
    /// acknowledged with [`Action::AckNotice`] once acted on).
    pub notices: Vec<Notice>,
    /// Per Node name, the XID errors its GPUs last reported, when they were read in this pass
    /// (`None`: not read, the last reading stands).
    pub gpu_xids: Option<BTreeMap<String, Vec<GpuXid>>>,
}

/// The object an Event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    Pod {
        namespace: String,
        name: String,
        uid: String,
    },
    Node(String),
    /// A pool of the policy (about its instances that have no Node): the executor records it on
    /// the policy's ConfigMap.
    Pool(String),
}

/// A Kubernetes Event to record.
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    pub subject: Subject,
    pub warning: bool,
    pub reason: &'static str,
    pub action: &'static str,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
}

/// Something to count or measure.
#[derive(Clone, Debug, PartialEq)]
pub enum Count {
    /// Nodes launched for a pool.
    ScaleUps {
        pool: String,
        nodes: u32,
    },
    /// A node drained and removed.
    ScaleDown {
        pool: String,
    },
    FailedLaunch {
        pool: String,
        reason: &'static str,
    },
    /// Pods a scale-up was decided for (their reaction time is measured from when they became
    /// unschedulable).
    Planned {
        pods: Vec<String>,
    },
    /// Nodes of ours that advertise no GPUs any more (a gauge).
    NodesGpusLost(usize),
    /// Nodes of ours seen unhealthy now (a gauge).
    NodesUnhealthy(usize),
    /// Nodes of ours drifted now (a gauge).
    NodesDrifted(usize),
    /// A node of `pool` kube-scheduler refused a pending pod that fits it on the model
    /// ([`refused`]).
    Refused {
        pool: String,
    },
    /// A node replaced (drained and removed) for `cause` (`unhealthy`, `interrupted`).
    Replaced {
        pool: String,
        cause: &'static str,
    },
    /// The termination of an instance given up (never became a node) failed; it is retried.
    GiveUpTerminateFailed {
        pool: String,
    },
    /// A node in a Capacity Block about to end is replaced: the pod-hours its pods had run there
    /// (work that would be cut off at the block's end), moved to other capacity.
    CapacityBlockPodHoursMoved {
        pool: String,
        pod_hours: f64,
    },
}

/// A drain to run: taint and cordon the node, evict its pods, terminate its instance and delete
/// the Node. At the deadline a voluntary drain not done gives the node back (untaint, uncordon);
/// a forced one removes it with what is left ([`DrainKind`]).
#[derive(Clone, Debug, PartialEq)]
pub struct DrainOrder {
    pub node: String,
    pub pool: String,
    /// The instance, only as the pools' listing names it (never parsed out of a providerID).
    pub instance_id: Option<String>,
    /// For an interrupted spot node, no later than when its instance is taken back.
    pub deadline: Time,
    pub reason: String,
    pub kind: DrainKind,
}

/// A warning about a pool, both logged and raised as an Event on the pool.
fn warn_pool(
    out: &mut Vec<Action>,
    pool: &str,
    reason: &'static str,
    action: &'static str,
    message: String,
) {
    out.push(Action::Log {
        level: Level::Warn,
        message: message.clone(),
    });
    out.push(Action::Event(Note {
        subject: Subject::Pool(pool.to_string()),
        warning: true,
        reason,
        action,
        message,
    }));
}

/// An action for the executor, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Give a Node of ours its pool's labels, taints and annotations. Answered with
    /// [`Feedback::Registered`].
    Register(Registration),
    /// Launch through the pool's provider, trying the offerings in order. Answered with
    /// [`Feedback::Launched`].
    Launch {
        request: LaunchRequest,
        /// The pods (`namespace/name`) the nodes are for.
        pods: Vec<String>,
    },
    /// Terminate an instance of ours (a launch given up or given back). Answered with
    /// [`Feedback::Terminated`].
    Terminate {
        pool: String,
        instance_id: String,
        why: String,
    },
    DeleteNode {
        node: String,
    },
    /// Start a drain; its outcome comes back through [`Autoscaler::drain_finished`].
    Drain(DrainOrder),
    /// Give back a node whose drain (found from the taint) ran past its deadline; the outcome
    /// comes back through [`Autoscaler::drain_finished`].
    RollBack {
        node: String,
        pool: Option<String>,
        why: String,
    },
    /// Add (`present`) or remove a taint of a Node (matched by key and effect).
    Taint {
        node: String,
        taint: crate::model::Taint,
        present: bool,
    },
    /// Delete a notice's message from the queue: what it says is recorded (a node tainted), or
    /// it is about no instance of ours. Only if every earlier `Taint` of the pass succeeded.
    AckNotice {
        message_id: String,
    },
    /// Set a pending pod's `status.nominatedNodeName`: the node launched for it, which the
    /// scheduler tries first for it and keeps room on for it while placing other pods.
    Nominate {
        /// `namespace/name`.
        pod: String,
        uid: String,
        node: String,
    },
    /// Set (or remove, `None`) an annotation of a Node.
    Annotate {
        node: String,
        key: &'static str,
        value: Option<String>,
    },
    Event(Note),
    Log {
        level: Level,
        message: String,
    },
    Count(Count),
    /// Publish the status (the status ConfigMap).
    Status(Box<Status>),
}

/// The outcome of an action that has one.
#[derive(Clone, Debug, PartialEq)]
pub enum Feedback {
    /// A registration was written (`changed`: the Node's labels or taints changed) or failed.
    Registered { node: String, changed: bool },
    Launched {
        launch_id: String,
        result: Result<LaunchResult, ProviderError>,
    },
    /// What the cloud answered to a [`Action::Terminate`] (success: the termination was
    /// accepted; the instance counts until the cloud no longer lists it).
    Terminated {
        instance_id: String,
        result: Result<(), ProviderError>,
    },
}

/// How a drain ended.
#[derive(Clone, Debug, PartialEq)]
pub enum DrainOutcome {
    Removed,
    /// Given back (taint removed, uncordoned), with why.
    RolledBack(String),
    /// Leadership was lost: the next leader finds the drain from the taint.
    Abandoned,
    /// The node was emptied but could not be removed; it stays tainted and is tried again.
    Failed(String),
}

/// One scale-up of the current round: its launch id and whether a launch was asked for.
#[derive(Clone, Debug)]
struct Issued {
    launch_id: String,
    launched: bool,
}

enum Stage {
    /// Registrations asked for; the plan waits for their outcome.
    Registering(BTreeMap<String, Registration>),
    /// Launches asked for in round `round` of `plan`.
    Launching {
        round: u32,
        plan: Box<Plan>,
        issued: Vec<Issued>,
    },
}

/// A pass between its steps.
struct Pass {
    now: Time,
    snapshot: Snapshot,
    instances: Arc<Vec<Instance>>,
    view: FleetView,
    policy: Arc<Policy>,
    templates: Option<Arc<Templates>>,
    policy_valid: bool,
    /// Pod key → index in `snapshot.pods`.
    pod_index: HashMap<String, usize>,
    /// Nodes being replaced → their GPU pods, planned again as pending.
    moving: BTreeMap<String, Vec<String>>,
    /// Nodes kept free for spot whose taint this pass planned without (a pending pod needs
    /// them): the pass takes the taint off.
    released: BTreeSet<String>,
    /// Pods planned again as pending → the node they run on and their phase.
    moved_from: HashMap<String, (String, crate::model::PodPhase)>,
    /// Pods moving off a replaced node whose launch failed in this pass → why.
    launch_failed: BTreeMap<String, String>,
    /// Instances of ours of pools no longer in the policy, with their Nodes.
    orphans: Vec<orphans::Orphan>,
    stage: Stage,
}

/// A pool whose nodes and pods are as they were at a consolidation that found nothing is
/// planned again after this long at the earliest.
const CONSOLIDATION_RELOOK: std::time::Duration = std::time::Duration::from_secs(60 * 60);

/// The decision core.
pub struct Autoscaler {
    config: Config,
    policy: Option<Arc<Policy>>,
    templates: Option<Arc<Templates>>,
    catalog: Catalog,
    batch: Batch,
    launches: Launches,
    fleet: FleetTracking,
    disruption: Disruptions,
    orphan_state: orphans::OrphanState,
    reported: Reported,
    history: BTreeMap<String, PoolHistory>,
    /// History restored from the last leader's status (after a restart or a failover).
    restored: bool,
    pass: Option<Pass>,
    last_plan: Option<Plan>,
    wake: Wake,
    refusals: refused::Refusals,
    /// What each pool launches today ([`crate::plan::lifecycle::fingerprint`]), per policy.
    fingerprints: crate::plan::lifecycle::Fingerprints,
}

/// Scale-up state: offerings short of capacity, launch back-off, the pods each launch was planned
/// for, nominations.
#[derive(Default)]
struct Launches {
    /// Offerings that failed for lack of capacity, unavailable until then.
    ice: BTreeMap<OfferingKey, Time>,
    /// Per pool: no launch before this time after failures other than capacity, and how many.
    launch_backoff: HashMap<String, (Time, u32)>,
    jitter_draws: u64,
    /// Per launch id issued here: when, and the pods planned for each of its nodes (for
    /// [`crate::model::Snapshot::planned`]), kept for the longest a node may take to come.
    planned: BTreeMap<String, (Time, crate::model::snapshot::PlannedNodes)>,
    /// Pending pods nominated here: pod UID → node.
    nominated: HashMap<String, String>,
    /// Per launch id issued here: when, and what it used
    /// ([`crate::plan::lifecycle::fingerprint`]), given to its Nodes at registration; kept for
    /// the longest a node may take to come.
    fingerprints: BTreeMap<String, (Time, String)>,
    /// Per launch id answered short without a failure while the cloud lists none of the rest:
    /// since when. Still so after the max node provision time, it is given up, as a launch
    /// whose instance never becomes a Node is.
    short: HashMap<String, Time>,
}

/// Fleet tracking: instances launched here until listed, launch ids given up, instances seen and
/// registered.
#[derive(Default)]
struct FleetTracking {
    /// Instances launched here, until the cloud's listing shows them.
    recent: HashMap<String, (Instance, Time)>,
    /// Launch ids given up (never registered in time, a gang's partial launch given back, or
    /// their instances gone), with when: a re-plan uses a new id.
    given_up: HashMap<String, Time>,
    /// Live instances seen (listed or launched here) → their launch id.
    seen: HashMap<String, String>,
    /// Instances seen with a Node; and since when those without one any more lost it.
    registered: HashSet<String>,
    lost: HashMap<String, Time>,
    /// Instances of launches given up, while the cloud lists them: their termination, retried
    /// with back-off while it fails.
    terminating: HashMap<String, tracking::Terminating>,
    /// Launches a previous leader asked for without recording their answer
    /// ([`status::Status::launching`]): their pool launches nothing until the cloud lists
    /// them (as many instances as asked), their id is given up, or [`RECENT_FOR`] passed.
    awaited: BTreeMap<String, status::Launching>,
}

/// Disruption state: drains running, nodes removed, replacements, consolidation timers, unneeded
/// times in dry-run.
#[derive(Default)]
struct Disruptions {
    /// Drains and rollbacks running: node → pool.
    drains: BTreeMap<String, Option<String>>,
    /// Nodes removed here, so that a stale view does not resume their drain.
    removed: HashMap<String, Time>,
    /// Nodes being replaced (broken, about to be taken back, or consolidated).
    replace: replace::Replacements,
    /// Nodes drifted or expired.
    lifecycle: disruption::lifecycle::LifecycleState,
    /// Per pool with consolidation: when its running pods are planned again next.
    consolidation_due: BTreeMap<String, Time>,
    /// Per pool: what its last fruitless consolidation looked at, and when.
    consolidation_seen: BTreeMap<String, (u64, Time)>,
    /// Offerings a consolidation was called off for (they ran short), left out of consolidation
    /// plans until the given time: the insufficient-capacity cache forgets them sooner, and a
    /// move planned onto one again launches its fallback for nothing.
    consolidation_short: BTreeMap<OfferingKey, Time>,
    /// "Unneeded since" per node, kept here in dry-run (no annotation is written).
    unneeded_dry: BTreeMap<String, String>,
    /// Unneeded nodes whose instance is not ours, already reported (reported once, never
    /// drained).
    not_ours_reported: BTreeSet<String>,
}

/// What was last reported (Events, logs, the status), so that it is reported again only when it
/// changes.
#[derive(Default)]
struct Reported {
    /// The last NotTriggerScaleUp reason sent per pod.
    notified: HashMap<String, String>,
    /// Why each idle-looking node is kept, as last logged.
    kept: BTreeMap<String, String>,
    /// Nodes whose GPUs went missing, as last reported.
    gpus_lost: BTreeSet<String>,
    /// Unclaimed instances (our name, no identity), as last reported.
    unclaimed: BTreeSet<String>,
    /// Pending pods whose expected run time annotation is no duration, with what was said.
    bad_run_time: BTreeMap<String, String>,
    last_status: Option<(String, Time)>,
    /// The node gauges of the last pass's observation (with reports only).
    node_gauges: NodeGauges,
}

/// From the last finished pass, what [`Autoscaler::next_change`] needs.
#[derive(Default)]
struct Wake {
    /// Unneeded node → its pool.
    unneeded_pools: BTreeMap<String, String>,
    /// Pool → its newest node's creation or launch.
    newest_in_pool: BTreeMap<String, Time>,
}

impl Autoscaler {
    pub fn new(config: Config) -> Autoscaler {
        Autoscaler {
            config,
            policy: None,
            templates: None,
            catalog: Catalog::default(),
            batch: Batch::default(),
            launches: Launches::default(),
            fleet: FleetTracking::default(),
            disruption: Disruptions::default(),
            orphan_state: orphans::OrphanState::default(),
            reported: Reported::default(),
            history: BTreeMap::new(),
            restored: false,
            pass: None,
            last_plan: None,
            wake: Wake::default(),
            refusals: refused::Refusals::default(),
            fingerprints: Default::default(),
        }
    }

    /// The node gauges of the last pass's observation, its nodes adopted into pools as the pass
    /// saw them (kept only when the core reports).
    pub fn node_gauges(&self) -> &NodeGauges {
        &self.reported.node_gauges
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Puts a policy in force with the catalog its offerings are priced from.
    pub fn set_policy(&mut self, policy: Arc<Policy>, catalog: Catalog) {
        self.templates = Some(Arc::new(Templates::new(&policy, &catalog)));
        self.catalog = catalog;
        self.policy = Some(policy);
    }

    pub fn policy(&self) -> Option<&Arc<Policy>> {
        self.policy.as_ref()
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// What the ProvisioningRequests of a pass call for under the policy in force (see
    /// [`crate::provisioning::assess`]): the executor plans the pass with
    /// [`crate::provisioning::Assessment::snapshot`] and writes the updates. Without a policy,
    /// nothing.
    pub fn assess_provisioning(
        &self,
        snapshot: &Snapshot,
        requests: &[crate::provisioning::ProvisioningRequest],
        now: Time,
    ) -> crate::provisioning::Assessment {
        match (&self.policy, &self.templates) {
            (Some(policy), Some(templates)) if !requests.is_empty() => {
                crate::provisioning::assess(snapshot, templates, policy, requests, now)
            }
            _ => Default::default(),
        }
    }

    /// What the CapacityBuffers of a pass call for under the policy in force (see
    /// [`crate::buffer::assess`]): `snapshot` is the one the pass plans (with the
    /// ProvisioningRequests' pods); the executor plans with
    /// [`crate::buffer::Assessment::snapshot`] and writes the updates. Without a policy, nothing.
    pub fn assess_buffers(
        &self,
        snapshot: &Snapshot,
        buffers: &[crate::buffer::CapacityBuffer],
        now: Time,
    ) -> crate::buffer::Assessment {
        match (&self.policy, &self.templates) {
            (Some(policy), Some(templates)) if !buffers.is_empty() => {
                crate::buffer::assess(snapshot, templates, policy, buffers, now)
            }
            _ => Default::default(),
        }
    }

    /// Whether the last leader's history must be read (with [`Autoscaler::restore`]) before
    /// the next pass decides anything.
    pub fn needs_restore(&self) -> bool {
        !self.restored
    }

    /// Restores cooldowns, back-offs, given-up launches and launches the cloud did not list yet
    /// from the status the last leader wrote (`status.json`; `None` when there is none).
    pub fn restore(&mut self, status_json: Option<&str>) {
        self.restored = true;
        let Some(json) = status_json else { return };
        for (id, at) in status::given_up_of(json) {
            self.fleet.given_up.entry(id).or_insert(at);
        }
        // Asked of the cloud by the last leader, answer unknown: what the cloud made of it is
        // seen in its listing, which may lag; the pool waits for it rather than launching for
        // the same pods again under another id.
        for (id, l) in status::launching_of(json) {
            self.fleet.awaited.entry(id).or_insert(l);
        }
        // Launched by the last leader, not listed yet: in flight from their launch, for as long
        // as this process would remember its own.
        for i in status::launched_unlisted_of(json) {
            let at = Time(i.launched_at_ms);
            self.fleet
                .recent
                .entry(i.id.clone())
                .or_insert_with(|| (i.clone(), at));
            self.fleet
                .seen
                .entry(i.id.clone())
                .or_insert_with(|| i.launch_id.clone());
        }
        for (pool, h) in status::history_of(json) {
            let mine = self.history.entry(pool).or_default();
            mine.last_scale_up = mine.last_scale_up.max(h.last_scale_up);
            mine.last_scale_down = mine.last_scale_down.max(h.last_scale_down);
            mine.last_scale_down_failure =
                mine.last_scale_down_failure.max(h.last_scale_down_failure);
        }
    }

    /// Another replica may lead from now on: a pass under way is dropped, and the history is
    /// read again on taking over. `not_done` are the actions of the last step that were not
    /// carried out (their drains are not running).
    pub fn leadership_lost(&mut self, not_done: &[Action]) {
        self.pass = None;
        self.restored = false;
        for a in not_done {
            match a {
                Action::Drain(DrainOrder { node, .. }) | Action::RollBack { node, .. } => {
                    self.disruption.drains.remove(node);
                }
                Action::Nominate { uid, .. } => {
                    self.launches.nominated.remove(uid);
                }
                _ => {}
            }
        }
    }

    /// New pods became unschedulable.
    pub fn unschedulable_seen(&mut self, now: Time) {
        self.batch.add(now);
    }

    /// When the batching window closes (a pass is due then); `None` when it is not open.
    pub fn batch_deadline(&self) -> Option<Time> {
        let (idle, max) = self
            .policy
            .as_ref()
            .map(|p| (p.batching.idle, p.batching.max))
            .unwrap_or((Duration::from_secs(1), Duration::from_secs(10)));
        self.batch.deadline(idle, max)
    }

    /// Whether the last pass kept nodes it would have removed but for `maxConcurrentDrains`:
    /// once drains end, the next pass removes more of them. No timer says when, so a loop that
    /// skips the passes which cannot change the decision ([`Autoscaler::next_change`]) must not
    /// skip the next one.
    pub fn scale_down_held(&self) -> bool {
        self.last_plan
            .as_ref()
            .is_some_and(|p| p.held_for_drains > 0)
    }

    /// The plan of the last finished pass.
    pub fn last_plan(&self) -> Option<&Plan> {
        self.last_plan.as_ref()
    }

    /// Whether a drain (or rollback) of `node` is running.
    pub fn draining(&self, node: &str) -> bool {
        self.disruption.drains.contains_key(node)
    }

    pub fn drains(&self) -> usize {
        self.disruption.drains.len()
    }

    /// Whether a pass has steps left (it waits for [`Feedback`]).
    pub fn in_pass(&self) -> bool {
        self.pass.is_some()
    }

    /// When the decision could change with nothing new observed: an unneeded node's delay, a
    /// pool's cooldown or scale-down back-off running out; while pods wait, an unavailable
    /// offering or a pool's launch back-off expiring. `None` when nothing is timed.
    pub fn next_change(&self, now: Time) -> Option<Time> {
        let (Some(policy), Some(plan)) = (&self.policy, &self.last_plan) else {
            return None;
        };
        let mut next: Option<Time> = None;
        let mut consider = |t: Time| {
            if t > now {
                next = Some(next.map_or(t, |n: Time| n.min(t)));
            }
        };
        for u in &plan.unneeded {
            let Some(pool) = self
                .wake
                .unneeded_pools
                .get(&u.node)
                .and_then(|p| policy.pool(p))
            else {
                continue;
            };
            if let Ok(since) = Time::parse_rfc3339(&u.since) {
                consider(since + pool.scale_down.unneeded_time);
                consider(since + pool.scale_down.empty_unneeded_time);
            }
            if let Some(h) = self.history.get(&pool.name) {
                if let Some(t) = h.last_scale_up {
                    consider(t + pool.scale_down.cooldown_after_scale_up);
                }
                if let Some(t) = h.last_scale_down_failure {
                    consider(t + pool.scale_down.backoff_after_failure);
                }
            }
            if let Some(t) = self.wake.newest_in_pool.get(&pool.name) {
                consider(*t + pool.scale_down.cooldown_after_scale_up);
            }
        }
        if plan.unschedulable.iter().any(|u| !u.permanent) {
            for until in self.launches.ice.values() {
                consider(*until);
            }
            for (until, _) in self.launches.launch_backoff.values() {
                consider(*until);
            }
            for l in self.fleet.awaited.values() {
                consider(l.asked_at + RECENT_FOR);
            }
        }
        for t in self.disruption.replace.timers() {
            consider(t);
        }
        let grace_of = |pool: &str| {
            policy
                .pool(pool)
                .and_then(|p| p.disruption.termination_grace_period)
        };
        for t in self.disruption.lifecycle.timers(grace_of) {
            consider(t);
        }
        // A scheduled disruption budget opening or closing changes what may be disrupted.
        for pool in &policy.pools {
            if let Some(t) = crate::plan::disrupt::next_budget_change(pool, now) {
                consider(t);
            }
        }
        // A pool whose last look found nothing is looked at again when something changes (a
        // pass comes then anyway) or after a while; one with nodes and no look yet, when due.
        for (pool, due) in &self.disruption.consolidation_due {
            match self.disruption.consolidation_seen.get(pool) {
                Some((_, at)) => consider((*at + CONSOLIDATION_RELOOK).max(*due)),
                None => consider(*due),
            }
        }
        if let Some(t) = plan.spot_wait_until {
            consider(t);
        }
        next
    }

    /// Starts a pass. Returns its first actions; feed outcomes back with [`Autoscaler::resume`]
    /// until it returns none.
    pub fn pass(&mut self, mut obs: Observation) -> Vec<Action> {
        self.pass = None;
        self.batch.clear();
        let mut out = Vec::new();
        if let (Some(policy), Some(instances)) = (&self.policy, &obs.instances) {
            // Nodes adopted by a pool's nodeSelector count as the pool's, in decisions and gauges.
            let ours: HashSet<&str> = instances
                .iter()
                .filter(|i| !i.unclaimed)
                .map(|i| i.provider_id.as_str())
                .collect();
            fleet::adopt_nodes(&mut obs.snapshot.nodes, &ours, &policy.pools);
        }
        if self.config.report {
            self.reported.node_gauges = fleet::node_gauges(&obs.snapshot.nodes);
        }
        if !self.restored {
            // Deciding without the last leader's cooldowns and back-offs could scale too early.
            return out;
        }
        let now = obs.now;
        // Giving nodes back needs neither a policy nor the cloud.
        self.roll_back_expired_drains(&obs.snapshot, now, &mut out);
        let (Some(policy), Some(instances)) = (self.policy.clone(), obs.instances) else {
            return out;
        };
        // Instances with our name but not our identity are not ours: reported, never touched.
        let (instances, unclaimed) = unclaimed::split(instances);
        self.report_unclaimed(&unclaimed, &mut out);
        // Instances of pools no longer in the policy are no pool's: reported, never counted.
        let (instances, orphans) = {
            let index = NodeIndex::new(&obs.snapshot.nodes);
            orphans::split(instances, &policy, &index, &obs.other_provider_ids)
        };
        self.launches.ice.retain(|_, until| *until > now);
        self.fleet
            .given_up
            .retain(|_, at| now.since(*at) < GIVEN_UP_FOR);
        self.disruption
            .removed
            .retain(|_, at| now.since(*at) < REMOVED_FOR);
        self.track_instances(&instances, now);
        if let Some(x) = obs.gpu_xids.take() {
            self.disruption.replace.xids = x;
        }
        self.record_notices(
            std::mem::take(&mut obs.notices),
            &instances,
            now,
            now + policy.insufficient_capacity_ttl,
            &mut out,
        );
        self.learn_templates(&obs.snapshot.nodes, &mut out);
        let index = NodeIndex::new(&obs.snapshot.nodes);
        let mut view = self.fleet_of(&instances, &index, &obs.other_provider_ids, &policy, now);
        // Their Nodes are ours: a drain finds their instance.
        for o in orphans.iter().filter(|o| o.node.is_some()) {
            view.instance_of_node
                .insert(o.instance.provider_id.clone(), o.instance.id.clone());
        }
        let regs = registrations(
            instances.iter(),
            &index,
            &policy.pools,
            &self.catalog,
            &self.launches.fingerprints,
        );
        drop(index);
        let pod_index = if self.config.report {
            obs.snapshot
                .pods
                .iter()
                .enumerate()
                .map(|(i, p)| (p.id.to_string(), i))
                .collect()
        } else {
            HashMap::default()
        };
        let mut pass = Pass {
            now,
            snapshot: obs.snapshot,
            instances,
            view,
            policy,
            templates: self.templates.clone(),
            policy_valid: obs.policy_valid,
            pod_index,
            moving: BTreeMap::new(),
            released: BTreeSet::new(),
            moved_from: HashMap::default(),
            launch_failed: BTreeMap::new(),
            orphans,
            stage: Stage::Registering(BTreeMap::new()),
        };
        if !self.config.dry_run && !regs.is_empty() {
            out.extend(regs.values().cloned().map(Action::Register));
            pass.stage = Stage::Registering(regs);
            self.pass = Some(pass);
            return out;
        }
        self.after_registration(pass, regs, &mut out);
        out
    }

    /// Continues the pass with the outcomes of its last actions.
    pub fn resume(&mut self, feedback: Vec<Feedback>) -> Vec<Action> {
        let mut out = Vec::new();
        // Answers to terminations come back whatever the step (also after the pass's last one).
        for f in &feedback {
            if let Feedback::Terminated {
                instance_id,
                result,
            } = f
            {
                match result {
                    Ok(()) => self.give_up_terminated(instance_id, &mut out),
                    Err(e) => self.give_up_terminate_failed(instance_id, e, &mut out),
                }
            }
        }
        let Some(mut pass) = self.pass.take() else {
            return out;
        };
        match std::mem::replace(&mut pass.stage, Stage::Registering(BTreeMap::new())) {
            Stage::Registering(regs) => {
                let changed = feedback.iter().any(|f| {
                    matches!(f, Feedback::Registered { node, changed: true }
                        if regs.get(node).is_some_and(Registration::changes_shape))
                });
                if changed {
                    // Decide on what the API server shows once the registrations are in: a pass
                    // that planned on nodes registered in the same pass was seen (on a loaded
                    // machine) to leave them out and launch again for pods they would take.
                    for r in regs.values() {
                        out.push(Action::Log {
                            level: Level::Info,
                            message: format!("registered node {} in pool {}", r.node, r.pool),
                        });
                    }
                    return out;
                }
                self.after_registration(pass, regs, &mut out);
            }
            Stage::Launching {
                round,
                plan,
                issued,
            } => {
                self.after_launches(pass, round, *plan, issued, feedback, &mut out);
            }
        }
        out
    }

    // ---- the steps of a pass ----

    fn after_registration(
        &mut self,
        mut pass: Pass,
        regs: BTreeMap<String, Registration>,
        out: &mut Vec<Action>,
    ) {
        let now = pass.now;
        for n in &mut pass.snapshot.nodes {
            if let Some(r) = regs.get(&n.name) {
                r.apply(n);
            }
            if self.config.dry_run {
                if let Some(since) = self.disruption.unneeded_dry.get(&n.name) {
                    Arc::make_mut(&mut n.annotations)
                        .insert(labels::UNNEEDED_SINCE.into(), since.clone());
                }
            }
        }
        self.give_up_overdue(&pass, out);
        self.report_gpus_lost(&pass.view, out);
        self.resume_drains(&pass, out);
        self.choose_disruptions(&mut pass, out);
        if pass.templates.is_none() {
            return;
        }
        self.plan_round(pass, 0, now, out);
    }

    /// The rest of a pass once launching is done: reasons for the pods it cannot help, drains,
    /// "unneeded since" annotations, the status.
    fn finish(&mut self, pass: Pass, plan: Plan, out: &mut Vec<Action>) {
        if self.config.report {
            self.report(&pass, &plan, out);
        }
        self.disrupt(&pass, &plan, out);
        self.orphans(&pass, out);
        if self.config.report {
            self.publish(&pass, &plan, out);
        }
        // What `next_change` needs: each unneeded node's pool, each pool's newest node or launch
        // (the planner's cooldown starts there too). Names are cloned per pool and per unneeded
        // node only: this runs every pass.
        let mut newest: BTreeMap<String, Time> = BTreeMap::new();
        let mut note = |pool: &str, t: Time| match newest.get_mut(pool) {
            Some(n) => *n = (*n).max(t),
            None => {
                newest.insert(pool.to_string(), t);
            }
        };
        for n in &pass.snapshot.nodes {
            if let Some(p) = n.pool() {
                note(p, n.created);
            }
        }
        for f in &pass.snapshot.in_flight {
            note(&f.pool, f.launched_at);
        }
        let unneeded: HashSet<&str> = plan.unneeded.iter().map(|u| u.node.as_str()).collect();
        let pools: BTreeMap<String, String> = pass
            .snapshot
            .nodes
            .iter()
            .filter(|n| unneeded.contains(n.name.as_str()))
            .filter_map(|n| n.pool().map(|p| (n.name.clone(), p.to_string())))
            .collect();
        self.wake = Wake {
            unneeded_pools: pools,
            newest_in_pool: newest,
        };
        self.last_plan = Some(plan);
    }
}

fn pod_subject(p: &crate::model::Pod) -> Subject {
    Subject::Pod {
        namespace: p.id.namespace.clone(),
        name: p.id.name.clone(),
        uid: p.uid.clone(),
    }
}

/// The instance of ours a Node is, as the pools' listing names it.
fn instance_of<'a>(n: &Node, view: &FleetView, instances: &'a [Instance]) -> Option<&'a Instance> {
    n.provider_id
        .as_ref()
        .and_then(|p| view.instance_of_node.get(p))
        .and_then(|id| instances.iter().find(|i| &i.id == id))
}

fn has_drain_taint(n: &Node) -> bool {
    n.taints
        .iter()
        .any(|t| t.key == labels::TO_BE_DELETED_TAINT)
}

/// When the drain of `n` must be given up: its start (annotation; `now` when missing) plus the
/// drain time allowed.
pub fn drain_deadline(n: &Node, max: Duration, now: Time) -> Time {
    n.annotations
        .get(labels::DRAIN_STARTED)
        .and_then(|s| Time::parse_rfc3339(s).ok())
        .unwrap_or(now)
        + max
}
