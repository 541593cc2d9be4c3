//! The side-by-side harness (`simulations/anchors`) on the real control plane, with our controller
//! only: Karpenter's kwok provider is a Go build of its own (`scripts/anchors.sh`), run by the
//! documented `anchors` command, not by the test suite (docs/kwok.md).

use std::path::PathBuf;

use gpu_node_autoscaler_anchors::{measure, Options};

#[test]
fn the_harness_replays_the_smoke_scenario_with_our_controller_on_its_kwok_provider() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let work = std::env::temp_dir().join(format!("gna-e2e-anchors-{}", std::process::id()));
    let (reports, bins) = measure(&Options {
        scenarios: vec![root.join("simulations/anchors/smoke.yaml")],
        time_scale: 20.0,
        autoscalers: vec!["gpu-node-autoscaler".into()],
        ours_bin: Some(env!("CARGO_BIN_EXE_gpu-node-autoscaler").into()),
        work_dir: work.clone(),
        max_time: None,
    })
    .unwrap_or_else(|e| panic!("anchors: {e:#}"));
    assert!(reports[0].failed.is_empty(), "{:?}", reports[0].failed);
    let json = gpu_node_autoscaler_anchors::replay::to_json(&reports, &bins);
    let m = &json["scenarios"][0]["strategies"][0];
    assert_eq!(m["strategy"], "gpu-node-autoscaler", "{json:#}");
    assert_eq!(m["pods"], 6, "{json:#}");
    assert_eq!(m["pods_never_placed"], 0, "{json:#}");
    // The first pod waits for a node to boot (90 s of the scenario's time: kwok keeps a new Node
    // NotReady that long).
    assert!(m["wait_p99_s"].as_f64().unwrap() >= 80.0, "{json:#}");
    let nodes = m["nodes_launched"].as_u64().unwrap();
    assert!((2..=6).contains(&nodes), "{json:#}");
    assert!(m["cost_usd"].as_f64().unwrap() > 0.0, "{json:#}");
    assert!(
        m["cost_by_offering"]
            .as_object()
            .unwrap()
            .keys()
            .all(|k| k.starts_with("g5.")),
        "{json:#}"
    );
    let table = gpu_node_autoscaler_anchors::replay::to_table(&reports, &bins);
    assert!(table.contains("gpu-node-autoscaler"), "{table}");
    let _ = std::fs::remove_dir_all(work);
}
