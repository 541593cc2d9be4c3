//! Draining a node the core removes: taint `gpu-node-autoscaler.io/to-be-deleted:NoSchedule` and
//! cordon, evict its pods through the Eviction API (PDB refusals retried with back-off until the
//! deadline), then terminate the instance and delete the Node. What the drain evicts, with what
//! grace period, and what happens at the deadline is the core's [`DrainKind`]: a voluntary drain
//! (scale-down, consolidation) gives the node back (taint removed, uncordoned) when a pod cannot
//! be moved or the deadline comes; a forced one (an unhealthy or interrupted node) evicts every
//! pod but DaemonSet and mirror pods with grace periods cut to the deadline, and removes the node
//! at the deadline with what is left. The taints and the `drain-started` annotation are the
//! drain's whole state, so a controller that restarts finds a drain again and finishes or rolls
//! it back.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use gpu_node_autoscaler_provider::retry::{backoff, jitter_unit};
use gpu_node_autoscaler_provider::CloudProvider;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::Api;
use kube::Client;
use tracing::{error, info, warn};

use super::kube_io::{self, node_ref, EventSink, Evicted, Note};
use super::leader::Elector;
use super::metrics::{EvictionResult, Metrics};
use super::store::ClusterState;
use super::wall_now;
use gpu_node_autoscaler_core::autoscaler::drain::{self as rules, PodFate};
use gpu_node_autoscaler_core::model::{labels, Time};

pub use gpu_node_autoscaler_core::model::labels::{CORDONED_BY_DRAIN, DRAIN_STARTED};

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
    /// Given back (voluntary) or removed with what is left (forced) when not empty by then.
    pub deadline: Time,
    pub reason: String,
    pub kind: DrainKind,
}

pub use gpu_node_autoscaler_core::autoscaler::{DrainKind, DrainOutcome};

fn mark(node: &mut Node, started: Time) -> bool {
    let spec = node.spec.get_or_insert_with(Default::default);
    let ann = node
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
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
        ann.insert(CORDONED_BY_DRAIN.into(), "true".into());
        changed = true;
    }
    if !ann.contains_key(DRAIN_STARTED) {
        ann.insert(DRAIN_STARTED.into(), started.to_rfc3339());
        changed = true;
    }
    changed
}

fn unmark(node: &mut Node) -> bool {
    let mut changed = false;
    let cordoned_by_us = node
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CORDONED_BY_DRAIN));
    if let Some(spec) = node.spec.as_mut() {
        if let Some(taints) = spec.taints.as_mut() {
            let before = taints.len();
            taints.retain(|t| t.key != labels::TO_BE_DELETED_TAINT);
            changed |= taints.len() != before;
        }
        if cordoned_by_us && spec.unschedulable == Some(true) {
            spec.unschedulable = None;
            changed = true;
        }
    }
    if let Some(ann) = node.metadata.annotations.as_mut() {
        changed |= ann.remove(DRAIN_STARTED).is_some();
        changed |= ann.remove(CORDONED_BY_DRAIN).is_some();
        changed |= ann.remove(labels::UNNEEDED_SINCE).is_some();
    }
    changed
}

/// A pod to evict: namespace, name, and its grace period (`terminationGracePeriodSeconds`).
type ToEvict = (String, String, u64);

/// The pods still on a node being drained.
#[derive(Debug, Default)]
struct Remaining {
    /// To evict: bound there, not finished, not DaemonSet or mirror pods, not being deleted.
    evict: Vec<ToEvict>,
    /// Evicted (or deleted) and still terminating: their grace period
    /// (`terminationGracePeriodSeconds`: a training job checkpointing) is waited out before the
    /// instance goes.
    terminating: Vec<(String, String)>,
}

impl Remaining {
    fn is_empty(&self) -> bool {
        self.evict.is_empty() && self.terminating.is_empty()
    }
}

