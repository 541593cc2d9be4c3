//! Scale-down of unneeded nodes: the plan's scale-downs ([`crate::plan::scale_down`]) drained,
//! within the drain limit, only where the instance is ours; "unneeded since" kept on the nodes.

use std::collections::BTreeSet;

use crate::autoscaler::{Action, Autoscaler, DrainKind, Note, Pass, Subject};
use crate::model::labels;
use crate::plan;
use crate::plan::Plan;
use crate::policy::Reason;

use super::Method;

pub(super) struct ScaleDown;

impl Method for ScaleDown {
    fn after_plan(&self, a: &mut Autoscaler, pass: &Pass, plan: &Plan, out: &mut Vec<Action>) {
        a.scale_down(pass, plan, out);
        a.keep_unneeded(pass, plan, out);
    }
}

impl Autoscaler {
    pub(in crate::autoscaler) fn scale_down(
        &mut self,
        pass: &Pass,
        plan: &Plan,
        out: &mut Vec<Action>,
    ) {
        let limit = pass.policy.max_concurrent_drains as usize;
        let mut not_ours = BTreeSet::new();
        // The pools' disruption budgets, only where a pool writes one (empty and underutilized
        // nodes are otherwise limited by `maxConcurrentDrains` alone).
        let mut sizes = if pass
            .policy
            .pools
            .iter()
            .any(|p| !p.disruption.budgets.is_empty())
        {
            self.disruption_counts(&pass.snapshot.nodes)
        } else {
            Default::default()
        };
        for d in &plan.scale_downs {
            if self.disruption.drains.contains_key(&d.node) {
                continue;
            }
            let Some(node) = pass.snapshot.nodes.iter().find(|n| n.name == d.node) else {
                continue;
            };
            let ours = pass.view.is_ours(node);
            // Dry-run lists no instance (it calls no cloud API): it says what it would drain.
            if !ours && !self.config.dry_run {
                // Adopted through a pool's nodeSelector, or labelled by hand: never terminated.
                if !self.disruption.not_ours_reported.contains(&d.node) {
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
            if self.disruption.drains.len() >= limit {
                continue;
            }
            if let Some(pool) = pass
                .policy
                .pool(&d.pool)
                .filter(|p| !p.disruption.budgets.is_empty())
            {
                let reason = if d.evict.is_empty() {
                    Reason::Empty
                } else {
                    Reason::Underutilized
                };
                let (size, busy) = sizes.get(&d.pool).copied().unwrap_or((0, 0));
                if plan::disrupt::budget_left(pool, reason, size, busy, pass.now) == Some(0) {
                    continue;
                }
                if let Some(e) = sizes.get_mut(&d.pool) {
                    e.1 += 1;
                }
            }
            let deadline = pass.now + self.config.max_graceful_termination;
            out.push(self.drain(
                node,
                &pass.view,
                deadline,
                d.reason.clone(),
                DrainKind::Voluntary,
            ));
        }
        self.disruption.not_ours_reported = not_ours;
    }

    /// Keeps "unneeded since" on the nodes (the annotation; in memory in dry-run).
    pub(in crate::autoscaler) fn keep_unneeded(
        &mut self,
        pass: &Pass,
        plan: &Plan,
        out: &mut Vec<Action>,
    ) {
        if self.config.dry_run {
            self.disruption.unneeded_dry = plan
                .unneeded
                .iter()
                .map(|u| (u.node.clone(), u.since.clone()))
                .collect();
            return;
        }
        let changes =
            plan::scale_down::unneeded_changes(&pass.snapshot.nodes, &plan.unneeded, |n| {
                self.disruption.drains.contains_key(&n.name)
            });
        for (node, value) in changes {
            out.push(Action::Annotate {
                node: node.to_string(),
                key: labels::UNNEEDED_SINCE,
                value: value.map(str::to_string),
            });
        }
    }
}
