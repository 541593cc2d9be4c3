//! CapacityBuffers (`autoscaling.x-k8s.io/v1beta1`, warm capacity) on the real control plane,
//! with the CRD of `deploy/crds/` and the kwok provider.

use std::time::Duration;

use serde_json::Value;

use crate::cluster::{ClusterOptions, REPO};
use crate::kwok::kwok_env;
use crate::support::{gpu_pod, Env};
use crate::MIN;

const CRD: &str = "deploy/crds/capacitybuffers.autoscaling.x-k8s.io.yaml";
const EXAMPLES: &str = "deploy/examples/warm-gpu";

/// One-GPU nodes: a buffer of N one-GPU chunks is N nodes.
const POLICY: &str = "clusterName: e2e\nzones: [us-east-1a]\n\
batching: {idle: 1s, max: 3s}\nmaxNodeProvisionTime: 2m\n\
pools:\n- name: kwok-a10g\n  provider: kwok\n  instanceTypes: [g5.xlarge]\n\
\x20 capacityTypes: [on-demand]\n  maxNodes: 5\n\
\x20 taints:\n  - {key: nvidia.com/gpu, value: \"true\", effect: NoSchedule}\n\
\x20 scaleDown: {cooldownAfterScaleUp: 5s, unneededTime: 5s}\n";

const TEMPLATE: &str = "apiVersion: v1\nkind: PodTemplate\nmetadata:\n  name: replica\n  namespace: serve\n\
template:\n  spec:\n    tolerations:\n    - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n\
\x20   containers:\n    - name: main\n      image: cuda:12\n      resources:\n\
\x20       requests: {cpu: \"1\", memory: 2Gi, nvidia.com/gpu: \"1\"}\n\
\x20       limits: {nvidia.com/gpu: \"1\"}\n";

const BUFFER: &str = "apiVersion: autoscaling.x-k8s.io/v1beta1\nkind: CapacityBuffer\nmetadata:\n  name: warm\n  namespace: serve\n\
spec:\n  podTemplateRef: {name: replica}\n  replicas: 2\n";

fn install_crd(env: &Env) {
    env.kubectl_ok(&["create", "-f", &format!("{REPO}/{CRD}")]);
    env.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/capacitybuffers.autoscaling.x-k8s.io",
    ]);
}

