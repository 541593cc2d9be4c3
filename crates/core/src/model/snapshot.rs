//! The one value the planner reads: everything it needs to know about the cluster and the cloud.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpu_node_autoscaler_provider::OfferingKey;

use super::node::Node;
use super::pod::Pod;
use super::time::Time;

/// A PodDisruptionBudget, reduced to what eviction checks need.
#[derive(Clone, Debug, PartialEq)]
pub struct Pdb {
    pub namespace: String,
    pub name: String,
    /// `matchLabels` and `matchExpressions` as requirements; an empty selector selects all pods
    /// in the namespace (policy/v1).
    pub selector: Vec<crate::model::Requirement>,
    /// From status: how many more pods may be disrupted now.
    pub disruptions_allowed: i32,
}

impl Pdb {
    pub fn selects(&self, pod: &Pod) -> bool {
        pod.id.namespace == self.namespace && self.selector.iter().all(|r| r.matches(&pod.labels))
    }
}

/// Instances launched for a pool whose Nodes have not registered yet.
#[derive(Clone, Debug, PartialEq)]
pub struct InFlight {
    pub launch_id: String,
    pub pool: String,
    pub offering: OfferingKey,
    pub count: u32,
    pub launched_at: Time,
}

/// Groups launched instances without a Node into in-flight launches, one per launch id and
/// offering, each launched at its earliest instance's time, oldest first (the planner fills
/// in-flight capacity in this order: by arrival, not by how launch ids happen to sort). Items:
/// (launch id, pool, offering, launch time).
pub fn group_in_flight<'a>(
    instances: impl IntoIterator<Item = (&'a str, &'a str, &'a OfferingKey, Time)>,
) -> Vec<InFlight> {
    let mut flights: BTreeMap<(&str, &OfferingKey), InFlight> = BTreeMap::new();
    for (launch_id, pool, offering, launched_at) in instances {
        let f = flights
            .entry((launch_id, offering))
            .or_insert_with(|| InFlight {
                launch_id: launch_id.to_string(),
                pool: pool.to_string(),
                offering: offering.clone(),
                count: 0,
                launched_at,
            });
        f.count += 1;
        f.launched_at = f.launched_at.min(launched_at);
    }
    let mut out: Vec<InFlight> = flights.into_values().collect();
    out.sort_by(|a, b| {
        (a.launched_at, &a.launch_id, &a.offering).cmp(&(b.launched_at, &b.launch_id, &b.offering))
    });
    out
}

/// A launch's pods as planned, one list of pod keys per node.
pub type PlannedNodes = Arc<Vec<Vec<String>>>;

/// What the autoscaler remembers about a pool between decisions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolState {
    pub last_scale_up: Option<Time>,
    pub last_scale_down_failure: Option<Time>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub pods: Vec<Pod>,
    pub nodes: Vec<Node>,
    pub pdbs: Vec<Pdb>,
    pub in_flight: Vec<InFlight>,
    /// Instances the cloud still lists that are neither capacity nor a Node: launches given up
    /// (no Node within the max node provision time) whose termination the cloud has not
    /// confirmed, or that failed. They count against the pools' and the cluster's limits until
    /// the cloud no longer lists them.
    pub held: Vec<InFlight>,
    /// Per launch id: the pods the plan that launched it meant for each of its nodes (pod keys,
    /// `namespace/name`), while its nodes are on their way, so that a later plan puts them
    /// back there instead of packing them again from scratch.
    pub planned: BTreeMap<String, PlannedNodes>,
    /// Offerings that recently failed for lack of capacity, unavailable until the given time.
    pub unavailable: BTreeMap<OfferingKey, Time>,
    /// The account's capacity reservations as the cloud last reported them (counts of what can
    /// still be launched into each); the pools that select one plan it as a reserved offering.
    pub reservations: Vec<gpu_node_autoscaler_provider::Reservation>,
    /// Pool → the launch template version (and image) a moving version (`$Latest`,
    /// `$Default`) resolves to now, as the cloud last reported it
    /// ([`gpu_node_autoscaler_provider::CloudProvider::launch_versions`]); part of what a launch
    /// records and what drift compares ([`crate::plan::lifecycle::fingerprint`]).
    pub launch_versions: BTreeMap<String, String>,
    pub pools: BTreeMap<String, PoolState>,
    /// DeviceClasses, ResourceSlices and allocated devices (Dynamic Resource Allocation).
    pub dra: super::dra::DraState,
    /// The CSI drivers' per-node attach limits, from the CSINodes.
    pub attach_limits: super::volumes::AttachLimits,
}

impl Snapshot {
    /// Sets every node's count of published devices from the ResourceSlices in `dra`.
    pub fn count_published_devices(&mut self) {
        for n in &mut self.nodes {
            n.dra_devices = self.dra.published(&n.name) as i64;
        }
    }
}

impl Snapshot {
    pub fn is_unavailable(&self, key: &OfferingKey, now: Time) -> bool {
        self.unavailable.get(key).is_some_and(|until| now < *until)
    }
}
