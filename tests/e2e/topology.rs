//! Rules across nodes that kube-scheduler enforces, on the real scheduler: zone spread with
//! hostname anti-affinity, host ports, volumes; and the safety net for a rule the planner does
//! not model (a pod refused a node it fits is planned again without it). The kwok provider's
//! Nodes carry the zone and hostname labels a kubelet and the cloud would set.

use std::collections::{BTreeMap, BTreeSet};

use gpu_node_autoscaler_test_support::provisioner;
use serde_json::Value;

use crate::kwok::kwok_env;
use crate::support::Env;
use crate::MIN;

/// Three zones, one pool of 4-GPU g5.12xlarge nodes only: without the rules one node would be
/// planned for up to four of the one-GPU pods below.
const POLICY: &str = "clusterName: e2e\nzones: [us-east-1a, us-east-1b, us-east-1c]\n\
batching: {idle: 1s, max: 3s}\nmaxNodeProvisionTime: 2m\n\
pools:\n- name: kwok-a10g\n  provider: kwok\n  instanceTypes: [g5.12xlarge]\n\
\x20 capacityTypes: [spot, on-demand]\n  maxNodes: 8\n\
\x20 taints:\n  - {key: nvidia.com/gpu, value: \"true\", effect: NoSchedule}\n\
\x20 scaleDown: {cooldownAfterScaleUp: 5m, unneededTime: 5m}\n";

/// A pod template's spec part: one container asking for a GPU, tolerating the pool's taint,
/// with `extra` (YAML at the spec's indentation, 6 spaces) and `ports` for the container.
fn gpu_spec(extra: &str, ports: &str) -> String {
    format!(
        "      tolerations:\n      - {{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}}\n\
         {extra}      containers:\n      - name: main\n        image: cuda:12\n{ports}\
         \x20       resources:\n          requests: {{cpu: \"1\", memory: 2Gi, nvidia.com/gpu: \"1\"}}\n\
         \x20         limits: {{nvidia.com/gpu: \"1\"}}\n"
    )
}

fn started(name: &str) -> Env {
    let mut env = kwok_env(name);
    env.create(&env.policy_configmap(POLICY));
    env.start_controller("r1", &[]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });
    env
}

/// The Running pods labelled `app=<app>`, once there are `n`: their Nodes' names.
fn running_on(env: &Env, app: &str, n: usize) -> Vec<String> {
    env.wait_for(&format!("{n} pods of {app} to run"), 3 * MIN, || {
        let pods = env.get_json(&["get", "pods", "-n", "default", "-l", &format!("app={app}")]);
        let nodes: Vec<String> = pods["items"]
            .as_array()?
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .filter_map(|p| p["spec"]["nodeName"].as_str().map(str::to_string))
            .collect();
        (nodes.len() == n).then_some(nodes)
    })
}

/// The Nodes the kwok provider launched for the pool (by its annotation: the controller's pool
/// label comes later, at registration).
fn launched(env: &Env) -> usize {
    let nodes = env.get_json(&["get", "nodes"]);
    nodes["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter(|n| {
                    n["metadata"]["annotations"]["kwok.gpu-node-autoscaler.io/pool"] == "kwok-a10g"
                })
                .count()
        })
        .unwrap_or(0)
}

fn zone_of(env: &Env, node: &str) -> String {
    let n: Value = env.get_json(&["get", "node", node]);
    n["metadata"]["labels"]["topology.kubernetes.io/zone"]
        .as_str()
        .unwrap_or_else(|| panic!("no zone on {n}"))
        .to_string()
}

/// A Deployment of `replicas` one-GPU pods labelled `app=<app>`, with `extra` in their spec and
/// `ports` for their container.
fn deployment(app: &str, replicas: u32, extra: &str, ports: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {app}\n  namespace: default\n\
         spec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {app}}}}}\n  template:\n    \
         metadata: {{labels: {{app: {app}}}}}\n    spec:\n{}",
        gpu_spec(extra, ports)
    )
}

#[test]
fn topology_six_replicas_spread_over_zones_one_per_node_all_run_two_per_zone() {
    let env = started("topology-spread");
    let extra = "      topologySpreadConstraints:\n      - maxSkew: 1\n        \
                 topologyKey: topology.kubernetes.io/zone\n        whenUnsatisfiable: DoNotSchedule\n        \
                 labelSelector: {matchLabels: {app: llm}}\n      affinity:\n        podAntiAffinity:\n          \
                 requiredDuringSchedulingIgnoredDuringExecution:\n          - topologyKey: kubernetes.io/hostname\n            \
                 labelSelector: {matchLabels: {app: llm}}\n";
    env.create(&deployment("llm", 6, extra, ""));
    let nodes = running_on(&env, "llm", 6);
    let distinct: BTreeSet<&String> = nodes.iter().collect();
    assert_eq!(distinct.len(), 6, "one replica per node: {nodes:?}");
    let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
    for n in &nodes {
        *per_zone.entry(zone_of(&env, n)).or_default() += 1;
    }
    assert_eq!(
        per_zone.values().copied().collect::<Vec<_>>(),
        vec![2, 2, 2],
        "{per_zone:?}"
    );
    // Exactly the nodes the replicas needed: every launch was of a node the scheduler took.
    assert_eq!(launched(&env), 6);
}

