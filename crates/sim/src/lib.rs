//! Offline simulation: replay a workload (a scenario or a real GPU trace) on a virtual clock
//! against a strategy (ours, or Cluster Autoscaler / Karpenter semantics), on an in-memory cloud.
//!
//! The engine owns the cluster side: pods arrive, a kube-scheduler-like placement binds them
//! (whole, MIG and shared GPUs, ResourceClaims on published devices, selectors, affinity, taints;
//! gangs all-or-nothing as coscheduling does), bound pods run for their duration, launched
//! instances register as nodes after a boot delay and advertise their GPUs (or publish their
//! devices) after a device-plugin delay, spot instances get interrupted.
//! The strategy owns the decisions and talks to the cloud through the `MemoryProvider`.

pub mod baselines;
pub mod bound;
pub mod claims;
pub mod engine;
pub mod generate;
pub mod groups;
pub mod ours;
pub mod plot;
pub mod report;
pub mod scenario;
pub mod trace;

#[cfg(test)]
mod tests;
#[cfg(test)]
use gpu_node_autoscaler_core::catalog;
use gpu_node_autoscaler_core::model;
use gpu_node_autoscaler_provider::Catalog;

use gpu_node_autoscaler_core::model::Pod;
use gpu_node_autoscaler_core::policy::Policy;

/// Milliseconds on the virtual clock.
pub type Ms = i64;

pub const SECOND: Ms = 1000;
pub const MINUTE: Ms = 60 * SECOND;
pub const HOUR: Ms = 60 * MINUTE;

/// The earlier of two optional times.
pub fn earliest(a: Option<Ms>, b: Option<Ms>) -> Option<Ms> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// One pod of the workload.
#[derive(Clone, Debug)]
pub struct WorkloadPod {
    /// The pod as it is created (pending, unbound).
    pub pod: Pod,
    pub arrival: Ms,
    /// Run time once bound; `None` for pods that run until `deleted_at`.
    pub duration: Option<Ms>,
    /// Deleted at this time whatever its state (a replica removed by an HPA scale-in).
    pub deleted_at: Option<Ms>,
}

/// Something that happens to the cloud during a run.
#[derive(Clone, Debug, PartialEq)]
pub enum CloudEvent {
    /// Offerings matching this have no (or limited) capacity from `at` to `until`.
    InsufficientCapacity {
        at: Ms,
        until: Ms,
        zone: Option<String>,
        capacity_type: Option<gpu_node_autoscaler_provider::CapacityType>,
        instance_types: Vec<String>,
        max_instances: Option<u32>,
    },
    /// A share of the running spot instances (of a pool, or all) get a 2-minute notice.
    SpotInterruption {
        at: Ms,
        fraction: f64,
        pool: Option<String>,
    },
    /// A share of the GPU nodes (of a pool, or all) get a broken GPU: the node shows
    /// `AcceleratedHardwareReady=False`, its GPU reports `xid` (read through `gpuMetrics`), its
    /// pods make no progress and no GPU pod is placed on it any more.
    GpuFailure {
        at: Ms,
        fraction: f64,
        pool: Option<String>,
        xid: u32,
    },
    /// An account quota from `at` on.
    Quota {
        at: Ms,
        max_instances: Option<u32>,
        max_gpus: Option<u32>,
    },
    /// The pool's launch template (or the image it resolves to) changes at `at`: its nodes
    /// launched before are drifted from then on.
    Drift { at: Ms, pool: String },
}

/// Timing of the simulated cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterTiming {
    /// A GPU node registers between these (uniform, seeded).
    pub boot_min: Ms,
    pub boot_max: Ms,
    /// Then it is Ready but advertises no GPUs for this long.
    pub device_plugin_delay: Ms,
}

impl Default for ClusterTiming {
    fn default() -> Self {
        ClusterTiming {
            boot_min: 90 * SECOND,
            boot_max: 180 * SECOND,
            device_plugin_delay: 60 * SECOND,
        }
    }
}

