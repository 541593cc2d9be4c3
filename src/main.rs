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

/// The simulator's replays allocate and free small strings and vectors on each of hundreds of
/// thousands of passes; mimalloc takes about a fifth less CPU time than the system allocator for
/// it (docs/benchmarks.md). Builds without the simulator (the container image) keep the system
/// allocator.
#[cfg(feature = "simulator")]
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What this build can do beyond `plan` and `check-policy`, and how to get the rest.
fn built_with() -> String {
    let parts = [
        if cfg!(feature = "simulator") {
            "simulate"
        } else {
            "no simulate (build with --features simulator)"
        },
        if cfg!(feature = "controller") {
            "run and AWS"
        } else {
            "no run (build with --features controller)"
        },
        if cfg!(feature = "alibaba") {
            "Alibaba Cloud"
        } else {
            "no Alibaba Cloud (build with --features alibaba)"
        },
    ];
    format!("Built with: {}.", parts.join(", "))
}

/// A Kubernetes node autoscaler for GPU node pools.
#[derive(Parser)]
#[command(name = "gpu-node-autoscaler", version, about, after_help = built_with())]
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
        /// `kubectl get pods,nodes,pdb,pvc,pv,storageclass,csinode,namespaces -A -o yaml` prints it.
        #[arg(long)]
        cluster: PathBuf,
        /// The scaling policy (`policy.yaml`).
        #[arg(long)]
        policy: PathBuf,
        /// Instance catalog CSV; defaults to the built-in catalog of the policy's region (us-east-1
        /// for a region without one, with a warning).
        #[arg(long)]
        catalog: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "table")]
        format: Format,
        /// Evaluate time-based rules at this instant (RFC 3339) instead of now.
        #[arg(long)]
        now: Option<String>,
        /// The account's capacity reservations, as a provider reports them (YAML or JSON list:
        /// id, kind `default` or `capacity-block`, instanceType, zone, total, available, and
        /// startMs / endMs in ms since the epoch, tags); pools with `reserved` plan them first.
        #[arg(long)]
        reservations: Option<PathBuf>,
    },
    /// Replay a scenario or a GPU cluster trace on a virtual clock and report cost and waiting.
    /// Without a scenario or --trace, runs the built-in scenario (arena-style MPI training).
    #[cfg(feature = "simulator")]
    Simulate(SimArgs),
    /// Run the autoscaler against the cluster (in-cluster service account or KUBECONFIG):
    /// watch pending GPU pods and nodes, launch and drain, with leader election.
    #[cfg(feature = "controller")]
    Run(Box<gpu_node_autoscaler::controller::RunArgs>),
    /// Validate a scaling policy; print one line per pool, or every error found.
    CheckPolicy {
        file: PathBuf,
        /// Also check the pools' instance types against this catalog CSV (default: the built-in
        /// AWS catalog, for pools with `provider: aws`).
        #[arg(long)]
        catalog: Option<PathBuf>,
        /// Also check the pools of this provider against its account before any launch
        /// (`aws`: instance types offered in each zone, subnets, launch templates; `alibaba`:
        /// scaling groups and their vSwitches, instance types offered in each zone; both need
        /// credentials from their default chain).
        #[arg(long, value_parser = ["aws", "alibaba"])]
        provider: Option<String>,
        /// Region for --provider aws (default: the policy's `region`).
        #[arg(long)]
        aws_region: Option<String>,
        /// Another EC2 endpoint for --provider aws, e.g. an emulator's URL.
        #[arg(long)]
        aws_endpoint_url: Option<String>,
        /// Another ESS/ECS/VPC endpoint for --provider alibaba (region: the policy's `region`).
        #[arg(long)]
        alibaba_endpoint_url: Option<String>,
    },
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

fn load_policy(path: &Path) -> Result<Policy> {
    let text = read(path)?;
    let providers = gpu_node_autoscaler::provider_policies();
    policy::parse_policy_with(&text, &path.display().to_string(), &providers)
        .map_err(anyhow::Error::new)
}

