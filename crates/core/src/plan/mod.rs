//! The planner: a pure function from a cluster snapshot, a catalog and a policy at time `now` to a
//! [`Plan`] value. Acting on the plan (launching, draining, Events) is a separate, later step.

pub mod bound;
pub mod consolidate;
mod devices;
pub mod disrupt;
pub mod lifecycle;
pub mod output;
mod pack;
pub mod scale_down;
pub mod templates;

use gpu_node_autoscaler_provider::{CapacityType, Catalog, OfferingKey};
use serde::{Serialize, Serializer};

use crate::model::{PodRef, Snapshot, Time};
use crate::policy::Policy;

pub use scale_down::{Eviction, Unneeded};
pub use templates::{build_templates, Template, Templates};

/// One offering of a scale-up's fallback list.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PlannedOffering {
    pub instance_type: String,
    pub zone: String,
    /// Printed `spot` or `on-demand`.
    pub capacity_type: CapacityType,
    pub price_per_hour: f64,
}

impl PlannedOffering {
    pub fn key(&self) -> OfferingKey {
        OfferingKey {
            instance_type: self.instance_type.clone(),
            zone: self.zone.clone(),
            capacity_type: self.capacity_type,
        }
    }
}

/// A pod a scale-up is for: `namespace/name` (as plans print it) and its UID (a pod re-created
/// under its old name is another pod, and gets another launch).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PlannedPod {
    pub key: String,
    pub uid: String,
}

impl PlannedPod {
    pub fn of(p: &crate::model::Pod) -> PlannedPod {
        PlannedPod {
            key: p.id.to_string(),
            uid: p.uid.clone(),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.key
    }
}

impl Serialize for PlannedPod {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.key)
    }
}

impl std::fmt::Display for PlannedPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.key)
    }
}

impl std::borrow::Borrow<str> for PlannedPod {
    fn borrow(&self) -> &str {
        &self.key
    }
}

impl PartialEq<&str> for PlannedPod {
    fn eq(&self, other: &&str) -> bool {
        self.key == *other
    }
}

impl PartialEq<str> for PlannedPod {
    fn eq(&self, other: &str) -> bool {
        self.key == other
    }
}

/// Launch `count` nodes of one instance type for `pool`, trying `offerings` in order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScaleUp {
    pub pool: String,
    pub count: u32,
    /// Ordered fallback list: the first is the planned (cheapest preferred) offering.
    pub offerings: Vec<PlannedOffering>,
    /// The pods these nodes are for.
    pub pods: Vec<PlannedPod>,
    /// Set when the nodes are for a gang: launch all of them, in one zone, or none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gang: Option<String>,
    /// How many of `pods` go on each node, in order (`pods` is the nodes' lists concatenated).
    #[serde(skip)]
    pub pods_per_node: Vec<usize>,
}

impl ScaleUp {
    /// $/hour of the planned (first) offering times the count.
    pub fn cost_per_hour(&self) -> f64 {
        self.offerings
            .first()
            .map_or(0.0, |o| o.price_per_hour * self.count as f64)
    }
}

/// A node to drain and remove.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScaleDown {
    pub node: String,
    pub pool: String,
    pub reason: String,
    /// Pods to evict, each with the remaining node it fits on.
    pub evict: Vec<Eviction>,
    pub saves_per_hour: f64,
}

/// A node that looks idle but stays, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Kept {
    pub node: String,
    pub reason: String,
}

/// How an [`Unschedulable`] reason begins when the pools' or the cluster's limits (`maxNodes`,
/// `maxGpus`, `limits`) leave no room for the pod.
pub const LIMITS_REACHED: &str = "limits reached";

/// A pending pod the plan cannot help, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Unschedulable {
    pub pod: String,
    pub reason: String,
    /// Nothing this policy can launch will ever host it (as it is specified now): waiting does
    /// not help.
    #[serde(skip)]
    pub permanent: bool,
}

