//! The controller's view of the cluster: model values kept up to date from watch events.
//!
//! Each watched kind feeds one [`KindStore`]. Objects are converted to the planner's model as
//! they arrive (so a pass does no conversion and the store holds only what the planner reads,
//! not `managedFields` and the rest of the object). A store is *synced* from the end of a full
//! list until its watch fails; the loop makes no decision while any store is not synced.
//! Everything here is pure: events in, state out.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde_json::Value;

use gpu_node_autoscaler_core::convert::Converter;
use gpu_node_autoscaler_core::model::dra::{Claim, ClaimSpec, DeviceClass, DraObjects, Slice};
use gpu_node_autoscaler_core::model::volumes;
use gpu_node_autoscaler_core::model::{Node, Pdb, Pod, Time};

/// One watch event, after conversion to JSON (what `kube::runtime::watcher` yields, minus the
/// typed object).
#[derive(Clone, Debug)]
pub enum WatchEvent {
    /// A (re)list starts: what follows until `InitDone` replaces the store.
    Init,
    InitApply(Value),
    InitDone,
    Apply(Value),
    Delete(Value),
    /// The watch failed: the store is stale until the next full list.
    Lost(String),
}

/// The key of a namespaced object (`namespace/name`) or a cluster-scoped one (`name`).
pub fn object_key(v: &Value) -> Option<String> {
    let m = v.get("metadata")?;
    let name = m.get("name")?.as_str()?;
    Some(match m.get("namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    })
}

/// Objects of one kind, converted, with whether they are a complete and current view.
#[derive(Debug)]
pub struct KindStore<T> {
    pub items: HashMap<String, T>,
    /// Objects that could not be converted, with why (reported, never planned with).
    pub rejected: BTreeMap<String, String>,
    pub synced: bool,
    /// Incremented on every change, so readers can tell whether anything moved.
    pub generation: u64,
    buffer: Option<(HashMap<String, T>, BTreeMap<String, String>)>,
}

impl<T> Default for KindStore<T> {
    fn default() -> Self {
        KindStore {
            items: HashMap::new(),
            rejected: BTreeMap::new(),
            synced: false,
            generation: 0,
            buffer: None,
        }
    }
}

impl<T> KindStore<T> {
    /// Applies one event; `convert` turns an object into a model value or says why it cannot.
    /// Returns the key of the object that changed, if one did, with its value now and before.
    pub fn apply(
        &mut self,
        event: WatchEvent,
        mut convert: impl FnMut(Value) -> Result<T, String>,
    ) -> Option<(String, Option<&T>, Option<T>)> {
        match event {
            WatchEvent::Init => {
                self.buffer = Some((HashMap::new(), BTreeMap::new()));
                None
            }
            WatchEvent::InitApply(v) => {
                let key = object_key(&v)?;
                let (items, rejected) = self
                    .buffer
                    .get_or_insert_with(|| (HashMap::new(), BTreeMap::new()));
                match convert(v) {
                    Ok(t) => {
                        items.insert(key, t);
                    }
                    Err(e) => {
                        rejected.insert(key, e);
                    }
                }
                None
            }
            WatchEvent::InitDone => {
                if let Some((items, rejected)) = self.buffer.take() {
                    self.items = items;
                    self.rejected = rejected;
                }
                self.synced = true;
                self.generation += 1;
                None
            }
            WatchEvent::Apply(v) => {
                let key = object_key(&v)?;
                self.generation += 1;
                let before = match convert(v) {
                    Ok(t) => {
                        self.rejected.remove(&key);
                        self.items.insert(key.clone(), t)
                    }
                    Err(e) => {
                        self.rejected.insert(key.clone(), e);
                        self.items.remove(&key)
                    }
                };
                let item = self.items.get(&key);
                Some((key, item, before))
            }
            WatchEvent::Delete(v) => {
                let key = object_key(&v)?;
                self.generation += 1;
                self.rejected.remove(&key);
                let before = self.items.remove(&key);
                Some((key, None, before))
            }
            WatchEvent::Lost(_) => {
                self.synced = false;
                self.buffer = None;
                None
            }
        }
    }
}

/// The policy ConfigMap's text, as last seen.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicySource {
    /// `None` when the ConfigMap does not exist or lacks the key.
    pub text: Option<String>,
    pub resource_version: String,
    pub uid: String,
}

/// Everything the controller watches.
#[derive(Default)]
pub struct ClusterState {
    pub pods: KindStore<Pod>,
    pub nodes: KindStore<Node>,
    pub pdbs: KindStore<Pdb>,
    pub policy: KindStore<PolicySource>,
    /// Dynamic Resource Allocation (`resource.k8s.io/v1`): ResourceClaims and their templates
    /// by `namespace/name`, DeviceClasses by name, ResourceSlices by name (`None` for a slice
    /// not bound to one node, which is not planned with). Marked synced and left empty when the
    /// API server does not serve the group.
    pub claims: KindStore<Claim>,
    pub claim_templates: KindStore<Arc<ClaimSpec>>,
    pub device_classes: KindStore<DeviceClass>,
    pub slices: KindStore<Option<Slice>>,
    /// Volume topology: PersistentVolumeClaims by `namespace/name`, PersistentVolumes and
    /// StorageClasses by name (read only; joined with the pods in each snapshot).
    pub volume_claims: KindStore<volumes::Claim>,
    pub volumes: KindStore<volumes::Volume>,
    pub storage_classes: KindStore<volumes::StorageClass>,
    /// CSINodes by name: each CSI driver's attach limit on that node (read only).
    pub csi_nodes: KindStore<BTreeMap<String, u32>>,
    /// Namespaces' labels by name (what pod affinity terms' `namespaceSelector`s select).
    pub namespaces: KindStore<BTreeMap<String, String>>,
    /// ProvisioningRequests and PodTemplates by `namespace/name`, as objects without
    /// `metadata.managedFields` (converted in each pass, see [`ClusterState::provisioning_requests`]).
    pub provisioning_requests: KindStore<Value>,
    pub pod_templates: KindStore<Value>,
    /// CapacityBuffers (`autoscaling.x-k8s.io/v1beta1`) by `namespace/name`, and the scalable
    /// objects they may name (Deployments, StatefulSets), kept with only their pod template and
    /// replicas (see [`ClusterState::capacity_buffers`]).
    pub capacity_buffers: KindStore<Value>,
    pub deployments: KindStore<Value>,
    pub stateful_sets: KindStore<Value>,
    /// When each pending GPU pod was first seen unschedulable (for the reaction-time metric and
    /// the batching window).
    pub unschedulable_since: HashMap<String, Time>,
    /// Pods that became unschedulable since the loop last looked.
    pub new_unschedulable: u64,
    /// Pending pods whose `status.nominatedNodeName` went away (kube-scheduler clears it when it
    /// tries the pod and finds no node, e.g. while the node launched for it boots): a pass soon
    /// sets ours again, before that node turns Ready and another pod takes it.
    pub nominations_cleared: u64,
    /// providerIDs of Nodes that could not be converted, by Node: their instances are
    /// registered all the same (never taken for launches that did not come up).
    pub rejected_provider_ids: HashMap<String, String>,
    converter: Converter,
}

/// An object without `metadata.managedFields`.
fn slim(mut v: Value) -> Value {
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    v
}

/// What a buffer reads of a scalable object: its pod template and replicas.
fn scalable(v: Value) -> Value {
    serde_json::json!({
        "metadata": {
            "name": v.pointer("/metadata/name"),
            "namespace": v.pointer("/metadata/namespace"),
        },
        "spec": {
            "replicas": v.pointer("/spec/replicas"),
            "template": v.pointer("/spec/template"),
        },
        "status": {"replicas": v.pointer("/status/replicas")},
    })
}

/// The key of the policy ConfigMap that holds the policy.
pub const POLICY_KEY: &str = "policy.yaml";

/// Which watched kind an event belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Pod,
    Node,
    Pdb,
    PolicyConfigMap,
    ResourceClaim,
    ResourceClaimTemplate,
    DeviceClass,
    ResourceSlice,
    PersistentVolumeClaim,
    PersistentVolume,
    StorageClass,
    CsiNode,
    Namespace,
    ProvisioningRequest,
    PodTemplate,
    CapacityBuffer,
    Deployment,
    StatefulSet,
}

