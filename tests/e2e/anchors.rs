//! The side-by-side harness (`simulations/anchors`) on the real control plane: its smoke scenario
//! at 20×, once with our controller (its kwok provider, the RBAC of `deploy/overlays/kwok`) and once
//! with Karpenter's kwok provider, which `scripts/test.sh` builds pinned (`scripts/anchors.sh
//! karpenter`). The Cluster Autoscaler is not in it: the Go module proxy refuses its releases, so it
//! is built only from a clone of its repository, by the documented `anchors` command
//! (docs/kwok.md). A Karpenter that is not built fails the test with the command that builds it.

use std::path::PathBuf;

use gpu_node_autoscaler_anchors::{measure, Options};

#[test]
fn the_harness_replays_the_smoke_scenario_with_our_controller_and_karpenter() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let work = std::env::temp_dir().join(format!("gna-e2e-anchors-{}", std::process::id()));
    let (reports, bins) = measure(&Options {
        scenarios: vec![root.join("simulations/anchors/smoke.yaml")],
        time_scale: 20.0,
        autoscalers: vec!["gpu-node-autoscaler".into(), "karpenter".into()],
        ours_bin: Some(env!("CARGO_BIN_EXE_gpu-node-autoscaler").into()),
        work_dir: work.clone(),
        max_time: None,
        real_hpa: false,
        repeat: 1,
    })
    .unwrap_or_else(|e| panic!("anchors: {e:#}"));
    assert!(reports[0].failed.is_empty(), "{:?}", reports[0].failed);
    // kwok keeps every new Node NotReady for the scenario's boot and device-plugin delay.
    assert_eq!(reports[0].boot_s, 90.0);
    let json = gpu_node_autoscaler_anchors::replay::to_json(&reports, &bins);
    let strategies = json["scenarios"][0]["strategies"].as_array().unwrap();
    let names: Vec<&str> = strategies
        .iter()
        .map(|m| m["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gpu-node-autoscaler", "karpenter"], "{json:#}");
    assert_eq!(json["versions"]["karpenter"], "v1.14.1", "{json:#}");
    for m in strategies {
        assert_eq!(m["pods"], 6, "{json:#}");
        assert_eq!(m["pods_never_placed"], 0, "{json:#}");
        // How alone the run was: the machine's load average, sampled while it ran.
        assert!(
            m["load_avg_max"].as_f64().is_some_and(|l| l > 0.0),
            "{json:#}"
        );
        // Every pod waits for a node to boot (90 s of the scenario's time).
        assert!(m["wait_p50_s"].as_f64().unwrap() >= 80.0, "{json:#}");
        // The gang's two 4-GPU workers need two nodes; we launch one node per pod and at most
        // one more: kube-scheduler clears a pending pod's nomination whenever it tries the pod
        // and finds no node (a booting Node's arrival or update is such a time), and a one-GPU
        // fine-tune whose own node is not Ready yet can take a gang worker's node in the moment
        // before our next pass nominates the worker again (7 nodes in each of two runs on
        // 2026-11-26 once Nodes turned Ready at their boot time after creation; 6 before).
        // Karpenter may replace nodes as it consolidates.
        let nodes = m["nodes_launched"].as_u64().unwrap();
        let most = if m["strategy"] == "karpenter" { 12 } else { 7 };
        assert!((2..=most).contains(&nodes), "{json:#}");
        // Some cost, and less than eight g5.12xlarge on-demand ($5.672/h) for the 20 minutes.
        let cost = m["cost_usd"].as_f64().unwrap();
        assert!(cost > 0.1 && cost < 8.0 * 5.672 / 3.0, "{json:#}");
        assert!(
            m["unpriced_nodes"].as_array().unwrap().is_empty(),
            "{json:#}"
        );
        // The five longest waits, longest first, the first no shorter than the p95, each with
        // the Node its pod ran on.
        let longest = m["longest_waits"].as_array().unwrap();
        assert_eq!(longest.len(), 5, "{json:#}");
        let w: Vec<f64> = longest
            .iter()
            .map(|x| x["wait_s"].as_f64().unwrap())
            .collect();
        assert!(w.windows(2).all(|p| p[0] >= p[1]), "{json:#}");
        assert!(w[0] >= m["wait_p95_s"].as_f64().unwrap(), "{json:#}");
        assert!(
            longest.iter().all(|x| x["node"].as_str().unwrap() != ""),
            "{json:#}"
        );
        assert!(
            m["cost_by_offering"]
                .as_object()
                .unwrap()
                .keys()
                .all(|k| k.starts_with("g5.")),
            "{json:#}"
        );
    }
    let table = gpu_node_autoscaler_anchors::replay::to_table(&reports, &bins);
    assert!(
        table.contains("gpu-node-autoscaler") && table.contains("karpenter"),
        "{table}"
    );
    let _ = std::fs::remove_dir_all(work);
}

