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
