//! kube-sim: an in-memory, Kubernetes-API-compatible server for end-to-end tests.
//!
//! It serves a stateful subset of the Kubernetes API over plain HTTP (see `docs/kube-sim.md`):
//! discovery, CRUD with resourceVersions, list/watch with selectors and pagination, patches
//! (merge, JSON, strategic merge) and PDB-aware eviction, so that the real `kubectl` and
//! kube-rs clients can drive it.

pub mod patch;
pub mod resources;
pub mod selector;
pub mod server;
pub mod status;
pub mod store;
pub mod validation;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Server settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Number of changes kept for watches that resume from a resourceVersion; older ones get 410.
    pub watch_history: usize,
    /// How often watches that asked for `allowWatchBookmarks` get a BOOKMARK event.
    pub bookmark_interval: std::time::Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            watch_history: 10_000,
            bookmark_interval: std::time::Duration::from_secs(30),
        }
    }
}

/// Serves the API on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, config: Config) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    let app = Arc::new(server::App {
        store: Mutex::new(store::Store::new(config.watch_history)),
        addr,
        bookmark_interval: config.bookmark_interval,
    });
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
