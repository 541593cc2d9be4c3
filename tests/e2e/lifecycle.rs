//! Node lifecycle on the real control plane: a pool's launch template changes and its nodes
//! are replaced, the new node first, within the pool's disruption budget.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

use crate::support::{Env, Options};
use crate::{create_trainers, MIN};

/// The test pool, three trainers' worth, drift limited to one node at a time, its launch
/// template at `version`.
fn rolling_policy(env: &Env, version: &str) -> String {
    let p = env.policy(
        &["us-east-1a"],
        "  disruption:\n    budgets:\n    - {nodes: 1, reasons: [Drifted]}\n",
    );
    let lt = "launchTemplate: {name: gpu-nodes}";
    assert!(p.contains(lt), "{p}");
    p.replace(
        lt,
        &format!("launchTemplate: {{name: gpu-nodes, version: \"{version}\"}}"),
    )
}

fn has_taint(n: &Value, key: &str, value: &str) -> bool {
    n["spec"]["taints"].as_array().is_some_and(|ts| {
        ts.iter()
            .any(|t| t["key"] == key && t["value"].as_str().unwrap_or("") == value)
    })
}

/// A node not being deleted.
fn staying(n: &Value) -> bool {
    n["metadata"]["deletionTimestamp"].is_null()
}

/// Trainer pods (name → node, "" while pending) that are not terminating.
fn trainers(env: &Env) -> Vec<(String, String, String)> {
    let v = env.get_json(&["get", "pods", "-n", "default", "-l", "app=trainer"]);
    v["items"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .map(|p| {
                    (
                        p["metadata"]["name"].as_str().unwrap_or("").to_string(),
                        p["spec"]["nodeName"].as_str().unwrap_or("").to_string(),
                        p["status"]["phase"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_launch_template_version_change_drifts_every_node_replaced_one_at_a_time_within_a_budget_of_one(
) {
    let mut env = Env::start("drift-roll", Options::default());
    env.create(&env.policy_configmap(&rolling_policy(&env, "1")));
    env.start_controller("r1", &["--resync", "10s"]);
    create_trainers(&env, 3);
    let old: BTreeSet<String> =
        env.wait_for("three trainers to run on three nodes", 4 * MIN, || {
            let t = trainers(&env);
            let nodes: BTreeSet<String> = t
                .iter()
                .filter(|(_, _, phase)| phase == "Running")
                .map(|(_, n, _)| n.clone())
                .collect();
            (nodes.len() == 3).then_some(nodes)
        });
    // Each records what its launch used.
    env.wait_for(
        "the nodes to be registered with their launch fingerprint",
        MIN,
        || {
            let nodes = env.pool_nodes();
            (nodes.len() == 3
                && nodes.iter().all(|n| {
                    n["metadata"]["annotations"]["gpu-node-autoscaler.io/launch-fingerprint"]
                        .as_str()
                        .is_some_and(|f| f.contains("provider="))
                }))
            .then_some(())
        },
    );
    let mut pods_seen: BTreeSet<String> = trainers(&env).into_iter().map(|p| p.0).collect();
    assert_eq!(pods_seen.len(), 3);

    // A new launch template version (the new GPU AMI).
    env.apply(&env.policy_configmap(&rolling_policy(&env, "$Latest")));
    let mut most_at_once = 0;
    env.wait_for("every drifted node to be replaced", 10 * MIN, || {
        let nodes = env.pool_nodes();
        let replacing = nodes
            .iter()
            .filter(|n| has_taint(n, "gpu-node-autoscaler.io/replacing", "drifted"))
            .count();
        most_at_once = most_at_once.max(replacing);
        assert!(replacing <= 1, "the budget allows one at a time: {nodes:?}");
        // Never fewer nodes up than the pods need: the new one is Ready before the old goes.
        let up = nodes.iter().filter(|n| staying(n)).count();
        assert!(up >= 3, "{up} nodes for 3 trainers: {nodes:?}");
        let t = trainers(&env);
        assert!(t.len() <= 3, "{t:?}");
        pods_seen.extend(t.iter().map(|p| p.0.clone()));
        let left: Vec<&String> = old
            .iter()
            .filter(|o| nodes.iter().any(|n| n["metadata"]["name"] == o.as_str()))
            .collect();
        let running_new = t
            .iter()
            .filter(|(_, n, phase)| phase == "Running" && !old.contains(n))
            .count();
        (left.is_empty() && running_new == 3).then_some(())
    });
    assert_eq!(most_at_once, 1, "a node was seen being replaced");
    // Each trainer moved once (its ReplicaSet re-created it once), none lost.
    assert_eq!(pods_seen.len(), 6, "{pods_seen:?}");
    let events = env.events("ReplacingDriftedNode");
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(
        events.iter().all(|e| e.contains("its provider settings")),
        "{events:?}"
    );
    let line = "gpu_node_autoscaler_nodes_replaced_total{pool=\"a10g\",cause=\"drifted\"}";
    env.wait_for(
        "the replacements to be counted",
        Duration::from_secs(60),
        || (env.metric("r1", line) == Some(3.0)).then_some(()),
    );
    // The new nodes are what the pool launches now: nothing drifted is left.
    std::thread::sleep(Duration::from_secs(15));
    assert!(env.events("ReplacingDriftedNode").len() == 3);
    assert_eq!(
        env.metric("r1", "gpu_node_autoscaler_nodes_drifted"),
        Some(0.0)
    );
}

#[test]
fn a_node_older_than_expire_after_is_replaced_its_pod_moved_first() {
    let mut env = Env::start("expire", Options::default());
    env.create(&env.policy_configmap(&env.policy(&["us-east-1a"], "")));
    env.start_controller("r1", &["--resync", "10s"]);
    let old = crate::gpu_trainer(&env);
    env.wait_for("the node to be registered", MIN, || {
        (env.pool_nodes().len() == 1).then_some(())
    });
    // Nodes live two minutes from now on: the one there goes, its trainer moved first.
    env.apply(
        &env.policy_configmap(&env.policy(&["us-east-1a"], "  disruption: {expireAfter: 2m}\n")),
    );
    let new = crate::trainer_moved_and_node_removed(&env, &old);
    assert_ne!(new, old);
    crate::counted_replaced(&env, "expired");
    let events = env.events("ReplacingExpiredNode");
    assert!(
        events
            .iter()
            .any(|e| e.contains(&format!("replacing {old} (pool a10g)"))
                && e.contains("older than the pool's expireAfter (2m)")),
        "{events:?}"
    );
}

/// The pool's launch template moved from version 1 to `$Latest` (a new GPU AMI), with `extra`
/// in the pool's `disruption:` section.
fn drifting_policy(env: &Env, version: &str, disruption: &str) -> String {
    let p = env.policy(&["us-east-1a"], disruption);
    let lt = "launchTemplate: {name: gpu-nodes}";
    assert!(p.contains(lt), "{p}");
    p.replace(
        lt,
        &format!("launchTemplate: {{name: gpu-nodes, version: \"{version}\"}}"),
    )
}

/// Seconds since the Unix epoch, as the controller's clock reads it.
fn epoch_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// What the status ConfigMap says of `node` among the drifted nodes.
fn drifted_status(env: &Env, node: &str) -> Option<String> {
    env.status_json()["driftedNodes"][node]
        .as_str()
        .map(str::to_string)
}

/// One trainer running on a node registered with its launch fingerprint; returns the node.
fn trainer_on_a_fingerprinted_node(env: &Env) -> String {
    let old = crate::gpu_trainer(env);
    env.wait_for(
        "the node to be registered with its launch fingerprint",
        MIN,
        || {
            env.pool_nodes()
                .iter()
                .any(|n| {
                    n["metadata"]["name"] == old.as_str()
                        && n["metadata"]["annotations"]["gpu-node-autoscaler.io/launch-fingerprint"]
                            .is_string()
                })
                .then_some(())
        },
    );
    old
}

#[test]
fn a_budget_of_zero_in_a_maintenance_window_holds_drift_replacement_until_the_window_ends() {
    let mut env = Env::start("drift-window", Options::default());
    env.create(&env.policy_configmap(&drifting_policy(&env, "1", "")));
    env.start_controller("r1", &["--resync", "10s"]);
    let old = trainer_on_a_fingerprinted_node(&env);

    // A window (UTC, as cron reads it) that opened this minute and stays open four more
    // minutes, freezing drift in it; the launch template changes inside it.
    let now = epoch_secs();
    let window_end = (now / 60) * 60 + 5 * 60;
    let (minute, hour) = ((now / 60) % 60, (now / 3600) % 24);
    let budget = format!(
        "  disruption:\n    budgets:\n    - {{nodes: 0, reasons: [Drifted], schedule: \"{minute} \
         {hour} * * *\", duration: 5m}}\n"
    );
    env.apply(&env.policy_configmap(&drifting_policy(&env, "$Latest", &budget)));

    // Found drifted, and kept by the budget.
    let kept = env.wait_for("the node to be reported drifted and kept", 3 * MIN, || {
        drifted_status(&env, &old).filter(|s| s.contains("kept:"))
    });
    assert!(
        kept.contains("its provider settings")
            && kept.contains("the pool's disruption budget for Drifted allows no more nodes now"),
        "{kept}"
    );
    assert!(
        epoch_secs() < window_end,
        "the window ended before the hold was seen; the machine is too slow for this test"
    );
    // Nothing replaced while the window is open: the old node keeps its trainer, untainted.
    while epoch_secs() < window_end - 5 {
        let nodes = env.pool_nodes();
        assert_eq!(nodes.len(), 1, "nothing launched in the window: {nodes:?}");
        assert!(
            !has_taint(&nodes[0], "gpu-node-autoscaler.io/replacing", "drifted"),
            "replaced in the window: {nodes:?}"
        );
        assert!(env.events("ReplacingDriftedNode").is_empty());
        assert_eq!(crate::trainer_node(&env).as_deref(), Some(old.as_str()));
        std::thread::sleep(Duration::from_secs(2));
    }

    // Once it ends the node is replaced, the new one first.
    let new = crate::trainer_moved_and_node_removed(&env, &old);
    assert_ne!(new, old);
    let events = env.events("ReplacingDriftedNode");
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].starts_with(&format!("{old}: ")), "{events:?}");
    crate::counted_replaced(&env, "drifted");
    env.wait_for("nothing drifted to be left", MIN, || {
        (env.metric("r1", "gpu_node_autoscaler_nodes_drifted") == Some(0.0)).then_some(())
    });
}

#[test]
fn do_not_disrupt_holds_a_drifted_node_until_the_termination_grace_period_then_it_is_replaced() {
    let mut env = Env::start("drift-dnd", Options::default());
    let grace = "  disruption: {terminationGracePeriod: 90s}\n";
    env.create(&env.policy_configmap(&drifting_policy(&env, "1", grace)));
    env.start_controller("r1", &["--resync", "10s"]);
    // A trainer that asks not to be disrupted (as Karpenter spells it).
    env.create(
        "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata:\n  name: trainer\n  namespace: default\n\
         spec:\n  replicas: 1\n  selector:\n    matchLabels: {app: trainer}\n  template:\n    \
         metadata:\n      labels: {app: trainer}\n      \
         annotations: {karpenter.sh/do-not-disrupt: \"true\"}\n    spec:\n      \
         tolerations:\n      - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n      \
         containers:\n      - name: main\n        image: cuda:12\n        resources:\n          \
         requests: {cpu: \"1\", memory: 2Gi, nvidia.com/gpu: \"1\"}\n          \
         limits: {nvidia.com/gpu: \"1\"}\n",
    );
    let old = env.wait_for("the trainer to run", 2 * MIN, || crate::trainer_node(&env));
    env.wait_for("the node's launch fingerprint", MIN, || {
        env.pool_nodes()
            .iter()
            .any(|n| {
                n["metadata"]["annotations"]["gpu-node-autoscaler.io/launch-fingerprint"]
                    .is_string()
            })
            .then_some(())
    });

    env.apply(&env.policy_configmap(&drifting_policy(&env, "$Latest", grace)));
    // Held by the pod, with the Event saying until when.
    let blocked = env.wait_for("the replacement to be blocked", 3 * MIN, || {
        env.events("DisruptionBlocked")
            .into_iter()
            .find(|e| e.starts_with(&format!("{old}: ")))
    });
    assert!(
        blocked.contains("karpenter.sh/do-not-disrupt")
            && blocked.contains("the pool's terminationGracePeriod"),
        "{blocked}"
    );
    let kept = drifted_status(&env, &old).unwrap_or_default();
    assert!(
        kept.contains("kept:") || env.events("DisruptionGracePeriodOver").len() == 1,
        "{kept}"
    );
    // Until the grace period is over nothing is replaced; then it is, drain forced.
    let over = env.wait_for("the grace period to run out", 4 * MIN, || {
        let replacing = !env.events("ReplacingDriftedNode").is_empty();
        let over = env.events("DisruptionGracePeriodOver");
        if over.is_empty() {
            // Both are raised by one pass: the replacement is never seen without the other
            // (read a little later, the order in which they are written being the recorder's).
            if replacing {
                std::thread::sleep(Duration::from_secs(10));
                assert!(
                    !env.events("DisruptionGracePeriodOver").is_empty(),
                    "replaced before the grace period was over"
                );
            } else {
                assert_eq!(crate::trainer_node(&env).as_deref(), Some(old.as_str()));
            }
        }
        over.into_iter().next()
    });
    assert!(
        over.starts_with(&format!("{old}: ")) && over.contains("terminationGracePeriod"),
        "{over}"
    );
    let new = crate::trainer_moved_and_node_removed(&env, &old);
    assert_ne!(new, old);
    let replacing = env.events("ReplacingDriftedNode");
    assert_eq!(replacing.len(), 1, "{replacing:?}");
    crate::counted_replaced(&env, "drifted");
}

/// The instance type a node was launched as.
fn instance_type(n: &Value) -> String {
    n["metadata"]["labels"]["node.kubernetes.io/instance-type"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_budget_of_zero_in_a_maintenance_window_holds_consolidation_until_the_window_ends() {
    let mut env = Env::start("consolidation-window", Options::default());
    // On-demand only: its catalog prices (moto's spot price history is one fixed price).
    let types = |p: String| {
        p.replace("[g5.xlarge]", "[g5.xlarge, g5.12xlarge]")
            .replace("[spot, on-demand]", "[on-demand]")
    };
    env.create(&env.policy_configmap(&types(env.policy(&["us-east-1a"], ""))));
    env.start_controller("r1", &["--resync", "10s"]);

    // A 3-GPU pod gets a g5.12xlarge (4 GPUs), and the trainer (1 GPU) the GPU left on it.
    env.create(
        &crate::support::gpu_pod("default", "companion", &crate::no_labels(), None)
            .replace("nvidia.com/gpu: \"1\"", "nvidia.com/gpu: \"3\""),
    );
    env.wait_for("the companion to run", 2 * MIN, || {
        (env.pod_phase("default", "companion") == "Running").then_some(())
    });
    let old = crate::gpu_trainer(&env);
    let companion = env.get_json(&["get", "pod", "companion", "-n", "default"]);
    assert_eq!(
        companion["spec"]["nodeName"],
        old.as_str(),
        "one node for both"
    );
    // Registered in the pool (the pods may land before registration labels their node).
    let nodes = env.wait_for("the node in the pool", MIN, || {
        Some(env.pool_nodes()).filter(|n| !n.is_empty())
    });
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(instance_type(&nodes[0]), "g5.12xlarge");

    // Consolidation on, quick to act, and a window (UTC, as cron reads it) that opened this
    // minute and stays open two more minutes, in which Underutilized may take no node.
    let now = epoch_secs();
    let window_end = (now / 60) * 60 + 3 * 60;
    let (minute, hour) = ((now / 60) % 60, (now / 3600) % 24);
    let extra = format!(
        "  consolidation: {{enabled: true, interval: 5s, consolidateAfter: 5s, restartCost: 1s}}\n\
         \x20 disruption:\n    budgets:\n    - {{nodes: 0, reasons: [Underutilized], schedule: \
         \"{minute} {hour} * * *\", duration: 3m}}\n"
    );
    env.apply(&env.policy_configmap(&types(env.policy(&["us-east-1a"], &extra))));
    // The companion ends: its trainer alone keeps a 4-GPU node, which a g5.xlarge would do.
    env.kubectl_ok(&[
        "delete",
        "pod",
        "companion",
        "-n",
        "default",
        "--wait=false",
    ]);

    // Planned, and held by the budget.
    env.wait_for(
        "the consolidation to be held by the budget",
        3 * MIN,
        || {
            env.log("r1")
                .lines()
                .find(|l| {
                    l.contains("pool a10g: not consolidating:")
                        && l.contains(&old)
                        && l.contains(
                            "the pool's disruption budget for Underutilized allows 0 more node(s) now",
                        )
                })
                .map(str::to_string)
        },
    );
    assert!(
        epoch_secs() < window_end,
        "the window ended before the hold was seen; the machine is too slow for this test"
    );
    // Nothing consolidated while the window is open: the old node keeps its trainer, untainted.
    while epoch_secs() < window_end - 5 {
        let nodes = env.pool_nodes();
        assert_eq!(nodes.len(), 1, "nothing launched in the window: {nodes:?}");
        assert!(
            !has_taint(
                &nodes[0],
                "gpu-node-autoscaler.io/replacing",
                "consolidating"
            ),
            "consolidated in the window: {nodes:?}"
        );
        assert!(env.events("Consolidating").is_empty());
        assert_eq!(crate::trainer_node(&env).as_deref(), Some(old.as_str()));
        std::thread::sleep(Duration::from_secs(2));
    }

    // Once it ends the trainer moves to a g5.xlarge and the g5.12xlarge goes.
    let new = crate::trainer_moved_and_node_removed(&env, &old);
    let events = env.events("Consolidating");
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        events[0].starts_with(&format!("{old}: replacing {old} (pool a10g)")),
        "{events:?}"
    );
    let nodes = env.pool_nodes();
    assert!(
        nodes
            .iter()
            .any(|n| n["metadata"]["name"] == new.as_str() && instance_type(n) == "g5.xlarge"),
        "{nodes:?}"
    );
    crate::counted_replaced(&env, "consolidating");
}
