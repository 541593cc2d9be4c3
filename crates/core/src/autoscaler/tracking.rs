//! Fleet tracking: what this process launched until the cloud lists it, launch ids retired or
//! given up, the templates corrected by what registered nodes allocate, launches that never became
//! working nodes, nodes whose GPUs went missing.

use crate::hash::{HashMap, HashSet};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use gpu_node_autoscaler_provider::retry::backoff;
use gpu_node_autoscaler_provider::{Instance, InstanceState, OfferingKey, ProviderError};

use crate::autoscaler::fleet::{fleet_view, FleetView, NodeIndex};
use crate::autoscaler::{Action, Autoscaler, Count, Level, Note, Pass, Subject, RECENT_FOR};
use crate::model::{labels, Node, Time};
use crate::policy::duration::format_duration;
use crate::policy::Policy;

/// The first retry of a give-up's termination that failed comes this long after it; each
/// further failure doubles the wait, up to [`TERMINATE_RETRY_MAX`].
const TERMINATE_RETRY_BASE: Duration = Duration::from_secs(30);
const TERMINATE_RETRY_MAX: Duration = Duration::from_secs(600);

/// An instance given up (it never became a working node) that the cloud still lists.
#[derive(Clone, Debug)]
pub(in crate::autoscaler) struct Terminating {
    pool: String,
    /// Its Node (registered, never advertised GPUs): deleted once the cloud has accepted the
    /// termination, never before (a Node deleted for an instance still running would leave it
    /// unseen).
    node: Option<String>,
    /// Terminations of it that failed, in a row.
    failures: u32,
    /// No new termination before then (the cloud may take a while to list it as gone).
    retry_at: Time,
}

/// When the termination asked for at `now` is asked for again if the instance is still listed,
/// after `failures` failed ones.
fn terminate_retry_at(now: Time, failures: u32) -> Time {
    // No jitter: a handful of instances, retried at the pace of the passes.
    now + backoff(TERMINATE_RETRY_BASE, TERMINATE_RETRY_MAX, failures, 1.0)
}

impl Autoscaler {
    /// Corrects the templates by what registered nodes allocate, so that a pod that did not fit
    /// the node launched for it is not launched for again on the same instance type.
    pub(in crate::autoscaler) fn learn_templates(&mut self, nodes: &[Node], out: &mut Vec<Action>) {
        let Some(templates) = self.templates.as_mut() else {
            return;
        };
        // Unshared between passes (the last pass was dropped): no copy.
        let changed = Arc::make_mut(templates).learn_from(nodes);
        for l in changed {
            let less = l.now.cpu_milli < l.was.cpu_milli
                || l.now.memory < l.was.memory
                || l.now.pods < l.was.pods;
            out.push(Action::Log {
                level: if less { Level::Warn } else { Level::Info },
                message: format!(
                    "{} nodes of pool {} allocate {} and {} pods (node {}), not {} and {} pods \
                     as planned: planning with what they allocate",
                    l.instance_type, l.pool, l.now, l.now.pods, l.node, l.was, l.was.pods
                ),
            });
        }
    }

    /// Keeps what this process launched until the cloud lists it, and retires the launch ids of
    /// instances that are gone (terminated, interrupted): the same pods planned again get a new
    /// launch, not the idempotent answer of the old one.
    pub(in crate::autoscaler) fn track_instances(&mut self, listed: &[Instance], now: Time) {
        let live = |i: &Instance| {
            !matches!(
                i.state,
                InstanceState::Terminated | InstanceState::ShuttingDown
            )
        };
        let listed_ids: HashSet<&str> = listed.iter().map(|i| i.id.as_str()).collect();
        self.fleet.recent.retain(|id, (_, added)| {
            !listed_ids.contains(id.as_str()) && now.since(*added) < RECENT_FOR
        });
        // A previous leader's launch is answered once the cloud lists what it asked for (or its
        // id is given up); unanswered after as long as a launch of ours is remembered, it made
        // nothing.
        if !self.fleet.awaited.is_empty() {
            let mut per_launch: HashMap<&str, u32> = HashMap::default();
            for i in listed
                .iter()
                .chain(self.fleet.recent.values().map(|(i, _)| i))
            {
                *per_launch.entry(i.launch_id.as_str()).or_default() += 1;
            }
            let given_up = &self.fleet.given_up;
            self.fleet.awaited.retain(|id, l| {
                now.since(l.asked_at) < RECENT_FOR
                    && !given_up.contains_key(id)
                    && per_launch.get(id.as_str()).copied().unwrap_or(0) < l.count
            });
        }
        let current: HashMap<&str, &str> = listed
            .iter()
            .filter(|i| live(i))
            .chain(self.fleet.recent.values().map(|(i, _)| i))
            .map(|i| (i.id.as_str(), i.launch_id.as_str()))
            .collect();
        let given_up = &mut self.fleet.given_up;
        self.fleet.seen.retain(|id, launch_id| {
            let there = current.contains_key(id.as_str());
            if !there && !launch_id.is_empty() {
                given_up.entry(launch_id.clone()).or_insert(now);
            }
            there
        });
        // Terminated at last (or the cloud no longer lists it): it no longer counts.
        self.fleet
            .terminating
            .retain(|id, _| current.contains_key(id.as_str()));
        for (id, launch_id) in current {
            if !self.fleet.seen.contains_key(id) {
                self.fleet
                    .seen
                    .insert(id.to_string(), launch_id.to_string());
            }
        }
    }

