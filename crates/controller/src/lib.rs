//! The controller (`gpu-node-autoscaler run`): watch, and execute the decision core.
//!
//! Watch tasks keep a [`store::ClusterState`] of model values; the loop waits until every store
//! has synced, and runs a pass of the decision core ([`Autoscaler`], the same one `simulate`
//! runs) when its batching window closes, when one of the core's timers runs out (an unneeded
//! node's delay, a cooldown: `Autoscaler::next_change`, as `simulate` runs it) or every
//! `--scan-interval`. A pass observes the watch caches
//! and the pools' instance listings, and this crate carries out the actions it returns against
//! the API server and the cloud providers: registrations, launches through the fallback list,
//! terminations, drains (as tasks, whose outcomes go back to the core), annotations, Events, the
//! status ConfigMap and metrics. Only the Lease holder acts.

pub mod drain;
pub mod gpu_metrics;
pub mod instrumented;
pub mod kube_io;
pub mod leader;
pub mod metrics;
pub mod providers;
pub mod reads;
pub mod store;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use gpu_node_autoscaler_provider::interruptions::{InterruptionSource, Parsed};
use gpu_node_autoscaler_provider::{Catalog, CloudProvider, LaunchResult, ProviderError};
use k8s_openapi::api::core::v1::{ConfigMap, Node as K8sNode, Pod as K8sPod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::runtime::watcher;
use kube::Client;
use tracing::{error, info, warn};

use gpu_node_autoscaler_core::autoscaler::fleet::Registration;
use gpu_node_autoscaler_core::autoscaler::{
    status, Action, Autoscaler, Count, DrainOutcome, Feedback, Level, Observation, Subject,
};
use gpu_node_autoscaler_core::model::node::GpuXid;
use gpu_node_autoscaler_core::model::{Snapshot, Time};
use gpu_node_autoscaler_core::plan::templates::provider_spec;
use gpu_node_autoscaler_core::policy::{parse_policy_with, Policy};

pub use gpu_node_autoscaler_core::autoscaler::LAUNCH_FAILURE_REASONS;

use drain::{DrainContext, DrainJob};
use kube_io::{configmap_ref, node_ref, pod_ref, EventSink, Note as KubeNote};
use leader::Elector;
use metrics::{FailedLaunch, Health, Metrics, PoolCapacity, PoolLabel};
use store::{ClusterState, Kind};

/// Now, from the wall clock (the only place the controller reads it besides timers).
pub fn wall_now() -> Time {
    Time(chrono::Utc::now().timestamp_millis())
}

static SEED: AtomicU64 = AtomicU64::new(0);

/// A fresh seed for jitter.
pub fn seed() -> u64 {
    SEED.fetch_add(1, Ordering::Relaxed) ^ (wall_now().0 as u64).rotate_left(17)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

fn duration_arg(s: &str) -> std::result::Result<Duration, String> {
    gpu_node_autoscaler_core::policy::duration::parse_duration(s).map_err(|e| e.to_string())
}

/// A duration, or a bare number of seconds (as the Cluster Autoscaler's `-sec` flags take).
fn seconds_or_duration_arg(s: &str) -> std::result::Result<Duration, String> {
    match s.parse::<u64>() {
        Ok(secs) => Ok(Duration::from_secs(secs)),
        Err(_) => duration_arg(s),
    }
}

/// `gpu-node-autoscaler run`.
#[derive(clap::Args, Clone, Debug)]
pub struct RunArgs {
    /// The policy ConfigMap (`NAMESPACE/NAME`, key `policy.yaml`).
    #[arg(long, default_value = "kube-system/gpu-node-autoscaler-policy")]
    pub policy_configmap: String,
    /// Where the status is written (`NAMESPACE/NAME`).
    #[arg(long, default_value = "kube-system/gpu-node-autoscaler-status")]
    pub status_configmap: String,
    /// The leader-election Lease (`NAMESPACE/NAME`).
    #[arg(long, default_value = "kube-system/gpu-node-autoscaler")]
    pub lease: String,
    /// This replica's name in the Lease (default: env POD_NAME, else the host name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Decide and report, but make no cloud call and change no node or pod.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Instance catalog CSV for on-demand prices (default: the built-in catalog of the policy's
    /// region; us-east-1's, with a warning, for a region without one).
    #[arg(long)]
    pub catalog: Option<PathBuf>,
    /// EC2 endpoint (for tests against an emulator); the region comes from the policy.
    #[arg(long)]
    pub aws_endpoint_url: Option<String>,
    /// ESS/ECS/VPC endpoint (for tests against a local fake); the region comes from the policy.
    #[arg(long)]
    pub alibaba_endpoint_url: Option<String>,
    /// Periodic resync: a pass at least this often (the Cluster Autoscaler's name; `--resync`
    /// is kept as an alias).
    #[arg(
        long = "scan-interval",
        visible_alias = "resync",
        default_value = "10s",
        value_parser = duration_arg
    )]
    pub resync: Duration,
    /// How long the leader Lease is held without renewal.
    #[arg(
        long = "leader-elect-lease-duration",
        visible_alias = "lease-duration",
        default_value = "15s",
        value_parser = duration_arg
    )]
    pub lease_duration: Duration,
    /// How often the Lease is renewed or tried for.
    #[arg(
        long = "leader-elect-retry-period",
        visible_alias = "lease-retry",
        default_value = "2s",
        value_parser = duration_arg
    )]
    pub lease_retry: Duration,
    /// How long a drain may take (PDB refusals are retried until then) before the node is
    /// given back; a bare number is seconds, so that the Cluster Autoscaler's
    /// `--max-graceful-termination-sec=600` means the same.
    #[arg(
        long,
        visible_alias = "max-graceful-termination-sec",
        default_value = "600s",
        value_parser = seconds_or_duration_arg
    )]
    pub max_graceful_termination: Duration,
    /// Evictions per second, across all drains.
    #[arg(long, default_value_t = 10)]
    pub evictions_per_second: u32,
    /// Events written per second at most.
    #[arg(long, default_value_t = 20)]
    pub events_per_second: u32,
    /// How often the cloud's prices (spot price history) are read again while the policy stays
    /// the same; `0` reads them only when the policy changes. A failed read keeps the last good
    /// prices.
    #[arg(long, default_value = "5m", value_parser = duration_arg)]
    pub price_refresh_interval: Duration,
    /// How often the cloud groups of pools whose templates come from the cloud (Auto Scaling
    /// groups) are read again while the policy stays the same: groups tagged for discovery
    /// since, and changed tags, instance types, zones or sizes, are planned from then on (the
    /// Cluster Autoscaler's 1 minute refresh); `0` reads them only when the policy changes. A
    /// failed read keeps the last good groups.
    #[arg(long, default_value = "1m", value_parser = duration_arg)]
    pub group_refresh_interval: Duration,
}

impl RunArgs {
    /// The endpoint that replaces the cloud of the provider `name` (`--aws-endpoint-url`,
    /// `--alibaba-endpoint-url`): an emulator in tests.
    pub fn endpoint_url(&self, name: &str) -> Option<String> {
        match name {
            "aws" => self.aws_endpoint_url.clone(),
            "alibaba" => self.alibaba_endpoint_url.clone(),
            _ => None,
        }
    }
}

fn split_ref(s: &str, what: &str) -> Result<(String, String)> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => bail!("--{what}: expected NAMESPACE/NAME, got {s:?}"),
    }
}

pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => b.try_init(),
        LogFormat::Json => b.json().try_init(),
    };
}

/// Runs the controller until SIGTERM or SIGINT.
pub fn run(args: RunArgs) -> Result<()> {
    init_logging(args.log_format);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(run_async(args))
}

