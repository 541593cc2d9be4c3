//! GPU-aware consolidation: the running pods of a pool planned again as if they were starting
//! now. Pods arrive one by one and each got the cheapest node for itself then; hours later, the
//! same pods together often fit fewer or cheaper nodes (four one-GPU nodes into one four-GPU
//! node, on-demand into spot, pods onto room other nodes have left). When the saving pays for
//! the move, those nodes are replaced: the decision core taints them, plans their pods as
//! pending (the replacement is launched like any scale-up), drains them once the pods have a
//! place on nodes that exist, and terminates them.
//!
//! A move pays off when, over the pods' expected remaining run time (taken as the time they have
//! run so far, at least `consolidateAfter`), the saving exceeds what the old and new nodes cost
//! during `restartCost` (the work a moved pod loses: restart, reload, the new node's boot) plus
//! what the nodes that stay and take moved pods cost for as long as those pods are expected to
//! outlast the nodes' own pods (a four-GPU node whose gang ends in half an hour, kept for hours
//! by a one-GPU server moved onto its room, costs more than the one-GPU node it saved), and the
//! saving is at least `minSaving` of what the old nodes cost.
//!
//! A node is a candidate when it is a ready, schedulable node of the pool older than
//! `consolidateAfter`; has pods to move (empty nodes are scale-down's); every pod on it is
//! movable (as for scale-down: controller-owned, no `do-not-disrupt`, no local storage without
//! `safe-to-evict`, PDBs allow it), has run for `consolidateAfter`, and is not a batch Job's,
//! training operator's or gang's pod unless the pool moves jobs (`moveJobs`) or the pod is
//! annotated `gpu-node-autoscaler.io/restartable: "true"`. Nothing is consolidated while GPU
//! pods wait or the pool has launches in flight: their capacity comes first.
//!
//! Candidates are ranked twice, by what they cost per GPU their pods use (the most wasteful
//! first) and by price (the cheapest first), at most `maxNodes` of them (and no more than the
//! drains left under `maxConcurrentDrains`); the first 1, 2, 3, ... up to all of each ranking
//! are planned again, and the set with the largest net gain (saving over the horizon less the
//! cost of moving) wins.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;

use gpu_node_autoscaler_provider::CapacityType;

use crate::model::constraints::{Effect, Taint};
use crate::model::{labels, OwnerKind, Pod, PodPhase, Snapshot, Time};
use crate::policy::{Policy, Pool};

use super::disrupt::{do_not_disrupt, drains_left};
use super::scale_down::{dies_with_node, not_movable, price_of, utilization};
use super::templates::{template_of_node, Template};
use super::{is_planned_pod, pack};

/// Nodes to replace, what replaces them, and why it pays.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Consolidation {
    pub pool: String,
    pub nodes: Vec<String>,
    /// The pods that move.
    pub pods: Vec<String>,
    /// $/hour of the nodes replaced.
    pub old_per_hour: f64,
    /// $/hour of the nodes launched for their pods (zero: they fit nodes that stay).
    pub new_per_hour: f64,
    /// What is launched, e.g. `1 × g4dn.12xlarge us-east-1a spot`.
    pub launches: Vec<String>,
    /// The offerings planned for them (the first of each scale-up's list): should one run out
    /// before the launch, the move no longer pays as planned and is called off.
    #[serde(skip)]
    pub offerings: Vec<gpu_node_autoscaler_provider::OfferingKey>,
    /// The pods' expected remaining run time the saving was weighed over.
    pub horizon: Duration,
    /// What the nodes that take moved pods cost for the time those pods are expected to keep
    /// them beyond their own pods (a big node whose job ends soon, kept for a small pod that runs
    /// on): charged against the saving.
    pub kept_longer_usd: f64,
}

impl Consolidation {
    pub fn saving_per_hour(&self) -> f64 {
        self.old_per_hour - self.new_per_hour
    }

