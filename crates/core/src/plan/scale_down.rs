//! Scale-down: which idle GPU nodes to drain and remove, and why the others stay.
//!
//! A node of a managed pool is removed only when every rule holds: the pool is out of its
//! cooldown after a scale-up and out of its back-off after a failed scale-down; the node has been
//! unneeded (GPU requests of non-DaemonSet pods below the pool's threshold) for longer than the
//! pool's unneeded time; scale-down is not disabled on it; every pod on it is movable and fits on
//! the nodes that remain (never onto a node removed by the same plan, and a node that receives
//! pods is not removed); PodDisruptionBudgets allow every eviction, counted across the plan; the
//! pool stays at or above its minimum; at most `maxConcurrentDrains` drains run at once.
//!
//! "Unneeded since" lives on the node as the annotation `gpu-node-autoscaler.io/unneeded-since`
//! (RFC 3339), which the controller sets from [`super::Plan::unneeded`] and clears when the node is
//! needed again, so it survives a restart of the controller.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;

use crate::model::resources::place_share;
use crate::model::topology::{Profile, Site, TopologyIndex};
use crate::model::{labels, Node, Pod, Snapshot, Time};
use crate::policy::{Policy, Pool};

use super::disrupt::{annotation_true, do_not_disrupt, drains_left};
use super::pack::{Left, NodeRoom};
use super::templates::{template_of_node, Template};
use super::{Kept, ScaleDown};

/// A node that is unneeded now, and since when (to keep in its annotation).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Unneeded {
    pub node: String,
    pub since: String,
}

/// The "unneeded since" annotations to change so that the nodes say what `unneeded` says, in
/// node order: each node whose annotation differs, with its new value (`None`: remove it). Nodes
/// `skip` names are left as they are.
pub fn unneeded_changes<'a>(
    nodes: &'a [Node],
    unneeded: &'a [Unneeded],
    skip: impl Fn(&Node) -> bool,
) -> Vec<(&'a str, Option<&'a str>)> {
    let want: BTreeMap<&str, &str> = unneeded
        .iter()
        .map(|u| (u.node.as_str(), u.since.as_str()))
        .collect();
    nodes
        .iter()
        .filter_map(|n| {
            let has = n
                .annotations
                .get(labels::UNNEEDED_SINCE)
                .map(String::as_str);
            let want = want.get(n.name.as_str()).copied();
            (has != want && !skip(n)).then_some((n.name.as_str(), want))
        })
        .collect()
}

/// One planned eviction and where the pod will fit afterwards.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Eviction {
    pub pod: String,
    pub to: String,
}

pub(super) struct Outcome {
    pub scale_downs: Vec<ScaleDown>,
    pub kept: Vec<Kept>,
    pub unneeded: Vec<Unneeded>,
    /// Candidates kept only because `maxConcurrentDrains` drains run or are planned.
    pub held_for_drains: usize,
}

fn annotation_false(map: &BTreeMap<String, String>, keys: &[&str]) -> bool {
    keys.iter()
        .any(|k| map.get(*k).is_some_and(|v| v == "false"))
}

const SAFE_TO_EVICT: [&str; 2] = [labels::SAFE_TO_EVICT, labels::CA_SAFE_TO_EVICT];

/// Pods that go away with their node and need no eviction: DaemonSet and static (mirror) pods.
pub fn dies_with_node(p: &Pod) -> bool {
    p.is_daemonset() || p.annotations.contains_key("kubernetes.io/config.mirror")
}

/// Why a pod cannot be evicted and re-created elsewhere, if it cannot.
pub fn not_movable(p: &Pod, snapshot: &Snapshot) -> Option<String> {
    if annotation_true(&p.annotations, &[labels::KARPENTER_DO_NOT_DISRUPT]) {
        return Some(format!(
            "pod {} is annotated karpenter.sh/do-not-disrupt: \"true\"",
            p.id
        ));
    }
    if annotation_false(&p.annotations, &SAFE_TO_EVICT) {
        return Some(format!(
            "pod {} is annotated safe-to-evict: \"false\"",
            p.id
        ));
    }
    if annotation_true(&p.annotations, &SAFE_TO_EVICT) {
        return None;
    }
    if p.owner.is_none() {
        return Some(format!("pod {} is not managed by a controller", p.id));
    }
    if p.local_storage {
        return Some(format!(
            "pod {} uses local storage (emptyDir/hostPath) and is not annotated safe-to-evict",
            p.id
        ));
    }
    if p.id.namespace == "kube-system" && !snapshot.pdbs.iter().any(|b| b.selects(p)) {
        return Some(format!(
            "pod {} is a kube-system pod without a PodDisruptionBudget",
            p.id
        ));
    }
    None
}

