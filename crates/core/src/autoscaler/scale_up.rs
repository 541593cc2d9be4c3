//! Scale-up within a pass: plan, nominate pending pods to the nodes launched for them, ask for
//! the launches and act on their outcome (capacity re-planning, gangs all or nothing, back-off).

use crate::hash::{HashMap, HashSet};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use gpu_node_autoscaler_provider::retry::{backoff, jitter_unit};
use gpu_node_autoscaler_provider::{Instance, InstanceState, LaunchResult, ProviderError};

use crate::autoscaler::fleet::{launch_request, launch_reservations, NodeIndex};
use crate::autoscaler::{
    pod_subject, replace, status, Action, Autoscaler, Count, Feedback, Issued, Level, Note, Pass,
    Stage, CAPACITY_ROUNDS,
};
use crate::model::snapshot::PoolState;
use crate::model::{Node, Snapshot, Time};
use crate::plan;
use crate::plan::{Plan, ScaleUp};

impl Autoscaler {
    /// Plans with what is known now and asks for the launches.
    pub(in crate::autoscaler) fn plan_round(
        &mut self,
        mut pass: Pass,
        round: u32,
        now: Time,
        out: &mut Vec<Action>,
    ) {
        let Some(templates) = pass.templates.clone() else {
            return;
        };
        if round > 0 {
            self.before_replan(&mut pass, out);
        }
        pass.snapshot.in_flight = pass.view.in_flight.clone();
        pass.snapshot.held = pass.view.held();
        let keep = pass.policy.max_node_provision_time;
        self.launches
            .planned
            .retain(|_, (at, _)| now.since(*at) < keep);
        self.launches
            .fingerprints
            .retain(|_, (at, _)| now.since(*at) < keep);
        // Twice the provision time: a record that reached it is given up after this pass's
        // launch (below); one kept longer is of an id no longer asked for.
        self.launches
            .short
            .retain(|_, since| now.since(*since) < keep + keep);
        pass.snapshot.planned = self
            .launches
            .planned
            .iter()
            .map(|(id, (_, lists))| (id.clone(), lists.clone()))
            .collect();
        pass.snapshot.unavailable = self.launches.ice.clone();
        pass.snapshot.pools = self
            .history
            .iter()
            .map(|(pool, h)| {
                let state = PoolState {
                    last_scale_up: h.last_scale_up,
                    last_scale_down_failure: h.last_scale_down_failure,
                };
                (pool.clone(), state)
            })
            .collect();
        let now_templates = templates.for_snapshot(&pass.snapshot, now);
        pass.released
            .extend(plan::consolidate::release_for_on_demand(
                &mut pass.snapshot,
                &now_templates,
                &pass.policy,
            ));
        let restored = self.restore_nominations(&mut pass.snapshot);
        self.apply_refusals(&mut pass.snapshot);
        let plan = plan::plan_with(&pass.snapshot, &templates, &pass.policy, now);
        self.nominate(&pass.snapshot, &plan, &restored, out);
        if round == 0 {
            self.note_refusals(&pass.snapshot, &plan, now, out);
        }
        // A launch whose capacity went to other pods is done with: its capacity given to them by
        // this plan (in flight), or its instance already a Node (the scheduler placed pods on
        // it). Its own pods, planned again, need a launch of their own: under the old id the
        // provider would answer with the instance it already has and launch nothing. A launch
        // still on its way and not used by the plan keeps its id: asking again for it launches
        // nothing new (after a crash, or while the cloud lists it with less than the plan can
        // place pods on).
        let mut taken: HashSet<&str> = HashSet::default();
        if !plan.scale_ups.is_empty() {
            taken.extend(
                plan.existing_capacity
                    .iter()
                    .filter_map(|p| p.target.strip_prefix("launch/")),
            );
            let nodes = NodeIndex::new(&pass.snapshot.nodes);
            taken.extend(
                pass.instances
                    .iter()
                    .filter(|i| nodes.contains(&i.provider_id))
                    .map(|i| i.launch_id.as_str()),
            );
        }
        let mut issued = Vec::with_capacity(plan.scale_ups.len());
        let mut first_launch = None;
        let mut launching = BTreeMap::new();
        for su in &plan.scale_ups {
            let cut = replace::consolidation_launch(
                su,
                &self.disruption.replace.replacing,
                &pass.moved_from,
            );
            let su = cut.as_ref().unwrap_or(su);
            let pool = pass.policy.pool(&su.pool);
            let version = pass
                .snapshot
                .launch_versions
                .get(&su.pool)
                .map(String::as_str);
            let fingerprint =
                pool.map(|p| self.fingerprints.get(&pass.policy, p, version).to_string());
            let pool = pool.zip(fingerprint.as_deref());
            let mut attempt = 0;
            let mut req = launch_request(su, pool, attempt);
            while self.fleet.given_up.contains_key(&req.launch_id)
                || taken.contains(req.launch_id.as_str())
            {
                attempt += 1;
                req = launch_request(su, pool, attempt);
            }
            req.reservations =
                launch_reservations(su, pool.map(|(p, _)| p), &pass.snapshot.reservations, now);
            out.push(Action::Count(Count::Planned { pods: pod_keys(su) }));
            let what = describe(su);
            if self.config.dry_run {
                // Reasons of its own, so that it can run beside the Cluster Autoscaler, whose
                // Events (TriggeredScaleUp, NotTriggerScaleUp, ScaleDown) tools read.
                notify_pods(
                    &pass,
                    su,
                    "DryRunScaleUp",
                    format!("would launch {what}"),
                    out,
                );
                issued.push(Issued {
                    launch_id: req.launch_id,
                    launched: false,
                });
                continue;
            }
            let backing_off = self
                .launches
                .launch_backoff
                .get(&su.pool)
                .is_some_and(|(until, _)| *until > now);
            // A previous leader's launch in this pool, its answer unknown: what it made may
            // already hold these pods' capacity (the cloud's listing lags behind its launches).
            let awaiting = self.fleet.awaited.values().any(|l| l.pool == su.pool);
            if backing_off || awaiting {
                issued.push(Issued {
                    launch_id: req.launch_id,
                    launched: false,
                });
                continue;
            }
            out.push(Action::Log {
                level: Level::Info,
                message: format!("launching {what} (launch id {})", req.launch_id),
            });
            // Pending pods only: pods moving off a node being replaced stay where they run
            // until it is drained, and are planned afresh at every pass.
            if !su.pods_per_node.is_empty() {
                let mut pods = su.pods.iter();
                let lists = su
                    .pods_per_node
                    .iter()
                    .map(|&n| {
                        pods.by_ref()
                            .take(n)
                            .filter(|p| !pass.moved_from.contains_key(&p.key))
                            .map(|p| p.key.clone())
                            .collect()
                    })
                    .collect();
                self.launches
                    .planned
                    .insert(req.launch_id.clone(), (now, Arc::new(lists)));
            }
            if let Some(fp) = req.tags.get(crate::model::labels::LAUNCH_FINGERPRINT) {
                self.launches
                    .fingerprints
                    .insert(req.launch_id.clone(), (now, fp.clone()));
            }
            issued.push(Issued {
                launch_id: req.launch_id.clone(),
                launched: true,
            });
            first_launch.get_or_insert(out.len());
            launching.insert(
                req.launch_id.clone(),
                status::LaunchingStatus {
                    pool: su.pool.clone(),
                    count: su.count,
                    asked_at: now.to_rfc3339(),
                },
            );
            out.push(Action::Launch {
                request: req,
                pods: pod_keys(su),
            });
        }
        // The launches are recorded before they are sent (the executor sends none of them if
        // that fails).
        if let (Some(at), true) = (first_launch, self.config.report) {
            let st = self.launching_status(&pass, &plan, launching);
            out.insert(at, st);
        }
        let waiting = issued.iter().any(|i| i.launched);
        pass.stage = Stage::Launching {
            round,
            plan: Box::new(plan),
            issued,
        };
        if waiting {
            self.pass = Some(pass);
        } else {
            let Stage::Launching {
                round,
                plan,
                issued,
            } = std::mem::replace(&mut pass.stage, Stage::Registering(BTreeMap::new()))
            else {
                unreachable!("set above")
            };
            self.after_launches(pass, round, *plan, issued, Vec::new(), out);
        }
    }

