//! The resources kube-sim serves, and the discovery documents built from them.

use serde_json::{json, Value};

/// A pod with this annotation (a duration such as `30s` or `2m`) succeeds that long after it
/// started running (the kubelet acts on it, validation checks it).
pub const RUN_DURATION_ANNOTATION: &str = "kube-sim.gpu-node-autoscaler.io/run-duration";

/// One served resource (a group/version/plural).
#[derive(Debug)]
pub struct ResourceDef {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    /// Whether the resource has a `status` subresource (status is then ignored on main updates).
    pub has_status: bool,
    /// Whether `metadata.name` is a DNS-1123 label (namespaces) rather than a subdomain.
    pub name_is_label: bool,
}

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `pods` or `poddisruptionbudgets.policy`, as used in `Status` messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

const fn def(
    group: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    has_status: bool,
) -> ResourceDef {
    ResourceDef {
        group,
        version: "v1",
        plural,
        singular,
        kind,
        namespaced,
        short_names,
        has_status,
        name_is_label: false,
    }
}

/// Every served resource; the index in this table identifies a resource in the store.
pub static RESOURCES: [ResourceDef; 13] = [
    ResourceDef {
        name_is_label: true,
        ..def(
            "",
            "namespaces",
            "namespace",
            "Namespace",
            false,
            &["ns"],
            true,
        )
    },
    def("", "pods", "pod", "Pod", true, &["po"], true),
    def("", "nodes", "node", "Node", false, &["no"], true),
    def(
        "",
        "configmaps",
        "configmap",
        "ConfigMap",
        true,
        &["cm"],
        false,
    ),
    def("", "events", "event", "Event", true, &["ev"], false),
    def(
        "policy",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        "PodDisruptionBudget",
        true,
        &["pdb"],
        true,
    ),
    def(
        "coordination.k8s.io",
        "leases",
        "lease",
        "Lease",
        true,
        &[],
        false,
    ),
    def(
        "events.k8s.io",
        "events",
        "event",
        "Event",
        true,
        &["ev"],
        false,
    ),
    // Served (storage only, no controller) so that `kubectl drain --ignore-daemonsets` can look
    // up the DaemonSet that owns a pod.
    def(
        "apps",
        "daemonsets",
        "daemonset",
        "DaemonSet",
        true,
        &["ds"],
        true,
    ),
    // Served (storage only: no volume binding or provisioning) so that the autoscaler's volume
    // topology watches list and watch them as on a real API server.
    def(
        "",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        "PersistentVolumeClaim",
        true,
        &["pvc"],
        true,
    ),
    def(
        "",
        "persistentvolumes",
        "persistentvolume",
        "PersistentVolume",
        false,
        &["pv"],
        true,
    ),
    def(
        "storage.k8s.io",
        "storageclasses",
        "storageclass",
        "StorageClass",
        false,
        &["sc"],
        false,
    ),
    def(
        "storage.k8s.io",
        "csinodes",
        "csinode",
        "CSINode",
        false,
        &[],
        false,
    ),
];

pub const NAMESPACES: usize = 0;
pub const PODS: usize = 1;
pub const NODES: usize = 2;
pub const CONFIGMAPS: usize = 3;
pub const PDBS: usize = 5;

/// The groups (besides the legacy core group) in discovery order.
const GROUPS: [&str; 5] = [
    "policy",
    "coordination.k8s.io",
    "events.k8s.io",
    "apps",
    "storage.k8s.io",
];

/// Finds a resource index by group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
}

pub fn group_version_known(group: &str, version: &str) -> bool {
    RESOURCES
        .iter()
        .any(|r| r.group == group && r.version == version)
}

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `APIResourceList` for a group/version (legacy discovery format).
pub fn resource_list(group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        resources.push(json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": VERBS,
            "shortNames": r.short_names,
        }));
        if r.has_status {
            resources.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if r.plural == "pods" && r.group.is_empty() {
            resources.push(json!({
                "name": "pods/binding", "singularName": "", "namespaced": true,
                "kind": "Binding", "verbs": ["create"],
            }));
            resources.push(json!({
                "name": "pods/eviction", "singularName": "", "namespaced": true,
                "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"],
            }));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

fn group_json(name: &str) -> Value {
    let gv = json!({"groupVersion": format!("{name}/v1"), "version": "v1"});
    json!({"name": name, "versions": [gv.clone()], "preferredVersion": gv})
}

/// `APIGroupList` served at `/apis`.
pub fn group_list() -> Value {
    let groups: Vec<Value> = GROUPS.iter().map(|g| group_json(g)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `APIGroup` served at `/apis/<group>`.
pub fn group(name: &str) -> Option<Value> {
    GROUPS.contains(&name).then(|| {
        let mut g = group_json(name);
        g["kind"] = json!("APIGroup");
        g["apiVersion"] = json!("v1");
        g
    })
}

/// `APIVersions` served at `/api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": "v1.32.0-kube-sim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.23",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// The OpenAPI v3 root (`/openapi/v3`): one document per served group/version.
///
/// kubectl only needs it to learn that the server validates fields itself
/// (`fieldValidation`), which spares it client-side schema validation.
pub fn openapi_v3_root() -> Value {
    let mut paths = serde_json::Map::new();
    let mut gvs: Vec<(&str, &str)> = RESOURCES.iter().map(|r| (r.group, r.version)).collect();
    gvs.dedup();
    for (g, v) in gvs {
        let p = gv_path(g, v);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=kube-sim")}),
        );
    }
    json!({"paths": paths})
}

/// A minimal OpenAPI v3 document for a group/version: the PATCH operation of every resource,
/// tagged with its group/version/kind and the `fieldValidation` query parameter.
pub fn openapi_v3_doc(gv: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    for r in RESOURCES
        .iter()
        .filter(|r| gv_path(r.group, r.version) == gv)
    {
        let item = if r.namespaced {
            format!("/{gv}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("/{gv}/{}/{{name}}", r.plural)
        };
        let op = json!({
            "operationId": format!("patch{}", r.kind),
            "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
            "parameters": [
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}}
            ],
            "responses": {"200": {"description": "OK"}}
        });
        paths.insert(item, json!({"patch": op}));
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (kube-sim)", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": {}}
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_list_has_subresources_and_short_names() {
        let list = resource_list("", "v1");
        let names: Vec<&str> = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        for n in [
            "pods",
            "pods/status",
            "pods/eviction",
            "nodes",
            "nodes/status",
            "configmaps",
            "events",
            "namespaces",
        ] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
        assert_eq!(list["resources"][0]["shortNames"][0], "ns");
    }

    #[test]
    fn find_resolves_group_resources() {
        assert_eq!(find("policy", "v1", "poddisruptionbudgets"), Some(PDBS));
        assert_eq!(find("", "v1", "pods"), Some(PODS));
        assert_eq!(find("", "v1", "deployments"), None);
        assert!(group("events.k8s.io").is_some());
        assert!(group("apps").is_some());
        assert!(group("batch").is_none());
    }
}
