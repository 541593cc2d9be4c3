//! `anchors`: see the library (`gpu_node_autoscaler_anchors`) and docs/kwok.md.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;

use gpu_node_autoscaler_anchors::{measure, replay, Options, AUTOSCALERS};

#[derive(Parser)]
#[command(
    name = "anchors",
    about = "Runs gpu-node-autoscaler, Karpenter and the Cluster Autoscaler on one workload, each on a fresh real control plane, and measures them alike"
)]
struct Args {
    /// Scenario files (the YAML that `simulate` reads).
    #[arg(required_unless_present = "table_from")]
    scenarios: Vec<PathBuf>,
    /// Every duration is divided by this.
    #[arg(long, default_value_t = 20.0)]
    time_scale: f64,
    /// Which autoscalers, comma-separated (default: all three).
    #[arg(long, value_delimiter = ',', default_values_t = AUTOSCALERS.map(String::from))]
    autoscalers: Vec<String>,
    /// `table` or `json` (the shape of `simulate --format json`).
    #[arg(long, default_value = "table")]
    format: String,
    /// The `gpu-node-autoscaler` binary (built with `--features controller`).
    #[arg(long)]
    ours_bin: Option<PathBuf>,
    /// Where the clusters' directories and the autoscalers' logs go (kept).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Stop a run after this long of the scenario's time even if pods remain.
    #[arg(long, value_parser = parse_dur)]
    max_time: Option<Duration>,
    /// `model`: replay the replicas of the simulator's HPA model; `real`: scale the scenario's
    /// services with the real HPA chain (kube-controller-manager's HPA, Prometheus,
    /// prometheus-adapter, a dcgm-exporter stand-in driven by the services' load).
    #[arg(long, default_value = "model")]
    hpa: String,
    /// Runs per autoscaler and scenario, one cluster at a time, the autoscalers taking turns;
    /// the JSON gives each figure's mean, least and most, and every run.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Print the Markdown table of earlier `--format json` outputs and exit: one file, or the
    /// files of a round run a scenario or a repetition at a time (a scenario several hold gets
    /// all their runs; the files must come from the same builds).
    #[arg(long, num_args = 1.., conflicts_with = "scenarios")]
    table_from: Vec<PathBuf>,
}

fn parse_dur(s: &str) -> Result<Duration, String> {
    gpu_node_autoscaler_core::policy::duration::parse_duration(s).map_err(|e| e.to_string())
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("anchors: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    if !args.table_from.is_empty() {
        let mut files = Vec::new();
        for f in &args.table_from {
            let text =
                std::fs::read_to_string(f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
            let json: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| anyhow::anyhow!("{}: not JSON: {e}", f.display()))?;
            files.push((f.display().to_string(), json));
        }
        print!("{}", replay::markdown(&replay::merge(&files)?)?);
        return Ok(());
    }
    if !matches!(args.format.as_str(), "table" | "json") {
        bail!("--format: expected table or json, got {:?}", args.format);
    }
    let real_hpa = match args.hpa.as_str() {
        "model" => false,
        "real" => true,
        other => bail!("--hpa: expected model or real, got {other:?}"),
    };
    let options = Options {
        real_hpa,
        repeat: args.repeat,
        scenarios: args.scenarios,
        time_scale: args.time_scale,
        autoscalers: args.autoscalers,
        ours_bin: args.ours_bin,
        work_dir: args.work_dir.unwrap_or_else(|| {
            std::env::temp_dir().join(format!("gna-anchors-{}", std::process::id()))
        }),
        max_time: args.max_time,
    };
    let (reports, bins) = measure(&options)?;
    if args.format == "json" {
        println!(
            "{}",
            serde_json::to_string_pretty(&replay::to_json(&reports, &bins))?
        );
    } else {
        print!("{}", replay::to_table(&reports, &bins));
    }
    let failed = reports.iter().map(|r| r.failed.len()).sum::<usize>();
    if failed > 0 {
        bail!("{failed} run(s) failed (listed above)");
    }
    Ok(())
}