/// Share of the node's GPUs requested by its non-DaemonSet pods (CPU/memory for GPU-less nodes),
/// or `None` while a GPU node has not advertised its GPUs yet.
pub(super) fn utilization(node: &Node, template: Option<&Template>, pods: &[&Pod]) -> Option<f64> {
    let a = &node.allocatable;
    let workload: Vec<&&Pod> = pods.iter().filter(|p| !dies_with_node(p)).collect();
    let whole = a.whole_gpus();
    let slices: i64 = a.mig_slices().map(|(_, n)| n).sum();
    if whole > 0 {
        let used: i64 = workload.iter().map(|p| p.requests.whole_gpus()).sum();
        return Some(used as f64 / whole as f64);
    }
    if slices > 0 {
        let used: i64 = workload
            .iter()
            .map(|p| p.requests.mig_slices().map(|(_, n)| n).sum::<i64>())
            .sum();
        return Some(used as f64 / slices as f64);
    }
    if !node.shared_gpus.is_empty() {
        let mem: i64 = node.shared_gpus.iter().map(|g| g.mem_gib).sum();
        let core: i64 = node.shared_gpus.iter().map(|g| g.core_pct).sum();
        let (um, uc) = workload
            .iter()
            .filter_map(|p| p.share)
            .fold((0, 0), |(m, c), s| (m + s.mem_gib, c + s.core_pct));
        return Some((um as f64 / mem.max(1) as f64).max(uc as f64 / core.max(1) as f64));
    }
    if node.dra_devices > 0 {
        // Devices published through DRA: the share allocated to its pods' claims.
        let mut claims = crate::hash::HashSet::default();
        let used: usize = workload
            .iter()
            .flat_map(|p| p.claims.iter())
            .filter(|c| claims.insert(&c.claim))
            .filter_map(|c| c.allocation.as_ref())
            .filter(|a| a.node.as_deref() == Some(node.name.as_str()))
            .map(|a| a.devices.len())
            .sum();
        return Some(used as f64 / node.dra_devices as f64);
    }
    if template.is_some_and(|t| t.gpus > 0) {
        return None; // GPUs not advertised yet: booting, never a candidate
    }
    let cpu: i64 = workload.iter().map(|p| p.requests.cpu_milli).sum();
    let mem: i64 = workload.iter().map(|p| p.requests.memory).sum();
    Some((cpu as f64 / a.cpu_milli.max(1) as f64).max(mem as f64 / a.memory.max(1) as f64))
}

fn gpus_of(node: &Node) -> f64 {
    let a = &node.allocatable;
    let slices: i64 = a.mig_slices().map(|(_, n)| n).sum();
    if a.whole_gpus() > 0 {
        a.whole_gpus() as f64
    } else if slices > 0 {
        slices as f64 / crate::model::gpu::MIG_COMPUTE_SLICES as f64
    } else {
        node.shared_gpus.len() as f64
    }
}

/// $/hour of a node, from its pool template's offering (zone and capacity type labels).
pub fn price_of(node: &Node, template: Option<&Template>) -> f64 {
    let Some(t) = template else { return 0.0 };
    let ct = node.capacity_type();
    let zone = node.zone().unwrap_or("");
    t.offerings
        .iter()
        .find(|o| o.key.zone == zone && o.key.capacity_type.as_str() == ct)
        .or_else(|| {
            t.offerings
                .iter()
                .find(|o| o.key.capacity_type.as_str() == ct)
        })
        .or(t.offerings.first())
        .map_or(0.0, |o| o.price)
}

