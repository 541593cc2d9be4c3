//! The thin Kubernetes edge: watch tasks feeding the store, node updates, evictions, Events and
//! the status ConfigMap. No decisions are made here.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::{debug, info, warn};

use super::store::{ClusterState, Kind, WatchEvent};
use super::wall_now;
use gpu_node_autoscaler_provider::retry::{backoff, jitter_unit};

/// Feeds one kind's watch into the store. A failed watch marks the store stale and starts over
/// with a full list (after a jittered back-off), so no decision is made from stale state.
pub async fn watch_into<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: Kind,
    state: Arc<Mutex<ClusterState>>,
) where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug + Send + 'static,
{
    let mut failures: u32 = 0;
    loop {
        let mut stream = watcher(api.clone(), config.clone()).boxed();
        while let Some(ev) = stream.next().await {
            let ev = match ev {
                Ok(watcher::Event::Init) => WatchEvent::Init,
                Ok(watcher::Event::InitApply(o)) => WatchEvent::InitApply(to_json(&o)),
                Ok(watcher::Event::InitDone) => {
                    failures = 0;
                    info!(kind = kind.name(), "watch cache synced");
                    WatchEvent::InitDone
                }
                Ok(watcher::Event::Apply(o)) => WatchEvent::Apply(to_json(&o)),
                Ok(watcher::Event::Delete(o)) => WatchEvent::Delete(to_json(&o)),
                Err(e) => {
                    warn!(kind = kind.name(), error = %e, "watch failed; re-listing");
                    state
                        .lock()
                        .unwrap()
                        .apply(kind, WatchEvent::Lost(e.to_string()), wall_now());
                    break;
                }
            };
            state.lock().unwrap().apply(kind, ev, wall_now());
        }
        failures = failures.saturating_add(1);
        let wait = backoff(
            Duration::from_millis(500),
            Duration::from_secs(30),
            failures - 1,
            jitter_unit(super::seed()),
        );
        tokio::time::sleep(wait).await;
    }
}

