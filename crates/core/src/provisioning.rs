//! ProvisioningRequests (`autoscaling.x-k8s.io/v1`, the API Kueue's provisioning admission check
//! and the Cluster Autoscaler speak): a request for capacity for pods that do not exist yet.
//!
//! Two classes are served, the others left alone (another autoscaler may serve them):
//!
//! - `best-effort-atomic-scale-up.autoscaling.x-k8s.io`: the request's pods are planned as one
//!   gang, all in one zone or nothing; while capacity is on its way the request is `Accepted`,
//!   once every pod has a place on a Ready node it is `Provisioned`. A request the plan cannot
//!   place whole now (the pools' limits taken by other nodes, offerings out of capacity) is
//!   `Provisioned` `False` (`CapacityIsNotFound`), nothing is launched for it, and it is tried
//!   again every pass while capacity may appear, as the Cluster Autoscaler does; it is `Failed`
//!   only when it could not be placed whole even in an empty cluster with every offering
//!   available (the API's "impossible to obtain resources": more nodes than the pools' limits
//!   allow, pods no instance type fits), or when not provisioned within its
//!   `ValidUntilSeconds`.
//! - `check-capacity.autoscaling.x-k8s.io`: answered from the capacity that exists or is on its way,
//!   without launching: `Provisioned` `True` (`CapacityIsFound`) or `False` (`CapacityIsNotFound`,
//!   asked again next pass).
//!
//! A provisioned request's capacity is booked for its pods for [`BOOKING`]: the pods that have not
//! arrived yet (pods name the request in [`CONSUME_ANNOTATION`]) are planned first, on existing
//! capacity only, so their nodes are neither given to other pods by the plan nor scaled down or
//! consolidated. When the booking runs out the request gets `BookingExpired`; when its pods no
//! longer fit the capacity that exists (its nodes were lost), `CapacityRevoked`.
//!
//! Pure: the executors make the pods of [`Assessment::inject`] part of the snapshot the decision
//! core plans, and write [`Assessment::updates`] to the requests' status.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::model::{Pod, Snapshot, Time};
use crate::plan::{plan_with, Plan, Templates};
use crate::policy::Policy;

pub const CLASS_ATOMIC: &str = "best-effort-atomic-scale-up.autoscaling.x-k8s.io";
pub const CLASS_CHECK_CAPACITY: &str = "check-capacity.autoscaling.x-k8s.io";
/// The annotation of a pod that consumes a request's capacity (its value: the request's name).
pub const CONSUME_ANNOTATION: &str = "autoscaling.x-k8s.io/consume-provisioning-request";
/// Ours, on the pods made from a request's pod sets (its value: the request's name).
pub const REQUEST_ANNOTATION: &str = "gpu-node-autoscaler.io/provisioning-request";
/// How long a provisioned request's capacity stays booked for its pods (the Cluster
/// Autoscaler's reservation time).
pub const BOOKING: Duration = Duration::from_secs(600);

pub const ACCEPTED: &str = "Accepted";
pub const PROVISIONED: &str = "Provisioned";
pub const FAILED: &str = "Failed";
pub const BOOKING_EXPIRED: &str = "BookingExpired";
pub const CAPACITY_REVOKED: &str = "CapacityRevoked";

/// The classes served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    AtomicScaleUp,
    CheckCapacity,
}

impl Class {
    pub fn parse(name: &str) -> Option<Class> {
        match name {
            CLASS_ATOMIC => Some(Class::AtomicScaleUp),
            CLASS_CHECK_CAPACITY => Some(Class::CheckCapacity),
            _ => None,
        }
    }
}

/// A status condition (`metav1.Condition`).
#[derive(Clone, Debug, PartialEq)]
pub struct Condition {
    pub kind: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub reason: String,
    pub message: String,
    /// `lastTransitionTime`.
    pub since: Time,
    pub observed_generation: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ProvisioningRequest {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub generation: i64,
    pub class_name: String,
    pub created: Time,
    /// `ValidUntilSeconds`: how long after its creation an unprovisioned request is tried.
    pub valid_until: Option<Duration>,
    /// One pending pod per requested pod, all of one gang (`gang_name`); or why they cannot be
    /// made (a PodTemplate missing or not understood).
    pub pods: Result<Vec<Pod>, String>,
    pub conditions: Vec<Condition>,
}

impl ProvisioningRequest {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn class(&self) -> Option<Class> {
        Class::parse(&self.class_name)
    }

    pub fn condition(&self, kind: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }

    pub fn is_true(&self, kind: &str) -> bool {
        self.condition(kind).is_some_and(|c| c.status == "True")
    }

