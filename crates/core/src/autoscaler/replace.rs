//! Replacing nodes of ours that are broken (GPU health) or about to be taken back (an
//! interruption notice): the node is tainted so that nothing new lands on it, its pods are
//! planned again as if pending (their new capacity is launched like any scale-up and counted in
//! flight), and the node is drained once they have a place elsewhere (at once for an
//! interruption: the notice is shorter than a boot), then its instance is terminated.
//!
//! Health is judged from when the core first saw a signal (kept in the `unhealthy-since`
//! annotation across restarts), never from the condition's transition time: a condition that
//! flaps does not restart the clock, which only resets once the node has been healthy for the
//! signal's grace period. At most a share of a pool is replaced for health at once.

use std::collections::BTreeMap;
use std::time::Duration;

use gpu_node_autoscaler_provider::NoticeKind;

use super::drain::DrainKind;
use crate::model::constraints::{Effect, Taint};
use crate::model::node::GpuXid;
use crate::model::{labels, Node, PodPhase, Time};
use crate::plan::{Plan, ScaleUp, Template};
use crate::policy::{Policy, Pool};

/// Why a node is being replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    Unhealthy,
    Interrupted,
    /// Its pods fit cheaper capacity (GPU-aware consolidation).
    Consolidating,
    /// Launched differently from what its pool launches today.
    Drifted,
    /// Older than its pool's `disruption.expireAfter`.
    Expired,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Unhealthy => "unhealthy",
            Cause::Interrupted => "interrupted",
            Cause::Consolidating => "consolidating",
            Cause::Drifted => "drifted",
            Cause::Expired => "expired",
        }
    }

    /// Taken by choice: counted against the pool's disruption budgets.
    pub fn voluntary(self) -> bool {
        matches!(self, Cause::Consolidating | Cause::Drifted | Cause::Expired)
    }

    pub(super) fn parse(s: &str) -> Cause {
        match s {
            "interrupted" => Cause::Interrupted,
            "consolidating" => Cause::Consolidating,
            "drifted" => Cause::Drifted,
            "expired" => Cause::Expired,
            _ => Cause::Unhealthy,
        }
    }

    /// Waits for its pods to have a place on nodes that exist before it is drained (an
    /// interrupted node is drained at once: the notice is shorter than a boot).
    pub fn waits_for_capacity(self) -> bool {
        self != Cause::Interrupted
    }

    /// How its node is drained: a broken or interrupted node goes whatever is on it; a
    /// consolidation is a choice.
    pub fn drain_kind(self) -> DrainKind {
        match self {
            Cause::Unhealthy | Cause::Interrupted => DrainKind::Forced,
            Cause::Consolidating | Cause::Drifted | Cause::Expired => DrainKind::Voluntary,
        }
    }
}

/// The taint that keeps new pods off a node being replaced.
pub fn replacing_taint(cause: Cause) -> Taint {
    Taint {
        key: labels::REPLACING_TAINT.into(),
        value: cause.as_str().into(),
        effect: Effect::NoSchedule,
    }
}

/// A node seen unhealthy: since when, when last, and what.
#[derive(Clone, Debug)]
struct Unhealthy {
    since: Time,
    last_seen: Time,
    what: String,
    grace: Duration,
}

/// A node being replaced.
#[derive(Clone, Debug)]
pub struct Replacing {
    pub cause: Cause,
    pub why: String,
    /// Its drain failed: not tried again before then.
    pub retry_after: Option<Time>,
    /// When this process started (or adopted) the replacement.
    pub started: Time,
    /// A consolidation's planned offerings: one running short before its launch calls it off.
    pub offerings: Vec<gpu_node_autoscaler_provider::OfferingKey>,
    /// An interrupted spot node: when its instance is taken back (see [`reclaimed_at`]).
    pub reclaimed_at: Option<Time>,
    /// A drifted or expired node held past its pool's `terminationGracePeriod`: drained all
    /// the same, every pod evicted.
    pub forced: bool,
}