/// Whether the API server serves Dynamic Resource Allocation (`resource.k8s.io/v1`, GA since
/// Kubernetes 1.34) with every kind the store reads. Discovery is open to every authenticated
/// client.
pub async fn serves_dra(client: &Client) -> Result<bool, kube::Error> {
    match client.list_api_group_resources(DRA_API_VERSION).await {
        Ok(list) => Ok(DRA_KINDS
            .iter()
            .all(|(_, _, plural)| list.resources.iter().any(|r| r.name == *plural))),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

const DRA_API_VERSION: &str = "resource.k8s.io/v1";

/// The store's kinds of `resource.k8s.io/v1`, with their object kind and resource name.
const DRA_KINDS: [(Kind, &str, &str); 4] = [
    (Kind::ResourceClaim, "ResourceClaim", "resourceclaims"),
    (
        Kind::ResourceClaimTemplate,
        "ResourceClaimTemplate",
        "resourceclaimtemplates",
    ),
    (Kind::DeviceClass, "DeviceClass", "deviceclasses"),
    (Kind::ResourceSlice, "ResourceSlice", "resourceslices"),
];

/// The cluster-wide API of each DRA kind, read as dynamic objects: the store takes JSON, and
/// the typed client stays at the oldest Kubernetes version supported.
pub fn dra_apis(client: &Client) -> Vec<(Kind, Api<kube::api::DynamicObject>)> {
    DRA_KINDS
        .iter()
        .map(|(kind, object_kind, plural)| {
            let resource = kube::api::ApiResource {
                group: "resource.k8s.io".into(),
                version: "v1".into(),
                api_version: DRA_API_VERSION.into(),
                kind: (*object_kind).into(),
                plural: (*plural).into(),
            };
            (*kind, Api::all_with(client.clone(), &resource))
        })
        .collect()
}

const PROVISIONING_API_VERSION: &str = "autoscaling.x-k8s.io/v1";

/// Which of the APIs that come with CRDs the API server serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    pub provisioning: bool,
    pub buffers: bool,
}

/// Asks discovery for ProvisioningRequests and CapacityBuffers (at start, and again while
/// either is missing: their CRDs may be installed later).
pub async fn serves_optional(client: &Client) -> Result<Served, kube::Error> {
    Ok(Served {
        provisioning: serves_provisioning(client).await?,
        buffers: serves_buffers(client).await?,
    })
}

/// Whether the API server serves ProvisioningRequests (`autoscaling.x-k8s.io/v1`, a CRD the
/// cluster installs).
pub async fn serves_provisioning(client: &Client) -> Result<bool, kube::Error> {
    serves(client, PROVISIONING_API_VERSION, "provisioningrequests").await
}

/// Whether the API server serves `plural` in `api_version` (404 for a group it does not know).
async fn serves(client: &Client, api_version: &str, plural: &str) -> Result<bool, kube::Error> {
    match client.list_api_group_resources(api_version).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == plural)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Conditions as the API writes them.
fn conditions_json(
    conditions: &[gpu_node_autoscaler_core::provisioning::Condition],
) -> Vec<serde_json::Value> {
    conditions
        .iter()
        .map(|c| {
            serde_json::json!({
                "type": c.kind,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": c.since.to_rfc3339(),
                "observedGeneration": c.observed_generation,
            })
        })
        .collect()
}

/// A merge patch of `name`'s status subresource; an object deleted meanwhile is not an error.
async fn patch_status_if_there(
    api: &Api<kube::api::DynamicObject>,
    name: &str,
    patch: &serde_json::Value,
) -> Result<(), kube::Error> {
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// A reference to a namespaced object, for Events.
fn object_ref(
    api_version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
    uid: &str,
) -> ObjectReference {
    ObjectReference {
        api_version: Some(api_version.into()),
        kind: Some(kind.into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: (!uid.is_empty()).then(|| uid.to_string()),
        ..Default::default()
    }
}

fn provisioning_resource() -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: "autoscaling.x-k8s.io".into(),
        version: "v1".into(),
        api_version: PROVISIONING_API_VERSION.into(),
        kind: "ProvisioningRequest".into(),
        plural: "provisioningrequests".into(),
    }
}

/// ProvisioningRequests in every namespace, as dynamic objects (the store takes JSON).
pub fn provisioning_api(client: &Client) -> Api<kube::api::DynamicObject> {
    Api::all_with(client.clone(), &provisioning_resource())
}

/// Writes a ProvisioningRequest's conditions (the whole list: the status subresource, merge
/// patch). A request deleted meanwhile is not an error.
pub async fn write_provisioning_conditions(
    client: &Client,
    update: &gpu_node_autoscaler_core::provisioning::Update,
) -> Result<(), kube::Error> {
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), &update.namespace, &provisioning_resource());
    let patch = serde_json::json!({"status": {"conditions": conditions_json(&update.conditions)}});
    patch_status_if_there(&api, &update.name, &patch).await
}

pub fn provisioning_request_ref(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    object_ref(
        PROVISIONING_API_VERSION,
        "ProvisioningRequest",
        namespace,
        name,
        uid,
    )
}

const BUFFER_API_VERSION: &str = "autoscaling.x-k8s.io/v1beta1";

/// Whether the API server serves CapacityBuffers (`autoscaling.x-k8s.io/v1beta1`, a CRD the
/// cluster installs).
pub async fn serves_buffers(client: &Client) -> Result<bool, kube::Error> {
    serves(client, BUFFER_API_VERSION, "capacitybuffers").await
}

fn buffer_resource() -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: "autoscaling.x-k8s.io".into(),
        version: "v1beta1".into(),
        api_version: BUFFER_API_VERSION.into(),
        kind: "CapacityBuffer".into(),
        plural: "capacitybuffers".into(),
    }
}

