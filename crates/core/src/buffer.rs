//! CapacityBuffers (`autoscaling.x-k8s.io/v1beta1`, the Cluster Autoscaler's API for spare
//! capacity, beta in 1.35): warm GPU capacity kept ready before a burst.
//!
//! A buffer names the shape of one chunk (a PodTemplate, or the pod template of a scalable object
//! such as a Deployment) and how many chunks to keep: `replicas`, a `percentage` of the scalable
//! object's replicas (rounded up; the larger of the two when both are set), capped by `limits`
//! (total requests of all chunks; alone, as many chunks as fit). Only buffers of the default
//! strategy [`STRATEGY_ACTIVE`] whose chunk asks for GPUs are served; the others are left alone
//! (another autoscaler may serve them).
//!
//! Each chunk becomes a virtual pending pod (marked with [`BUFFER_ANNOTATION`]) planned after
//! every real pod ([`BUFFER_PRIORITY`]): it goes first-fit onto free room of existing and
//! incoming nodes, else a node is launched for it, so the nodes exist before the burst. The
//! virtual pods never exist in the cluster, so the scheduler gives their room to the first real
//! pod that fits; the next pass finds the buffer short of room and plans it again (replenished).
//! A node whose room the plan gives to a virtual pod is needed, so scale-down does not remove it;
//! consolidation holds a chunk that has room on a node there
//! ([`crate::plan::consolidate::place_buffer_pods`]) and waits only while one has no room.
//!
//! The buffer's status is written back as the Cluster Autoscaler does: `replicas`,
//! `podTemplateRef`, `provisioningStrategy`, and the conditions [`READY_FOR_PROVISIONING`] and
//! [`PROVISIONING`]. For a `scalableRef` buffer, as the Cluster Autoscaler's buffer controller
//! does, the chunk's shape is written to a PodTemplate of the buffer's own
//! ([`own_template_name`], owned by the buffer so that it goes with it, rewritten when the
//! scalable object's pod template changes: [`Assessment::templates`]) and `podTemplateRef`
//! names it.
//!
//! Pure: the executors plan the pass with [`Assessment::snapshot`], skip actions on the pods of
//! [`Assessment::pod_keys`], write [`Assessment::updates`] and publish [`Assessment::report`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::model::{Pod, PodRef, Resources, Snapshot, Time};
use crate::plan::scale_down::price_of;
use crate::plan::templates::template_of_node;
use crate::plan::{is_planned_pod, plan_with, Plan, Templates};
use crate::policy::Policy;
use crate::provisioning::{set, Condition};

/// The default strategy: the buffer is kept as active (running) spare capacity.
pub const STRATEGY_ACTIVE: &str = "buffer.x-k8s.io/active-capacity";
/// Ours, on the virtual pods of a buffer (its value: the buffer's name).
pub const BUFFER_ANNOTATION: &str = "gpu-node-autoscaler.io/capacity-buffer";
/// Virtual pods are planned after every real pod.
pub const BUFFER_PRIORITY: i32 = i32::MIN;

pub const READY_FOR_PROVISIONING: &str = "ReadyForProvisioning";
pub const PROVISIONING: &str = "Provisioning";
/// Some chunks have no room because the pools' limits (`maxNodes`, `maxGpus`, the cluster's
/// `limits`) are reached: the buffer is smaller than asked (the API's condition for a buffer
/// capped by quotas; ours are the policy's limits).
pub const LIMITED_BY_QUOTAS: &str = "LimitedByQuotas";
pub const REASON_POOL_LIMITS: &str = "PoolLimitsReached";
pub const REASON_WITHIN_LIMITS: &str = "WithinPoolLimits";

