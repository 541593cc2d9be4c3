//! The cloud bridge to an EC2 endpoint (real EC2 or `moto_server`): the cluster's instances
//! become Nodes, and Nodes go away when their instances do.
//!
//! Every poll lists the instances tagged `gpu-node-autoscaler.io/cluster=<cluster>` in state
//! `pending` or `running`. An instance becomes a Node `boot_delay` after kube-sim first saw it;
//! its GPUs appear in the Node's capacity and allocatable `device_plugin_delay` after that, as
//! with a device plugin starting. A Node deleted by a client while its instance lives is not
//! registered again (a real kubelet would re-register; kube-sim does not simulate that).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use aws_config::{BehaviorVersion, Region};
use aws_sdk_ec2::error::DisplayErrorContext;
use aws_sdk_ec2::types::{Filter, Instance, InstanceLifecycleType, InstanceType};
use aws_sdk_ec2::Client;
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::resources::{NODES, PODS};
use crate::server::App;
use crate::store::{now_timestamp, Store};

/// The tags the bridge reads.
pub const TAG_CLUSTER: &str = "gpu-node-autoscaler.io/cluster";
pub const TAG_POOL: &str = "gpu-node-autoscaler.io/pool";
pub const TAG_LAUNCH_ID: &str = "gpu-node-autoscaler.io/launch-id";
/// Cluster Autoscaler's node-template tags: `.../label/<key>` = value, `.../taint/<key>` =
/// `<value>:<Effect>`.
pub const TAG_TEMPLATE_LABEL: &str = "k8s.io/cluster-autoscaler/node-template/label/";
pub const TAG_TEMPLATE_TAINT: &str = "k8s.io/cluster-autoscaler/node-template/taint/";

/// Where the bridge finds EC2 and which instances are the cluster's.
#[derive(Debug, Clone)]
pub struct Ec2Config {
    /// The endpoint URL, e.g. `http://127.0.0.1:5000`.
    pub endpoint: String,
    pub region: String,
    /// The value of the `gpu-node-autoscaler.io/cluster` tag.
    pub cluster_name: String,
    /// How long after kube-sim first sees an instance its Node registers.
    pub boot_delay: Duration,
    /// How long after the Node registers its GPUs are advertised.
    pub device_plugin_delay: Duration,
    /// How often instances are listed.
    pub poll: Duration,
}

impl Ec2Config {
    pub fn new(endpoint: &str, region: &str, cluster_name: &str) -> Self {
        Ec2Config {
            endpoint: endpoint.to_string(),
            region: region.to_string(),
            cluster_name: cluster_name.to_string(),
            boot_delay: Duration::from_secs(3),
            device_plugin_delay: Duration::from_secs(2),
            poll: Duration::from_secs(1),
        }
    }
}

/// What an instance type offers a Node.
#[derive(Debug, Clone)]
struct TypeInfo {
    vcpus: i64,
    memory_mib: i64,
    /// (`nvidia.com/gpu` or `amd.com/gpu`, count)
    gpus: Option<(&'static str, i64)>,
    /// The `nvidia.com/gpu.product` label of NVIDIA GPUs.
    product: Option<String>,
}

/// The `nvidia.com/gpu.product` value GPU feature discovery reports for an EC2 GPU model name
/// and per-GPU memory (as the controller predicts it for its node templates).
pub fn nvidia_product(model: &str, memory_mib: i64) -> String {
    let gib = (memory_mib + 1023) / 1024;
    match model {
        "T4" => "Tesla-T4".into(),
        "V100" if gib > 16 => "Tesla-V100-SXM2-32GB".into(),
        "V100" => "Tesla-V100-SXM2-16GB".into(),
        "K80" => "Tesla-K80".into(),
        "M60" => "Tesla-M60".into(),
        "A100" if gib > 40 => "NVIDIA-A100-SXM4-80GB".into(),
        "A100" => "NVIDIA-A100-SXM4-40GB".into(),
        "H100" => "NVIDIA-H100-80GB-HBM3".into(),
        other => format!("NVIDIA-{}", other.replace(' ', "-")),
    }
}

/// One instance as the bridge needs it.
#[derive(Debug, Clone)]
pub struct InstanceView {
    pub id: String,
    pub instance_type: String,
    pub zone: String,
    pub private_dns: String,
    pub private_ip: String,
    pub spot: bool,
    pub tags: BTreeMap<String, String>,
}

impl InstanceView {
    fn from_sdk(i: &Instance) -> Option<Self> {
        Some(InstanceView {
            id: i.instance_id()?.to_string(),
            instance_type: i.instance_type().map(|t| t.as_str().to_string())?,
            zone: i
                .placement()
                .and_then(|p| p.availability_zone())
                .unwrap_or("")
                .to_string(),
            private_dns: i.private_dns_name().unwrap_or("").to_string(),
            private_ip: i.private_ip_address().unwrap_or("").to_string(),
            spot: i.instance_lifecycle() == Some(&InstanceLifecycleType::Spot),
            tags: i
                .tags()
                .iter()
                .filter_map(|t| Some((t.key()?.to_string(), t.value().unwrap_or("").to_string())))
                .collect(),
        })
    }

