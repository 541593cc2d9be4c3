//! Baselines on the same engine: Cluster Autoscaler and Karpenter semantics as GPU users meet
//! them today. Both are simplified, and both are given our policy's pools, prices and limits.
//!
//! `ca-like`: a scan every 10 s; one node group per pool × instance type × capacity type (all its
//! zones, as an Auto Scaling group over the pool's subnets); pods that fit nowhere are bin-packed
//! per group and the expanders `priority,least-waste` pick one group per scan: spot groups
//! first (the pool's capacity types in their order, as AWS's guidance for spot with the Cluster
//! Autoscaler configures the priority expander), least waste (wasted CPU + memory share) among
//! them; no gang awareness;
//! a registered node that carries the cloud's GPU label (`k8s.amazonaws.com/accelerator`) but
//! advertises no GPU yet is not ready and, for the 15 minutes after its creation
//! (`MaxNodeStartupTime`), counts as upcoming at its group's template capacity, as the Cluster
//! Autoscaler's `FilterOutNodesWithUnreadyResources` and cluster state do; a launch the cloud
//! could not fill is seen at the next scan (its AWS provider reads the Auto Scaling group's failed
//! scaling activities) and the group is backed off exponentially, 5 m doubling up to 30 m, reset
//! after 3 h without failure (`--initial-node-group-backoff-duration`,
//! `--max-node-group-backoff-duration`, `--node-group-backoff-reset-timeout`). Scale-down: the
//! same rules as ours through the same scale-down planner, each node group with its pool's
//! unneeded time and utilisation threshold (what its AWS provider reads from the Auto Scaling
//! group's `k8s.io/cluster-autoscaler/node-template/autoscaling-options/*` tags), and the flags
//! that are global only (`--scale-down-delay-after-add`, `--scale-down-delay-after-failure`)
//! the smallest of the pools', a scale-up in any pool holding every pool's scale-down. Pods with
//! ResourceClaims (its `--enable-dynamic-resource-allocation`) are simulated on the devices of a
//! group's template, and its AWS provider's templates carry no
//! ResourceSlices: a group has devices only once it has a node, whose published devices its
//! template copies; an empty group never gets a node for them.
//!
//! `karpenter-like`: batching 1 s idle / 10 s max; pods sorted by CPU then memory, descending;
//! each goes onto existing or in-flight capacity (counted at full capacity, GPUs included), else
//! into the first new node claim whose remaining instance types still fit it, else a new claim;
//! each claim launches the cheapest instance type left, spot first where allowed; no gang
//! awareness; an offering that fails is avoided for 3 m; empty nodes are consolidated after 30 s,
//! and (Karpenter v1's default `WhenEmptyOrUnderutilized`) a node whose pods have not changed for
//! 30 s and all fit on the other nodes is drained and deleted, at most 10 % of a pool at once;
//! an on-demand node whose pods do not all fit elsewhere is replaced by one cheaper node (spot
//! or on-demand) launched first, the old node drained once the new one is initialised (spot
//! nodes are not replaced: spot-to-spot consolidation is behind a feature gate, off by default);
//! the cluster is looked at again after 5 minutes without a change; multi-node consolidation
//! (several nodes into one new node) is not modelled. Pods with ResourceClaims are not
//! provisioned for (its `--ignore-dra-requests`, true by default).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use gpu_node_autoscaler_provider::{Catalog, LaunchRequest, OfferingKey};

use gpu_node_autoscaler_core::model::dra::Device;
use gpu_node_autoscaler_core::model::resources::{place_share, Resources, SharedGpu};
use gpu_node_autoscaler_core::model::{Pod, Snapshot, Time};
use gpu_node_autoscaler_core::plan::templates::template_of_node;
use gpu_node_autoscaler_core::plan::{self, Template};
use gpu_node_autoscaler_core::policy::Policy;

use super::claims::DeviceMatcher;
use super::engine::{Strategy, World};
use super::{earliest, Ms, SimInput, MINUTE, SECOND};
use gpu_node_autoscaler_core::autoscaler::Batch;

/// Devices of a node (published, or of its group's template) and which of them are allocated.
#[derive(Clone)]
struct DeviceRoom {
    devices: Arc<Vec<Device>>,
    taken: Vec<bool>,
    matcher: Rc<RefCell<DeviceMatcher>>,
}

impl DeviceRoom {
    fn free(devices: Arc<Vec<Device>>, matcher: &Rc<RefCell<DeviceMatcher>>) -> DeviceRoom {
        DeviceRoom {
            taken: vec![false; devices.len()],
            devices,
            matcher: matcher.clone(),
        }
    }
}

/// What a strategy knows of devices when it simulates: its DeviceClasses, and per node group
/// (template index) the devices a new node of it would publish (none where it cannot tell).
struct DeviceView {
    matcher: Rc<RefCell<DeviceMatcher>>,
    groups: BTreeMap<usize, Arc<Vec<Device>>>,
}

impl DeviceView {
    fn room(&self, template: usize) -> Option<DeviceRoom> {
        self.groups
            .get(&template)
            .map(|d| DeviceRoom::free(d.clone(), &self.matcher))
    }
}

/// Free room of a node (or of a node on its way).
#[derive(Clone)]
struct Room {
    free: Resources,
    shared: Vec<SharedGpu>,
    labels: std::sync::Arc<BTreeMap<String, String>>,
    taints: Vec<gpu_node_autoscaler_core::model::Taint>,
    name: Option<String>,
    /// Index into the snapshot's nodes (registered nodes only).
    node: Option<usize>,
    /// Devices claims can be allocated on (none: pods with claims do not fit).
    devices: Option<DeviceRoom>,
    /// $/hour of the node and its GPUs (a CapacityBuffer's chunk is priced at its share).
    price: f64,
    gpus: i64,
}

impl Room {
    fn take(&mut self, p: &Pod) -> bool {
        if !p.fits(
            &self.free,
            &self.shared,
            &self.labels,
            &self.taints,
            self.name.as_deref(),
        ) {
            return false;
        }
        if p.needs_devices() {
            let Some(d) = &mut self.devices else {
                return false;
            };
            let Some(allocated) = d.matcher.borrow_mut().allocate(p, &d.devices, &d.taken) else {
                return false;
            };
            for i in allocated.iter().flat_map(|(_, i)| i) {
                d.taken[*i] = true;
            }
        }
        self.free.sub(&p.requests);
        if let Some(s) = &p.share {
            place_share(&mut self.shared, s);
        }
        true
    }
}

fn template_room(t: &Template, offering: usize, devices: Option<DeviceRoom>) -> Room {
    Room {
        free: t.allocatable.clone(),
        shared: t.shared.clone(),
        labels: t.offerings[offering].labels.clone(),
        taints: t.taints.clone(),
        name: None,
        node: None,
        devices,
        price: t.offerings[offering].price,
        gpus: i64::from(t.gpus),
    }
}