    /// Joins the cloud's instances (listed, and launched here but not listed yet) with the
    /// Nodes: what is in flight, what is overdue, which instance each Node is.
    pub(in crate::autoscaler) fn fleet_of(
        &mut self,
        listed: &[Instance],
        nodes: &NodeIndex,
        other_provider_ids: &[String],
        policy: &Policy,
        now: Time,
    ) -> FleetView {
        let listed_ids: HashSet<&str> = listed.iter().map(|i| i.id.as_str()).collect();
        let all: Vec<&Instance> = listed
            .iter()
            .chain(
                self.fleet
                    .recent
                    .values()
                    .map(|(i, _)| i)
                    .filter(|i| !listed_ids.contains(i.id.as_str())),
            )
            .collect();
        let recent = &self.fleet.recent;
        let known = |id: &str| listed_ids.contains(id) || recent.contains_key(id);
        self.fleet.registered.retain(|id| known(id));
        self.fleet.lost.retain(|id, _| known(id));
        for i in &all {
            if let Some(n) = nodes.get(&i.provider_id) {
                if !self.fleet.registered.contains(&i.id) {
                    self.fleet.registered.insert(i.id.clone());
                }
                // A Node re-created for an instance that lost its own waits from when that went
                // until it works again (advertises its GPUs), not from the launch.
                if n.advertised_gpus() > 0 || n.annotations.contains_key(labels::GPUS_ADVERTISED) {
                    self.fleet.lost.remove(&i.id);
                }
            } else if other_provider_ids.contains(&i.provider_id) {
                if !self.fleet.registered.contains(&i.id) {
                    self.fleet.registered.insert(i.id.clone());
                }
                self.fleet.lost.remove(&i.id);
            } else if self.fleet.registered.contains(&i.id) {
                self.fleet.lost.entry(i.id.clone()).or_insert(now);
            }
        }
        let catalog = &self.catalog;
        let lost = &self.fleet.lost;
        let terminating = &self.fleet.terminating;
        let max_provision = policy.max_node_provision_time;
        // A Node created after its instance's provision time ran out is not the launch's first
        // (that one would have been given up by then): it was re-created, and waits from its
        // creation (also when this process did not see the old one go).
        let waiting_since = |i: &Instance| {
            let launched = Time(i.launched_at_ms);
            let since = lost.get(&i.id).copied().unwrap_or(launched);
            match nodes.get(&i.provider_id) {
                Some(n)
                    if n.created > launched + max_provision && !terminating.contains_key(&i.id) =>
                {
                    since.max(n.created)
                }
                _ => since,
            }
        };
        fleet_view(
            all,
            nodes,
            now,
            policy.max_node_provision_time,
            |k: &OfferingKey| {
                catalog
                    .instance_type(&k.instance_type)
                    .is_none_or(|t| t.gpu.is_some())
            },
            waiting_since,
        )
    }