/// The pods the drain must still move or wait for, read from the API server (not the watch
/// cache: a pod bound just before the cordon must not be lost with the node). `Err` names a pod
/// that keeps the node (see [`remaining`]), or an API failure.
async fn to_move(ctx: &DrainContext, node: &str, kind: DrainKind) -> Result<Remaining, Unmovable> {
    let api: Api<k8s_openapi::api::core::v1::Pod> = Api::all(ctx.client.clone());
    let lp = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
    let list = api
        .list(&lp)
        .await
        .map_err(|e| Unmovable::Api(e.to_string()))?;
    let pdbs = ctx
        .state
        .lock()
        .unwrap()
        .pdbs
        .items
        .values()
        .cloned()
        .collect();
    let budgets = gpu_node_autoscaler_core::model::Snapshot {
        pdbs,
        ..Default::default()
    };
    remaining(list.items, &budgets, kind).map_err(Unmovable::Pod)
}

/// Sorts the pods listed on a node into those to evict and those still terminating, as the
/// drain's `kind` decides ([`DrainKind::fate`]). `Err` names a pod that keeps the node from a
/// voluntary drain: bare, safe-to-evict "false", do-not-disrupt, local storage, kube-system
/// without a budget in `budgets`, or one that cannot be read (a pod we cannot read is one we
/// cannot tell is safe to move: the node stays).
fn remaining(
    pods: Vec<k8s_openapi::api::core::v1::Pod>,
    budgets: &gpu_node_autoscaler_core::model::Snapshot,
    kind: DrainKind,
) -> Result<Remaining, String> {
    let mut conv = gpu_node_autoscaler_core::convert::Converter::new();
    let mut out = Remaining::default();
    for p in pods {
        let (ns, n) = (
            p.metadata.namespace.clone().unwrap_or_default(),
            p.metadata.name.clone().unwrap_or_default(),
        );
        let name = format!("{ns}/{n}");
        // The API server defaults it to 30 s.
        let grace = p
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30)
            .max(0) as u64;
        let read = serde_json::to_value(&p)
            .map_err(|e| e.to_string())
            .and_then(|v| conv.pod(v));
        let fate = match &read {
            Ok(p) => kind.fate(p, budgets),
            Err(e) => kind.fate_unread(&name, e),
        };
        match fate {
            PodFate::Leave => {}
            PodFate::Wait => out.terminating.push((ns, n)),
            // A pod without a name cannot be evicted: the node goes with it.
            PodFate::Evict if n.is_empty() => {}
            PodFate::Evict => out.evict.push((ns, n, grace)),
            PodFate::KeepsNode(why) => return Err(why),
        }
    }
    Ok(out)
}

