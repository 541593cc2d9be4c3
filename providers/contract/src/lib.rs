//! The contract between gpu-node-autoscaler and a cloud: the [`CloudProvider`] trait and the
//! plain data types it speaks in. No cloud SDK lives here, so the planner, the simulator and every
//! provider crate can depend on it without pulling one in.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub mod interruptions;
pub mod policy;
pub mod retry;
pub mod rng;
pub mod spec;

/// How an instance is bought.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityType {
    Spot,
    OnDemand,
    /// Inside a capacity reservation the account has already paid for (an On-Demand Capacity
    /// Reservation or a Capacity Block for ML): its offerings come from the cloud's
    /// [`Reservation`]s, not from a price list.
    Reserved,
}

impl CapacityType {
    /// The capacity types a price list offers (reserved capacity is bought beforehand).
    pub const ALL: [CapacityType; 2] = [CapacityType::Spot, CapacityType::OnDemand];

    /// The spelling used in policies, labels and JSON output: `spot`, `on-demand` or
    /// `reserved` (Karpenter's values of `karpenter.sh/capacity-type`).
    pub fn as_str(self) -> &'static str {
        match self {
            CapacityType::Spot => "spot",
            CapacityType::OnDemand => "on-demand",
            CapacityType::Reserved => "reserved",
        }
    }

    pub fn parse(s: &str) -> Option<CapacityType> {
        match s {
            "spot" => Some(CapacityType::Spot),
            "on-demand" => Some(CapacityType::OnDemand),
            "reserved" => Some(CapacityType::Reserved),
            _ => None,
        }
    }
}

/// What kind of capacity reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReservationKind {
    /// An On-Demand Capacity Reservation: open-ended unless it has an end date.
    Default,
    /// A Capacity Block for ML: fixed start and end; the cloud takes its instances back at the
    /// end.
    CapacityBlock,
}

impl ReservationKind {
    /// `default` or `capacity-block` (EC2's `ReservationType`).
    pub fn as_str(self) -> &'static str {
        match self {
            ReservationKind::Default => "default",
            ReservationKind::CapacityBlock => "capacity-block",
        }
    }
}

/// A capacity reservation of the account: instances of one type in one zone, paid for whether
/// they run or not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    /// The cloud's id (`cr-...`).
    pub id: String,
    pub kind: ReservationKind,
    pub instance_type: String,
    pub zone: String,
    /// Instances it holds in all.
    pub total: u32,
    /// Instances that can still be launched into it now.
    pub available: u32,
    /// When it starts and ends (ms since the epoch); `None`: already started, or no end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_ms: Option<i64>,
    /// Its tags, for the policy's tag selectors.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// What it costs per hour while it lasts, used or not (reported; never a planning cost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_per_hour: Option<f64>,
}

impl Reservation {
    /// Whether instances can be launched into it at `now_ms` (between its start and end).
    pub fn active_at(&self, now_ms: i64) -> bool {
        self.start_ms.is_none_or(|s| s <= now_ms) && self.end_ms.is_none_or(|e| now_ms < e)
    }

    /// The offering it is.
    pub fn offering(&self) -> OfferingKey {
        OfferingKey {
            instance_type: self.instance_type.clone(),
            zone: self.zone.clone(),
            capacity_type: CapacityType::Reserved,
        }
    }
}

impl fmt::Display for CapacityType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who made a GPU, which decides the extended resource its device plugin advertises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuVendor {
    Nvidia,
    Amd,
}

impl GpuVendor {
    /// A cloud's name of a GPU such as `NVIDIA A10` or `AMD MI300X` → (vendor, model `A10`); a
    /// name without a vendor word is NVIDIA's, and is the model as it stands.
    pub fn split_name(name: &str) -> (GpuVendor, String) {
        let s = name.trim();
        let vendor = if s.to_ascii_lowercase().starts_with("amd") {
            GpuVendor::Amd
        } else {
            GpuVendor::Nvidia
        };
        let model = s
            .split_once(' ')
            .filter(|(v, _)| matches!(v.to_ascii_lowercase().as_str(), "nvidia" | "amd"))
            .map(|(_, m)| m.trim().to_string())
            .unwrap_or_else(|| s.to_string());
        (vendor, model)
    }