/// What the rules about one unneeded node look at.
struct NodeFacts<'a> {
    node: &'a Node,
    pool: &'a Pool,
    snapshot: &'a Snapshot,
    now: Time,
    /// Unneeded since.
    since: Time,
    /// The pool's last scale-up: its newest node or launch, or what the decision core recorded.
    last_scale_up: Option<Time>,
    /// Its pods that need a place elsewhere (DaemonSet and static pods go with it).
    workload: &'a [&'a Pod],
}

/// A rule an unneeded node must pass to be a candidate for removal: why it is kept, if it is.
type NodeRule = fn(&NodeFacts) -> Option<String>;

/// The rules an unneeded node must pass, in order, to be a candidate for removal; the first that
/// keeps it gives the reason listed in the plan's `kept`. The rules that weigh candidates against
/// each other (minimum size, drains, PodDisruptionBudgets, room for the pods) follow in
/// [`scale_down`].
const CANDIDATE_RULES: [NodeRule; 7] = [
    pool_scale_down_enabled,
    reserved_kept_warm,
    node_may_be_disrupted,
    out_of_cooldown,
    out_of_backoff,
    unneeded_long_enough,
    pods_movable,
];

fn pool_scale_down_enabled(f: &NodeFacts) -> Option<String> {
    (!f.pool.scale_down.enabled).then(|| format!("scale-down is disabled for pool {}", f.pool.name))
}

/// A node in a capacity reservation stays when its pool keeps reserved nodes warm (the
/// reservation is paid anyway); otherwise it goes like any other, freeing the reservation.
fn reserved_kept_warm(f: &NodeFacts) -> Option<String> {
    (f.pool.keep_reserved_warm
        && f.node.capacity_type() == gpu_node_autoscaler_provider::CapacityType::Reserved.as_str())
    .then(|| {
        format!(
            "pool {} keeps its reserved nodes warm (keepReservedWarm)",
            f.pool.name
        )
    })
}

fn node_may_be_disrupted(f: &NodeFacts) -> Option<String> {
    do_not_disrupt(f.node)
}

fn out_of_cooldown(f: &NodeFacts) -> Option<String> {
    let until = f.last_scale_up? + f.pool.scale_down.cooldown_after_scale_up;
    (f.now < until).then(|| {
        format!(
            "pool {} is in its cooldown after a scale-up until {until}",
            f.pool.name
        )
    })
}

fn out_of_backoff(f: &NodeFacts) -> Option<String> {
    let failed = f
        .snapshot
        .pools
        .get(&f.pool.name)
        .and_then(|s| s.last_scale_down_failure)?;
    let until = failed + f.pool.scale_down.backoff_after_failure;
    (f.now < until).then(|| {
        format!(
            "pool {} is backing off after a failed scale-down until {until}",
            f.pool.name
        )
    })
}

fn unneeded_long_enough(f: &NodeFacts) -> Option<String> {
    let delay = if f.workload.is_empty() {
        f.pool.scale_down.empty_unneeded_time
    } else {
        f.pool.scale_down.unneeded_time
    };
    let removable_at = f.since + delay;
    (f.now < removable_at)
        .then(|| format!("unneeded since {}, removable after {removable_at}", f.since))
}

fn pods_movable(f: &NodeFacts) -> Option<String> {
    f.workload.iter().find_map(|p| not_movable(p, f.snapshot))
}

struct Candidate<'a> {
    node: usize,
    pool: usize,
    price: f64,
    idle_gpus: f64,
    util: f64,
    since: Time,
    movable: Vec<&'a Pod>,
}

