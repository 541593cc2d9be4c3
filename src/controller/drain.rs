//! Draining a node the plan removes: taint `gpu-node-autoscaler.io/to-be-deleted:NoSchedule` and
//! cordon, evict its pods through the Eviction API (PDB refusals retried with back-off until the
//! deadline), then terminate the instance and delete the Node. On timeout the node is given back
//! (taint removed, uncordoned). The taint and the `drain-started` annotation are the drain's
//! whole state, so a controller that restarts finds a drain again and finishes or rolls it back.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use gpu_node_autoscaler_provider::retry::{backoff, jitter_unit};
use gpu_node_autoscaler_provider::CloudProvider;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::Api;
use kube::Client;
use tracing::{info, warn};

use super::kube_io::{self, node_ref, EventSink, Evicted, Note};
use super::leader::Elector;
use super::metrics::{EvictionResult, Metrics};
use super::store::ClusterState;
use super::wall_now;
use crate::model::{labels, Time};

/// Annotation holding when the drain of a node started (RFC 3339).
pub const DRAIN_STARTED: &str = "gpu-node-autoscaler.io/drain-started";
const MIRROR: &str = "kubernetes.io/config.mirror";

pub struct DrainContext {
    pub client: Client,
    pub state: Arc<Mutex<ClusterState>>,
    pub elector: Elector,
    pub metrics: Arc<Metrics>,
    pub events: EventSink,
    pub evictions: DefaultDirectRateLimiter,
}

impl DrainContext {
    pub fn eviction_limiter(per_second: u32) -> DefaultDirectRateLimiter {
        RateLimiter::direct(Quota::per_second(
            NonZeroU32::new(per_second.max(1)).expect("non-zero"),
        ))
    }
}

pub struct DrainJob {
    pub node: String,
    pub pool: String,
    pub provider: Option<Arc<dyn CloudProvider>>,
    pub instance_id: Option<String>,
    /// Give the node back when it is not empty by then.
    pub deadline: Time,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum DrainOutcome {
    Removed,
    /// Given back (taint removed, uncordoned), with why.
    RolledBack(String),
    /// Leadership was lost: the next leader finds the drain from the taint.
    Abandoned,
    /// The node was emptied but could not be removed; it stays tainted and is tried again.
    Failed(String),
}

fn mark(node: &mut Node, started: Time) -> bool {
    let spec = node.spec.get_or_insert_with(Default::default);
    let taints = spec.taints.get_or_insert_with(Vec::new);
    let mut changed = false;
    if !taints
        .iter()
        .any(|t| t.key == labels::TO_BE_DELETED_TAINT && t.effect == "NoSchedule")
    {
        taints.push(Taint {
            key: labels::TO_BE_DELETED_TAINT.into(),
            value: Some(started.0.to_string()),
            effect: "NoSchedule".into(),
            time_added: None,
        });
        changed = true;
    }
    if spec.unschedulable != Some(true) {
        spec.unschedulable = Some(true);
        changed = true;
    }
    let ann = node
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    if !ann.contains_key(DRAIN_STARTED) {
        ann.insert(DRAIN_STARTED.into(), started.to_rfc3339());
        changed = true;
    }
    changed
}

fn unmark(node: &mut Node) -> bool {
    let mut changed = false;
    if let Some(spec) = node.spec.as_mut() {
        if let Some(taints) = spec.taints.as_mut() {
            let before = taints.len();
            taints.retain(|t| t.key != labels::TO_BE_DELETED_TAINT);
            changed |= taints.len() != before;
        }
        if spec.unschedulable == Some(true) {
            spec.unschedulable = None;
            changed = true;
        }
    }
    if let Some(ann) = node.metadata.annotations.as_mut() {
        changed |= ann.remove(DRAIN_STARTED).is_some();
        changed |= ann.remove(labels::UNNEEDED_SINCE).is_some();
    }
    changed
}

/// Pods the drain must move: bound, not finished, not DaemonSet or mirror pods.
fn movable(state: &Mutex<ClusterState>, node: &str) -> Vec<(String, String)> {
    let s = state.lock().unwrap();
    s.pods
        .items
        .values()
        .filter(|p| p.node_name.as_deref() == Some(node) && p.is_bound_active())
        .filter(|p| !p.is_daemonset() && !p.annotations.contains_key(MIRROR))
        .map(|p| (p.id.namespace.clone(), p.id.name.clone()))
        .collect()
}

/// Gives a node back after a failed or abandoned drain.
pub async fn roll_back(ctx: &DrainContext, node: &str, why: &str) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    kube_io::modify_node(&api, node, unmark).await?;
    ctx.events.send(Note {
        object: node_ref(node),
        warning: true,
        reason: "ScaleDownFailed",
        action: "Drain",
        message: format!("scale-down of {node} given up, node uncordoned: {why}"),
    });
    Ok(())
}

