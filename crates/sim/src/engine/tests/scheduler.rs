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

/// Two g5.12xlarge nodes (4 GPUs each) in zones a and b, launched at 0 s, and three one-GPU
/// pods arriving at 3 minutes with `rules` (YAML lines of a pod group, indented 8 spaces).
fn three_pods_on_two_big_nodes(rules: &str) -> World {
    let input = crate::test_a10g_input(
        "us-east-1a, us-east-1b",
        "instanceTypes: [g5.12xlarge], capacityTypes: [on-demand], maxNodes: 4",
        &format!(
            "  - name: serve\n    kind: Deployment\n    arrival: 3m\n    duration: 30m\n    pods:\n\
             \x20     - name: w\n        replicas: 3\n        labels: {{app: serve}}\n\
             \x20       requests: {{cpu: \"2\", memory: 8Gi, nvidia.com/gpu: 1}}\n{rules}"
        ),
    );
    let mut w = World::new(&input);
    launch_where(&mut w, "a10g", |k| k.zone == "us-east-1a");
    launch_where(&mut w, "a10g", |k| k.zone == "us-east-1b");
    run_until(&mut w, 4 * MINUTE);
    w
}

/// Pods bound per node name.
fn bound_per_node(w: &World) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for p in &w.pods {
        if let Some(n) = p.node {
            *out.entry(w.nodes[n].node.name.clone()).or_default() += 1;
        }
    }
    out
}

#[test]
fn the_scheduler_binds_no_two_pods_with_one_host_port_to_a_node() {
    // Without rules the three pods share the nodes as scoring puts them.
    let w = three_pods_on_two_big_nodes("");
    assert_eq!(bound_per_node(&w).values().sum::<usize>(), 3);
    let w = three_pods_on_two_big_nodes("        ports: [{containerPort: 9400, hostPort: 9400}]\n");
    let per_node = bound_per_node(&w);
    assert_eq!(per_node.values().copied().collect::<Vec<_>>(), vec![1, 1]);
    let waiting: Vec<&PodState> = w.pods.iter().filter(|p| p.node.is_none()).collect();
    assert_eq!(waiting.len(), 1);
    assert!(waiting[0].pod.unschedulable);
}

#[test]
fn the_scheduler_keeps_zone_spread_and_anti_affinity() {
    // Spread over the two zones with maxSkew 1: a third pod makes 2/1, allowed; anti-affinity
    // per node then leaves it nowhere.
    let spread = "        topologySpreadConstraints:\n\
         \x20         - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: serve}}}\n";
    let w = three_pods_on_two_big_nodes(spread);
    let per_node = bound_per_node(&w);
    assert_eq!(per_node.values().sum::<usize>(), 3);
    assert!(per_node.values().all(|&n| n <= 2), "{per_node:?}");
    let anti = format!(
        "{spread}        affinity:\n          podAntiAffinity:\n            requiredDuringSchedulingIgnoredDuringExecution:\n\
         \x20             - {{topologyKey: kubernetes.io/hostname, labelSelector: {{matchLabels: {{app: serve}}}}}}\n"
    );
    let w = three_pods_on_two_big_nodes(&anti);
    let per_node = bound_per_node(&w);
    assert_eq!(per_node.values().copied().collect::<Vec<_>>(), vec![1, 1]);
}

#[test]
fn the_scheduler_scores_preferred_node_and_pod_affinity() {
    // Without preferences scoring shares the three pods out over the two nodes.
    let w = three_pods_on_two_big_nodes("");
    assert_eq!(bound_per_node(&w).len(), 2, "{:?}", bound_per_node(&w));
    // Preferring zone b's node (NodeAffinity's score, weight 2) outweighs the room left.
    let zone_b = "        affinity:\n          nodeAffinity:\n            preferredDuringSchedulingIgnoredDuringExecution:\n\
         \x20             - {weight: 100, preference: {matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [us-east-1b]}]}}\n";
    let w = three_pods_on_two_big_nodes(zone_b);
    let per_node = bound_per_node(&w);
    assert_eq!(per_node.values().copied().collect::<Vec<_>>(), vec![3]);
    let n = w.pods[0].node.expect("bound");
    assert_eq!(w.nodes[n].offering.zone, "us-east-1b");
    // Preferring each other's node packs them onto one; preferring not to spreads them.
    let together = |sign: &str| {
        format!(
            "        affinity:\n          pod{sign}Affinity:\n            preferredDuringSchedulingIgnoredDuringExecution:\n\
             \x20             - {{weight: 100, podAffinityTerm: {{topologyKey: kubernetes.io/hostname, labelSelector: {{matchLabels: {{app: serve}}}}}}}}\n"
        )
    };
    let w = three_pods_on_two_big_nodes(&together(""));
    assert_eq!(
        bound_per_node(&w).values().copied().collect::<Vec<_>>(),
        vec![3]
    );
    let w = three_pods_on_two_big_nodes(&together("Anti"));
    let mut per_node: Vec<usize> = bound_per_node(&w).values().copied().collect();
    per_node.sort();
    assert_eq!(per_node, vec![1, 2]);
}