    /// The Node name: the private DNS name, else one made from the private IP, else the id.
    pub fn node_name(&self, region: &str) -> String {
        if !self.private_dns.is_empty() {
            return self.private_dns.clone();
        }
        if !self.private_ip.is_empty() {
            let domain = if region == "us-east-1" {
                "ec2.internal".to_string()
            } else {
                format!("{region}.compute.internal")
            };
            return format!("ip-{}.{domain}", self.private_ip.replace('.', "-"));
        }
        self.id.clone()
    }
}

/// The Node for `inst` (GPUs left out until the device plugin starts, unless `with_gpus`).
/// Malformed node-template taint tags are reported in the error list and left out.
fn node_object(
    inst: &InstanceView,
    info: &TypeInfo,
    region: &str,
    with_gpus: bool,
) -> (Value, Vec<String>) {
    let name = inst.node_name(region);
    let mut problems = Vec::new();
    let mut labels = Map::new();
    let mut taints = Vec::new();
    for (k, v) in &inst.tags {
        if let Some(key) = k.strip_prefix(TAG_TEMPLATE_LABEL) {
            labels.insert(key.to_string(), json!(v));
        } else if let Some(key) = k.strip_prefix(TAG_TEMPLATE_TAINT) {
            match v.rsplit_once(':') {
                Some((value, effect))
                    if matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") =>
                {
                    taints.push(json!({"key": key, "value": value, "effect": effect}));
                }
                _ => problems.push(format!(
                    "tag {k}={v:?}: a node-template taint must be <value>:<NoSchedule|PreferNoSchedule|NoExecute>"
                )),
            }
        }
    }
    let capacity_type = if inst.spot { "spot" } else { "on-demand" };
    let region_label = inst
        .zone
        .get(..inst.zone.len().saturating_sub(1))
        .filter(|r| !r.is_empty())
        .unwrap_or(region);
    for (k, v) in [
        (
            "node.kubernetes.io/instance-type",
            inst.instance_type.as_str(),
        ),
        ("topology.kubernetes.io/zone", inst.zone.as_str()),
        ("topology.kubernetes.io/region", region_label),
        ("kubernetes.io/hostname", name.as_str()),
        ("kubernetes.io/arch", "amd64"),
        ("kubernetes.io/os", "linux"),
        ("karpenter.sh/capacity-type", capacity_type),
        ("gpu-node-autoscaler.io/capacity-type", capacity_type),
    ] {
        labels.insert(k.to_string(), json!(v));
    }
    for tag in [TAG_POOL, TAG_LAUNCH_ID] {
        if let Some(v) = inst.tags.get(tag) {
            labels.insert(tag.to_string(), json!(v));
        }
    }
    if let Some(p) = &info.product {
        labels.insert("nvidia.com/gpu.product".into(), json!(p));
    }
    let mut capacity = Map::new();
    capacity.insert("cpu".into(), json!(info.vcpus.to_string()));
    capacity.insert("memory".into(), json!(format!("{}Mi", info.memory_mib)));
    capacity.insert("pods".into(), json!("110"));
    if let (true, Some((resource, n))) = (with_gpus, info.gpus) {
        capacity.insert(resource.into(), json!(n.to_string()));
    }
    let now = now_timestamp();
    let mut addresses = Vec::new();
    if !inst.private_ip.is_empty() {
        addresses.push(json!({"type": "InternalIP", "address": inst.private_ip}));
    }
    addresses.push(json!({"type": "Hostname", "address": name}));
    if !inst.private_dns.is_empty() {
        addresses.push(json!({"type": "InternalDNS", "address": inst.private_dns}));
    }
    let mut spec = json!({"providerID": format!("aws:///{}/{}", inst.zone, inst.id)});
    if !taints.is_empty() {
        spec["taints"] = json!(taints);
    }
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {
            "capacity": capacity, "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                "lastTransitionTime": now}],
            "addresses": addresses,
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                "kubeletVersion": "v1.32.0-kube-sim", "kubeProxyVersion": "v1.32.0-kube-sim",
                "containerRuntimeVersion": "containerd://1.7.0", "osImage": "kube-sim",
                "kernelVersion": "", "machineID": inst.id, "systemUUID": inst.id, "bootID": inst.id},
        },
    });
    (node, problems)
}

