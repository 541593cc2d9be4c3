//! ProvisioningRequests (`autoscaling.x-k8s.io/v1`, what Kueue's provisioning admission check
//! creates) on the real control plane, with the CRD the Cluster Autoscaler's `apis` module ships
//! at the version Kueue v0.17.0 pins (copied out of the Go module cache by `scripts/kueue.sh`).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::kwok::kwok_env;
use crate::MIN;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

const POLICY: &str = "clusterName: e2e\nzones: [us-east-1a, us-east-1b]\n\
batching: {idle: 1s, max: 3s}\nmaxNodeProvisionTime: 2m\n\
pools:\n- name: kwok-a10g\n  provider: kwok\n  instanceTypes: [g5.12xlarge]\n\
\x20 capacityTypes: [on-demand]\n  maxNodes: 4\n\
\x20 taints:\n  - {key: nvidia.com/gpu, value: \"true\", effect: NoSchedule}\n\
\x20 scaleDown: {cooldownAfterScaleUp: 5s, unneededTime: 5s}\n";

/// Where `scripts/kueue.sh` put Kueue and the CRDs: `$GNA_KUEUE_DIR`, else its cache directory.
/// A missing build fails with the command that makes it.
pub fn kueue_dir() -> PathBuf {
    let dir = match std::env::var_os("GNA_KUEUE_DIR") {
        Some(p) => PathBuf::from(p),
        None => {
            let out = Command::new("bash")
                .arg(format!("{REPO}/scripts/kueue.sh"))
                .arg("--print-dir")
                .output()
                .expect("bash scripts/kueue.sh --print-dir");
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    assert!(
        dir.join(".complete").is_file(),
        "{} is not a complete Kueue build: run `bash scripts/kueue.sh` (scripts/test.sh does)",
        dir.display()
    );
    dir
}

fn pod_template(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PodTemplate\nmetadata:\n  name: {name}\n  namespace: team\n\
         template:\n  spec:\n    tolerations:\n    - {{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}}\n\
         \x20   containers:\n    - name: main\n      image: cuda:12\n      resources:\n\
         \x20       requests: {{cpu: \"4\", memory: 16Gi, nvidia.com/gpu: \"4\"}}\n\
         \x20       limits: {{nvidia.com/gpu: \"4\"}}\n"
    )
}

fn request(name: &str, template: &str, count: u32) -> String {
    format!(
        "apiVersion: autoscaling.x-k8s.io/v1\nkind: ProvisioningRequest\nmetadata:\n  name: {name}\n  namespace: team\n\
         spec:\n  provisioningClassName: best-effort-atomic-scale-up.autoscaling.x-k8s.io\n\
         \x20 podSets:\n  - podTemplateRef: {{name: {template}}}\n    count: {count}\n"
    )
}

/// A pod that consumes a request's capacity, as Kueue's pods do.
fn consumer(name: &str, request: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: team\n  annotations:\n\
         \x20   autoscaling.x-k8s.io/consume-provisioning-request: {request}\n\
         \x20   autoscaling.x-k8s.io/provisioning-class-name: best-effort-atomic-scale-up.autoscaling.x-k8s.io\n\
         spec:\n  tolerations:\n  - {{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}}\n\
         \x20 containers:\n  - name: main\n    image: cuda:12\n    resources:\n\
         \x20     requests: {{cpu: \"4\", memory: 16Gi, nvidia.com/gpu: \"4\"}}\n\
         \x20     limits: {{nvidia.com/gpu: \"4\"}}\n"
    )
}

fn condition(r: &Value, kind: &str) -> Option<Value> {
    r["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .cloned()
}

#[test]
fn provisioning_request_gets_its_nodes_in_one_zone_at_once_and_one_too_big_fails() {
    let mut env = kwok_env("provisioning-request");
    let crd = kueue_dir().join("crds/provisioningrequests.autoscaling.x-k8s.io.yaml");
    env.kubectl_ok(&["create", "-f", &crd.to_string_lossy()]);
    env.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/provisioningrequests.autoscaling.x-k8s.io",
    ]);
    env.create(&env.policy_configmap(POLICY));
    env.create("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team\n");
    env.start_controller("r1", &["--resync", "5s"]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });

    // Two 4-GPU pods: two g5.12xlarge, launched together, in one zone; then Provisioned.
    env.create(&pod_template("worker"));
    env.create(&request("job", "worker", 2));
    let provisioned = env.wait_for("the request to be Provisioned", 3 * MIN, || {
        let r = env.get_json(&["get", "provisioningrequest", "-n", "team", "job"]);
        condition(&r, "Provisioned").filter(|c| c["status"] == "True")
    });
    assert_eq!(
        provisioned["reason"], "CapacityIsProvisioned",
        "{provisioned}"
    );
    let r = env.get_json(&["get", "provisioningrequest", "-n", "team", "job"]);
    assert_eq!(
        condition(&r, "Accepted").map(|c| c["status"].clone()),
        Some("True".into()),
        "{r}"
    );
    let nodes = env.wait_for("the two nodes to be registered into the pool", MIN, || {
        Some(env.pool_nodes()).filter(|n| n.len() >= 2)
    });
    assert_eq!(nodes.len(), 2, "two nodes for two pods: {nodes:?}");
    let zones: std::collections::BTreeSet<String> = nodes
        .iter()
        .map(|n| {
            n["metadata"]["labels"]["topology.kubernetes.io/zone"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(zones.len(), 1, "one zone: {zones:?}");
    let names: std::collections::BTreeSet<String> = nodes
        .iter()
        .map(|n| {
            n["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();

    // The job's pods arrive and run on those nodes; nothing more is launched.
    env.create(&consumer("job-0", "job"));
    env.create(&consumer("job-1", "job"));
    for p in ["job-0", "job-1"] {
        let node = env.wait_for("the job's pod to run", 2 * MIN, || {
            let pod = env.get_json(&["get", "pod", "-n", "team", p]);
            (pod["status"]["phase"] == "Running")
                .then(|| pod["spec"]["nodeName"].as_str().map(str::to_string))
                .flatten()
        });
        assert!(
            names.contains(&node),
            "{p} runs on {node}, not on {names:?}"
        );
    }

    // Three more 4-GPU pods need three nodes; the pool has room for two: Failed, none launched.
    env.create(&request("too-big", "worker", 3));
    let failed = env.wait_for("the request to be Failed", 2 * MIN, || {
        let r = env.get_json(&["get", "provisioningrequest", "-n", "team", "too-big"]);
        condition(&r, "Failed").filter(|c| c["status"] == "True")
    });
    assert_eq!(failed["reason"], "CapacityIsNotFound", "{failed}");
    assert!(
        failed["message"]
            .as_str()
            .unwrap_or_default()
            .contains("cannot be given nodes all at once"),
        "{failed}"
    );
    // Two passes later still nothing launched for it.
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(
        env.pool_nodes().len(),
        2,
        "nothing launched for the failed request"
    );
}