    /// Gangs' pending pods whose nomination made here the scheduler has cleared (it tried the pod
    /// while the node was still NotReady) are planned as nominated: this pass nominates them again
    /// before the node turns Ready. Without it the plan would expect single pods on the gang's
    /// registered node (as the scheduler places them when nothing is nominated there) and launch
    /// another node for the member. Single pods are planned afresh: the plan places bigger pods
    /// first anyway, and keeping every earlier placement cost more where pods arrive in bursts
    /// (the `multigpu40` trace, +0.75 % over three seeds). Returns their indices.
    pub(in crate::autoscaler) fn restore_nominations(
        &self,
        snapshot: &mut Snapshot,
    ) -> HashSet<usize> {
        let mut restored = HashSet::default();
        if self.launches.nominated.is_empty() {
            return restored;
        }
        for (i, p) in snapshot.pods.iter_mut().enumerate() {
            if p.nominated_node.is_none() && p.is_pending() && p.gang.is_some() {
                if let Some(node) = self.launches.nominated.get(&p.uid) {
                    p.nominated_node = Some(node.clone());
                    restored.insert(i);
                }
            }
        }
        restored
    }

    /// Nominates each pending pod that the plan places on a node of ours to that node
    /// (`status.nominatedNodeName`). The scheduler then tries that node first for the pod, and
    /// keeps the pod's room on it while placing pods of no higher priority: a one-GPU pod does not
    /// take the eight-GPU node launched for a gang's worker because that node turned Ready first
    /// and is the emptiest. A nomination made by someone else (the scheduler's, for a preemption)
    /// is left alone while its node exists. The scheduler clears a nomination when the pod fails
    /// to schedule (e.g. on the node while it is not Ready yet); the next pass sets it again.
    pub(in crate::autoscaler) fn nominate(
        &mut self,
        snapshot: &Snapshot,
        plan: &Plan,
        restored: &HashSet<usize>,
        out: &mut Vec<Action>,
    ) {
        if self.config.dry_run {
            return;
        }
        if !self.launches.nominated.is_empty() {
            let pending: HashSet<&str> = snapshot
                .pods
                .iter()
                .filter(|p| p.is_pending())
                .map(|p| p.uid.as_str())
                .collect();
            self.launches
                .nominated
                .retain(|uid, _| pending.contains(uid.as_str()));
        }
        let mut nodes: Option<HashMap<&str, &Node>> = None;
        for placed in &plan.existing_capacity {
            if placed.target.starts_with("launch/") {
                continue;
            }
            let Some(pod) = snapshot.pods.get(placed.pod_index) else {
                continue;
            };
            let nodes = nodes.get_or_insert_with(|| {
                snapshot
                    .nodes
                    .iter()
                    .map(|n| (n.name.as_str(), n))
                    .collect()
            });
            let Some(node) = nodes.get(placed.target.as_str()) else {
                continue;
            };
            if node.pool().is_none() || node.deleting || !pod.is_pending() {
                continue;
            }
            let ours = self.launches.nominated.get(&pod.uid).map(String::as_str);
            let shown = if restored.contains(&placed.pod_index) {
                None
            } else {
                pod.nominated_node.as_deref()
            };
            match shown {
                Some(n) if n == placed.target => continue,
                Some(n) if ours != Some(n) && nodes.contains_key(n) => continue,
                _ => {}
            }
            if self.config.report && ours != Some(placed.target.as_str()) {
                out.push(Action::Event(Note {
                    subject: pod_subject(pod),
                    warning: false,
                    reason: "Nominated",
                    action: "Nominate",
                    message: format!("expected on node {} (nominated)", placed.target),
                }));
            }
            self.launches
                .nominated
                .insert(pod.uid.clone(), placed.target.clone());
            out.push(Action::Nominate {
                pod: placed.pod.clone(),
                uid: pod.uid.clone(),
                node: placed.target.clone(),
            });
        }
    }