/// The replacement bookkeeping of the core.
#[derive(Default)]
pub struct Replacements {
    unhealthy: BTreeMap<String, Unhealthy>,
    pub replacing: BTreeMap<String, Replacing>,
    /// Instance id → the notices a queue delivered about it (kept while the instance is ours).
    pub notices: BTreeMap<String, std::collections::BTreeSet<NoticeKind>>,
    /// Queue messages to acknowledge once what they say is recorded (the node tainted).
    pub to_ack: Vec<String>,
    /// Instance id → when its spot interruption warning was sent (the earliest, if several).
    pub spot_warned: BTreeMap<String, Time>,
    /// Per node, what was last reported about a replacement that waits (reported once).
    reported: BTreeMap<String, String>,
    /// Per node, the XID errors its GPUs last reported (the last reading of `gpuMetrics`).
    pub xids: BTreeMap<String, Vec<GpuXid>>,
}

/// After a failed drain, a replacement waits this long before it drains again.
pub const RETRY_AFTER: Duration = Duration::from_secs(5 * 60);

/// What a node reports that makes it unhealthy now, and that signal's grace period: of several
/// signals, the one with the shortest grace (a fatal XID is acted on sooner than the condition a
/// node agent sets for it).
pub fn health_signal(
    n: &Node,
    pool: &Pool,
    template: Option<&Template>,
    xids: &[GpuXid],
) -> Option<(String, Duration)> {
    if !pool.health.enabled {
        return None;
    }
    let mut signals: Vec<(String, Duration)> = Vec::new();
    if let Some(c) = pool
        .health
        .conditions
        .iter()
        .filter(|c| n.conditions.get(&c.type_) == Some(&c.status))
        .min_by_key(|c| c.grace)
    {
        signals.push((format!("condition {}={}", c.type_, c.status), c.grace));
    }
    if let Some(x) = xids.iter().find(|x| pool.health.xid_codes.contains(&x.xid)) {
        signals.push((
            format!("GPU {} reported XID {}", x.gpu, x.xid),
            pool.health.xid_grace,
        ));
    }
    // Only a node that has advertised its GPUs: one still booting is the provisioning
    // timeout's business.
    if n.annotations.contains_key(labels::GPUS_ADVERTISED) {
        if let Some(t) = template {
            let want = crate::model::node::gpu_units(&t.allocatable, &t.shared);
            let have = n.advertised_gpus();
            if have < want {
                signals.push((
                    format!("advertises {have} of its {want} GPUs"),
                    pool.health.missing_gpus_grace,
                ));
            }
        }
    }
    // The first of the shortest: conditions, then XIDs, then missing GPUs.
    let shortest = signals.iter().map(|s| s.1).min()?;
    signals.into_iter().find(|s| s.1 == shortest)
}

/// A node about to be taken back: why, and whether an interruption handler (a taint or a
/// condition it sets) says so rather than a notice from the cloud's queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interruption {
    pub why: String,
    pub from_handler: bool,
}

/// Why a node is about to be taken back, if it is: an interruption handler's taint or
/// condition, or a notice from the cloud's queue about its instance (a rebalance recommendation
/// only where the pool replaces on one).
pub fn interruption_signal(
    n: &Node,
    pool: &Pool,
    policy: &Policy,
    notices: Option<&std::collections::BTreeSet<NoticeKind>>,
) -> Option<Interruption> {
    let handler = |why: String| {
        Some(Interruption {
            why,
            from_handler: true,
        })
    };
    if let Some(t) = n
        .taints
        .iter()
        .find(|t| policy.interruption_taints.contains(&t.key))
    {
        return handler(t.key.clone());
    }
    if let Some(c) = policy
        .interruption_conditions
        .iter()
        .find(|c| n.conditions.get(&c.type_) == Some(&c.status))
    {
        return handler(format!("condition {}={}", c.type_, c.status));
    }
    notices?
        .iter()
        .find(|k| **k != NoticeKind::Rebalance || pool.replace_on_rebalance)
        .map(|k| Interruption {
            why: format!("{} notice", k.describe()),
            from_handler: false,
        })
}