    /// Nothing more will happen to it: failed, booking expired or capacity revoked.
    pub fn is_finished(&self) -> bool {
        self.is_true(FAILED) || self.is_true(BOOKING_EXPIRED) || self.is_true(CAPACITY_REVOKED)
    }
}

/// The name of the gang a request's pods form (within its namespace).
pub fn gang_name(request: &str) -> String {
    format!("provisioning-request.{request}")
}

/// The name of the `j`-th pod of a request's `i`-th pod set.
pub fn pod_name(request: &str, set: usize, j: usize) -> String {
    format!("provisioning-request.{request}.{set}.{j}")
}

/// A request's new conditions (the whole list, others' conditions kept).
#[derive(Clone, Debug, PartialEq)]
pub struct Update {
    pub namespace: String,
    pub name: String,
    pub conditions: Vec<Condition>,
}

impl Update {
    pub fn condition(&self, kind: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }
}

/// What a pass does about the requests.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Assessment {
    /// Pods to plan with the cluster's own: the gangs of atomic requests not provisioned yet,
    /// and the booked pods of provisioned ones (first, on existing capacity).
    pub inject: Vec<Pod>,
    /// Requests whose conditions change.
    pub updates: Vec<Update>,
}

impl Assessment {
    /// `snapshot` with the pods to inject.
    pub fn snapshot(&self, snapshot: &Snapshot) -> Snapshot {
        let mut s = snapshot.clone();
        s.pods.extend(self.inject.iter().cloned());
        s
    }

    /// The keys (`namespace/name`) of the pods made from requests: the executors skip actions
    /// on them (no such pod exists).
    pub fn pod_keys(&self) -> BTreeSet<String> {
        self.inject.iter().map(|p| p.id.to_string()).collect()
    }
}

/// The priority booked pods are planned at: before every real pod.
const BOOKED_PRIORITY: i32 = i32::MAX;

#[derive(Debug)]
enum Outcome<'a> {
    /// Every pod placed on a Ready node.
    OnReadyNodes,
    /// Every pod placed on existing capacity, some on nodes starting or launches in flight.
    OnExistingCapacity,
    /// Some pod needs a new node (and none is unschedulable).
    Launching,
    /// Some pod has no place; the planner's reason.
    Unschedulable(&'a str, &'a str),
}

fn outcome<'a>(plan: &'a Plan, snapshot: &Snapshot, pods: &[Pod]) -> Outcome<'a> {
    let keys: BTreeSet<String> = pods.iter().map(|p| p.id.to_string()).collect();
    if let Some(u) = plan.unschedulable.iter().find(|u| keys.contains(&u.pod)) {
        return Outcome::Unschedulable(&u.pod, &u.reason);
    }
    let placed: BTreeMap<&str, &str> = plan
        .existing_capacity
        .iter()
        .filter(|p| keys.contains(&p.pod))
        .map(|p| (p.pod.as_str(), p.target.as_str()))
        .collect();
    if placed.len() < keys.len() {
        return Outcome::Launching;
    }
    // Ready, and advertising GPUs when the pods placed there ask for some: a node whose device
    // plugin has not started yet cannot take them, so Kueue would create them to wait Pending.
    let wants_gpus: BTreeSet<&str> = plan
        .existing_capacity
        .iter()
        .filter(|p| keys.contains(&p.pod))
        .filter(|p| {
            pods.iter()
                .any(|q| q.id.to_string() == p.pod && q.gpu_equivalents() > 0.0)
        })
        .map(|p| p.target.as_str())
        .collect();
    let ready = placed.values().all(|target| {
        snapshot.nodes.iter().any(|n| {
            n.name == *target
                && n.is_schedulable()
                && (n.advertised_gpus() > 0 || !wants_gpus.contains(target))
        })
    });
    if ready {
        Outcome::OnReadyNodes
    } else {
        Outcome::OnExistingCapacity
    }
}

/// The pods of a provisioned request that have not arrived yet, to be planned first and alone
/// (the booking): one fewer for each pod that consumes the request.
fn booked_pods(
    r: &ProvisioningRequest,
    pods: &[Pod],
    consumed: &BTreeMap<(&str, &str), usize>,
) -> Vec<Pod> {
    let arrived = consumed
        .get(&(r.namespace.as_str(), r.name.as_str()))
        .copied()
        .unwrap_or(0);
    pods.iter()
        .skip(arrived)
        .map(|p| {
            let mut p = p.clone();
            p.gang = None;
            p.priority = BOOKED_PRIORITY;
            p
        })
        .collect()
}