/// CapacityBuffers in every namespace, as dynamic objects (the store takes JSON).
pub fn buffer_api(client: &Client) -> Api<kube::api::DynamicObject> {
    Api::all_with(client.clone(), &buffer_resource())
}

/// Writes a CapacityBuffer's status (`replicas`, `podTemplateRef`, `provisioningStrategy`, the
/// whole list of conditions: the status subresource, merge patch). A buffer deleted meanwhile is
/// not an error.
pub async fn write_buffer_status(
    client: &Client,
    update: &gpu_node_autoscaler_core::buffer::Update,
) -> Result<(), kube::Error> {
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), &update.namespace, &buffer_resource());
    let st = &update.status;
    let patch = serde_json::json!({"status": {
        "replicas": st.replicas,
        "podTemplateRef": st.pod_template.as_ref().map(|n| serde_json::json!({"name": n})),
        "podTemplateGeneration": st.pod_template_generation,
        "provisioningStrategy": st.strategy,
        "conditions": conditions_json(&st.conditions),
    }});
    patch_status_if_there(&api, &update.name, &patch).await
}

/// Writes the PodTemplate of a `scalableRef` buffer (created, or replaced when the scalable
/// object's pod template changed), owned by the buffer so that the garbage collector removes it
/// with the buffer. A template created meanwhile (409) is replaced.
pub async fn write_buffer_template(
    client: &Client,
    w: &gpu_node_autoscaler_core::buffer::TemplateWrite,
) -> Result<(), kube::Error> {
    use k8s_openapi::api::core::v1::PodTemplate;
    let api: Api<PodTemplate> = Api::namespaced(client.clone(), &w.namespace);
    let object: PodTemplate = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {
            "name": w.name,
            "namespace": w.namespace,
            "labels": {"app.kubernetes.io/managed-by": "gpu-node-autoscaler"},
            "annotations": {gpu_node_autoscaler_core::buffer::SOURCE_HASH_ANNOTATION: w.hash},
            "ownerReferences": [{
                "apiVersion": BUFFER_API_VERSION,
                "kind": "CapacityBuffer",
                "name": w.buffer,
                "uid": w.buffer_uid,
                "controller": true,
            }],
        },
        "template": w.template,
    }))
    .map_err(kube::Error::SerdeError)?;
    if w.create {
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    api.replace(&w.name, &PostParams::default(), &object)
        .await
        .map(|_| ())
}

pub fn buffer_ref(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    object_ref(BUFFER_API_VERSION, "CapacityBuffer", namespace, name, uid)
}

fn to_json<K: Serialize>(o: &K) -> serde_json::Value {
    serde_json::to_value(o).unwrap_or(serde_json::Value::Null)
}