/// The catalog `path`, else the built-in one for the policy's region (a warning on stderr when
/// that region has none and another region's prices are used).
fn load_catalog(path: Option<&Path>, policy: &Policy) -> Result<Catalog> {
    let text = path.map(read).transpose()?;
    let name = path.map(|p| p.display().to_string());
    let file = name.as_deref().zip(text.as_deref());
    let (types, warning) = catalog::load(file, policy.region.as_deref())?;
    if let Some(w) = warning {
        eprintln!("warning: {w}");
    }
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
            reservations,
        } => {
            let policy = load_policy(&policy)?;
            let catalog = load_catalog(catalog.as_deref(), &policy)?;
            let mut loaded = load_cluster_file(&read(&cluster)?, &cluster.display().to_string())
                .map_err(anyhow::Error::msg)?;
            if let Some(path) = reservations {
                loaded.snapshot.reservations = gpu_node_autoscaler::convert::load_reservations(
                    &read(&path)?,
                    &path.display().to_string(),
                )
                .map_err(anyhow::Error::msg)?;
            }
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            let now = match now {
                Some(s) => Time::parse_rfc3339(&s).map_err(anyhow::Error::msg)?,
                None => Time(chrono::Utc::now().timestamp_millis()),
            };
            let plan = plan::plan_adopting(&loaded.snapshot, &catalog, &policy, now);
            match format {
                Format::Json => println!("{}", output::to_json(&plan)),
                Format::Table => print!("{}", output::to_table(&plan)),
            }
            if !plan.warnings.is_empty() {
                bail!("the policy does not match the catalog (see warnings above)");
            }
            Ok(())
        }
        #[cfg(feature = "simulator")]
        Command::Simulate(args) => simulate(args),
        #[cfg(feature = "controller")]
        Command::Run(args) => gpu_node_autoscaler::controller::run(*args),
        Command::CheckPolicy {
            file,
            catalog,
            provider,
            aws_region,
            aws_endpoint_url,
            alibaba_endpoint_url,
        } => {
            let policy = load_policy(&file)?;
            for w in policy.warnings() {
                eprintln!("warning: {}: {w}", file.display());
            }
            let explicit = catalog.is_some();
            let catalog = load_catalog(catalog.as_deref(), &policy)?;
            let mig = plan::templates::check_mig_layouts(&policy, &catalog);
            if !mig.is_empty() {
                let n = mig.len();
                eprintln!(
                    "{}",
                    policy::PolicyErrors {
                        file: file.display().to_string(),
                        errors: mig,
                    }
                );
                bail!("{n} error(s) in {}", file.display());
            }
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
            if let Some(name) = provider.as_deref() {
                // The command line's flags of each provider.
                let (region, endpoint) = match name {
                    "aws" => (aws_region, aws_endpoint_url),
                    "alibaba" => (None, alibaba_endpoint_url),
                    _ => (None, None),
                };
                check_account(name, &policy, &catalog, &file, region, endpoint)?;
            }
            for line in policy::summary(&policy) {
                println!("{line}");
            }
            Ok(())
        }
    }
}

/// `check-policy --provider NAME`: the pools of `policy` that name the provider, checked against
/// its cloud account through the controller's registry.
#[cfg(feature = "controller")]
fn check_account(
    name: &str,
    policy: &Policy,
    catalog: &Catalog,
    file: &Path,
    region: Option<String>,
    endpoint: Option<String>,
) -> Result<()> {
    use gpu_node_autoscaler::controller::providers;
    use gpu_node_autoscaler::provider::spec::CheckFailed;
    let report = |what: &str, lines: &[String]| {
        for l in lines {
            eprintln!("{}: {l}", file.display());
        }
        anyhow::anyhow!("{} {what} {}", lines.len(), file.display())
    };
    match providers::check_against_account(name, policy, catalog, region, endpoint) {
        Ok(mut found) => {
            // Each Auto Scaling group a pool scales, with its template.
            for l in &found.found {
                println!("{l}");
            }
            // The reservations the pools select, as the account has them now.
            let (lines, problems) = policy::reservation_report(policy, name, &found.reservations);
            for l in lines {
                println!("{l}");
            }
            found.problems.extend(problems);
            if found.problems.is_empty() {
                Ok(())
            } else {
                Err(report(
                    &format!("problem(s) with the {} account for", found.account),
                    &found.problems,
                ))
            }
        }
        Err(CheckFailed::Spec(errors)) => Err(report("error(s) in", &errors)),
        Err(CheckFailed::Cloud(e)) => Err(anyhow::Error::msg(e)),
    }
}

#[cfg(not(feature = "controller"))]
fn check_account(
    name: &str,
    _: &Policy,
    _: &Catalog,
    _: &Path,
    _: Option<String>,
    _: Option<String>,
) -> Result<()> {
    bail!("this build has no {name} support (built without the `{name}` feature)")
}

