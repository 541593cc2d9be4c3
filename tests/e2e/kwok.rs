//! The kwok provider (`provider: kwok`): launches are Nodes that kwok plays the kubelets of, on
//! the real control plane, with the RBAC of `deploy/overlays/kwok`.

use std::time::Duration;

use gpu_node_autoscaler_core::policy::duration::parse_duration;

use crate::cluster::ClusterOptions;
use crate::support::{gpu_pod, Env, Options};
use crate::{no_labels, MIN};

const POLICY: &str = "clusterName: e2e\nzones: [us-east-1a, us-east-1b]\n\
batching: {idle: 1s, max: 3s}\nmaxNodeProvisionTime: 2m\n\
pools:\n- name: kwok-a10g\n  provider: kwok\n  instanceTypes: [g5.xlarge, g5.12xlarge]\n\
\x20 capacityTypes: [spot, on-demand]\n  maxNodes: 4\n\
\x20 taints:\n  - {key: nvidia.com/gpu, value: \"true\", effect: NoSchedule}\n\
\x20 scaleDown: {cooldownAfterScaleUp: 5s, unneededTime: 5s}\n";

/// A world whose controllers run with the RBAC of `deploy/overlays/kwok`.
pub fn kwok_env(name: &str) -> Env {
    Env::start(
        name,
        Options {
            cluster: ClusterOptions {
                rbac_from: Some("overlays/kwok"),
                ..Default::default()
            },
            ..Default::default()
        },
    )
}

