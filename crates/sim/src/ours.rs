//! Our strategy in the simulator: the decision core [`Autoscaler`] that `run` executes, executed
//! here against the virtual cluster and the in-memory cloud on the virtual clock. This file
//! holds no rule of its own: it turns the world into observations, carries out the core's
//! actions and decides only when to look again.

use std::sync::Arc;
use std::time::Duration;

use gpu_node_autoscaler_core::autoscaler::{
    Action, Autoscaler, Config, DrainOutcome, Feedback, Observation, CAPACITY_ROUNDS,
};
use gpu_node_autoscaler_provider::ProviderError;
use std::collections::BTreeMap;

use gpu_node_autoscaler_core::buffer::{self, CapacityBuffer, Source};
use gpu_node_autoscaler_core::model::{GangRef, PodRef, Snapshot, Time};
use gpu_node_autoscaler_core::provisioning::{self, Condition, ProvisioningRequest};

use super::engine::{Strategy, Waiting, World};
use super::{earliest, Ms, SimBuffer, SimInput, MINUTE, SECOND};

/// How often the controller looks again while something is under way (its `--scan-interval`).
const RESYNC: Ms = 10 * SECOND;
/// An idle cluster is looked at this often (a resync that finds nothing to do changes nothing,
/// so the ones in between are skipped).
const IDLE_LOOK: Ms = 10 * MINUTE;

/// Kueue's retries of a failed ProvisioningRequest (a `ProvisioningRequestConfig`'s default
/// `retryStrategy`): a new request after 60 s doubling, at most 1800 s, three times; then the
/// job is deactivated.
const KUEUE_RETRIES: u32 = 3;
const KUEUE_BACKOFF_BASE: Ms = 60 * SECOND;
const KUEUE_BACKOFF_MAX: Ms = 1800 * SECOND;
/// The namespace of the simulated workload.
const NAMESPACE: &str = "sim";

/// The ProvisioningRequest Kueue keeps for a queued job.
struct Request {
    /// 1 for the first request, one more for each retry.
    attempt: u32,
    created: Ms,
    conditions: Vec<Condition>,
    /// Failed: Kueue makes the next request then.
    retry_at: Option<Ms>,
}

impl Request {
    fn name(&self, job: &str) -> String {
        format!("{job}-provisioning-{}", self.attempt)
    }
}

/// A queued job's ProvisioningRequest of the best-effort-atomic class, as Kueue makes it (one
/// pod per pod of the job), with its pods as the controller's converter makes them: one gang.
fn provisioning_request(job: &Waiting<'_>, r: &Request) -> ProvisioningRequest {
    let name = r.name(job.name);
    let gang = GangRef {
        key: format!("{NAMESPACE}/{}", provisioning::gang_name(&name)),
        min_member: Some(job.pods.len() as u32),
    };
    let pods = job
        .pods
        .iter()
        .enumerate()
        .map(|(j, p)| {
            let mut p = (*p).clone();
            p.id = PodRef::new(NAMESPACE, provisioning::pod_name(&name, 0, j));
            p.uid = format!("{name}/0/{j}");
            let mut a = (*p.annotations).clone();
            a.insert(provisioning::REQUEST_ANNOTATION.to_string(), name.clone());
            p.annotations = Arc::new(a);
            p.gang = Some(gang.clone());
            p.owner = None;
            p.created = Time(r.created);
            p.unschedulable = true;
            p
        })
        .collect();
    ProvisioningRequest {
        namespace: NAMESPACE.into(),
        name: name.clone(),
        uid: name,
        generation: 1,
        class_name: provisioning::CLASS_ATOMIC.into(),
        created: Time(r.created),
        valid_until: None,
        pods: Ok(pods),
        conditions: r.conditions.clone(),
    }
}

pub struct Ours {
    core: Autoscaler,
    next: Option<Ms>,
    catalog: gpu_node_autoscaler_provider::Catalog,
    /// The world's policy version last applied.
    policy_version: u64,
    /// Per queued Kueue job (by its index), its current ProvisioningRequest.
    requests: BTreeMap<usize, Request>,
    buffers: Vec<SimBuffer>,
    /// Each buffer's status as last written.
    buffer_status: BTreeMap<String, buffer::Status>,
}

