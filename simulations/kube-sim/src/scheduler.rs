//! The simulated kube-scheduler: binds Pending pods to nodes where they fit, or marks them
//! `PodScheduled=False` / `Unschedulable` with a message shaped like kube-scheduler's.
//!
//! Filters, in kube-scheduler's order (the first one that fails names the node's reason):
//! NodeUnschedulable (`spec.unschedulable`), TaintToleration (NoSchedule/NoExecute taints, and a
//! node whose Ready condition is not True counts as tainted `node.kubernetes.io/not-ready`),
//! NodeAffinity (`nodeSelector` and required node affinity), NodeResourcesFit (requests against
//! allocatable minus what bound, non-terminal pods request, the `pods` count included). Among the
//! nodes that pass, the least allocated one (CPU and memory, like kube-scheduler's default
//! `LeastAllocated` score) wins; ties go to the first by name.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use gpu_node_autoscaler_core::convert::{effective_requests, is_sidecar};
use gpu_node_autoscaler_core::model::quantity::parse_quantity;
use serde_json::{json, Value};

use crate::resources::{NODES, PODS};
use crate::server::App;
use crate::store::{now_timestamp, Store};

/// Resource name → amount in thousandths.
pub type Resources = BTreeMap<String, i128>;

fn quantities(v: Option<&Value>) -> Result<Resources, String> {
    let mut out = Resources::new();
    for (k, q) in v.and_then(Value::as_object).into_iter().flatten() {
        let s = match q {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            other => return Err(format!("resource {k}: {other} is not a quantity")),
        };
        out.insert(
            k.clone(),
            parse_quantity(&s)
                .and_then(|q| q.to_milli_ceil())
                .map(i128::from)
                .map_err(|e| format!("resource {k}: {e}"))?,
        );
    }
    Ok(out)
}

/// A container's effective requests: `requests`, with `limits` standing in where a resource has
/// no request (the apiserver defaults requests to limits).
fn container_requests(c: &Value) -> Result<Resources, String> {
    let mut r = quantities(c.pointer("/resources/limits"))?;
    r.extend(quantities(c.pointer("/resources/requests"))?);
    Ok(r)
}

fn containers(pod: &Value, field: &str) -> Result<Vec<(Resources, bool)>, String> {
    let list = pod
        .pointer(&format!("/spec/{field}"))
        .and_then(Value::as_array);
    (list.into_iter().flatten())
        .map(|c| {
            let restart = c.get("restartPolicy").and_then(Value::as_str);
            Ok((container_requests(c)?, is_sidecar(restart)))
        })
        .collect()
}