#[test]
fn hostport_two_pods_binding_one_port_land_on_two_nodes() {
    let env = started("hostport");
    let ports = "        ports:\n        - {containerPort: 9400, hostPort: 9400}\n";
    env.create(&deployment("agent", 2, "", ports));
    let nodes = running_on(&env, "agent", 2);
    assert_ne!(nodes[0], nodes[1], "{nodes:?}");
    assert_eq!(launched(&env), 2);
}

#[test]
fn volume_a_statefulset_pod_bound_to_a_zonal_volume_runs_in_the_volumes_zone() {
    let env = started("volume-static");
    // A static volume in us-east-1c (the last zone of the policy: without the volume's rule the
    // first, cheapest offering would be in us-east-1a), reserved for the StatefulSet's claim.
    env.create(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: ckpt-c}\nspec:\n  \
         capacity: {storage: 10Gi}\n  accessModes: [ReadWriteOnce]\n  storageClassName: manual\n  \
         persistentVolumeReclaimPolicy: Retain\n  hostPath: {path: /var/ckpt}\n  \
         claimRef: {namespace: default, name: data-ckpt-0}\n  nodeAffinity:\n    required:\n      \
         nodeSelectorTerms:\n      - matchExpressions:\n        \
         - {key: topology.kubernetes.io/zone, operator: In, values: [us-east-1c]}\n",
    );
    env.create(&format!(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: ckpt, namespace: default}}\n\
         spec:\n  serviceName: ckpt\n  replicas: 1\n  selector: {{matchLabels: {{app: ckpt}}}}\n  \
         template:\n    metadata: {{labels: {{app: ckpt}}}}\n    spec:\n{}  \
         volumeClaimTemplates:\n  - metadata: {{name: data}}\n    spec:\n      \
         accessModes: [ReadWriteOnce]\n      storageClassName: manual\n      \
         resources: {{requests: {{storage: 10Gi}}}}\n",
        gpu_spec(
            "",
            "        volumeMounts:\n        - {name: data, mountPath: /ckpt}\n"
        )
    ));
    let nodes = running_on(&env, "ckpt", 1);
    assert_eq!(zone_of(&env, &nodes[0]), "us-east-1c");
    assert_eq!(launched(&env), 1, "one node, in the volume's zone");
    let pvc = env.get_json(&["get", "pvc", "-n", "default", "data-ckpt-0"]);
    assert_eq!(pvc["spec"]["volumeName"], "ckpt-c", "{pvc}");
}

/// The provisioner stand-in, from the tests' waits.
fn provision_selected_claims(env: &Env) {
    provisioner::provision_selected_claims(&env.cluster).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn volume_a_wait_for_first_consumer_claim_is_provisioned_in_the_zone_its_class_allows() {
    let env = started("volume-wffc");
    // gp3 volumes in us-east-1b only (without the class's rule the first, cheapest offering
    // would be in us-east-1a), provisioned once a consumer is scheduled.
    env.create(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: gp3-b}\n\
         provisioner: ebs.csi.aws.com\nvolumeBindingMode: WaitForFirstConsumer\n\
         allowedTopologies:\n- matchLabelExpressions:\n  \
         - {key: topology.kubernetes.io/zone, values: [us-east-1b]}\n",
    );
    env.create(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: scratch, namespace: default}\n\
         spec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: gp3-b\n  \
         resources: {requests: {storage: 10Gi}}\n",
    );
    env.create(&bare_gpu_pod(
        "default",
        "finetune",
        "  volumes:\n  - name: data\n    persistentVolumeClaim: {claimName: scratch}\n",
    ));
    let node = env.wait_for("the pod to run", 4 * MIN, || {
        provision_selected_claims(&env);
        let p = env.get_json(&["get", "pod", "finetune", "-n", "default"]);
        (p["status"]["phase"] == "Running")
            .then(|| p["spec"]["nodeName"].as_str().map(str::to_string))
            .flatten()
    });
    assert_eq!(zone_of(&env, &node), "us-east-1b");
    assert_eq!(launched(&env), 1, "one node, in the zone the class allows");
    let pvc = env.get_json(&["get", "pvc", "-n", "default", "scratch"]);
    assert_eq!(pvc["status"]["phase"], "Bound", "{pvc}");
    let pv = env.get_json(&["get", "pv", pvc["spec"]["volumeName"].as_str().unwrap()]);
    assert_eq!(
        pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
            ["values"][0],
        "us-east-1b",
        "{pv}"
    );
}