    pub(in crate::autoscaler) fn after_launches(
        &mut self,
        mut pass: Pass,
        round: u32,
        plan: Plan,
        issued: Vec<Issued>,
        feedback: Vec<Feedback>,
        out: &mut Vec<Action>,
    ) {
        let now = pass.now;
        let mut results: HashMap<String, Result<LaunchResult, ProviderError>> = feedback
            .into_iter()
            .filter_map(|f| match f {
                Feedback::Launched { launch_id, result } => Some((launch_id, result)),
                Feedback::Registered { .. } | Feedback::Terminated { .. } => None,
            })
            .collect();
        let ttl = pass.policy.insufficient_capacity_ttl;
        let mut capacity_failed = false;
        let mut launched: Vec<Vec<Instance>> = Vec::with_capacity(issued.len());
        for (su, is) in plan.scale_ups.iter().zip(&issued) {
            if !is.launched {
                launched.push(Vec::new());
                continue;
            }
            // A launch the executor did not answer did not happen (leadership lost meanwhile).
            let result = results.remove(&is.launch_id).unwrap_or_else(|| {
                Ok(LaunchResult {
                    launched: Vec::new(),
                    failures: Vec::new(),
                })
            });
            let mut other_failure = false;
            let mut failure: Option<String> = None;
            let instances = match result {
                Ok(res) => {
                    for (key, err) in &res.failures {
                        out.push(Action::Count(Count::FailedLaunch {
                            pool: su.pool.clone(),
                            reason: err.metric_label(),
                        }));
                        if matches!(err, ProviderError::InsufficientCapacity { .. }) {
                            capacity_failed |= !self.launches.ice.contains_key(key);
                            self.launches.ice.insert(key.clone(), now + ttl);
                        } else {
                            out.push(Action::Log {
                                level: Level::Warn,
                                message: format!("pool {}: launching {key} failed: {err}", su.pool),
                            });
                            other_failure = true;
                        }
                        failure.get_or_insert_with(|| format!("launching {key} failed: {err}"));
                    }
                    res.launched
                }
                Err(e) => {
                    out.push(Action::Log {
                        level: Level::Warn,
                        message: format!("pool {}: launch failed: {e}", su.pool),
                    });
                    out.push(Action::Count(Count::FailedLaunch {
                        pool: su.pool.clone(),
                        reason: e.metric_label(),
                    }));
                    other_failure = true;
                    failure = Some(format!("launch failed: {e}"));
                    Vec::new()
                }
            };
            let n = instances.len() as u32;
            // Answered short without a failure, and the cloud lists none of the rest: under way
            // (an Auto Scaling group's raise not listed yet), or counted under this id from long
            // before (terminated instances clouds remember: the same pods moved to the same
            // instance type hours later), when asking again launches nothing, pass after pass.
            // Still so after the max node provision time, the id is given up, as a launch that
            // never becomes a Node is, and the next pass asks under a new one.
            let has = if n < su.count && failure.is_none() && !other_failure {
                pass.instances
                    .iter()
                    .filter(|i| {
                        i.launch_id == is.launch_id
                            && !matches!(
                                i.state,
                                InstanceState::Terminated | InstanceState::ShuttingDown
                            )
                    })
                    .map(|i| i.id.as_str())
                    .chain(
                        self.fleet
                            .recent
                            .values()
                            .filter(|(i, _)| i.launch_id == is.launch_id)
                            .map(|(i, _)| i.id.as_str()),
                    )
                    .chain(instances.iter().map(|i| i.id.as_str()))
                    .collect::<HashSet<&str>>()
                    .len() as u32
            } else {
                su.count
            };
            if has < su.count {
                let since = *self
                    .launches
                    .short
                    .entry(is.launch_id.clone())
                    .or_insert(now);
                if now.since(since) >= pass.policy.max_node_provision_time {
                    self.launches.short.remove(&is.launch_id);
                    self.fleet.given_up.insert(is.launch_id.clone(), now);
                    out.push(Action::Log {
                        level: Level::Info,
                        message: format!(
                            "pool {}: launch id {} has {has} of its {} instance(s) after {}s of \
                             asking: given up, planned again under a new id",
                            su.pool,
                            is.launch_id,
                            su.count,
                            now.since(since).as_secs()
                        ),
                    });
                }
            } else {
                self.launches.short.remove(&is.launch_id);
            }
            if let (true, Some(why)) = (n < su.count, failure) {
                for p in su
                    .pods
                    .iter()
                    .filter(|p| pass.moved_from.contains_key(&p.key))
                {
                    pass.launch_failed.insert(p.key.clone(), why.clone());
                }
            }
            if other_failure {
                let failures = self
                    .launches
                    .launch_backoff
                    .get(&su.pool)
                    .map_or(0, |b| b.1)
                    + 1;
                self.launches.jitter_draws += 1;
                let wait = backoff(
                    Duration::from_secs(5),
                    Duration::from_secs(300),
                    failures - 1,
                    jitter_unit(self.config.seed ^ self.launches.jitter_draws.rotate_left(32)),
                );
                out.push(Action::Log {
                    level: Level::Warn,
                    message: format!(
                        "pool {}: launches wait {}s after {failures} failure(s)",
                        su.pool,
                        wait.as_secs()
                    ),
                });
                self.launches
                    .launch_backoff
                    .insert(su.pool.clone(), (now + wait, failures));
            } else if n == su.count {
                self.launches.launch_backoff.remove(&su.pool);
            }
            for i in &instances {
                self.fleet.recent.insert(i.id.clone(), (i.clone(), now));
                self.fleet.seen.insert(i.id.clone(), i.launch_id.clone());
            }
            if n > 0 {
                out.push(Action::Count(Count::ScaleUps {
                    pool: su.pool.clone(),
                    nodes: n,
                }));
                // A gang's launch counts once it is whole (below).
                if su.gang.is_none() {
                    self.history
                        .entry(su.pool.clone())
                        .or_default()
                        .last_scale_up = Some(now);
                }
                let what = describe(su);
                let note = if n < su.count {
                    format!("launched {n} of {what}; the rest is planned again")
                } else {
                    format!("launched {what}")
                };
                notify_pods(&pass, su, "TriggeredScaleUp", note, out);
            }
            launched.push(instances);
        }
        if !self.config.dry_run {
            self.settle_gangs(&pass, &plan, &issued, &launched, out);
        }
        // An offering just found short of capacity is now avoided: plan the rest again at once.
        // Other failures wait for their back-off.
        if capacity_failed && round + 1 < CAPACITY_ROUNDS && !self.config.dry_run {
            let nodes = std::mem::take(&mut pass.snapshot.nodes);
            let index = NodeIndex::new(&nodes);
            pass.view = self.fleet_of(&pass.instances, &index, &[], &pass.policy, now);
            drop(index);
            pass.snapshot.nodes = nodes;
            self.plan_round(pass, round + 1, now, out);
            return;
        }
        self.finish(pass, plan, out);
    }

