//! GPUs through Dynamic Resource Allocation on the real control plane: pools with `dra:` launch
//! kwok Nodes that advertise no GPU extended resource; a driver stand-in publishes the
//! ResourceSlices NVIDIA's DRA driver (`gpu.nvidia.com`) would publish for each of them once it
//! is Ready, and the real kube-scheduler and kube-controller-manager allocate the pods'
//! ResourceClaims on them. The controller runs with the RBAC of `deploy/overlays/kwok`.

use std::collections::BTreeSet;

use gpu_node_autoscaler_test_support::dra_driver;
use serde_json::Value;

use crate::support::Env;
use crate::MIN;

const POOL_DEFAULTS: &str =
    "  provider: kwok\n  capacityTypes: [spot, on-demand]\n  maxNodes: 4\n  dra: {}\n\
\x20 scaleDown: {cooldownAfterScaleUp: 5m, unneededTime: 5m}\n";

fn policy(pools: &[(&str, &str)]) -> String {
    let mut p =
        "clusterName: e2e\nzones: [us-east-1a, us-east-1b]\nbatching: {idle: 1s, max: 3s}\n\
maxNodeProvisionTime: 2m\npools:\n"
            .to_string();
    for (name, fields) in pools {
        p += &format!("- name: {name}\n{fields}{POOL_DEFAULTS}");
    }
    p
}

const H100_POOL: (&str, &str) = ("h100", "  instanceTypes: [p5.48xlarge]\n");
const A10G_POOL: (&str, &str) = ("a10g", "  instanceTypes: [g5.xlarge, g5.12xlarge]\n");
const MIG_POOL: (&str, &str) = (
    "a100-mig",
    "  instanceTypes: [p4d.24xlarge]\n  gpuMode: mig\n  migLayout: {1g.5gb: 7}\n",
);

fn dra_env(name: &str, pools: &[(&str, &str)]) -> Env {
    let mut env = crate::kwok::kwok_env(name);
    env.create(dra_driver::DEVICE_CLASSES);
    env.create(&env.policy_configmap(&policy(pools)));
    env.start_controller("r1", &[]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });
    env
}