#[cfg(feature = "simulator")]
#[derive(clap::Args)]
struct SimArgs {
    /// A scenario YAML file (see simulations/scenarios/).
    scenario: Option<PathBuf>,
    /// An Alibaba GPU trace CSV (openb_pod_list_*.csv) instead of a scenario.
    #[arg(long, conflicts_with = "scenario")]
    trace: Option<PathBuf>,
    /// Replay the scenario generated from this seed (a random mix of services, gangs, batch
    /// jobs and notebooks, pools and cloud events; docs/simulation.md).
    #[arg(long, value_name = "SEED", conflicts_with_all = ["scenario", "trace"])]
    generate: Option<u64>,
    /// With --generate: write the generated scenario file here instead of running it (`-`:
    /// standard output); `simulate FILE` replays it.
    #[arg(long, value_name = "FILE", requires = "generate")]
    write_scenario: Option<PathBuf>,
    /// Run N generated scenarios (seeds --first-seed ..) with every strategy and report, per
    /// strategy, how often it is the cheapest, its cost against the best other and wait p95.
    #[arg(long, value_name = "N", conflicts_with_all = ["scenario", "trace", "generate", "compare", "plot", "seed"])]
    generate_bench: Option<u64>,
    /// The first seed of --generate-bench.
    #[arg(long, default_value_t = 1, requires = "generate_bench")]
    first_seed: u64,
    /// Scenarios of --generate-bench run at once (the figures do not depend on it).
    #[arg(long, default_value_t = 1, requires = "generate_bench")]
    jobs: usize,
    /// Policy for --trace (default: the built-in mapping of trace GPU models).
    #[arg(long, requires = "trace")]
    policy: Option<PathBuf>,
    /// Instance catalog CSV (default: the scenario's, else the built-in AWS catalog).
    #[arg(long)]
    catalog: Option<PathBuf>,
    /// gpu-node-autoscaler, ca-like or karpenter-like.
    #[arg(
        long,
        default_value = "gpu-node-autoscaler",
        conflicts_with = "compare"
    )]
    strategy: String,
    /// Run all three strategies side by side.
    #[arg(long)]
    compare: bool,
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// Write charts (SVG and PNG) into this directory.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Run time of trace pods in files without time columns.
    #[arg(long, default_value = "1h")]
    default_duration: String,
    /// Seed for boot delays and interruptions (default: the scenario's, else 1).
    #[arg(long)]
    seed: Option<u64>,
    /// Keep a CapacityBuffer of N chunks, each one replica of the scenario's service SERVICE
    /// (replacing the scenario's buffer of that service): warm capacity before its bursts.
    #[arg(long, value_name = "SERVICE=N", conflicts_with = "trace")]
    buffer: Vec<String>,
}

