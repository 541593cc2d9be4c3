//! Back to spot: on-demand nodes of pools whose spot is to be had again, empty or with every GPU
//! taken, are tainted so new pods wait for spot nodes
//! ([`crate::plan::consolidate::keep_free_for_spot`]), and removed as empty nodes once their pods
//! end.

use std::collections::BTreeSet;

use crate::autoscaler::{Action, Autoscaler, Note, Pass, Subject};
use crate::model::labels;
use crate::plan;
use crate::plan::Plan;

use super::Method;

pub(super) struct SpotReturn;

impl Method for SpotReturn {
    fn after_plan(&self, a: &mut Autoscaler, pass: &Pass, plan: &Plan, out: &mut Vec<Action>) {
        a.keep_free_for_spot(pass, plan, out);
    }
}

impl Autoscaler {
    /// Taints the on-demand nodes new pods should stay off while spot is to be had
    /// ([`plan::consolidate::keep_free_for_spot`]), and untaints those that no longer qualify.
    pub(in crate::autoscaler) fn keep_free_for_spot(
        &mut self,
        pass: &Pass,
        plan: &Plan,
        out: &mut Vec<Action>,
    ) {
        if self.config.dry_run {
            return;
        }
        let Some(templates) = pass.templates.as_ref() else {
            return;
        };
        // No pool keeps a node free: none is kept (one tainted before is untainted below).
        let keep = if plan::consolidate::keeps_free_for_spot(&pass.policy) {
            let templates = templates.for_snapshot(&pass.snapshot, pass.now);
            plan::consolidate::keep_free_for_spot(&pass.snapshot, &templates, &pass.policy, plan)
        } else {
            Default::default()
        };
        let draining: BTreeSet<&str> = plan.scale_downs.iter().map(|d| d.node.as_str()).collect();
        for n in &pass.snapshot.nodes {
            let tainted = pass.released.contains(&n.name)
                || n.taints
                    .iter()
                    .any(|t| t.key == labels::SPOT_AVAILABLE_TAINT);
            // Only a node whose instance is ours: one we would not remove would sit idle.
            let ours = pass.view.is_ours(n);
            let kept = keep.get(&n.name).filter(|_| ours);
            let wanted = kept.is_some();
            if tainted == wanted || (tainted && draining.contains(n.name.as_str())) {
                continue;
            }
            out.push(Action::Taint {
                node: n.name.clone(),
                taint: plan::consolidate::spot_available_taint(),
                present: wanted,
            });
            if let Some(&empty) = kept {
                let (what, then) = if empty {
                    ("an empty on-demand node", "it is removed as an empty node")
                } else {
                    (
                        "an on-demand node with every GPU taken",
                        "it is removed as an empty node once its pods end",
                    )
                };
                out.push(Action::Event(Note {
                    subject: Subject::Node(n.name.clone()),
                    warning: false,
                    reason: "KeptFreeForSpot",
                    action: "Consolidate",
                    message: format!(
                        "{} is {what} and spot is to be had again in its pool: new pods get spot \
                         nodes, and {then}",
                        n.name
                    ),
                }));
            }
        }
    }
}