async fn run_async(args: RunArgs) -> Result<()> {
    let (policy_ns, policy_name) = split_ref(&args.policy_configmap, "policy-configmap")?;
    let (lease_ns, lease_name) = split_ref(&args.lease, "lease")?;
    let status_name = split_ref(&args.status_configmap, "status-configmap")?;
    let identity = match &args.identity {
        Some(i) if !i.is_empty() => i.clone(),
        _ => hostname(),
    };
    let mut config = kube::Config::infer()
        .await
        .context("no Kubernetes configuration (in-cluster service account or KUBECONFIG)")?;
    // Retries are ours (jittered back-off, PDB refusals retried until the drain deadline): the
    // client's own would hold a refused eviction for minutes.
    config.default_retry = false;
    // Explicit time-outs, so that an API server that accepts a connection and answers nothing
    // fails a call instead of holding the loop. Watches get no read time-out (a quiet watch is
    // idle for minutes; the watcher's own idle time-out protects them): their own client.
    config.connect_timeout = Some(KUBE_CONNECT_TIMEOUT);
    config.write_timeout = Some(KUBE_CALL_TIMEOUT);
    let watch_config = config.clone();
    config.read_timeout = Some(KUBE_CALL_TIMEOUT);
    config.reset_reader_on_write = true;
    let client = Client::try_from(config).context("building the Kubernetes client")?;
    let watch_client =
        Client::try_from(watch_config).context("building the Kubernetes client for watches")?;
    let cluster_id = kube_io::cluster_identity(&client).await.context(
        "reading the UID of the kube-system Namespace (the cluster's identity, tagged on every \
         instance and required to terminate one; deploy/base/rbac.yaml grants `get` on it)",
    )?;
    info!(cluster_id = %cluster_id, "cluster identity");
    let listener = metrics::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    info!(identity = %identity, dry_run = args.dry_run, listen = %args.listen, "starting");

    let state = Arc::new(Mutex::new(ClusterState::default()));
    let pods_cfg =
        watcher::Config::default().fields("status.phase!=Succeeded,status.phase!=Failed");
    tokio::spawn(kube_io::watch_into(
        Api::<K8sPod>::all(watch_client.clone()),
        pods_cfg,
        Kind::Pod,
        state.clone(),
    ));
    tokio::spawn(kube_io::watch_into(
        Api::<K8sNode>::all(watch_client.clone()),
        watcher::Config::default(),
        Kind::Node,
        state.clone(),
    ));
    tokio::spawn(kube_io::watch_into(
        Api::<PodDisruptionBudget>::all(watch_client.clone()),
        watcher::Config::default(),
        Kind::Pdb,
        state.clone(),
    ));
    tokio::spawn(kube_io::watch_into(
        Api::<ConfigMap>::namespaced(watch_client.clone(), &policy_ns),
        watcher::Config::default().fields(&format!("metadata.name={policy_name}")),
        Kind::PolicyConfigMap,
        state.clone(),
    ));
    // Volume topology: the pods' PersistentVolumeClaims, the volumes they are bound to and the
    // StorageClasses of those not bound yet.
    tokio::spawn(kube_io::watch_into(
        Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
        Kind::PersistentVolumeClaim,
        state.clone(),
    ));
    tokio::spawn(kube_io::watch_into(
        Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(client.clone()),
        watcher::Config::default(),
        Kind::PersistentVolume,
        state.clone(),
    ));
    tokio::spawn(kube_io::watch_into(
        Api::<k8s_openapi::api::storage::v1::StorageClass>::all(client.clone()),
        watcher::Config::default(),
        Kind::StorageClass,
        state.clone(),
    ));
    // The CSI drivers' attach limits per node (kube-scheduler's NodeVolumeLimits).
    tokio::spawn(kube_io::watch_into(
        Api::<k8s_openapi::api::storage::v1::CSINode>::all(client.clone()),
        watcher::Config::default(),
        Kind::CsiNode,
        state.clone(),
    ));
    // Namespaces' labels, which pod affinity terms' namespaceSelectors select.
    tokio::spawn(kube_io::watch_into(
        Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone()),
        watcher::Config::default(),
        Kind::Namespace,
        state.clone(),
    ));
    // Dynamic Resource Allocation: pods' ResourceClaims, their templates, DeviceClasses and the
    // devices nodes publish. On an API server without `resource.k8s.io/v1` no pod can claim
    // devices, and those stores are complete and empty.
    if kube_io::serves_dra(&client)
        .await
        .context("asking the API server whether it serves resource.k8s.io/v1")?
    {
        for (kind, api) in kube_io::dra_apis(&watch_client) {
            tokio::spawn(kube_io::watch_into(
                api,
                watcher::Config::default(),
                kind,
                state.clone(),
            ));
        }
    } else {
        info!("the API server does not serve resource.k8s.io/v1: ResourceClaims are not watched");
        state.lock().unwrap().without_dra(wall_now());
    }

    // ProvisioningRequests (Kueue's provisioning admission check, the Cluster Autoscaler's
    // API) and CapacityBuffers (warm capacity), with the PodTemplates they name, when the
    // cluster has their CRDs; asked again every `DISCOVERY_INTERVAL` while one is missing, so
    // that a CRD installed after start (Kueue, the Cluster Autoscaler's) is watched without a
    // restart.
    let served = kube_io::serves_optional(&client)
        .await
        .context("asking the API server whether it serves autoscaling.x-k8s.io")?;
    let mut watched = Watched::default();
    watched.start(&watch_client, &state, served, true);

    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    health
        .heartbeat
        .store(wall_now().0 / 1000, Ordering::Relaxed);
    tokio::spawn(metrics::serve(listener, metrics.clone(), health.clone()));

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let elector = Elector::new(
        client.clone(),
        &lease_ns,
        &lease_name,
        &identity,
        args.lease_duration,
    );
    let election = tokio::spawn(elector.clone().run(args.lease_retry, stop_rx.clone()));

    let events = EventSink::start(client.clone(), &identity, args.events_per_second);
    let drain_ctx = Arc::new(DrainContext {
        client: client.clone(),
        state: state.clone(),
        elector: elector.clone(),
        metrics: metrics.clone(),
        events: events.clone(),
        evictions: DrainContext::eviction_limiter(args.evictions_per_second),
    });
    let mut ctl = Controller {
        args: args.clone(),
        cluster_id,
        client,
        state,
        metrics,
        health,
        elector,
        events,
        drain_ctx,
        policy_name: (policy_ns, policy_name),
        status_name,
        policy_seen: None,
        policy_apply_failed: None,
        policy_valid: false,
        providers: BTreeMap::new(),
        orphan_pools: BTreeMap::new(),
        listing_stalled: false,
        core: Autoscaler::new(gpu_node_autoscaler_core::autoscaler::Config {
            dry_run: args.dry_run,
            max_graceful_termination: args.max_graceful_termination,
            identity: identity.clone(),
            seed: seed(),
            report: true,
        }),
        drains: HashMap::new(),
        waiting: None,
        reading: None,
        decided_at: None,
        reacted: HashSet::new(),
        request_pods: HashMap::new(),
        buffer_pods: HashMap::new(),
        buffer_report: Vec::new(),
        watch_client,
        watched,
        queue: None,
        notices: BTreeMap::new(),
        queue_until: None,
        queue_stalled: false,
        queue_spent: false,
        http: reqwest::Client::new(),
        xids_read_at: None,
        prices: gpu_node_autoscaler_core::prices::PriceSchedule::new(args.price_refresh_interval),
        groups_read: gpu_node_autoscaler_core::prices::PriceSchedule::new(
            args.group_refresh_interval,
        ),
        parsed_policy: None,
        cloud_groups: Default::default(),
    };

    let mut stop = stop_rx;
    tokio::spawn(async move {
        wait_for_signal().await;
        info!("shutting down");
        let _ = stop_tx.send(true);
    });
    ctl.run_loop(&mut stop).await;
    // Give the Lease back so that the other replica takes over at once.
    let _ = election.await;
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| format!("gpu-node-autoscaler-{}", std::process::id()))
}

/// How often the API server's discovery is asked again for ProvisioningRequests and
/// CapacityBuffers while either is not served (their CRDs may be installed at any time).
const DISCOVERY_INTERVAL: Duration = Duration::from_secs(30);

/// Which of the APIs that come with CRDs are watched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Watched {
    pod_templates: bool,
    provisioning: bool,
    buffers: bool,
}

impl Watched {
    /// Whether every API that comes with a CRD is watched (nothing left to discover).
    fn complete(&self) -> bool {
        self.provisioning && self.buffers
    }

    /// Starts the watches of the APIs `served` that are not watched yet. At start-up
    /// (`first`), the stores of those not served are marked complete and empty (nothing can
    /// ask for capacity that way there); a watch started later replaces its empty store when
    /// its first list is done.
    fn start(
        &mut self,
        client: &Client,
        state: &Arc<Mutex<ClusterState>>,
        served: kube_io::Served,
        first: bool,
    ) {
        let now = wall_now();
        if (served.provisioning || served.buffers) && !self.pod_templates {
            self.pod_templates = true;
            tokio::spawn(kube_io::watch_into(
                Api::<k8s_openapi::api::core::v1::PodTemplate>::all(client.clone()),
                watcher::Config::default(),
                Kind::PodTemplate,
                state.clone(),
            ));
        }
        if served.provisioning && !self.provisioning {
            self.provisioning = true;
            if !first {
                info!("the API server serves ProvisioningRequests (autoscaling.x-k8s.io/v1) now: watching them");
            }
            tokio::spawn(kube_io::watch_into(
                kube_io::provisioning_api(client),
                watcher::Config::default(),
                Kind::ProvisioningRequest,
                state.clone(),
            ));
        }
        if served.buffers && !self.buffers {
            self.buffers = true;
            if !first {
                info!("the API server serves CapacityBuffers (autoscaling.x-k8s.io/v1beta1) now: watching them");
            }
            tokio::spawn(kube_io::watch_into(
                kube_io::buffer_api(client),
                watcher::Config::default(),
                Kind::CapacityBuffer,
                state.clone(),
            ));
            tokio::spawn(kube_io::watch_into(
                Api::<k8s_openapi::api::apps::v1::Deployment>::all(client.clone()),
                watcher::Config::default(),
                Kind::Deployment,
                state.clone(),
            ));
            tokio::spawn(kube_io::watch_into(
                Api::<k8s_openapi::api::apps::v1::StatefulSet>::all(client.clone()),
                watcher::Config::default(),
                Kind::StatefulSet,
                state.clone(),
            ));
        }
        if !first {
            return;
        }
        let mut s = state.lock().unwrap();
        if !self.pod_templates {
            s.empty(Kind::PodTemplate, now);
        }
        if !self.provisioning {
            info!("the API server does not serve autoscaling.x-k8s.io/v1: ProvisioningRequests are not watched until it does (asked every {}s)", DISCOVERY_INTERVAL.as_secs());
            s.empty(Kind::ProvisioningRequest, now);
        }
        if !self.buffers {
            info!("the API server does not serve autoscaling.x-k8s.io/v1beta1: CapacityBuffers are not watched until it does (asked every {}s)", DISCOVERY_INTERVAL.as_secs());
            s.without_buffers(now);
        }
    }
}

struct Controller {
    args: RunArgs,
    /// The kube-system Namespace UID: tagged on every launch, required for every termination.
    cluster_id: String,
    client: Client,
    state: Arc<Mutex<ClusterState>>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    elector: Elector,
    events: EventSink,
    drain_ctx: Arc<DrainContext>,
    policy_name: (String, String),
    /// The status ConfigMap (namespace, name).
    status_name: (String, String),
    /// resourceVersion of the policy ConfigMap last looked at.
    policy_seen: Option<String>,
    /// resourceVersion of a valid policy that could not be applied yet (reported once).
    policy_apply_failed: Option<String>,
    policy_valid: bool,
    /// Provider per pool name.
    providers: BTreeMap<String, Arc<dyn CloudProvider>>,
    /// Pools not in the policy whose instances of ours are listed too (orphans): the pools a
    /// reload took out, those a Node's pool label or the last leader's status names. With the
    /// provider that listed them last (`None`: not known yet, every provider lists them).
    orphan_pools: BTreeMap<String, Option<Arc<dyn CloudProvider>>>,
    /// The last listing of the cloud timed out (reported once per stretch).
    listing_stalled: bool,
    /// Every decision, and the state decisions depend on.
    core: Autoscaler,
    /// Running drains and rollbacks: node → task.
    drains: HashMap<String, tokio::task::JoinHandle<DrainOutcome>>,
    /// The step of a pass whose launches are still with the cloud.
    waiting: Option<Waiting>,
    /// A pass whose reads of the cloud are under way.
    reading: Option<Reading>,
    /// When the last pass decided: the core's timers (`Autoscaler::next_change`) count from it.
    decided_at: Option<Time>,
    /// Pods whose reaction time was recorded.
    reacted: HashSet<String>,
    /// The pods of the last pass made from ProvisioningRequests (`namespace/name`) → the
    /// request's namespace, name and UID: no such pod exists, so nothing is nominated for them
    /// and their Events are the request's.
    request_pods: HashMap<String, (String, String, String)>,
    /// The virtual pods of the last pass made from CapacityBuffers (`namespace/name`) → the
    /// buffer's namespace, name and UID: as `request_pods`, they do not exist.
    buffer_pods: HashMap<String, (String, String, String)>,
    /// Where the last pass found each buffer's room, and its cost (status ConfigMap, metrics).
    buffer_report: Vec<gpu_node_autoscaler_core::buffer::Report>,
    /// The client of the watches, for those started after start-up.
    watch_client: Client,
    /// Which of the APIs a cluster may lack (CRDs) are watched.
    watched: Watched,
    /// The policy's interruption queue (`interruptionQueue`), when set.
    queue: Option<Arc<dyn InterruptionSource>>,
    /// Notices received and not acknowledged yet: message id → (receipt, notice).
    notices: BTreeMap<String, (String, gpu_node_autoscaler_provider::Notice)>,
    /// Until when this pass may wait on the interruption queue (its reads and every delete,
    /// together): [`QUEUE_BUDGET`] from the pass's read.
    queue_until: Option<tokio::time::Instant>,
    /// Whether the queue's budget ran out in this pass, and (for the Event, sent once per
    /// stall) whether it ran out in a pass before.
    queue_spent: bool,
    queue_stalled: bool,
    /// For `gpuMetrics`' Prometheus.
    http: reqwest::Client,
    /// When the XID series were last read (`gpuMetrics.interval` apart).
    xids_read_at: Option<tokio::time::Instant>,
    /// When the cloud's prices are read again (`--price-refresh-interval`).
    prices: gpu_node_autoscaler_core::prices::PriceSchedule,
    /// When the pools' cloud groups are read again (`--group-refresh-interval`).
    groups_read: gpu_node_autoscaler_core::prices::PriceSchedule,
    /// The policy in force as parsed, before its cloud groups' templates were merged in: each
    /// read of the groups is merged into it afresh.
    parsed_policy: Option<Policy>,
    /// The cloud groups in force, to compare the next read with.
    cloud_groups: gpu_node_autoscaler_core::cloud_groups::Groups,
}