/// The reasons the Cluster Autoscaler gives (its buffer controller and pod list processor).
pub const REASON_ATTRIBUTES_SET: &str = "AttributesSetSuccessfully";
pub const REASON_ERROR: &str = "error";
pub const REASON_INJECTED: &str = "FakePodsInjected";
pub const REASON_EMPTY: &str = "BufferIsEmpty";
pub const REASON_NOT_READY: &str = "NotReadyForProvisioning";
/// Ours: no pod of the buffer can be given a node under the policy.
pub const REASON_CANNOT_PROVISION: &str = "CannotBeProvisioned";
/// Ours, on the PodTemplate written for a `scalableRef` buffer: a hash of the scalable object's
/// pod template it was written from (rewritten when that changes).
pub const SOURCE_HASH_ANNOTATION: &str = "gpu-node-autoscaler.io/pod-template-hash";

/// The PodTemplate written for a `scalableRef` buffer, in the buffer's namespace.
pub fn own_template_name(buffer: &str) -> String {
    format!("capacitybuffer-{buffer}-pod-template")
}

/// A stable hash (FNV-1a) of a pod template, as JSON with sorted keys.
pub fn template_hash(template: &Value) -> String {
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    h.write(template.to_string().as_bytes());
    format!("{:016x}", h.finish())
}

/// The PodTemplate named [`own_template_name`], as found in the buffer's namespace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OwnTemplate {
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// Whether the buffer owns it (an ownerReference with its UID): one that is not is never
    /// written.
    pub owned: bool,
    /// Its [`SOURCE_HASH_ANNOTATION`].
    pub source_hash: Option<String>,
}

/// A PodTemplate to write for a `scalableRef` buffer (created when `create`, else replaced).
#[derive(Clone, Debug, PartialEq)]
pub struct TemplateWrite {
    pub namespace: String,
    pub name: String,
    pub buffer: String,
    pub buffer_uid: String,
    /// The scalable object's pod template (`metadata`, `spec`).
    pub template: Value,
    /// [`template_hash`] of `template`.
    pub hash: String,
    pub create: bool,
}

/// What a chunk's shape comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// `spec.podTemplateRef`: a PodTemplate in the buffer's namespace.
    PodTemplate(String),
    /// `spec.scalableRef`: an object with a pod template and replicas.
    Scalable {
        api_group: String,
        kind: String,
        name: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct CapacityBuffer {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub generation: i64,
    pub created: Time,
    /// `spec.provisioningStrategy` (the default when absent or empty).
    pub strategy: String,
    pub source: Source,
    pub replicas: Option<i32>,
    pub percentage: Option<i32>,
    /// Total requests all chunks may take, per resource (units of [`Resources::get`]).
    pub limits: Option<Resources>,
    /// The resources `spec.limits` names (those at zero included: no chunk asking for one
    /// fits).
    pub limit_names: Vec<String>,
    /// One chunk's pod (pending), or why it cannot be made (template missing or not understood,
    /// a `limits` quantity not understood).
    pub chunk: Result<Pod, String>,
    /// The scalable object's current replicas (`scalableRef` only, when it exists).
    pub scalable_replicas: Option<i32>,
    /// `metadata.generation` of the PodTemplate named (`podTemplateRef` only).
    pub template_generation: Option<i64>,
    /// The scalable object's pod template (`scalableRef` only, when it exists).
    pub scalable_template: Option<Value>,
    /// The PodTemplate of the buffer's own (`scalableRef` only, when it exists).
    pub own_template: Option<OwnTemplate>,
    pub status: Status,
}

/// The status fields we write.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Status {
    pub replicas: Option<i32>,
    pub pod_template: Option<String>,
    /// `podTemplateGeneration`: the generation of the PodTemplate the chunk was made from.
    pub pod_template_generation: Option<i64>,
    pub strategy: Option<String>,
    pub conditions: Vec<Condition>,
}

