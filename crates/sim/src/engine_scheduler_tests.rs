//! The simulated kube-scheduler: which feasible node a pod is bound to.

use super::dra_tests::{launch_where, run_until};
use super::*;
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