#[test]
fn the_kwok_provider_launches_a_node_that_runs_the_pod_and_deletes_it_when_idle() {
    let mut env = kwok_env("kwok-provider");
    env.create(&env.policy_configmap(POLICY));
    // A Node of another cluster's kwok provider (same cluster name, another identity): never
    // listed as ours, never deleted.
    env.create(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: foreign-0\n  labels:\n    \
         kwok.gpu-node-autoscaler.io/cluster-id: another-cluster\n    \
         node.kubernetes.io/instance-type: g5.xlarge\n    topology.kubernetes.io/zone: us-east-1a\n  \
         annotations:\n    kwok.x-k8s.io/node: fake\n    kwok.gpu-node-autoscaler.io/cluster: e2e\n    \
         kwok.gpu-node-autoscaler.io/pool: kwok-a10g\n    kwok.gpu-node-autoscaler.io/launch-id: kwok-a10g-0\n    \
         kwok.gpu-node-autoscaler.io/capacity-type: spot\nspec:\n  providerID: kwok://foreign-0\n  \
         taints: [{key: nvidia.com/gpu, value: \"true\", effect: NoSchedule}]\n  unschedulable: true\n\
         status:\n  capacity: {cpu: \"4\", memory: 16Gi, pods: \"110\", nvidia.com/gpu: \"1\"}\n",
    );
    // Passes every 20 s, besides the batching window and the core's timers.
    env.start_controller("r1", &["--resync", "20s"]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });
    env.create(&gpu_pod("default", "trainer", &no_labels(), Some("15s")));

    let node = env.wait_for("the pod to run on a Node of the pool", 2 * MIN, || {
        let pod = env.get_json(&["get", "pod", "-n", "default", "trainer"]);
        (pod["status"]["phase"] == "Running")
            .then(|| pod["spec"]["nodeName"].as_str().map(str::to_string))
            .flatten()
    });
    // Registered into its pool from the instance (the provider set no pool label).
    let n = env.wait_for("the controller to register the Node", MIN, || {
        let n = env.get_json(&["get", "node", &node]);
        (n["metadata"]["labels"]["gpu-node-autoscaler.io/pool"] == "kwok-a10g").then_some(n)
    });
    let labels = &n["metadata"]["labels"];
    assert_eq!(n["spec"]["providerID"], format!("kwok://{node}"), "{n}");
    assert_eq!(
        labels["node.kubernetes.io/instance-type"], "g5.xlarge",
        "{n}"
    );
    assert_eq!(
        labels["gpu-node-autoscaler.io/pool"], "kwok-a10g",
        "the controller registers it: {n}"
    );
    assert_eq!(
        labels["gpu-node-autoscaler.io/capacity-type"], "spot",
        "{n}"
    );
    assert_eq!(labels["nvidia.com/gpu.product"], "NVIDIA-A10G", "{n}");
    // Pods may select the GPU model our templates predict: registration applies it.
    assert_eq!(labels["gpu-node-autoscaler.io/gpu-model"], "A10G", "{n}");
    assert_eq!(n["status"]["capacity"]["nvidia.com/gpu"], "1", "{n}");
    let ours = env.pool_nodes();
    assert_eq!(ours.len(), 1, "one launch for one pod");

    // The pod completes; after the cooldown and the unneeded time its Node goes, the other
    // cluster's stays.
    env.wait_for("the pod to finish", 2 * MIN, || {
        (env.pod_phase("default", "trainer") == "Succeeded").then_some(())
    });
    env.wait_for("the Node to be deleted", 2 * MIN, || {
        env.kubectl(&["get", "node", &node])
            .status
            .code()
            .filter(|c| *c != 0)
    });
    std::thread::sleep(Duration::from_secs(3));
    env.kubectl_ok(&["get", "node", "foreign-0"]);
    let events = env.events("ScaleDown");
    let ours = events.iter().find(|e| e.starts_with(&node));
    let ours = ours.unwrap_or_else(|| panic!("{events:?}"));
    // Drained when its 5 s unneeded time ran out, at the core's timer, not at the next resync
    // 20 s after the pass that found it unneeded.
    let idle = ours
        .split("empty (no GPU pods) for ")
        .nth(1)
        .and_then(|d| parse_duration(d.split_whitespace().next()?).ok());
    let idle = idle.unwrap_or_else(|| panic!("{ours}"));
    assert!(idle < Duration::from_secs(15), "{ours}");
}

#[test]
fn a_pending_pod_is_nominated_to_the_node_launched_for_it_and_bound_there() {
    // Nodes take 8 s to turn Ready: the controller nominates the pod meanwhile, with the
    // `patch` on `pods/status` that deploy/ grants, and the scheduler binds it there.
    let dir = std::env::temp_dir().join(format!("gna-e2e-nominate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let stages = dir.join("kwok-stages.yaml");
    let text = std::fs::read_to_string(crate::cluster::KWOK_STAGES).unwrap();
    let text = gpu_node_autoscaler_anchors::replay::with_node_delay(&text, Duration::from_secs(8))
        .unwrap();
    std::fs::write(&stages, text).unwrap();
    let mut env = Env::start(
        "kwok-nominate",
        Options {
            cluster: ClusterOptions {
                rbac_from: Some("overlays/kwok"),
                kwok_stages: Some(stages),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    env.create(&env.policy_configmap(POLICY));
    env.start_controller("r1", &[]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });
    env.create(&gpu_pod("default", "trainer", &no_labels(), None));
    let nominated = env.wait_for("the pod to be nominated to a node", MIN, || {
        let pod = env.get_json(&["get", "pod", "-n", "default", "trainer"]);
        let node = pod["status"]["nominatedNodeName"].as_str()?;
        assert!(
            pod["spec"]["nodeName"].is_null(),
            "nominated while pending: {pod}"
        );
        Some(node.to_string())
    });
    let n = env.get_json(&["get", "node", &nominated]);
    assert_eq!(
        n["metadata"]["annotations"]["kwok.gpu-node-autoscaler.io/pool"], "kwok-a10g",
        "a node launched for it: {n}"
    );
    let node = env.wait_for("the pod to run", MIN, || {
        let pod = env.get_json(&["get", "pod", "-n", "default", "trainer"]);
        (pod["status"]["phase"] == "Running")
            .then(|| pod["spec"]["nodeName"].as_str().map(str::to_string))
            .flatten()
    });
    assert_eq!(node, nominated);
    assert!(
        env.events("Nominated")
            .iter()
            .any(|e| e == &format!("trainer: expected on node {node} (nominated)")),
        "{:?}",
        env.events("Nominated")
    );
    let log = env.log("r1");
    assert!(!log.contains("nominating:"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
