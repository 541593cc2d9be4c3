//! The simulated kube-scheduler: which feasible node a pod is bound to.

use super::dra::{launch_where, run_until};
use crate::engine::*;
use crate::MINUTE;

/// One A10G pool of g5.xlarge (4 CPUs) and g5.12xlarge (48 CPUs) nodes, launched by the test;
/// one Job pod of one GPU arrives at 3 minutes.
fn input() -> SimInput {
    let text = "name: t\n\
         timing: {bootMin: 60s, bootMax: 60s, devicePluginDelay: 30s}\n\
         policy:\n\
         \x20 clusterName: sim\n\
         \x20 zones: [us-east-1a]\n\
         \x20 pools:\n\
         \x20   - {name: a10g, instanceTypes: [g5.xlarge, g5.12xlarge], capacityTypes: [on-demand], maxNodes: 4}\n\
         jobs:\n\
         \x20 - name: serve\n    arrival: 3m\n    duration: 30m\n    pods:\n\
         \x20     - name: w\n        requests: {cpu: \"2\", memory: 8Gi, nvidia.com/gpu: 1}\n";
    crate::test_input(text)
}

#[test]
fn a_pod_goes_to_the_node_with_the_most_cpu_and_memory_left_not_the_oldest() {
    // kube-scheduler's default scoring (LeastAllocated, BalancedAllocation on CPU and memory):
    // the one-GPU pod takes the g5.12xlarge although the g5.xlarge is older and fits it.
    let input = input();
    let mut w = World::new(&input);
    launch_where(&mut w, "a10g", |k| k.instance_type == "g5.xlarge");
    launch_where(&mut w, "a10g", |k| k.instance_type == "g5.12xlarge");
    run_until(&mut w, 4 * MINUTE);
    let ni = w.pods[0].node.expect("the pod runs");
    assert_eq!(w.nodes[ni].offering.instance_type, "g5.12xlarge");
    assert_eq!(w.nodes[0].offering.instance_type, "g5.xlarge");
}

#[test]
fn the_scheduler_scores_every_node_of_a_small_cluster_and_a_share_of_a_large_one() {
    // numFeasibleNodesToFind with the default percentageOfNodesToScore.
    assert_eq!(feasible_nodes_to_find(0), 1);
    assert_eq!(feasible_nodes_to_find(60), 60);
    assert_eq!(feasible_nodes_to_find(150), 100);
    assert_eq!(feasible_nodes_to_find(1_000), 420);
    assert_eq!(feasible_nodes_to_find(5_000), 500);
    assert_eq!(feasible_nodes_to_find(10_000), 500);
}

/// The one-GPU pod and a four-GPU pod arrive at 3 minutes; a g5.xlarge and a g5.12xlarge are
/// launched then, and have registered (GPUs not advertised yet) a minute later. Returns the
/// world and the g5.12xlarge's name.
fn two_pods_before_their_nodes() -> (World, String) {
    let mut input = input();
    let mut big = input.pods[0].clone();
    big.pod.id.name = "big".into();
    big.pod.uid = "big".into();
    big.pod.requests.gpu = 4;
    input.pods.push(big);
    let mut w = World::new(&input);
    run_until(&mut w, 3 * MINUTE + 1);
    launch_where(&mut w, "a10g", |k| k.instance_type == "g5.xlarge");
    launch_where(&mut w, "a10g", |k| k.instance_type == "g5.12xlarge");
    run_until(&mut w, 4 * MINUTE + 10_000);
    let wide = w
        .live_nodes()
        .find(|n| n.offering.instance_type == "g5.12xlarge")
        .expect("registered")
        .node
        .name
        .clone();
    (w, wide)
}

#[test]
fn a_node_nominated_for_a_pod_keeps_its_room_from_a_smaller_pod_that_would_score_it_best() {
    let on = |w: &World, pod: usize| w.nodes[w.pods[pod].node.expect("bound")].offering.clone();
    // Without a nomination the one-GPU pod takes the g5.12xlarge (the most room left), and the
    // four-GPU pod finds no node.
    let (mut w, _) = two_pods_before_their_nodes();
    run_until(&mut w, 6 * MINUTE);
    assert_eq!(on(&w, 0).instance_type, "g5.12xlarge");
    assert!(w.pods[1].node.is_none());
    // Nominated there, the four-GPU pod gets it, and the one-GPU pod the g5.xlarge.
    let (mut w, wide) = two_pods_before_their_nodes();
    w.nominate("big", &wide);
    assert_eq!(w.pods[1].pod.nominated_node.as_deref(), Some(wide.as_str()));
    run_until(&mut w, 6 * MINUTE);
    assert_eq!(on(&w, 1).instance_type, "g5.12xlarge");
    assert_eq!(on(&w, 0).instance_type, "g5.xlarge");
    assert_eq!(w.pods[1].pod.nominated_node, None, "dropped once bound");
}
