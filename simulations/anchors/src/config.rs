//! Equivalent configuration for the three autoscalers, from one source: the scenario's policy and
//! catalog, with every duration divided by the time scale.

use std::collections::BTreeMap;
use std::time::Duration;

use gpu_node_autoscaler_core::model::labels::{self, GPU_MODEL};
use gpu_node_autoscaler_core::model::resources::NVIDIA_GPU;
use gpu_node_autoscaler_core::policy::{duration::parse_duration, Policy};
use gpu_node_autoscaler_core::yaml;
use gpu_node_autoscaler_provider::{CapacityType, Catalog};
use serde_json::{json, Value};

/// The policy keys whose values are durations (docs/policy.md).
const DURATION_KEYS: [&str; 17] = [
    "idle",
    "max",
    "maxNodeProvisionTime",
    "insufficientCapacityTtl",
    "gracePeriod",
    "missingGpusGracePeriod",
    "interval",
    "cooldownAfterScaleUp",
    "unneededTime",
    "emptyUnneededTime",
    "backoffAfterFailure",
    "spotMaxWait",
    "consolidateAfter",
    "restartCost",
    "expectedRemaining",
    "minRemaining",
    "xidGracePeriod",
];

/// A duration divided by the time scale, as a Go/policy duration string in milliseconds (at least
/// 1 ms for a non-zero one).
pub fn scaled(d: Duration, scale: f64) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    let ms = (d.as_secs_f64() * 1000.0 / scale).round().max(1.0);
    format!("{ms}ms")
}

/// A scaled duration in whole seconds, rounded up (Karpenter's `consolidateAfter` takes only
/// `s`, `m` and `h`).
pub fn scaled_whole_seconds(d: Duration, scale: f64) -> String {
    format!("{}s", (d.as_secs_f64() / scale).ceil() as u64)
}

/// kube-scheduler's `podInitialBackoffSeconds` and `podMaxBackoffSeconds` (1 s and 10 s by default)
/// divided by the time scale, in the whole seconds they take: at least 1 s each.
pub fn scheduler_backoff_s(scale: f64) -> (u32, u32) {
    let s = |d: f64| ((d / scale).round() as u32).max(1);
    (s(1.0), s(10.0))
}

pub fn scaled_duration(d: Duration, scale: f64) -> Duration {
    Duration::from_secs_f64(d.as_secs_f64() / scale)
}

fn scale_durations(v: &mut Value, scale: f64) {
    match v {
        Value::Object(m) => {
            for (k, val) in m.iter_mut() {
                if let (true, Some(s)) = (DURATION_KEYS.contains(&k.as_str()), val.as_str()) {
                    if let Ok(d) = parse_duration(s) {
                        *val = Value::String(scaled(d, scale));
                        continue;
                    }
                }
                scale_durations(val, scale);
            }
        }
        Value::Array(s) => s.iter_mut().for_each(|x| scale_durations(x, scale)),
        _ => {}
    }
}

fn map(v: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !v.is_object() {
        *v = Value::Object(Default::default());
    }
    v.as_object_mut().unwrap()
}

fn set(m: &mut serde_json::Map<String, Value>, key: &str, value: String) {
    m.insert(key.into(), Value::String(value));
}