    /// One line for Events and logs.
    pub fn describe(&self) -> String {
        let to = if self.launches.is_empty() {
            "the room other nodes have".to_string()
        } else {
            self.launches.join(", ")
        };
        let kept = if self.kept_longer_usd > 0.0 {
            format!(
                "; nodes that take them are kept longer, for ${:.2}",
                self.kept_longer_usd
            )
        } else {
            String::new()
        };
        format!(
            "{} pod(s) on {} node(s) ({}) at ${:.2}/h fit {} at ${:.2}/h: saves ${:.2}/h \
             ({:.0}%) over an expected {} more{kept}",
            self.pods.len(),
            self.nodes.len(),
            self.nodes.join(", "),
            self.old_per_hour,
            to,
            self.new_per_hour,
            self.saving_per_hour(),
            100.0 * self.saving_per_hour() / self.old_per_hour.max(1e-9),
            crate::policy::duration::format_duration(self.horizon)
        )
    }
}

/// What a pool's consolidation depends on, hashed: its nodes (name, schedulable) and the pods
/// bound to them. Unchanged, planning again gives the same answer, save for the pods' growing
/// age (which only makes a move pay more): the decision core skips the work for a while.
pub fn fingerprint(snapshot: &Snapshot, pool: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    let mut names: BTreeSet<&str> = BTreeSet::new();
    for n in snapshot.nodes.iter().filter(|n| n.pool() == Some(pool)) {
        n.name.hash(&mut h);
        n.is_schedulable().hash(&mut h);
        names.insert(n.name.as_str());
    }
    for p in &snapshot.pods {
        if let (true, Some(n)) = (p.is_bound_active(), p.node_name.as_deref()) {
            if names.contains(n) {
                p.uid.hash(&mut h);
                n.hash(&mut h);
            }
        }
    }
    h.finish()
}

/// A pod of work that ends (a batch Job, a training operator's, a gang member): it loses its
/// progress when moved unless it checkpoints.
fn is_job(p: &Pod) -> bool {
    p.gang.is_some()
        || matches!(
            p.owner.as_ref().map(|o| &o.kind),
            Some(OwnerKind::Job | OwnerKind::Kubeflow(_))
        )
}

struct Candidate<'a> {
    node: usize,
    price: f64,
    per_used_gpu: f64,
    pods: Vec<&'a Pod>,
}

/// A real pod waits for a node: no pool is consolidated (why, as [`consolidate`] says it).
/// CapacityBuffer pods are not looked at: see [`place_buffer_pods`].
pub fn pod_waiting(snapshot: &Snapshot) -> Option<String> {
    let p = snapshot
        .pods
        .iter()
        .find(|p| is_planned_pod(p) && crate::buffer::buffer_of(p).is_none())?;
    Some(format!("pod {} waits for a node", p.id))
}

/// A pod waits for a node, a real one or a CapacityBuffer's chunk that has no room on a node or
/// a launch in flight (once [`place_buffer_pods`] placed the others): no pool is consolidated.
pub fn waiting(snapshot: &Snapshot) -> Option<String> {
    if let Some(why) = pod_waiting(snapshot) {
        return Some(why);
    }
    let p = snapshot.pods.iter().find(|p| is_planned_pod(p))?;
    let b = crate::buffer::buffer_of(p).unwrap_or_default();
    Some(format!(
        "capacity buffer {}/{b} has a chunk ({}) with no room on a node or a launch in flight: \
         consolidation waits for its node",
        p.id.namespace, p.id.name
    ))
}