#[test]
fn volume_attach_limit_a_node_at_its_csi_limit_is_not_planned_for_a_pod_with_one_more_volume() {
    let env = started("volume-attach");
    env.create(
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: gp3}\n\
         provisioner: ebs.csi.aws.com\nvolumeBindingMode: WaitForFirstConsumer\n",
    );
    let claim = |name: &str| {
        format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}, namespace: default}}\n\
             spec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: gp3\n  \
             resources: {{requests: {{storage: 10Gi}}}}\n"
        )
    };
    let with_claim = |claim: &str| {
        format!("  volumes:\n  - name: data\n    persistentVolumeClaim: {{claimName: {claim}}}\n")
    };
    let running = |pod: &str| {
        env.wait_for(&format!("pod {pod} to run"), 4 * MIN, || {
            provision_selected_claims(&env);
            let p = env.get_json(&["get", "pod", pod, "-n", "default"]);
            (p["status"]["phase"] == "Running")
                .then(|| p["spec"]["nodeName"].as_str().map(str::to_string))
                .flatten()
        })
    };
    env.create(&claim("data-a"));
    env.create(&bare_gpu_pod("default", "a", &with_claim("data-a")));
    let first = running("a");
    assert_eq!(launched(&env), 1);
    // The node's EBS driver attaches one volume at most, as its kubelet registers it: a's
    // volume fills it. b fits the node's three free GPUs, and kube-scheduler's NodeVolumeLimits
    // would refuse it there.
    env.create(&format!(
        "apiVersion: storage.k8s.io/v1\nkind: CSINode\nmetadata: {{name: {first}}}\nspec:\n  \
         drivers:\n  - name: ebs.csi.aws.com\n    nodeID: {first}\n    allocatable: {{count: 1}}\n"
    ));
    env.create(&claim("data-b"));
    env.create(&bare_gpu_pod("default", "b", &with_claim("data-b")));
    let second = running("b");
    assert_ne!(second, first, "b on a node of its own");
    assert_eq!(launched(&env), 2, "one more node, no more");
    // Planned there at once, not after the scheduler refused the first node (the safety net
    // would have said so).
    let refused: Vec<String> = env
        .events("FailedScaleUp")
        .into_iter()
        .filter(|e| e.starts_with("b: "))
        .collect();
    assert!(refused.is_empty(), "{refused:?}");
}

/// A bare pod in `ns` asking for one GPU, labelled `app=<app>`, with `extra` in its spec (YAML at
/// 2 spaces).
fn bare_gpu_pod(ns: &str, app: &str, extra: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {app}\n  namespace: {ns}\n  labels: {{app: {app}}}\n\
         spec:\n  tolerations:\n  - {{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}}\n\
         {extra}  containers:\n  - name: main\n    image: cuda:12\n    resources:\n      \
         requests: {{cpu: \"1\", memory: 2Gi, nvidia.com/gpu: \"1\"}}\n      \
         limits: {{nvidia.com/gpu: \"1\"}}\n"
    )
}

#[test]
fn refused_a_pod_the_scheduler_keeps_off_a_node_for_a_rule_we_do_not_model_gets_a_node_of_its_own()
{
    let env = started("refused");
    // Pod a runs on a 4-GPU node (200Gi of ephemeral storage), three GPUs left free, and takes
    // 150Gi of its scratch space.
    let scratch = |gib: u32| {
        format!("{{cpu: \"1\", memory: 2Gi, nvidia.com/gpu: \"1\", ephemeral-storage: {gib}Gi}}")
    };
    let pod = |name: &str, gib: u32| {
        bare_gpu_pod("default", name, "").replace(
            "requests: {cpu: \"1\", memory: 2Gi, nvidia.com/gpu: \"1\"}",
            &format!("requests: {}", scratch(gib)),
        )
    };
    env.create(&pod("a", 150));
    let first = env.wait_for("pod a to run", 3 * MIN, || {
        let p = env.get_json(&["get", "pod", "a", "-n", "default"]);
        (p["status"]["phase"] == "Running")
            .then(|| p["spec"]["nodeName"].as_str().map(str::to_string))
            .flatten()
    });
    assert_eq!(launched(&env), 1);

    // Pod b asks for 100Gi more. The planner does not count ephemeral storage, so on its model
    // b fits the free GPUs of a's node; kube-scheduler refuses it there.
    env.create(&pod("b", 100));
    let refused = env.wait_for("the refusal to be noticed", 4 * MIN, || {
        env.events("FailedScaleUp")
            .into_iter()
            .find(|e| e.starts_with("b: "))
    });
    assert!(
        refused.contains(&format!("node {first} for 90 s although it fits there"))
            && refused.contains("kube-scheduler: 0/"),
        "{refused}"
    );
    // Planned again without that node: b gets a node of its own and runs.
    let second = env.wait_for("pod b to run", 3 * MIN, || {
        let p = env.get_json(&["get", "pod", "b", "-n", "default"]);
        (p["status"]["phase"] == "Running")
            .then(|| p["spec"]["nodeName"].as_str().map(str::to_string))
            .flatten()
    });
    assert_ne!(second, first);
    assert_eq!(launched(&env), 2, "one more node, no more");
    let refusals = "gpu_node_autoscaler_nodes_refused_by_scheduler_total{pool=\"kwok-a10g\"}";
    assert_eq!(env.metric("r1", refusals), Some(1.0));
}
