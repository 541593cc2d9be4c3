//! Cloud instances → Nodes, whatever cloud lists them (the EC2 bridge, the in-memory provider's).
//!
//! A [`Registrar`] is given the cluster's live instances at every poll. An instance becomes a Node
//! `boot_delay` after the registrar first saw it; its GPUs appear in the Node's capacity and
//! allocatable `device_plugin_delay` after that, as with a device plugin starting. An instance
//! that leaves the listing takes its Node and the Node's pods with it. A Node deleted by a client
//! while its instance lives is not registered again (a real kubelet would re-register; kube-sim
//! does not simulate that).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::resources::{NODES, PODS};
use crate::store::{now_timestamp, Store};

/// The tags the bridges read.
pub const TAG_CLUSTER: &str = "gpu-node-autoscaler.io/cluster";
pub const TAG_POOL: &str = "gpu-node-autoscaler.io/pool";
pub const TAG_LAUNCH_ID: &str = "gpu-node-autoscaler.io/launch-id";
/// Cluster Autoscaler's node-template tags: `.../label/<key>` = value, `.../taint/<key>` =
/// `<value>:<Effect>`.
pub const TAG_TEMPLATE_LABEL: &str = "k8s.io/cluster-autoscaler/node-template/label/";
pub const TAG_TEMPLATE_TAINT: &str = "k8s.io/cluster-autoscaler/node-template/taint/";

/// What an instance type offers a Node.
#[derive(Debug, Clone)]
pub struct TypeInfo {
    pub vcpus: i64,
    pub memory_mib: i64,
    /// (`nvidia.com/gpu` or `amd.com/gpu`, count)
    pub gpus: Option<(&'static str, i64)>,
    /// The `nvidia.com/gpu.product` label of NVIDIA GPUs.
    pub product: Option<String>,
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
    /// The Node's `spec.providerID`.
    pub provider_id: String,
    /// The region (the bridge's configured one): the Node's `topology.kubernetes.io/region`
    /// label, and part of its name when it has no DNS name.
    pub region: String,
}

impl InstanceView {
    /// The Node name: the private DNS name, else one made from the private IP, else the id.
    pub fn node_name(&self) -> String {
        if !self.private_dns.is_empty() {
            return self.private_dns.clone();
        }
        if !self.private_ip.is_empty() {
            let domain = if self.region == "us-east-1" {
                "ec2.internal".to_string()
            } else {
                format!("{}.compute.internal", self.region)
            };
            return format!("ip-{}.{domain}", self.private_ip.replace('.', "-"));
        }
        self.id.clone()
    }
}

/// How a registered Node looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeStyle {
    /// kube-sim's own: the node-template tags become labels and taints, the pool, launch-id and
    /// capacity-type labels are set (kube-sim's kubelets run its pods).
    #[default]
    KubeSim,
    /// As a real instance's kubelet registers it (with the cloud's node labels): instance type,
    /// zone, region, hostname, arch, os and the GPU product, nothing of the pool (no pool label,
    /// no taints, no capacity type), and kwok's annotation so that kwok plays its kubelet.
    Kubelet,
}

/// The annotation by which kwok manages a Node (`--manage-nodes-with-annotation-selector`).
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// A Node taint, when `effect` is one Kubernetes knows.
fn taint_json(key: &str, value: &str, effect: &str) -> Option<Value> {
    matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute")
        .then(|| json!({"key": key, "value": value, "effect": effect}))
}

/// Adds the kubelet's `--register-with-taints` (`key=value:Effect`, value optional) to `node`;
/// a malformed one is reported in `problems` and left out.
fn add_register_taints(node: &mut Value, taints: &[String], problems: &mut Vec<String>) {
    for t in taints {
        let parsed = t.rsplit_once(':').and_then(|(kv, effect)| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            taint_json(k, v, effect)
        });
        match parsed {
            Some(taint) => match node["spec"]["taints"].as_array_mut() {
                Some(list) => list.push(taint),
                None => node["spec"]["taints"] = json!([taint]),
            },
            None => problems.push(format!(
                "--register-with-taints {t:?}: expected <key>[=<value>]:<NoSchedule|PreferNoSchedule|NoExecute>"
            )),
        }
    }
}