/// What a pod requests, as the core computes it ([`effective_requests`]): its containers plus
/// sidecars, at least each init container plus the sidecars before it, plus `spec.overhead`.
pub fn pod_requests(pod: &Value) -> Result<Resources, String> {
    let apps: Vec<Resources> = containers(pod, "containers")?
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    let init = containers(pod, "initContainers")?;
    let add = |a: &mut Resources, b: &Resources| {
        for (k, v) in b {
            *a.entry(k.clone()).or_default() += v;
        }
    };
    let max = |a: &mut Resources, b: &Resources| {
        for (k, v) in b {
            let e = a.entry(k.clone()).or_default();
            *e = (*e).max(*v);
        }
    };
    let mut total = effective_requests(&apps, &init, add, max);
    add(&mut total, &quantities(pod.pointer("/spec/overhead"))?);
    Ok(total)
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn terminal(pod: &Value) -> bool {
    matches!(str_at(pod, "/status/phase"), "Succeeded" | "Failed")
}

/// A node as the scheduler sees it.
struct NodeInfo {
    name: String,
    obj: Value,
    allocatable: Resources,
    requested: Resources,
    ready: bool,
}

fn tolerates(tolerations: &[Value], key: &str, value: &str, effect: &str) -> bool {
    tolerations.iter().any(|t| {
        let t_effect = str_at(t, "/effect");
        let t_key = str_at(t, "/key");
        if !t_effect.is_empty() && t_effect != effect {
            return false;
        }
        match str_at(t, "/operator") {
            "Exists" => t_key.is_empty() || t_key == key,
            "" | "Equal" => t_key == key && str_at(t, "/value") == value,
            _ => false,
        }
    })
}

/// One required node-selector requirement against a set of values (labels or fields).
fn requirement_matches(req: &Value, get: impl Fn(&str) -> Option<String>) -> bool {
    let key = str_at(req, "/key");
    let values: Vec<&str> = req
        .get("values")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let have = get(key);
    let int = |s: &str| s.parse::<i64>().ok();
    match str_at(req, "/operator") {
        "In" => have.is_some_and(|h| values.contains(&h.as_str())),
        "NotIn" => have.is_none_or(|h| !values.contains(&h.as_str())),
        "Exists" => have.is_some(),
        "DoesNotExist" => have.is_none(),
        "Gt" | "Lt" => {
            let (Some(h), Some(v)) = (
                have.as_deref().and_then(int),
                values.first().and_then(|v| int(v)),
            ) else {
                return false;
            };
            if str_at(req, "/operator") == "Gt" {
                h > v
            } else {
                h < v
            }
        }
        _ => false,
    }
}

fn affinity_matches(pod: &Value, node: &Value) -> bool {
    let labels = node.pointer("/metadata/labels");
    let label = |k: &str| {
        labels
            .and_then(|l| l.get(k))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    if let Some(sel) = pod.pointer("/spec/nodeSelector").and_then(Value::as_object) {
        if !sel
            .iter()
            .all(|(k, v)| v.as_str().is_some_and(|v| label(k).as_deref() == Some(v)))
        {
            return false;
        }
    }
    let Some(terms) = pod
        .pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(Value::as_array)
    else {
        return true;
    };
    let name = str_at(node, "/metadata/name").to_string();
    terms.iter().any(|term| {
        let exprs = term.get("matchExpressions").and_then(Value::as_array);
        let fields = term.get("matchFields").and_then(Value::as_array);
        if exprs.is_none_or(Vec::is_empty) && fields.is_none_or(Vec::is_empty) {
            return false;
        }
        exprs
            .into_iter()
            .flatten()
            .all(|r| requirement_matches(r, label))
            && fields
                .into_iter()
                .flatten()
                .all(|r| requirement_matches(r, |k| (k == "metadata.name").then(|| name.clone())))
    })
}

/// Why a node does not fit a pod (kube-scheduler's reason texts), or its score when it does.
fn evaluate(pod: &Value, req: &Resources, node: &NodeInfo) -> Result<f64, Vec<String>> {
    let tolerations: &[Value] = pod
        .pointer("/spec/tolerations")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    if node.obj.pointer("/spec/unschedulable") == Some(&Value::Bool(true))
        && !tolerates(
            tolerations,
            "node.kubernetes.io/unschedulable",
            "",
            "NoSchedule",
        )
    {
        return Err(vec!["node(s) were unschedulable".into()]);
    }
    let mut taints: Vec<(String, String, String)> = node
        .obj
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|t| {
            (
                str_at(t, "/key").to_string(),
                str_at(t, "/value").to_string(),
                str_at(t, "/effect").to_string(),
            )
        })
        .collect();
    if !node.ready {
        taints.push((
            "node.kubernetes.io/not-ready".into(),
            String::new(),
            "NoSchedule".into(),
        ));
    }
    for (key, value, effect) in &taints {
        if matches!(effect.as_str(), "NoSchedule" | "NoExecute")
            && !tolerates(tolerations, key, value, effect)
        {
            return Err(vec![format!(
                "node(s) had untolerated taint {{{key}: {value}}}"
            )]);
        }
    }
    if !affinity_matches(pod, &node.obj) {
        return Err(vec![
            "node(s) didn't match Pod's node affinity/selector".into()
        ]);
    }
    let mut reasons = Vec::new();
    let free = |r: &str| {
        node.allocatable.get(r).copied().unwrap_or(0) - node.requested.get(r).copied().unwrap_or(0)
    };
    if free("pods") < 1000 {
        reasons.push("Too many pods".to_string());
    }
    for (r, amount) in req {
        if *amount > 0 && r != "pods" && free(r) < *amount {
            reasons.push(format!("Insufficient {r}"));
        }
    }
    if !reasons.is_empty() {
        return Err(reasons);
    }
    let share = |r: &str| {
        let alloc = node.allocatable.get(r).copied().unwrap_or(0);
        if alloc <= 0 {
            0.0
        } else {
            (free(r) - req.get(r).copied().unwrap_or(0)) as f64 / alloc as f64
        }
    };
    Ok((share("cpu") + share("memory")) / 2.0)
}

/// kube-scheduler's FitError text: "0/3 nodes are available: 1 node(s) were unschedulable,
/// 2 Insufficient nvidia.com/gpu."
fn fit_error(nodes: usize, histogram: &HashMap<String, usize>) -> String {
    if nodes == 0 {
        return "no nodes available to schedule pods".into();
    }
    let mut parts: Vec<String> = histogram.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    format!("0/{nodes} nodes are available: {}.", parts.join(", "))
}

fn is_ready(node: &Value) -> bool {
    node.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn is_pending_for_us(pod: &Value) -> bool {
    str_at(pod, "/spec/nodeName").is_empty()
        && str_at(pod, "/spec/schedulerName") == "default-scheduler"
        && matches!(str_at(pod, "/status/phase"), "Pending" | "")
        && pod.pointer("/metadata/deletionTimestamp").is_none()
}

/// One scheduling pass over every pending pod. Returns how many pods are still pending.
pub fn schedule_pass(store: &mut Store) -> usize {
    let mut pending: Vec<Value> = store
        .iter(PODS)
        .filter(|p| is_pending_for_us(p))
        .cloned()
        .collect();
    if pending.is_empty() {
        return 0;
    }
    let mut nodes: Vec<NodeInfo> = store
        .iter(NODES)
        .map(|n| NodeInfo {
            name: str_at(n, "/metadata/name").to_string(),
            allocatable: quantities(
                n.pointer("/status/allocatable")
                    .or_else(|| n.pointer("/status/capacity")),
            )
            .unwrap_or_default(),
            requested: Resources::new(),
            ready: is_ready(n),
            obj: n.clone(),
        })
        .collect();
    let index: HashMap<String, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.clone(), i))
        .collect();
    for pod in store.iter(PODS) {
        let node = str_at(pod, "/spec/nodeName");
        if node.is_empty() || terminal(pod) {
            continue;
        }
        if let Some(&i) = index.get(node) {
            let n = &mut nodes[i];
            for (k, v) in pod_requests(pod).unwrap_or_default() {
                *n.requested.entry(k).or_default() += v;
            }
            *n.requested.entry("pods".into()).or_default() += 1000;
        }
    }
    // kube-scheduler's queue: higher priority first, then older.
    pending.sort_by(|a, b| {
        let prio = |p: &Value| {
            p.pointer("/spec/priority")
                .and_then(Value::as_i64)
                .unwrap_or(0)
        };
        prio(b).cmp(&prio(a)).then_with(|| {
            str_at(a, "/metadata/creationTimestamp").cmp(str_at(b, "/metadata/creationTimestamp"))
        })
    });
    let mut still_pending = 0;
    for pod in pending {
        let ns = str_at(&pod, "/metadata/namespace").to_string();
        let name = str_at(&pod, "/metadata/name").to_string();
        let outcome = match pod_requests(&pod) {
            Err(e) => Err(format!("invalid resource requests: {e}")),
            Ok(req) => {
                let mut best: Option<(f64, usize)> = None;
                let mut histogram: HashMap<String, usize> = HashMap::new();
                for (i, n) in nodes.iter().enumerate() {
                    match evaluate(&pod, &req, n) {
                        Ok(score) => {
                            let better = match best {
                                None => true,
                                Some((s, j)) => score > s || (score == s && n.name < nodes[j].name),
                            };
                            if better {
                                best = Some((score, i));
                            }
                        }
                        Err(reasons) => {
                            for r in reasons {
                                *histogram.entry(r).or_default() += 1;
                            }
                        }
                    }
                }
                match best {
                    Some((_, i)) => Ok((i, req)),
                    None => Err(fit_error(nodes.len(), &histogram)),
                }
            }
        };
        match outcome {
            Ok((i, req)) => {
                let node = &mut nodes[i];
                let body = json!({"target": {"kind": "Node", "name": node.name}});
                if store.bind(&ns, &name, &body).is_ok() {
                    for (k, v) in req {
                        *node.requested.entry(k).or_default() += v;
                    }
                    *node.requested.entry("pods".into()).or_default() += 1000;
                }
            }
            Err(message) => {
                still_pending += 1;
                mark_unschedulable(store, &pod, &message);
            }
        }
    }
    still_pending
}