/// A node of ours in a Capacity Block whose end is within its pool's `capacityBlockDrainLead`
/// at `now`: the block's id and end (the instance is taken back then). The block is the one the
/// pool selects for the node's offering (instance type and zone, `reserved`) that ends first.
pub fn capacity_block_end(
    offering: &gpu_node_autoscaler_provider::OfferingKey,
    pool: &Pool,
    reservations: &[gpu_node_autoscaler_provider::Reservation],
    now: Time,
) -> Option<(String, Time)> {
    if offering.capacity_type != gpu_node_autoscaler_provider::CapacityType::Reserved {
        return None;
    }
    let (id, end) = reservations
        .iter()
        .filter(|r| {
            r.kind == gpu_node_autoscaler_provider::ReservationKind::CapacityBlock
                && r.offering() == *offering
                && pool.selects_reservation(r)
        })
        .filter_map(|r| Some((r.id.clone(), Time(r.end_ms?))))
        .min_by_key(|(_, end)| *end)?;
    (now + pool.capacity_block_drain_lead >= end).then_some((id, end))
}

/// How long a spot interruption warning gives before the instance is taken back (EC2: two
/// minutes).
pub const SPOT_NOTICE: Duration = Duration::from_secs(120);

/// When an interrupted node's instance is taken back, where that is soon: two minutes after a
/// spot interruption warning from the queue was sent (`warned_at`), or, for a spot instance an
/// interruption handler marks (it relays the same warning), two minutes after `now`, when it is
/// first seen. Other notices (a rebalance recommendation, a scheduled change days ahead, a stop)
/// set no window: the drain has its usual deadline.
pub fn reclaimed_at(
    i: &Interruption,
    spot: bool,
    warned_at: Option<Time>,
    now: Time,
) -> Option<Time> {
    match warned_at {
        Some(t) => Some(t.min(now) + SPOT_NOTICE),
        None if i.from_handler && spot => Some(now + SPOT_NOTICE),
        None => None,
    }
}

/// The deadline of a replaced node's drain: `maxGracefulTermination` from now, and never past
/// the time its instance is taken back.
pub fn drain_deadline(now: Time, max_graceful: Duration, reclaimed_at: Option<Time>) -> Time {
    let usual = now + max_graceful;
    reclaimed_at.map_or(usual, |t| usual.min(t))
}

/// A node's decision for this pass.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Start replacing: taint it.
    Start { cause: Cause, why: String },
    /// The signal is new: persist since when.
    Seen { since: Time },
    /// The node is healthy again: forget the clock (and stop a replacement not draining yet).
    Recovered,
    /// Due, but the pool has too many nodes being replaced already.
    Deferred { why: String },
}

impl Replacements {
    /// Nodes being replaced, as the taint shows them (after a restart or a failover).
    pub fn adopt_tainted(&mut self, nodes: &[Node], now: Time) {
        for n in nodes {
            if let Some(t) = n.taints.iter().find(|t| t.key == labels::REPLACING_TAINT) {
                self.replacing
                    .entry(n.name.clone())
                    .or_insert_with(|| Replacing {
                        cause: Cause::parse(&t.value),
                        why: format!("{} (found tainted)", t.value),
                        retry_after: None,
                        started: now,
                        offerings: Vec::new(),
                        reclaimed_at: None,
                        forced: false,
                    });
            }
        }
    }

