//! The baselines take each pool's scale-down time: the Cluster Autoscaler as its node group's
//! unneeded time (its AWS provider reads it from the Auto Scaling group's tags), Karpenter as the
//! NodePool's `consolidateAfter`.

use crate::{engine, SimInput, StrategyKind};

/// One A10G pool whose nodes are unneeded after `unneeded`; two Job pods of one GPU run one hour
/// on a g5.xlarge from 0 s and three hours on a g5.2xlarge from 10 m (6 CPUs: it fits no g5.xlarge, so Karpenter
/// cannot consolidate it onto the emptied node; the run ends with the last pod).
fn input(unneeded: &str) -> SimInput {
    input_beside(unneeded, &[])
}

/// [`input`] with `others` (pools, each the fields of a flow-style mapping) after its pool.
fn input_beside(unneeded: &str, others: &[&str]) -> SimInput {
    let a10g = format!(
        "name: a10g, instanceTypes: [g5.xlarge, g5.2xlarge], capacityTypes: [on-demand], \
         maxNodes: 10, scaleDown: {{unneededTime: {unneeded}, cooldownAfterScaleUp: 3m}}"
    );
    let pools: Vec<&str> = std::iter::once(a10g.as_str())
        .chain(others.iter().copied())
        .collect();
    crate::test_pools_input(
        "us-east-1a",
        &pools,
        "  - name: short\n    arrival: 0s\n    duration: 1h\n    pods:\n\
         \x20     - name: w\n        requests: {cpu: \"2\", memory: 8Gi, nvidia.com/gpu: 1}\n\
         \x20 - name: long\n    arrival: 10m\n    duration: 3h\n    pods:\n\
         \x20     - name: w\n        requests: {cpu: \"6\", memory: 8Gi, nvidia.com/gpu: 1}\n",
    )
}

/// Minutes the short pod's node stays empty after it ends.
fn empty_minutes(unneeded: &str, k: StrategyKind) -> f64 {
    empty_minutes_of(&input(unneeded), k)
}

fn empty_minutes_of(input: &SimInput, k: StrategyKind) -> f64 {
    let mut s = k.build(input);
    let m = engine::run(input, s.as_mut());
    assert_eq!(m.pods_never_placed, 0);
    m.idle_gpu_hours_empty * 60.0
}

#[test]
fn the_baselines_remove_an_empty_node_after_the_pools_unneeded_time() {
    for k in [StrategyKind::CaLike, StrategyKind::KarpenterLike] {
        for (unneeded, minutes) in [("3m", 3.0), ("20m", 20.0)] {
            let got = empty_minutes(unneeded, k);
            // Within the Cluster Autoscaler's 10 s scan and Karpenter's batching.
            assert!(
                (got - minutes).abs() <= 0.5,
                "{k:?} with unneededTime {unneeded}: empty for {got:.2} minutes"
            );
        }
    }
}

#[test]
fn a_pool_keeps_its_own_unneeded_time_beside_a_pool_with_a_shorter_one() {
    // An L40S pool that removes its nodes after 3 minutes, dearer and more wasteful for these
    // pods than the A10G pool: the A10G pool's empty node still waits its own 20 minutes, under
    // both baselines.
    let l40s = "name: l40s, instanceTypes: [g6e.12xlarge], capacityTypes: [on-demand], \
                maxNodes: 10, scaleDown: {unneededTime: 3m, cooldownAfterScaleUp: 3m}";
    let input = input_beside("20m", &[l40s]);
    for k in [StrategyKind::CaLike, StrategyKind::KarpenterLike] {
        let got = empty_minutes_of(&input, k);
        assert!(
            (got - 20.0).abs() <= 0.5,
            "{k:?}: the A10G pool's node empty for {got:.2} minutes"
        );
    }
}

#[test]
fn ca_like_holds_every_pools_scale_down_after_a_scale_up_in_any_pool() {
    // The A10G pool's node empties at about 31 minutes; the L40S pool scales up at 30. The
    // Cluster Autoscaler's delay after a scale-up (20 minutes) is one for the cluster, so the
    // A10G node waits until about 51 minutes; Karpenter has no such delay.
    let pool = |name: &str, ty: &str| {
        format!(
            "name: {name}, instanceTypes: [{ty}], capacityTypes: [on-demand], maxNodes: 10, \
             scaleDown: {{unneededTime: 1m, cooldownAfterScaleUp: 20m}}"
        )
    };
    let job = |name: &str, arrival: &str, duration: &str, model: &str| {
        format!(
            "  - name: {name}\n    arrival: {arrival}\n    duration: {duration}\n    pods:\n\
             \x20     - name: w\n        requests: {{cpu: \"2\", memory: 8Gi, nvidia.com/gpu: 1}}\n\
             \x20       nodeSelector: {{gpu-node-autoscaler.io/gpu-model: {model}}}\n"
        )
    };
    let input = crate::test_pools_input(
        "us-east-1a",
        &[&pool("a10g", "g5.xlarge"), &pool("l40s", "g6e.xlarge")],
        &(job("short", "0s", "30m", "A10G") + &job("late", "30m", "2h", "L40S")),
    );
    let ca = empty_minutes_of(&input, StrategyKind::CaLike);
    assert!(
        (18.0..=21.0).contains(&ca),
        "ca-like: empty for {ca:.2} minutes"
    );
    let karpenter = empty_minutes_of(&input, StrategyKind::KarpenterLike);
    assert!(
        karpenter <= 1.5,
        "karpenter-like: empty for {karpenter:.2} minutes"
    );
}