/// Why a request's pods could not be placed whole even alone in an empty cluster (no node, no
/// other pod, every offering available): the first pod without a place and the planner's
/// reason, or `None` when they could be (what stops them now is temporary).
fn never_placed(
    templates: &Templates,
    policy: &Policy,
    pods: &[Pod],
    now: Time,
) -> Option<(String, String)> {
    let alone = Snapshot {
        pods: pods.to_vec(),
        ..Default::default()
    };
    let plan = plan_with(&alone, templates, policy, now);
    let keys: BTreeSet<String> = pods.iter().map(|p| p.id.to_string()).collect();
    plan.unschedulable
        .iter()
        .find(|u| keys.contains(&u.pod))
        .map(|u| (u.pod.clone(), u.reason.clone()))
}

/// Sets a condition in `conditions` (its transition time kept when its status does not change).
pub(crate) fn set(
    conditions: &mut Vec<Condition>,
    kind: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: i64,
    now: Time,
) {
    let status = if status { "True" } else { "False" };
    let new = |since| Condition {
        kind: kind.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        since,
        observed_generation: generation,
    };
    match conditions.iter_mut().find(|c| c.kind == kind) {
        Some(c) => {
            let since = if c.status == status { c.since } else { now };
            *c = new(since);
        }
        None => conditions.push(new(now)),
    }
}