    /// The extended resource its device plugin advertises whole GPUs as.
    pub fn resource(self) -> &'static str {
        match self {
            GpuVendor::Nvidia => "nvidia.com/gpu",
            GpuVendor::Amd => "amd.com/gpu",
        }
    }
}

/// The accelerators of an instance type.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Short model name as the catalog gives it, e.g. `A10G`, `A100`, `T4`.
    pub model: String,
    pub vendor: GpuVendor,
    pub count: u32,
    /// Memory of ONE GPU.
    pub memory_mib: u64,
}

/// The shape of an instance type, independent of zone and capacity type.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceType {
    pub name: String,
    pub vcpu: u32,
    pub memory_mib: u64,
    pub gpu: Option<GpuInfo>,
    /// On-demand list price in USD per hour, where the source knows one.
    pub on_demand_price: Option<f64>,
}

/// One purchasable thing: instance type × zone × capacity type.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OfferingKey {
    pub instance_type: String,
    pub zone: String,
    pub capacity_type: CapacityType,
}

impl fmt::Display for OfferingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.instance_type, self.zone, self.capacity_type
        )
    }
}

/// An offering with its current price and whether the cloud currently has capacity for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Offering {
    pub key: OfferingKey,
    pub price_per_hour: f64,
    pub available: bool,
}

/// Everything a provider can launch: shapes and offerings, unavailable ones included.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Catalog {
    pub instance_types: Vec<InstanceType>,
    pub offerings: Vec<Offering>,
}

impl Catalog {
    pub fn instance_type(&self, name: &str) -> Option<&InstanceType> {
        self.instance_types.iter().find(|t| t.name == name)
    }
}

/// A request to launch `count` instances for one pool, trying `offerings` in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LaunchRequest {
    /// Idempotency key: launching twice with the same id never creates more than `count`.
    pub launch_id: String,
    pub pool: String,
    pub count: u32,
    /// Preferred first; a provider may use any of them but should respect the order.
    pub offerings: Vec<OfferingKey>,
    /// Extra tags/labels to put on the instances (cluster, pool and launch id are added by the
    /// provider from the fields above).
    pub tags: BTreeMap<String, String>,
    /// The capacity reservations the request's `reserved` offerings launch into, preferred
    /// first, each with its room when the launch was planned: a provider launches a reserved
    /// offering into these (targeted by id, a Capacity Block as such), never into a
    /// reservation the pool does not select. A reserved offering with none of them has no
    /// capacity.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<Reservation>,
    /// All `count` instances or none, in one zone, of one instance type (a gang's nodes, a
    /// best-effort-atomic ProvisioningRequest's): a provider that can make the cloud itself
    /// atomic does (on AWS a fleet's `MinTargetCapacity`); the decision core gives back a
    /// partial launch of a gang either way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub atomic: bool,
}

/// What a cloud says the Nodes of one of a pool's scaling groups look like, for a pool whose
/// templates come from the cloud (an Auto Scaling group read as the Cluster Autoscaler reads it
/// for scale from zero): the core plans the pool from these where its policy leaves a field out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupTemplate {
    /// The group's name, for people.
    pub group: String,
    /// The instance types it launches, in its order.
    pub instance_types: Vec<String>,
    /// The zones it launches into.
    pub zones: Vec<String>,
    pub capacity_type: Option<CapacityType>,
    /// The labels its Nodes register with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The taints its Nodes register with, as `(key, value, effect)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<(String, String, String)>,
    /// Resources its Nodes advertise besides the instance type's, as quantities
    /// (`ephemeral-storage: 100Gi`, `example.com/fpga: 1`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, String>,
}

