//! The discrete-event engine: virtual clock, cluster model, scheduler, accounting.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::Arc;

use gpu_node_autoscaler_memory::{CapacityWindow, MemoryProvider};
use gpu_node_autoscaler_provider::rng::Rng;
use gpu_node_autoscaler_provider::{
    Instance, InstanceState, InstanceType, LaunchRequest, LaunchResult, Notice, NoticeKind,
    OfferingKey, ProviderError,
};

use gpu_node_autoscaler_core::model::constraints::{Effect, Taint};
use gpu_node_autoscaler_core::model::dra::{Allocation, Claim, Device, DraObjects, Slice};
use gpu_node_autoscaler_core::model::labels;
use gpu_node_autoscaler_core::model::node::GpuXid;
use gpu_node_autoscaler_core::model::resources::{place_share, Resources, SharedGpu};
use gpu_node_autoscaler_core::model::snapshot::group_in_flight;
use gpu_node_autoscaler_core::model::topology::{Profile, Site, TopologyIndex};
use gpu_node_autoscaler_core::model::{Node, Pod, PodPhase, Snapshot, Time};
use gpu_node_autoscaler_core::plan::templates::{build_templates, Template};
use gpu_node_autoscaler_core::policy::defaults::HEALTH_CONDITION as HARDWARE_CONDITION;
use gpu_node_autoscaler_core::policy::Policy;

mod volumes;

use super::claims::{gpu_equivalent, Allocated, DeviceMatcher};
use super::report::{Metrics, SeriesPoint};
use super::{CloudEvent, Ms, SimInput, HOUR};

/// A decision-maker under test.
pub trait Strategy {
    fn name(&self) -> &'static str;
    /// New pods became unschedulable at `now` (after a scheduling pass).
    fn pods_unschedulable(&mut self, now: Ms);
    /// Pods finished or were deleted, nodes came or went: what a watch would notice.
    fn cluster_changed(&mut self, now: Ms);
    /// When it wants to run next; `None` when only new unschedulable pods should wake it.
    fn next_run(&self) -> Option<Ms>;
    /// Decide and act through `world`.
    fn run(&mut self, world: &mut World);
    /// Whether it answers ProvisioningRequests: if not, Kueue (with no such admission check)
    /// admits a queued job on quota as soon as it is submitted.
    fn serves_provisioning_requests(&self) -> bool {
        false
    }
}

/// A job queued by Kueue (see [`super::KueueJob`]).
struct Workload {
    name: String,
    pods: Vec<usize>,
    /// When its pods arrived (it was submitted).
    submitted: Option<Ms>,
    admitted: bool,
    /// Given up on (Kueue deactivated it): its pods are never created.
    deactivated: bool,
}

/// A job Kueue holds for admission, as a strategy sees it.
pub struct Waiting<'a> {
    /// Its index (for [`World::admit`]).
    pub index: usize,
    pub name: &'a str,
    pub submitted: Ms,
    /// Its pods as they will be created.
    pub pods: Vec<&'a Pod>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrive(usize),
    /// Pod finished (valid only for the pod's current `epoch`).
    Finish(usize, u32),
    Delete(usize),
    Register(String),
    Advertise(String),
    /// When the pod would start and end had it started on arrival: they keep the run going
    /// until the last of those (the lower bound's span).
    IdealStart(usize),
    IdealEnd(usize),
    Cloud(usize),
    SpotGone(String),
    /// A capacity reservation ends: the cloud takes its instances back.
    ReservationEnd(String),
    /// Something time-based changed (a capacity window ended): schedule again.
    Wake,
}

struct PodState {
    pod: Pod,
    arrival: Ms,
    remaining: Option<Ms>,
    arrived: bool,
    bound_at: Option<Ms>,
    node: Option<usize>,
    first_bound: Option<Ms>,
    done: bool,
    epoch: u32,
    gpu_eq: f64,
    /// Since when the pod's work is disrupted (an interruption notice for its node, a broken
    /// GPU), until it runs again.
    disrupted_since: Option<Ms>,
    /// On a node whose GPU broke: bound, but making no progress (its remaining time stands).
    stalled: bool,
    /// The devices its claims hold on its node.
    allocated: Allocated,
    /// Evicted by a drift or expiry replacement at: pending until it runs again.
    evicted_at: Option<Ms>,
}

/// A node of the simulated cluster (registered instance).
pub struct SimNode {
    pub node: Node,
    pub instance_id: String,
    pub pool: String,
    pub offering: OfferingKey,
    /// Full allocatable (GPUs included) once the device plugin runs.
    full: Resources,
    full_shared: Vec<SharedGpu>,
    free: Resources,
    free_shared: Vec<SharedGpu>,
    pub advertised: bool,
    pub removed: bool,
    pods: Vec<usize>,
    /// A GPU of the node broke (the XID it reported), and when.
    pub broken: Option<(u32, Ms)>,
    /// Since when the node, its GPUs advertised, has held no pod but DaemonSet pods.
    empty_since: Option<Ms>,
    gpus: f64,
    /// The devices its DRA driver publishes once it runs (a pool with `dra:`), and which of them
    /// claims hold.
    devices: Arc<Vec<Device>>,
    taken: Vec<bool>,
}

struct LiveInstance {
    pool: String,
    launch_id: String,
    offering: OfferingKey,
    launched: Ms,
    price: f64,
    gpus: f64,
    node: Option<usize>,
    gone: bool,
    /// When its node advertised its GPUs.
    advertised_at: Option<Ms>,
    /// Its pool's template version when it was launched (see [`CloudEvent::Drift`]).
    version: u32,
    /// The capacity reservation it runs in.
    reservation: Option<String>,
}

/// The simulated world a strategy acts on.
pub struct World {
    pub now: Ms,
    pub policy: Policy,
    pub provider: MemoryProvider,
    templates: Vec<Template>,
    instance_types: BTreeMap<String, InstanceType>,
    pods: Vec<PodState>,
    /// Arrived and not done; and of those, the unbound ones.
    active: std::collections::BTreeSet<usize>,
    pending: std::collections::BTreeSet<usize>,
    done: usize,
    pub nodes: Vec<SimNode>,
    /// Nodes not removed; of those, the ones whose free capacity grew since the last pass.
    live_nodes: std::collections::BTreeSet<usize>,
    grown: std::collections::BTreeSet<usize>,
    /// Pods that became pending since the last scheduling pass.
    fresh: std::collections::BTreeSet<usize>,
    node_by_name: BTreeMap<String, usize>,
    /// Pod UID → index in `pods`.
    pod_by_uid: HashMap<String, usize>,
    instances: BTreeMap<String, LiveInstance>,
    /// Instances launched and not registered (nor gone) yet.
    booting: std::collections::BTreeSet<String>,
    events: BinaryHeap<Reverse<(Ms, u64, Event)>>,
    cloud_events: Vec<CloudEvent>,
    seq: u64,
    rng: Rng,
    timing: super::ClusterTiming,
    /// Set when capacity or the pending set changed since the last scheduling pass.
    dirty: bool,
    /// The cloud's listing as last built (`None` once an instance came or went).
    listing: Option<Arc<Vec<Instance>>>,
    /// Set when something a controller watches changed (for `Strategy::cluster_changed`).
    changed: bool,
    pub metrics: Metrics,
    /// Interruption notices not taken by the strategy yet (what an EventBridge queue holds).
    notices: Vec<Notice>,
    /// Per (pool, instance type, capacity type): instances, USD, GPU-hours billed so far.
    cost_lines: BTreeMap<(String, String, String), (usize, f64, f64)>,
    live_price: f64,
    live_gpus: f64,
    running_gpus: f64,
    last_series: Ms,
    /// DeviceClasses, the pods' claim templates, the claims allocated and the ResourceSlices
    /// published, as the API server holds them.
    dra: DraObjects,
    matcher: RefCell<DeviceMatcher>,
    /// Some pod has rules across nodes (host ports, pod affinity, spread): the scheduler keeps
    /// a topology index while it binds.
    topology: bool,
    /// Per pool, its template version: bumped by each drift event.
    pool_versions: BTreeMap<String, u32>,
    /// Bumped whenever the policy changes (a drift event changes a pool's provider settings).
    policy_version: u64,
    /// Drift or expiry can happen in this run: their replacements are measured.
    lifecycle: bool,
    /// The account has capacity reservations: the snapshot carries them.
    reservations: bool,
    /// Jobs Kueue queues, and for each pod the workload it belongs to.
    workloads: Vec<Workload>,
    workload_of: HashMap<usize, usize>,
    /// Kueue admits on submission (the strategy answers no ProvisioningRequest).
    admit_on_arrival: bool,
    /// A job was submitted since the strategy last looked.
    submitted: bool,
    /// $/hour of the capacity the strategy holds for CapacityBuffers (set by the strategy).
    buffer_rate: f64,
    /// The account's Auto Scaling groups: a launch for a pool they back grows them.
    pub groups: crate::groups::Groups,
    /// The PersistentVolumeClaims, PersistentVolumes and StorageClasses as the API server holds
    /// them: the scenario's, and the volumes provisioned since ([`volumes`]).
    storage: gpu_node_autoscaler_core::model::volumes::Storage,
    /// The pods that have volumes (joined with `storage` again when a claim is bound).
    volume_pods: Vec<usize>,
    /// Each binding of a pod with volumes: the pod and its node's zone.
    pub(crate) volume_binds: Vec<(usize, Option<String>)>,
}

