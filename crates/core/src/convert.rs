//! Kubernetes objects (as JSON values, whether from a `kubectl get -o yaml` file or from the API)
//! into model types. The one place that knows Kubernetes field names; pure and unit-tested.

use crate::hash::HashMap;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use crate::model::constraints::{
    Constraints, Effect, Operator, Requirement, Taint, Term, Toleration,
};
use crate::model::labels;
use crate::model::quantity::parse_quantity;
use crate::model::resources::{self, GpuShare, Resources, SharedGpu};
use crate::model::topology::{
    AffinityTerm, HostPort, NamespaceSelector, PodSelector, PodTopology, PreferredNodes,
    PreferredTerm, Spread,
};
use crate::model::{GangRef, Node, Owner, OwnerKind, Pdb, Pod, PodPhase, PodRef, Snapshot, Time};

// ---- the subset of the Kubernetes schema we read ----

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Meta {
    name: String,
    namespace: Option<String>,
    uid: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    owner_references: Vec<OwnerRef>,
    creation_timestamp: Option<String>,
    deletion_timestamp: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct OwnerRef {
    api_version: String,
    kind: String,
    name: String,
    uid: String,
    controller: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PodSpec {
    node_name: Option<String>,
    node_selector: BTreeMap<String, String>,
    affinity: Option<Affinity>,
    tolerations: Vec<RawToleration>,
    containers: Vec<Container>,
    init_containers: Vec<Container>,
    overhead: BTreeMap<String, Value>,
    priority: Option<i32>,
    volumes: Vec<Volume>,
    resource_claims: Vec<dra::PodClaimRef>,
    topology_spread_constraints: Vec<RawSpread>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Affinity {
    node_affinity: Option<NodeAffinity>,
    pod_affinity: Option<PodAffinity>,
    pod_anti_affinity: Option<PodAffinity>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PodAffinity {
    required_during_scheduling_ignored_during_execution: Vec<PodAffinityTerm>,
    preferred_during_scheduling_ignored_during_execution: Vec<WeightedPodAffinityTerm>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WeightedPodAffinityTerm {
    weight: i32,
    pod_affinity_term: PodAffinityTerm,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PreferredSchedulingTerm {
    weight: i32,
    preference: SelectorTerm,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PodAffinityTerm {
    label_selector: Option<LabelSelector>,
    namespaces: Vec<String>,
    namespace_selector: Option<LabelSelector>,
    topology_key: String,
    match_label_keys: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawSpread {
    max_skew: i32,
    topology_key: String,
    when_unsatisfiable: String,
    label_selector: Option<LabelSelector>,
    min_domains: Option<i32>,
    match_label_keys: Vec<String>,
    node_affinity_policy: Option<String>,
    node_taints_policy: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ContainerPort {
    host_port: Option<i32>,
    protocol: Option<String>,
    #[serde(rename = "hostIP")]
    host_ip: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct NodeAffinity {
    required_during_scheduling_ignored_during_execution: Option<NodeSelector>,
    preferred_during_scheduling_ignored_during_execution: Vec<PreferredSchedulingTerm>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct NodeSelector {
    node_selector_terms: Vec<SelectorTerm>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct SelectorTerm {
    match_expressions: Vec<Expr>,
    match_fields: Vec<Expr>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Expr {
    key: String,
    operator: String,
    values: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawToleration {
    key: Option<String>,
    operator: Option<String>,
    value: Option<String>,
    effect: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Container {
    name: String,
    resources: ContainerResources,
    restart_policy: Option<String>,
    ports: Vec<ContainerPort>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ContainerResources {
    requests: BTreeMap<String, Value>,
    limits: BTreeMap<String, Value>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Volume {
    name: String,
    empty_dir: Option<Value>,
    host_path: Option<Value>,
    persistent_volume_claim: Option<volumes::ClaimSource>,
    ephemeral: Option<volumes::Ephemeral>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PodStatus {
    phase: String,
    start_time: Option<String>,
    nominated_node_name: Option<String>,
    conditions: Vec<Condition>,
    resource_claim_statuses: Vec<dra::PodClaimStatus>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct Condition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    reason: Option<String>,
    message: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawPod {
    metadata: Meta,
    spec: PodSpec,
    status: PodStatus,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct NodeSpec {
    taints: Vec<RawTaint>,
    unschedulable: bool,
    #[serde(rename = "providerID")]
    provider_id: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawTaint {
    key: String,
    value: Option<String>,
    effect: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct NodeStatus {
    allocatable: BTreeMap<String, Value>,
    conditions: Vec<Condition>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawNode {
    metadata: Meta,
    spec: NodeSpec,
    status: NodeStatus,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct LabelSelector {
    match_labels: BTreeMap<String, String>,
    match_expressions: Vec<Expr>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PdbSpec {
    selector: Option<LabelSelector>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PdbStatus {
    disruptions_allowed: i32,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawPdb {
    metadata: Meta,
    spec: PdbSpec,
    status: PdbStatus,
}

/// The most physical GPUs one Node may advertise (the largest machines have 16): the
/// conversion allocates per GPU, so an absurd count in a Node's status is an error.
pub const MAX_GPUS_PER_NODE: i64 = 64;

/// Turns JSON objects into model values, sharing equal constraints between pods.
#[derive(Default)]
pub struct Converter {
    constraints: HashMap<Constraints, Arc<Constraints>>,
    /// Equal claim specs are shared, so that pods of one template plan as one class.
    claim_specs: HashMap<crate::model::dra::ClaimSpec, Arc<crate::model::dra::ClaimSpec>>,
}

fn quantity(v: &Value) -> Result<parse_q::Q, String> {
    let s = match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => return Err(format!("expected a quantity, got {other}")),
    };
    parse_quantity(&s)
        .map(|q| parse_q::Q { q, text: s })
        .map_err(|e| e.to_string())
}

mod parse_q {
    pub struct Q {
        pub q: crate::model::quantity::Quantity,
        pub text: String,
    }
}

/// Adds one resource list into `res`/`share`. `path` prefixes error messages.
fn add_resource_list(
    list: &BTreeMap<String, Value>,
    path: &str,
    res: &mut Resources,
    share: &mut GpuShare,
) -> Result<(), String> {
    for (name, v) in list {
        let here = format!("{path}.{name}");
        let q = quantity(v).map_err(|e| format!("{here}: {e}"))?;
        if q.q.is_negative() {
            return Err(format!("{here}: negative quantity {:?}", q.text));
        }
        let conv = |milli: bool| {
            if milli {
                q.q.to_milli_ceil()
            } else {
                q.q.to_units_ceil()
            }
            .map_err(|e| format!("{here}: {e}"))
        };
        match name.as_str() {
            resources::CPU => res.cpu_milli = res.cpu_milli.saturating_add(conv(true)?),
            resources::MEMORY => res.memory = res.memory.saturating_add(conv(false)?),
            resources::PODS => res.pods = res.pods.saturating_add(conv(false)?),
            // Not planned for: node templates do not know their disk.
            "ephemeral-storage" => {}
            resources::ALIYUN_GPU_MEM => share.mem_gib = share.mem_gib.saturating_add(conv(false)?),
            resources::ALIYUN_GPU_CORE => {
                share.core_pct = share.core_pct.saturating_add(conv(false)?)
            }
            resources::ALIYUN_GPU_COUNT => {}
            other => {
                let cur = res.get(other);
                res.set(other, cur.saturating_add(conv(false)?));
            }
        }
    }
    Ok(())
}

/// Requests of one container, with limits standing in for absent requests (as the API server
/// defaults them).
fn container_requests(c: &Container, path: &str) -> Result<(Resources, GpuShare), String> {
    let requests = &c.resources.requests;
    let limits_only: BTreeMap<String, Value> = c
        .resources
        .limits
        .iter()
        .filter(|(k, _)| !requests.contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut r = Resources::default();
    let mut s = GpuShare::default();
    // Separately, so that errors name the field the value is really in.
    let (req_path, lim_path) = (
        format!("{path}.resources.requests"),
        format!("{path}.resources.limits"),
    );
    add_resource_list(requests, &req_path, &mut r, &mut s)?;
    add_resource_list(&limits_only, &lim_path, &mut r, &mut s)?;
    Ok((r, s))
}

fn max_into(acc: &mut Resources, other: &Resources) {
    for (name, v) in other.dimensions() {
        if v > acc.get(name) {
            acc.set(name, v);
        }
    }
}

/// A pod's effective requests as kube-scheduler computes them, over any per-resource amounts
/// (`add` sums two, `max` keeps the larger of each resource): the larger of the app containers
/// plus the sidecars (init containers with `restartPolicy: Always`, flagged `true`) and of each
/// init container plus the sidecars started before it. The caller adds `spec.overhead`.
pub fn effective_requests<R: Clone + Default>(
    containers: &[R],
    init_containers: &[(R, bool)],
    add: impl Fn(&mut R, &R),
    max: impl Fn(&mut R, &R),
) -> R {
    let mut sum = R::default();
    for r in containers {
        add(&mut sum, r);
    }
    let mut sidecars = R::default();
    let mut init_max = R::default();
    for (r, sidecar) in init_containers {
        if *sidecar {
            add(&mut sidecars, r);
            max(&mut init_max, &sidecars);
        } else {
            let mut with = sidecars.clone();
            add(&mut with, r);
            max(&mut init_max, &with);
        }
    }
    add(&mut sum, &sidecars);
    max(&mut sum, &init_max);
    sum
}

/// Whether an init container is a sidecar (`restartPolicy: Always`).
pub fn is_sidecar(restart_policy: Option<&str>) -> bool {
    restart_policy == Some("Always")
}

/// Effective pod requests ([`effective_requests`]) plus overhead; GPU shares are summed over the
/// app containers and at least each init container's.
fn pod_requests(spec: &PodSpec) -> Result<(Resources, GpuShare), String> {
    let mut share = GpuShare::default();
    let mut containers = Vec::with_capacity(spec.containers.len());
    for (i, c) in spec.containers.iter().enumerate() {
        let (r, s) = container_requests(c, &format!("spec.containers[{i}]"))?;
        containers.push(r);
        share.mem_gib = share.mem_gib.saturating_add(s.mem_gib);
        share.core_pct = share.core_pct.saturating_add(s.core_pct);
    }
    let mut init = Vec::with_capacity(spec.init_containers.len());
    for (i, c) in spec.init_containers.iter().enumerate() {
        let (r, s) = container_requests(c, &format!("spec.initContainers[{i}]"))?;
        share.mem_gib = share.mem_gib.max(s.mem_gib);
        share.core_pct = share.core_pct.max(s.core_pct);
        init.push((r, is_sidecar(c.restart_policy.as_deref())));
    }
    let mut sum = effective_requests(&containers, &init, Resources::add, max_into);
    let mut s2 = GpuShare::default();
    add_resource_list(&spec.overhead, "spec.overhead", &mut sum, &mut s2)?;
    sum.pods = 1;
    Ok((sum, share))
}

fn parse_time(s: &Option<String>) -> Time {
    s.as_deref()
        .and_then(|s| Time::parse_rfc3339(s).ok())
        .unwrap_or(Time::EPOCH)
}

fn requirement(e: &Expr) -> Result<Requirement, String> {
    let operator = Operator::parse(&e.operator)
        .ok_or_else(|| format!("unknown operator {:?} for key {:?}", e.operator, e.key))?;
    Ok(Requirement {
        key: e.key.clone(),
        operator,
        values: e.values.clone(),
    })
}

fn tolerations(list: &[RawToleration]) -> Result<Vec<Toleration>, String> {
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            let exists = match t.operator.as_deref() {
                None | Some("Equal") => false,
                Some("Exists") => true,
                Some(o) => return Err(format!("spec.tolerations[{i}].operator: unknown {o:?}")),
            };
            let effect = match t.effect.as_deref() {
                None | Some("") => None,
                Some(e) => Some(
                    Effect::parse(e)
                        .ok_or_else(|| format!("spec.tolerations[{i}].effect: unknown {e:?}"))?,
                ),
            };
            Ok(Toleration {
                key: t.key.clone().filter(|k| !k.is_empty()),
                exists,
                value: t.value.clone().unwrap_or_default(),
                effect,
            })
        })
        .collect()
}

/// A label selector as requirements (`matchLabels` as `In`), with the pod's values of
/// `matchLabelKeys` added; `None` when absent (it selects no pod).
fn label_selector(
    sel: Option<&LabelSelector>,
    match_label_keys: &[String],
    pod_labels: &BTreeMap<String, String>,
) -> Result<Option<Vec<Requirement>>, String> {
    let Some(sel) = sel else { return Ok(None) };
    let mut reqs: Vec<Requirement> = sel
        .match_labels
        .iter()
        .map(|(k, v)| Requirement {
            key: k.clone(),
            operator: Operator::In,
            values: vec![v.clone()],
        })
        .collect();
    for e in &sel.match_expressions {
        let r = requirement(e)?;
        if matches!(r.operator, Operator::Gt | Operator::Lt) {
            return Err(format!(
                "operator {:?} is not allowed in a label selector",
                e.operator
            ));
        }
        reqs.push(r);
    }
    for k in match_label_keys {
        if let Some(v) = pod_labels.get(k) {
            reqs.push(Requirement {
                key: k.clone(),
                operator: Operator::In,
                values: vec![v.clone()],
            });
        }
    }
    Ok(Some(reqs))
}

/// A pod (anti-)affinity term at `path`. Namespaces: the listed ones, or the pod's own when
/// none are listed and there is no `namespaceSelector`; `namespaceSelector: {}` is every
/// namespace. A non-empty `namespaceSelector` needs the Namespaces' labels, which are not read:
/// its term looks at the listed namespaces and the pod's own.
fn affinity_term(
    t: &PodAffinityTerm,
    namespace: &str,
    pod_labels: &BTreeMap<String, String>,
    path: &str,
) -> Result<AffinityTerm, String> {
    if t.topology_key.is_empty() {
        return Err(format!("{path}.topologyKey: required"));
    }
    let labels = label_selector(t.label_selector.as_ref(), &t.match_label_keys, pod_labels)
        .map_err(|e| format!("{path}.labelSelector: {e}"))?;
    let everywhere = t
        .namespace_selector
        .as_ref()
        .is_some_and(|s| s.match_labels.is_empty() && s.match_expressions.is_empty());
    let namespace_selector = match &t.namespace_selector {
        Some(s) if !everywhere => {
            let labels = label_selector(Some(s), &[], &BTreeMap::new())
                .map_err(|e| format!("{path}.namespaceSelector: {e}"))?
                .unwrap_or_default();
            let mut listed = t.namespaces.clone();
            listed.sort();
            listed.dedup();
            Some(NamespaceSelector { labels, listed })
        }
        _ => None,
    };
    let namespaces = if everywhere {
        None
    } else {
        let mut ns = t.namespaces.clone();
        if ns.is_empty() || t.namespace_selector.is_some() {
            ns.push(namespace.to_string());
        }
        ns.sort();
        ns.dedup();
        Some(ns)
    };
    Ok(AffinityTerm {
        selector: PodSelector {
            labels,
            namespaces,
            namespace_selector,
        },
        topology_key: t.topology_key.clone(),
    })
}

/// A pod's rules across nodes: host ports of its containers (and of its sidecars), required
/// pod affinity and anti-affinity, and its `DoNotSchedule` spread constraints; and its
/// preferences (preferred pod and node affinity terms, `ScheduleAnyway` spread constraints),
/// which only break ties. `None` when it has none.
fn pod_topology(
    spec: &PodSpec,
    namespace: &str,
    pod_labels: &BTreeMap<String, String>,
) -> Result<Option<Arc<PodTopology>>, String> {
    let mut t = PodTopology::default();
    let sidecars = spec
        .init_containers
        .iter()
        .filter(|c| is_sidecar(c.restart_policy.as_deref()));
    for c in spec.containers.iter().chain(sidecars) {
        for p in &c.ports {
            let Some(port) = p.host_port.filter(|&p| p > 0) else {
                continue;
            };
            let ip = p.host_ip.clone().unwrap_or_default();
            t.host_ports.push(HostPort {
                port,
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                ip: if ip == "0.0.0.0" { String::new() } else { ip },
            });
        }
    }
    if let Some(a) = &spec.affinity {
        for (terms, into, field) in [
            (&a.pod_affinity, &mut t.affinity, "podAffinity"),
            (
                &a.pod_anti_affinity,
                &mut t.anti_affinity,
                "podAntiAffinity",
            ),
        ] {
            if let Some(pa) = terms {
                for (i, a) in pa
                    .required_during_scheduling_ignored_during_execution
                    .iter()
                    .enumerate()
                {
                    into.push(affinity_term(
                        a,
                        namespace,
                        pod_labels,
                        &format!(
                            "spec.affinity.{field}.requiredDuringSchedulingIgnoredDuringExecution[{i}]"
                        ),
                    )?);
                }
                let path = format!(
                    "spec.affinity.{field}.preferredDuringSchedulingIgnoredDuringExecution"
                );
                let sign = if field == "podAffinity" { 1 } else { -1 };
                for (i, w) in pa
                    .preferred_during_scheduling_ignored_during_execution
                    .iter()
                    .enumerate()
                {
                    weight(w.weight, &format!("{path}[{i}]"))?;
                    let term = affinity_term(
                        &w.pod_affinity_term,
                        namespace,
                        pod_labels,
                        &format!("{path}[{i}].podAffinityTerm"),
                    )?;
                    t.preferences.pods.push(PreferredTerm {
                        weight: sign * w.weight,
                        term,
                    });
                }
            }
        }
        if let Some(n) = &a.node_affinity {
            let path = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution";
            for (i, p) in n
                .preferred_during_scheduling_ignored_during_execution
                .iter()
                .enumerate()
            {
                weight(p.weight, &format!("{path}[{i}]"))?;
                let requirements = p
                    .preference
                    .match_expressions
                    .iter()
                    .map(requirement)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("{path}[{i}].preference: {e}"))?;
                t.preferences.nodes.push(PreferredNodes {
                    weight: p.weight,
                    requirements,
                });
            }
        }
    }
    for (i, s) in spec.topology_spread_constraints.iter().enumerate() {
        let path = format!("spec.topologySpreadConstraints[{i}]");
        let soft = match s.when_unsatisfiable.as_str() {
            "DoNotSchedule" => false,
            "ScheduleAnyway" => true,
            other => return Err(format!("{path}.whenUnsatisfiable: unknown {other:?}")),
        };
        if s.max_skew < 1 {
            return Err(format!("{path}.maxSkew: must be at least 1"));
        }
        if s.topology_key.is_empty() {
            return Err(format!("{path}.topologyKey: required"));
        }
        let labels = label_selector(s.label_selector.as_ref(), &s.match_label_keys, pod_labels)
            .map_err(|e| format!("{path}.labelSelector: {e}"))?;
        let spread = Spread {
            max_skew: s.max_skew,
            topology_key: s.topology_key.clone(),
            selector: PodSelector {
                labels,
                namespaces: Some(vec![namespace.to_string()]),
                namespace_selector: None,
            },
            min_domains: s.min_domains.unwrap_or(1),
            honor_node_affinity: honor(
                s.node_affinity_policy.as_deref(),
                true,
                &format!("{path}.nodeAffinityPolicy"),
            )?,
            honor_taints: honor(
                s.node_taints_policy.as_deref(),
                false,
                &format!("{path}.nodeTaintsPolicy"),
            )?,
        };
        if soft {
            t.preferences.spread.push(spread);
        } else {
            t.spread.push(spread);
        }
    }
    Ok((!t.is_empty()).then(|| Arc::new(t)))
}

/// A Namespace's labels (what a pod affinity term's `namespaceSelector` selects on).
pub fn namespace_labels(item: &Value) -> BTreeMap<String, String> {
    item.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// A node inclusion policy: `Honor` or `Ignore`, `default` when unset.
fn honor(policy: Option<&str>, default: bool, path: &str) -> Result<bool, String> {
    match policy {
        None => Ok(default),
        Some("Honor") => Ok(true),
        Some("Ignore") => Ok(false),
        Some(other) => Err(format!("{path}: unknown {other:?} (Honor or Ignore)")),
    }
}

/// A preferred term's weight: 1 to 100, as the API validates it.
fn weight(w: i32, path: &str) -> Result<(), String> {
    if (1..=100).contains(&w) {
        Ok(())
    } else {
        Err(format!("{path}.weight: must be 1 to 100, got {w}"))
    }
}

fn first_of<'a>(maps: [&'a BTreeMap<String, String>; 2], keys: &[&str]) -> Option<&'a String> {
    keys.iter()
        .find_map(|k| maps.iter().find_map(|m| m.get(*k)))
}

impl Converter {
    pub fn new() -> Converter {
        Converter::default()
    }

    fn intern(&mut self, c: Constraints) -> Arc<Constraints> {
        self.constraints
            .entry(c.clone())
            .or_insert_with(|| Arc::new(c))
            .clone()
    }

    /// A Pod. Problems with its spec do not fail the conversion: they are kept on the pod so that
    /// the planner reports it (and the controller raises an Event), while other pods go on.
    pub fn pod(&mut self, v: Value) -> Result<Pod, String> {
        let raw: RawPod = serde_json::from_value(v).map_err(|e| format!("not a Pod: {e}"))?;
        if raw.metadata.name.is_empty() {
            return Err("Pod without metadata.name".into());
        }
        let m = &raw.metadata;
        let id = PodRef::new(
            m.namespace.clone().unwrap_or_else(|| "default".into()),
            m.name.clone(),
        );
        let mut problem = None;
        let (requests, share) = match pod_requests(&raw.spec) {
            Ok(x) => x,
            Err(e) => {
                problem = Some(e);
                (
                    Resources {
                        pods: 1,
                        ..Default::default()
                    },
                    GpuShare::default(),
                )
            }
        };
        let share = (share.mem_gib > 0 || share.core_pct > 0).then_some(share);
        if let Some(s) = share {
            if s.core_pct % 5 != 0 && problem.is_none() {
                problem = Some(format!(
                    "{} must be a multiple of 5, got {}",
                    resources::ALIYUN_GPU_CORE,
                    s.core_pct
                ));
            }
        }
        let mut affinity = None;
        if let Some(sel) = raw
            .spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
        {
            let mut terms = Vec::new();
            for (i, t) in sel.node_selector_terms.iter().enumerate() {
                let mut reqs = Vec::new();
                for e in &t.match_expressions {
                    match requirement(e) {
                        Ok(r) => reqs.push(r),
                        Err(e) => {
                            problem.get_or_insert(format!(
                                "spec.affinity.nodeAffinity...nodeSelectorTerms[{i}]: {e}"
                            ));
                        }
                    }
                }
                let node_names = t
                    .match_fields
                    .iter()
                    .find(|f| f.key == "metadata.name" && f.operator == "In")
                    .map(|f| f.values.clone());
                terms.push(Term {
                    requirements: reqs,
                    node_names,
                });
            }
            affinity = Some(terms);
        }
        let tolerations = tolerations(&raw.spec.tolerations).unwrap_or_else(|e| {
            problem.get_or_insert(e);
            Vec::new()
        });
        let topology = pod_topology(&raw.spec, &id.namespace, &m.labels).unwrap_or_else(|e| {
            problem.get_or_insert(e);
            None
        });
        let constraints = self.intern(Constraints {
            node_selector: raw.spec.node_selector.clone(),
            affinity,
            tolerations,
            topology,
            volumes: Vec::new(),
            refused_nodes: Vec::new(),
        });
        let owner = m
            .owner_references
            .iter()
            .find(|o| o.controller == Some(true))
            .map(|o| Owner {
                kind: OwnerKind::parse(&o.kind, &o.api_version),
                name: o.name.clone(),
                uid: o.uid.clone(),
            });
        let gang = first_of([&m.labels, &m.annotations], &labels::GANG_KEYS).map(|g| {
            let min_member = first_of([&m.annotations, &m.labels], &labels::GANG_MIN_MEMBER_KEYS)
                .and_then(|v| v.parse().ok());
            GangRef {
                key: format!("{}/{}", id.namespace, g),
                min_member,
            }
        });
        let refusal = raw.status.conditions.iter().find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        });
        let unschedulable = refusal.is_some();
        let scheduler_message = refusal.and_then(|c| c.message.clone());
        // Local volumes lost with the node, less those the pod says it may lose.
        let may_lose: Vec<&str> = m
            .annotations
            .get(labels::CA_SAFE_TO_EVICT_LOCAL_VOLUMES)
            .map(|v| v.split(',').map(str::trim).collect())
            .unwrap_or_default();
        let local_storage = raw.spec.volumes.iter().any(|v| {
            (v.empty_dir.is_some() || v.host_path.is_some()) && !may_lose.contains(&v.name.as_str())
        });
        let volumes = volumes::pod_volumes(&m.name, &raw.spec.volumes);
        Ok(Pod {
            volumes,
            waiting: None,
            uid: m.uid.clone(),
            labels: Arc::new(m.labels.clone()),
            requests,
            share,
            constraints,
            node_name: raw.spec.node_name.clone().filter(|n| !n.is_empty()),
            phase: PodPhase::parse(&raw.status.phase),
            owner,
            gang,
            priority: raw.spec.priority.unwrap_or(0),
            created: parse_time(&m.creation_timestamp),
            started: raw
                .status
                .start_time
                .as_deref()
                .and_then(|s| Time::parse_rfc3339(s).ok()),
            deleting: m.deletion_timestamp.is_some(),
            unschedulable,
            scheduler_message,
            local_storage,
            nominated_node: raw
                .status
                .nominated_node_name
                .clone()
                .filter(|n| !n.is_empty()),
            shared_gpu_index: m
                .annotations
                .get("ALIYUN_COM_GPU_MEM_IDX")
                .and_then(|v| v.parse().ok()),
            annotations: Arc::new(raw.metadata.annotations),
            problem,
            claims: dra::pod_claims(
                &id.namespace,
                &id.name,
                &raw.spec.resource_claims,
                &raw.status.resource_claim_statuses,
            ),
            id,
        })
    }

    pub fn node(&mut self, v: Value) -> Result<Node, String> {
        let raw: RawNode = serde_json::from_value(v).map_err(|e| format!("not a Node: {e}"))?;
        if raw.metadata.name.is_empty() {
            return Err("Node without metadata.name".into());
        }
        let mut allocatable = Resources::default();
        let mut share_total = GpuShare::default();
        add_resource_list(
            &raw.status.allocatable,
            "status.allocatable",
            &mut allocatable,
            &mut share_total,
        )
        .map_err(|e| format!("Node {}: {e}", raw.metadata.name))?;
        let mut shared_gpus = Vec::new();
        if share_total.mem_gib > 0 {
            let count = raw
                .status
                .allocatable
                .get(resources::ALIYUN_GPU_COUNT)
                .and_then(|v| quantity(v).ok())
                .and_then(|q| q.q.to_units_ceil().ok())
                .unwrap_or(1)
                .max(1);
            // One entry per GPU is allocated: a value no machine has is refused, not believed.
            if count > MAX_GPUS_PER_NODE {
                return Err(format!(
                    "Node {}: status.allocatable.{}: {count} GPUs on one node is more than \
                     {MAX_GPUS_PER_NODE}, the most this autoscaler accepts",
                    raw.metadata.name,
                    resources::ALIYUN_GPU_COUNT
                ));
            }
            let core = if share_total.core_pct > 0 {
                share_total.core_pct / count
            } else {
                100
            };
            shared_gpus = (0..count)
                .map(|_| SharedGpu {
                    mem_gib: share_total.mem_gib / count,
                    core_pct: core,
                })
                .collect();
        }
        let taints = raw
            .spec
            .taints
            .iter()
            .filter_map(|t| {
                Effect::parse(&t.effect).map(|effect| Taint {
                    key: t.key.clone(),
                    value: t.value.clone().unwrap_or_default(),
                    effect,
                })
            })
            .collect();
        let ready = raw
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        let conditions = raw
            .status
            .conditions
            .iter()
            .filter(|c| c.type_ != "Ready")
            .map(|c| (c.type_.clone(), c.status.clone()))
            .collect();
        Ok(Node {
            conditions,
            name: raw.metadata.name.clone(),
            labels: Arc::new(raw.metadata.labels),
            annotations: Arc::new(raw.metadata.annotations),
            taints,
            allocatable,
            shared_gpus,
            ready,
            unschedulable: raw.spec.unschedulable,
            created: parse_time(&raw.metadata.creation_timestamp),
            provider_id: raw.spec.provider_id,
            deleting: raw.metadata.deletion_timestamp.is_some(),
            dra_devices: 0,
        })
    }

    pub fn pdb(&mut self, v: Value) -> Result<Pdb, String> {
        let raw: RawPdb =
            serde_json::from_value(v).map_err(|e| format!("not a PodDisruptionBudget: {e}"))?;
        // policy/v1: a null selector selects no pods (only `{}` selects the whole namespace), so
        // such a budget never limits an eviction.
        let Some(sel) = &raw.spec.selector else {
            return Err("no spec.selector, so it selects no pods".into());
        };
        let mut selector = Vec::new();
        for (k, v) in &sel.match_labels {
            selector.push(Requirement {
                key: k.clone(),
                operator: Operator::In,
                values: vec![v.clone()],
            });
        }
        for e in &sel.match_expressions {
            selector.push(requirement(e)?);
        }
        Ok(Pdb {
            namespace: raw.metadata.namespace.unwrap_or_else(|| "default".into()),
            name: raw.metadata.name,
            selector,
            disruptions_allowed: raw.status.disruptions_allowed,
        })
    }
}

/// What reading a cluster file produced: the snapshot and a warning per object it had to skip
/// or could not fully understand.
#[derive(Debug, Default)]
pub struct Loaded {
    pub snapshot: Snapshot,
    pub warnings: Vec<String>,
}

/// Reads a list of capacity reservations as a provider reports them (YAML or JSON); errors
/// name the file and the field.
pub fn load_reservations(
    text: &str,
    file: &str,
) -> Result<Vec<gpu_node_autoscaler_provider::Reservation>, String> {
    let value = crate::yaml::parse(text)
        .map_err(|e| format!("{file}:{}:{}: {}", e.line, e.col, e.message))?;
    serde_path_to_error::deserialize(value)
        .map_err(|e| format!("{file}: {}: {}", e.path(), e.inner()))
}

/// Reads what `kubectl get pods,nodes,pdb,pvc,pv,storageclass,csinode,namespaces -A -o yaml` (or `-o json`) prints: a `List`.
pub fn load_cluster_file(text: &str, file: &str) -> Result<Loaded, String> {
    let doc = crate::yaml::parse(text).map_err(|e| {
        format!(
            "{file}:{}:{}: not valid YAML or JSON: {}",
            e.line, e.col, e.message
        )
    })?;
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
    let items = match doc.get("items") {
        Some(Value::Array(items)) if kind == "List" || kind.ends_with("List") => items,
        _ => {
            return Err(format!(
                "{file}: expected a Kubernetes List with `items` (what `kubectl get pods,nodes,pdb,pvc,pv,storageclass,csinode,namespaces -A -o yaml` prints), got {}",
                if kind.is_empty() { "no `kind`".to_string() } else { format!("kind {kind:?}") }
            ))
        }
    };
    let mut conv = Converter::new();
    let mut out = Loaded::default();
    let mut dra = crate::model::dra::DraObjects::default();
    let mut storage = crate::model::volumes::Storage::default();
    let mut namespaces: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let kind = item.get("kind").and_then(Value::as_str).unwrap_or("");
        let name = item
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("?");
        let ns = item.pointer("/metadata/namespace").and_then(Value::as_str);
        let what = match ns {
            Some(ns) => format!("{file}: items[{i}] {kind} {ns}/{name}"),
            None => format!("{file}: items[{i}] {kind} {name}"),
        };
        match kind {
            "Pod" => match conv.pod(item.clone()) {
                Ok(p) => {
                    if let Some(problem) = &p.problem {
                        out.warnings.push(format!("{what}: {problem}"));
                    }
                    out.snapshot.pods.push(p);
                }
                Err(e) => out.warnings.push(format!("{what}: skipped: {e}")),
            },
            "Node" => match conv.node(item.clone()) {
                Ok(n) => out.snapshot.nodes.push(n),
                Err(e) => out.warnings.push(format!("{what}: skipped: {e}")),
            },
            "PodDisruptionBudget" => match conv.pdb(item.clone()) {
                Ok(p) => out.snapshot.pdbs.push(p),
                Err(e) => out.warnings.push(format!("{what}: skipped: {e}")),
            },
            "ResourceClaim" => match conv.resource_claim(item.clone()) {
                Ok((k, c)) => {
                    dra.claims.insert(k, c);
                }
                Err(e) => out.warnings.push(format!("{what}: skipped: {e}")),
            },
            "ResourceClaimTemplate" => match conv.resource_claim_template(item.clone()) {
                Ok((k, t)) => {
                    dra.templates.insert(k, t);
                }
                Err(e) => out.warnings.push(format!("{what}: skipped: {e}")),
            },
            "DeviceClass" => match conv.device_class(item.clone()) {
                Ok(c) => {
                    dra.classes.insert(c.name.clone(), c);
                }
                Err(e) => out.warnings.push(format!("{what}: skipped: {e}")),
            },
            "ResourceSlice" => match conv.resource_slice(item.clone()) {
                Ok(Some((k, s))) => {
                    dra.slices.insert(k, s);
                }
                Ok(None) => out.warnings.push(format!(
                    "{what}: ignored (devices not bound to one node are not planned with)"
                )),
                Err(e) => out.warnings.push(format!("{what}: skipped: {e}")),
            },
            "PersistentVolumeClaim" => match conv.persistent_volume_claim(item.clone()) {
                Ok(c) => {
                    storage
                        .claims
                        .insert(format!("{}/{}", c.namespace, c.name), c);
                }
                Err(e) => out.warnings.push(format!("{what}: skipped: {e}")),
            },
            "PersistentVolume" => match conv.persistent_volume(item.clone()) {
                Ok(v) => {
                    storage.volumes.insert(v.name.clone(), v);
                }
                Err(e) => out.warnings.push(format!("{what}: skipped: {e}")),
            },
            "StorageClass" => match conv.storage_class(item.clone()) {
                Ok(c) => {
                    storage.classes.insert(c.name.clone(), c);
                }
                Err(e) => out.warnings.push(format!("{what}: skipped: {e}")),
            },
            "CSINode" => match conv.csi_node(item.clone()) {
                Ok((node, limits)) => {
                    if !limits.is_empty() {
                        out.snapshot.attach_limits.by_node.insert(node, limits);
                    }
                }
                Err(e) => out.warnings.push(format!("{what}: skipped: {e}")),
            },
            "Namespace" => {
                namespaces.insert(name.to_string(), namespace_labels(item));
            }
            _ => out.warnings.push(format!(
                "{what}: ignored (only Pods, Nodes, PodDisruptionBudgets, ResourceClaims, \
                 ResourceClaimTemplates, DeviceClasses, ResourceSlices, PersistentVolumeClaims, \
                 PersistentVolumes, StorageClasses, CSINodes and Namespaces are read)"
            )),
        }
    }
    if !namespaces.is_empty() {
        crate::model::topology::resolve_namespaces(&mut out.snapshot.pods, &namespaces);
    }
    storage.complete = !storage.claims.is_empty();
    storage.limited_drivers = out.snapshot.attach_limits.drivers();
    storage.join(&mut out.snapshot.pods);
    out.snapshot.dra = dra.join(&mut out.snapshot.pods);
    for p in &out.snapshot.pods {
        if let (Some(problem), false) = (&p.problem, p.claims.is_empty()) {
            if problem.contains("does not exist") {
                out.warnings
                    .push(format!("{file}: Pod {}: {problem}", p.id));
            }
        }
    }
    out.snapshot.count_published_devices();
    Ok(out)
}

mod buffer;
mod dra;
mod provisioning;
mod volumes;

pub use buffer::scalable_key;
pub use provisioning::VALID_UNTIL_SECONDS;

#[cfg(test)]
mod tests;
