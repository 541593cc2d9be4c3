//! Orphans: instances of ours (this cluster's name and identity, as the providers list them)
//! whose pool is no longer in the policy (removed or renamed by a reload), and their Nodes. They
//! are listed in the status and reported with a `PoolOrphaned` Event (again only when what a pool
//! holds changes), never launched for nor counted in a pool of the policy, and only with
//! `orphans: drain` drained and removed as a scale-down is (voluntary drains, within
//! `maxConcurrentDrains`, a failed one tried again after [`ORPHAN_RETRY`]); their instances
//! without a Node are then terminated.

use crate::hash::HashMap;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gpu_node_autoscaler_provider::{Instance, InstanceState};

use crate::autoscaler::fleet::NodeIndex;
use crate::autoscaler::status::OrphanStatus;
use crate::autoscaler::{has_drain_taint, Action, Autoscaler, DrainKind, DrainOrder, Pass};
use crate::model::Time;
use crate::policy::{Orphans, Policy};

/// An orphan node whose drain failed (a pod that cannot be moved, a budget) is drained again
/// after this long at the earliest.
pub const ORPHAN_RETRY: Duration = Duration::from_secs(5 * 60);
/// The termination of an orphan instance without a Node is asked for again after this long while
/// the cloud still lists it.
pub const ORPHAN_TERMINATE_AGAIN: Duration = Duration::from_secs(5 * 60);

/// An instance of ours of a pool not in the policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Orphan {
    pub instance: Instance,
    /// Its Node, when one is registered.
    pub node: Option<String>,
    /// A Node of it exists but could not be read: it is not terminated as if it had none.
    pub node_unreadable: bool,
}

/// What the core remembers of orphans between passes.
#[derive(Default)]
pub(in crate::autoscaler) struct OrphanState {
    /// Per pool, what was last reported: instance id → its Node.
    reported: BTreeMap<String, BTreeMap<String, Option<String>>>,
    /// Orphan instances without a Node whose termination was asked for → when.
    terminated: HashMap<String, Time>,
}

/// Splits the cloud's listing into the live instances of the policy's pools (shared as it came
/// when there is no orphan) and the orphans, joined with their Nodes.
pub fn split(
    instances: Arc<Vec<Instance>>,
    policy: &Policy,
    nodes: &NodeIndex,
    unreadable: &[String],
) -> (Arc<Vec<Instance>>, Vec<Orphan>) {
    let orphaned = |i: &Instance| {
        policy.pool(&i.pool).is_none()
            && !matches!(
                i.state,
                InstanceState::Terminated | InstanceState::ShuttingDown
            )
    };
    if !instances.iter().any(orphaned) {
        return (instances, Vec::new());
    }
    let mut mine = Vec::with_capacity(instances.len());
    let mut orphans = Vec::new();
    for i in instances.iter() {
        if policy.pool(&i.pool).is_some() {
            mine.push(i.clone());
        } else if orphaned(i) {
            orphans.push(Orphan {
                node: nodes.name_of(&i.provider_id).map(str::to_string),
                node_unreadable: unreadable.contains(&i.provider_id),
                instance: i.clone(),
            });
        }
    }
    (Arc::new(mine), orphans)
}

impl Autoscaler {
    /// Reports the orphans and, with `orphans: drain`, drains their nodes and terminates their
    /// instances without a Node.
    pub(in crate::autoscaler) fn orphans(&mut self, pass: &Pass, out: &mut Vec<Action>) {
        let mut now_orphaned: BTreeMap<String, BTreeMap<String, Option<String>>> = BTreeMap::new();
        for o in &pass.orphans {
            now_orphaned
                .entry(o.instance.pool.clone())
                .or_default()
                .insert(o.instance.id.clone(), o.node.clone());
        }
        let mode = pass.policy.orphans;
        for (pool, members) in &now_orphaned {
            if self.orphan_state.reported.get(pool) == Some(members) {
                continue;
            }
            let nodes: Vec<&str> = members.values().flatten().map(String::as_str).collect();
            let without = members.values().filter(|n| n.is_none()).count();
            let fate = match mode {
                Orphans::Keep => "left running (orphans: keep); never launched for",
                Orphans::Drain => "drained and removed (orphans: drain); never launched for",
            };
            let message = format!(
                "pool {pool} is not in the policy, but {} node(s) of it ({}) and {without} \
                 instance(s) of it without a Node are ours: {fate}",
                nodes.len(),
                if nodes.is_empty() {
                    "none".to_string()
                } else {
                    nodes.join(", ")
                },
            );
            super::warn_pool(out, pool, "PoolOrphaned", "Report", message);
        }
        self.orphan_state.reported = now_orphaned;
        let listed: crate::hash::HashSet<&str> = pass
            .orphans
            .iter()
            .map(|o| o.instance.id.as_str())
            .collect();
        self.orphan_state
            .terminated
            .retain(|id, _| listed.contains(id.as_str()));
        if self.config.dry_run || mode == Orphans::Keep {
            return;
        }
        let now = pass.now;
        let limit = pass.policy.max_concurrent_drains as usize;
        for o in &pass.orphans {
            let why = format!(
                "pool {} is no longer in the policy (orphans: drain)",
                o.instance.pool
            );
            let Some(name) = &o.node else {
                if o.node_unreadable {
                    continue;
                }
                let due = self
                    .orphan_state
                    .terminated
                    .get(&o.instance.id)
                    .is_none_or(|at| now.since(*at) >= ORPHAN_TERMINATE_AGAIN);
                if due {
                    self.orphan_state
                        .terminated
                        .insert(o.instance.id.clone(), now);
                    out.push(Action::Terminate {
                        pool: o.instance.pool.clone(),
                        instance_id: o.instance.id.clone(),
                        why,
                    });
                }
                continue;
            };
            let Some(n) = pass.snapshot.nodes.iter().find(|n| &n.name == name) else {
                continue;
            };
            if n.deleting
                || has_drain_taint(n)
                || self.disruption.drains.contains_key(&n.name)
                || self.disruption.removed.contains_key(&n.name)
            {
                continue;
            }
            let failed_lately = self
                .history
                .get(&o.instance.pool)
                .and_then(|h| h.last_scale_down_failure)
                .is_some_and(|t| now.since(t) < ORPHAN_RETRY);
            if failed_lately {
                continue;
            }
            if self.disruption.drains.len() >= limit {
                break;
            }
            // The instance's pool, not the Node's label (which it may lack): the executor
            // terminates through that pool's provider.
            let pool = o.instance.pool.clone();
            self.disruption
                .drains
                .insert(n.name.clone(), Some(pool.clone()));
            out.push(Action::Drain(DrainOrder {
                node: n.name.clone(),
                pool,
                instance_id: Some(o.instance.id.clone()),
                deadline: now + self.config.max_graceful_termination,
                reason: why,
                kind: DrainKind::Voluntary,
            }));
        }
    }

    /// The orphans as the status lists them: instance id → its pool and Node.
    pub(in crate::autoscaler) fn orphan_status(pass: &Pass) -> BTreeMap<String, OrphanStatus> {
        pass.orphans
            .iter()
            .map(|o| {
                (
                    o.instance.id.clone(),
                    OrphanStatus {
                        pool: o.instance.pool.clone(),
                        node: o.node.clone(),
                    },
                )
            })
            .collect()
    }
}
