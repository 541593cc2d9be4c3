//! Disruption: the ways nodes are taken away, side by side, each a [`Method`] in its own file.
//!
//! - [`replacement`]: nodes that are broken or being taken back by their cloud (involuntary: no
//!   do-not-disrupt or drain budget holds them);
//! - [`lifecycle`]: drifted and expired nodes (replaced first, then drained);
//! - [`consolidation`]: nodes whose running pods fit cheaper capacity;
//! - [`scale_down`]: unneeded nodes (empty or underutilized);
//! - [`spot_return`]: on-demand nodes, empty or full, kept free while spot is to be had again.
//!
//! A pass asks every method in [`METHODS`] order at the same steps: before planning (start or
//! call off replacements, whose pods the plan then places as pending), before planning again
//! after a launch ran short, and after the plan (drain what it found a place for). The voluntary
//! methods' shared rules, do-not-disrupt annotations, the `maxConcurrentDrains` budget and the
//! pools' disruption budgets, are [`crate::plan::disrupt`]; drains themselves (start, resume after a restart, roll back, finish)
//! are here, the same for every method. A new method is a file with a type implementing
//! [`Method`] and one entry in [`METHODS`].

mod consolidation;
pub(super) mod lifecycle;
mod replacement;
mod scale_down;
mod spot_return;

use crate::autoscaler::fleet::FleetView;
use crate::autoscaler::{
    drain_deadline, has_drain_taint, replace, Action, Autoscaler, Count, DrainKind, DrainOrder,
    DrainOutcome, Level, Pass,
};
use crate::model::{Node, Snapshot, Time};
use crate::plan::Plan;

/// One way of taking nodes away. Every step has a default that does nothing.
pub(super) trait Method: Sync {
    /// Before the pass plans (not in dry-run, where only drift and expiry are reported): start or
    /// call off this method's replacements;
    /// their pods are then planned as pending ([`replace::plan_as_moving`]).
    fn before_plan(&self, _a: &mut Autoscaler, _pass: &mut Pass, _out: &mut Vec<Action>) {}

    /// Before the pass plans again because a launch ran short of capacity.
    fn before_replan(&self, _a: &mut Autoscaler, _pass: &mut Pass, _out: &mut Vec<Action>) {}

    /// After the plan and its launches: drain (or mark) what the plan allows.
    fn after_plan(&self, _a: &mut Autoscaler, _pass: &Pass, _plan: &Plan, _out: &mut Vec<Action>) {}
}

/// The methods, in the order a pass asks them.
pub(super) const METHODS: [&dyn Method; 5] = [
    &replacement::Replacement,
    &lifecycle::Lifecycle,
    &consolidation::Consolidation,
    &scale_down::ScaleDown,
    &spot_return::SpotReturn,
];

impl Autoscaler {
    /// Before planning: every method starts (or calls off) its replacements, the notices acted
    /// on are acknowledged (after the taints that record them), and the pods of the nodes being
    /// replaced are planned again as pending. Dry-run replaces nothing.
    pub(super) fn choose_disruptions(&mut self, pass: &mut Pass, out: &mut Vec<Action>) {
        if self.config.dry_run {
            // Drifted and expired nodes are reported (status, Events, gauge) and what would
            // be replaced is said; nothing is tainted or replaced.
            self.replace_drifted_and_expired(pass, out);
            return;
        }
        for m in METHODS {
            m.before_plan(self, pass, out);
        }
        for message_id in std::mem::take(&mut self.disruption.replace.to_ack) {
            out.push(Action::AckNotice { message_id });
        }
        pass.moving = replace::plan_as_moving(
            &mut pass.snapshot,
            &self.disruption.replace.replacing,
            &mut pass.moved_from,
        );
    }

    /// Before planning again in the same pass after a launch ran short.
    pub(super) fn before_replan(&mut self, pass: &mut Pass, out: &mut Vec<Action>) {
        for m in METHODS {
            m.before_replan(self, pass, out);
        }
    }

