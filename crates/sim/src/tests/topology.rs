//! Rules across nodes in the simulated cluster: its scheduler refuses what kube-scheduler
//! refuses, and our plan launches where the pods will be accepted.

use crate::{engine, StrategyKind};

/// Six one-GPU serving replicas, spread over three zones (maxSkew 1) and one per node, on a
/// pool of 4-GPU nodes only: packed without the rules, two nodes would hold them all and the
/// scheduler would refuse four.
const SPREAD_SERVING: &str = "  - name: llm\n    kind: Deployment\n    arrival: 0s\n    duration: 1h\n    pods:\n\
     \x20     - name: r\n        replicas: 6\n        labels: {app: llm}\n\
     \x20       requests: {cpu: \"3\", memory: 12Gi, nvidia.com/gpu: 1}\n\
     \x20       topologySpreadConstraints:\n\
     \x20         - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: llm}}}\n\
     \x20       affinity:\n          podAntiAffinity:\n            requiredDuringSchedulingIgnoredDuringExecution:\n\
     \x20             - {topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app: llm}}}\n";

#[test]
fn ours_launches_one_node_per_spread_replica_and_every_replica_runs_at_once() {
    let input = crate::test_a10g_input(
        "us-east-1a, us-east-1b, us-east-1c",
        "instanceTypes: [g5.12xlarge], capacityTypes: [spot, on-demand], maxNodes: 12",
        SPREAD_SERVING,
    );
    let mut s = StrategyKind::Ours.build(&input);
    let m = engine::run(&input, s.as_mut());
    assert_eq!(m.pods_never_placed, 0);
    assert_eq!(m.nodes_launched, 6, "{:?}", m.cost_by_offering);
    // One launch round: every replica waits about a boot, none a second round.
    assert!(m.wait_p95_s < 300.0, "wait p95 {} s", m.wait_p95_s);
}

/// The volume-zoned pods of `topology-serving`: the cache's replicas (claims of a class allowed
/// in us-east-1c only) and the fine-tune (its claim bound to a static volume in us-east-1b).
fn volume_zone(pod: &str) -> &'static str {
    if pod.starts_with("cache-") {
        "us-east-1c"
    } else if pod.starts_with("finetune-") {
        "us-east-1b"
    } else {
        panic!("{pod} has no volume in the scenario")
    }
}

#[test]
fn volume_zoned_pods_of_topology_serving_are_bound_only_in_their_volumes_zone_by_every_strategy() {
    let input = crate::test_input(include_str!(
        "../../../../simulations/scenarios/topology-serving.yaml"
    ));
    let with_volumes: Vec<usize> = (0..input.pods.len())
        .filter(|&i| !input.pods[i].pod.volumes.is_empty())
        .collect();
    assert_eq!(
        with_volumes.len(),
        8,
        "two rounds of 3 cache replicas and a fine-tune"
    );
    for kind in StrategyKind::ALL {
        let mut s = kind.build(&input);
        let w = engine::run_world(&input, s.as_mut(), &mut |_| {});
        for (p, zone) in &w.volume_binds {
            let name = &input.pods[*p].pod.id.name;
            assert_eq!(
                zone.as_deref(),
                Some(volume_zone(name)),
                "{}: {name}",
                kind.name()
            );
        }
        let placed: std::collections::BTreeSet<usize> =
            w.volume_binds.iter().map(|(p, _)| *p).collect();
        // Ours and karpenter-like launch in the volumes' zones (as Karpenter's volume topology
        // does); ca-like's node groups span the zones and its template is their first zone's (the
        // Cluster Autoscaler's AWS provider), so it launches for none of them.
        let want = match kind {
            StrategyKind::CaLike => 0,
            _ => with_volumes.len(),
        };
        assert_eq!(placed.len(), want, "{}: {placed:?}", kind.name());
    }
}

#[test]
fn volume_a_bound_claim_outlives_its_pod_and_the_next_pod_of_it_goes_back_to_its_zone() {
    // A StatefulSet-like pod with a claim of a class allowed in any zone, made again 2 hours
    // later. No spot or on-demand capacity in us-east-1a and 1b for the first hour: the first
    // pod's volume is made in us-east-1c. The second pod would be planned in us-east-1a (the
    // first zone, the same prices) but for its claim, bound by then.
    let mut input = crate::test_input(
        "name: t\n\
         timing: {bootMin: 60s, bootMax: 60s, devicePluginDelay: 30s}\n\
         policy:\n  clusterName: sim\n  zones: [us-east-1a, us-east-1b, us-east-1c]\n  pools:\n\
         \x20   - {name: a10g, instanceTypes: [g5.xlarge], capacityTypes: [on-demand], maxNodes: 4}\n\
         storageClasses:\n  - {name: gp3, provisioner: ebs.csi.aws.com, volumeBindingMode: WaitForFirstConsumer}\n\
         events:\n\
         \x20 - insufficientCapacity: {from: 0s, until: 1h, zone: us-east-1a}\n\
         \x20 - insufficientCapacity: {from: 0s, until: 1h, zone: us-east-1b}\n\
         jobs:\n  - name: db\n    arrival: 0s\n    repeat: {count: 2, every: 2h}\n    duration: 30m\n    pods:\n\
         \x20     - name: r\n        requests: {cpu: \"2\", memory: 8Gi, nvidia.com/gpu: 1}\n\
         \x20       volumes: [{template: data, storageClass: gp3, size: 50Gi}]\n",
    );
    input.until = Some(4 * crate::HOUR);
    let claims: Vec<&str> = input
        .pods
        .iter()
        .map(|p| p.pod.volumes[0].claim.as_str())
        .collect();
    assert_eq!(claims, ["data-db-r-0", "data-db-r-0"], "one claim for both");
    let mut s = StrategyKind::Ours.build(&input);
    let w = engine::run_world(&input, s.as_mut(), &mut |_| {});
    let zones: Vec<(usize, Option<&str>)> = w
        .volume_binds
        .iter()
        .map(|(p, z)| (*p, z.as_deref()))
        .collect();
    assert_eq!(
        zones,
        [(0, Some("us-east-1c")), (1, Some("us-east-1c"))],
        "{:?}",
        w.metrics.cost_by_offering
    );
}
