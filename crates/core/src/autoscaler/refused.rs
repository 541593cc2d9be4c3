//! The safety net for what the planner does not model: a pending pod the plan keeps placing on a
//! Ready node of a pool, while kube-scheduler keeps it `Unschedulable`, was refused that node for
//! a rule the model does not know (a namespace selector on Namespaces' labels, a scheduler
//! plugin's setting, an attach limit, ...). After [`REFUSED_AFTER`] the node stops counting as
//! the pod's place: it is left out of the pod's plans while the pod waits (Event
//! `FailedScaleUp` with the scheduler's message, a metric), so that the next plan finds it other
//! capacity or launches some. After [`MAX_REFUSALS`] such nodes the pod is reported and no
//! longer planned for, so that a rule refusing every node cannot launch node after node.

use crate::hash::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::autoscaler::{pod_subject, Action, Autoscaler, Count, Level, Note};
use crate::model::{Snapshot, Time};
use crate::plan::Plan;

/// How long a pending pod may be placed on a Ready node by the plan while kube-scheduler holds
/// it `Unschedulable` before that node counts as refused. kube-scheduler tries an unschedulable
/// pod again on every Node event that may make it fit (a node added, turning Ready, its
/// allocatable growing) and at most 10 s (`podMaxBackoffSeconds`) after a failed try: 90 s is
/// many tries.
pub const REFUSED_AFTER: Duration = Duration::from_secs(90);

/// The most nodes refused to one pod before it is no longer planned for.
pub const MAX_REFUSALS: usize = 3;

/// Per pending pod (UID): the node the plan placed it on and since when, and the nodes refused.
#[derive(Default)]
pub(in crate::autoscaler) struct Refusals {
    placed: HashMap<String, (String, Time)>,
    refused: HashMap<String, Vec<String>>,
}

impl Autoscaler {
    /// Leaves each pending pod's refused nodes out of its plans; a pod refused
    /// [`MAX_REFUSALS`] nodes waits (reported, not planned for). Forgets the pods that no
    /// longer wait and the nodes that are gone.
    pub(in crate::autoscaler) fn apply_refusals(&mut self, snapshot: &mut Snapshot) {
        let r = &mut self.refusals;
        if r.placed.is_empty() && r.refused.is_empty() {
            return;
        }
        let pending: HashSet<&str> = snapshot
            .pods
            .iter()
            .filter(|p| p.is_pending())
            .map(|p| p.uid.as_str())
            .collect();
        let nodes: HashSet<&str> = snapshot.nodes.iter().map(|n| n.name.as_str()).collect();
        r.placed.retain(|uid, _| pending.contains(uid.as_str()));
        r.refused.retain(|uid, ns| {
            ns.retain(|n| nodes.contains(n.as_str()));
            pending.contains(uid.as_str()) && !ns.is_empty()
        });
        if r.refused.is_empty() {
            return;
        }
        for pod in snapshot.pods.iter_mut().filter(|p| p.is_pending()) {
            let Some(refused) = r.refused.get(&pod.uid) else {
                continue;
            };
            if refused.len() >= MAX_REFUSALS {
                pod.waiting.get_or_insert_with(|| {
                    format!(
                        "kube-scheduler refused it on {} nodes it fits on this model ({}): not \
                         planned for again while it waits",
                        refused.len(),
                        refused.join(", ")
                    )
                });
            }
            Arc::make_mut(&mut pod.constraints).refused_nodes = refused.clone();
        }
    }

    /// Notes, for each pending pod the plan placed on a Ready node of a pool while the scheduler
    /// holds it `Unschedulable`, since when; one held there [`REFUSED_AFTER`] is refused that
    /// node from the next plan on.
    pub(in crate::autoscaler) fn note_refusals(
        &mut self,
        snapshot: &Snapshot,
        plan: &Plan,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let mut nodes = None;
        let mut seen = HashSet::default();
        for placed in &plan.existing_capacity {
            let Some(pod) = snapshot.pods.get(placed.pod_index) else {
                continue;
            };
            // Pods no scheduler places (a CapacityBuffer's chunks, a ProvisioningRequest's
            // booked pods) sit on their room for good: never refusals.
            let virtual_pod = [
                crate::buffer::BUFFER_ANNOTATION,
                crate::provisioning::REQUEST_ANNOTATION,
            ]
            .iter()
            .any(|a| pod.annotations.contains_key(*a));
            if placed.target.starts_with("launch/")
                || !pod.is_pending()
                || !pod.unschedulable
                || virtual_pod
            {
                continue;
            }
            let nodes = nodes.get_or_insert_with(|| {
                snapshot
                    .nodes
                    .iter()
                    .map(|n| (n.name.as_str(), n))
                    .collect::<HashMap<_, _>>()
            });
            let Some(node) = nodes.get(placed.target.as_str()) else {
                continue;
            };
            // A node the scheduler may place it on now: Ready, schedulable, its resources
            // advertised (not a node still starting that is planned with its template).
            if node.pool().is_none()
                || !node.ready
                || node.unschedulable
                || node.deleting
                || !pod.requests.fits_in(&node.allocatable)
            {
                continue;
            }
            seen.insert(pod.uid.as_str());
            let since = match self.refusals.placed.get(&pod.uid) {
                Some((n, since)) if n == &placed.target => *since,
                _ => {
                    self.refusals
                        .placed
                        .insert(pod.uid.clone(), (placed.target.clone(), now));
                    now
                }
            };
            if now.since(since) < REFUSED_AFTER {
                continue;
            }
            self.refusals.placed.remove(&pod.uid);
            let refused = self.refusals.refused.entry(pod.uid.clone()).or_default();
            if refused.contains(&placed.target) {
                continue;
            }
            refused.push(placed.target.clone());
            let pool = node.pool().unwrap_or_default().to_string();
            let said = pod
                .scheduler_message
                .as_deref()
                .map(|m| format!(" (kube-scheduler: {m})"))
                .unwrap_or_default();
            let message = format!(
                "kube-scheduler has not placed it on node {} for {} s although it fits there on \
                 this model{said}: a rule the model does not know refuses it; planning for it \
                 without that node",
                placed.target,
                REFUSED_AFTER.as_secs()
            );
            out.push(Action::Log {
                level: Level::Warn,
                message: format!("pod {}: {message}", placed.pod),
            });
            out.push(Action::Event(Note {
                subject: pod_subject(pod),
                warning: true,
                // A reason of its own in a dry run beside the Cluster Autoscaler (which uses
                // FailedScaleUp for its node groups).
                reason: if self.config.dry_run {
                    "DryRunFailedScaleUp"
                } else {
                    "FailedScaleUp"
                },
                action: "ScaleUp",
                message,
            }));
            out.push(Action::Count(Count::Refused { pool }));
        }
        self.refusals
            .placed
            .retain(|uid, _| seen.contains(uid.as_str()));
    }
}

#[cfg(test)]
impl Autoscaler {
    /// Nothing noted or refused.
    pub(crate) fn refusals_is_empty(&self) -> bool {
        self.refusals.placed.is_empty() && self.refusals.refused.is_empty()
    }
}