impl CapacityBuffer {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Served here: the active strategy, and a chunk that asks for GPUs (or cannot be made, to
    /// say why).
    pub fn is_served(&self) -> bool {
        self.strategy == STRATEGY_ACTIVE
            && match &self.chunk {
                Ok(p) => is_planned_pod(p),
                Err(_) => true,
            }
    }

    /// The number of chunks the spec asks for, as the API defines it: the larger of `replicas`
    /// and `percentage` of the scalable object's replicas (rounded up), capped by how many
    /// chunks fit in `limits`; with neither, as many as fit in `limits`.
    pub fn desired_replicas(&self, chunk: &Pod) -> Result<u32, String> {
        let mut want: Option<i64> = self.replicas.map(|r| i64::from(r.max(0)));
        if let (Some(pct), Some(n)) = (self.percentage, self.scalable_replicas) {
            let from_pct = if pct <= 0 || n <= 0 {
                0
            } else {
                (i64::from(pct) * i64::from(n) + 99) / 100
            };
            want = Some(want.map_or(from_pct, |w| w.max(from_pct)));
        }
        if let Some(limits) = &self.limits {
            let mut fit: Option<i64> = None;
            for (name, req) in chunk.requests.dimensions() {
                if req <= 0 {
                    continue;
                }
                if !self.limit_names.iter().any(|n| n == name) {
                    continue;
                }
                let limit = limits.get(name);
                let n = limit.max(0) / req;
                fit = Some(fit.map_or(n, |f| f.min(n)));
            }
            let Some(fit) = fit else {
                return Err(
                    "spec.limits: none of its resources is requested by the buffer's pod template"
                        .into(),
                );
            };
            return Ok(want
                .map_or(fit, |w| w.min(fit))
                .clamp(0, i64::from(i32::MAX)) as u32);
        }
        match want {
            Some(w) => Ok(w.clamp(0, i64::from(i32::MAX)) as u32),
            None => Err(
                "none of spec.replicas, spec.percentage (with a scalableRef) and \
                         spec.limits is set"
                    .into(),
            ),
        }
    }

    /// The name status.podTemplateRef reports: the PodTemplate named, or for a `scalableRef`
    /// the buffer's own once it exists.
    fn template_name(&self) -> Option<String> {
        match &self.source {
            Source::PodTemplate(n) => Some(n.clone()),
            Source::Scalable { .. } => self
                .own_template
                .as_ref()
                .filter(|t| t.owned)
                .map(|_| own_template_name(&self.name)),
        }
    }

    /// The generation status.podTemplateGeneration reports, of the template named.
    fn reported_generation(&self) -> Option<i64> {
        match &self.source {
            Source::PodTemplate(_) => self.template_generation,
            Source::Scalable { .. } => self
                .own_template
                .as_ref()
                .filter(|t| t.owned)
                .and_then(|t| t.generation),
        }
    }

    /// The PodTemplate to write for a `scalableRef` buffer, if it is missing or was written
    /// from another pod template than the scalable object's now. One of that name the buffer
    /// does not own is left alone.
    fn template_write(&self) -> Option<TemplateWrite> {
        let Source::Scalable { .. } = &self.source else {
            return None;
        };
        let template = self.scalable_template.as_ref()?;
        let hash = template_hash(template);
        let create = match &self.own_template {
            None => true,
            Some(t) if t.owned && t.source_hash.as_deref() != Some(hash.as_str()) => false,
            Some(_) => return None,
        };
        Some(TemplateWrite {
            namespace: self.namespace.clone(),
            name: own_template_name(&self.name),
            buffer: self.name.clone(),
            buffer_uid: self.uid.clone(),
            template: template.clone(),
            hash,
            create,
        })
    }
}

/// The name of the `i`-th virtual pod of a buffer.
pub fn pod_name(buffer: &str, i: u32) -> String {
    format!("capacity-buffer.{buffer}.{i}")
}

/// Whether a plan's pod key (`namespace/name`) names a buffer's virtual pod (by the names
/// [`pod_name`] gives them): not a pod that waits.
pub fn is_virtual_key(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(_, name)| name.starts_with("capacity-buffer."))
}

/// A buffer's new status (conditions whole, others' kept).
#[derive(Clone, Debug, PartialEq)]
pub struct Update {
    pub namespace: String,
    pub name: String,
    pub status: Status,
}

impl Update {
    pub fn condition(&self, kind: &str) -> Option<&Condition> {
        self.status.conditions.iter().find(|c| c.kind == kind)
    }
}