impl World {
    pub(crate) fn new(input: &SimInput) -> World {
        let provider = MemoryProvider::new(
            input.catalog.clone(),
            &input.policy.cluster_name,
            input.seed,
        );
        let (templates, _) =
            build_templates(&input.policy, &input.catalog, &Snapshot::default(), Time(0));
        let pods: Vec<PodState> = input
            .pods
            .iter()
            .map(|w| PodState {
                gpu_eq: w.pod.gpu_equivalents(),
                pod: w.pod.clone(),
                arrival: w.arrival,
                remaining: w.duration,
                arrived: false,
                bound_at: None,
                node: None,
                first_bound: None,
                done: false,
                epoch: 0,
                disrupted_since: None,
                stalled: false,
                allocated: Vec::new(),
                evicted_at: None,
            })
            .collect();
        let mut dra = DraObjects {
            classes: input.device_classes.clone(),
            ..DraObjects::default()
        };
        for c in input.pods.iter().flat_map(|w| &w.pod.claims) {
            if let Some(t) = &c.template {
                dra.templates.insert(t.clone(), c.spec.clone());
            }
        }
        let mut w = World {
            now: 0,
            policy: input.policy.clone(),
            provider,
            instance_types: input
                .catalog
                .instance_types
                .iter()
                .map(|t| (t.name.clone(), t.clone()))
                .collect(),
            templates,
            pods,
            active: Default::default(),
            pending: Default::default(),
            done: 0,
            nodes: Vec::new(),
            live_nodes: Default::default(),
            grown: Default::default(),
            fresh: Default::default(),
            node_by_name: BTreeMap::new(),
            pod_by_uid: input
                .pods
                .iter()
                .enumerate()
                .map(|(i, w)| (w.pod.uid.clone(), i))
                .collect(),
            instances: BTreeMap::new(),
            booting: Default::default(),
            events: BinaryHeap::new(),
            cloud_events: input.events.clone(),
            seq: 0,
            rng: Rng::new(input.seed),
            timing: input.timing.clone(),
            dirty: false,
            listing: None,
            changed: false,
            metrics: Metrics::default(),
            notices: Vec::new(),
            cost_lines: BTreeMap::new(),
            live_price: 0.0,
            live_gpus: 0.0,
            running_gpus: 0.0,
            last_series: i64::MIN,
            matcher: RefCell::new(DeviceMatcher::new(input.device_classes.clone())),
            dra,
            topology: input
                .pods
                .iter()
                .any(|w| w.pod.constraints.topology.is_some()),
            pool_versions: BTreeMap::new(),
            policy_version: 0,
            lifecycle: input
                .events
                .iter()
                .any(|e| matches!(e, CloudEvent::Drift { .. }))
                || input
                    .policy
                    .pools
                    .iter()
                    .any(|p| p.disruption.expire_after.is_some()),
            reservations: !input.reservations.is_empty(),
            workloads: input
                .kueue_jobs
                .iter()
                .map(|j| Workload {
                    name: j.name.clone(),
                    pods: j.pods.clone(),
                    submitted: None,
                    admitted: false,
                    deactivated: false,
                })
                .collect(),
            workload_of: input
                .kueue_jobs
                .iter()
                .enumerate()
                .flat_map(|(wi, j)| j.pods.iter().map(move |&p| (p, wi)))
                .collect(),
            admit_on_arrival: true,
            submitted: false,
            buffer_rate: 0.0,
            groups: input.groups.clone(),
            storage: input.storage.clone(),
            volume_pods: input
                .pods
                .iter()
                .enumerate()
                .filter(|(_, p)| !p.pod.volumes.is_empty())
                .map(|(i, _)| i)
                .collect(),
            volume_binds: Vec::new(),
        };
        w.join_volumes();
        w.start_groups();
        for r in &input.reservations {
            w.provider.add_reservation(r.clone());
            if let Some(start) = r.start_ms {
                w.push(start, Event::Wake);
            }
            if let Some(end) = r.end_ms {
                w.push(end, Event::ReservationEnd(r.id.clone()));
            }
        }
        for (i, p) in input.pods.iter().enumerate() {
            w.push(p.arrival, Event::Arrive(i));
            w.push(p.arrival, Event::IdealStart(i));
            let ideal_end = match (p.duration, p.deleted_at) {
                (Some(d), Some(del)) => Some((p.arrival + d).min(del)),
                (Some(d), None) => Some(p.arrival + d),
                (None, del) => del,
            };
            if let Some(e) = ideal_end {
                w.push(e, Event::IdealEnd(i));
            }
            if let Some(d) = p.deleted_at {
                w.push(d, Event::Delete(i));
            }
        }
        for (i, e) in input.events.iter().enumerate() {
            let at = match e {
                CloudEvent::InsufficientCapacity { at, .. }
                | CloudEvent::SpotInterruption { at, .. }
                | CloudEvent::GpuFailure { at, .. }
                | CloudEvent::Quota { at, .. }
                | CloudEvent::Drift { at, .. } => *at,
            };
            w.push(at, Event::Cloud(i));
        }
        w.metrics.pods_total = input.pods.len();
        w
    }

