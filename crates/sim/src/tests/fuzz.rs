//! The simulator's inputs, fed mutated valid ones: scenarios and traces never panic the parser,
//! and each error names the file and line (docs/testing.md, "Fuzzing").

use gpu_node_autoscaler_core::fuzz::{positioned, run};
use gpu_node_autoscaler_core::policy::parse_policy;

use crate::scenario::parse_scenario;
use crate::trace::{default_trace_policy, load_trace};

const SCENARIOS: &[&str] = &[
    include_str!("../../../../simulations/scenarios/arena-mpi-training.yaml"),
    include_str!("../../../../simulations/scenarios/bursty-inference-hpa.yaml"),
    include_str!("../../../../simulations/scenarios/dra-claims.yaml"),
    include_str!("../../../../simulations/scenarios/drift-rolling-ami.yaml"),
    include_str!("../../../../simulations/scenarios/gpu-failures.yaml"),
    include_str!("../../../../simulations/scenarios/kueue-gangs.yaml"),
    include_str!("../../../../simulations/scenarios/mig-shared-mix.yaml"),
    include_str!("../../../../simulations/scenarios/one-type-short.yaml"),
    include_str!("../../../../simulations/scenarios/reserved-h100.yaml"),
    include_str!("../../../../simulations/scenarios/spot-returns.yaml"),
    include_str!("../../../../simulations/scenarios/spot-short-one-zone.yaml"),
    include_str!("../../../../simulations/scenarios/spot-short-two-zones.yaml"),
    include_str!("../../../../simulations/scenarios/spot-shortage.yaml"),
    include_str!("../../../../simulations/scenarios/topology-serving.yaml"),
];

#[test]
fn fuzz_scenarios_never_panic_and_every_error_names_file_line_and_column() {
    for (i, s) in SCENARIOS.iter().enumerate() {
        parse_scenario(s, "s.yaml").unwrap_or_else(|e| panic!("seed {i}: {e}"));
    }
    let (ok, refused) = run(
        "scenario",
        SCENARIOS,
        |t| parse_scenario(t, "s.yaml").map(|_| ()),
        |text, e| positioned(e, "s.yaml", text, true),
    );
    assert!(ok > 0 && refused > 0, "ok {ok}, refused {refused}");
}

#[test]
fn fuzz_traces_never_panic_and_every_error_names_file_and_line() {
    let head = |t: &str| {
        t.lines()
            .take(40)
            .map(|l| format!("{l}\n"))
            .collect::<String>()
    };
    let seeds = [
        head(include_str!(
            "../../../../simulations/traces/alibaba-gpu-v2023/openb_pod_list_default.csv"
        )),
        head(include_str!(
            "../../../../simulations/traces/alibaba-gpu-v2023/openb_pod_list_gpushare40.csv"
        )),
        head(include_str!(
            "../../../../simulations/traces/alibaba-gpu-v2023/openb_pod_list_multigpu40.csv"
        )),
    ];
    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let policy = parse_policy(&default_trace_policy(), "builtin").unwrap();
    let (ok, refused) = run(
        "trace",
        &seeds,
        |t| load_trace(t, "t.csv", &policy, 3_600_000).map(|_| ()),
        |text, e| positioned(e, "t.csv", text, false),
    );
    assert!(ok > 0 && refused > 0, "ok {ok}, refused {refused}");
}
