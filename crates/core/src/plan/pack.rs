//! Scale-up packing.
//!
//! 1. Pending GPU pods are grouped into classes of identical pods (requests, shared-GPU share,
//!    constraints, gang), so that work scales with the number of distinct shapes, not pods.
//! 2. In priority order (then size), single pods go first-fit onto capacity that exists or is on
//!    its way: Ready nodes, nodes still booting or whose device plugin has not advertised GPUs yet
//!    (counted at their template's capacity), and launches in flight. Gangs try every zone,
//!    existing capacity first and new nodes for the rest, and take the cheapest zone that holds
//!    the whole gang, or nothing.
//! 3. What is left opens new nodes greedily: each round fills one fresh node of every template
//!    (largest pods first) and opens the one with the lowest price per unit of demand packed,
//!    repeated while the same fill fits again. A pod's demand is valued at what it would cost on
//!    its cheapest matching offering if nodes could be split (its dominant share of the node
//!    times the price), so cheap small nodes and big shared nodes compete on equal terms.

use crate::hash::HashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use crate::model::resources::{
    place_share, place_shares, share_copies, GpuShare, Resources, SharedGpu,
};
use crate::model::topology::{self, Profile, Refusal, Site, TopologyIndex};
use crate::model::{Constraints, InFlight, Pod, Snapshot, Time};
use crate::policy::Policy;
use gpu_node_autoscaler_provider::CapacityType;

use super::devices::{self, DeviceDemand, Devices};
use super::templates::{template_of_node, Template};
use super::{is_planned_pod, Placement, Plan, PlannedOffering, PlannedPod, ScaleUp, Unschedulable};

struct Class {
    requests: Resources,
    share: Option<GpuShare>,
    cclass: usize,
    /// Indices into `snapshot.pods`, in placement order.
    pods: Vec<usize>,
    next: usize,
    gang: Option<usize>,
    priority: i32,
    gpu_eq: f64,
    /// Per template: offerings whose labels and taints admit the class and whose empty node
    /// fits one pod (0 when none).
    tmask: Vec<u64>,
    value: f64,
    /// Pools whose on-demand offerings the class may not use yet (bit per pool: its pods
    /// wait for spot, `spotMaxWait`), and when the first of its pods may.
    spot_only: u64,
    spot_until: Option<Time>,
    /// Devices its claims take (Dynamic Resource Allocation); `None` for most pods.
    devices: Option<Arc<DeviceDemand>>,
    /// Its rules across nodes, or other pods' rules that look at it; `None` for most pods.
    profile: Option<Arc<Profile>>,
    /// Why those rules kept it off capacity it would otherwise have had.
    refused: Option<Refusal>,
    /// How long its pods are expected to run (`gpu-node-autoscaler.io/expected-run-time`; a
    /// value that is no duration counts as none); else its pool's `expectedRunTime`.
    run_time: Option<Duration>,
}

impl Class {
    fn remaining(&self) -> i64 {
        (self.pods.len() - self.next) as i64
    }

    fn copies(&self, free: &Resources, shared: &[SharedGpu]) -> i64 {
        let mut k = self.requests.copies_in(free);
        if let Some(s) = &self.share {
            k = k.min(share_copies(shared, s));
        }
        if let (Some(d), true) = (&self.devices, k > 0) {
            k = d.copies(free, k);
        }
        k
    }

    fn apply(&self, free: &mut Resources, shared: &mut [SharedGpu], k: i64) {
        free.add_scaled(&self.requests, -k);
        if let Some(s) = &self.share {
            place_shares(shared, s, k);
        }
        if let Some(d) = &self.devices {
            d.apply(free, k);
        }
    }
}

struct Gang {
    key: String,
    classes: Vec<usize>,
    zone: Option<String>,
    incomplete: Option<String>,
    priority: i32,
    gpu_eq: f64,
    failed: Option<String>,
}

#[derive(Clone, Copy, PartialEq)]
enum BinKind {
    Node(usize),
    InFlight(usize),
    New(usize),
}

struct Bin {
    free: Resources,
    shared: Vec<SharedGpu>,
    zone: Option<String>,
    kind: BinKind,
    /// For in-flight and new bins: the template and which of its offerings the node may be.
    template: usize,
    mask: u64,
    /// No GPU of any kind left (every planned pod wants one): skipped from then on.
    full: bool,
    /// A node still starting, counted at its template's capacity.
    starting: bool,
    /// A node that joined within the max node provision time, Ready or not: the taints a
    /// starting node carries (not-ready, uninitialized) are about to go, so they do not keep a
    /// pod off it. The node lifecycle controller takes the not-ready taint off a moment after
    /// the node turns Ready; a plan made in between would otherwise launch again.
    joining: bool,
    /// Pending pods (indices into `snapshot.pods`) the launch of this starting or in-flight
    /// node was for.
    reserved: Vec<usize>,
}

impl Bin {
    fn update_full(&mut self) {
        let f = &self.free;
        self.full = f.pods <= 0
            || !(f.gpu > 0
                || f.amd_gpu > 0
                || f.mig_slices().any(|(_, n)| n > 0)
                || self.shared.iter().any(|g| g.mem_gib > 0 || g.core_pct > 0)
                || f.extended
                    .iter()
                    .any(|(n, v)| *v > 0 && n.starts_with(devices::DIM_PREFIX)));
    }
}

struct NewNode {
    template: usize,
    mask: u64,
    gang: Option<usize>,
    pods: Vec<usize>,
}

/// Per (class, template): the most pods of the class one new node of the template may take (no
/// entry: as many as fit).
type NodeCaps = HashMap<(usize, usize), i64>;

/// Offerings of a template in one domain of every topology key: their mask, the domains (the
/// values of the keys rules use) and the labels of the first of them.
type Part = (u64, Vec<Option<String>>, Arc<BTreeMap<String, String>>);

/// Nodes opened by the greedy: `count` identical nodes taking `takes` per node.
struct Opened {
    template: usize,
    mask: u64,
    count: i64,
    takes: Vec<(usize, i64)>,
    free: Resources,
    shared: Vec<SharedGpu>,
}

/// What counts against the pools' and the cluster's limits. Sums saturate: a Node reporting an
/// absurd GPU count (up to `i64::MAX`) fills the limits, it does not wrap them.
#[derive(Clone)]
struct Usage {
    pool_nodes: Vec<i64>,
    pool_gpus: Vec<i64>,
    nodes: i64,
    gpus: i64,
    /// Per reserved offering (`Packer::reserved_slots`): instances its reservations still hold.
    reserved: Vec<i64>,
}

impl Usage {
    /// Adds `nodes` nodes with `gpus` GPUs in all, in pool `pool` (none: counted for the cluster
    /// only).
    fn add(&mut self, pool: Option<usize>, nodes: i64, gpus: i64) {
        self.nodes = self.nodes.saturating_add(nodes);
        self.gpus = self.gpus.saturating_add(gpus);
        if let Some(pi) = pool {
            self.pool_nodes[pi] = self.pool_nodes[pi].saturating_add(nodes);
            self.pool_gpus[pi] = self.pool_gpus[pi].saturating_add(gpus);
        }
    }
}

struct Packer<'a> {
    snapshot: &'a Snapshot,
    templates: &'a [Template],
    policy: &'a Policy,
    classes: Vec<Class>,
    gangs: Vec<Gang>,
    constraints: Vec<Arc<Constraints>>,
    bins: Vec<Bin>,
    /// `cclass * bins + bin`: 0 unknown, 1 admits, 2 does not (node bins only).
    bin_compat: Vec<u8>,
    bin_compat_width: usize,
    usage: Usage,
    new_nodes: Vec<NewNode>,
    placed: Vec<(usize, BinKind)>,
    available: Vec<u64>,
    /// Bins of each zone, by zone name.
    zone_bins: BTreeMap<String, Vec<usize>>,
    /// Devices of templates and nodes, and what pods' claims take (Dynamic Resource Allocation).
    devices: Devices,
    /// Spare nodes added to gangs' launches in this plan ([`Packer::spare_for_gang`]).
    spares: i64,
    /// Every zone of a template or a bin, sorted.
    zones: Vec<String>,
    /// Per zone of `zones`: each template's offerings in it.
    zone_masks: HashMap<String, Vec<u64>>,
    /// [`Packer::template_parts`] by (template, offerings, topology keys split by): classes
    /// alike in these share them.
    parts: HashMap<(usize, u64, Vec<String>), Rc<Vec<Part>>>,
    /// The pods placed so far per topology domain, when some pod has rules across nodes
    /// (host ports, pod affinity, spread); then `sites` holds each bin's labels and identity.
    topology: Option<TopologyIndex>,
    sites: Vec<(Arc<BTreeMap<String, String>>, String)>,
    /// Per template: its reserved offerings (offering index, slot of `Usage::reserved`); a
    /// reservation's count is a hard limit shared by every template that offers it.
    reserved_slots: Vec<Vec<(usize, usize)>>,
}

/// Hands out each launch's planned node lists ([`Snapshot::planned`]), one per node of the
/// launch, as pod indices of the pods still pending.
struct PlannedLists<'a> {
    snapshot: &'a Snapshot,
    /// Pending pods by name, made when a list is first handed out.
    index: Option<HashMap<String, usize>>,
    next: HashMap<&'a str, usize>,
}

impl<'a> PlannedLists<'a> {
    fn new(snapshot: &'a Snapshot) -> Self {
        PlannedLists {
            snapshot,
            index: None,
            next: HashMap::default(),
        }
    }

    fn next(&mut self, launch: &str) -> Vec<usize> {
        let Some((id, lists)) = self.snapshot.planned.get_key_value(launch) else {
            return Vec::new();
        };
        let i = self.next.entry(id.as_str()).or_default();
        let Some(list) = lists.get(*i) else {
            return Vec::new();
        };
        *i += 1;
        let pods = &self.snapshot.pods;
        let index = self.index.get_or_insert_with(|| {
            pods.iter()
                .enumerate()
                .filter(|(_, p)| is_planned_pod(p))
                .map(|(i, p)| (p.id.to_string(), i))
                .collect()
        });
        list.iter().filter_map(|k| index.get(k).copied()).collect()
    }
}

