use serde_json::Value;

use crate::{run, stderr, stdout, temp_file};

fn json(args: &[&str]) -> Value {
    let o = run(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    serde_json::from_str(&stdout(&o)).expect("JSON report")
}

#[test]
fn simulate_without_arguments_runs_the_builtin_scenario() {
    let o = run(&["simulate"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = stdout(&o);
    assert!(t.contains("Scenario: arena-mpi-training"), "{t}");
    assert!(t.contains("gpu-node-autoscaler"));
    assert!(t.contains("total cost (USD)"));
}

#[test]
fn compare_reports_every_strategy_with_the_documented_fields() {
    let v = json(&["simulate", "--compare", "--format", "json"]);
    let s = v["strategies"].as_array().unwrap();
    let names: Vec<&str> = s.iter().map(|m| m["strategy"].as_str().unwrap()).collect();
    assert_eq!(names, ["gpu-node-autoscaler", "ca-like", "karpenter-like"]);
    for m in s {
        for f in [
            "span_s",
            "cost_usd",
            "lower_bound_usd",
            "cost_over_lower_bound",
            "gpu_hours_provisioned",
            "gpu_hours_requested",
            "gpu_allocation_ratio",
            "pods_total",
            "pods_never_placed",
            "wait_p50_s",
            "wait_p95_s",
            "wait_p99_s",
            "scale_ups",
            "nodes_launched",
            "nodes_removed",
            "evictions",
            "spot_interruptions",
            "gpu_failures",
            "lost_gpu_hours",
            "disrupted_gpus",
            "recovery_s_per_gpu",
            "idle_gpu_hours_booting",
            "idle_gpu_hours_empty",
            "idle_gpu_hours_fragmented",
            "cost_by_offering",
            "wall_s",
        ] {
            assert!(m.get(f).is_some(), "{f} missing");
        }
        // Where the money goes adds up to the total...
        let f = |k: &str| m[k].as_f64().unwrap();
        let lines = m["cost_by_offering"].as_array().unwrap();
        assert!(!lines.is_empty());
        let billed: f64 = lines.iter().map(|l| l["cost_usd"].as_f64().unwrap()).sum();
        assert!(
            (billed - f("cost_usd")).abs() < 1e-6 * f("cost_usd"),
            "{billed} {m}"
        );
        let gpu_hours: f64 = lines.iter().map(|l| l["gpu_hours"].as_f64().unwrap()).sum();
        assert!(
            (gpu_hours - f("gpu_hours_provisioned")).abs() < 1e-6 * gpu_hours,
            "{m}"
        );
        // ...and so do the idle GPU-hours, split three ways.
        let idle = f("gpu_hours_provisioned") - f("gpu_hours_requested");
        let parts = f("idle_gpu_hours_booting") + f("idle_gpu_hours_empty");
        assert!(
            f("idle_gpu_hours_booting") > 0.0 && parts <= idle + 1e-6,
            "{m}"
        );
        assert!(
            (parts + f("idle_gpu_hours_fragmented") - idle).abs() < 1e-6 * idle.max(1.0),
            "{m}"
        );
        assert!(m["cost_usd"].as_f64().unwrap() >= m["lower_bound_usd"].as_f64().unwrap());
        assert_eq!(m["pods_never_placed"], 0);
    }
    // Same input, same numbers.
    let again = json(&["simulate", "--compare", "--format", "json"]);
    for (a, b) in s.iter().zip(again["strategies"].as_array().unwrap()) {
        assert_eq!(a["cost_usd"], b["cost_usd"]);
        assert_eq!(a["wait_p95_s"], b["wait_p95_s"]);
    }
}

#[test]
fn every_shipped_scenario_runs_and_ours_places_every_pod() {
    for f in std::fs::read_dir(crate::root().join("simulations/scenarios")).unwrap() {
        let p = f.unwrap().path();
        let v = json(&["simulate", p.to_str().unwrap(), "--format", "json"]);
        let m = &v["strategies"][0];
        assert_eq!(m["pods_never_placed"], 0, "{}", p.display());
        assert!(m["nodes_launched"].as_u64().unwrap() > 0);
    }
}

#[test]
fn a_spot_shortage_falls_back_and_interrupted_pods_run_again() {
    let v = json(&[
        "simulate",
        "simulations/scenarios/spot-shortage.yaml",
        "--format",
        "json",
    ]);
    let m = &v["strategies"][0];
    assert!(m["spot_interruptions"].as_u64().unwrap() > 0);
    assert_eq!(m["pods_never_placed"], 0);
    // Falling back instead of waiting for the shortage to end (ca-like's pods wait ~1,400 s):
    // most pods wait about one boot. A single pod that takes the first node of a gang's launch
    // (the scheduler binds first-fit as nodes register, not as planned) leaves the gang its spare
    // node, or the gang's missing node is launched when its first node registers.
    assert!(m["wait_p95_s"].as_f64().unwrap() < 300.0, "{m}");
    assert!(m["wait_p99_s"].as_f64().unwrap() < 900.0, "{m}");
    // Interrupted pods were moved on their notice: their work stopped for less than a boot
    // each on average.
    assert!(m["lost_gpu_hours"].as_f64().unwrap() > 0.0, "{m}");
}

#[test]
fn broken_gpus_are_replaced_sooner_with_dcgm_metrics_and_never_by_the_cluster_autoscaler() {
    let v = json(&[
        "simulate",
        "simulations/scenarios/gpu-failures.yaml",
        "--compare",
        "--format",
        "json",
    ]);
    let s = v["strategies"].as_array().unwrap();
    // Failures hit different nodes in each strategy's fleet: compare how long a disrupted GPU's
    // work stood still on average.
    let recovery = |i: usize| s[i]["recovery_s_per_gpu"].as_f64().unwrap();
    for m in s {
        assert!(m["gpu_failures"].as_u64().unwrap() > 0, "{m}");
        assert_eq!(m["pods_never_placed"], 0, "{m}");
        assert!(m["lost_gpu_hours"].as_f64().unwrap() > 0.0, "{m}");
    }
    // Ours acts on the XID after 2 minutes, Karpenter's node repair on the node condition after
    // 10; the Cluster Autoscaler leaves the pods on the broken GPUs, making no progress, to the
    // end of the run.
    assert!(recovery(0) < 600.0, "ours {}", recovery(0));
    assert!(
        recovery(0) < recovery(2),
        "ours {} karpenter-like {}",
        recovery(0),
        recovery(2)
    );
    assert!(
        recovery(2) < recovery(1),
        "karpenter-like {} ca-like {}",
        recovery(2),
        recovery(1)
    );
    // Every replaced node's pods were moved by a drain.
    assert!(s[0]["evictions"].as_u64().unwrap() >= s[0]["gpu_failures"].as_u64().unwrap());
}

#[test]
fn waiting_for_spot_buys_less_on_demand_in_a_shortage_and_still_places_every_pod() {
    let text =
        std::fs::read_to_string(crate::root().join("simulations/scenarios/spot-shortage.yaml"))
            .unwrap();
    let waiting = text.replacen(
        "      maxNodes: 60\n",
        "      maxNodes: 60\n      spotMaxWait: 20m\n",
        1,
    );
    assert_ne!(waiting, text);
    let f = temp_file("spot-shortage-wait.yaml", &waiting);
    let cost = |v: &Value| v["strategies"][0]["cost_usd"].as_f64().unwrap();
    let before = json(&[
        "simulate",
        "simulations/scenarios/spot-shortage.yaml",
        "--format",
        "json",
    ]);
    let after = json(&["simulate", f.to_str().unwrap(), "--format", "json"]);
    let m = &after["strategies"][0];
    assert_eq!(m["pods_never_placed"], 0, "{m}");
    // On-demand only for pods that waited 20 minutes: less on-demand, cheaper, and slower at the
    // tail.
    let on_demand = |v: &Value| -> f64 {
        v["strategies"][0]["cost_by_offering"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["capacity_type"] == "on-demand")
            .map(|o| o["cost_usd"].as_f64().unwrap())
            .sum()
    };
    assert!(
        on_demand(&after) < 0.75 * on_demand(&before),
        "on-demand {} vs {}",
        on_demand(&after),
        on_demand(&before)
    );
    assert!(
        cost(&after) < cost(&before),
        "{} vs {}",
        cost(&after),
        cost(&before)
    );
    assert!(
        m["wait_p99_s"].as_f64().unwrap() > before["strategies"][0]["wait_p99_s"].as_f64().unwrap()
    );
}

#[test]
fn spot_short_in_one_zone_moves_launches_to_another_zones_spot() {
    // Spot is short in us-east-1a for two hours; serving pods and 2 × 4-GPU gangs planned there
    // must go to another zone's spot, not to on-demand (~2.5 × spot) in us-east-1a. Buying
    // on-demand there cost 2.27 × the lower bound; moving costs 1.12 ×.
    let v = json(&[
        "simulate",
        "simulations/scenarios/spot-short-one-zone.yaml",
        "--format",
        "json",
    ]);
    let m = &v["strategies"][0];
    assert_eq!(m["pods_never_placed"], 0);
    assert!(m["cost_over_lower_bound"].as_f64().unwrap() < 1.3, "{m}");
}

#[test]
fn traces_replay_with_the_builtin_policy() {
    let trace = temp_file(
        "trace.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
         p0,8000,16384,1,1000,,LS,Running,0,3600,0\n\
         p1,4000,8192,1,300,,LS,Running,60,1800,60\n\
         p2,4000,8192,1,300,T4,LS,Running,60,1800,60\n\
         p3,32000,65536,4,1000,V100M16|V100M32,LS,Running,120,7200,300\n\
         p4,1000,1024,0,0,,BE,Running,0,100,0\n\
         p5,1000,1024,1,1000,,LS,Pending,0,,\n",
    );
    let v = json(&[
        "simulate",
        "--trace",
        trace.to_str().unwrap(),
        "--compare",
        "--format",
        "json",
    ]);
    for m in v["strategies"].as_array().unwrap() {
        assert_eq!(m["pods_total"], 4, "{m}");
        assert_eq!(m["pods_never_placed"], 0, "{m}");
        assert_eq!(m["skipped"].as_array().unwrap().len(), 2);
    }
}

#[test]
fn bad_simulation_input_is_a_clear_error() {
    let t = temp_file(
        "bad.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\np0,8000,16384,1,1000,B200,LS,Running,0,3600,0\n",
    );
    let o = run(&["simulate", "--trace", t.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("bad.csv:2: field `gpu_spec`: GPU model \"B200\" is not mapped"),
        "{err}"
    );

    let s = temp_file(
        "bad.yaml",
        "name: x\npolicy:\n  zones: [a]\n  pools: []\njobs: []\n",
    );
    let o = run(&["simulate", s.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("bad.yaml:4:3: policy.pools: at least one pool is required"),
        "{}",
        stderr(&o)
    );

    let o = run(&["simulate", "--strategy", "magic"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("unknown strategy \"magic\""));
}

#[test]
fn no_second_scale_up_while_the_device_plugin_starts() {
    // A slow device plugin: the node is Ready but advertises no GPUs. We and Karpenter count it
    // at its full capacity. The Cluster Autoscaler counts a node with the cloud's GPU label and
    // no GPU as not started, and so as upcoming, for 15 minutes after its creation; past that it
    // is unready and the same pod triggers another scale-up.
    let launched = |delay: &str| {
        let s = temp_file(
            &format!("slow-plugin-{delay}.yaml"),
            &format!("name: slow-plugin\ntiming: {{devicePluginDelay: {delay}}}\npolicy:\n  zones: [us-east-1a]\n  pools:\n    - {{name: a100, instanceTypes: [p4d.24xlarge], maxNodes: 5}}\njobs:\n  - name: train\n    arrival: 0s\n    duration: 1h\n    pods:\n      - {{name: w, requests: {{cpu: \"8\", memory: 64Gi, nvidia.com/gpu: 8}}}}\n"),
        );
        let v = json(&[
            "simulate",
            s.to_str().unwrap(),
            "--compare",
            "--format",
            "json",
        ]);
        (0..3)
            .map(|i| v["strategies"][i]["nodes_launched"].as_u64().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(launched("10m"), [1, 1, 1]);
    let slow = launched("20m");
    assert_eq!((slow[0], slow[2]), (1, 1), "{slow:?}");
    assert!(
        slow[1] > 1,
        "ca-like scales up again past 15 minutes: {slow:?}"
    );
}

#[test]
fn plots_are_written_as_svg_and_png() {
    let dir = std::env::temp_dir().join(format!("gna-it-plots-{}", std::process::id()));
    let o = run(&["simulate", "--compare", "--plot", dir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    for f in ["gpus", "pending", "cost"] {
        let svg = std::fs::read_to_string(dir.join(format!("{f}.svg"))).unwrap();
        assert!(svg.contains("karpenter-like"), "{f}.svg");
        let png = std::fs::read(dir.join(format!("{f}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    }
}

#[test]
fn generated_scenarios_written_out_replay_to_the_bench_figures() {
    // `--write-scenario` writes the scenario file `--generate` runs; replayed as a file it gives
    // the figures the bench gives for its seed.
    let out = temp_file("generated-2005.yaml", "");
    let o = run(&[
        "simulate",
        "--generate",
        "2005",
        "--write-scenario",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("name: generated-2005"), "{text}");
    let o = run(&["simulate", "--generate", "2005", "--write-scenario", "-"]);
    assert_eq!(stdout(&o), text);

    let file = json(&[
        "simulate",
        out.to_str().unwrap(),
        "--compare",
        "--format",
        "json",
    ]);
    let bench = json(&[
        "simulate",
        "--generate-bench",
        "1",
        "--first-seed",
        "2005",
        "--format",
        "json",
    ]);
    let from_file = file["strategies"].as_array().unwrap();
    let from_bench = bench["scenarios"][0]["runs"].as_array().unwrap();
    assert_eq!(bench["scenarios"][0]["seed"], 2005);
    assert_eq!(from_file.len(), 3);
    for (a, b) in from_file.iter().zip(from_bench) {
        for f in [
            "strategy",
            "scenario",
            "cost_usd",
            "wait_p95_s",
            "pods_total",
            "pods_never_placed",
            "nodes_launched",
            "cost_by_offering",
        ] {
            assert_eq!(a[f], b[f], "{f}");
        }
    }
    let summary = bench["summary"].as_array().unwrap();
    let names: Vec<&str> = summary
        .iter()
        .map(|s| s["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gpu-node-autoscaler", "ca-like", "karpenter-like"]);
    for s in summary {
        for f in [
            "wins",
            "compared",
            "win_rate",
            "mean_relative_cost",
            "worst_relative_cost",
            "mean_wait_p95_s",
            "wait_p95_within_5_percent",
        ] {
            assert!(s.get(f).is_some(), "{f} missing: {s}");
        }
    }
}
