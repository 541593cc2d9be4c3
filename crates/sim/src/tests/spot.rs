//! Spot short, then back, in the simulated cluster: the Cluster Autoscaler's on-demand node
//! groups behind its spot ones, Karpenter's replacement of on-demand nodes by spot, and our
//! consolidation moving pods off on-demand once spot returns.

use crate::report::Metrics;
use crate::{engine, SimInput, StrategyKind};

/// One A10G pool (spot and on-demand) whose spot is short in every zone for the first 40
/// minutes; `jobs` is appended as the scenario's jobs, `consolidation` as the pool's field.
fn input(consolidation: &str, jobs: &str) -> SimInput {
    let text = format!(
        "name: t\n\
         timing: {{bootMin: 60s, bootMax: 60s, devicePluginDelay: 30s}}\n\
         policy:\n\
         \x20 clusterName: sim\n\
         \x20 zones: [us-east-1a, us-east-1b]\n\
         \x20 pools:\n\
         \x20   - name: a10g\n\
         \x20     instanceTypes: [g5.xlarge]\n\
         \x20     capacityTypes: [spot, on-demand]\n\
         \x20     maxNodes: 10\n\
         \x20     scaleDown: {{unneededTime: 3m, cooldownAfterScaleUp: 3m}}\n\
         \x20     consolidation: {consolidation}\n\
         events:\n\
         \x20 - insufficientCapacity: {{from: 0s, until: 40m, capacityType: spot}}\n\
         jobs:\n{jobs}"
    );
    crate::test_input(&text)
}

/// One replica of `kind` (Deployment or Job) asking for a GPU, from 0 s for 4 hours.
fn replica(kind: &str) -> String {
    format!(
        "  - name: serve\n    kind: {kind}\n    arrival: 0s\n    duration: 4h\n    pods:\n\
         \x20     - name: r\n        requests: {{cpu: \"2\", memory: 8Gi, nvidia.com/gpu: 1}}\n"
    )
}

fn run(input: &SimInput, k: StrategyKind) -> Metrics {
    let mut s = k.build(input);
    engine::run(input, s.as_mut())
}

/// Nodes and GPU-hours per capacity type.
fn by_capacity(m: &Metrics, ct: &str) -> (usize, f64) {
    m.cost_by_offering
        .iter()
        .filter(|o| o.capacity_type == ct)
        .fold((0, 0.0), |(n, h), o| (n + o.nodes, h + o.gpu_hours))
}

#[test]
fn karpenter_like_replaces_an_on_demand_node_by_spot_once_spot_returns() {
    let m = run(
        &input("{enabled: false}", &replica("Deployment")),
        StrategyKind::KarpenterLike,
    );
    let (od, od_hours) = by_capacity(&m, "on-demand");
    let (spot, spot_hours) = by_capacity(&m, "spot");
    assert_eq!((od, spot), (1, 1), "{:?}", m.cost_by_offering);
    // The on-demand node goes once its replacement is initialised, soon after spot returns.
    assert!(od_hours < 1.0, "on-demand for {od_hours} GPU-hours");
    assert!(spot_hours > 3.0, "spot for {spot_hours} GPU-hours");
    assert_eq!(m.evictions, 1);
    assert_eq!(m.pods_never_placed, 0);
}

#[test]
fn karpenter_like_never_replaces_a_spot_node_by_spot() {
    // No shortage: the replica gets spot from the start and stays on its node.
    let text = replica("Deployment");
    let mut input = input("{enabled: false}", &text);
    input.events.clear();
    let m = run(&input, StrategyKind::KarpenterLike);
    assert_eq!(by_capacity(&m, "spot").0, 1, "{:?}", m.cost_by_offering);
    assert_eq!(by_capacity(&m, "on-demand").0, 0);
    assert_eq!(m.evictions, 0);
}

#[test]
fn our_consolidation_moves_a_replica_back_to_spot_once_spot_returns() {
    let input = input("{enabled: true}", &replica("Deployment"));
    let m = run(&input, StrategyKind::Ours);
    let (od, od_hours) = by_capacity(&m, "on-demand");
    let (spot, _) = by_capacity(&m, "spot");
    assert_eq!((od, spot), (1, 1), "{:?}", m.cost_by_offering);
    // consolidateAfter is 30 minutes: the move comes once spot is back (40 m), well before the
    // replica's 4 hours end.
    assert!(od_hours < 1.25, "on-demand for {od_hours} GPU-hours");
    assert_eq!(m.evictions, 1);
    // Without consolidation it stays on on-demand for its whole run.
    let off = run(
        &self::input("{enabled: false}", &replica("Deployment")),
        StrategyKind::Ours,
    );
    assert!(
        by_capacity(&off, "on-demand").1 > 3.9,
        "{:?}",
        off.cost_by_offering
    );
    assert!(
        m.cost_usd < off.cost_usd,
        "{} >= {}",
        m.cost_usd,
        off.cost_usd
    );
}

#[test]
fn our_consolidation_leaves_a_jobs_pod_where_it_runs() {
    // A batch Job's pod loses its work when moved: without moveJobs it stays on on-demand.
    let m = run(
        &input("{enabled: true}", &replica("Job")),
        StrategyKind::Ours,
    );
    assert_eq!(
        by_capacity(&m, "on-demand").0,
        1,
        "{:?}",
        m.cost_by_offering
    );
    assert_eq!(by_capacity(&m, "spot").0, 0);
    assert_eq!(m.evictions, 0);
}

#[test]
fn ca_like_falls_back_to_its_on_demand_group_when_the_spot_group_fails() {
    // The spot group's launch fails; at the next scan it is backed off and the on-demand group,
    // next by priority, gets the node: the pod does not wait the 40 minutes of the shortage.
    let m = run(
        &input("{enabled: false}", &replica("Job")),
        StrategyKind::CaLike,
    );
    assert_eq!(
        by_capacity(&m, "on-demand").0,
        1,
        "{:?}",
        m.cost_by_offering
    );
    assert_eq!(by_capacity(&m, "spot").0, 0);
    assert!(m.wait_p99_s < 300.0, "waited {} s", m.wait_p99_s);
    // Without a shortage its spot group comes first.
    let mut calm = input("{enabled: false}", &replica("Job"));
    calm.events.clear();
    let m = run(&calm, StrategyKind::CaLike);
    assert_eq!(by_capacity(&m, "spot").0, 1, "{:?}", m.cost_by_offering);
    assert_eq!(by_capacity(&m, "on-demand").0, 0);
}