/// The snapshot consolidation plans, with the CapacityBuffers' chunks that already have their
/// room placed there: each buffer pod goes first-fit onto the free room of a Ready node (its GPUs
/// counted from its template while its device plugin starts) and is bound to it there, so its
/// room is not given to moved pods and its node is not a candidate; else onto a launch in flight
/// of its template's capacity, and left out (that room is coming). A chunk with no room anywhere
/// stays pending: consolidation waits for it ([`waiting`]). Chunks that need devices are left
/// pending.
pub fn place_buffer_pods(snapshot: &mut Snapshot, templates: &[Template]) {
    let buffered = |p: &Pod| is_planned_pod(p) && crate::buffer::buffer_of(p).is_some();
    if !snapshot.pods.iter().any(buffered) {
        return;
    }
    let index: BTreeMap<&str, usize> = snapshot
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let mut free: Vec<Option<(crate::model::Resources, Vec<crate::model::SharedGpu>)>> = snapshot
        .nodes
        .iter()
        .map(|n| {
            if !n.is_schedulable() || n.deleting {
                return None;
            }
            let t = template_of_node(n, templates).map(|t| &templates[t]);
            Some(match t {
                Some(t) if t.gpus > 0 && n.advertised_gpus() == 0 => {
                    (t.allocatable.clone(), t.shared.clone())
                }
                _ => (n.allocatable.clone(), n.shared_gpus.clone()),
            })
        })
        .collect();
    for p in &snapshot.pods {
        if let (true, Some(n)) = (p.is_bound_active(), p.node_name.as_deref()) {
            if let Some(Some((f, shared))) = index.get(n).map(|&i| &mut free[i]) {
                f.sub(&p.requests);
                if let Some(sh) = &p.share {
                    crate::model::resources::place_share(shared, sh);
                }
            }
        }
    }
    let mut coming: Vec<(
        crate::model::Resources,
        Vec<crate::model::SharedGpu>,
        usize,
        usize,
    )> = Vec::new();
    for f in &snapshot.in_flight {
        let Some((ti, oi)) = templates.iter().enumerate().find_map(|(ti, t)| {
            (t.pool_name == f.pool && t.instance_type == f.offering.instance_type)
                .then(|| {
                    t.offerings
                        .iter()
                        .position(|o| o.key == f.offering)
                        .map(|oi| (ti, oi))
                })
                .flatten()
        }) else {
            continue;
        };
        for _ in 0..f.count {
            coming.push((
                templates[ti].allocatable.clone(),
                templates[ti].shared.clone(),
                ti,
                oi,
            ));
        }
    }
    let mut gone = BTreeSet::new();
    for (pi, p) in snapshot.pods.iter_mut().enumerate() {
        if !buffered(p) || p.needs_devices() {
            continue;
        }
        let on_node = snapshot.nodes.iter().enumerate().find_map(|(i, n)| {
            let (f, shared) = free[i].as_mut()?;
            if !p.fits(f, shared, &n.labels, &n.taints, Some(&n.name)) {
                return None;
            }
            f.sub(&p.requests);
            if let Some(sh) = &p.share {
                crate::model::resources::place_share(shared, sh);
            }
            Some(n.name.clone())
        });
        if let Some(node) = on_node {
            p.node_name = Some(node);
            p.phase = PodPhase::Running;
            p.unschedulable = false;
            p.nominated_node = None;
            continue;
        }
        for (f, shared, ti, oi) in &mut coming {
            let t = &templates[*ti];
            if p.fits(f, shared, &t.offerings[*oi].labels, &t.taints, None) {
                f.sub(&p.requests);
                if let Some(sh) = &p.share {
                    crate::model::resources::place_share(shared, sh);
                }
                gone.insert(pi);
                break;
            }
        }
    }
    if !gone.is_empty() {
        let mut i = 0;
        snapshot.pods.retain(|_| {
            i += 1;
            !gone.contains(&(i - 1))
        });
    }
}

