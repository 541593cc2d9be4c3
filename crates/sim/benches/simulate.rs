//! `cargo bench -p gpu-node-autoscaler-sim --bench simulate`: replays the Alibaba GPU traces (from `../shared/traces`) and the
//! shipped scenarios with every strategy, printing wall time, peak heap and the headline numbers.
//! A plain benchmark binary: one run each is the measurement (a trace replay takes seconds).

use std::path::Path;

use gpu_node_autoscaler_core::catalog;
use gpu_node_autoscaler_core::policy::parse_policy;
use gpu_node_autoscaler_sim::{engine, scenario, trace, SimInput, StrategyKind, HOUR};

use gpu_node_autoscaler_test_support::counting_alloc;

#[global_allocator]
static GLOBAL: counting_alloc::Counting = counting_alloc::Counting;

fn report(input: &SimInput, filter: Option<&str>) {
    for k in StrategyKind::ALL {
        if filter.is_some_and(|f| !k.name().contains(f)) {
            continue;
        }
        let base = counting_alloc::start();
        let mut s = k.build(input);
        let m = engine::run(input, s.as_mut());
        let peak = counting_alloc::peak_above(base) as f64 / (1 << 20) as f64;
        println!(
            "| {} | {} | {:.2} | {:.0} | {:.2} | {:.3} | {} | {:.0} | {:.0} | {:.1} | {:.1} |",
            input.name,
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
    }
}

fn main() {
    // `cargo bench -p gpu-node-autoscaler-sim --bench simulate -- [strategy-substring]`
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    println!("| input | strategy | wall s | peak heap MiB | cost USD | cost / LB | never placed | wait p95 s | wait p99 s | GPU alloc % | LB USD |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../simulations/scenarios");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let sc = scenario::parse_scenario(&text, &f.display().to_string()).unwrap();
        let types = catalog::parse_csv(catalog::BUILTIN_AWS, "builtin").unwrap();
        let catalog = catalog::offerings_from_list_prices(&sc.policy, types);
        let input = sc.into_input(catalog, None);
        report(&input, filter.as_deref());
    }
    let traces =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/alibaba-gpu-v2023");
    for name in [
        "openb_pod_list_default.csv",
        "openb_pod_list_gpushare40.csv",
        "openb_pod_list_multigpu40.csv",
    ] {
        let path = traces.join(name);
        let Ok(text) = std::fs::read_to_string(&path) else {
            eprintln!("skipping {}: not found", path.display());
            continue;
        };
        let policy = parse_policy(&trace::default_trace_policy(), "builtin").unwrap();
        let types = catalog::parse_csv(catalog::BUILTIN_AWS, "builtin").unwrap();
        let t = trace::load_trace(&text, name, &policy, HOUR).unwrap();
        let input = SimInput {
            name: name.to_string(),
            catalog: catalog::offerings_from_list_prices(&policy, types),
            policy,
            pods: t.pods,
            events: Vec::new(),
            timing: Default::default(),
            until: None,
            seed: 1,
            skipped: t.skipped,
            device_classes: Default::default(),
        };
        report(&input, filter.as_deref());
    }
}