/// Registered nodes with what they advertise now (the devices they publish, less those
/// allocated), then launches in flight at their template's capacity.
fn rooms(s: &Snapshot, templates: &[Template], view: &DeviceView) -> Vec<Room> {
    let mut used: BTreeMap<&str, (Resources, Vec<&Pod>)> = BTreeMap::new();
    for p in &s.pods {
        if let (true, Some(n)) = (p.is_bound_active(), &p.node_name) {
            let e = used.entry(n).or_default();
            e.0.add(&p.requests);
            e.1.push(p);
        }
    }
    let mut out = Vec::new();
    for (ni, n) in s.nodes.iter().enumerate() {
        if !n.is_schedulable() {
            continue;
        }
        let mut free = n.allocatable.clone();
        let mut shared = n.shared_gpus.clone();
        if let Some((r, pods)) = used.get(n.name.as_str()) {
            free.sub(r);
            for p in pods {
                if let Some(sh) = &p.share {
                    place_share(&mut shared, sh);
                }
            }
        }
        let devices = s.dra.slices.get(&n.name).map(|published| {
            let allocated = s.dra.allocated.get(&n.name);
            DeviceRoom {
                taken: published
                    .iter()
                    .map(|(pool, d)| {
                        allocated.is_some_and(|a| {
                            a.iter().any(|(dr, p, name)| {
                                *dr == d.driver && p == pool && *name == d.name
                            })
                        })
                    })
                    .collect(),
                devices: Arc::new(published.iter().map(|(_, d)| d.clone()).collect()),
                matcher: view.matcher.clone(),
            }
        });
        let t = template_of_node(n, templates).map(|i| &templates[i]);
        out.push(Room {
            free,
            shared,
            labels: n.labels.clone(),
            taints: n.taints.clone(),
            name: Some(n.name.clone()),
            node: Some(ni),
            devices,
            price: plan::scale_down::price_of(n, t),
            gpus: t.map_or(n.allocatable.whole_gpus(), |t| i64::from(t.gpus)),
        });
    }
    for f in &s.in_flight {
        if let Some(ti) = templates
            .iter()
            .position(|t| t.pool_name == f.pool && t.instance_type == f.offering.instance_type)
        {
            let t = &templates[ti];
            if let Some(oi) = t.offerings.iter().position(|o| o.key == f.offering) {
                for _ in 0..f.count {
                    out.push(template_room(t, oi, view.room(ti)));
                }
            }
        }
    }
    out
}

/// Registered nodes (for which `counts` holds) whose template has GPUs but which advertise none
/// yet: their rooms get the template's GPUs (and the devices the view expects of its group).
fn count_unadvertised_at_template(
    rooms: &mut [Room],
    s: &Snapshot,
    templates: &[Template],
    view: &DeviceView,
    counts: impl Fn(&gpu_node_autoscaler_core::model::Node) -> bool,
) {
    for r in rooms.iter_mut() {
        let Some(n) = r.node.map(|i| &s.nodes[i]) else {
            continue;
        };
        let Some(ti) = template_of_node(n, templates) else {
            continue;
        };
        let t = &templates[ti];
        if t.gpus == 0 || n.advertised_gpus() > 0 || !counts(n) {
            continue;
        }
        if r.devices.is_none() {
            r.devices = view.room(ti);
        }
        r.free.gpu += t.allocatable.gpu;
        r.free.amd_gpu += t.allocatable.amd_gpu;
        for (name, v) in t.allocatable.mig_slices() {
            let key = format!(
                "{}{name}",
                gpu_node_autoscaler_core::model::resources::MIG_PREFIX
            );
            let cur = r.free.get(&key);
            r.free.set(&key, cur + v);
        }
        if r.shared.is_empty() {
            r.shared = t.shared.clone();
        }
    }
}

fn pending_gpu_pods(s: &Snapshot) -> Vec<&Pod> {
    s.pods
        .iter()
        .filter(|p| plan::is_planned_pod(p) && p.problem.is_none() && p.waiting.is_none())
        .collect()
}

/// The pending GPU pods Karpenter provisions for: not those with ResourceClaims (its
/// `--ignore-dra-requests`, true by default, makes its scheduler return an error for them).
fn karpenter_pending(s: &Snapshot) -> Vec<&Pod> {
    let mut pods = pending_gpu_pods(s);
    pods.retain(|p| p.claims.is_empty());
    pods
}

fn pool_nodes(s: &Snapshot, pool: &str) -> i64 {
    s.nodes.iter().filter(|n| n.pool() == Some(pool)).count() as i64
        + s.in_flight
            .iter()
            .filter(|f| f.pool == pool)
            .map(|f| f.count as i64)
            .sum::<i64>()
}

fn cluster_gpus(s: &Snapshot, templates: &[Template]) -> i64 {
    let mut g: i64 = s
        .nodes
        .iter()
        .map(|n| {
            template_of_node(n, templates)
                .map_or(n.allocatable.whole_gpus(), |t| templates[t].gpus as i64)
        })
        .sum();
    for f in &s.in_flight {
        g += templates
            .iter()
            .find(|t| t.pool_name == f.pool && t.instance_type == f.offering.instance_type)
            .map_or(0, |t| t.gpus as i64 * f.count as i64);
    }
    g
}

/// Scale-down with the shared rules (GPU utilisation, unneeded time, cooldown after scale-up),
/// keeping "unneeded since" in node annotations as ours does.
fn scale_down(
    world: &mut World,
    policy: &Policy,
    templates: &plan::Templates,
    snapshot: &Snapshot,
) -> Option<Ms> {
    let now = world.now;
    let p = plan::plan_with(snapshot, templates, policy, Time(now));
    for d in &p.scale_downs {
        let _ = world.drain_and_remove(&d.node);
    }
    for (node, since) in plan::scale_down::unneeded_changes(&snapshot.nodes, &p.unneeded, |_| false)
    {
        world.annotate(
            node,
            gpu_node_autoscaler_core::model::labels::UNNEEDED_SINCE,
            since,
        );
    }
    p.unneeded
        .iter()
        .filter_map(|u| Time::parse_rfc3339(&u.since).ok())
        .map(|t| t.0)
        .min()
}

/// `--scale-down-delay-after-add` holds the scale-down of every node group after a scale-up in
/// any of them (`--scale-down-delay-type-local` is off by default, and `anchors` leaves it off):
/// each pool's last scale-up is the cluster's latest, a launch or a node of any pool.
fn hold_every_group_after_a_scale_up(snapshot: &mut Snapshot, policy: &Policy) {
    let latest = snapshot
        .nodes
        .iter()
        .filter(|n| n.pool().is_some())
        .map(|n| n.created)
        .chain(snapshot.in_flight.iter().map(|f| f.launched_at))
        .max();
    if let Some(t) = latest {
        for p in &policy.pools {
            let state = snapshot.pools.entry(p.name.clone()).or_default();
            state.last_scale_up = state.last_scale_up.max(Some(t));
        }
    }
}

fn available_catalog(input: &SimInput) -> Catalog {
    let mut c = input.catalog.clone();
    for o in &mut c.offerings {
        o.available = true;
    }
    c
}

// ---------------------------------------------------------------------------------------------

pub struct CaLike {
    policy: Policy,
    templates: plan::Templates,
    matcher: Rc<RefCell<DeviceMatcher>>,
    next: Option<Ms>,
    /// Per node group (template index, capacity type's index in the pool's list): failed
    /// launches in a row, and the last one's time.
    failures: BTreeMap<(usize, usize), (u32, Ms)>,
    backoff: BTreeMap<(usize, usize), Ms>,
    launches: u64,
    /// Per queued Kueue job (by index): its ProvisioningRequest's tries that found no
    /// capacity, and when it is tried again.
    request_backoff: BTreeMap<usize, (u32, Ms)>,
    /// The CapacityBuffers' chunks, as the fake pods the Cluster Autoscaler injects for them.
    buffer_pods: Vec<Pod>,
}

/// The back-off of a ProvisioningRequest that found no capacity
/// (`--provisioning-request-initial-backoff-time`, `--provisioning-request-max-backoff-time`).
const CA_REQUEST_BACKOFF: Ms = MINUTE;
const CA_REQUEST_MAX_BACKOFF: Ms = 10 * MINUTE;