/// A Node the bridge registered for an instance.
#[derive(Debug)]
struct Registered {
    name: String,
    uid: String,
    at: Instant,
    gpus_advertised: bool,
    /// A client deleted it (or replaced it): the bridge leaves it alone from then on.
    gone: bool,
}

#[derive(Debug)]
struct Tracked {
    first_seen: Instant,
    node: Option<Registered>,
    /// The last registration error logged, so that each is logged once.
    last_error: Option<String>,
}

/// Deletes the Node `name` if it still has `uid`, and every pod bound to it.
pub fn delete_node_and_pods(store: &mut Store, name: &str, uid: &str) {
    let same = store
        .get(NODES, "", name)
        .is_ok_and(|n| n.pointer("/metadata/uid").and_then(Value::as_str) == Some(uid));
    if !same {
        return;
    }
    let _ = store.delete(NODES, "", name, None, false);
    let pods: Vec<(String, String)> = store
        .iter(PODS)
        .filter(|p| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(name))
        .map(|p| {
            let s = |f: &str| p["metadata"][f].as_str().unwrap_or("").to_string();
            (s("namespace"), s("name"))
        })
        .collect();
    for (ns, pod) in pods {
        let _ = store.delete(PODS, &ns, &pod, None, false);
    }
}

struct Bridge {
    config: Ec2Config,
    client: Client,
    types: HashMap<String, TypeInfo>,
    tracked: HashMap<String, Tracked>,
}

async fn client(config: &Ec2Config) -> Client {
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(config.region.clone()))
        .endpoint_url(&config.endpoint);
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
        loader = loader.credentials_provider(aws_sdk_ec2::config::Credentials::new(
            "kube-sim", "kube-sim", None, None, "kube-sim",
        ));
    }
    Client::new(&loader.load().await)
}