/// Why nothing in `pool` is worth consolidating now, or what is.
pub fn consolidate(
    snapshot: &Snapshot,
    templates: &[Template],
    policy: &Policy,
    pool: &Pool,
    now: Time,
    drains_running: usize,
) -> Result<Consolidation, String> {
    let cfg = &pool.consolidation;
    if let Some(why) = waiting(snapshot) {
        return Err(why);
    }
    if snapshot.in_flight.iter().any(|f| f.pool == pool.name) {
        return Err("launches of the pool are in flight".into());
    }
    let budget = drains_left(policy, drains_running).min(cfg.max_nodes as usize);
    if budget == 0 {
        return Err(format!(
            "{drains_running} drains are running (maxConcurrentDrains {})",
            policy.max_concurrent_drains
        ));
    }
    let mut pods_on: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
    for p in &snapshot.pods {
        if let (true, Some(n)) = (p.is_bound_active(), &p.node_name) {
            pods_on.entry(n.as_str()).or_default().push(p);
        }
    }
    let old_enough = |t: Time| now.since(t) >= cfg.consolidate_after;
    let mut candidates: Vec<Candidate> = Vec::new();
    'nodes: for (ni, n) in snapshot.nodes.iter().enumerate() {
        if n.pool() != Some(pool.name.as_str())
            || !n.is_schedulable()
            || n.deleting
            || n.taints.iter().any(|t| t.key == labels::REPLACING_TAINT)
            || !old_enough(n.created)
            || do_not_disrupt(n).is_some()
        {
            continue;
        }
        let Some(ti) = template_of_node(n, templates) else {
            continue;
        };
        let template = &templates[ti];
        let all = pods_on.get(n.name.as_str()).cloned().unwrap_or_default();
        let Some(util) = utilization(n, Some(template), &all) else {
            continue;
        };
        let pods: Vec<&Pod> = all.into_iter().filter(|p| !dies_with_node(p)).collect();
        if pods.is_empty() {
            continue;
        }
        for p in &pods {
            // A CapacityBuffer's room ([`place_buffer_pods`]) is kept where it is.
            if crate::buffer::buffer_of(p).is_some() {
                continue 'nodes;
            }
            let restartable = p
                .annotations
                .get(labels::RESTARTABLE)
                .is_some_and(|v| v == "true");
            if p.deleting
                || !p.wants_gpu()
                || !old_enough(p.started.unwrap_or(p.created))
                || not_movable(p, snapshot).is_some()
                || (is_job(p) && !cfg.move_jobs && !restartable)
            {
                continue 'nodes;
            }
        }
        let price = price_of(n, Some(template));
        let gpus = template.gpus.max(1) as f64;
        candidates.push(Candidate {
            node: ni,
            price,
            per_used_gpu: price / (gpus * util).max(1e-3),
            pods,
        });
    }
    if candidates.is_empty() {
        return Err("no node has only movable pods that have run long enough".into());
    }
    // Two orders, each tried on its first 1, 2, 4, ... candidates: the most wasteful first
    // (their pods repack best together) and the cheapest first (their pods fit best into the
    // room of nodes that stay).
    let name = |c: &Candidate| snapshot.nodes[c.node].name.as_str();
    let mut wasteful: Vec<&Candidate> = candidates.iter().collect();
    wasteful.sort_by(|a, b| {
        b.per_used_gpu
            .total_cmp(&a.per_used_gpu)
            .then(name(a).cmp(name(b)))
    });
    wasteful.truncate(budget);
    let mut cheap: Vec<&Candidate> = candidates.iter().collect();
    cheap.sort_by(|a, b| a.price.total_cmp(&b.price).then(name(a).cmp(name(b))));
    cheap.truncate(budget);

    // A lower bound on what any repack of a set costs, to skip sets that cannot save enough:
    // whole GPUs beyond the room free elsewhere, at the cheapest price per GPU on offer.
    let per_gpu = templates
        .iter()
        .filter(|t| t.gpus > 0 && t.shared.is_empty())
        .flat_map(|t| {
            t.offerings
                .iter()
                .filter(|o| o.available)
                .map(move |o| o.price / t.gpus as f64)
        })
        .fold(f64::INFINITY, f64::min);
    let mut free_gpus = 0i64;
    let mut free_on = vec![0i64; snapshot.nodes.len()];
    let mut used: BTreeMap<&str, i64> = BTreeMap::new();
    for p in &snapshot.pods {
        if let (true, Some(n)) = (p.is_bound_active(), p.node_name.as_deref()) {
            *used.entry(n).or_default() += p.requests.whole_gpus();
        }
    }
    for (i, n) in snapshot.nodes.iter().enumerate() {
        if n.is_schedulable() {
            let f = (n.allocatable.whole_gpus() - used.get(n.name.as_str()).copied().unwrap_or(0))
                .max(0);
            free_on[i] = f;
            free_gpus += f;
        }
    }
    let cannot_pay = |set: &[&Candidate]| -> bool {
        if !per_gpu.is_finite() {
            return false;
        }
        let mut need = 0i64;
        for c in set {
            for p in &c.pods {
                if p.share.is_some() || p.requests.mig_slices().next().is_some() {
                    return false; // no simple bound: plan it
                }
                need += p.requests.whole_gpus();
            }
        }
        let elsewhere = free_gpus - set.iter().map(|c| free_on[c.node]).sum::<i64>();
        let old: f64 = set.iter().map(|c| c.price).sum();
        let least = (need - elsewhere).max(0) as f64 * per_gpu;
        old - least < cfg.min_saving * old
    };

    let mut tried: BTreeSet<Vec<usize>> = BTreeSet::new();
    let mut scratch: Option<Snapshot> = None;
    let mut best: Option<(f64, Consolidation)> = None;
    let mut last_why = String::new();
    for order in [&wasteful, &cheap] {
        for k in 1..=order.len() {
            let set = &order[..k];
            let mut key: Vec<usize> = set.iter().map(|c| c.node).collect();
            key.sort_unstable();
            if !tried.insert(key) {
                continue;
            }
            if cannot_pay(set) {
                last_why = format!(
                    "no repack of {k} node(s) can save minSaving {:.0}% (cheapest GPU on offer \
                     ${per_gpu:.2}/h)",
                    cfg.min_saving * 100.0
                );
                continue;
            }
            // One copy of the snapshot for every set: each evaluation changes it and puts it
            // back as it was.
            let scratch = scratch.get_or_insert_with(|| snapshot.clone());
            match evaluate(snapshot, scratch, templates, policy, pool, now, set) {
                Ok((net, c)) => {
                    if best.as_ref().is_none_or(|(b, _)| net > *b) {
                        best = Some((net, c));
                    }
                }
                Err(why) => last_why = why,
            }
        }
    }
    best.map(|(_, c)| c).ok_or(last_why)
}

