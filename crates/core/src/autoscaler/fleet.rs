//! Pure bookkeeping between the cloud's instances and the cluster's Nodes: what is in flight,
//! what never became a working node in time, and how launches are named and tagged so that a
//! restarted controller finds them again.

use crate::hash::{HashMap, HashSet};
use std::collections::BTreeMap;
use std::hash::Hasher;
use std::sync::Arc;
use std::time::Duration;

use gpu_node_autoscaler_provider::{
    CapacityType, Catalog, Instance, InstanceState, LaunchRequest, OfferingKey, Reservation,
};

use crate::model::snapshot::group_in_flight;
use crate::model::{labels, InFlight, Node, Taint, Time};
use crate::plan::ScaleUp;
use crate::policy::Pool;

/// Tag prefix (the Cluster Autoscaler's node-template convention) carrying a node label.
pub const NODE_TEMPLATE_LABEL: &str = "k8s.io/cluster-autoscaler/node-template/label/";
/// Tag prefix carrying a node taint, as `value:Effect`.
pub const NODE_TEMPLATE_TAINT: &str = "k8s.io/cluster-autoscaler/node-template/taint/";

/// Nodes by providerID: how instances and Nodes are joined (built once per pass).
pub struct NodeIndex<'a>(HashMap<&'a str, &'a Node>);

impl<'a> NodeIndex<'a> {
    pub fn new(nodes: impl IntoIterator<Item = &'a Node>) -> NodeIndex<'a> {
        NodeIndex(
            nodes
                .into_iter()
                .filter_map(|n| n.provider_id.as_deref().map(|p| (p, n)))
                .collect(),
        )
    }

    pub fn contains(&self, provider_id: &str) -> bool {
        self.0.contains_key(provider_id)
    }

    /// The name of the Node with this providerID.
    pub fn name_of(&self, provider_id: &str) -> Option<&'a str> {
        self.0.get(provider_id).map(|n| n.name.as_str())
    }

    /// The Node with this providerID.
    pub fn get(&self, provider_id: &str) -> Option<&'a Node> {
        self.0.get(provider_id).copied()
    }
}

/// A launched instance that has not become a node with GPUs within the max provision time.
#[derive(Clone, Debug, PartialEq)]
pub struct Overdue {
    pub instance: Instance,
    /// Its Node, when it registered but never advertised GPUs.
    pub node: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct FleetView {
    /// Launched instances whose Node has not registered, grouped per launch and offering.
    pub in_flight: Vec<InFlight>,
    pub overdue: Vec<Overdue>,
    /// providerID → instance id, for terminating drained nodes.
    pub instance_of_node: BTreeMap<String, String>,
    /// Nodes of ours that advertised GPUs once and advertise none now (an outage: reported,
    /// never given up as a launch that did not come up).
    pub gpus_lost: Vec<String>,
}

impl FleetView {
    /// The overdue instances without a Node, grouped as launches: no capacity, but the cloud
    /// lists them, so they count against their pools' limits (an overdue Node counts as a node).
    pub fn held(&self) -> Vec<InFlight> {
        group_in_flight(self.overdue.iter().filter(|o| o.node.is_none()).map(|o| {
            let i = &o.instance;
            (
                i.launch_id.as_str(),
                i.pool.as_str(),
                &i.offering,
                Time(i.launched_at_ms),
            )
        }))
    }

