//! Reserved capacity on the real control plane, through the kwok provider's reservations (a
//! pool's `kwok.reservations`, the stand-in for a cloud account's): a Capacity Block is filled
//! before anything is bought, and its pods are moved off before it ends.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::kwok::kwok_env;
use crate::{create_trainers, MIN};

const BLOCK: &str = "cr-0block00000000001";

/// A pool of one-GPU nodes that takes a Capacity Block of 2 in us-east-1a first, then on-demand;
/// the block runs from a minute ago until `end_ms`.
fn policy(end_ms: i64) -> String {
    let start_ms = now_ms() - 60_000;
    format!(
        "clusterName: e2e\nzones: [us-east-1a, us-east-1b]\n\
batching: {{idle: 1s, max: 3s}}\nmaxNodeProvisionTime: 2m\n\
pools:\n- name: h100-reserved\n  provider: kwok\n  instanceTypes: [g5.xlarge]\n\
\x20 capacityTypes: [reserved, on-demand]\n\
\x20 capacityReservations: [{{id: {BLOCK}}}]\n  maxNodes: 6\n\
\x20 taints:\n  - {{key: nvidia.com/gpu, value: \"true\", effect: NoSchedule}}\n\
\x20 scaleDown: {{cooldownAfterScaleUp: 5m, unneededTime: 5m}}\n\
\x20 kwok:\n    reservations:\n    - {{id: {BLOCK}, kind: capacity-block, instanceType: g5.xlarge, \
zone: us-east-1a, total: 2, startMs: {start_ms}, endMs: {end_ms}}}\n"
    )
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Running, not terminating trainers: (pod, node).
fn running_trainers(env: &crate::support::Env) -> Vec<(String, String)> {
    let v = env.get_json(&["get", "pods", "-n", "default", "-l", "app=trainer"]);
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            p["metadata"]["deletionTimestamp"].is_null() && p["status"]["phase"] == "Running"
        })
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap_or("").to_string(),
                p["spec"]["nodeName"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn label<'a>(n: &'a Value, k: &str) -> &'a str {
    n["metadata"]["labels"][k].as_str().unwrap_or("")
}