/// The Cluster Autoscaler's node group back-off after a failed scale-up.
const CA_INITIAL_BACKOFF: Ms = 5 * MINUTE;
const CA_MAX_BACKOFF: Ms = 30 * MINUTE;
const CA_BACKOFF_RESET: Ms = 3 * 60 * MINUTE;
/// How long a registered node that is not ready counts as still starting (`NotStarted`).
const CA_MAX_NODE_STARTUP: Ms = 15 * MINUTE;

/// The Cluster Autoscaler's scale-down settings that are flags only, one for the whole cluster:
/// the smallest of the pools' (none without pools).
fn ca_scale_down(policy: &Policy) -> Option<gpu_node_autoscaler_core::policy::ScaleDown> {
    let mut pools = policy.pools.iter().map(|p| &p.scale_down);
    let first = pools.next()?.clone();
    Some(pools.fold(first, |mut g, s| {
        g.cooldown_after_scale_up = g.cooldown_after_scale_up.min(s.cooldown_after_scale_up);
        g.backoff_after_failure = g.backoff_after_failure.min(s.backoff_after_failure);
        g
    }))
}

impl CaLike {
    pub fn new(input: &SimInput) -> CaLike {
        // A node group's unneeded time and utilisation threshold are its own: the Cluster
        // Autoscaler's AWS provider reads them from the Auto Scaling group's tags
        // (`.../autoscaling-options/scaledownunneededtime`, `scaledownutilizationthreshold`,
        // `scaledowngpuutilizationthreshold`), so each pool keeps its own. The delays after a
        // scale-up and after a failed scale-down are flags for the whole cluster
        // (`--scale-down-delay-after-add`, `--scale-down-delay-after-failure`): the smallest of
        // the pools'. It has no separate time for empty nodes.
        let mut policy = input.policy.clone();
        if let Some(global) = ca_scale_down(&policy) {
            for p in &mut policy.pools {
                p.scale_down.cooldown_after_scale_up = global.cooldown_after_scale_up;
                p.scale_down.empty_unneeded_time = p.scale_down.unneeded_time;
                p.scale_down.backoff_after_failure = global.backoff_after_failure;
            }
        }
        CaLike {
            templates: plan::Templates::new(&policy, &available_catalog(input)),
            matcher: Rc::new(RefCell::new(DeviceMatcher::new(
                input.device_classes.clone(),
            ))),
            policy,
            next: None,
            failures: BTreeMap::new(),
            backoff: BTreeMap::new(),
            launches: 0,
            request_backoff: BTreeMap::new(),
            buffer_pods: input
                .buffers
                .iter()
                .flat_map(|b| {
                    (0..b.replicas).map(move |i| {
                        let mut p = b.chunk.clone();
                        p.id = gpu_node_autoscaler_core::model::PodRef::new(
                            p.id.namespace.clone(),
                            gpu_node_autoscaler_core::buffer::pod_name(&b.name, i),
                        );
                        p.uid = p.id.to_string();
                        p.priority = gpu_node_autoscaler_core::buffer::BUFFER_PRIORITY;
                        p.unschedulable = true;
                        p
                    })
                })
                .collect(),
        }
    }

    /// The Cluster Autoscaler's `best-effort-atomic-scale-up` ProvisioningRequests (the ones
    /// Kueue makes for its queued jobs), one a scan, the oldest not backed off: `Provisioned`
    /// at once (Kueue admits the job, its pods are created) when its pods fit the capacity
    /// there and on its way, else when one node group can take all of them and is scaled up by
    /// that many nodes in one call (the Auto Scaling group may fill fewer: atomic only as far as
    /// the cloud is); else `CapacityIsNotFound` and tried again after a back-off. Whether it
    /// launched.
    fn provisioning_request(&mut self, world: &mut World, templates: &[Template]) -> bool {
        let now = world.now;
        let Some((index, pods)) = world
            .waiting_jobs()
            .into_iter()
            .filter(|j| {
                self.request_backoff
                    .get(&j.index)
                    .is_none_or(|(_, t)| *t <= now)
            })
            .min_by_key(|j| (j.submitted, j.index))
            .map(|j| {
                (
                    j.index,
                    j.pods.iter().map(|p| (*p).clone()).collect::<Vec<Pod>>(),
                )
            })
        else {
            return false;
        };
        let snapshot = world.snapshot();
        let view = self.device_view(&snapshot, templates);
        let mut rooms = rooms(&snapshot, templates, &view);
        count_unadvertised_at_template(&mut rooms, &snapshot, templates, &view, |n| {
            n.labels
                .contains_key(gpu_node_autoscaler_core::model::labels::AWS_ACCELERATOR)
                && now - n.created.0 < CA_MAX_NODE_STARTUP
        });
        // The pods already pending take their room first.
        for p in pending_gpu_pods(&snapshot) {
            rooms.iter_mut().any(|r| r.take(p));
        }
        let request = format!("{index}-provisioning");
        if pods.iter().all(|p| rooms.iter_mut().any(|r| r.take(p))) {
            world.admit(index, Some(&request));
            return false;
        }
        let gpus_now = cluster_gpus(&snapshot, templates);
        // One group for all the pods: the expanders as for pending pods.
        let mut best: Option<(usize, f64, usize, u32)> = None;
        for (ti, t) in templates.iter().enumerate() {
            for ct in 0..self.policy.pools[t.pool].capacity_types.len() {
                if self.backoff.get(&(ti, ct)).is_some_and(|u| *u > now) {
                    continue;
                }
                let offers = self.group_offerings(t, ct);
                let Some(oi) = t
                    .offerings
                    .iter()
                    .position(|o| Some(&o.key) == offers.first())
                else {
                    continue;
                };
                let pool = &self.policy.pools[t.pool];
                let room_left = pool.max_nodes as i64 - pool_nodes(&snapshot, &pool.name);
                let mut nodes: Vec<Room> = Vec::new();
                let all = pods.iter().all(|p| {
                    nodes.iter_mut().any(|r| r.take(p)) || {
                        let mut r = template_room(t, oi, view.room(ti));
                        let fits = r.take(p);
                        if fits {
                            nodes.push(r);
                        }
                        fits
                    }
                });
                let n = nodes.len() as u32;
                if !all || n as i64 > room_left {
                    continue;
                }
                if let Some(mg) = self.policy.limits.max_gpus {
                    if gpus_now + i64::from(t.gpus) * i64::from(n) > mg as i64 {
                        continue;
                    }
                }
                let cap = |f: fn(&Resources) -> i64| (f(&t.allocatable) * n as i64).max(1) as f64;
                let free_cpu: i64 = nodes.iter().map(|r| r.free.cpu_milli).sum();
                let free_mem: i64 = nodes.iter().map(|r| r.free.memory).sum();
                let waste =
                    free_cpu as f64 / cap(|r| r.cpu_milli) + free_mem as f64 / cap(|r| r.memory);
                if best
                    .as_ref()
                    .is_none_or(|(pr, w, _, _)| ct < *pr || (ct == *pr && waste < *w - 1e-12))
                {
                    best = Some((ct, waste, ti, n));
                }
            }
        }
        let Some((ct, _, ti, n)) = best else {
            let e = self.request_backoff.entry(index).or_insert((0, now));
            e.0 += 1;
            let wait = (CA_REQUEST_BACKOFF << (e.0 - 1).min(8)).min(CA_REQUEST_MAX_BACKOFF);
            e.1 = now + wait;
            return false;
        };
        self.scale_up_group(world, &templates[ti], ti, ct, n, now);
        world.admit(index, Some(&request));
        true
    }