/// Where a served buffer's room is, and what it costs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// `namespace/name`.
    pub buffer: String,
    pub replicas: u32,
    /// GPUs of all its chunks.
    pub gpus: i64,
    /// Chunks with room on Ready nodes: warm now.
    pub ready: u32,
    /// Chunks with room on nodes starting or launched, or in this pass's launches.
    pub provisioning: u32,
    /// Chunks the policy cannot give a node.
    pub unplaced: u32,
    /// $/hour of the room the buffer holds (each chunk's share of its node's GPUs, or CPU for a
    /// node without GPUs, × the node's price).
    pub cost_per_hour: f64,
}

/// What a pass does about the buffers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Assessment {
    /// The virtual pods to plan with the cluster's own.
    pub inject: Vec<Pod>,
    pub updates: Vec<Update>,
    /// One per served buffer, by key.
    pub report: Vec<Report>,
    /// PodTemplates to write for `scalableRef` buffers.
    pub templates: Vec<TemplateWrite>,
}

impl Assessment {
    /// `snapshot` with the virtual pods.
    pub fn snapshot(&self, snapshot: &Snapshot) -> Snapshot {
        let mut s = snapshot.clone();
        s.pods.extend(self.inject.iter().cloned());
        s
    }

    /// The keys (`namespace/name`) of the virtual pods: no such pod exists, so the executors
    /// act on none of them.
    pub fn pod_keys(&self) -> BTreeSet<String> {
        self.inject.iter().map(|p| p.id.to_string()).collect()
    }
}

/// The buffer a pod stands for, if it is one of a buffer's virtual pods.
pub fn buffer_of(p: &Pod) -> Option<&str> {
    p.annotations.get(BUFFER_ANNOTATION).map(String::as_str)
}

/// The virtual pods of a buffer of `n` chunks.
fn virtual_pods(b: &CapacityBuffer, chunk: &Pod, n: u32) -> Vec<Pod> {
    let annotations = {
        let mut a = (*chunk.annotations).clone();
        a.insert(BUFFER_ANNOTATION.to_string(), b.name.clone());
        Arc::new(a)
    };
    (0..n)
        .map(|i| {
            let mut p = chunk.clone();
            p.id = PodRef::new(b.namespace.clone(), pod_name(&b.name, i));
            p.uid = format!("{}/{i}", b.uid);
            p.annotations = annotations.clone();
            p.priority = BUFFER_PRIORITY;
            p.gang = None;
            p.node_name = None;
            p.nominated_node = None;
            p.unschedulable = true;
            p.created = b.created;
            p
        })
        .collect()
}

