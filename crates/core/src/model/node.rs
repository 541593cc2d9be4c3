//! Nodes as the planner sees them.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::constraints::{Effect, Taint};
use super::labels;
use super::resources::{Resources, SharedGpu};
use super::time::Time;

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub labels: Arc<BTreeMap<String, String>>,
    pub annotations: Arc<BTreeMap<String, String>>,
    pub taints: Vec<Taint>,
    /// Allocatable as the kubelet reports it (shared-GPU units excluded, see `shared_gpus`).
    pub allocatable: Resources,
    /// Shared-GPU nodes: one entry per physical GPU, at full size.
    pub shared_gpus: Vec<SharedGpu>,
    pub ready: bool,
    /// Conditions other than `Ready`: type → status (`True`, `False`, `Unknown`).
    pub conditions: BTreeMap<String, String>,
    /// Cordoned (`spec.unschedulable`).
    pub unschedulable: bool,
    pub created: Time,
    pub provider_id: Option<String>,
    pub deleting: bool,
    /// Devices the node publishes in ResourceSlices (Dynamic Resource Allocation).
    pub dra_devices: i64,
}

impl Node {
    pub fn pool(&self) -> Option<&str> {
        self.labels.get(labels::POOL).map(String::as_str)
    }

    pub fn instance_type(&self) -> Option<&str> {
        self.labels.get(labels::INSTANCE_TYPE).map(String::as_str)
    }

    pub fn zone(&self) -> Option<&str> {
        self.labels.get(labels::ZONE).map(String::as_str)
    }

    /// `spot` or `on-demand`, from our label, Karpenter's or EKS's (`SPOT`/`ON_DEMAND`);
    /// on-demand when none says.
    pub fn capacity_type(&self) -> &str {
        self.capacity_type_label().unwrap_or("on-demand")
    }

    /// The capacity type the node's labels give (ours, Karpenter's or EKS's `SPOT`/`ON_DEMAND`),
    /// if one does.
    pub fn capacity_type_label(&self) -> Option<&str> {
        self.labels
            .get(labels::CAPACITY_TYPE)
            .or_else(|| self.labels.get(labels::KARPENTER_CAPACITY_TYPE))
            .map(String::as_str)
            .or_else(|| {
                self.labels.get("eks.amazonaws.com/capacityType").map(|v| {
                    if v == "SPOT" {
                        "spot"
                    } else {
                        "on-demand"
                    }
                })
            })
    }

    /// Marked for deletion by us (the to-be-deleted taint).
    pub fn is_being_deleted(&self) -> bool {
        self.deleting
            || self
                .taints
                .iter()
                .any(|t| t.key == labels::TO_BE_DELETED_TAINT && t.effect == Effect::NoSchedule)
    }

    /// New pods can be scheduled here now.
    pub fn is_schedulable(&self) -> bool {
        self.ready && !self.unschedulable && !self.is_being_deleted()
    }

    /// The taints that stay once the node has started: all but the not-ready, unreachable and
    /// cloud-uninitialized ones a starting node carries until it is Ready.
    pub fn lasting_taints(&self) -> Vec<Taint> {
        self.taints
            .iter()
            .filter(|t| !labels::STARTING_NODE_TAINTS.contains(&t.key.as_str()))
            .cloned()
            .collect()
    }

    /// GPUs the node advertises right now, of any kind: extended resources, or devices it
    /// publishes through Dynamic Resource Allocation.
    pub fn advertised_gpus(&self) -> i64 {
        gpu_units(&self.allocatable, &self.shared_gpus) + self.dra_devices
    }
}

/// GPU units an allocatable offers: whole GPUs, MIG slices and shared GPUs (what a Node
/// advertises, and what a template of its instance type should).
pub fn gpu_units(allocatable: &Resources, shared: &[SharedGpu]) -> i64 {
    allocatable.whole_gpus()
        + allocatable.mig_slices().map(|(_, n)| n).sum::<i64>()
        + shared.len() as i64
}

/// The last XID error a GPU of a node reported (dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuXid {
    /// The GPU's index on the node.
    pub gpu: String,
    pub xid: u32,
}
