//! End-to-end tests that drive the machine's real `kubectl` against an in-process kube-sim.

use crate::common::{start, Kubectl};
use gpu_node_autoscaler_core::yaml;
use serde_json::Value;

const CLUSTER: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: gpu-a
  labels: {pool: gpu, nvidia.com/gpu.product: A100}
status:
  capacity: {cpu: "8", memory: 64Gi, nvidia.com/gpu: "1"}
  allocatable: {cpu: "8", memory: 64Gi, nvidia.com/gpu: "1"}
---
apiVersion: v1
kind: Node
metadata:
  name: gpu-b
  labels: {pool: gpu}
---
apiVersion: v1
kind: Namespace
metadata:
  name: ml
---
apiVersion: v1
kind: Pod
metadata:
  name: trainer-0
  namespace: ml
  labels: {app: trainer}
  ownerReferences:
  - {apiVersion: apps/v1, kind: ReplicaSet, name: trainer, uid: 00000000-0000-0000-0000-000000000001, controller: true}
spec:
  nodeName: gpu-a
  containers:
  - name: main
    image: trainer:1
    resources: {limits: {nvidia.com/gpu: "1"}}
---
apiVersion: v1
kind: Pod
metadata:
  name: trainer-1
  namespace: ml
  labels: {app: trainer}
  ownerReferences:
  - {apiVersion: apps/v1, kind: ReplicaSet, name: trainer, uid: 00000000-0000-0000-0000-000000000001, controller: true}
spec:
  nodeName: gpu-b
  containers: [{name: main, image: trainer:1}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: dcgm-exporter, namespace: ml}
spec:
  selector: {matchLabels: {app: dcgm}}
  template:
    metadata: {labels: {app: dcgm}}
    spec: {containers: [{name: dcgm, image: dcgm:1}]}
---
apiVersion: v1
kind: Pod
metadata:
  name: dcgm-exporter-a
  namespace: ml
  labels: {app: dcgm}
  ownerReferences:
  - {apiVersion: apps/v1, kind: DaemonSet, name: dcgm-exporter, uid: 00000000-0000-0000-0000-000000000002, controller: true}
