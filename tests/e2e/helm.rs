//! The Helm chart installed on the real control plane: every object it renders is applied (the
//! API server validates each, strictly), the controller runs with the chart's ServiceAccount,
//! RBAC, policy ConfigMap and arguments, takes the Lease and scales a kwok pool.

use crate::cluster::{helm_template, ClusterOptions};
use crate::support::{gpu_pod, Env, Options};
use crate::{no_labels, MIN};

const POLICY: &str = "clusterName: e2e\nzones: [us-east-1a]\n\
batching: {idle: 1s, max: 3s}\nmaxNodeProvisionTime: 2m\n\
pools:\n- name: kwok-a10g\n  provider: kwok\n  instanceTypes: [g5.xlarge]\n\
\x20 capacityTypes: [on-demand]\n  maxNodes: 2\n\
\x20 taints:\n  - {key: nvidia.com/gpu, value: \"true\", effect: NoSchedule}\n";

#[test]
fn helm_chart_installs_and_its_controller_leads_and_scales_with_the_charts_rbac() {
    let dir = std::env::temp_dir().join(format!("gna-e2e-helm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    let values: Vec<String> = [
        "--set",
        "kwok.enabled=true",
        "--set-file",
        &format!("policy.content={}", policy.display()),
    ]
    .map(str::to_string)
    .to_vec();
    let mut env = Env::start(
        "helm-chart",
        Options {
            cluster: ClusterOptions {
                helm_values: Some(values.clone()),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    // The whole release, as `helm install` would apply it (the harness already applied its
    // ServiceAccount and RBAC, and minted the controller's token for that ServiceAccount).
    let rendered = helm_template(&values);
    env.apply(&rendered);
    for (kind, name) in [
        ("deployment", "gpu-node-autoscaler"),
        ("poddisruptionbudget", "gpu-node-autoscaler"),
        ("service", "gpu-node-autoscaler"),
        ("configmap", "gpu-node-autoscaler-policy"),
        ("clusterrole", "gpu-node-autoscaler"),
        ("role", "gpu-node-autoscaler"),
        ("lease", "gpu-node-autoscaler"),
    ] {
        env.kubectl_ok(&["get", kind, name, "-n", "kube-system"]);
    }

    // The controller with the chart's arguments (its own listen address aside: the harness
    // picks a free port) and the chart's identity.
    let deployment = env.get_json(&[
        "get",
        "deployment",
        "-n",
        "kube-system",
        "gpu-node-autoscaler",
    ]);
    let args: Vec<String> = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("the Deployment's args")
        .iter()
        .filter_map(|a| a.as_str())
        .filter(|a| *a != "run" && !a.starts_with("--listen="))
        .map(str::to_string)
        .collect();
    assert!(
        args.iter()
            .any(|a| a == "--lease=kube-system/gpu-node-autoscaler"),
        "{args:?}"
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    env.start_controller("r1", &args);
    env.wait_for("the controller to hold the chart's Lease", MIN, || {
        let out = env.kubectl(&[
            "get",
            "lease",
            "-n",
            "kube-system",
            "gpu-node-autoscaler",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ]);
        (String::from_utf8_lossy(&out.stdout).trim() == "r1").then_some(())
    });

    // It reads the chart's policy and launches for a GPU pod; the pod runs on the new Node.
    env.create(&gpu_pod("default", "trainer", &no_labels(), None));
    let node = env.wait_for("the pod to run on a Node of the pool", 2 * MIN, || {
        let pod = env.get_json(&["get", "pod", "-n", "default", "trainer"]);
        (pod["status"]["phase"] == "Running")
            .then(|| pod["spec"]["nodeName"].as_str().map(str::to_string))
            .flatten()
    });
    let n = env.get_json(&["get", "node", &node]);
    assert_eq!(
        n["metadata"]["annotations"]["kwok.gpu-node-autoscaler.io/pool"], "kwok-a10g",
        "{n}"
    );
    // And writes its status where the chart's Role lets it.
    // (the chart creates it empty; the Role may only update it, by name)
    env.wait_for(
        "the controller's status in the chart's ConfigMap",
        MIN,
        || {
            let cm = env.get_json(&[
                "get",
                "configmap",
                "-n",
                "kube-system",
                "gpu-node-autoscaler-status",
            ]);
            cm["data"]["status"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
                .then_some(())
        },
    );
    assert!(
        !env.log("r1").contains("forbidden"),
        "the chart's RBAC refused a call:\n{}",
        env.log("r1")
    );
}
