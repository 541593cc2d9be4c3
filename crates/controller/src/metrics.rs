//! `/metrics` (OpenMetrics text), `/healthz` and `/readyz` over plain HTTP.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tracing::warn;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolCapacity {
    pub pool: String,
    pub capacity_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NoticeLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReadResult {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailedLaunch {
    pub pool: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Replaced {
    pub pool: String,
    pub cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionResult {
    pub result: String,
}

/// Every metric the controller exports (names documented in docs/operations.md).
pub struct Metrics {
    pub leader: Gauge,
    pub policy_valid: Gauge,
    pub pending_gpu_pods: Gauge,
    pub oldest_pending_gpu_pod_seconds: Gauge,
    pub nodes: Family<PoolCapacity, Gauge>,
    pub gpus: Family<PoolCapacity, Gauge>,
    pub scale_ups: Family<PoolLabel, Counter>,
    pub scale_downs: Family<PoolLabel, Counter>,
    pub failed_launches: Family<FailedLaunch, Counter>,
    pub evictions: Family<EvictionResult, Counter>,
    pub nodes_gpus_lost: Gauge,
    pub nodes_unhealthy: Gauge,
    pub nodes_replaced: Family<Replaced, Counter>,
    pub interruption_messages: Family<NoticeLabel, Counter>,
    pub gpu_metrics_reads: Family<ReadResult, Counter>,
    pub heartbeat_timestamp_seconds: Gauge,
    pub launches_in_progress: Gauge,
    pub plan_duration_seconds: Histogram,
    pub reaction_seconds: Histogram,
    registry: Registry,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("gpu_node_autoscaler");
        let m = Metrics {
            leader: Gauge::default(),
            policy_valid: Gauge::default(),
            pending_gpu_pods: Gauge::default(),
            oldest_pending_gpu_pod_seconds: Gauge::default(),
            nodes: Family::default(),
            gpus: Family::default(),
            scale_ups: Family::default(),
            scale_downs: Family::default(),
            failed_launches: Family::default(),
            evictions: Family::default(),
            nodes_gpus_lost: Gauge::default(),
            nodes_unhealthy: Gauge::default(),
            nodes_replaced: Family::default(),
            interruption_messages: Family::default(),
            gpu_metrics_reads: Family::default(),
            heartbeat_timestamp_seconds: Gauge::default(),
            launches_in_progress: Gauge::default(),
            plan_duration_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            reaction_seconds: Histogram::new(exponential_buckets(0.25, 2.0, 12)),
            registry: Registry::default(),
        };
        registry.register(
            "leader",
            "1 on the replica holding the leader Lease",
            m.leader.clone(),
        );
        registry.register(
            "policy_valid",
            "1 when the policy ConfigMap in force is the latest one and valid",
            m.policy_valid.clone(),
        );
        registry.register(
            "pending_gpu_pods",
            "Pods waiting for a GPU node",
            m.pending_gpu_pods.clone(),
        );
        registry.register(
            "oldest_pending_gpu_pod_seconds",
            "How long the oldest pending GPU pod has waited",
            m.oldest_pending_gpu_pod_seconds.clone(),
        );
        registry.register("nodes", "Nodes per pool and capacity type", m.nodes.clone());
        registry.register(
            "nodes_gpus_lost",
            "Nodes of ours that advertised GPUs once and advertise none now",
            m.nodes_gpus_lost.clone(),
        );
        registry.register(
            "nodes_unhealthy",
            "Nodes of ours seen unhealthy now (a health condition, GPUs missing)",
            m.nodes_unhealthy.clone(),
        );
        registry.register(
            "nodes_replaced",
            "Nodes drained and removed to be replaced, per pool and cause (unhealthy, interrupted)",
            m.nodes_replaced.clone(),
        );
        registry.register(
            "interruption_messages",
            "Messages read from the interruption queue, per kind (spot_interruption, rebalance, \
             scheduled_change, stopping, irrelevant, unreadable)",
            m.interruption_messages.clone(),
        );
        registry.register(
            "gpu_metrics_reads",
            "Reads of dcgm-exporter's XID series from gpuMetrics.prometheusUrl, per result \
             (ok, error)",
            m.gpu_metrics_reads.clone(),
        );
        registry.register(
            "gpus",
            "GPUs advertised per pool and capacity type",
            m.gpus.clone(),
        );
        registry.register(
            "scale_ups",
            "Instances launched per pool",
            m.scale_ups.clone(),
        );
        registry.register(
            "scale_downs",
            "Nodes drained and removed per pool",
            m.scale_downs.clone(),
        );
        registry.register(
            "failed_launches",
            "Launch failures per pool and reason",
            m.failed_launches.clone(),
        );
        registry.register(
            "evictions",
            "Evictions by result (evicted, blocked, failed)",
            m.evictions.clone(),
        );
        registry.register(
            "heartbeat_timestamp_seconds",
            "Unix time of the control loop's last turn (what /healthz reads)",
            m.heartbeat_timestamp_seconds.clone(),
        );
        registry.register(
            "launches_in_progress",
            "Launch calls to the cloud not answered yet (the loop goes on meanwhile)",
            m.launches_in_progress.clone(),
        );
        registry.register(
            "plan_duration_seconds",
            "Time to build one plan",
            m.plan_duration_seconds.clone(),
        );
        registry.register(
            "reaction_seconds",
            "From a pod seen unschedulable to its launch request",
            m.reaction_seconds.clone(),
        );
        Metrics { registry, ..m }
    }

    pub fn encode(&self) -> String {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &self.registry)
            .expect("writing to a String cannot fail");
        s
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// What the probes read.
#[derive(Default)]
pub struct Health {
    /// Every watch store has synced.
    pub ready: AtomicBool,
    /// Unix seconds of the loop's last turn; `/healthz` fails when it stops turning.
    pub heartbeat: AtomicI64,
}

/// The loop turns at least every few seconds; a minute without a turn means it is stuck.
const STUCK_AFTER_SECS: i64 = 60;

pub fn respond(path: &str, metrics: &Metrics, health: &Health, now_s: i64) -> (StatusCode, String) {
    match path {
        "/metrics" => (StatusCode::OK, metrics.encode()),
        "/healthz" | "/livez" => {
            let beat = health.heartbeat.load(Ordering::Relaxed);
            if now_s - beat <= STUCK_AFTER_SECS {
                (StatusCode::OK, "ok\n".into())
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("the control loop has not turned for {}s\n", now_s - beat),
                )
            }
        }
        "/readyz" => {
            if health.ready.load(Ordering::Relaxed) {
                (StatusCode::OK, "ok\n".into())
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "watch caches not synced yet\n".into(),
                )
            }
        }
        _ => (StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

/// Serves the endpoints until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>, health: Arc<Health>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                warn!(error = %e, "metrics listener");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        let health = health.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let (code, body) = respond(
                    req.uri().path(),
                    &metrics,
                    &health,
                    crate::wall_now().0 / 1000,
                );
                let ct = if req.uri().path() == "/metrics" {
                    "application/openmetrics-text; version=1.0.0; charset=utf-8"
                } else {
                    "text/plain; charset=utf-8"
                };
                async move {
                    Ok::<_, std::convert::Infallible>(
                        Response::builder()
                            .status(code)
                            .header("content-type", ct)
                            .body(Full::new(Bytes::from(body)))
                            .expect("a valid response"),
                    )
                }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, svc)
                .await;
        });
    }
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_openmetrics_with_the_documented_names() {
        let m = Metrics::new();
        m.leader.set(1);
        m.failed_launches
            .get_or_create(&FailedLaunch {
                pool: "a10g".into(),
                reason: "insufficient_capacity".into(),
            })
            .inc();
        let text = m.encode();
        assert!(text.contains("gpu_node_autoscaler_leader 1"), "{text}");
        assert!(text.contains(
            "gpu_node_autoscaler_failed_launches_total{pool=\"a10g\",reason=\"insufficient_capacity\"} 1"
        ));
        assert!(text.contains("# TYPE gpu_node_autoscaler_reaction_seconds histogram"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn probes_follow_sync_and_the_loop_heartbeat() {
        let m = Metrics::new();
        let h = Health::default();
        assert_eq!(
            respond("/readyz", &m, &h, 0).0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        h.ready.store(true, Ordering::Relaxed);
        assert_eq!(respond("/readyz", &m, &h, 0).0, StatusCode::OK);
        h.heartbeat.store(1000, Ordering::Relaxed);
        assert_eq!(respond("/healthz", &m, &h, 1030).0, StatusCode::OK);
        assert_eq!(
            respond("/healthz", &m, &h, 1100).0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(respond("/nope", &m, &h, 0).0, StatusCode::NOT_FOUND);
    }
}
