//! Replacing broken and interrupted nodes: health (conditions, missing GPUs, XID errors) and
//! interruption (handler taints and conditions, the cloud's notices) decide, per node, one
//! replacement state machine ([`crate::autoscaler::replace`]); the node's pods are planned again as
//! pending, and the node is drained once they have a place (an interrupted one at once). The
//! drains of consolidation's replacements go through here too ([`Replacement::after_plan`]).

use crate::hash::HashMap;
use std::collections::BTreeMap;

use gpu_node_autoscaler_provider::{Instance, Notice, NoticeKind};

use crate::autoscaler::fleet::FleetView;
use crate::autoscaler::{
    has_drain_taint, instance_of, replace, Action, Autoscaler, Count, Level, Note, Pass, Subject,
};
use crate::model::{labels, Node, Time};
use crate::plan::Plan;
use crate::policy::Policy;

use super::Method;

/// Health and interruption: one state machine per node (a node taken back while broken is
/// replaced once), hence one method.
pub(super) struct Replacement;

impl Method for Replacement {
    fn before_plan(&self, a: &mut Autoscaler, pass: &mut Pass, out: &mut Vec<Action>) {
        a.replace_nodes(pass, out);
    }

    fn after_plan(&self, a: &mut Autoscaler, pass: &Pass, plan: &Plan, out: &mut Vec<Action>) {
        a.drain_replaced(pass, plan, out);
    }
}

impl Autoscaler {
    /// Decides which nodes of ours start (or stop) being replaced, and plans their GPU pods
    /// again as pending.
    pub(in crate::autoscaler) fn replace_nodes(&mut self, pass: &mut Pass, out: &mut Vec<Action>) {
        let policy = pass.policy.clone();
        let templates = pass.templates.clone();
        let drains = &self.disruption.drains;
        self.disruption
            .replace
            .retain_nodes(&pass.snapshot.nodes, |n| drains.contains_key(n));
        self.disruption
            .replace
            .adopt_tainted(&pass.snapshot.nodes, pass.now);
        // Per pool: nodes, and nodes being replaced for health.
        let mut sizes: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for n in &pass.snapshot.nodes {
            let Some(p) = n.pool() else { continue };
            let e = sizes.entry(p).or_default();
            e.0 += 1;
            if self
                .disruption
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
            let ours = pass.view.is_ours(n);
            let pool = n.pool().and_then(|p| policy.pool(p));
            let (true, Some(pool)) = (ours, pool) else {
                continue;
            };
            if n.deleting || self.disruption.drains.contains_key(&n.name) || has_drain_taint(n) {
                continue;
            }
            let template = templates.as_ref().and_then(|t| t.find(&pool.name, n));
            let xids = self
                .disruption
                .replace
                .xids
                .get(&n.name)
                .map_or(&[][..], Vec::as_slice);
            let unhealthy = replace::health_signal(n, pool, template, xids);
            let notices = n
                .provider_id
                .as_ref()
                .and_then(|p| pass.view.instance_of_node.get(p))
                .and_then(|i| self.disruption.replace.notices.get(i));
            let mut interrupted = replace::interruption_signal(n, pool, &policy, notices);
            // A Capacity Block about to end takes its instance back like an interruption.
            let block_end = instance_of(n, &pass.view, &pass.instances).and_then(|i| {
                replace::capacity_block_end(
                    &i.offering,
                    pool,
                    &pass.snapshot.reservations,
                    pass.now,
                )
            });
            if let (None, Some((id, end))) = (&interrupted, &block_end) {
                interrupted = Some(replace::Interruption {
                    why: format!("capacity block {id} ends at {}", end.to_rfc3339()),
                    from_handler: false,
                });
            }
            let (size, busy) = sizes.get(pool.name.as_str()).copied().unwrap_or((0, 0));
            let busy = busy + started.get(&pool.name).copied().unwrap_or(0);
            let allowed = busy < replace::replacing_allowed(pool, size);
            let step = self.disruption.replace.step(
                n,
                interrupted.as_ref().map(|i| i.why.as_str()),
                unhealthy,
                allowed,
                pass.now,
            );
            if let (Some(i), Some(r)) = (
                &interrupted,
                self.disruption.replace.replacing.get_mut(&n.name),
            ) {
                if r.cause == replace::Cause::Interrupted && r.reclaimed_at.is_none() {
                    let instance = instance_of(n, &pass.view, &pass.instances);
                    let spot = instance.is_some_and(|i| {
                        i.offering.capacity_type == gpu_node_autoscaler_provider::CapacityType::Spot
                    });
                    let warned =
                        instance.and_then(|i| self.disruption.replace.spot_warned.get(&i.id));
                    r.reclaimed_at = replace::reclaimed_at(i, spot, warned.copied(), pass.now)
                        .or(block_end.as_ref().map(|(_, end)| *end));
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
                    if block_end.is_some() {
                        let pod_hours: f64 = pass
                            .snapshot
                            .pods
                            .iter()
                            .filter(|p| {
                                p.node_name.as_deref() == Some(n.name.as_str())
                                    && !p.is_daemonset()
                                    && p.is_bound_active()
                            })
                            .filter_map(|p| p.started)
                            .map(|s| (pass.now.0 - s.0).max(0) as f64 / 3_600_000.0)
                            .sum();
                        out.push(Action::Count(Count::CapacityBlockPodHoursMoved {
                            pool: pool.name.clone(),
                            pod_hours,
                        }));
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
                            replace::Cause::Interrupted if block_end.is_some() => {
                                "CapacityBlockEnding"
                            }
                            replace::Cause::Interrupted => "ReplacingInterruptedNode",
                            replace::Cause::Consolidating => "Consolidating",
                            replace::Cause::Drifted => "ReplacingDriftedNode",
                            replace::Cause::Expired => "ReplacingExpiredNode",
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
            self.disruption.replace.unhealthy_count(),
        )));
    }

    /// An interruption handler says a spot instance of ours is being taken back: its offering
    /// counts as short of capacity for `insufficientCapacityTtl`, as with a queue's notice.
    pub(in crate::autoscaler) fn mark_reclaimed(
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
            let e = self.launches.ice.entry(i.offering.clone()).or_insert(until);
            *e = (*e).max(until);
        }
    }