#[cfg(feature = "simulator")]
fn simulate(a: SimArgs) -> Result<()> {
    use gpu_node_autoscaler::sim::{
        self, engine, generate, report, scenario, trace, SimInput, StrategyKind,
    };
    if let Some(n) = a.generate_bench {
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
        let bar = terminal.then(|| {
            let b = indicatif::ProgressBar::new(n);
            b.set_style(
                indicatif::ProgressStyle::with_template("{msg:>20} [{bar:40}] {pos}/{len}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            b.set_message("generated scenarios");
            b
        });
        let end = a
            .first_seed
            .checked_add(n)
            .ok_or_else(|| anyhow::anyhow!("--first-seed {} + {n} overflows", a.first_seed))?;
        let bench = generate::bench(a.first_seed..end, a.jobs, &|done| {
            if let Some(b) = &bar {
                b.set_position(done as u64);
            }
        })
        .map_err(anyhow::Error::msg)?;
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        match a.format {
            Format::Json => println!("{}", generate::bench_json(&bench)),
            Format::Table => print!("{}", generate::bench_table(&bench)),
        }
        return Ok(());
    }
    let strategies: Vec<StrategyKind> = if a.compare {
        StrategyKind::ALL.to_vec()
    } else {
        vec![StrategyKind::parse(&a.strategy).ok_or_else(|| {
            anyhow::anyhow!(
                "unknown strategy {:?} (expected gpu-node-autoscaler, ca-like or karpenter-like)",
                a.strategy
            )
        })?]
    };
    let input = if let Some(path) = &a.trace {
        let policy = match &a.policy {
            Some(p) => load_policy(p)?,
            None => policy::parse_policy(&trace::default_trace_policy(), "<built-in trace policy>")
                .map_err(anyhow::Error::new)?,
        };
        let catalog = load_catalog(a.catalog.as_deref(), &policy)?;
        let dd = policy::duration::parse_duration(&a.default_duration)
            .map_err(|e| anyhow::anyhow!("--default-duration: {e}"))?;
        let t = trace::load_trace(
            &read(path)?,
            &path.display().to_string(),
            &policy,
            dd.as_millis() as i64,
        )
        .map_err(anyhow::Error::msg)?;
        SimInput {
            name: path.file_name().map_or_else(
                || path.display().to_string(),
                |f| f.to_string_lossy().into_owned(),
            ),
            policy,
            catalog,
            pods: t.pods,
            events: Vec::new(),
            timing: Default::default(),
            until: None,
            seed: a.seed.unwrap_or(1),
            skipped: t.skipped,
            device_classes: Default::default(),
            reservations: Vec::new(),
            kueue_jobs: Vec::new(),
            buffers: Vec::new(),
            groups: Default::default(),
            storage: Default::default(),
        }
    } else {
        let (text, file, dir) = match (&a.scenario, a.generate) {
            (_, Some(seed)) => {
                let text = generate::generate(seed);
                match &a.write_scenario {
                    Some(out) if out.as_os_str() == "-" => {
                        print!("{text}");
                        return Ok(());
                    }
                    Some(out) => {
                        std::fs::write(out, &text)
                            .with_context(|| format!("cannot write {}", out.display()))?;
                        eprintln!("wrote {}", out.display());
                        return Ok(());
                    }
                    None => (text, generate::file_name(seed), PathBuf::from(".")),
                }
            }
            (Some(p), None) => (
                read(p)?,
                p.display().to_string(),
                p.parent().map(Path::to_path_buf).unwrap_or_default(),
            ),
            (None, None) => (
                scenario::DEFAULT.to_string(),
                format!("<built-in {}>", scenario::DEFAULT_NAME),
                PathBuf::from("."),
            ),
        };
        let mut sc = scenario::parse_scenario(&text, &file).map_err(anyhow::Error::msg)?;
        for b in &a.buffer {
            let (service, n) = b
                .split_once('=')
                .and_then(|(s, n)| Some((s, n.parse::<u32>().ok()?)))
                .ok_or_else(|| {
                    anyhow::anyhow!("--buffer {b:?}: expected SERVICE=N (N a whole number)")
                })?;
            sc.add_buffer(service, n)
                .map_err(|e| anyhow::anyhow!("--buffer {b:?}: {e}"))?;
        }
        let catalog_path = a
            .catalog
            .clone()
            .or_else(|| sc.catalog.as_ref().map(|c| dir.join(c)));
        let catalog = load_catalog(catalog_path.as_deref(), &sc.policy)?;
        sc.into_input(catalog, a.seed)
    };
    let errors = gpu_node_autoscaler::plan::Templates::new(&input.policy, &input.catalog).errors;
    if !errors.is_empty() {
        bail!(
            "the policy does not match the catalog:\n{}",
            errors.join("\n")
        );
    }
    let mut runs = Vec::new();
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    for k in strategies {
        let mut s = k.build(&input);
        let bar = terminal.then(|| {
            let b = indicatif::ProgressBar::new(100);
            b.set_style(
                indicatif::ProgressStyle::with_template("{msg:>20} [{bar:40}] {pos:>3}%")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            b.set_message(k.name());
            b
        });
        let m = engine::run_with_progress(&input, s.as_mut(), &mut |f| {
            if let Some(b) = &bar {
                b.set_position((f * 100.0) as u64);
            }
        });
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        runs.push(m);
    }
    match a.format {
        Format::Json => println!("{}", report::to_json(&input.name, &runs)),
        Format::Table => print!("{}", report::to_table(&input.name, &runs)),
    }
    if let Some(dir) = &a.plot {
        let series: Vec<sim::plot::RunSeries> = runs
            .iter()
            .map(|m| sim::plot::RunSeries {
                strategy: m.strategy.clone(),
                points: m.series.clone(),
            })
            .collect();
        let files =
            sim::plot::write_plots(dir, &input.name, &series).map_err(anyhow::Error::msg)?;
        for f in files {
            eprintln!("wrote {}", f.display());
        }
    }
    Ok(())
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