type LaunchTask = tokio::task::JoinHandle<std::result::Result<LaunchResult, ProviderError>>;
type TerminateTask = tokio::task::JoinHandle<std::result::Result<(), ProviderError>>;

/// A step's calls to the cloud, started as tasks and answered to the core together.
#[derive(Default)]
struct Calls {
    /// Launch id → its launch.
    launches: Vec<(String, LaunchTask)>,
    /// Instance id → its termination.
    terminations: Vec<(String, TerminateTask)>,
}

impl Calls {
    fn is_empty(&self) -> bool {
        self.launches.is_empty() && self.terminations.is_empty()
    }

    fn all_finished(&self) -> bool {
        self.launches.iter().all(|(_, t)| t.is_finished())
            && self.terminations.iter().all(|(_, t)| t.is_finished())
    }
}

/// A pass waiting for its reads of the cloud ([`reads`]).
struct Reading {
    task: tokio::task::JoinHandle<reads::Reads>,
    since: tokio::time::Instant,
}

/// Reads still under way after this long are given up (each call has a shorter time-out of
/// its own; this bounds what a provider would leave unbounded): counted, an Event, and the pass
/// decides nothing.
const READS_STUCK_AFTER: Duration = Duration::from_secs(300);

/// A step of a pass waiting for its launches (an Alibaba ESS scaling activity can take minutes).
/// The loop keeps turning meanwhile (probes, drains, leadership); no new pass starts before the
/// step is resumed with every launch's answer, so nothing is planned twice.
struct Waiting {
    /// What the step's other actions answered.
    feedback: Vec<Feedback>,
    calls: Calls,
    since: tokio::time::Instant,
    /// Time spent deciding in this pass so far.
    deciding: Duration,
}

/// What one pass spends on the interruption queue at most, its read and every delete together
/// (each SQS call is also bounded by its own time-out, 2 × 20 s): past it, the queue's calls
/// are dropped for this pass (a message not deleted is delivered again and read next pass).
const QUEUE_BUDGET: Duration = Duration::from_secs(30);

/// A launch awaited longer than this is stuck: `/healthz` stops answering so that the process
/// is restarted (the next leader finds the instances by their tags). Longer than any cloud
/// call's own time-outs (an ESS scaling activity is awaited for up to 300 s).
const LAUNCH_STUCK_AFTER: Duration = Duration::from_secs(900);

/// How long connecting to the API server may take.
const KUBE_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an API call (not a watch) may wait for its request to be written and for its answer.
const KUBE_CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// The most nomination patches in flight at once in a pass, so that a burst of pending pods does
/// not open hundreds of requests to the API server together.
const NOMINATIONS_AT_ONCE: usize = 8;

/// Whether the loop counts as alive: it turns, and no launch has been awaited for too long.
fn loop_alive(waiting_for: Option<Duration>) -> bool {
    waiting_for.is_none_or(|d| d < LAUNCH_STUCK_AFTER)
}

impl Controller {
    /// The loop made progress. Written at the top of every turn and between the steps of a
    /// pass: each step is one call with a time-out of its own (cloud calls, the API server's
    /// 20 s, Prometheus' 10 s), so a pass of many slow but answered calls keeps `/healthz`
    /// passing, and only a call that outlives its time-out (or a launch awaited too long) can
    /// stop the beats.
    fn beat(&self) {
        let waiting_for = self.waiting.as_ref().map(|w| w.since.elapsed());
        if loop_alive(waiting_for) {
            let beat = wall_now().0 / 1000;
            self.health.heartbeat.store(beat, Ordering::Relaxed);
            self.metrics.heartbeat_timestamp_seconds.set(beat);
        }
    }

