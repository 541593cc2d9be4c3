//! Node lifecycle: nodes of ours that are drifted (launched differently from what their pool
//! launches today, [`crate::plan::lifecycle::drifted`]) or expired (older than the pool's
//! `disruption.expireAfter`) are replaced: tainted so that nothing new lands on them, their pods
//! planned again as pending (their new capacity launched like any scale-up), and drained only
//! once every pod has a place on a node that is Ready with its GPUs advertised
//! ([`super::replacement`] drains them). The pool's disruption budgets limit how many at once
//! ([`crate::plan::disrupt::budget_left`]); a node or a pod that may not be disrupted holds the
//! node until the pool's `terminationGracePeriod` (then it is replaced all the same, its drain
//! forced).

use std::collections::BTreeMap;

use crate::autoscaler::{
    has_drain_taint, replace, Action, Autoscaler, Count, Level, Note, Pass, Subject,
};
use crate::model::Time;
use crate::plan;
use crate::policy::Reason;

use super::Method;

pub(super) struct Lifecycle;

impl Method for Lifecycle {
    fn before_plan(&self, a: &mut Autoscaler, pass: &mut Pass, out: &mut Vec<Action>) {
        a.replace_drifted_and_expired(pass, out);
    }
}

/// A node of ours found drifted or expired, not being replaced yet (or being replaced).
#[derive(Clone, Debug, PartialEq)]
pub struct Due {
    pub pool: String,
    pub reason: Reason,
    pub why: String,
    /// When it was first found so (here: a new leader starts the clock again).
    pub since: Time,
    /// What keeps it (do-not-disrupt, the budget), if something does.
    pub held: Option<String>,
    /// Being replaced.
    pub replacing: bool,
    /// Dry-run: it would be replaced now (nothing holds it).
    pub would_replace: bool,
}

impl Due {
    /// As the status and the logs show it.
    pub fn describe(&self) -> String {
        let what = match self.reason {
            Reason::Expired => "expired",
            _ => "drifted",
        };
        let state = match (&self.held, self.replacing) {
            (_, true) => "; being replaced".to_string(),
            (Some(h), false) => format!("; kept: {h}"),
            (None, false) if self.would_replace => "; would be replaced (dry run)".to_string(),
            (None, false) => String::new(),
        };
        format!("{what}: {}{state}", self.why)
    }
}

/// The lifecycle state of the core.
#[derive(Default)]
pub struct LifecycleState {
    /// Nodes of ours drifted or expired now.
    pub due: BTreeMap<String, Due>,
    /// When the next node of ours expires.
    pub next_expiry: Option<Time>,
}

impl LifecycleState {
    /// When a hold runs out (`grace_of`: a pool's `terminationGracePeriod`) or a node expires.
    pub fn timers<'a>(
        &'a self,
        grace_of: impl Fn(&str) -> Option<std::time::Duration> + 'a,
    ) -> impl Iterator<Item = Time> + 'a {
        self.due
            .values()
            .filter(|d| d.held.is_some() && !d.replacing)
            .filter_map(move |d| grace_of(&d.pool).map(|g| d.since + g))
            .chain(self.next_expiry)
    }
}

