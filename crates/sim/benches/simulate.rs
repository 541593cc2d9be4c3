//! `cargo bench -p gpu-node-autoscaler-sim --bench simulate -- [STRATEGY] [--seeds 1,2,3] [--only INPUT] [--without-consolidation] [--detail]`:
//! replays the shipped scenarios and the Alibaba GPU traces (shipped in `simulations/traces`;
//! missing traces are an error) with every strategy, once per seed, printing wall time, peak heap and
//! the headline numbers per run, then per input the mean over the seeds: who is cheapest, and
//! our wait p95 against the better baseline's.
//! A plain benchmark binary: one run each is the measurement (a trace replay takes seconds).

use std::path::Path;

use gpu_node_autoscaler_core::catalog;
use gpu_node_autoscaler_core::policy::parse_policy;
use gpu_node_autoscaler_sim::report::Metrics;
use gpu_node_autoscaler_sim::{engine, scenario, trace, SimInput, StrategyKind, HOUR};

use gpu_node_autoscaler_test_support::counting_alloc;

#[global_allocator]
static GLOBAL: counting_alloc::Counting = counting_alloc::Counting;

struct Args {
    strategy: Option<String>,
    only: Option<String>,
    seeds: Vec<u64>,
    /// Every pool's consolidation off, to measure what it does.
    without_consolidation: bool,
    /// Per run, also where the money goes: launches, idle GPU-hours and cost per offering.
    detail: bool,
}

fn args() -> Args {
    let mut a = Args {
        strategy: None,
        only: None,
        seeds: Vec::new(),
        without_consolidation: false,
        detail: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        match x.as_str() {
            "--seeds" => {
                let v = it.next().expect("--seeds needs a list, e.g. 1,2,3");
                a.seeds = v
                    .split(',')
                    .map(|s| s.trim().parse().expect("--seeds: numbers, e.g. 1,2,3"))
                    .collect();
            }
            "--only" => a.only = Some(it.next().expect("--only needs an input name substring")),
            "--without-consolidation" => a.without_consolidation = true,
            "--detail" => a.detail = true,
            // cargo bench passes --bench to the binary
            s if s.starts_with('-') => {}
            s => a.strategy = Some(s.to_string()),
        }
    }
    a
}

/// Runs `input` with every selected strategy, prints a row per run.
fn report(input: &SimInput, a: &Args) -> Vec<Metrics> {
    let filter = a.strategy.as_deref();
    let mut input = input.clone();
    if a.without_consolidation {
        for p in &mut input.policy.pools {
            p.consolidation.enabled = false;
        }
    }
    let input = &input;
    let mut runs = Vec::new();
    for k in StrategyKind::ALL {
        if filter.is_some_and(|f| !k.name().contains(f)) {
            continue;
        }
        let base = counting_alloc::start();
        let mut s = k.build(input);
        let m = engine::run(input, s.as_mut());
        let peak = counting_alloc::peak_above(base) as f64 / (1 << 20) as f64;
        println!(
            "| {} | {} | {} | {:.2} | {:.0} | {:.2} | {:.3} | {} | {:.0} | {:.0} | {:.1} | {:.1} |",
            input.name,
            input.seed,
            m.strategy,
            m.wall_s,
            peak,
            m.cost_usd,
            m.cost_over_lower_bound,
            m.pods_never_placed,
            m.wait_p95_s,
            m.wait_p99_s,
            m.gpu_allocation_ratio * 100.0,
            m.lower_bound_usd,
        );
        if a.detail {
            eprintln!(
                "  {} {}: {} scale-ups, {} nodes launched, {} removed, {} evictions; GPU-hours provisioned {:.0}, requested {:.0}, idle booting {:.0}, empty {:.0}, fragmented {:.0}",
                input.name,
                m.strategy,
                m.scale_ups,
                m.nodes_launched,
                m.nodes_removed,
                m.evictions,
                m.gpu_hours_provisioned,
                m.gpu_hours_requested,
                m.idle_gpu_hours_booting,
                m.idle_gpu_hours_empty,
                m.idle_gpu_hours_fragmented,
            );
            for o in &m.cost_by_offering {
                eprintln!(
                    "    {} {} {}: {} nodes, {:.2} USD, {:.0} GPU-hours",
                    o.pool, o.instance_type, o.capacity_type, o.nodes, o.cost_usd, o.gpu_hours
                );
            }
        }
        runs.push(m);
    }
    runs
}