impl Ours {
    pub fn new(input: &SimInput) -> Ours {
        // The core learns availability by failing, as against a real cloud.
        let mut catalog = input.catalog.clone();
        for o in &mut catalog.offerings {
            o.available = true;
        }
        let mut core = Autoscaler::new(Config {
            dry_run: false,
            max_graceful_termination: Duration::from_secs(600),
            identity: "simulator".into(),
            seed: input.seed,
            // Events and the status have no reader here.
            report: false,
        });
        core.set_policy(Arc::new(input.policy.clone()), catalog.clone());
        // A fresh cluster: no earlier leader's history.
        core.restore(None);
        Ours {
            core,
            next: None,
            catalog,
            policy_version: 0,
            requests: BTreeMap::new(),
            buffers: input.buffers.clone(),
            buffer_status: BTreeMap::new(),
        }
    }

    /// Kueue's queued jobs as ProvisioningRequests, assessed as the controller does: the
    /// conditions written back, a provisioned job admitted (its pods created, consuming the
    /// request), a failed one retried or given up on. `snapshot` with the requests' pods.
    fn kueue(&mut self, world: &mut World, snapshot: Snapshot) -> Snapshot {
        let now = world.now;
        let mut requests = Vec::new();
        let mut jobs = Vec::new();
        for job in world.waiting_jobs() {
            let r = self.requests.entry(job.index).or_insert(Request {
                attempt: 1,
                created: job.submitted,
                conditions: Vec::new(),
                retry_at: None,
            });
            match r.retry_at {
                Some(t) if t > now => continue,
                Some(t) => {
                    r.attempt += 1;
                    r.created = t;
                    r.conditions.clear();
                    r.retry_at = None;
                }
                None => {}
            }
            requests.push(provisioning_request(&job, r));
            jobs.push(job.index);
        }
        if requests.is_empty() {
            return snapshot;
        }
        let a = self
            .core
            .assess_provisioning(&snapshot, &requests, Time(now));
        let mut admitted = Vec::new();
        for u in &a.updates {
            let Some(k) = requests.iter().position(|r| r.name == u.name) else {
                continue;
            };
            let index = jobs[k];
            let Some(r) = self.requests.get_mut(&index) else {
                continue;
            };
            r.conditions = u.conditions.clone();
            let is_true = |kind: &str| u.condition(kind).is_some_and(|c| c.status == "True");
            if is_true(provisioning::PROVISIONED) {
                world.admit(index, Some(&u.name));
                admitted.push(u.name.as_str());
            } else if is_true(provisioning::FAILED) {
                if r.attempt > KUEUE_RETRIES {
                    world.deactivate(index);
                } else {
                    let wait = (KUEUE_BACKOFF_BASE << (r.attempt - 1)).min(KUEUE_BACKOFF_MAX);
                    r.retry_at = Some(now + wait);
                }
            }
        }
        if admitted.is_empty() {
            return a.snapshot(&snapshot);
        }
        // The admitted jobs' pods exist now (the scheduler binds them after this pass): they
        // stand for their requests' booked pods; the other requests are assessed again next
        // pass, with them in place.
        let mut s = world.snapshot();
        s.pods.extend(
            a.inject
                .iter()
                .filter(|p| {
                    p.annotations
                        .get(provisioning::REQUEST_ANNOTATION)
                        .is_none_or(|r| !admitted.contains(&r.as_str()))
                })
                .cloned(),
        );
        s
    }

    /// The CapacityBuffers, assessed as the controller does: `snapshot` with their virtual
    /// pods; what their room costs is the world's buffer rate until the next pass.
    fn buffers(&mut self, world: &mut World, snapshot: Snapshot) -> Snapshot {
        if self.buffers.is_empty() {
            return snapshot;
        }
        let now = Time(world.now);
        let buffers: Vec<CapacityBuffer> = self
            .buffers
            .iter()
            .map(|b| CapacityBuffer {
                namespace: NAMESPACE.into(),
                name: b.name.clone(),
                uid: b.name.clone(),
                generation: 1,
                created: Time(0),
                strategy: buffer::STRATEGY_ACTIVE.into(),
                source: Source::Scalable {
                    api_group: "apps".into(),
                    kind: "Deployment".into(),
                    name: b
                        .chunk
                        .owner
                        .as_ref()
                        .map_or_else(String::new, |o| o.name.clone()),
                },
                replicas: Some(b.replicas as i32),
                percentage: None,
                limits: None,
                limit_names: Vec::new(),
                chunk: Ok(b.chunk.clone()),
                scalable_replicas: None,
                template_generation: None,
                scalable_template: None,
                own_template: None,
                status: self.buffer_status.get(&b.name).cloned().unwrap_or_default(),
            })
            .collect();
        let a = self.core.assess_buffers(&snapshot, &buffers, now);
        for u in &a.updates {
            self.buffer_status.insert(u.name.clone(), u.status.clone());
        }
        world.set_buffer_rate(a.report.iter().map(|r| r.cost_per_hour).sum());
        if a.inject.is_empty() {
            snapshot
        } else {
            a.snapshot(&snapshot)
        }
    }