    /// All or nothing: a gang whose scale-ups were not all fulfilled gives its instances back
    /// and is planned again under a new launch id.
    pub(in crate::autoscaler) fn settle_gangs(
        &mut self,
        pass: &Pass,
        plan: &Plan,
        issued: &[Issued],
        launched: &[Vec<Instance>],
        out: &mut Vec<Action>,
    ) {
        let short: BTreeSet<&str> = plan
            .scale_ups
            .iter()
            .zip(issued.iter().zip(launched))
            .filter(|(su, (is, l))| !is.launched || (l.len() as u32) < su.count)
            .filter_map(|(su, _)| su.gang.as_deref())
            .collect();
        for ((su, is), l) in plan.scale_ups.iter().zip(issued).zip(launched) {
            let Some(g) = su.gang.as_deref() else {
                continue;
            };
            if short.contains(g) {
                if l.is_empty() {
                    continue;
                }
                self.fleet.given_up.insert(is.launch_id.clone(), pass.now);
                for i in l {
                    self.fleet.recent.remove(&i.id);
                    out.push(Action::Terminate {
                        pool: su.pool.clone(),
                        instance_id: i.id.clone(),
                        why: format!("giving back the partial launch of gang {g}"),
                    });
                }
                notify_pods(
                    pass,
                    su,
                    "NotTriggerScaleUp",
                    format!(
                        "gang {g} could not be launched whole; its {} instance(s) were given \
                         back and it is planned again",
                        l.len()
                    ),
                    out,
                );
            } else if !l.is_empty() {
                self.history
                    .entry(su.pool.clone())
                    .or_default()
                    .last_scale_up = Some(pass.now);
            }
        }
    }
}

pub(super) fn notify_pods(
    pass: &Pass,
    su: &ScaleUp,
    reason: &'static str,
    message: String,
    out: &mut Vec<Action>,
) {
    // Without reports the index is empty: no Event.
    for key in &su.pods {
        let Some(&i) = pass.pod_index.get(key.as_str()) else {
            continue;
        };
        out.push(Action::Event(Note {
            subject: pod_subject(&pass.snapshot.pods[i]),
            warning: false,
            reason,
            action: "ScaleUp",
            message: message.clone(),
        }));
    }
}

pub(super) fn pod_keys(su: &ScaleUp) -> Vec<String> {
    su.pods.iter().map(|p| p.key.clone()).collect()
}

pub(super) fn describe(su: &ScaleUp) -> String {
    let first = su.offerings.first();
    format!(
        "{} × {} in {} ({}), pool {}",
        su.count,
        first.map_or("-", |o| o.instance_type.as_str()),
        first.map_or("-", |o| o.zone.as_str()),
        first.map_or("-", |o| o.capacity_type.as_str()),
        su.pool
    )
}
