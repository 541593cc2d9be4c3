//! The provider itself: Nodes created and deleted through the API server.

use super::*;

use std::collections::{BTreeMap, BTreeSet};

use gpu_node_autoscaler_provider::{
    CapacityType, Catalog, CloudProvider, Instance, InstanceState, LaunchRequest, LaunchResult,
    OfferingKey, ProviderError, Reservation, LAUNCH_FINGERPRINT_TAG,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::{Api, Client};
use serde_json::json;

/// What the provider needs besides the API server.
#[derive(Clone, Debug, Default)]
pub struct KwokConfig {
    /// The policy's `clusterName`.
    pub cluster: String,
    /// The cluster identity (kube-system Namespace UID); a label value, so at most 63 characters.
    pub cluster_id: String,
    /// The region label of every Node.
    pub region: String,
    /// The instance types and offerings that can be launched (prices as the catalog gives them).
    pub catalog: Catalog,
    /// Labels a Node of an instance type carries besides the well-known ones (e.g. the GPU
    /// product label GPU feature discovery would put there).
    pub type_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// Taints a pool's Nodes register with (the kubelet's `--register-with-taints`), as
    /// `(key, value, effect)`.
    pub register_taints: BTreeMap<String, Vec<(String, String, String)>>,
    /// Offerings that always fail with insufficient capacity.
    pub unavailable: BTreeSet<OfferingKey>,
    /// The GPU extended resources a pool's Node of an instance type advertises, by `(pool,
    /// instance type)`: MIG profiles, shared-GPU memory and cores, or nothing where a Dynamic
    /// Resource Allocation driver publishes the GPUs (ResourceSlices). A pool and type not here
    /// advertise the catalog's whole GPUs (`nvidia.com/gpu`, `amd.com/gpu`).
    pub gpu_resources: BTreeMap<(String, String), BTreeMap<String, i64>>,
    /// The capacity reservations of the pools' `kwok:` sections (each `available` is counted
    /// from the Nodes launched into it, not read from here).
    pub reservations: Vec<Reservation>,
}

/// The wall clock, in ms since the epoch (reservations start and end by it).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// How many more instances `r` takes at `now_ms`, with `used` Nodes in it: none outside its
/// start and end.
pub fn reservation_room(r: &Reservation, used: u32, now_ms: i64) -> u32 {
    if r.active_at(now_ms) {
        r.total.saturating_sub(used)
    } else {
        0
    }
}

/// Nodes in each reservation (by id), those being deleted left out (the cloud frees their slot).
fn used_by_reservation(instances: &[Instance]) -> BTreeMap<String, u32> {
    let mut used: BTreeMap<String, u32> = BTreeMap::new();
    for i in instances {
        if let (Some(r), InstanceState::Running) = (&i.reservation_id, i.state) {
            *used.entry(r.clone()).or_default() += 1;
        }
    }
    used
}

/// Nodes as instances, on the API server `client` talks to.
pub struct KwokProvider {
    nodes: Api<Node>,
    config: KwokConfig,
}

impl KwokProvider {
    /// A provider for `config`; `client` needs `create`, `get`, `list` and `delete` on Nodes.
    pub fn new(client: Client, config: KwokConfig) -> Result<KwokProvider, ProviderError> {
        if config.cluster_id.is_empty() || !is_label_value(&config.cluster_id) {
            return Err(ProviderError::InvalidRequest {
                message: format!(
                    "the cluster identity {:?} is not a Kubernetes label value",
                    config.cluster_id
                ),
            });
        }
        Ok(KwokProvider {
            nodes: Api::all(client),
            config,
        })
    }

    /// Whether `node` was created by this cluster's provider.
    fn owns(&self, node: &Node) -> bool {
        let labels = node.metadata.labels.as_ref();
        let annotations = node.metadata.annotations.as_ref();
        labels.and_then(|l| l.get(LABEL_CLUSTER_ID)) == Some(&self.config.cluster_id)
            && annotations.and_then(|a| a.get(ANNOTATION_CLUSTER)) == Some(&self.config.cluster)
    }

    /// The Node of one instance of `offering` for `request`.
    fn node_object(
        &self,
        name: &str,
        request: &LaunchRequest,
        offering: &OfferingKey,
        reservation: Option<&str>,
    ) -> Result<Node, ProviderError> {
        let t = self
            .config
            .catalog
            .instance_type(&offering.instance_type)
            .ok_or_else(|| ProviderError::InvalidRequest {
                message: format!(
                    "instance type {} is not in the kwok provider's catalog",
                    offering.instance_type
                ),
            })?;
        let mut labels: BTreeMap<String, String> = BTreeMap::new();
        for (k, v) in [
            ("kubernetes.io/hostname", name),
            ("kubernetes.io/arch", "amd64"),
            ("kubernetes.io/os", "linux"),
            ("node.kubernetes.io/instance-type", &offering.instance_type),
            ("topology.kubernetes.io/zone", &offering.zone),
            ("topology.kubernetes.io/region", &self.config.region),
            ("type", "kwok"),
            (LABEL_CLUSTER_ID, &self.config.cluster_id),
        ] {
            labels.insert(k.to_string(), v.to_string());
        }
        if let Some(extra) = self.config.type_labels.get(&t.name) {
            labels.extend(extra.clone());
        }
        // The launch's tags that can be annotations (a Cluster Autoscaler node-template tag,
        // `k8s.io/cluster-autoscaler/node-template/taint/<key>`, cannot: it is for a cloud's
        // bootstrap, and the controller applies the pool's labels and taints itself).
        let mut annotations: BTreeMap<String, String> = request
            .tags
            .iter()
            .filter(|(k, _)| is_qualified_name(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, v) in [
            (KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE),
            (ANNOTATION_CLUSTER, &self.config.cluster),
            (ANNOTATION_POOL, &request.pool),
            (ANNOTATION_LAUNCH_ID, &request.launch_id),
            (ANNOTATION_CAPACITY_TYPE, offering.capacity_type.as_str()),
        ] {
            annotations.insert(k.to_string(), v.to_string());
        }
        if let Some(r) = reservation {
            annotations.insert(ANNOTATION_RESERVATION_ID.to_string(), r.to_string());
        }
        let mut capacity = json!({
            "cpu": t.vcpu.to_string(),
            "memory": format!("{}Mi", t.memory_mib),
            "pods": MAX_PODS.to_string(),
            "ephemeral-storage": "200Gi",
        });
        match self
            .config
            .gpu_resources
            .get(&(request.pool.clone(), t.name.clone()))
        {
            Some(gpus) => {
                for (k, v) in gpus {
                    capacity[k] = json!(v.to_string());
                }
            }
            None => {
                if let Some(g) = &t.gpu {
                    capacity[g.vendor.resource()] = json!(g.count.to_string());
                }
            }
        }
        let taints: Vec<_> = self
            .config
            .register_taints
            .get(&request.pool)
            .into_iter()
            .flatten()
            .map(|(key, value, effect)| json!({"key": key, "value": value, "effect": effect}))
            .collect();
        let node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"providerID": format!("{PROVIDER_ID_PREFIX}{name}"), "taints": taints},
            // As a kubelet registers: NotReady until it has started (kwok's node Stages make it
            // Ready), so that the node lifecycle controller keeps its not-ready taint meanwhile.
            "status": {
                "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                                "message": "kwok: the node is starting"}],
                "capacity": capacity,
                "allocatable": capacity,
                "nodeInfo": {
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "kubeletVersion": "kwok",
                    "kubeProxyVersion": "kwok",
                    "containerRuntimeVersion": "kwok",
                    "kernelVersion": "kwok",
                    "osImage": "kwok",
                    "machineID": "", "systemUUID": "", "bootID": ""
                },
            },
        });
        serde_json::from_value(node).map_err(|e| ProviderError::Other {
            message: format!("building Node {name}: {e}"),
        })
    }

    /// Every Node of this cluster's provider.
    async fn ours(&self) -> Result<Vec<Node>, ProviderError> {
        let lp =
            ListParams::default().labels(&format!("{LABEL_CLUSTER_ID}={}", self.config.cluster_id));
        let list = self.nodes.list(&lp).await.map_err(api_error)?;
        Ok(list.items.into_iter().filter(|n| self.owns(n)).collect())
    }
}