enum Unmovable {
    Pod(String),
    Api(String),
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

async fn give_back(ctx: &DrainContext, node: &str, why: String) -> DrainOutcome {
    match roll_back(ctx, node, &why).await {
        Ok(()) => DrainOutcome::RolledBack(why),
        Err(e) => DrainOutcome::Failed(format!("{why}; rolling back failed: {e}")),
    }
}

pub async fn drain(ctx: Arc<DrainContext>, job: DrainJob) -> DrainOutcome {
    let api: Api<Node> = Api::all(ctx.client.clone());
    if !ctx.elector.is_leader() {
        return DrainOutcome::Abandoned;
    }
    let unknown = format!(
        "no cloud instance known for the node (pool {:?} has no provider, or its providerID \
         names no instance of ours)",
        job.pool
    );
    let instance = match (job.provider.clone(), job.instance_id.clone()) {
        (Some(provider), Some(instance_id)) => Some((provider, instance_id)),
        // Deleting the Node without terminating its instance would leave it running unseen: a
        // voluntary drain gives the node back. A forced one still evicts its pods (the node is
        // broken or being taken back: they must move, with their grace periods) and leaves the
        // node cordoned below.
        _ if job.kind == DrainKind::Voluntary => return give_back(&ctx, &job.node, unknown).await,
        _ => None,
    };
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
    let mut cut_reported = std::collections::BTreeSet::new();
    loop {
        if !ctx.elector.is_leader() {
            return DrainOutcome::Abandoned;
        }
        let pods = match to_move(&ctx, &job.node, job.kind).await {
            Ok(p) => Some(p),
            Err(Unmovable::Pod(why)) => {
                return give_back(&ctx, &job.node, format!("{why}, so it cannot be moved")).await
            }
            Err(Unmovable::Api(e)) => {
                warn!(node = %job.node, "listing the node's pods: {e}");
                None
            }
        };
        if pods.as_ref().is_some_and(Remaining::is_empty) {
            break;
        }
        if job.kind == DrainKind::Forced && wall_now() >= job.deadline {
            // The node goes now whatever is left on it: say what, and remove it.
            let left: Vec<(String, &str)> = match &pods {
                Some(r) => r
                    .evict
                    .iter()
                    .map(|(ns, n, _)| {
                        (
                            format!("{ns}/{n}"),
                            "not evicted: PodDisruptionBudget or eviction errors",
                        )
                    })
                    .chain(
                        r.terminating
                            .iter()
                            .map(|(ns, n)| (format!("{ns}/{n}"), "still terminating")),
                    )
                    .collect(),
                None => vec![("its pods".to_string(), "could not be listed")],
            };
            warn!(node = %job.node, "drain window closed with {} pod(s) left", left.len());
            ctx.events.send(Note {
                object: node_ref(&job.node),
                warning: true,
                reason: "DrainCutShort",
                action: "Drain",
                message: rules::window_closed_message(&job.node, job.deadline, &job.reason, &left),
            });
            break;
        }
        if wall_now() >= job.deadline {
            let why = match &pods {
                Some(Remaining { evict, .. }) if !evict.is_empty() => format!(
                    "{} pod(s) could not be evicted before the deadline (PodDisruptionBudget \
                     or eviction errors), e.g. {}/{}",
                    evict.len(),
                    evict[0].0,
                    evict[0].1
                ),
                Some(Remaining { terminating, .. }) if !terminating.is_empty() => format!(
                    "{} pod(s) were still terminating at the deadline, e.g. {}/{}",
                    terminating.len(),
                    terminating[0].0,
                    terminating[0].1
                ),
                _ => "the node's pods could not be listed before the deadline".to_string(),
            };
            return give_back(&ctx, &job.node, why).await;
        }
        let evict = pods.as_ref().map(|p| p.evict.as_slice()).unwrap_or(&[]);
        if evict.is_empty() {
            // Only terminating pods left: wait for them, not for the eviction back-off.
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        for (ns, name, grace) in evict {
            ctx.evictions.until_ready().await;
            let cut = job.kind.grace(*grace, wall_now(), job.deadline);
            if let Some(c) = cut {
                if cut_reported.insert((ns.clone(), name.clone())) {
                    ctx.events.send(Note {
                        object: node_ref(&job.node),
                        warning: true,
                        reason: "GracePeriodCut",
                        action: "Drain",
                        message: rules::grace_cut_message(
                            &format!("{ns}/{name}"),
                            &job.node,
                            c,
                            job.deadline,
                            &job.reason,
                        ),
                    });
                }
            }
            let result = match kube_io::evict(&ctx.client, ns, name, cut.map(|c| c.given)).await {
                Evicted::Done => "evicted",
                Evicted::Blocked(msg) => {
                    info!(pod = %format!("{ns}/{name}"), "eviction refused: {msg}");
                    "blocked"
                }
                Evicted::Failed(msg) => {
                    warn!(pod = %format!("{ns}/{name}"), "eviction failed: {msg}");
                    "failed"
                }
                Evicted::Forbidden(msg) => {
                    error!(
                        pod = %format!("{ns}/{name}"),
                        "eviction forbidden: the controller's RBAC lacks `create` on \
                         `pods/eviction` (deploy/base/rbac.yaml grants it): {msg}"
                    );
                    ctx.metrics
                        .evictions
                        .get_or_create(&EvictionResult {
                            result: "forbidden".into(),
                        })
                        .inc();
                    if job.kind == DrainKind::Forced {
                        // Never given back: the node goes at the deadline with what is left.
                        continue;
                    }
                    let why = format!(
                        "evicting {ns}/{name} is forbidden to the controller ({msg}); grant it \
                         `create` on `pods/eviction` as deploy/base/rbac.yaml does"
                    );
                    return give_back(&ctx, &job.node, why).await;
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
    if !ctx.elector.is_leader() {
        return DrainOutcome::Abandoned;
    }
    let Some((provider, instance_id)) = instance else {
        let message = format!(
            "{} was drained ({}), but {unknown}: it is left cordoned and tainted, neither \
             terminated nor deleted; delete the Node once its machine is gone",
            job.node, job.reason
        );
        warn!(node = %job.node, "{message}");
        ctx.events.send(Note {
            object: node_ref(&job.node),
            warning: true,
            reason: "InstanceUnknown",
            action: "Drain",
            message,
        });
        return DrainOutcome::Failed(unknown);
    };
    if let Err(e) = provider.terminate(&instance_id).await {
        return DrainOutcome::Failed(format!("terminating instance {instance_id}: {e}"));
    }
    if let Err(e) = kube_io::delete_node(&api, &job.node).await {
        return DrainOutcome::Failed(format!("deleting the Node: {e}"));
    }
    info!(node = %job.node, instance = %instance_id, "node removed");
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

    #[test]
    fn a_node_an_administrator_cordoned_stays_cordoned_after_a_rollback() {
        let mut n = Node::default();
        n.spec.get_or_insert_with(Default::default).unschedulable = Some(true);
        assert!(mark(&mut n, Time::from_secs(10)));
        assert!(unmark(&mut n));
        assert_eq!(n.spec.as_ref().unwrap().unschedulable, Some(true));
        assert!(n.spec.as_ref().unwrap().taints.as_ref().unwrap().is_empty());
    }

    /// A running pod of a ReplicaSet bound to `gpu-1`.
    fn bound_pod(name: Option<&str>) -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "namespace": "ml",
                "name": name,
                "ownerReferences": [{
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "worker-5d9c",
                    "uid": "rs-1",
                    "controller": true,
                }],
            },
            "spec": {"nodeName": "gpu-1", "containers": [{"name": "main"}]},
            "status": {"phase": "Running"},
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_that_cannot_be_converted_keeps_the_node() {
        let budgets = gpu_node_autoscaler_core::model::Snapshot::default();
        let voluntary = |pods| remaining(pods, &budgets, DrainKind::Voluntary);
        let movable = voluntary(vec![bound_pod(Some("worker"))]).unwrap();
        assert_eq!(
            movable.evict,
            [("ml".to_string(), "worker".to_string(), 30)]
        );
        // A pod without a name does not convert: nothing tells it may be moved, so the drain
        // may not count the node as empty once the other pod is gone.
        let why = voluntary(vec![bound_pod(Some("worker")), bound_pod(None)]).unwrap_err();
        assert!(why.contains("pod ml/ cannot be read"), "{why}");
        let why = voluntary(vec![bound_pod(None)]).unwrap_err();
        assert!(why.contains("cannot be read"), "{why}");
    }

    #[test]
    fn an_interrupt_drain_evicts_a_bare_trainer_with_dev_shm() {
        let budgets = gpu_node_autoscaler_core::model::Snapshot::default();
        // A bare trainer, annotated safe-to-evict "false", with an emptyDir at /dev/shm, asking
        // for ten minutes to checkpoint.
        let mut trainer: serde_json::Value =
            serde_json::to_value(bound_pod(Some("trainer"))).unwrap();
        trainer["metadata"]["ownerReferences"] = serde_json::json!(null);
        trainer["metadata"]["annotations"] =
            serde_json::json!({"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"});
        trainer["spec"]["terminationGracePeriodSeconds"] = serde_json::json!(600);
        trainer["spec"]["volumes"] =
            serde_json::json!([{"name": "shm", "emptyDir": {"medium": "Memory"}}]);
        let trainer: k8s_openapi::api::core::v1::Pod = serde_json::from_value(trainer).unwrap();
        let why = remaining(vec![trainer.clone()], &budgets, DrainKind::Voluntary).unwrap_err();
        assert!(why.contains("ml/trainer"), "{why}");
        let forced = remaining(vec![trainer], &budgets, DrainKind::Forced).unwrap();
        assert_eq!(
            forced.evict,
            [("ml".to_string(), "trainer".to_string(), 600)]
        );
        // A pod that cannot be read (here: without a name) does not keep the node from a forced
        // drain; nameless, it cannot be evicted either: the node goes with it.
        let forced = remaining(vec![bound_pod(None)], &budgets, DrainKind::Forced).unwrap();
        assert!(forced.is_empty(), "{forced:?}");
    }
}