    /// Keeps the queue's notices about instances of ours (until those instances are gone), to
    /// be acted on by `replace_nodes`; every message is acknowledged there. A spot offering
    /// being reclaimed is short of capacity: the replacement is planned elsewhere until
    /// `short_until`.
    pub(in crate::autoscaler) fn record_notices(
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
                let known = self.disruption.replace.notices.get(id.as_str());
                if n.kind == NoticeKind::SpotInterruption
                    && !known.is_some_and(|k| k.contains(&n.kind))
                {
                    self.launches.ice.insert(i.offering.clone(), short_until);
                }
                if n.kind == NoticeKind::SpotInterruption {
                    let sent = n.sent_at_ms.map_or(now, Time).min(now);
                    let w = self
                        .disruption
                        .replace
                        .spot_warned
                        .entry(id.clone())
                        .or_insert(sent);
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
                self.disruption
                    .replace
                    .notices
                    .entry(id.clone())
                    .or_default()
                    .insert(n.kind);
            }
            self.disruption.replace.to_ack.push(n.message_id);
        }
        self.disruption
            .replace
            .notices
            .retain(|id, _| ours.contains_key(id.as_str()));
        self.disruption
            .replace
            .spot_warned
            .retain(|id, _| ours.contains_key(id.as_str()));
    }

    /// Drains the nodes being replaced whose pods have a place on nodes that exist (an
    /// interrupted one at once).
    pub(in crate::autoscaler) fn drain_replaced(
        &mut self,
        pass: &Pass,
        plan: &Plan,
        out: &mut Vec<Action>,
    ) {
        if self.config.dry_run {
            return;
        }
        for (node, pods) in &pass.moving {
            let Some(r) = self.disruption.replace.replacing.get(node) else {
                continue;
            };
            if self.disruption.drains.contains_key(node)
                || r.retry_after.is_some_and(|t| t > pass.now)
            {
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
                let ready = match r.cause {
                    replace::Cause::Drifted | replace::Cause::Expired => {
                        replace::ready_to_drain_on_ready(pods, plan, &pass.snapshot.nodes)
                    }
                    _ => replace::ready_to_drain(pods, plan),
                };
                if let Err(wait) = ready {
                    if self.disruption.replace.report_once(node, &wait) {
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
            let deadline = replace::drain_deadline(
                pass.now,
                self.config.max_graceful_termination,
                r.reclaimed_at,
            );
            let kind = if r.forced {
                crate::autoscaler::DrainKind::Forced
            } else {
                r.cause.drain_kind()
            };
            out.push(self.drain(n, &pass.view, deadline, why, kind));
        }
    }
}