/// Sets `PodScheduled=False`/`Unschedulable` unless the pod already says exactly that.
fn mark_unschedulable(store: &mut Store, pod: &Value, message: &str) {
    let conds = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if conds.iter().any(|c| {
        c["type"] == "PodScheduled"
            && c["status"] == "False"
            && c["reason"] == "Unschedulable"
            && c["message"] == message
    }) {
        return;
    }
    let mut next = pod.clone();
    let mut conds: Vec<Value> = conds
        .into_iter()
        .filter(|c| c["type"] != "PodScheduled")
        .collect();
    conds.push(json!({
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": message, "lastProbeTime": null, "lastTransitionTime": now_timestamp(),
    }));
    next["status"]["conditions"] = json!(conds);
    let ns = str_at(pod, "/metadata/namespace").to_string();
    let name = str_at(pod, "/metadata/name").to_string();
    // The resourceVersion read above is a precondition; a conflict means a newer pod, which the
    // next pass sees.
    let _ = store.update(PODS, &ns, &name, next, true, false);
}

/// Runs scheduling passes whenever pods or nodes change, and every second while pods are pending.
pub async fn run(app: Arc<App>) {
    let mut rx = app.store().subscribe();
    loop {
        let pending = schedule_pass(&mut app.store());
        let wait = if pending > 0 {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(3600)
        };
        if !crate::store::wait_for_change(&mut rx, &[PODS, NODES], wait).await {
            return;
        }
        // Let a burst of changes settle into one pass.
        tokio::time::sleep(Duration::from_millis(20)).await;
        crate::store::drain(&mut rx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, labels: Value, alloc: Value, spec: Value) -> NodeInfo {
        let obj = json!({"metadata": {"name": name, "labels": labels}, "spec": spec,
            "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}});
        NodeInfo {
            name: name.into(),
            allocatable: quantities(obj.pointer("/status/allocatable")).unwrap(),
            requested: Resources::new(),
            ready: is_ready(&obj),
            obj,
        }
    }

    #[test]
    fn requests_sum_containers_and_max_init_containers() {
        let pod = json!({"spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": "1"}}},
                {"resources": {"requests": {"cpu": "1"}}}],
            "initContainers": [{"resources": {"requests": {"cpu": "2", "amd.com/gpu": 1}}}],
            "overhead": {"cpu": "100m"}}});
        let r = pod_requests(&pod).unwrap();
        assert_eq!(r["cpu"], 2100);
        assert_eq!(r["memory"], 1024 * 1024 * 1024 * 1000);
        assert_eq!(r["nvidia.com/gpu"], 1000);
        assert_eq!(r["amd.com/gpu"], 1000);
        assert!(pod_requests(
            &json!({"spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}})
        )
        .is_err());
    }

    #[test]
    fn sidecars_count_with_the_containers_and_before_later_init_containers() {
        let pod = json!({"spec": {
            "initContainers": [
                {"restartPolicy": "Always", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
                {"resources": {"requests": {"cpu": "2"}}}],
            "containers": [{"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]}});
        let r = pod_requests(&pod).unwrap();
        // The sidecar runs beside the app container (1.5 CPU, 2 Gi) and beside the later init
        // container (3 CPU): the larger wins per resource.
        assert_eq!(r["cpu"], 3000);
        assert_eq!(r["memory"], 2 * 1024 * 1024 * 1024 * 1000);
        // The same pod as the core reads it.
        let mut full = pod.clone();
        full["metadata"] = json!({"name": "p", "namespace": "default", "uid": "u"});
        let core = gpu_node_autoscaler_core::convert::Converter::new()
            .pod(full)
            .unwrap();
        assert_eq!(core.requests.cpu_milli as i128, r["cpu"]);
        assert_eq!(core.requests.memory as i128 * 1000, r["memory"]);
    }

    #[test]
    fn filters_in_kube_scheduler_order() {
        let alloc = json!({"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "1"});
        let gpu =
            json!({"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}});
        let n = node("a", json!({}), alloc.clone(), json!({}));
        let req = pod_requests(&gpu).unwrap();
        assert_eq!(
            evaluate(&gpu, &req, &n),
            Err(vec!["Insufficient nvidia.com/gpu".to_string()])
        );
        let tainted = node(
            "b",
            json!({}),
            alloc.clone(),
            json!({"unschedulable": true, "taints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]}),
        );
        assert_eq!(
            evaluate(&gpu, &req, &tainted),
            Err(vec!["node(s) were unschedulable".to_string()])
        );
        let tainted = node(
            "b",
            json!({}),
            alloc.clone(),
            json!({"taints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]}),
        );
        assert_eq!(
            evaluate(&gpu, &req, &tainted),
            Err(vec!["node(s) had untolerated taint {gpu: true}".to_string()])
        );
        let tolerant = json!({"spec": {"containers": [{}], "tolerations": [{"key": "gpu", "operator": "Exists"}]}});
        assert!(evaluate(&tolerant, &Resources::new(), &tainted).is_ok());
        let prefer = node(
            "c",
            json!({}),
            alloc.clone(),
            json!({"taints": [{"key": "x", "effect": "PreferNoSchedule"}]}),
        );
        assert!(evaluate(&tolerant, &Resources::new(), &prefer).is_ok());
    }

    #[test]
    fn node_affinity_operators() {
        let n = node(
            "n1",
            json!({"zone": "a", "gen": "5"}),
            json!({"pods": "110"}),
            json!({}),
        );
        let with = |expr: Value| json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [expr]}]}}}}});
        let cases = [
            (
                json!({"key": "zone", "operator": "In", "values": ["a", "b"]}),
                true,
            ),
            (
                json!({"key": "zone", "operator": "NotIn", "values": ["a"]}),
                false,
            ),
            (
                json!({"key": "other", "operator": "NotIn", "values": ["a"]}),
                true,
            ),
            (json!({"key": "zone", "operator": "Exists"}), true),
            (json!({"key": "zone", "operator": "DoesNotExist"}), false),
            (
                json!({"key": "gen", "operator": "Gt", "values": ["4"]}),
                true,
            ),
            (
                json!({"key": "gen", "operator": "Lt", "values": ["4"]}),
                false,
            ),
            (
                json!({"key": "zone", "operator": "Gt", "values": ["4"]}),
                false,
            ),
        ];
        for (expr, want) in cases {
            assert_eq!(
                affinity_matches(&with(expr.clone()), &n.obj),
                want,
                "{expr}"
            );
        }
        let by_name = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}});
        assert!(affinity_matches(&by_name, &n.obj), "terms are ORed");
        assert!(!affinity_matches(
            &json!({"spec": {"nodeSelector": {"zone": "b"}}}),
            &n.obj
        ));
        assert!(affinity_matches(
            &json!({"spec": {"nodeSelector": {"zone": "a"}}}),
            &n.obj
        ));
    }

    #[test]
    fn fit_error_message() {
        let h: HashMap<String, usize> = [
            ("Insufficient nvidia.com/gpu".to_string(), 2),
            ("node(s) were unschedulable".to_string(), 1),
        ]
        .into();
        assert_eq!(
            fit_error(3, &h),
            "0/3 nodes are available: 1 node(s) were unschedulable, 2 Insufficient nvidia.com/gpu."
        );
        assert_eq!(
            fit_error(0, &HashMap::new()),
            "no nodes available to schedule pods"
        );
    }
}