    /// Whether `n` is the Node of an instance of ours (launched by this autoscaler for this
    /// cluster): only those are ever drained for removal or replaced.
    pub fn is_ours(&self, n: &Node) -> bool {
        n.provider_id
            .as_ref()
            .is_some_and(|p| self.instance_of_node.contains_key(p))
    }
}

/// Joins the provider's instances with the Nodes by providerID. `expects_gpus` tells whether an
/// offering's instance type has GPUs (a node of it without advertised GPUs is still starting).
///
/// `waiting_since` says since when an instance has been without a working node: its launch,
/// unless it had a Node that went away (then since it went), so that a long-running instance
/// whose Node re-registers is not taken for a launch that never came up.
pub fn fleet_view<'a>(
    instances: impl IntoIterator<Item = &'a Instance>,
    nodes: &NodeIndex,
    now: Time,
    max_provision: Duration,
    expects_gpus: impl Fn(&OfferingKey) -> bool,
    waiting_since: impl Fn(&Instance) -> Time,
) -> FleetView {
    let by_provider_id = &nodes.0;
    let mut waiting: Vec<&Instance> = Vec::new();
    let mut view = FleetView::default();
    for i in instances {
        if matches!(
            i.state,
            InstanceState::Terminated | InstanceState::ShuttingDown
        ) {
            continue;
        }
        let launched = Time(i.launched_at_ms);
        let late = waiting_since(i).max(launched) + max_provision <= now;
        match by_provider_id.get(i.provider_id.as_str()) {
            Some(node) => {
                view.instance_of_node
                    .insert(i.provider_id.clone(), i.id.clone());
                if node.advertised_gpus() == 0 && expects_gpus(&i.offering) {
                    if node.annotations.contains_key(labels::GPUS_ADVERTISED) {
                        view.gpus_lost.push(node.name.clone());
                    } else if late {
                        view.overdue.push(Overdue {
                            instance: i.clone(),
                            node: Some(node.name.clone()),
                        });
                    }
                }
            }
            None if late => view.overdue.push(Overdue {
                instance: i.clone(),
                node: None,
            }),
            None => waiting.push(i),
        }
    }
    view.in_flight = group_in_flight(waiting.iter().map(|i| {
        (
            i.launch_id.as_str(),
            i.pool.as_str(),
            &i.offering,
            Time(i.launched_at_ms),
        )
    }));
    view
}

/// What registration gives a Node of ours that it lacks: pool membership comes from the cloud
/// instance we launched (its tags, joined by providerID), not from anything the node's kubelet
/// registers with; the pool label, the capacity type, the launch id, the pool's labels and taints
/// follow from it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Registration {
    pub node: String,
    pub pool: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// The pool's startup taints the Node still has: removed now that it is registered.
    pub remove_taints: Vec<Taint>,
}

impl Registration {
    /// Whether the Node's labels or taints change (the planner should see them first).
    pub fn changes_shape(&self) -> bool {
        !self.labels.is_empty() || !self.taints.is_empty() || !self.remove_taints.is_empty()
    }
}

impl Registration {
    /// Gives `node` (the planner's view) what registration adds.
    pub fn apply(&self, node: &mut Node) {
        for (k, v) in &self.labels {
            Arc::make_mut(&mut node.labels).insert(k.clone(), v.clone());
        }
        for (k, v) in &self.annotations {
            Arc::make_mut(&mut node.annotations).insert(k.clone(), v.clone());
        }
        for t in &self.taints {
            if !node
                .taints
                .iter()
                .any(|x| x.key == t.key && x.effect == t.effect)
            {
                node.taints.push(t.clone());
            }
        }
        node.taints.retain(|x| {
            !self
                .remove_taints
                .iter()
                .any(|t| t.key == x.key && t.effect == x.effect)
        });
    }
}

/// Adopts existing nodes into pools by the pools' `nodeSelector`: a node without a pool label,
/// not of an instance of ours (`ours`: their provider ids), carrying every label of a pool's
/// selector gets that pool's label, in memory only (first pool in policy order). Returns how
/// many were adopted.
pub fn adopt_nodes(nodes: &mut [Node], ours: &HashSet<&str>, pools: &[Pool]) -> usize {
    let mut adopted = 0;
    if pools.iter().all(|p| p.node_selector.is_empty()) {
        return adopted;
    }
    for n in nodes {
        if n.labels.contains_key(labels::POOL)
            || n.provider_id.as_deref().is_some_and(|p| ours.contains(p))
        {
            continue;
        }
        let pool = pools.iter().find(|p| {
            !p.node_selector.is_empty()
                && p.node_selector
                    .iter()
                    .all(|(k, v)| n.labels.get(k) == Some(v))
        });
        if let Some(p) = pool {
            Arc::make_mut(&mut n.labels).insert(labels::POOL.to_string(), p.name.clone());
            adopted += 1;
        }
    }
    adopted
}

/// What the node gauges show, from the nodes as a pass sees them (pools adopted).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeGauges {
    /// (pool, capacity type as the node's labels give it, else `unknown`) → (nodes, advertised
    /// GPUs).
    pub by_capacity: BTreeMap<(String, String), (i64, i64)>,
    /// Pool → nodes annotated unneeded.
    pub unneeded: BTreeMap<String, i64>,
}

