//! Pure data model: resources, pods, nodes, gangs and the cluster snapshot the planner reads.
//! Nothing here does I/O.

pub mod constraints;
pub mod dra;
pub mod gpu;
pub mod mig;
pub mod node;
pub mod pod;
pub mod quantity;
pub mod resources;
pub mod snapshot;
pub mod time;
pub mod topology;
pub mod volumes;

pub use constraints::{Constraints, Effect, Operator, Requirement, Taint, Term, Toleration};
pub use node::Node;
pub use pod::{GangRef, Owner, OwnerKind, Pod, PodPhase, PodRef};
pub use resources::{GpuShare, Resources, SharedGpu};
pub use snapshot::{InFlight, Pdb, Snapshot};
pub use time::Time;
pub use topology::{HostPort, PodTopology, Site, TopologyIndex};

/// Labels and annotations this project reads and writes.
pub mod labels {
    pub const POOL: &str = "gpu-node-autoscaler.io/pool";
    pub const CAPACITY_TYPE: &str = "gpu-node-autoscaler.io/capacity-type";
    pub const GPU_MODEL: &str = "gpu-node-autoscaler.io/gpu-model";
    pub const LAUNCH_ID: &str = "gpu-node-autoscaler.io/launch-id";
    pub const KARPENTER_CAPACITY_TYPE: &str = "karpenter.sh/capacity-type";
    /// The capacity reservation a node runs in: ours and Karpenter's AWS provider's.
    pub const CAPACITY_RESERVATION_ID: &str = "gpu-node-autoscaler.io/capacity-reservation-id";
    pub const KARPENTER_CAPACITY_RESERVATION_ID: &str = "karpenter.k8s.aws/capacity-reservation-id";
    pub const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
    pub const ZONE: &str = "topology.kubernetes.io/zone";
    pub const REGION: &str = "topology.kubernetes.io/region";
    pub const NVIDIA_PRODUCT: &str = "nvidia.com/gpu.product";
    pub const NVIDIA_COUNT: &str = "nvidia.com/gpu.count";
    pub const AWS_ACCELERATOR: &str = "k8s.amazonaws.com/accelerator";
    pub const ARCH: &str = "kubernetes.io/arch";
    pub const OS: &str = "kubernetes.io/os";

    pub const TO_BE_DELETED_TAINT: &str = "gpu-node-autoscaler.io/to-be-deleted";
    /// Taints a joining node carries until it is Ready and initialised, which its node
    /// lifecycle controller or cloud controller manager then takes off: a pod need not tolerate
    /// them to be counted on a node that is still starting.
    pub const STARTING_NODE_TAINTS: [&str; 3] = [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.cloudprovider.kubernetes.io/uninitialized",
    ];
    pub const SAFE_TO_EVICT: &str = "gpu-node-autoscaler.io/safe-to-evict";
    pub const CA_SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
    pub const SCALE_DOWN_DISABLED: &str = "gpu-node-autoscaler.io/scale-down-disabled";
    /// Karpenter's: on a pod, its node is not disrupted; on a node, the node is not.
    pub const KARPENTER_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
    /// The Cluster Autoscaler's: the local volumes (comma-separated names) a pod may lose.
    pub const CA_SAFE_TO_EVICT_LOCAL_VOLUMES: &str =
        "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes";
    pub const CA_SCALE_DOWN_DISABLED: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";
    pub const UNNEEDED_SINCE: &str = "gpu-node-autoscaler.io/unneeded-since";
    /// When the drain of a node started (RFC 3339).
    pub const DRAIN_STARTED: &str = "gpu-node-autoscaler.io/drain-started";
    /// The drain cordoned the node (a rollback uncordons only what it cordoned, never a node an
    /// administrator had cordoned).
    pub const CORDONED_BY_DRAIN: &str = "gpu-node-autoscaler.io/cordoned-by-drain";
    /// On a Node of ours once it has advertised GPUs: from then on, GPUs missing from it are an
    /// outage (a device plugin restarting, a GPU lost), never a launch that did not come up.
    pub const GPUS_ADVERTISED: &str = "gpu-node-autoscaler.io/gpus-advertised";
    /// On a Node being replaced (NoSchedule; the value says why: `unhealthy`, `interrupted` or
    /// `consolidating`): no new pod lands while its pods get a place elsewhere.
    pub const REPLACING_TAINT: &str = "gpu-node-autoscaler.io/replacing";
    /// What a launch of a pool used (an instance tag, and an annotation on its Node from
    /// registration on): a hash per part of the pool, compared with what the pool would launch
    /// today to find drifted nodes ([`crate::plan::lifecycle`]).
    pub const LAUNCH_FINGERPRINT: &str = gpu_node_autoscaler_provider::LAUNCH_FINGERPRINT_TAG;
    /// On an empty on-demand Node of a pool that prefers spot, while its spot is to be had
    /// (NoSchedule): new pods get spot nodes instead of refilling it, and it is removed.
    pub const SPOT_AVAILABLE_TAINT: &str = "gpu-node-autoscaler.io/spot-available";
    /// On a pod of a batch Job or training operator: it checkpoints and may be moved by
    /// consolidation (`"true"`), whatever the pool's `consolidation.moveJobs`.
    pub const RESTARTABLE: &str = "gpu-node-autoscaler.io/restartable";
    /// On a pod: how long it is expected to run once started (a duration such as `90m` or
    /// `6h`), so that it is not planned onto a Capacity Block that ends before it would.
    pub const EXPECTED_RUN_TIME: &str = "gpu-node-autoscaler.io/expected-run-time";
    /// On a Node of ours seen unhealthy: since when (RFC 3339), so that a new leader keeps the
    /// clock.
    pub const UNHEALTHY_SINCE: &str = "gpu-node-autoscaler.io/unhealthy-since";

    /// Pod-group labels/annotations that make pods one gang, in lookup order.
    pub const GANG_KEYS: [&str; 5] = [
        "scheduling.k8s.io/group-name",
        "pod-group.scheduling.sigs.k8s.io",
        "training.kubeflow.org/job-name",
        "mpi-job-name",
        "gpu-node-autoscaler.io/gang",
    ];
    /// Annotations that carry a gang's minimum size.
    pub const GANG_MIN_MEMBER_KEYS: [&str; 3] = [
        "scheduling.k8s.io/group-min-member",
        "pod-group.scheduling.sigs.k8s.io/min-available",
        "gpu-node-autoscaler.io/gang-min-member",
    ];
}
