//! Unclaimed instances: listed under this cluster's name but without its identity, while the
//! identity is known ([`Instance::unclaimed`]). They may be another installation's of the same
//! name, a scaling group's own, or launched by a version before the identity; the providers
//! refuse to terminate them. So they are never ours: not adopted (their Nodes are no pool's by
//! providerID), not in flight, never given up (a give-up could only fail, again and again, and
//! mark their offering short each time), never drained for removal. Each is reported once, with
//! an `InstanceUnclaimed` Event on its pool and a log line.

use std::collections::BTreeSet;
use std::sync::Arc;

use gpu_node_autoscaler_provider::{Instance, InstanceState};

use crate::autoscaler::{Action, Autoscaler};

/// Splits the cloud's listing into the instances that may be ours (shared as it came when none
/// is unclaimed) and the live unclaimed ones.
pub fn split(instances: Arc<Vec<Instance>>) -> (Arc<Vec<Instance>>, Vec<Instance>) {
    if !instances.iter().any(|i| i.unclaimed) {
        return (instances, Vec::new());
    }
    let (unclaimed, mine): (Vec<Instance>, Vec<Instance>) =
        instances.iter().cloned().partition(|i| i.unclaimed);
    let live = unclaimed
        .into_iter()
        .filter(|i| {
            !matches!(
                i.state,
                InstanceState::Terminated | InstanceState::ShuttingDown
            )
        })
        .collect();
    (Arc::new(mine), live)
}

impl Autoscaler {
    /// Reports each unclaimed instance once (again only if it goes and comes back).
    pub(in crate::autoscaler) fn report_unclaimed(
        &mut self,
        unclaimed: &[Instance],
        out: &mut Vec<Action>,
    ) {
        let now: BTreeSet<String> = unclaimed.iter().map(|i| i.id.clone()).collect();
        for i in unclaimed {
            if self.reported.unclaimed.contains(&i.id) {
                continue;
            }
            let message = format!(
                "instance {} ({}) is tagged with this cluster's name and pool {} but carries no \
                 cluster identity (gpu-node-autoscaler.io/cluster-id): it may be another cluster's of the \
                 same name, so it is neither managed nor terminated; tag it with this \
                 cluster's identity to hand it over, or remove it yourself",
                i.id, i.offering, i.pool
            );
            super::warn_pool(out, &i.pool, "InstanceUnclaimed", "Observe", message);
        }
        self.reported.unclaimed = now;
    }
}
