//! What people see of a pass besides its actions: reasons for pods that get no node, why
//! idle-looking nodes stay, the status ConfigMap.

use std::collections::BTreeMap;

use crate::autoscaler::status::StatusInput;
use crate::autoscaler::{pod_subject, status, Action, Autoscaler, Level, Note, Pass, STATUS_EVERY};
use crate::model::Node;
use crate::plan::Plan;

impl Autoscaler {
    /// What people see of a pass besides its actions: why pods get no node, why idle-looking
    /// nodes stay.
    pub(in crate::autoscaler) fn report(
        &mut self,
        pass: &Pass,
        plan: &Plan,
        out: &mut Vec<Action>,
    ) {
        self.report_unschedulable(pass, plan, out);
        self.report_bad_run_times(pass, out);
        let mut kept: BTreeMap<String, String> = plan
            .kept
            .iter()
            .map(|k| (k.node.clone(), k.reason.clone()))
            .collect();
        // Drifted and expired nodes held (do-not-disrupt, a budget).
        for (node, d) in &self.disruption.lifecycle.due {
            if d.held.is_some() && !d.replacing {
                kept.insert(node.clone(), d.describe());
            }
        }
        for (node, reason) in &kept {
            if self.reported.kept.get(node) != Some(reason) {
                out.push(Action::Log {
                    level: Level::Info,
                    message: format!("idle-looking node {node} kept: {reason}"),
                });
            }
        }
        self.reported.kept = kept;
    }

    /// `NotTriggerScaleUp` once per pod and reason.
    pub(in crate::autoscaler) fn report_unschedulable(
        &mut self,
        pass: &Pass,
        plan: &Plan,
        out: &mut Vec<Action>,
    ) {
        self.reported
            .notified
            .retain(|k, _| pass.pod_index.contains_key(k));
        for u in &plan.unschedulable {
            if self.reported.notified.get(&u.pod) == Some(&u.reason) {
                continue;
            }
            let Some(&i) = pass.pod_index.get(&u.pod) else {
                continue;
            };
            self.reported
                .notified
                .insert(u.pod.clone(), u.reason.clone());
            out.push(Action::Event(Note {
                subject: pod_subject(&pass.snapshot.pods[i]),
                warning: false,
                reason: if self.config.dry_run {
                    "DryRunNoScaleUp"
                } else {
                    "NotTriggerScaleUp"
                },
                action: "ScaleUp",
                message: u.reason.clone(),
            }));
        }
    }

    /// `InvalidExpectedRunTime` (a warning, also logged) once per pending pod and value whose
    /// `gpu-node-autoscaler.io/expected-run-time` is no duration: the pod is planned as if it
    /// had none.
    pub(in crate::autoscaler) fn report_bad_run_times(
        &mut self,
        pass: &Pass,
        out: &mut Vec<Action>,
    ) {
        let mut bad = BTreeMap::new();
        for p in &pass.snapshot.pods {
            if !crate::plan::is_planned_pod(p) {
                continue;
            }
            let Err(e) = p.expected_run_time() else {
                continue;
            };
            let pod = p.id.to_string();
            let message = format!(
                "pod {pod}: {e}; it is planned as without an expected run time (e.g. \"90m\", \"6h\")"
            );
            if self.reported.bad_run_time.get(&pod) != Some(&message) {
                out.push(Action::Log {
                    level: Level::Warn,
                    message: message.clone(),
                });
                out.push(Action::Event(Note {
                    subject: pod_subject(p),
                    warning: true,
                    reason: "InvalidExpectedRunTime",
                    action: "ScaleUp",
                    message: message.clone(),
                }));
            }
            bad.insert(pod, message);
        }
        self.reported.bad_run_time = bad;
    }

    /// The status, when it changed or at least every 10 s.
    pub(in crate::autoscaler) fn publish(
        &mut self,
        pass: &Pass,
        plan: &Plan,
        out: &mut Vec<Action>,
    ) {
        let st = self.status_of(pass, plan);
        let mut timeless = st.clone();
        timeless.time.clear();
        let key = serde_json::to_string(&timeless).unwrap_or_default();
        if let Some((last, at)) = &self.reported.last_status {
            if *last == key && pass.now.since(*at) < STATUS_EVERY {
                return;
            }
        }
        self.reported.last_status = Some((key, pass.now));
        out.push(Action::Status(Box::new(st)));
    }

    /// The status written before a step's launches are sent, with those launches in
    /// `launching`: a leader that dies before their answer is recorded leaves them to the next
    /// one. The status after the launches is written whatever it holds (it drops them).
    pub(in crate::autoscaler) fn launching_status(
        &mut self,
        pass: &Pass,
        plan: &Plan,
        launching: BTreeMap<String, status::LaunchingStatus>,
    ) -> Action {
        let mut st = self.status_of(pass, plan);
        st.launching.extend(launching);
        self.reported.last_status = None;
        Action::Status(Box::new(st))
    }

    fn status_of(&self, pass: &Pass, plan: &Plan) -> status::Status {
        let nodes: Vec<&Node> = pass.snapshot.nodes.iter().collect();
        let catalog = &self.catalog;
        let mut st = status::build(&StatusInput {
            now: pass.now,
            leader: &self.config.identity,
            dry_run: self.config.dry_run,
            policy_valid: pass.policy_valid,
            policy: &pass.policy,
            nodes: &nodes,
            in_flight: &pass.view.in_flight,
            gpus_of: &|t| {
                catalog
                    .instance_type(t)
                    .and_then(|t| t.gpu.as_ref())
                    .map_or(0, |g| i64::from(g.count))
            },
            plan,
            history: &self.history,
            unavailable: &self.launches.ice,
            given_up: &self.fleet.given_up,
            replacements: &self.disruption.replace,
            lifecycle: &self
                .disruption
                .lifecycle
                .due
                .iter()
                .map(|(n, d)| (n.clone(), d.describe()))
                .collect(),
        });
        st.orphans = Self::orphan_status(pass);
        st.launched_unlisted = self
            .fleet
            .recent
            .iter()
            .map(|(id, (i, _))| (id.clone(), status::LaunchedStatus::of(i)))
            .collect();
        // A previous leader's launches still awaited go on to the next leader.
        st.launching = self
            .fleet
            .awaited
            .iter()
            .map(|(id, l)| (id.clone(), l.to_status()))
            .collect();
        st
    }
}