/// Plans scale-downs on top of the scale-up's view of free capacity (`rooms`).
pub(super) fn scale_down(
    snapshot: &Snapshot,
    templates: &[Template],
    policy: &Policy,
    now: Time,
    left: Left,
    devices: &super::devices::Devices,
    targeted: &BTreeSet<&str>,
) -> Outcome {
    let Left {
        mut rooms,
        mut topology,
    } = left;
    let mut out = Outcome {
        scale_downs: Vec::new(),
        kept: Vec::new(),
        unneeded: Vec::new(),
        held_for_drains: 0,
    };
    let mut pods_on: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
    for p in &snapshot.pods {
        if let (true, Some(n)) = (p.is_bound_active(), &p.node_name) {
            pods_on.entry(n.as_str()).or_default().push(p);
        }
    }
    let pool_of = |n: &Node| {
        n.pool()
            .and_then(|p| policy.pools.iter().position(|x| x.name == p))
    };
    let template_of = |n: &Node| template_of_node(n, templates).map(|t| &templates[t]);
    // Pool sizes and the last scale-up, derived from what exists so that a restart loses nothing.
    let mut pool_nodes = vec![0i64; policy.pools.len()];
    let mut last_up: Vec<Option<Time>> = policy
        .pools
        .iter()
        .map(|p| snapshot.pools.get(&p.name).and_then(|s| s.last_scale_up))
        .collect();
    let mut draining = 0u32;
    for n in &snapshot.nodes {
        if n.is_being_deleted() {
            draining += 1;
            continue;
        }
        if let Some(pi) = pool_of(n) {
            pool_nodes[pi] += 1;
            last_up[pi] = last_up[pi].max(Some(n.created));
        }
    }
    for f in &snapshot.in_flight {
        if let Some(pi) = policy.pools.iter().position(|x| x.name == f.pool) {
            last_up[pi] = last_up[pi].max(Some(f.launched_at));
        }
    }

    let mut candidates: Vec<Candidate> = Vec::new();
    for (ni, n) in snapshot.nodes.iter().enumerate() {
        let Some(pi) = pool_of(n) else { continue };
        if n.is_being_deleted() || !n.ready {
            continue;
        }
        let pool = &policy.pools[pi];
        let pods = pods_on.get(n.name.as_str()).cloned().unwrap_or_default();
        let template = template_of(n);
        let Some(util) = utilization(n, template, &pods) else {
            continue;
        };
        if util >= pool.scale_down.utilization_threshold || targeted.contains(n.name.as_str()) {
            continue;
        }
        let since = n
            .annotations
            .get(labels::UNNEEDED_SINCE)
            .and_then(|v| Time::parse_rfc3339(v).ok())
            .filter(|t| *t <= now)
            .unwrap_or(now);
        out.unneeded.push(Unneeded {
            node: n.name.clone(),
            since: since.to_rfc3339(),
        });
        let movable: Vec<&Pod> = pods
            .iter()
            .copied()
            .filter(|p| !dies_with_node(p))
            .collect();
        let facts = NodeFacts {
            node: n,
            pool,
            snapshot,
            now,
            since,
            last_scale_up: last_up[pi],
            workload: &movable,
        };
        if let Some(reason) = CANDIDATE_RULES.iter().find_map(|rule| rule(&facts)) {
            out.kept.push(Kept {
                node: n.name.clone(),
                reason,
            });
            continue;
        }
        let gpus = gpus_of(n);
        candidates.push(Candidate {
            node: ni,
            pool: pi,
            price: price_of(n, template),
            idle_gpus: gpus * (1.0 - util),
            util,
            since,
            movable,
        });
    }

    // Empty nodes first, then the most $/hour per idle GPU.
    candidates.sort_by(|a, b| {
        let per = |c: &Candidate| c.price / c.idle_gpus.max(1e-9);
        b.movable
            .is_empty()
            .cmp(&a.movable.is_empty())
            .then(per(b).total_cmp(&per(a)))
            .then(
                snapshot.nodes[a.node]
                    .name
                    .cmp(&snapshot.nodes[b.node].name),
            )
    });

    // Pods move preferably onto nodes that stay anyway, so that other candidates remain removable.
    let is_candidate: BTreeSet<usize> = candidates.iter().map(|c| c.node).collect();
    rooms.sort_by_key(|r| (is_candidate.contains(&r.node), r.node));
    let room_of: BTreeMap<usize, usize> =
        rooms.iter().enumerate().map(|(i, r)| (r.node, i)).collect();
    let mut removed: BTreeSet<usize> = BTreeSet::new();
    let mut receiving: BTreeSet<usize> = BTreeSet::new();
    let mut pdb_used = vec![0i32; snapshot.pdbs.len()];
    let mut removed_in_pool = vec![0i64; policy.pools.len()];
    for c in candidates {
        let n = &snapshot.nodes[c.node];
        let pool = &policy.pools[c.pool];
        let keep = |reason: String| Kept {
            node: n.name.clone(),
            reason,
        };
        if receiving.contains(&c.node) {
            out.kept.push(keep(
                "it receives pods evicted from another node in this plan".into(),
            ));
            continue;
        }
        if let Some(why) = pool_at_minimum(pool, pool_nodes[c.pool] - removed_in_pool[c.pool]) {
            out.kept.push(keep(why));
            continue;
        }
        let running = draining as usize + out.scale_downs.len();
        if drains_left(policy, running) == 0 {
            out.held_for_drains += 1;
            out.kept.push(keep(format!(
                "{running} drains are already running or planned (maxConcurrentDrains {})",
                policy.max_concurrent_drains
            )));
            continue;
        }
        // PodDisruptionBudgets, counted across the whole plan.
        let need = pdb_need(snapshot, &c.movable);
        if let Some(why) = pdbs_refuse(snapshot, &need, &pdb_used) {
            out.kept.push(keep(why));
            continue;
        }
        let placed = place_elsewhere(snapshot, &c, &rooms, &removed, devices, &mut topology);
        let (moves, scratch) = match placed {
            Ok(placed) => placed,
            Err(p) => {
                out.kept.push(keep(format!(
                    "pod {p} would not fit on the nodes that remain"
                )));
                continue;
            }
        };
        for (node, room) in scratch {
            if moves.iter().any(|m| m.to == snapshot.nodes[node].name) {
                receiving.insert(node);
            }
            rooms[room_of[&node]] = room;
        }
        for (bi, k) in need.iter().enumerate() {
            pdb_used[bi] += k;
        }
        removed.insert(c.node);
        removed_in_pool[c.pool] += 1;
        let idle_for = std::time::Duration::from_secs(now.since(c.since).as_secs());
        let reason = if moves.is_empty() {
            format!(
                "empty (no GPU pods) for {}",
                crate::policy::duration::format_duration(idle_for)
            )
        } else {
            format!(
                "GPU utilization {:.0}% below {:.0}% for {}; {} pod(s) fit elsewhere",
                c.util * 100.0,
                pool.scale_down.utilization_threshold * 100.0,
                crate::policy::duration::format_duration(idle_for),
                moves.len()
            )
        };
        out.scale_downs.push(ScaleDown {
            node: n.name.clone(),
            pool: pool.name.clone(),
            reason,
            evict: moves,
            saves_per_hour: c.price,
        });
    }
    out.kept.sort_by(|a, b| a.node.cmp(&b.node));
    out
}

