//! The plans of the benchmark's generated clusters, recorded: a change meant to make the planner
//! faster, not to plan otherwise, must leave every one of them as it was. Each plan is printed in
//! full (`{:?}`: every scale-up with its fallbacks and its pods node by node, every placement on
//! existing capacity, every reason, the scale-downs and the cost) and hashed (FNV-1a, stable
//! across Rust releases); the hashes were recorded from the planner before its speed work (those
//! with rules across nodes again once topology spread honoured its node inclusion policies,
//! which changed what is counted, before the speed work was merged).

use super::*;
use crate::fixtures::{
    bench_policy, generated_cluster, generated_cluster_with_topology, SYNTHETIC_TYPES_CSV,
};

/// FNV-1a (64 bits) of a plan's full debug print.
fn fingerprint(plan: &Plan) -> u64 {
    format!("{plan:?}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// What the benchmark plans with: its policy and the built-in catalog with the synthetic types.
fn bench_inputs() -> (Policy, Catalog) {
    let policy = parse_policy(&bench_policy(), "bench-policy").expect("bench policy");
    let csv = format!("{}{}", catalog::BUILTIN_AWS, SYNTHETIC_TYPES_CSV);
    let types = catalog::parse_csv(&csv, "bench-catalog").expect("bench catalog");
    let cat = catalog::offerings_from_list_prices(&policy, types);
    (policy, cat)
}

/// A short account of a plan, to say what moved when a fingerprint does not match.
fn summary(plan: &Plan) -> String {
    format!(
        "{} scale-ups ({} nodes, ${:.4}/h), {} on existing capacity, {} unschedulable, {} scale-downs",
        plan.scale_ups.len(),
        plan.scale_ups.iter().map(|s| s.count).sum::<u32>(),
        plan.added_cost_per_hour,
        plan.existing_capacity.len(),
        plan.unschedulable.len(),
        plan.scale_downs.len()
    )
}

fn check(cases: &[(&str, Snapshot, u64)]) {
    let (policy, cat) = bench_inputs();
    let mut wrong = Vec::new();
    for (name, snapshot, want) in cases {
        let plan = plan(snapshot, &cat, &policy, NOW);
        let got = fingerprint(&plan);
        if got != *want {
            wrong.push(format!("{name}: {got:#018x} ({})", summary(&plan)));
        }
    }
    assert!(
        wrong.is_empty(),
        "plans differ from those recorded:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_benchmarks_clusters_with_rules_across_nodes_and_zonal_volumes_plan_as_recorded() {
    check(&[
        (
            "topology 10000 pods, seed 42",
            generated_cluster_with_topology(10_000, 1_000, 30, 10, 42),
            0x26a7_94e7_2fc2_aeb2,
        ),
        (
            "topology 1000 pods, seed 1",
            generated_cluster_with_topology(1_000, 300, 30, 10, 1),
            0xaaa4_c024_b9db_c79e,
        ),
        (
            "topology 1000 pods, seed 2, 60 % rules, 30 % volumes",
            generated_cluster_with_topology(1_000, 300, 60, 30, 2),
            0x359e_3d50_4303_4d9f,
        ),
        (
            "topology 3000 pods, seed 3",
            generated_cluster_with_topology(3_000, 100, 30, 10, 3),
            0x290a_b28a_15c4_ae54,
        ),
    ]);
}

#[test]
fn the_benchmarks_plain_clusters_plan_as_recorded() {
    check(&[
        (
            "plain 10000 pods, seed 42",
            generated_cluster(10_000, 1_000, 42),
            0x5835_cb39_6a78_a9ac,
        ),
        (
            "plain 1000 pods, seed 1",
            generated_cluster(1_000, 300, 1),
            0xc18b_adc0_6c67_c4de,
        ),
    ]);
}