impl Bridge {
    async fn describe(&self) -> Result<Vec<InstanceView>, String> {
        let mut pages = self
            .client
            .describe_instances()
            .filters(
                Filter::builder()
                    .name(format!("tag:{TAG_CLUSTER}"))
                    .values(&self.config.cluster_name)
                    .build(),
            )
            .filters(
                Filter::builder()
                    .name("instance-state-name")
                    .values("pending")
                    .values("running")
                    .build(),
            )
            .into_paginator()
            .send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page =
                page.map_err(|e| format!("DescribeInstances: {}", DisplayErrorContext(&e)))?;
            for r in page.reservations() {
                out.extend(r.instances().iter().filter_map(InstanceView::from_sdk));
            }
        }
        Ok(out)
    }

    /// Fetches the instance types not yet cached.
    async fn learn_types(&mut self, wanted: &HashSet<String>) -> Result<(), String> {
        let missing: Vec<&String> = wanted
            .iter()
            .filter(|t| !self.types.contains_key(*t))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let out = self
            .client
            .describe_instance_types()
            .set_instance_types(Some(
                missing
                    .iter()
                    .map(|t| InstanceType::from(t.as_str()))
                    .collect(),
            ))
            .send()
            .await
            .map_err(|e| format!("DescribeInstanceTypes: {}", DisplayErrorContext(&e)))?;
        for t in out.instance_types() {
            let Some(name) = t.instance_type().map(|n| n.as_str().to_string()) else {
                continue;
            };
            let mut gpus = None;
            let mut product = None;
            for g in t.gpu_info().map(|g| g.gpus()).unwrap_or_default() {
                let count = i64::from(g.count().unwrap_or(0));
                let resource = match g.manufacturer().unwrap_or("").to_ascii_uppercase().as_str() {
                    "NVIDIA" => "nvidia.com/gpu",
                    "AMD" => "amd.com/gpu",
                    _ => continue,
                };
                if resource == "nvidia.com/gpu" {
                    let mem = g.memory_info().and_then(|m| m.size_in_mib()).unwrap_or(0);
                    product = Some(nvidia_product(g.name().unwrap_or(""), i64::from(mem)));
                }
                let (_, n) = gpus.get_or_insert((resource, 0));
                *n += count;
            }
            self.types.insert(
                name,
                TypeInfo {
                    vcpus: i64::from(t.v_cpu_info().and_then(|v| v.default_v_cpus()).unwrap_or(0)),
                    memory_mib: t.memory_info().and_then(|m| m.size_in_mib()).unwrap_or(0),
                    gpus,
                    product,
                },
            );
        }
        Ok(())
    }

    /// One reconciliation: registers due Nodes, advertises due GPUs, removes Nodes of instances
    /// that are gone. Returns when something is due next.
    async fn poll(&mut self, app: &App) -> Option<Instant> {
        let instances = match self.describe().await {
            Ok(i) => i,
            Err(e) => {
                eprintln!("kube-sim: ec2 bridge: {e}");
                return None;
            }
        };
        let now = Instant::now();
        let live: HashSet<&str> = instances.iter().map(|i| i.id.as_str()).collect();
        for inst in &instances {
            self.tracked.entry(inst.id.clone()).or_insert(Tracked {
                first_seen: now,
                node: None,
                last_error: None,
            });
        }
        let due_types: HashSet<String> = instances
            .iter()
            .filter(|i| {
                let t = &self.tracked[&i.id];
                t.node.is_none() && t.first_seen + self.config.boot_delay <= now
            })
            .map(|i| i.instance_type.clone())
            .collect();
        let types_known = match self.learn_types(&due_types).await {
            Ok(()) => true,
            Err(e) => {
                eprintln!("kube-sim: ec2 bridge: {e}");
                false
            }
        };
        let mut store = app.store();
        let mut next_due: Option<Instant> = None;
        let mut due = |at: Instant| next_due = Some(next_due.map_or(at, |d: Instant| d.min(at)));
        for inst in &instances {
            let tracked = self.tracked.get_mut(&inst.id).expect("inserted");
            match &mut tracked.node {
                None => {
                    let at = tracked.first_seen + self.config.boot_delay;
                    if at > now {
                        due(at);
                        continue;
                    }
                    let Some(info) = self.types.get(&inst.instance_type) else {
                        let error = format!(
                            "instance type {} is not known to DescribeInstanceTypes",
                            inst.instance_type
                        );
                        if types_known && tracked.last_error.as_deref() != Some(&error) {
                            eprintln!("kube-sim: ec2 bridge: instance {}: {error}", inst.id);
                            tracked.last_error = Some(error);
                        }
                        continue;
                    };
                    let with_gpus = self.config.device_plugin_delay.is_zero();
                    let (node, problems) = node_object(inst, info, &self.config.region, with_gpus);
                    let result = store.create(NODES, "", node, false);
                    let error = match &result {
                        Ok(_) => problems.join("; "),
                        Err(e) => e.message.clone(),
                    };
                    if !error.is_empty() && tracked.last_error.as_deref() != Some(&error) {
                        eprintln!("kube-sim: ec2 bridge: instance {}: {error}", inst.id);
                        tracked.last_error = Some(error);
                    }
                    if let Ok(obj) = result {
                        tracked.node = Some(Registered {
                            name: obj["metadata"]["name"].as_str().unwrap_or("").to_string(),
                            uid: obj["metadata"]["uid"].as_str().unwrap_or("").to_string(),
                            at: now,
                            gpus_advertised: with_gpus || info.gpus.is_none(),
                            gone: false,
                        });
                        if info.gpus.is_some() && !with_gpus {
                            due(now + self.config.device_plugin_delay);
                        }
                    }
                }
                Some(reg) if !reg.gone && !reg.gpus_advertised => {
                    let at = reg.at + self.config.device_plugin_delay;
                    if at > now {
                        due(at);
                        continue;
                    }
                    let gpus = self.types.get(&inst.instance_type).and_then(|i| i.gpus);
                    match store.get(NODES, "", &reg.name) {
                        Ok(node) if node["metadata"]["uid"] == reg.uid.as_str() => {
                            let mut next = node.clone();
                            if let Some((resource, n)) = gpus {
                                for field in ["capacity", "allocatable"] {
                                    next["status"][field][resource] = json!(n.to_string());
                                }
                            }
                            if store
                                .update(NODES, "", &reg.name, next, true, false)
                                .is_ok()
                            {
                                reg.gpus_advertised = true;
                            }
                        }
                        _ => reg.gone = true,
                    }
                }
                Some(_) => {}
            }
        }
        let ended: Vec<String> = self
            .tracked
            .keys()
            .filter(|id| !live.contains(id.as_str()))
            .cloned()
            .collect();
        for id in ended {
            if let Some(Registered {
                name,
                uid,
                gone: false,
                ..
            }) = self.tracked.remove(&id).and_then(|t| t.node)
            {
                delete_node_and_pods(&mut store, &name, &uid);
            }
        }
        next_due
    }
}