    /// Decides for one node of ours (not draining) with its signals now. `allowed`: whether its
    /// pool may start one more replacement for health.
    pub fn step(
        &mut self,
        n: &Node,
        interrupted: Option<&str>,
        unhealthy: Option<(String, Duration)>,
        allowed: bool,
        now: Time,
    ) -> Option<Step> {
        let mut seen_new = None;
        if let Some((what, grace)) = &unhealthy {
            match self.unhealthy.get_mut(&n.name) {
                Some(u) => {
                    u.last_seen = now;
                    u.what.clone_from(what);
                    u.grace = *grace;
                }
                None => {
                    // A new leader keeps the last one's clock.
                    let recorded = n
                        .annotations
                        .get(labels::UNHEALTHY_SINCE)
                        .and_then(|v| Time::parse_rfc3339(v).ok())
                        .filter(|t| *t <= now);
                    let since = recorded.unwrap_or(now);
                    if recorded.is_none() {
                        seen_new = Some(since);
                    }
                    self.unhealthy.insert(
                        n.name.clone(),
                        Unhealthy {
                            since,
                            last_seen: now,
                            what: what.clone(),
                            grace: *grace,
                        },
                    );
                }
            }
        }
        let healthy_long = |u: &Unhealthy| now.since(u.last_seen) >= u.grace;
        if let (Some(r), Some(key)) = (self.replacing.get_mut(&n.name), interrupted) {
            // Being replaced by choice, and now about to be taken back: drained at once.
            if r.cause.voluntary() {
                r.why = format!(
                    "interruption notice ({key}) while being {}",
                    r.cause.as_str()
                );
                r.cause = Cause::Interrupted;
            }
        }
        if let Some(r) = self.replacing.get(&n.name) {
            let recovered = r.cause == Cause::Unhealthy
                && unhealthy.is_none()
                && interrupted.is_none()
                && self.unhealthy.get(&n.name).is_none_or(healthy_long);
            if recovered {
                self.unhealthy.remove(&n.name);
                self.replacing.remove(&n.name);
                self.reported.remove(&n.name);
                return Some(Step::Recovered);
            }
            return seen_new.map(|since| Step::Seen { since });
        }
        if let Some(key) = interrupted {
            return Some(self.start(
                n,
                Cause::Interrupted,
                format!("interruption notice ({key})"),
                now,
            ));
        }
        let u = self.unhealthy.get(&n.name)?.clone();
        if unhealthy.is_none() {
            // Flapping: the clock keeps running until the node has been healthy for the grace.
            if healthy_long(&u) {
                self.unhealthy.remove(&n.name);
                self.reported.remove(&n.name);
                return Some(Step::Recovered);
            }
            return None;
        }
        let for_s = now.since(u.since).as_secs();
        if now.since(u.since) < u.grace {
            return seen_new.map(|since| Step::Seen { since });
        }
        if !allowed {
            // No elapsed time in the reason: it is reported once, not once per pass.
            let why = format!(
                "{}, but its pool has as many nodes being replaced as \
                 health.maxReplacingShare allows",
                u.what
            );
            if !self.report_once(&n.name, &why) {
                return None;
            }
            return Some(Step::Deferred { why });
        }
        Some(self.start(n, Cause::Unhealthy, format!("{} for {for_s}s", u.what), now))
    }

    fn start(&mut self, n: &Node, cause: Cause, why: String, now: Time) -> Step {
        self.reported.remove(&n.name);
        self.replacing.insert(
            n.name.clone(),
            Replacing {
                cause,
                why: why.clone(),
                retry_after: None,
                started: now,
                offerings: Vec::new(),
                reclaimed_at: None,
                forced: false,
            },
        );
        Step::Start { cause, why }
    }

    /// Forgets nodes that are gone, except a replaced node whose drain has not reported back
    /// yet (its Node is deleted before the drain ends): the drain's outcome is counted as a
    /// replacement, not as a scale-down.
    pub fn retain_nodes(&mut self, nodes: &[Node], draining: impl Fn(&str) -> bool) {
        let names: std::collections::BTreeSet<&str> =
            nodes.iter().map(|n| n.name.as_str()).collect();
        self.unhealthy.retain(|k, _| names.contains(k.as_str()));
        self.replacing
            .retain(|k, _| names.contains(k.as_str()) || draining(k));
        self.reported.retain(|k, _| names.contains(k.as_str()));
    }

    /// Nodes seen unhealthy: name, since when, what.
    pub fn unhealthy_nodes(&self) -> impl Iterator<Item = (&str, Time, &str)> {
        self.unhealthy
            .iter()
            .map(|(n, u)| (n.as_str(), u.since, u.what.as_str()))
    }