/// Decides, for every served buffer, its virtual pods, its status and where its room is.
/// `snapshot` is the cluster as the decision core will plan it (with the pods of other sources
/// such as ProvisioningRequests), without the buffers' pods.
pub fn assess(
    snapshot: &Snapshot,
    templates: &Templates,
    policy: &Policy,
    buffers: &[CapacityBuffer],
    now: Time,
) -> Assessment {
    let mut out = Assessment::default();
    let mut served: Vec<(usize, Status, Vec<Pod>)> = Vec::new();
    for (i, b) in buffers.iter().enumerate() {
        if !b.is_served() {
            continue;
        }
        let g = b.generation;
        out.templates.extend(b.template_write());
        let mut st = Status {
            replicas: None,
            pod_template: b.template_name(),
            pod_template_generation: b.template_name().and(b.reported_generation()),
            strategy: Some(b.strategy.clone()),
            conditions: b.status.conditions.clone(),
        };
        let pods = match b
            .chunk
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|chunk| b.desired_replicas(chunk).map(|n| (chunk, n)))
        {
            Err(why) => {
                let msg = format!("Buffer not ready for provisioning: {why}");
                set(
                    &mut st.conditions,
                    READY_FOR_PROVISIONING,
                    false,
                    REASON_ERROR,
                    &msg,
                    g,
                    now,
                );
                set(
                    &mut st.conditions,
                    PROVISIONING,
                    false,
                    REASON_NOT_READY,
                    "CapacityBuffer is not ready for provisioning",
                    g,
                    now,
                );
                Vec::new()
            }
            Ok((chunk, n)) => {
                st.replicas = Some(n as i32);
                set(
                    &mut st.conditions,
                    READY_FOR_PROVISIONING,
                    true,
                    REASON_ATTRIBUTES_SET,
                    "ready",
                    g,
                    now,
                );
                if n == 0 {
                    set(
                        &mut st.conditions,
                        PROVISIONING,
                        false,
                        REASON_EMPTY,
                        "CapacityBuffer has zero replicas",
                        g,
                        now,
                    );
                }
                virtual_pods(b, chunk, n)
            }
        };
        served.push((i, st, pods));
    }
    if served.is_empty() {
        return out;
    }

    // Where the room goes: the plan the decision core will make with the virtual pods.
    let mut with = snapshot.clone();
    for (_, _, pods) in &served {
        with.pods.extend(pods.iter().cloned());
    }
    let plan = if served.iter().all(|(_, _, p)| p.is_empty()) {
        Plan::default()
    } else {
        plan_with(&with, templates, policy, now)
    };
    let placed = Placed::new(&plan, snapshot, templates, now);

    for (i, mut st, pods) in served {
        let b = &buffers[i];
        let mut r = Report {
            buffer: b.key(),
            replicas: pods.len() as u32,
            gpus: pods.iter().map(|p| p.requests.whole_gpus()).sum(),
            ..Default::default()
        };
        let mut why = None;
        let mut limited: Option<(u32, &str)> = None;
        for p in &pods {
            let key = p.id.to_string();
            match placed.of(&key, p) {
                Where::Ready(cost) => {
                    r.ready += 1;
                    r.cost_per_hour += cost;
                }
                Where::Coming(cost) => {
                    r.provisioning += 1;
                    r.cost_per_hour += cost;
                }
                Where::Nowhere(reason) => {
                    r.unplaced += 1;
                    why.get_or_insert(reason);
                    if reason.starts_with(crate::plan::LIMITS_REACHED) {
                        let l = limited.get_or_insert((0, reason));
                        l.0 += 1;
                    }
                }
            }
        }
        if !pods.is_empty() {
            if r.unplaced as usize == pods.len() {
                let msg = format!(
                    "no pod of the buffer can be given a node: {}",
                    why.unwrap_or_default()
                );
                set(
                    &mut st.conditions,
                    PROVISIONING,
                    false,
                    REASON_CANNOT_PROVISION,
                    &msg,
                    b.generation,
                    now,
                );
            } else {
                set(
                    &mut st.conditions,
                    PROVISIONING,
                    true,
                    REASON_INJECTED,
                    "",
                    b.generation,
                    now,
                );
            }
        }
        match limited {
            Some((n, reason)) => {
                let msg = format!(
                    "{n} of the buffer's {} chunks have no room under the pools' limits: {reason}",
                    pods.len()
                );
                set(
                    &mut st.conditions,
                    LIMITED_BY_QUOTAS,
                    true,
                    REASON_POOL_LIMITS,
                    &msg,
                    b.generation,
                    now,
                );
            }
            None if st
                .conditions
                .iter()
                .any(|c| c.kind == LIMITED_BY_QUOTAS && c.status == "True") =>
            {
                set(
                    &mut st.conditions,
                    LIMITED_BY_QUOTAS,
                    false,
                    REASON_WITHIN_LIMITS,
                    "every chunk is within the pools' limits",
                    b.generation,
                    now,
                );
            }
            None => {}
        }
        if st != b.status {
            out.updates.push(Update {
                namespace: b.namespace.clone(),
                name: b.name.clone(),
                status: st,
            });
        }
        out.report.push(r);
        out.inject.extend(pods);
    }
    out
}

enum Where<'a> {
    /// On a Ready node, at this $/hour.
    Ready(f64),
    /// On a node starting, a launch in flight or a launch of this pass.
    Coming(f64),
    Nowhere(&'a str),
}