/// `anchors --hpa real` on its HPA smoke at 20x, our controller only: the service's replicas come
/// from kube-controller-manager's HPA on the pods' GPU utilisation (the dcgm-exporter stand-in
/// driven by the scenario's load, the real Prometheus, the real prometheus-adapter), not from the
/// simulator's model; every replica it makes while the load is high runs on a node we launched.
#[test]
fn anchors_hpa_real_chain_scales_the_service_and_every_replica_gets_a_node() {
    let (json, table, work) = ours_at_20x("smoke-hpa.yaml", "hpa", true);
    let scenario = &json["scenarios"][0];
    assert_eq!(scenario["hpa"], "real", "{json:#}");
    let m = &scenario["strategies"][0];
    // One replica at 0.3 GPUs' worth (30 % against the 50 % target); at two GPUs' worth the HPA
    // wants four, so it makes at least three more.
    let made = m["hpa_replicas"].as_u64().unwrap();
    assert!(made >= 4, "{json:#}");
    assert_eq!(m["pods"], made, "{json:#}");
    assert!(m["hpa_peak_replicas"].as_u64().unwrap() >= 4, "{json:#}");
    assert!(m["hpa_replica_hours"].as_f64().unwrap() > 0.0, "{json:#}");
    // The model's replicas of the same service, for comparison.
    assert!(
        scenario["hpa_model"]["peak_replicas"].as_u64().unwrap() >= 4,
        "{json:#}"
    );
    assert_eq!(m["pods_never_placed"], 0, "{json:#}");
    // A g5.xlarge (one GPU) per replica running at once: at least four, at most the pool's 8.
    let nodes = m["nodes_launched"].as_u64().unwrap();
    assert!((4..=8).contains(&nodes), "{json:#}");
    assert!(
        m["wait_p50_s"].as_f64().unwrap() >= 0.0 && m["cost_usd"].as_f64().unwrap() > 0.0,
        "{json:#}"
    );
    // Less than eight g5.xlarge on-demand ($1.006/h) for the whole run (under an hour).
    assert!(m["cost_usd"].as_f64().unwrap() < 8.0 * 1.006, "{json:#}");
    assert!(table.contains("services scaled by the real HPA"), "{table}");
    let _ = std::fs::remove_dir_all(work);
}

/// `anchors` on its volume smoke at 20x, our controller only: the scenario's StorageClasses,
/// static PersistentVolume and claims are created on the real cluster, the provisioner stand-in
/// makes the `WaitForFirstConsumer` claims' volumes where kube-scheduler puts their pods, and
/// every pod runs in its volume's zone.
#[test]
fn anchors_volume_smoke_creates_the_claims_provisions_them_and_every_pod_runs_in_its_volumes_zone()
{
    let (json, _, work) = ours_at_20x("smoke-volumes.yaml", "volume", false);
    let m = &json["scenarios"][0]["strategies"][0];
    assert_eq!(m["pods"], 3, "{json:#}");
    assert_eq!(m["pods_never_placed"], 0, "{json:#}");
    // The two replicas' volumes, made in the one zone their class allows.
    assert_eq!(
        m["volumes_by_zone"],
        serde_json::json!({"us-east-1b": 2}),
        "{json:#}"
    );
    // The replicas ran there, the fine-tune in its static volume's zone.
    assert_eq!(
        m["volume_pods_by_zone"],
        serde_json::json!({"us-east-1b": 2, "us-east-1c": 1}),
        "{json:#}"
    );
    // A node per pod at most (one GPU each). Said with our controller's decisions, so that a
    // launch too many shows what the plan saw.
    assert!(
        m["nodes_launched"].as_u64().unwrap() <= 3,
        "{json:#}\n{}",
        decisions(&work)
    );
    let _ = std::fs::remove_dir_all(work);
}

/// The lines of our controller's logs under `work` that tell its decisions (launches,
/// nominations, scale-ups not triggered, refusals, removals), without colour codes.
fn decisions(work: &std::path::Path) -> String {
    let mut out = String::new();
    for dir in std::fs::read_dir(work).into_iter().flatten().flatten() {
        let log = dir.path().join("gpu-node-autoscaler.log");
        let Ok(text) = std::fs::read_to_string(&log) else {
            continue;
        };
        out.push_str(&format!("--- {}\n", log.display()));
        for line in text.lines() {
            let plain: String = strip_ansi(line);
            if [
                "launch",
                "Nominated",
                "ScaleUp",
                "refused",
                "terminat",
                "drain",
                "unneeded",
            ]
            .iter()
            .any(|k| plain.contains(k))
            {
                out.push_str(&plain);
                out.push('\n');
            }
        }
    }
    out
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // An escape sequence: up to its final letter.
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `anchors` on `simulations/anchors/<scenario>` at 20x with our controller only (`--hpa real`
/// with `real_hpa`): the run's JSON and table, and its work directory (`tag` in its name).
fn ours_at_20x(scenario: &str, tag: &str, real_hpa: bool) -> (serde_json::Value, String, PathBuf) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let work = std::env::temp_dir().join(format!("gna-e2e-anchors-{tag}-{}", std::process::id()));
    let (reports, bins) = measure(&Options {
        scenarios: vec![root.join("simulations/anchors").join(scenario)],
        time_scale: 20.0,
        autoscalers: vec!["gpu-node-autoscaler".into()],
        ours_bin: Some(env!("CARGO_BIN_EXE_gpu-node-autoscaler").into()),
        work_dir: work.clone(),
        max_time: None,
        real_hpa,
        repeat: 1,
    })
    .unwrap_or_else(|e| panic!("anchors: {e:#}"));
    assert!(reports[0].failed.is_empty(), "{:?}", reports[0].failed);
    let json = gpu_node_autoscaler_anchors::replay::to_json(&reports, &bins);
    let table = gpu_node_autoscaler_anchors::replay::to_table(&reports, &bins);
    (json, table, work)
}