    /// The decision core's last plan (what it placed, launched and could not help).
    pub fn last_plan(&self) -> Option<&gpu_node_autoscaler_core::plan::Plan> {
        self.core.last_plan()
    }

    /// Carries out one step's actions on the world; the outcomes of those that have one.
    fn execute(&mut self, world: &mut World, actions: Vec<Action>) -> Vec<Feedback> {
        let now = Time(world.now);
        let mut feedback = Vec::new();
        for a in actions {
            match a {
                Action::Register(r) => {
                    world.register_node(&r);
                    feedback.push(Feedback::Registered {
                        node: r.node,
                        changed: true,
                    });
                }
                Action::Launch { request, .. } => {
                    let result = world.launch(&request);
                    feedback.push(Feedback::Launched {
                        launch_id: request.launch_id,
                        result,
                    });
                }
                Action::Terminate { instance_id, .. } => {
                    // Refused for an instance whose Auto Scaling group is at its minimum size.
                    let result = world
                        .terminate_instance(&instance_id)
                        .map_err(|message| ProviderError::InvalidRequest { message });
                    feedback.push(Feedback::Terminated {
                        instance_id,
                        result,
                    });
                }
                Action::DeleteNode { node } => world.delete_node(&node),
                Action::Drain(order) => {
                    // The simulated drain is immediate: evicted pods go back to pending. A node
                    // whose Auto Scaling group is at its minimum size stays, as the provider
                    // refuses its termination before the drain.
                    let outcome = match world.drain_and_remove(&order.node) {
                        Ok(()) => DrainOutcome::Removed,
                        Err(why) => DrainOutcome::RolledBack(why),
                    };
                    let _ = self.core.drain_finished(&order.node, outcome, now);
                }
                Action::RollBack { node, why, .. } => {
                    world.give_back(&node);
                    let _ = self
                        .core
                        .drain_finished(&node, DrainOutcome::RolledBack(why), now);
                }
                Action::Nominate { uid, node, .. } => world.nominate(&uid, &node),
                Action::Annotate { node, key, value } => {
                    world.annotate(&node, key, value.as_deref())
                }
                Action::Taint {
                    node,
                    taint,
                    present,
                } => world.set_taint(&node, &taint, present),
                // The simulated cloud delivers no queue notices.
                Action::AckNotice { .. }
                | Action::Event(_)
                | Action::Log { .. }
                | Action::Count(_)
                | Action::Status(_) => {}
            }
        }
        feedback
    }
}

