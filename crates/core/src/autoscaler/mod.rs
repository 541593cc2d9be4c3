//! The decision core that `run` (the controller) and `simulate` both execute.
//!
//! [`Autoscaler`] owns every piece of decision state — the batching window, the
//! insufficient-capacity cache, per-pool launch back-off, scale-up and scale-down history,
//! launches in flight and given up, drains in progress, what was reported — and holds no I/O:
//! no clock, no client, no runtime. A pass takes an [`Observation`] (the cluster, the cloud's
//! instances, the time) and returns [`Action`]s as plain data; an executor carries them out and
//! answers those that have an outcome (registrations, launches) with [`Feedback`], which may
//! bring more actions (give back a gang's partial launch, plan again at once after an offering
//! ran out of capacity), until a step returns no action. Drains run longer than a pass: their
//! outcome comes back through [`Autoscaler::drain_finished`].
//!
//! The controller executes the actions against the API server and the cloud providers
//! (`controller`), the simulator against its virtual cluster and the in-memory cloud (`sim::ours`).

pub mod batch;
pub mod fleet;
pub mod replace;
pub mod status;
#[cfg(test)]
mod tests;

pub use batch::Batch;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use gpu_node_autoscaler_provider::retry::{backoff, jitter_unit};
use gpu_node_autoscaler_provider::{
    Catalog, Instance, InstanceState, LaunchRequest, LaunchResult, Notice, NoticeKind, OfferingKey,
    ProviderError,
};

use crate::model::node::GpuXid;
use crate::model::snapshot::PoolState;
use crate::model::{labels, Node, Snapshot, Time};
use crate::plan::{self, Plan, ScaleUp, Templates};
use crate::policy::duration::format_duration;
use crate::policy::Policy;

use fleet::{fleet_view, launch_request, registrations, FleetView, NodeIndex, Registration};
use status::{PoolHistory, Status, StatusInput};

/// The `reason` label values of `failed_launches_total`.
pub const LAUNCH_FAILURE_REASONS: [&str; 7] = [
    "insufficient_capacity",
    "quota_exceeded",
    "throttled",
    "invalid_request",
    "not_found",
    "other",
    "provision_timeout",
];

/// Rounds of planning in one pass: an offering newly found short of capacity is avoided and the
/// rest planned again at once, at most this many times.
pub const CAPACITY_ROUNDS: u32 = 3;
/// A launched instance not listed by the cloud yet is remembered this long.
const RECENT_FOR: Duration = Duration::from_secs(300);
/// Given-up launch ids are remembered this long (a re-plan of the same pods uses a new id).
const GIVEN_UP_FOR: Duration = Duration::from_secs(3600);
/// Nodes removed here: a stale cache does not resume their drain for this long.
const REMOVED_FOR: Duration = Duration::from_secs(600);
/// The status is rewritten at least this often while it changes nothing but the time.
const STATUS_EVERY: Duration = Duration::from_secs(10);

/// Settings fixed for the life of the core.
#[derive(Clone, Debug)]
pub struct Config {
    /// Decide and report only: no launch, drain, registration or annotation.
    pub dry_run: bool,
    /// How long a drain may take before the node is given back.
    pub max_graceful_termination: Duration,
    /// Who decides (written into the status).
    pub identity: String,
    /// Seed of the back-off jitter (fixed in the simulator, random in the controller).
    pub seed: u64,
    /// Produce what is only shown to people: pod Events, the status, the kept-node log. The
    /// simulator has no one to show them to and leaves them out (no decision depends on them).
    pub report: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            dry_run: false,
            max_graceful_termination: Duration::from_secs(600),
            identity: String::new(),
            seed: 0,
            report: true,
        }
    }
}

/// What a pass looks at.
#[derive(Clone, Debug, Default)]
pub struct Observation {
    pub now: Time,
    /// Pods, Nodes and PDBs as the API server shows them. In-flight launches, unavailable
    /// offerings and pool history are the core's to fill in.
    pub snapshot: Snapshot,
    /// Every instance the pools' providers list now; `None` when the cloud could not be listed
    /// (then in-flight capacity is unknown and deciding could launch twice: only expired drains
    /// are given back). Shared, so that an executor that keeps its listing between passes
    /// (the simulator) need not copy it.
    pub instances: Option<Arc<Vec<Instance>>>,
    /// providerIDs of Nodes that exist but could not be read: their instances are neither in
    /// flight nor overdue.
    pub other_provider_ids: Vec<String>,
    /// Whether the policy last read was valid (for the status).
    pub policy_valid: bool,
    /// Notices from the cloud's interruption queue received since the last pass (each is
    /// acknowledged with [`Action::AckNotice`] once acted on).
    pub notices: Vec<Notice>,
    /// Per Node name, the XID errors its GPUs last reported, when they were read in this pass
    /// (`None`: not read, the last reading stands).
    pub gpu_xids: Option<BTreeMap<String, Vec<GpuXid>>>,
}

/// The object an Event is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    Pod {
        namespace: String,
        name: String,
        uid: String,
    },
    Node(String),
}

/// A Kubernetes Event to record.
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    pub subject: Subject,
    pub warning: bool,
    pub reason: &'static str,
    pub action: &'static str,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
}

/// Something to count or measure.
#[derive(Clone, Debug, PartialEq)]
pub enum Count {
    /// Nodes launched for a pool.
    ScaleUps {
        pool: String,
        nodes: u32,
    },
    /// A node drained and removed.
    ScaleDown {
        pool: String,
    },
    FailedLaunch {
        pool: String,
        reason: &'static str,
    },
    /// Pods a scale-up was decided for (their reaction time is measured from when they became
    /// unschedulable).
    Planned {
        pods: Vec<String>,
    },
    /// Nodes of ours that advertise no GPUs any more (a gauge).
    NodesGpusLost(usize),
    /// Nodes of ours seen unhealthy now (a gauge).
    NodesUnhealthy(usize),
    /// A node replaced (drained and removed) for `cause` (`unhealthy`, `interrupted`).
    Replaced {
        pool: String,
        cause: &'static str,
    },
}

/// A drain to run: taint and cordon the node, evict its pods, terminate its instance and delete
/// the Node; give it back (untaint, uncordon) if it is not empty by the deadline.
#[derive(Clone, Debug, PartialEq)]
pub struct DrainOrder {
    pub node: String,
    pub pool: String,
    /// The instance, only as the pools' listing names it (never parsed out of a providerID).
    pub instance_id: Option<String>,
    pub deadline: Time,
    pub reason: String,
    /// The instance is taken back then whatever the drain does (an interrupted spot node): pods'
    /// grace periods are cut to end before it, and a drain that runs out of time does not give
    /// the node back (the deadline is no later than this).
    pub reclaimed_at: Option<Time>,
}

/// An action for the executor, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Give a Node of ours its pool's labels, taints and annotations. Answered with
    /// [`Feedback::Registered`].
    Register(Registration),
    /// Launch through the pool's provider, trying the offerings in order. Answered with
    /// [`Feedback::Launched`].
    Launch {
        request: LaunchRequest,
        /// The pods (`namespace/name`) the nodes are for.
        pods: Vec<String>,
    },
    /// Terminate an instance of ours (a launch given up or given back).
    Terminate {
        pool: String,
        instance_id: String,
        why: String,
    },
    DeleteNode {
        node: String,
    },
    /// Start a drain; its outcome comes back through [`Autoscaler::drain_finished`].
    Drain(DrainOrder),
    /// Give back a node whose drain (found from the taint) ran past its deadline; the outcome
    /// comes back through [`Autoscaler::drain_finished`].
    RollBack {
        node: String,
        pool: Option<String>,
        why: String,
    },
    /// Add (`present`) or remove a taint of a Node (matched by key and effect).
    Taint {
        node: String,
        taint: crate::model::Taint,
        present: bool,
    },
    /// Delete a notice's message from the queue: what it says is recorded (a node tainted), or
    /// it is about no instance of ours. Only if every earlier `Taint` of the pass succeeded.
    AckNotice {
        message_id: String,
    },
    /// Set a pending pod's `status.nominatedNodeName`: the node launched for it, which the
    /// scheduler tries first for it and keeps room on for it while placing other pods.
    Nominate {
        /// `namespace/name`.
        pod: String,
        uid: String,
        node: String,
    },
    /// Set (or remove, `None`) an annotation of a Node.
    Annotate {
        node: String,
        key: &'static str,
        value: Option<String>,
    },
    Event(Note),
    Log {
        level: Level,
        message: String,
    },
    Count(Count),
    /// Publish the status (the status ConfigMap).
    Status(Box<Status>),
}

/// The outcome of an action that has one.
#[derive(Clone, Debug, PartialEq)]
pub enum Feedback {
    /// A registration was written (`changed`: the Node's labels or taints changed) or failed.
    Registered { node: String, changed: bool },
    Launched {
        launch_id: String,
        result: Result<LaunchResult, ProviderError>,
    },
}

/// How a drain ended.
#[derive(Clone, Debug, PartialEq)]
pub enum DrainOutcome {
    Removed,
    /// Given back (taint removed, uncordoned), with why.
    RolledBack(String),
    /// Leadership was lost: the next leader finds the drain from the taint.
    Abandoned,
    /// The node was emptied but could not be removed; it stays tainted and is tried again.
    Failed(String),
}

/// One scale-up of the current round: its launch id and whether a launch was asked for.
#[derive(Clone, Debug)]
struct Issued {
    launch_id: String,
    launched: bool,
}

enum Stage {
    /// Registrations asked for; the plan waits for their outcome.
    Registering(BTreeMap<String, Registration>),
    /// Launches asked for in round `round` of `plan`.
    Launching {
        round: u32,
        plan: Box<Plan>,
        issued: Vec<Issued>,
    },
}