    async fn run_loop(&mut self, stop: &mut tokio::sync::watch::Receiver<bool>) {
        let mut seen_unschedulable = 0u64;
        let mut next_resync = tokio::time::Instant::now();
        let mut next_discovery = tokio::time::Instant::now() + DISCOVERY_INTERVAL;
        let tick = Duration::from_millis(200);
        loop {
            if *stop.borrow() {
                break;
            }
            self.beat();
            if !self.watched.complete() && tokio::time::Instant::now() >= next_discovery {
                next_discovery = tokio::time::Instant::now() + DISCOVERY_INTERVAL;
                match kube_io::serves_optional(&self.client).await {
                    Ok(served) => {
                        self.watched
                            .start(&self.watch_client, &self.state, served, false)
                    }
                    Err(e) => {
                        warn!("asking the API server whether it serves autoscaling.x-k8s.io: {e}")
                    }
                }
                self.beat();
            }
            // New unschedulable pods, and pods whose nomination the scheduler cleared, open the
            // batching window: a pass soon.
            let (synced, new_unschedulable) = {
                let s = self.state.lock().unwrap();
                (s.all_synced(), s.new_unschedulable + s.nominations_cleared)
            };
            self.health.ready.store(synced, Ordering::Relaxed);
            self.metrics.leader.set(i64::from(self.elector.is_leader()));
            let now = wall_now();
            if new_unschedulable != seen_unschedulable {
                seen_unschedulable = new_unschedulable;
                self.core.unschedulable_seen(now);
            }
            let batch_due = self.core.batch_deadline().is_some_and(|d| d <= now);
            // A timer of the core ran out since the last pass (an unneeded node's delay, a
            // cooldown or back-off, an unavailable offering): a pass now, not at the resync.
            let timer_due = self
                .decided_at
                .and_then(|t| self.core.next_change(t))
                .is_some_and(|t| t <= now);
            let now_i = tokio::time::Instant::now();
            self.resume_launched().await;
            self.take_reads().await;
            if self.waiting.is_none()
                && self.reading.is_none()
                && synced
                && (batch_due || timer_due || now_i >= next_resync)
            {
                next_resync = now_i + self.args.resync;
                self.pass().await;
            }
            self.reap_drains().await;
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// Collects finished drains and tells the core how they ended.
    async fn reap_drains(&mut self) {
        let done: Vec<String> = self
            .drains
            .iter()
            .filter(|(_, h)| h.is_finished())
            .map(|(n, _)| n.clone())
            .collect();
        for node in done {
            let Some(h) = self.drains.remove(&node) else {
                continue;
            };
            let outcome = futures::FutureExt::now_or_never(h)
                .and_then(|r| r.ok())
                .unwrap_or(DrainOutcome::Failed(
                    "the drain task ended abnormally".into(),
                ));
            let actions = self.core.drain_finished(&node, outcome, wall_now());
            // Counts and logs only.
            let _ = self.execute(actions).await;
        }
    }

    /// Reads the status the last leader wrote. False when it could not be read.
    async fn restore_history(&mut self) -> bool {
        let (ns, name) = &self.status_name;
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        let cm = match api.get_opt(name).await {
            Ok(cm) => cm,
            Err(e) => {
                warn!("reading the status ConfigMap: {e}");
                return false;
            }
        };
        let json = cm
            .and_then(|c| c.data)
            .and_then(|d| d.get("status.json").cloned());
        for pool in json
            .as_deref()
            .map(gpu_node_autoscaler_core::autoscaler::status::orphan_pools_of)
            .unwrap_or_default()
        {
            self.orphan_pools.entry(pool).or_insert(None);
        }
        self.core.restore(json.as_deref());
        info!("history restored from the status ConfigMap");
        true
    }

    /// Reads a changed policy ConfigMap; an invalid one leaves the last good policy in force
    /// and is reported once (Event, log), not again until the ConfigMap changes, also when no
    /// policy is in force yet. A valid one that cannot be applied yet (the cloud's catalog
    /// unreachable) is tried again on the next pass.
    async fn reload_policy(&mut self) {
        let src = self.state.lock().unwrap().policy_source().cloned();
        let rv = src.as_ref().map(|s| s.resource_version.clone());
        if rv == self.policy_seen {
            return;
        }
        let (ns, name) = self.policy_name.clone();
        let file = format!("configmap {ns}/{name} key {}", store::POLICY_KEY);
        let Some(src) = src else {
            self.policy_seen = rv;
            warn!("the policy ConfigMap {ns}/{name} does not exist");
            self.set_policy_valid(false);
            return;
        };
        let cm = configmap_ref(&ns, &name, &src.uid);
        let result = match &src.text {
            None => Err(format!("{file}: the key is missing")),
            Some(text) => match parse_policy_with(text, &file, &providers::policies())
                .and_then(|p| self.check_against_catalog(p, &file))
            {
                Ok((p, _))
                    if self
                        .core
                        .policy()
                        .is_some_and(|old| p.identity_change(old).is_some()) =>
                {
                    let old = self.core.policy().expect("checked");
                    Err(format!(
                        "{file}: {}",
                        p.identity_change(old).unwrap_or_default()
                    ))
                }
                Ok((p, file_catalog)) => match self.apply_policy(p, file_catalog).await {
                    Ok(warning) => Ok(warning),
                    Err(e) if self.policy_apply_failed.as_deref() == rv.as_deref() => {
                        warn!("the new policy cannot be applied yet: {e}");
                        return;
                    }
                    Err(e) => {
                        warn!("the new policy cannot be applied yet, retrying: {e}");
                        self.policy_apply_failed = rv.clone();
                        self.events.send(KubeNote {
                            object: cm,
                            warning: true,
                            reason: "PolicyNotApplied",
                            action: "Reload",
                            message: format!(
                                "valid, but not applied yet (retried every pass): {e}"
                            ),
                        });
                        return;
                    }
                },
                Err(e) => Err(e.to_string()),
            },
        };
        self.policy_seen = rv;
        self.policy_apply_failed = None;
        match result {
            Ok(catalog_warning) => {
                info!(resource_version = %src.resource_version, "policy in force");
                self.set_policy_valid(true);
                if let Some(w) = catalog_warning {
                    warn!("{w}");
                    self.events.send(KubeNote {
                        object: cm,
                        warning: true,
                        reason: "BuiltinCatalogFallback",
                        action: "Reload",
                        message: w,
                    });
                }
            }
            Err(msg) => {
                error!("policy rejected, the last good one stays in force:\n{msg}");
                self.set_policy_valid(false);
                self.events.send(KubeNote {
                    object: cm,
                    warning: true,
                    reason: "PolicyInvalid",
                    action: "Reload",
                    message: format!(
                        "{}; {}",
                        msg,
                        if self.core.policy().is_some() {
                            "the last good policy stays in force"
                        } else {
                            "no policy in force: nothing is scaled"
                        }
                    ),
                });
            }
        }
    }

    fn set_policy_valid(&mut self, ok: bool) {
        self.policy_valid = ok;
        self.metrics.policy_valid.set(i64::from(ok));
    }

    /// What of a parsed policy is checked against the price file's catalog (the MIG layouts of
    /// its pools against their GPUs), with positions as parse errors have them. Returns the
    /// policy with the catalog as read once for it (an error there is reported when the policy
    /// is applied).
    #[allow(clippy::type_complexity)]
    fn check_against_catalog(
        &self,
        policy: Policy,
        file: &str,
    ) -> std::result::Result<
        (
            Policy,
            std::result::Result<(Catalog, Option<String>), String>,
        ),
        gpu_node_autoscaler_core::policy::PolicyErrors,
    > {
        let loaded = load_catalog(self.args.catalog.as_deref(), &policy);
        let errors = match &loaded {
            Ok((catalog, _)) => {
                gpu_node_autoscaler_core::plan::templates::check_mig_layouts(&policy, catalog)
            }
            Err(_) => Vec::new(),
        };
        if errors.is_empty() {
            Ok((policy, loaded))
        } else {
            Err(gpu_node_autoscaler_core::policy::PolicyErrors {
                file: file.to_string(),
                errors,
            })
        }
    }

    /// Builds providers and the catalog for a new policy; nothing changes on error. Returns the
    /// warning about the catalog, if any (no built-in catalog for the policy's region).
    async fn apply_policy(
        &mut self,
        policy: Policy,
        file_catalog: std::result::Result<(Catalog, Option<String>), String>,
    ) -> std::result::Result<Option<String>, String> {
        for w in policy.warnings() {
            warn!("policy: {w}");
        }
        let (file_catalog, catalog_warning) = file_catalog?;
        let parsed = policy.clone();
        let (providers, catalog, policy, groups, unpriced) =
            if self.args.dry_run {
                // No cloud call at all: the price file's catalog, every offering assumed available.
                for p in policy.pools.iter().filter(|p| {
                    gpu_node_autoscaler_core::plan::templates::awaits_cloud_templates(p)
                }) {
                    warn!(
                        "pool {}: its instance types come from its cloud groups, which a dry run \
                     does not read: it plans nothing (list `instanceTypes` to plan it)",
                        p.name
                    );
                }
                (
                    BTreeMap::new(),
                    file_catalog,
                    policy,
                    Default::default(),
                    Vec::new(),
                )
            } else {
                build_providers(
                    policy,
                    &file_catalog,
                    &self.args,
                    &self.cluster_id,
                    &self.metrics,
                    &self.client,
                )
                .await?
            };
        // Every pool's counters exist from the start, so that the first failure shows as an
        // increase (a series appearing at 1 does not).
        for p in &policy.pools {
            let pool = PoolLabel {
                pool: p.name.clone(),
            };
            let _ = self.metrics.scale_ups.get_or_create(&pool);
            let _ = self
                .metrics
                .give_up_terminations_failed
                .get_or_create(&pool);
            let _ = self.metrics.scale_downs.get_or_create(&pool);
            for reason in LAUNCH_FAILURE_REASONS {
                let _ = self.metrics.failed_launches.get_or_create(&FailedLaunch {
                    pool: p.name.clone(),
                    reason: reason.to_string(),
                });
            }
        }
        self.metrics.pool_max_nodes.clear();
        self.metrics.pool_max_gpus.clear();
        for p in &policy.pools {
            let pool = PoolLabel {
                pool: p.name.clone(),
            };
            self.metrics
                .pool_max_nodes
                .get_or_create(&pool)
                .set(i64::from(p.max_nodes));
            if let Some(g) = p.max_gpus {
                self.metrics
                    .pool_max_gpus
                    .get_or_create(&pool)
                    .set(i64::from(g));
            }
        }
        if policy.gpu_metrics.is_some() {
            // Both series from the start, so that the first failure shows as an increase.
            for result in ["ok", "error"] {
                let _ = self
                    .metrics
                    .gpu_metrics_reads
                    .get_or_create(&metrics::ReadResult {
                        result: result.to_string(),
                    });
            }
        }
        let queue = match (&policy.interruption_queue, self.args.dry_run) {
            (Some(address), false) => {
                if self.queue.as_ref().is_none_or(|q| q.address() != address) {
                    let Some((name, open)) = providers::interruptions() else {
                        return Err(format!(
                            "interruptionQueue: this controller is built without a provider \
                             that reads interruption notices (built with: {})",
                            providers::runnable()
                        ));
                    };
                    let mut spec = provider_spec(&policy, &catalog, name);
                    spec.endpoint_url = self.args.endpoint_url(name);
                    let source = open(&spec, address)
                        .await
                        .map_err(|e| format!("interruptionQueue: {e}"))?;
                    self.notices.clear();
                    Some(source)
                } else {
                    self.queue.take()
                }
            }
            _ => None,
        };
        self.queue = queue;
        // The pools taken out are orphans now: still listed, with the provider they had.
        let old = std::mem::replace(&mut self.providers, providers);
        for (pool, provider) in old {
            if policy.pool(&pool).is_none() {
                self.orphan_pools.insert(pool, Some(provider));
            }
        }
        self.orphan_pools
            .retain(|pool, _| policy.pool(pool).is_none());
        self.core.set_policy(Arc::new(policy), catalog);
        self.prices.read_at(wall_now());
        self.groups_read.read_at(wall_now());
        self.parsed_policy = Some(parsed);
        self.cloud_groups = groups;
        self.report_group_changes(&unpriced);
        self.publish_prices();
        Ok(catalog_warning)
    }

    /// The clouds whose groups are due to be read again (`--group-refresh-interval`): those of
    /// the pools that take their templates from the cloud.
    fn groups_to_read(&mut self) -> reads::Asked {
        let now = wall_now();
        if self.args.dry_run || self.providers.is_empty() || !self.groups_read.due(now) {
            return Vec::new();
        }
        let Some(parsed) = self.parsed_policy.clone() else {
            return Vec::new();
        };
        let clouds: BTreeMap<String, Arc<dyn CloudProvider>> = self
            .providers
            .iter()
            .filter(|(pool, _)| parsed.pool(pool).is_some_and(|p| p.templates_from_cloud))
            .map(|(_, p)| (p.name().to_string(), p.clone()))
            .collect();
        if clouds.is_empty() {
            return Vec::new();
        }
        self.groups_read.read_at(now);
        clouds.into_iter().collect()
    }

    /// Merges the groups read again into the policy as parsed (`cloud_groups::reread`): the
    /// plan follows what they say now, the offerings of groups found since join the catalog. A
    /// cloud whose read failed keeps its last good groups; a group no longer found keeps its
    /// last template. Nothing is launched or terminated here.
    fn apply_groups(&mut self, read: Vec<(String, reads::GroupsRead)>) {
        if read.is_empty() {
            return;
        }
        let Some(parsed) = self.parsed_policy.clone() else {
            return;
        };
        let mut fresh = BTreeMap::new();
        let mut fresh_catalog = Catalog::default();
        for (cloud, read) in read {
            match read {
                Ok((t, c)) => {
                    fresh.extend(t);
                    fresh_catalog.instance_types.extend(c.instance_types);
                    fresh_catalog.offerings.extend(c.offerings);
                }
                Err(e) => {
                    warn!(
                        "reading the {cloud} groups again: {e}; the last good groups stay in force"
                    )
                }
            }
        }
        let r = gpu_node_autoscaler_core::cloud_groups::reread(
            &parsed,
            &self.cloud_groups,
            &fresh,
            self.core.catalog(),
            &fresh_catalog,
        );
        self.cloud_groups = r.groups;
        if r.changes.is_empty() && &r.catalog == self.core.catalog() {
            return;
        }
        self.report_group_changes(&r.changes);
        if self.core.policy().is_none_or(|p| **p != r.policy) || &r.catalog != self.core.catalog() {
            info!(
                changes = r.changes.len(),
                "cloud groups read again: the plan follows them"
            );
            self.core.set_policy(Arc::new(r.policy), r.catalog);
            self.publish_prices();
        }
    }

    /// Logs each change of the cloud groups, with an Event on the policy ConfigMap.
    fn report_group_changes(
        &self,
        changes: &[gpu_node_autoscaler_core::cloud_groups::GroupChange],
    ) {
        let src = self.state.lock().unwrap().policy_source().cloned();
        let (ns, name) = &self.policy_name;
        for c in changes {
            let message = c.message();
            if c.is_warning() {
                warn!("{message}");
            } else {
                info!("{message}");
            }
            if let Some(src) = &src {
                self.events.send(KubeNote {
                    object: configmap_ref(ns, name, &src.uid),
                    warning: c.is_warning(),
                    reason: c.reason(),
                    action: "ReadGroups",
                    message,
                });
            }
        }
    }

    /// Merges the prices read (when they were due) into the catalog in force.
    fn apply_prices(&mut self, read: Vec<(String, std::result::Result<Catalog, ProviderError>)>) {
        if read.is_empty() {
            return;
        }
        let Some(policy) = self.core.policy().cloned() else {
            return;
        };
        let mut catalog = self.core.catalog().clone();
        let mut changed = 0;
        for (cloud, read) in read {
            let result = match read {
                Ok(fresh) => {
                    let (merged, changes) =
                        gpu_node_autoscaler_core::prices::merge(&catalog, &fresh);
                    for c in &changes {
                        info!(
                            offering = %format!("{}/{}/{}", c.key.instance_type, c.key.zone, c.key.capacity_type),
                            from = c.from,
                            to = c.to,
                            "price changed"
                        );
                    }
                    changed += changes.len();
                    catalog = merged;
                    "ok"
                }
                Err(e) => {
                    warn!("reading the {cloud} prices: {e}; the last good prices stay in force");
                    "error"
                }
            };
            self.metrics
                .price_refreshes
                .get_or_create(&metrics::PriceRefresh {
                    provider: cloud,
                    result: result.to_string(),
                })
                .inc();
        }
        if changed > 0 {
            info!(changed, "prices refreshed");
            self.core.set_policy(policy, catalog);
            self.publish_prices();
        }
    }

    /// The prices in force, per offering.
    fn publish_prices(&self) {
        self.metrics.offering_price.clear();
        for o in &self.core.catalog().offerings {
            self.metrics
                .offering_price
                .get_or_create(&metrics::OfferingLabel {
                    instance_type: o.key.instance_type.clone(),
                    zone: o.key.zone.clone(),
                    capacity_type: o.key.capacity_type.to_string(),
                })
                .set(o.price_per_hour);
        }
    }

    /// Takes what the interruption queue answered: notices are kept until the core
    /// acknowledges them; what is no notice (an instance starting, an unreadable body) is
    /// deleted at once, within what is left of the pass's [`QUEUE_BUDGET`].
    async fn take_queue(&mut self, read: Option<reads::QueueRead>) {
        let (Some(q), Some((read, took))) = (self.queue.clone(), read) else {
            return;
        };
        self.queue_until = Some(tokio::time::Instant::now() + QUEUE_BUDGET.saturating_sub(took));
        let received = match read {
            Some(Ok(r)) => r,
            Some(Err(e)) => {
                warn!("interruption queue: {e}");
                return;
            }
            None => {
                self.queue_budget_spent("receive", took);
                return;
            }
        };
        for r in received {
            let kind = match &r.parsed {
                Ok(Parsed::Notice(n)) => n.kind.as_str(),
                Ok(Parsed::Irrelevant(_)) => "irrelevant",
                Err(_) => "unreadable",
            };
            if !self.notices.contains_key(&r.message_id) {
                self.metrics
                    .interruption_messages
                    .get_or_create(&metrics::NoticeLabel {
                        kind: kind.to_string(),
                    })
                    .inc();
            }
            match r.parsed {
                Ok(Parsed::Notice(n)) => {
                    self.notices.insert(r.message_id, (r.receipt, n));
                }
                Ok(Parsed::Irrelevant(_)) | Err(_) => {
                    if let Err(why) = &r.parsed {
                        warn!(message = %r.message_id, "interruption queue: deleting a message that is no notice: {why}");
                    }
                    if let Some(Err(e)) = self
                        .within_queue_budget("delete", q.delete(&r.receipt))
                        .await
                    {
                        warn!("interruption queue: {e}");
                    }
                }
            }
        }
    }

    /// Runs a call of the interruption queue within what is left of the pass's
    /// [`QUEUE_BUDGET`]; `None` when it runs out (the call is dropped). The first call cut
    /// short in a pass is counted (`cloud_requests_total{operation="interruption_queue",
    /// result="timeout"}`); the first pass of a stall sends a `CloudCallTimedOut` Event.
    async fn within_queue_budget<T>(
        &mut self,
        what: &str,
        call: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        if self.queue_spent {
            return None;
        }
        let until = *self
            .queue_until
            .get_or_insert_with(|| tokio::time::Instant::now() + QUEUE_BUDGET);
        let started = tokio::time::Instant::now();
        match tokio::time::timeout_at(until, call).await {
            Ok(r) => Some(r),
            Err(_) => {
                self.queue_budget_spent(what, started.elapsed());
                None
            }
        }
    }

    /// The pass's [`QUEUE_BUDGET`] ran out during a call of the queue: counted
    /// (`cloud_requests_total{operation="interruption_queue", result="timeout"}`), and the first
    /// pass of a stall sends a `CloudCallTimedOut` Event.
    fn queue_budget_spent(&mut self, what: &str, took: Duration) {
        self.queue_spent = true;
        let provider = providers::interruptions().map_or("", |(name, _)| name);
        self.metrics
            .cloud_call(provider, "interruption_queue", took, "timeout");
        let message = format!(
            "interruption queue: the pass's {}s for the queue ran out during a {what}; its other \
             calls wait for the next pass (a message not deleted is read again)",
            QUEUE_BUDGET.as_secs()
        );
        warn!("{message}");
        if !self.queue_stalled {
            self.queue_stalled = true;
            self.events.send(KubeNote {
                object: self.policy_ref(),
                warning: true,
                reason: "CloudCallTimedOut",
                action: "Queue",
                message: format!("{message}; passes go on"),
            });
        }
    }

    /// The XID errors dcgm-exporter reported, when `gpuMetrics` is set and they were read in
    /// this pass; `None` keeps the core's last reading (also when Prometheus cannot be read: a
    /// broken GPU does not heal because its metrics are out of reach).
    fn take_gpu_metrics(
        &mut self,
        read: Option<std::result::Result<BTreeMap<String, Vec<GpuXid>>, String>>,
    ) -> Option<BTreeMap<String, Vec<GpuXid>>> {
        if self
            .core
            .policy()
            .and_then(|p| p.gpu_metrics.as_ref())
            .is_none()
        {
            // Without gpuMetrics (any more), no XID stands.
            return self.xids_read_at.take().map(|_| BTreeMap::new());
        }
        let result = read?;
        self.metrics
            .gpu_metrics_reads
            .get_or_create(&metrics::ReadResult {
                result: if result.is_ok() { "ok" } else { "error" }.to_string(),
            })
            .inc();
        match result {
            Ok(x) => Some(x),
            Err(e) => {
                warn!("gpuMetrics: {e}; the last reading of XID errors stands");
                None
            }
        }
    }

    /// The provider that launches, lists and terminates the instances of `pool` (also of a pool
    /// no longer in the policy, by the provider that listed it).
    fn provider_for(&self, pool: &str) -> Option<Arc<dyn CloudProvider>> {
        self.providers
            .get(pool)
            .or_else(|| self.orphan_pools.get(pool).and_then(Option::as_ref))
            .cloned()
    }

    /// The provider of each of `pools`, each provider once (with the first pool that named it):
    /// pools often share one, and a question to the cloud need not be asked twice.
    fn providers_once<'a>(
        &self,
        pools: impl Iterator<Item = &'a gpu_node_autoscaler_core::policy::Pool>,
    ) -> Vec<(&'a str, Arc<dyn CloudProvider>)> {
        let mut out: Vec<(&str, Arc<dyn CloudProvider>)> = Vec::new();
        for pool in pools {
            if let Some(provider) = self.providers.get(&pool.name) {
                if !out.iter().any(|(_, p)| Arc::ptr_eq(p, provider)) {
                    out.push((&pool.name, provider.clone()));
                }
            }
        }
        out
    }

    /// Starts a pass: the policy, leadership and the last leader's history first (API calls
    /// with time-outs of their own), then the pass's reads of the cloud as a task the loop does
    /// not wait on ([`reads`]); [`Controller::take_reads`] decides once they are in.
    async fn pass(&mut self) {
        self.reload_policy().await;
        self.beat();
        if !self.elector.is_leader() {
            // Another replica may lead meanwhile: its history is read again on taking over.
            self.core.leadership_lost(&[]);
            return;
        }
        if self.core.needs_restore() && !self.restore_history().await {
            // Deciding without the last leader's cooldowns and back-offs could scale too early.
            return;
        }
        self.beat();
        let input = self.reads_input();
        self.reading = Some(Reading {
            task: tokio::spawn(reads::run(input)),
            since: tokio::time::Instant::now(),
        });
    }

    /// What this pass reads, with what the task needs of the controller.
    fn reads_input(&mut self) -> reads::Input {
        let now = wall_now();
        // Pools of one cloud share its provider: each is asked once.
        let clouds: BTreeMap<String, Arc<dyn CloudProvider>> = self
            .providers
            .values()
            .map(|p| (p.name().to_string(), p.clone()))
            .collect();
        let policy = self.core.policy().cloned();
        let prices = if !self.args.dry_run
            && !self.providers.is_empty()
            && policy.is_some()
            && self.prices.due(now)
        {
            self.prices.read_at(now);
            clouds.iter().map(|(c, p)| (c.clone(), p.clone())).collect()
        } else {
            Vec::new()
        };
        let owned = |v: Vec<(&str, Arc<dyn CloudProvider>)>| -> reads::Asked {
            v.into_iter().map(|(p, c)| (p.to_string(), c)).collect()
        };
        let (listing, reservations, launch_versions) = match &policy {
            Some(policy) => (
                Some(reads::Listing {
                    pools: self
                        .providers
                        .iter()
                        .map(|(n, p)| (n.clone(), p.clone()))
                        .collect(),
                    clouds: clouds.values().cloned().collect(),
                    orphan_pools: self.orphan_pools.clone(),
                    state: self.state.clone(),
                }),
                owned(self.providers_once(policy.pools.iter().filter(|p| {
                    p.capacity_types
                        .contains(&gpu_node_autoscaler_provider::CapacityType::Reserved)
                }))),
                owned(self.providers_once(policy.pools.iter())),
            ),
            None => (None, Vec::new(), Vec::new()),
        };
        let queue = self.queue.clone().map(|q| {
            // A stall lasts as long as passes run out of their budget: one Event for it.
            self.queue_stalled = self.queue_spent;
            self.queue_spent = false;
            (q, tokio::time::Instant::now() + QUEUE_BUDGET)
        });
        let now_i = tokio::time::Instant::now();
        let gpu_metrics = match policy.and_then(|p| p.gpu_metrics.clone()) {
            Some(cfg)
                if self
                    .xids_read_at
                    .is_none_or(|at| now_i.duration_since(at) >= cfg.interval) =>
            {
                self.xids_read_at = Some(now_i);
                Some((self.http.clone(), cfg))
            }
            _ => None,
        };
        let groups = self.groups_to_read();
        reads::Input {
            prices,
            groups,
            listing,
            reservations,
            launch_versions,
            queue,
            gpu_metrics,
        }
    }

    /// Ends the pass whose reads are all in (or gives them up once they are stuck).
    async fn take_reads(&mut self) {
        let Some(r) = &self.reading else { return };
        if !r.task.is_finished() {
            if r.since.elapsed() >= READS_STUCK_AFTER {
                r.task.abort();
                self.reading = None;
                let message = format!(
                    "the pass's reads of the cloud did not end within {}s: given up, the pass \
                     decided nothing; passes go on",
                    READS_STUCK_AFTER.as_secs()
                );
                warn!("{message}");
                let provider = self.providers.values().next().map_or("", |p| p.name());
                self.metrics
                    .cloud_call(provider, "reads", READS_STUCK_AFTER, "timeout");
                self.events.send(KubeNote {
                    object: self.policy_ref(),
                    warning: true,
                    reason: "CloudCallTimedOut",
                    action: "Read",
                    message,
                });
            }
            return;
        }
        let Some(r) = self.reading.take() else { return };
        match r.task.await {
            Ok(reads) => self.decide(reads).await,
            Err(e) => warn!("the pass's reads of the cloud ended abnormally: {e}"),
        }
    }

    /// The rest of a pass, with what it read: observes, decides and carries the decision out.
    async fn decide(&mut self, reads: reads::Reads) {
        if !self.elector.is_leader() {
            self.core.leadership_lost(&[]);
            return;
        }
        self.apply_prices(reads.prices);
        self.apply_groups(reads.groups);
        let instances = match reads.listing {
            Some(Ok((i, orphan_pools))) => {
                self.orphan_pools = orphan_pools;
                self.listing_stalled = false;
                Some(Arc::new(i))
            }
            Some(Err(e)) => {
                // Without the cloud's view, in-flight capacity is unknown: deciding now
                // could launch twice. Try again on the next pass.
                warn!("{e}; only expired drains are given back in this pass");
                let stalled = e.contains(instrumented::TIMED_OUT);
                if stalled && !self.listing_stalled {
                    self.events.send(KubeNote {
                        object: self.policy_ref(),
                        warning: true,
                        reason: "CloudCallTimedOut",
                        action: "List",
                        message: format!(
                            "{e}; passes go on, launching and removing nothing until the \
                             cloud answers again"
                        ),
                    });
                }
                self.listing_stalled = stalled;
                None
            }
            None => None,
        };
        let reservations = reads.reservations;
        let launch_versions = reads.launch_versions;
        let now = wall_now();
        let (mut snapshot, other_provider_ids, (requests, bad_requests), (buffers, bad_buffers)) = {
            let mut s = self.state.lock().unwrap();
            self.reacted.retain(|k| s.pods.items.contains_key(k));
            (
                s.snapshot(Vec::new()),
                s.rejected_provider_ids
                    .values()
                    .cloned()
                    .collect::<Vec<_>>(),
                s.provisioning_requests(),
                s.capacity_buffers(),
            )
        };
        snapshot.reservations = reservations;
        snapshot.launch_versions = launch_versions;
        self.publish_pending_gauges(&snapshot, now);
        for (key, why) in bad_requests {
            warn!(request = %key, "ProvisioningRequest not understood: {why}");
        }
        let assessment = self.core.assess_provisioning(&snapshot, &requests, now);
        self.request_pods = assessment
            .inject
            .iter()
            .filter_map(|p| {
                let name = p
                    .annotations
                    .get(gpu_node_autoscaler_core::provisioning::REQUEST_ANNOTATION)?;
                let uid = requests
                    .iter()
                    .find(|r| r.namespace == p.id.namespace && &r.name == name)
                    .map_or_else(String::new, |r| r.uid.clone());
                Some((
                    p.id.to_string(),
                    (p.id.namespace.clone(), name.clone(), uid),
                ))
            })
            .collect();
        if !assessment.inject.is_empty() {
            snapshot = assessment.snapshot(&snapshot);
        }
        // CapacityBuffers: their virtual pods planned after every real pod (and the requests').
        for (key, why) in bad_buffers {
            warn!(buffer = %key, "CapacityBuffer not understood: {why}");
        }
        let buffered = self.core.assess_buffers(&snapshot, &buffers, now);
        self.buffer_pods = buffered
            .inject
            .iter()
            .filter_map(|p| {
                let name = gpu_node_autoscaler_core::buffer::buffer_of(p)?;
                let uid = buffers
                    .iter()
                    .find(|b| b.namespace == p.id.namespace && b.name == name)
                    .map_or_else(String::new, |b| b.uid.clone());
                Some((
                    p.id.to_string(),
                    (p.id.namespace.clone(), name.to_string(), uid),
                ))
            })
            .collect();
        if !buffered.inject.is_empty() {
            snapshot = buffered.snapshot(&snapshot);
        }
        if self.publish_buffers(&buffered.report) && self.elector.is_leader() {
            // The status ConfigMap's buffer keys follow the buffers, not the core's status.
            self.write_buffer_status_keys().await;
        }
        // The requests' and buffers' status are the leader's to write, and not in dry-run
        // (nothing is launched for them there).
        if self.args.dry_run {
            for u in &assessment.updates {
                let c: Vec<String> = u
                    .conditions
                    .iter()
                    .map(|c| format!("{}={} ({})", c.kind, c.status, c.reason))
                    .collect();
                info!(request = %format!("{}/{}", u.namespace, u.name), "dry-run: ProvisioningRequest conditions not written: {}", c.join(", "));
            }
            for u in &buffered.updates {
                let c: Vec<String> = u
                    .status
                    .conditions
                    .iter()
                    .map(|c| format!("{}={} ({})", c.kind, c.status, c.reason))
                    .collect();
                info!(buffer = %format!("{}/{}", u.namespace, u.name), "dry-run: CapacityBuffer status not written: {}", c.join(", "));
            }
            for t in &buffered.templates {
                info!(buffer = %format!("{}/{}", t.namespace, t.buffer), "dry-run: the buffer's PodTemplate {} not written", t.name);
            }
        } else if self.elector.is_leader() {
            for u in &assessment.updates {
                if let Err(e) = kube_io::write_provisioning_conditions(&self.client, u).await {
                    warn!(request = %format!("{}/{}", u.namespace, u.name), "writing the ProvisioningRequest's conditions: {e}");
                }
            }
            for u in &buffered.updates {
                if let Err(e) = kube_io::write_buffer_status(&self.client, u).await {
                    warn!(buffer = %format!("{}/{}", u.namespace, u.name), "writing the CapacityBuffer's status: {e}");
                }
            }
            for t in &buffered.templates {
                match kube_io::write_buffer_template(&self.client, t).await {
                    Ok(()) => {
                        info!(buffer = %format!("{}/{}", t.namespace, t.buffer), "PodTemplate {} written from the buffer's scalable object", t.name)
                    }
                    Err(e) => {
                        warn!(buffer = %format!("{}/{}", t.namespace, t.buffer), "writing the buffer's PodTemplate {}: {e}", t.name)
                    }
                }
            }
        }
        self.take_queue(reads.queue).await;
        self.beat();
        let gpu_xids = self.take_gpu_metrics(reads.gpu_metrics);
        let obs = Observation {
            now,
            snapshot,
            instances,
            other_provider_ids,
            policy_valid: self.policy_valid,
            notices: self.notices.values().map(|(_, n)| n.clone()).collect(),
            gpu_xids,
        };
        let t0 = std::time::Instant::now();
        self.decided_at = Some(now);
        let actions = self.core.pass(obs);
        self.publish_node_gauges();
        self.carry_out(actions, t0.elapsed()).await;
    }

    /// Carries out a pass's steps until it ends, or until a step waits for launches (then the
    /// loop resumes it once they are answered).
    async fn carry_out(&mut self, mut actions: Vec<Action>, mut deciding: Duration) {
        while !actions.is_empty() {
            let Some((feedback, calls)) = self.execute(actions).await else {
                break;
            };
            if !calls.is_empty() {
                self.metrics
                    .launches_in_progress
                    .set(calls.launches.len() as i64);
                self.waiting = Some(Waiting {
                    feedback,
                    calls,
                    since: tokio::time::Instant::now(),
                    deciding,
                });
                return;
            }
            let t = std::time::Instant::now();
            actions = self.core.resume(feedback);
            deciding += t.elapsed();
        }
        self.metrics
            .plan_duration_seconds
            .observe(deciding.as_secs_f64());
        self.metrics
            .last_pass_timestamp_seconds
            .set(wall_now().0 / 1000);
    }

    /// Resumes the waiting step once every one of its launches and terminations is answered.
    async fn resume_launched(&mut self) {
        let all_back = self
            .waiting
            .as_ref()
            .is_some_and(|w| w.calls.all_finished());
        if !all_back {
            return;
        }
        let Some(w) = self.waiting.take() else {
            return;
        };
        self.metrics.launches_in_progress.set(0);
        let mut feedback = w.feedback;
        for (instance_id, task) in w.calls.terminations {
            let result = task.await.unwrap_or_else(|e| {
                Err(ProviderError::Other {
                    message: format!("the termination task ended abnormally: {e}"),
                })
            });
            if let Err(e) = &result {
                warn!(instance = %instance_id, "terminating: {e}");
            }
            feedback.push(Feedback::Terminated {
                instance_id,
                result,
            });
        }
        for (launch_id, task) in w.calls.launches {
            let result = task.await.unwrap_or_else(|e| {
                // What the cloud did is unknown: the instances are found by their tags.
                Err(ProviderError::Other {
                    message: format!("the launch task ended abnormally: {e}"),
                })
            });
            feedback.push(Feedback::Launched { launch_id, result });
        }
        let t = std::time::Instant::now();
        let actions = self.core.resume(feedback);
        self.carry_out(actions, w.deciding + t.elapsed()).await;
    }

    /// Carries out one step's actions in order; launches and terminations are started, not
    /// awaited (their tasks are returned). `None` when leadership was lost on the way (the rest
    /// is not done: the next leader decides again).
    async fn execute(&mut self, actions: Vec<Action>) -> Option<(Vec<Feedback>, Calls)> {
        let mut feedback = Vec::new();
        let mut calls = Calls::default();
        // A notice is acknowledged only once the taints that record it are on the nodes.
        let mut taint_failed = false;
        let mut status_written = true;
        let mut launch_unrecorded = false;
        // Nominations are independent patches, made together once the rest is done: a burst of
        // pending pods placed on registered nodes is as many API calls in one pass.
        let mut nominations = Vec::new();
        let mut actions = actions.into_iter();
        while let Some(action) = actions.next() {
            self.beat();
            // Every change to the cluster or the cloud is the leader's.
            if action_mutates(&action) && !self.elector.is_leader() {
                let mut not_done = vec![action];
                not_done.extend(actions);
                self.core.leadership_lost(&not_done);
                return None;
            }
            match action {
                Action::Register(r) => {
                    let ok = self.register(&r).await;
                    feedback.push(Feedback::Registered {
                        node: r.node,
                        changed: ok,
                    });
                }
                // The status that records a step's launches comes before them: without it a
                // leader that dies before their answer could leave them to be launched again.
                // Not sent, they did not happen (the next pass plans their pods again).
                Action::Launch { request, .. } if !status_written => {
                    warn!(
                        launch = %request.launch_id,
                        pool = %request.pool,
                        "not launching: the status recording the launch was not written"
                    );
                    self.metrics
                        .failed_launches
                        .get_or_create(&FailedLaunch {
                            pool: request.pool.clone(),
                            reason: "not_recorded".to_string(),
                        })
                        .inc();
                    if !launch_unrecorded {
                        launch_unrecorded = true;
                        self.events.send(KubeNote {
                            object: self.policy_ref(),
                            warning: true,
                            reason: "LaunchNotRecorded",
                            action: "ScaleUp",
                            message: format!(
                                "pool {}: not launching while the status ConfigMap {}/{} \
                                 cannot be written (it records launches before they are \
                                 sent, for the next leader); tried again every pass",
                                request.pool, self.status_name.0, self.status_name.1
                            ),
                        });
                    }
                }
                Action::Launch { request, .. } => match self.providers.get(&request.pool) {
                    Some(p) => {
                        let p = p.clone();
                        let launch_id = request.launch_id.clone();
                        let task = tokio::spawn(async move { p.launch(&request).await });
                        calls.launches.push((launch_id, task));
                    }
                    None => feedback.push(Feedback::Launched {
                        result: Err(ProviderError::InvalidRequest {
                            message: format!("no provider for pool {}", request.pool),
                        }),
                        launch_id: request.launch_id,
                    }),
                },
                Action::Terminate {
                    pool,
                    instance_id,
                    why,
                } => {
                    info!(instance = %instance_id, pool = %pool, "terminating: {why}");
                    match self.provider_for(&pool) {
                        Some(p) => {
                            let id = instance_id.clone();
                            let task = tokio::spawn(async move { p.terminate(&id).await });
                            calls.terminations.push((instance_id, task));
                        }
                        None => {
                            let message = format!("no provider for pool {pool}");
                            warn!(instance = %instance_id, "terminating: {message}");
                            feedback.push(Feedback::Terminated {
                                instance_id,
                                result: Err(ProviderError::InvalidRequest { message }),
                            });
                        }
                    }
                }
                Action::DeleteNode { node } => {
                    let api: Api<K8sNode> = Api::all(self.client.clone());
                    if let Err(e) = kube_io::delete_node(&api, &node).await {
                        warn!(node = %node, "deleting: {e}");
                    }
                }
                Action::Drain(order) => {
                    let job = DrainJob {
                        provider: self.provider_for(&order.pool),
                        node: order.node.clone(),
                        pool: order.pool,
                        instance_id: order.instance_id,
                        deadline: order.deadline,
                        reason: order.reason,
                        kind: order.kind,
                    };
                    let ctx = self.drain_ctx.clone();
                    self.drains
                        .insert(order.node, tokio::spawn(drain::drain(ctx, job)));
                }
                Action::RollBack { node, why, .. } => {
                    let ctx = self.drain_ctx.clone();
                    let n = node.clone();
                    let task = tokio::spawn(async move {
                        match drain::roll_back(&ctx, &n, &why).await {
                            Ok(()) => DrainOutcome::RolledBack(why),
                            Err(e) => {
                                warn!(node = %n, "rolling back: {e}");
                                DrainOutcome::Abandoned
                            }
                        }
                    });
                    self.drains.insert(node, task);
                }
                Action::Taint {
                    node,
                    taint,
                    present,
                } => {
                    let api: Api<K8sNode> = Api::all(self.client.clone());
                    if let Err(e) = kube_io::set_taint(&api, &node, &taint, present).await {
                        warn!(node = %node, "tainting: {e}");
                        taint_failed = true;
                    }
                }
                Action::AckNotice { message_id } => {
                    if taint_failed {
                        continue; // read again, and acted on, in the next pass
                    }
                    let (Some(q), Some((receipt, _))) =
                        (self.queue.clone(), self.notices.remove(&message_id))
                    else {
                        continue;
                    };
                    if let Some(Err(e)) =
                        self.within_queue_budget("delete", q.delete(&receipt)).await
                    {
                        warn!(message = %message_id, "interruption queue: {e}");
                    }
                }
                // A pod made from a ProvisioningRequest does not exist: its node is booked.
                Action::Nominate { pod, .. }
                    if self.request_pods.contains_key(&pod)
                        || self.buffer_pods.contains_key(&pod) => {}
                Action::Nominate { pod, uid, node } => nominations.push((pod, uid, node)),
                Action::Annotate { node, key, value } => {
                    let api: Api<K8sNode> = Api::all(self.client.clone());
                    if let Err(e) = kube_io::annotate_node(&api, &node, key, value.as_deref()).await
                    {
                        warn!(node = %node, "annotating: {e}");
                    }
                }
                Action::Event(note) => self.events.send(KubeNote {
                    object: match &note.subject {
                        Subject::Pod {
                            namespace,
                            name,
                            uid,
                        } => {
                            let key = format!("{namespace}/{name}");
                            match (self.request_pods.get(&key), self.buffer_pods.get(&key)) {
                                (Some((ns, request, uid)), _) => {
                                    kube_io::provisioning_request_ref(ns, request, uid)
                                }
                                (None, Some((ns, buffer, uid))) => {
                                    kube_io::buffer_ref(ns, buffer, uid)
                                }
                                (None, None) => pod_ref(namespace, name, uid),
                            }
                        }
                        Subject::Node(n) => node_ref(n),
                        Subject::Pool(_) => self.policy_ref(),
                    },
                    warning: note.warning,
                    reason: note.reason,
                    action: note.action,
                    message: note.message,
                }),
                Action::Log { level, message } => match level {
                    Level::Info => info!("{message}"),
                    Level::Warn => warn!("{message}"),
                },
                Action::Count(c) => self.count(c),
                Action::Status(st) => status_written = self.write_status(&st).await,
            }
        }
        let client = &self.client;
        futures::stream::iter(nominations)
            .for_each_concurrent(NOMINATIONS_AT_ONCE, |(pod, uid, node)| async move {
                let Some((namespace, name)) = pod.split_once('/') else {
                    return;
                };
                if let Err(e) = kube_io::nominate_pod(client, namespace, name, &uid, &node).await {
                    warn!(pod = %pod, node = %node, "nominating: {e}");
                }
            })
            .await;
        Some((feedback, calls))
    }

    fn count(&mut self, c: Count) {
        match c {
            Count::ScaleUps { pool, nodes } => {
                self.metrics
                    .scale_ups
                    .get_or_create(&PoolLabel { pool })
                    .inc_by(u64::from(nodes));
            }
            Count::ScaleDown { pool } => {
                self.metrics
                    .scale_downs
                    .get_or_create(&PoolLabel { pool })
                    .inc();
            }
            Count::FailedLaunch { pool, reason } => {
                self.metrics
                    .failed_launches
                    .get_or_create(&FailedLaunch {
                        pool,
                        reason: reason.to_string(),
                    })
                    .inc();
            }
            Count::Planned { pods } => {
                let now = wall_now();
                let s = self.state.lock().unwrap();
                for p in pods {
                    if let Some(since) = s.unschedulable_since.get(&p) {
                        if self.reacted.insert(p) {
                            self.metrics
                                .reaction_seconds
                                .observe(now.since(*since).as_secs_f64());
                        }
                    }
                }
            }
            Count::NodesGpusLost(n) => {
                self.metrics.nodes_gpus_lost.set(n as i64);
            }
            Count::NodesUnhealthy(n) => {
                self.metrics.nodes_unhealthy.set(n as i64);
            }
            Count::NodesDrifted(n) => {
                self.metrics.nodes_drifted.set(n as i64);
            }
            Count::Replaced { pool, cause } => {
                self.metrics
                    .nodes_replaced
                    .get_or_create(&metrics::Replaced {
                        pool,
                        cause: cause.to_string(),
                    })
                    .inc();
            }
            Count::Refused { pool } => {
                self.metrics
                    .nodes_refused
                    .get_or_create(&PoolLabel { pool })
                    .inc();
            }
            Count::GiveUpTerminateFailed { pool } => {
                self.metrics
                    .give_up_terminations_failed
                    .get_or_create(&PoolLabel { pool })
                    .inc();
            }
            Count::CapacityBlockPodHoursMoved { pool, pod_hours } => {
                self.metrics
                    .capacity_block_pod_hours_moved
                    .get_or_create(&PoolLabel { pool })
                    .inc_by(pod_hours);
            }
        }
    }

    /// The policy ConfigMap, what Events about a pool are recorded on.
    fn policy_ref(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        let (ns, name) = &self.policy_name;
        let uid = self
            .state
            .lock()
            .unwrap()
            .policy_source()
            .map(|s| s.uid.clone())
            .unwrap_or_default();
        configmap_ref(ns, name, &uid)
    }

    /// Gives a Node of ours its pool's labels and taints (a real node registers with what its
    /// kubelet flags say, which need not name the pool). True when the Node was written.
    async fn register(&mut self, r: &Registration) -> bool {
        let api: Api<K8sNode> = Api::all(self.client.clone());
        let result = kube_io::modify_node(&api, &r.node, |n| {
            let mut changed = false;
            let annotations = n.metadata.annotations.get_or_insert_with(Default::default);
            for (k, v) in &r.annotations {
                if annotations.get(k) != Some(v) {
                    annotations.insert(k.clone(), v.clone());
                    changed = true;
                }
            }
            let labels = n.metadata.labels.get_or_insert_with(Default::default);
            for (k, v) in &r.labels {
                if labels.get(k) != Some(v) {
                    labels.insert(k.clone(), v.clone());
                    changed = true;
                }
            }
            let taints = n
                .spec
                .get_or_insert_with(Default::default)
                .taints
                .get_or_insert_with(Vec::new);
            let before = taints.len();
            taints.retain(|x| {
                !r.remove_taints
                    .iter()
                    .any(|t| t.key == x.key && t.effect.as_str() == x.effect)
            });
            changed |= taints.len() != before;
            for t in &r.taints {
                let effect = t.effect.as_str();
                if !taints.iter().any(|x| x.key == t.key && x.effect == effect) {
                    taints.push(k8s_openapi::api::core::v1::Taint {
                        key: t.key.clone(),
                        value: (!t.value.is_empty()).then(|| t.value.clone()),
                        effect: effect.to_string(),
                        time_added: None,
                    });
                    changed = true;
                }
            }
            changed
        })
        .await;
        match result {
            Ok(()) => {
                if r.changes_shape() {
                    info!(node = %r.node, pool = %r.pool, "registered the node in its pool");
                }
                for t in &r.remove_taints {
                    info!(node = %r.node, "startup taint {}:{} removed", t.key, t.effect.as_str());
                }
                true
            }
            Err(e) => {
                warn!(node = %r.node, pool = %r.pool, "registering the node: {e}");
                false
            }
        }
    }

    /// Gauges read off the cluster as it is.
    fn publish_pending_gauges(&self, snapshot: &Snapshot, now: Time) {
        let pending = snapshot
            .pods
            .iter()
            .filter(|p| p.is_pending() && p.wants_gpu())
            .count();
        self.metrics.pending_gpu_pods.set(pending as i64);
        let oldest = {
            let s = self.state.lock().unwrap();
            s.unschedulable_since
                .values()
                .map(|t| now.since(*t).as_secs() as i64)
                .max()
                .unwrap_or(0)
        };
        self.metrics.oldest_pending_gpu_pod_seconds.set(oldest);
    }

    /// Nodes and GPUs per pool and capacity type, and unneeded nodes per pool, as the decision
    /// core saw them in its last pass (pools adopted by nodeSelector).
    fn publish_node_gauges(&self) {
        let g = self.core.node_gauges();
        self.metrics.nodes.clear();
        self.metrics.gpus.clear();
        self.metrics.nodes_unneeded.clear();
        for (pool, n) in &g.unneeded {
            self.metrics
                .nodes_unneeded
                .get_or_create(&PoolLabel { pool: pool.clone() })
                .set(*n);
        }
        for ((pool, ct), (nodes, gpus)) in &g.by_capacity {
            let key = PoolCapacity {
                pool: pool.clone(),
                capacity_type: ct.clone(),
            };
            self.metrics.nodes.get_or_create(&key).set(*nodes);
            self.metrics.gpus.get_or_create(&key).set(*gpus);
        }
    }

    /// Each CapacityBuffer's room and cost as metrics; the series of buffers gone are removed.
    /// Whether the report changed since the last pass.
    fn publish_buffers(&mut self, report: &[gpu_node_autoscaler_core::buffer::Report]) -> bool {
        let m = &self.metrics;
        for old in &self.buffer_report {
            if !report.iter().any(|r| r.buffer == old.buffer) {
                let l = metrics::BufferLabel {
                    buffer: old.buffer.clone(),
                };
                m.buffer_replicas.remove(&l);
                m.buffer_ready_replicas.remove(&l);
                m.buffer_gpus.remove(&l);
                m.buffer_cost.remove(&l);
            }
        }
        for r in report {
            let l = metrics::BufferLabel {
                buffer: r.buffer.clone(),
            };
            m.buffer_replicas
                .get_or_create(&l)
                .set(i64::from(r.replicas));
            m.buffer_ready_replicas
                .get_or_create(&l)
                .set(i64::from(r.ready));
            m.buffer_gpus.get_or_create(&l).set(r.gpus);
            m.buffer_cost.get_or_create(&l).set(r.cost_per_hour);
        }
        let changed = self.buffer_report != report;
        self.buffer_report = report.to_vec();
        changed
    }

    async fn write_buffer_status_keys(&self) {
        let (ns, name) = &self.status_name;
        if let Err(e) = kube_io::write_status(&self.client, ns, name, self.buffer_data()).await {
            warn!("writing the status ConfigMap: {e}");
        }
    }

    /// The status ConfigMap's `buffers` (for people) and `buffers.json` (for tools).
    fn buffer_data(&self) -> BTreeMap<String, String> {
        let mut buffers = String::new();
        for r in &self.buffer_report {
            buffers.push_str(&format!(
                "{}: {} chunks ({} GPUs), {} warm, {} on their way, {} without a node; ${:.3}/hour\n",
                r.buffer, r.replicas, r.gpus, r.ready, r.provisioning, r.unplaced, r.cost_per_hour
            ));
        }
        if buffers.is_empty() {
            buffers.push_str("none\n");
        }
        BTreeMap::from([
            ("buffers".to_string(), buffers),
            (
                "buffers.json".to_string(),
                serde_json::to_string_pretty(&self.buffer_report).unwrap_or_default(),
            ),
        ])
    }

    /// Writes the status ConfigMap; false when it could not be written.
    async fn write_status(&self, st: &status::Status) -> bool {
        let mut data = self.buffer_data();
        data.insert("status".to_string(), status::to_text(st));
        data.insert(
            "status.json".to_string(),
            serde_json::to_string_pretty(st).unwrap_or_default(),
        );
        let (ns, name) = &self.status_name;
        match kube_io::write_status(&self.client, ns, name, data).await {
            Ok(()) => true,
            Err(e) => {
                warn!("writing the status ConfigMap: {e}");
                false
            }
        }
    }
}

/// Whether an action changes the cluster or the cloud (only the leader's may).
fn action_mutates(a: &Action) -> bool {
    !matches!(
        a,
        Action::Event(_) | Action::Log { .. } | Action::Count(_) | Action::Status(_)
    )
}

/// The `--catalog` file, else the built-in catalog for the policy's region; with a warning when
/// that region has none and another region's list prices are used.
fn load_catalog(
    path: Option<&std::path::Path>,
    policy: &Policy,
) -> std::result::Result<(Catalog, Option<String>), String> {
    let text = path
        .map(|p| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display())))
        .transpose()?;
    let name = path.map(|p| p.display().to_string());
    let file = name.as_deref().zip(text.as_deref());
    let (types, warning) = gpu_node_autoscaler_core::catalog::load(file, policy.region.as_deref())
        .map_err(|e| e.to_string())?;
    Ok((
        gpu_node_autoscaler_core::catalog::offerings_from_list_prices(policy, types),
        warning,
    ))
}