    fn push(&mut self, at: Ms, e: Event) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, e)));
    }

    fn next_event_time(&self) -> Option<Ms> {
        self.events.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Moves the clock to `t`, integrating cost and GPU-hours.
    fn advance(&mut self, t: Ms) {
        if t <= self.now {
            return;
        }
        let h = (t - self.now) as f64 / HOUR as f64;
        self.metrics.cost_usd += self.live_price * h;
        self.metrics.gpu_hours_provisioned += self.live_gpus * h;
        self.metrics.gpu_hours_requested += self.running_gpus * h;
        self.metrics.buffer_cost_usd += self.buffer_rate * h;
        self.now = t;
        self.provider.set_now(t);
    }

    fn record_series(&mut self, force: bool) {
        if !force && self.now.saturating_sub(self.last_series) < super::MINUTE {
            return;
        }
        self.last_series = self.now;
        let pending = self.pending.len() as u32;
        self.metrics.series.push(SeriesPoint {
            t_s: self.now as f64 / 1000.0,
            gpus_provisioned: self.live_gpus,
            gpus_requested: self.running_gpus,
            pending_pods: pending,
            cost_usd: self.metrics.cost_usd,
        });
    }

    // ---- the view strategies plan from ----

    /// The cluster as the API server and the cloud would show it now.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot::default();
        s.pods.reserve(self.active.len());
        s.nodes.reserve(self.live_nodes.len());
        for &i in &self.active {
            s.pods.push(self.pods[i].pod.clone());
        }
        for &n in &self.live_nodes {
            s.nodes.push(self.nodes[n].node.clone());
        }
        // What the watches of ResourceClaims, templates, DeviceClasses and ResourceSlices hold,
        // joined with the pods (skipped while there is nothing to join).
        if !(self.dra.templates.is_empty() && self.dra.slices.is_empty()) {
            s.dra = self.dra.join(&mut s.pods);
            s.count_published_devices();
        }
        if self.reservations {
            s.reservations = self.provider.reservations_now();
        }
        s.in_flight = group_in_flight(
            self.booting
                .iter()
                .filter_map(|id| self.instances.get(id))
                .map(|i| {
                    (
                        i.launch_id.as_str(),
                        i.pool.as_str(),
                        &i.offering,
                        Time(i.launched),
                    )
                }),
        );
        s
    }

    /// The jobs Kueue holds: submitted, not admitted, not given up on.
    pub fn waiting_jobs(&self) -> Vec<Waiting<'_>> {
        self.workloads
            .iter()
            .enumerate()
            .filter(|(_, w)| !w.admitted && !w.deactivated)
            .filter_map(|(index, w)| {
                Some(Waiting {
                    index,
                    name: &w.name,
                    submitted: w.submitted?,
                    pods: w.pods.iter().map(|&p| &self.pods[p].pod).collect(),
                })
            })
            .collect()
    }

    /// Whether a Kueue job has pods not done yet (admitted and running or pending).
    pub fn job_running(&self, index: usize) -> bool {
        let w = &self.workloads[index];
        w.admitted && w.pods.iter().any(|&p| !self.pods[p].done)
    }

    /// Kueue admits job `index`: its pods are created now, marked as consuming `request` (the
    /// ProvisioningRequest whose capacity they take, as Kueue annotates them).
    pub fn admit(&mut self, index: usize, request: Option<&str>) {
        let w = &mut self.workloads[index];
        if w.admitted || w.submitted.is_none() {
            return;
        }
        w.admitted = true;
        for p in w.pods.clone() {
            let st = &mut self.pods[p];
            st.pod.created = Time(self.now);
            if let Some(r) = request {
                let mut a = (*st.pod.annotations).clone();
                a.insert(
                    gpu_node_autoscaler_core::provisioning::CONSUME_ANNOTATION.to_string(),
                    r.to_string(),
                );
                st.pod.annotations = Arc::new(a);
            }
            self.active.insert(p);
            self.pending.insert(p);
            self.fresh.insert(p);
        }
        self.dirty = true;
        self.changed = true;
    }

    /// Kueue gives up on job `index` (its admission check was retried to its limit): its pods
    /// are never created.
    pub fn deactivate(&mut self, index: usize) {
        self.workloads[index].deactivated = true;
        for p in self.workloads[index].pods.clone() {
            self.mark_done(p);
        }
    }

    /// The $/hour the capacity held for CapacityBuffers costs from now on (added up as
    /// `buffer_cost_usd`).
    pub fn set_buffer_rate(&mut self, per_hour: f64) {
        self.buffer_rate = per_hour;
    }

    pub fn templates(&self) -> &[Template] {
        &self.templates
    }

    /// Launches through the cloud; launched instances register after their boot delay.
    /// The account's reservations a launch of `pool` may name for the reserved ones of
    /// `offerings`: those the pool selects, with room now (a Capacity Block up to its end: the
    /// drain lead before it is the decision core's rule, not the baselines'), in the order the
    /// cloud lists them.
    pub fn reservations_for(
        &self,
        pool: &str,
        offerings: &[OfferingKey],
    ) -> Vec<gpu_node_autoscaler_provider::Reservation> {
        let Some(pool) = self.policy.pools.iter().find(|p| p.name == pool) else {
            return Vec::new();
        };
        self.provider
            .reservations_now()
            .into_iter()
            .filter(|r| {
                r.available > 0
                    && offerings.iter().any(|o| {
                        o.capacity_type == gpu_node_autoscaler_provider::CapacityType::Reserved
                            && r.offering() == *o
                    })
                    && pool.selects_reservation(r)
            })
            .collect()
    }

    pub fn launch(&mut self, req: &LaunchRequest) -> Result<LaunchResult, ProviderError> {
        let res = if self.groups.backs(&req.pool) {
            self.groups.launch(&self.provider, req)?
        } else {
            self.provider.launch_now(req)?
        };
        self.launched(&res, true);
        Ok(res)
    }

    /// The instances the groups backing pools run at the start (their desired capacity), as
    /// their own launches (no launch of a strategy's): each of its first instance type, in its
    /// first zone.
    fn start_groups(&mut self) {
        let pools: Vec<(String, Vec<usize>)> = self
            .groups
            .pools
            .iter()
            .map(|(p, g)| (p.clone(), g.clone()))
            .collect();
        for (pool, idx) in pools {
            for gi in idx {
                let g = &self.groups.groups[gi];
                let (Some(t), Some(z)) = (g.instance_types.first(), g.zones.first()) else {
                    continue;
                };
                if g.desired == 0 {
                    continue;
                }
                let req = LaunchRequest {
                    launch_id: format!("group/{}", g.name),
                    pool: pool.clone(),
                    count: g.desired,
                    offerings: vec![OfferingKey {
                        instance_type: t.clone(),
                        zone: z.clone(),
                        capacity_type: g.capacity_type,
                    }],
                    tags: BTreeMap::new(),
                    reservations: Vec::new(),
                    atomic: false,
                };
                let Ok(mut res) = self.provider.launch_now(&req) else {
                    continue;
                };
                for inst in &mut res.launched {
                    // Not launched by us: no launch id of ours.
                    inst.launch_id = String::new();
                    self.groups.join(gi, inst);
                }
                // What did not launch is not there: the group's size is what runs.
                self.groups.groups[gi].desired = res.launched.len() as u32;
                self.launched(&res, false);
            }
        }
    }

    /// Launched instances register after their boot delay; `scale_up`: a strategy's launch (a
    /// scale-up counted), not a group's own.
    fn launched(&mut self, res: &LaunchResult, scale_up: bool) {
        for inst in &res.launched {
            if self.instances.contains_key(&inst.id) {
                continue;
            }
            let gpus = self
                .instance_types
                .get(&inst.offering.instance_type)
                .and_then(|t| t.gpu.as_ref())
                .map_or(0.0, |g| g.count as f64);
            // The price the planner used (pool overrides included), else the cloud's.
            let price = self
                .templates
                .iter()
                .filter(|t| t.pool_name == inst.pool)
                .flat_map(|t| &t.offerings)
                .find(|o| o.key == inst.offering)
                .map(|o| o.price)
                .or_else(|| self.provider.price(&inst.offering))
                .unwrap_or(0.0);
            self.live_price += price;
            self.live_gpus += gpus;
            self.metrics.nodes_launched += 1;
            self.instances.insert(
                inst.id.clone(),
                LiveInstance {
                    pool: inst.pool.clone(),
                    launch_id: inst.launch_id.clone(),
                    offering: inst.offering.clone(),
                    launched: self.now,
                    price,
                    gpus,
                    node: None,
                    gone: false,
                    advertised_at: None,
                    version: self.pool_versions.get(&inst.pool).copied().unwrap_or(0),
                    reservation: inst.reservation_id.clone(),
                },
            );
            let span = (self.timing.boot_max - self.timing.boot_min).max(0) as u64;
            let boot = self.timing.boot_min + self.rng.below(span + 1) as Ms;
            self.booting.insert(inst.id.clone());
            self.listing = None;
            self.push(self.now + boot, Event::Register(inst.id.clone()));
        }
        if scale_up && !res.launched.is_empty() {
            self.metrics.scale_ups += 1;
        }
    }

    /// Nominates a pending pod to a node (`status.nominatedNodeName`): the scheduler tries that
    /// node first for it, and keeps its room there while placing pods of no higher priority. It
    /// is dropped when the pod is bound, and, as kube-scheduler does, when the pod is tried and
    /// fits nowhere.
    pub fn nominate(&mut self, uid: &str, node: &str) {
        let Some(&i) = self.pod_by_uid.get(uid) else {
            return;
        };
        if self.pending.contains(&i) && self.node_by_name.contains_key(node) {
            self.drop_nomination(i);
            self.pods[i].pod.nominated_node = Some(node.to_string());
        }
    }

    /// Sets or clears an annotation on a node.
    pub fn annotate(&mut self, node: &str, key: &str, value: Option<&str>) {
        if let Some(&i) = self.node_by_name.get(node) {
            match value {
                Some(v) => {
                    Arc::make_mut(&mut self.nodes[i].node.annotations).insert(key.into(), v.into())
                }
                None => Arc::make_mut(&mut self.nodes[i].node.annotations).remove(key),
            };
        }
    }

    /// Drains a node (taint, cordon, evict every pod but DaemonSet pods) and terminates it.
    /// Evicted pods go back to Pending and keep their remaining run time.
    /// `Err` with why when the node's instance may not leave its Auto Scaling group (its group
    /// at its minimum size): then nothing is done.
    pub fn drain_and_remove(&mut self, node: &str) -> Result<(), String> {
        let Some(&ni) = self.node_by_name.get(node) else {
            return Ok(());
        };
        if self.nodes[ni].removed {
            return Ok(());
        }
        if let Some(why) = self.groups.refuse(&self.nodes[ni].instance_id) {
            return Err(why);
        }
        self.nodes[ni].node.taints.push(Taint {
            key: labels::TO_BE_DELETED_TAINT.into(),
            value: String::new(),
            effect: Effect::NoSchedule,
        });
        self.nodes[ni].node.unschedulable = true;
        let replaced = self.lifecycle && self.lifecycle_disrupted(ni);
        if replaced {
            self.metrics.lifecycle_replacements += 1;
        }
        let pods = self.nodes[ni].pods.clone();
        for p in pods {
            if !self.pods[p].pod.is_daemonset() {
                self.metrics.evictions += 1;
                self.unbind(p);
                if replaced {
                    self.pods[p].evicted_at = Some(self.now);
                }
            }
        }
        let id = self.nodes[ni].instance_id.clone();
        let _ = self.provider.terminate_now(&id);
        self.remove_node(ni);
        self.metrics.nodes_removed += 1;
        Ok(())
    }

    /// The interruption notices delivered since the last call (a strategy that reads an
    /// interruption queue takes them; one that does not leaves them).
    pub fn take_notices(&mut self) -> Vec<Notice> {
        std::mem::take(&mut self.notices)
    }

    /// The node of an instance, if it registered and is not removed.
    pub fn node_of_instance(&self, instance_id: &str) -> Option<&str> {
        self.instances
            .get(instance_id)
            .and_then(|i| i.node)
            .filter(|&ni| !self.nodes[ni].removed)
            .map(|ni| self.nodes[ni].node.name.as_str())
    }

    /// Terminates an instance that never became a usable node.
    /// `Err` with why when it may not leave its Auto Scaling group (its group at its minimum
    /// size).
    pub fn terminate_instance(&mut self, id: &str) -> Result<(), String> {
        if let Some(why) = self.groups.refuse(id) {
            return Err(why);
        }
        let _ = self.provider.terminate_now(id);
        if let Some(node) = self.instances.get(id).and_then(|i| i.node) {
            self.remove_node(node);
        } else {
            self.instance_gone(id);
        }
        Ok(())
    }

    /// The cloud's listing: every live instance (booting, or with a node). Kept between passes
    /// until an instance comes or goes, and built from the live sets, not every instance ever
    /// launched (a trace launches thousands).
    pub fn instances(&mut self) -> Arc<Vec<Instance>> {
        if let Some(l) = &self.listing {
            return l.clone();
        }
        let booting = self.booting.iter();
        let with_node = self.live_nodes.iter().map(|&n| &self.nodes[n].instance_id);
        let mut ids: Vec<&String> = booting.chain(with_node).collect();
        ids.sort_unstable();
        ids.dedup();
        let listing: Vec<Instance> = ids
            .into_iter()
            .filter_map(|id| self.instances.get(id).map(|i| (id, i)))
            .filter(|(_, i)| !i.gone)
            .map(|(id, i)| Instance {
                id: id.clone(),
                provider_id: format!("memory:///{}/{id}", i.offering.zone),
                pool: i.pool.clone(),
                launch_id: i.launch_id.clone(),
                offering: i.offering.clone(),
                state: InstanceState::Running,
                launched_at_ms: i.launched,
                reservation_id: i.reservation.clone(),
                launch_fingerprint: None,
                unclaimed: false,
            })
            .collect();
        let listing = Arc::new(listing);
        self.listing = Some(listing.clone());
        listing
    }

    /// Gives a node what registration adds (labels, annotations, taints) and takes its startup
    /// taints away.
    pub fn register_node(&mut self, r: &gpu_node_autoscaler_core::autoscaler::fleet::Registration) {
        let Some(&i) = self.node_by_name.get(&r.node) else {
            return;
        };
        let before = self.nodes[i].node.taints.clone();
        r.apply(&mut self.nodes[i].node);
        if self.nodes[i].node.taints != before {
            self.grown.insert(i);
            self.dirty = true;
        }
    }

    /// Removes a node (its instance is terminated separately).
    pub fn delete_node(&mut self, node: &str) {
        if let Some(&ni) = self.node_by_name.get(node) {
            if !self.nodes[ni].removed {
                self.remove_node(ni);
            }
        }
    }

    /// Gives a node back after a drain: untainted and schedulable again.
    /// Adds (`present`) or removes a taint of a node (matched by key and effect).
    pub fn set_taint(&mut self, node: &str, taint: &Taint, present: bool) {
        if let Some(&ni) = self.node_by_name.get(node) {
            let n = &mut self.nodes[ni].node;
            n.taints
                .retain(|t| !(t.key == taint.key && t.effect == taint.effect));
            if present {
                n.taints.push(taint.clone());
            } else {
                self.grown.insert(ni);
            }
            self.dirty = true;
            if self.lifecycle {
                let now = self
                    .live_nodes
                    .iter()
                    .filter(|&&i| self.lifecycle_disrupted(i))
                    .count();
                self.metrics.peak_nodes_disrupted = self.metrics.peak_nodes_disrupted.max(now);
            }
        }
    }

    /// Whether node `ni` is being replaced for drift or expiry: tainted by the strategy that
    /// replaces it (ours `gpu-node-autoscaler.io/replacing`, Karpenter's
    /// `karpenter.sh/disrupted`) and drifted, or tainted as expired.
    fn lifecycle_disrupted(&self, ni: usize) -> bool {
        let n = &self.nodes[ni];
        let tainted = |v: Option<&str>| {
            n.node.taints.iter().any(|t| {
                (t.key == labels::REPLACING_TAINT || t.key == "karpenter.sh/disrupted")
                    && v.is_none_or(|v| t.value == v)
            })
        };
        (tainted(None) && self.is_drifted(ni)) || tainted(Some("expired"))
    }

    /// Whether node `ni` was launched before its pool's template last changed.
    fn is_drifted(&self, ni: usize) -> bool {
        let n = &self.nodes[ni];
        let now = self.pool_versions.get(&n.pool).copied().unwrap_or(0);
        self.instances
            .get(&n.instance_id)
            .is_some_and(|i| i.version < now)
    }

    /// Live nodes launched before their pool's template last changed: (node, pool).
    pub fn drifted_nodes(&self) -> Vec<(String, String)> {
        self.live_nodes
            .iter()
            .filter(|&&ni| self.is_drifted(ni))
            .map(|&ni| {
                (
                    self.nodes[ni].node.name.clone(),
                    self.nodes[ni].pool.clone(),
                )
            })
            .collect()
    }

    /// Changes whenever the policy does (see [`CloudEvent::Drift`]).
    pub fn policy_version(&self) -> u64 {
        self.policy_version
    }

    pub fn give_back(&mut self, node: &str) {
        if let Some(&ni) = self.node_by_name.get(node) {
            let n = &mut self.nodes[ni].node;
            n.taints.retain(|t| t.key != labels::TO_BE_DELETED_TAINT);
            n.unschedulable = false;
            self.grown.insert(ni);
            self.dirty = true;
        }
    }

    /// Instances launched but not registered yet, with their launch time.
    pub fn unregistered(&self) -> Vec<(String, OfferingKey, Ms)> {
        self.booting
            .iter()
            .filter_map(|id| {
                self.instances
                    .get(id)
                    .map(|i| (id.clone(), i.offering.clone(), i.launched))
            })
            .collect()
    }

    /// Live nodes, in creation order.
    pub fn live_nodes(&self) -> impl Iterator<Item = &SimNode> {
        self.live_nodes.iter().map(|&n| &self.nodes[n])
    }

    fn instance_gone(&mut self, id: &str) {
        self.groups.left(id);
        self.booting.remove(id);
        self.listing = None;
        let mut billed = false;
        if let Some(i) = self.instances.get_mut(id) {
            if !i.gone {
                i.gone = true;
                self.live_price -= i.price;
                self.live_gpus -= i.gpus;
                billed = true;
            }
        }
        if billed {
            self.account_instance(id, self.now);
        }
    }

    fn remove_node(&mut self, ni: usize) {
        let pods = self.nodes[ni].pods.clone();
        for p in pods {
            if self.pods[p].pod.is_daemonset() {
                self.mark_done(p);
            } else {
                self.unbind(p);
            }
        }
        self.nodes[ni].removed = true;
        self.unpublish(ni);
        self.workload_changed(ni);
        self.live_nodes.remove(&ni);
        let id = self.nodes[ni].instance_id.clone();
        self.instance_gone(&id);
        self.dirty = true;
    }

    // ---- cluster mechanics ----

    /// The node's ResourceSlices go with it.
    fn unpublish(&mut self, ni: usize) {
        let name = &self.nodes[ni].node.name;
        self.dra.slices.retain(|_, s| &s.node != name);
        self.nodes[ni].node.dra_devices = 0;
    }

    /// The devices `p`'s claims would get on node `ni` with `taken` already allocated (`None`:
    /// they cannot be allocated there).
    fn allocation(&self, p: &Pod, ni: usize, taken: &[bool]) -> Option<Allocated> {
        if !p.needs_devices() {
            return Some(Vec::new());
        }
        let n = &self.nodes[ni];
        if n.node.dra_devices == 0 {
            return None;
        }
        self.matcher.borrow_mut().allocate(p, &n.devices, taken)
    }

    fn mark_done(&mut self, p: usize) {
        if !self.pods[p].done {
            self.pods[p].done = true;
            self.done += 1;
            self.active.remove(&p);
            self.pending.remove(&p);
        }
    }

    fn register(&mut self, id: &str) {
        let Some(inst) = self.instances.get(id) else {
            return;
        };
        if inst.gone || inst.node.is_some() {
            return;
        }
        let Some(t) = self
            .templates
            .iter()
            .find(|t| t.pool_name == inst.pool && t.instance_type == inst.offering.instance_type)
        else {
            return;
        };
        let o = t.offerings.iter().find(|o| o.key == inst.offering);
        let mut node_labels = o.map(|o| (*o.labels).clone()).unwrap_or_default();
        node_labels.insert(labels::LAUNCH_ID.into(), inst.launch_id.clone());
        let name = format!("node-{}", id.trim_start_matches("i-"));
        let full = t.allocatable.clone();
        let full_shared = t.shared.clone();
        let mut without_gpus = full.clone();
        without_gpus.gpu = 0;
        without_gpus.amd_gpu = 0;
        without_gpus.extended.retain(|(n, _)| {
            !n.starts_with(gpu_node_autoscaler_core::model::resources::MIG_PREFIX)
        });
        let node = Node {
            name: name.clone(),
            labels: Arc::new(node_labels),
            annotations: Default::default(),
            taints: t.taints.clone(),
            allocatable: without_gpus.clone(),
            shared_gpus: Vec::new(),
            ready: true,
            conditions: BTreeMap::new(),
            unschedulable: false,
            created: Time(inst.launched),
            provider_id: Some(format!("memory:///{}/{id}", inst.offering.zone)),
            deleting: false,
            dra_devices: 0,
        };
        let ni = self.nodes.len();
        self.nodes.push(SimNode {
            node,
            instance_id: id.to_string(),
            pool: inst.pool.clone(),
            offering: inst.offering.clone(),
            full,
            full_shared,
            free: without_gpus,
            free_shared: Vec::new(),
            advertised: false,
            removed: false,
            pods: Vec::new(),
            broken: None,
            empty_since: None,
            gpus: inst.gpus,
            taken: vec![false; t.devices.len()],
            devices: t.devices.clone(),
        });
        self.node_by_name.insert(name.clone(), ni);
        self.live_nodes.insert(ni);
        self.grown.insert(ni);
        if let Some(i) = self.instances.get_mut(id) {
            i.node = Some(ni);
        }
        self.booting.remove(id);
        self.listing = None;
        self.push(
            self.now + self.timing.device_plugin_delay,
            Event::Advertise(name),
        );
        self.dirty = true;
    }

    fn advertise(&mut self, name: &str) {
        let Some(&ni) = self.node_by_name.get(name) else {
            return;
        };
        let n = &mut self.nodes[ni];
        if n.removed || n.advertised {
            return;
        }
        n.advertised = true;
        let mut free = n.full.clone();
        let mut shared = n.full_shared.clone();
        for &p in &n.pods {
            free.sub(&self.pods[p].pod.requests);
            if let Some(s) = &self.pods[p].pod.share {
                place_share(&mut shared, s);
            }
        }
        n.free = free;
        n.free_shared = shared;
        n.node.allocatable = n.full.clone();
        n.node.shared_gpus = n.full_shared.clone();
        if let Some(driver) = n.devices.first().map(|d| d.driver.clone()) {
            // Its DRA driver publishes the devices in a ResourceSlice, in a pool named after
            // the node (as NVIDIA's driver does).
            n.node.dra_devices = n.devices.len() as i64;
            self.dra.slices.insert(
                format!("{}-{driver}", n.node.name),
                Slice {
                    node: n.node.name.clone(),
                    driver,
                    pool: n.node.name.clone(),
                    generation: 1,
                    devices: n.devices.to_vec(),
                },
            );
        }
        let id = n.instance_id.clone();
        if let Some(i) = self.instances.get_mut(&id) {
            i.advertised_at = Some(self.now);
        }
        self.workload_changed(ni);
        self.grown.insert(ni);
        self.dirty = true;
    }

    /// Keeps the empty-node clock of node `ni` (GPU-hours idle waiting for scale-down).
    fn workload_changed(&mut self, ni: usize) {
        let now = self.now;
        let n = &self.nodes[ni];
        let empty =
            n.advertised && !n.removed && n.pods.iter().all(|&p| self.pods[p].pod.is_daemonset());
        let (gpus, since) = (n.gpus, n.empty_since);
        match (empty, since) {
            (true, None) => self.nodes[ni].empty_since = Some(now),
            (false, Some(t)) => {
                self.metrics.idle_gpu_hours_empty += gpus * (now - t) as f64 / HOUR as f64;
                self.nodes[ni].empty_since = None;
            }
            _ => {}
        }
    }

    /// Bills a gone (or, at the end, a live) instance to its offering, and its GPU-hours before
    /// its GPUs were advertised to booting.
    fn account_instance(&mut self, id: &str, until: Ms) {
        let Some(i) = self.instances.get(id) else {
            return;
        };
        let hours = (until - i.launched).max(0) as f64 / HOUR as f64;
        let boot_end = i.advertised_at.unwrap_or(until).min(until);
        self.metrics.idle_gpu_hours_booting +=
            i.gpus * (boot_end - i.launched).max(0) as f64 / HOUR as f64;
        let key = (
            i.pool.clone(),
            i.offering.instance_type.clone(),
            i.offering.capacity_type.as_str().to_string(),
        );
        let e = self.cost_lines.entry(key).or_default();
        e.0 += 1;
        e.1 += i.price * hours;
        e.2 += i.gpus * hours;
    }

    fn bind(&mut self, p: usize, ni: usize) {
        let now = self.now;
        let allocated = self
            .allocation(&self.pods[p].pod, ni, &self.nodes[ni].taken)
            .unwrap_or_default();
        // The room its nomination kept elsewhere is free for others again.
        if self.pods[p].pod.nominated_node.as_deref() != Some(self.nodes[ni].node.name.as_str()) {
            self.drop_nomination(p);
        }
        let st = &mut self.pods[p];
        let n = &mut self.nodes[ni];
        // The scheduler writes each claim's allocation (its devices, on this node).
        let mut device_gpus = 0.0;
        for (claim, devices) in &allocated {
            let mut results = Vec::new();
            for &d in devices {
                n.taken[d] = true;
                device_gpus += gpu_equivalent(&n.devices[d]);
                let dev = &n.devices[d];
                results.push((dev.driver.clone(), n.node.name.clone(), dev.name.clone()));
            }
            if let Some(c) = st.pod.claims.iter().find(|c| &c.claim == claim) {
                self.dra.claims.insert(
                    claim.clone(),
                    Claim {
                        spec: c.spec.clone(),
                        allocation: Some(Allocation {
                            node: Some(n.node.name.clone()),
                            devices: results,
                        }),
                    },
                );
            }
        }
        if !allocated.is_empty() {
            st.gpu_eq = st.pod.gpu_equivalents() + device_gpus;
        }
        st.allocated = allocated;
        n.free.sub(&st.pod.requests);
        if let Some(s) = &st.pod.share {
            st.pod.shared_gpu_index = place_share(&mut n.free_shared, s);
        }
        n.pods.push(p);
        self.pending.remove(&p);
        st.node = Some(ni);
        st.pod.node_name = Some(n.node.name.clone());
        st.pod.phase = PodPhase::Running;
        st.pod.unschedulable = false;
        st.pod.nominated_node = None;
        st.pod.started = Some(Time(now));
        st.bound_at = Some(now);
        if st.first_bound.is_none() {
            st.first_bound = Some(now);
            self.metrics
                .waits_s
                .push((now - st.arrival) as f64 / 1000.0);
        }
        self.running_gpus += st.gpu_eq;
        if let Some(t) = st.disrupted_since.take() {
            self.metrics.lost_gpu_hours += (now - t) as f64 / HOUR as f64 * st.gpu_eq;
        }
        if let Some(t) = st.evicted_at.take() {
            self.metrics.disrupted_pod_hours += (now - t) as f64 / HOUR as f64;
        }
        if let Some(r) = st.remaining {
            let epoch = st.epoch;
            self.push(now + r, Event::Finish(p, epoch));
        }
        if !self.pods[p].pod.volumes.is_empty() {
            self.provision(p, ni);
        }
        self.workload_changed(ni);
    }

    /// Takes a pod off its node: back to Pending (or done), keeping its remaining run time.
    fn unbind(&mut self, p: usize) {
        let now = self.now;
        let Some(ni) = self.pods[p].node else { return };
        let st = &mut self.pods[p];
        let n = &mut self.nodes[ni];
        n.pods.retain(|&x| x != p);
        n.free.add(&st.pod.requests);
        // Its claims are deallocated (a pod that goes takes its generated claims with it).
        for (claim, devices) in std::mem::take(&mut st.allocated) {
            for d in devices {
                n.taken[d] = false;
            }
            self.dra.claims.remove(&claim);
        }
        if let (Some(s), Some(i)) = (&st.pod.share, st.pod.shared_gpu_index) {
            if let Some(g) = n.free_shared.get_mut(i) {
                g.mem_gib += s.mem_gib;
                g.core_pct += s.core_pct;
            }
        }
        if let (Some(r), Some(b), false) = (st.remaining, st.bound_at, st.stalled) {
            st.remaining = Some((r - (now - b)).max(0));
        }
        st.stalled = false;
        st.node = None;
        st.bound_at = None;
        st.epoch += 1;
        if !st.done {
            self.pending.insert(p);
            self.fresh.insert(p);
        }
        self.grown.insert(ni);
        st.pod.node_name = None;
        st.pod.phase = PodPhase::Pending;
        st.pod.started = None;
        st.pod.shared_gpu_index = None;
        self.running_gpus -= st.gpu_eq;
        self.dirty = true;
        self.workload_changed(ni);
    }

    /// Whether pod `p` fits node `ni` with `free` left there.
    fn fits_in(&self, p: &Pod, ni: usize, free: &Resources) -> bool {
        let n = &self.nodes[ni];
        !n.removed
            && n.node.is_schedulable()
            && !(n.broken.is_some() && p.wants_gpu())
            && p.fits(
                free,
                &n.free_shared,
                &n.node.labels,
                &n.node.taints,
                Some(&n.node.name),
            )
            && (!p.needs_devices() || self.allocation(p, ni, &n.taken).is_some())
    }

    /// Drops pod `i`'s nomination: the room it kept is free again.
    fn drop_nomination(&mut self, i: usize) {
        let Some(node) = self.pods[i].pod.nominated_node.take() else {
            return;
        };
        if let Some(&n) = self.node_by_name.get(&node) {
            self.grown.insert(n);
        }
    }

    /// Room on node `ni` for pending pod `i` out of `free`: what pods of no lower priority
    /// nominated to the node keep is taken out (kube-scheduler's filters count them there).
    fn room_left(
        &self,
        i: usize,
        ni: usize,
        mut free: Resources,
        nominees: &HashMap<usize, Vec<usize>>,
    ) -> Resources {
        let pod = &self.pods[i].pod;
        let gang = pod.gang.as_ref().map(|g| &g.key);
        for &j in nominees.get(&ni).into_iter().flatten() {
            let other = &self.pods[j];
            // A gang's members are placed together, each on its own scratch room.
            let same_gang = gang.is_some() && other.pod.gang.as_ref().map(|g| &g.key) == gang;
            if j != i
                && !same_gang
                && other.node.is_none()
                && !other.done
                && other.pod.priority >= pod.priority
            {
                free.sub(&other.pod.requests);
            }
        }
        free
    }

    /// Whether pending pod `i` fits node `ni` with `free` left there, the room of the pods
    /// nominated to the node kept for them.
    fn fits_nominated(
        &self,
        i: usize,
        ni: usize,
        free: &Resources,
        nominees: &HashMap<usize, Vec<usize>>,
    ) -> bool {
        let pod = &self.pods[i].pod;
        if nominees.get(&ni).is_none_or(|l| l.iter().all(|&j| j == i)) {
            return self.fits_in(pod, ni, free);
        }
        self.fits_in(pod, ni, &self.room_left(i, ni, free.clone(), nominees))
    }

    /// The pods that hold a live node, per topology domain of every rule across nodes the
    /// arrived pods have (kube-scheduler's view: the nodes that exist, no others).
    fn topology_index(&self) -> Option<TopologyIndex> {
        if !self.topology {
            return None;
        }
        let sites = self
            .live_nodes
            .iter()
            .map(|&n| {
                (
                    self.nodes[n].node.labels.clone(),
                    self.nodes[n].node.name.clone(),
                )
            })
            .collect();
        let active = || self.active.iter().map(|&i| &self.pods[i].pod);
        let mut ix = TopologyIndex::new(active(), sites, Vec::new());
        ix.set_node_taints(self.live_nodes.iter().map(|&n| {
            let node = &self.nodes[n].node;
            (node.name.as_str(), node.taints.as_slice())
        }));
        for &i in &self.active {
            let Some(n) = self.pods[i].node else { continue };
            let fp = ix.footprint(&self.pods[i].pod);
            if !fp.is_free() {
                ix.add(&fp, &self.site(n));
            }
        }
        Some(ix)
    }

    fn site(&self, n: usize) -> Site<'_> {
        Site {
            labels: &self.nodes[n].node.labels,
            node: &self.nodes[n].node.name,
        }
    }

    /// Whether the rules across nodes let a pod of profile `p` onto node `n`.
    fn admits(&self, topo: &Option<TopologyIndex>, p: &Option<Profile>, n: usize) -> bool {
        match (topo, p) {
            (Some(t), Some(p)) => t.admits(p, &self.site(n)).is_ok(),
            _ => true,
        }
    }

    /// kube-scheduler-like pass: each pending pod is bound to the feasible node its default
    /// scoring prefers ([`score`]); a gang's pending members are bound together or not at all
    /// (coscheduling). Returns whether any pod was newly found unschedulable.
    fn schedule(&mut self) -> bool {
        if !self.dirty {
            return false;
        }
        self.dirty = false;
        let pending: Vec<usize> = self.pending.iter().copied().collect();
        let fresh = std::mem::take(&mut self.fresh);
        let grown: Vec<usize> = std::mem::take(&mut self.grown)
            .into_iter()
            .filter(|n| self.live_nodes.contains(n))
            .collect();
        let live: Vec<usize> = self.live_nodes.iter().copied().collect();
        // Pending pods nominated to a node (`status.nominatedNodeName`), by node.
        let nominated = |w: &World, i: usize| {
            let n = *w
                .node_by_name
                .get(w.pods[i].pod.nominated_node.as_deref()?)?;
            w.live_nodes.contains(&n).then_some(n)
        };
        let mut nominees: HashMap<usize, Vec<usize>> = HashMap::new();
        for &i in &pending {
            if let Some(n) = nominated(self, i) {
                nominees.entry(n).or_default().push(i);
            }
        }
        let mut gangs: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        let mut newly = false;
        let mut topo = self.topology_index();
        let profile_of = |w: &World, topo: &Option<TopologyIndex>, i: usize| {
            let t = topo.as_ref()?;
            Some(t.profile(&w.pods[i].pod)).filter(|p| !p.is_free())
        };
        for &i in &pending {
            if let Some(g) = &self.pods[i].pod.gang {
                gangs.entry(g.key.clone()).or_default().push(i);
                continue;
            }
            let prof = profile_of(self, &topo, i);
            // Its nominated node first, as kube-scheduler does.
            if let Some(n) = nominated(self, i) {
                if self.fits_nominated(i, n, &self.nodes[n].free, &nominees)
                    && self.admits(&topo, &prof, n)
                {
                    if let (Some(t), Some(p)) = (&mut topo, &prof) {
                        t.add(p, &self.site(n));
                    }
                    self.bind(i, n);
                    continue;
                }
            }
            // A pod that failed before can only fit where capacity grew since, unless rules
            // across nodes kept it off: then where other pods came or went too.
            let ruled = prof.as_ref().is_some_and(|p| p.has_rules());
            let candidates = if fresh.contains(&i) || ruled {
                &live
            } else {
                &grown
            };
            let pod = &self.pods[i].pod;
            let feasible = candidates.iter().copied().filter(|&n| {
                self.fits_nominated(i, n, &self.nodes[n].free, &nominees)
                    && self.admits(&topo, &prof, n)
            });
            let scored = feasible.map(|n| {
                (
                    n,
                    score(pod, &self.nodes[n].node.allocatable, &self.nodes[n].free),
                )
            });
            let best = match (&topo, &prof) {
                (Some(t), Some(p)) if p.has_preferences() => {
                    // Its preferences' scores are normalised over the nodes scored together.
                    let scored: Vec<(usize, f64)> =
                        scored.take(feasible_nodes_to_find(live.len())).collect();
                    let sites: Vec<Site> = scored.iter().map(|&(n, _)| self.site(n)).collect();
                    let preferred = t.preference_scores(p, &sites);
                    best_scored(
                        scored
                            .into_iter()
                            .zip(preferred)
                            .map(|((n, s), p)| (n, s + p as f64)),
                        live.len(),
                    )
                }
                _ => best_scored(scored, live.len()),
            };
            match best {
                Some(n) => {
                    if let (Some(t), Some(p)) = (&mut topo, &prof) {
                        t.add(p, &self.site(n));
                    }
                    self.bind(i, n);
                }
                None => {
                    if !self.pods[i].pod.unschedulable {
                        self.pods[i].pod.unschedulable = true;
                        newly = true;
                    }
                    // Tried and failed: kube-scheduler drops its nomination.
                    if !candidates.is_empty() {
                        self.drop_nomination(i);
                    }
                }
            }
        }
        for (_, members) in gangs {
            // All pending members, and at least min-member pods in the gang overall.
            let min = members
                .iter()
                .filter_map(|&i| self.pods[i].pod.gang.as_ref().and_then(|g| g.min_member))
                .max()
                .unwrap_or(0) as usize;
            let key = self.pods[members[0]]
                .pod
                .gang
                .as_ref()
                .map(|g| g.key.clone());
            let bound = self
                .active
                .iter()
                .map(|&i| &self.pods[i])
                .filter(|p| p.node.is_some() && p.pod.gang.as_ref().map(|g| &g.key) == key.as_ref())
                .count();
            let mut plan: Vec<(usize, usize)> = Vec::new();
            if members.len() + bound >= min {
                // Tentatively bind on scratch copies: free resources, shared GPUs, devices.
                type Scratch = (Resources, Vec<SharedGpu>, Vec<bool>);
                let mut scratch: BTreeMap<usize, Scratch> = BTreeMap::new();
                for &i in &members {
                    let p = &self.pods[i].pod;
                    let prof = profile_of(self, &topo, i);
                    let option = |n: usize| {
                        if !self.admits(&topo, &prof, n) {
                            return None;
                        }
                        let node = &self.nodes[n];
                        let (free, shared, taken) = scratch.get(&n).cloned().unwrap_or_else(|| {
                            (
                                node.free.clone(),
                                node.free_shared.clone(),
                                node.taken.clone(),
                            )
                        });
                        let free = self.room_left(i, n, free, &nominees);
                        let fits = !node.removed
                            && node.node.is_schedulable()
                            && p.fits(
                                &free,
                                &shared,
                                &node.node.labels,
                                &node.node.taints,
                                Some(&node.node.name),
                            );
                        if !fits {
                            return None;
                        }
                        let a = self.allocation(p, n, &taken)?;
                        Some(((n, a), score(p, &node.node.allocatable, &free)))
                    };
                    // Its nominated node first, as kube-scheduler does.
                    let chosen = match nominated(self, i).and_then(option) {
                        Some((choice, _)) => Some(choice),
                        None => best_scored(live.iter().copied().filter_map(option), live.len()),
                    };
                    let Some((n, allocated)) = chosen else {
                        // Not all of the gang: what its members took in the index goes back.
                        if let Some(t) = &mut topo {
                            for &(j, m) in &plan {
                                let p = t.profile(&self.pods[j].pod);
                                if !p.is_free() {
                                    t.remove(&p, &self.site(m));
                                }
                            }
                        }
                        plan.clear();
                        break;
                    };
                    let e = scratch.entry(n).or_insert_with(|| {
                        (
                            self.nodes[n].free.clone(),
                            self.nodes[n].free_shared.clone(),
                            self.nodes[n].taken.clone(),
                        )
                    });
                    e.0.sub(&p.requests);
                    if let Some(s) = &p.share {
                        place_share(&mut e.1, s);
                    }
                    for d in allocated.iter().flat_map(|(_, d)| d) {
                        e.2[*d] = true;
                    }
                    if let (Some(t), Some(p)) = (&mut topo, &prof) {
                        t.add(p, &self.site(n));
                    }
                    plan.push((i, n));
                }
            }
            if plan.len() == members.len() {
                for (i, n) in plan {
                    self.bind(i, n);
                }
            } else {
                for &i in &members {
                    if !self.pods[i].pod.unschedulable {
                        self.pods[i].pod.unschedulable = true;
                        newly = true;
                    }
                    self.drop_nomination(i);
                }
            }
        }
        newly
    }

    fn handle(&mut self, e: Event) {
        if matches!(
            e,
            Event::Finish(..)
                | Event::Delete(_)
                | Event::Register(_)
                | Event::Advertise(_)
                | Event::SpotGone(_)
                | Event::ReservationEnd(_)
        ) {
            self.changed = true;
        }
        match e {
            Event::Arrive(i) if self.workload_of.contains_key(&i) => {
                // Submitted to Kueue: created once the job is admitted.
                let wi = self.workload_of[&i];
                self.pods[i].arrived = true;
                let w = &mut self.workloads[wi];
                if w.submitted.is_none() {
                    w.submitted = Some(self.now);
                    if self.admit_on_arrival {
                        self.admit(wi, None);
                    } else {
                        self.submitted = true;
                    }
                }
            }
            Event::Arrive(i) => {
                // Created when it arrives (a trace's creation time, a scenario's arrival).
                self.pods[i].pod.created = Time(self.now);
                self.pods[i].arrived = true;
                self.active.insert(i);
                self.pending.insert(i);
                self.fresh.insert(i);
                self.dirty = true;
            }
            Event::Finish(i, epoch) => {
                if self.pods[i].epoch == epoch && !self.pods[i].done {
                    self.unbind(i);
                    self.mark_done(i);
                }
            }
            Event::Delete(i) => {
                if !self.pods[i].done {
                    self.unbind(i);
                    self.mark_done(i);
                    self.dirty = true;
                }
            }
            Event::Register(id) => self.register(&id),
            Event::Advertise(name) => self.advertise(&name),
            Event::IdealStart(_) | Event::IdealEnd(_) => {}
            Event::Cloud(k) => self.cloud_event(k),
            Event::Wake => self.dirty = true,
            Event::SpotGone(id) => match self.instances.get(&id).and_then(|i| i.node) {
                Some(ni) => self.remove_node(ni),
                None => self.instance_gone(&id),
            },
            Event::ReservationEnd(rid) => {
                let taken: Vec<String> = self
                    .instances
                    .iter()
                    .filter(|(id, i)| {
                        !i.gone && self.provider.reservation_of(id).as_deref() == Some(&rid)
                    })
                    .map(|(id, _)| id.clone())
                    .collect();
                for id in taken {
                    match self.instances.get(&id).and_then(|i| i.node) {
                        Some(ni) => {
                            // Pods still running there are cut off: their work is disrupted
                            // until they run again elsewhere.
                            let running: Vec<usize> = self.nodes[ni]
                                .pods
                                .iter()
                                .copied()
                                .filter(|&p| !self.pods[p].pod.is_daemonset())
                                .collect();
                            self.metrics.pods_on_ended_reservations += running.len();
                            for p in running {
                                let st = &mut self.pods[p];
                                if st.disrupted_since.is_none() {
                                    st.disrupted_since = Some(self.now);
                                    self.metrics.disrupted_gpus += st.gpu_eq;
                                }
                            }
                            self.remove_node(ni);
                        }
                        None => self.instance_gone(&id),
                    }
                }
            }
        }
    }

    fn cloud_event(&mut self, k: usize) {
        match self.cloud_events[k].clone() {
            CloudEvent::InsufficientCapacity {
                at,
                until,
                zone,
                capacity_type,
                instance_types,
                max_instances,
            } => {
                self.provider.add_capacity_window(CapacityWindow {
                    from_ms: at,
                    until_ms: until,
                    zone,
                    capacity_type,
                    instance_types,
                    max_instances,
                });
                self.push(until, Event::Wake);
            }
            CloudEvent::SpotInterruption { fraction, pool, .. } => {
                let hits = self.provider.interrupt_spot(fraction, pool.as_deref());
                for h in hits {
                    self.metrics.spot_interruptions += 1;
                    // The two-minute warning, as EventBridge delivers it; the pods' work is
                    // disrupted from now until they run again.
                    if let Some(ni) = self.instances.get(&h.instance_id).and_then(|i| i.node) {
                        for &p in &self.nodes[ni].pods {
                            let st = &mut self.pods[p];
                            if !st.pod.is_daemonset() && st.disrupted_since.is_none() {
                                st.disrupted_since = Some(self.now);
                                self.metrics.disrupted_gpus += st.gpu_eq;
                            }
                        }
                    }
                    self.notices.push(Notice {
                        message_id: format!("sim-notice-{}", h.instance_id),
                        kind: NoticeKind::SpotInterruption,
                        instance_ids: vec![h.instance_id.clone()],
                        sent_at_ms: Some(h.notice_at_ms),
                    });
                    self.changed = true;
                    self.push(h.terminate_at_ms, Event::SpotGone(h.instance_id));
                }
            }
            CloudEvent::GpuFailure {
                fraction,
                pool,
                xid,
                ..
            } => {
                let mut candidates: Vec<usize> = self
                    .live_nodes
                    .iter()
                    .copied()
                    .filter(|&ni| {
                        let n = &self.nodes[ni];
                        n.advertised
                            && n.broken.is_none()
                            && n.node.advertised_gpus() > 0
                            && pool.as_ref().is_none_or(|p| *p == n.pool)
                    })
                    .collect();
                let k =
                    ((fraction * candidates.len() as f64).ceil() as usize).min(candidates.len());
                for j in 0..k {
                    let r = j + self.rng.below((candidates.len() - j) as u64) as usize;
                    candidates.swap(j, r);
                }
                for &ni in &candidates[..k] {
                    self.break_gpu(ni, xid);
                }
            }
            CloudEvent::Quota {
                max_instances,
                max_gpus,
                ..
            } => self.provider.set_quota(max_instances, max_gpus),
            CloudEvent::Drift { pool, .. } => {
                // What the pool launches changes: a new template version in its provider
                // section (the image it resolves to), as an operator's change would.
                let v = self.pool_versions.entry(pool.clone()).or_default();
                *v += 1;
                let version = *v;
                if let Some(p) = self.policy.pools.iter_mut().find(|p| p.name == pool) {
                    let mut settings = match p.settings.take() {
                        Some(serde_json::Value::Object(m)) => m,
                        _ => serde_json::Map::new(),
                    };
                    settings.insert(
                        "simulatedTemplateVersion".into(),
                        serde_json::Value::from(version),
                    );
                    p.settings = Some(serde_json::Value::Object(settings));
                }
                self.policy_version += 1;
                self.changed = true;
                self.dirty = true;
            }
        }
    }

    /// A GPU of node `ni` breaks: the node's health agent reports it, its pods stop making
    /// progress (their work is lost from now until they run elsewhere), and the scheduler places
    /// no GPU pod on it any more (the device plugin reports the GPU unhealthy).
    fn break_gpu(&mut self, ni: usize, xid: u32) {
        let now = self.now;
        self.metrics.gpu_failures += 1;
        let n = &mut self.nodes[ni];
        n.broken = Some((xid, now));
        n.node
            .conditions
            .insert(HARDWARE_CONDITION.into(), "False".into());
        // The device plugin reports the node's GPUs unhealthy: none allocatable any more.
        n.node.allocatable.gpu = 0;
        n.node.allocatable.amd_gpu = 0;
        n.node.allocatable.extended.retain(|(name, _)| {
            !name.starts_with(gpu_node_autoscaler_core::model::resources::MIG_PREFIX)
        });
        n.node.shared_gpus.clear();
        for &p in &n.pods {
            let st = &mut self.pods[p];
            if st.pod.is_daemonset() || st.stalled {
                continue;
            }
            if let (Some(r), Some(b)) = (st.remaining, st.bound_at) {
                st.remaining = Some((r - (now - b)).max(0));
            }
            st.bound_at = Some(now);
            st.stalled = true;
            // Its Finish no longer comes.
            st.epoch += 1;
            if st.disrupted_since.is_none() {
                st.disrupted_since = Some(now);
                self.metrics.disrupted_gpus += st.gpu_eq;
            }
        }
        self.changed = true;
    }

    /// Per Node name, the XID its broken GPU reported (what dcgm-exporter shows through
    /// Prometheus).
    pub fn gpu_xids(&self) -> BTreeMap<String, Vec<GpuXid>> {
        self.live_nodes
            .iter()
            .filter_map(|&ni| {
                let n = &self.nodes[ni];
                n.broken.map(|(xid, _)| {
                    (
                        n.node.name.clone(),
                        vec![GpuXid {
                            gpu: "0".into(),
                            xid,
                        }],
                    )
                })
            })
            .collect()
    }

    /// Nodes with a broken GPU: name, pool, and since when.
    pub fn broken_nodes(&self) -> Vec<(String, String, Ms)> {
        self.live_nodes
            .iter()
            .filter_map(|&ni| {
                let n = &self.nodes[ni];
                n.broken
                    .map(|(_, at)| (n.node.name.clone(), n.pool.clone(), at))
            })
            .collect()
    }

    /// Nothing left to happen: no queued event, no running pod (a pod stalled on a broken GPU
    /// does not run), nothing launching.
    fn quiescent(&self) -> bool {
        self.events.is_empty()
            && self.booting.is_empty()
            && self.active.len()
                == self.pending.len()
                    + self
                        .active
                        .iter()
                        .filter(|&&p| self.pods[p].stalled && self.pods[p].node.is_some())
                        .count()
    }
}

