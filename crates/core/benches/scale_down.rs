//! `cargo bench -p gpu-node-autoscaler-core --bench scale_down`: the whole plan (scale-up pass included) on a busy cluster of
//! 5,000 GPU nodes and 100,000 running pods, a fifth of the nodes under-used.

use criterion::{criterion_group, criterion_main, Criterion};
use gpu_node_autoscaler_core::catalog;
use gpu_node_autoscaler_core::fixtures::{bench_policy, generated_busy_cluster};
use gpu_node_autoscaler_core::model::Time;
use gpu_node_autoscaler_core::plan;
use gpu_node_autoscaler_core::policy::parse_policy;

fn bench(c: &mut Criterion) {
    let text = bench_policy().replace("pools:", "maxConcurrentDrains: 50\npools:");
    let policy = parse_policy(&text, "bench-policy").expect("bench policy");
    let types = catalog::parse_csv(catalog::BUILTIN_AWS, "builtin").expect("catalog");
    let cat = catalog::offerings_from_list_prices(&policy, types);
    let now = Time(1_800_000_000_000);
    let snapshot = generated_busy_cluster(5_000, 20, now, 7);
    let p = plan::plan(&snapshot, &cat, &policy, now);
    eprintln!(
        "scale_down/5000x20: {} nodes, {} pods: {} unneeded, {} scale-downs ({} evictions, ${:.2}/h saved), {} kept",
        snapshot.nodes.len(),
        snapshot.pods.len(),
        p.unneeded.len(),
        p.scale_downs.len(),
        p.scale_downs.iter().map(|d| d.evict.len()).sum::<usize>(),
        p.scale_downs.iter().map(|d| d.saves_per_hour).sum::<f64>(),
        p.kept.len()
    );
    let mut group = c.benchmark_group("scale_down");
    group.sample_size(10);
    group.bench_function("5000_nodes_100000_pods", |b| {
        b.iter(|| plan::plan(&snapshot, &cat, &policy, now))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