    /// A scale-up of group (`ti`, `ct`) the cloud did not fill: seen at the next scan from the
    /// group's failed scaling activity, and the group backed off.
    /// Raises node group (`ti`, capacity type `ct`) by `n`; a group that launched fewer is backed
    /// off.
    fn scale_up_group(
        &mut self,
        world: &mut World,
        t: &Template,
        ti: usize,
        ct: usize,
        n: u32,
        now: Ms,
    ) {
        self.launches += 1;
        let req = LaunchRequest {
            launch_id: format!("ca-{}-{}", t.pool_name, self.launches),
            pool: t.pool_name.clone(),
            count: n,
            offerings: self.group_offerings(t, ct),
            tags: BTreeMap::new(),
            reservations: Vec::new(),
            atomic: false,
        };
        let got = world
            .launch(&req)
            .map(|r| r.launched.len() as u32)
            .unwrap_or(0);
        if got < n {
            self.group_failed(ti, ct, now);
        }
    }

    fn group_failed(&mut self, ti: usize, ct: usize, now: Ms) {
        let e = self.failures.entry((ti, ct)).or_insert((0, now));
        if now - e.1 >= CA_BACKOFF_RESET {
            e.0 = 0;
        }
        e.0 += 1;
        e.1 = now;
        let wait = (CA_INITIAL_BACKOFF << (e.0 - 1).min(8)).min(CA_MAX_BACKOFF);
        self.backoff.insert((ti, ct), now + 10 * SECOND + wait);
    }

    /// The devices the Cluster Autoscaler expects of a new node: its AWS provider's templates
    /// carry no ResourceSlices, so a group's template has devices only once the group has a
    /// node, whose published slices its sanitized copy keeps (the first such node's).
    fn device_view(&self, s: &Snapshot, templates: &[Template]) -> DeviceView {
        let mut groups = BTreeMap::new();
        for n in &s.nodes {
            let Some(published) = s.dra.slices.get(&n.name).filter(|d| !d.is_empty()) else {
                continue;
            };
            if let Some(ti) = template_of_node(n, templates) {
                groups.entry(ti).or_insert_with(|| {
                    Arc::new(published.iter().map(|(_, d)| d.clone()).collect())
                });
            }
        }
        DeviceView {
            matcher: self.matcher.clone(),
            groups,
        }
    }

    /// A node group's offerings: one capacity type (`ct`, its index in the pool's list),
    /// every zone (an Auto Scaling group over the pool's subnets).
    /// The Cluster Autoscaler knows no capacity reservations: a reserved capacity type is no
    /// node group (none of its offerings).
    fn group_offerings(&self, t: &Template, ct: usize) -> Vec<OfferingKey> {
        let ct = self.policy.pools[t.pool].capacity_types[ct];
        if ct == gpu_node_autoscaler_provider::CapacityType::Reserved {
            return Vec::new();
        }
        t.offerings
            .iter()
            .filter(|o| o.key.capacity_type == ct)
            .map(|o| o.key.clone())
            .collect()
    }
}

impl Strategy for CaLike {
    fn name(&self) -> &'static str {
        "ca-like"
    }

    fn pods_unschedulable(&mut self, now: Ms) {
        // The next 10 s scan sees them.
        let scan = now + 10 * SECOND - now.rem_euclid(10 * SECOND);
        self.next = Some(self.next.map_or(scan, |n| n.min(scan)));
    }

    fn cluster_changed(&mut self, now: Ms) {
        self.pods_unschedulable(now);
    }

    fn next_run(&self) -> Option<Ms> {
        self.next
    }

    fn run(&mut self, world: &mut World) {
        let now = world.now;
        // The Cluster Autoscaler reads no interruption notices: an interrupted node's pods
        // are noticed when the node goes.
        drop(world.take_notices());
        let templates = world.templates().to_vec();
        let requested = self.provisioning_request(world, &templates);
        let snapshot = world.snapshot();
        let view = self.device_view(&snapshot, &templates);
        let mut rooms = rooms(&snapshot, &templates, &view);
        // A GPU node whose device plugin (or DRA driver) has not started is unready, and
        // upcoming at its template's capacity while it is young.
        count_unadvertised_at_template(&mut rooms, &snapshot, &templates, &view, |n| {
            n.labels
                .contains_key(gpu_node_autoscaler_core::model::labels::AWS_ACCELERATOR)
                && now - n.created.0 < CA_MAX_NODE_STARTUP
        });
        let mut left: Vec<&Pod> = Vec::new();
        let pending = pending_gpu_pods(&snapshot);
        // Pods waiting for upcoming nodes are looked at every scan: a node still starting can
        // turn unready (and its pods unschedulable) without anything else changing.
        let waiting = !pending.is_empty();
        for p in pending {
            if !rooms.iter_mut().any(|r| r.take(p)) {
                left.push(p);
            }
        }
        // CapacityBuffers (its `capacitybuffer` pod list processor): the chunks' fake pods after
        // every real pod, on free room, else scaled up for; the room they hold is priced.
        if !self.buffer_pods.is_empty() {
            let mut rate = 0.0;
            for p in &self.buffer_pods {
                match rooms.iter_mut().find_map(|r| r.take(p).then_some(&*r)) {
                    Some(r) => {
                        let g = p.requests.whole_gpus();
                        rate += r.price
                            * if r.gpus > 0 && g > 0 {
                                (g as f64 / r.gpus as f64).min(1.0)
                            } else {
                                1.0
                            };
                    }
                    None => left.push(p),
                }
            }
            world.set_buffer_rate(rate);
        }
        let mut scaled = false;
        if !left.is_empty() {
            // Estimate per group (first-fit decreasing on template nodes) and pick least waste.
            left.sort_by(|a, b| {
                b.gpu_equivalents()
                    .total_cmp(&a.gpu_equivalents())
                    .then(a.id.cmp(&b.id))
            });
            let gpus_now = cluster_gpus(&snapshot, &templates);
            // (capacity type's rank, waste, template, nodes): the priority expander first (a
            // pool's capacity types in its order: spot groups before on-demand ones), least waste
            // among equals.
            let mut best: Option<(usize, f64, usize, u32)> = None;
            let groups = templates.iter().enumerate().flat_map(|(ti, t)| {
                (0..self.policy.pools[t.pool].capacity_types.len()).map(move |ct| (ti, t, ct))
            });
            for (ti, t, ct) in groups {
                if self
                    .backoff
                    .get(&(ti, ct))
                    .is_some_and(|until| *until > now)
                {
                    continue;
                }
                let offers = self.group_offerings(t, ct);
                let Some(oi) = t
                    .offerings
                    .iter()
                    .position(|o| Some(&o.key) == offers.first())
                else {
                    continue;
                };
                let pool = &self.policy.pools[t.pool];
                let room_left = pool.max_nodes as i64 - pool_nodes(&snapshot, &pool.name);
                let mut nodes: Vec<Room> = Vec::new();
                let mut placed = 0;
                for p in &left {
                    if nodes.iter_mut().any(|r| r.take(p)) {
                        placed += 1;
                        continue;
                    }
                    if nodes.len() as i64 >= room_left {
                        continue;
                    }
                    let mut r = template_room(t, oi, view.room(ti));
                    if r.take(p) {
                        nodes.push(r);
                        placed += 1;
                    }
                }
                if placed == 0 {
                    continue;
                }
                let mut n = nodes.len() as u32;
                if let Some(mg) = self.policy.limits.max_gpus {
                    if t.gpus > 0 {
                        n = n.min(((mg as i64 - gpus_now).max(0) / t.gpus as i64) as u32);
                    }
                }
                if n == 0 {
                    continue;
                }
                let cap = |f: fn(&Resources) -> i64| (f(&t.allocatable) * n as i64).max(1) as f64;
                let free_cpu: i64 = nodes.iter().map(|r| r.free.cpu_milli).sum();
                let free_mem: i64 = nodes.iter().map(|r| r.free.memory).sum();
                let waste =
                    free_cpu as f64 / cap(|r| r.cpu_milli) + free_mem as f64 / cap(|r| r.memory);
                if best
                    .as_ref()
                    .is_none_or(|(pr, w, _, _)| ct < *pr || (ct == *pr && waste < *w - 1e-12))
                {
                    best = Some((ct, waste, ti, n));
                }
            }
            if let Some((ct, _, ti, n)) = best {
                self.scale_up_group(world, &templates[ti], ti, ct, n, now);
                scaled = true;
            }
        }
        let mut snapshot = world.snapshot();
        // The buffers' fake pods take their room in the scale-down simulation too.
        snapshot.pods.extend(self.buffer_pods.iter().cloned());
        hold_every_group_after_a_scale_up(&mut snapshot, &self.policy);
        let first_unneeded = scale_down(world, &self.policy, &self.templates, &snapshot);
        // Scan again in 10 s while anything is pending, waiting or being watched.
        let busy = scaled || requested || waiting || !world.unregistered().is_empty();
        // A queued job's request is tried again at its back-off's end.
        let queued = world
            .waiting_jobs()
            .iter()
            .map(|j| self.request_backoff.get(&j.index).map_or(now, |(_, t)| *t))
            .min()
            .map(|t| t.max(now + 10 * SECOND));
        self.next = if busy {
            Some(now + 10 * SECOND)
        } else {
            earliest(first_unneeded.map(|_| now + MINUTE), queued)
        };
    }
}