/// Everything a run needs.
#[derive(Clone, Debug)]
pub struct SimInput {
    pub name: String,
    pub policy: Policy,
    pub catalog: Catalog,
    pub pods: Vec<WorkloadPod>,
    pub events: Vec<CloudEvent>,
    pub timing: ClusterTiming,
    /// Stop at this time even if pods remain (scenarios may set it).
    pub until: Option<Ms>,
    pub seed: u64,
    /// Input rows that were left out, with why (for the report).
    pub skipped: Vec<(String, usize)>,
    /// DeviceClasses the pods' ResourceClaims name (Dynamic Resource Allocation), by name.
    pub device_classes: std::collections::BTreeMap<String, model::dra::DeviceClass>,
    /// The account's capacity reservations (ODCRs, Capacity Blocks), times on the run's clock.
    pub reservations: Vec<gpu_node_autoscaler_provider::Reservation>,
    /// The account's Auto Scaling groups and the pools they back (none: every pool launches
    /// with `CreateFleet`).
    pub groups: groups::Groups,
    /// Jobs queued by Kueue behind a ProvisioningRequest admission check: their pods are created
    /// only once the job is admitted.
    pub kueue_jobs: Vec<KueueJob>,
    /// CapacityBuffers (warm capacity kept as spare chunks).
    pub buffers: Vec<SimBuffer>,
    /// The PersistentVolumeClaims, PersistentVolumes and StorageClasses the pods' volumes name
    /// (empty: no pod has volumes).
    pub storage: model::volumes::Storage,
}

/// A job Kueue queues with a ProvisioningRequest admission check
/// (`best-effort-atomic-scale-up.autoscaling.x-k8s.io`): submitted when its pods arrive, admitted
/// (its pods created) when the strategy provisions its request; a strategy without
/// ProvisioningRequests has Kueue admit it on quota at once.
#[derive(Clone, Debug, PartialEq)]
pub struct KueueJob {
    pub name: String,
    /// Its pods (indices into [`SimInput::pods`]), all arriving together.
    pub pods: Vec<usize>,
}

/// A CapacityBuffer of the active strategy: `replicas` chunks shaped as `chunk` (a pending pod,
/// such as one replica of a service).
#[derive(Clone, Debug, PartialEq)]
pub struct SimBuffer {
    pub name: String,
    pub chunk: Pod,
    pub replicas: u32,
}

/// The strategies the simulator knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrategyKind {
    Ours,
    CaLike,
    KarpenterLike,
}

impl StrategyKind {
    pub const ALL: [StrategyKind; 3] = [
        StrategyKind::Ours,
        StrategyKind::CaLike,
        StrategyKind::KarpenterLike,
    ];

    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::Ours => "gpu-node-autoscaler",
            StrategyKind::CaLike => "ca-like",
            StrategyKind::KarpenterLike => "karpenter-like",
        }
    }

    pub fn parse(s: &str) -> Option<StrategyKind> {
        StrategyKind::ALL.into_iter().find(|k| k.name() == s)
    }

    pub fn build(self, input: &SimInput) -> Box<dyn engine::Strategy> {
        match self {
            StrategyKind::Ours => Box::new(ours::Ours::new(input)),
            StrategyKind::CaLike => Box::new(baselines::CaLike::new(input)),
            StrategyKind::KarpenterLike => Box::new(baselines::KarpenterLike::new(input)),
        }
    }
}

/// A scenario's YAML text, with the built-in AWS catalog at list prices, as the simulator's
/// input (for tests).
#[cfg(test)]
pub(crate) fn test_input(text: &str) -> SimInput {
    let sc = scenario::parse_scenario(text, "t.yaml").unwrap();
    let types = catalog::parse_csv(catalog::BUILTIN_AWS, "builtin").unwrap();
    let catalog = catalog::offerings_from_list_prices(&sc.policy, types);
    sc.into_input(catalog, None)
}

/// [`test_input`] of a scenario with a one-minute boot, a 30 s device plugin, these zones, one
/// A10G pool (its fields after `name: a10g`, in flow style) and these jobs (YAML list items).
#[cfg(test)]
pub(crate) fn test_a10g_input(zones: &str, pool: &str, jobs: &str) -> SimInput {
    test_pools_input(zones, &[&format!("name: a10g, {pool}")], jobs)
}

/// [`test_a10g_input`] with these pools (each the fields of a flow-style mapping).
#[cfg(test)]
pub(crate) fn test_pools_input(zones: &str, pools: &[&str], jobs: &str) -> SimInput {
    let pools: String = pools.iter().map(|p| format!("    - {{{p}}}\n")).collect();
    test_input(&format!(
        "name: t\n\
         timing: {{bootMin: 60s, bootMax: 60s, devicePluginDelay: 30s}}\n\
         policy:\n  clusterName: sim\n  zones: [{zones}]\n  pools:\n{pools}\
         jobs:\n{jobs}"
    ))
}