/// Decides, for every request of a served class, its conditions and the pods to plan for it.
/// `snapshot` is the cluster as the decision core will see it (without any request's pods).
pub fn assess(
    snapshot: &Snapshot,
    templates: &Templates,
    policy: &Policy,
    requests: &[ProvisioningRequest],
    now: Time,
) -> Assessment {
    let mut out = Assessment::default();
    let mut conds: BTreeMap<usize, Vec<Condition>> = BTreeMap::new();
    // Pods already there for each request (by namespace and request name).
    let mut consumed: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for p in &snapshot.pods {
        if p.phase.is_terminal() || p.deleting {
            continue;
        }
        if let Some(name) = p.annotations.get(CONSUME_ANNOTATION) {
            *consumed
                .entry((p.id.namespace.as_str(), name.as_str()))
                .or_default() += 1;
        }
    }

    // Requests that want a plan: atomic ones not yet provisioned (their gang), and booked ones
    // (the pods that have not arrived, one by one, first).
    let mut atomic: Vec<(usize, &[Pod])> = Vec::new();
    let mut booked: Vec<(usize, Vec<Pod>)> = Vec::new();
    let mut check: Vec<(usize, &[Pod])> = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        let Some(class) = r.class() else { continue };
        if r.is_finished() {
            continue;
        }
        let mut c = r.conditions.clone();
        let g = r.generation;
        let pods = match &r.pods {
            Ok(p) => p.as_slice(),
            Err(problem) => {
                set(&mut c, FAILED, true, "InvalidRequest", problem, g, now);
                conds.insert(i, c);
                continue;
            }
        };
        if !r.is_true(ACCEPTED) {
            set(
                &mut c,
                ACCEPTED,
                true,
                "Accepted",
                "ProvisioningRequest is accepted by gpu-node-autoscaler",
                g,
                now,
            );
        }
        if let Some(p) = r.condition(PROVISIONED).filter(|p| p.status == "True") {
            if now >= p.since + BOOKING {
                set(
                    &mut c,
                    BOOKING_EXPIRED,
                    true,
                    "CapacityReservationTimeExpired",
                    &format!(
                        "the capacity booked for the request's pods since {} ({}s) is no longer booked",
                        p.since,
                        BOOKING.as_secs()
                    ),
                    g,
                    now,
                );
            } else {
                let waiting = booked_pods(r, pods, &consumed);
                if !waiting.is_empty() {
                    booked.push((i, waiting));
                }
            }
        } else if r.valid_until.is_some_and(|v| now >= r.created + v) {
            set(
                &mut c,
                FAILED,
                true,
                "Expired",
                &format!(
                    "not provisioned within ValidUntilSeconds ({}s) of its creation",
                    r.valid_until.unwrap_or_default().as_secs()
                ),
                g,
                now,
            );
        } else {
            match class {
                Class::AtomicScaleUp => atomic.push((i, pods)),
                Class::CheckCapacity => check.push((i, pods)),
            }
        }
        conds.insert(i, c);
    }

    // The plan the decision core will make with the requests' pods (it launches for the atomic
    // requests that it can place whole).
    let mut with = snapshot.clone();
    for (_, pods) in &booked {
        with.pods.extend(pods.iter().cloned());
    }
    for (_, pods) in &atomic {
        with.pods.extend(pods.iter().cloned());
    }
    let plan = if booked.is_empty() && atomic.is_empty() {
        Plan::default()
    } else {
        plan_with(&with, templates, policy, now)
    };
    for (i, pods) in booked {
        let r = &requests[i];
        let c = conds.get_mut(&i).expect("assessed");
        match outcome(&plan, snapshot, &pods) {
            Outcome::OnReadyNodes => out.inject.extend(pods),
            Outcome::Unschedulable(pod, why) => {
                let msg = format!(
                    "the capacity provisioned for the request is gone: {pod} has no place any more ({why})"
                );
                set(
                    c,
                    CAPACITY_REVOKED,
                    true,
                    "CapacityRevoked",
                    &msg,
                    r.generation,
                    now,
                );
            }
            _ => {
                let msg = "the capacity provisioned for the request is gone: its pods no longer \
                           fit the Ready nodes";
                set(
                    c,
                    CAPACITY_REVOKED,
                    true,
                    "CapacityRevoked",
                    msg,
                    r.generation,
                    now,
                );
            }
        }
    }
    for (i, pods) in atomic {
        let r = &requests[i];
        let c = conds.get_mut(&i).expect("assessed");
        let g = r.generation;
        match outcome(&plan, snapshot, pods) {
            Outcome::OnReadyNodes => {
                let msg = format!(
                    "all {} pods of the request have a place on Ready nodes, booked for {}s",
                    pods.len(),
                    BOOKING.as_secs()
                );
                set(c, PROVISIONED, true, "CapacityIsProvisioned", &msg, g, now);
                // Booked from now on: the pods the plan placed on these nodes stay there.
                out.inject.extend(booked_pods(r, pods, &consumed));
            }
            Outcome::Unschedulable(pod, why) => match never_placed(templates, policy, pods, now) {
                Some((pod, why)) => {
                    let msg = format!(
                        "the request's {} pods cannot be given nodes all at once, even in an \
                         empty cluster: {pod}: {why}",
                        pods.len()
                    );
                    set(c, FAILED, true, "CapacityIsNotFound", &msg, g, now);
                }
                None => {
                    let msg = format!(
                        "the request's {} pods cannot be given nodes all at once now: {pod}: \
                         {why}; tried again while capacity may appear",
                        pods.len()
                    );
                    set(c, PROVISIONED, false, "CapacityIsNotFound", &msg, g, now);
                }
            },
            Outcome::OnExistingCapacity | Outcome::Launching => {
                out.inject.extend(pods.iter().cloned());
                let msg = format!(
                    "capacity for the request's {} pods is being provisioned, all at once",
                    pods.len()
                );
                set(
                    c,
                    PROVISIONED,
                    false,
                    "CapacityIsProvisioning",
                    &msg,
                    g,
                    now,
                );
            }
        }
    }

    // check-capacity: the cluster as it will be (booked pods first), each request alone, never
    // launched for.
    if !check.is_empty() {
        let base = out.snapshot(snapshot);
        for (i, pods) in check {
            let r = &requests[i];
            let c = conds.get_mut(&i).expect("assessed");
            let mut s = base.clone();
            s.pods.extend(pods.iter().cloned());
            let plan = plan_with(&s, templates, policy, now);
            match outcome(&plan, snapshot, pods) {
                Outcome::OnReadyNodes | Outcome::OnExistingCapacity => {
                    let msg = format!(
                        "all {} pods of the request fit the capacity in the cluster and on its way",
                        pods.len()
                    );
                    set(
                        c,
                        PROVISIONED,
                        true,
                        "CapacityIsFound",
                        &msg,
                        r.generation,
                        now,
                    );
                }
                Outcome::Launching => {
                    let msg = format!(
                        "the request's {} pods do not all fit the capacity in the cluster and on \
                         its way (new nodes would be needed)",
                        pods.len()
                    );
                    set(
                        c,
                        PROVISIONED,
                        false,
                        "CapacityIsNotFound",
                        &msg,
                        r.generation,
                        now,
                    );
                }
                Outcome::Unschedulable(pod, why) => {
                    let msg = format!(
                        "the request's {} pods do not all fit the capacity in the cluster and on \
                         its way: {pod}: {why}",
                        pods.len()
                    );
                    set(
                        c,
                        PROVISIONED,
                        false,
                        "CapacityIsNotFound",
                        &msg,
                        r.generation,
                        now,
                    );
                }
            }
        }
    }

    for (i, c) in conds {
        let r = &requests[i];
        if c != r.conditions {
            out.updates.push(Update {
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                conditions: c,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests;
