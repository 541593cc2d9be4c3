//! Capacity reservations in the simulated cluster: ours fills them first at no marginal cost
//! and moves pods off a Capacity Block before it ends; the Cluster Autoscaler knows none.

use crate::report::Metrics;
use crate::{engine, SimInput, StrategyKind};

/// One g5.xlarge pool (reserved, then on-demand) selecting a Capacity Block of 2 in
/// us-east-1a that ends at 2 h; three one-GPU jobs of 3 hours from the start.
fn input() -> SimInput {
    let text = "name: t\n\
         timing: {bootMin: 60s, bootMax: 60s, devicePluginDelay: 30s}\n\
         policy:\n\
         \x20 clusterName: sim\n\
         \x20 zones: [us-east-1a, us-east-1b]\n\
         \x20 pools:\n\
         \x20   - name: a10g\n\
         \x20     instanceTypes: [g5.xlarge]\n\
         \x20     capacityTypes: [reserved, on-demand]\n\
         \x20     capacityReservations: [{tags: {kind: block}}]\n\
         \x20     maxNodes: 10\n\
         \x20     scaleDown: {unneededTime: 3m, cooldownAfterScaleUp: 3m}\n\
         reservations:\n\
         \x20 - {id: cr-0block, type: capacity-block, instanceType: g5.xlarge, zone: us-east-1a,\n\
         \x20    count: 2, end: 2h, pricePerHour: 0.6, tags: {kind: block}}\n\
         jobs:\n\
         \x20 - name: train\n\
         \x20   arrival: 0s\n\
         \x20   duration: 3h\n\
         \x20   pods:\n\
         \x20     - name: w\n\
         \x20       replicas: 3\n\
         \x20       requests: {cpu: \"2\", memory: 8Gi, nvidia.com/gpu: 1}\n";
    crate::test_input(text)
}

fn run(input: &SimInput, k: StrategyKind) -> Metrics {
    let mut s = k.build(input);
    engine::run(input, s.as_mut())
}

fn nodes(m: &Metrics, ct: &str) -> usize {
    m.cost_by_offering
        .iter()
        .filter(|o| o.capacity_type == ct)
        .map(|o| o.nodes)
        .sum()
}

#[test]
fn ours_fills_the_reservation_first_and_moves_pods_off_a_capacity_block_before_it_ends() {
    let input = input();
    let m = run(&input, StrategyKind::Ours);
    assert_eq!(m.pods_never_placed, 0);
    assert_eq!(nodes(&m, "reserved"), 2, "{:?}", m.cost_by_offering);
    // Reserved nodes cost nothing more; what runs after the block is on-demand.
    let reserved_cost: f64 = m
        .cost_by_offering
        .iter()
        .filter(|o| o.capacity_type == "reserved")
        .map(|o| o.cost_usd)
        .sum();
    assert_eq!(reserved_cost, 0.0);
    assert!(nodes(&m, "on-demand") >= 3, "{:?}", m.cost_by_offering);
    assert_eq!(m.pods_on_ended_reservations, 0, "moved before the end");
    // The block's own cost is reported apart: 2 × 0.6 $/h for its 2 hours.
    assert!(
        (m.reserved_cost_usd - 2.4).abs() < 1e-9,
        "{}",
        m.reserved_cost_usd
    );
}

#[test]
fn ca_like_knows_no_reservation_and_karpenter_like_loses_pods_at_the_capacity_block_end() {
    let input = input();
    let ca = run(&input, StrategyKind::CaLike);
    assert_eq!(nodes(&ca, "reserved"), 0, "{:?}", ca.cost_by_offering);
    assert_eq!(ca.pods_never_placed, 0);
    let k = run(&input, StrategyKind::KarpenterLike);
    assert_eq!(nodes(&k, "reserved"), 2, "{:?}", k.cost_by_offering);
    assert_eq!(k.pods_on_ended_reservations, 2, "{:?}", k.cost_by_offering);
}