// ---------------------------------------------------------------------------------------------

pub struct KarpenterLike {
    policy: Policy,
    batch: Batch,
    next: Option<Ms>,
    ice: BTreeMap<OfferingKey, Ms>,
    empty_since: BTreeMap<String, Ms>,
    /// Per node with pods: those pods, and since when they are the same.
    stable_since: BTreeMap<String, (Vec<String>, Ms)>,
    launches: u64,
    /// It predicts no devices for new nodes (pods with claims are not provisioned for).
    devices: DeviceView,
    /// Consolidation's replacements under way.
    replacing: Vec<Replacement>,
}

/// A node being replaced by a cheaper one: the old node stays (tainted
/// `karpenter.sh/disrupted`) until the replacement's node is initialised, then it is drained.
struct Replacement {
    old: String,
    pool: String,
    instance: String,
    launched: Ms,
    /// When the old node was drained (the entry is kept a minute longer, so that the new node
    /// is not taken for empty before the old node's pods are bound to it).
    drained: Option<Ms>,
}

/// How long a replacement may take to become an initialised node before it is given up
/// (Karpenter's NodeClaim registration TTL).
const REPLACEMENT_TTL: Ms = 15 * MINUTE;

/// Karpenter's taint on a node it is disrupting.
fn disrupted_taint() -> gpu_node_autoscaler_core::model::Taint {
    gpu_node_autoscaler_core::model::Taint {
        key: "karpenter.sh/disrupted".into(),
        value: String::new(),
        effect: gpu_node_autoscaler_core::model::constraints::Effect::NoSchedule,
    }
}

/// Karpenter's node repair (`node.health`, behind the `NodeRepair` feature gate, assumed on):
/// a node whose `AcceleratedHardwareReady` condition has been `False` for its 10-minute
/// toleration (from the condition's transition time) has its NodeClaim deleted at once, pods'
/// grace periods cut, unless more of its NodePool is unhealthy than 20 % of its nodes rounded up
/// (then it looks again 5 minutes later). It reads no GPU metrics.
const REPAIR_TOLERATION: Ms = 10 * 60 * SECOND;
const REPAIR_ALLOWED_UNHEALTHY: f64 = 0.2;
const REPAIR_BLOCKED_REQUEUE: Ms = 5 * 60 * SECOND;

impl KarpenterLike {
    fn repair(&mut self, world: &mut World) {
        let now = world.now;
        let broken = world.broken_nodes();
        let mut sizes: BTreeMap<String, usize> = BTreeMap::new();
        for n in world.nodes.iter().filter(|n| !n.removed) {
            *sizes.entry(n.pool.clone()).or_default() += 1;
        }
        let mut unhealthy: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, pool, _) in &broken {
            *unhealthy.entry(pool.as_str()).or_default() += 1;
        }
        for (node, pool, since) in &broken {
            let size = sizes.get(pool).copied().unwrap_or(0);
            let threshold = (REPAIR_ALLOWED_UNHEALTHY * size as f64).ceil() as usize;
            let at = if now - since < REPAIR_TOLERATION {
                since + REPAIR_TOLERATION
            } else if unhealthy[pool.as_str()] <= threshold {
                let _ = world.drain_and_remove(node);
                continue;
            } else {
                now + REPAIR_BLOCKED_REQUEUE
            };
            self.next = Some(self.next.map_or(at, |n| n.min(at)));
        }
    }

    pub fn new(input: &SimInput) -> KarpenterLike {
        KarpenterLike {
            policy: input.policy.clone(),
            batch: Batch::default(),
            next: None,
            ice: BTreeMap::new(),
            empty_since: BTreeMap::new(),
            stable_since: BTreeMap::new(),
            launches: 0,
            replacing: Vec::new(),
            devices: DeviceView {
                matcher: Rc::new(RefCell::new(DeviceMatcher::new(
                    input.device_classes.clone(),
                ))),
                groups: BTreeMap::new(),
            },
        }
    }
}

/// A NodePool's `consolidateAfter`: its pool's `scaleDown.unneededTime`, as `anchors` configures
/// the real Karpenter (the policy's default without a pool).
fn consolidate_after(pool: Option<&gpu_node_autoscaler_core::policy::Pool>) -> Ms {
    let t = pool.map_or(
        gpu_node_autoscaler_core::policy::defaults::UNNEEDED_TIME,
        |p| p.scale_down.unneeded_time,
    );
    t.as_millis() as Ms
}

/// A node claim being filled: the templates still possible and the pods on it; per template
/// still possible, the first offering every pod accepts ([`fits_all`]) and the room a new node
/// of it has left with the pods on it.
struct Claim<'a> {
    options: Vec<usize>,
    requests: Vec<&'a Pod>,
    rooms: Vec<(usize, Room)>,
}

impl<'a> Claim<'a> {
    /// A claim for `p` alone on each of `fits`: (template, what `fits_all` found for `p`).
    fn new(fits: Vec<(usize, (usize, Room))>, p: &'a Pod) -> Claim<'a> {
        let (options, rooms) = fits.into_iter().unzip();
        Claim {
            options,
            requests: vec![p],
            rooms,
        }
    }

    /// Adds `p` if some template still fits every pod with it, keeping those that do: what
    /// `fits_all` over the pods and `p` gives, without planning the pods again where the first
    /// offering they all accept stays the same.
    fn add(&mut self, templates: &[Template], p: &'a Pod) -> bool {
        let mut options = Vec::new();
        let mut rooms = Vec::new();
        for (&ti, (oi, room)) in self.options.iter().zip(&self.rooms) {
            let t = &templates[ti];
            if accepted(t, *oi, &[p]) {
                // No offering before `oi` accepts all the others: `oi` is still the first.
                let mut r = room.clone();
                if r.take(p) {
                    options.push(ti);
                    rooms.push((*oi, r));
                }
                continue;
            }
            let mut with = self.requests.clone();
            with.push(p);
            if let Some(fit) = fits_all(t, &with) {
                options.push(ti);
                rooms.push(fit);
            }
        }
        if options.is_empty() {
            return false;
        }
        self.options = options;
        self.rooms = rooms;
        self.requests.push(p);
        true
    }
}

/// Every one of `pods` accepts `t`'s offering `oi` (its labels and the template's taints).
fn accepted(t: &Template, oi: usize, pods: &[&Pod]) -> bool {
    let o = &t.offerings[oi];
    pods.iter()
        .all(|p| p.constraints.matches_node(&o.labels, None) && p.constraints.tolerates(&t.taints))
}

/// All of `pods` on one new node of `t`'s offering `oi`: the room they leave, if they fit.
fn room_with(t: &Template, oi: usize, pods: &[&Pod]) -> Option<Room> {
    if !accepted(t, oi, pods) {
        return None;
    }
    let mut r = template_room(t, oi, None);
    pods.iter().all(|p| r.take(p)).then_some(r)
}

/// Whether all of `pods` fit one new node of `t`'s offering `oi`.
fn fits_offering(t: &Template, oi: usize, pods: &[&Pod]) -> bool {
    room_with(t, oi, pods).is_some()
}

/// The first offering of `t` every pod accepts, if all of them fit one new node of it, and the
/// room they leave there.
fn fits_all(t: &Template, pods: &[&Pod]) -> Option<(usize, Room)> {
    let oi = (0..t.offerings.len()).find(|&oi| accepted(t, oi, pods))?;
    room_with(t, oi, pods).map(|r| (oi, r))
}

impl Strategy for KarpenterLike {
    fn name(&self) -> &'static str {
        "karpenter-like"
    }