fn condition(b: &Value, kind: &str) -> Option<Value> {
    b["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .cloned()
}

fn names(nodes: &[Value]) -> std::collections::BTreeSet<String> {
    nodes
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

fn ready(n: &Value) -> bool {
    n["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

#[test]
fn buffer_keeps_warm_gpu_nodes_a_real_pod_runs_at_once_and_the_buffer_is_replenished() {
    let mut env = kwok_env("capacity-buffer");
    install_crd(&env);
    env.create(&env.policy_configmap(POLICY));
    env.create("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: serve\n");
    env.start_controller("r1", &["--resync", "5s"]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });

    // A buffer of two one-GPU chunks and no pod at all: two nodes are launched.
    env.create(TEMPLATE);
    env.create(BUFFER);
    let warm = env.wait_for("two Ready nodes for the buffer", 3 * MIN, || {
        Some(env.pool_nodes()).filter(|n| n.len() >= 2 && n.iter().all(ready))
    });
    assert_eq!(warm.len(), 2, "two one-GPU chunks, two g5.xlarge: {warm:?}");
    let warm = names(&warm);
    let pods = env.get_json(&["get", "pods", "-A"]);
    assert!(
        pods["items"].as_array().is_none_or(|p| p.is_empty()),
        "no real pod: {pods}"
    );
    // Its status, as the Cluster Autoscaler writes it.
    let b = env.wait_for("the buffer's status", MIN, || {
        let b = env.get_json(&["get", "capacitybuffer", "-n", "serve", "warm"]);
        condition(&b, "Provisioning")
            .filter(|c| c["status"] == "True")
            .map(|_| b)
    });
    assert_eq!(b["status"]["replicas"], 2, "{b}");
    assert_eq!(b["status"]["podTemplateRef"]["name"], "replica", "{b}");
    assert_eq!(
        b["status"]["provisioningStrategy"], "buffer.x-k8s.io/active-capacity",
        "{b}"
    );
    assert_eq!(
        condition(&b, "ReadyForProvisioning").map(|c| c["status"].clone()),
        Some("True".into()),
        "{b}"
    );
    // The launch's Event is on the buffer (its chunks are no pods).
    let on_buffer = env.wait_for("a TriggeredScaleUp Event on the buffer", MIN, || {
        let e = env.events("TriggeredScaleUp");
        e.iter().any(|l| l.starts_with("warm: ")).then_some(e)
    });
    assert!(
        on_buffer.iter().all(|l| !l.starts_with("capacity-buffer.")),
        "{on_buffer:?}"
    );
    // Reported: both chunks warm, at a price.
    let warm_now = env.wait_for("the buffer's metrics", MIN, || {
        env.metric(
            "r1",
            "gpu_node_autoscaler_buffer_ready_replicas{buffer=\"serve/warm\"}",
        )
        .filter(|v| *v == 2.0)
    });
    assert_eq!(warm_now, 2.0);
    let cost = env.wait_for("the buffer's cost", MIN, || {
        env.metric(
            "r1",
            "gpu_node_autoscaler_buffer_cost_dollars_per_hour{buffer=\"serve/warm\"}",
        )
        .filter(|v| *v > 0.0)
    });
    // Two g5.xlarge at their on-demand list price.
    assert!((cost - 2.0 * 1.006).abs() < 1e-6, "{cost}");
    env.wait_for("the buffer in the status ConfigMap", MIN, || {
        let status = env.get_json(&[
            "get",
            "configmap",
            "-n",
            "kube-system",
            "gpu-node-autoscaler-status",
        ]);
        let text = status["data"]["buffers"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        text.contains(
            "serve/warm: 2 chunks (2 GPUs), 2 warm, 0 on their way, 0 without a node; $2.012/hour",
        )
        .then_some(())
    });

    // Empty, and past the pool's unneededTime and cooldown several passes over: kept warm,
    // nothing more launched.
    std::thread::sleep(Duration::from_secs(20));
    assert_eq!(
        names(&env.pool_nodes()),
        warm,
        "the buffer's nodes stay, and no more"
    );

    // A real pod takes a warm node at once (no launch for it); the buffer is replenished with a
    // new node.
    env.create(&gpu_pod("serve", "burst-0", &Default::default(), None));
    let node = env.wait_for("the real pod to run", MIN, || {
        let pod = env.get_json(&["get", "pod", "-n", "serve", "burst-0"]);
        (pod["status"]["phase"] == "Running")
            .then(|| pod["spec"]["nodeName"].as_str().map(str::to_string))
            .flatten()
    });
    assert!(
        warm.contains(&node),
        "burst-0 runs on {node}, not on a warm node {warm:?}"
    );
    let after = env.wait_for("the buffer to be replenished", 3 * MIN, || {
        Some(env.pool_nodes()).filter(|n| n.len() >= 3 && n.iter().all(ready))
    });
    assert_eq!(
        after.len(),
        3,
        "one node more for the room taken: {after:?}"
    );
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(env.pool_nodes().len(), 3, "replenished once");

    // Deleting the buffer lets its empty nodes go; the real pod's node stays.
    env.kubectl_ok(&["delete", "capacitybuffer", "-n", "serve", "warm"]);
    let left = env.wait_for("the buffer's empty nodes to be removed", 3 * MIN, || {
        Some(env.pool_nodes()).filter(|n| n.len() == 1)
    });
    assert_eq!(names(&left).into_iter().next(), Some(node));
    assert_eq!(env.pod_phase("serve", "burst-0"), "Running");
    env.wait_for("the buffer's series to go", MIN, || {
        let (_, body) = env.http_get("r1", "/metrics")?;
        (!body.contains("buffer=\"serve/warm\"")).then_some(())
    });
}

/// Every manifest of `deploy/examples/warm-gpu/` passes the API server's own validation, field
/// by field (`kubectl apply --dry-run=server --validate=strict`), against the CRD of
/// `deploy/crds/`; the CRD's own rules refuse a buffer without a count and one naming two shapes.
#[test]
fn buffer_examples_validate_against_the_api_server() {
    let dir = std::env::temp_dir().join(format!("gna-e2e-buffer-examples-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cluster = crate::cluster::Cluster::start(&dir, &ClusterOptions::default());
    cluster
        .kubectl(&["create", "-f", &format!("{REPO}/{CRD}")])
        .unwrap();
    cluster
        .kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/capacitybuffers.autoscaling.x-k8s.io",
        ])
        .unwrap();
    cluster
        .kubectl(&["create", "-f", &format!("{REPO}/{EXAMPLES}/namespace.yaml")])
        .unwrap();
    let mut files: Vec<String> = std::fs::read_dir(format!("{REPO}/{EXAMPLES}"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    for f in &files {
        let path = format!("{REPO}/{EXAMPLES}/{f}");
        let out = cluster
            .kubectl(&[
                "apply",
                "--dry-run=server",
                "--validate=strict",
                "-f",
                &path,
            ])
            .unwrap_or_else(|e| panic!("{EXAMPLES}/{f} does not validate: {e}"));
        assert!(out.contains("(server dry run)"), "{f}: {out}");
    }
    for (bad, says) in [
        (
            "spec:\n  podTemplateRef: {name: t}\n",
            "replicas or limits must be set",
        ),
        (
            "spec:\n  podTemplateRef: {name: t}\n  scalableRef: {kind: Deployment, name: d}\n  replicas: 1\n",
            "exactly one of podTemplateRef and scalableRef",
        ),
        (
            "spec:\n  podTemplateRef: {name: t}\n  replicas: -1\n",
            "spec.replicas",
        ),
    ] {
        let f = dir.join("bad.yaml");
        std::fs::write(
            &f,
            format!(
                "apiVersion: autoscaling.x-k8s.io/v1beta1\nkind: CapacityBuffer\nmetadata:\n  \
                 name: bad\n  namespace: serving\n{bad}"
            ),
        )
        .unwrap();
        let err = cluster
            .kubectl(&["apply", "--dry-run=server", "-f", f.to_str().unwrap()])
            .expect_err(bad);
        assert!(err.contains(says), "{bad}: {err}");
    }
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

const DEPLOYMENT: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: llm\n  namespace: serve\n\
spec:\n  replicas: 0\n  selector: {matchLabels: {app: llm}}\n  template:\n    metadata:\n      labels: {app: llm}\n\
\x20   spec:\n      tolerations:\n      - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n\
\x20     containers:\n      - name: main\n        image: cuda:12\n        resources:\n\
\x20         requests: {cpu: \"1\", memory: 2Gi, nvidia.com/gpu: \"1\"}\n\
\x20         limits: {nvidia.com/gpu: \"1\"}\n";

const SCALABLE_BUFFER: &str = "apiVersion: autoscaling.x-k8s.io/v1beta1\nkind: CapacityBuffer\nmetadata:\n  name: llm-warm\n  namespace: serve\n\
spec:\n  scalableRef: {apiGroup: apps, kind: Deployment, name: llm}\n  replicas: 1\n";

/// A `scalableRef` buffer: the controller writes the Deployment's pod template to a PodTemplate
/// of the buffer's own (owned by it, as the ServiceAccount `deploy/` grants), names it in
/// `status.podTemplateRef`, rewrites it when the Deployment's template changes, and the garbage
/// collector removes it with the buffer.
#[test]
fn buffer_scalable_ref_gets_its_own_pod_template_named_in_its_status() {
    let mut env = kwok_env("capacity-buffer-scalable");
    install_crd(&env);
    env.create(&env.policy_configmap(POLICY));
    env.create("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: serve\n");
    env.create(DEPLOYMENT);
    env.start_controller("r1", &["--resync", "5s"]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });
    env.create(SCALABLE_BUFFER);
    const OWN: &str = "capacitybuffer-llm-warm-pod-template";
    let b = env.wait_for(
        "status.podTemplateRef to name the buffer's own",
        2 * MIN,
        || {
            let b = env.get_json(&["get", "capacitybuffer", "-n", "serve", "llm-warm"]);
            (b["status"]["podTemplateRef"]["name"] == OWN).then_some(b)
        },
    );
    let t = env.get_json(&["get", "podtemplate", "-n", "serve", OWN]);
    let owner = &t["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "CapacityBuffer", "{t}");
    assert_eq!(owner["name"], "llm-warm", "{t}");
    assert_eq!(owner["uid"], b["metadata"]["uid"], "{t}");
    assert_eq!(
        t["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"], "1",
        "{t}"
    );
    assert_eq!(
        b["status"]["podTemplateGeneration"], t["metadata"]["generation"],
        "{b}"
    );
    // Its chunk is warm on a node of its own.
    env.wait_for("a Ready node for the buffer", 3 * MIN, || {
        Some(env.pool_nodes()).filter(|n| n.len() == 1 && n.iter().all(ready))
    });

    // The Deployment's pod template changes: the buffer's PodTemplate follows.
    env.kubectl_ok(&[
        "patch",
        "deployment",
        "-n",
        "serve",
        "llm",
        "--type=merge",
        "-p",
        r#"{"spec":{"template":{"metadata":{"labels":{"app":"llm","version":"v2"}}}}}"#,
    ]);
    env.wait_for(
        "the buffer's PodTemplate to follow the Deployment",
        2 * MIN,
        || {
            let t = env.get_json(&["get", "podtemplate", "-n", "serve", OWN]);
            (t["template"]["metadata"]["labels"]["version"] == "v2").then_some(())
        },
    );

    // Deleting the buffer takes its PodTemplate with it.
    env.kubectl_ok(&["delete", "capacitybuffer", "-n", "serve", "llm-warm"]);
    env.wait_for("the buffer's PodTemplate to go with it", 2 * MIN, || {
        let list = env.get_json(&["get", "podtemplates", "-n", "serve"]);
        list["items"]
            .as_array()
            .is_some_and(|i| i.iter().all(|t| t["metadata"]["name"] != OWN))
            .then_some(())
    });
    let log = env.log("r1");
    assert!(!log.contains("writing the buffer's PodTemplate"), "{log}");
}
