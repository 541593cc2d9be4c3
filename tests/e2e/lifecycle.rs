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