/// The instance a Node of ours stands for; None when its annotations are incomplete.
pub fn instance_of(node: &Node) -> Option<Instance> {
    let name = node.metadata.name.clone()?;
    let annotations = node.metadata.annotations.as_ref()?;
    let labels = node.metadata.labels.as_ref()?;
    let capacity_type = CapacityType::parse(annotations.get(ANNOTATION_CAPACITY_TYPE)?)?;
    let state = if node.metadata.deletion_timestamp.is_some() {
        InstanceState::ShuttingDown
    } else {
        InstanceState::Running
    };
    Some(Instance {
        id: name.clone(),
        provider_id: format!("{PROVIDER_ID_PREFIX}{name}"),
        pool: annotations.get(ANNOTATION_POOL)?.clone(),
        launch_id: annotations.get(ANNOTATION_LAUNCH_ID)?.clone(),
        offering: OfferingKey {
            instance_type: labels.get("node.kubernetes.io/instance-type")?.clone(),
            zone: labels.get("topology.kubernetes.io/zone")?.clone(),
            capacity_type,
        },
        state,
        launched_at_ms: node
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_millisecond()),
        reservation_id: annotations.get(ANNOTATION_RESERVATION_ID).cloned(),
        launch_fingerprint: annotations.get(LAUNCH_FINGERPRINT_TAG).cloned(),
        unclaimed: false,
    })
}