/// One provider per cloud the policy's pools use, and their catalogs merged. Availability is
/// learnt by failing (insufficient capacity), not assumed from the catalog.
/// The providers of the policy's pools, the catalog they offer, and the policy with what they
/// say of the pools whose templates come from the cloud ([`Policy::with_cloud_templates`]).
async fn build_providers(
    policy: Policy,
    file_catalog: &Catalog,
    args: &RunArgs,
    cluster_id: &str,
    metrics: &Arc<Metrics>,
    client: &Client,
) -> std::result::Result<BuiltProviders, String> {
    let mut providers: BTreeMap<String, Arc<dyn CloudProvider>> = BTreeMap::new();
    let mut catalog = Catalog::default();
    let mut found = BTreeMap::new();
    let clouds: std::collections::BTreeSet<&str> =
        policy.pools.iter().map(|p| p.provider.as_str()).collect();
    for cloud in clouds {
        let host = providers::Host {
            cluster_id,
            client,
            endpoint_url: args.endpoint_url(cloud),
        };
        let provider = providers::build(cloud, &policy, file_catalog, host).await?;
        let provider = crate::instrumented::Instrumented::wrap(provider, metrics.clone());
        let mut c = provider
            .catalog()
            .await
            .map_err(|e| format!("reading the {cloud} catalog: {e}"))?;
        for o in &mut c.offerings {
            o.available = true;
        }
        for t in c.instance_types {
            if catalog.instance_type(&t.name).is_none() {
                catalog.instance_types.push(t);
            }
        }
        catalog.offerings.extend(c.offerings);
        if policy
            .pools
            .iter()
            .any(|p| p.provider == cloud && p.templates_from_cloud)
        {
            found.extend(
                provider
                    .templates()
                    .await
                    .map_err(|e| format!("reading the {cloud} groups' templates: {e}"))?,
            );
        }
        for p in policy.pools.iter().filter(|p| p.provider == cloud) {
            providers.insert(p.name.clone(), provider.clone());
        }
    }
    // The groups as first read; their instance types nothing prices are reported.
    let r = gpu_node_autoscaler_core::cloud_groups::reread(
        &policy,
        &Default::default(),
        &found,
        &catalog,
        &Catalog::default(),
    );
    let unpriced = r
        .changes
        .into_iter()
        .filter(|c| {
            matches!(
                c,
                gpu_node_autoscaler_core::cloud_groups::GroupChange::Unpriced { .. }
            )
        })
        .collect();
    Ok((providers, catalog, r.policy, r.groups, unpriced))
}

