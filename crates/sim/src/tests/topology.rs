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