spec:
  nodeName: gpu-a
  containers: [{name: dcgm, image: dcgm:1}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: trainer
  namespace: ml
spec:
  minAvailable: 2
  selector:
    matchLabels: {app: trainer}
"#;

fn yaml(s: &str) -> Value {
    yaml::parse(s).expect("kubectl printed YAML")
}

/// `kubectl get WHAT -o jsonpath=PATH`.
fn jsonpath(k: &Kubectl, what: &[&str], path: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let path = format!("jsonpath={path}");
    args.extend(["-o", &path]);
    k.ok(&args)
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn create_get_and_delete() {
    let k = Kubectl::new(start());
    let out = k.create(CLUSTER);
    assert!(out.contains("node/gpu-a created"), "{out}");
    assert!(
        out.contains("poddisruptionbudget.policy/trainer created"),
        "{out}"
    );

    let nodes = k.ok(&["get", "nodes"]);
    assert!(
        nodes.contains("gpu-a") && nodes.contains("gpu-b"),
        "{nodes}"
    );
    let short = k.ok(&["get", "no", "gpu-a", "-o", "name"]);
    assert_eq!(short.trim(), "node/gpu-a");

    let table = k.ok(&["get", "pods", "-A"]);
    assert!(
        table.starts_with("NAMESPACE") && table.contains("trainer-0"),
        "{table}"
    );
    let pods = yaml(&k.ok(&["get", "pods", "-A", "-o", "yaml"]));
    assert_eq!(names(&pods), ["dcgm-exporter-a", "trainer-0", "trainer-1"]);
    let p0 = &pods["items"][1];
    assert_eq!(p0["metadata"]["namespace"], "ml");
    assert_eq!(
        p0["status"]["phase"], "Pending",
        "status is reset on create, as the apiserver does"
    );
    assert!(p0["metadata"]["uid"]
        .as_str()
        .is_some_and(|u| u.len() == 36));
    assert!(p0["metadata"]["resourceVersion"].as_str().is_some());
    assert!(p0["metadata"]["creationTimestamp"].as_str().is_some());
    assert_eq!(
        p0["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        "1"
    );

    let pdb = yaml(&k.ok(&["get", "pdb", "-n", "ml", "trainer", "-o", "yaml"]));
    assert_eq!(pdb["spec"]["minAvailable"], 2);
    let cms = k.run(&["get", "cm", "-A"], None);
    assert!(String::from_utf8_lossy(&cms.stderr).contains("No resources found"));

    let out = k.ok(&["delete", "pod", "-n", "ml", "trainer-1"]);
    assert!(out.contains("pod \"trainer-1\" deleted"), "{out}");
    let err = k.fails(&["get", "pod", "-n", "ml", "trainer-1"]);
    assert!(
        err.contains("NotFound") && err.contains("pods \"trainer-1\" not found"),
        "{err}"
    );
    let err = k.fails(&["delete", "node", "nope"]);
    assert!(err.contains("nodes \"nope\" not found"), "{err}");

    // Deleting the namespace removes what it holds.
    k.ok(&["delete", "namespace", "ml"]);
    let pods = yaml(&k.ok(&["get", "pods", "-A", "-o", "yaml"]));
    assert!(names(&pods).is_empty());
}

#[test]
fn create_rejects_bad_objects_with_apiserver_errors() {
    let k = Kubectl::new(start());
    let err = k.run(
        &["create", "-f", "-"],
        Some("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: Bad_Name\n"),
    );
    let stderr = String::from_utf8_lossy(&err.stderr);
    assert!(!err.status.success());
    assert!(
        stderr.contains("ConfigMap \"Bad_Name\" is invalid") && stderr.contains("RFC 1123"),
        "{stderr}"
    );
    k.create("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata: {a: b}\n");
    let err = k.run(
        &["create", "-f", "-"],
        Some("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n"),
    );
    assert!(String::from_utf8_lossy(&err.stderr).contains("AlreadyExists"));
    let err = k.run(&["create", "-f", "-"], Some("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: nope\nspec:\n  containers: [{name: c, image: i}]\n"));
    assert!(String::from_utf8_lossy(&err.stderr).contains("namespaces \"nope\" not found"));
}

#[test]
fn label_annotate_cordon_uncordon_taint() {
    let k = Kubectl::new(start());
    k.create(CLUSTER);
    k.ok(&["label", "node", "gpu-a", "team=ml"]);
    k.ok(&["label", "pod", "-n", "ml", "trainer-0", "stage=train"]);
    k.ok(&[
        "annotate",
        "node",
        "gpu-a",
        "gpu-node-autoscaler.io/note=hello",
    ]);
    let node = yaml(&k.ok(&["get", "node", "gpu-a", "-o", "yaml"]));
    assert_eq!(node["metadata"]["labels"]["team"], "ml");
    assert_eq!(node["metadata"]["labels"]["pool"], "gpu");
    assert_eq!(
        node["metadata"]["annotations"]["gpu-node-autoscaler.io/note"],
        "hello"
    );
    assert_eq!(
        node["status"]["allocatable"]["nvidia.com/gpu"], "1",
        "node status is kept on create"
    );
    let pod = yaml(&k.ok(&["get", "pod", "-n", "ml", "trainer-0", "-o", "yaml"]));
    assert_eq!(pod["metadata"]["labels"]["stage"], "train");

    // Overwriting needs --overwrite; removing with a trailing dash.
    k.fails(&["label", "node", "gpu-a", "team=infra"]);
    k.ok(&["label", "node", "gpu-a", "team=infra", "--overwrite"]);
    k.ok(&["label", "node", "gpu-a", "team-"]);
    k.ok(&["annotate", "node", "gpu-a", "gpu-node-autoscaler.io/note-"]);
    let node = yaml(&k.ok(&["get", "node", "gpu-a", "-o", "yaml"]));
    assert!(node["metadata"]["labels"].get("team").is_none());
    assert!(node["metadata"]["annotations"]
        .get("gpu-node-autoscaler.io/note")
        .is_none());

    assert!(k.ok(&["cordon", "gpu-a"]).contains("cordoned"));
    assert_eq!(
        jsonpath(&k, &["node", "gpu-a"], "{.spec.unschedulable}"),
        "true"
    );
    let selected = k.ok(&[
        "get",
        "nodes",
        "--field-selector",
        "spec.unschedulable=true",
        "-o",
        "name",
    ]);
    assert_eq!(selected.trim(), "node/gpu-a");
    assert!(k.ok(&["uncordon", "gpu-a"]).contains("uncordoned"));
    assert_eq!(
        jsonpath(&k, &["node", "gpu-a"], "{.spec.unschedulable}"),
        ""
    );

    k.ok(&[
        "taint",
        "node",
        "gpu-a",
        "gpu-node-autoscaler.io/to-be-deleted=1:NoSchedule",
        "a=b:NoExecute",
    ]);
    let taints = jsonpath(&k, &["node", "gpu-a"], "{.spec.taints[*].key}");
    assert_eq!(taints, "gpu-node-autoscaler.io/to-be-deleted a");
    k.ok(&[
        "taint",
        "node",
        "gpu-a",
        "gpu-node-autoscaler.io/to-be-deleted:NoSchedule-",
    ]);
    let taints = jsonpath(&k, &["node", "gpu-a"], "{.spec.taints[*].key}");
    assert_eq!(taints, "a");
    let err = k.fails(&["taint", "node", "gpu-a", "x=y:Sometimes"]);
    assert!(err.contains("effect"), "{err}");
}

fn set_running(k: &Kubectl, ns: &str, pod: &str) {
    k.ok(&[
        "patch",
        "pod",
        "-n",
        ns,
        pod,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#,
    ]);
}

#[test]
fn drain_is_blocked_by_a_pdb_then_allowed() {
    let k = Kubectl::new(start());
    k.create(CLUSTER);
    set_running(&k, "ml", "trainer-0");
    set_running(&k, "ml", "trainer-1");
    assert_eq!(
        jsonpath(&k, &["pod", "-n", "ml", "trainer-0"], "{.status.phase}"),
        "Running"
    );

    // minAvailable 2 with 2 healthy pods: no eviction allowed.
    let out = k.run(
        &[
            "drain",
            "gpu-a",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=3s",
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("disruption budget"), "{stderr}");
    assert_eq!(
        jsonpath(&k, &["node", "gpu-a"], "{.spec.unschedulable}"),
        "true"
    );
    k.ok(&["get", "pod", "-n", "ml", "trainer-0"]);

    k.ok(&[
        "patch",
        "pdb",
        "-n",
        "ml",
        "trainer",
        "--type=merge",
        "-p",
        r#"{"spec":{"minAvailable":1}}"#,
    ]);
    let drained = k.run(
        &[
            "drain",
            "gpu-a",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=20s",
        ],
        None,
    );
    let out = String::from_utf8_lossy(&drained.stdout);
    let err = String::from_utf8_lossy(&drained.stderr);
    assert!(drained.status.success(), "{out}\n{err}");
    assert!(
        err.contains("ignoring DaemonSet-managed Pods: ml/dcgm-exporter-a"),
        "{err}"
    );
    assert!(
        out.contains("evicting pod ml/trainer-0") || out.contains("pod/trainer-0 evicted"),
        "{out}"
    );
    assert!(out.contains("drained"), "{out}");
    let pods = yaml(&k.ok(&["get", "pods", "-A", "-o", "yaml"]));
    assert_eq!(
        names(&pods),
        ["dcgm-exporter-a", "trainer-1"],
        "DaemonSet pods stay, and so does the pod on the other node"
    );

    // The last healthy pod is protected by minAvailable 1.
    let out = k.run(
        &["drain", "gpu-b", "--ignore-daemonsets", "--timeout=2s"],
        None,
    );
    assert!(!out.status.success());
}

#[test]
fn get_events_from_both_event_apis() {
    let k = Kubectl::new(start());
    k.create(
        r#"
apiVersion: v1
kind: Event
metadata: {name: gpu-a.scale-up, namespace: default}
involvedObject: {kind: Node, name: gpu-a}
reason: TriggeredScaleUp
message: launched 1 x p4d.24xlarge
type: Normal
source: {component: gpu-node-autoscaler}
---
apiVersion: events.k8s.io/v1
kind: Event
metadata: {name: pod-x.not-triggered, namespace: default}
eventTime: "2026-01-01T00:00:00.000000Z"
reportingController: gpu-node-autoscaler.io/controller
reportingInstance: gpu-node-autoscaler-0
action: ScaleUp
reason: NotTriggerScaleUp
regarding: {kind: Pod, name: pod-x, namespace: default}
type: Warning
"#,
    );
    let all = k.ok(&["get", "events", "-A", "-o", "yaml"]);
    assert!(all.contains("TriggeredScaleUp"), "{all}");
    let filtered = k.ok(&[
        "get",
        "events",
        "--field-selector",
        "reason=TriggeredScaleUp",
        "-o",
        "name",
    ]);
    assert!(filtered.contains("gpu-a.scale-up"), "{filtered}");
    let new_api = k.ok(&["get", "events.v1.events.k8s.io", "-o", "yaml"]);
    assert!(new_api.contains("NotTriggerScaleUp"), "{new_api}");
}

#[test]
fn apply_and_watch() {
    let k = Kubectl::new(start());
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: policy\n  namespace: kube-system\ndata:\n  window: 10s\n";
    assert!(k
        .ok_stdin(&["apply", "-f", "-"], Some(cm))
        .contains("created"));
    let cm2 = cm.replace("10s", "20s");
    assert!(k
        .ok_stdin(&["apply", "-f", "-"], Some(&cm2))
        .contains("configured"));
    let got = yaml(&k.ok(&["get", "cm", "-n", "kube-system", "policy", "-o", "yaml"]));
    assert_eq!(got["data"]["window"], "20s");
    assert!(
        got["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );

    // `get --watch` ends at the request timeout and prints what it saw.
    let out = k.ok(&[
        "get",
        "cm",
        "-n",
        "kube-system",
        "--watch",
        "--request-timeout=1s",
        "-o",
        "name",
    ]);
    assert!(out.contains("configmap/policy"), "{out}");
}

const GPU_NODES: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: gpu-1
  labels: {pool: gpu}
status:
  capacity: {cpu: "8", memory: 64Gi, pods: "110", nvidia.com/gpu: "2"}
  allocatable: {cpu: "8", memory: 64Gi, pods: "110", nvidia.com/gpu: "2"}
---
apiVersion: v1
kind: Node
metadata:
  name: gpu-2
  labels: {pool: gpu}
status:
  capacity: {cpu: "8", memory: 64Gi, pods: "110", nvidia.com/gpu: "2"}
  allocatable: {cpu: "8", memory: 64Gi, pods: "110", nvidia.com/gpu: "2"}
"#;

fn gpu_pod(name: &str, gpus: u32, annotations: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations: {{{annotations}}}
  labels: {{app: train}}
  ownerReferences:
  - {{apiVersion: apps/v1, kind: ReplicaSet, name: train, uid: 00000000-0000-0000-0000-000000000009, controller: true}}
spec:
  containers:
  - name: main
    image: trainer:1
    resources: {{limits: {{nvidia.com/gpu: "{gpus}"}}}}
"#
    )
}

fn simulated() -> Kubectl {
    Kubectl::new(crate::common::start_with(kube_sim::Config {
        pod_start_delay: std::time::Duration::from_millis(300),
        ..kube_sim::Config::default()
    }))
}

#[test]
fn created_pods_are_scheduled_and_run_or_say_why_not() {
    let k = simulated();
    k.create(GPU_NODES);
    k.create(&gpu_pod("one", 2, ""));
    k.ok(&["wait", "--for=condition=Ready", "pod/one", "--timeout=60s"]);
    let pod = yaml(&k.ok(&["get", "pod", "one", "-o", "yaml"]));
    assert_eq!(pod["status"]["phase"], "Running");
    assert!(["gpu-1", "gpu-2"].contains(&pod["spec"]["nodeName"].as_str().unwrap()));

    k.create(&gpu_pod("too-big", 4, ""));
    k.ok(&[
        "wait",
        "--for=condition=PodScheduled=false",
        "pod/too-big",
        "--timeout=60s",
    ]);
    let why = k.ok(&[
        "get",
        "pod",
        "too-big",
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="PodScheduled")].reason}: {.status.conditions[?(@.type=="PodScheduled")].message}"#,
    ]);
    assert_eq!(
        why,
        "Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    );
    assert_eq!(
        jsonpath(&k, &["pod", "too-big"], "{.status.phase}"),
        "Pending"
    );
}

#[test]
fn a_run_duration_pod_succeeds() {
    let k = simulated();
    k.create(GPU_NODES);
    k.create(&gpu_pod(
        "job",
        1,
        r#"kube-sim.gpu-node-autoscaler.io/run-duration: 1s"#,
    ));
    k.ok(&[
        "wait",
        "--for=jsonpath={.status.phase}=Succeeded",
        "pod/job",
        "--timeout=60s",
    ]);
    let pod = yaml(&k.ok(&["get", "pod", "job", "-o", "yaml"]));
    assert_eq!(
        pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"],
        "Completed"
    );
}

#[test]
fn drain_evicts_and_nothing_moves() {
    let k = simulated();
    k.create(GPU_NODES);
    k.ok(&["cordon", "gpu-2"]);
    k.create(&gpu_pod("a", 1, ""));
    k.create(&gpu_pod("b", 1, ""));
    k.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/a",
        "pod/b",
        "--timeout=60s",
    ]);
    let on = jsonpath(&k, &["pods"], "{.items[*].spec.nodeName}");
    assert_eq!(on, "gpu-1 gpu-1", "gpu-2 is cordoned");
    k.ok(&["uncordon", "gpu-2"]);

    let out = k.run(
        &["drain", "gpu-1", "--ignore-daemonsets", "--timeout=60s"],
        None,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("pod/a evicted") && stdout.contains("pod/b evicted"),
        "{stdout}"
    );
    // No ReplicaSet controller runs: the evicted pods are gone, none was re-created on gpu-2.
    let pods = yaml(&k.ok(&["get", "pods", "-A", "-o", "yaml"]));
    assert!(names(&pods).is_empty(), "{pods:?}");
    assert_eq!(
        jsonpath(&k, &["node", "gpu-1"], "{.spec.unschedulable}"),
        "true"
    );
    // A new pod now goes to the other node.
    k.create(&gpu_pod("c", 2, ""));
    k.ok(&["wait", "--for=condition=Ready", "pod/c", "--timeout=60s"]);
    assert_eq!(jsonpath(&k, &["pod", "c"], "{.spec.nodeName}"), "gpu-2");
}