impl Kind {
    pub const ALL: [Kind; 18] = [
        Kind::Pod,
        Kind::Node,
        Kind::Pdb,
        Kind::PolicyConfigMap,
        Kind::ResourceClaim,
        Kind::ResourceClaimTemplate,
        Kind::DeviceClass,
        Kind::ResourceSlice,
        Kind::PersistentVolumeClaim,
        Kind::PersistentVolume,
        Kind::StorageClass,
        Kind::CsiNode,
        Kind::Namespace,
        Kind::ProvisioningRequest,
        Kind::PodTemplate,
        Kind::CapacityBuffer,
        Kind::Deployment,
        Kind::StatefulSet,
    ];

    /// ProvisioningRequests (`autoscaling.x-k8s.io/v1`) and the PodTemplates their pod sets name.
    pub const PROVISIONING: [Kind; 2] = [Kind::ProvisioningRequest, Kind::PodTemplate];

    /// CapacityBuffers (`autoscaling.x-k8s.io/v1beta1`) and the scalable objects they may name
    /// (their PodTemplates are watched with ProvisioningRequests' or alone).
    pub const BUFFERS: [Kind; 3] = [Kind::CapacityBuffer, Kind::Deployment, Kind::StatefulSet];

    /// The kinds of `resource.k8s.io/v1` (Dynamic Resource Allocation).
    pub const DRA: [Kind; 4] = [
        Kind::ResourceClaim,
        Kind::ResourceClaimTemplate,
        Kind::DeviceClass,
        Kind::ResourceSlice,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Pod => "pods",
            Kind::Node => "nodes",
            Kind::Pdb => "poddisruptionbudgets",
            Kind::PolicyConfigMap => "policy configmap",
            Kind::ResourceClaim => "resourceclaims",
            Kind::ResourceClaimTemplate => "resourceclaimtemplates",
            Kind::DeviceClass => "deviceclasses",
            Kind::ResourceSlice => "resourceslices",
            Kind::PersistentVolumeClaim => "persistentvolumeclaims",
            Kind::PersistentVolume => "persistentvolumes",
            Kind::StorageClass => "storageclasses",
            Kind::CsiNode => "csinodes",
            Kind::Namespace => "namespaces",
            Kind::ProvisioningRequest => "provisioningrequests",
            Kind::PodTemplate => "podtemplates",
            Kind::CapacityBuffer => "capacitybuffers",
            Kind::Deployment => "deployments",
            Kind::StatefulSet => "statefulsets",
        }
    }
}