/// The pool would fall below its `minNodes` with one node less (`left`: its nodes not removed by
/// this plan).
fn pool_at_minimum(pool: &Pool, left: i64) -> Option<String> {
    (left <= pool.min_nodes as i64).then(|| {
        format!(
            "pool {} is at its minimum of {} nodes",
            pool.name, pool.min_nodes
        )
    })
}

/// Evictions per PodDisruptionBudget (index in `snapshot.pdbs`) that draining a node with these
/// pods needs.
fn pdb_need(snapshot: &Snapshot, pods: &[&Pod]) -> Vec<i32> {
    let mut need = vec![0i32; snapshot.pdbs.len()];
    for p in pods {
        for (bi, b) in snapshot.pdbs.iter().enumerate() {
            if b.selects(p) {
                need[bi] += 1;
            }
        }
    }
    need
}

/// The first PodDisruptionBudget that does not allow `need` more evictions on top of the `used`
/// ones of this plan, as why the node is kept.
fn pdbs_refuse(snapshot: &Snapshot, need: &[i32], used: &[i32]) -> Option<String> {
    let bi = (0..need.len())
        .find(|&bi| need[bi] > 0 && used[bi] + need[bi] > snapshot.pdbs[bi].disruptions_allowed)?;
    let b = &snapshot.pdbs[bi];
    Some(format!(
        "PodDisruptionBudget {}/{} allows {} more disruption(s), draining needs {}",
        b.namespace,
        b.name,
        (b.disruptions_allowed - used[bi]).max(0),
        need[bi]
    ))
}

