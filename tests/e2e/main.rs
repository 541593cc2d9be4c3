//! End-to-end tests on the real Kubernetes control plane (etcd, kube-apiserver with RBAC,
//! kube-controller-manager, kube-scheduler, kwok as the kubelets; see `cluster.rs`), `moto_server`
//! and the real `gpu-node-autoscaler run` binary running as its ServiceAccount with the RBAC of
//! `deploy/`, driven with the real `kubectl`.
//!
//! Timings are generous polls, never assertions on how long something took.

mod alibaba;
mod anchors;
mod buffer;
mod cluster;
mod dra;
mod faults;
mod helm;
mod hpa;
mod kube_proxy;
mod kueue;
mod kwok;
mod lifecycle;
mod nodegroup;
mod prices;
mod prometheus;
mod reserved;
mod support;
mod topology;

use std::collections::BTreeMap;
use std::time::Duration;

use support::{gpu_pod, Env, Options, RUN_DURATION};

const MIN: Duration = Duration::from_secs(60);

fn no_labels() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::new()
}

/// An arena-style MPI job: a launcher and two 1-GPU workers, one gang.
fn mpi_job(run_for: &str) -> String {
    // The job declares its size as a PodGroup's minMember does, counting every pod of the job
    // (the launcher too: its job-name label makes it a member): its two workers are planned
    // together even when the API server, under load, creates the second one after a pass has
    // seen the launcher and the first.
    let gang: BTreeMap<&str, &str> = [
        ("training.kubeflow.org/job-name", "bert"),
        ("training.kubeflow.org/replica-type", "worker"),
        ("gpu-node-autoscaler.io/gang-min-member", "3"),
    ]
    .into();
    let launcher = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: bert-launcher\n  namespace: default\n  labels:\n    \
         training.kubeflow.org/job-name: bert\n    training.kubeflow.org/replica-type: launcher\n    \
         gpu-node-autoscaler.io/gang-min-member: \"3\"\n  annotations:\n    {RUN_DURATION}: {run_for}\nspec:\n  containers:\n  \
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
    env.wait_for("the status to count the gang's GPUs", MIN, || {
        (env.status_json()["pools"][0]["targetGpus"] == 2).then_some(())
    });
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
    assert!(
        env.events("ScaleDown").len() >= 2,
        "{:?}",
        env.events("ScaleDown")
    );
    env.wait_for("two scale-downs counted", MIN, || {
        (env.metric("r1", "gpu_node_autoscaler_scale_downs_total{pool=\"a10g\"}") == Some(2.0))
            .then_some(())
    });
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

/// A Ready g5.xlarge Node in us-east-1a made by hand (not by a launch), with these labels.
fn ready_gpu_node(name: &str, labels: &[(&str, &str)], instance_id: &str) -> String {
    let labels: String = labels
        .iter()
        .map(|(k, v)| format!("    {k}: {v}\n"))
        .collect();
    format!(
        r#"
apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels:
{labels}    node.kubernetes.io/instance-type: g5.xlarge
    topology.kubernetes.io/zone: us-east-1a
spec:
  providerID: aws:///us-east-1a/{instance_id}
status:
  allocatable: {{cpu: "4", memory: 16Gi, pods: "110", nvidia.com/gpu: "1"}}
  capacity: {{cpu: "4", memory: 16Gi, pods: "110", nvidia.com/gpu: "1"}}
  conditions:
  - {{type: Ready, status: "True"}}
"#
    )
}

fn lease_holder(env: &Env) -> Option<String> {
    let out = env.kubectl(&[
        "get",
        "lease",
        "-n",
        "kube-system",
        "gpu-node-autoscaler",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    let h = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !h.is_empty()).then_some(h)
}

#[test]
fn only_the_leader_acts_and_a_killed_leader_is_replaced_without_duplicate_launches() {
    // Nodes take longer to boot than a failover, so the new leader must find the launch from
    // the instances' tags.
    let mut env = Env::start(
        "leader",
        Options {
            boot_delay: Some(Duration::from_secs(12)),
            ..Options::default()
        },
    );
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a"], "")));
    env.start_controller("r1", &[]);
    env.start_controller("r2", &[]);
    let leader = env.wait_for("a leader", MIN, || lease_holder(&env));
    let other = if leader == "r1" { "r2" } else { "r1" }.to_string();
    env.wait_for("both replicas to report their role", MIN, || {
        (env.metric(&leader, "gpu_node_autoscaler_leader ") == Some(1.0)
            && env.metric(&other, "gpu_node_autoscaler_leader ") == Some(0.0))
        .then_some(())
    });

    for i in 0..3 {
        env.create(&gpu_pod(
            "default",
            &format!("train-{i}"),
            &no_labels(),
            None,
        ));
    }
    // Kill the leader as soon as its launches for the three pods exist in EC2, before any node
    // has registered (on a loaded machine the pods may be planned in two passes, one launch
    // each: the new leader must find both).
    env.wait_for("the leader's launches", 2 * MIN, || {
        (env.live_instances().len() >= 3).then_some(())
    });
    env.kill(&leader);
    assert!(
        env.pool_nodes().is_empty(),
        "killed before the nodes registered"
    );
    env.wait_for("the other replica to take the Lease", MIN, || {
        (lease_holder(&env).as_deref() == Some(other.as_str())).then_some(())
    });
    env.wait_for("the new leader to make a decision", MIN, || {
        env.status_json()["leader"]
            .as_str()
            .filter(|l| *l == other)
            .map(|_| ())
    });
    assert!(
        env.pool_nodes().is_empty(),
        "the new leader decided before any node registered"
    );
    assert_eq!(
        env.live_instances().len(),
        3,
        "no second launch for the same pods\n{}\n{}",
        env.kubectl_ok(&["get", "nodes,pods", "-A", "-o", "wide", "--show-labels"]),
        env.log(&other)
    );
    env.wait_for("all pods to run", 3 * MIN, || {
        (0..3)
            .all(|i| env.pod_phase("default", &format!("train-{i}")) == "Running")
            .then_some(())
    });
    // The new leader rebuilt the in-flight launch from the instances' tags: nothing launched
    // twice. It keeps passing (resync every 2 s) with no further launch.
    std::thread::sleep(Duration::from_secs(6));
    let all = env.instances();
    assert_eq!(
        all.len(),
        3,
        "{:?}",
        all.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
    assert!(env.log(&other).contains("became the leader"));
    assert!(
        !env.log(&other).contains("launching"),
        "the new leader launched again:\n{}",
        env.log(&other)
    );
}

#[test]
fn an_invalid_policy_update_keeps_the_last_good_policy_and_warns_on_the_configmap() {
    let mut env = Env::start("policy", Options::default());
    let good = env.policy(&["us-east-1a"], "");
    env.create(&env.policy_configmap(&good));
    env.start_controller("r1", &[]);
    env.wait_for("the policy to be in force", MIN, || {
        (env.metric("r1", "gpu_node_autoscaler_policy_valid ") == Some(1.0)).then_some(())
    });
    let bad = good.replace("maxNodes: 6", "maxNodes: -1");
    assert_ne!(bad, good);
    env.apply(&env.policy_configmap(&bad));
    let warning = env.wait_for("a PolicyInvalid Event", MIN, || {
        env.events("PolicyInvalid").pop()
    });
    assert!(
        warning.starts_with("gpu-node-autoscaler-policy: "),
        "{warning}"
    );
    let at = warning
        .split("policy.yaml:")
        .nth(1)
        .unwrap_or_default()
        .split(':')
        .take(2)
        .map(|n| n.trim().parse::<u32>().is_ok())
        .collect::<Vec<_>>();
    assert_eq!(at, [true, true], "LINE:COL after the file: {warning}");
    assert!(warning.contains("maxNodes"), "{warning}");
    assert!(
        warning.contains("the last good policy stays in force"),
        "{warning}"
    );
    assert_eq!(
        env.metric("r1", "gpu_node_autoscaler_policy_valid "),
        Some(0.0)
    );
    // The last good policy keeps scaling.
    env.create(&gpu_pod("default", "after-bad-policy", &no_labels(), None));
    env.wait_for("the pod to run on a new node", 2 * MIN, || {
        (env.pod_phase("default", "after-bad-policy") == "Running").then_some(())
    });
    assert_eq!(env.live_instances().len(), 1);
    // A valid change applies on a later pass.
    env.apply(&env.policy_configmap(&good.replace("maxNodes: 6", "maxNodes: 5")));
    env.wait_for("the valid policy to be in force", MIN, || {
        (env.metric("r1", "gpu_node_autoscaler_policy_valid ") == Some(1.0)).then_some(())
    });
}

#[test]
fn overrun_an_invalid_policy_at_start_up_is_reported_once_not_at_every_pass() {
    let mut env = Env::start("policy-start", Options::default());
    let good = env.policy(&["us-east-1a"], "");
    let bad = good.replace("maxNodes: 6", "maxNodes: -1");
    assert_ne!(bad, good);
    env.create(&env.policy_configmap(&bad));
    env.start_controller("r1", &[]);
    env.wait_for("a PolicyInvalid Event", MIN, || {
        env.events("PolicyInvalid").pop()
    });
    // Passes go on (every 2 s) with the same invalid policy: five more at least.
    let last_pass = |env: &Env| {
        env.metric("r1", "gpu_node_autoscaler_last_pass_timestamp_seconds ")
            .unwrap_or(0.0)
    };
    let first = last_pass(&env);
    env.wait_for("passes after the first", MIN, || {
        (last_pass(&env) >= first + 10.0).then_some(())
    });
    // Each rejection is logged, and each Event sent is logged with its reason.
    let sent = |log: &str| {
        (
            log.matches("policy rejected").count(),
            log.lines().filter(|l| l.contains("PolicyInvalid")).count(),
        )
    };
    let log = env.log("r1");
    assert_eq!(
        sent(&log),
        (1, 1),
        "the same policy rejected and its Event sent again:\n{log}"
    );
    assert_eq!(
        env.metric("r1", "gpu_node_autoscaler_policy_valid "),
        Some(0.0)
    );
    // A new version of the policy is read: invalid again, reported again, once.
    env.apply(&env.policy_configmap(&good.replace("maxNodes: 6", "maxNodes: -2")));
    env.wait_for("the second version rejected", MIN, || {
        (sent(&env.log("r1")).0 == 2).then_some(())
    });
    let second = last_pass(&env);
    env.wait_for("passes after the second", MIN, || {
        (last_pass(&env) >= second + 6.0).then_some(())
    });
    assert_eq!(sent(&env.log("r1")), (2, 2));
    // A valid one is put in force.
    env.apply(&env.policy_configmap(&good));
    env.wait_for("the valid policy to be in force", MIN, || {
        (env.metric("r1", "gpu_node_autoscaler_policy_valid ") == Some(1.0)).then_some(())
    });
}

/// A service with one replica on the GPU `node` and one on the system node (two ReplicaSets,
/// each preferring its node: free to move elsewhere), under two PodDisruptionBudgets that each still allow one
/// disruption. The planner sees room in both; the Eviction API refuses to evict a pod that more
/// than one budget selects, so the drain is blocked by the API server.
fn web_with_a_budget(env: &Env, node: &str) {
    web_with_budgets(env, node, 2);
}

/// The web service of [`web_with_a_budget`] under its first `budgets` budgets (1 or 2).
fn web_with_budgets(env: &Env, node: &str, budgets: usize) {
    let web = |name: &str, on: &str| {
        format!(
            "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata:\n  name: {name}\n  namespace: default\n\
             spec:\n  replicas: 1\n  selector:\n    matchLabels: {{app: web, instance: {name}}}\n  template:\n    \
             metadata:\n      labels: {{app: web, tier: frontend, instance: {name}}}\n    spec:\n      \
             affinity:\n        nodeAffinity:\n          preferredDuringSchedulingIgnoredDuringExecution:\n          \
             - weight: 100\n            preference:\n              matchExpressions:\n              \
             - {{key: kubernetes.io/hostname, operator: In, values: [{on}]}}\n      \
             terminationGracePeriodSeconds: 1\n      \
             tolerations:\n      - {{key: nvidia.com/gpu, operator: Exists}}\n      containers:\n      - name: web\n        \
             image: nginx\n        resources:\n          requests: {{cpu: 100m, memory: 128Mi}}\n"
        )
    };
    let budget = |name: &str, key: &str, value: &str| {
        format!(
            "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: {name}\n  namespace: default\n\
             spec:\n  minAvailable: 1\n  selector:\n    matchLabels: {{{key}: {value}}}\n"
        )
    };
    let all = [
        budget("web", "app", "web"),
        budget("web-tier", "tier", "frontend"),
    ];
    env.create(&format!(
        "{}---\n{}",
        web("web-gpu", node),
        web("web-system", "system-0"),
    ));
    // The budgets once both replicas run: the disruption controller re-syncs only one of several
    // budgets when a pod they share changes, so a budget made earlier could stay stale.
    env.wait_for("both web replicas to run", 2 * MIN, || {
        let v = env.get_json(&["get", "pods", "-n", "default", "-l", "app=web"]);
        let running = v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["status"]["phase"] == "Running")
            .count();
        (running == 2).then_some(())
    });
    env.create(&all[..budgets].join("---\n"));
    // The disruption controller computes the budgets' status from the two running replicas.
    env.wait_for("the budgets to allow one disruption", 2 * MIN, || {
        ["web", "web-tier"][..budgets]
            .iter()
            .all(|b| {
                let v = env.get_json(&["get", "pdb", "-n", "default", b]);
                v["status"]["disruptionsAllowed"] == 1 && v["status"]["currentHealthy"] == 2
            })
            .then_some(())
    });
}

/// The web replica's pod on `node`.
fn web_pod_on(env: &Env, node: &str) -> Option<String> {
    let v = env.get_json(&["get", "pods", "-n", "default", "-l", "instance=web-gpu"]);
    v["items"]
        .as_array()?
        .iter()
        .find(|p| p["spec"]["nodeName"] == node && p["metadata"]["deletionTimestamp"].is_null())
        .and_then(|p| p["metadata"]["name"].as_str().map(str::to_string))
}

/// A short GPU job gets a node of the pool (registered there by the controller): its name.
fn short_job_node(env: &Env) -> String {
    env.create(&gpu_pod("default", "short-job", &no_labels(), Some("4s")));
    env.wait_for("the GPU node in its pool", 2 * MIN, || {
        env.pool_nodes()
            .first()
            .and_then(|n| n["metadata"]["name"].as_str().map(str::to_string))
    })
}

/// A short GPU job gets a node; a budgeted service lands on it; after the job the node is
/// drained and the eviction refused. Returns the node.
fn drain_blocked_by_a_budget(env: &Env) -> String {
    let node = short_job_node(env);
    web_with_a_budget(env, &node);
    env.wait_for("the drain to start", 2 * MIN, || {
        env.events("ScaleDown")
            .into_iter()
            .find(|e| e.contains("draining"))
    });
    node
}

#[test]
fn a_drain_blocked_by_a_pdb_is_given_up_and_the_node_uncordoned() {
    let mut env = Env::start("pdb", Options::default());
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a"], "")));
    env.start_controller("r1", &["--max-graceful-termination", "8s"]);
    let node = drain_blocked_by_a_budget(&env);
    let failed = env.wait_for("the drain to be given up", MIN, || {
        env.events("ScaleDownFailed").pop()
    });
    assert!(failed.starts_with(&format!("{node}: ")), "{failed}");
    let n = env.get_json(&["get", "node", &node]);
    assert_ne!(n["spec"]["unschedulable"], true, "uncordoned: {n}");
    let taints = n["spec"]["taints"].as_array().cloned().unwrap_or_default();
    assert!(
        taints
            .iter()
            .all(|t| t["key"] != "gpu-node-autoscaler.io/to-be-deleted"),
        "{taints:?}"
    );
    let web = web_pod_on(&env, &node).expect("the web replica stays on the node");
    assert_eq!(env.pod_phase("default", &web), "Running");
    assert_eq!(env.live_instances().len(), 1, "the instance stays");
    // The pool's scale-down back-off (10m) holds: no second drain after the unneeded time.
    std::thread::sleep(Duration::from_secs(8));
    let drains: Vec<String> = env
        .events("ScaleDown")
        .into_iter()
        .filter(|e| e.contains("draining"))
        .collect();
    assert_eq!(drains.len(), 1, "{drains:?}");
    assert!(
        env.metric(
            "r1",
            "gpu_node_autoscaler_evictions_total{result=\"failed\"}"
        )
        .unwrap_or(0.0)
            >= 1.0,
        "the API server refused the eviction"
    );
}

#[test]
fn dry_run_reports_what_it_would_do_and_makes_no_ec2_call() {
    let mut env = Env::start(
        "dryrun",
        Options {
            proxy: true,
            ..Options::default()
        },
    );
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a"], "")));
    env.start_controller("r1", &["--dry-run"]);
    env.create(&gpu_pod("default", "dry", &no_labels(), None));
    let ev = env.wait_for("a DryRunScaleUp Event", MIN, || {
        env.events("DryRunScaleUp").pop()
    });
    assert!(ev.starts_with("dry: would launch 1 × g5.xlarge"), "{ev}");
    // Not the Cluster Autoscaler's reasons: the two can run side by side.
    assert!(env.events("TriggeredScaleUp").is_empty());
    std::thread::sleep(Duration::from_secs(4));
    let proxy = env.proxy.as_ref().unwrap();
    let calls: usize = [
        "DescribeInstances",
        "CreateFleet",
        "TerminateInstances",
        "DescribeInstanceTypes",
        "DescribeInstanceTypeOfferings",
        "DescribeSpotPriceHistory",
    ]
    .iter()
    .map(|a| proxy.calls_of(a))
    .sum();
    assert_eq!(calls, 0, "dry-run called EC2");
    assert!(env.instances().is_empty());
    assert_eq!(env.pod_phase("default", "dry"), "Pending");
    let status = env.status_json();
    assert_eq!(status["dryRun"], true);

    // An idle GPU node of the pool: it would be drained, and is left alone.
    env.kubectl_ok(&["delete", "pod", "dry"]);
    env.create(&ready_gpu_node(
        "idle-gpu-0",
        &[
            ("gpu-node-autoscaler.io/pool", "a10g"),
            ("karpenter.sh/capacity-type", "on-demand"),
        ],
        "i-0123456789abcdef0",
    ));
    let ev = env.wait_for("a DryRunScaleDown Event", MIN, || {
        env.events("DryRunScaleDown").pop()
    });
    assert!(env.events("ScaleDown").is_empty());
    assert!(
        ev.starts_with("idle-gpu-0: would drain and remove idle-gpu-0 (pool a10g"),
        "{ev}"
    );
    let n = env.get_json(&["get", "node", "idle-gpu-0"]);
    assert_ne!(n["spec"]["unschedulable"], true, "{n}");
    assert!(n["spec"]["taints"].is_null(), "{n}");
    assert!(
        n["metadata"]["annotations"]["gpu-node-autoscaler.io/unneeded-since"].is_null(),
        "dry-run writes no annotation: {n}"
    );
    let calls: usize = ["DescribeInstances", "CreateFleet", "TerminateInstances"]
        .iter()
        .map(|a| proxy.calls_of(a))
        .sum();
    assert_eq!(calls, 0, "dry-run called EC2");
}

#[test]
fn api_errors_and_closed_watches_cause_no_stale_decision_and_it_recovers() {
    let mut env = Env::start(
        "faults",
        Options {
            kube_proxy: true,
            ..Options::default()
        },
    );
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a"], "")));
    // A Lease that outlasts a few failed renewals in a row (each is a GET and a PUT, either of
    // which may be the failing request).
    env.start_controller("r1", &["--lease-duration", "15s"]);
    env.create(&gpu_pod("default", "first", &no_labels(), None));
    env.wait_for("the first pod to run", 2 * MIN, || {
        (env.pod_phase("default", "first") == "Running").then_some(())
    });
    let node = env.wait_for("the node in its pool", MIN, || {
        env.pool_nodes()
            .first()
            .and_then(|n| n["metadata"]["name"].as_str().map(str::to_string))
    });

    // A third of the API requests fail, every watch is cut now and again after 10 s of life.
    // Meanwhile the first pod goes and a second is bound to the node: a controller deciding
    // from a cache that saw the deletion but not the new pod would find the node idle and
    // drain it. (With every second request failing, each Lease renewal, a GET and a PUT in a
    // row, failed; with watches cut every 2 s, one of the 13 kinds was always re-listing and
    // no pass may decide then: either way no pass ran, and the test passed by doing nothing.)
    let passes = |env: &Env| {
        env.metric("r1", "gpu_node_autoscaler_plan_duration_seconds_count")
            .unwrap_or(0.0)
    };
    let proxy = env.kube_proxy.as_ref().unwrap();
    proxy.fail_every(3, 500);
    proxy.cut_watches_after(Some(Duration::from_secs(10)));
    proxy.cut_watches();
    let passes_before = passes(&env);
    env.kubectl_ok(&["delete", "pod", "first", "--wait=false"]);
    let mut second = gpu_pod("default", "second", &no_labels(), None);
    second = second.replace("spec:\n", &format!("spec:\n  nodeName: {node}\n"));
    env.create(&second);
    // Until passes have run under the faults (it cannot pass by deciding nothing), and for
    // 20 s at least.
    let started = std::time::Instant::now();
    let window = Duration::from_secs(20);
    while started.elapsed() < window || passes(&env) < passes_before + 2.0 {
        assert!(
            started.elapsed() < 4 * MIN,
            "{} passes in 4 minutes of API faults:\n{}",
            passes(&env) - passes_before,
            env.log("r1")
        );
        assert_eq!(
            env.live_instances().len(),
            1,
            "the node's instance was terminated"
        );
        let out = env.kubectl(&["get", "node", &node, "-o", "jsonpath={.spec.taints}"]);
        if out.status.success() {
            let taints = String::from_utf8_lossy(&out.stdout);
            assert!(
                !taints.contains("to-be-deleted"),
                "drained from a stale cache: {taints}"
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let during = passes(&env) - passes_before;
    let proxy = env.kube_proxy.as_ref().unwrap();
    proxy.fail_every(0, 500);
    proxy.cut_watches_after(None);
    assert!(during >= 2.0, "{during} passes during the faults");
    assert!(
        env.log("r1").contains("watch failed; re-listing"),
        "the faults reached the controller"
    );
    env.wait_for("the controller to be ready again", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });
    let n = env.get_json(&["get", "node", &node]);
    assert_ne!(n["spec"]["unschedulable"], true, "{n}");
    assert_eq!(env.pod_phase("default", "second"), "Running");

    // Recovered: a new pod gets a new node.
    env.create(&gpu_pod("default", "after-faults", &no_labels(), None));
    env.wait_for("the new pod to run", 2 * MIN, || {
        (env.pod_phase("default", "after-faults") == "Running").then_some(())
    });
    assert_eq!(env.live_instances().len(), 2);
}

#[test]
fn a_drain_interrupted_by_a_crash_is_finished_by_the_next_leader() {
    let mut env = Env::start("resume", Options::default());
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a"], "")));
    let flags = ["--max-graceful-termination", "5m"];
    env.start_controller("r1", &flags);
    let node = drain_blocked_by_a_budget(&env);
    env.kill("r1");
    // One budget goes while no controller runs; the next one finds the drain from the taint.
    env.kubectl_ok(&["delete", "pdb", "web-tier"]);
    let n = env.get_json(&["get", "node", &node]);
    assert!(
        n["spec"]["taints"]
            .to_string()
            .contains("gpu-node-autoscaler.io/to-be-deleted"),
        "{n}"
    );
    env.start_controller("r2", &flags);
    env.wait_for("the node's instance to be terminated", 2 * MIN, || {
        env.live_instances().is_empty().then_some(())
    });
    env.wait_for("the node to be deleted", MIN, || {
        env.pool_nodes().is_empty().then_some(())
    });
    assert!(env.log("r2").contains("resuming an interrupted drain"));
    let system = env.get_json(&["get", "pods", "-n", "default", "-l", "instance=web-system"]);
    assert_eq!(system["items"][0]["status"]["phase"], "Running", "{system}");
}

#[test]
fn a_launch_that_never_becomes_a_node_is_given_up_and_planned_elsewhere() {
    // Instances never register.
    let mut env = Env::start(
        "provision",
        Options {
            boot_delay: Some(Duration::from_secs(3600)),
            ..Options::default()
        },
    );
    let policy = env
        .policy(&["us-east-1a", "us-east-1b"], "")
        .replace("maxNodeProvisionTime: 2m", "maxNodeProvisionTime: 15s");
    env.create(&env.policy_configmap(&policy));
    env.start_controller("r1", &[]);
    env.create(&gpu_pod("default", "stuck", &no_labels(), None));
    let first = env.wait_for("a launch", 2 * MIN, || env.live_instances().pop());
    let second = env.wait_for("a launch of another offering", 2 * MIN, || {
        env.live_instances()
            .into_iter()
            .find(|(id, _)| *id != first.0)
    });
    assert!(
        (second.1.zone.as_str(), second.1.spot) != (first.1.zone.as_str(), first.1.spot),
        "the given-up offering is avoided: {} spot={} then {} spot={}",
        first.1.zone,
        first.1.spot,
        second.1.zone,
        second.1.spot
    );
    let gone = env
        .instances()
        .into_iter()
        .find(|(id, _)| *id == first.0)
        .map(|(_, v)| v.state)
        .unwrap_or_default();
    assert!(gone == "shutting-down" || gone == "terminated", "{gone}");
    assert!(
        env.metric(
            "r1",
            "gpu_node_autoscaler_failed_launches_total{pool=\"a10g\",reason=\"provision_timeout\"}"
        )
        .unwrap_or(0.0)
            >= 1.0
    );
}

#[test]
fn sigterm_releases_the_lease_for_the_other_replica() {
    let mut env = Env::start("sigterm", Options::default());
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a"], "")));
    // A Lease this long is never taken over by expiry within the test: only a release hands
    // it over.
    let flags = ["--lease-duration", "120s"];
    env.start_controller("r1", &flags);
    env.wait_for("r1 to lead", MIN, || {
        (lease_holder(&env).as_deref() == Some("r1")).then_some(())
    });
    env.start_controller("r2", &flags);
    env.wait_for("r2 to follow", MIN, || {
        (env.metric("r2", "gpu_node_autoscaler_leader ") == Some(0.0)).then_some(())
    });
    env.terminate("r1");
    env.wait_for("r2 to lead", MIN, || {
        (lease_holder(&env).as_deref() == Some("r2")).then_some(())
    });
    assert!(env.log("r1").contains("released the Lease"));
}

#[test]
fn a_forbidden_eviction_is_reported_and_the_node_given_back() {
    // The controller's ClusterRole as deploy/ renders it, less `create` on pods/eviction.
    let mut env = Env::start(
        "forbidden",
        Options {
            cluster: cluster::ClusterOptions {
                drop_rule: Some(("pods/eviction", "create")),
                ..Default::default()
            },
            ..Options::default()
        },
    );
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a"], "")));
    env.start_controller("r1", &["--max-graceful-termination", "5m"]);
    let node = short_job_node(&env);
    web_with_budgets(&env, &node, 1);
    let failed = env.wait_for("the drain to be given up", 2 * MIN, || {
        env.events("ScaleDownFailed").pop()
    });
    assert!(failed.starts_with(&format!("{node}: ")), "{failed}");
    assert!(
        failed.contains("forbidden") && failed.contains("pods/eviction"),
        "{failed}"
    );
    assert!(
        env.log("r1").contains("eviction forbidden"),
        "logged as an error"
    );
    assert_eq!(
        env.metric(
            "r1",
            "gpu_node_autoscaler_evictions_total{result=\"forbidden\"}"
        ),
        Some(1.0)
    );
    let n = env.get_json(&["get", "node", &node]);
    assert_ne!(n["spec"]["unschedulable"], true, "uncordoned: {n}");
    assert_eq!(env.live_instances().len(), 1, "the instance stays");
}

#[test]
fn a_drain_waits_for_a_pods_grace_period_before_the_instance_goes() {
    let mut env = Env::start("grace", Options::default());
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a"], "")));
    env.start_controller("r1", &["--max-graceful-termination", "5m"]);
    let node = short_job_node(&env);
    // A checkpointing trainer: 30 s to save its state once told to stop. It prefers the GPU
    // node and may move to the system node.
    env.create(&format!(
        "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata:\n  name: ckpt\n  namespace: default\n\
         spec:\n  replicas: 1\n  selector:\n    matchLabels: {{app: ckpt}}\n  template:\n    \
         metadata:\n      labels: {{app: ckpt}}\n    spec:\n      affinity:\n        nodeAffinity:\n          \
         preferredDuringSchedulingIgnoredDuringExecution:\n          - weight: 100\n            \
         preference:\n              matchExpressions:\n              \
         - {{key: kubernetes.io/hostname, operator: In, values: [{node}]}}\n      \
         terminationGracePeriodSeconds: 30\n      tolerations:\n      - {{key: nvidia.com/gpu, operator: Exists}}\n      \
         containers:\n      - name: saver\n        image: busybox\n        resources:\n          \
         requests: {{cpu: 100m, memory: 128Mi}}\n"
    ));
    let pods_on_node = |env: &Env| -> Vec<serde_json::Value> {
        let v = env.get_json(&["get", "pods", "-n", "default", "-l", "app=ckpt"]);
        v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["spec"]["nodeName"] == node.as_str())
            .cloned()
            .collect()
    };
    let evicted = env.wait_for("the trainer on the node to be evicted", 3 * MIN, || {
        pods_on_node(&env)
            .into_iter()
            .find(|p| p["metadata"]["deletionTimestamp"].is_string())
    });
    let name = evicted["metadata"]["name"].as_str().unwrap().to_string();
    // While it saves its state, its node's instance stays.
    let mut terminating_polls = 0;
    while pods_on_node(&env)
        .iter()
        .any(|p| p["metadata"]["name"] == name.as_str())
    {
        assert_eq!(
            env.live_instances().len(),
            1,
            "the instance went while {name} was still terminating"
        );
        terminating_polls += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(terminating_polls > 1, "{name} was seen terminating");
    env.wait_for("the instance to be terminated", 2 * MIN, || {
        env.live_instances().is_empty().then_some(())
    });
}

#[test]
fn a_node_whose_device_plugin_restarts_is_kept() {
    let mut env = Env::start("plugin", Options::default());
    // Without GPUs past this, a node would count as a launch that never came up.
    let policy = env
        .policy(&["us-east-1a"], "")
        .replace("maxNodeProvisionTime: 2m", "maxNodeProvisionTime: 15s");
    env.create(&env.policy_configmap(&policy));
    env.start_controller("r1", &[]);
    env.create(&gpu_pod("default", "train", &no_labels(), None));
    env.wait_for("the trainer to run", 2 * MIN, || {
        (env.pod_phase("default", "train") == "Running").then_some(())
    });
    let node = env.wait_for("the node to be known to have had GPUs", MIN, || {
        env.pool_nodes().into_iter().find_map(|n| {
            n["metadata"]["annotations"]["gpu-node-autoscaler.io/gpus-advertised"]
                .is_string()
                .then(|| n["metadata"]["name"].as_str().unwrap().to_string())
        })
    });
    let set_gpus = |n: &str| {
        env.kubectl_ok(&[
            "patch",
            "node",
            &node,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(
                r#"{{"status":{{"capacity":{{"nvidia.com/gpu":"{n}"}},"allocatable":{{"nvidia.com/gpu":"{n}"}}}}}}"#
            ),
        ]);
    };
    // The device plugin restarts: no GPUs for longer than maxNodeProvisionTime.
    set_gpus("0");
    let lost = env.wait_for("a GPUsUnavailable Event", MIN, || {
        env.events("GPUsUnavailable").pop()
    });
    assert!(lost.starts_with(&format!("{node}: ")), "{lost}");
    assert_eq!(
        env.metric("r1", "gpu_node_autoscaler_nodes_gpus_lost "),
        Some(1.0)
    );
    std::thread::sleep(Duration::from_secs(25));
    assert_eq!(env.live_instances().len(), 1, "the instance was given up");
    assert!(!env.log("r1").contains("giving up a launch"));
    assert_eq!(env.pod_phase("default", "train"), "Running");
    // Back: reported as such.
    set_gpus("1");
    env.wait_for("the node to count its GPUs again", MIN, || {
        (env.metric("r1", "gpu_node_autoscaler_nodes_gpus_lost ") == Some(0.0)).then_some(())
    });
    assert_eq!(env.live_instances().len(), 1);
}

#[test]
fn two_clusters_with_one_name_leave_each_others_instances_alone() {
    let mut env = Env::start("owners", Options::default());
    // Another cluster of the same clusterName in the same account: its launch, as it tags it
    // (its own kube-system UID as the identity). Its node joins that cluster, never this one.
    let theirs = env.rt.block_on(async {
        let r = env
            .ec2
            .run_instances()
            .launch_template(
                aws_sdk_ec2::types::LaunchTemplateSpecification::builder()
                    .launch_template_name(&env.net.launch_template)
                    .build(),
            )
            .instance_type(aws_sdk_ec2::types::InstanceType::G5Xlarge)
            .subnet_id(&env.net.subnets["us-east-1a"])
            .min_count(1)
            .max_count(1)
            .tag_specifications(
                aws_sdk_ec2::types::TagSpecification::builder()
                    .resource_type(aws_sdk_ec2::types::ResourceType::Instance)
                    .set_tags(Some(
                        [
                            ("gpu-node-autoscaler.io/cluster", support::CLUSTER),
                            ("gpu-node-autoscaler.io/pool", "a10g"),
                            ("gpu-node-autoscaler.io/launch-id", "a10g-0123456789ab"),
                            ("gpu-node-autoscaler.io/managed-by", "gpu-node-autoscaler"),
                            (
                                "gpu-node-autoscaler.io/cluster-id",
                                "6b1f0c2e-0000-4000-8000-other-cluster",
                            ),
                        ]
                        .into_iter()
                        .map(|(k, v)| aws_sdk_ec2::types::Tag::builder().key(k).value(v).build())
                        .collect(),
                    ))
                    .build(),
            )
            .send()
            .await
            .expect("RunInstances");
        r.instances()[0].instance_id().unwrap().to_string()
    });
    // Without a node here past this, an instance of ours would be given up and terminated.
    let policy = env
        .policy(&["us-east-1a"], "")
        .replace("maxNodeProvisionTime: 2m", "maxNodeProvisionTime: 10s");
    env.create(&env.policy_configmap(&policy));
    env.start_controller("r1", &[]);
    env.create(&gpu_pod("default", "ours", &no_labels(), Some("5s")));
    // Our pod gets its own node: the other cluster's instance is not capacity of ours.
    env.wait_for("our pod to run", 2 * MIN, || {
        (env.pod_phase("default", "ours") == "Running").then_some(())
    });
    let mine: Vec<String> = env
        .live_instances()
        .into_iter()
        .map(|(id, _)| id)
        .filter(|id| *id != theirs)
        .collect();
    assert_eq!(mine.len(), 1, "{mine:?}");
    // Ours goes after the pod; theirs stays, long past maxNodeProvisionTime.
    env.wait_for("our instance to be terminated", 3 * MIN, || {
        (!env.live_instances().iter().any(|(id, _)| *id == mine[0])).then_some(())
    });
    std::thread::sleep(Duration::from_secs(15));
    let live: Vec<String> = env.live_instances().into_iter().map(|(id, _)| id).collect();
    assert_eq!(
        live,
        std::slice::from_ref(&theirs),
        "the other cluster's instance stays"
    );
    assert!(
        !env.log("r1").contains(theirs.as_str()),
        "the controller never acted on {theirs}:\n{}",
        env.log("r1")
    );
    let launched: String = env.kubectl_ok(&[
        "get",
        "namespace",
        "kube-system",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    let tags = &env
        .instances()
        .into_iter()
        .find(|(id, _)| *id == mine[0])
        .unwrap()
        .1
        .tags;
    assert_eq!(
        tags.get("gpu-node-autoscaler.io/cluster-id"),
        Some(&launched),
        "our launches carry our identity"
    );
}

#[test]
fn a_node_registered_with_the_startup_taint_is_freed_of_it_and_takes_its_pod() {
    // The launch template's kubelet registers every node with the pool's startup taint (and no
    // pool label); registration in the pool removes it.
    let mut env = Env::start(
        "startup",
        Options {
            register_with_taints: vec!["gpu-node-autoscaler.io/registering=:NoExecute".into()],
            ..Options::default()
        },
    );
    env.create(&env.policy_configmap(&env.policy(
        &["us-east-1a"],
        "  startupTaints: [{key: gpu-node-autoscaler.io/registering, effect: NoExecute}]\n",
    )));
    env.start_controller("r1", &[]);
    env.create(&gpu_pod("default", "train", &no_labels(), None));
    env.wait_for("the pod to run", 2 * MIN, || {
        (env.pod_phase("default", "train") == "Running").then_some(())
    });
    let nodes = env.pool_nodes();
    assert_eq!(nodes.len(), 1, "one node");
    let taints: Vec<String> = nodes[0]["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| t["key"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        !taints
            .iter()
            .any(|k| k == "gpu-node-autoscaler.io/registering"),
        "{taints:?}"
    );
    assert!(taints.iter().any(|k| k == "nvidia.com/gpu"), "{taints:?}");
    assert!(
        env.log("r1")
            .contains("startup taint gpu-node-autoscaler.io/registering:NoExecute removed"),
        "{}",
        env.log("r1")
    );
    assert_eq!(
        env.instances().len(),
        1,
        "no second launch while it was tainted"
    );
}

#[test]
fn the_loop_keeps_turning_while_a_slow_launch_is_awaited() {
    // A launch call can take minutes (an ESS scaling activity): the liveness heartbeat must not
    // stop meanwhile, and the launch still ends in exactly one node for the pod.
    let mut env = Env::start(
        "slowlaunch",
        Options {
            proxy: true,
            ..Options::default()
        },
    );
    let hold = Duration::from_secs(20);
    env.proxy.as_ref().unwrap().hold_next("CreateFleet", hold);
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a"], "")));
    env.start_controller("r1", &[]);
    env.create(&gpu_pod("default", "train", &no_labels(), None));
    let metrics = |env: &Env| {
        let (_, body) = env.http_get("r1", "/metrics")?;
        let get = |name: &str| {
            body.lines()
                .find_map(|l| l.strip_prefix(&format!("gpu_node_autoscaler_{name} ")))
                .and_then(|v| v.parse::<f64>().ok())
        };
        Some((
            get("launches_in_progress")?,
            get("heartbeat_timestamp_seconds")?,
        ))
    };
    let first_beat = env.wait_for("the launch to be under way", MIN, || {
        metrics(&env).and_then(|(launching, beat)| (launching == 1.0).then_some(beat))
    });
    std::thread::sleep(Duration::from_secs(8));
    let (launching, beat) = metrics(&env).expect("metrics");
    assert_eq!(launching, 1.0, "the held launch is still awaited");
    assert!(
        beat >= first_beat + 5.0,
        "the heartbeat stood still while the launch was awaited: {first_beat} → {beat}"
    );
    assert_eq!(env.http_get("r1", "/healthz").map(|r| r.0), Some(200));
    env.wait_for("the pod to run", 2 * MIN, || {
        (env.pod_phase("default", "train") == "Running").then_some(())
    });
    assert_eq!(env.instances().len(), 1, "one launch");
    assert_eq!(metrics(&env).map(|m| m.0), Some(0.0));
}

#[test]
fn a_node_group_adopted_by_node_selector_counts_in_its_pool_and_is_only_reported_when_idle() {
    let mut env = Env::start("adopt", Options::default());
    env.create(&env.policy_configmap(&env.policy(
        &["us-east-1a"],
        "  nodeSelector: {eks.amazonaws.com/nodegroup: gpu-a10g}\n",
    )));
    // A node of an EKS managed node group: no pool label, an instance we did not launch.
    env.create(&ready_gpu_node(
        "ng-gpu-0",
        &[("eks.amazonaws.com/nodegroup", "gpu-a10g")],
        "i-0feedfacefeedface",
    ));
    env.start_controller("r1", &[]);
    let ev = env.wait_for("a ScaleDownNotOwned Event", 2 * MIN, || {
        env.events("ScaleDownNotOwned").pop()
    });
    assert!(
        ev.contains("ng-gpu-0 is unneeded (pool a10g") && ev.contains("not launched by"),
        "{ev}"
    );
    let status = env.status_json();
    let pool = &status["pools"][0];
    assert_eq!(pool["name"], "a10g", "{status}");
    assert_eq!(pool["readyNodes"], 1, "{status}");
    assert_eq!(
        env.metric(
            "r1",
            "gpu_node_autoscaler_nodes{pool=\"a10g\",capacity_type=\"unknown\"}"
        ),
        Some(1.0)
    );
    // Left alone: never cordoned, tainted, labelled or deleted.
    std::thread::sleep(Duration::from_secs(8));
    let n = env.get_json(&["get", "node", "ng-gpu-0"]);
    assert_ne!(n["spec"]["unschedulable"], true, "{n}");
    assert!(n["spec"]["taints"].is_null(), "{n}");
    assert!(
        n["metadata"]["labels"]["gpu-node-autoscaler.io/pool"].is_null(),
        "{n}"
    );
    assert!(n["metadata"]["deletionTimestamp"].is_null(), "{n}");
    assert_eq!(env.events("ScaleDownNotOwned").len(), 1, "reported once");
    assert!(env.events("ScaleDown").is_empty());
}

#[test]
fn a_pod_that_does_not_fit_the_node_launched_for_it_gets_a_larger_type_not_the_same_again() {
    // The kubelets reserve 500m CPU, the policy plans with its default 200m: a pod asking 3.8
    // CPUs fits a g5.xlarge on paper and not on the node.
    let mut env = Env::start(
        "learn",
        Options {
            kube_reserved_cpu_milli: 500,
            ..Options::default()
        },
    );
    let policy = env
        .policy(&["us-east-1a"], "")
        .replace("[g5.xlarge]", "[g5.xlarge, g5.2xlarge]");
    env.create(&env.policy_configmap(&policy));
    env.start_controller("r1", &[]);
    env.create(
        &gpu_pod("default", "wide", &no_labels(), None)
            .replace("cpu: \"1\", memory: 2Gi", "cpu: 3800m, memory: 4Gi"),
    );
    env.wait_for("the pod to run", 3 * MIN, || {
        (env.pod_phase("default", "wide") == "Running").then_some(())
    });
    // Both registered in the pool (the pod may land before registration labels its node).
    env.wait_for("two nodes in the pool", MIN, || {
        (env.pool_nodes().len() == 2).then_some(())
    });
    let mut types: Vec<String> = env
        .pool_nodes()
        .iter()
        .map(|n| {
            n["metadata"]["labels"]["node.kubernetes.io/instance-type"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    types.sort();
    assert_eq!(types, ["g5.2xlarge", "g5.xlarge"], "one of each");
    assert_eq!(env.instances().len(), 2);
    let pod = env.get_json(&["get", "pod", "wide", "-n", "default"]);
    let node = env.get_json(&["get", "node", pod["spec"]["nodeName"].as_str().unwrap()]);
    assert_eq!(
        node["metadata"]["labels"]["node.kubernetes.io/instance-type"],
        "g5.2xlarge"
    );
    assert!(
        env.log("r1")
            .contains("g5.xlarge nodes of pool a10g allocate cpu=3500m"),
        "{}",
        env.log("r1")
    );
}

/// One GPU trainer kept by a ReplicaSet (so an evicted one comes back), and the node it runs on.
fn gpu_trainer(env: &Env) -> String {
    create_trainers(env, 1);
    env.wait_for("the trainer to run", 2 * MIN, || trainer_node(env))
}

/// A ReplicaSet `trainer` of `replicas` pods asking for one GPU each.
fn create_trainers(env: &Env, replicas: u32) {
    env.create(&format!(
        "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata:\n  name: trainer\n  namespace: default\n\
         spec:\n  replicas: {replicas}\n  selector:\n    matchLabels: {{app: trainer}}\n  template:\n    \
         metadata:\n      labels: {{app: trainer}}\n    spec:\n      \
         tolerations:\n      - {{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}}\n      \
         containers:\n      - name: main\n        image: cuda:12\n        resources:\n          \
         requests: {{cpu: \"1\", memory: 2Gi, nvidia.com/gpu: \"1\"}}\n          \
         limits: {{nvidia.com/gpu: \"1\"}}\n",
    ));
}

/// The node a Running, not terminating trainer runs on.
fn trainer_node(env: &Env) -> Option<String> {
    let v = env.get_json(&["get", "pods", "-n", "default", "-l", "app=trainer"]);
    v["items"].as_array()?.iter().find_map(|p| {
        (p["status"]["phase"] == "Running" && !p["metadata"]["deletionTimestamp"].is_string())
            .then(|| p["spec"]["nodeName"].as_str().map(str::to_string))
            .flatten()
    })
}

/// Waits until the trainer runs on another node than `old` and `old`'s instance is gone;
/// returns the new node.
fn trainer_moved_and_node_removed(env: &Env, old: &str) -> String {
    let new = env.wait_for("the trainer to run on another node", 3 * MIN, || {
        trainer_node(env).filter(|n| n != old)
    });
    env.wait_for("the old node to be removed", 2 * MIN, || {
        let gone = !env
            .pool_nodes()
            .iter()
            .any(|n| n["metadata"]["name"] == old);
        (gone && env.live_instances().len() == 1).then_some(())
    });
    new
}

/// Waits for the replacement to be counted (once the drain task is collected).
fn counted_replaced(env: &Env, cause: &str) {
    let line =
        format!("gpu_node_autoscaler_nodes_replaced_total{{pool=\"a10g\",cause=\"{cause}\"}}");
    env.wait_for(
        "the replacement to be counted",
        Duration::from_secs(30),
        || (env.metric("r1", &line) == Some(1.0)).then_some(()),
    );
}

/// A cluster whose pool replaces a node showing `AcceleratedHardwareReady=False` for 5 s, and
/// its controller started with `args`.
fn with_hardware_health(name: &str, args: &[&str]) -> Env {
    let mut env = Env::start(name, Options::default());
    let policy = env.policy(
        &["us-east-1a"],
        "  health:\n    conditions:\n    \
         - {type: AcceleratedHardwareReady, status: \"False\", gracePeriod: 5s}\n",
    );
    env.create(&env.policy_configmap(&policy));
    env.start_controller("r1", args);
    env
}

#[test]
fn a_node_whose_gpu_hardware_fails_is_replaced_and_its_trainer_moves() {
    let env = with_hardware_health("health", &[]);
    let old = gpu_trainer(&env);
    // What a GPU health agent (NVIDIA's GPU operator, node-problem-detector) reports on an XID
    // error.
    set_hardware_ready(&env, &old, "False");
    let ev = env.wait_for("a ReplacingUnhealthyNode Event", MIN, || {
        env.events("ReplacingUnhealthyNode").pop()
    });
    assert!(ev.starts_with(&format!("{old}: ")), "{ev}");
    assert!(ev.contains("AcceleratedHardwareReady"), "{ev}");
    // The trainer keeps running on the broken node until its new place exists: a replacement
    // is launched first, then the broken node is drained and its instance terminated.
    let new = trainer_moved_and_node_removed(&env, &old);
    assert_ne!(new, old);
    counted_replaced(&env, "unhealthy");
    assert_eq!(env.instances().len(), 2, "exactly one replacement launched");
}

#[test]
fn a_ready_node_advertising_fewer_gpus_than_its_instance_type_is_replaced_after_the_grace_period() {
    let mut env = Env::start("missing-gpus", Options::default());
    // g5.12xlarge: four A10Gs.
    let policy = env
        .policy(
            &["us-east-1a"],
            "  health:\n    missingGpusGracePeriod: 5s\n",
        )
        .replace("instanceTypes: [g5.xlarge]", "instanceTypes: [g5.12xlarge]");
    env.create(&env.policy_configmap(&policy));
    env.start_controller("r1", &[]);
    let old = gpu_trainer(&env);
    let gpus = |env: &Env, field: &str| {
        env.get_json(&["get", "node", &old])["status"][field]["nvidia.com/gpu"]
            .as_str()
            .map(str::to_string)
    };
    env.wait_for("the node to advertise its four GPUs", MIN, || {
        let n = env.get_json(&["get", "node", &old]);
        let known =
            n["metadata"]["annotations"]["gpu-node-autoscaler.io/gpus-advertised"].is_string();
        (known && gpus(&env, "allocatable").as_deref() == Some("4")).then_some(())
    });
    // The device plugin reports one GPU unhealthy: the kubelet keeps it in capacity and takes it
    // out of allocatable. The node stays Ready.
    env.kubectl_ok(&[
        "patch",
        "node",
        &old,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"allocatable":{"nvidia.com/gpu":"3"}}}"#,
    ]);
    let ev = env.wait_for("a ReplacingUnhealthyNode Event", MIN, || {
        env.events("ReplacingUnhealthyNode").pop()
    });
    assert!(ev.starts_with(&format!("{old}: ")), "{ev}");
    assert!(ev.contains("advertises 3 of its 4 GPUs"), "{ev}");
    // Measured from when the controller first saw it: at least the grace period.
    let secs = seen_for_secs(&ev);
    assert!(secs >= 5, "{ev}");
    let node = env.get_json(&["get", "node", &old]);
    assert_eq!(
        node["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
            .map(|c| c["status"].clone()),
        Some(serde_json::json!("True")),
        "{node}"
    );
    assert_eq!(gpus(&env, "allocatable").as_deref(), Some("3"));
    // Cordoned (tainted) and replaced: its trainer moves to the replacement, then the node is
    // drained and its instance terminated.
    let new = trainer_moved_and_node_removed(&env, &old);
    assert_ne!(new, old);
    counted_replaced(&env, "unhealthy");
    assert_eq!(env.instances().len(), 2, "exactly one replacement launched");
    assert_trainer_evicted(&env);
}

/// How long a ReplacingUnhealthyNode Event says the node had been seen unhealthy ("... for Ns").
fn seen_for_secs(ev: &str) -> u64 {
    ev.split(" for ")
        .nth(1)
        .and_then(|t| t.split('s').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no duration in {ev}"))
}

/// Sets the `AcceleratedHardwareReady` condition of `node` as the EKS node monitoring agent
/// would (kept through kwok's heartbeats: conditions merge by type).
fn set_hardware_ready(env: &Env, node: &str, status: &str) {
    env.kubectl_ok(&[
        "patch",
        "node",
        node,
        "--subresource=status",
        "--type=strategic",
        "-p",
        &format!(
            r#"{{"status":{{"conditions":[{{"type":"AcceleratedHardwareReady","status":"{status}","reason":"XidError","message":"Xid 79: GPU has fallen off the bus"}}]}}}}"#
        ),
    ]);
}

/// Waits until the controller has finished `n` more passes.
fn wait_passes(env: &Env, n: f64) {
    let passes = |env: &Env| {
        env.metric("r1", "gpu_node_autoscaler_plan_duration_seconds_count")
            .unwrap_or(0.0)
    };
    let start = passes(env);
    env.wait_for(&format!("{n} more passes"), MIN, || {
        (passes(env) >= start + n).then_some(())
    });
}

#[test]
fn a_flapping_gpu_condition_keeps_the_clock_it_started_and_the_node_is_replaced_on_it() {
    let mut env = Env::start("flap", Options::default());
    let policy = env.policy(
        &["us-east-1a"],
        "  health:\n    conditions:\n    \
         - {type: AcceleratedHardwareReady, status: \"False\", gracePeriod: 30s}\n",
    );
    env.create(&env.policy_configmap(&policy));
    env.start_controller("r1", &[]);
    let old = gpu_trainer(&env);
    let since = |env: &Env| {
        env.get_json(&["get", "node", &old])["metadata"]["annotations"]
            ["gpu-node-autoscaler.io/unhealthy-since"]
            .as_str()
            .map(str::to_string)
    };
    set_hardware_ready(&env, &old, "False");
    let first = env.wait_for("the clock to start", MIN, || since(&env));
    // Healthy again for a few passes (less than the grace period), then broken again: the
    // clock that started first stands.
    set_hardware_ready(&env, &old, "True");
    wait_passes(&env, 3.0);
    assert_eq!(since(&env).as_deref(), Some(first.as_str()));
    assert!(env.events("NodeRecovered").is_empty());
    set_hardware_ready(&env, &old, "False");
    wait_passes(&env, 3.0);
    assert_eq!(since(&env).as_deref(), Some(first.as_str()));
    let ev = env.wait_for("a ReplacingUnhealthyNode Event", 2 * MIN, || {
        env.events("ReplacingUnhealthyNode").pop()
    });
    assert!(ev.starts_with(&format!("{old}: ")), "{ev}");
    // The reason counts from the first sighting: "... for Ns" with N at least the grace period.
    let secs = seen_for_secs(&ev);
    assert!(secs >= 30, "{ev}");
    trainer_moved_and_node_removed(&env, &old);
    counted_replaced(&env, "unhealthy");
}

#[test]
fn with_two_broken_nodes_and_max_replacing_share_one_half_they_are_replaced_one_at_a_time() {
    let mut env = Env::start("guard", Options::default());
    let policy = env.policy(
        &["us-east-1a"],
        "  health:\n    maxReplacingShare: 0.5\n    conditions:\n    \
         - {type: AcceleratedHardwareReady, status: \"False\", gracePeriod: 3s}\n",
    );
    env.create(&env.policy_configmap(&policy));
    env.start_controller("r1", &[]);
    create_trainers(&env, 2);
    let trainer_nodes = |env: &Env| -> Vec<String> {
        let v = env.get_json(&["get", "pods", "-n", "default", "-l", "app=trainer"]);
        let mut nodes: Vec<String> = v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| {
                p["status"]["phase"] == "Running" && !p["metadata"]["deletionTimestamp"].is_string()
            })
            .filter_map(|p| p["spec"]["nodeName"].as_str().map(str::to_string))
            .collect();
        nodes.sort();
        nodes
    };
    let old = env.wait_for("both trainers to run", 2 * MIN, || {
        let n = trainer_nodes(&env);
        (n.len() == 2).then_some(n)
    });
    for n in &old {
        set_hardware_ready(&env, n, "False");
    }
    let replacing = |env: &Env| -> usize {
        env.pool_nodes()
            .iter()
            .filter(|n| {
                n["spec"]["taints"].as_array().is_some_and(|ts| {
                    ts.iter()
                        .any(|t| t["key"] == "gpu-node-autoscaler.io/replacing")
                })
            })
            .count()
    };
    let deferred = env.wait_for("a ReplacementDeferred Event", MIN, || {
        env.events("ReplacementDeferred").pop()
    });
    assert!(deferred.contains("maxReplacingShare"), "{deferred}");
    // Until both broken nodes are gone, never more than one is being replaced.
    env.wait_for("both broken nodes to be replaced", 5 * MIN, || {
        let r = replacing(&env);
        assert!(r <= 1, "{r} nodes being replaced at once");
        let names: Vec<String> = env
            .pool_nodes()
            .iter()
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        let gone = old.iter().all(|o| !names.contains(o));
        let moved = trainer_nodes(&env);
        (gone && moved.len() == 2 && moved.iter().all(|m| !old.contains(m))).then_some(())
    });
    assert_eq!(env.events("ReplacingUnhealthyNode").len(), 2);
    let line = "gpu_node_autoscaler_nodes_replaced_total{pool=\"a10g\",cause=\"unhealthy\"}";
    env.wait_for(
        "both replacements to be counted",
        Duration::from_secs(30),
        || (env.metric("r1", line) == Some(2.0)).then_some(()),
    );
}

/// dcgm-exporter's exposition for the one A10G of a g5.xlarge running `pod`, its last XID `xid`.
fn dcgm_exposition(node: &str, pod: &str, xid: u32, message: &str) -> String {
    include_str!("testdata/dcgm-exporter.prom")
        .replace("{{NODE}}", node)
        .replace("{{POD}}", pod)
        .replace("{{XID_MSG}}", message)
        .replace("{{XID}}", &xid.to_string())
}

#[test]
fn a_gpu_that_fell_off_the_bus_as_dcgm_exporter_reports_through_prometheus_is_replaced() {
    let mut env = Env::start("xid", Options::default());
    // No GPU node yet: nothing to export.
    let exporter = prometheus::Exporter::start(String::new());
    let prom = prometheus::Prometheus::start(&env.dir, "dcgm-exporter", exporter.port);
    let policy =
        format!(
        "gpuMetrics: {{prometheusUrl: {}, selector: 'job=\"dcgm-exporter\"', interval: 1s}}\n{}",
        prom.url,
        env.policy(&["us-east-1a"], "  health:\n    xidErrors: {gracePeriod: 3s}\n")
    );
    env.create(&env.policy_configmap(&policy));
    env.start_controller("r1", &[]);
    let old = gpu_trainer(&env);
    let pod = env.get_json(&["get", "pods", "-n", "default", "-l", "app=trainer"])["items"][0]
        ["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let scraped = |xid: &str| {
        let q = format!("DCGM_FI_DEV_XID_ERRORS{{Hostname=\"{old}\",err_code=\"{xid}\"}}");
        prom.query(&q).contains(&format!("\"err_code\":\"{xid}\""))
    };
    // A healthy GPU (last XID 0) for a while: read, and nothing happens.
    exporter.set(dcgm_exposition(&old, &pod, 0, "No Error"));
    env.wait_for("Prometheus to scrape the healthy GPU", MIN, || {
        scraped("0").then_some(())
    });
    let reads = |env: &Env| {
        env.metric(
            "r1",
            "gpu_node_autoscaler_gpu_metrics_reads_total{result=\"ok\"}",
        )
        .unwrap_or(0.0)
    };
    let before = reads(&env);
    env.wait_for("three more reads of the XID series", MIN, || {
        (reads(&env) >= before + 3.0).then_some(())
    });
    assert!(env.events("ReplacingUnhealthyNode").is_empty());
    // XID 79: the GPU has fallen off the bus.
    exporter.set(dcgm_exposition(
        &old,
        &pod,
        79,
        "GPU has fallen off the bus",
    ));
    let ev = env.wait_for("a ReplacingUnhealthyNode Event", MIN, || {
        env.events("ReplacingUnhealthyNode").pop()
    });
    assert!(ev.starts_with(&format!("{old}: ")), "{ev}");
    assert!(ev.contains("GPU 0 reported XID 79"), "{ev}");
    assert!(scraped("79"));
    let new = trainer_moved_and_node_removed(&env, &old);
    assert_ne!(new, old);
    counted_replaced(&env, "unhealthy");
    assert_eq!(env.instances().len(), 2, "exactly one replacement launched");
    let errors = env.metric(
        "r1",
        "gpu_node_autoscaler_gpu_metrics_reads_total{result=\"error\"}",
    );
    assert_eq!(errors.unwrap_or(0.0), 0.0, "{}", prom.log());
}

#[test]
fn a_spot_interruption_notice_drains_the_node_at_once_and_its_trainer_moves() {
    let mut env = Env::start("interrupt", Options::default());
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a"], "")));
    env.start_controller("r1", &[]);
    let old = gpu_trainer(&env);
    let instance = instance_of(&env, &old);
    spot_interruption_notice(&env, &old);
    let ev = env.wait_for("a ReplacingInterruptedNode Event", MIN, || {
        env.events("ReplacingInterruptedNode").pop()
    });
    assert!(ev.starts_with(&format!("{old}: ")), "{ev}");
    drained_before_its_instance_went_and_replaced_once(&env, &old, &instance);
    counted_replaced(&env, "interrupted");
}

/// A GPU trainer that a voluntary drain leaves alone, three times over: a bare pod, annotated
/// safe-to-evict "false", with an emptyDir at /dev/shm (as NCCL wants); it asks for ten minutes
/// to checkpoint. Returns the node it runs on.
fn bare_trainer_with_dev_shm(env: &Env) -> String {
    env.create(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: trainer\n  namespace: default\n  \
         annotations:\n    cluster-autoscaler.kubernetes.io/safe-to-evict: \"false\"\n\
         spec:\n  terminationGracePeriodSeconds: 600\n  tolerations:\n  \
         - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n  containers:\n  \
         - name: main\n    image: cuda:12\n    resources:\n      \
         requests: {cpu: \"1\", memory: 2Gi, nvidia.com/gpu: \"1\"}\n      \
         limits: {nvidia.com/gpu: \"1\"}\n    volumeMounts:\n    - {name: shm, mountPath: /dev/shm}\n  \
         volumes:\n  - {name: shm, emptyDir: {medium: Memory}}\n",
    );
    env.wait_for("the trainer to run", 2 * MIN, || {
        let p = env.get_json(&["get", "pod", "-n", "default", "trainer"]);
        (p["status"]["phase"] == "Running")
            .then(|| p["spec"]["nodeName"].as_str().map(str::to_string))
            .flatten()
    })
}

/// The bare trainer of [`bare_trainer_with_dev_shm`] on `old` is evicted (the Eviction API) with
/// its ten minutes cut to `at_most` seconds, which an Event that names `why` says; `old` is never
/// given back (it stays tainted and cordoned) until it and its instance go.
fn trainer_evicted_with_its_grace_cut_and_node_removed(
    env: &Env,
    old: &str,
    at_most: u64,
    why: &str,
) {
    let instance = instance_of(env, old);
    let evicted = env.wait_for("the trainer to be evicted", 3 * MIN, || {
        let p = env.get_json(&["get", "pod", "-n", "default", "trainer"]);
        p["metadata"]["deletionTimestamp"].is_string().then_some(p)
    });
    let given = evicted["metadata"]["deletionGracePeriodSeconds"]
        .as_u64()
        .expect("a grace period");
    assert!(given <= at_most, "grace period {given}s: {evicted}");
    assert_trainer_evicted(env);
    let ev = env.wait_for("a GracePeriodCut Event", MIN, || {
        env.events("GracePeriodCut").pop()
    });
    assert!(ev.starts_with(&format!("{old}: default/trainer: ")), "{ev}");
    assert!(ev.contains(&format!("cut from 600s to {given}s")), "{ev}");
    assert!(ev.contains(why), "{ev}");
    env.wait_for("the node and its instance to go", 3 * MIN, || {
        let nodes = env.pool_nodes();
        if let Some(n) = nodes.iter().find(|n| n["metadata"]["name"] == old) {
            let taints = n["spec"]["taints"].as_array().cloned().unwrap_or_default();
            assert!(
                taints
                    .iter()
                    .any(|t| t["key"] == "gpu-node-autoscaler.io/to-be-deleted"),
                "given back: {n}"
            );
            assert_eq!(n["spec"]["unschedulable"], true, "uncordoned: {n}");
            return None;
        }
        let live = env.live_instances().iter().any(|(id, _)| *id == instance);
        (!live).then_some(())
    });
    assert_eq!(env.events("ScaleDownFailed"), Vec::<String>::new());
}

#[test]
fn interrupt_evicts_a_bare_trainer_with_dev_shm_cutting_its_grace_and_removes_the_node() {
    let mut env = Env::start("interrupt-shm", Options::default());
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a"], "")));
    env.start_controller("r1", &[]);
    let old = bare_trainer_with_dev_shm(&env);
    let instance = instance_of(&env, &old);
    assert!(
        env.instances()
            .iter()
            .any(|(id, v)| *id == instance && v.spot),
        "a spot instance"
    );
    // The instance goes in two minutes: the trainer gets what is left of them less the margin
    // for the instance's termination, not its own ten minutes.
    spot_interruption_notice(&env, &old);
    trainer_evicted_with_its_grace_cut_and_node_removed(
        &env,
        &old,
        105,
        "aws-node-termination-handler/spot-itn",
    );
}

#[test]
fn a_broken_nodes_drain_is_forced_as_an_interrupt_is_and_evicts_a_bare_trainer_with_dev_shm() {
    // A drain has two minutes: the trainer's ten are cut to end before then.
    let env = with_hardware_health("interrupt-health", &["--max-graceful-termination", "2m"]);
    let old = bare_trainer_with_dev_shm(&env);
    set_hardware_ready(&env, &old, "False");
    // Its replacement comes up first, then the broken node is drained.
    trainer_evicted_with_its_grace_cut_and_node_removed(
        &env,
        &old,
        105,
        "AcceleratedHardwareReady=False",
    );
    counted_replaced(&env, "unhealthy");
}

/// The AWS Node Termination Handler's taint on a spot interruption notice.
fn spot_interruption_notice(env: &Env, node: &str) {
    env.kubectl_ok(&[
        "taint",
        "node",
        node,
        "aws-node-termination-handler/spot-itn=notice:NoSchedule",
    ]);
}

/// The drain evicted the trainer (rather than its node vanishing under it).
fn assert_trainer_evicted(env: &Env) {
    let evicted = env.metric(
        "r1",
        "gpu_node_autoscaler_evictions_total{result=\"evicted\"}",
    );
    assert!(
        evicted.unwrap_or(0.0) >= 1.0,
        "the trainer was evicted by the drain"
    );
}

/// The EC2 instance id of a Node (from its providerID).
fn instance_of(env: &Env, node: &str) -> String {
    let provider_id = env.get_json(&["get", "node", node])["spec"]["providerID"]
        .as_str()
        .unwrap()
        .to_string();
    provider_id.rsplit('/').next().unwrap().to_string()
}

/// Waits until the trainer runs elsewhere and `old` is gone, checking at every look that `old`'s
/// instance is not terminated while the trainer still runs there (the drain evicted it first),
/// then that the drain evicted it, and that exactly one replacement was launched and stays the
/// only one over more passes (its capacity counted in flight: the pod is not planned twice).
fn drained_before_its_instance_went_and_replaced_once(env: &Env, old: &str, instance: &str) {
    env.wait_for(
        "the trainer to move, then the old node and its instance to go",
        4 * MIN,
        || {
            // The instance's state first: a trainer seen on the node after it means the
            // instance went while the trainer still ran there.
            let state = env
                .instances()
                .into_iter()
                .find(|(id, _)| id == instance)
                .map(|(_, v)| v.state)
                .unwrap_or_default();
            let gone = !(state == "pending" || state == "running");
            let v = env.get_json(&["get", "pods", "-n", "default", "-l", "app=trainer"]);
            let pods = v["items"].as_array().cloned().unwrap_or_default();
            let still_there: Vec<&str> = pods
                .iter()
                .filter(|p| p["spec"]["nodeName"] == old)
                .filter(|p| !p["metadata"]["deletionTimestamp"].is_string())
                .filter_map(|p| p["metadata"]["name"].as_str())
                .collect();
            assert!(
                !gone || still_there.is_empty(),
                "instance {instance} is {state} while {still_there:?} still run on {old}"
            );
            let moved = pods.iter().any(|p| {
                p["status"]["phase"] == "Running"
                    && !p["metadata"]["deletionTimestamp"].is_string()
                    && p["spec"]["nodeName"].as_str().is_some_and(|n| n != old)
            });
            let node_gone = !env
                .pool_nodes()
                .iter()
                .any(|n| n["metadata"]["name"] == old);
            (gone && moved && node_gone).then_some(())
        },
    );
    assert_trainer_evicted(env);
    assert_eq!(env.instances().len(), 2, "exactly one replacement launched");
    wait_passes(env, 3.0);
    assert_eq!(
        env.instances().len(),
        2,
        "no second replacement for the same pod"
    );
    assert_eq!(env.live_instances().len(), 1);
}

#[test]
fn a_spot_interruption_warning_from_the_sqs_queue_replaces_the_node_and_is_deleted() {
    let mut env = Env::start("sqs", Options::default());
    let (sqs, url) = env.sqs_queue("gna-interruptions");
    let policy = format!(
        "interruptionQueue: {url}\n{}",
        env.policy(&["us-east-1a"], "")
    );
    env.create(&env.policy_configmap(&policy));
    env.start_controller("r1", &[]);
    let old = gpu_trainer(&env);
    let instance = instance_of(&env, &old);
    // Sent now: a spot instance goes two minutes after its warning's time.
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let event = |detail_type: &str, detail: &str| {
        format!(
            r#"{{"version":"0","id":"7bf73129-1428-4cd3-a780-95db273d1602","detail-type":"{detail_type}","source":"aws.ec2","account":"123456789012","time":"{now}","region":"us-east-1","resources":["arn:aws:ec2:us-east-1a:instance/{instance}"],"detail":{detail}}}"#
        )
    };
    let send = |body: String| {
        env.rt.block_on(async {
            sqs.send_message()
                .queue_url(&url)
                .message_body(body)
                .send()
                .await
                .expect("SendMessage");
        })
    };
    // What else such a queue sees: a body that is no event, an instance starting.
    send("hello".to_string());
    send(event(
        "EC2 Instance State-change Notification",
        &format!(r#"{{"instance-id":"{instance}","state":"running"}}"#),
    ));
    send(event(
        "EC2 Spot Instance Interruption Warning",
        &format!(r#"{{"instance-id":"{instance}","instance-action":"terminate"}}"#),
    ));
    let ev = env.wait_for("a ReplacingInterruptedNode Event", MIN, || {
        env.events("ReplacingInterruptedNode").pop()
    });
    assert!(ev.starts_with(&format!("{old}: ")), "{ev}");
    assert!(ev.contains("spot interruption notice"), "{ev}");
    drained_before_its_instance_went_and_replaced_once(&env, &old, &instance);
    // Every message is gone from the queue, none left in flight.
    env.wait_for("the queue to be empty", MIN, || {
        let attrs = env.rt.block_on(async {
            sqs.get_queue_attributes()
                .queue_url(&url)
                .attribute_names(aws_sdk_sqs::types::QueueAttributeName::All)
                .send()
                .await
                .expect("GetQueueAttributes")
        });
        let a = attrs.attributes().cloned().unwrap_or_default();
        let n = |k| {
            a.get(&k)
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(u32::MAX)
        };
        (n(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages) == 0
            && n(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                == 0)
            .then_some(())
    });
    for (kind, n) in [
        ("spot_interruption", 1.0),
        ("irrelevant", 1.0),
        ("unreadable", 1.0),
    ] {
        assert_eq!(
            env.metric(
                "r1",
                &format!("gpu_node_autoscaler_interruption_messages_total{{kind=\"{kind}\"}}")
            ),
            Some(n),
            "{kind}"
        );
    }
    counted_replaced(&env, "interrupted");
}

#[test]
fn chaos_leader_killed_mid_drain_under_a_cloud_of_90s_calls_cuts_no_grace_and_overruns_nothing() {
    let mut env = Env::start(
        "chaos-drain",
        Options {
            proxy: true,
            ..Options::default()
        },
    );
    let policy = env
        .policy(&["us-east-1a"], "")
        .replace("maxNodes: 6", "maxNodes: 2");
    assert!(policy.contains("maxNodes: 2"), "{policy}");
    env.create(&env.policy_configmap(&policy));
    let flags = ["--max-graceful-termination", "10m"];
    env.start_controller("r1", &flags);
    env.start_controller("r2", &flags);
    let leader = env.wait_for("a leader", MIN, || lease_holder(&env));
    let other = if leader == "r1" { "r2" } else { "r1" }.to_string();
    // The leader drains an idle node, its service's eviction refused by a budget.
    let node = short_job_node(&env);
    web_with_a_budget(&env, &node);
    env.wait_for("the drain to start", 2 * MIN, || {
        env.events("ScaleDown")
            .into_iter()
            .find(|e| e.contains("draining"))
    });
    let instance = instance_of(&env, &node);
    // Every call to the cloud now takes 90 s; the leader is killed mid-drain.
    let proxy = env.proxy.as_ref().unwrap();
    for call in [
        "DescribeInstances",
        "CreateFleet",
        "TerminateInstances",
        "DescribeSpotPriceHistory",
    ] {
        proxy.hold_every(call, Duration::from_secs(90));
    }
    env.kill(&leader);
    let passes = |env: &Env| {
        env.metric(&other, "gpu_node_autoscaler_plan_duration_seconds_count")
            .unwrap_or(0.0)
    };
    let at_most_two = |env: &Env| {
        let live = env.live_instances().len();
        assert!(live <= 2, "{live} instances for maxNodes 2");
        let (code, body) = env
            .http_get(&other, "/healthz")
            .unwrap_or((0, String::new()));
        assert_eq!(
            code, 200,
            "/healthz of {other} under the slow cloud: {body}"
        );
    };
    // A GPU pod arrives meanwhile: one node may still come for it (maxNodes 2).
    env.create(&gpu_pod("default", "chaos-late", &no_labels(), None));
    let before = passes(&env);
    let slow = std::time::Instant::now();
    // Passes run under the slow cloud: the loop turns, stuck calls are reported, not restarts.
    while slow.elapsed() < Duration::from_secs(100) {
        at_most_two(&env);
        std::thread::sleep(Duration::from_secs(2));
    }
    assert!(
        passes(&env) >= before + 2.0,
        "{other} decided {} times in 100 s of 90 s calls",
        passes(&env) - before
    );
    env.wait_for("a CloudCallTimedOut Event", MIN, || {
        env.events("CloudCallTimedOut").pop()
    });
    assert_eq!(
        env.instances()
            .into_iter()
            .find(|(id, _)| *id == instance)
            .map(|(_, v)| v.state)
            .as_deref(),
        Some("running"),
        "the drained node's instance went while its service still ran there"
    );
    // The budget goes and the cloud answers again: the new leader finishes the drain.
    env.kubectl_ok(&["delete", "pdb", "web-tier"]);
    env.proxy.as_ref().unwrap().release();
    env.wait_for(
        "the drained node's instance to be terminated",
        3 * MIN,
        || {
            at_most_two(&env);
            (!env.live_instances().iter().any(|(id, _)| *id == instance)).then_some(())
        },
    );
    env.wait_for("chaos-late to run", 3 * MIN, || {
        at_most_two(&env);
        (env.pod_phase("default", "chaos-late") == "Running").then_some(())
    });
    // A voluntary drain gives every pod its own grace period, also across a failover.
    assert!(env.events("GracePeriodCut").is_empty());
    assert!(env.events("DrainCutShort").is_empty());
    assert!(env.log(&other).contains("resuming an interrupted drain"));
    let system = env.get_json(&["get", "pods", "-n", "default", "-l", "instance=web-system"]);
    assert_eq!(system["items"][0]["status"]["phase"], "Running", "{system}");
}

#[test]
fn chaos_leader_killed_mid_launch_api_cut_and_a_slow_cloud_leave_no_overrun() {
    // Nodes boot slower than a failover: the leader is killed with its launch in flight.
    let mut env = Env::start(
        "chaos",
        Options {
            proxy: true,
            kube_proxy: true,
            boot_delay: Some(Duration::from_secs(10)),
            ..Options::default()
        },
    );
    let policy = env
        .policy(&["us-east-1a"], "")
        .replace("maxNodes: 6", "maxNodes: 3");
    assert!(policy.contains("maxNodes: 3"), "{policy}");
    env.create(&env.policy_configmap(&policy));
    env.start_controller("r1", &[]);
    env.start_controller("r2", &[]);
    let leader = env.wait_for("a leader", MIN, || lease_holder(&env));
    let other = if leader == "r1" { "r2" } else { "r1" }.to_string();
    let passes = |env: &Env, who: &str| {
        env.metric(who, "gpu_node_autoscaler_plan_duration_seconds_count")
            .unwrap_or(0.0)
    };
    // Every check of the run: never more instances than the pool's maxNodes.
    let at_most_three = |env: &Env| {
        let live = env.live_instances().len();
        assert!(live <= 3, "{live} instances for maxNodes 3");
    };
    // A slow cloud: every launch and listing held.
    let proxy = env.proxy.as_ref().unwrap();
    proxy.hold_every("CreateFleet", Duration::from_secs(8));
    proxy.hold_every("DescribeInstances", Duration::from_secs(3));
    // Four one-GPU pods for a pool of at most three nodes.
    for i in 0..4 {
        env.create(&gpu_pod(
            "default",
            &format!("chaos-{i}"),
            &no_labels(),
            None,
        ));
    }
    // Killed while its launch is held by the cloud.
    env.wait_for("the leader's launch to reach the cloud", 2 * MIN, || {
        (env.proxy.as_ref().unwrap().held_calls_of("CreateFleet") >= 1).then_some(())
    });
    env.kill(&leader);
    let before = passes(&env, &other);
    env.wait_for(
        "the other replica to decide under the slow cloud",
        2 * MIN,
        || {
            at_most_three(&env);
            (passes(&env, &other) >= before + 1.0).then_some(())
        },
    );
    // The API server cut for 30 s: every request refused, every watch closed.
    let kube = env.kube_proxy.as_ref().unwrap();
    kube.fail_every(1, 503);
    kube.cut_watches_after(Some(Duration::from_secs(1)));
    kube.cut_watches();
    let cut = std::time::Instant::now();
    while cut.elapsed() < Duration::from_secs(30) {
        at_most_three(&env);
        std::thread::sleep(Duration::from_secs(1));
    }
    let kube = env.kube_proxy.as_ref().unwrap();
    kube.fail_every(0, 503);
    kube.cut_watches_after(None);
    // Passes ran in the fault window (the slow cloud still on): it cannot pass by doing nothing.
    env.wait_for(
        "a pass after the API came back, the cloud still slow",
        2 * MIN,
        || {
            at_most_three(&env);
            (passes(&env, &other) >= before + 2.0).then_some(())
        },
    );
    env.proxy.as_ref().unwrap().release();
    // Three pods run on the three nodes maxNodes allows; the fourth waits.
    env.wait_for("three pods to run", 3 * MIN, || {
        at_most_three(&env);
        ((0..4)
            .filter(|i| env.pod_phase("default", &format!("chaos-{i}")) == "Running")
            .count()
            == 3)
            .then_some(())
    });
    // No instance without a Node outlives maxNodeProvisionTime (2 min) and a pass: each live
    // instance has its Node.
    env.wait_for("every live instance to have its Node", 3 * MIN, || {
        at_most_three(&env);
        let nodes = env.get_json(&["get", "nodes"]);
        let provider_ids: Vec<String> = nodes["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n["spec"]["providerID"].as_str().map(str::to_string))
            .collect();
        env.live_instances()
            .iter()
            .all(|(id, _)| provider_ids.iter().any(|p| p.ends_with(&format!("/{id}"))))
            .then_some(())
    });
    assert_eq!(env.live_instances().len(), 3);
    // No pod was evicted or lost: all four are still there.
    for i in 0..4 {
        let phase = env.pod_phase("default", &format!("chaos-{i}"));
        assert!(
            phase == "Running" || phase == "Pending",
            "chaos-{i}: {phase}"
        );
    }
    assert!(env.events("Evicted").is_empty());
}