/// A pass between its steps.
struct Pass {
    now: Time,
    snapshot: Snapshot,
    instances: Arc<Vec<Instance>>,
    view: FleetView,
    policy: Arc<Policy>,
    templates: Option<Arc<Templates>>,
    policy_valid: bool,
    /// Pod key → index in `snapshot.pods`.
    pod_index: HashMap<String, usize>,
    /// Nodes being replaced → their GPU pods, planned again as pending.
    moving: BTreeMap<String, Vec<String>>,
    /// Nodes kept free for spot whose taint this pass planned without (a pending pod needs
    /// them): the pass takes the taint off.
    released: BTreeSet<String>,
    /// Pods planned again as pending → the node they run on and their phase.
    moved_from: HashMap<String, (String, crate::model::PodPhase)>,
    /// Pods moving off a replaced node whose launch failed in this pass → why.
    launch_failed: BTreeMap<String, String>,
    stage: Stage,
}

/// A pool whose nodes and pods are as they were at a consolidation that found nothing is
/// planned again after this long at the earliest.
const CONSOLIDATION_RELOOK: std::time::Duration = std::time::Duration::from_secs(60 * 60);

/// The decision core.
pub struct Autoscaler {
    config: Config,
    policy: Option<Arc<Policy>>,
    templates: Option<Arc<Templates>>,
    catalog: Catalog,
    batch: Batch,
    /// Offerings that failed for lack of capacity, unavailable until then.
    ice: BTreeMap<OfferingKey, Time>,
    history: BTreeMap<String, PoolHistory>,
    /// Instances launched here, until the cloud's listing shows them.
    recent: HashMap<String, (Instance, Time)>,
    /// Launch ids given up (never registered in time, a gang's partial launch given back, or
    /// their instances gone), with when: a re-plan uses a new id.
    given_up: HashMap<String, Time>,
    /// Per launch id issued here: when, and the pods planned for each of its nodes (for
    /// [`crate::model::Snapshot::planned`]), kept for the longest a node may take to come.
    planned: BTreeMap<String, (Time, crate::model::snapshot::PlannedNodes)>,
    /// Live instances seen (listed or launched here) → their launch id.
    seen: HashMap<String, String>,
    /// Instances seen with a Node; and since when those without one any more lost it.
    registered: HashSet<String>,
    lost: HashMap<String, Time>,
    /// Nodes removed here, so that a stale view does not resume their drain.
    removed: HashMap<String, Time>,
    /// Per pool: no launch before this time after failures other than capacity, and how many.
    launch_backoff: HashMap<String, (Time, u32)>,
    /// History restored from the last leader's status (after a restart or a failover).
    restored: bool,
    /// Drains and rollbacks running: node → pool.
    drains: BTreeMap<String, Option<String>>,
    /// The last NotTriggerScaleUp reason sent per pod.
    notified: HashMap<String, String>,
    /// Pending pods nominated here: pod UID → node.
    nominated: HashMap<String, String>,
    /// "Unneeded since" per node, kept here in dry-run (no annotation is written).
    unneeded_dry: BTreeMap<String, String>,
    /// Why each idle-looking node is kept, as last logged.
    kept: BTreeMap<String, String>,
    /// Nodes whose GPUs went missing, as last reported.
    gpus_lost: BTreeSet<String>,
    /// Unneeded nodes whose instance is not ours, already reported (reported once, never
    /// drained).
    not_ours_reported: BTreeSet<String>,
    /// Nodes being replaced (broken, about to be taken back, or consolidated).
    replace: replace::Replacements,
    /// Per pool with consolidation: when its running pods are planned again next.
    consolidation_due: BTreeMap<String, Time>,
    /// Per pool: what its last fruitless consolidation looked at, and when.
    consolidation_seen: BTreeMap<String, (u64, Time)>,
    last_status: Option<(String, Time)>,
    jitter_draws: u64,
    pass: Option<Pass>,
    last_plan: Option<Plan>,
    wake: Wake,
}

/// From the last finished pass, what [`Autoscaler::next_change`] needs.
#[derive(Default)]
struct Wake {
    /// Unneeded node → its pool.
    unneeded_pools: BTreeMap<String, String>,
    /// Pool → its newest node's creation or launch.
    newest_in_pool: BTreeMap<String, Time>,
}