/// The Node name of instance `index` of a launch: the launch id (pool and hash) made a DNS label,
/// and the index, so that a launch retried after a crash finds the Nodes it made.
pub fn node_name(launch_id: &str, index: u32) -> String {
    let mut base: String = launch_id
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() {
                c
            } else {
                '-'
            }
        })
        .collect();
    base.truncate(56);
    let base = base.trim_matches('-');
    format!("{base}-{index}")
}

/// A Kubernetes label or annotation key: an optional DNS-subdomain prefix and `/`, then a name of
/// at most 63 alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
fn is_qualified_name(k: &str) -> bool {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    });
    prefix_ok && !name.is_empty() && is_label_value(name)
}

fn is_label_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && v.chars().next().is_none_or(|c| c.is_ascii_alphanumeric())
        && v.chars().last().is_none_or(|c| c.is_ascii_alphanumeric())
}

fn api_error(e: kube::Error) -> ProviderError {
    match &e {
        kube::Error::Api(s) if s.code == 429 => ProviderError::Throttled { retry_after: None },
        kube::Error::Api(s) if s.code == 404 => ProviderError::NotFound {
            id: s.message.clone(),
        },
        kube::Error::Api(s) if s.code == 403 || s.code == 422 || s.code == 400 => {
            ProviderError::InvalidRequest {
                message: e.to_string(),
            }
        }
        _ => ProviderError::Other {
            message: e.to_string(),
        },
    }
}

#[async_trait::async_trait]
impl CloudProvider for KwokProvider {
    fn name(&self) -> &str {
        "kwok"
    }

    async fn catalog(&self) -> Result<Catalog, ProviderError> {
        let mut c = self.config.catalog.clone();
        for o in &mut c.offerings {
            o.available = !self.config.unavailable.contains(&o.key);
        }
        Ok(c)
    }

