use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};

use gpu_node_autoscaler::catalog;
use gpu_node_autoscaler::convert::load_cluster_file;
use gpu_node_autoscaler::model::{Snapshot, Time};
use gpu_node_autoscaler::plan::{self, output};
use gpu_node_autoscaler::policy::{self, Policy};
use gpu_node_autoscaler::provider::Catalog;

/// A Kubernetes node autoscaler for GPU node pools.
#[derive(Parser)]
#[command(name = "gpu-node-autoscaler", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Json,
    Table,
}

#[derive(Subcommand)]
enum Command {
    /// Plan scale-ups (and scale-downs) for a cluster snapshot, without touching anything.
    Plan {
        /// A Kubernetes List of Pods, Nodes and PodDisruptionBudgets, as
        /// `kubectl get pods,nodes,pdb -A -o yaml` prints it.
        #[arg(long)]
        cluster: PathBuf,
        /// The scaling policy (`policy.yaml`).
        #[arg(long)]
        policy: PathBuf,
        /// Instance catalog CSV; defaults to the built-in AWS us-east-1 GPU catalog.
        #[arg(long)]
        catalog: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
        /// Evaluate time-based rules at this instant (RFC 3339) instead of now.
        #[arg(long)]
        now: Option<String>,
    },
    /// Validate a scaling policy; print one line per pool, or every error found.
    CheckPolicy {
        file: PathBuf,
        /// Also check the pools' instance types against this catalog CSV (default: the built-in
        /// AWS catalog, for pools with `provider: aws`).
        #[arg(long)]
        catalog: Option<PathBuf>,
    },
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

fn load_policy(path: &Path) -> Result<Policy> {
    let text = read(path)?;
    policy::parse_policy(&text, &path.display().to_string()).map_err(anyhow::Error::new)
}

fn load_catalog(path: Option<&Path>, policy: &Policy) -> Result<Catalog> {
    let types = match path {
        Some(p) => catalog::parse_csv(&read(p)?, &p.display().to_string())?,
        None => catalog::parse_csv(catalog::BUILTIN_AWS, catalog::BUILTIN_AWS_NAME)?,
    };
    Ok(catalog::offerings_from_list_prices(policy, types))
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Plan {
            cluster,
            policy,
            catalog,
            format,
            now,
        } => {
            let policy = load_policy(&policy)?;
            let catalog = load_catalog(catalog.as_deref(), &policy)?;
            let loaded = load_cluster_file(&read(&cluster)?, &cluster.display().to_string())
                .map_err(anyhow::Error::msg)?;
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            let now = match now {
                Some(s) => Time::parse_rfc3339(&s).map_err(anyhow::Error::msg)?,
                None => Time(chrono::Utc::now().timestamp_millis()),
            };
            let plan = plan::plan(&loaded.snapshot, &catalog, &policy, now);
            match format {
                Format::Json => println!("{}", output::to_json(&plan)),
                Format::Table => print!("{}", output::to_table(&plan)),
            }
            if !plan.warnings.is_empty() {
                bail!("the policy does not match the catalog (see warnings above)");
            }
            Ok(())
        }
        Command::CheckPolicy { file, catalog } => {
            let policy = load_policy(&file)?;
            let explicit = catalog.is_some();
            let catalog = load_catalog(catalog.as_deref(), &policy)?;
            let mut checked = policy.clone();
            if !explicit {
                checked.pools.retain(|p| p.provider == "aws");
            }
            let (_, errors) =
                plan::build_templates(&checked, &catalog, &Snapshot::default(), Time::EPOCH);
            if !errors.is_empty() {
                for e in &errors {
                    eprintln!("{}: {e}", file.display());
                }
                bail!("{} error(s) in {}", errors.len(), file.display());
            }
            for line in policy::summary(&policy) {
                println!("{line}");
            }
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