/// A node's GPUs: its template's (`template`, [`template_of_node`]), else what it reports.
fn gpu_count_of_node(n: &crate::model::Node, template: Option<&Template>) -> i64 {
    template
        .map(|t| t.gpus as i64)
        .unwrap_or_else(|| n.allocatable.whole_gpus() + n.shared_gpus.len() as i64)
}

fn dominant_share(c: &Class, t: &Template) -> f64 {
    let mut s = c.requests.largest_share_of(&t.allocatable);
    if let Some(d) = &c.devices {
        s = s.max(d.share_of(&t.allocatable));
    }
    if let Some(sh) = &c.share {
        let mem: i64 = t.shared.iter().map(|g| g.mem_gib).sum();
        let core: i64 = t.shared.iter().map(|g| g.core_pct).sum();
        if mem > 0 {
            s = s.max(sh.mem_gib as f64 / mem as f64);
        }
        if core > 0 {
            s = s.max(sh.core_pct as f64 / core as f64);
        }
    }
    s
}

impl<'a> Packer<'a> {
    fn new(
        snapshot: &'a Snapshot,
        templates: &'a [Template],
        policy: &'a Policy,
        now: Time,
        devices: Devices,
    ) -> Packer<'a> {
        let mut p = Packer {
            devices,
            snapshot,
            templates,
            policy,
            classes: Vec::new(),
            gangs: Vec::new(),
            constraints: Vec::new(),
            bins: Vec::new(),
            bin_compat: Vec::new(),
            bin_compat_width: 0,
            usage: Usage {
                pool_nodes: vec![0; policy.pools.len()],
                pool_gpus: vec![0; policy.pools.len()],
                nodes: 0,
                gpus: 0,
                reserved: Vec::new(),
            },
            new_nodes: Vec::new(),
            placed: Vec::new(),
            available: templates.iter().map(Template::available_mask).collect(),
            zone_bins: BTreeMap::new(),
            zones: Vec::new(),
            zone_masks: HashMap::default(),
            parts: HashMap::default(),
            spares: 0,
            topology: None,
            sites: Vec::new(),
            reserved_slots: vec![Vec::new(); templates.len()],
        };
        let counts = super::templates::reserved_counts(policy, snapshot, now);
        if !counts.is_empty() {
            let slot: BTreeMap<_, usize> = counts.keys().enumerate().map(|(i, k)| (k, i)).collect();
            for (ti, t) in templates.iter().enumerate() {
                for (oi, o) in t.offerings.iter().enumerate() {
                    if let Some(&s) = slot.get(&o.key) {
                        p.reserved_slots[ti].push((oi, s));
                    }
                }
            }
            p.usage.reserved = counts.values().copied().collect();
        }
        p.build_bins(now);
        // Only when some pod has rules across nodes.
        if snapshot
            .pods
            .iter()
            .any(|p| p.constraints.topology.is_some())
        {
            p.topology = topology::index_of(
                &snapshot.pods,
                &snapshot.nodes,
                templates
                    .iter()
                    .flat_map(|t| {
                        let taints: Arc<[crate::model::Taint]> = t.taints.as_slice().into();
                        t.offerings
                            .iter()
                            .filter(|o| o.available)
                            .map(move |o| (o.labels.clone(), taints.clone()))
                    })
                    .collect(),
                &snapshot.attach_limits,
            );
        }
        if p.topology.is_some() {
            p.sites = (0..p.bins.len()).map(|b| p.site_of(b)).collect();
        }
        for b in 0..p.bins.len() {
            p.bins[b].update_full();
            p.index_bin(b);
        }
        let mut zones: BTreeSet<&str> = p.zone_bins.keys().map(String::as_str).collect();
        for t in templates {
            zones.extend(t.offerings.iter().map(|o| o.key.zone.as_str()));
        }
        // Per zone, each template's offerings in it ([`Template::zone_mask`]), in one walk of
        // the offerings.
        let mut masks: BTreeMap<&str, Vec<u64>> = zones
            .iter()
            .map(|&z| (z, vec![0u64; templates.len()]))
            .collect();
        for (ti, t) in templates.iter().enumerate() {
            for (oi, o) in t.offerings.iter().enumerate() {
                if let Some(m) = masks.get_mut(o.key.zone.as_str()) {
                    m[ti] |= 1u64 << oi;
                }
            }
        }
        p.zone_masks = masks.into_iter().map(|(z, m)| (z.to_string(), m)).collect();
        p.zones = zones.into_iter().map(str::to_string).collect();
        p.build_classes(now);
        p
    }

    fn pool_index(&self, name: &str) -> Option<usize> {
        self.policy.pools.iter().position(|p| p.name == name)
    }

    fn build_bins(&mut self, now: Time) {
        let snap = self.snapshot;
        // Per node: the sum of bound pods' requests, and their shares by pod index.
        type Load = (Resources, Vec<(usize, GpuShare)>);
        let mut used: HashMap<&str, Load> = HashMap::default();
        for (i, p) in snap.pods.iter().enumerate() {
            if let (true, Some(n)) = (p.is_bound_active(), &p.node_name) {
                let e = used.entry(n.as_str()).or_default();
                e.0.add(&p.requests);
                if let Some(s) = p.share {
                    e.1.push((i, s));
                }
            }
        }
        let mut planned = PlannedLists::new(snap);
        let mut ready = Vec::new();
        let mut booting = Vec::new();
        for (ni, n) in snap.nodes.iter().enumerate() {
            let tmpl = template_of_node(n, self.templates);
            if !n.deleting {
                let g = gpu_count_of_node(n, tmpl.map(|t| &self.templates[t]));
                let pool = n.pool().and_then(|p| self.pool_index(p));
                self.usage.add(pool, 1, g);
            }
            if n.unschedulable || n.is_being_deleted() {
                continue;
            }
            // A node still joining or whose device plugin has not advertised its GPUs yet counts
            // at its template's capacity: it is coming, do not scale up for it again.
            let young = now.since(n.created) < self.policy.max_node_provision_time;
            // A node of a DRA pool has its GPUs once its ResourceSlices are published.
            let published = self.devices.node_devices.get(&ni);
            let gpus_missing = tmpl.is_some_and(|t| {
                self.templates[t].gpus > 0 && n.advertised_gpus() == 0 && published.is_none()
            });
            let (mut free, mut shared, is_booting) = if n.ready && !gpus_missing {
                let mut free = n.allocatable.clone();
                if let Some(d) = published {
                    free.add(d);
                }
                (free, n.shared_gpus.clone(), false)
            } else if let (Some(t), true) = (tmpl, young) {
                let t = &self.templates[t];
                (t.allocatable.clone(), t.shared.clone(), true)
            } else {
                continue;
            };
            if let Some((r, shares)) = used.get(n.name.as_str()) {
                free.sub(r);
                for (pi, s) in shares {
                    let idx = snap.pods[*pi].shared_gpu_index;
                    match idx.filter(|&i| i < shared.len()) {
                        Some(i) => {
                            shared[i].mem_gib -= s.mem_gib;
                            shared[i].core_pct -= s.core_pct;
                        }
                        None => {
                            place_share(&mut shared, s);
                        }
                    }
                }
            }
            let bin = Bin {
                free,
                shared,
                zone: n.zone().map(str::to_string),
                kind: BinKind::Node(ni),
                template: usize::MAX,
                mask: 0,
                full: false,
                starting: is_booting,
                joining: young,
                reserved: if is_booting {
                    n.labels
                        .get(crate::model::labels::LAUNCH_ID)
                        .map(|l| planned.next(l))
                        .unwrap_or_default()
                } else {
                    Vec::new()
                },
            };
            if is_booting {
                booting.push(bin);
            } else {
                ready.push(bin);
            }
        }
        let mut inflight = Vec::new();
        for (fi, f) in snap.in_flight.iter().enumerate() {
            let Some(pi) = self.pool_index(&f.pool) else {
                continue;
            };
            // The cloud lists it: it counts against the limits until it is gone.
            let ti = self.count_listed(pi, f);
            // Not registered within the max node provision time: given up, not capacity.
            if now.since(f.launched_at) >= self.policy.max_node_provision_time {
                continue;
            }
            let Some(ti) = ti else {
                continue;
            };
            let t = &self.templates[ti];
            let Some(oi) = t.offerings.iter().position(|o| o.key == f.offering) else {
                continue;
            };
            for _ in 0..f.count {
                inflight.push(Bin {
                    free: t.allocatable.clone(),
                    shared: t.shared.clone(),
                    zone: Some(f.offering.zone.clone()),
                    kind: BinKind::InFlight(fi),
                    template: ti,
                    mask: 1 << oi,
                    full: false,
                    starting: false,
                    joining: false,
                    reserved: planned.next(&f.launch_id),
                });
            }
        }
        // Given up and not terminated yet (or its termination failed): no capacity, but still
        // the pool's until the cloud no longer lists it.
        for f in &snap.held {
            if let Some(pi) = self.pool_index(&f.pool) {
                self.count_listed(pi, f);
            }
        }
        self.bins = ready;
        self.bins.extend(booting);
        self.bins.extend(inflight);
    }

    /// Counts instances the cloud lists without a Node against the limits of pool `pi` and of
    /// the cluster (their GPUs from the pool's template of their type). Returns that template.
    fn count_listed(&mut self, pi: usize, f: &InFlight) -> Option<usize> {
        let ti = self
            .templates
            .iter()
            .position(|t| t.pool == pi && t.instance_type == f.offering.instance_type);
        let n = i64::from(f.count);
        let g = ti.map_or(0, |ti| (self.templates[ti].gpus as i64).saturating_mul(n));
        self.usage.add(Some(pi), n, g);
        ti
    }

    fn build_classes(&mut self, now: Time) {
        let snap = self.snapshot;
        // Per pod: the pools in which it still waits for spot, and until when.
        let spot_wait = |pod: &Pod| -> (u64, Option<Time>) {
            let mut mask = 0u64;
            let mut until: Option<Time> = None;
            for (i, pool) in self.policy.pools.iter().enumerate().take(64) {
                if pool.spot_max_wait.is_zero() {
                    continue;
                }
                let at = pod.created + pool.spot_max_wait;
                if now < at {
                    mask |= 1 << i;
                    until = Some(until.map_or(at, |u: Time| u.min(at)));
                }
            }
            (mask, until)
        };
        let mut cclass_of: HashMap<*const Constraints, usize> = HashMap::default();
        let mut by_value: HashMap<Arc<Constraints>, usize> = HashMap::default();
        let mut pending: Vec<usize> = snap
            .pods
            .iter()
            .enumerate()
            .filter(|(i, p)| {
                is_planned_pod(p)
                    && p.problem.is_none()
                    && p.waiting.is_none()
                    && !matches!(self.devices.demands.get(i), Some(Err(_)))
            })
            .map(|(i, _)| i)
            .collect();
        pending.sort_by(|&a, &b| {
            let (pa, pb) = (&snap.pods[a], &snap.pods[b]);
            pb.priority
                .cmp(&pa.priority)
                .then(pa.created.cmp(&pb.created))
                .then(pa.id.cmp(&pb.id))
        });
        // Gangs: all members (pending or running) count towards the minimum size.
        let mut gang_index: BTreeMap<&str, usize> = BTreeMap::new();
        let mut gang_members: Vec<(u32, u32, Option<u32>, Option<String>)> = Vec::new();
        for p in &snap.pods {
            let Some(g) = &p.gang else { continue };
            if p.phase.is_terminal() || p.deleting {
                continue;
            }
            let gi = *gang_index.entry(g.key.as_str()).or_insert_with(|| {
                gang_members.push((0, 0, None, None));
                gang_members.len() - 1
            });
            let e = &mut gang_members[gi];
            if p.is_pending() {
                e.0 += 1;
            } else {
                e.1 += 1;
                if let Some(z) = p
                    .node_name
                    .as_ref()
                    .and_then(|n| snap.nodes.iter().find(|x| &x.name == n))
                    .and_then(|n| n.zone())
                {
                    e.3.get_or_insert_with(|| z.to_string());
                }
            }
            if let Some(m) = g.min_member {
                e.2 = Some(e.2.map_or(m, |x: u32| x.max(m)));
            }
        }
        let mut gang_of_key: BTreeMap<String, usize> = BTreeMap::new();
        // Identical pods: requests, share, constraint class, gang, priority, pools they wait
        // for spot in.
        type ClassKey = (
            Resources,
            Option<GpuShare>,
            usize,
            Option<usize>,
            i32,
            u64,
            *const DeviceDemand,
            (Vec<usize>, Vec<usize>, Vec<usize>),
            Option<Duration>,
        );
        let mut class_of: HashMap<ClassKey, usize> = HashMap::default();
        for &pi in &pending {
            let pod: &Pod = &snap.pods[pi];
            let cc = *cclass_of
                .entry(Arc::as_ptr(&pod.constraints))
                .or_insert_with(|| {
                    let n = by_value.len();
                    *by_value.entry(pod.constraints.clone()).or_insert(n)
                });
            if cc == self.constraints.len() {
                self.constraints.push(pod.constraints.clone());
            }
            let gang = pod.gang.as_ref().map(|g| {
                *gang_of_key.entry(g.key.clone()).or_insert_with(|| {
                    let (pending, running, min, zone) = gang_members[gang_index[g.key.as_str()]].clone();
                    let incomplete = min.filter(|&m| pending + running < m).map(|m| {
                        format!(
                            "gang {} is incomplete: {} of its {} members exist, waiting for the rest",
                            g.key,
                            pending + running,
                            m
                        )
                    });
                    self.gangs.push(Gang {
                        key: g.key.clone(),
                        classes: Vec::new(),
                        zone,
                        incomplete,
                        priority: pod.priority,
                        gpu_eq: 0.0,
                        failed: None,
                    });
                    self.gangs.len() - 1
                })
            });
            let (spot_only, spot_until) = spot_wait(pod);
            let run_time = pod.expected_run_time().ok().flatten();
            let demand = match self.devices.demands.get(&pi) {
                Some(Ok(d)) => Some(d.clone()),
                _ => None,
            };
            let gpu_eq = pod.gpu_equivalents() + demand.as_ref().map_or(0.0, |d| d.devices);
            // Pods that rules across nodes tell apart are apart.
            let selected = self
                .topology
                .as_ref()
                .map(|t| t.selected(pod))
                .unwrap_or_default();
            let key = (
                pod.requests.clone(),
                pod.share,
                cc,
                gang,
                pod.priority,
                spot_only,
                demand.as_ref().map_or(std::ptr::null(), Arc::as_ptr),
                selected,
                run_time,
            );
            let ci = *class_of.entry(key).or_insert_with(|| {
                self.classes.push(Class {
                    requests: pod.requests.clone(),
                    share: pod.share,
                    cclass: cc,
                    pods: Vec::new(),
                    next: 0,
                    gang,
                    priority: pod.priority,
                    gpu_eq,
                    tmask: Vec::new(),
                    value: 0.0,
                    spot_only,
                    spot_until,
                    devices: demand,
                    profile: self
                        .topology
                        .as_ref()
                        .map(|t| t.profile(pod))
                        .filter(|p| !p.is_free())
                        .map(Arc::new),
                    refused: None,
                    run_time,
                });
                if let Some(g) = gang {
                    self.gangs[g].classes.push(self.classes.len() - 1);
                }
                self.classes.len() - 1
            });
            self.classes[ci].pods.push(pi);
            if let Some(g) = gang {
                self.gangs[g].gpu_eq += gpu_eq;
                self.gangs[g].priority = self.gangs[g].priority.max(pod.priority);
            }
        }
        // Static compatibility and value.
        let templates = self.templates;
        let offerings_where = |keep: &dyn Fn(&super::templates::TemplateOffering) -> bool| {
            templates
                .iter()
                .map(|t| {
                    t.offerings
                        .iter()
                        .enumerate()
                        .filter(|(_, o)| keep(o))
                        .fold(0u64, |m, (i, _)| m | (1 << i))
                })
                .collect::<Vec<u64>>()
        };
        let spot = offerings_where(&|o| o.key.capacity_type == CapacityType::Spot);
        // Per constraint class, each template's offerings whose labels it admits (classes of
        // one constraint class share them).
        let mut by_labels: Vec<Option<Vec<u64>>> = vec![None; self.constraints.len()];
        for c in &mut self.classes {
            let cons = &self.constraints[c.cclass];
            let labelled = by_labels[c.cclass]
                .get_or_insert_with(|| offerings_where(&|o| cons.matches_node(&o.labels, None)));
            c.tmask = templates
                .iter()
                .enumerate()
                .map(|(ti, t)| {
                    let fits = c.requests.fits_in(&t.allocatable)
                        && c.share.is_none_or(|s| share_copies(&t.shared, &s) > 0)
                        && c.devices
                            .as_ref()
                            .is_none_or(|d| d.copies(&t.allocatable, 1) > 0);
                    if !fits || !cons.tolerates(&t.taints) {
                        return 0;
                    }
                    let spot_only = t.pool < 64 && c.spot_only & (1 << t.pool) != 0;
                    labelled[ti] & if spot_only { spot[ti] } else { u64::MAX }
                })
                .collect();
            // Capacity Blocks that end before the class's pods would are no offering for it,
            // unless it has no other.
            let outlives: Vec<u64> = self
                .templates
                .iter()
                .map(|t| {
                    let pool = &self.policy.pools[t.pool];
                    let Some(run) = c.run_time.or(pool.expected_run_time) else {
                        return 0;
                    };
                    let done = (now + run).0;
                    t.offerings
                        .iter()
                        .enumerate()
                        .filter(|(_, o)| o.key.capacity_type == CapacityType::Reserved)
                        .filter(|(_, o)| {
                            super::templates::reserved_until(
                                pool,
                                &self.snapshot.reservations,
                                &o.key,
                                now,
                            )
                            .is_some_and(|end| end < done)
                        })
                        .fold(0u64, |m, (i, _)| m | (1 << i))
                })
                .collect();
            let other = c
                .tmask
                .iter()
                .zip(&outlives)
                .zip(&self.available)
                .any(|((m, o), a)| m & !o & a != 0);
            if other {
                for (m, o) in c.tmask.iter_mut().zip(&outlives) {
                    *m &= !o;
                }
            }
            // Valued at what it costs bought (reserved capacity is free, but runs out): at
            // reserved offerings only where the class can have nothing else.
            let mut best = f64::INFINITY;
            for market in [true, false] {
                for (ti, t) in self.templates.iter().enumerate() {
                    let mut m = c.tmask[ti] & self.available[ti];
                    if market {
                        m &= !t.reserved_mask();
                    }
                    if m != 0 {
                        best = best.min(t.price(m) * dominant_share(c, t));
                    }
                }
                if best.is_finite() {
                    break;
                }
            }
            // A free offering (price 0) still needs a positive value to be packed.
            c.value = if best.is_finite() {
                best.max(1e-9)
            } else {
                0.0
            };
        }
        self.bin_compat_width = self.bins.len();
        self.bin_compat = vec![0; self.constraints.len() * self.bins.len()];
    }

    fn room(&self, usage: &Usage, t: usize) -> i64 {
        let t = &self.templates[t];
        let pool = &self.policy.pools[t.pool];
        let g = t.gpus as i64;
        let left = |max: u32, used: i64| i64::from(max).saturating_sub(used);
        let mut r = left(pool.max_nodes, usage.pool_nodes[t.pool]);
        if let (Some(mg), true) = (pool.max_gpus, g > 0) {
            r = r.min(left(mg, usage.pool_gpus[t.pool]) / g);
        }
        if let Some(mn) = self.policy.limits.max_nodes {
            r = r.min(left(mn, usage.nodes));
        }
        if let (Some(mg), true) = (self.policy.limits.max_gpus, g > 0) {
            r = r.min(left(mg, usage.gpus) / g);
        }
        r.max(0)
    }

    /// Reserved offerings of template `t` whose reservations are used up.
    fn exhausted(&self, usage: &Usage, t: usize) -> u64 {
        self.reserved_slots[t]
            .iter()
            .filter(|&&(_, s)| usage.reserved[s] <= 0)
            .fold(0, |m, &(oi, _)| m | (1u64 << oi))
    }

    /// Offerings of template `t` a new node may be opened with: available, and reservations not
    /// used up.
    fn openable(&self, usage: &Usage, t: usize) -> u64 {
        self.available[t] & !self.exhausted(usage, t)
    }

    /// `n` nodes of template `t` opened with `mask`: when its preferred offering is a
    /// reservation, as many as it still holds (at least one), taken from its count.
    fn take_reserved(&self, usage: &mut Usage, t: usize, mask: u64, n: i64) -> i64 {
        let first = (mask & self.available[t]).trailing_zeros() as usize;
        match self.reserved_slots[t].iter().find(|&&(oi, _)| oi == first) {
            Some(&(_, s)) => {
                let k = n.min(usage.reserved[s]).max(1);
                usage.reserved[s] -= k;
                k
            }
            None => n,
        }
    }

    fn add_usage(&self, usage: &mut Usage, t: usize, n: i64) {
        let t = &self.templates[t];
        usage.add(Some(t.pool), n, (t.gpus as i64).saturating_mul(n));
    }

    fn compat(&mut self, c: usize, b: usize) -> bool {
        let bin = &self.bins[b];
        match bin.kind {
            BinKind::Node(ni) => {
                let cc = self.classes[c].cclass;
                let idx = cc * self.bin_compat_width + b;
                if self.bin_compat[idx] == 0 {
                    let n = &self.snapshot.nodes[ni];
                    let ok = if bin.joining {
                        // What a starting node loses once it is Ready is no reason to launch
                        // another for the pod.
                        self.constraints[cc].admits(&n.labels, &n.lasting_taints(), Some(&n.name))
                    } else {
                        self.constraints[cc].admits(&n.labels, &n.taints, Some(&n.name))
                    };
                    self.bin_compat[idx] = if ok { 1 } else { 2 };
                }
                self.bin_compat[idx] == 1
            }
            BinKind::InFlight(_) | BinKind::New(_) => {
                self.classes[c].tmask[bin.template] & bin.mask != 0
            }
        }
    }

    /// First-fit of up to `want` pods of class `c` onto bins (optionally only in `zone`), on the
    /// real bins. Returns how many were placed.
    fn place_on_bins(&mut self, c: usize, want: i64, zone: Option<&str>) -> i64 {
        if self.classes[c]
            .profile
            .as_ref()
            .is_some_and(|p| p.has_preferences())
        {
            return self.place_preferred(c, want, zone);
        }
        let mut left = want;
        match zone {
            // Every bin, in order, without listing them first: only bin `b` changes when pods
            // go onto it, so a bin skipped as full here is one the list would have left out.
            None => {
                for b in 0..self.bins.len() {
                    if left == 0 {
                        break;
                    }
                    if !self.bins[b].full {
                        left -= self.place_on_bin(c, b, left);
                    }
                }
            }
            Some(z) => {
                for b in self.zone_bin_list(z) {
                    if left == 0 {
                        break;
                    }
                    left -= self.place_on_bin(c, b, left);
                }
            }
        }
        want - left
    }

    /// [`Packer::place_on_bins`] for a class with preferences: one pod at a time, onto the bin
    /// kube-scheduler's preference scores rank first among those that admit it (the first of
    /// them on a tie, as first-fit would). The preferences only choose between bins the pod
    /// may use: they never keep it off one.
    fn place_preferred(&mut self, c: usize, want: i64, zone: Option<&str>) -> i64 {
        let Some(prof) = self.classes[c].profile.clone() else {
            return 0;
        };
        let mut placed = 0;
        while placed < want {
            let mut fit: Vec<usize> = Vec::new();
            let bins: Vec<usize> = match zone {
                None => (0..self.bins.len())
                    .filter(|&b| !self.bins[b].full)
                    .collect(),
                Some(z) => self.zone_bin_list(z),
            };
            for b in bins {
                if !self.compat(c, b) {
                    continue;
                }
                let bin = &self.bins[b];
                if self.classes[c].copies(&bin.free, &bin.shared) <= 0 {
                    continue;
                }
                let (labels, node) = &self.sites[b];
                let site = Site { labels, node };
                match self.topology.as_ref().map(|t| t.admits(&prof, &site)) {
                    Some(Err(r)) => self.classes[c].refused = Some(r),
                    _ => fit.push(b),
                }
            }
            let Some(topo) = self.topology.as_ref() else {
                break;
            };
            let sites: Vec<Site> = fit
                .iter()
                .map(|&b| Site {
                    labels: &self.sites[b].0,
                    node: &self.sites[b].1,
                })
                .collect();
            let scores = topo.preference_scores(&prof, &sites);
            let best = (0..fit.len()).fold(None::<usize>, |best, i| match best {
                Some(j) if scores[j] >= scores[i] => Some(j),
                _ => Some(i),
            });
            let Some(i) = best else { break };
            if self.place_on_bin(c, fit[i], 1) == 0 {
                break;
            }
            placed += 1;
        }
        placed
    }

    /// Up to `want` pods of class `c` onto bin `b`. Returns how many were placed.
    fn place_on_bin(&mut self, c: usize, b: usize, want: i64) -> i64 {
        if !self.compat(c, b) {
            return 0;
        }
        let bin = &self.bins[b];
        let mut k = self.classes[c].copies(&bin.free, &bin.shared).min(want);
        if k <= 0 {
            return 0;
        }
        if let (Some(prof), Some(topo)) = (self.classes[c].profile.clone(), &mut self.topology) {
            let (labels, node) = &self.sites[b];
            let site = Site { labels, node };
            let mut n = 0;
            while n < k {
                if let Err(r) = topo.admits(&prof, &site) {
                    self.classes[c].refused = Some(r);
                    break;
                }
                topo.add(&prof, &site);
                n += 1;
            }
            k = n;
            if k == 0 {
                return 0;
            }
        }
        let bin = &mut self.bins[b];
        self.classes[c].apply(&mut bin.free, &mut bin.shared, k);
        bin.update_full();
        if matches!(bin.kind, BinKind::New(_)) {
            bin.mask &= self.classes[c].tmask[bin.template];
        }
        let kind = bin.kind;
        for _ in 0..k {
            let cl = &mut self.classes[c];
            let pod = cl.pods[cl.next];
            cl.next += 1;
            match kind {
                BinKind::New(n) => {
                    self.new_nodes[n].pods.push(pod);
                    self.new_nodes[n].mask = self.bins[b].mask;
                }
                _ => self.placed.push((pod, kind)),
            }
        }
        k
    }

    /// Pods of priority `priority` that a launch still on its way was for go back onto its
    /// nodes, before other pods of that priority are placed (pods of a higher priority have
    /// been: they may take the capacity). Packed again from scratch, first-fit onto the launched
    /// nodes, the same pods need not fit them (the packing that chose those nodes is not
    /// first-fit), and the plan would launch again for the rest. Gangs' pods are left to the
    /// gang's own all-or-nothing placement.
    fn place_reserved(&mut self, priority: i32, class_of: &HashMap<usize, usize>) {
        for b in 0..self.bins.len() {
            if self.bins[b].reserved.is_empty() {
                continue;
            }
            let mut want: BTreeMap<usize, i64> = BTreeMap::new();
            for p in &self.bins[b].reserved {
                if let Some(&c) = class_of.get(p) {
                    if self.classes[c].priority == priority {
                        *want.entry(c).or_default() += 1;
                    }
                }
            }
            for (c, k) in want {
                let k = k.min(self.classes[c].remaining());
                if k > 0 {
                    self.place_on_bin(c, b, k);
                }
            }
        }
    }

    /// Pending pods nominated to a registered node (`status.nominatedNodeName`, set by the
    /// controller for the node launched for them): (class, pod, bin).
    fn nominated(&self) -> Vec<(usize, usize, usize)> {
        let snap = self.snapshot;
        if !snap.pods.iter().any(|p| p.nominated_node.is_some()) {
            return Vec::new();
        }
        let bins: HashMap<&str, usize> = (0..self.bins.len())
            .filter_map(|b| match self.bins[b].kind {
                BinKind::Node(n) => Some((snap.nodes[n].name.as_str(), b)),
                _ => None,
            })
            .collect();
        let mut out = Vec::new();
        for (c, cl) in self.classes.iter().enumerate() {
            for &p in &cl.pods {
                let node = snap.pods[p].nominated_node.as_deref();
                if let Some(&b) = node.and_then(|n| bins.get(n)) {
                    out.push((c, p, b));
                }
            }
        }
        out
    }

    /// Pods of priority `priority` nominated to a registered node go onto it before any other
    /// pod of that priority is placed: kube-scheduler tries a pod's nominated node first, and
    /// while it places other pods of no higher priority it counts the nominated pod there. A
    /// gang's member goes there only in the zone the gang is placed in (the first member placed
    /// so sets it); the rest of the gang is placed with the gang.
    fn place_nominated(&mut self, priority: i32, nominated: &[(usize, usize, usize)]) {
        for &(c, pod, b) in nominated {
            if self.classes[c].priority != priority {
                continue;
            }
            if let Some(g) = self.classes[c].gang {
                let zone = self.bins[b].zone.clone();
                match (&self.gangs[g].zone, &zone) {
                    (Some(gz), Some(z)) if gz != z => continue,
                    (Some(_), None) => continue,
                    _ => {}
                }
                if !self.place_pod(c, pod, b) {
                    continue;
                }
                if self.gangs[g].zone.is_none() {
                    self.gangs[g].zone = zone;
                }
            } else {
                self.place_pod(c, pod, b);
            }
        }
    }

    /// Places pod `pod` of class `c` (not placed yet) on bin `b`, if it fits there.
    fn place_pod(&mut self, c: usize, pod: usize, b: usize) -> bool {
        let cl = &mut self.classes[c];
        let next = cl.next;
        let Some(j) = cl.pods[next..].iter().position(|&x| x == pod) else {
            return false;
        };
        cl.pods.swap(next, next + j);
        self.place_on_bin(c, b, 1) == 1
    }

    /// Single pods of priority `priority` go first-fit onto registered nodes (Ready ones, then
    /// those still starting, the earliest created first) before the gangs of that priority. The
    /// scheduler binds a single pod to the first node that has room for it, while a gang waits
    /// until all its members fit: a pod waiting for a launch not registered yet takes the first
    /// node of a gang's launch to advertise its GPUs, not its own. Planned so, the gang's missing
    /// node is launched as soon as its first node registers, not after the pod took it. The room
    /// of pods nominated to a node is taken before ([`Packer::place_nominated`]).
    fn place_singles_before_gangs(&mut self, priority: i32) {
        if !self
            .gangs
            .iter()
            .any(|g| g.priority == priority && g.incomplete.is_none())
        {
            return;
        }
        let snap = self.snapshot;
        let mut nodes: Vec<usize> = (0..self.bins.len())
            .filter(|&b| matches!(self.bins[b].kind, BinKind::Node(_)))
            .collect();
        // Ready nodes first (as built), then starting ones by creation.
        nodes.sort_by_key(|&b| match self.bins[b].kind {
            BinKind::Node(n) if self.bins[b].starting => (1, snap.nodes[n].created),
            _ => (0, Time(0)),
        });
        for c in 0..self.classes.len() {
            let cl = &self.classes[c];
            if cl.gang.is_some() || cl.priority != priority {
                continue;
            }
            let mut left = cl.remaining();
            for &b in &nodes {
                if left == 0 {
                    break;
                }
                if !self.bins[b].full {
                    left -= self.place_on_bin(c, b, left);
                }
            }
        }
    }

    /// Class of each pending pod not in a gang, when some bin has reserved pods.
    fn reserved_classes(&self) -> HashMap<usize, usize> {
        let mut class_of = HashMap::default();
        if self.bins.iter().all(|b| b.reserved.is_empty()) {
            return class_of;
        }
        for (c, cl) in self.classes.iter().enumerate() {
            if cl.gang.is_none() {
                class_of.extend(cl.pods.iter().map(|&p| (p, c)));
            }
        }
        class_of
    }

    /// Takes off `items` what would fit on the bins of `zone`, without changing the bins.
    fn trial_on_bins(&mut self, items: &mut [(usize, i64)], zone: &str) {
        let list = self.zone_bin_list(zone);
        // Scratch copies of the bins touched, with the offering mask narrowed as the real
        // placement (`place_on_bins`) narrows it, so that trial and commit agree.
        let mut scratch: HashMap<usize, (Resources, Vec<SharedGpu>, u64)> = HashMap::default();
        for it in items.iter_mut() {
            let c = it.0;
            for &b in &list {
                if it.1 == 0 {
                    break;
                }
                if !self.compat(c, b) {
                    continue;
                }
                let bin = &self.bins[b];
                let (free, shared, mask) = scratch
                    .entry(b)
                    .or_insert_with(|| (bin.free.clone(), bin.shared.clone(), bin.mask));
                let narrowed = match bin.kind {
                    BinKind::New(_) => {
                        let m = *mask & self.classes[c].tmask[bin.template];
                        if m == 0 {
                            continue;
                        }
                        m
                    }
                    _ => *mask,
                };
                let k = self.classes[c].copies(free, shared).min(it.1);
                if k > 0 {
                    self.classes[c].apply(free, shared, k);
                    *mask = narrowed;
                    it.1 -= k;
                }
            }
        }
    }

    /// Top pool priority, per item, among templates that could take it now.
    fn top_priorities(
        &self,
        items: &[(usize, i64)],
        usage: &Usage,
        zone_masks: &[u64],
    ) -> Vec<i32> {
        // Per template: the offerings a node may be opened with now, none without room.
        let open: Vec<u64> = (0..self.templates.len())
            .map(|t| {
                if self.room(usage, t) > 0 {
                    self.openable(usage, t) & zone_masks[t]
                } else {
                    0
                }
            })
            .collect();
        items
            .iter()
            .map(|&(c, _)| {
                let cl = &self.classes[c];
                self.templates
                    .iter()
                    .zip(&cl.tmask)
                    .zip(&open)
                    .filter(|((_, m), o)| *m & *o != 0)
                    .map(|((t, _), _)| t.priority)
                    .max()
                    .unwrap_or(i32::MIN)
            })
            .collect()
    }

    /// Greedy opening of new nodes for `items` (class, remaining), decremented in place.
    fn open_new(
        &self,
        items: &mut [(usize, i64)],
        zone: Option<&str>,
        caps: &NodeCaps,
        usage: &mut Usage,
    ) -> Vec<Opened> {
        let zone_masks: std::borrow::Cow<[u64]> = match zone {
            None => vec![u64::MAX; self.templates.len()].into(),
            Some(z) => match self.zone_masks.get(z) {
                Some(m) => m.as_slice().into(),
                None => self
                    .templates
                    .iter()
                    .map(|t| t.zone_mask(z))
                    .collect::<Vec<_>>()
                    .into(),
            },
        };
        let mut out = Vec::new();
        loop {
            if items.iter().all(|(_, r)| *r == 0) {
                break;
            }
            let prio = self.top_priorities(items, usage, &zone_masks);
            let mut best: Option<(f64, f64, usize, Opened)> = None;
            for (ti, t) in self.templates.iter().enumerate() {
                let base = self.openable(usage, ti) & zone_masks[ti];
                if base == 0 || self.room(usage, ti) == 0 {
                    continue;
                }
                // Templates no waiting class can use (e.g. a DRA pool's for pods without
                // claims) are passed over before their resources are copied.
                let usable = items.iter().enumerate().any(|(i, &(c, rem))| {
                    rem > 0 && prio[i] == t.priority && base & self.classes[c].tmask[ti] != 0
                });
                if !usable {
                    continue;
                }
                let mut free = t.allocatable.clone();
                let mut shared = t.shared.clone();
                let mut mask = base;
                let mut takes = Vec::new();
                let mut value = 0.0;
                for (i, &(c, rem)) in items.iter().enumerate() {
                    if rem == 0 || prio[i] != t.priority {
                        continue;
                    }
                    let cl = &self.classes[c];
                    let m = mask & cl.tmask[ti];
                    if m == 0 {
                        continue;
                    }
                    let cap = caps.get(&(c, ti)).copied().unwrap_or(i64::MAX);
                    let k = cl.copies(&free, &shared).min(rem).min(cap);
                    if k <= 0 {
                        continue;
                    }
                    cl.apply(&mut free, &mut shared, k);
                    mask = m;
                    takes.push((i, k));
                    value += k as f64 * cl.value;
                }
                if takes.is_empty() || value <= 0.0 {
                    continue;
                }
                let ratio = t.price(mask) / value;
                let better = match &best {
                    None => true,
                    Some((br, bv, _, _)) => {
                        ratio < br * (1.0 - 1e-9) || (ratio <= br * (1.0 + 1e-9) && value > *bv)
                    }
                };
                if better {
                    best = Some((
                        ratio,
                        value,
                        ti,
                        Opened {
                            template: ti,
                            mask,
                            count: 1,
                            takes,
                            free,
                            shared,
                        },
                    ));
                }
            }
            let Some((_, _, ti, mut o)) = best else { break };
            let mut reps = self.room(usage, ti);
            for &(i, k) in &o.takes {
                reps = reps.min(items[i].1 / k);
            }
            let reps = self.take_reserved(usage, ti, o.mask, reps.max(1));
            for &(i, k) in &o.takes {
                items[i].1 -= k * reps;
            }
            self.add_usage(usage, ti, reps);
            o.count = reps;
            // Store class ids instead of item positions.
            o.takes = o.takes.iter().map(|&(i, k)| (items[i].0, k)).collect();
            out.push(o);
        }
        out
    }

    fn take_pods(&mut self, c: usize, k: i64) -> Vec<usize> {
        let cl = &mut self.classes[c];
        let end = cl.next + k as usize;
        let pods = cl.pods[cl.next..end].to_vec();
        cl.next = end;
        pods
    }

    fn commit_opened(&mut self, opened: Vec<Opened>, gang: Option<usize>, as_bins: bool) {
        for o in opened {
            for _ in 0..o.count {
                let mut pods = Vec::new();
                for &(c, k) in &o.takes {
                    pods.extend(self.take_pods(c, k));
                }
                let id = self.new_nodes.len();
                self.new_nodes.push(NewNode {
                    template: o.template,
                    mask: o.mask,
                    gang,
                    pods,
                });
                if as_bins {
                    let t = &self.templates[o.template];
                    let zone = t.offerings_in(o.mask).next().map(|x| x.key.zone.clone());
                    let b = self.push_bin(Bin {
                        free: o.free.clone(),
                        shared: o.shared.clone(),
                        zone,
                        kind: BinKind::New(id),
                        template: o.template,
                        mask: o.mask,
                        full: false,
                        starting: false,
                        joining: false,
                        reserved: Vec::new(),
                    });
                    // Rules across nodes count these pods where they go, as placed ones.
                    if let Some(topo) = self.topology.as_mut() {
                        let (labels, node) = &self.sites[b];
                        let site = Site { labels, node };
                        for &(c, k) in &o.takes {
                            if let Some(prof) = &self.classes[c].profile {
                                for _ in 0..k {
                                    topo.add(prof, &site);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Adds a bin (a node opened in this plan), its site and its zone.
    fn push_bin(&mut self, bin: Bin) -> usize {
        self.bins.push(bin);
        let b = self.bins.len() - 1;
        self.bins[b].update_full();
        self.index_bin(b);
        if self.topology.is_some() {
            let site = self.site_of(b);
            self.sites.push(site);
        }
        b
    }

    /// A bin's labels and identity for rules across nodes: a registered node's own; for a node
    /// on its way or opened in this plan, the labels of its preferred offering and a name of its
    /// own (its own hostname domain).
    fn site_of(&self, b: usize) -> (Arc<BTreeMap<String, String>>, String) {
        let bin = &self.bins[b];
        match bin.kind {
            BinKind::Node(n) => {
                let n = &self.snapshot.nodes[n];
                (n.labels.clone(), n.name.clone())
            }
            BinKind::InFlight(_) | BinKind::New(_) => {
                let labels = self.templates[bin.template]
                    .offerings_in(bin.mask)
                    .next()
                    .map(|o| o.labels.clone())
                    .unwrap_or_default();
                (labels, format!("\0bin/{b}"))
            }
        }
    }

    /// The offerings of `base` split by their values of the topology keys rules use (each
    /// part one zone, say), in preference order; one part when the pod is not bound to
    /// domains (host ports only).
    fn domain_parts(&self, t: &Template, base: u64, keys: &[String]) -> Vec<u64> {
        if keys.is_empty() {
            return vec![base];
        }
        let mut parts: Vec<(Vec<Option<&String>>, u64)> = Vec::new();
        for (i, o) in t.offerings.iter().enumerate() {
            if base & (1u64 << i) == 0 {
                continue;
            }
            let values: Vec<Option<&String>> = keys.iter().map(|k| o.labels.get(k)).collect();
            match parts.iter_mut().find(|(v, _)| *v == values) {
                Some((_, m)) => *m |= 1u64 << i,
                None => parts.push((values, 1u64 << i)),
            }
        }
        parts.into_iter().map(|(_, m)| m).collect()
    }

    /// [`Packer::domain_parts`] of template `ti`'s offerings `base`, each with its domains and
    /// the labels of its first offering; computed once per pass.
    fn template_parts(&mut self, ti: usize, base: u64, keys: &[String]) -> Rc<Vec<Part>> {
        let memo = (ti, base, keys.to_vec());
        if let Some(p) = self.parts.get(&memo) {
            return p.clone();
        }
        let t = &self.templates[ti];
        let out: Vec<Part> = self
            .domain_parts(t, base, keys)
            .into_iter()
            .map(|part| {
                let labels = t.offerings_in(part).next().map(|o| o.labels.clone());
                let labels = labels.unwrap_or_default();
                let domains: Vec<Option<String>> =
                    keys.iter().map(|k| labels.get(k).cloned()).collect();
                (part, domains, labels)
            })
            .collect();
        let out = Rc::new(out);
        self.parts.insert(memo, out.clone());
        out
    }

    /// New nodes for the pods of class `c` (not in a gang) that rules across nodes look at,
    /// one at a time, each in one domain of every topology key these rules use, so that each
    /// pod is placed knowing where the earlier ones went: the pods go first-fit onto the bins
    /// (registered, on their way and opened in this plan), then a node is opened of the
    /// template and domain where these rules admit the most pods for the lowest price (pools
    /// of a higher priority first). Its fallbacks stay in that domain (spot, then on-demand,
    /// in one zone).
    fn open_for_topology(&mut self, c: usize) {
        let Some(prof) = self.classes[c].profile.clone() else {
            return;
        };
        let bound = prof.is_bound_to_domains();
        // The bins are tried again after a node is opened only when what refused the pods there
        // may have changed (a spread's global minimum, the first pod an affinity counts): else
        // the new node is all there is to try.
        let floor = |p: &Self| p.topology.as_ref().map(|t| t.floor(&prof));
        // A pod bound to domains: the keys of every rule in use and of its own preferences.
        let keys: Vec<String> = match &self.topology {
            Some(topo) if bound => {
                let mut k: BTreeSet<String> = topo.keys().clone();
                k.extend(topo.preference_keys(&prof));
                k.into_iter().collect()
            }
            _ => Vec::new(),
        };
        // The templates the class may use, each split into parts of one domain; what a new
        // node admits depends on its domains only, so each domain is probed once a round.
        let mut domain_of: HashMap<Vec<Option<String>>, usize> = HashMap::default();
        let mut domain_labels: Vec<Arc<BTreeMap<String, String>>> = Vec::new();
        // (template, copies on an empty node, [(offerings of one domain, domain)])
        type Candidate = (usize, i64, Vec<(u64, usize)>);
        let mut candidates: Vec<Candidate> = Vec::new();
        let templates = self.templates;
        for (ti, t) in templates.iter().enumerate() {
            let base = self.classes[c].tmask[ti] & self.available[ti];
            let copies = self.classes[c].copies(&t.allocatable, &t.shared);
            // Reserved offerings used up are left out as each node is opened, below.
            if base == 0 || copies <= 0 {
                continue;
            }
            let mut parts = Vec::new();
            for (part, domains, labels) in self.template_parts(ti, base, &keys).iter() {
                let d = match domain_of.get(domains) {
                    Some(&d) => d,
                    None => {
                        domain_labels.push(labels.clone());
                        domain_of.insert(domains.clone(), domain_labels.len() - 1);
                        domain_labels.len() - 1
                    }
                };
                parts.push((*part, d));
            }
            candidates.push((ti, copies, parts));
        }
        let mut tried: Option<Option<Vec<i64>>> = None;
        while self.classes[c].remaining() > 0 {
            let want = self.classes[c].remaining();
            let now = floor(self);
            if tried.as_ref() != Some(&now) && self.place_on_bins(c, want, None) == want {
                return;
            }
            tried = Some(now);
            let want = self.classes[c].remaining();
            // Preferences break ties of price between domains: scored as kube-scheduler would
            // score a new node of each.
            let preferred: Vec<i64> = match &self.topology {
                Some(topo) if prof.has_preferences() => {
                    let sites: Vec<Site> = domain_labels
                        .iter()
                        .map(|labels| Site {
                            labels,
                            node: "\0probe",
                        })
                        .collect();
                    topo.preference_scores(&prof, &sites)
                }
                _ => vec![0; domain_labels.len()],
            };
            // (priority, price per pod, preference score, template, part)
            let mut best: Option<(i32, f64, i64, usize, u64)> = None;
            let mut blocked = None;
            let mut probes: Vec<Option<(i64, Option<Refusal>)>> = vec![None; domain_labels.len()];
            for (ti, copies, parts) in &candidates {
                let t = &self.templates[*ti];
                if best.is_some_and(|b| b.0 > t.priority) || self.room(&self.usage, *ti) == 0 {
                    continue;
                }
                let fit = (*copies).min(want);
                let exhausted = self.exhausted(&self.usage, *ti);
                for &(part, d) in parts {
                    let part = part & !exhausted;
                    if part == 0 {
                        continue;
                    }
                    let probed = match probes[d] {
                        Some(p) => p,
                        None => {
                            let labels = domain_labels[d].clone();
                            let p = self.admitted_on_new(&prof, &labels, want);
                            probes[d] = Some(p);
                            p
                        }
                    };
                    let (k, refusal) = (probed.0.min(fit), probed.1);
                    if k == 0 {
                        blocked = blocked.or(refusal);
                        continue;
                    }
                    let per_pod = t.price(part) / k as f64;
                    let better = match best {
                        None => true,
                        Some((p, b, score, _, _)) => {
                            t.priority > p
                                || per_pod < b * (1.0 - 1e-9)
                                || (per_pod <= b * (1.0 + 1e-9) && preferred[d] > score)
                        }
                    };
                    if better {
                        best = Some((t.priority, per_pod, preferred[d], *ti, part));
                    }
                }
            }
            let Some((_, _, _, ti, mask)) = best else {
                // The reason is these rules only when they, not limits, left no node.
                self.classes[c].refused = blocked;
                return;
            };
            let t = &self.templates[ti];
            let id = self.new_nodes.len();
            self.new_nodes.push(NewNode {
                template: ti,
                mask,
                gang: None,
                pods: Vec::new(),
            });
            let zone = t.offerings_in(mask).next().map(|o| o.key.zone.clone());
            let b = self.push_bin(Bin {
                free: t.allocatable.clone(),
                shared: t.shared.clone(),
                zone,
                kind: BinKind::New(id),
                template: ti,
                mask,
                full: false,
                starting: false,
                joining: false,
                reserved: Vec::new(),
            });
            let mut usage = self.usage.clone();
            self.add_usage(&mut usage, ti, 1);
            self.take_reserved(&mut usage, ti, mask, 1);
            self.usage = usage;
            if self.place_on_bin(c, b, want) == 0 {
                // Cannot happen (the node was chosen for admitting a pod): never loop on it.
                return;
            }
        }
    }

    /// How many of `up_to` pods of profile `prof` the rules across nodes admit on one new node
    /// with these labels, as things are now, and why not more.
    fn admitted_on_new(
        &mut self,
        prof: &Profile,
        labels: &BTreeMap<String, String>,
        up_to: i64,
    ) -> (i64, Option<Refusal>) {
        let Some(topo) = self.topology.as_mut() else {
            return (up_to, None);
        };
        let site = Site {
            labels,
            node: "\0probe",
        };
        let mut k = 0;
        let mut refusal = None;
        while k < up_to {
            if let Err(r) = topo.admits(prof, &site) {
                refusal = Some(r);
                break;
            }
            topo.add(prof, &site);
            k += 1;
        }
        for _ in 0..k {
            topo.remove(prof, &site);
        }
        (k, refusal)
    }

    /// For a gang's classes that rules across nodes look at: per (class, template), how many of
    /// its pods these rules admit on one new node of that template in `zone` (a hostname
    /// anti-affinity among the workers, a host port: one). Empty without such classes.
    fn new_node_caps(&mut self, classes: &[usize], zone: &str) -> NodeCaps {
        let mut caps = NodeCaps::default();
        if self.topology.is_none() {
            return caps;
        }
        for &c in classes {
            let Some(prof) = self.classes[c].profile.clone().filter(|p| p.has_rules()) else {
                continue;
            };
            let templates = self.templates;
            for (ti, t) in templates.iter().enumerate() {
                let base = self.classes[c].tmask[ti] & self.available[ti] & t.zone_mask(zone);
                let copies = self.classes[c].copies(&t.allocatable, &t.shared);
                let Some(o) = t.offerings_in(base).next() else {
                    continue;
                };
                if copies <= 0 {
                    continue;
                }
                let labels = o.labels.clone();
                let (k, refusal) = self.admitted_on_new(&prof, &labels, copies);
                if k == 0 {
                    self.classes[c].refused = self.classes[c].refused.or(refusal);
                }
                caps.insert((c, ti), k);
            }
        }
        caps
    }

    fn gang_zones(&self, g: &Gang) -> Vec<String> {
        match &g.zone {
            Some(z) => vec![z.clone()],
            None => self.zones.clone(),
        }
    }

    fn index_bin(&mut self, b: usize) {
        if let Some(z) = &self.bins[b].zone {
            self.zone_bins.entry(z.clone()).or_default().push(b);
        }
    }

    /// Bins of one zone to try, in order.
    fn zone_bin_list(&self, zone: &str) -> Vec<usize> {
        self.zone_bins
            .get(zone)
            .map(|l| l.iter().copied().filter(|&b| !self.bins[b].full).collect())
            .unwrap_or_default()
    }

    fn place_gang(&mut self, g: usize) {
        if self.gangs[g].incomplete.is_some() {
            return;
        }
        let classes = self.gangs[g].classes.clone();
        if classes
            .iter()
            .any(|&c| self.classes[c].tmask.iter().all(|m| *m == 0))
        {
            return; // a member can never fit: its own reason says why
        }
        let mut costs: Vec<(f64, String)> = Vec::new();
        for zone in self.gang_zones(&self.gangs[g]) {
            let mut items: Vec<(usize, i64)> = classes
                .iter()
                .map(|&c| (c, self.classes[c].remaining()))
                .collect();
            items.sort_by(|a, b| self.classes[b.0].value.total_cmp(&self.classes[a.0].value));
            self.trial_on_bins(&mut items, &zone);
            let caps = self.new_node_caps(&classes, &zone);
            let mut usage = self.usage.clone();
            let opened = self.open_new(&mut items, Some(&zone), &caps, &mut usage);
            if items.iter().any(|(_, r)| *r > 0) {
                continue;
            }
            let cost: f64 = opened
                .iter()
                .map(|o| self.templates[o.template].price(o.mask) * o.count as f64)
                .sum();
            costs.push((cost, zone));
        }
        // The cheapest zone (the first of equals), and what the next one would cost.
        let best = costs
            .iter()
            .enumerate()
            .fold(None::<usize>, |b, (i, c)| match b {
                Some(j) if costs[j].0 <= c.0 + 1e-9 => Some(j),
                _ => Some(i),
            });
        let Some((best_cost, zone)) = best.map(|i| costs[i].clone()) else {
            let members: i64 = classes.iter().map(|&c| self.classes[c].remaining()).sum();
            let rules = classes
                .iter()
                .find_map(|&c| self.classes[c].refused)
                .map(|r| format!(" (rules across nodes refuse a new node: {})", r.describe()))
                .unwrap_or_default();
            self.gangs[g].failed = Some(format!(
                "gang {} ({} pending pods, {:.2} GPUs) cannot get all its capacity in one zone: no zone has enough free or launchable capacity within pool and cluster limits{rules}",
                self.gangs[g].key, members, self.gangs[g].gpu_eq
            ));
            return;
        };
        // Commit: existing capacity first, then new nodes, exactly as in the trial.
        let mut items: Vec<(usize, i64)> = classes
            .iter()
            .map(|&c| (c, self.classes[c].remaining()))
            .collect();
        items.sort_by(|a, b| self.classes[b.0].value.total_cmp(&self.classes[a.0].value));
        for it in items.iter_mut() {
            it.1 -= self.place_on_bins(it.0, it.1, Some(&zone));
        }
        let caps = self.new_node_caps(&classes, &zone);
        let mut usage = self.usage.clone();
        let mut opened = self.open_new(&mut items, Some(&zone), &caps, &mut usage);
        self.usage = usage;
        // A gang's launch falls back within its zone only to offerings that keep it cheaper
        // than moving the whole gang to the next zone: when spot runs short here, the gang is
        // planned again in another zone's spot before it buys on-demand here.
        let next_zone = costs
            .iter()
            .filter(|(_, z)| *z != zone)
            .map(|(c, _)| *c)
            .min_by(f64::total_cmp);
        if let Some(next) = next_zone.filter(|_| best_cost > 0.0) {
            for o in &mut opened {
                let t = &self.templates[o.template];
                let cap = t.price(o.mask) * (next / best_cost) * (1.0 + 1e-9);
                o.mask = t
                    .offerings
                    .iter()
                    .enumerate()
                    .filter(|(i, x)| o.mask & (1u64 << i) != 0 && x.price <= cap)
                    .fold(0, |m, (i, _)| m | (1u64 << i));
            }
        }
        let spare = self.spare_for_gang(&opened);
        self.commit_opened(opened, Some(g), true);
        if let Some((template, mask)) = spare {
            self.new_nodes.push(NewNode {
                template,
                mask,
                gang: Some(g),
                pods: Vec::new(),
            });
            let mut usage = self.usage.clone();
            self.add_usage(&mut usage, template, 1);
            self.usage = usage;
            self.spares += 1;
        }
    }

    /// One node more for a gang whose nodes are launched while single pods wait for nodes not
    /// registered yet (launched in this plan or before) and would fit the gang's: the scheduler
    /// binds a single pod to the first node that has room for it, which is the gang's first node
    /// as often as not, and the gang waits for all its nodes. The node the gang does not need
    /// (the one the single left, or the spare) is scaled down once empty. Only for a launch
    /// planned on spot: an on-demand spare that later pods fill stays, at on-demand prices.
    fn spare_for_gang(&self, opened: &[Opened]) -> Option<(usize, u64)> {
        let o = opened.first()?;
        let preferred = self.templates[o.template]
            .offerings_in(o.mask & self.available[o.template])
            .next()?;
        if preferred.key.capacity_type != CapacityType::Spot
            || self.room(&self.usage, o.template) == 0
        {
            return None;
        }
        let on_new: BTreeSet<usize> = self
            .placed
            .iter()
            .filter(|(_, k)| !matches!(k, BinKind::Node(_)))
            .map(|(p, _)| *p)
            .collect();
        let singles: i64 = self
            .classes
            .iter()
            .filter(|c| c.gang.is_none() && c.tmask[o.template] & o.mask != 0)
            .map(|c| {
                c.remaining()
                    + c.pods[..c.next]
                        .iter()
                        .filter(|p| on_new.contains(p))
                        .count() as i64
            })
            .sum();
        (singles > self.spares).then_some((o.template, o.mask))
    }

    fn run(&mut self) {
        // Units in priority order, then size: gangs by total size, classes by pod size.
        enum Unit {
            Class(usize),
            Gang(usize),
        }
        let mut units: Vec<(i32, f64, Unit)> = Vec::new();
        for (ci, c) in self.classes.iter().enumerate() {
            if c.gang.is_none() {
                units.push((c.priority, c.gpu_eq, Unit::Class(ci)));
            }
        }
        for (gi, g) in self.gangs.iter().enumerate() {
            units.push((g.priority, g.gpu_eq, Unit::Gang(gi)));
        }
        units.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.total_cmp(&a.1)));
        let class_of = self.reserved_classes();
        let nominated = self.nominated();
        let mut reserved_for: Option<i32> = None;
        for (priority, _, u) in &units {
            if reserved_for != Some(*priority) {
                if !nominated.is_empty() {
                    self.place_nominated(*priority, &nominated);
                }
                self.place_singles_before_gangs(*priority);
                if !class_of.is_empty() {
                    self.place_reserved(*priority, &class_of);
                }
                reserved_for = Some(*priority);
            }
            match *u {
                Unit::Class(c) => {
                    let want = self.classes[c].remaining();
                    self.place_on_bins(c, want, None);
                }
                Unit::Gang(g) => self.place_gang(g),
            }
        }
        // Singles that rules across nodes look at get their new nodes first, one at a time
        // (preferences alone are no such rule).
        let ruled =
            |p: &Self, c: usize| p.classes[c].profile.as_ref().is_some_and(|x| x.has_rules());
        for (_, _, u) in &units {
            if let Unit::Class(c) = *u {
                if ruled(self, c) {
                    self.open_for_topology(c);
                }
            }
        }
        // Singles left: leftovers of nodes opened for gangs, then new nodes.
        let mut items: Vec<(usize, i64)> = Vec::new();
        for (_, _, u) in &units {
            if let Unit::Class(c) = *u {
                if ruled(self, c) {
                    continue;
                }
                let want = self.classes[c].remaining();
                if want > 0 {
                    let placed = self.place_on_bins(c, want, None);
                    if want - placed > 0 {
                        items.push((c, want - placed));
                    }
                }
            }
        }
        items.sort_by(|a, b| {
            self.classes[b.0]
                .value
                .total_cmp(&self.classes[a.0].value)
                .then(a.0.cmp(&b.0))
        });
        let mut usage = self.usage.clone();
        let opened = self.open_new(&mut items, None, &NodeCaps::default(), &mut usage);
        self.usage = usage;
        self.commit_opened(opened, None, false);
    }

    fn class_reason(&self, c: usize) -> String {
        let cl = &self.classes[c];
        let cons = &self.constraints[cl.cclass];
        if let Some(g) = cl.gang {
            let g = &self.gangs[g];
            if let Some(r) = &g.incomplete {
                return r.clone();
            }
            if let Some(r) = &g.failed {
                return r.clone();
            }
        }
        let what = match &cl.share {
            Some(s) => format!(
                "{} (shared GPU: {} GiB, {}% of one GPU)",
                cl.requests, s.mem_gib, s.core_pct
            ),
            None => cl.requests.to_string(),
        };
        if self.templates.is_empty() {
            return "no pool has any usable instance type".into();
        }
        // Templates whose labels match, then those whose taints are tolerated too.
        let by_labels: Vec<usize> = (0..self.templates.len())
            .filter(|&t| {
                self.templates[t]
                    .offerings
                    .iter()
                    .any(|o| cons.matches_node(&o.labels, None))
            })
            .collect();
        if by_labels.is_empty() {
            return "no pool offers nodes matching its nodeSelector/node affinity (GPU model, instance type, zone or capacity type not offered)".into();
        }
        if cl.tmask.iter().any(|m| *m != 0) {
            if let Some(r) = cl.refused {
                return format!(
                    "kube-scheduler would refuse it on every node it fits, existing or that \
                     could be launched within limits: {}",
                    r.describe()
                );
            }
            return self.dynamic_reason(c);
        }
        // Nothing can ever host it: say why, pool by pool.
        let mut why: Vec<String> = Vec::new();
        let mut tolerated = Vec::new();
        for &t in &by_labels {
            let tp = &self.templates[t];
            match cons.untolerated(&tp.taints) {
                Some(taint) => why.push(format!(
                    "pool {} nodes are tainted {taint}, which the pod does not tolerate",
                    tp.pool_name
                )),
                None => tolerated.push(t),
            }
        }
        let mut pools: BTreeSet<usize> =
            tolerated.iter().map(|&t| self.templates[t].pool).collect();
        // Pools none of whose matching templates offer what `lacks` tests for.
        let lacking = |pools: &BTreeSet<usize>, lacks: &dyn Fn(&Template) -> bool| -> Vec<usize> {
            pools
                .iter()
                .copied()
                .filter(|&p| {
                    tolerated
                        .iter()
                        .filter(|&&t| self.templates[t].pool == p)
                        .all(|&t| lacks(&self.templates[t]))
                })
                .collect()
        };
        for (name, v) in cl.requests.dimensions() {
            let lacking = lacking(&pools, &|t| t.allocatable.get(name) == 0);
            if v > 0 && !lacking.is_empty() && lacking.len() == pools.len() {
                why.push(format!("no matching pool offers {name}"));
                pools.clear();
            } else if v > 0 && !lacking.is_empty() {
                for p in &lacking {
                    why.push(format!(
                        "pool {} does not offer {name}",
                        self.policy.pools[*p].name
                    ));
                    pools.remove(p);
                }
            }
        }
        if cl.share.is_some() {
            let lacking = lacking(&pools, &|t| t.shared.is_empty());
            for p in &lacking {
                why.push(format!(
                    "pool {} does not share GPUs",
                    self.policy.pools[*p].name
                ));
                pools.remove(p);
            }
        }
        if !pools.is_empty() {
            let largest = tolerated
                .iter()
                .filter(|&&t| pools.contains(&self.templates[t].pool))
                .map(|&t| &self.templates[t])
                .max_by(|a, b| {
                    (
                        a.allocatable.whole_gpus() + a.shared.len() as i64,
                        a.allocatable.cpu_milli,
                    )
                        .cmp(&(
                            b.allocatable.whole_gpus() + b.shared.len() as i64,
                            b.allocatable.cpu_milli,
                        ))
                })
                .map(|t| {
                    let learned = t
                        .learned_from
                        .as_ref()
                        .map(|n| format!(", as its registered node {n} shows"))
                        .unwrap_or_default();
                    format!(
                        " (largest: {} in pool {} with {}{learned})",
                        t.instance_type, t.pool_name, t.allocatable
                    )
                })
                .unwrap_or_default();
            why.push(format!(
                "no matching instance type can fit requests {what} on one node{largest}"
            ));
        }
        format!("no pool can ever host it: {}", why.join("; "))
    }

    /// Why a pod that some template could host got no capacity in this plan.
    fn dynamic_reason(&self, c: usize) -> String {
        let cl = &self.classes[c];
        let fitting: Vec<usize> = (0..self.templates.len())
            .filter(|&t| cl.tmask[t] != 0)
            .collect();
        if fitting
            .iter()
            .all(|&t| cl.tmask[t] & self.available[t] == 0)
        {
            let n: usize = fitting
                .iter()
                .map(|&t| (cl.tmask[t]).count_ones() as usize)
                .sum();
            if let Some(until) = cl.spot_until {
                return format!(
                    "waiting for spot (spotMaxWait): all {n} matching spot offerings are short of \
                     capacity; on-demand from {until}"
                );
            }
            return format!(
                "all {n} matching offerings are currently unavailable (insufficient capacity); retrying when the insufficient-capacity cache expires"
            );
        }
        let mut pools: Vec<String> = fitting
            .iter()
            .filter(|&&t| self.room(&self.usage, t) == 0)
            .map(|&t| {
                let p = &self.policy.pools[self.templates[t].pool];
                format!(
                    "{} (max {} nodes{})",
                    p.name,
                    p.max_nodes,
                    p.max_gpus
                        .map(|g| format!(", {g} GPUs"))
                        .unwrap_or_default()
                )
            })
            .collect();
        pools.dedup();
        if !pools.is_empty() {
            let cluster = match (self.policy.limits.max_nodes, self.policy.limits.max_gpus) {
                (None, None) => String::new(),
                (n, g) => format!(
                    "; cluster limits: {} nodes, {} GPUs",
                    n.map_or("unlimited".into(), |n| n.to_string()),
                    g.map_or("unlimited".into(), |g| g.to_string())
                ),
            };
            return format!(
                "{}: pool {}{cluster}",
                super::LIMITS_REACHED,
                pools.join(", ")
            );
        }
        "no capacity could be planned for it".into()
    }

    /// Free room left on registered nodes once pending pods took their share.
    fn node_rooms(&self) -> Vec<NodeRoom> {
        self.bins
            .iter()
            .filter_map(|b| match b.kind {
                BinKind::Node(n) => Some(NodeRoom {
                    node: n,
                    free: b.free.clone(),
                    shared: b.shared.clone(),
                }),
                _ => None,
            })
            .collect()
    }

    fn into_plan(self) -> Plan {
        let snap = self.snapshot;
        let mut plan = Plan {
            spot_wait_until: self.classes.iter().filter_map(|c| c.spot_until).min(),
            ..Plan::default()
        };
        for (pod, kind) in &self.placed {
            let target = match *kind {
                BinKind::Node(n) => snap.nodes[n].name.clone(),
                BinKind::InFlight(f) => format!("launch/{}", snap.in_flight[f].launch_id),
                BinKind::New(_) => unreachable!("new nodes keep their own pods"),
            };
            plan.existing_capacity.push(Placement {
                pod: snap.pods[*pod].id.to_string(),
                target,
                pod_index: *pod,
            });
        }
        // Group identical new nodes into one scale-up.
        // Keyed by (template, offering mask, gang).
        type GroupKey = (usize, u64, Option<usize>);
        let mut groups: Vec<(GroupKey, ScaleUp)> = Vec::new();
        let mut index: HashMap<GroupKey, usize> = HashMap::default();
        for n in &self.new_nodes {
            let key = (n.template, n.mask, n.gang);
            let gi = *index.entry(key).or_insert_with(|| {
                let t = &self.templates[n.template];
                groups.push((
                    key,
                    ScaleUp {
                        pool: t.pool_name.clone(),
                        count: 0,
                        offerings: t
                            .offerings_in(n.mask & self.available[n.template])
                            .map(|o| PlannedOffering {
                                instance_type: o.key.instance_type.clone(),
                                zone: o.key.zone.clone(),
                                capacity_type: o.key.capacity_type,
                                price_per_hour: o.price,
                            })
                            .collect(),
                        pods: Vec::new(),
                        gang: n.gang.map(|g| self.gangs[g].key.clone()),
                        pods_per_node: Vec::new(),
                    },
                ));
                groups.len() - 1
            });
            let su = &mut groups[gi].1;
            su.count += 1;
            su.pods_per_node.push(n.pods.len());
            su.pods
                .extend(n.pods.iter().map(|&p| PlannedPod::of(&snap.pods[p])));
        }
        plan.scale_ups = groups.into_iter().map(|(_, s)| s).collect();
        for (ci, c) in self.classes.iter().enumerate() {
            if c.remaining() == 0 {
                continue;
            }
            let reason = self.class_reason(ci);
            let permanent = c.tmask.iter().all(|m| *m == 0);
            for &p in &c.pods[c.next..] {
                plan.unschedulable.push(Unschedulable {
                    pod: snap.pods[p].id.to_string(),
                    reason: reason.clone(),
                    permanent,
                });
            }
        }
        for (i, p) in snap.pods.iter().enumerate() {
            if is_planned_pod(p) {
                if let Some(problem) = &p.problem {
                    plan.unschedulable.push(Unschedulable {
                        pod: p.id.to_string(),
                        reason: format!("invalid pod spec: {problem}"),
                        permanent: true,
                    });
                } else if let Some(why) = &p.waiting {
                    plan.unschedulable.push(Unschedulable {
                        pod: p.id.to_string(),
                        reason: format!("waiting: {why}"),
                        permanent: false,
                    });
                } else if let Some(Err(why)) = self.devices.demands.get(&i) {
                    plan.unschedulable.push(Unschedulable {
                        pod: p.id.to_string(),
                        reason: format!("no pool can ever host its ResourceClaims: {why}"),
                        permanent: true,
                    });
                }
            }
        }
        plan.unschedulable.sort_by(|a, b| a.pod.cmp(&b.pod));
        plan.existing_capacity.sort_by(|a, b| a.pod.cmp(&b.pod));
        plan
    }
}

/// Plans placements and scale-ups for the pending GPU pods.
pub(super) fn scale_up(
    snapshot: &Snapshot,
    templates: &[Template],
    policy: &Policy,
    now: Time,
) -> (Plan, Left, Devices) {
    let planned: Vec<usize> = snapshot
        .pods
        .iter()
        .enumerate()
        .filter(|(_, p)| is_planned_pod(p) && p.problem.is_none() && p.waiting.is_none())
        .map(|(i, _)| i)
        .collect();
    let devices = devices::resolve(snapshot, templates, &planned);
    // Templates offer their predicted devices as dimensions of their allocatable.
    let with_devices: Option<Vec<Template>> = devices
        .template_devices
        .iter()
        .any(|d| !d.is_zero())
        .then(|| {
            let mut t = templates.to_vec();
            for (t, d) in t.iter_mut().zip(&devices.template_devices) {
                t.allocatable.add(d);
            }
            t
        });
    let templates = with_devices.as_deref().unwrap_or(templates);
    let mut p = Packer::new(snapshot, templates, policy, now, devices);
    p.run();
    let rooms = p.node_rooms();
    // What scale-down needs of the devices: which kind each published device is.
    let devices = Devices {
        published: std::mem::take(&mut p.devices.published),
        moving: std::mem::take(&mut p.devices.moving),
        ..Devices::default()
    };
    let left = Left {
        rooms,
        topology: p.topology.take(),
    };
    (p.into_plan(), left, devices)
}

/// What a scale-up leaves to scale-down: the room on registered nodes, and the pods (running
/// and placed by the plan) per topology domain when some pod has rules across nodes.
pub(super) struct Left {
    pub rooms: Vec<NodeRoom>,
    pub topology: Option<TopologyIndex>,
}

/// What is free on a registered node (index into `Snapshot::nodes`).
#[derive(Clone, Debug)]
pub(super) struct NodeRoom {
    pub node: usize,
    pub free: Resources,
    pub shared: Vec<SharedGpu>,
}
