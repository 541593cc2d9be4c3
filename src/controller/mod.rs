//! The controller (`gpu-node-autoscaler run`): watch, decide, act.
//!
//! Watch tasks keep a [`store::ClusterState`] of model values; the loop waits until every store
//! has synced, batches newly unschedulable GPU pods (idle/max window from the policy) and resyncs
//! every `--resync`; each pass rebuilds in-flight launches from the cloud (tags) and the Nodes
//! (providerIDs), plans with the pure planner and acts: launches through the fallback list,
//! drains, Events, the status ConfigMap and metrics. Only the Lease holder acts.

pub mod drain;
pub mod fleet;
pub mod kube_io;
pub mod leader;
pub mod metrics;
pub mod status;
pub mod store;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use gpu_node_autoscaler_provider::retry::{backoff, jitter_unit};
use gpu_node_autoscaler_provider::{Catalog, CloudProvider, Instance, OfferingKey, ProviderError};
use k8s_openapi::api::core::v1::{ConfigMap, Node as K8sNode, Pod as K8sPod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::runtime::watcher;
use kube::Client;
use tracing::{error, info, warn};

use crate::model::snapshot::PoolState;
use crate::model::{labels, Snapshot, Time};
use crate::plan::{self, Plan, Templates};
use crate::policy::{parse_policy, Policy};
use crate::sim::Batch;

use drain::{DrainContext, DrainJob, DrainOutcome};
use fleet::{fleet_view, launch_request, registrations, short_gangs, FleetView, Registration};
use kube_io::{configmap_ref, node_ref, pod_ref, EventSink, Note};
use leader::Elector;
use metrics::{FailedLaunch, Health, Metrics, PoolCapacity, PoolLabel};
use status::{PoolHistory, StatusInput};
use store::{ClusterState, Kind};

/// Now, from the wall clock (the only place the controller reads it besides timers).
pub fn wall_now() -> Time {
    Time(chrono::Utc::now().timestamp_millis())
}

/// The `reason` label values of `failed_launches_total`.
pub const LAUNCH_FAILURE_REASONS: [&str; 7] = [
    "insufficient_capacity",
    "quota_exceeded",
    "throttled",
    "invalid_request",
    "not_found",
    "other",
    "provision_timeout",
];

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
    crate::policy::duration::parse_duration(s).map_err(|e| e.to_string())
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
    /// Instance catalog CSV for on-demand prices (default: the built-in AWS us-east-1 catalog).
    #[arg(long)]
    pub catalog: Option<PathBuf>,
    /// EC2 endpoint (for tests against an emulator); the region comes from the policy.
    #[arg(long)]
    pub aws_endpoint_url: Option<String>,
    /// ESS/ECS/VPC endpoint (for tests against a local fake); the region comes from the policy.
    #[arg(long)]
    pub alibaba_endpoint_url: Option<String>,
    /// Periodic resync: a pass at least this often.
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    pub resync: Duration,
    #[arg(long, default_value = "15s", value_parser = duration_arg)]
    pub lease_duration: Duration,
    #[arg(long, default_value = "2s", value_parser = duration_arg)]
    pub lease_retry: Duration,
    /// How long a drain may take (PDB refusals are retried until then) before the node is
    /// given back.
    #[arg(long, default_value = "600s", value_parser = duration_arg)]
    pub max_graceful_termination: Duration,
    /// Evictions per second, across all drains.
    #[arg(long, default_value_t = 10)]
    pub evictions_per_second: u32,
    /// Events written per second at most.
    #[arg(long, default_value_t = 20)]
    pub events_per_second: u32,
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
    let client = Client::try_from(config).context("building the Kubernetes client")?;
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
        Api::<K8sPod>::all(client.clone()),
        pods_cfg,
        Kind::Pod,
        state.clone(),
    ));
    tokio::spawn(kube_io::watch_into(
        Api::<K8sNode>::all(client.clone()),
        watcher::Config::default(),
        Kind::Node,
        state.clone(),
    ));
    tokio::spawn(kube_io::watch_into(
        Api::<PodDisruptionBudget>::all(client.clone()),
        watcher::Config::default(),
        Kind::Pdb,
        state.clone(),
    ));
    tokio::spawn(kube_io::watch_into(
        Api::<ConfigMap>::namespaced(client.clone(), &policy_ns),
        watcher::Config::default().fields(&format!("metadata.name={policy_name}")),
        Kind::PolicyConfigMap,
        state.clone(),
    ));

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
        policy: None,
        policy_seen: None,
        policy_apply_failed: None,
        policy_valid: false,
        templates: None,
        catalog: Catalog::default(),
        providers: BTreeMap::new(),
        ice: BTreeMap::new(),
        history: BTreeMap::new(),
        recent: HashMap::new(),
        given_up: HashMap::new(),
        registered: HashSet::new(),
        lost: HashMap::new(),
        removed: HashMap::new(),
        launch_backoff: HashMap::new(),
        restored: false,
        drains: HashMap::new(),
        notified: HashMap::new(),
        reacted: HashSet::new(),
        unneeded_dry: BTreeMap::new(),
        last_status: None,
        kept: BTreeMap::new(),
        gpus_lost: BTreeSet::new(),
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
    policy: Option<Arc<Policy>>,
    /// resourceVersion of the policy ConfigMap last looked at.
    policy_seen: Option<String>,
    /// resourceVersion of a valid policy that could not be applied yet (reported once).
    policy_apply_failed: Option<String>,
    policy_valid: bool,
    templates: Option<Arc<Templates>>,
    catalog: Catalog,
    /// Provider per pool name.
    providers: BTreeMap<String, Arc<dyn CloudProvider>>,
    /// Offerings that failed for lack of capacity, unavailable until then.
    ice: BTreeMap<OfferingKey, Time>,
    history: BTreeMap<String, PoolHistory>,
    /// Instances this process launched, until the cloud's listing shows them.
    recent: HashMap<String, (Instance, Time)>,
    /// Launch ids given up (never registered in time, or a gang's partial launch given back),
    /// with when: a re-plan uses a new id.
    given_up: HashMap<String, Time>,
    /// Instances seen with a Node; and since when those without one any more lost it.
    registered: HashSet<String>,
    lost: HashMap<String, Time>,
    /// Nodes this process removed, so a stale cache does not resume their drain.
    removed: HashMap<String, Time>,
    /// Per pool: no launch before this time after failures other than capacity, and how many.
    launch_backoff: HashMap<String, (Time, u32)>,
    /// History restored from the status ConfigMap (after a restart or a failover).
    restored: bool,
    /// Running drains: node → (pool, task).
    drains: HashMap<String, (String, tokio::task::JoinHandle<DrainOutcome>)>,
    /// The last NotTriggerScaleUp reason sent per pod.
    notified: HashMap<String, String>,
    /// Pods whose reaction time was recorded.
    reacted: HashSet<String>,
    /// "Unneeded since" per node, kept in memory in dry-run (no annotation is written).
    unneeded_dry: BTreeMap<String, String>,
    last_status: Option<(String, Time)>,
    /// Why each idle-looking node is kept, as last logged.
    kept: BTreeMap<String, String>,
    /// Nodes whose GPUs went missing, as last reported.
    gpus_lost: BTreeSet<String>,
}