/// The node gauges of `nodes`: nodes of a pool only.
pub fn node_gauges(nodes: &[Node]) -> NodeGauges {
    let mut g = NodeGauges::default();
    for n in nodes {
        let Some(pool) = n.pool() else { continue };
        if n.annotations.contains_key(labels::UNNEEDED_SINCE) {
            *g.unneeded.entry(pool.to_string()).or_default() += 1;
        }
        let ct = n.capacity_type_label().unwrap_or("unknown");
        let e = g
            .by_capacity
            .entry((pool.to_string(), ct.to_string()))
            .or_default();
        e.0 += 1;
        e.1 = e.1.saturating_add(n.advertised_gpus());
    }
    g
}

/// The registrations due: every live instance of ours whose Node lacks a label or taint of its
/// pool. A label an operator set to another value is overwritten only for the pool label, the
/// capacity type and the launch id (which must be true); the pool's own labels, and the GPU model
/// label the pool's templates predict (from `catalog`), are added where missing.
pub fn registrations<'a>(
    instances: impl IntoIterator<Item = &'a Instance>,
    nodes: &NodeIndex,
    pools: &[Pool],
    catalog: &Catalog,
    fingerprints: &BTreeMap<String, (crate::model::Time, String)>,
) -> BTreeMap<String, Registration> {
    let by_provider_id = &nodes.0;
    let mut out = BTreeMap::new();
    for i in instances {
        if matches!(
            i.state,
            InstanceState::Terminated | InstanceState::ShuttingDown
        ) {
            continue;
        }
        let (Some(node), Some(pool)) = (
            by_provider_id.get(i.provider_id.as_str()),
            pools.iter().find(|p| p.name == i.pool),
        ) else {
            continue;
        };
        let capacity_type = i.offering.capacity_type.as_str();
        // Names are filled in only for a registration that is due (most nodes need none, and
        // this runs every pass).
        let mut reg = Registration::default();
        let owned = [
            (labels::POOL, pool.name.as_str()),
            (labels::CAPACITY_TYPE, capacity_type),
            (labels::KARPENTER_CAPACITY_TYPE, capacity_type),
            (labels::LAUNCH_ID, i.launch_id.as_str()),
            (
                labels::CAPACITY_RESERVATION_ID,
                i.reservation_id.as_deref().unwrap_or(""),
            ),
            (
                labels::KARPENTER_CAPACITY_RESERVATION_ID,
                i.reservation_id.as_deref().unwrap_or(""),
            ),
        ];
        for (k, v) in owned {
            if v.is_empty() {
                continue;
            }
            if node.labels.get(k).map(String::as_str) != Some(v) {
                reg.labels.insert(k.to_string(), v.to_string());
            }
        }
        for (k, v) in &pool.labels {
            if !node.labels.contains_key(k) {
                reg.labels.insert(k.clone(), v.clone());
            }
        }
        // Only we put it there, and pods may select it (the templates they were planned on
        // carry it): without it they would never fit the node launched for them.
        let gpu = catalog
            .instance_type(&i.offering.instance_type)
            .and_then(|t| t.gpu.as_ref());
        if let (Some(g), false) = (gpu, node.labels.contains_key(labels::GPU_MODEL)) {
            reg.labels
                .insert(labels::GPU_MODEL.to_string(), g.model.clone());
        }
        for t in &pool.taints {
            if !node
                .taints
                .iter()
                .any(|x| x.key == t.key && x.effect == t.effect)
            {
                reg.taints.push(t.clone());
            }
        }
        for t in &pool.startup_taints {
            if node
                .taints
                .iter()
                .any(|x| x.key == t.key && x.effect == t.effect)
            {
                reg.remove_taints.push(t.clone());
            }
        }
        // What its launch used: known for launches issued by this process, else as the cloud
        // kept it with the instance's tags (a launch of a process gone since); a provider that
        // turns tags into annotations, kwok, has put it there already.
        let recorded = fingerprints
            .get(&i.launch_id)
            .map(|(_, fp)| fp)
            .or(i.launch_fingerprint.as_ref());
        if let (false, Some(fp)) = (
            node.annotations.contains_key(labels::LAUNCH_FINGERPRINT),
            recorded,
        ) {
            reg.annotations
                .insert(labels::LAUNCH_FINGERPRINT.to_string(), fp.clone());
        }
        if node.advertised_gpus() > 0 && !node.annotations.contains_key(labels::GPUS_ADVERTISED) {
            reg.annotations
                .insert(labels::GPUS_ADVERTISED.to_string(), "true".to_string());
        }
        if reg.changes_shape() || !reg.annotations.is_empty() {
            reg.node = node.name.clone();
            reg.pool = pool.name.clone();
            out.insert(reg.node.clone(), reg);
        }
    }
    out
}