/// A pending pod that fits capacity already there or on its way.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Placement {
    pub pod: String,
    /// A node name, or `launch/<id>` for nodes launched but not registered yet.
    pub target: String,
    /// The pod's index in the snapshot planned from.
    #[serde(skip)]
    pub pod_index: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Plan {
    pub scale_ups: Vec<ScaleUp>,
    pub scale_downs: Vec<ScaleDown>,
    pub unschedulable: Vec<Unschedulable>,
    /// Pending pods that need no new node: they fit free, booting or in-flight capacity.
    pub existing_capacity: Vec<Placement>,
    /// Idle-looking nodes that are kept, with why.
    pub kept: Vec<Kept>,
    /// Every node unneeded now and since when: the controller keeps this in the node annotation
    /// `gpu-node-autoscaler.io/unneeded-since` and clears it from nodes not listed.
    pub unneeded: Vec<Unneeded>,
    /// Nodes that every other rule lets go but that are kept for want of a drain slot
    /// (`maxConcurrentDrains`): a pass after drains have ended removes them.
    #[serde(skip)]
    pub held_for_drains: usize,
    pub added_cost_per_hour: f64,
    /// Configuration problems met while planning (e.g. a pool naming an unknown instance type);
    /// the other pools still planned.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The earliest time a pod now waiting for spot (`spotMaxWait`) may have on-demand.
    #[serde(skip)]
    pub spot_wait_until: Option<Time>,
}

/// Plans scale-ups for the pending GPU pods of `snapshot`, and scale-downs of idle GPU nodes.
pub fn plan(snapshot: &Snapshot, catalog: &Catalog, policy: &Policy, now: Time) -> Plan {
    plan_with(snapshot, &Templates::new(policy, catalog), policy, now)
}

/// [`plan`] of a snapshot as the controller would see it (the `plan` command): nodes without a
/// pool label that carry every label of a pool's `nodeSelector` are adopted into that pool, as
/// the controller adopts them, so they count and may be unneeded. The controller drains only
/// instances it can remove: an adopted node of a pool backed by its cloud groups (an Auto
/// Scaling group, which the controller shrinks by that instance) stays a scale-down; any other
/// adopted node is kept, reported as not ours (`ScaleDownNotOwned`).
pub fn plan_adopting(snapshot: &Snapshot, catalog: &Catalog, policy: &Policy, now: Time) -> Plan {
    let mut s = snapshot.clone();
    let before: std::collections::BTreeSet<String> = s
        .nodes
        .iter()
        .filter(|n| n.pool().is_some())
        .map(|n| n.name.clone())
        .collect();
    crate::autoscaler::fleet::adopt_nodes(&mut s.nodes, &Default::default(), &policy.pools);
    let adopted: std::collections::BTreeSet<&str> = s
        .nodes
        .iter()
        .filter(|n| n.pool().is_some() && !before.contains(&n.name))
        .map(|n| n.name.as_str())
        .collect();
    let mut out = plan(&s, catalog, policy, now);
    let mut kept = Vec::new();
    out.scale_downs.retain(|d| {
        let scales_its_groups = policy
            .pool(&d.pool)
            .is_some_and(|p| p.templates_from_cloud);
        if !adopted.contains(d.node.as_str()) || scales_its_groups {
            return true;
        }
        kept.push(Kept {
            node: d.node.clone(),
            reason: format!(
                "not ours (ScaleDownNotOwned): unneeded in pool {} (would save ${:.3}/hour: {}),                  but its instance was not launched by this autoscaler: scale its node group down                  to remove it",
                d.pool, d.saves_per_hour, d.reason
            ),
        });
        false
    });
    out.kept.extend(kept);
    out
}

/// [`plan`] with templates built once for a policy and catalog (a long-running loop).
pub fn plan_with(snapshot: &Snapshot, templates: &Templates, policy: &Policy, now: Time) -> Plan {
    let warnings = templates.errors.clone();
    let templates = templates.for_snapshot(snapshot, now);
    let (mut plan, left, devices) = pack::scale_up(snapshot, &templates, policy, now);
    let targeted: std::collections::BTreeSet<&str> = plan
        .existing_capacity
        .iter()
        .map(|p| p.target.as_str())
        .collect();
    let down = scale_down::scale_down(snapshot, &templates, policy, now, left, &devices, &targeted);
    plan.scale_downs = down.scale_downs;
    plan.kept = down.kept;
    plan.unneeded = down.unneeded;
    plan.held_for_drains = down.held_for_drains;
    plan.added_cost_per_hour = plan.scale_ups.iter().map(ScaleUp::cost_per_hour).sum();
    plan.warnings = warnings;
    plan
}

/// The pods a plan is about: pending, GPU-requesting, not DaemonSet pods.
pub fn is_planned_pod(p: &crate::model::Pod) -> bool {
    p.is_pending()
        && !p.is_daemonset()
        && (p.requests.whole_gpus() > 0
            || p.requests.mig_slices().next().is_some()
            || p.share.is_some()
            || p.needs_devices()
            || p.problem.is_some())
}

/// `ns/name` of a pod, as plans print it.
pub fn pod_name(p: &PodRef) -> String {
    p.to_string()
}

#[cfg(test)]
mod tests;