    /// When a health clock runs out (a node due for replacement, one healthy long enough to be
    /// forgotten) or a failed drain may be tried again.
    pub fn timers(&self) -> impl Iterator<Item = Time> + '_ {
        self.unhealthy
            .values()
            .flat_map(|u| [u.since + u.grace, u.last_seen + u.grace])
            .chain(self.replacing.values().filter_map(|r| r.retry_after))
    }

    /// Nodes seen unhealthy now (a gauge).
    pub fn unhealthy_count(&self) -> usize {
        self.unhealthy.len()
    }

    /// Whether a waiting replacement's reason was reported already (and records it).
    pub fn report_once(&mut self, node: &str, why: &str) -> bool {
        if self.reported.get(node).map(String::as_str) == Some(why) {
            return false;
        }
        self.reported.insert(node.to_string(), why.to_string());
        true
    }
}

/// How many nodes of a pool of `pool_nodes` may be replaced for health at once.
pub fn replacing_allowed(pool: &Pool, pool_nodes: usize) -> usize {
    ((pool.health.max_replacing_share * pool_nodes as f64).floor() as usize).max(1)
}

/// Marks the nodes being replaced in a pass's snapshot: they take no pod (as if being deleted),
/// and their GPU pods are pending again, so that the plan finds (or launches) a place for them.
/// Returns each node's pods (`namespace/name`) planned again.
pub fn plan_as_moving(
    snapshot: &mut crate::model::Snapshot,
    replacing: &BTreeMap<String, Replacing>,
    moved_from: &mut crate::hash::HashMap<String, (String, PodPhase)>,
) -> BTreeMap<String, Vec<String>> {
    let mut moving: BTreeMap<String, Vec<String>> = BTreeMap::new();
    if replacing.is_empty() {
        return moving;
    }
    for n in &mut snapshot.nodes {
        if replacing.contains_key(&n.name) {
            if !n
                .taints
                .iter()
                .any(|t| t.key == labels::TO_BE_DELETED_TAINT)
            {
                n.taints.push(Taint {
                    key: labels::TO_BE_DELETED_TAINT.into(),
                    value: String::new(),
                    effect: Effect::NoSchedule,
                });
            }
            moving.entry(n.name.clone()).or_default();
        }
    }
    for p in &mut snapshot.pods {
        let Some(list) = p.node_name.as_deref().and_then(|n| moving.get_mut(n)) else {
            continue;
        };
        // Only GPU pods are ours to place; the others go wherever the scheduler puts them
        // once the drain evicts them.
        if !p.is_bound_active() || p.is_daemonset() || p.deleting || !p.wants_gpu() {
            continue;
        }
        let id = p.id.to_string();
        list.push(id.clone());
        let Some(node) = p.node_name.take() else {
            continue;
        };
        moved_from.insert(id, (node, p.phase));
        p.phase = PodPhase::Pending;
    }
    moving
}

/// Undoes [`plan_as_moving`] for one node whose replacement is called off within a pass: its
/// pods are back on it and it takes pods again.
pub fn unplan_moving(
    snapshot: &mut crate::model::Snapshot,
    node: &str,
    pods: &[String],
    moved_from: &crate::hash::HashMap<String, (String, PodPhase)>,
) {
    if let Some(n) = snapshot.nodes.iter_mut().find(|n| n.name == node) {
        n.taints.retain(|t| t.key != labels::TO_BE_DELETED_TAINT);
    }
    for p in &mut snapshot.pods {
        let key = p.id.to_string();
        if let (true, Some((from, phase))) = (pods.contains(&key), moved_from.get(&key)) {
            p.node_name = Some(from.clone());
            p.phase = *phase;
        }
    }
}