/// What [`build_providers`] gives: the providers per pool, their catalog, the policy with its
/// cloud groups' templates, those groups, and their instance types nothing prices.
type BuiltProviders = (
    BTreeMap<String, Arc<dyn CloudProvider>>,
    Catalog,
    Policy,
    gpu_node_autoscaler_core::cloud_groups::Groups,
    Vec<gpu_node_autoscaler_core::cloud_groups::GroupChange>,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    #[test]
    fn the_cluster_autoscalers_flag_names_mean_the_same_and_the_old_names_still_work() {
        use clap::Parser;
        let ca = Cli::try_parse_from([
            "run",
            "--scan-interval=5s",
            "--leader-elect-lease-duration=20s",
            "--leader-elect-retry-period=3s",
            "--max-graceful-termination-sec=120",
        ])
        .unwrap()
        .run;
        let ours = Cli::try_parse_from([
            "run",
            "--resync=5s",
            "--lease-duration=20s",
            "--lease-retry=3s",
            "--max-graceful-termination=2m",
        ])
        .unwrap()
        .run;
        for a in [&ca, &ours] {
            assert_eq!(a.resync, Duration::from_secs(5));
            assert_eq!(a.lease_duration, Duration::from_secs(20));
            assert_eq!(a.lease_retry, Duration::from_secs(3));
            assert_eq!(a.max_graceful_termination, Duration::from_secs(120));
        }
        let e = Cli::try_parse_from(["run", "--scan-interval=often"])
            .err()
            .unwrap();
        assert!(e.to_string().contains("--scan-interval"), "{e}");
    }

    #[test]
    fn the_loop_stays_alive_while_a_launch_is_awaited_until_it_is_stuck() {
        assert!(loop_alive(None));
        assert!(loop_alive(Some(Duration::from_secs(300))));
        assert!(!loop_alive(Some(LAUNCH_STUCK_AFTER)));
    }
}