/// The Node for `inst` (GPUs left out until the device plugin starts, unless `with_gpus`).
/// Malformed node-template taint tags are reported in the error list and left out.
fn node_object(
    inst: &InstanceView,
    info: &TypeInfo,
    with_gpus: bool,
    style: NodeStyle,
) -> (Value, Vec<String>) {
    let name = inst.node_name();
    let mut problems = Vec::new();
    let mut labels = Map::new();
    let mut taints = Vec::new();
    let template_tags = inst.tags.iter().filter(|_| style == NodeStyle::KubeSim);
    for (k, v) in template_tags {
        if let Some(key) = k.strip_prefix(TAG_TEMPLATE_LABEL) {
            labels.insert(key.to_string(), json!(v));
        } else if let Some(key) = k.strip_prefix(TAG_TEMPLATE_TAINT) {
            match v
                .rsplit_once(':')
                .and_then(|(value, effect)| taint_json(key, value, effect))
            {
                Some(taint) => taints.push(taint),
                None => problems.push(format!(
                    "tag {k}={v:?}: a node-template taint must be <value>:<NoSchedule|PreferNoSchedule|NoExecute>"
                )),
            }
        }
    }
    for (k, v) in [
        (
            "node.kubernetes.io/instance-type",
            inst.instance_type.as_str(),
        ),
        ("topology.kubernetes.io/zone", inst.zone.as_str()),
        ("topology.kubernetes.io/region", inst.region.as_str()),
        ("kubernetes.io/hostname", name.as_str()),
        ("kubernetes.io/arch", "amd64"),
        ("kubernetes.io/os", "linux"),
    ] {
        labels.insert(k.to_string(), json!(v));
    }
    if style == NodeStyle::KubeSim {
        let capacity_type = if inst.spot { "spot" } else { "on-demand" };
        labels.insert("karpenter.sh/capacity-type".into(), json!(capacity_type));
        labels.insert(
            "gpu-node-autoscaler.io/capacity-type".into(),
            json!(capacity_type),
        );
        for tag in [TAG_POOL, TAG_LAUNCH_ID] {
            if let Some(v) = inst.tags.get(tag) {
                labels.insert(tag.to_string(), json!(v));
            }
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
    let mut spec = json!({"providerID": inst.provider_id});
    if !taints.is_empty() {
        spec["taints"] = json!(taints);
    }
    let mut metadata = json!({"name": name, "labels": labels});
    if style == NodeStyle::Kubelet {
        metadata["annotations"] = json!({ KWOK_NODE_ANNOTATION: "fake" });
    }
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": metadata,
        "spec": spec,
        "status": {
            "capacity": capacity, "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                "lastTransitionTime": now}],
            "addresses": addresses,
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                "kubeletVersion": kubelet_version(style), "kubeProxyVersion": kubelet_version(style),
                "containerRuntimeVersion": "containerd://1.7.0", "osImage": kubelet_version(style),
                "kernelVersion": "", "machineID": inst.id, "systemUUID": inst.id, "bootID": inst.id},
        },
    });
    (node, problems)
}

fn kubelet_version(style: NodeStyle) -> &'static str {
    match style {
        NodeStyle::KubeSim => "v1.32.0-kube-sim",
        NodeStyle::Kubelet => "v1.37.2-kwok",
    }
}

/// Where the registrar's Nodes live: kube-sim's store, or a real API server.
pub trait NodeApi {
    /// Creates the Node; returns its name and uid.
    fn create_node(&mut self, node: Value) -> Result<(String, String), String>;
    /// The Node `name`, if it exists.
    fn get_node(&mut self, name: &str) -> Result<Option<Value>, String>;
    /// Writes `node`'s status to the Node `name` (its status subresource).
    fn update_node_status(&mut self, name: &str, node: Value) -> Result<(), String>;
    /// Deletes the Node `name` if it still has `uid`, and what a real cluster's controllers
    /// would remove with it.
    fn delete_node(&mut self, name: &str, uid: &str);
}

impl NodeApi for Store {
    fn create_node(&mut self, node: Value) -> Result<(String, String), String> {
        let obj = self.create(NODES, "", node, false).map_err(|e| e.message)?;
        let s = |f: &str| obj["metadata"][f].as_str().unwrap_or("").to_string();
        Ok((s("name"), s("uid")))
    }

    fn get_node(&mut self, name: &str) -> Result<Option<Value>, String> {
        Ok(self.get(NODES, "", name).ok())
    }