/// Our policy: the scenario's `policy` section with every pool on the kwok provider, every
/// duration it sets scaled, and the defaults that matter to timing written out scaled.
pub fn our_policy(raw_policy: &Value, policy: &Policy, scale: f64) -> anyhow::Result<String> {
    let mut p = raw_policy.clone();
    scale_durations(&mut p, scale);
    let top = map(&mut p);
    let batching = map(top.entry("batching").or_insert(Value::Null));
    set(batching, "idle", scaled(policy.batching.idle, scale));
    set(batching, "max", scaled(policy.batching.max, scale));
    set(
        top,
        "maxNodeProvisionTime",
        scaled(policy.max_node_provision_time, scale),
    );
    set(
        top,
        "insufficientCapacityTtl",
        scaled(policy.insufficient_capacity_ttl, scale),
    );
    let pools = top
        .get_mut("pools")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| anyhow::anyhow!("the scenario's policy has no pools"))?;
    for (raw, pool) in pools.iter_mut().zip(&policy.pools) {
        let m = map(raw);
        set(m, "provider", "kwok".into());
        m.remove("aws");
        m.remove("alibaba");
        let sd = map(m.entry("scaleDown").or_insert(Value::Null));
        let s = &pool.scale_down;
        set(
            sd,
            "cooldownAfterScaleUp",
            scaled(s.cooldown_after_scale_up, scale),
        );
        set(sd, "unneededTime", scaled(s.unneeded_time, scale));
        set(
            sd,
            "emptyUnneededTime",
            scaled(s.empty_unneeded_time, scale),
        );
        set(
            sd,
            "backoffAfterFailure",
            scaled(s.backoff_after_failure, scale),
        );
    }
    Ok(yaml::to_string(&p)?)
}

/// Karpenter's kwok instance types (`INSTANCE_TYPES_FILE_PATH`, the schema of
/// `kwok/cloudprovider/helpers.go`): every instance type of the pools, with one offering per zone
/// and capacity type at the catalog's price.
pub fn karpenter_instance_types(policy: &Policy, catalog: &Catalog) -> anyhow::Result<Value> {
    let mut out = Vec::new();
    // Instance type → the pool that defined it and its resources: the file is global, so two
    // pools may share a type only if their Nodes of it offer the same (not whole GPUs in one and
    // MIG slices in the other).
    let mut seen: BTreeMap<String, (String, Value)> = BTreeMap::new();
    for pool in &policy.pools {
        for t in pool_types(pool, catalog) {
            let Some(it) = catalog.instance_type(&t) else {
                continue;
            };
            let resources = node_resources(pool, it)?;
            if let Some((other, r)) = seen.get(&t) {
                if *r != resources {
                    anyhow::bail!(
                        "pools {other} and {} both launch {t} but offer different GPU resources \
                         ({r} and {resources}): Karpenter's kwok instance types are one per type",
                        pool.name
                    );
                }
                continue;
            }
            seen.insert(t.clone(), (pool.name.clone(), resources.clone()));
            let offerings: Vec<Value> = catalog
                .offerings
                .iter()
                .filter(|o| o.key.instance_type == t)
                .map(|o| {
                    let mut requirements = vec![
                        json!({"key": "karpenter.sh/capacity-type", "operator": "In",
                               "values": [o.key.capacity_type.as_str()]}),
                        json!({"key": "topology.kubernetes.io/zone", "operator": "In",
                               "values": [o.key.zone]}),
                    ];
                    // The GPU model label that pods select and our registration applies: the
                    // kwok provider makes every offering requirement key a well-known label and
                    // puts a single-valued one on the Node, so Karpenter launches the right type
                    // for such pods and labels its Node as we label ours.
                    if let Some(g) = &it.gpu {
                        requirements.push(json!({"key": GPU_MODEL, "operator": "In",
                                                 "values": [g.model]}));
                    }
                    json!({
                        "Price": o.price_per_hour,
                        "Available": true,
                        "Requirements": requirements,
                    })
                })
                .collect();
            out.push(json!({
                "name": t,
                "architecture": "amd64",
                "operatingSystems": ["linux"],
                "resources": resources,
                "offerings": offerings,
            }));
        }
    }
    Ok(Value::Array(out))
}