impl Strategy for Ours {
    fn name(&self) -> &'static str {
        "gpu-node-autoscaler"
    }

    fn serves_provisioning_requests(&self) -> bool {
        true
    }

    fn pods_unschedulable(&mut self, now: Ms) {
        self.core.unschedulable_seen(Time(now));
    }

    fn cluster_changed(&mut self, now: Ms) {
        // The periodic resync notices within one period.
        let t = now + RESYNC;
        self.next = Some(self.next.map_or(t, |n| n.min(t)));
    }

    fn next_run(&self) -> Option<Ms> {
        earliest(self.core.batch_deadline().map(|t| t.0), self.next)
    }

    fn run(&mut self, world: &mut World) {
        let now = world.now;
        // The policy changed (a pool's template): reloaded, as the controller does.
        if world.policy_version() != self.policy_version {
            self.policy_version = world.policy_version();
            self.core
                .set_policy(Arc::new(world.policy.clone()), self.catalog.clone());
        }
        let snapshot = self.kueue(world, world.snapshot());
        let snapshot = self.buffers(world, snapshot);
        let obs = Observation {
            now: Time(now),
            snapshot,
            instances: Some(world.instances()),
            other_provider_ids: Vec::new(),
            policy_valid: true,
            // The interruption queue (`interruptionQueue`), as EventBridge fills it.
            notices: world.take_notices(),
            // dcgm-exporter's XIDs, where the policy reads them (`gpuMetrics`).
            gpu_xids: world.policy.gpu_metrics.is_some().then(|| world.gpu_xids()),
        };
        let mut actions = self.core.pass(obs);
        let mut steps = 0;
        let mut short = false;
        while !actions.is_empty() {
            steps += 1;
            assert!(
                steps <= 2 * CAPACITY_ROUNDS as usize + 2,
                "a pass of the decision core did not end"
            );
            let feedback = self.execute(world, actions);
            short |= feedback.iter().any(|f| match f {
                Feedback::Launched { result: Ok(r), .. } => !r.failures.is_empty(),
                Feedback::Launched { result: Err(_), .. } => true,
                Feedback::Registered { .. } | Feedback::Terminated { .. } => false,
            });
            actions = self.core.resume(feedback);
        }
        // When to look again: while pods wait, launches are short, instances boot or nodes wait
        // for a drain slot, at the resync period; otherwise when a timer of the core runs out,
        // or after a long idle.
        let pending = self.core.last_plan().is_none_or(|p| {
            !p.scale_ups.is_empty() || p.unschedulable.iter().any(|u| !u.permanent)
        });
        let mut next = self.core.next_change(Time(now)).map(|t| t.0);
        // A queued job waits for its request: looked at every resync, or when Kueue retries.
        let mut queued = false;
        for job in world.waiting_jobs() {
            match self.requests.get(&job.index).and_then(|r| r.retry_at) {
                Some(t) => next = Some(next.map_or(t, |n| n.min(t))),
                None => queued = true,
            }
        }
        if pending
            || short
            || queued
            || self.core.scale_down_held()
            || !world.unregistered().is_empty()
        {
            next = Some(next.map_or(now + RESYNC, |t| t.min(now + RESYNC)));
        }
        self.next = Some(next.unwrap_or(now + IDLE_LOOK));
    }
}

#[cfg(test)]
mod tests {
    use crate::{engine, StrategyKind};

    /// Six one-GPU nodes emptied together, two drains at a time, and a seventh busy for hours:
    /// the nodes held back by `maxConcurrentDrains` go at the next resyncs, as the controller's
    /// periodic pass removes them, not at the core's next timer (none here) or an idle look.
    #[test]
    fn nodes_held_back_for_a_drain_slot_go_at_the_next_resyncs() {
        let text = "name: t\n\
             timing: {bootMin: 60s, bootMax: 60s, devicePluginDelay: 30s}\n\
             policy:\n\
             \x20 clusterName: sim\n\
             \x20 zones: [us-east-1a]\n\
             \x20 maxConcurrentDrains: 2\n\
             \x20 pools:\n\
             \x20   - name: a10g\n\
             \x20     instanceTypes: [g5.xlarge]\n\
             \x20     capacityTypes: [on-demand]\n\
             \x20     maxNodes: 10\n\
             \x20     scaleDown: {unneededTime: 1m, cooldownAfterScaleUp: 1m}\n\
             jobs:\n\
             \x20 - name: short\n    arrival: 0s\n    duration: 10m\n    pods:\n\
             \x20     - name: w\n        replicas: 6\n        requests: {cpu: \"2\", memory: 8Gi, nvidia.com/gpu: 1}\n\
             \x20 - name: long\n    arrival: 0s\n    duration: 3h\n    pods:\n\
             \x20     - name: w\n        requests: {cpu: \"2\", memory: 8Gi, nvidia.com/gpu: 1}\n";
        let input = crate::test_input(text);
        let mut s = StrategyKind::Ours.build(&input);
        let m = engine::run(&input, s.as_mut());
        assert_eq!((m.nodes_launched, m.nodes_removed), (7, 6));
        // Each empty node waits its minute, the resync that sees it empty and at most two more
        // (two drains a pass): 6 × 90 s at most. Passes only at the core's timers would leave
        // four of them for another 10 minutes or more.
        assert!(
            m.idle_gpu_hours_empty <= 6.0 * 90.0 / 3600.0,
            "{} GPU-hours empty",
            m.idle_gpu_hours_empty
        );
    }
}