impl ClusterState {
    pub fn all_synced(&self) -> bool {
        Kind::ALL.iter().all(|k| self.synced(*k))
    }

    pub fn synced(&self, kind: Kind) -> bool {
        match kind {
            Kind::Pod => self.pods.synced,
            Kind::Node => self.nodes.synced,
            Kind::Pdb => self.pdbs.synced,
            Kind::PolicyConfigMap => self.policy.synced,
            Kind::ResourceClaim => self.claims.synced,
            Kind::ResourceClaimTemplate => self.claim_templates.synced,
            Kind::DeviceClass => self.device_classes.synced,
            Kind::ResourceSlice => self.slices.synced,
            Kind::PersistentVolumeClaim => self.volume_claims.synced,
            Kind::PersistentVolume => self.volumes.synced,
            Kind::StorageClass => self.storage_classes.synced,
            Kind::CsiNode => self.csi_nodes.synced,
            Kind::Namespace => self.namespaces.synced,
            Kind::ProvisioningRequest => self.provisioning_requests.synced,
            Kind::PodTemplate => self.pod_templates.synced,
            Kind::CapacityBuffer => self.capacity_buffers.synced,
            Kind::Deployment => self.deployments.synced,
            Kind::StatefulSet => self.stateful_sets.synced,
        }
    }

    /// For an API server that does not serve `resource.k8s.io/v1`: its DRA stores are complete
    /// and empty (no pod can claim devices there).
    pub fn without_dra(&mut self, now: Time) {
        for kind in Kind::DRA {
            self.apply(kind, WatchEvent::Init, now);
            self.apply(kind, WatchEvent::InitDone, now);
        }
    }

    /// One store complete and empty (an API the server does not serve).
    pub fn empty(&mut self, kind: Kind, now: Time) {
        self.apply(kind, WatchEvent::Init, now);
        self.apply(kind, WatchEvent::InitDone, now);
    }

    /// For an API server that does not serve ProvisioningRequests: those stores are complete and
    /// empty (nothing can ask for capacity that way there).
    pub fn without_provisioning(&mut self, now: Time) {
        for kind in Kind::PROVISIONING {
            self.apply(kind, WatchEvent::Init, now);
            self.apply(kind, WatchEvent::InitDone, now);
        }
    }

    /// For an API server that does not serve CapacityBuffers: their stores are complete and
    /// empty (the PodTemplates' store is [`ClusterState::without_provisioning`]'s).
    pub fn without_buffers(&mut self, now: Time) {
        for kind in Kind::BUFFERS {
            self.apply(kind, WatchEvent::Init, now);
            self.apply(kind, WatchEvent::InitDone, now);
        }
    }

    /// The CapacityBuffers, converted with the PodTemplates and scalable objects they name,
    /// sorted by key; those that are not CapacityBuffers at all are left out (their keys and
    /// why in the second list).
    pub fn capacity_buffers(
        &mut self,
    ) -> (
        Vec<gpu_node_autoscaler_core::buffer::CapacityBuffer>,
        Vec<(String, String)>,
    ) {
        if self.capacity_buffers.items.is_empty() {
            return (Vec::new(), Vec::new());
        }
        let templates: BTreeMap<String, Value> = self
            .pod_templates
            .items
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut scalables: BTreeMap<String, Value> = BTreeMap::new();
        for (kind, store) in [
            ("Deployment", &self.deployments),
            ("StatefulSet", &self.stateful_sets),
        ] {
            for (k, v) in &store.items {
                if let Some((ns, name)) = k.split_once('/') {
                    scalables.insert(
                        gpu_node_autoscaler_core::convert::scalable_key("apps", kind, ns, name),
                        v.clone(),
                    );
                }
            }
        }
        let mut keys: Vec<&String> = self.capacity_buffers.items.keys().collect();
        keys.sort();
        let mut out = Vec::new();
        let mut bad = Vec::new();
        for k in keys {
            match self.converter.capacity_buffer(
                &self.capacity_buffers.items[k],
                &templates,
                &scalables,
            ) {
                Ok(b) => out.push(b),
                Err(e) => bad.push((k.clone(), e)),
            }
        }
        (out, bad)
    }

    /// The ProvisioningRequests, converted with the PodTemplates they name, sorted by key; those
    /// that are not ProvisioningRequests at all are left out (their keys and why in the second
    /// list).
    pub fn provisioning_requests(
        &mut self,
    ) -> (
        Vec<gpu_node_autoscaler_core::provisioning::ProvisioningRequest>,
        Vec<(String, String)>,
    ) {
        let templates: BTreeMap<String, Value> = self
            .pod_templates
            .items
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut keys: Vec<&String> = self.provisioning_requests.items.keys().collect();
        keys.sort();
        let mut out = Vec::new();
        let mut bad = Vec::new();
        for k in keys {
            match self
                .converter
                .provisioning_request(&self.provisioning_requests.items[k], &templates)
            {
                Ok(r) => out.push(r),
                Err(e) => bad.push((k.clone(), e)),
            }
        }
        (out, bad)
    }