impl Controller {
    async fn run_loop(&mut self, stop: &mut tokio::sync::watch::Receiver<bool>) {
        let start = tokio::time::Instant::now();
        let ms = |i: tokio::time::Instant| i.duration_since(start).as_millis() as i64;
        let mut batch = Batch::default();
        let mut seen_unschedulable = 0u64;
        let mut next_resync = tokio::time::Instant::now();
        let tick = Duration::from_millis(200);
        loop {
            if *stop.borrow() {
                break;
            }
            self.health
                .heartbeat
                .store(wall_now().0 / 1000, Ordering::Relaxed);
            let (synced, new_unschedulable) = {
                let s = self.state.lock().unwrap();
                (s.all_synced(), s.new_unschedulable)
            };
            self.health.ready.store(synced, Ordering::Relaxed);
            self.metrics.leader.set(i64::from(self.elector.is_leader()));
            let now_i = tokio::time::Instant::now();
            if new_unschedulable != seen_unschedulable {
                seen_unschedulable = new_unschedulable;
                batch.add(ms(now_i));
            }
            let (idle, max) = self
                .policy
                .as_ref()
                .map(|p| (p.batching.idle, p.batching.max))
                .unwrap_or((Duration::from_secs(1), Duration::from_secs(10)));
            let batch_due = batch
                .deadline(idle.as_millis() as i64, max.as_millis() as i64)
                .is_some_and(|d| d <= ms(now_i));
            if synced && (batch_due || now_i >= next_resync) {
                batch.clear();
                next_resync = now_i + self.args.resync;
                self.pass().await;
            }
            self.reap_drains();
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// Collects finished drains.
    fn reap_drains(&mut self) {
        let done: Vec<String> = self
            .drains
            .iter()
            .filter(|(_, (_, h))| h.is_finished())
            .map(|(n, _)| n.clone())
            .collect();
        for node in done {
            let Some((pool, h)) = self.drains.remove(&node) else {
                continue;
            };
            let pool = Some(pool).filter(|p| !p.is_empty());
            let outcome = futures::FutureExt::now_or_never(h)
                .and_then(|r| r.ok())
                .unwrap_or(DrainOutcome::Failed(
                    "the drain task ended abnormally".into(),
                ));
            let now = wall_now();
            match outcome {
                DrainOutcome::Removed => {
                    self.removed.insert(node.clone(), now);
                    if let Some(p) = &pool {
                        self.metrics
                            .scale_downs
                            .get_or_create(&PoolLabel { pool: p.clone() })
                            .inc();
                        self.history.entry(p.clone()).or_default().last_scale_down = Some(now);
                    }
                }
                DrainOutcome::RolledBack(why) | DrainOutcome::Failed(why) => {
                    warn!(node = %node, "scale-down failed: {why}");
                    if let Some(p) = pool {
                        self.scale_down_failed(p, now);
                    }
                }
                DrainOutcome::Abandoned => {}
            }
        }
    }

    /// Starts the pool's scale-down back-off (kept in the status, so it survives a failover).
    fn scale_down_failed(&mut self, pool: String, now: Time) {
        self.history
            .entry(pool)
            .or_default()
            .last_scale_down_failure = Some(now);
    }

    /// Restores cooldowns, back-offs and given-up launches from the status ConfigMap the last
    /// leader wrote. False when it could not be read.
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
        self.restored = true;
        let Some(json) = cm
            .and_then(|c| c.data)
            .and_then(|d| d.get("status.json").cloned())
        else {
            return true;
        };
        for (id, at) in status::given_up_of(&json) {
            self.given_up.entry(id).or_insert(at);
        }
        for (pool, h) in status::history_of(&json) {
            let mine = self.history.entry(pool).or_default();
            mine.last_scale_up = mine.last_scale_up.max(h.last_scale_up);
            mine.last_scale_down = mine.last_scale_down.max(h.last_scale_down);
            mine.last_scale_down_failure =
                mine.last_scale_down_failure.max(h.last_scale_down_failure);
        }
        info!("history restored from the status ConfigMap");
        true
    }

    /// Reads a changed policy ConfigMap; an invalid one leaves the last good policy in force.
    /// A valid one that cannot be applied yet (the cloud's catalog unreachable) is tried again
    /// on the next pass.
    async fn reload_policy(&mut self) {
        let src = self.state.lock().unwrap().policy_source().cloned();
        let rv = src.as_ref().map(|s| s.resource_version.clone());
        if rv == self.policy_seen && (self.policy.is_some() || rv.is_none()) {
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
            Some(text) => match parse_policy(text, &file) {
                Ok(p) => match self.apply_policy(p).await {
                    Ok(()) => Ok(()),
                    Err(e) if self.policy_apply_failed.as_deref() == rv.as_deref() => {
                        warn!("the new policy cannot be applied yet: {e}");
                        return;
                    }
                    Err(e) => {
                        warn!("the new policy cannot be applied yet, retrying: {e}");
                        self.policy_apply_failed = rv.clone();
                        self.events.send(Note {
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
            Ok(()) => {
                info!(resource_version = %src.resource_version, "policy in force");
                self.set_policy_valid(true);
            }
            Err(msg) => {
                error!("policy rejected, the last good one stays in force:\n{msg}");
                self.set_policy_valid(false);
                self.events.send(Note {
                    object: cm,
                    warning: true,
                    reason: "PolicyInvalid",
                    action: "Reload",
                    message: format!(
                        "{}; {}",
                        msg,
                        if self.policy.is_some() {
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

    /// Builds providers, catalog and templates for a new policy; nothing changes on error.
    async fn apply_policy(&mut self, policy: Policy) -> std::result::Result<(), String> {
        for w in policy.warnings() {
            warn!("policy: {w}");
        }
        let file_catalog = load_catalog(self.args.catalog.as_deref(), &policy)?;
        let (providers, catalog) = if self.args.dry_run {
            // No cloud call at all: the price file's catalog, every offering assumed available.
            (BTreeMap::new(), file_catalog)
        } else {
            build_providers(&policy, &file_catalog, &self.args, &self.cluster_id).await?
        };
        // Every pool's counters exist from the start, so that the first failure shows as an
        // increase (a series appearing at 1 does not).
        for p in &policy.pools {
            let pool = PoolLabel {
                pool: p.name.clone(),
            };
            let _ = self.metrics.scale_ups.get_or_create(&pool);
            let _ = self.metrics.scale_downs.get_or_create(&pool);
            for reason in LAUNCH_FAILURE_REASONS {
                let _ = self.metrics.failed_launches.get_or_create(&FailedLaunch {
                    pool: p.name.clone(),
                    reason: reason.to_string(),
                });
            }
        }
        let templates = Templates::new(&policy, &catalog);
        self.templates = Some(Arc::new(templates));
        self.catalog = catalog;
        self.providers = providers;
        self.policy = Some(Arc::new(policy));
        Ok(())
    }

    /// The cloud's instances of every pool (`recent` keeps those launched here until listed).
    async fn list_instances(&mut self, now: Time) -> std::result::Result<Vec<Instance>, String> {
        let mut out: Vec<Instance> = Vec::new();
        for (pool, provider) in &self.providers {
            let listed = provider
                .list(pool)
                .await
                .map_err(|e| format!("listing the instances of pool {pool}: {e}"))?;
            out.extend(listed);
        }
        let seen: HashSet<&str> = out.iter().map(|i| i.id.as_str()).collect();
        self.recent.retain(|id, (_, added)| {
            !seen.contains(id.as_str()) && now.since(*added) < Duration::from_secs(300)
        });
        Ok(out)
    }

    /// Joins the cloud's instances (listed, and launched here but not listed yet) with the
    /// Nodes: what is in flight, what is overdue, which instance each Node is.
    fn fleet(&mut self, listed: &[Instance], policy: &Policy, now: Time) -> FleetView {
        let state = self.state.clone();
        let s = state.lock().unwrap();
        let listed_ids: HashSet<&str> = listed.iter().map(|i| i.id.as_str()).collect();
        let all: Vec<&Instance> = listed
            .iter()
            .chain(
                self.recent
                    .values()
                    .map(|(i, _)| i)
                    .filter(|i| !listed_ids.contains(i.id.as_str())),
            )
            .collect();
        let with_node: HashSet<&str> = s
            .nodes
            .items
            .values()
            .filter_map(|n| n.provider_id.as_deref())
            .chain(s.rejected_provider_ids.values().map(String::as_str))
            .collect();
        let ids: HashSet<&str> = all.iter().map(|i| i.id.as_str()).collect();
        self.registered.retain(|id| ids.contains(id.as_str()));
        self.lost.retain(|id, _| ids.contains(id.as_str()));
        for i in &all {
            if with_node.contains(i.provider_id.as_str()) {
                self.registered.insert(i.id.clone());
                self.lost.remove(&i.id);
            } else if self.registered.contains(&i.id) {
                self.lost.entry(i.id.clone()).or_insert(now);
            }
        }
        let catalog = &self.catalog;
        let lost = &self.lost;
        fleet_view(
            all,
            &s.nodes.items,
            now,
            policy.max_node_provision_time,
            |k: &OfferingKey| {
                catalog
                    .instance_type(&k.instance_type)
                    .is_none_or(|t| t.gpu.is_some())
            },
            |i: &Instance| lost.get(&i.id).copied().unwrap_or(Time(i.launched_at_ms)),
        )
    }

    /// The snapshot the planner reads (in dry-run with the "unneeded since" kept in memory).
    fn snapshot(&self, view: &FleetView) -> Snapshot {
        let mut snapshot = self.state.lock().unwrap().snapshot(view.in_flight.clone());
        if self.args.dry_run {
            for n in &mut snapshot.nodes {
                if let Some(since) = self.unneeded_dry.get(&n.name) {
                    n.annotations
                        .insert(labels::UNNEEDED_SINCE.into(), since.clone());
                }
            }
        }
        snapshot
    }

    async fn pass(&mut self) {
        self.reload_policy().await;
        if !self.elector.is_leader() {
            // Another replica may lead meanwhile: its history is read again on taking over.
            self.restored = false;
            return;
        }
        let now = wall_now();
        if !self.restored && !self.restore_history().await {
            // Deciding without the last leader's cooldowns and back-offs could scale too early.
            return;
        }
        // Giving nodes back needs neither a policy nor the cloud.
        self.roll_back_expired_drains(now).await;
        let Some(policy) = self.policy.clone() else {
            return;
        };
        self.ice.retain(|_, until| *until > now);
        self.given_up
            .retain(|_, at| now.since(*at) < Duration::from_secs(3600));
        self.removed
            .retain(|_, at| now.since(*at) < Duration::from_secs(600));
        {
            let s = self.state.lock().unwrap();
            self.reacted.retain(|k| s.pods.items.contains_key(k));
        }
        let listed = match self.list_instances(now).await {
            Ok(i) => i,
            Err(e) => {
                // Without the cloud's view, in-flight capacity is unknown: deciding now could
                // launch twice. Try again on the next pass.
                warn!("{e}; skipping this pass");
                return;
            }
        };
        let mut view = self.fleet(&listed, &policy, now);
        let regs = {
            let s = self.state.lock().unwrap();
            registrations(&listed, &s.nodes.items, &policy.pools)
        };
        if self.register(&regs).await {
            // Decide on what the API server shows once the registrations are in: a pass that
            // planned on nodes registered in the same pass was seen (rarely, on a loaded machine)
            // to leave them out and launch again for pods they would take. The next pass comes
            // with the Node updates.
            return;
        }
        let mut snapshot = self.snapshot(&view);
        for n in &mut snapshot.nodes {
            if let Some(r) = regs.get(&n.name) {
                r.apply(n);
            }
        }
        self.give_up_overdue(&view, &policy, now).await;
        self.report_gpus_lost(&view);
        self.resume_drains(&snapshot, &view, now);
        let Some(templates) = self.templates.clone() else {
            return;
        };
        let mut plan;
        let mut round = 0;
        loop {
            snapshot.unavailable = self.ice.clone();
            snapshot.pools = self
                .history
                .iter()
                .map(|(pool, h)| {
                    let state = PoolState {
                        last_scale_up: h.last_scale_up,
                        last_scale_down_failure: h.last_scale_down_failure,
                    };
                    (pool.clone(), state)
                })
                .collect();
            let t0 = std::time::Instant::now();
            plan = plan::plan_with(&snapshot, &templates, &policy, now);
            self.metrics
                .plan_duration_seconds
                .observe(t0.elapsed().as_secs_f64());
            let capacity_failed = self.scale_up(&plan, &policy, now).await;
            round += 1;
            // An offering just found short of capacity is now avoided: plan the rest again at
            // once. Other failures wait for their back-off.
            if !capacity_failed || round == 3 || self.args.dry_run {
                break;
            }
            view = self.fleet(&listed, &policy, now);
            snapshot.in_flight = view.in_flight.clone();
        }
        self.report_unschedulable(&plan);
        let kept: BTreeMap<String, String> = plan
            .kept
            .iter()
            .map(|k| (k.node.clone(), k.reason.clone()))
            .collect();
        for (node, reason) in &kept {
            if self.kept.get(node) != Some(reason) {
                info!(node = %node, "idle-looking node kept: {reason}");
            }
        }
        self.kept = kept;
        self.scale_down(&plan, &policy, &view, now).await;
        self.keep_unneeded(&plan, &snapshot).await;
        self.publish(&plan, &policy, &snapshot, &view, now).await;
    }

    /// Launches the plan's scale-ups. Returns whether an offering was newly found short of
    /// capacity (worth planning again at once).
    async fn scale_up(&mut self, plan: &Plan, policy: &Policy, now: Time) -> bool {
        let mut launched_counts = Vec::with_capacity(plan.scale_ups.len());
        let mut launched_ids: Vec<Vec<String>> = Vec::new();
        let mut launch_ids: Vec<String> = Vec::new();
        let mut capacity_failed = false;
        for su in &plan.scale_ups {
            let pool = policy.pool(&su.pool);
            let uids: Vec<String> = {
                let s = self.state.lock().unwrap();
                su.pods
                    .iter()
                    .map(|k| {
                        s.pods
                            .items
                            .get(k)
                            .map(|p| p.uid.clone())
                            .filter(|u| !u.is_empty())
                            .unwrap_or_else(|| k.clone())
                    })
                    .collect()
            };
            let uids: Vec<&str> = uids.iter().map(String::as_str).collect();
            let mut attempt = 0;
            let mut req = launch_request(su, &uids, pool, attempt);
            while self.given_up.contains_key(&req.launch_id) {
                attempt += 1;
                req = launch_request(su, &uids, pool, attempt);
            }
            launch_ids.push(req.launch_id.clone());
            {
                let s = self.state.lock().unwrap();
                for p in &su.pods {
                    if let Some(since) = s.unschedulable_since.get(p) {
                        if self.reacted.insert(p.clone()) {
                            self.metrics
                                .reaction_seconds
                                .observe(now.since(*since).as_secs_f64());
                        }
                    }
                }
            }
            let first = su.offerings.first();
            let what = format!(
                "{} × {} in {} ({}), pool {}",
                su.count,
                first.map_or("-", |o| o.instance_type.as_str()),
                first.map_or("-", |o| o.zone.as_str()),
                first.map_or("-", |o| o.capacity_type.as_str()),
                su.pool
            );
            if self.args.dry_run {
                self.notify_pods(su, "TriggeredScaleUp", format!("would launch {what}"));
                launched_counts.push(su.count);
                launched_ids.push(Vec::new());
                continue;
            }
            let backing_off = self
                .launch_backoff
                .get(&su.pool)
                .is_some_and(|(until, _)| *until > now);
            let provider = self.providers.get(&su.pool).cloned();
            let (Some(provider), false, true) = (provider, backing_off, self.elector.is_leader())
            else {
                launched_counts.push(0);
                launched_ids.push(Vec::new());
                continue;
            };
            info!(launch_id = %req.launch_id, "launching {what}");
            let result = provider.launch(&req).await;
            let mut other_failure = false;
            let (n, ids) = match result {
                Ok(res) => {
                    for (key, err) in &res.failures {
                        self.count_failure(&su.pool, err);
                        if matches!(err, ProviderError::InsufficientCapacity { .. }) {
                            capacity_failed |= !self.ice.contains_key(key);
                            self.ice
                                .insert(key.clone(), now + policy.insufficient_capacity_ttl);
                        } else {
                            other_failure = true;
                        }
                    }
                    let ids: Vec<String> = res.launched.iter().map(|i| i.id.clone()).collect();
                    for i in res.launched {
                        self.recent.insert(i.id.clone(), (i, now));
                    }
                    (ids.len() as u32, ids)
                }
                Err(e) => {
                    warn!(pool = %su.pool, "launch failed: {e}");
                    self.count_failure(&su.pool, &e);
                    other_failure = true;
                    (0, Vec::new())
                }
            };
            if other_failure {
                let failures = self.launch_backoff.get(&su.pool).map_or(0, |b| b.1) + 1;
                let wait = backoff(
                    Duration::from_secs(5),
                    Duration::from_secs(300),
                    failures - 1,
                    jitter_unit(seed()),
                );
                warn!(pool = %su.pool, "launches for this pool wait {}s after {failures} failure(s)", wait.as_secs());
                self.launch_backoff
                    .insert(su.pool.clone(), (now + wait, failures));
            } else if n == su.count {
                self.launch_backoff.remove(&su.pool);
            }
            if n > 0 {
                self.metrics
                    .scale_ups
                    .get_or_create(&PoolLabel {
                        pool: su.pool.clone(),
                    })
                    .inc_by(u64::from(n));
                // A gang's launch counts once it is whole (below).
                if su.gang.is_none() {
                    self.history
                        .entry(su.pool.clone())
                        .or_default()
                        .last_scale_up = Some(now);
                }
                let note = if n < su.count {
                    format!("launched {n} of {what}; the rest is planned again")
                } else {
                    format!("launched {what}")
                };
                self.notify_pods(su, "TriggeredScaleUp", note);
            }
            launched_counts.push(n);
            launched_ids.push(ids);
        }
        let short = short_gangs(&plan.scale_ups, &launched_counts);
        for (i, su) in plan.scale_ups.iter().enumerate() {
            let Some(g) = &su.gang else { continue };
            if short.contains(g) {
                if self.args.dry_run {
                    continue;
                }
                // Given back: the next attempt for these pods is a new launch.
                if !launched_ids[i].is_empty() {
                    self.given_up.insert(launch_ids[i].clone(), now);
                }
                if let Some(provider) = self.providers.get(&su.pool).cloned() {
                    for id in &launched_ids[i] {
                        self.recent.remove(id);
                        if let Err(e) = provider.terminate(id).await {
                            warn!(instance = %id, "giving back a partial gang launch: {e}");
                        }
                    }
                }
                if !launched_ids[i].is_empty() {
                    self.notify_pods(
                        su,
                        "NotTriggerScaleUp",
                        format!(
                            "gang {g} could not be launched whole; its {} instance(s) were \
                             given back and it is planned again",
                            launched_ids[i].len()
                        ),
                    );
                }
            } else if launched_counts[i] > 0 {
                self.history
                    .entry(su.pool.clone())
                    .or_default()
                    .last_scale_up = Some(now);
            }
        }
        capacity_failed
    }

    fn count_failure(&self, pool: &str, e: &ProviderError) {
        self.metrics
            .failed_launches
            .get_or_create(&FailedLaunch {
                pool: pool.to_string(),
                reason: e.metric_label().to_string(),
            })
            .inc();
    }

    fn notify_pods(&self, su: &plan::ScaleUp, reason: &'static str, message: String) {
        let s = self.state.lock().unwrap();
        for key in &su.pods {
            let Some(p) = s.pods.items.get(key) else {
                continue;
            };
            self.events.send(Note {
                object: pod_ref(&p.id.namespace, &p.id.name, &p.uid),
                warning: false,
                reason,
                action: "ScaleUp",
                message: message.clone(),
            });
        }
    }

    /// `NotTriggerScaleUp` once per pod and reason.
    fn report_unschedulable(&mut self, plan: &Plan) {
        let s = self.state.lock().unwrap();
        self.notified.retain(|k, _| s.pods.items.contains_key(k));
        for u in &plan.unschedulable {
            if self.notified.get(&u.pod) == Some(&u.reason) {
                continue;
            }
            let Some(p) = s.pods.items.get(&u.pod) else {
                continue;
            };
            self.notified.insert(u.pod.clone(), u.reason.clone());
            self.events.send(Note {
                object: pod_ref(&p.id.namespace, &p.id.name, &p.uid),
                warning: false,
                reason: "NotTriggerScaleUp",
                action: "ScaleUp",
                message: u.reason.clone(),
            });
        }
    }

    /// Instances that never became working nodes: terminated, their offering avoided.
    /// Nodes whose GPUs went missing after they advertised them: reported (Event, log, metric),
    /// never terminated for it (a device plugin restarting, a GPU operator upgrade).
    fn report_gpus_lost(&mut self, view: &FleetView) {
        let now_lost: BTreeSet<String> = view.gpus_lost.iter().cloned().collect();
        for n in now_lost.difference(&self.gpus_lost) {
            warn!(node = %n, "the node advertises no GPUs any more; it is kept");
            self.events.send(Note {
                object: node_ref(n),
                warning: true,
                reason: "GPUsUnavailable",
                action: "Observe",
                message: format!(
                    "{n} advertised GPUs and advertises none now (device plugin restarting, or \
                     GPUs lost); the node is kept, not given up as a failed launch"
                ),
            });
        }
        for n in self.gpus_lost.difference(&now_lost) {
            info!(node = %n, "the node advertises its GPUs again");
        }
        self.metrics.nodes_gpus_lost.set(now_lost.len() as i64);
        self.gpus_lost = now_lost;
    }

    async fn give_up_overdue(&mut self, view: &FleetView, policy: &Policy, now: Time) {
        for o in &view.overdue {
            // Every cloud mutation is the leader's.
            if !self.elector.is_leader() {
                return;
            }
            let i = &o.instance;
            let why = match &o.node {
                Some(n) => format!("node {n} never advertised its GPUs"),
                None => "no Node registered".to_string(),
            };
            warn!(
                instance = %i.id, offering = %i.offering,
                "giving up a launch after {}: {why}",
                crate::policy::duration::format_duration(policy.max_node_provision_time)
            );
            self.ice
                .insert(i.offering.clone(), now + policy.insufficient_capacity_ttl);
            self.given_up.insert(i.launch_id.clone(), now);
            self.metrics
                .failed_launches
                .get_or_create(&FailedLaunch {
                    pool: i.pool.clone(),
                    reason: "provision_timeout".into(),
                })
                .inc();
            self.recent.remove(&i.id);
            if let Some(p) = self.providers.get(&i.pool) {
                if let Err(e) = p.terminate(&i.id).await {
                    warn!(instance = %i.id, "terminating: {e}");
                }
            }
            if let Some(n) = &o.node {
                let api: Api<K8sNode> = Api::all(self.client.clone());
                if let Err(e) = kube_io::delete_node(&api, n).await {
                    warn!(node = %n, "deleting: {e}");
                }
                self.events.send(Note {
                    object: node_ref(n),
                    warning: true,
                    reason: "ScaleDown",
                    action: "GiveUp",
                    message: format!("instance {} removed: {why}", i.id),
                });
            }
        }
    }

    /// Drains of a previous leader (found from the taint) past their deadline: given back.
    async fn roll_back_expired_drains(&mut self, now: Time) {
        if self.args.dry_run {
            return;
        }
        let expired: Vec<(String, Option<String>)> = {
            let s = self.state.lock().unwrap();
            s.nodes
                .items
                .values()
                .filter(|n| {
                    !self.drains.contains_key(&n.name)
                        && !self.removed.contains_key(&n.name)
                        && !n.deleting
                })
                .filter(|n| drain_deadline(n, self.args.max_graceful_termination, now) <= now)
                .filter(|n| {
                    n.taints
                        .iter()
                        .any(|t| t.key == labels::TO_BE_DELETED_TAINT)
                })
                .map(|n| (n.name.clone(), n.pool().map(str::to_string)))
                .collect()
        };
        for (node, pool) in expired {
            let why = "a drain interrupted by a restart ran past its deadline";
            match drain::roll_back(&self.drain_ctx, &node, why).await {
                Ok(()) => {
                    if let Some(p) = pool {
                        self.scale_down_failed(p, now);
                    }
                }
                Err(e) => warn!(node = %node, "rolling back: {e}"),
            }
        }
    }

    /// Drains of a previous leader (found from the taint) within their deadline: finished.
    fn resume_drains(&mut self, snapshot: &Snapshot, view: &FleetView, now: Time) {
        if self.args.dry_run {
            return;
        }
        for n in &snapshot.nodes {
            let ours = n
                .taints
                .iter()
                .any(|t| t.key == labels::TO_BE_DELETED_TAINT);
            if !ours
                || n.deleting
                || self.drains.contains_key(&n.name)
                || self.removed.contains_key(&n.name)
            {
                continue;
            }
            let deadline = drain_deadline(n, self.args.max_graceful_termination, now);
            if deadline <= now {
                continue;
            }
            info!(node = %n.name, "resuming an interrupted drain");
            self.spawn_drain(n, view, deadline, "resumed after a restart".into());
        }
    }

    fn spawn_drain(
        &mut self,
        n: &crate::model::Node,
        view: &FleetView,
        deadline: Time,
        reason: String,
    ) {
        let pool = n.pool().unwrap_or("").to_string();
        // Only an instance the pools' listing names: never one parsed out of a providerID.
        let instance_id = n
            .provider_id
            .as_ref()
            .and_then(|p| view.instance_of_node.get(p).cloned());
        let job = DrainJob {
            node: n.name.clone(),
            provider: self.providers.get(&pool).cloned(),
            pool,
            instance_id,
            deadline,
            reason,
        };
        let ctx = self.drain_ctx.clone();
        let pool = job.pool.clone();
        self.drains
            .insert(n.name.clone(), (pool, tokio::spawn(drain::drain(ctx, job))));
    }

    async fn scale_down(&mut self, plan: &Plan, policy: &Policy, view: &FleetView, now: Time) {
        let limit = policy.max_concurrent_drains as usize;
        for d in &plan.scale_downs {
            if self.drains.contains_key(&d.node) {
                continue;
            }
            if self.args.dry_run {
                self.events.send(Note {
                    object: node_ref(&d.node),
                    warning: false,
                    reason: "ScaleDown",
                    action: "Drain",
                    message: format!(
                        "would drain and remove {} (pool {}, saves ${:.3}/hour): {}",
                        d.node, d.pool, d.saves_per_hour, d.reason
                    ),
                });
                continue;
            }
            if self.drains.len() >= limit {
                break;
            }
            let node = self.state.lock().unwrap().nodes.items.get(&d.node).cloned();
            let Some(node) = node else { continue };
            let deadline = now + self.args.max_graceful_termination;
            self.spawn_drain(&node, view, deadline, d.reason.clone());
        }
    }

    /// Gives the Nodes of our instances their pool's labels and taints (a real node registers
    /// with what its kubelet flags say, which need not name the pool). The planner sees them at
    /// once; the Node gets them with a patch (not in dry-run).
    /// Returns whether a Node was changed.
    async fn register(&mut self, regs: &BTreeMap<String, Registration>) -> bool {
        if self.args.dry_run || regs.is_empty() {
            return false;
        }
        let mut changed = false;
        let api: Api<K8sNode> = Api::all(self.client.clone());
        for r in regs.values() {
            if !self.elector.is_leader() {
                return changed;
            }
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
                Ok(()) if !r.labels.is_empty() || !r.taints.is_empty() => {
                    changed = true;
                    info!(node = %r.node, pool = %r.pool, "registered the node in its pool")
                }
                Ok(()) => {}
                Err(e) => warn!(node = %r.node, pool = %r.pool, "registering the node: {e}"),
            }
        }
        changed
    }

    /// Keeps "unneeded since" on the nodes (annotation; in memory in dry-run).
    async fn keep_unneeded(&mut self, plan: &Plan, snapshot: &Snapshot) {
        let now_unneeded: BTreeMap<&str, &str> = plan
            .unneeded
            .iter()
            .map(|u| (u.node.as_str(), u.since.as_str()))
            .collect();
        if self.args.dry_run {
            self.unneeded_dry = now_unneeded
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            return;
        }
        let api: Api<K8sNode> = Api::all(self.client.clone());
        for n in &snapshot.nodes {
            let has = n
                .annotations
                .get(labels::UNNEEDED_SINCE)
                .map(String::as_str);
            let want = now_unneeded.get(n.name.as_str()).copied();
            if has == want || self.drains.contains_key(&n.name) {
                continue;
            }
            if let Err(e) =
                kube_io::annotate_node(&api, &n.name, labels::UNNEEDED_SINCE, want).await
            {
                warn!(node = %n.name, "annotating: {e}");
            }
        }
    }

    async fn publish(
        &mut self,
        plan: &Plan,
        policy: &Policy,
        snapshot: &Snapshot,
        view: &FleetView,
        now: Time,
    ) {
        // Metrics.
        let pending: Vec<&crate::model::Pod> = snapshot
            .pods
            .iter()
            .filter(|p| p.is_pending() && p.wants_gpu())
            .collect();
        self.metrics.pending_gpu_pods.set(pending.len() as i64);
        let oldest = {
            let s = self.state.lock().unwrap();
            s.unschedulable_since
                .values()
                .map(|t| now.since(*t).as_secs() as i64)
                .max()
                .unwrap_or(0)
        };
        self.metrics.oldest_pending_gpu_pod_seconds.set(oldest);
        self.metrics.nodes.clear();
        self.metrics.gpus.clear();
        for n in &snapshot.nodes {
            let Some(pool) = n.pool() else { continue };
            let ct = n
                .labels
                .get(labels::CAPACITY_TYPE)
                .or_else(|| n.labels.get(labels::KARPENTER_CAPACITY_TYPE))
                .cloned()
                .unwrap_or_else(|| "unknown".into());
            let key = PoolCapacity {
                pool: pool.to_string(),
                capacity_type: ct,
            };
            self.metrics.nodes.get_or_create(&key).inc();
            self.metrics
                .gpus
                .get_or_create(&key)
                .inc_by(n.advertised_gpus());
        }
        // The status ConfigMap, at most every 10 s unless it changed.
        let nodes: Vec<&crate::model::Node> = snapshot.nodes.iter().collect();
        let st = status::build(&StatusInput {
            now,
            leader: self.elector.identity(),
            dry_run: self.args.dry_run,
            policy_valid: self.policy_valid,
            policy,
            nodes: &nodes,
            in_flight: &view.in_flight,
            gpus_of: &|t| {
                self.catalog
                    .instance_type(t)
                    .and_then(|t| t.gpu.as_ref())
                    .map_or(0, |g| i64::from(g.count))
            },
            plan,
            history: &self.history,
            unavailable: &self.ice,
            given_up: &self.given_up,
        });
        let mut timeless = st.clone();
        timeless.time.clear();
        let key = serde_json::to_string(&timeless).unwrap_or_default();
        if let Some((last, at)) = &self.last_status {
            if *last == key && now.since(*at) < Duration::from_secs(10) {
                return;
            }
        }
        let data = BTreeMap::from([
            ("status".to_string(), status::to_text(&st)),
            (
                "status.json".to_string(),
                serde_json::to_string_pretty(&st).unwrap_or_default(),
            ),
        ]);
        let (ns, name) = &self.status_name;
        match kube_io::write_status(&self.client, ns, name, data).await {
            Ok(()) => self.last_status = Some((key, now)),
            Err(e) => warn!("writing the status ConfigMap: {e}"),
        }
    }
}

/// When the drain of `n` must be given up: its start (annotation; `now` when missing) plus the
/// drain time allowed.
fn drain_deadline(n: &crate::model::Node, max: Duration, now: Time) -> Time {
    n.annotations
        .get(drain::DRAIN_STARTED)
        .and_then(|s| Time::parse_rfc3339(s).ok())
        .unwrap_or(now)
        + max
}

fn load_catalog(
    path: Option<&std::path::Path>,
    policy: &Policy,
) -> std::result::Result<Catalog, String> {
    let types = match path {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            crate::catalog::parse_csv(&text, &p.display().to_string()).map_err(|e| e.to_string())?
        }
        None => crate::catalog::parse_csv(
            crate::catalog::BUILTIN_AWS,
            crate::catalog::BUILTIN_AWS_NAME,
        )
        .map_err(|e| e.to_string())?,
    };
    Ok(crate::catalog::offerings_from_list_prices(policy, types))
}

/// One provider per cloud the policy's pools use, and their catalogs merged. Availability is
/// learnt by failing (insufficient capacity), not assumed from the catalog.
async fn build_providers(
    policy: &Policy,
    file_catalog: &Catalog,
    args: &RunArgs,
    cluster_id: &str,
) -> std::result::Result<(BTreeMap<String, Arc<dyn CloudProvider>>, Catalog), String> {
    let mut providers: BTreeMap<String, Arc<dyn CloudProvider>> = BTreeMap::new();
    let mut catalog = Catalog::default();
    let clouds: std::collections::BTreeSet<&str> =
        policy.pools.iter().map(|p| p.provider.as_str()).collect();
    for cloud in clouds {
        let provider: Arc<dyn CloudProvider> = match cloud {
            "aws" => {
                build_aws(
                    policy,
                    file_catalog,
                    args.aws_endpoint_url.clone(),
                    cluster_id,
                )
                .await?
            }
            #[cfg(feature = "alibaba")]
            "alibaba" => {
                let region = policy
                    .region
                    .clone()
                    .or_else(|| std::env::var("ALIBABA_CLOUD_REGION_ID").ok())
                    .ok_or("no region: set `region` in the policy or ALIBABA_CLOUD_REGION_ID")?;
                let config = crate::alibaba::config_from_policy(
                    policy,
                    file_catalog,
                    &region,
                    args.alibaba_endpoint_url.clone(),
                )
                .map_err(|e| e.join("\n"))?;
                Arc::new(crate::alibaba::provider(config)?)
            }
            other => {
                return Err(format!(
                    "provider {other:?} cannot be run by this controller (built with: {})",
                    if cfg!(feature = "alibaba") {
                        "aws, alibaba"
                    } else {
                        "aws"
                    }
                ))
            }
        };
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
        for p in policy.pools.iter().filter(|p| p.provider == cloud) {
            providers.insert(p.name.clone(), provider.clone());
        }
    }
    Ok((providers, catalog))
}

async fn build_aws(
    policy: &Policy,
    catalog: &Catalog,
    endpoint: Option<String>,
    cluster_id: &str,
) -> std::result::Result<Arc<dyn CloudProvider>, String> {
    let region = policy
        .region
        .clone()
        .or_else(|| std::env::var("AWS_REGION").ok())
        .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
        .ok_or("no region: set `region` in the policy or AWS_REGION")?;
    let mut config = crate::aws::config_from_policy(policy, catalog, &region, endpoint)
        .map_err(|e| e.join("\n"))?;
    config.cluster_id = Some(cluster_id.to_string());
    let provider = gpu_node_autoscaler_aws::AwsProvider::new(config)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(provider))
}