/// How long the strategy may keep trying for waiting pods once nothing else can happen.
const QUIET_HORIZON: Ms = HOUR;

/// How many feasible nodes kube-scheduler looks for before it scores them
/// (`numFeasibleNodesToFind`, default `percentageOfNodesToScore`): every node up to 100, else an
/// adaptive share (50 % less 1 % per 125 nodes, at least 5 %), at least 100.
fn feasible_nodes_to_find(nodes: usize) -> usize {
    if nodes < 100 {
        return nodes.max(1);
    }
    let percent = (50 - (nodes / 125) as i64).max(5) as usize;
    (nodes * percent / 100).max(100)
}

/// kube-scheduler's default scores that depend on the node's resources, both of weight 1
/// (`NodeResourcesFit` with `LeastAllocated` and `NodeResourcesBalancedAllocation`, on CPU and
/// memory; GPUs are not among the scored resources by default): a pod goes to the node that
/// would have the most CPU and memory left, in balance. A pod's preferences (preferred pod and
/// node affinity, `ScheduleAnyway` spreads) add the scores of their plugins
/// ([`TopologyIndex::preference_scores`]); the other default scores (image locality, taints
/// `PreferNoSchedule`) are level for the simulator's pods.
fn score(p: &Pod, allocatable: &Resources, free: &Resources) -> f64 {
    let share = |alloc: i64, free: i64, req: i64| {
        if alloc <= 0 {
            return 1.0;
        }
        (((alloc - free) + req) as f64 / alloc as f64).clamp(0.0, 1.0)
    };
    let cpu = share(allocatable.cpu_milli, free.cpu_milli, p.requests.cpu_milli);
    let mem = share(allocatable.memory, free.memory, p.requests.memory);
    let least = ((1.0 - cpu) + (1.0 - mem)) / 2.0 * 100.0;
    let balanced = (1.0 - (cpu - mem).abs() / 2.0) * 100.0;
    least + balanced
}

