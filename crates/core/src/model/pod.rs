//! Pods as the planner sees them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use super::constraints::Constraints;
use super::resources::{GpuShare, Resources};
use super::time::Time;

/// `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

impl PodRef {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> PodRef {
        PodRef {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl PodPhase {
    pub fn parse(s: &str) -> PodPhase {
        match s {
            "Pending" | "" => PodPhase::Pending,
            "Running" => PodPhase::Running,
            "Succeeded" => PodPhase::Succeeded,
            "Failed" => PodPhase::Failed,
            _ => PodPhase::Unknown,
        }
    }

    /// Succeeded and Failed pods hold no resources.
    pub fn is_terminal(self) -> bool {
        matches!(self, PodPhase::Succeeded | PodPhase::Failed)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OwnerKind {
    ReplicaSet,
    ReplicationController,
    StatefulSet,
    DaemonSet,
    Job,
    /// A Kubeflow training job (`MPIJob`, `PyTorchJob`, `TFJob`, ...), which recreates its pods.
    Kubeflow(String),
    Other(String),
}

impl OwnerKind {
    pub fn parse(kind: &str, api_version: &str) -> OwnerKind {
        match kind {
            "ReplicaSet" => OwnerKind::ReplicaSet,
            "ReplicationController" => OwnerKind::ReplicationController,
            "StatefulSet" => OwnerKind::StatefulSet,
            "DaemonSet" => OwnerKind::DaemonSet,
            "Job" => OwnerKind::Job,
            _ if api_version.starts_with("kubeflow.org/") => OwnerKind::Kubeflow(kind.to_string()),
            _ => OwnerKind::Other(kind.to_string()),
        }
    }
}

/// The controlling owner reference.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Owner {
    pub kind: OwnerKind,
    pub name: String,
    pub uid: String,
}

/// Membership in a gang: pods that only make progress together.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GangRef {
    /// `namespace/group`.
    pub key: String,
    /// The group's minimum size, when the pods carry it.
    pub min_member: Option<u32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Pod {
    pub id: PodRef,
    pub uid: String,
    pub labels: Arc<BTreeMap<String, String>>,
    pub annotations: Arc<BTreeMap<String, String>>,
    /// Effective requests: containers, init containers and overhead, with shared-GPU units
    /// taken out into `share`.
    pub requests: Resources,
    pub share: Option<GpuShare>,
    /// Shared by all pods with equal constraints, which lets the planner group them cheaply.
    pub constraints: Arc<Constraints>,
    pub node_name: Option<String>,
    pub phase: PodPhase,
    pub owner: Option<Owner>,
    pub gang: Option<GangRef>,
    pub priority: i32,
    pub created: Time,
    /// When its node's kubelet accepted it (`status.startTime`); `None` while it is not on a
    /// node. A pod that moves is a new pod, or (in the simulator) starts again.
    pub started: Option<Time>,
    pub deleting: bool,
    /// The scheduler tried and found no node (`PodScheduled=False`, reason `Unschedulable`).
    pub unschedulable: bool,
    /// The scheduler's message with that condition (which rules refused which nodes).
    pub scheduler_message: Option<String>,
    /// Uses `emptyDir` or `hostPath` volumes, lost when the node goes.
    pub local_storage: bool,
    /// On shared-GPU nodes, the GPU index the device plugin assigned, when known.
    pub shared_gpu_index: Option<usize>,
    /// The node it is expected on (`status.nominatedNodeName`): set by the scheduler when it
    /// preempts for the pod, and by the controller for a pending pod whose node it launched.
    pub nominated_node: Option<String>,
    /// Why this pod's spec cannot be planned for (a malformed quantity, ...).
    pub problem: Option<String>,
    /// Its ResourceClaims (`spec.resourceClaims`), in the pod's order.
    pub claims: Vec<super::dra::PodClaim>,
    /// Its volumes that come from PersistentVolumeClaims (see [`super::volumes`]).
    pub volumes: Vec<super::volumes::PodVolume>,
    /// Why it cannot be placed until something else changes (its claim bound, a volume freed):
    /// reported, not planned for, and not for good.
    pub waiting: Option<String>,
}

impl Pod {
    /// Its expected run time, from the annotation `gpu-node-autoscaler.io/expected-run-time`
    /// (a duration such as `90m` or `6h`, as policy durations are written): `Ok(None)` without
    /// the annotation, an error naming the annotation when its value is no positive duration.
    pub fn expected_run_time(&self) -> Result<Option<std::time::Duration>, String> {
        let key = super::labels::EXPECTED_RUN_TIME;
        let Some(v) = self.annotations.get(key) else {
            return Ok(None);
        };
        match crate::policy::duration::parse_duration(v) {
            Ok(d) if d.is_zero() => Err(format!("annotation {key}: must be longer than 0s")),
            Ok(d) => Ok(Some(d)),
            Err(e) => Err(format!("annotation {key}: {e}")),
        }
    }

    pub fn is_daemonset(&self) -> bool {
        matches!(&self.owner, Some(o) if o.kind == OwnerKind::DaemonSet)
    }

    /// Asks for any kind of GPU: whole, MIG slice or shared, or devices through ResourceClaims.
    pub fn wants_gpu(&self) -> bool {
        self.requests.whole_gpus() > 0
            || self.requests.mig_slices().next().is_some()
            || self.share.is_some()
            || self.claims.iter().any(|c| !c.spec.requests.is_empty())
    }

    /// Has a ResourceClaim whose devices a plan must find (see [`super::dra::PodClaim::needs_devices`]).
    pub fn needs_devices(&self) -> bool {
        self.claims.iter().any(super::dra::PodClaim::needs_devices)
    }

    /// Waiting for a node: not bound, not finished, not being deleted.
    pub fn is_pending(&self) -> bool {
        self.node_name.is_none() && self.phase == PodPhase::Pending && !self.deleting
    }

    /// Holds resources on its node.
    pub fn is_bound_active(&self) -> bool {
        self.node_name.is_some() && !self.phase.is_terminal()
    }

    /// Fits a node with this much free (`free`, per-GPU `shared`) and these labels and taints:
    /// resources, the shared-GPU share on one physical GPU, selectors, affinity, tolerations.
    pub fn fits(
        &self,
        free: &Resources,
        shared: &[super::resources::SharedGpu],
        labels: &std::collections::BTreeMap<String, String>,
        taints: &[super::constraints::Taint],
        node_name: Option<&str>,
    ) -> bool {
        self.requests.fits_in(free)
            && self
                .share
                .is_none_or(|s| super::resources::share_copies(shared, &s) > 0)
            && self.constraints.admits(labels, taints, node_name)
    }

    /// Size in GPU equivalents, for ordering (MIG slices count by compute share).
    pub fn gpu_equivalents(&self) -> f64 {
        let mut g = self.requests.whole_gpus() as f64;
        for (profile, n) in self.requests.mig_slices() {
            let compute = super::gpu::parse_mig_profile(profile).map_or(1, |p| p.compute);
            g += n as f64 * compute as f64 / super::gpu::MIG_COMPUTE_SLICES as f64;
        }
        if let Some(s) = &self.share {
            g += (s.core_pct as f64 / 100.0)
                .max(s.mem_gib as f64 / 16.0)
                .min(1.0);
        }
        g
    }
}
