//! End-to-end tests: kube-sim (scheduler, kubelets, EC2 bridge), `moto_server` and the real
//! `gpu-node-autoscaler run` binary, driven with the real `kubectl`.
//!
//! Timings are generous polls, never assertions on how long something took.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::{gpu_pod, Env, Options};

const MIN: Duration = Duration::from_secs(60);

fn no_labels() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::new()
}

/// An arena-style MPI job: a launcher and two 1-GPU workers, one gang.
fn mpi_job(run_for: &str) -> String {
    let gang: BTreeMap<&str, &str> = [
        ("training.kubeflow.org/job-name", "bert"),
        ("training.kubeflow.org/replica-type", "worker"),
    ]
    .into();
    let launcher = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bert-launcher\n  namespace: default\n  labels:\n    \
         training.kubeflow.org/job-name: bert\n    training.kubeflow.org/replica-type: launcher\n  \
         annotations:\n    kube-sim.gpu-node-autoscaler.io/run-duration: {run_for}\nspec:\n  containers:\n  \
         - name: launcher\n    image: mpi:1\n    resources:\n      requests: {{cpu: 500m, memory: 1Gi}}\n"
    );
    format!(
        "{launcher}---\n{}---\n{}",
        gpu_pod("default", "bert-worker-0", &gang, Some(run_for)),
        gpu_pod("default", "bert-worker-1", &gang, Some(run_for))
    )
}

#[test]
fn an_mpi_job_gets_exactly_its_nodes_which_are_removed_after_it_ends() {
    let mut env = Env::start("mpi", Options::default());
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a"], "")));
    env.start_controller("r1", &[]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });
    env.create(&mpi_job("20s"));

    // One decision: two g5.xlarge (one per 1-GPU worker), never more.
    let launched = env.wait_for("two instances", 2 * MIN, || {
        let l = env.live_instances();
        (l.len() >= 2).then_some(l)
    });
    assert_eq!(
        launched.len(),
        2,
        "{:?}",
        launched.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
    for (_, v) in &launched {
        assert_eq!(v.tags["gpu-node-autoscaler.io/pool"], "a10g");
        assert_eq!(
            v.tags["k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu"],
            "true:NoSchedule"
        );
    }
    env.wait_for("the workers to run", 2 * MIN, || {
        (env.pod_phase("default", "bert-worker-0") == "Running"
            && env.pod_phase("default", "bert-worker-1") == "Running")
            .then_some(())
    });
    assert_eq!(
        env.instances().len(),
        2,
        "no instance beyond the gang's two"
    );
    let triggered = env.events("TriggeredScaleUp");
    assert!(
        triggered
            .iter()
            .any(|e| e.starts_with("bert-worker-0: launched 2 × g5.xlarge")),
        "{triggered:?}"
    );

    // The job ends; after the cooldown and the unneeded time the nodes go, and their instances.
    env.wait_for("the workers to finish", 2 * MIN, || {
        (env.pod_phase("default", "bert-worker-0") == "Succeeded").then_some(())
    });
    env.wait_for("the instances to be terminated", 3 * MIN, || {
        env.live_instances().is_empty().then_some(())
    });
    env.wait_for("the nodes to be deleted", MIN, || {
        env.pool_nodes().is_empty().then_some(())
    });
    assert_eq!(
        env.events("ScaleDown").len() >= 2,
        true,
        "{:?}",
        env.events("ScaleDown")
    );
    assert_eq!(
        env.metric("r1", "gpu_node_autoscaler_scale_downs_total{pool=\"a10g\"}"),
        Some(2.0)
    );
    let json = env.wait_for("the status to show the scale-down", MIN, || {
        let json = env.status_json();
        json["pools"][0]["lastScaleDown"]
            .is_string()
            .then_some(json)
    });
    assert_eq!(json["leader"], "r1");
    assert_eq!(json["pools"][0]["name"], "a10g");
    assert_eq!(json["pools"][0]["readyNodes"], 0, "{json}");
}

#[test]
fn spot_short_in_one_zone_goes_to_the_next_then_to_on_demand() {
    let mut env = Env::start(
        "spot",
        Options {
            proxy: true,
            ..Options::default()
        },
    );
    let zones = ["us-east-1a", "us-east-1b"];
    env.create(&env.policy_configmap(&env.policy(&zones, "")));
    let proxy = env.proxy.as_ref().unwrap();
    proxy.fail_subnet(
        &env.net.subnets["us-east-1a"],
        "InsufficientInstanceCapacity",
    );
    env.start_controller("r1", &[]);
    env.create(&gpu_pod("default", "infer-0", &no_labels(), None));
    let first = env.wait_for("an instance", 2 * MIN, || env.live_instances().pop());
    assert_eq!(first.1.zone, "us-east-1b", "zone a has no capacity");
    assert!(first.1.spot, "spot is preferred while zone b has it");
    env.wait_for("infer-0 to run", 2 * MIN, || {
        (env.pod_phase("default", "infer-0") == "Running").then_some(())
    });

    // Now spot is short everywhere: on-demand.
    env.proxy.as_ref().unwrap().cap_spot(0);
    env.create(&gpu_pod("default", "infer-1", &no_labels(), None));
    let second = env.wait_for("a second instance", 2 * MIN, || {
        env.live_instances()
            .into_iter()
            .find(|(id, _)| *id != first.0)
    });
    assert!(!second.1.spot, "on-demand after spot ran out");
    assert_eq!(second.1.zone, "us-east-1b");
    env.wait_for("infer-1 to run", 2 * MIN, || {
        (env.pod_phase("default", "infer-1") == "Running").then_some(())
    });
    assert_eq!(env.live_instances().len(), 2);
    assert!(
        env.metric(
            "r1",
            "gpu_node_autoscaler_failed_launches_total{pool=\"a10g\",reason=\"insufficient_capacity\"}"
        )
        .unwrap_or(0.0)
            >= 1.0
    );
    let status = env.get_json(&[
        "get",
        "configmap",
        "-n",
        "kube-system",
        "gpu-node-autoscaler-status",
    ]);
    let text = status["data"]["status"].as_str().unwrap_or("").to_string();
    assert!(text.contains("g5.xlarge/us-east-1a/spot until"), "{text}");
}