/// Plans the candidates' pods again without their nodes, and weighs the result. `scratch` is a
/// copy of `snapshot`, changed for the plan (the set's nodes tainted, their pods pending) and
/// given back unchanged.
#[allow(clippy::too_many_arguments)]
fn evaluate(
    snapshot: &Snapshot,
    scratch: &mut Snapshot,
    templates: &[Template],
    policy: &Policy,
    pool: &Pool,
    now: Time,
    set: &[&Candidate],
) -> Result<(f64, Consolidation), String> {
    let cfg = &pool.consolidation;
    // PodDisruptionBudgets must allow every eviction at once.
    let mut need = vec![0i32; snapshot.pdbs.len()];
    for c in set {
        for p in &c.pods {
            for (bi, b) in snapshot.pdbs.iter().enumerate() {
                if b.selects(p) {
                    need[bi] += 1;
                }
            }
        }
    }
    if let Some(bi) = (0..need.len()).find(|&bi| need[bi] > snapshot.pdbs[bi].disruptions_allowed) {
        let b = &snapshot.pdbs[bi];
        return Err(format!(
            "PodDisruptionBudget {}/{} allows {} disruption(s), moving needs {}",
            b.namespace, b.name, b.disruptions_allowed, need[bi]
        ));
    }
    let nodes: BTreeSet<&str> = set
        .iter()
        .map(|c| snapshot.nodes[c.node].name.as_str())
        .collect();
    let mut tainted = Vec::new();
    for (i, n) in scratch.nodes.iter_mut().enumerate() {
        if nodes.contains(n.name.as_str()) {
            n.taints.push(Taint {
                key: labels::TO_BE_DELETED_TAINT.into(),
                value: String::new(),
                effect: Effect::NoSchedule,
            });
            tainted.push(i);
        }
    }
    // A pod is expected to run as long again as it has run, at least `consolidateAfter`.
    let expected = |p: &Pod| {
        now.since(p.started.unwrap_or(p.created))
            .max(cfg.consolidate_after)
    };
    let mut moved = Vec::new();
    let mut ages = Vec::new();
    let mut moved_expected: BTreeMap<String, Duration> = BTreeMap::new();
    // How long each node that stays is expected to be kept by its own pods.
    let mut kept_for: BTreeMap<String, Duration> = BTreeMap::new();
    // Pods made pending: their index, node and phase, to put back.
    let mut unbound = Vec::new();
    for (i, p) in scratch.pods.iter_mut().enumerate() {
        let Some(node) = p.node_name.as_deref() else {
            continue;
        };
        if !p.is_bound_active() || dies_with_node(p) {
            continue;
        }
        if nodes.contains(node) {
            moved.push(p.id.to_string());
            ages.push(now.since(p.started.unwrap_or(p.created)));
            moved_expected.insert(p.id.to_string(), expected(p));
            unbound.push((i, p.node_name.take(), p.phase));
            p.phase = PodPhase::Pending;
        } else {
            let e = kept_for.entry(node.to_string()).or_default();
            *e = (*e).max(expected(p));
        }
    }
    let (plan, ..) = pack::scale_up(scratch, templates, policy, now);
    for i in tainted {
        scratch.nodes[i].taints.pop();
    }
    for (i, node, phase) in unbound {
        scratch.pods[i].node_name = node;
        scratch.pods[i].phase = phase;
    }
    if let Some(u) = plan.unschedulable.first() {
        return Err(format!("pod {} would have no place: {}", u.pod, u.reason));
    }
    let old_per_hour: f64 = set.iter().map(|c| c.price).sum();
    let new_per_hour: f64 = plan.scale_ups.iter().map(|s| s.cost_per_hour()).sum();
    let launches: Vec<String> = plan
        .scale_ups
        .iter()
        .filter_map(|s| {
            let o = s.offerings.first()?;
            Some(format!(
                "{} × {} {} {}",
                s.count, o.instance_type, o.zone, o.capacity_type
            ))
        })
        .collect();
    let offerings = plan
        .scale_ups
        .iter()
        .filter_map(|s| s.offerings.first().map(|o| o.key()))
        .collect();
    ages.sort();
    let horizon = ages[ages.len() / 2].max(cfg.consolidate_after);
    let hours = |d: Duration| d.as_secs_f64() / 3600.0;
    // Moved pods that outlast a staying node's own pods keep it (its whole price) that much
    // longer.
    let mut longest: BTreeMap<&str, Duration> = BTreeMap::new();
    for pl in &plan.existing_capacity {
        if let Some(e) = moved_expected.get(&pl.pod) {
            let l = longest.entry(pl.target.as_str()).or_default();
            *l = (*l).max(*e);
        }
    }
    let kept_longer_usd: f64 = longest
        .iter()
        .filter_map(|(target, &e)| {
            let n = snapshot.nodes.iter().find(|n| n.name == *target)?;
            let own = kept_for.get(*target).copied().unwrap_or_default();
            let template = template_of_node(n, templates).map(|ti| &templates[ti]);
            Some(price_of(n, template) * hours(e.saturating_sub(own)))
        })
        .sum();
    let c = Consolidation {
        pool: pool.name.clone(),
        nodes: nodes.iter().map(|s| s.to_string()).collect(),
        pods: moved,
        old_per_hour,
        new_per_hour,
        launches,
        offerings,
        horizon,
        kept_longer_usd,
    };
    let saving = c.saving_per_hour();
    if saving < cfg.min_saving * old_per_hour {
        return Err(format!(
            "the best repack of {} node(s) saves ${:.2}/h of ${:.2}/h, less than minSaving {:.0}%",
            set.len(),
            saving.max(0.0),
            old_per_hour,
            cfg.min_saving * 100.0
        ));
    }
    let move_cost = (old_per_hour + new_per_hour) * hours(cfg.restart_cost);
    let net = saving * hours(horizon) - move_cost - kept_longer_usd;
    if net < 0.0 {
        return Err(format!(
            "saving ${saving:.2}/h over an expected {} does not pay for moving (${move_cost:.2}) \
             and for keeping the nodes that take the pods longer (${kept_longer_usd:.2})",
            crate::policy::duration::format_duration(horizon)
        ));
    }
    Ok((net, c))
}