/// Reads a node, lets `change` edit it, and writes it back with its resourceVersion; retried on
/// conflicts. `change` returns false when there is nothing to write.
pub async fn modify_node(
    api: &Api<Node>,
    name: &str,
    mut change: impl FnMut(&mut Node) -> bool,
) -> Result<(), kube::Error> {
    for attempt in 0..5u32 {
        let Some(mut node) = api.get_opt(name).await? else {
            return Ok(());
        };
        if !change(&mut node) {
            return Ok(());
        }
        match api.replace(name, &PostParams::default(), &node).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < 4 => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sets or removes one annotation with a merge patch.
/// Adds (`present`) or removes a taint (matched by key and effect) of a Node; a missing Node is
/// no error.
pub async fn set_taint(
    api: &Api<Node>,
    name: &str,
    taint: &gpu_node_autoscaler_core::model::Taint,
    present: bool,
) -> Result<(), kube::Error> {
    let effect = taint.effect.as_str();
    modify_node(api, name, |n| {
        let taints = n
            .spec
            .get_or_insert_with(Default::default)
            .taints
            .get_or_insert_with(Vec::new);
        let has = taints
            .iter()
            .any(|t| t.key == taint.key && t.effect == effect);
        match (present, has) {
            (true, false) => {
                taints.push(k8s_openapi::api::core::v1::Taint {
                    key: taint.key.clone(),
                    value: Some(taint.value.clone()).filter(|v| !v.is_empty()),
                    effect: effect.to_string(),
                    time_added: None,
                });
                true
            }
            (false, true) => {
                taints.retain(|t| !(t.key == taint.key && t.effect == effect));
                true
            }
            _ => false,
        }
    })
    .await
}

pub async fn annotate_node(
    api: &Api<Node>,
    name: &str,
    key: &str,
    value: Option<&str>,
) -> Result<(), kube::Error> {
    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
    gone_is_done(
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    )
}

/// An object already gone (404) is not an error for a call that changes or deletes it.
fn gone_is_done<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Sets a pending pod's `status.nominatedNodeName` (the `pods/status` subresource). The UID in
/// the patch makes it fail on another pod re-created under the name; a pod gone is not an error.
pub async fn nominate_pod(
    client: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
    node: &str,
) -> Result<(), kube::Error> {
    let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
    let patch = serde_json::json!({
        "metadata": {"uid": uid},
        "status": {"nominatedNodeName": node},
    });
    gone_is_done(
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    )
}

/// How an eviction went.
#[derive(Clone, Debug, PartialEq)]
pub enum Evicted {
    /// Accepted, or the pod was already gone.
    Done,
    /// Refused by a PodDisruptionBudget (429): try again later.
    Blocked(String),
    /// The controller's RBAC does not allow it (403): retrying cannot help.
    Forbidden(String),
    Failed(String),
}

/// Evicts a pod through the Eviction API (PodDisruptionBudgets honoured), with its own grace
/// period or `grace_secs`.
pub async fn evict(
    client: &Client,
    namespace: &str,
    name: &str,
    grace_secs: Option<u64>,
) -> Evicted {
    let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), namespace);
    let body = eviction(namespace, name, grace_secs);
    let sent = api
        .create_subresource::<_, kube::core::Status>(
            "eviction",
            name,
            &PostParams::default(),
            &body,
        )
        .await;
    match sent {
        Ok(_) => Evicted::Done,
        Err(kube::Error::Api(s)) if s.code == 404 => Evicted::Done,
        Err(kube::Error::Api(s)) if s.code == 429 => Evicted::Blocked(s.message),
        Err(kube::Error::Api(s)) if s.code == 403 => Evicted::Forbidden(s.message),
        Err(e) => Evicted::Failed(e.to_string()),
    }
}

/// The Eviction of pod `namespace/name`, with `grace_secs` as its grace period when set. Written
/// out here rather than through kube's `Api::evict`, whose body names the field
/// `delete_options`: the API server drops that unknown field, and the pod would keep its own
/// grace period.
fn eviction(
    namespace: &str,
    name: &str,
    grace_secs: Option<u64>,
) -> k8s_openapi::api::policy::v1::Eviction {
    k8s_openapi::api::policy::v1::Eviction {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        },
        delete_options: grace_secs.map(|g| {
            k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions {
                grace_period_seconds: Some(g.min(i64::MAX as u64) as i64),
                ..Default::default()
            }
        }),
    }
}

/// The cluster's identity: the UID of its `kube-system` Namespace (stable for the cluster's life,
/// distinct between clusters, unlike a name an operator chooses).
pub async fn cluster_identity(client: &Client) -> Result<String, kube::Error> {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = api.get("kube-system").await?;
    Ok(ns.metadata.uid.unwrap_or_default())
}

pub async fn delete_node(api: &Api<Node>, name: &str) -> Result<(), kube::Error> {
    gone_is_done(api.delete(name, &DeleteParams::default()).await)
}

