//! kube-sim: an in-memory, Kubernetes-API-compatible server for end-to-end tests.
//!
//! It serves a stateful subset of the Kubernetes API over plain HTTP (see `docs/kube-sim.md`):
//! discovery, CRUD with resourceVersions, list/watch with selectors and pagination, patches
//! (merge, JSON, strategic merge) and PDB-aware eviction, so that the real `kubectl` and
//! kube-rs clients can drive it. Simulated controllers (a scheduler, the kubelets and a bridge to
//! an EC2 endpoint) make pods run and nodes come and go; faults can be injected.

pub mod alibaba_rpc;
pub mod ec2;
pub mod ess;
pub mod faults;
pub mod kubelet;
pub mod memory;
pub mod nodes;
pub mod patch;
pub mod resources;
pub mod scheduler;
pub mod selector;
pub mod server;
pub mod status;
pub mod store;
pub mod validation;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

pub use ec2::Ec2Config;
pub use ess::EssConfig;
pub use faults::Faults;
pub use memory::MemoryBridgeConfig;

/// Server settings. The default runs the scheduler and the kubelets, no EC2 bridge, no faults.
#[derive(Debug, Clone)]
pub struct Config {
    /// Number of changes kept for watches that resume from a resourceVersion; older ones get 410.
    pub watch_history: usize,
    /// How often watches that asked for `allowWatchBookmarks` get a BOOKMARK event.
    pub bookmark_interval: Duration,
    /// Run the simulated scheduler (binds Pending pods, marks unschedulable ones).
    pub scheduler: bool,
    /// Run the simulated kubelets (pods Running and Succeeded, node Ready heartbeats).
    pub kubelet: bool,
    /// How long after it is bound a pod turns Running.
    pub pod_start_delay: Duration,
    /// How often the kubelets refresh each node's Ready `lastHeartbeatTime`.
    pub heartbeat: Duration,
    /// Run the bridge to an EC2 endpoint.
    pub ec2: Option<Ec2Config>,
    /// Run the bridge to Alibaba Cloud ESS scaling groups.
    pub ess: Option<EssConfig>,
    /// Run the bridge to an in-memory provider (tests that need no cloud endpoint).
    pub memory: Option<MemoryBridgeConfig>,
    /// The fault settings at start (`/admin/faults` changes them later).
    pub faults: Faults,
    /// Seeds the random sequence that picks the requests that fail.
    pub fault_seed: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            watch_history: 10_000,
            bookmark_interval: Duration::from_secs(30),
            scheduler: true,
            kubelet: true,
            pod_start_delay: Duration::from_secs(1),
            heartbeat: Duration::from_secs(10),
            ec2: None,
            ess: None,
            memory: None,
            faults: Faults::default(),
            fault_seed: 1,
        }
    }
}

impl Config {
    /// Only the API: no scheduler, no kubelets (pods stay as clients leave them).
    pub fn api_only() -> Self {
        Config {
            scheduler: false,
            kubelet: false,
            ..Config::default()
        }
    }
}

/// Aborts the controller tasks when the server future is dropped.
struct Controllers(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Controllers {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Serves the API on `listener`, and runs the controllers `config` asks for, until the task is
/// dropped.
pub async fn serve(listener: TcpListener, config: Config) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    let app = Arc::new(server::App::new(
        store::Store::new(config.watch_history),
        addr,
        config.bookmark_interval,
        config.faults,
        config.fault_seed,
    ));
    let mut tasks = Vec::new();
    if config.scheduler {
        tasks.push(tokio::spawn(scheduler::run(app.clone())));
    }
    if config.kubelet {
        tasks.push(tokio::spawn(kubelet::run(
            app.clone(),
            config.pod_start_delay,
            config.heartbeat,
        )));
    }
    if let Some(ec2) = config.ec2.clone() {
        tasks.push(tokio::spawn(ec2::run(app.clone(), ec2)));
    }
    if let Some(ess) = config.ess.clone() {
        tasks.push(tokio::spawn(ess::run(app.clone(), ess)));
    }
    if let Some(memory) = config.memory.clone() {
        tasks.push(tokio::spawn(memory::run(app.clone(), memory)));
    }
    let _controllers = Controllers(tasks);
    loop {
        let (stream, _) = listener.accept().await?;
        let app = app.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| server::handle(app.clone(), req));
            // Connection errors (client went away) are not server errors.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Starts a server on a background thread with its own runtime; returns its address.
/// Meant for tests: the server lives as long as the process.
pub fn spawn_background(config: Config) -> std::io::Result<SocketAddr> {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    std::thread::Builder::new()
        .name(format!("kube-sim-{}", addr.port()))
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("tokio runtime");
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener).expect("listener");
                let _ = serve(listener, config).await;
            });
        })?;
    Ok(addr)
}