/// On-demand nodes to keep new pods off while their pool's spot is to be had again: in a pool
/// that prefers spot and consolidates, an on-demand node bought while spot was short would
/// otherwise be refilled by the next pods the scheduler binds as soon as it has room (a batch
/// Job's pod is never moved off it later), and stay on-demand for as long as pods keep coming.
/// Kept free (tainted), it is removed as an empty node once its pods end, and new pods get spot
/// nodes.
///
/// A node qualifies when it is a Ready, schedulable on-demand node of such a pool that either
/// holds no pod but DaemonSet pods and the plan finds unneeded, or has every GPU taken (it has
/// no room to lose: the taint matters only once a pod ends, when the next pod would otherwise
/// take the GPU it frees, the same moment in a cluster whose Jobs arrive as their pods end);
/// some template of its pool has a spot offering available now, the plan buys no on-demand node
/// in its pool, and no pending GPU pod could use it but none of those spot offerings (a pod that
/// must run on on-demand keeps it). A node the plan means pods for is needed, so one just
/// launched for a pod is not kept free. Each node kept free is returned with whether it is empty.
pub fn keep_free_for_spot(
    snapshot: &Snapshot,
    templates: &[Template],
    policy: &Policy,
    plan: &super::Plan,
) -> BTreeMap<String, bool> {
    if !keeps_free_for_spot(policy) {
        return BTreeMap::new();
    }
    let unneeded: BTreeSet<&str> = plan.unneeded.iter().map(|u| u.node.as_str()).collect();
    let buys_on_demand: BTreeSet<&str> = plan
        .scale_ups
        .iter()
        .filter(|u| {
            u.offerings
                .first()
                .is_some_and(|o| o.capacity_type == CapacityType::OnDemand)
        })
        .map(|u| u.pool.as_str())
        .collect();
    let mut out = BTreeMap::new();
    // Made when a node first passes the other checks.
    let mut busy: Option<BTreeMap<&str, Vec<&Pod>>> = None;
    let mut pending: Option<Vec<&Pod>> = None;
    for n in &snapshot.nodes {
        let Some(pool) = n.pool().and_then(|name| policy.pool(name)) else {
            continue;
        };
        if !pool.consolidation.enabled
            || !prefers_spot(pool)
            || n.capacity_type() != CapacityType::OnDemand.as_str()
            || !n.ready
            || n.unschedulable
            || n.is_being_deleted()
            || buys_on_demand.contains(pool.name.as_str())
        {
            continue;
        }
        let busy = busy.get_or_insert_with(|| {
            let mut on: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
            for p in &snapshot.pods {
                if let (true, false, Some(node)) = (
                    p.is_bound_active(),
                    p.is_daemonset(),
                    p.node_name.as_deref(),
                ) {
                    on.entry(node).or_default().push(p);
                }
            }
            on
        });
        let empty = match busy.get(n.name.as_str()) {
            None if unneeded.contains(n.name.as_str()) => true,
            Some(pods)
                if template_of_node(n, templates)
                    .and_then(|t| utilization(n, Some(&templates[t]), pods))
                    .is_some_and(|u| u >= 1.0) =>
            {
                false
            }
            _ => continue,
        };
        let pending = pending
            .get_or_insert_with(|| snapshot.pods.iter().filter(|p| is_planned_pod(p)).collect());
        let spot = available_spot(templates, &pool.name);
        if spot.is_empty() {
            continue;
        }
        let needs_it = needs_on_demand(n, pending, &spot);
        if !needs_it {
            out.insert(n.name.clone(), empty);
        }
    }
    out
}

