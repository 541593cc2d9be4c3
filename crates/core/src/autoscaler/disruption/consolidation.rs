//! GPU-aware consolidation: per pool that has it, once per `consolidation.interval`, the running
//! pods are planned again ([`crate::plan::consolidate`]) and the nodes whose pods fit cheaper
//! capacity are replaced (their drain goes through [`super::replacement`]).

use crate::hash::HashMap;
use std::collections::BTreeSet;
use std::sync::Arc;

use gpu_node_autoscaler_provider::OfferingKey;

use crate::autoscaler::{
    replace, Action, Autoscaler, Level, Note, Pass, Subject, CONSOLIDATION_RELOOK,
};
use crate::model::labels;
use crate::plan;
use crate::plan::Templates;
use crate::policy::Policy;

use super::Method;

pub(super) struct Consolidation;

impl Method for Consolidation {
    fn before_plan(&self, a: &mut Autoscaler, pass: &mut Pass, out: &mut Vec<Action>) {
        if let Some(t) = pass.templates.clone() {
            let policy = pass.policy.clone();
            a.consolidate(pass, &policy, &t, out);
        }
    }

    fn before_replan(&self, a: &mut Autoscaler, pass: &mut Pass, out: &mut Vec<Action>) {
        a.call_off_short_consolidations(pass, out);
    }
}

impl Autoscaler {
    /// GPU-aware consolidation: per pool that has it, once per `consolidation.interval`, plans
    /// the running pods again (`plan::consolidate`) and starts replacing the nodes whose pods
    /// fit cheaper capacity. One consolidation at a time per pool; only nodes of ours.
    pub(in crate::autoscaler) fn consolidate(
        &mut self,
        pass: &mut Pass,
        policy: &Policy,
        templates: &Templates,
        out: &mut Vec<Action>,
    ) {
        let now = pass.now;
        self.call_off_short_consolidations(pass, out);
        let enabled: Vec<&crate::policy::Pool> = policy
            .pools
            .iter()
            .filter(|p| p.consolidation.enabled)
            .collect();
        self.disruption
            .consolidation_due
            .retain(|p, _| enabled.iter().any(|e| &e.name == p));
        self.disruption
            .consolidation_seen
            .retain(|p, _| enabled.iter().any(|e| &e.name == p));
        if enabled.is_empty() {
            return;
        }
        let pool_of_node: HashMap<&str, &str> = pass
            .snapshot
            .nodes
            .iter()
            .filter_map(|n| n.pool().map(|p| (n.name.as_str(), p)))
            .collect();
        let busy: BTreeSet<String> = self
            .disruption
            .replace
            .replacing
            .iter()
            .filter(|(_, r)| r.cause == replace::Cause::Consolidating)
            .filter_map(|(n, _)| pool_of_node.get(n.as_str()).map(|p| p.to_string()))
            .collect();
        let due: Vec<&crate::policy::Pool> = enabled
            .into_iter()
            .filter(|p| !busy.contains(&p.name))
            .filter(|p| {
                self.disruption
                    .consolidation_due
                    .get(&p.name)
                    .is_none_or(|t| *t <= now)
            })
            .collect();
        if due.is_empty() {
            return;
        }
        self.disruption.consolidation_short.retain(|_, t| *t > now);
        let drains_running = self.disruption.drains.len() + self.disruption.replace.replacing.len();
        // The snapshot as the plan will see it (launches in flight, offerings short, only nodes
        // of ours candidates) and its templates: made once, when a pool is planned.
        let mut prepared: Option<(crate::model::Snapshot, Arc<Vec<plan::Template>>)> = None;
        for pool in due {
            self.disruption
                .consolidation_due
                .insert(pool.name.clone(), now + pool.consolidation.interval);
            // Nothing changed since a look that found nothing: look again only after a while
            // (the pods' age, which makes a move pay more, is all that changes).
            let fp = plan::consolidate::fingerprint(&pass.snapshot, &pool.name);
            if let Some((seen, at)) = self.disruption.consolidation_seen.get(&pool.name) {
                if *seen == fp && now < *at + CONSOLIDATION_RELOOK {
                    continue;
                }
            }
            // A pod waiting for a node stops every pool's: no need for the copy.
            let found = match plan::consolidate::pod_waiting(&pass.snapshot) {
                Some(why) => Err(why),
                None => {
                    let (snapshot, for_snapshot) = &*prepared.get_or_insert_with(|| {
                        let mut snapshot = pass.snapshot.clone();
                        snapshot.in_flight = pass.view.in_flight.clone();
                        snapshot.unavailable = self.launches.ice.clone();
                        for (o, t) in &self.disruption.consolidation_short {
                            let until = snapshot.unavailable.entry(o.clone()).or_insert(*t);
                            *until = (*until).max(*t);
                        }
                        // Only nodes of ours are replaced: others are left out of the candidates.
                        let view = &pass.view;
                        for n in &mut snapshot.nodes {
                            let ours = view.is_ours(n);
                            if !ours {
                                Arc::make_mut(&mut n.annotations)
                                    .insert(labels::SCALE_DOWN_DISABLED.into(), "true".into());
                            }
                        }
                        let for_snapshot = templates.for_snapshot(&snapshot, now);
                        // The buffers' chunks that have their room keep it there.
                        plan::consolidate::place_buffer_pods(&mut snapshot, &for_snapshot);
                        (snapshot, for_snapshot)
                    });
                    plan::consolidate::consolidate(
                        snapshot,
                        for_snapshot,
                        policy,
                        pool,
                        now,
                        drains_running,
                    )
                }
            };
            let c = match found {
                Ok(c) => c,
                Err(why) => {
                    self.disruption
                        .consolidation_seen
                        .insert(pool.name.clone(), (fp, now));
                    let key = format!("consolidation/{}", pool.name);
                    if self.disruption.replace.report_once(&key, &why) {
                        out.push(Action::Log {
                            level: Level::Info,
                            message: format!("pool {}: nothing to consolidate: {why}", pool.name),
                        });
                    }
                    continue;
                }
            };
            if !pool.disruption.budgets.is_empty() {
                let sizes = self.disruption_counts(&pass.snapshot.nodes);
                let (size, busy) = sizes.get(&pool.name).copied().unwrap_or((0, 0));
                let left = plan::disrupt::budget_left(
                    pool,
                    crate::policy::Reason::Underutilized,
                    size,
                    busy,
                    now,
                );
                if left.is_some_and(|l| l < c.nodes.len()) {
                    let key = format!("consolidation/{}", pool.name);
                    let why = format!(
                        "{}, but the pool's disruption budget for Underutilized allows {} more \
                         node(s) now",
                        c.describe(),
                        left.unwrap_or_default()
                    );
                    if self.disruption.replace.report_once(&key, &why) {
                        out.push(Action::Log {
                            level: Level::Info,
                            message: format!("pool {}: not consolidating: {why}", pool.name),
                        });
                    }
                    continue;
                }
            }
            self.disruption.consolidation_seen.remove(&pool.name);
            let why = c.describe();
            for node in &c.nodes {
                self.disruption.replace.replacing.insert(
                    node.clone(),
                    replace::Replacing {
                        cause: replace::Cause::Consolidating,
                        why: why.clone(),
                        retry_after: None,
                        started: now,
                        offerings: c.offerings.clone(),
                        reclaimed_at: None,
                        forced: false,
                    },
                );
                out.push(Action::Taint {
                    node: node.clone(),
                    taint: replace::replacing_taint(replace::Cause::Consolidating),
                    present: true,
                });
                out.push(Action::Event(Note {
                    subject: Subject::Node(node.clone()),
                    warning: false,
                    reason: "Consolidating",
                    action: "Consolidate",
                    message: format!(
                        "replacing {node} (pool {}): {why}; its pods get a place elsewhere, \
                         then it is drained",
                        pool.name
                    ),
                }));
            }
            out.push(Action::Log {
                level: Level::Info,
                message: format!("pool {}: consolidating: {why}", pool.name),
            });
        }
    }