impl Autoscaler {
    /// Finds the drifted and expired nodes of ours and starts replacing those that nothing
    /// holds, within the pools' disruption budgets. In dry-run they are reported the same way
    /// (status, `Drifted`/`Expired` Events, the gauge) and those that would be replaced get a
    /// `DryRunReplaceNode` Event instead; nothing is tainted or replaced.
    pub(in crate::autoscaler) fn replace_drifted_and_expired(
        &mut self,
        pass: &mut Pass,
        out: &mut Vec<Action>,
    ) {
        let now = pass.now;
        let policy = pass.policy.clone();
        let mut sizes = self.disruption_counts(&pass.snapshot.nodes);
        let version_of = |p: &crate::policy::Pool| {
            pass.snapshot
                .launch_versions
                .get(&p.name)
                .map(String::as_str)
        };
        for p in &policy.pools {
            self.fingerprints.get(&policy, p, version_of(p));
        }
        let today: BTreeMap<&str, &str> = policy
            .pools
            .iter()
            .filter_map(|p| {
                let fp = self.fingerprints.known(&p.name, version_of(p))?;
                Some((p.name.as_str(), fp))
            })
            .collect();
        let mut due_now: BTreeMap<String, Due> = BTreeMap::new();
        let mut next_expiry: Option<Time> = None;
        let mut drifted = 0;
        for n in &pass.snapshot.nodes {
            let Some(pool) = n.pool().and_then(|p| policy.pool(p)) else {
                continue;
            };
            if !pass.view.is_ours(n) || n.deleting {
                continue;
            }
            let expired = plan::lifecycle::expired(n, pool, now);
            if expired.is_none() {
                if let Some(t) = plan::lifecycle::expires_at(n, pool) {
                    next_expiry = Some(next_expiry.map_or(t, |x: Time| x.min(t)));
                }
            }
            let fp = today.get(pool.name.as_str()).copied().unwrap_or_default();
            let drift = plan::lifecycle::drifted(n, pool, fp, &self.catalog);
            if drift.is_some() {
                drifted += 1;
            }
            let (reason, why) = match (expired, drift) {
                (Some(e), _) => (Reason::Expired, e),
                (None, Some(d)) => (Reason::Drifted, d),
                (None, None) => continue,
            };
            let prev = self.disruption.lifecycle.due.get(&n.name);
            let since = prev.map_or(now, |d| d.since);
            if prev.is_none_or(|d| d.why != why) {
                let (event, what) = match reason {
                    Reason::Expired => ("Expired", "expired"),
                    _ => ("Drifted", "drifted"),
                };
                out.push(Action::Event(Note {
                    subject: Subject::Node(n.name.clone()),
                    warning: false,
                    reason: event,
                    action: "Replace",
                    message: format!("{} (pool {}) is {what}: {why}", n.name, pool.name),
                }));
                out.push(Action::Log {
                    level: Level::Info,
                    message: format!("node {} (pool {}) is {what}: {why}", n.name, pool.name),
                });
            }
            let mut due = Due {
                pool: pool.name.clone(),
                reason,
                why: why.clone(),
                since,
                held: None,
                replacing: false,
                would_replace: false,
            };
            let dry_run = self.config.dry_run;
            let busy = self.disruption.replace.replacing.contains_key(&n.name)
                || self.disruption.drains.contains_key(&n.name)
                || has_drain_taint(n);
            if busy {
                due.replacing = true;
                due_now.insert(n.name.clone(), due);
                continue;
            }
            // What may not be disrupted holds it, until the pool's terminationGracePeriod.
            let mut forced = false;
            if let Some(h) = plan::disrupt::held_by(n, &pass.snapshot) {
                match pool.disruption.termination_grace_period {
                    Some(g) if now >= since + g && dry_run => {}
                    Some(g) if now >= since + g => {
                        forced = true;
                        out.push(Action::Event(Note {
                            subject: Subject::Node(n.name.clone()),
                            warning: true,
                            reason: "DisruptionGracePeriodOver",
                            action: "Replace",
                            message: format!(
                                "{} has been kept for {} ({h}), the pool's \
                                 terminationGracePeriod: it is replaced and drained all the same",
                                n.name,
                                crate::policy::duration::format_duration(g)
                            ),
                        }));
                    }
                    _ => {
                        if prev.and_then(|d| d.held.as_ref()) != Some(&h) {
                            out.push(Action::Event(Note {
                                subject: Subject::Node(n.name.clone()),
                                warning: false,
                                reason: "DisruptionBlocked",
                                action: "Replace",
                                message: format!(
                                    "{} is not replaced yet: {h}{}",
                                    n.name,
                                    match pool.disruption.termination_grace_period {
                                        Some(g) => format!(
                                            " (at most until {}, the pool's \
                                             terminationGracePeriod)",
                                            (since + g).to_rfc3339()
                                        ),
                                        None => String::new(),
                                    }
                                ),
                            }));
                        }
                        due.held = Some(h);
                        due_now.insert(n.name.clone(), due);
                        continue;
                    }
                }
            }
            let (size, disrupting) = sizes.get(pool.name.as_str()).copied().unwrap_or((0, 0));
            if plan::disrupt::budget_left(pool, reason, size, disrupting, now) == Some(0) {
                due.held = Some(format!(
                    "the pool's disruption budget for {} allows no more nodes now",
                    reason.as_str()
                ));
                if prev.and_then(|d| d.held.as_ref()) != due.held.as_ref() {
                    out.push(Action::Log {
                        level: Level::Info,
                        message: format!(
                            "node {} (pool {}) waits: {}",
                            n.name,
                            pool.name,
                            due.held.as_deref().unwrap_or_default()
                        ),
                    });
                }
                due_now.insert(n.name.clone(), due);
                continue;
            }
            if let Some(e) = sizes.get_mut(pool.name.as_str()) {
                e.1 += 1;
            }
            if dry_run {
                if prev.is_none_or(|d| !d.would_replace || d.why != why) {
                    out.push(Action::Event(Note {
                        subject: Subject::Node(n.name.clone()),
                        warning: false,
                        reason: "DryRunReplaceNode",
                        action: "Replace",
                        message: format!(
                            "would replace {} (pool {}): {why}; dry run, nothing is replaced",
                            n.name, pool.name
                        ),
                    }));
                }
                due.would_replace = true;
                due_now.insert(n.name.clone(), due);
                continue;
            }
            let cause = match reason {
                Reason::Expired => replace::Cause::Expired,
                _ => replace::Cause::Drifted,
            };
            self.disruption.replace.replacing.insert(
                n.name.clone(),
                replace::Replacing {
                    cause,
                    why: format!("{}: {why}", cause.as_str()),
                    retry_after: None,
                    started: now,
                    offerings: Vec::new(),
                    reclaimed_at: None,
                    forced,
                },
            );
            out.push(Action::Taint {
                node: n.name.clone(),
                taint: replace::replacing_taint(cause),
                present: true,
            });
            out.push(Action::Event(Note {
                subject: Subject::Node(n.name.clone()),
                warning: false,
                reason: match cause {
                    replace::Cause::Expired => "ReplacingExpiredNode",
                    _ => "ReplacingDriftedNode",
                },
                action: "Replace",
                message: format!(
                    "replacing {} (pool {}): {why}; its pods get a place on a new node first, \
                     then it is drained",
                    n.name, pool.name
                ),
            }));
            out.push(Action::Log {
                level: Level::Info,
                message: format!(
                    "replacing {} node {} (pool {}): {why}",
                    cause.as_str(),
                    n.name,
                    pool.name
                ),
            });
            due.replacing = true;
            due_now.insert(n.name.clone(), due);
        }
        self.disruption.lifecycle.due = due_now;
        self.disruption.lifecycle.next_expiry = next_expiry;
        out.push(Action::Count(Count::NodesDrifted(drifted)));
    }
}