    /// Instances that never became working nodes: terminated, their offering avoided.
    pub(in crate::autoscaler) fn give_up_overdue(&mut self, pass: &Pass, out: &mut Vec<Action>) {
        if self.config.dry_run {
            return;
        }
        let now = pass.now;
        for o in &pass.view.overdue {
            let i = &o.instance;
            let why = match &o.node {
                Some(n) => format!("node {n} never advertised its GPUs"),
                None => "no Node registered".to_string(),
            };
            if let Some(t) = self.fleet.terminating.get_mut(&i.id) {
                // Given up already: terminated again once its back-off has run out.
                if now < t.retry_at {
                    continue;
                }
                t.retry_at = terminate_retry_at(now, t.failures);
                out.push(Action::Log {
                    level: Level::Warn,
                    message: format!(
                        "terminating instance {} of launch {} again (given up, still listed, \
                         {} failed termination(s))",
                        i.id, i.launch_id, t.failures
                    ),
                });
                t.node = o.node.clone();
                out.push(Action::Terminate {
                    pool: i.pool.clone(),
                    instance_id: i.id.clone(),
                    why,
                });
                continue;
            }
            self.fleet.terminating.insert(
                i.id.clone(),
                Terminating {
                    pool: i.pool.clone(),
                    node: o.node.clone(),
                    failures: 0,
                    retry_at: terminate_retry_at(now, 0),
                },
            );
            out.push(Action::Log {
                level: Level::Warn,
                message: format!(
                    "giving up a launch ({}: instance {}, {}) after {}: {why}",
                    i.launch_id,
                    i.id,
                    i.offering,
                    format_duration(pass.policy.max_node_provision_time)
                ),
            });
            self.launches.ice.insert(
                i.offering.clone(),
                now + pass.policy.insufficient_capacity_ttl,
            );
            self.fleet.given_up.insert(i.launch_id.clone(), now);
            out.push(Action::Count(Count::FailedLaunch {
                pool: i.pool.clone(),
                reason: "provision_timeout",
            }));
            self.fleet.recent.remove(&i.id);
            out.push(Action::Terminate {
                pool: i.pool.clone(),
                instance_id: i.id.clone(),
                why: why.clone(),
            });
            if let Some(n) = &o.node {
                out.push(Action::Event(Note {
                    subject: Subject::Node(n.clone()),
                    warning: true,
                    reason: "ScaleDown",
                    action: "GiveUp",
                    message: format!(
                        "instance {} given up: {why}; it is terminated, and the Node deleted \
                         once the cloud has accepted the termination",
                        i.id
                    ),
                }));
            }
        }
    }

    /// The termination of an instance given up was accepted: its Node, if it has one, goes now.
    pub(in crate::autoscaler) fn give_up_terminated(
        &mut self,
        instance_id: &str,
        out: &mut Vec<Action>,
    ) {
        if let Some(node) = self
            .fleet
            .terminating
            .get_mut(instance_id)
            .and_then(|t| t.node.take())
        {
            out.push(Action::DeleteNode { node });
        }
    }

    /// The termination of an instance given up failed: counted, reported, and retried later
    /// (until then, and as long as the cloud lists it, it counts against its pool's limits).
    pub(in crate::autoscaler) fn give_up_terminate_failed(
        &mut self,
        instance_id: &str,
        e: &ProviderError,
        out: &mut Vec<Action>,
    ) {
        let Some(t) = self.fleet.terminating.get_mut(instance_id) else {
            return;
        };
        t.failures += 1;
        let message = format!(
            "instance {instance_id} of pool {}, given up (it never became a node), could not be \
             terminated ({} time(s) in a row): {e}; it counts against the pool's limits until \
             the cloud no longer lists it, and termination is tried again",
            t.pool, t.failures
        );
        super::warn_pool(out, &t.pool, "GiveUpTerminateFailed", "Terminate", message);
        out.push(Action::Count(Count::GiveUpTerminateFailed {
            pool: t.pool.clone(),
        }));
    }

    /// Nodes whose GPUs went missing after they advertised them: reported (Event, log, gauge),
    /// never terminated for it (a device plugin restarting, a GPU operator upgrade).
    pub(in crate::autoscaler) fn report_gpus_lost(
        &mut self,
        view: &FleetView,
        out: &mut Vec<Action>,
    ) {
        let now_lost: BTreeSet<String> = view.gpus_lost.iter().cloned().collect();
        for n in now_lost.difference(&self.reported.gpus_lost) {
            out.push(Action::Log {
                level: Level::Warn,
                message: format!("node {n} advertises no GPUs any more; it is kept"),
            });
            out.push(Action::Event(Note {
                subject: Subject::Node(n.clone()),
                warning: true,
                reason: "GPUsUnavailable",
                action: "Observe",
                message: format!(
                    "{n} advertised GPUs and advertises none now (device plugin restarting, or \
                     GPUs lost); the node is kept, not given up as a failed launch"
                ),
            }));
        }
        for n in self.reported.gpus_lost.difference(&now_lost) {
            out.push(Action::Log {
                level: Level::Info,
                message: format!("node {n} advertises its GPUs again"),
            });
        }
        out.push(Action::Count(Count::NodesGpusLost(now_lost.len())));
        self.reported.gpus_lost = now_lost;
    }
}