    fn pods_unschedulable(&mut self, now: Ms) {
        self.batch.add(Time(now));
    }

    fn cluster_changed(&mut self, now: Ms) {
        let t = now + SECOND;
        self.next = Some(self.next.map_or(t, |n| n.min(t)));
    }

    fn next_run(&self) -> Option<Ms> {
        earliest(
            self.batch
                .deadline(Duration::from_secs(1), Duration::from_secs(10))
                .map(|t| t.0),
            self.next,
        )
    }

    fn run(&mut self, world: &mut World) {
        let now = world.now;
        self.batch.clear();
        self.next = None;
        // With its interruption queue (`settings.interruptionQueue`, as its getting-started
        // set-up creates it), Karpenter taints, drains and deletes a node on a spot
        // interruption warning at once; the evicted pods are provisioned for like any.
        for n in world.take_notices() {
            for id in &n.instance_ids {
                if let Some(node) = world.node_of_instance(id).map(str::to_string) {
                    let _ = world.drain_and_remove(&node);
                }
            }
        }
        self.repair(world);
        self.replace_drifted(world);
        let replacement_nodes = self.advance_replacements(world);
        self.ice.retain(|_, until| *until > now);
        let templates = world.templates().to_vec();
        let snapshot = world.snapshot();
        let mut rooms = rooms(&snapshot, &templates, &self.devices);
        // Nodes whose GPUs are not advertised yet count at full capacity (node claims know
        // their instance type).
        count_unadvertised_at_template(&mut rooms, &snapshot, &templates, &self.devices, |_| true);
        let mut pods: Vec<&Pod> = karpenter_pending(&snapshot);
        pods.sort_by(|a, b| {
            b.requests
                .cpu_milli
                .cmp(&a.requests.cpu_milli)
                .then(b.requests.memory.cmp(&a.requests.memory))
                .then(a.id.cmp(&b.id))
        });
        let usable = |ti: usize, t: &Template| -> bool {
            let _ = ti;
            t.offerings.iter().any(|o| !self.ice.contains_key(&o.key))
        };
        let mut claims: Vec<Claim> = Vec::new();
        let mut waiting = false;
        for p in pods {
            if rooms.iter_mut().any(|r| r.take(p)) {
                continue;
            }
            if claims.iter_mut().any(|c| c.add(&templates, p)) {
                continue;
            }
            let fits: Vec<(usize, (usize, Room))> = templates
                .iter()
                .enumerate()
                .filter(|(ti, t)| usable(*ti, t))
                .filter_map(|(ti, t)| fits_all(t, &[p]).map(|fit| (ti, fit)))
                .collect();
            if fits.is_empty() {
                waiting = true;
                continue;
            }
            claims.push(Claim::new(fits, p));
        }
        let mut gpus_now = cluster_gpus(&snapshot, &templates);
        let mut added: BTreeMap<String, i64> = BTreeMap::new();
        // Each pool's size in the snapshot ([`pool_nodes`]), counted once.
        let mut sizes: BTreeMap<&str, i64> = BTreeMap::new();
        for c in claims {
            // Cheapest instance type left (its cheapest allowed offering), within limits.
            let mut best: Option<(f64, usize, Vec<OfferingKey>)> = None;
            for &ti in &c.options {
                let t = &templates[ti];
                let pool = &self.policy.pools[t.pool];
                let size = *sizes
                    .entry(pool.name.as_str())
                    .or_insert_with(|| pool_nodes(&snapshot, &pool.name));
                if size + added.get(&pool.name).copied().unwrap_or(0) >= pool.max_nodes as i64 {
                    continue;
                }
                if self
                    .policy
                    .limits
                    .max_gpus
                    .is_some_and(|mg| gpus_now + t.gpus as i64 > mg as i64)
                {
                    continue;
                }
                let mut offers: Vec<(f64, OfferingKey)> = t
                    .offerings
                    .iter()
                    .filter(|o| !self.ice.contains_key(&o.key))
                    .filter(|o| {
                        c.requests
                            .iter()
                            .all(|p| p.constraints.matches_node(&o.labels, None))
                    })
                    .map(|o| (o.price, o.key.clone()))
                    .collect();
                offers.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                let Some(price) = offers.first().map(|o| o.0) else {
                    continue;
                };
                if best.as_ref().is_none_or(|(bp, _, _)| price < *bp) {
                    best = Some((price, ti, offers.into_iter().map(|o| o.1).collect()));
                }
            }
            let Some((_, ti, offerings)) = best else {
                waiting = true;
                continue;
            };
            let t = &templates[ti];
            self.launches += 1;
            let req = LaunchRequest {
                launch_id: format!("karpenter-{}", self.launches),
                pool: t.pool_name.clone(),
                count: 1,
                reservations: world.reservations_for(&t.pool_name, &offerings),
                offerings,
                tags: BTreeMap::new(),
                atomic: false,
            };
            match world.launch(&req) {
                Ok(res) => {
                    for (k, _) in &res.failures {
                        self.ice.insert(k.clone(), now + 3 * MINUTE);
                    }
                    if res.launched.is_empty() {
                        waiting = true;
                    } else {
                        *added.entry(t.pool_name.clone()).or_default() += 1;
                        gpus_now += t.gpus as i64;
                    }
                }
                Err(_) => waiting = true,
            }
        }
        // Consolidation of empty nodes after 30 s.
        let mut busy: BTreeMap<&str, bool> = BTreeMap::new();
        for p in &snapshot.pods {
            if let (true, Some(n)) = (p.is_bound_active() && !p.is_daemonset(), &p.node_name) {
                busy.insert(n.as_str(), true);
            }
        }
        // A node that a pending pod fits is nominated for it: not consolidated.
        let pending = karpenter_pending(&snapshot);
        let nominated = |n: &gpu_node_autoscaler_core::model::Node| {
            let r = Room {
                devices: None,
                free: n.allocatable.clone(),
                shared: n.shared_gpus.clone(),
                labels: n.labels.clone(),
                taints: n.taints.clone(),
                name: Some(n.name.clone()),
                node: None,
                price: 0.0,
                gpus: 0,
            };
            pending.iter().any(|p| r.clone().take(p))
        };
        let mut soonest: Option<Ms> = None;
        let mut removed: BTreeMap<String, i64> = BTreeMap::new();
        let mut emptied: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        for n in &snapshot.nodes {
            if busy.contains_key(n.name.as_str())
                || n.advertised_gpus() == 0
                || nominated(n)
                || replacement_nodes.contains(&n.name)
            {
                self.empty_since.remove(&n.name);
                continue;
            }
            let since = *self.empty_since.entry(n.name.clone()).or_insert(now);
            let pool = n.pool().and_then(|p| self.policy.pool(p));
            let min = pool.map_or(0, |p| p.min_nodes as i64);
            let count = n.pool().map_or(0, |p| {
                pool_nodes(&snapshot, p) - removed.get(p).copied().unwrap_or(0)
            });
            let after = consolidate_after(pool);
            if now - since >= after && count > min {
                let _ = world.drain_and_remove(&n.name);
                emptied.insert(n.name.clone());
                self.empty_since.remove(&n.name);
                if let Some(p) = n.pool() {
                    *removed.entry(p.to_string()).or_insert(0) += 1;
                }
            } else {
                let at = since + after;
                soonest = Some(soonest.map_or(at, |s: Ms| s.min(at)));
            }
        }
        // Karpenter consolidates while pods wait too: its scheduling simulation places the
        // pending pods with the candidates' (`SimulateScheduling`), and only the candidates' pods
        // must all get a place (`AllNonPendingPodsScheduled`).
        self.consolidate_underutilized(world, &snapshot, &pending, &removed, emptied, &mut soonest);
        if waiting {
            self.next = Some(now + 10 * SECOND);
        }
        if !self.replacing.is_empty() {
            soonest = Some(soonest.map_or(now + 5 * SECOND, |s| s.min(now + 5 * SECOND)));
        }
        if let Some(s) = soonest {
            self.next = Some(self.next.map_or(s, |n| n.min(s)));
        }
    }
}

