//! The rules every voluntary disruption (scale-down of unneeded nodes, consolidation) applies
//! before its own, written once: a node annotated not to be disrupted stays, and drains stay
//! within the cluster's `maxConcurrentDrains`. Involuntary replacements (a node taken back by its
//! cloud, a broken node) do not ask: the node goes either way.

use std::collections::BTreeMap;

use crate::model::{labels, Node};
use crate::policy::Policy;

/// Node annotations that keep a node from voluntary disruption when `"true"`: ours, the Cluster
/// Autoscaler's and Karpenter's.
pub const DO_NOT_DISRUPT: [&str; 3] = [
    labels::SCALE_DOWN_DISABLED,
    labels::CA_SCALE_DOWN_DISABLED,
    labels::KARPENTER_DO_NOT_DISRUPT,
];

/// Whether one of `keys` is annotated `"true"`.
pub fn annotation_true(map: &BTreeMap<String, String>, keys: &[&str]) -> bool {
    keys.iter()
        .any(|k| map.get(*k).is_some_and(|v| v == "true"))
}

/// Why `n` may not be disrupted voluntarily, if it may not.
pub fn do_not_disrupt(n: &Node) -> Option<String> {
    annotation_true(&n.annotations, &DO_NOT_DISRUPT)
        .then(|| "the node is annotated scale-down-disabled: \"true\"".to_string())
}

/// How many more drains may start while `running` drains run or are planned.
pub fn drains_left(policy: &Policy, running: usize) -> usize {
    (policy.max_concurrent_drains as usize).saturating_sub(running)
}

/// How many more nodes of `pool` may start being disrupted for `reason` at `now`, by its
/// disruption budgets: `pool_nodes` nodes, `disrupting` of them being disrupted by choice
/// already (drained, or being replaced by consolidation, drift or expiry). The tightest active
/// budget that names the reason (or names none) wins; a percentage of the pool's nodes is
/// rounded up, as Karpenter does. `None`: no budget limits it. A pool that writes no budget
/// gets Karpenter's default of `10%` for drift and expiry only, so that scale-down and
/// consolidation keep their behaviour.
pub fn budget_left(
    pool: &crate::policy::Pool,
    reason: crate::policy::Reason,
    pool_nodes: usize,
    disrupting: usize,
    now: crate::model::Time,
) -> Option<usize> {
    use crate::policy::{BudgetNodes, Reason};
    let allowed = |nodes: BudgetNodes| match nodes {
        BudgetNodes::Count(n) => n as usize,
        BudgetNodes::Percent(p) => (pool_nodes * p as usize).div_ceil(100),
    };
    let budgets = &pool.disruption.budgets;
    if budgets.is_empty() {
        return matches!(reason, Reason::Drifted | Reason::Expired)
            .then(|| allowed(BudgetNodes::Percent(10)).saturating_sub(disrupting));
    }
    budgets
        .iter()
        .filter(|b| b.reasons.is_empty() || b.reasons.contains(&reason))
        .filter(|b| {
            b.schedule
                .as_ref()
                .is_none_or(|(c, d)| c.open_at(now, *d).is_some())
        })
        .map(|b| allowed(b.nodes).saturating_sub(disrupting))
        .min()
}

/// When a scheduled budget of `pool` opens or closes next after `now` (within a day), so that
/// disruption held by a window is looked at again when it ends.
pub fn next_budget_change(
    pool: &crate::policy::Pool,
    now: crate::model::Time,
) -> Option<crate::model::Time> {
    let day = std::time::Duration::from_secs(24 * 3600);
    pool.disruption
        .budgets
        .iter()
        .filter_map(|b| b.schedule.as_ref())
        .flat_map(|(c, d)| {
            let closes = c.open_at(now, *d).map(|t| t + *d);
            let opens = c.next_fire(now + std::time::Duration::from_secs(60), day);
            [closes, opens]
        })
        .flatten()
        .filter(|t| *t > now)
        .min()
}

/// Why pods on `node` keep it from voluntary disruption (do-not-disrupt, safe-to-evict
/// `"false"`, and the node's own annotations), if any: the first reason found.
pub fn held_by(n: &Node, snapshot: &crate::model::Snapshot) -> Option<String> {
    if let Some(why) = do_not_disrupt(n) {
        return Some(why);
    }
    snapshot
        .pods
        .iter()
        .filter(|p| p.node_name.as_deref() == Some(n.name.as_str()) && p.is_bound_active())
        .filter(|p| !crate::plan::scale_down::dies_with_node(p) && !p.deleting)
        .find_map(|p| {
            let a = &p.annotations;
            if annotation_true(a, &[labels::KARPENTER_DO_NOT_DISRUPT]) {
                Some(format!(
                    "pod {} is annotated karpenter.sh/do-not-disrupt: \"true\"",
                    p.id
                ))
            } else if [labels::SAFE_TO_EVICT, labels::CA_SAFE_TO_EVICT]
                .iter()
                .any(|k| a.get(*k).is_some_and(|v| v == "false"))
            {
                Some(format!(
                    "pod {} is annotated safe-to-evict: \"false\"",
                    p.id
                ))
            } else {
                None
            }
        })
}