    /// A consolidation not draining yet whose planned offering ran short is called off: its pods
    /// would be launched for elsewhere, at a price the move was not weighed at. Also within a
    /// pass, before planning again after a launch ran short: its pods are back on their nodes.
    pub(in crate::autoscaler) fn call_off_short_consolidations(
        &mut self,
        pass: &mut Pass,
        out: &mut Vec<Action>,
    ) {
        let now = pass.now;
        let short: Vec<(String, OfferingKey)> = self
            .disruption
            .replace
            .replacing
            .iter()
            .filter(|(n, r)| {
                r.cause == replace::Cause::Consolidating && !self.disruption.drains.contains_key(*n)
            })
            .filter_map(|(n, r)| {
                r.offerings
                    .iter()
                    .find(|o| self.launches.ice.get(*o).is_some_and(|t| *t > now))
                    .map(|o| (n.clone(), o.clone()))
            })
            .collect();
        for (node, o) in short {
            self.disruption
                .consolidation_short
                .insert(o.clone(), now + CONSOLIDATION_RELOOK);
            self.call_off_consolidation(
                &node,
                format!(
                    "consolidation called off: {} {} {} ran short of capacity",
                    o.instance_type, o.zone, o.capacity_type
                ),
                out,
            );
            if let Some(pods) = pass.moving.remove(&node) {
                replace::unplan_moving(&mut pass.snapshot, &node, &pods, &pass.moved_from);
            }
        }
    }

    /// Gives up consolidating `node`: it keeps its pods and loses its taint.
    pub(in crate::autoscaler) fn call_off_consolidation(
        &mut self,
        node: &str,
        why: String,
        out: &mut Vec<Action>,
    ) {
        self.disruption.replace.replacing.remove(node);
        out.push(Action::Taint {
            node: node.to_string(),
            taint: replace::replacing_taint(replace::Cause::Consolidating),
            present: false,
        });
        out.push(Action::Event(Note {
            subject: Subject::Node(node.to_string()),
            warning: true,
            reason: "ConsolidationCalledOff",
            action: "Consolidate",
            message: format!("{node} stays: {why}"),
        }));
    }
}
