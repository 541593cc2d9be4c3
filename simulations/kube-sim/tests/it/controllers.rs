//! The simulated scheduler and kubelets, driven over HTTP.

use std::time::Duration;

use crate::common::{eventually, get, patch, post, start_with};
use serde_json::{json, Value};

const PODS: &str = "/api/v1/namespaces/default/pods";

fn fast() -> kube_sim::Config {
    kube_sim::Config {
        pod_start_delay: Duration::from_millis(200),
        ..kube_sim::Config::default()
    }
}

fn node(name: &str, labels: Value, allocatable: Value, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels}, "spec": spec,
        "status": {"capacity": allocatable, "allocatable": allocatable}})
}

fn gpu_alloc(gpus: u32) -> Value {
    json!({"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string()})
}

fn pod(name: &str, limits: Value, extra_spec: Value) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": limits}}]}});
    for (k, v) in extra_spec.as_object().into_iter().flatten() {
        p["spec"][k] = v.clone();
    }
    p
}

fn create(a: std::net::SocketAddr, path: &str, obj: &Value) {
    let (c, body) = post(a, path, obj);
    assert_eq!(c, 201, "{body}");
}

fn get_pod(a: std::net::SocketAddr, name: &str) -> Value {
    let (c, p) = get(a, &format!("{PODS}/{name}"));
    assert_eq!(c, 200, "{p}");
    p
}

fn bound_node(a: std::net::SocketAddr, name: &str) -> String {
    eventually(20, &format!("pod {name} to be bound"), || {
        get_pod(a, name)["spec"]["nodeName"]
            .as_str()
            .map(str::to_string)
    })
}

fn scheduled_condition(p: &Value) -> Option<Value> {
    p["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "PodScheduled")
        .cloned()
}

fn unschedulable_message(a: std::net::SocketAddr, name: &str) -> String {
    eventually(
        20,
        &format!("pod {name} to be marked unschedulable"),
        || {
            let c = scheduled_condition(&get_pod(a, name))?;
            (c["status"] == "False" && c["reason"] == "Unschedulable")
                .then(|| c["message"].as_str().unwrap().to_string())
        },
    )
}

fn phase(a: std::net::SocketAddr, name: &str) -> String {
    get_pod(a, name)["status"]["phase"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

#[test]
fn scheduler_binds_where_gpus_fit_and_retries_when_nodes_change() {
    let a = start_with(fast());
    create(
        a,
        "/api/v1/nodes",
        &node("small", json!({}), gpu_alloc(1), json!({})),
    );
    create(
        a,
        "/api/v1/nodes",
        &node("big", json!({}), gpu_alloc(4), json!({})),
    );
    create(
        a,
        "/api/v1/nodes",
        &node(
            "cpu",
            json!({}),
            json!({"cpu": "4", "memory": "8Gi", "pods": "110"}),
            json!({}),
        ),
    );

    create(
        a,
        PODS,
        &pod("two", json!({"nvidia.com/gpu": "2"}), json!({})),
    );
    assert_eq!(bound_node(a, "two"), "big");
    let c = scheduled_condition(&get_pod(a, "two")).unwrap();
    assert_eq!(c["status"], "True");

    // 2 of big's 4 GPUs are taken: 3 more fit nowhere.
    create(
        a,
        PODS,
        &pod("three", json!({"nvidia.com/gpu": "3"}), json!({})),
    );
    assert_eq!(
        unschedulable_message(a, "three"),
        "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    );
    assert!(get_pod(a, "three")["spec"]["nodeName"].is_null());

    // Extended resources of other vendors and MIG profiles are counted the same way.
    create(
        a,
        PODS,
        &pod(
            "mig",
            json!({"nvidia.com/mig-1g.5gb": "1", "cpu": "100"}),
            json!({}),
        ),
    );
    assert_eq!(
        unschedulable_message(a, "mig"),
        "0/3 nodes are available: 3 Insufficient cpu, 3 Insufficient nvidia.com/mig-1g.5gb."
    );

    // A new node with room: the pending pod is bound to it.
    create(
        a,
        "/api/v1/nodes",
        &node("huge", json!({}), gpu_alloc(8), json!({})),
    );
    assert_eq!(bound_node(a, "three"), "huge");
    let c = scheduled_condition(&get_pod(a, "three")).unwrap();
    assert_eq!(c["status"], "True");
}

#[test]
fn scheduler_honours_selectors_affinity_taints_cordon_and_readiness() {
    let a = start_with(fast());
    create(
        a,
        "/api/v1/nodes",
        &node(
            "a-cordoned",
            json!({"zone": "a"}),
            gpu_alloc(1),
            json!({"unschedulable": true}),
        ),
    );
    create(
        a,
        "/api/v1/nodes",
        &node(
            "b-tainted",
            json!({"zone": "b", "gen": "5"}),
            gpu_alloc(1),
            json!({"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}),
        ),
    );
    create(
        a,
        "/api/v1/nodes",
        &node(
            "c-plain",
            json!({"zone": "c", "gen": "3"}),
            gpu_alloc(1),
            json!({}),
        ),
    );

    create(
        a,
        PODS,
        &pod("anywhere", json!({"nvidia.com/gpu": "1"}), json!({})),
    );
    assert_eq!(bound_node(a, "anywhere"), "c-plain");

    // Tolerating the taint opens b; the GPU on c is taken.
    create(
        a,
        PODS,
        &pod(
            "tolerant",
            json!({"nvidia.com/gpu": "1"}),
            json!({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}),
        ),
    );
    assert_eq!(bound_node(a, "tolerant"), "b-tainted");

    create(
        a,
        PODS,
        &pod("zone-a", json!({}), json!({"nodeSelector": {"zone": "a"}})),
    );
    assert_eq!(
        unschedulable_message(a, "zone-a"),
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {nvidia.com/gpu: present}, 1 node(s) were unschedulable."
    );
    // Uncordoning a lets it in.
    let (c, body) = patch(
        a,
        "/api/v1/nodes/a-cordoned",
        "application/merge-patch+json",
        &json!({"spec": {"unschedulable": null}}),
    );
    assert_eq!(c, 200, "{body}");
    assert_eq!(bound_node(a, "zone-a"), "a-cordoned");

    let affinity = |exprs: Value| json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": exprs}]}}}});
    let mut spec = affinity(json!([{"key": "gen", "operator": "Gt", "values": ["4"]}]));
    spec["tolerations"] = json!([{"operator": "Exists"}]);
    create(a, PODS, &pod("gen-gt-4", json!({}), spec));
    assert_eq!(bound_node(a, "gen-gt-4"), "b-tainted");
    create(
        a,
        PODS,
        &pod(
            "not-c",
            json!({}),
            affinity(json!([
        {"key": "zone", "operator": "NotIn", "values": ["c"]},
        {"key": "gen", "operator": "DoesNotExist"}])),
        ),
    );
    assert_eq!(bound_node(a, "not-c"), "a-cordoned");
    create(
        a,
        PODS,
        &pod(
            "gen-lt-3",
            json!({}),
            affinity(json!([{"key": "gen", "operator": "Lt", "values": ["3"]}])),
        ),
    );
    assert!(unschedulable_message(a, "gen-lt-3").starts_with("0/3 nodes are available:"));

    // A node whose Ready condition is False counts as tainted not-ready.
    let (c, body) = patch(
        a,
        "/api/v1/nodes/c-plain/status",
        "application/strategic-merge-patch+json",
        &json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}}),
    );
    assert_eq!(c, 200, "{body}");
    create(
        a,
        PODS,
        &pod("on-c", json!({}), json!({"nodeSelector": {"zone": "c"}})),
    );
    assert_eq!(
        unschedulable_message(a, "on-c"),
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, 1 node(s) had untolerated taint {nvidia.com/gpu: present}."
    );
}

#[test]
fn kubelet_runs_bound_pods_and_finishes_them_after_their_run_duration() {
    let a = start_with(fast());
    let mut n = node("n1", json!({}), gpu_alloc(1), json!({}));
    n["status"]["addresses"] = json!([{"type": "InternalIP", "address": "10.0.0.9"}]);
    create(a, "/api/v1/nodes", &n);

    // The kubelet registers the node's Ready condition.
    eventually(20, "node Ready", || {
        let (_, n) = get(a, "/api/v1/nodes/n1");
        n["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready" && c["status"] == "True")
            .cloned()
    });

    let mut job = pod("job", json!({"nvidia.com/gpu": "1"}), json!({}));
    // Long enough to be seen Running by a poll on a busy machine.
    job["metadata"]["annotations"] = json!({"kube-sim.gpu-node-autoscaler.io/run-duration": "5s"});
    create(a, PODS, &job);

    eventually(20, "job Running", || {
        (phase(a, "job") == "Running").then_some(())
    });
    // Created once job holds the GPU, so that the scheduler cannot give it to this one first.
    create(
        a,
        PODS,
        &pod("next", json!({"nvidia.com/gpu": "1"}), json!({})),
    );
    let p = get_pod(a, "job");
    let st = &p["status"];
    for t in ["Initialized", "Ready", "ContainersReady", "PodScheduled"] {
        assert!(
            st["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["type"] == t && c["status"] == "True"),
            "{t}: {st}"
        );
    }
    assert_eq!(st["hostIP"], "10.0.0.9");
    assert!(
        st["podIP"]
            .as_str()
            .is_some_and(|ip| ip.starts_with("10.244.")),
        "{st}"
    );
    assert!(st["startTime"].is_string());
    assert_eq!(st["containerStatuses"][0]["ready"], true);
    assert!(st["containerStatuses"][0]["state"]["running"]["startedAt"].is_string());
    // The one GPU is taken while job runs.
    assert!(unschedulable_message(a, "next").contains("1 Insufficient nvidia.com/gpu"));

    eventually(20, "job Succeeded", || {
        (phase(a, "job") == "Succeeded").then_some(())
    });
    let st = get_pod(a, "job")["status"].clone();
    assert_eq!(
        st["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        0
    );
    assert!(st["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["type"] == "Ready" && c["status"] == "False"));
    // A finished pod frees its GPU for the pending one, which then runs.
    assert_eq!(bound_node(a, "next"), "n1");
    eventually(20, "next Running", || {
        (phase(a, "next") == "Running").then_some(())
    });

    // A bad run duration is rejected when the pod is created.
    let mut bad = pod("bad", json!({}), json!({}));
    bad["metadata"]["annotations"] =
        json!({"kube-sim.gpu-node-autoscaler.io/run-duration": "a while"});
    let (c, body) = post(a, PODS, &bad);
    assert_eq!(c, 422, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("run-duration"),
        "{body}"
    );
}

#[test]
fn kubelet_heartbeats_refresh_the_ready_condition() {
    let a = start_with(kube_sim::Config {
        heartbeat: Duration::from_millis(500),
        ..fast()
    });
    create(
        a,
        "/api/v1/nodes",
        &node("n1", json!({}), gpu_alloc(0), json!({})),
    );
    let beat = || {
        let (_, n) = get(a, "/api/v1/nodes/n1");
        n["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready")?["lastHeartbeatTime"]
            .as_str()
            .map(str::to_string)
    };
    let first = eventually(20, "a first heartbeat", beat);
    // Timestamps have second resolution: a later heartbeat shows as a later second.
    eventually(30, "a later heartbeat", || beat().filter(|b| *b > first));
}

#[test]
fn switched_off_controllers_leave_pods_alone() {
    let a = start_with(kube_sim::Config {
        scheduler: false,
        ..fast()
    });
    create(
        a,
        "/api/v1/nodes",
        &node("n1", json!({}), gpu_alloc(1), json!({})),
    );
    create(a, PODS, &pod("p", json!({}), json!({})));
    // The kubelet still runs the pods a client binds.
    let mut bound = pod("bound", json!({}), json!({}));
    bound["spec"]["nodeName"] = json!("n1");
    create(a, PODS, &bound);
    eventually(20, "bound Running", || {
        (phase(a, "bound") == "Running").then_some(())
    });
    assert!(
        get_pod(a, "p")["spec"]["nodeName"].is_null(),
        "no scheduler, no binding"
    );
    assert!(scheduled_condition(&get_pod(a, "p")).is_none());

    let a = start_with(kube_sim::Config {
        kubelet: false,
        ..fast()
    });
    let mut n = node("n1", json!({}), gpu_alloc(1), json!({}));
    n["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
    create(a, "/api/v1/nodes", &n);
    create(a, PODS, &pod("p", json!({}), json!({})));
    assert_eq!(bound_node(a, "p"), "n1");
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(phase(a, "p"), "Pending", "no kubelet, no Running");
}