/// A ResourceClaimTemplate in `default` asking for `count` devices of `class` with `selector`.
fn claim_template(name: &str, class: &str, count: u32, selector: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {{name: {name}, namespace: default}}\n\
spec:\n  spec:\n    devices:\n      requests:\n      - name: gpu\n        exactly:\n          \
deviceClassName: {class}\n          count: {count}\n          selectors:\n          - cel: {{expression: \"{selector}\"}}\n"
    )
}

/// A pod in `default` whose one claim is made from `template`.
fn claiming_pod(name: &str, template: &str, labels: &[(&str, &str)]) -> String {
    let labels: String = labels
        .iter()
        .map(|(k, v)| format!("    {k}: {v}\n"))
        .collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n  labels:\n    app: dra\n{labels}\
spec:\n  resourceClaims: [{{name: gpu, resourceClaimTemplateName: {template}}}]\n  containers:\n  - name: main\n    \
image: cuda:12\n    resources:\n      requests: {{cpu: \"1\", memory: 2Gi}}\n      claims: [{{name: gpu}}]\n"
    )
}

/// The driver stand-in: publishes a ResourceSlice for every Ready node of a DRA pool that has
/// none yet (`published` remembers them).
fn publish_slices(env: &Env, published: &mut BTreeSet<String>) {
    let nodes = env.pool_nodes();
    for n in &nodes {
        let name = n["metadata"]["name"].as_str().unwrap_or_default();
        let ready = n["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        if !ready || published.contains(name) {
            continue;
        }
        let it = n["metadata"]["labels"]["node.kubernetes.io/instance-type"]
            .as_str()
            .unwrap_or_default();
        // The MIG pool's GPUs are partitioned into seven 1g.5gb instances.
        let mig = [("1g.5gb".to_string(), 7)];
        let layout = (it == "p4d.24xlarge").then_some(&mig[..]);
        let devices =
            dra_driver::devices(name, it, layout).unwrap_or_else(|e| panic!("{name}: {e}"));
        let uid = n["metadata"]["uid"].as_str().unwrap_or_default();
        env.create(&dra_driver::resource_slice(name, uid, devices).to_string());
        published.insert(name.to_string());
    }
}

/// The node a pod runs on, once it runs.
fn running_on(env: &Env, pod: &str) -> Option<String> {
    let p = env.get_json(&["get", "pod", "-n", "default", pod]);
    (p["status"]["phase"] == "Running")
        .then(|| p["spec"]["nodeName"].as_str().map(str::to_string))
        .flatten()
}

/// The devices allocated to a pod's claim, and the node the allocation is for.
fn allocation(env: &Env, pod: &str) -> (String, Vec<String>) {
    let p = env.get_json(&["get", "pod", "-n", "default", pod]);
    let claim = p["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .unwrap_or_else(|| panic!("pod {pod} has no claim: {p}"))
        .to_string();
    let c = env.get_json(&["get", "resourceclaim", "-n", "default", &claim]);
    let a = &c["status"]["allocation"];
    let node = a["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
        .as_str()
        .unwrap_or_else(|| panic!("claim {claim} is not allocated on a node: {c}"))
        .to_string();
    let devices = a["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| r["device"].as_str().unwrap_or_default().to_string())
        .collect();
    (node, devices)
}

fn label<'a>(node: &'a Value, key: &str) -> &'a str {
    node["metadata"]["labels"][key].as_str().unwrap_or_default()
}

#[test]
fn a_pod_claiming_an_h100_gets_a_p5_from_zero_and_a_claim_no_pool_satisfies_gets_a_reason() {
    let env = dra_env("dra-from-zero", &[A10G_POOL, H100_POOL]);
    env.create(&claim_template(
        "h100-80g",
        "gpu.nvidia.com",
        1,
        "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA H100') && \
         device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80G')) >= 0",
    ));
    env.create(&claim_template(
        "b200",
        "gpu.nvidia.com",
        1,
        "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B200'",
    ));
    env.create(&claiming_pod("trainer", "h100-80g", &[]));
    env.create(&claiming_pod("b200-trainer", "b200", &[]));

    let mut published = BTreeSet::new();
    let node = env.wait_for("the trainer to run on a node we launched", 3 * MIN, || {
        publish_slices(&env, &mut published);
        running_on(&env, "trainer")
    });
    let n = env.get_json(&["get", "node", &node]);
    assert_eq!(label(&n, "gpu-node-autoscaler.io/pool"), "h100", "{n}");
    assert_eq!(label(&n, "node.kubernetes.io/instance-type"), "p5.48xlarge");
    assert!(
        n["status"]["capacity"]["nvidia.com/gpu"].is_null(),
        "a DRA pool's node advertises no GPU extended resource: {n}"
    );
    let (allocated_on, devices) = allocation(&env, "trainer");
    assert_eq!(
        allocated_on, node,
        "the scheduler allocated the claim there"
    );
    assert_eq!(devices.len(), 1, "{devices:?}");

    // The B200 claim: a reason on the pod, and no node for it.
    let reason = env.wait_for("a NotTriggerScaleUp Event on the B200 pod", MIN, || {
        env.events("NotTriggerScaleUp")
            .into_iter()
            .find(|e| e.starts_with("b200-trainer:"))
    });
    assert!(
        reason.contains("request gpu") && reason.contains("no pool's devices"),
        "{reason}"
    );
    assert_eq!(env.pod_phase("default", "b200-trainer"), "Pending");
    // Passes go on; never a node for a claim whose devices no offering has, nor a second
    // one for the trainer's.
    std::thread::sleep(std::time::Duration::from_secs(10));
    let nodes: Vec<String> = env
        .pool_nodes()
        .iter()
        .map(|n| label(n, "node.kubernetes.io/instance-type").to_string())
        .collect();
    assert_eq!(nodes, ["p5.48xlarge"], "exactly the trainer's node");
}

#[test]
fn mig_claims_get_a_partitioned_a100_and_a_gang_of_claims_gets_its_nodes_in_one_zone() {
    let env = dra_env("dra-mig-gang", &[H100_POOL, MIG_POOL]);
    env.create(&claim_template(
        "slice",
        "mig.nvidia.com",
        1,
        "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'",
    ));
    env.create(&claim_template(
        "eight-h100",
        "gpu.nvidia.com",
        8,
        "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'",
    ));
    env.create(&claiming_pod("notebook", "slice", &[]));
    let gang = [
        ("training.kubeflow.org/job-name", "llm"),
        ("training.kubeflow.org/replica-type", "worker"),
    ];
    env.create(&format!(
        "{}---\n{}",
        claiming_pod("llm-worker-0", "eight-h100", &gang),
        claiming_pod("llm-worker-1", "eight-h100", &gang)
    ));

    let mut published = BTreeSet::new();
    let (notebook, w0, w1) = env.wait_for("the notebook and both workers to run", 3 * MIN, || {
        publish_slices(&env, &mut published);
        Some((
            running_on(&env, "notebook")?,
            running_on(&env, "llm-worker-0")?,
            running_on(&env, "llm-worker-1")?,
        ))
    });
    let node = |name: &str| env.get_json(&["get", "node", name]);
    let nb = node(&notebook);
    assert_eq!(
        label(&nb, "node.kubernetes.io/instance-type"),
        "p4d.24xlarge"
    );
    let (on, devices) = allocation(&env, "notebook");
    assert_eq!(on, notebook);
    assert!(
        devices.len() == 1 && devices[0].contains("-mig-"),
        "{devices:?}"
    );

    // The gang: one 8-GPU node per worker, both in one zone, each claim on its worker's node.
    assert_ne!(w0, w1, "eight H100s each: one p5 per worker");
    let (n0, n1) = (node(&w0), node(&w1));
    for n in [&n0, &n1] {
        assert_eq!(label(n, "node.kubernetes.io/instance-type"), "p5.48xlarge");
    }
    assert_eq!(
        label(&n0, "topology.kubernetes.io/zone"),
        label(&n1, "topology.kubernetes.io/zone"),
        "a gang is launched in one zone"
    );
    for (pod, on_node) in [("llm-worker-0", &w0), ("llm-worker-1", &w1)] {
        let (on, devices) = allocation(&env, pod);
        assert_eq!(&on, on_node);
        assert_eq!(devices.len(), 8, "{pod}: {devices:?}");
    }
    let launched = env.events("TriggeredScaleUp");
    assert!(
        launched.iter().any(|e| e.contains("2 × p5.48xlarge")),
        "both workers' nodes in one decision: {launched:?}"
    );
    assert_eq!(env.pool_nodes().len(), 3, "nothing beyond the three nodes");
}