pub async fn drain(ctx: Arc<DrainContext>, job: DrainJob) -> DrainOutcome {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let started = wall_now();
    if let Err(e) = kube_io::modify_node(&api, &job.node, |n| mark(n, started)).await {
        return DrainOutcome::Failed(format!("cannot taint the node: {e}"));
    }
    ctx.events.send(Note {
        object: node_ref(&job.node),
        warning: false,
        reason: "ScaleDown",
        action: "Drain",
        message: format!("draining {} (pool {}): {}", job.node, job.pool, job.reason),
    });
    let mut round: u32 = 0;
    loop {
        if !ctx.elector.is_leader() {
            return DrainOutcome::Abandoned;
        }
        let pods = movable(&ctx.state, &job.node);
        if pods.is_empty() {
            break;
        }
        if wall_now() >= job.deadline {
            let why = format!(
                "{} pod(s) could not be evicted before the deadline (PodDisruptionBudget or \
                 eviction errors), e.g. {}/{}",
                pods.len(),
                pods[0].0,
                pods[0].1
            );
            return match roll_back(&ctx, &job.node, &why).await {
                Ok(()) => DrainOutcome::RolledBack(why),
                Err(e) => DrainOutcome::Failed(format!("{why}; rolling back failed: {e}")),
            };
        }
        for (ns, name) in &pods {
            ctx.evictions.until_ready().await;
            let result = match kube_io::evict(&ctx.client, ns, name).await {
                Evicted::Done => "evicted",
                Evicted::Blocked(msg) => {
                    info!(pod = %format!("{ns}/{name}"), "eviction refused: {msg}");
                    "blocked"
                }
                Evicted::Failed(msg) => {
                    warn!(pod = %format!("{ns}/{name}"), "eviction failed: {msg}");
                    "failed"
                }
            };
            ctx.metrics
                .evictions
                .get_or_create(&EvictionResult {
                    result: result.into(),
                })
                .inc();
        }
        round += 1;
        let wait = backoff(
            Duration::from_millis(500),
            Duration::from_secs(10),
            round.min(5),
            jitter_unit(super::seed()),
        );
        tokio::time::sleep(wait).await;
    }
    if let (Some(provider), Some(id)) = (&job.provider, &job.instance_id) {
        if let Err(e) = provider.terminate(id).await {
            return DrainOutcome::Failed(format!("terminating instance {id}: {e}"));
        }
    }
    if let Err(e) = kube_io::delete_node(&api, &job.node).await {
        return DrainOutcome::Failed(format!("deleting the Node: {e}"));
    }
    info!(node = %job.node, instance = job.instance_id.as_deref().unwrap_or("-"), "node removed");
    DrainOutcome::Removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marking_and_unmarking_are_idempotent_and_reverse_each_other() {
        let mut n = Node::default();
        assert!(mark(&mut n, Time::from_secs(10)));
        assert!(!mark(&mut n, Time::from_secs(20)), "already marked");
        let spec = n.spec.as_ref().unwrap();
        assert_eq!(spec.unschedulable, Some(true));
        assert_eq!(
            spec.taints.as_ref().unwrap()[0].key,
            labels::TO_BE_DELETED_TAINT
        );
        assert_eq!(
            n.metadata.annotations.as_ref().unwrap()[DRAIN_STARTED],
            "1970-01-01T00:00:10Z"
        );
        assert!(unmark(&mut n));
        assert!(!unmark(&mut n));
        assert!(n.spec.as_ref().unwrap().taints.as_ref().unwrap().is_empty());
        assert_eq!(n.spec.as_ref().unwrap().unschedulable, None);
    }
}