impl GroupTemplate {
    /// Whether the group launches `key`: its instance type, in one of its zones, bought its way.
    pub fn serves(&self, key: &OfferingKey) -> bool {
        self.capacity_type.is_none_or(|c| c == key.capacity_type)
            && self.instance_types.contains(&key.instance_type)
            && self.zones.contains(&key.zone)
    }
}

/// Lifecycle state of an instance as the cloud reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceState {
    Pending,
    Running,
    ShuttingDown,
    Terminated,
}

/// An instance the provider owns for us.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Instance {
    pub id: String,
    /// The Kubernetes `spec.providerID` its Node will carry.
    pub provider_id: String,
    pub pool: String,
    pub launch_id: String,
    pub offering: OfferingKey,
    pub state: InstanceState,
    /// Launch time in milliseconds since the Unix epoch.
    pub launched_at_ms: i64,
    /// The capacity reservation it runs in (`cr-...`), where the cloud says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
    /// What its launch used (the launch request's [`LAUNCH_FINGERPRINT_TAG`]), where the cloud
    /// keeps the launch's tags: a Node registered after the launching process is gone gets it
    /// from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_fingerprint: Option<String>,
    /// It carries this cluster's name but no cluster identity, while this cluster's identity is
    /// known: another installation of the same name, its scaling group's own, or one launched
    /// by a version before the identity. Listed so that it is seen and reported, but never
    /// ours to adopt, give up or terminate.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unclaimed: bool,
}

/// The tag a launch request carries with what the launch used (its pool's launch fingerprint);
/// providers keep it on the instance with the request's other tags.
pub const LAUNCH_FINGERPRINT_TAG: &str = "gpu-node-autoscaler.io/launch-fingerprint";

/// The outcome of a launch: providers fulfil partially, so both lists may be non-empty.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LaunchResult {
    pub launched: Vec<Instance>,
    /// Offerings that failed, with why. The caller marks insufficient ones unavailable.
    pub failures: Vec<(OfferingKey, ProviderError)>,
}

/// Typed provider errors, so that callers can react without parsing messages.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ProviderError {
    #[error("insufficient capacity for {offering}")]
    InsufficientCapacity { offering: OfferingKey },
    #[error("quota exceeded: {message}")]
    QuotaExceeded { message: String },
    #[error("throttled by the cloud API{}", retry_after.map(|d| format!(", retry after {}s", d.as_secs())).unwrap_or_default())]
    Throttled { retry_after: Option<Duration> },
    #[error("invalid request: {message}")]
    InvalidRequest { message: String },
    #[error("not found: {id}")]
    NotFound { id: String },
    #[error("{message}")]
    Other { message: String },
}

impl ProviderError {
    /// A short, stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ProviderError::InsufficientCapacity { .. } => "insufficient_capacity",
            ProviderError::QuotaExceeded { .. } => "quota_exceeded",
            ProviderError::Throttled { .. } => "throttled",
            ProviderError::InvalidRequest { .. } => "invalid_request",
            ProviderError::NotFound { .. } => "not_found",
            ProviderError::Other { .. } => "other",
        }
    }
}