/// A pool's node's capacity of an instance type (Karpenter's instance-type resources, the Cluster
/// Autoscaler's template Node): CPU, memory, pods and its GPUs as the pool offers them (whole,
/// MIG slices or shared, as our kwok provider's Nodes advertise them: one source,
/// `advertised_gpu_resources`).
fn node_resources(
    pool: &gpu_node_autoscaler_core::policy::Pool,
    it: &gpu_node_autoscaler_provider::InstanceType,
) -> anyhow::Result<Value> {
    let mut r = json!({
        "cpu": it.vcpu.to_string(),
        "memory": format!("{}Mi", it.memory_mib),
        "pods": "110",
    });
    let gpus = gpu_node_autoscaler_core::plan::templates::advertised_gpu_resources(pool, it)
        .map_err(|e| anyhow::anyhow!(e))?;
    for (k, v) in gpus {
        r[k] = json!(v.to_string());
    }
    Ok(r)
}

/// Whether a pool's Nodes advertise whole NVIDIA GPUs through the device plugin
/// (`nvidia.com/gpu`), the resource the two products' GPU handling knows.
fn advertises_whole_gpus(resources: &Value) -> bool {
    resources.get(NVIDIA_GPU).is_some()
}

/// A pool's taints as Node/NodePool taints.
fn taints_json(pool: &gpu_node_autoscaler_core::policy::Pool) -> Vec<Value> {
    pool.taints
        .iter()
        .map(|t| json!({"key": t.key, "value": t.value, "effect": t.effect.as_str()}))
        .collect()
}

/// The instance types a pool may launch.
pub fn pool_types(pool: &gpu_node_autoscaler_core::policy::Pool, catalog: &Catalog) -> Vec<String> {
    gpu_node_autoscaler_core::plan::templates::pool_types_and_prices(pool, catalog)
        .map(|x| x.0)
        .unwrap_or_default()
}

/// Karpenter's objects: a KWOKNodeClass and one NodePool per pool with the pool's instance types,
/// zones, capacity types, labels and taints; consolidation as Karpenter v1's default
/// (WhenEmptyOrUnderutilized) after the pool's unneeded time; the GPU limit from `maxGpus`, else
/// `maxNodes` of the pool's largest type.
pub fn karpenter_objects(policy: &Policy, catalog: &Catalog, scale: f64) -> anyhow::Result<Value> {
    let mut items = vec![json!({
        "apiVersion": "karpenter.kwok.sh/v1alpha1",
        "kind": "KWOKNodeClass",
        "metadata": {"name": "default"},
    })];
    for pool in &policy.pools {
        let types = pool_types(pool, catalog);
        let mut labels: BTreeMap<String, String> = pool.labels.clone();
        labels.insert(
            gpu_node_autoscaler_core::model::labels::POOL.to_string(),
            pool.name.clone(),
        );
        let taints = taints_json(pool);
        let caps: Vec<&str> = pool.capacity_types.iter().map(|c| c.as_str()).collect();
        let max_gpus_per_node = types
            .iter()
            .filter_map(|t| catalog.instance_type(t)?.gpu.as_ref().map(|g| g.count))
            .max()
            .unwrap_or(0);
        let gpu_limit = pool
            .max_gpus
            .unwrap_or(pool.max_nodes.saturating_mul(max_gpus_per_node));
        // Whether the pool's Nodes count against an `nvidia.com/gpu` limit at all (MIG slices,
        // shared GPUs and DRA devices are other resources).
        let mut whole = true;
        for t in &types {
            if let Some(it) = catalog.instance_type(t) {
                whole &= it.gpu.is_none() || advertises_whole_gpus(&node_resources(pool, it)?);
            }
        }
        let mut spec = json!({
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"},
                    "requirements": [
                        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": types},
                        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": pool.zones},
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": caps},
                    ],
                    "taints": taints,
                    "expireAfter": "Never",
                },
            },
            "disruption": {
                "consolidationPolicy": "WhenEmptyOrUnderutilized",
                "consolidateAfter": scaled_whole_seconds(pool.scale_down.unneeded_time, scale),
            },
        });
        if !whole {
            // Karpenter's node-count limit (v1.14 `limits.nodes`): the pool's `maxNodes`.
            spec["limits"] = json!({"nodes": pool.max_nodes.to_string()});
        } else if gpu_limit > 0 {
            spec["limits"] = json!({NVIDIA_GPU: gpu_limit.to_string()});
        }
        items.push(json!({
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodePool",
            "metadata": {"name": pool.name},
            "spec": spec,
        }));
    }
    Ok(json!({"apiVersion": "v1", "kind": "List", "items": items}))
}