    fn update_node_status(&mut self, name: &str, node: Value) -> Result<(), String> {
        self.update(NODES, "", name, node, true, false)
            .map(|_| ())
            .map_err(|e| e.message)
    }

    /// kube-sim runs no pod garbage collector: the Node's pods go with it.
    fn delete_node(&mut self, name: &str, uid: &str) {
        delete_node_and_pods(self, name, uid);
    }
}

/// A cloud's bridge, polled in two halves: the cloud's instances (async), then their Nodes
/// through a [`NodeApi`] (kube-sim's store, or a real API server).
pub trait CloudBridge {
    /// How often it polls.
    fn poll_interval(&self) -> Duration;
    /// Lists the instances (and learns what registering them needs). None when the cloud could
    /// not be listed; `.1`: whether every instance type due to register is known.
    fn observe(&mut self) -> impl std::future::Future<Output = Option<(Vec<InstanceView>, bool)>>;
    /// Registers, advertises the GPUs of and removes Nodes. Returns when something is due next.
    fn reconcile(
        &mut self,
        api: &mut dyn NodeApi,
        instances: &[InstanceView],
        types_known: bool,
    ) -> Option<Instant>;
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
/// Sleeps until the next poll (`poll` after `started`) or until something is `due` before it.
pub async fn sleep_until_next_poll(started: Instant, poll: Duration, due: Option<Instant>) {
    let next_poll = started + poll;
    let wake = due
        .map_or(next_poll, |d| d.min(next_poll))
        .max(Instant::now() + Duration::from_millis(10));
    tokio::time::sleep_until(wake).await;
}

/// Registers the Nodes of a cloud's instances and removes them when the instances go.
#[derive(Debug)]
pub struct Registrar {
    /// Names the bridge in log lines (`ec2`, `memory`).
    who: &'static str,
    boot_delay: Duration,
    device_plugin_delay: Duration,
    style: NodeStyle,
    /// Taints every Node registers with, as the kubelet's `--register-with-taints` gives them
    /// (`key=value:Effect`), whatever the style.
    register_with_taints: Vec<String>,
    /// CPU the kubelet keeps for the system (`--kube-reserved`/`--system-reserved`), in milli:
    /// taken from the Node's allocatable, not its capacity.
    kube_reserved_cpu_milli: u64,
    tracked: HashMap<String, Tracked>,
}

impl Registrar {
    pub fn new(who: &'static str, boot_delay: Duration, device_plugin_delay: Duration) -> Self {
        Registrar {
            who,
            boot_delay,
            device_plugin_delay,
            style: NodeStyle::KubeSim,
            register_with_taints: Vec::new(),
            kube_reserved_cpu_milli: 0,
            tracked: HashMap::new(),
        }
    }

    /// Registers every Node with these taints (`key=value:Effect`, the kubelet's
    /// `--register-with-taints`).
    pub fn with_register_taints(mut self, taints: Vec<String>) -> Self {
        self.register_with_taints = taints;
        self
    }

    /// Registers Nodes whose allocatable CPU is `milli` less than their capacity, as the
    /// kubelet's `--kube-reserved=cpu=...` gives.
    pub fn with_kube_reserved_cpu(mut self, milli: u64) -> Self {
        self.kube_reserved_cpu_milli = milli;
        self
    }

    /// Registers Nodes in `style` instead of kube-sim's.
    pub fn with_style(mut self, style: NodeStyle) -> Self {
        self.style = style;
        self
    }

    /// Notes when each instance was first seen; returns the instance types of the instances due
    /// to register now (the caller makes sure it knows them).
    pub fn track(&mut self, instances: &[InstanceView]) -> HashSet<String> {
        let now = Instant::now();
        for inst in instances {
            self.tracked.entry(inst.id.clone()).or_insert(Tracked {
                first_seen: now,
                node: None,
                last_error: None,
            });
        }
        instances
            .iter()
            .filter(|i| {
                let t = &self.tracked[&i.id];
                t.node.is_none() && t.first_seen + self.boot_delay <= now
            })
            .map(|i| i.instance_type.clone())
            .collect()
    }