/// A launch id that is the same for the same scale-up of the same pods (by UID: a pod re-created
/// under its old name is another pod), so that a controller that crashed after launching and
/// plans the same again launches nothing new (the provider finds the instances by this id).
/// `attempt` changes it after a launch was given up.
pub fn launch_id(su: &ScaleUp, attempt: u32) -> String {
    // A pod without a UID (never the case for a pod read from the API server) by its name.
    let mut pods: Vec<&str> = su
        .pods
        .iter()
        .map(|p| {
            if p.uid.is_empty() {
                p.as_str()
            } else {
                p.uid.as_str()
            }
        })
        .collect();
    pods.sort_unstable();
    // Bytes fed explicitly (not through `Hash`, whose encoding may change between Rust
    // versions), into FNV-1a (stable, unlike std's hasher): the id must be found again after an
    // upgrade.
    let mut h = fnv::FnvHasher::default();
    let instance_type = su
        .offerings
        .first()
        .map_or("", |o| o.instance_type.as_str());
    for part in [su.pool.as_str(), instance_type].into_iter().chain(pods) {
        h.write(part.as_bytes());
        h.write(&[0]);
    }
    h.write(&attempt.to_le_bytes());
    format!("{}-{:012x}", su.pool, h.finish() & 0xffff_ffff_ffff)
}

/// The pool's node labels and taints (startup taints included) as node-template tags, for
/// bootstrap scripts (and kube-sim) to apply when the node registers.
pub fn node_template_tags(pool: &Pool) -> BTreeMap<String, String> {
    let mut tags = BTreeMap::new();
    for (k, v) in &pool.labels {
        tags.insert(format!("{NODE_TEMPLATE_LABEL}{k}"), v.clone());
    }
    for t in pool.taints.iter().chain(&pool.startup_taints) {
        tags.insert(
            format!("{NODE_TEMPLATE_TAINT}{}", t.key),
            format!("{}:{}", t.value, t.effect.as_str()),
        );
    }
    tags
}

/// The reservations a scale-up's `reserved` offerings launch into: those its pool selects that
/// have room and take launches at `now` ([`crate::plan::templates::launchable`]), by offering in
/// the scale-up's order and, within an offering, open-ended reservations first, then the one
/// ending last (a node in a Capacity Block is moved off it before the block's end), then by id.
/// Empty for a scale-up without reserved offerings.
pub fn launch_reservations(
    su: &ScaleUp,
    pool: Option<&Pool>,
    reservations: &[Reservation],
    now: Time,
) -> Vec<Reservation> {
    let Some(pool) = pool else {
        return Vec::new();
    };
    let mut out: Vec<Reservation> = Vec::new();
    for o in &su.offerings {
        if o.capacity_type != CapacityType::Reserved {
            continue;
        }
        let key = o.key();
        let mut of_offering: Vec<&Reservation> = reservations
            .iter()
            .filter(|r| {
                r.available > 0
                    && r.offering() == key
                    && crate::plan::templates::launchable(pool, r, now)
                    && !out.iter().any(|x| x.id == r.id)
            })
            .collect();
        of_offering.sort_by(|a, b| {
            let end = |r: &Reservation| r.end_ms.unwrap_or(i64::MAX);
            end(b).cmp(&end(a)).then(a.id.cmp(&b.id))
        });
        out.extend(of_offering.into_iter().cloned());
    }
    out
}