/// The Cluster Autoscaler's kwok provider: its configuration and node templates (two ConfigMaps in
/// the namespace it runs in) and its flags.
pub struct ClusterAutoscalerSetup {
    /// A List of the two ConfigMaps, `kwok-provider-config` and `kwok-provider-templates`.
    pub objects: Value,
    /// Its flags after `--kubeconfig`, `--address` and the like that belong to the run.
    pub args: Vec<String>,
}

/// The name of the node group of one offering: the template Node's annotation, and the prefix of
/// the names of the Nodes the Cluster Autoscaler creates in it.
pub fn ca_node_group(pool: &str, instance_type: &str, zone: &str, ct: CapacityType) -> String {
    format!("{pool}-{instance_type}-{zone}-{}", ct.as_str())
        .to_ascii_lowercase()
        .replace(['.', '_'], "-")
}

/// The Cluster Autoscaler as its users run it on a pool: one node group per instance type × zone ×
/// capacity type of each pool (an auto-scaling group each), sized 0 to the pool's `maxNodes`, its
/// template Node with the labels and taints our registration gives such a Node; the GPU label is
/// our GPU model label, so that a GPU node without GPUs yet counts as unready as with the real GPU
/// labels. Its kwok provider has no prices, so the expanders are `priority,least-waste`: the
/// priority expander ranks a pool's groups by its capacity types' order (spot groups before
/// on-demand ones, as AWS's guidance sets it up for mixed spot and on-demand node groups; a spot
/// group that fails is backed off and the on-demand group gets the next scale-up), least waste
/// among equals. The pool's scale-down times become the global flags (the smallest where pools
/// differ: the kwok provider has no per-group options), and every duration is scaled.
pub fn cluster_autoscaler(
    policy: &Policy,
    catalog: &Catalog,
    scale: f64,
) -> anyhow::Result<ClusterAutoscalerSetup> {
    let mut templates = Vec::new();
    let mut gpu_types = serde_json::Map::new();
    // Priority → the node groups at it (a higher number is tried first).
    let mut priorities: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for pool in &policy.pools {
        for t in pool_types(pool, catalog) {
            let Some(it) = catalog.instance_type(&t) else {
                continue;
            };
            let capacity = node_resources(pool, it)?;
            // The GPU label only on Nodes with whole GPUs: the Cluster Autoscaler counts a Node
            // with its GPU label and no `nvidia.com/gpu` as not ready (its GPUs not advertised
            // yet), which a MIG or shared-GPU Node would stay for good; and it measures a GPU
            // Node's utilization by `nvidia.com/gpu` alone. A user of MIG or shared GPUs leaves
            // the label off those node groups, and their Nodes are measured by CPU and memory.
            let gpu_label = it.gpu.as_ref().filter(|_| advertises_whole_gpus(&capacity));
            if let Some(g) = gpu_label {
                gpu_types.insert(g.model.clone(), json!({}));
            }
            for o in catalog
                .offerings
                .iter()
                .filter(|o| o.key.instance_type == t)
            {
                if !pool.zones.contains(&o.key.zone)
                    || !pool.capacity_types.contains(&o.key.capacity_type)
                {
                    continue;
                }
                let ng = ca_node_group(&pool.name, &t, &o.key.zone, o.key.capacity_type);
                let rank = pool
                    .capacity_types
                    .iter()
                    .position(|c| *c == o.key.capacity_type)
                    .unwrap_or(0);
                priorities
                    .entry(10 * (pool.capacity_types.len() - rank))
                    .or_default()
                    .push(format!("^{ng}$"));
                let mut labels: BTreeMap<String, String> = pool.labels.clone();
                for (k, v) in [
                    (labels::POOL, pool.name.as_str()),
                    (labels::CAPACITY_TYPE, o.key.capacity_type.as_str()),
                    (labels::INSTANCE_TYPE, t.as_str()),
                    (labels::ZONE, o.key.zone.as_str()),
                    (labels::ARCH, "amd64"),
                    (labels::OS, "linux"),
                ] {
                    labels.insert(k.to_string(), v.to_string());
                }
                if let Some(g) = gpu_label {
                    labels.insert(GPU_MODEL.to_string(), g.model.clone());
                }
                // A Node its kwok provider creates is there at once, not when a kubelet has
                // booted and registered it. A kubelet registers NotReady, with the not-ready
                // taint; the template says the same (the Cluster Autoscaler leaves condition
                // taints out of what it simulates). The condition matters as much as the taint:
                // on a Node with no Ready condition the node lifecycle controller takes the taint
                // off at once, and the scheduler bound pods to it before its boot time (until
                // 2026-11-26, with the taint alone).
                let mut taints = taints_json(pool);
                taints.push(json!({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}));
                templates.push(json!({
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": ng,
                        "labels": labels,
                        "annotations": {
                            "cluster-autoscaler.kwok.nodegroup/name": ng,
                            "cluster-autoscaler.kwok.nodegroup/min-count": "0",
                            "cluster-autoscaler.kwok.nodegroup/max-count": pool.max_nodes.to_string(),
                        },
                    },
                    "spec": {"taints": taints},
                    // kwok's `node-initialize` Stage makes it Ready after its boot time.
                    "status": {
                        "capacity": capacity,
                        "allocatable": capacity,
                        "conditions": [{
                            "type": "Ready",
                            "status": "False",
                            "reason": "KubeletNotReady",
                            "message": "booting",
                        }],
                    },
                }));
            }
        }
    }
    if templates.is_empty() {
        anyhow::bail!("no pool of the policy has an offering in the catalog: no node group for the Cluster Autoscaler");
    }
    let config = json!({
        "apiVersion": "v1alpha1",
        "readNodesFrom": "configmap",
        "nodegroups": {"fromNodeAnnotationKey": "cluster-autoscaler.kwok.nodegroup/name"},
        // Our templates carry the pools' own taints; the provider's extra taint would keep
        // every workload pod off its Nodes.
        "nodes": {"skipTaint": true, "gpuConfig": {"gpuLabelKey": GPU_MODEL, "availableGPUTypes": gpu_types}},
        "configmap": {"name": "kwok-provider-templates"},
    });
    let templates = json!({"apiVersion": "v1", "kind": "List", "items": templates});
    let cm = |name: &str, key: &str, data: String| {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "kube-system"},
            "data": {key: data},
        })
    };
    // The priority expander's ConfigMap: `priorities` is YAML, priority → regexes of group names.
    let ranks = yaml::to_string(&priorities)?;
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        cm("kwok-provider-config", "config", config.to_string()),
        cm("kwok-provider-templates", "templates", templates.to_string()),
        cm("cluster-autoscaler-priority-expander", "priorities", ranks),
    ]});
    let smallest = |f: fn(&gpu_node_autoscaler_core::policy::Pool) -> Duration| {
        policy.pools.iter().map(f).min().unwrap_or_default()
    };
    let unneeded = smallest(|p| p.scale_down.unneeded_time);
    let after_add = smallest(|p| p.scale_down.cooldown_after_scale_up);
    let after_failure = smallest(|p| p.scale_down.backoff_after_failure);
    let threshold = policy
        .pools
        .iter()
        .map(|p| p.scale_down.utilization_threshold)
        .fold(f64::NAN, f64::min);
    let minutes = |m: u64| Duration::from_secs(m * 60);
    let mut args: Vec<String> = vec![
        "--cloud-provider=kwok".into(),
        "--namespace=kube-system".into(),
        "--leader-elect=false".into(),
        "--expander=priority,least-waste".into(),
        format!("--scan-interval={}", scaled(Duration::from_secs(10), scale)),
        format!("--scale-down-unneeded-time={}", scaled(unneeded, scale)),
        format!("--scale-down-delay-after-add={}", scaled(after_add, scale)),
        format!(
            "--scale-down-delay-after-failure={}",
            scaled(after_failure, scale)
        ),
        format!(
            "--max-node-provision-time={}",
            scaled(policy.max_node_provision_time, scale)
        ),
        // The Cluster Autoscaler's own defaults, scaled like everything else.
        format!("--max-node-startup-time={}", scaled(minutes(15), scale)),
        format!("--scale-down-unready-time={}", scaled(minutes(20), scale)),
        format!(
            "--unremovable-node-recheck-timeout={}",
            scaled(minutes(5), scale)
        ),
        format!(
            "--node-deletion-delay-timeout={}",
            scaled(minutes(2), scale)
        ),
    ];
    if threshold.is_finite() {
        args.push(format!(
            "--scale-down-gpu-utilization-threshold={threshold}"
        ));
    }
    if let Some(n) = policy.limits.max_nodes {
        // The system node outside every node group counts too.
        args.push(format!("--max-nodes-total={}", n + 1));
    }
    Ok(ClusterAutoscalerSetup { objects, args })
}