#[test]
fn a_capacity_block_is_filled_first_and_its_pods_are_moved_before_it_ends_none_lost() {
    let mut env = kwok_env("capacity-block");
    // The block lasts two more hours: well past the default 30-minute drain lead.
    env.create(&env.policy_configmap(&policy(now_ms() + 2 * 3_600_000)));
    env.start_controller("r1", &["--resync", "10s"]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });
    create_trainers(&env, 3);

    // The block's two nodes are taken first, the third trainer's node is bought on-demand: never
    // more nodes in the block than it holds.
    let nodes = env.wait_for(
        "three trainers on three registered nodes, two in the block",
        3 * MIN,
        || {
            let t = running_trainers(&env);
            let nodes = env.pool_nodes();
            let registered = nodes
                .iter()
                .filter(|n| !label(n, "gpu-node-autoscaler.io/capacity-type").is_empty())
                .count();
            (t.len() == 3 && registered == nodes.len() && nodes.len() == 3).then_some(nodes)
        },
    );
    let in_block: BTreeSet<String> = nodes
        .iter()
        .filter(|n| label(n, "gpu-node-autoscaler.io/capacity-type") == "reserved")
        .map(|n| n["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(in_block.len(), 2, "the block's two nodes first: {nodes:?}");
    for n in &nodes {
        let name = n["metadata"]["name"].as_str().unwrap();
        if in_block.contains(name) {
            assert_eq!(label(n, "karpenter.sh/capacity-type"), "reserved", "{n}");
            assert_eq!(
                label(n, "gpu-node-autoscaler.io/capacity-reservation-id"),
                BLOCK,
                "{n}"
            );
            assert_eq!(
                label(n, "karpenter.k8s.aws/capacity-reservation-id"),
                BLOCK,
                "{n}"
            );
            assert_eq!(label(n, "topology.kubernetes.io/zone"), "us-east-1a", "{n}");
        } else {
            assert_eq!(
                label(n, "gpu-node-autoscaler.io/capacity-type"),
                "on-demand",
                "{n}"
            );
        }
    }
    let on_block = running_trainers(&env)
        .iter()
        .filter(|(_, n)| in_block.contains(n))
        .count();
    assert_eq!(on_block, 2, "two trainers run in the block");
    assert!(env.events("CapacityBlockEnding").is_empty());

    // Time moves on: the block now ends in four minutes, inside its 30-minute drain lead. Its
    // nodes are replaced and drained at once, with the block's end as the deadline.
    let end_ms = now_ms() + 4 * 60_000;
    env.apply(&env.policy_configmap(&policy(end_ms)));
    let ending = env.wait_for("both block nodes to be reported ending", 2 * MIN, || {
        let e = env.events("CapacityBlockEnding");
        (e.iter()
            .filter(|l| in_block.iter().any(|n| l.starts_with(n.as_str())))
            .count()
            == 2)
            .then_some(e)
    });
    assert!(ending.iter().all(|l| l.contains(BLOCK)), "{ending:?}");
    // Before the end every trainer runs outside the block, and the block's nodes are gone.
    let moved = env.wait_for(
        "every trainer to run outside the block and its nodes to go",
        4 * MIN,
        || {
            let t = running_trainers(&env);
            let left: Vec<_> = env
                .pool_nodes()
                .iter()
                .filter(|n| in_block.contains(n["metadata"]["name"].as_str().unwrap_or("")))
                .map(|n| n["metadata"]["name"].clone())
                .collect();
            (t.len() == 3 && t.iter().all(|(_, n)| !in_block.contains(n)) && left.is_empty())
                .then_some((t, now_ms()))
        },
    );
    assert!(
        moved.1 < end_ms,
        "the trainers were moved {} s after the block's end: {:?}",
        (moved.1 - end_ms) / 1000,
        moved.0
    );
    // Nothing was cut short at the deadline: every pod left the block by eviction.
    assert!(
        env.events("DrainCutShort").is_empty(),
        "{:?}",
        env.events("DrainCutShort")
    );
    let hours = env
        .metric(
            "r1",
            "gpu_node_autoscaler_capacity_block_pod_hours_moved_total{pool=\"h100-reserved\"}",
        )
        .unwrap_or(0.0);
    assert!(hours > 0.0, "pod-hours moved off the block: {hours}");
    // Nothing is launched into the block again while it ends.
    std::thread::sleep(Duration::from_secs(15));
    let reserved_now: Vec<_> = env
        .pool_nodes()
        .into_iter()
        .filter(|n| label(n, "gpu-node-autoscaler.io/capacity-type") == "reserved")
        .collect();
    assert!(reserved_now.is_empty(), "{reserved_now:?}");
    assert_eq!(running_trainers(&env).len(), 3);
}

/// A pool that selects only `cr-0selected00000001` (an ODCR of 1 g5.xlarge in us-east-1a), while
/// the account (the pool's `kwok.reservations`) also holds `cr-0foreign000000001`, another team's
/// ODCR of the same type and zone, listed first.
const SELECTED: &str = "cr-0selected00000001";
const FOREIGN: &str = "cr-0foreign000000001";

fn two_reservations_policy() -> String {
    format!(
        "clusterName: e2e\nzones: [us-east-1a]\n\
batching: {{idle: 1s, max: 3s}}\nmaxNodeProvisionTime: 2m\n\
pools:\n- name: h100-reserved\n  provider: kwok\n  instanceTypes: [g5.xlarge]\n\
\x20 capacityTypes: [reserved, on-demand]\n\
\x20 capacityReservations: [{{id: {SELECTED}}}]\n  maxNodes: 4\n\
\x20 taints:\n  - {{key: nvidia.com/gpu, value: \"true\", effect: NoSchedule}}\n\
\x20 scaleDown: {{cooldownAfterScaleUp: 5m, unneededTime: 5m}}\n\
\x20 kwok:\n    reservations:\n\
\x20   - {{id: {FOREIGN}, kind: default, instanceType: g5.xlarge, zone: us-east-1a, total: 2}}\n\
\x20   - {{id: {SELECTED}, kind: default, instanceType: g5.xlarge, zone: us-east-1a, total: 1}}\n"
    )
}

#[test]
fn a_reserved_launch_goes_into_the_reservation_its_pool_selects_never_another_of_the_same_type() {
    let mut env = kwok_env("reservation-selected");
    env.create(&env.policy_configmap(&two_reservations_policy()));
    env.start_controller("r1", &["--resync", "10s"]);
    env.wait_for("the controller to become ready", MIN, || {
        env.http_get("r1", "/readyz").filter(|(c, _)| *c == 200)
    });
    create_trainers(&env, 2);
    // One node in the selected reservation (its count), the other on-demand: none in the
    // other team's reservation, though it has room for both.
    let nodes = env.wait_for("two trainers on two registered nodes", 3 * MIN, || {
        let nodes = env.pool_nodes();
        let registered = nodes
            .iter()
            .filter(|n| !label(n, "gpu-node-autoscaler.io/capacity-type").is_empty())
            .count();
        (running_trainers(&env).len() == 2 && registered == 2 && nodes.len() == 2).then_some(nodes)
    });
    let mut got: Vec<(&str, &str)> = nodes
        .iter()
        .map(|n| {
            (
                label(n, "gpu-node-autoscaler.io/capacity-type"),
                label(n, "gpu-node-autoscaler.io/capacity-reservation-id"),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [("on-demand", ""), ("reserved", SELECTED)],
        "{nodes:?}"
    );
    for n in &nodes {
        assert_ne!(
            label(n, "karpenter.k8s.aws/capacity-reservation-id"),
            FOREIGN,
            "{n}"
        );
    }
}
