//! What a drain may do, decided here for the executors: which pods it evicts, waits for or leaves,
//! with what grace period, and what happens at its deadline. A drain is of one of two kinds
//! ([`DrainKind`]): a node taken away by choice keeps the conservative rules of scale-down; a
//! node that goes whatever the drain does (broken, or being taken back by its cloud) has every
//! pod but DaemonSet and mirror pods evicted, each with as much of its grace period as the
//! deadline leaves.

use std::time::Duration;

use crate::model::{Node, Pod, Snapshot, Time};
use crate::plan::scale_down::{dies_with_node, not_movable};

/// Why a node is drained, as far as the drain is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainKind {
    /// Taken away by choice (scale-down, consolidation, an on-demand node kept free for spot): a
    /// pod that cannot be moved ([`not_movable`]) keeps the node, grace periods are the pods'
    /// own, and a drain not done by its deadline gives the node back.
    Voluntary,
    /// The node goes whatever the drain does (unhealthy, interrupted): every pod but DaemonSet
    /// and mirror pods is evicted, grace periods are cut to end before the deadline
    /// ([`grace_within`]), and at the deadline the node is removed with what is left on it,
    /// never given back.
    Forced,
}

/// What a drain does with one pod bound to its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodFate {
    /// Nothing: finished, a DaemonSet's or a mirror pod (it goes with the node).
    Leave,
    /// Being deleted already: its grace period is waited out.
    Wait,
    /// Evicted through the Eviction API.
    Evict,
    /// It cannot be moved, so a voluntary drain gives the node back; why.
    KeepsNode(String),
}

impl DrainKind {
    /// What the drain does with pod `p` (PodDisruptionBudgets from `budgets`).
    pub fn fate(self, p: &Pod, budgets: &Snapshot) -> PodFate {
        if !p.is_bound_active() || dies_with_node(p) {
            return PodFate::Leave;
        }
        if p.deleting {
            return PodFate::Wait;
        }
        match (self, not_movable(p, budgets)) {
            (DrainKind::Voluntary, Some(why)) => PodFate::KeepsNode(why),
            _ => PodFate::Evict,
        }
    }

    /// What the drain does with pod `name` (`namespace/name`) that cannot be read (`problem`):
    /// nothing tells that it may be moved, so a voluntary drain keeps the node; a forced one
    /// evicts it, since the node goes anyway.
    pub fn fate_unread(self, name: &str, problem: &str) -> PodFate {
        match self {
            DrainKind::Voluntary => {
                PodFate::KeepsNode(format!("pod {name} cannot be read ({problem})"))
            }
            DrainKind::Forced => PodFate::Evict,
        }
    }

    /// The grace period to evict a pod with at `now` (`asked`: its own): its own for a
    /// voluntary drain, cut to end before the deadline for a forced one.
    pub fn grace(self, asked_secs: u64, now: Time, deadline: Time) -> Option<GraceCut> {
        match self {
            DrainKind::Voluntary => None,
            DrainKind::Forced => grace_within(asked_secs, now, deadline),
        }
    }

    /// The kind of a drain found from its node's taints after a restart: a node tainted as
    /// being replaced for health or an interruption is forced, any other voluntary.
    pub fn of_node(n: &Node) -> DrainKind {
        n.taints
            .iter()
            .find(|t| t.key == crate::model::labels::REPLACING_TAINT)
            .map_or(DrainKind::Voluntary, |t| {
                super::replace::Cause::parse(&t.value).drain_kind()
            })
    }
}

/// What a forced drain keeps, before its deadline, for terminating the instance and deleting the
/// Node once the pods are gone.
pub const WINDOW_MARGIN: Duration = Duration::from_secs(15);

/// A pod's termination grace period cut to end before its node goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraceCut {
    /// Its own (`terminationGracePeriodSeconds`).
    pub asked: u64,
    /// What it is evicted with.
    pub given: u64,
}

/// The grace period a pod evicted at `now` gets when its node goes at `ends`: its own (`None`)
/// when that ends [`WINDOW_MARGIN`] before, otherwise what is left until then less the margin
/// (0 when nothing is).
pub fn grace_within(asked_secs: u64, now: Time, ends: Time) -> Option<GraceCut> {
    let left = ends.since(now).saturating_sub(WINDOW_MARGIN).as_secs();
    (now >= ends || asked_secs > left).then_some(GraceCut {
        asked: asked_secs,
        given: left.min(asked_secs),
    })
}

/// The Event message for a pod whose grace period was cut: `why` the node goes.
pub fn grace_cut_message(pod: &str, node: &str, cut: GraceCut, ends: Time, why: &str) -> String {
    format!(
        "{pod}: termination grace period cut from {}s to {}s: node {node} is removed at {} \
         ({why})",
        cut.asked,
        cut.given,
        ends.to_rfc3339()
    )
}

/// The Event message for a forced drain whose deadline came with pods left on the node (a
/// PodDisruptionBudget refused their eviction, or they were still terminating): the node is
/// removed with them. `left` names them (`namespace/name`, why); `why` the node goes.
pub fn window_closed_message(node: &str, ends: Time, why: &str, left: &[(String, &str)]) -> String {
    let names: Vec<String> = left
        .iter()
        .take(5)
        .map(|(p, why)| format!("{p} ({why})"))
        .collect();
    let more = left.len().saturating_sub(names.len());
    format!(
        "{node} is removed at {} whatever is on it ({why}): {} pod(s) could not be moved \
         before then and go with it: {}{}",
        ends.to_rfc3339(),
        left.len(),
        names.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    )
}