/// A cloud that can launch and terminate GPU instances for node pools.
///
/// Implementations must be safe to call concurrently. `terminate` of an instance that is already
/// gone succeeds. `list` is the truth after a restart: it returns every instance tagged as ours
/// for the pool, whatever state the controller lost.
#[async_trait::async_trait]
pub trait CloudProvider: Send + Sync {
    /// A short name, e.g. `aws`, `memory`.
    fn name(&self) -> &str;
    /// Every offering the provider knows for the given pools' instance types, unavailable ones
    /// included.
    async fn catalog(&self) -> Result<Catalog, ProviderError>;
    async fn launch(&self, request: &LaunchRequest) -> Result<LaunchResult, ProviderError>;
    async fn terminate(&self, instance_id: &str) -> Result<(), ProviderError>;
    async fn list(&self, pool: &str) -> Result<Vec<Instance>, ProviderError>;
    /// The account's capacity reservations the pools may launch into (their ids and tags are
    /// matched against the policy's `capacityReservations`), with their counts now. A provider
    /// without reservations has none.
    async fn reservations(&self) -> Result<Vec<Reservation>, ProviderError> {
        Ok(Vec::new())
    }
    /// What the pools whose launch settings name a version that moves (a launch template's
    /// `$Latest` or `$Default`) launch now: pool → a text naming the version it resolves to
    /// (and its image), e.g. `lt-0abc version 7 (ami-0def)`. The core records it with each
    /// launch, and a node launched under another is drifted. Pools that name a fixed version
    /// are left out; a provider without moving versions has none.
    async fn launch_versions(&self) -> Result<BTreeMap<String, String>, ProviderError> {
        Ok(BTreeMap::new())
    }
    /// For the pools whose templates come from the cloud (their policy section says so, see
    /// [`policy::ProviderPolicy::templates_from_cloud`]): pool → its groups' templates, in the
    /// pool's order of preference. The core plans such a pool from them where its policy leaves
    /// a field out. A provider without such pools has none.
    async fn templates(&self) -> Result<BTreeMap<String, Vec<GroupTemplate>>, ProviderError> {
        Ok(BTreeMap::new())
    }
}

/// What a cloud announces about instances: they are about to be taken back or changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NoticeKind {
    /// A spot instance is reclaimed in about two minutes.
    SpotInterruption,
    /// A spot instance is at elevated risk of interruption (replace early where allowed).
    Rebalance,
    /// Scheduled maintenance (retirement, reboot) of the instance's host.
    ScheduledChange,
    /// The instance is stopping or terminating (by someone else than the autoscaler).
    Stopping,
}

impl NoticeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NoticeKind::SpotInterruption => "spot_interruption",
            NoticeKind::Rebalance => "rebalance",
            NoticeKind::ScheduledChange => "scheduled_change",
            NoticeKind::Stopping => "stopping",
        }
    }

    /// For people: `spot interruption`, `rebalance`, ...
    pub fn describe(self) -> String {
        self.as_str().replace('_', " ")
    }
}

/// One notice, as a queue delivers it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The queue's id of the message (acknowledged once the notice is acted on).
    pub message_id: String,
    pub kind: NoticeKind,
    /// Instances the notice is about (provider ids as the cloud names them, e.g. `i-0abc...`).
    pub instance_ids: Vec<String>,
    /// When the cloud sent it (ms since the epoch; an EventBridge event's `time`), where it
    /// says: a spot instance is taken back two minutes after its warning was sent, not after it
    /// was read.
    pub sent_at_ms: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_type_spelling_round_trips() {
        for ct in CapacityType::ALL {
            assert_eq!(CapacityType::parse(ct.as_str()), Some(ct));
        }
        assert_eq!(CapacityType::parse("ondemand"), None);
        assert_eq!(
            CapacityType::parse(CapacityType::Reserved.as_str()),
            Some(CapacityType::Reserved)
        );
    }

    #[test]
    fn a_capacity_block_reservation_is_active_between_its_start_and_end() {
        let r = Reservation {
            id: "cr-1".into(),
            kind: ReservationKind::CapacityBlock,
            instance_type: "p5.48xlarge".into(),
            zone: "us-east-1a".into(),
            total: 2,
            available: 2,
            start_ms: Some(1_000),
            end_ms: Some(2_000),
            tags: BTreeMap::new(),
            price_per_hour: None,
        };
        assert!(!r.active_at(999));
        assert!(r.active_at(1_000));
        assert!(r.active_at(1_999));
        assert!(!r.active_at(2_000));
    }

    #[test]
    fn throttled_message_names_retry_after() {
        let e = ProviderError::Throttled {
            retry_after: Some(Duration::from_secs(3)),
        };
        assert_eq!(e.to_string(), "throttled by the cloud API, retry after 3s");
        assert_eq!(e.metric_label(), "throttled");
    }
}