impl KarpenterLike {
    /// Karpenter's drift: a node launched before its NodePool's template last changed is
    /// replaced, within the pool's disruption budget for `Drifted` (its default, `10%` of the
    /// pool's nodes rounded up, when the pool writes none): an empty one is deleted at once;
    /// otherwise a node of the same offering is launched, the old one tainted
    /// `karpenter.sh/disrupted` and drained once the new one is initialised (as a consolidation's
    /// replacement, [`Self::advance_replacements`]).
    fn replace_drifted(&mut self, world: &mut World) {
        let drifted = world.drifted_nodes();
        if drifted.is_empty() {
            return;
        }
        let now = world.now;
        let snapshot = world.snapshot();
        for (node, pool) in drifted {
            if self.replacing.iter().any(|r| r.old == node) {
                continue;
            }
            let size = pool_nodes(&snapshot, &pool).max(0) as usize;
            let busy = self
                .replacing
                .iter()
                .filter(|r| r.pool == pool && r.drained.is_none())
                .count();
            let left = self.policy.pool(&pool).and_then(|p| {
                plan::disrupt::budget_left(
                    p,
                    gpu_node_autoscaler_core::policy::Reason::Drifted,
                    size,
                    busy,
                    Time(now),
                )
            });
            if left == Some(0) {
                continue;
            }
            let busy_pods = snapshot
                .pods
                .iter()
                .any(|p| p.node_name.as_deref() == Some(node.as_str()) && !p.is_daemonset());
            world.set_taint(&node, &disrupted_taint(), true);
            if !busy_pods {
                let _ = world.drain_and_remove(&node);
                continue;
            }
            let Some(offering) = world
                .live_nodes()
                .find(|n| n.node.name == node)
                .map(|n| n.offering.clone())
            else {
                continue;
            };
            self.launches += 1;
            let req = LaunchRequest {
                launch_id: format!("karpenter-{}", self.launches),
                pool: pool.clone(),
                count: 1,
                reservations: world.reservations_for(&pool, std::slice::from_ref(&offering)),
                offerings: vec![offering],
                tags: BTreeMap::new(),
                atomic: false,
            };
            let launched = world
                .launch(&req)
                .ok()
                .and_then(|r| r.launched.first().map(|i| i.id.clone()));
            match launched {
                Some(instance) => self.replacing.push(Replacement {
                    old: node.clone(),
                    pool: pool.clone(),
                    instance,
                    launched: now,
                    drained: None,
                }),
                None => world.set_taint(&node, &disrupted_taint(), false),
            }
        }
    }

    /// Replacements under way: once the new node advertises its GPUs (initialised), the old
    /// node is drained and deleted; a replacement whose instance is gone or that has not come in
    /// `REPLACEMENT_TTL` is given up and the old node untainted. Returns the new nodes, which
    /// are not taken for empty while the old node's pods move to them.
    fn advance_replacements(&mut self, world: &mut World) -> std::collections::BTreeSet<String> {
        let now = world.now;
        let listed: std::collections::BTreeSet<String> =
            world.instances().iter().map(|i| i.id.clone()).collect();
        let mut new_nodes = std::collections::BTreeSet::new();
        let mut keep = Vec::new();
        for mut r in std::mem::take(&mut self.replacing) {
            if let Some(at) = r.drained {
                if now - at < MINUTE {
                    if let Some(n) = world.node_of_instance(&r.instance) {
                        new_nodes.insert(n.to_string());
                    }
                    keep.push(r);
                }
                continue;
            }
            let node = world.node_of_instance(&r.instance).map(str::to_string);
            let ready = node.as_deref().is_some_and(|name| {
                world
                    .live_nodes()
                    .any(|n| n.node.name == name && n.node.advertised_gpus() > 0)
            });
            if ready {
                let _ = world.drain_and_remove(&r.old);
                self.stable_since.remove(&r.old);
                r.drained = Some(now);
                new_nodes.extend(node);
                keep.push(r);
            } else if !listed.contains(&r.instance) || now - r.launched > REPLACEMENT_TTL {
                // Given up: the old node keeps its pods, the new instance (a node that never
                // advertised its GPUs, or none) goes.
                world.set_taint(&r.old, &disrupted_taint(), false);
                if listed.contains(&r.instance) {
                    let _ = world.terminate_instance(&r.instance);
                }
            } else {
                new_nodes.extend(node);
                keep.push(r);
            }
        }
        self.replacing = keep;
        new_nodes
    }

    /// Karpenter v1's single-node consolidation, its replace half: a node whose pods do not
    /// all fit on the other nodes is replaced by one cheaper node that takes the pods that do
    /// not (the new node launched first; the old one tainted `karpenter.sh/disrupted` and
    /// drained once the new one is initialised). A spot node is never replaced (spot-to-spot
    /// consolidation is behind the `SpotToSpotConsolidation` feature gate, off by default); an
    /// on-demand node may be replaced by spot or on-demand, the cheapest first, every offering
    /// of its NodePool cheaper than the node. One replacement at a time.
    fn replace_one(
        &mut self,
        world: &mut World,
        templates: &[Template],
        n: &gpu_node_autoscaler_core::model::Node,
        leftover: &[Pod],
    ) -> bool {
        if !self.replacing.iter().all(|r| r.drained.is_some()) {
            return false;
        }
        if n.capacity_type() == "spot" {
            return false;
        }
        let price =
            plan::scale_down::price_of(n, template_of_node(n, templates).map(|i| &templates[i]));
        let pool = n.pool().unwrap_or_default();
        let leftover: Vec<&Pod> = leftover.iter().collect();
        let mut offers: Vec<(f64, OfferingKey)> = Vec::new();
        for t in templates.iter().filter(|t| t.pool_name == pool) {
            for (oi, o) in t.offerings.iter().enumerate() {
                if o.price < price
                    && !self.ice.contains_key(&o.key)
                    && fits_offering(t, oi, &leftover)
                {
                    offers.push((o.price, o.key.clone()));
                }
            }
        }
        if offers.is_empty() {
            return false;
        }
        offers.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        self.launches += 1;
        let offerings: Vec<OfferingKey> = offers.into_iter().map(|o| o.1).collect();
        let req = LaunchRequest {
            launch_id: format!("karpenter-{}", self.launches),
            pool: pool.to_string(),
            count: 1,
            reservations: world.reservations_for(pool, &offerings),
            offerings,
            tags: BTreeMap::new(),
            atomic: false,
        };
        let Ok(res) = world.launch(&req) else {
            return false;
        };
        for (k, _) in &res.failures {
            self.ice.insert(k.clone(), world.now + 3 * MINUTE);
        }
        let Some(inst) = res.launched.first() else {
            return false;
        };
        world.set_taint(&n.name, &disrupted_taint(), true);
        self.replacing.push(Replacement {
            old: n.name.clone(),
            pool: pool.to_string(),
            instance: inst.id.clone(),
            launched: world.now,
            drained: None,
        });
        true
    }