    /// Registers due Nodes, advertises due GPUs, removes the Nodes of instances no longer in
    /// `instances` (which [`Registrar::track`] has seen). `types_known`: whether `types` is
    /// complete (else a missing type is not worth a log line). Returns when something is due
    /// next.
    pub fn reconcile(
        &mut self,
        store: &mut dyn NodeApi,
        instances: &[InstanceView],
        types: &HashMap<String, TypeInfo>,
        types_known: bool,
    ) -> Option<Instant> {
        let now = Instant::now();
        let live: HashSet<&str> = instances.iter().map(|i| i.id.as_str()).collect();
        let mut next_due: Option<Instant> = None;
        let mut due = |at: Instant| next_due = Some(next_due.map_or(at, |d: Instant| d.min(at)));
        for inst in instances {
            let Some(tracked) = self.tracked.get_mut(&inst.id) else {
                continue;
            };
            match &mut tracked.node {
                None => {
                    let at = tracked.first_seen + self.boot_delay;
                    if at > now {
                        due(at);
                        continue;
                    }
                    let Some(info) = types.get(&inst.instance_type) else {
                        let error = format!(
                            "instance type {} is not known to the {} bridge",
                            inst.instance_type, self.who
                        );
                        if types_known && tracked.last_error.as_deref() != Some(&error) {
                            eprintln!(
                                "kube-sim: {} bridge: instance {}: {error}",
                                self.who, inst.id
                            );
                            tracked.last_error = Some(error);
                        }
                        continue;
                    };
                    let with_gpus = self.device_plugin_delay.is_zero();
                    let (mut node, mut problems) = node_object(inst, info, with_gpus, self.style);
                    add_register_taints(&mut node, &self.register_with_taints, &mut problems);
                    if self.kube_reserved_cpu_milli > 0 {
                        let milli = (info.vcpus.max(0) as u64 * 1000)
                            .saturating_sub(self.kube_reserved_cpu_milli);
                        node["status"]["allocatable"]["cpu"] = json!(format!("{milli}m"));
                    }
                    let result = store.create_node(node);
                    let error = match &result {
                        Ok(_) => problems.join("; "),
                        Err(e) => e.clone(),
                    };
                    if !error.is_empty() && tracked.last_error.as_deref() != Some(&error) {
                        eprintln!(
                            "kube-sim: {} bridge: instance {}: {error}",
                            self.who, inst.id
                        );
                        tracked.last_error = Some(error);
                    }
                    if let Ok((name, uid)) = result {
                        tracked.node = Some(Registered {
                            name,
                            uid,
                            at: now,
                            gpus_advertised: with_gpus || info.gpus.is_none(),
                            gone: false,
                        });
                        if info.gpus.is_some() && !with_gpus {
                            due(now + self.device_plugin_delay);
                        }
                    }
                }
                Some(reg) if !reg.gone && !reg.gpus_advertised => {
                    let at = reg.at + self.device_plugin_delay;
                    if at > now {
                        due(at);
                        continue;
                    }
                    let gpus = types.get(&inst.instance_type).and_then(|i| i.gpus);
                    match store.get_node(&reg.name) {
                        Ok(Some(node)) if node["metadata"]["uid"] == reg.uid.as_str() => {
                            let mut next = node.clone();
                            if let Some((resource, n)) = gpus {
                                for field in ["capacity", "allocatable"] {
                                    next["status"][field][resource] = json!(n.to_string());
                                }
                            }
                            if store.update_node_status(&reg.name, next).is_ok() {
                                reg.gpus_advertised = true;
                            }
                        }
                        Ok(_) => reg.gone = true,
                        // Try again at the next poll.
                        Err(_) => due(now),
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
                store.delete_node(&name, &uid);
            }
        }
        next_due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_node_autoscaler_core::model::gpu::nvidia_product_label;

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
            provider_id: "aws:///us-east-1b/i-0abc".into(),
            region: "us-east-1".into(),
        }
    }

    #[test]
    fn node_from_instance_and_template_tags() {
        let info = TypeInfo {
            vcpus: 4,
            memory_mib: 16384,
            gpus: Some(("nvidia.com/gpu", 1)),
            product: Some(nvidia_product_label("A10G", 22888)),
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
        let (node, problems) = node_object(&i, &info, false, NodeStyle::KubeSim);
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
        let (node, _) = node_object(&i, &info, true, NodeStyle::KubeSim);
        assert_eq!(node["status"]["allocatable"]["nvidia.com/gpu"], "1");
    }
}