/// Places a candidate's pods on the nodes that stay (never itself or a node this plan removes),
/// largest first, on a scratch copy of their room: the evictions and the rooms they change, or
/// the first pod that fits nowhere. With rules across nodes (host ports, pod affinity, spread),
/// the pods leave their node in `topology` and each goes only where kube-scheduler would take
/// it; `topology` is left as it was when one fits nowhere.
fn place_elsewhere(
    snapshot: &Snapshot,
    c: &Candidate,
    rooms: &[NodeRoom],
    removed: &BTreeSet<usize>,
    devices: &super::devices::Devices,
    topology: &mut Option<TopologyIndex>,
) -> Result<(Vec<Eviction>, BTreeMap<usize, NodeRoom>), String> {
    let mut order = c.movable.clone();
    order.sort_by(|a, b| {
        b.gpu_equivalents()
            .total_cmp(&a.gpu_equivalents())
            .then(b.requests.cpu_milli.cmp(&a.requests.cpu_milli))
            .then(a.id.cmp(&b.id))
    });
    let site = |n: &Node| (n.labels.clone(), n.name.clone());
    let from = site(&snapshot.nodes[c.node]);
    let profiles: Vec<Option<Profile>> = order
        .iter()
        .map(|p| {
            let t = topology.as_ref()?;
            Some(t.profile(p)).filter(|x| !x.is_free())
        })
        .collect();
    fn at(s: &(Arc<BTreeMap<String, String>>, String)) -> Site<'_> {
        Site {
            labels: &s.0,
            node: &s.1,
        }
    }
    if let Some(t) = topology.as_mut() {
        for prof in profiles.iter().flatten() {
            t.remove(prof, &at(&from));
        }
    }
    let mut scratch: BTreeMap<usize, NodeRoom> = BTreeMap::new();
    let mut moves = Vec::new();
    let mut recorded: Vec<(usize, usize)> = Vec::new();
    let mut failed = None;
    for (i, p) in order.iter().enumerate() {
        let mut placed = None;
        // Its claims' devices must be found where it goes.
        let claims = devices.moved_claims(p, &snapshot.nodes[c.node].name);
        for r in rooms {
            let dest = &snapshot.nodes[r.node];
            let room = scratch.get(&r.node).unwrap_or(r);
            if r.node == c.node
                || removed.contains(&r.node)
                || !dest.is_schedulable()
                || !p.fits(
                    &room.free,
                    &room.shared,
                    &dest.labels,
                    &dest.taints,
                    Some(&dest.name),
                )
                || !claims.fits_in(&room.free)
            {
                continue;
            }
            let to = Site {
                labels: &dest.labels,
                node: &dest.name,
            };
            if let (Some(t), Some(prof)) = (topology.as_mut(), &profiles[i]) {
                if t.admits(prof, &to).is_err() {
                    continue;
                }
                t.add(prof, &to);
                recorded.push((i, r.node));
            }
            let room = scratch.entry(r.node).or_insert_with(|| r.clone());
            room.free.sub(&p.requests);
            claims.take_from(&mut room.free);
            if let Some(s) = &p.share {
                place_share(&mut room.shared, s);
            }
            placed = Some(r.node);
            break;
        }
        match placed {
            Some(d) => moves.push(Eviction {
                pod: p.id.to_string(),
                to: snapshot.nodes[d].name.clone(),
            }),
            None if claims.any() => {
                failed = Some(format!(
                    "{} (no node that remains has the devices its ResourceClaims need)",
                    p.id
                ));
                break;
            }
            None => {
                failed = Some(p.id.to_string());
                break;
            }
        }
    }
    let Some(why) = failed else {
        return Ok((moves, scratch));
    };
    if let Some(t) = topology.as_mut() {
        for &(i, node) in &recorded {
            if let Some(prof) = &profiles[i] {
                t.remove(prof, &at(&site(&snapshot.nodes[node])));
            }
        }
        for prof in profiles.iter().flatten() {
            t.add(prof, &at(&from));
        }
    }
    Err(why)
}