    async fn launch(&self, request: &LaunchRequest) -> Result<LaunchResult, ProviderError> {
        if request.count > MAX_LAUNCH {
            return Err(ProviderError::InvalidRequest {
                message: format!(
                    "a launch of {} Nodes (at most {MAX_LAUNCH} at once)",
                    request.count
                ),
            });
        }
        let mut result = LaunchResult::default();
        // The Nodes an earlier try of this launch made (a crash between create and the answer).
        let existing: Vec<Instance> = self
            .ours()
            .await?
            .iter()
            .filter_map(instance_of)
            .filter(|i| i.launch_id == request.launch_id)
            .collect();
        let taken: BTreeSet<String> = existing.iter().map(|i| i.id.clone()).collect();
        result.launched.extend(existing);
        // What the reservations hold now: counted from every Node of ours in them.
        let now = now_ms();
        let mut used = if request
            .offerings
            .iter()
            .any(|o| o.capacity_type == CapacityType::Reserved)
        {
            used_by_reservation(
                &self
                    .ours()
                    .await?
                    .iter()
                    .filter_map(instance_of)
                    .collect::<Vec<_>>(),
            )
        } else {
            BTreeMap::new()
        };
        let mut index = 0u32;
        for offering in &request.offerings {
            if result.launched.len() as u32 >= request.count {
                break;
            }
            if self.config.unavailable.contains(offering) {
                result.failures.push((
                    offering.clone(),
                    ProviderError::InsufficientCapacity {
                        offering: offering.clone(),
                    },
                ));
                continue;
            }
            while (result.launched.len() as u32) < request.count {
                // A reserved offering launches into the first reservation the request names
                // for it (those its pool selects, in the request's order) that has room here;
                // with none, it is short of capacity (that offering only).
                let reservation = if offering.capacity_type == CapacityType::Reserved {
                    let room = request
                        .reservations
                        .iter()
                        .filter(|t| t.offering() == *offering)
                        .filter_map(|t| self.config.reservations.iter().find(|r| r.id == t.id))
                        .find(|r| {
                            r.offering() == *offering
                                && reservation_room(r, used.get(&r.id).copied().unwrap_or(0), now)
                                    > 0
                        });
                    match room {
                        Some(r) => Some(r.id.clone()),
                        None => {
                            result.failures.push((
                                offering.clone(),
                                ProviderError::InsufficientCapacity {
                                    offering: offering.clone(),
                                },
                            ));
                            break;
                        }
                    }
                } else {
                    None
                };
                let name = node_name(&request.launch_id, index);
                index += 1;
                if taken.contains(&name) {
                    continue;
                }
                let node = self.node_object(&name, request, offering, reservation.as_deref())?;
                let created = match self.nodes.create(&PostParams::default(), &node).await {
                    Ok(n) => n,
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        // Someone else's Node of that name: not ours to count, try the next name.
                        match self.nodes.get_opt(&name).await.map_err(api_error)? {
                            Some(n) if self.owns(&n) => n,
                            _ => continue,
                        }
                    }
                    Err(e) => {
                        result.failures.push((offering.clone(), api_error(e)));
                        break;
                    }
                };
                if let Some(i) = instance_of(&created) {
                    if let Some(r) = &i.reservation_id {
                        *used.entry(r.clone()).or_default() += 1;
                    }
                    result.launched.push(i);
                }
            }
        }
        Ok(result)
    }

    async fn terminate(&self, instance_id: &str) -> Result<(), ProviderError> {
        let Some(node) = self.nodes.get_opt(instance_id).await.map_err(api_error)? else {
            return Ok(());
        };
        if !self.owns(&node) {
            return Err(ProviderError::InvalidRequest {
                message: format!(
                    "Node {instance_id} was not launched by this cluster's kwok provider \
                     (label {LABEL_CLUSTER_ID}, annotation {ANNOTATION_CLUSTER}): not deleted"
                ),
            });
        }
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: node.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.nodes.delete(instance_id, &dp).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
            Err(e) => Err(api_error(e)),
        }
    }

    async fn list(&self, pool: &str) -> Result<Vec<Instance>, ProviderError> {
        let now = now_ms();
        let mut out = Vec::new();
        for i in self.ours().await?.iter().filter_map(instance_of) {
            if i.pool != pool {
                continue;
            }
            // A reservation that has ended takes its instances back, as the cloud does at a
            // Capacity Block's end: what still runs there is gone.
            let ended = i.reservation_id.as_ref().and_then(|id| {
                self.config
                    .reservations
                    .iter()
                    .find(|r| &r.id == id && r.end_ms.is_some_and(|e| e <= now))
            });
            if ended.is_some() {
                self.terminate(&i.id).await?;
                continue;
            }
            out.push(i);
        }
        Ok(out)
    }

    /// The pools' `kwok:` reservations, each with what is left of it now: its count less the
    /// Nodes of ours in it, none outside its start and end.
    async fn reservations(&self) -> Result<Vec<Reservation>, ProviderError> {
        if self.config.reservations.is_empty() {
            return Ok(Vec::new());
        }
        let instances: Vec<Instance> = self.ours().await?.iter().filter_map(instance_of).collect();
        let used = used_by_reservation(&instances);
        let now = now_ms();
        Ok(self
            .config
            .reservations
            .iter()
            .map(|r| Reservation {
                available: reservation_room(r, used.get(&r.id).copied().unwrap_or(0), now),
                ..r.clone()
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_dns_labels_found_again_from_the_launch_id() {
        assert_eq!(node_name("a10g-0123456789ab", 2), "a10g-0123456789ab-2");
        assert_eq!(node_name("Big_Pool-ff", 0), "big-pool-ff-0");
        let long = node_name(&"x".repeat(100), 12);
        assert!(long.len() <= 63, "{long}");
        assert_eq!(
            node_name("a10g-0123456789ab", 2),
            node_name("a10g-0123456789ab", 2)
        );
    }

    #[test]
    fn only_qualified_names_become_annotations() {
        assert!(is_qualified_name("gpu-node-autoscaler.io/pool"));
        assert!(is_qualified_name("team"));
        assert!(!is_qualified_name(
            "k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu"
        ));
        assert!(!is_qualified_name("Bad.Prefix/x"));
        assert!(!is_qualified_name("/x"));
    }

    #[test]
    fn cluster_ids_must_be_label_values() {
        assert!(is_label_value("0b6c1d3e-6f0e-4d7e-9a51-3f4c2a0f9d11"));
        assert!(!is_label_value("-x"));
        assert!(!is_label_value(&"a".repeat(64)));
        assert!(!is_label_value("a/b"));
    }

    #[test]
    fn a_node_without_complete_annotations_is_no_instance() {
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": {"node.kubernetes.io/instance-type": "g5.xlarge",
                "topology.kubernetes.io/zone": "us-east-1a"},
                "annotations": {ANNOTATION_POOL: "a10g", ANNOTATION_LAUNCH_ID: "a10g-1"}}
        }))
        .unwrap();
        assert_eq!(instance_of(&n), None);
        let mut n = n;
        n.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANNOTATION_CAPACITY_TYPE.into(), "spot".into());
        let i = instance_of(&n).unwrap();
        assert_eq!(i.provider_id, "kwok://n");
        assert_eq!(i.offering.capacity_type, CapacityType::Spot);
        assert_eq!(i.state, InstanceState::Running);
    }
}