/// Updates the status ConfigMap's data, creating the ConfigMap when it is missing (deploy/ ships
/// it; its Role grants no `create`, so there a missing one is a clear error instead).
pub async fn write_status(
    client: &Client,
    namespace: &str,
    name: &str,
    data: BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let patch = serde_json::json!({"data": data});
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            let cm = ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(namespace.to_string()),
                    labels: Some(BTreeMap::from([(
                        "app.kubernetes.io/name".to_string(),
                        "gpu-node-autoscaler".to_string(),
                    )])),
                    ..Default::default()
                },
                data: Some(data),
                ..Default::default()
            };
            match api.create(&PostParams::default(), &cm).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(mut s)) if s.code == 403 => {
                    s.message = format!(
                        "the status ConfigMap {namespace}/{name} does not exist and may not be \
                         created (apply deploy/: it ships it): {}",
                        s.message
                    );
                    Err(kube::Error::Api(s))
                }
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// One Event to publish.
#[derive(Clone, Debug)]
pub struct Note {
    pub object: ObjectReference,
    pub warning: bool,
    pub reason: &'static str,
    pub action: &'static str,
    pub message: String,
}

pub fn pod_ref(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: (!uid.is_empty()).then(|| uid.to_string()),
        ..Default::default()
    }
}

pub fn node_ref(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.into()),
        // Events about cluster-scoped objects live in `default`, as kubectl looks for them.
        namespace: Some("default".into()),
        ..Default::default()
    }
}

pub fn configmap_ref(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: (!uid.is_empty()).then(|| uid.to_string()),
        ..Default::default()
    }
}

/// Publishes Events from a bounded queue at a bounded rate, so that a burst of 10,000 pending
/// pods never becomes a storm of writes. When the queue is full, Events are dropped (counted in
/// the log), never the decisions they describe.
#[derive(Clone)]
pub struct EventSink {
    tx: tokio::sync::mpsc::Sender<Note>,
    dropped: Arc<std::sync::atomic::AtomicU64>,
}

impl EventSink {
    pub fn start(client: Client, identity: &str, per_second: u32) -> EventSink {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Note>(2048);
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: "gpu-node-autoscaler".into(),
                instance: Some(identity.to_string()),
            },
        );
        let per_second = NonZeroU32::new(per_second.max(1)).expect("non-zero");
        let limiter: DefaultDirectRateLimiter = RateLimiter::direct(Quota::per_second(per_second));
        tokio::spawn(async move {
            while let Some(n) = rx.recv().await {
                limiter.until_ready().await;
                let ev = Event {
                    type_: if n.warning {
                        EventType::Warning
                    } else {
                        EventType::Normal
                    },
                    reason: n.reason.into(),
                    note: Some(truncate(&n.message, 1000)),
                    action: n.action.into(),
                    secondary: None,
                };
                if let Err(e) = recorder.publish(&ev, &n.object).await {
                    debug!(error = %e, reason = n.reason, "could not publish an Event");
                }
            }
        });
        EventSink {
            tx,
            dropped: Arc::default(),
        }
    }

    pub fn send(&self, note: Note) {
        info!(
            reason = note.reason,
            object = note.object.name.as_deref().unwrap_or(""),
            namespace = note.object.namespace.as_deref().unwrap_or(""),
            "{}",
            note.message
        );
        if self.tx.try_send(note).is_err() {
            let n = self
                .dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if n.is_power_of_two() {
                warn!(dropped = n + 1, "event queue full; Events dropped");
            }
        }
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interrupt_evictions_carry_the_cut_grace_period_where_the_api_server_reads_it() {
        assert_eq!(
            serde_json::to_value(eviction("ml", "trainer", Some(75))).unwrap(),
            serde_json::json!({
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": "trainer", "namespace": "ml"},
                "deleteOptions": {"gracePeriodSeconds": 75},
            })
        );
        // Its own grace period: no options at all.
        let own = serde_json::to_value(eviction("ml", "trainer", None)).unwrap();
        assert!(own.get("deleteOptions").is_none(), "{own}");
    }
}