/// Runs the bridge until the server goes away.
pub async fn run(app: Arc<App>, config: Ec2Config) {
    let mut bridge = Bridge {
        client: client(&config).await,
        config,
        types: HashMap::new(),
        tracked: HashMap::new(),
    };
    loop {
        let started = Instant::now();
        let due = bridge.poll(&app).await;
        let next_poll = started + bridge.config.poll;
        let wake = due
            .map_or(next_poll, |d| d.min(next_poll))
            .max(Instant::now() + Duration::from_millis(10));
        tokio::time::sleep_until(wake).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(tags: &[(&str, &str)]) -> InstanceView {
        InstanceView {
            id: "i-0abc".into(),
            instance_type: "g5.xlarge".into(),
            zone: "us-east-1b".into(),
            private_dns: String::new(),
            private_ip: "10.0.1.7".into(),
            spot: true,
            tags: tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn node_from_instance_and_template_tags() {
        let info = TypeInfo {
            vcpus: 4,
            memory_mib: 16384,
            gpus: Some(("nvidia.com/gpu", 1)),
            product: Some(nvidia_product("A10G", 22888)),
        };
        let i = inst(&[
            (TAG_POOL, "gpu"),
            (
                "k8s.io/cluster-autoscaler/node-template/label/workload",
                "training",
            ),
            (
                "k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu",
                "present:NoSchedule",
            ),
            (
                "k8s.io/cluster-autoscaler/node-template/taint/bad",
                "present",
            ),
        ]);
        let (node, problems) = node_object(&i, &info, "us-east-1", false);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(node["metadata"]["name"], "ip-10-0-1-7.ec2.internal");
        assert_eq!(node["spec"]["providerID"], "aws:///us-east-1b/i-0abc");
        let l = &node["metadata"]["labels"];
        assert_eq!(l["karpenter.sh/capacity-type"], "spot");
        assert_eq!(l["topology.kubernetes.io/region"], "us-east-1");
        assert_eq!(l["workload"], "training");
        assert_eq!(l[TAG_POOL], "gpu");
        assert_eq!(l["nvidia.com/gpu.product"], "NVIDIA-A10G");
        assert_eq!(
            node["spec"]["taints"],
            json!([{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
        );
        assert!(node["status"]["allocatable"]
            .get("nvidia.com/gpu")
            .is_none());
        assert_eq!(node["status"]["capacity"]["memory"], "16384Mi");
        let (node, _) = node_object(&i, &info, "us-east-1", true);
        assert_eq!(node["status"]["allocatable"]["nvidia.com/gpu"], "1");
    }
}