/// The price per hour of a Node of `instance_type` bought as `capacity_type` (any zone: the
/// catalog's list prices do not vary by zone).
pub fn price(catalog: &Catalog, instance_type: &str, capacity_type: CapacityType) -> Option<f64> {
    catalog
        .offerings
        .iter()
        .find(|o| o.key.instance_type == instance_type && o.key.capacity_type == capacity_type)
        .map(|o| o.price_per_hour)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_backoff_is_scaled_to_whole_seconds() {
        assert_eq!(scheduler_backoff_s(1.0), (1, 10));
        assert_eq!(scheduler_backoff_s(4.0), (1, 3));
        assert_eq!(scheduler_backoff_s(20.0), (1, 1));
    }

    #[test]
    fn karpenter_offerings_carry_the_gpu_model_label() {
        use gpu_node_autoscaler_core::catalog::{
            offerings_from_list_prices, parse_csv, BUILTIN_AWS,
        };
        let policy = gpu_node_autoscaler_core::policy::parse_policy(
            "pools:\n- name: a100\n  instanceTypes: [p4d.24xlarge]\n  zones: [us-east-1a]\n  capacityTypes: [spot]\n  maxNodes: 2\n",
            "p.yaml",
        )
        .unwrap();
        let catalog =
            offerings_from_list_prices(&policy, parse_csv(BUILTIN_AWS, "builtin").unwrap());
        let types = karpenter_instance_types(&policy, &catalog).unwrap();
        let reqs = &types[0]["offerings"][0]["Requirements"];
        let model = reqs
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == GPU_MODEL)
            .expect("a GPU model requirement");
        assert_eq!(model["values"], json!(["A100"]));
    }

    /// MIG and shared-GPU pools: the two products' nodes offer what ours do (the MIG profiles,
    /// the shared GPUs' memory, count and cores), Karpenter's pool is limited by its node count
    /// and the Cluster Autoscaler's node groups carry no GPU label.
    #[test]
    fn mig_and_shared_pools_offer_the_same_gpus_to_all_three() {
        use gpu_node_autoscaler_core::catalog::{
            offerings_from_list_prices, parse_csv, BUILTIN_AWS,
        };
        let policy = gpu_node_autoscaler_core::policy::parse_policy(
            "zones: [us-east-1a]\npools:\n- name: mig\n  instanceTypes: [p4d.24xlarge]\n  capacityTypes: [on-demand]\n  maxNodes: 3\n  gpuMode: mig\n  migLayout: {2g.10gb: 3, 1g.5gb: 1}\n- name: t4\n  instanceTypes: [g4dn.xlarge]\n  capacityTypes: [spot]\n  maxNodes: 5\n  gpuMode: shared\n- name: a10g\n  instanceTypes: [g5.xlarge]\n  capacityTypes: [spot]\n  maxNodes: 4\n",
            "p.yaml",
        )
        .unwrap();
        let catalog =
            offerings_from_list_prices(&policy, parse_csv(BUILTIN_AWS, "builtin").unwrap());
        let types = karpenter_instance_types(&policy, &catalog).unwrap();
        let resources = |t: &str| {
            types
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["name"] == t)
                .unwrap()["resources"]
                .clone()
        };
        let p4d = resources("p4d.24xlarge");
        assert_eq!(p4d["nvidia.com/mig-2g.10gb"], "24");
        assert_eq!(p4d["nvidia.com/mig-1g.5gb"], "8");
        assert!(p4d.get(NVIDIA_GPU).is_none(), "{p4d}");
        let t4 = resources("g4dn.xlarge");
        assert_eq!(t4["aliyun.com/gpu-mem"], "15");
        assert_eq!(t4["aliyun.com/gpu-count"], "1");
        assert_eq!(t4["aliyun.com/gpu-core.percentage"], "100");
        assert_eq!(resources("g5.xlarge")[NVIDIA_GPU], "1");

        let objects = karpenter_objects(&policy, &catalog, 10.0).unwrap();
        let limits = |pool: &str| {
            objects["items"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["metadata"]["name"] == pool)
                .unwrap()["spec"]["limits"]
                .clone()
        };
        assert_eq!(limits("mig"), json!({"nodes": "3"}));
        assert_eq!(limits("t4"), json!({"nodes": "5"}));
        assert_eq!(limits("a10g"), json!({NVIDIA_GPU: "4"}));

        let ca = cluster_autoscaler(&policy, &catalog, 10.0).unwrap();
        let templates: Value = serde_json::from_str(
            ca.objects["items"][1]["data"]["templates"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        for n in templates["items"].as_array().unwrap() {
            let pool = n["metadata"]["labels"][labels::POOL].as_str().unwrap();
            let t = n["metadata"]["labels"][labels::INSTANCE_TYPE]
                .as_str()
                .unwrap();
            assert_eq!(n["status"]["capacity"], resources(t), "{pool}");
            let labelled = n["metadata"]["labels"].get(GPU_MODEL).is_some();
            assert_eq!(labelled, pool == "a10g", "{pool}: {n}");
        }

        // One instance type in two pools that offer it differently cannot be one Karpenter type.
        let two = gpu_node_autoscaler_core::policy::parse_policy(
            "zones: [us-east-1a]\npools:\n- name: mig\n  instanceTypes: [p4d.24xlarge]\n  maxNodes: 1\n  gpuMode: mig\n  migLayout: {1g.5gb: 7}\n- name: whole\n  instanceTypes: [p4d.24xlarge]\n  maxNodes: 1\n",
            "p.yaml",
        )
        .unwrap();
        let catalog = offerings_from_list_prices(&two, parse_csv(BUILTIN_AWS, "builtin").unwrap());
        let e = karpenter_instance_types(&two, &catalog)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("pools mig and whole both launch p4d.24xlarge"),
            "{e}"
        );
    }

    #[test]
    fn cluster_autoscaler_has_a_node_group_per_offering_of_the_pool() {
        use gpu_node_autoscaler_core::catalog::{
            offerings_from_list_prices, parse_csv, BUILTIN_AWS,
        };
        let policy = gpu_node_autoscaler_core::policy::parse_policy(
            "zones: [us-east-1a, us-east-1b]\npools:\n- name: a10g\n  instanceTypes: [g5.xlarge, g5.12xlarge]\n  capacityTypes: [spot]\n  maxNodes: 3\n  scaleDown: {unneededTime: 2m}\n",
            "p.yaml",
        )
        .unwrap();
        let catalog =
            offerings_from_list_prices(&policy, parse_csv(BUILTIN_AWS, "builtin").unwrap());
        let ca = cluster_autoscaler(&policy, &catalog, 4.0).unwrap();
        let templates: Value = serde_json::from_str(
            ca.objects["items"][1]["data"]["templates"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        let groups: Vec<&str> = templates["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                n["metadata"]["annotations"]["cluster-autoscaler.kwok.nodegroup/name"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(groups.len(), 4, "2 types x 2 zones x spot: {groups:?}");
        assert!(
            groups.contains(&"a10g-g5-12xlarge-us-east-1b-spot"),
            "{groups:?}"
        );
        let node = templates["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["metadata"]["name"] == "a10g-g5-12xlarge-us-east-1b-spot")
            .unwrap();
        assert_eq!(node["metadata"]["labels"][GPU_MODEL], "A10G");
        assert_eq!(node["metadata"]["labels"][labels::CAPACITY_TYPE], "spot");
        assert_eq!(node["status"]["allocatable"]["nvidia.com/gpu"], "4");
        // A Node it creates takes no pod before it is Ready (its boot time).
        assert_eq!(
            node["spec"]["taints"],
            json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}])
        );
        assert_eq!(node["status"]["conditions"][0]["type"], "Ready");
        assert_eq!(node["status"]["conditions"][0]["status"], "False");
        assert_eq!(
            node["metadata"]["annotations"]["cluster-autoscaler.kwok.nodegroup/max-count"],
            "3"
        );
        assert!(
            ca.args
                .contains(&"--scale-down-unneeded-time=30000ms".to_string()),
            "{:?}",
            ca.args
        );
        let config: Value =
            serde_json::from_str(ca.objects["items"][0]["data"]["config"].as_str().unwrap())
                .unwrap();
        assert_eq!(config["nodes"]["gpuConfig"]["gpuLabelKey"], GPU_MODEL);
        assert!(ca
            .args
            .contains(&"--expander=priority,least-waste".to_string()));
    }

    #[test]
    fn the_cluster_autoscaler_tries_a_pools_spot_groups_before_its_on_demand_ones() {
        use gpu_node_autoscaler_core::catalog::{
            offerings_from_list_prices, parse_csv, BUILTIN_AWS,
        };
        let policy = gpu_node_autoscaler_core::policy::parse_policy(
            "zones: [us-east-1a]\npools:\n- name: a10g\n  instanceTypes: [g5.xlarge]\n  capacityTypes: [spot, on-demand]\n  maxNodes: 3\n",
            "p.yaml",
        )
        .unwrap();
        let catalog =
            offerings_from_list_prices(&policy, parse_csv(BUILTIN_AWS, "builtin").unwrap());
        let ca = cluster_autoscaler(&policy, &catalog, 4.0).unwrap();
        let cm = &ca.objects["items"][2];
        assert_eq!(
            cm["metadata"]["name"],
            "cluster-autoscaler-priority-expander"
        );
        assert_eq!(cm["metadata"]["namespace"], "kube-system");
        let ranks = yaml::parse(cm["data"]["priorities"].as_str().unwrap()).unwrap();
        assert_eq!(
            ranks,
            json!({"20": ["^a10g-g5-xlarge-us-east-1a-spot$"], "10": ["^a10g-g5-xlarge-us-east-1a-on-demand$"]})
        );
    }

    #[test]
    fn durations_are_scaled_and_quantities_left_alone() {
        let mut v = yaml::parse(
            "batching: {idle: 2s}\npools:\n- name: a\n  reserved: {cpu: 500m}\n  scaleDown: {unneededTime: 3m}\n",
        )
        .unwrap();
        scale_durations(&mut v, 60.0);
        assert_eq!(v["batching"]["idle"].as_str(), Some("33ms"));
        assert_eq!(
            v["pools"][0]["scaleDown"]["unneededTime"].as_str(),
            Some("3000ms")
        );
        assert_eq!(v["pools"][0]["reserved"]["cpu"].as_str(), Some("500m"));
    }
}
