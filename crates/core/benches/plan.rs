//! `cargo bench -p gpu-node-autoscaler-core --bench plan`: the scale-up planner on generated clusters (100 / 1,000 / 10,000
//! pending pods, 1,000 existing nodes, ~400 offerings), plus its peak heap use per run; and
//! (`plan-claims`) the same clusters with 30 % of the GPU pods asking through DRA ResourceClaims,
//! with a DRA twin of every NVIDIA pool; and (`plan-topology`) with 30 % of the pending single
//! whole-GPU pods in services with zone spread, hostname anti-affinity or zone affinity, and 10 %
//! claiming a volume bound in one zone.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpu_node_autoscaler_core::catalog;
use gpu_node_autoscaler_core::fixtures::{
    bench_policy, bench_policy_with_dra, generated_cluster, generated_cluster_with_claims,
    generated_cluster_with_topology, SYNTHETIC_TYPES_CSV,
};
use gpu_node_autoscaler_core::model::Snapshot;
use gpu_node_autoscaler_core::model::Time;
use gpu_node_autoscaler_core::plan;
use gpu_node_autoscaler_core::policy::parse_policy;

use gpu_node_autoscaler_test_support::counting_alloc;

#[global_allocator]
static GLOBAL: counting_alloc::Counting = counting_alloc::Counting;

fn bench(c: &mut Criterion) {
    group(c, "plan", &bench_policy(), |pods| {
        generated_cluster(pods, 1_000, 42)
    });
    group(c, "plan-claims", &bench_policy_with_dra(), |pods| {
        generated_cluster_with_claims(pods, 1_000, 34, 42)
    });
    group(c, "plan-topology", &bench_policy(), |pods| {
        generated_cluster_with_topology(pods, 1_000, 30, 10, 42)
    });
}

fn group(c: &mut Criterion, name: &str, policy: &str, cluster: impl Fn(usize) -> Snapshot) {
    let policy = parse_policy(policy, "bench-policy").expect("bench policy");
    let csv = format!("{}{}", catalog::BUILTIN_AWS, SYNTHETIC_TYPES_CSV);
    let types = catalog::parse_csv(&csv, "bench-catalog").expect("bench catalog");
    let cat = catalog::offerings_from_list_prices(&policy, types);
    let now = Time(1_800_000_000_000);
    let mut group = c.benchmark_group(name);
    group.sample_size(10);
    for pods in [100usize, 1_000, 10_000] {
        let snapshot = cluster(pods);
        let claiming = snapshot
            .pods
            .iter()
            .filter(|p| !p.claims.is_empty())
            .count();
        let ruled = snapshot
            .pods
            .iter()
            .filter(|p| p.is_pending() && p.constraints.topology.is_some())
            .count();
        let zonal = snapshot
            .pods
            .iter()
            .filter(|p| p.is_pending() && !p.constraints.volumes.is_empty())
            .count();
        // One run outside the timer: report size, quality and peak heap above the input.
        let base = counting_alloc::start();
        let p = plan::plan(&snapshot, &cat, &policy, now);
        let peak = counting_alloc::peak_above(base);
        eprintln!(
            "{name}/{pods}: {claiming} pods with claims, {ruled} with rules across nodes, {zonal} with a zonal volume, {} offerings, {} scale-ups ({} nodes, ${:.2}/h), {} on existing capacity, {} unschedulable, peak heap {:.1} MiB",
            cat.offerings.len(),
            p.scale_ups.len(),
            p.scale_ups.iter().map(|s| s.count).sum::<u32>(),
            p.added_cost_per_hour,
            p.existing_capacity.len(),
            p.unschedulable.len(),
            peak as f64 / (1 << 20) as f64
        );
        let mut reasons = std::collections::BTreeMap::new();
        for u in &p.unschedulable {
            let r: String = u.reason.chars().take(90).collect();
            *reasons.entry(r).or_insert(0) += 1;
        }
        for (r, n) in reasons {
            eprintln!("  {n} unschedulable: {r}");
        }
        group.throughput(Throughput::Elements(pods as u64));
        group.bench_with_input(BenchmarkId::from_parameter(pods), &snapshot, |b, s| {
            b.iter(|| plan::plan(s, &cat, &policy, now))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