    /// Applies one watch event of `kind` seen at `now`.
    pub fn apply(&mut self, kind: Kind, event: WatchEvent, now: Time) {
        match kind {
            Kind::Pod => {
                let conv = &mut self.converter;
                let relist_done = matches!(event, WatchEvent::InitDone);
                let changed = self
                    .pods
                    .apply(event, |v| conv.pod(v))
                    .map(|(k, p, before)| {
                        let was_nominated = before.is_some_and(|b| b.nominated_node.is_some());
                        if was_nominated
                            && p.is_some_and(|p| p.is_pending() && p.nominated_node.is_none())
                        {
                            self.nominations_cleared += 1;
                        }
                        (k, p.map(waits_for_gpu))
                    });
                match changed {
                    Some((key, Some(true))) => {
                        if let std::collections::hash_map::Entry::Vacant(e) =
                            self.unschedulable_since.entry(key)
                        {
                            e.insert(now);
                            self.new_unschedulable += 1;
                        }
                    }
                    Some((key, _)) => {
                        self.unschedulable_since.remove(&key);
                    }
                    None if relist_done => {
                        let mut fresh = 0;
                        let pods = &self.pods.items;
                        self.unschedulable_since
                            .retain(|k, _| pods.get(k).is_some_and(waits_for_gpu));
                        for (k, p) in pods {
                            if waits_for_gpu(p) {
                                self.unschedulable_since
                                    .entry(k.clone())
                                    .or_insert_with(|| {
                                        fresh += 1;
                                        now
                                    });
                            }
                        }
                        self.new_unschedulable += fresh;
                    }
                    None => {}
                }
            }
            Kind::Node => {
                let conv = &mut self.converter;
                // (Node key, its providerID when it could not be converted).
                let mut outcome: Option<(String, Option<String>)> = None;
                let relist_done = matches!(event, WatchEvent::InitDone);
                let changed = self.nodes.apply(event, |v| {
                    let key = object_key(&v);
                    let pid = v
                        .pointer("/spec/providerID")
                        .and_then(Value::as_str)
                        .map(str::to_string);
                    let node = conv.node(v);
                    if let Some(k) = key {
                        outcome = Some((k, if node.is_err() { pid } else { None }));
                    }
                    node
                });
                match (outcome, changed) {
                    (Some((key, Some(pid))), _) => {
                        self.rejected_provider_ids.insert(key, pid);
                    }
                    (Some((key, None)), _) | (None, Some((key, _, _))) => {
                        self.rejected_provider_ids.remove(&key);
                    }
                    (None, None) => {}
                }
                if relist_done {
                    let rejected = &self.nodes.rejected;
                    self.rejected_provider_ids
                        .retain(|k, _| rejected.contains_key(k));
                }
            }
            Kind::Pdb => {
                let conv = &mut self.converter;
                self.pdbs.apply(event, |v| conv.pdb(v));
            }
            Kind::PolicyConfigMap => {
                self.policy.apply(event, |v| Ok(policy_source(&v)));
            }
            Kind::ResourceClaim => {
                let conv = &mut self.converter;
                self.claims
                    .apply(event, |v| conv.resource_claim(v).map(|(_, c)| c));
            }
            Kind::ResourceClaimTemplate => {
                let conv = &mut self.converter;
                self.claim_templates
                    .apply(event, |v| conv.resource_claim_template(v).map(|(_, t)| t));
            }
            Kind::DeviceClass => {
                let conv = &mut self.converter;
                self.device_classes.apply(event, |v| conv.device_class(v));
            }
            Kind::ResourceSlice => {
                let conv = &mut self.converter;
                self.slices
                    .apply(event, |v| Ok(conv.resource_slice(v)?.map(|(_, s)| s)));
            }
            Kind::PersistentVolumeClaim => {
                let conv = &mut self.converter;
                self.volume_claims
                    .apply(event, |v| conv.persistent_volume_claim(v));
            }
            Kind::PersistentVolume => {
                let conv = &mut self.converter;
                self.volumes.apply(event, |v| conv.persistent_volume(v));
            }
            Kind::StorageClass => {
                let conv = &mut self.converter;
                self.storage_classes.apply(event, |v| conv.storage_class(v));
            }
            Kind::CsiNode => {
                let conv = &mut self.converter;
                self.csi_nodes.apply(event, |v| Ok(conv.csi_node(v)?.1));
            }
            Kind::Namespace => {
                self.namespaces.apply(event, |v| {
                    Ok(gpu_node_autoscaler_core::convert::namespace_labels(&v))
                });
            }
            // Kept as objects (few, and converted together in each pass), without what no
            // pass reads.
            Kind::ProvisioningRequest => {
                self.provisioning_requests.apply(event, |v| Ok(slim(v)));
            }
            Kind::PodTemplate => {
                self.pod_templates.apply(event, |v| Ok(slim(v)));
            }
            Kind::CapacityBuffer => {
                self.capacity_buffers.apply(event, |v| Ok(slim(v)));
            }
            Kind::Deployment => {
                self.deployments.apply(event, |v| Ok(scalable(v)));
            }
            Kind::StatefulSet => {
                self.stateful_sets.apply(event, |v| Ok(scalable(v)));
            }
        }
    }