/// Per input, the mean over its seeds of each strategy's cost, cost / bound and wait p95.
fn summary(all: &[(String, Vec<Metrics>)]) {
    println!();
    println!("| input | seeds | ours USD | ca-like USD | karpenter-like USD | cheapest | ours vs best other | ours / LB | wait p95 ours | wait p95 better baseline |");
    println!("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|");
    let mut names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    names.dedup();
    for name in names {
        let runs: Vec<&Metrics> = all
            .iter()
            .filter(|(n, _)| n == name)
            .flat_map(|(_, r)| r)
            .collect();
        let mean = |s: &str, f: &dyn Fn(&Metrics) -> f64| {
            let v: Vec<f64> = runs
                .iter()
                .filter(|m| m.strategy == s)
                .map(|m| f(m))
                .collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        let seeds = runs
            .iter()
            .filter(|m| m.strategy == "gpu-node-autoscaler")
            .count();
        let cost = |s| mean(s, &|m| m.cost_usd);
        let (ours, ca, ka) = (
            cost("gpu-node-autoscaler"),
            cost("ca-like"),
            cost("karpenter-like"),
        );
        let (Some(ours), Some(ca), Some(ka)) = (ours, ca, ka) else {
            continue;
        };
        // A strategy that leaves more pods unplaced than ours is not a comparison of cost.
        let unplaced = |s| mean(s, &|m| m.pods_never_placed as f64).unwrap_or(0.0);
        let places_fewer = |s| unplaced(s) > unplaced("gpu-node-autoscaler");
        if places_fewer("ca-like") && places_fewer("karpenter-like") {
            println!(
                "| {name} | {seeds} | {ours:.2} | {ca:.2} | {ka:.2} | not comparable: both leave pods unplaced ({:.0}, {:.0}; ours {:.0}) | | | | |",
                unplaced("ca-like"),
                unplaced("karpenter-like"),
                unplaced("gpu-node-autoscaler"),
            );
            continue;
        }
        let cheapest = [("ours", ours), ("ca-like", ca), ("karpenter-like", ka)]
            .into_iter()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map(|c| c.0)
            .unwrap_or("-");
        let best_other = ca.min(ka);
        let better = if ca <= ka {
            "ca-like"
        } else {
            "karpenter-like"
        };
        let p95 = |s| mean(s, &|m| m.wait_p95_s).unwrap_or(f64::NAN);
        let lb = mean("gpu-node-autoscaler", &|m| m.cost_over_lower_bound).unwrap_or(f64::NAN);
        println!(
            "| {name} | {seeds} | {ours:.2} | {ca:.2} | {ka:.2} | {cheapest} | {:+.1} % | {lb:.3} | {:.0} | {:.0} ({better}) |",
            100.0 * (ours / best_other - 1.0),
            p95("gpu-node-autoscaler"),
            p95(better),
        );
    }
}

fn main() {
    let a = args();
    let seeds: Vec<Option<u64>> = if a.seeds.is_empty() {
        vec![None]
    } else {
        a.seeds.iter().map(|s| Some(*s)).collect()
    };
    let wanted = |name: &str| a.only.as_deref().is_none_or(|o| name.contains(o));
    println!("| input | seed | strategy | wall s | peak heap MiB | cost USD | cost / LB | never placed | wait p95 s | wait p99 s | GPU alloc % | LB USD |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut all = Vec::new();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../simulations/scenarios");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let parse = || scenario::parse_scenario(&text, &f.display().to_string()).unwrap();
        if !wanted(&parse().name) {
            continue;
        }
        for seed in &seeds {
            let sc = parse();
            let types = catalog::parse_csv(catalog::BUILTIN_AWS, "builtin").unwrap();
            let catalog = catalog::offerings_from_list_prices(&sc.policy, types);
            let input = sc.into_input(catalog, *seed);
            all.push((input.name.clone(), report(&input, &a)));
        }
    }
    let traces =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../simulations/traces/alibaba-gpu-v2023");
    for name in [
        "openb_pod_list_default.csv",
        "openb_pod_list_gpushare40.csv",
        "openb_pod_list_multigpu40.csv",
    ] {
        if !wanted(name) {
            continue;
        }
        let path = traces.join(name);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (the traces ship in simulations/traces)",
                path.display()
            )
        });
        let policy = parse_policy(&trace::default_trace_policy(), "builtin").unwrap();
        let types = catalog::parse_csv(catalog::BUILTIN_AWS, "builtin").unwrap();
        let t = trace::load_trace(&text, name, &policy, HOUR).unwrap();
        for seed in &seeds {
            let input = SimInput {
                name: name.to_string(),
                catalog: catalog::offerings_from_list_prices(&policy, types.clone()),
                policy: policy.clone(),
                pods: t.pods.clone(),
                events: Vec::new(),
                timing: Default::default(),
                until: None,
                seed: seed.unwrap_or(1),
                skipped: t.skipped.clone(),
                device_classes: Default::default(),
                reservations: Vec::new(),
                kueue_jobs: Vec::new(),
                buffers: Vec::new(),
                groups: Default::default(),
                storage: Default::default(),
            };
            all.push((input.name.clone(), report(&input, &a)));
        }
    }
    summary(&all);
}