    /// After the plan: every method drains (or marks) what the plan allows.
    pub(super) fn disrupt(&mut self, pass: &Pass, plan: &Plan, out: &mut Vec<Action>) {
        for m in METHODS {
            m.after_plan(self, pass, plan, out);
        }
    }

    /// Per pool: its nodes, and those being disrupted by choice (drained by scale-down, or
    /// being replaced by consolidation, drift or expiry): what its disruption budgets count.
    pub(in crate::autoscaler) fn disruption_counts(
        &self,
        nodes: &[Node],
    ) -> std::collections::BTreeMap<String, (usize, usize)> {
        let mut sizes: std::collections::BTreeMap<String, (usize, usize)> = Default::default();
        for n in nodes {
            let Some(p) = n.pool() else { continue };
            let e = sizes.entry(p.to_string()).or_default();
            e.0 += 1;
            let voluntary = match self.disruption.replace.replacing.get(&n.name) {
                Some(r) => r.cause.voluntary(),
                None => self.disruption.drains.contains_key(&n.name),
            };
            if voluntary {
                e.1 += 1;
            }
        }
        sizes
    }

    /// A drain (or rollback) ended.
    pub fn drain_finished(&mut self, node: &str, outcome: DrainOutcome, now: Time) -> Vec<Action> {
        let mut out = Vec::new();
        let Some(pool) = self.disruption.drains.remove(node) else {
            return out;
        };
        if let Some(r) = self.disruption.replace.replacing.get_mut(node) {
            match outcome {
                DrainOutcome::Removed => {
                    let cause = r.cause.as_str();
                    self.disruption.replace.replacing.remove(node);
                    self.disruption.removed.insert(node.to_string(), now);
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
                self.disruption.removed.insert(node.to_string(), now);
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

    /// Voluntary drains of a previous leader (found from the taint) past their deadline: given
    /// back. A forced one is never given back: [`Self::resume_drains`] finishes it.
    pub(in crate::autoscaler) fn roll_back_expired_drains(
        &mut self,
        snapshot: &Snapshot,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        if self.config.dry_run {
            return;
        }
        for n in &snapshot.nodes {
            if self.disruption.drains.contains_key(&n.name)
                || self.disruption.removed.contains_key(&n.name)
                || n.deleting
                || !has_drain_taint(n)
                || DrainKind::of_node(n) == DrainKind::Forced
                || drain_deadline(n, self.config.max_graceful_termination, now) > now
            {
                continue;
            }
            let pool = n.pool().map(str::to_string);
            self.disruption.drains.insert(n.name.clone(), pool.clone());
            out.push(Action::RollBack {
                node: n.name.clone(),
                pool,
                why: "a drain interrupted by a restart ran past its deadline".into(),
            });
        }
    }

    /// Drains of a previous leader (found from the taint) within their deadline, and forced ones
    /// past it (removed with what is left): finished.
    pub(in crate::autoscaler) fn resume_drains(&mut self, pass: &Pass, out: &mut Vec<Action>) {
        if self.config.dry_run {
            return;
        }
        for n in &pass.snapshot.nodes {
            if !has_drain_taint(n)
                || n.deleting
                || self.disruption.drains.contains_key(&n.name)
                || self.disruption.removed.contains_key(&n.name)
            {
                continue;
            }
            let deadline = drain_deadline(n, self.config.max_graceful_termination, pass.now);
            let kind = DrainKind::of_node(n);
            if deadline <= pass.now && kind == DrainKind::Voluntary {
                continue;
            }
            out.push(Action::Log {
                level: Level::Info,
                message: format!("resuming an interrupted drain: node {}", n.name),
            });
            let reason = match kind {
                DrainKind::Voluntary => "resumed after a restart".to_string(),
                DrainKind::Forced => "resumed after a restart: the node is being replaced".into(),
            };
            out.push(self.drain(n, &pass.view, deadline, reason, kind));
        }
    }

    pub(in crate::autoscaler) fn drain(
        &mut self,
        n: &Node,
        view: &FleetView,
        deadline: Time,
        reason: String,
        kind: DrainKind,
    ) -> Action {
        let pool = n.pool().unwrap_or("").to_string();
        self.disruption
            .drains
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
            kind,
        })
    }
}