impl Autoscaler {
    pub fn new(config: Config) -> Autoscaler {
        Autoscaler {
            config,
            policy: None,
            templates: None,
            catalog: Catalog::default(),
            batch: Batch::default(),
            ice: BTreeMap::new(),
            history: BTreeMap::new(),
            recent: HashMap::new(),
            given_up: HashMap::new(),
            planned: BTreeMap::new(),
            seen: HashMap::new(),
            registered: HashSet::new(),
            lost: HashMap::new(),
            removed: HashMap::new(),
            launch_backoff: HashMap::new(),
            restored: false,
            drains: BTreeMap::new(),
            notified: HashMap::new(),
            nominated: HashMap::new(),
            unneeded_dry: BTreeMap::new(),
            kept: BTreeMap::new(),
            gpus_lost: BTreeSet::new(),
            not_ours_reported: BTreeSet::new(),
            replace: replace::Replacements::default(),
            consolidation_due: BTreeMap::new(),
            consolidation_seen: BTreeMap::new(),
            last_status: None,
            jitter_draws: 0,
            pass: None,
            last_plan: None,
            wake: Wake::default(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Puts a policy in force with the catalog its offerings are priced from.
    pub fn set_policy(&mut self, policy: Arc<Policy>, catalog: Catalog) {
        self.templates = Some(Arc::new(Templates::new(&policy, &catalog)));
        self.catalog = catalog;
        self.policy = Some(policy);
    }

    pub fn policy(&self) -> Option<&Arc<Policy>> {
        self.policy.as_ref()
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Whether the last leader's history must be read (with [`Autoscaler::restore`]) before
    /// the next pass decides anything.
    pub fn needs_restore(&self) -> bool {
        !self.restored
    }

    /// Restores cooldowns, back-offs and given-up launches from the status the last leader
    /// wrote (`status.json`; `None` when there is none).
    pub fn restore(&mut self, status_json: Option<&str>) {
        self.restored = true;
        let Some(json) = status_json else { return };
        for (id, at) in status::given_up_of(json) {
            self.given_up.entry(id).or_insert(at);
        }
        for (pool, h) in status::history_of(json) {
            let mine = self.history.entry(pool).or_default();
            mine.last_scale_up = mine.last_scale_up.max(h.last_scale_up);
            mine.last_scale_down = mine.last_scale_down.max(h.last_scale_down);
            mine.last_scale_down_failure =
                mine.last_scale_down_failure.max(h.last_scale_down_failure);
        }
    }

    /// Another replica may lead from now on: a pass under way is dropped, and the history is
    /// read again on taking over. `not_done` are the actions of the last step that were not
    /// carried out (their drains are not running).
    pub fn leadership_lost(&mut self, not_done: &[Action]) {
        self.pass = None;
        self.restored = false;
        for a in not_done {
            match a {
                Action::Drain(DrainOrder { node, .. }) | Action::RollBack { node, .. } => {
                    self.drains.remove(node);
                }
                Action::Nominate { uid, .. } => {
                    self.nominated.remove(uid);
                }
                _ => {}
            }
        }
    }

    /// New pods became unschedulable.
    pub fn unschedulable_seen(&mut self, now: Time) {
        self.batch.add(now);
    }

    /// When the batching window closes (a pass is due then); `None` when it is not open.
    pub fn batch_deadline(&self) -> Option<Time> {
        let (idle, max) = self
            .policy
            .as_ref()
            .map(|p| (p.batching.idle, p.batching.max))
            .unwrap_or((Duration::from_secs(1), Duration::from_secs(10)));
        self.batch.deadline(idle, max)
    }

    /// Whether the last pass kept nodes it would have removed but for `maxConcurrentDrains`:
    /// once drains end, the next pass removes more of them. No timer says when, so a loop that
    /// skips the passes which cannot change the decision ([`Autoscaler::next_change`]) must not
    /// skip the next one.
    pub fn scale_down_held(&self) -> bool {
        self.last_plan
            .as_ref()
            .is_some_and(|p| p.held_for_drains > 0)
    }

    /// The plan of the last finished pass.
    pub fn last_plan(&self) -> Option<&Plan> {
        self.last_plan.as_ref()
    }

    /// Whether a drain (or rollback) of `node` is running.
    pub fn draining(&self, node: &str) -> bool {
        self.drains.contains_key(node)
    }

    pub fn drains(&self) -> usize {
        self.drains.len()
    }

    /// Whether a pass has steps left (it waits for [`Feedback`]).
    pub fn in_pass(&self) -> bool {
        self.pass.is_some()
    }

    /// When the decision could change with nothing new observed: an unneeded node's delay, a
    /// pool's cooldown or scale-down back-off running out; while pods wait, an unavailable
    /// offering or a pool's launch back-off expiring. `None` when nothing is timed.
    pub fn next_change(&self, now: Time) -> Option<Time> {
        let (Some(policy), Some(plan)) = (&self.policy, &self.last_plan) else {
            return None;
        };
        let mut next: Option<Time> = None;
        let mut consider = |t: Time| {
            if t > now {
                next = Some(next.map_or(t, |n: Time| n.min(t)));
            }
        };
        for u in &plan.unneeded {
            let Some(pool) = self
                .wake
                .unneeded_pools
                .get(&u.node)
                .and_then(|p| policy.pool(p))
            else {
                continue;
            };
            if let Ok(since) = Time::parse_rfc3339(&u.since) {
                consider(since + pool.scale_down.unneeded_time);
                consider(since + pool.scale_down.empty_unneeded_time);
            }
            if let Some(h) = self.history.get(&pool.name) {
                if let Some(t) = h.last_scale_up {
                    consider(t + pool.scale_down.cooldown_after_scale_up);
                }
                if let Some(t) = h.last_scale_down_failure {
                    consider(t + pool.scale_down.backoff_after_failure);
                }
            }
            if let Some(t) = self.wake.newest_in_pool.get(&pool.name) {
                consider(*t + pool.scale_down.cooldown_after_scale_up);
            }
        }
        if plan.unschedulable.iter().any(|u| !u.permanent) {
            for until in self.ice.values() {
                consider(*until);
            }
            for (until, _) in self.launch_backoff.values() {
                consider(*until);
            }
        }
        for t in self.replace.timers() {
            consider(t);
        }
        // A pool whose last look found nothing is looked at again when something changes (a
        // pass comes then anyway) or after a while; one with nodes and no look yet, when due.
        for (pool, due) in &self.consolidation_due {
            match self.consolidation_seen.get(pool) {
                Some((_, at)) => consider((*at + CONSOLIDATION_RELOOK).max(*due)),
                None => consider(*due),
            }
        }
        if let Some(t) = plan.spot_wait_until {
            consider(t);
        }
        next
    }

    /// Starts a pass. Returns its first actions; feed outcomes back with [`Autoscaler::resume`]
    /// until it returns none.
    pub fn pass(&mut self, mut obs: Observation) -> Vec<Action> {
        self.pass = None;
        self.batch.clear();
        let mut out = Vec::new();
        if !self.restored {
            // Deciding without the last leader's cooldowns and back-offs could scale too early.
            return out;
        }
        let now = obs.now;
        // Giving nodes back needs neither a policy nor the cloud.
        self.roll_back_expired_drains(&obs.snapshot, now, &mut out);
        let (Some(policy), Some(instances)) = (self.policy.clone(), obs.instances) else {
            return out;
        };
        self.ice.retain(|_, until| *until > now);
        self.given_up.retain(|_, at| now.since(*at) < GIVEN_UP_FOR);
        self.removed.retain(|_, at| now.since(*at) < REMOVED_FOR);
        self.track_instances(&instances, now);
        if let Some(x) = obs.gpu_xids.take() {
            self.replace.xids = x;
        }
        self.record_notices(
            std::mem::take(&mut obs.notices),
            &instances,
            now,
            now + policy.insufficient_capacity_ttl,
            &mut out,
        );
        {
            let ours: HashSet<&str> = instances.iter().map(|i| i.provider_id.as_str()).collect();
            fleet::adopt_nodes(&mut obs.snapshot.nodes, &ours, &policy.pools);
        }
        self.learn_templates(&obs.snapshot.nodes, &mut out);
        let index = NodeIndex::new(&obs.snapshot.nodes);
        let view = self.fleet_of(&instances, &index, &obs.other_provider_ids, &policy, now);
        let regs = registrations(instances.iter(), &index, &policy.pools, &self.catalog);
        drop(index);
        let pod_index = if self.config.report {
            obs.snapshot
                .pods
                .iter()
                .enumerate()
                .map(|(i, p)| (p.id.to_string(), i))
                .collect()
        } else {
            HashMap::new()
        };
        let mut pass = Pass {
            now,
            snapshot: obs.snapshot,
            instances,
            view,
            policy,
            templates: self.templates.clone(),
            policy_valid: obs.policy_valid,
            pod_index,
            moving: BTreeMap::new(),
            released: BTreeSet::new(),
            moved_from: HashMap::new(),
            launch_failed: BTreeMap::new(),
            stage: Stage::Registering(BTreeMap::new()),
        };
        if !self.config.dry_run && !regs.is_empty() {
            out.extend(regs.values().cloned().map(Action::Register));
            pass.stage = Stage::Registering(regs);
            self.pass = Some(pass);
            return out;
        }
        self.after_registration(pass, regs, &mut out);
        out
    }

    /// Continues the pass with the outcomes of its last actions.
    pub fn resume(&mut self, feedback: Vec<Feedback>) -> Vec<Action> {
        let mut out = Vec::new();
        let Some(mut pass) = self.pass.take() else {
            return out;
        };
        match std::mem::replace(&mut pass.stage, Stage::Registering(BTreeMap::new())) {
            Stage::Registering(regs) => {
                let changed = feedback.iter().any(|f| {
                    matches!(f, Feedback::Registered { node, changed: true }
                        if regs.get(node).is_some_and(Registration::changes_shape))
                });
                if changed {
                    // Decide on what the API server shows once the registrations are in: a pass
                    // that planned on nodes registered in the same pass was seen (on a loaded
                    // machine) to leave them out and launch again for pods they would take.
                    for r in regs.values() {
                        out.push(Action::Log {
                            level: Level::Info,
                            message: format!("registered node {} in pool {}", r.node, r.pool),
                        });
                    }
                    return out;
                }
                self.after_registration(pass, regs, &mut out);
            }
            Stage::Launching {
                round,
                plan,
                issued,
            } => {
                self.after_launches(pass, round, *plan, issued, feedback, &mut out);
            }
        }
        out
    }

    /// A drain (or rollback) ended.
    pub fn drain_finished(&mut self, node: &str, outcome: DrainOutcome, now: Time) -> Vec<Action> {
        let mut out = Vec::new();
        let Some(pool) = self.drains.remove(node) else {
            return out;
        };
        if let Some(r) = self.replace.replacing.get_mut(node) {
            match outcome {
                DrainOutcome::Removed => {
                    let cause = r.cause.as_str();
                    self.replace.replacing.remove(node);
                    self.removed.insert(node.to_string(), now);
                    if let Some(p) = pool {
                        out.push(Action::Count(Count::Replaced { pool: p, cause }));
                    }
                }
                DrainOutcome::RolledBack(why) | DrainOutcome::Failed(why) => {
                    r.retry_after = Some(now + replace::RETRY_AFTER);
                    out.push(Action::Log {
                        level: Level::Warn,
                        message: format!(
                            "replacing {node}: its drain failed ({why}); tried again in {}s",
                            replace::RETRY_AFTER.as_secs()
                        ),
                    });
                }
                DrainOutcome::Abandoned => {}
            }
            return out;
        }
        match outcome {
            DrainOutcome::Removed => {
                self.removed.insert(node.to_string(), now);
                if let Some(p) = pool {
                    out.push(Action::Count(Count::ScaleDown { pool: p.clone() }));
                    self.history.entry(p).or_default().last_scale_down = Some(now);
                }
            }
            DrainOutcome::RolledBack(why) | DrainOutcome::Failed(why) => {
                out.push(Action::Log {
                    level: Level::Warn,
                    message: format!("scale-down of {node} failed: {why}"),
                });
                if let Some(p) = pool {
                    // The pool's scale-down back-off (kept in the status: it survives failover).
                    self.history.entry(p).or_default().last_scale_down_failure = Some(now);
                }
            }
            DrainOutcome::Abandoned => {}
        }
        out
    }

    // ---- the steps of a pass ----

    fn after_registration(
        &mut self,
        mut pass: Pass,
        regs: BTreeMap<String, Registration>,
        out: &mut Vec<Action>,
    ) {
        let now = pass.now;
        for n in &mut pass.snapshot.nodes {
            if let Some(r) = regs.get(&n.name) {
                r.apply(n);
            }
            if self.config.dry_run {
                if let Some(since) = self.unneeded_dry.get(&n.name) {
                    Arc::make_mut(&mut n.annotations)
                        .insert(labels::UNNEEDED_SINCE.into(), since.clone());
                }
            }
        }
        self.give_up_overdue(&pass, out);
        self.report_gpus_lost(&pass.view, out);
        self.resume_drains(&pass, out);
        self.replace_nodes(&mut pass, out);
        if pass.templates.is_none() {
            return;
        }
        self.plan_round(pass, 0, now, out);
    }

    /// Plans with what is known now and asks for the launches.
    fn plan_round(&mut self, mut pass: Pass, round: u32, now: Time, out: &mut Vec<Action>) {
        let Some(templates) = pass.templates.clone() else {
            return;
        };
        if round > 0 {
            self.call_off_short_consolidations(&mut pass, out);
        }
        pass.snapshot.in_flight = pass.view.in_flight.clone();
        let keep = pass.policy.max_node_provision_time;
        self.planned.retain(|_, (at, _)| now.since(*at) < keep);
        pass.snapshot.planned = self
            .planned
            .iter()
            .map(|(id, (_, lists))| (id.clone(), lists.clone()))
            .collect();
        pass.snapshot.unavailable = self.ice.clone();
        pass.snapshot.pools = self
            .history
            .iter()
            .map(|(pool, h)| {
                let state = PoolState {
                    last_scale_up: h.last_scale_up,
                    last_scale_down_failure: h.last_scale_down_failure,
                };
                (pool.clone(), state)
            })
            .collect();
        let now_templates = templates.for_snapshot(&pass.snapshot, now);
        pass.released
            .extend(plan::consolidate::release_for_on_demand(
                &mut pass.snapshot,
                &now_templates,
                &pass.policy,
            ));
        let restored = self.restore_nominations(&mut pass.snapshot);
        let plan = plan::plan_with(&pass.snapshot, &templates, &pass.policy, now);
        self.nominate(&pass.snapshot, &plan, &restored, out);
        // A launch whose capacity went to other pods is done with: its capacity given to them by
        // this plan (in flight), or its instance already a Node (the scheduler placed pods on
        // it). Its own pods, planned again, need a launch of their own: under the old id the
        // provider would answer with the instance it already has and launch nothing. A launch
        // still on its way and not used by the plan keeps its id: asking again for it launches
        // nothing new (after a crash, or while the cloud lists it with less than the plan can
        // place pods on).
        let mut taken: HashSet<&str> = HashSet::new();
        if !plan.scale_ups.is_empty() {
            taken.extend(
                plan.existing_capacity
                    .iter()
                    .filter_map(|p| p.target.strip_prefix("launch/")),
            );
            let nodes = NodeIndex::new(&pass.snapshot.nodes);
            taken.extend(
                pass.instances
                    .iter()
                    .filter(|i| nodes.contains(&i.provider_id))
                    .map(|i| i.launch_id.as_str()),
            );
        }
        let mut issued = Vec::with_capacity(plan.scale_ups.len());
        for su in &plan.scale_ups {
            let pool = pass.policy.pool(&su.pool);
            let mut attempt = 0;
            let mut req = launch_request(su, pool, attempt);
            while self.given_up.contains_key(&req.launch_id)
                || taken.contains(req.launch_id.as_str())
            {
                attempt += 1;
                req = launch_request(su, pool, attempt);
            }
            out.push(Action::Count(Count::Planned { pods: pod_keys(su) }));
            let what = describe(su);
            if self.config.dry_run {
                // Reasons of its own, so that it can run beside the Cluster Autoscaler, whose
                // Events (TriggeredScaleUp, NotTriggerScaleUp, ScaleDown) tools read.
                notify_pods(
                    &pass,
                    su,
                    "DryRunScaleUp",
                    format!("would launch {what}"),
                    out,
                );
                issued.push(Issued {
                    launch_id: req.launch_id,
                    launched: false,
                });
                continue;
            }
            let backing_off = self
                .launch_backoff
                .get(&su.pool)
                .is_some_and(|(until, _)| *until > now);
            if backing_off {
                issued.push(Issued {
                    launch_id: req.launch_id,
                    launched: false,
                });
                continue;
            }
            out.push(Action::Log {
                level: Level::Info,
                message: format!("launching {what} (launch id {})", req.launch_id),
            });
            // Pending pods only: pods moving off a node being replaced stay where they run
            // until it is drained, and are planned afresh at every pass.
            if !su.pods_per_node.is_empty() {
                let mut pods = su.pods.iter();
                let lists = su
                    .pods_per_node
                    .iter()
                    .map(|&n| {
                        pods.by_ref()
                            .take(n)
                            .filter(|p| !pass.moved_from.contains_key(&p.key))
                            .map(|p| p.key.clone())
                            .collect()
                    })
                    .collect();
                self.planned
                    .insert(req.launch_id.clone(), (now, Arc::new(lists)));
            }
            issued.push(Issued {
                launch_id: req.launch_id.clone(),
                launched: true,
            });
            out.push(Action::Launch {
                request: req,
                pods: pod_keys(su),
            });
        }
        let waiting = issued.iter().any(|i| i.launched);
        pass.stage = Stage::Launching {
            round,
            plan: Box::new(plan),
            issued,
        };
        if waiting {
            self.pass = Some(pass);
        } else {
            let Stage::Launching {
                round,
                plan,
                issued,
            } = std::mem::replace(&mut pass.stage, Stage::Registering(BTreeMap::new()))
            else {
                unreachable!("set above")
            };
            self.after_launches(pass, round, *plan, issued, Vec::new(), out);
        }
    }

    /// Gangs' pending pods whose nomination made here the scheduler has cleared (it tried the pod
    /// while the node was still NotReady) are planned as nominated: this pass nominates them again
    /// before the node turns Ready. Without it the plan would expect single pods on the gang's
    /// registered node (as the scheduler places them when nothing is nominated there) and launch
    /// another node for the member. Single pods are planned afresh: the plan places bigger pods
    /// first anyway, and keeping every earlier placement cost more where pods arrive in bursts
    /// (the `multigpu40` trace, +0.75 % over three seeds). Returns their indices.
    fn restore_nominations(&self, snapshot: &mut Snapshot) -> HashSet<usize> {
        let mut restored = HashSet::new();
        if self.nominated.is_empty() {
            return restored;
        }
        for (i, p) in snapshot.pods.iter_mut().enumerate() {
            if p.nominated_node.is_none() && p.is_pending() && p.gang.is_some() {
                if let Some(node) = self.nominated.get(&p.uid) {
                    p.nominated_node = Some(node.clone());
                    restored.insert(i);
                }
            }
        }
        restored
    }

    /// Nominates each pending pod that the plan places on a node of ours to that node
    /// (`status.nominatedNodeName`). The scheduler then tries that node first for the pod, and
    /// keeps the pod's room on it while placing pods of no higher priority: a one-GPU pod does not
    /// take the eight-GPU node launched for a gang's worker because that node turned Ready first
    /// and is the emptiest. A nomination made by someone else (the scheduler's, for a preemption)
    /// is left alone while its node exists. The scheduler clears a nomination when the pod fails
    /// to schedule (e.g. on the node while it is not Ready yet); the next pass sets it again.
    fn nominate(
        &mut self,
        snapshot: &Snapshot,
        plan: &Plan,
        restored: &HashSet<usize>,
        out: &mut Vec<Action>,
    ) {
        if self.config.dry_run {
            return;
        }
        if !self.nominated.is_empty() {
            let pending: HashSet<&str> = snapshot
                .pods
                .iter()
                .filter(|p| p.is_pending())
                .map(|p| p.uid.as_str())
                .collect();
            self.nominated
                .retain(|uid, _| pending.contains(uid.as_str()));
        }
        let mut nodes: Option<HashMap<&str, &Node>> = None;
        for placed in &plan.existing_capacity {
            if placed.target.starts_with("launch/") {
                continue;
            }
            let Some(pod) = snapshot.pods.get(placed.pod_index) else {
                continue;
            };
            let nodes = nodes.get_or_insert_with(|| {
                snapshot
                    .nodes
                    .iter()
                    .map(|n| (n.name.as_str(), n))
                    .collect()
            });
            let Some(node) = nodes.get(placed.target.as_str()) else {
                continue;
            };
            if node.pool().is_none() || node.deleting || !pod.is_pending() {
                continue;
            }
            let ours = self.nominated.get(&pod.uid).map(String::as_str);
            let shown = if restored.contains(&placed.pod_index) {
                None
            } else {
                pod.nominated_node.as_deref()
            };
            match shown {
                Some(n) if n == placed.target => continue,
                Some(n) if ours != Some(n) && nodes.contains_key(n) => continue,
                _ => {}
            }
            if self.config.report && ours != Some(placed.target.as_str()) {
                out.push(Action::Event(Note {
                    subject: pod_subject(pod),
                    warning: false,
                    reason: "Nominated",
                    action: "Nominate",
                    message: format!("expected on node {} (nominated)", placed.target),
                }));
            }
            self.nominated
                .insert(pod.uid.clone(), placed.target.clone());
            out.push(Action::Nominate {
                pod: placed.pod.clone(),
                uid: pod.uid.clone(),
                node: placed.target.clone(),
            });
        }
    }

    fn after_launches(
        &mut self,
        mut pass: Pass,
        round: u32,
        plan: Plan,
        issued: Vec<Issued>,
        feedback: Vec<Feedback>,
        out: &mut Vec<Action>,
    ) {
        let now = pass.now;
        let mut results: HashMap<String, Result<LaunchResult, ProviderError>> = feedback
            .into_iter()
            .filter_map(|f| match f {
                Feedback::Launched { launch_id, result } => Some((launch_id, result)),
                Feedback::Registered { .. } => None,
            })
            .collect();
        let ttl = pass.policy.insufficient_capacity_ttl;
        let mut capacity_failed = false;
        let mut launched: Vec<Vec<Instance>> = Vec::with_capacity(issued.len());
        for (su, is) in plan.scale_ups.iter().zip(&issued) {
            if !is.launched {
                launched.push(Vec::new());
                continue;
            }
            // A launch the executor did not answer did not happen (leadership lost meanwhile).
            let result = results.remove(&is.launch_id).unwrap_or_else(|| {
                Ok(LaunchResult {
                    launched: Vec::new(),
                    failures: Vec::new(),
                })
            });
            let mut other_failure = false;
            let mut failure: Option<String> = None;
            let instances = match result {
                Ok(res) => {
                    for (key, err) in &res.failures {
                        out.push(Action::Count(Count::FailedLaunch {
                            pool: su.pool.clone(),
                            reason: err.metric_label(),
                        }));
                        if matches!(err, ProviderError::InsufficientCapacity { .. }) {
                            capacity_failed |= !self.ice.contains_key(key);
                            self.ice.insert(key.clone(), now + ttl);
                        } else {
                            out.push(Action::Log {
                                level: Level::Warn,
                                message: format!("pool {}: launching {key} failed: {err}", su.pool),
                            });
                            other_failure = true;
                        }
                        failure.get_or_insert_with(|| format!("launching {key} failed: {err}"));
                    }
                    res.launched
                }
                Err(e) => {
                    out.push(Action::Log {
                        level: Level::Warn,
                        message: format!("pool {}: launch failed: {e}", su.pool),
                    });
                    out.push(Action::Count(Count::FailedLaunch {
                        pool: su.pool.clone(),
                        reason: e.metric_label(),
                    }));
                    other_failure = true;
                    failure = Some(format!("launch failed: {e}"));
                    Vec::new()
                }
            };
            let n = instances.len() as u32;
            if let (true, Some(why)) = (n < su.count, failure) {
                for p in su
                    .pods
                    .iter()
                    .filter(|p| pass.moved_from.contains_key(&p.key))
                {
                    pass.launch_failed.insert(p.key.clone(), why.clone());
                }
            }
            if other_failure {
                let failures = self.launch_backoff.get(&su.pool).map_or(0, |b| b.1) + 1;
                self.jitter_draws += 1;
                let wait = backoff(
                    Duration::from_secs(5),
                    Duration::from_secs(300),
                    failures - 1,
                    jitter_unit(self.config.seed ^ self.jitter_draws.rotate_left(32)),
                );
                out.push(Action::Log {
                    level: Level::Warn,
                    message: format!(
                        "pool {}: launches wait {}s after {failures} failure(s)",
                        su.pool,
                        wait.as_secs()
                    ),
                });
                self.launch_backoff
                    .insert(su.pool.clone(), (now + wait, failures));
            } else if n == su.count {
                self.launch_backoff.remove(&su.pool);
            }
            for i in &instances {
                self.recent.insert(i.id.clone(), (i.clone(), now));
                self.seen.insert(i.id.clone(), i.launch_id.clone());
            }
            if n > 0 {
                out.push(Action::Count(Count::ScaleUps {
                    pool: su.pool.clone(),
                    nodes: n,
                }));
                // A gang's launch counts once it is whole (below).
                if su.gang.is_none() {
                    self.history
                        .entry(su.pool.clone())
                        .or_default()
                        .last_scale_up = Some(now);
                }
                let what = describe(su);
                let note = if n < su.count {
                    format!("launched {n} of {what}; the rest is planned again")
                } else {
                    format!("launched {what}")
                };
                notify_pods(&pass, su, "TriggeredScaleUp", note, out);
            }
            launched.push(instances);
        }
        if !self.config.dry_run {
            self.settle_gangs(&pass, &plan, &issued, &launched, out);
        }
        // An offering just found short of capacity is now avoided: plan the rest again at once.
        // Other failures wait for their back-off.
        if capacity_failed && round + 1 < CAPACITY_ROUNDS && !self.config.dry_run {
            let nodes = std::mem::take(&mut pass.snapshot.nodes);
            let index = NodeIndex::new(&nodes);
            pass.view = self.fleet_of(&pass.instances, &index, &[], &pass.policy, now);
            drop(index);
            pass.snapshot.nodes = nodes;
            self.plan_round(pass, round + 1, now, out);
            return;
        }
        self.finish(pass, plan, out);
    }

    /// All or nothing: a gang whose scale-ups were not all fulfilled gives its instances back
    /// and is planned again under a new launch id.
    fn settle_gangs(
        &mut self,
        pass: &Pass,
        plan: &Plan,
        issued: &[Issued],
        launched: &[Vec<Instance>],
        out: &mut Vec<Action>,
    ) {
        let short: BTreeSet<&str> = plan
            .scale_ups
            .iter()
            .zip(issued.iter().zip(launched))
            .filter(|(su, (is, l))| !is.launched || (l.len() as u32) < su.count)
            .filter_map(|(su, _)| su.gang.as_deref())
            .collect();
        for ((su, is), l) in plan.scale_ups.iter().zip(issued).zip(launched) {
            let Some(g) = su.gang.as_deref() else {
                continue;
            };
            if short.contains(g) {
                if l.is_empty() {
                    continue;
                }
                self.given_up.insert(is.launch_id.clone(), pass.now);
                for i in l {
                    self.recent.remove(&i.id);
                    out.push(Action::Terminate {
                        pool: su.pool.clone(),
                        instance_id: i.id.clone(),
                        why: format!("giving back the partial launch of gang {g}"),
                    });
                }
                notify_pods(
                    pass,
                    su,
                    "NotTriggerScaleUp",
                    format!(
                        "gang {g} could not be launched whole; its {} instance(s) were given \
                         back and it is planned again",
                        l.len()
                    ),
                    out,
                );
            } else if !l.is_empty() {
                self.history
                    .entry(su.pool.clone())
                    .or_default()
                    .last_scale_up = Some(pass.now);
            }
        }
    }

    /// The rest of a pass once launching is done: reasons for the pods it cannot help, drains,
    /// "unneeded since" annotations, the status.
    fn finish(&mut self, pass: Pass, plan: Plan, out: &mut Vec<Action>) {
        if self.config.report {
            self.report(&pass, &plan, out);
        }
        self.drain_replaced(&pass, &plan, out);
        self.scale_down(&pass, &plan, out);
        self.keep_unneeded(&pass, &plan, out);
        self.keep_free_for_spot(&pass, &plan, out);
        if self.config.report {
            self.publish(&pass, &plan, out);
        }
        // What `next_change` needs: each unneeded node's pool, each pool's newest node or launch
        // (the planner's cooldown starts there too). Names are cloned per pool and per unneeded
        // node only: this runs every pass.
        let mut newest: BTreeMap<String, Time> = BTreeMap::new();
        let mut note = |pool: &str, t: Time| match newest.get_mut(pool) {
            Some(n) => *n = (*n).max(t),
            None => {
                newest.insert(pool.to_string(), t);
            }
        };
        for n in &pass.snapshot.nodes {
            if let Some(p) = n.pool() {
                note(p, n.created);
            }
        }
        for f in &pass.snapshot.in_flight {
            note(&f.pool, f.launched_at);
        }
        let unneeded: HashSet<&str> = plan.unneeded.iter().map(|u| u.node.as_str()).collect();
        let pools: BTreeMap<String, String> = pass
            .snapshot
            .nodes
            .iter()
            .filter(|n| unneeded.contains(n.name.as_str()))
            .filter_map(|n| n.pool().map(|p| (n.name.clone(), p.to_string())))
            .collect();
        self.wake = Wake {
            unneeded_pools: pools,
            newest_in_pool: newest,
        };
        self.last_plan = Some(plan);
    }

    // ---- replacing broken and interrupted nodes ----

    /// Decides which nodes of ours start (or stop) being replaced, and plans their GPU pods
    /// again as pending.
    fn replace_nodes(&mut self, pass: &mut Pass, out: &mut Vec<Action>) {
        if self.config.dry_run {
            return;
        }
        let policy = pass.policy.clone();
        let templates = pass.templates.clone();
        let drains = &self.drains;
        self.replace
            .retain_nodes(&pass.snapshot.nodes, |n| drains.contains_key(n));
        self.replace.adopt_tainted(&pass.snapshot.nodes, pass.now);
        // Per pool: nodes, and nodes being replaced for health.
        let mut sizes: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for n in &pass.snapshot.nodes {
            let Some(p) = n.pool() else { continue };
            let e = sizes.entry(p).or_default();
            e.0 += 1;
            if self
                .replace
                .replacing
                .get(&n.name)
                .is_some_and(|r| r.cause == replace::Cause::Unhealthy)
            {
                e.1 += 1;
            }
        }
        let mut started: BTreeMap<String, usize> = BTreeMap::new();
        for n in &pass.snapshot.nodes {
            let ours = n
                .provider_id
                .as_ref()
                .is_some_and(|p| pass.view.instance_of_node.contains_key(p));
            let pool = n.pool().and_then(|p| policy.pool(p));
            let (true, Some(pool)) = (ours, pool) else {
                continue;
            };
            if n.deleting || self.drains.contains_key(&n.name) || has_drain_taint(n) {
                continue;
            }
            let template = templates.as_ref().and_then(|t| t.find(&pool.name, n));
            let xids = self
                .replace
                .xids
                .get(&n.name)
                .map_or(&[][..], Vec::as_slice);
            let unhealthy = replace::health_signal(n, pool, template, xids);
            let notices = n
                .provider_id
                .as_ref()
                .and_then(|p| pass.view.instance_of_node.get(p))
                .and_then(|i| self.replace.notices.get(i));
            let interrupted = replace::interruption_signal(n, pool, &policy, notices);
            let (size, busy) = sizes.get(pool.name.as_str()).copied().unwrap_or((0, 0));
            let busy = busy + started.get(&pool.name).copied().unwrap_or(0);
            let allowed = busy < replace::replacing_allowed(pool, size);
            let step = self.replace.step(
                n,
                interrupted.as_ref().map(|i| i.why.as_str()),
                unhealthy,
                allowed,
                pass.now,
            );
            if let (Some(i), Some(r)) = (&interrupted, self.replace.replacing.get_mut(&n.name)) {
                if r.cause == replace::Cause::Interrupted && r.reclaimed_at.is_none() {
                    let instance = instance_of(n, &pass.view, &pass.instances);
                    let spot = instance.is_some_and(|i| {
                        i.offering.capacity_type == gpu_node_autoscaler_provider::CapacityType::Spot
                    });
                    let warned = instance.and_then(|i| self.replace.spot_warned.get(&i.id));
                    r.reclaimed_at = replace::reclaimed_at(i, spot, warned.copied(), pass.now);
                }
            }
            let Some(step) = step else {
                continue;
            };
            let node = n.name.clone();
            match step {
                replace::Step::Seen { since } => out.push(Action::Annotate {
                    node,
                    key: labels::UNHEALTHY_SINCE,
                    value: Some(since.to_rfc3339()),
                }),
                replace::Step::Start { cause, why } => {
                    if cause == replace::Cause::Unhealthy {
                        *started.entry(pool.name.clone()).or_default() += 1;
                    }
                    if interrupted.as_ref().is_some_and(|i| i.from_handler) {
                        // As a queue's spot notice does: the offering being reclaimed is short
                        // of capacity, and the replacement is planned elsewhere.
                        self.mark_reclaimed(n, &pass.view, &pass.instances, &policy, pass.now);
                    }
                    out.push(Action::Taint {
                        node: node.clone(),
                        taint: replace::replacing_taint(cause),
                        present: true,
                    });
                    out.push(Action::Event(Note {
                        subject: Subject::Node(node.clone()),
                        warning: true,
                        reason: match cause {
                            replace::Cause::Unhealthy => "ReplacingUnhealthyNode",
                            replace::Cause::Interrupted => "ReplacingInterruptedNode",
                            replace::Cause::Consolidating => "Consolidating",
                        },
                        action: "Replace",
                        message: format!(
                            "replacing {node} (pool {}): {why}; its pods get a place elsewhere, \
                             then it is drained",
                            pool.name
                        ),
                    }));
                    out.push(Action::Log {
                        level: Level::Warn,
                        message: format!("replacing node {node} (pool {}): {why}", pool.name),
                    });
                }
                replace::Step::Recovered => {
                    if n.annotations.contains_key(labels::UNHEALTHY_SINCE) {
                        out.push(Action::Annotate {
                            node: node.clone(),
                            key: labels::UNHEALTHY_SINCE,
                            value: None,
                        });
                    }
                    if n.taints.iter().any(|t| t.key == labels::REPLACING_TAINT) {
                        out.push(Action::Taint {
                            node: node.clone(),
                            taint: replace::replacing_taint(replace::Cause::Unhealthy),
                            present: false,
                        });
                        out.push(Action::Event(Note {
                            subject: Subject::Node(node.clone()),
                            warning: false,
                            reason: "NodeRecovered",
                            action: "Replace",
                            message: format!(
                                "{node} is healthy again: its replacement is called off"
                            ),
                        }));
                    }
                }
                replace::Step::Deferred { why } => out.push(Action::Event(Note {
                    subject: Subject::Node(node.clone()),
                    warning: true,
                    reason: "ReplacementDeferred",
                    action: "Replace",
                    message: format!("{node} is not replaced yet: {why}"),
                })),
            }
        }
        out.push(Action::Count(Count::NodesUnhealthy(
            self.replace.unhealthy_count(),
        )));
        if let Some(t) = templates.as_deref() {
            self.consolidate(pass, &policy, t, out);
        }
        // After the taints that record them.
        for message_id in std::mem::take(&mut self.replace.to_ack) {
            out.push(Action::AckNotice { message_id });
        }
        pass.moving = replace::plan_as_moving(
            &mut pass.snapshot,
            &self.replace.replacing,
            &mut pass.moved_from,
        );
    }

    /// GPU-aware consolidation: per pool that has it, once per `consolidation.interval`, plans
    /// the running pods again (`plan::consolidate`) and starts replacing the nodes whose pods
    /// fit cheaper capacity. One consolidation at a time per pool; only nodes of ours.
    fn consolidate(
        &mut self,
        pass: &mut Pass,
        policy: &Policy,
        templates: &Templates,
        out: &mut Vec<Action>,
    ) {
        let now = pass.now;
        self.call_off_short_consolidations(pass, out);
        let enabled: Vec<&crate::policy::Pool> = policy
            .pools
            .iter()
            .filter(|p| p.consolidation.enabled)
            .collect();
        self.consolidation_due
            .retain(|p, _| enabled.iter().any(|e| &e.name == p));
        self.consolidation_seen
            .retain(|p, _| enabled.iter().any(|e| &e.name == p));
        if enabled.is_empty() {
            return;
        }
        let pool_of_node: HashMap<&str, &str> = pass
            .snapshot
            .nodes
            .iter()
            .filter_map(|n| n.pool().map(|p| (n.name.as_str(), p)))
            .collect();
        let busy: BTreeSet<String> = self
            .replace
            .replacing
            .iter()
            .filter(|(_, r)| r.cause == replace::Cause::Consolidating)
            .filter_map(|(n, _)| pool_of_node.get(n.as_str()).map(|p| p.to_string()))
            .collect();
        let due: Vec<&crate::policy::Pool> = enabled
            .into_iter()
            .filter(|p| !busy.contains(&p.name))
            .filter(|p| {
                self.consolidation_due
                    .get(&p.name)
                    .is_none_or(|t| *t <= now)
            })
            .collect();
        if due.is_empty() {
            return;
        }
        // The snapshot as the plan will see it: launches in flight, offerings short.
        let mut snapshot = pass.snapshot.clone();
        snapshot.in_flight = pass.view.in_flight.clone();
        snapshot.unavailable = self.ice.clone();
        // Only nodes of ours are replaced: others are left out of the candidates.
        let view = &pass.view;
        for n in &mut snapshot.nodes {
            let ours = n
                .provider_id
                .as_ref()
                .is_some_and(|p| view.instance_of_node.contains_key(p));
            if !ours {
                Arc::make_mut(&mut n.annotations)
                    .insert(labels::SCALE_DOWN_DISABLED.into(), "true".into());
            }
        }
        let for_snapshot = templates.for_snapshot(&snapshot, now);
        let drains_running = self.drains.len() + self.replace.replacing.len();
        for pool in due {
            self.consolidation_due
                .insert(pool.name.clone(), now + pool.consolidation.interval);
            // Nothing changed since a look that found nothing: look again only after a while
            // (the pods' age, which makes a move pay more, is all that changes).
            let fp = plan::consolidate::fingerprint(&snapshot, &pool.name);
            if let Some((seen, at)) = self.consolidation_seen.get(&pool.name) {
                if *seen == fp && now < *at + CONSOLIDATION_RELOOK {
                    continue;
                }
            }
            let found = plan::consolidate::consolidate(
                &snapshot,
                &for_snapshot,
                policy,
                pool,
                now,
                drains_running,
            );
            let c = match found {
                Ok(c) => c,
                Err(why) => {
                    self.consolidation_seen.insert(pool.name.clone(), (fp, now));
                    let key = format!("consolidation/{}", pool.name);
                    if self.replace.report_once(&key, &why) {
                        out.push(Action::Log {
                            level: Level::Info,
                            message: format!("pool {}: nothing to consolidate: {why}", pool.name),
                        });
                    }
                    continue;
                }
            };
            self.consolidation_seen.remove(&pool.name);
            let why = c.describe();
            for node in &c.nodes {
                self.replace.replacing.insert(
                    node.clone(),
                    replace::Replacing {
                        cause: replace::Cause::Consolidating,
                        why: why.clone(),
                        retry_after: None,
                        started: now,
                        offerings: c.offerings.clone(),
                        reclaimed_at: None,
                    },
                );
                out.push(Action::Taint {
                    node: node.clone(),
                    taint: replace::replacing_taint(replace::Cause::Consolidating),
                    present: true,
                });
                out.push(Action::Event(Note {
                    subject: Subject::Node(node.clone()),
                    warning: false,
                    reason: "Consolidating",
                    action: "Consolidate",
                    message: format!(
                        "replacing {node} (pool {}): {why}; its pods get a place elsewhere, \
                         then it is drained",
                        pool.name
                    ),
                }));
            }
            out.push(Action::Log {
                level: Level::Info,
                message: format!("pool {}: consolidating: {why}", pool.name),
            });
        }
    }

    /// A consolidation not draining yet whose planned offering ran short is called off: its pods
    /// would be launched for elsewhere, at a price the move was not weighed at. Also within a
    /// pass, before planning again after a launch ran short: its pods are back on their nodes.
    fn call_off_short_consolidations(&mut self, pass: &mut Pass, out: &mut Vec<Action>) {
        let now = pass.now;
        let short: Vec<(String, OfferingKey)> = self
            .replace
            .replacing
            .iter()
            .filter(|(n, r)| {
                r.cause == replace::Cause::Consolidating && !self.drains.contains_key(*n)
            })
            .filter_map(|(n, r)| {
                r.offerings
                    .iter()
                    .find(|o| self.ice.get(*o).is_some_and(|t| *t > now))
                    .map(|o| (n.clone(), o.clone()))
            })
            .collect();
        for (node, o) in short {
            self.call_off_consolidation(
                &node,
                format!(
                    "consolidation called off: {} {} {} ran short of capacity",
                    o.instance_type, o.zone, o.capacity_type
                ),
                out,
            );
            if let Some(pods) = pass.moving.remove(&node) {
                replace::unplan_moving(&mut pass.snapshot, &node, &pods, &pass.moved_from);
            }
        }
    }

    /// Gives up consolidating `node`: it keeps its pods and loses its taint.
    fn call_off_consolidation(&mut self, node: &str, why: String, out: &mut Vec<Action>) {
        self.replace.replacing.remove(node);
        out.push(Action::Taint {
            node: node.to_string(),
            taint: replace::replacing_taint(replace::Cause::Consolidating),
            present: false,
        });
        out.push(Action::Event(Note {
            subject: Subject::Node(node.to_string()),
            warning: true,
            reason: "ConsolidationCalledOff",
            action: "Consolidate",
            message: format!("{node} stays: {why}"),
        }));
    }

    /// An interruption handler says a spot instance of ours is being taken back: its offering
    /// counts as short of capacity for `insufficientCapacityTtl`, as with a queue's notice.
    fn mark_reclaimed(
        &mut self,
        n: &Node,
        view: &FleetView,
        instances: &[Instance],
        policy: &Policy,
        now: Time,
    ) {
        let Some(i) = instance_of(n, view, instances) else {
            return;
        };
        if i.offering.capacity_type == gpu_node_autoscaler_provider::CapacityType::Spot {
            let until = now + policy.insufficient_capacity_ttl;
            let e = self.ice.entry(i.offering.clone()).or_insert(until);
            *e = (*e).max(until);
        }
    }

    /// Keeps the queue's notices about instances of ours (until those instances are gone), to
    /// be acted on by `replace_nodes`; every message is acknowledged there. A spot offering
    /// being reclaimed is short of capacity: the replacement is planned elsewhere until
    /// `short_until`.
    fn record_notices(
        &mut self,
        notices: Vec<Notice>,
        instances: &[Instance],
        now: Time,
        short_until: Time,
        out: &mut Vec<Action>,
    ) {
        if self.config.dry_run {
            return;
        }
        let ours: HashMap<&str, &Instance> = instances.iter().map(|i| (i.id.as_str(), i)).collect();
        for n in notices {
            for (id, i) in n
                .instance_ids
                .iter()
                .filter_map(|id| ours.get(id.as_str()).map(|i| (id, i)))
            {
                let known = self.replace.notices.get(id.as_str());
                if n.kind == NoticeKind::SpotInterruption
                    && !known.is_some_and(|k| k.contains(&n.kind))
                {
                    self.ice.insert(i.offering.clone(), short_until);
                }
                if n.kind == NoticeKind::SpotInterruption {
                    let sent = n.sent_at_ms.map_or(now, Time).min(now);
                    let w = self.replace.spot_warned.entry(id.clone()).or_insert(sent);
                    *w = (*w).min(sent);
                }
                out.push(Action::Log {
                    level: Level::Info,
                    message: format!(
                        "{} notice for instance {id} (message {})",
                        n.kind.describe(),
                        n.message_id
                    ),
                });
                self.replace
                    .notices
                    .entry(id.clone())
                    .or_default()
                    .insert(n.kind);
            }
            self.replace.to_ack.push(n.message_id);
        }
        self.replace
            .notices
            .retain(|id, _| ours.contains_key(id.as_str()));
        self.replace
            .spot_warned
            .retain(|id, _| ours.contains_key(id.as_str()));
    }

    /// Drains the nodes being replaced whose pods have a place on nodes that exist (an
    /// interrupted one at once).
    fn drain_replaced(&mut self, pass: &Pass, plan: &Plan, out: &mut Vec<Action>) {
        if self.config.dry_run {
            return;
        }
        for (node, pods) in &pass.moving {
            let Some(r) = self.replace.replacing.get(node) else {
                continue;
            };
            if self.drains.contains_key(node) || r.retry_after.is_some_and(|t| t > pass.now) {
                continue;
            }
            let why = format!("replacing: {}", r.why);
            if r.cause == replace::Cause::Consolidating {
                if let Some(off) = replace::call_off_consolidation(
                    pods,
                    plan,
                    r.started,
                    pass.now,
                    pass.policy.max_node_provision_time,
                ) {
                    self.call_off_consolidation(node, off, out);
                    continue;
                }
            }
            if r.cause.waits_for_capacity() {
                if let Err(wait) = replace::ready_to_drain(pods, plan) {
                    if self.replace.report_once(node, &wait) {
                        out.push(Action::Log {
                            level: Level::Info,
                            message: format!("replacing {node}: {wait}"),
                        });
                    }
                    continue;
                }
            }
            let Some(n) = pass.snapshot.nodes.iter().find(|n| &n.name == node) else {
                continue;
            };
            if r.cause == replace::Cause::Interrupted {
                // Drained all the same (the instance goes anyway): say what its pods lack.
                if let Some(why) = replace::not_launched(pods, plan, &pass.launch_failed) {
                    out.push(Action::Event(Note {
                        subject: Subject::Node(node.clone()),
                        warning: true,
                        reason: "ReplacementNotLaunched",
                        action: "Replace",
                        message: format!(
                            "{node} is drained before its instance is taken back, but its pods' \
                             new capacity could not be launched: {why}; they wait as pending"
                        ),
                    }));
                    out.push(Action::Log {
                        level: Level::Warn,
                        message: format!("replacing interrupted node {node}: {why}"),
                    });
                }
            }
            let reclaimed_at = r.reclaimed_at;
            let deadline = replace::drain_deadline(
                pass.now,
                self.config.max_graceful_termination,
                reclaimed_at,
            );
            let mut order = self.drain(n, &pass.view, deadline, why);
            if let Action::Drain(d) = &mut order {
                d.reclaimed_at = reclaimed_at;
            }
            out.push(order);
        }
    }

    // ---- bookkeeping ----

    /// Corrects the templates by what registered nodes allocate, so that a pod that did not fit
    /// the node launched for it is not launched for again on the same instance type.
    fn learn_templates(&mut self, nodes: &[Node], out: &mut Vec<Action>) {
        let Some(templates) = self.templates.as_mut() else {
            return;
        };
        // Unshared between passes (the last pass was dropped): no copy.
        let changed = Arc::make_mut(templates).learn_from(nodes);
        for l in changed {
            let less = l.now.cpu_milli < l.was.cpu_milli
                || l.now.memory < l.was.memory
                || l.now.pods < l.was.pods;
            out.push(Action::Log {
                level: if less { Level::Warn } else { Level::Info },
                message: format!(
                    "{} nodes of pool {} allocate {} and {} pods (node {}), not {} and {} pods \
                     as planned: planning with what they allocate",
                    l.instance_type, l.pool, l.now, l.now.pods, l.node, l.was, l.was.pods
                ),
            });
        }
    }

    /// Keeps what this process launched until the cloud lists it, and retires the launch ids of
    /// instances that are gone (terminated, interrupted): the same pods planned again get a new
    /// launch, not the idempotent answer of the old one.
    fn track_instances(&mut self, listed: &[Instance], now: Time) {
        let live = |i: &Instance| {
            !matches!(
                i.state,
                InstanceState::Terminated | InstanceState::ShuttingDown
            )
        };
        let listed_ids: HashSet<&str> = listed.iter().map(|i| i.id.as_str()).collect();
        self.recent.retain(|id, (_, added)| {
            !listed_ids.contains(id.as_str()) && now.since(*added) < RECENT_FOR
        });
        let current: HashMap<&str, &str> = listed
            .iter()
            .filter(|i| live(i))
            .chain(self.recent.values().map(|(i, _)| i))
            .map(|i| (i.id.as_str(), i.launch_id.as_str()))
            .collect();
        let given_up = &mut self.given_up;
        self.seen.retain(|id, launch_id| {
            let there = current.contains_key(id.as_str());
            if !there && !launch_id.is_empty() {
                given_up.entry(launch_id.clone()).or_insert(now);
            }
            there
        });
        for (id, launch_id) in current {
            if !self.seen.contains_key(id) {
                self.seen.insert(id.to_string(), launch_id.to_string());
            }
        }
    }

    /// Joins the cloud's instances (listed, and launched here but not listed yet) with the
    /// Nodes: what is in flight, what is overdue, which instance each Node is.
    fn fleet_of(
        &mut self,
        listed: &[Instance],
        nodes: &NodeIndex,
        other_provider_ids: &[String],
        policy: &Policy,
        now: Time,
    ) -> FleetView {
        let listed_ids: HashSet<&str> = listed.iter().map(|i| i.id.as_str()).collect();
        let all: Vec<&Instance> = listed
            .iter()
            .chain(
                self.recent
                    .values()
                    .map(|(i, _)| i)
                    .filter(|i| !listed_ids.contains(i.id.as_str())),
            )
            .collect();
        let recent = &self.recent;
        let known = |id: &str| listed_ids.contains(id) || recent.contains_key(id);
        self.registered.retain(|id| known(id));
        self.lost.retain(|id, _| known(id));
        for i in &all {
            if nodes.contains(&i.provider_id) || other_provider_ids.contains(&i.provider_id) {
                if !self.registered.contains(&i.id) {
                    self.registered.insert(i.id.clone());
                }
                self.lost.remove(&i.id);
            } else if self.registered.contains(&i.id) {
                self.lost.entry(i.id.clone()).or_insert(now);
            }
        }
        let catalog = &self.catalog;
        let lost = &self.lost;
        fleet_view(
            all,
            nodes,
            now,
            policy.max_node_provision_time,
            |k: &OfferingKey| {
                catalog
                    .instance_type(&k.instance_type)
                    .is_none_or(|t| t.gpu.is_some())
            },
            |i: &Instance| lost.get(&i.id).copied().unwrap_or(Time(i.launched_at_ms)),
        )
    }

    /// Instances that never became working nodes: terminated, their offering avoided.
    fn give_up_overdue(&mut self, pass: &Pass, out: &mut Vec<Action>) {
        if self.config.dry_run {
            return;
        }
        let now = pass.now;
        for o in &pass.view.overdue {
            let i = &o.instance;
            let why = match &o.node {
                Some(n) => format!("node {n} never advertised its GPUs"),
                None => "no Node registered".to_string(),
            };
            out.push(Action::Log {
                level: Level::Warn,
                message: format!(
                    "giving up a launch ({}: instance {}, {}) after {}: {why}",
                    i.launch_id,
                    i.id,
                    i.offering,
                    format_duration(pass.policy.max_node_provision_time)
                ),
            });
            self.ice.insert(
                i.offering.clone(),
                now + pass.policy.insufficient_capacity_ttl,
            );
            self.given_up.insert(i.launch_id.clone(), now);
            out.push(Action::Count(Count::FailedLaunch {
                pool: i.pool.clone(),
                reason: "provision_timeout",
            }));
            self.recent.remove(&i.id);
            out.push(Action::Terminate {
                pool: i.pool.clone(),
                instance_id: i.id.clone(),
                why: why.clone(),
            });
            if let Some(n) = &o.node {
                out.push(Action::DeleteNode { node: n.clone() });
                out.push(Action::Event(Note {
                    subject: Subject::Node(n.clone()),
                    warning: true,
                    reason: "ScaleDown",
                    action: "GiveUp",
                    message: format!("instance {} removed: {why}", i.id),
                }));
            }
        }
    }

    /// Nodes whose GPUs went missing after they advertised them: reported (Event, log, gauge),
    /// never terminated for it (a device plugin restarting, a GPU operator upgrade).
    fn report_gpus_lost(&mut self, view: &FleetView, out: &mut Vec<Action>) {
        let now_lost: BTreeSet<String> = view.gpus_lost.iter().cloned().collect();
        for n in now_lost.difference(&self.gpus_lost) {
            out.push(Action::Log {
                level: Level::Warn,
                message: format!("node {n} advertises no GPUs any more; it is kept"),
            });
            out.push(Action::Event(Note {
                subject: Subject::Node(n.clone()),
                warning: true,
                reason: "GPUsUnavailable",
                action: "Observe",
                message: format!(
                    "{n} advertised GPUs and advertises none now (device plugin restarting, or \
                     GPUs lost); the node is kept, not given up as a failed launch"
                ),
            }));
        }
        for n in self.gpus_lost.difference(&now_lost) {
            out.push(Action::Log {
                level: Level::Info,
                message: format!("node {n} advertises its GPUs again"),
            });
        }
        out.push(Action::Count(Count::NodesGpusLost(now_lost.len())));
        self.gpus_lost = now_lost;
    }

    /// Drains of a previous leader (found from the taint) past their deadline: given back.
    fn roll_back_expired_drains(&mut self, snapshot: &Snapshot, now: Time, out: &mut Vec<Action>) {
        if self.config.dry_run {
            return;
        }
        for n in &snapshot.nodes {
            if self.drains.contains_key(&n.name)
                || self.removed.contains_key(&n.name)
                || n.deleting
                || !has_drain_taint(n)
                || drain_deadline(n, self.config.max_graceful_termination, now) > now
            {
                continue;
            }
            let pool = n.pool().map(str::to_string);
            self.drains.insert(n.name.clone(), pool.clone());
            out.push(Action::RollBack {
                node: n.name.clone(),
                pool,
                why: "a drain interrupted by a restart ran past its deadline".into(),
            });
        }
    }

    /// Drains of a previous leader (found from the taint) within their deadline: finished.
    fn resume_drains(&mut self, pass: &Pass, out: &mut Vec<Action>) {
        if self.config.dry_run {
            return;
        }
        for n in &pass.snapshot.nodes {
            if !has_drain_taint(n)
                || n.deleting
                || self.drains.contains_key(&n.name)
                || self.removed.contains_key(&n.name)
            {
                continue;
            }
            let deadline = drain_deadline(n, self.config.max_graceful_termination, pass.now);
            if deadline <= pass.now {
                continue;
            }
            out.push(Action::Log {
                level: Level::Info,
                message: format!("resuming an interrupted drain: node {}", n.name),
            });
            out.push(self.drain(n, &pass.view, deadline, "resumed after a restart".into()));
        }
    }

    fn drain(&mut self, n: &Node, view: &FleetView, deadline: Time, reason: String) -> Action {
        let pool = n.pool().unwrap_or("").to_string();
        self.drains
            .insert(n.name.clone(), Some(pool.clone()).filter(|p| !p.is_empty()));
        Action::Drain(DrainOrder {
            node: n.name.clone(),
            pool,
            instance_id: n
                .provider_id
                .as_ref()
                .and_then(|p| view.instance_of_node.get(p).cloned()),
            deadline,
            reason,
            reclaimed_at: None,
        })
    }

    fn scale_down(&mut self, pass: &Pass, plan: &Plan, out: &mut Vec<Action>) {
        let limit = pass.policy.max_concurrent_drains as usize;
        let mut not_ours = BTreeSet::new();
        for d in &plan.scale_downs {
            if self.drains.contains_key(&d.node) {
                continue;
            }
            let Some(node) = pass.snapshot.nodes.iter().find(|n| n.name == d.node) else {
                continue;
            };
            let ours = node
                .provider_id
                .as_ref()
                .is_some_and(|p| pass.view.instance_of_node.contains_key(p));
            // Dry-run lists no instance (it calls no cloud API): it says what it would drain.
            if !ours && !self.config.dry_run {
                // Adopted through a pool's nodeSelector, or labelled by hand: never terminated.
                if !self.not_ours_reported.contains(&d.node) {
                    out.push(Action::Event(Note {
                        subject: Subject::Node(d.node.clone()),
                        warning: false,
                        reason: "ScaleDownNotOwned",
                        action: "Report",
                        message: format!(
                            "{} is unneeded (pool {}, would save ${:.3}/hour: {}), but its \
                             instance was not launched by this autoscaler for this cluster: \
                             scale its node group down to remove it",
                            d.node, d.pool, d.saves_per_hour, d.reason
                        ),
                    }));
                }
                not_ours.insert(d.node.clone());
                continue;
            }
            if self.config.dry_run {
                out.push(Action::Event(Note {
                    subject: Subject::Node(d.node.clone()),
                    warning: false,
                    reason: "DryRunScaleDown",
                    action: "Drain",
                    message: format!(
                        "would drain and remove {} (pool {}, saves ${:.3}/hour): {}",
                        d.node, d.pool, d.saves_per_hour, d.reason
                    ),
                }));
                continue;
            }
            if self.drains.len() >= limit {
                continue;
            }
            let deadline = pass.now + self.config.max_graceful_termination;
            out.push(self.drain(node, &pass.view, deadline, d.reason.clone()));
        }
        self.not_ours_reported = not_ours;
    }

    /// What people see of a pass besides its actions: why pods get no node, why idle-looking
    /// nodes stay.
    fn report(&mut self, pass: &Pass, plan: &Plan, out: &mut Vec<Action>) {
        self.report_unschedulable(pass, plan, out);
        let kept: BTreeMap<String, String> = plan
            .kept
            .iter()
            .map(|k| (k.node.clone(), k.reason.clone()))
            .collect();
        for (node, reason) in &kept {
            if self.kept.get(node) != Some(reason) {
                out.push(Action::Log {
                    level: Level::Info,
                    message: format!("idle-looking node {node} kept: {reason}"),
                });
            }
        }
        self.kept = kept;
    }

    /// `NotTriggerScaleUp` once per pod and reason.
    fn report_unschedulable(&mut self, pass: &Pass, plan: &Plan, out: &mut Vec<Action>) {
        self.notified.retain(|k, _| pass.pod_index.contains_key(k));
        for u in &plan.unschedulable {
            if self.notified.get(&u.pod) == Some(&u.reason) {
                continue;
            }
            let Some(&i) = pass.pod_index.get(&u.pod) else {
                continue;
            };
            self.notified.insert(u.pod.clone(), u.reason.clone());
            out.push(Action::Event(Note {
                subject: pod_subject(&pass.snapshot.pods[i]),
                warning: false,
                reason: if self.config.dry_run {
                    "DryRunNoScaleUp"
                } else {
                    "NotTriggerScaleUp"
                },
                action: "ScaleUp",
                message: u.reason.clone(),
            }));
        }
    }

    /// Keeps "unneeded since" on the nodes (the annotation; in memory in dry-run).
    /// Taints the empty on-demand nodes new pods should stay off while spot is to be had
    /// ([`plan::consolidate::keep_free_for_spot`]), and untaints those that no longer qualify.
    fn keep_free_for_spot(&mut self, pass: &Pass, plan: &Plan, out: &mut Vec<Action>) {
        if self.config.dry_run {
            return;
        }
        let Some(templates) = pass.templates.as_ref() else {
            return;
        };
        let templates = templates.for_snapshot(&pass.snapshot, pass.now);
        let keep =
            plan::consolidate::keep_free_for_spot(&pass.snapshot, &templates, &pass.policy, plan);
        let draining: BTreeSet<&str> = plan.scale_downs.iter().map(|d| d.node.as_str()).collect();
        for n in &pass.snapshot.nodes {
            let tainted = pass.released.contains(&n.name)
                || n.taints
                    .iter()
                    .any(|t| t.key == labels::SPOT_AVAILABLE_TAINT);
            // Only a node whose instance is ours: one we would not remove would sit idle.
            let ours = n
                .provider_id
                .as_ref()
                .is_some_and(|p| pass.view.instance_of_node.contains_key(p));
            let wanted = ours && keep.contains(&n.name);
            if tainted == wanted || (tainted && draining.contains(n.name.as_str())) {
                continue;
            }
            out.push(Action::Taint {
                node: n.name.clone(),
                taint: plan::consolidate::spot_available_taint(),
                present: wanted,
            });
            if wanted {
                out.push(Action::Event(Note {
                    subject: Subject::Node(n.name.clone()),
                    warning: false,
                    reason: "KeptFreeForSpot",
                    action: "Consolidate",
                    message: format!(
                        "{} is an empty on-demand node and spot is to be had again in its pool: \
                         new pods get spot nodes, and it is removed as an empty node",
                        n.name
                    ),
                }));
            }
        }
    }

    fn keep_unneeded(&mut self, pass: &Pass, plan: &Plan, out: &mut Vec<Action>) {
        if self.config.dry_run {
            self.unneeded_dry = plan
                .unneeded
                .iter()
                .map(|u| (u.node.clone(), u.since.clone()))
                .collect();
            return;
        }
        let changes =
            plan::scale_down::unneeded_changes(&pass.snapshot.nodes, &plan.unneeded, |n| {
                self.drains.contains_key(&n.name)
            });
        for (node, value) in changes {
            out.push(Action::Annotate {
                node: node.to_string(),
                key: labels::UNNEEDED_SINCE,
                value: value.map(str::to_string),
            });
        }
    }

    /// The status, when it changed or at least every 10 s.
    fn publish(&mut self, pass: &Pass, plan: &Plan, out: &mut Vec<Action>) {
        let nodes: Vec<&Node> = pass.snapshot.nodes.iter().collect();
        let catalog = &self.catalog;
        let st = status::build(&StatusInput {
            now: pass.now,
            leader: &self.config.identity,
            dry_run: self.config.dry_run,
            policy_valid: pass.policy_valid,
            policy: &pass.policy,
            nodes: &nodes,
            in_flight: &pass.view.in_flight,
            gpus_of: &|t| {
                catalog
                    .instance_type(t)
                    .and_then(|t| t.gpu.as_ref())
                    .map_or(0, |g| i64::from(g.count))
            },
            plan,
            history: &self.history,
            unavailable: &self.ice,
            given_up: &self.given_up,
            replacements: &self.replace,
        });
        let mut timeless = st.clone();
        timeless.time.clear();
        let key = serde_json::to_string(&timeless).unwrap_or_default();
        if let Some((last, at)) = &self.last_status {
            if *last == key && pass.now.since(*at) < STATUS_EVERY {
                return;
            }
        }
        self.last_status = Some((key, pass.now));
        out.push(Action::Status(Box::new(st)));
    }
}

fn pod_subject(p: &crate::model::Pod) -> Subject {
    Subject::Pod {
        namespace: p.id.namespace.clone(),
        name: p.id.name.clone(),
        uid: p.uid.clone(),
    }
}

fn notify_pods(
    pass: &Pass,
    su: &ScaleUp,
    reason: &'static str,
    message: String,
    out: &mut Vec<Action>,
) {
    // Without reports the index is empty: no Event.
    for key in &su.pods {
        let Some(&i) = pass.pod_index.get(key.as_str()) else {
            continue;
        };
        out.push(Action::Event(Note {
            subject: pod_subject(&pass.snapshot.pods[i]),
            warning: false,
            reason,
            action: "ScaleUp",
            message: message.clone(),
        }));
    }
}

fn pod_keys(su: &ScaleUp) -> Vec<String> {
    su.pods.iter().map(|p| p.key.clone()).collect()
}

fn describe(su: &ScaleUp) -> String {
    let first = su.offerings.first();
    format!(
        "{} × {} in {} ({}), pool {}",
        su.count,
        first.map_or("-", |o| o.instance_type.as_str()),
        first.map_or("-", |o| o.zone.as_str()),
        first.map_or("-", |o| o.capacity_type.as_str()),
        su.pool
    )
}

/// The instance of ours a Node is, as the pools' listing names it.
fn instance_of<'a>(n: &Node, view: &FleetView, instances: &'a [Instance]) -> Option<&'a Instance> {
    n.provider_id
        .as_ref()
        .and_then(|p| view.instance_of_node.get(p))
        .and_then(|id| instances.iter().find(|i| &i.id == id))
}

fn has_drain_taint(n: &Node) -> bool {
    n.taints
        .iter()
        .any(|t| t.key == labels::TO_BE_DELETED_TAINT)
}

/// When the drain of `n` must be given up: its start (annotation; `now` when missing) plus the
/// drain time allowed.
pub fn drain_deadline(n: &Node, max: Duration, now: Time) -> Time {
    n.annotations
        .get(labels::DRAIN_STARTED)
        .and_then(|s| Time::parse_rfc3339(s).ok())
        .unwrap_or(now)
        + max
}