/// A pool that consolidates and prefers spot to on-demand.
fn prefers_spot(pool: &Pool) -> bool {
    let at = |c: CapacityType| pool.capacity_types.iter().position(|x| *x == c);
    matches!((at(CapacityType::Spot), at(CapacityType::OnDemand)), (Some(s), Some(o)) if s < o)
}

/// Whether some pool of the policy may have nodes kept free for spot ([`keep_free_for_spot`]):
/// one that consolidates and prefers spot to on-demand.
pub fn keeps_free_for_spot(policy: &Policy) -> bool {
    policy
        .pools
        .iter()
        .any(|p| p.consolidation.enabled && prefers_spot(p))
}

/// The labels of the spot offerings of `pool` available now.
fn available_spot<'a>(templates: &'a [Template], pool: &str) -> Vec<&'a BTreeMap<String, String>> {
    templates
        .iter()
        .filter(|t| t.pool_name == pool)
        .flat_map(|t| &t.offerings)
        .filter(|o| o.available && o.key.capacity_type == CapacityType::Spot)
        .map(|o| o.labels.as_ref())
        .collect()
}

/// Whether a pending pod could use node `n` (were it not kept free) but none of `spot`.
fn needs_on_demand(
    n: &crate::model::Node,
    pending: &[&Pod],
    spot: &[&BTreeMap<String, String>],
) -> bool {
    let untainted: Vec<Taint> = n
        .taints
        .iter()
        .filter(|t| t.key != labels::SPOT_AVAILABLE_TAINT)
        .cloned()
        .collect();
    pending.iter().any(|p| {
        p.constraints.admits(&n.labels, &untainted, Some(&n.name))
            && !spot.iter().any(|l| p.constraints.matches_node(l, None))
    })
}