/// The plan's placements of pods, with the price share of each.
struct Placed<'a> {
    plan: &'a Plan,
    snapshot: &'a Snapshot,
    templates: Arc<Vec<crate::plan::Template>>,
    /// Pod key → (scale-up index).
    launched: BTreeMap<&'a str, usize>,
    existing: BTreeMap<&'a str, &'a str>,
}

impl<'a> Placed<'a> {
    fn new(plan: &'a Plan, snapshot: &'a Snapshot, templates: &Templates, now: Time) -> Self {
        let mut launched = BTreeMap::new();
        for (i, s) in plan.scale_ups.iter().enumerate() {
            for p in &s.pods {
                launched.insert(p.as_str(), i);
            }
        }
        Placed {
            plan,
            snapshot,
            templates: templates.for_snapshot(snapshot, now),
            launched,
            existing: plan
                .existing_capacity
                .iter()
                .map(|p| (p.pod.as_str(), p.target.as_str()))
                .collect(),
        }
    }

    fn share(p: &Pod, gpus: i64, cpu_milli: i64) -> f64 {
        if gpus > 0 && p.requests.whole_gpus() > 0 {
            (p.requests.whole_gpus() as f64 / gpus as f64).min(1.0)
        } else if cpu_milli > 0 {
            (p.requests.cpu_milli as f64 / cpu_milli as f64).min(1.0)
        } else {
            1.0
        }
    }

    fn of(&self, key: &str, p: &Pod) -> Where<'a> {
        if let Some(u) = self.plan.unschedulable.iter().find(|u| u.pod == key) {
            return Where::Nowhere(&u.reason);
        }
        if let Some(&target) = self.existing.get(key) {
            return match self.snapshot.nodes.iter().find(|n| n.name == target) {
                Some(n) => {
                    // A node of ours not registered into its pool yet: priced as its type.
                    let t = template_of_node(n, &self.templates)
                        .map(|t| &self.templates[t])
                        .or_else(|| {
                            let it = n.instance_type()?;
                            self.templates.iter().find(|t| t.instance_type == it)
                        });
                    let price = price_of(n, t);
                    let gpus = match t {
                        Some(t) if n.allocatable.whole_gpus() == 0 => i64::from(t.gpus),
                        _ => n.allocatable.whole_gpus(),
                    };
                    let cost = price * Self::share(p, gpus, n.allocatable.cpu_milli);
                    if n.is_schedulable() {
                        Where::Ready(cost)
                    } else {
                        Where::Coming(cost)
                    }
                }
                // A launch in flight (`launch/<id>`): priced as one of its type below.
                None => Where::Coming(self.in_flight_cost(target, p)),
            };
        }
        if let Some(&i) = self.launched.get(key) {
            let s = &self.plan.scale_ups[i];
            let Some(o) = s.offerings.first() else {
                return Where::Coming(0.0);
            };
            let t = self
                .templates
                .iter()
                .find(|t| t.pool_name == s.pool && t.instance_type == o.instance_type);
            let (gpus, cpu) = t.map_or((0, 0), |t| (i64::from(t.gpus), t.allocatable.cpu_milli));
            return Where::Coming(o.price_per_hour * Self::share(p, gpus, cpu));
        }
        Where::Nowhere("not planned")
    }

    fn in_flight_cost(&self, target: &str, p: &Pod) -> f64 {
        let id = target.strip_prefix("launch/").unwrap_or(target);
        let Some(f) = self.snapshot.in_flight.iter().find(|f| f.launch_id == id) else {
            return 0.0;
        };
        let Some(t) = self
            .templates
            .iter()
            .find(|t| t.pool_name == f.pool && t.instance_type == f.offering.instance_type)
        else {
            return 0.0;
        };
        let price = t
            .offerings
            .iter()
            .find(|o| o.key == f.offering)
            .or(t.offerings.first())
            .map_or(0.0, |o| o.price);
        price * Self::share(p, i64::from(t.gpus), t.allocatable.cpu_milli)
    }
}

#[cfg(test)]
mod tests;