    /// What the planner reads: every converted pod, node and budget, with `in_flight`, and the
    /// pods' ResourceClaims joined with the cluster's DRA objects (devices published and
    /// allocated per node). Sorted by key, so that the same cluster always gives the same
    /// snapshot.
    pub fn snapshot(
        &self,
        in_flight: Vec<gpu_node_autoscaler_core::model::InFlight>,
    ) -> gpu_node_autoscaler_core::model::Snapshot {
        fn sorted<T: Clone>(m: &HashMap<String, T>) -> Vec<T> {
            let mut v: Vec<(&String, &T)> = m.iter().collect();
            v.sort_unstable_by(|a, b| a.0.cmp(b.0));
            v.into_iter().map(|(_, t)| t.clone()).collect()
        }
        fn by_key<T: Clone>(m: &HashMap<String, T>) -> BTreeMap<String, T> {
            m.iter().map(|(k, t)| (k.clone(), t.clone())).collect()
        }
        let mut snapshot = gpu_node_autoscaler_core::model::Snapshot {
            pods: sorted(&self.pods.items),
            nodes: sorted(&self.nodes.items),
            pdbs: sorted(&self.pdbs.items),
            in_flight,
            ..Default::default()
        };
        let dra = DraObjects {
            claims: by_key(&self.claims.items),
            templates: by_key(&self.claim_templates.items),
            classes: by_key(&self.device_classes.items),
            slices: self
                .slices
                .items
                .iter()
                .filter_map(|(k, s)| Some((k.clone(), s.clone()?)))
                .collect(),
        };
        let storage = volumes::Storage {
            complete: self.volume_claims.synced,
            claims: self
                .volume_claims
                .items
                .values()
                .map(|c| (format!("{}/{}", c.namespace, c.name), c.clone()))
                .collect(),
            volumes: by_key(&self.volumes.items),
            classes: by_key(&self.storage_classes.items),
            limited_drivers: Default::default(),
        };
        snapshot.attach_limits.by_node = self
            .csi_nodes
            .items
            .iter()
            .filter(|(_, limits)| !limits.is_empty())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let storage = volumes::Storage {
            limited_drivers: snapshot.attach_limits.drivers(),
            ..storage
        };
        storage.join(&mut snapshot.pods);
        if self.namespaces.synced {
            gpu_node_autoscaler_core::model::topology::resolve_namespaces(
                &mut snapshot.pods,
                &by_key(&self.namespaces.items),
            );
        }
        snapshot.dra = dra.join(&mut snapshot.pods);
        snapshot.count_published_devices();
        snapshot
    }

    /// The policy as last seen (`None` if the ConfigMap is absent).
    pub fn policy_source(&self) -> Option<&PolicySource> {
        self.policy.items.values().next()
    }
}

/// A pending GPU pod the scheduler found no node for: what opens a batching window. A pod with
/// ResourceClaims counts whatever its claims ask for (their specs are only joined in the
/// snapshot; a claim for devices no pool offers is the planner's to report).
fn waits_for_gpu(p: &Pod) -> bool {
    p.is_pending() && p.unschedulable && (p.wants_gpu() || !p.claims.is_empty())
}