/// The best-scored of the feasible nodes kube-scheduler looks at (the first found among equals;
/// it picks among equals at random).
fn best_scored<T>(feasible: impl Iterator<Item = (T, f64)>, nodes: usize) -> Option<T> {
    let mut best: Option<(T, f64)> = None;
    for (t, s) in feasible.take(feasible_nodes_to_find(nodes)) {
        if best.as_ref().is_none_or(|(_, b)| s > *b) {
            best = Some((t, s));
        }
    }
    best.map(|(t, _)| t)
}

/// Runs one strategy over the input. Deterministic for the same input and seed.
pub fn run(input: &SimInput, strategy: &mut dyn Strategy) -> Metrics {
    run_with_progress(input, strategy, &mut |_| {})
}

/// [`run`], reporting progress (the share of the workload's arrival span simulated, 0..=1) about
/// every 1 %.
pub fn run_with_progress(
    input: &SimInput,
    strategy: &mut dyn Strategy,
    progress: &mut dyn FnMut(f64),
) -> Metrics {
    run_world(input, strategy, progress).metrics
}

/// [`run_with_progress`], returning the world as it ends (its metrics filled in).
pub(crate) fn run_world(
    input: &SimInput,
    strategy: &mut dyn Strategy,
    progress: &mut dyn FnMut(f64),
) -> World {
    let started = std::time::Instant::now();
    let last_arrival = input.pods.iter().map(|p| p.arrival).max().unwrap_or(0);
    let mut reported = -1i64;
    let mut quiet_since: Option<Ms> = None;
    let mut w = World::new(input);
    w.admit_on_arrival = !strategy.serves_provisioning_requests();
    w.metrics.strategy = strategy.name().to_string();
    w.metrics.scenario = input.name.clone();
    w.metrics.skipped = input.skipped.clone();
    let start = w.next_event_time().unwrap_or(0);
    w.now = start;
    w.provider.set_now(start);
    loop {
        let ev = w.next_event_time();
        let run_at = strategy.next_run();
        let t = match (ev, run_at) {
            (None, None) => break,
            (Some(a), None) => a,
            (None, Some(b)) => {
                // Nothing left to happen but the strategy's own runs: give pods that still wait
                // (an insufficient-capacity entry or a back-off to expire) a bounded horizon.
                if w.quiescent() {
                    let since = *quiet_since.get_or_insert(w.now);
                    if (w.pending.is_empty() && w.waiting_jobs().is_empty())
                        || b - since > QUIET_HORIZON
                    {
                        break;
                    }
                } else {
                    quiet_since = None;
                }
                b
            }
            (Some(a), Some(b)) => a.min(b),
        };
        if input.until.is_some_and(|u| t > u) {
            w.advance(input.until.unwrap_or(t));
            break;
        }
        w.advance(t.max(w.now));
        while w.next_event_time() == Some(w.now) {
            let Some(Reverse((_, _, e))) = w.events.pop() else {
                break;
            };
            w.handle(e);
        }
        if w.schedule() | std::mem::take(&mut w.submitted) {
            strategy.pods_unschedulable(w.now);
        }
        if std::mem::take(&mut w.changed) {
            strategy.cluster_changed(w.now);
        }
        if strategy.next_run().is_some_and(|r| r <= w.now) {
            strategy.run(&mut w);
            w.dirty = true;
            if w.schedule() {
                strategy.pods_unschedulable(w.now);
            }
        }
        w.record_series(false);
        if last_arrival > start {
            let pct = ((w.now - start) * 100 / (last_arrival - start)).min(100);
            if pct > reported {
                reported = pct;
                progress(pct as f64 / 100.0);
            }
        }
        if w.done == w.pods.len()
            && w.events
                .iter()
                .all(|Reverse((_, _, e))| matches!(e, Event::IdealEnd(_) | Event::IdealStart(_)))
        {
            // Every pod is done: drain the ideal-schedule events so the run spans the lower bound's time.
            while let Some(Reverse((t, _, e))) = w.events.pop() {
                w.advance(t);
                w.handle(e);
            }
            break;
        }
    }
    w.record_series(true);
    // What is still up is billed to the end.
    let live: Vec<String> = w
        .instances
        .iter()
        .filter(|(_, i)| !i.gone)
        .map(|(id, _)| id.clone())
        .collect();
    for id in live {
        w.account_instance(&id, w.now);
    }
    for ni in 0..w.nodes.len() {
        if let Some(t) = w.nodes[ni].empty_since.take() {
            w.metrics.idle_gpu_hours_empty += w.nodes[ni].gpus * (w.now - t) as f64 / HOUR as f64;
        }
    }
    w.metrics.cost_by_offering = std::mem::take(&mut w.cost_lines)
        .into_iter()
        .map(
            |((pool, instance_type, capacity_type), (nodes, cost_usd, gpu_hours))| {
                super::report::OfferingCost {
                    pool,
                    instance_type,
                    capacity_type,
                    nodes,
                    cost_usd,
                    gpu_hours,
                }
            },
        )
        .collect();
    // Work still disrupted at the end (a pod stalled on a broken GPU nobody replaced, one
    // interrupted and never placed again) is lost up to the end.
    for st in &w.pods {
        if let (Some(t), false) = (st.disrupted_since, st.done) {
            w.metrics.lost_gpu_hours += (w.now - t) as f64 / HOUR as f64 * st.gpu_eq;
        }
    }
    // What the reservations cost over the run, used or not (sunk: not in `cost_usd`).
    for r in &input.reservations {
        let from = r.start_ms.unwrap_or(start).max(start);
        let to = r.end_ms.unwrap_or(w.now).min(w.now);
        if let (Some(price), true) = (r.price_per_hour, to > from) {
            w.metrics.reserved_cost_usd +=
                price * f64::from(r.total) * (to - from) as f64 / HOUR as f64;
        }
    }
    let m = &mut w.metrics;
    m.lower_bound_usd = crate::bound::lower_bound_usd(input, w.now);
    m.span_s = (w.now - start) as f64 / 1000.0;
    m.pods_never_placed = w.pods.iter().filter(|p| p.first_bound.is_none()).count();
    m.wall_s = started.elapsed().as_secs_f64();
    m.provider_calls = w.provider.call_count();
    m.finish();
    w
}

#[cfg(test)]
mod tests;