    /// Karpenter v1's default `WhenEmptyOrUnderutilized` consolidation, its delete half: a node
    /// whose pods have not changed for 30 s and all fit on the other nodes is drained and deleted
    /// (cheapest to disrupt first: fewest pods); at most 10 % of a pool's nodes (rounded up, its
    /// default disruption budget) at once, empty nodes removed in this pass included; not while
    /// GPU pods wait. A node whose pods do not all fit elsewhere may be replaced by a cheaper
    /// one instead (`replace_one`). Multi-node consolidation (several nodes into one new node)
    /// is not modelled.
    fn consolidate_underutilized(
        &mut self,
        world: &mut World,
        snapshot: &Snapshot,
        pending: &[&Pod],
        removed: &BTreeMap<String, i64>,
        mut gone: std::collections::BTreeSet<String>,
        soonest: &mut Option<Ms>,
    ) {
        let now = world.now;
        let mut pods_on: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
        for p in &snapshot.pods {
            if let (true, Some(n)) = (p.is_bound_active() && !p.is_daemonset(), &p.node_name) {
                pods_on.entry(n.as_str()).or_default().push(p);
            }
        }
        // Since when each node's pods are what they are now.
        let mut live: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        let mut candidates: Vec<(usize, &gpu_node_autoscaler_core::model::Node, usize)> =
            Vec::new();
        for (ni, n) in snapshot.nodes.iter().enumerate() {
            let Some(pods) = pods_on.get(n.name.as_str()) else {
                continue;
            };
            live.insert(n.name.clone());
            let mut ids: Vec<String> = pods.iter().map(|p| p.id.to_string()).collect();
            ids.sort();
            let e = self
                .stable_since
                .entry(n.name.clone())
                .or_insert((ids.clone(), now));
            if e.0 != ids {
                *e = (ids, now);
            }
            let after = consolidate_after(n.pool().and_then(|p| self.policy.pool(p)));
            if now - e.1 < after {
                let at = e.1 + after;
                *soonest = Some(soonest.map_or(at, |s: Ms| s.min(at)));
                continue;
            }
            let protected = n
                .annotations
                .get(gpu_node_autoscaler_core::model::labels::KARPENTER_DO_NOT_DISRUPT)
                .is_some_and(|v| v == "true")
                || pods.iter().any(|p| {
                    p.annotations
                        .get(gpu_node_autoscaler_core::model::labels::KARPENTER_DO_NOT_DISRUPT)
                        .is_some_and(|v| v == "true")
                });
            if n.is_schedulable() && n.advertised_gpus() > 0 && n.pool().is_some() && !protected {
                candidates.push((pods.len(), n, ni));
            }
        }
        self.stable_since.retain(|k, _| live.contains(k));
        if candidates.is_empty() {
            return;
        }
        // Karpenter takes the cluster for consolidated until it changes, or for 5 minutes at
        // most (its cluster state's consolidation timeout): then it looks again, so that a
        // replacement that could not launch (spot short) is tried again.
        let again = now + 5 * MINUTE;
        *soonest = Some(soonest.map_or(again, |s: Ms| s.min(again)));
        candidates.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.name.cmp(&b.1.name)));
        let templates = world.templates().to_vec();
        let mut rooms = rooms(snapshot, &templates, &self.devices);
        // The pending pods that fit a node take its room first.
        for p in pending {
            let _ = rooms.iter_mut().any(|r| r.take(p));
        }
        let mut disrupted: BTreeMap<String, i64> = removed.clone();
        for r in self.replacing.iter().filter(|r| r.drained.is_none()) {
            *disrupted.entry(r.pool.clone()).or_default() += 1;
            gone.insert(r.old.clone());
        }
        // Each pool's size ([`pool_nodes`]), counted once: the snapshot does not change here.
        let mut sizes: BTreeMap<String, i64> = BTreeMap::new();
        // Per room: whether it is a registered node that stays (not among the nodes gone); a
        // candidate taken away below is marked as it goes.
        let mut stays: Vec<bool> = rooms
            .iter()
            .map(|r| r.node.is_some() && r.name.as_ref().is_some_and(|x| !gone.contains(x)))
            .collect();
        let room_of: BTreeMap<usize, usize> = rooms
            .iter()
            .enumerate()
            .filter_map(|(ri, r)| r.node.map(|ni| (ni, ri)))
            .collect();
        for (_, n, ni) in candidates {
            if gone.contains(&n.name) {
                continue;
            }
            let pool = n.pool().unwrap_or_default().to_string();
            let size = *sizes
                .entry(pool.clone())
                .or_insert_with(|| pool_nodes(snapshot, &pool));
            let budget = (size as f64 * 0.1).ceil() as i64;
            if disrupted.get(&pool).copied().unwrap_or(0) >= budget {
                continue;
            }
            let mut pods = pods_on[n.name.as_str()].clone();
            pods.sort_by(|a, b| {
                b.gpu_equivalents()
                    .total_cmp(&a.gpu_equivalents())
                    .then(a.id.cmp(&b.id))
            });
            // The pods try the room of the other registered nodes that stay; a room they take
            // is kept as it was before, to be put back if the node stays.
            let others: Vec<bool> = rooms
                .iter()
                .zip(&stays)
                .map(|(r, &stays)| stays && r.node != Some(ni))
                .collect();
            let mut before: Vec<(usize, Room)> = Vec::new();
            let leftover: Vec<Pod> = pods
                .iter()
                .filter(|p| {
                    !rooms.iter_mut().enumerate().any(|(i, r)| {
                        if !others[i]
                            || !p.fits(&r.free, &r.shared, &r.labels, &r.taints, r.name.as_deref())
                        {
                            return false;
                        }
                        let was = r.clone();
                        let took = r.take(p);
                        if took {
                            before.push((i, was));
                        }
                        took
                    })
                })
                .map(|p| (*p).clone())
                .collect();
            if !leftover.is_empty() {
                if self.replace_one(world, &templates, n, &leftover) {
                    gone.insert(n.name.clone());
                    if let Some(&ri) = room_of.get(&ni) {
                        stays[ri] = false;
                    }
                    *disrupted.entry(pool).or_default() += 1;
                } else {
                    for (i, was) in before.into_iter().rev() {
                        rooms[i] = was;
                    }
                }
                continue;
            }
            gone.insert(n.name.clone());
            if let Some(&ri) = room_of.get(&ni) {
                stays[ri] = false;
            }
            *disrupted.entry(pool).or_default() += 1;
            let _ = world.drain_and_remove(&n.name);
            self.stable_since.remove(&n.name);
        }
    }
}

#[cfg(test)]
mod tests;