/// A scale-up whose pods all move off nodes being consolidated, cut to the offerings of its
/// planned capacity type: the move was weighed at that price. Spot running short in every zone
/// would otherwise buy the on-demand fallback for a move that is then called off (its planned
/// offering ran short), nodes left empty until scale-down. `None`: launch it as planned (some
/// pod of it is pending, or moves for another cause: a broken or interrupted node's pods need a
/// place at any price).
pub fn consolidation_launch(
    su: &ScaleUp,
    replacing: &BTreeMap<String, Replacing>,
    moved_from: &crate::hash::HashMap<String, (String, PodPhase)>,
) -> Option<ScaleUp> {
    let planned = su.offerings.first()?.capacity_type;
    let consolidating = |key: &str| {
        moved_from
            .get(key)
            .and_then(|(node, _)| replacing.get(node))
            .is_some_and(|r| r.cause == Cause::Consolidating)
    };
    if su.pods.is_empty()
        || !su.pods.iter().all(|p| consolidating(&p.key))
        || su.offerings.iter().all(|o| o.capacity_type == planned)
    {
        return None;
    }
    let mut cut = su.clone();
    cut.offerings.retain(|o| o.capacity_type == planned);
    Some(cut)
}

/// Whether every pod of a node being replaced has a place on a node that exists now (not on
/// capacity still launching), and if not, why not.
pub fn ready_to_drain(pods: &[String], plan: &Plan) -> Result<(), String> {
    let mut launching = 0;
    for p in pods {
        if let Some(u) = plan.unschedulable.iter().find(|u| &u.pod == p) {
            return Err(format!("pod {p} has no place: {}", u.reason));
        }
        match plan.existing_capacity.iter().find(|x| &x.pod == p) {
            Some(x) if !x.target.starts_with("launch/") => {}
            _ => launching += 1,
        }
    }
    if launching > 0 {
        return Err(format!(
            "waiting for the capacity launched for {launching} of its pods"
        ));
    }
    Ok(())
}

/// As [`ready_to_drain`], and the nodes its pods have a place on are Ready with their GPUs
/// advertised (or their devices published): a drifted or expired node is drained only once its
/// replacement is up, never before.
pub fn ready_to_drain_on_ready(pods: &[String], plan: &Plan, nodes: &[Node]) -> Result<(), String> {
    ready_to_drain(pods, plan)?;
    let mut booting: Vec<&str> = Vec::new();
    for p in pods {
        let Some(x) = plan.existing_capacity.iter().find(|x| &x.pod == p) else {
            continue;
        };
        let up = nodes
            .iter()
            .find(|n| n.name == x.target)
            .is_some_and(|n| n.ready && (n.advertised_gpus() > 0 || n.dra_devices > 0));
        if !up && !booting.contains(&x.target.as_str()) {
            booting.push(&x.target);
        }
    }
    if booting.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "waiting for {} to be Ready with its GPUs advertised",
            booting.join(", ")
        ))
    }
}

/// Why the new capacity of a replaced node's pods is missing, if it is: a pod the plan found no
/// place for, or whose launch failed in this pass (`launch_failed`: pod → why).
pub fn not_launched(
    pods: &[String],
    plan: &Plan,
    launch_failed: &BTreeMap<String, String>,
) -> Option<String> {
    pods.iter().find_map(|p| {
        launch_failed
            .get(p)
            .map(|why| format!("pod {p}: {why}"))
            .or_else(|| {
                plan.unschedulable
                    .iter()
                    .find(|u| &u.pod == p)
                    .map(|u| format!("pod {p} has no place: {}", u.reason))
            })
    })
}

/// Why a consolidation under way is given up, if it is: a pod of the node has no place any more
/// (pods arrived and took the room), or its replacement did not come up in twice
/// `maxNodeProvisionTime`. The node then keeps its pods and loses its taint.
pub fn call_off_consolidation(
    pods: &[String],
    plan: &Plan,
    started: Time,
    now: Time,
    max_node_provision_time: Duration,
) -> Option<String> {
    if let Some(u) = pods
        .iter()
        .find_map(|p| plan.unschedulable.iter().find(|u| &u.pod == p))
    {
        return Some(format!(
            "consolidation called off: pod {} has no place any more ({})",
            u.pod, u.reason
        ));
    }
    let limit = max_node_provision_time * 2;
    if now.since(started) > limit && ready_to_drain(pods, plan).is_err() {
        return Some(format!(
            "consolidation called off: its pods had no place on nodes that exist after {}",
            crate::policy::duration::format_duration(limit)
        ));
    }
    None
}
