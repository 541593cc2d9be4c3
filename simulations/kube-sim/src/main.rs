use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use gpu_node_autoscaler_core::policy::duration::parse_duration;
use kube_sim::faults::{check_error_code, check_error_rate};

/// An in-memory, Kubernetes-API-compatible cluster simulator (plain HTTP).
#[derive(Parser, Debug)]
#[command(name = "kube-sim", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Changes kept for watches resuming from a resourceVersion (older ones get 410 Gone).
    #[arg(long, default_value_t = 10_000)]
    watch_history: usize,

    /// Do not run the simulated scheduler (Pending pods stay unbound).
    #[arg(long)]
    no_scheduler: bool,
    /// Do not run the simulated kubelets (bound pods stay Pending, no node heartbeats).
    #[arg(long)]
    no_kubelet: bool,
    /// How long after it is bound a pod turns Running.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pod_start_delay: Duration,
    /// How often each node's Ready condition gets a new lastHeartbeatTime.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    heartbeat: Duration,

    /// EC2 endpoint whose instances tagged for --cluster-name become Nodes (e.g. a moto_server).
    #[arg(long, requires = "cluster_name")]
    ec2_endpoint: Option<String>,
    /// The EC2 region.
    #[arg(long, default_value = "us-east-1")]
    ec2_region: String,
    /// The value of the instances' gpu-node-autoscaler.io/cluster tag.
    #[arg(long, requires = "ec2_endpoint")]
    cluster_name: Option<String>,
    /// How long after an instance is first seen its Node registers.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    boot_delay: Duration,
    /// How long after a Node registers its GPUs are advertised.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    device_plugin_delay: Duration,
    /// How often EC2 instances are listed.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    ec2_poll: Duration,

    /// ESS scaling groups whose instances become Nodes (comma-separated; credentials from
    /// ALIBABA_CLOUD_ACCESS_KEY_ID / ALIBABA_CLOUD_ACCESS_KEY_SECRET, and
    /// ALIBABA_CLOUD_SECURITY_TOKEN for temporary ones).
    #[arg(long, value_delimiter = ',')]
    ess_scaling_groups: Vec<String>,
    /// Replaces the ESS and ECS endpoints (e.g. the Alibaba Cloud provider's local fake).
    #[arg(long, requires = "ess_scaling_groups")]
    ess_endpoint: Option<String>,
    /// The Alibaba Cloud region.
    #[arg(long, default_value = "cn-hangzhou")]
    ess_region: String,
    /// GROUP=POOL: the gpu-node-autoscaler.io/pool label of the group's Nodes (repeatable).
    #[arg(long = "ess-pool", value_name = "GROUP=POOL", value_parser = kube_sim::ess::parse_pool_mapping)]
    ess_pools: Vec<(String, String)>,
    /// How often the ESS scaling groups are listed.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    ess_poll: Duration,

    /// Share (0 to 1) of API requests answered with --fault-error-code.
    #[arg(long, default_value_t = 0.0, value_parser = |s: &str| s.parse::<f64>().map_err(|e| e.to_string()).and_then(check_error_rate))]
    fault_error_rate: f64,
    /// The injected error: 429 (with Retry-After: 1) or 500-599.
    #[arg(long, default_value_t = 500, value_parser = |s: &str| s.parse::<u16>().map_err(|e| e.to_string()).and_then(check_error_code))]
    fault_error_code: u16,
    /// End every watch stream this long after it started.
    #[arg(long, value_parser = parse_duration)]
    fault_watch_close_after: Option<Duration>,
    /// Delay every API response this long.
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    fault_delay: Duration,
    /// Seed of the random sequence that picks the failing requests.
    #[arg(long, default_value_t = 1)]
    fault_seed: u64,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("kube-sim: cannot listen on {}: {e}", args.listen);
            std::process::exit(1);
        }
    };
    eprintln!(
        "kube-sim: serving the Kubernetes API on http://{}",
        args.listen
    );
    let ec2 = match (&args.ec2_endpoint, &args.cluster_name) {
        (Some(endpoint), Some(cluster)) => Some(kube_sim::Ec2Config {
            boot_delay: args.boot_delay,
            device_plugin_delay: args.device_plugin_delay,
            poll: args.ec2_poll,
            ..kube_sim::Ec2Config::new(endpoint, &args.ec2_region, cluster)
        }),
        _ => None,
    };
    let ess = if args.ess_scaling_groups.is_empty() {
        None
    } else {
        let credentials = kube_sim::alibaba_rpc::Credentials::from_env().unwrap_or_else(|e| {
            eprintln!("kube-sim: ess bridge: {e}");
            std::process::exit(2);
        });
        let groups: Vec<&str> = args.ess_scaling_groups.iter().map(String::as_str).collect();
        Some(kube_sim::EssConfig {
            endpoint: args.ess_endpoint.clone(),
            pools: args.ess_pools.iter().cloned().collect(),
            boot_delay: args.boot_delay,
            device_plugin_delay: args.device_plugin_delay,
            poll: args.ess_poll,
            ..kube_sim::EssConfig::new(&args.ess_region, &groups, credentials)
        })
    };
    let config = kube_sim::Config {
        watch_history: args.watch_history,
        scheduler: !args.no_scheduler,
        kubelet: !args.no_kubelet,
        pod_start_delay: args.pod_start_delay,
        heartbeat: args.heartbeat,
        ec2,
        ess,
        faults: kube_sim::Faults {
            error_rate: args.fault_error_rate,
            error_code: args.fault_error_code,
            watch_close_after: args.fault_watch_close_after.filter(|d| !d.is_zero()),
            delay: args.fault_delay,
        },
        fault_seed: args.fault_seed,
        ..kube_sim::Config::default()
    };
    if let Err(e) = kube_sim::serve(listener, config).await {
        eprintln!("kube-sim: {e}");
        std::process::exit(1);
    }
}