/// Before planning: a node kept free for spot ([`keep_free_for_spot`]) that a pending pod needs
/// (it cannot use the pool's spot) is planned without its taint, so that the plan puts the pod
/// there instead of buying another on-demand node; the pass then takes the taint off. Returns
/// those nodes.
pub fn release_for_on_demand(
    snapshot: &mut Snapshot,
    templates: &[Template],
    policy: &Policy,
) -> Vec<String> {
    let mut released = Vec::new();
    let pending: Vec<&Pod> = snapshot.pods.iter().filter(|p| is_planned_pod(p)).collect();
    if pending.is_empty() {
        return released;
    }
    for n in &mut snapshot.nodes {
        if !n
            .taints
            .iter()
            .any(|t| t.key == labels::SPOT_AVAILABLE_TAINT)
        {
            continue;
        }
        let Some(pool) = n.pool().and_then(|name| policy.pool(name)) else {
            continue;
        };
        let spot = available_spot(templates, &pool.name);
        if spot.is_empty() || needs_on_demand(n, &pending, &spot) {
            n.taints.retain(|t| t.key != labels::SPOT_AVAILABLE_TAINT);
            released.push(n.name.clone());
        }
    }
    released
}

/// The taint [`keep_free_for_spot`]'s nodes carry.
pub fn spot_available_taint() -> Taint {
    Taint {
        key: labels::SPOT_AVAILABLE_TAINT.into(),
        value: String::new(),
        effect: Effect::NoSchedule,
    }
}