/// The launch request for one planned scale-up: the pool's node-template tags, and what the
/// launch uses (`fingerprint`: [`crate::plan::lifecycle::fingerprint`] of the pool, with what
/// its moving launch template version resolves to now, where known).
pub fn launch_request(su: &ScaleUp, pool: Option<(&Pool, &str)>, attempt: u32) -> LaunchRequest {
    let mut tags = pool.map(|(p, _)| node_template_tags(p)).unwrap_or_default();
    if let Some((_, fingerprint)) = pool {
        tags.insert(
            labels::LAUNCH_FINGERPRINT.to_string(),
            fingerprint.to_string(),
        );
    }
    LaunchRequest {
        launch_id: launch_id(su, attempt),
        pool: su.pool.clone(),
        count: su.count,
        offerings: su.offerings.iter().map(|o| o.key()).collect(),
        tags,
        reservations: Vec::new(),
        atomic: su.gang.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::NodeBuilder;
    use crate::plan::{PlannedOffering, PlannedPod};
    use gpu_node_autoscaler_provider::CapacityType;

    fn offering() -> OfferingKey {
        OfferingKey {
            instance_type: "g5.xlarge".into(),
            zone: "us-east-1a".into(),
            capacity_type: CapacityType::Spot,
        }
    }

    fn instance(id: &str, launch: &str, at_s: i64, state: InstanceState) -> Instance {
        Instance {
            id: id.into(),
            provider_id: format!("aws:///us-east-1a/{id}"),
            pool: "a10g".into(),
            launch_id: launch.into(),
            offering: offering(),
            state,
            launched_at_ms: at_s * 1000,
            reservation_id: None,
            launch_fingerprint: None,
            unclaimed: false,
        }
    }

    #[test]
    fn node_gauges_count_nodes_by_pool_and_the_capacity_type_their_labels_give() {
        let spot = NodeBuilder::new("s")
            .pool("a10g", "g5.xlarge", "us-east-1a")
            .label(labels::CAPACITY_TYPE, "spot")
            .gpus(1)
            .build();
        let eks = NodeBuilder::new("e")
            .label(labels::POOL, "a10g")
            .label("eks.amazonaws.com/capacityType", "SPOT")
            .gpus(4)
            .annotation(labels::UNNEEDED_SINCE, "2026-01-01T00:00:00Z")
            .build();
        let mut bare = NodeBuilder::new("b").gpus(1).build();
        Arc::make_mut(&mut bare.labels).insert(labels::POOL.into(), "a10g".into());
        Arc::make_mut(&mut bare.labels).remove(labels::CAPACITY_TYPE);
        let none = NodeBuilder::new("x").gpus(8).build();
        let g = node_gauges(&[spot, eks, bare, none]);
        let key = |ct: &str| ("a10g".to_string(), ct.to_string());
        assert_eq!(g.by_capacity.get(&key("spot")), Some(&(2, 5)), "{g:?}");
        assert_eq!(g.by_capacity.get(&key("unknown")), Some(&(1, 1)), "{g:?}");
        assert_eq!(
            g.by_capacity.len(),
            2,
            "a node of no pool is not counted: {g:?}"
        );
        assert_eq!(g.unneeded.get("a10g"), Some(&1));
    }

    #[test]
    fn instances_without_nodes_are_in_flight_until_overdue() {
        let mut nodes: HashMap<String, Node> = HashMap::default();
        let mut n = NodeBuilder::new("n1").build();
        n.provider_id = Some("aws:///us-east-1a/i-1".into());
        nodes.insert("n1".into(), n);
        let instances = [
            instance("i-1", "L1", 0, InstanceState::Running),
            instance("i-2", "L1", 0, InstanceState::Running),
            instance("i-3", "L1", 10, InstanceState::Pending),
            instance("i-4", "L2", 0, InstanceState::Terminated),
            instance("i-5", "L3", -1000, InstanceState::Pending),
        ];
        let v = fleet_view(
            &instances,
            &NodeIndex::new(nodes.values()),
            Time::from_secs(60),
            Duration::from_secs(900),
            |_| true,
            |i| Time(i.launched_at_ms),
        );
        assert_eq!(v.in_flight.len(), 1);
        assert_eq!(v.in_flight[0].count, 2);
        assert_eq!(v.in_flight[0].launched_at, Time(0));
        assert_eq!(v.overdue.len(), 1);
        assert_eq!(v.overdue[0].instance.id, "i-5");
        assert_eq!(v.instance_of_node["aws:///us-east-1a/i-1"], "i-1");
    }

    #[test]
    fn a_registered_node_that_never_advertises_gpus_is_overdue() {
        let mut nodes: HashMap<String, Node> = HashMap::default();
        let mut n = NodeBuilder::new("n1").build();
        n.provider_id = Some("aws:///us-east-1a/i-1".into());
        assert_eq!(n.advertised_gpus(), 0);
        nodes.insert("n1".into(), n);
        let instances = [instance("i-1", "L1", 0, InstanceState::Running)];
        let v = fleet_view(
            &instances,
            &NodeIndex::new(nodes.values()),
            Time::from_secs(899),
            Duration::from_secs(900),
            |_| true,
            |i| Time(i.launched_at_ms),
        );
        assert!(v.overdue.is_empty());
        let v = fleet_view(
            &instances,
            &NodeIndex::new(nodes.values()),
            Time::from_secs(900),
            Duration::from_secs(900),
            |_| true,
            |i| Time(i.launched_at_ms),
        );
        assert_eq!(v.overdue[0].node.as_deref(), Some("n1"));
        let v = fleet_view(
            &instances,
            &NodeIndex::new(nodes.values()),
            Time::from_secs(900),
            Duration::from_secs(900),
            |_| false,
            |i| Time(i.launched_at_ms),
        );
        assert!(
            v.overdue.is_empty(),
            "a CPU-only type is never waiting for GPUs"
        );
    }

    #[test]
    fn a_node_whose_gpus_drop_after_it_advertised_them_is_an_outage_not_overdue() {
        let mut n = NodeBuilder::new("n1")
            .annotation(labels::GPUS_ADVERTISED, "true")
            .build();
        n.provider_id = Some("aws:///us-east-1a/i-1".into());
        assert_eq!(n.advertised_gpus(), 0, "the device plugin restarts");
        let nodes: HashMap<String, Node> = [("n1".to_string(), n)].into_iter().collect();
        let instances = [instance("i-1", "L1", 0, InstanceState::Running)];
        let v = fleet_view(
            &instances,
            &NodeIndex::new(nodes.values()),
            Time::from_secs(7200),
            Duration::from_secs(900),
            |_| true,
            |i| Time(i.launched_at_ms),
        );
        assert!(v.overdue.is_empty(), "never given up: {v:?}");
        assert_eq!(v.gpus_lost, ["n1"]);
    }

    fn scale_up(pods: &[&str]) -> ScaleUp {
        ScaleUp {
            pool: "a10g".into(),
            count: 1,
            offerings: vec![PlannedOffering {
                instance_type: "g5.xlarge".into(),
                zone: "us-east-1a".into(),
                capacity_type: CapacityType::Spot,
                price_per_hour: 0.4,
            }],
            pods: pods
                .iter()
                .map(|s| PlannedPod {
                    key: s.to_string(),
                    uid: format!("uid-{s}"),
                })
                .collect(),
            gang: None,
            pods_per_node: vec![pods.len()],
        }
    }

    #[test]
    fn launch_ids_depend_on_the_pods_not_their_order() {
        let of = |uids: &[&str]| {
            let mut su = scale_up(&["ml/a", "ml/b"][..uids.len()]);
            for (p, u) in su.pods.iter_mut().zip(uids) {
                p.uid = u.to_string();
            }
            su
        };
        let a = launch_id(&of(&["u1", "u2"]), 0);
        assert_eq!(a, launch_id(&of(&["u2", "u1"]), 0));
        assert_ne!(a, launch_id(&of(&["u1"]), 0));
        assert_ne!(
            a,
            launch_id(&of(&["u1", "u3"]), 0),
            "a re-created pod is another pod"
        );
        assert_ne!(a, launch_id(&of(&["u1", "u2"]), 1));
        assert!(a.starts_with("a10g-"));
        // Stable across builds and Rust versions: the id is found again after an upgrade.
        assert_eq!(a, "a10g-8f121cf6e7f6");
    }

    #[test]
    fn an_instance_whose_node_went_away_waits_from_then() {
        let instances = [instance("i-1", "L1", 0, InstanceState::Running)];
        let lost_at = Time::from_secs(10_000);
        let v = fleet_view(
            &instances,
            &NodeIndex::new(&[]),
            Time::from_secs(10_060),
            Duration::from_secs(900),
            |_| true,
            |_| lost_at,
        );
        assert!(v.overdue.is_empty(), "lost its Node a minute ago");
        assert_eq!(v.in_flight[0].count, 1);
        let v = fleet_view(
            &instances,
            &NodeIndex::new(&[]),
            Time::from_secs(10_900),
            Duration::from_secs(900),
            |_| true,
            |_| lost_at,
        );
        assert_eq!(v.overdue.len(), 1);
    }
}

#[cfg(test)]
mod registration_tests {
    use super::*;
    use crate::fixtures::NodeBuilder;
    use crate::model::Effect;
    use gpu_node_autoscaler_provider::CapacityType;

    /// The built-in catalog's instance types.
    fn test_catalog() -> Catalog {
        Catalog {
            instance_types: crate::catalog::parse_csv(
                crate::catalog::BUILTIN_AWS,
                crate::catalog::BUILTIN_AWS_NAME,
            )
            .unwrap(),
            offerings: Vec::new(),
        }
    }

    fn policy() -> crate::policy::Policy {
        crate::policy::parse_policy(
            "region: us-east-1\nzones: [us-east-1a]\npools:\n- name: a10g\n  instanceTypes: [g5.xlarge]\n  \
             maxNodes: 4\n  labels: {team: ml}\n  taints:\n  - {key: nvidia.com/gpu, value: \"true\", effect: NoSchedule}\n",
            "policy.yaml",
        )
        .unwrap()
    }

    fn instance(id: &str, state: InstanceState) -> Instance {
        Instance {
            id: id.into(),
            provider_id: format!("aws:///us-east-1a/{id}"),
            pool: "a10g".into(),
            launch_id: "l-1".into(),
            offering: OfferingKey {
                instance_type: "g5.xlarge".into(),
                zone: "us-east-1a".into(),
                capacity_type: CapacityType::Spot,
            },
            state,
            launched_at_ms: 0,
            reservation_id: None,
            launch_fingerprint: None,
            unclaimed: false,
        }
    }

    fn node(name: &str, instance: &str) -> Node {
        let mut n = NodeBuilder::new(name).build();
        Arc::make_mut(&mut n.labels).remove(labels::POOL);
        n.provider_id = Some(format!("aws:///us-east-1a/{instance}"));
        n
    }

    #[test]
    fn a_node_registered_without_pool_labels_gets_its_pool_from_the_instance() {
        let policy = policy();
        let nodes: HashMap<String, Node> = [
            ("n1".to_string(), node("n1", "i-1")),
            ("other".to_string(), node("other", "i-not-ours")),
        ]
        .into_iter()
        .collect();
        let regs = registrations(
            &[instance("i-1", InstanceState::Running)],
            &NodeIndex::new(nodes.values()),
            &policy.pools,
            &test_catalog(),
            &BTreeMap::new(),
        );
        assert_eq!(regs.len(), 1, "only the node of our instance: {regs:?}");
        let r = &regs["n1"];
        assert_eq!(r.pool, "a10g");
        assert_eq!(r.labels[labels::POOL], "a10g");
        assert_eq!(r.labels[labels::CAPACITY_TYPE], "spot");
        assert_eq!(r.labels[labels::LAUNCH_ID], "l-1");
        assert_eq!(r.labels["team"], "ml");
        assert_eq!(r.labels[labels::GPU_MODEL], "A10G");
        assert_eq!(r.taints.len(), 1);
        assert_eq!(r.taints[0].effect, Effect::NoSchedule);

        // Once applied, nothing is left to do.
        let mut n1 = nodes["n1"].clone();
        r.apply(&mut n1);
        assert_eq!(n1.pool(), Some("a10g"));
        let nodes: HashMap<String, Node> = [("n1".to_string(), n1)].into_iter().collect();
        assert!(registrations(
            &[instance("i-1", InstanceState::Running)],
            &NodeIndex::new(nodes.values()),
            &policy.pools,
            &test_catalog(),
            &BTreeMap::new()
        )
        .is_empty());
    }

    #[test]
    fn an_operator_label_is_kept_and_a_terminating_instance_is_left_alone() {
        let policy = policy();
        let mut n1 = node("n1", "i-1");
        Arc::make_mut(&mut n1.labels).insert("team".into(), "research".into());
        let nodes: HashMap<String, Node> = [("n1".to_string(), n1)].into_iter().collect();
        let regs = registrations(
            &[instance("i-1", InstanceState::Running)],
            &NodeIndex::new(nodes.values()),
            &policy.pools,
            &test_catalog(),
            &BTreeMap::new(),
        );
        assert!(!regs["n1"].labels.contains_key("team"), "{regs:?}");
        assert!(registrations(
            &[instance("i-1", InstanceState::ShuttingDown)],
            &NodeIndex::new(nodes.values()),
            &policy.pools,
            &test_catalog(),
            &BTreeMap::new()
        )
        .is_empty());
    }
}