fn policy_source(v: &Value) -> PolicySource {
    let m = v.get("metadata");
    let s = |k: &str| {
        m.and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    PolicySource {
        text: v
            .get("data")
            .and_then(|d| d.get(POLICY_KEY))
            .and_then(Value::as_str)
            .map(str::to_string),
        resource_version: s("resourceVersion"),
        uid: s("uid"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, unschedulable: bool) -> Value {
        let mut p = json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}")},
            "spec": {"containers": [{"name": "c", "image": "i",
                "resources": {"requests": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}
        });
        if unschedulable {
            p["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable"}]);
        }
        p
    }

    #[test]
    fn relist_replaces_the_store_atomically_and_marks_it_synced() {
        let mut s = ClusterState::default();
        assert!(!s.synced(Kind::Pod));
        s.apply(Kind::Pod, WatchEvent::Init, Time(0));
        s.apply(Kind::Pod, WatchEvent::InitApply(pod("a", false)), Time(0));
        assert!(s.pods.items.is_empty(), "nothing visible before InitDone");
        s.apply(Kind::Pod, WatchEvent::InitDone, Time(0));
        assert!(s.synced(Kind::Pod));
        assert_eq!(s.pods.items.len(), 1);
        // A lost watch makes the store stale until the next full list, which replaces it.
        s.apply(Kind::Pod, WatchEvent::Lost("closed".into()), Time(1));
        assert!(!s.synced(Kind::Pod));
        s.apply(Kind::Pod, WatchEvent::Init, Time(2));
        s.apply(Kind::Pod, WatchEvent::InitApply(pod("b", false)), Time(2));
        s.apply(Kind::Pod, WatchEvent::InitDone, Time(2));
        let keys: Vec<&String> = s.pods.items.keys().collect();
        assert_eq!(keys, vec!["ml/b"]);
    }

    #[test]
    fn affinity_namespace_selectors_are_resolved_against_the_watched_namespaces() {
        let mut s = ClusterState::default();
        let mut p = pod("server", true);
        p["spec"]["affinity"] = json!({"podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [{
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"app": "noisy"}},
                "namespaceSelector": {"matchLabels": {"team": "ml"}}}]}});
        s.apply(Kind::Pod, WatchEvent::Apply(p), Time(0));
        let namespaces = |s: &ClusterState| {
            let snap = s.snapshot(Vec::new());
            let t = snap.pods[0].constraints.topology.clone().unwrap();
            t.anti_affinity[0].selector.namespaces.clone()
        };
        // Before the Namespaces are listed: the pod's own.
        assert_eq!(namespaces(&s), Some(vec!["ml".to_string()]));
        s.apply(Kind::Namespace, WatchEvent::Init, Time(0));
        for (name, team) in [("train", "ml"), ("web", "web")] {
            let ns = json!({"metadata": {"name": name, "labels": {"team": team}}});
            s.apply(Kind::Namespace, WatchEvent::InitApply(ns), Time(0));
        }
        s.apply(Kind::Namespace, WatchEvent::InitDone, Time(0));
        assert_eq!(namespaces(&s), Some(vec!["train".to_string()]));
    }

    #[test]
    fn unschedulable_pods_are_timed_once_and_forgotten_when_they_go() {
        let mut s = ClusterState::default();
        s.apply(Kind::Pod, WatchEvent::Init, Time(0));
        s.apply(Kind::Pod, WatchEvent::InitDone, Time(0));
        s.apply(Kind::Pod, WatchEvent::Apply(pod("a", true)), Time(5));
        s.apply(Kind::Pod, WatchEvent::Apply(pod("a", true)), Time(9));
        assert_eq!(s.unschedulable_since.get("ml/a"), Some(&Time(5)));
        assert_eq!(s.new_unschedulable, 1);
        s.apply(Kind::Pod, WatchEvent::Delete(pod("a", true)), Time(10));
        assert!(s.unschedulable_since.is_empty());
        assert!(s.pods.items.is_empty());
    }

    #[test]
    fn a_pending_pods_nomination_cleared_is_counted() {
        let mut s = ClusterState::default();
        s.apply(Kind::Pod, WatchEvent::Init, Time(0));
        s.apply(Kind::Pod, WatchEvent::InitDone, Time(0));
        let mut nominated = pod("a", true);
        nominated["status"]["nominatedNodeName"] = json!("node-1");
        s.apply(Kind::Pod, WatchEvent::Apply(pod("a", true)), Time(1));
        s.apply(Kind::Pod, WatchEvent::Apply(nominated.clone()), Time(2));
        assert_eq!(s.nominations_cleared, 0, "set, not cleared");
        s.apply(Kind::Pod, WatchEvent::Apply(pod("a", true)), Time(3));
        assert_eq!(s.nominations_cleared, 1);
        s.apply(Kind::Pod, WatchEvent::Apply(pod("a", true)), Time(4));
        assert_eq!(s.nominations_cleared, 1, "once");
        // Bound (the API server clears it then): not a pod to nominate again.
        s.apply(Kind::Pod, WatchEvent::Apply(nominated), Time(5));
        let mut bound = pod("a", false);
        bound["spec"]["nodeName"] = json!("node-1");
        bound["status"]["phase"] = json!("Running");
        s.apply(Kind::Pod, WatchEvent::Apply(bound), Time(6));
        assert_eq!(s.nominations_cleared, 1);
    }

    #[test]
    fn an_object_that_does_not_convert_is_rejected_not_planned() {
        let mut s = ClusterState::default();
        s.apply(Kind::Pod, WatchEvent::Init, Time(0));
        s.apply(Kind::Pod, WatchEvent::InitDone, Time(0));
        s.apply(
            Kind::Node,
            WatchEvent::Apply(json!({"metadata": {"name": "n1"},
                "status": {"allocatable": {"cpu": "lots"}}})),
            Time(0),
        );
        assert!(s.nodes.items.is_empty());
        assert!(s.nodes.rejected["n1"].contains("status.allocatable.cpu"));
    }

    #[test]
    fn the_snapshot_holds_every_converted_object_in_key_order() {
        let mut s = ClusterState::default();
        for k in [Kind::Pod, Kind::Node, Kind::Pdb] {
            s.apply(k, WatchEvent::Init, Time(0));
        }
        s.apply(Kind::Pod, WatchEvent::InitApply(pod("b", true)), Time(0));
        s.apply(Kind::Pod, WatchEvent::InitApply(pod("a", false)), Time(0));
        s.apply(Kind::Pod, WatchEvent::InitDone, Time(0));
        s.apply(
            Kind::Node,
            WatchEvent::InitApply(json!({"metadata": {"name": "n1"},
                "spec": {"providerID": "aws:///z/i-1"},
                "status": {"allocatable": {"cpu": "4", "nvidia.com/gpu": "1"}}})),
            Time(0),
        );
        s.apply(
            Kind::Node,
            WatchEvent::InitApply(json!({"metadata": {"name": "bad"},
                "spec": {"providerID": "aws:///z/i-2"},
                "status": {"allocatable": {"cpu": "lots"}}})),
            Time(0),
        );
        s.apply(Kind::Node, WatchEvent::InitDone, Time(0));
        s.apply(
            Kind::Pdb,
            WatchEvent::InitApply(json!({"metadata": {"name": "b", "namespace": "ml"},
                "spec": {"selector": {"matchLabels": {"app": "x"}}},
                "status": {"disruptionsAllowed": 1}})),
            Time(0),
        );
        s.apply(Kind::Pdb, WatchEvent::InitDone, Time(0));
        let snap = s.snapshot(Vec::new());
        let names: Vec<&str> = snap.pods.iter().map(|p| p.id.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(snap.pods[1].unschedulable && snap.pods[1].wants_gpu());
        assert_eq!(snap.nodes.len(), 1);
        assert_eq!(snap.nodes[0].provider_id.as_deref(), Some("aws:///z/i-1"));
        assert_eq!(snap.pdbs[0].disruptions_allowed, 1);
        // The node that did not convert still counts as registered for its instance.
        assert_eq!(s.rejected_provider_ids["bad"], "aws:///z/i-2");
        // Fixed, it is a Node like the others.
        s.apply(
            Kind::Node,
            WatchEvent::Apply(json!({"metadata": {"name": "bad"},
                "spec": {"providerID": "aws:///z/i-2"},
                "status": {"allocatable": {"cpu": "4"}}})),
            Time(1),
        );
        assert!(s.rejected_provider_ids.is_empty());
    }

    #[test]
    fn only_gpu_pods_open_a_batching_window() {
        let mut s = ClusterState::default();
        let mut cpu = pod("cpu", true);
        cpu["spec"]["containers"][0]["resources"]["requests"] = json!({"cpu": "1"});
        s.apply(Kind::Pod, WatchEvent::Apply(cpu), Time(1));
        assert_eq!(s.new_unschedulable, 0);
        s.apply(Kind::Pod, WatchEvent::Apply(pod("gpu", true)), Time(1));
        assert_eq!(s.new_unschedulable, 1);
    }

    #[test]
    fn volume_claims_are_joined_with_the_pods_in_the_snapshot() {
        let mut s = ClusterState::default();
        let mut p = pod("web-0", true);
        p["spec"]["volumes"] =
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}}]);
        s.apply(Kind::Pod, WatchEvent::Apply(p), Time(0));
        let zone = |z: &str| -> BTreeMap<String, String> {
            [("topology.kubernetes.io/zone".to_string(), z.to_string())].into()
        };
        // Before the claims are listed, nothing is known: anywhere.
        let snap = s.snapshot(Vec::new());
        assert!(snap.pods[0].constraints.matches_node(&zone("a"), None));
        for k in [
            Kind::PersistentVolumeClaim,
            Kind::PersistentVolume,
            Kind::StorageClass,
        ] {
            s.apply(k, WatchEvent::Init, Time(0));
            s.apply(k, WatchEvent::InitDone, Time(0));
        }
        // Listed, and the claim is missing: the pod waits for it.
        let snap = s.snapshot(Vec::new());
        assert!(snap.pods[0]
            .waiting
            .as_deref()
            .unwrap()
            .contains("ml/data-web-0 does not exist"));
        s.apply(
            Kind::PersistentVolume,
            WatchEvent::Apply(
                json!({"metadata": {"name": "pv-b"}, "spec": {"nodeAffinity":
                {"required": {"nodeSelectorTerms": [{"matchExpressions": [{"key":
                "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}]}]}}}}),
            ),
            Time(1),
        );
        s.apply(
            Kind::PersistentVolumeClaim,
            WatchEvent::Apply(
                json!({"metadata": {"name": "data-web-0", "namespace": "ml"},
                "spec": {"volumeName": "pv-b", "storageClassName": "gp3"}}),
            ),
            Time(1),
        );
        let snap = s.snapshot(Vec::new());
        assert!(snap.pods[0].waiting.is_none());
        assert!(snap.pods[0].constraints.matches_node(&zone("b"), None));
        assert!(!snap.pods[0].constraints.matches_node(&zone("a"), None));
    }

    #[test]
    fn volume_attach_limit_of_a_csinode_reaches_the_snapshot_and_the_pods_volumes() {
        let mut s = ClusterState::default();
        let mut p = pod("web-0", true);
        p["spec"]["volumes"] =
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}}]);
        s.apply(Kind::Pod, WatchEvent::Apply(p), Time(0));
        s.apply(
            Kind::PersistentVolumeClaim,
            WatchEvent::Apply(
                json!({"metadata": {"name": "data-web-0", "namespace": "ml"},
                "spec": {"volumeName": "pv-1", "storageClassName": "gp3"}}),
            ),
            Time(0),
        );
        s.apply(
            Kind::PersistentVolume,
            WatchEvent::Apply(json!({"metadata": {"name": "pv-1"},
                "spec": {"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}}})),
            Time(0),
        );
        let attachments = |s: &ClusterState| {
            s.snapshot(Vec::new()).pods[0]
                .constraints
                .topology
                .as_ref()
                .map(|t| t.attachments.clone())
                .unwrap_or_default()
        };
        // No CSINode limits the driver: the volume is not an attachment.
        assert!(attachments(&s).is_empty());
        s.apply(
            Kind::CsiNode,
            WatchEvent::Apply(json!({"metadata": {"name": "n1"}, "spec": {"drivers": [
                {"name": "ebs.csi.aws.com", "nodeID": "i-1", "allocatable": {"count": 25}},
                {"name": "efs.csi.aws.com", "nodeID": "i-1"}]}})),
            Time(0),
        );
        let snap = s.snapshot(Vec::new());
        assert_eq!(
            snap.attach_limits.by_node["n1"],
            BTreeMap::from([("ebs.csi.aws.com".to_string(), 25)])
        );
        assert_eq!(
            attachments(&s),
            vec![gpu_node_autoscaler_core::model::topology::Attachment {
                driver: "ebs.csi.aws.com".into(),
                volume: "pv-1".into(),
            }]
        );
        s.apply(
            Kind::CsiNode,
            WatchEvent::Delete(json!({"metadata": {"name": "n1"}})),
            Time(0),
        );
        assert!(s.snapshot(Vec::new()).attach_limits.by_node.is_empty());
    }

    #[test]
    fn pods_claims_are_joined_with_the_dra_stores_in_the_snapshot() {
        let mut s = ClusterState::default();
        s.without_dra(Time(0));
        s.without_provisioning(Time(0));
        s.without_buffers(Time(0));
        for k in [
            Kind::Pod,
            Kind::Node,
            Kind::Pdb,
            Kind::PolicyConfigMap,
            Kind::PersistentVolumeClaim,
            Kind::PersistentVolume,
            Kind::StorageClass,
            Kind::CsiNode,
            Kind::Namespace,
        ] {
            s.apply(k, WatchEvent::Init, Time(0));
            s.apply(k, WatchEvent::InitDone, Time(0));
        }
        assert!(
            s.all_synced(),
            "a cluster without DRA is complete without its kinds"
        );
        let mut train = pod("train", true);
        train["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpus"}]});
        train["spec"]["resourceClaims"] =
            json!([{"name": "gpus", "resourceClaimTemplateName": "h100"}]);
        train["status"]["resourceClaimStatuses"] =
            json!([{"name": "gpus", "resourceClaimName": "train-gpus-x"}]);
        s.apply(Kind::Pod, WatchEvent::Apply(train), Time(1));
        // The claim's spec is not known yet, but the pod opens a batching window all the same.
        assert_eq!(s.new_unschedulable, 1);
        s.apply(
            Kind::DeviceClass,
            WatchEvent::Apply(json!({"metadata": {"name": "gpu.nvidia.com"},
                "spec": {"selectors": [{"cel": {"expression":
                    "device.driver == 'gpu.nvidia.com'"}}]}})),
            Time(1),
        );
        s.apply(
            Kind::ResourceClaimTemplate,
            WatchEvent::Apply(json!({"metadata": {"name": "h100", "namespace": "ml"},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu",
                    "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}}})),
            Time(1),
        );
        let slice = |name: &str, node: Option<&str>| {
            let mut v = json!({"metadata": {"name": name}, "spec": {
                "driver": "gpu.nvidia.com",
                "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}},
                            {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}}}]}});
            match node {
                Some(n) => v["spec"]["nodeName"] = json!(n),
                None => v["spec"]["allNodes"] = json!(true),
            }
            v
        };
        s.apply(
            Kind::ResourceSlice,
            WatchEvent::Apply(slice("n1-gpus", Some("n1"))),
            Time(1),
        );
        s.apply(
            Kind::ResourceSlice,
            WatchEvent::Apply(slice("everywhere", None)),
            Time(1),
        );
        s.apply(
            Kind::Node,
            WatchEvent::Apply(json!({"metadata": {"name": "n1"},
                "status": {"allocatable": {"cpu": "8", "pods": "110"}}})),
            Time(1),
        );
        let snap = s.snapshot(Vec::new());
        let claim = &snap.pods[0].claims[0];
        assert_eq!(claim.claim, "ml/train-gpus-x");
        assert_eq!(
            claim.spec.requests.len(),
            1,
            "the template's spec is joined"
        );
        assert!(snap.pods[0].wants_gpu() && snap.pods[0].problem.is_none());
        assert!(snap.dra.classes.contains_key("gpu.nvidia.com"));
        // Only the slice bound to the node counts; the node publishes its two devices.
        assert_eq!(snap.dra.slices.keys().collect::<Vec<_>>(), ["n1"]);
        assert_eq!(snap.nodes[0].dra_devices, 2);

        // The template goes: the pod is reported, not planned with a guess.
        s.apply(
            Kind::ResourceClaimTemplate,
            WatchEvent::Delete(json!({"metadata": {"name": "h100", "namespace": "ml"}})),
            Time(2),
        );
        let snap = s.snapshot(Vec::new());
        assert_eq!(
            snap.pods[0].problem.as_deref(),
            Some("ResourceClaimTemplate ml/h100 does not exist")
        );
        // A DRA watch that fails makes the cluster incomplete until it lists again.
        s.apply(
            Kind::ResourceSlice,
            WatchEvent::Lost("gone".into()),
            Time(3),
        );
        assert!(!s.all_synced());
    }

    #[test]
    fn policy_text_comes_from_its_key() {
        let mut s = ClusterState::default();
        s.apply(
            Kind::PolicyConfigMap,
            WatchEvent::Apply(json!({"metadata": {"name": "p", "namespace": "kube-system",
                "resourceVersion": "7", "uid": "u"}, "data": {"policy.yaml": "pools: []"}})),
            Time(0),
        );
        let p = s.policy_source().unwrap();
        assert_eq!(p.text.as_deref(), Some("pools: []"));
        assert_eq!(p.resource_version, "7");
    }
}
