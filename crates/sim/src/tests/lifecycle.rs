//! Drift in the simulated cluster: a pool's template changes and its older nodes are replaced
//! within the pool's disruption budget (ours, karpenter-like), or left (ca-like).

use crate::{engine, StrategyKind};

/// Eight one-GPU jobs of four hours on `g5.xlarge` nodes, the pool's template changing at 1 h;
/// drift may take `budget` nodes at once.
fn rolled(budget: u32) -> String {
    format!(
        "name: t\n\
         timing: {{bootMin: 60s, bootMax: 60s, devicePluginDelay: 30s}}\n\
         policy:\n\
         \x20 clusterName: sim\n\
         \x20 zones: [us-east-1a]\n\
         \x20 pools:\n\
         \x20   - name: a10g\n\
         \x20     instanceTypes: [g5.xlarge]\n\
         \x20     capacityTypes: [on-demand]\n\
         \x20     maxNodes: 20\n\
         \x20     scaleDown: {{unneededTime: 5m, cooldownAfterScaleUp: 5m}}\n\
         \x20     disruption: {{budgets: [{{nodes: {budget}, reasons: [Drifted]}}]}}\n\
         jobs:\n\
         \x20 - name: j\n    arrival: 0s\n    duration: 4h\n    pods:\n\
         \x20     - name: w\n        replicas: 8\n        requests: {{cpu: \"3\", memory: 12Gi, nvidia.com/gpu: 1}}\n\
         events:\n\
         \x20 - drift: {{at: 1h, pool: a10g}}\n"
    )
}

#[test]
fn a_drift_event_rolls_the_pool_within_its_budget_for_ours_and_karpenter_like_not_ca_like() {
    for budget in [1, 3] {
        let input = crate::test_input(&rolled(budget));
        for kind in [StrategyKind::Ours, StrategyKind::KarpenterLike] {
            let mut s = kind.build(&input);
            let m = engine::run(&input, s.as_mut());
            assert_eq!(m.pods_never_placed, 0);
            assert_eq!(
                m.lifecycle_replacements, 8,
                "{} with a budget of {budget}: every node launched before replaced once",
                m.strategy
            );
            assert_eq!(
                m.peak_nodes_disrupted, budget as usize,
                "{}: at most the budget at once, and that many",
                m.strategy
            );
            // The replacement is up before the old node is drained: no pod waits.
            assert!(m.disrupted_pod_hours < 0.01, "{}", m.disrupted_pod_hours);
            assert_eq!(m.nodes_launched, 16, "{}", m.strategy);
        }
        let mut ca = StrategyKind::CaLike.build(&input);
        let m = engine::run(&input, ca.as_mut());
        assert_eq!((m.lifecycle_replacements, m.nodes_launched), (0, 8));
    }
}
