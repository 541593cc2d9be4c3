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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OfferingLabel {
    pub instance_type: String,
    pub zone: String,
    pub capacity_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PriceRefresh {
    pub provider: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CloudOperation {
    pub provider: String,
    pub operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CloudResult {
    pub provider: String,
    pub operation: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BufferLabel {
    /// `namespace/name` of the CapacityBuffer.
    pub buffer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildInfo {
    pub version: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn cloud_buckets() -> Histogram {
    // 10 ms to about 160 s: an ESS scaling activity is awaited for minutes.
    Histogram::new(exponential_buckets(0.01, 2.0, 15))
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
    pub give_up_terminations_failed: Family<PoolLabel, Counter>,
    pub nodes_refused: Family<PoolLabel, Counter>,
    pub evictions: Family<EvictionResult, Counter>,
    pub nodes_gpus_lost: Gauge,
    pub nodes_unhealthy: Gauge,
    pub nodes_drifted: Gauge,
    pub nodes_replaced: Family<Replaced, Counter>,
    pub capacity_block_pod_hours_moved: Family<PoolLabel, Counter<f64>>,
    pub interruption_messages: Family<NoticeLabel, Counter>,
    pub gpu_metrics_reads: Family<ReadResult, Counter>,
    pub heartbeat_timestamp_seconds: Gauge,
    pub launches_in_progress: Gauge,
    pub plan_duration_seconds: Histogram,
    pub reaction_seconds: Histogram,
    pub cloud_request_duration_seconds: HistogramFamily<CloudOperation>,
    pub cloud_requests: Family<CloudResult, Counter>,
    pub pool_max_nodes: Family<PoolLabel, Gauge>,
    pub pool_max_gpus: Family<PoolLabel, Gauge>,
    pub nodes_unneeded: Family<PoolLabel, Gauge>,
    pub last_pass_timestamp_seconds: Gauge,
    pub offering_price: Family<OfferingLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub price_refreshes: Family<PriceRefresh, Counter>,
    pub buffer_replicas: Family<BufferLabel, Gauge>,
    pub buffer_ready_replicas: Family<BufferLabel, Gauge>,
    pub buffer_gpus: Family<BufferLabel, Gauge>,
    pub buffer_cost: Family<BufferLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// The process' own (`process_*`, without the prefix, as every exporter names them).
    process: Process,
    registry: Registry,
}

/// `process_*` metrics, read from `/proc/self` when scraped (Linux; absent elsewhere).
struct Process {
    start_time_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    cpu_seconds_total: Counter<f64, std::sync::atomic::AtomicU64>,
    resident_memory_bytes: Gauge,
    open_fds: Gauge,
    registry: Registry,
}

impl Process {
    fn new() -> Process {
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let p = Process {
            start_time_seconds: Gauge::default(),
            cpu_seconds_total: Counter::default(),
            resident_memory_bytes: Gauge::default(),
            open_fds: Gauge::default(),
            registry: Registry::default(),
        };
        p.start_time_seconds.set(start);
        let mut registry = Registry::with_prefix("process");
        registry.register(
            "start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            p.start_time_seconds.clone(),
        );
        registry.register(
            "cpu_seconds",
            "Total user and system CPU time spent in seconds",
            p.cpu_seconds_total.clone(),
        );
        registry.register(
            "resident_memory_bytes",
            "Resident memory size in bytes",
            p.resident_memory_bytes.clone(),
        );
        registry.register(
            "open_fds",
            "Number of open file descriptors",
            p.open_fds.clone(),
        );
        Process { registry, ..p }
    }

    fn refresh(&self) {
        // utime and stime (fields 14 and 15) in clock ticks of USER_HZ, 100 on Linux.
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
            if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
                let f: Vec<&str> = rest.split_whitespace().collect();
                // After the command: state is field 3, so utime (14) is at index 11.
                if let (Some(u), Some(s)) = (
                    f.get(11).and_then(|v| v.parse::<f64>().ok()),
                    f.get(12).and_then(|v| v.parse::<f64>().ok()),
                ) {
                    let total = (u + s) / 100.0;
                    let seen = self.cpu_seconds_total.get();
                    if total > seen {
                        self.cpu_seconds_total.inc_by(total - seen);
                    }
                }
            }
        }
        if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
            if let Some(kb) = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
            {
                self.resident_memory_bytes.set(kb * 1024);
            }
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(fds.count() as i64);
        }
    }
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
            give_up_terminations_failed: Family::default(),
            nodes_refused: Family::default(),
            evictions: Family::default(),
            nodes_gpus_lost: Gauge::default(),
            nodes_unhealthy: Gauge::default(),
            nodes_drifted: Gauge::default(),
            nodes_replaced: Family::default(),
            capacity_block_pod_hours_moved: Family::default(),
            interruption_messages: Family::default(),
            gpu_metrics_reads: Family::default(),
            heartbeat_timestamp_seconds: Gauge::default(),
            launches_in_progress: Gauge::default(),
            plan_duration_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            reaction_seconds: Histogram::new(exponential_buckets(0.25, 2.0, 12)),
            cloud_request_duration_seconds: Family::new_with_constructor(cloud_buckets),
            cloud_requests: Family::default(),
            pool_max_nodes: Family::default(),
            pool_max_gpus: Family::default(),
            nodes_unneeded: Family::default(),
            last_pass_timestamp_seconds: Gauge::default(),
            offering_price: Family::default(),
            price_refreshes: Family::default(),
            buffer_replicas: Family::default(),
            buffer_ready_replicas: Family::default(),
            buffer_gpus: Family::default(),
            buffer_cost: Family::default(),
            process: Process::new(),
            registry: Registry::default(),
        };
        let build_info: Family<BuildInfo, Gauge> = Family::default();
        build_info
            .get_or_create(&BuildInfo {
                version: env!("CARGO_PKG_VERSION").to_string(),
            })
            .set(1);
        registry.register(
            "build_info",
            "1, labelled with the version of the running build",
            build_info,
        );
        registry.register(
            "cloud_request_duration_seconds",
            "Duration of calls to a cloud provider, per provider and operation (launch, \
             terminate, list, catalog)",
            m.cloud_request_duration_seconds.clone(),
        );
        registry.register(
            "cloud_requests",
            "Calls to a cloud provider, per provider, operation and result (ok, error, \
             timeout: no answer in time, given up)",
            m.cloud_requests.clone(),
        );
        registry.register(
            "pool_max_nodes",
            "The pool's maxNodes in the policy in force",
            m.pool_max_nodes.clone(),
        );
        registry.register(
            "pool_max_gpus",
            "The pool's maxGpus in the policy in force, where it sets one",
            m.pool_max_gpus.clone(),
        );
        registry.register(
            "nodes_unneeded",
            "Nodes per pool the last decision found unneeded (candidates for scale-down)",
            m.nodes_unneeded.clone(),
        );
        registry.register(
            "last_pass_timestamp_seconds",
            "Unix time the leader last finished a decision pass",
            m.last_pass_timestamp_seconds.clone(),
        );
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
            "nodes_drifted",
            "Nodes of ours launched differently from what their pool launches today",
            m.nodes_drifted.clone(),
        );
        registry.register(
            "nodes_replaced",
            "Nodes drained and removed to be replaced, per pool and cause (unhealthy, interrupted, consolidating, drifted, expired)",
            m.nodes_replaced.clone(),
        );
        registry.register(
            "capacity_block_pod_hours_moved",
            "Pod-hours of work moved off nodes of Capacity Blocks before their end, per pool",
            m.capacity_block_pod_hours_moved.clone(),
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
            "give_up_terminations_failed",
            "Terminations of instances given up (never became nodes) that failed, per pool; \
             retried with back-off",
            m.give_up_terminations_failed.clone(),
        );
        registry.register(
            "nodes_refused_by_scheduler",
            "Nodes of a pool kube-scheduler refused a pending pod that fits them on the \
             planner's model (a rule it does not know), after which they were left out of the \
             pod's plans",
            m.nodes_refused.clone(),
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
            "offering_price_dollars_per_hour",
            "The price in force per offering (instance type, zone, capacity type)",
            m.offering_price.clone(),
        );
        registry.register(
            "price_refreshes",
            "Reads of a cloud's prices while the policy stays the same, by result (ok, error: \
             the last good prices stay)",
            m.price_refreshes.clone(),
        );
        registry.register(
            "buffer_replicas",
            "Chunks each CapacityBuffer keeps as spare capacity (its status.replicas)",
            m.buffer_replicas.clone(),
        );
        registry.register(
            "buffer_ready_replicas",
            "Chunks of each CapacityBuffer with room on Ready nodes now (warm)",
            m.buffer_ready_replicas.clone(),
        );
        registry.register(
            "buffer_gpus",
            "GPUs of all the chunks of each CapacityBuffer",
            m.buffer_gpus.clone(),
        );
        registry.register(
            "buffer_cost_dollars_per_hour",
            "What the room each CapacityBuffer holds costs: each chunk's share of its node's \
             GPUs times the node's price",
            m.buffer_cost.clone(),
        );
        registry.register(
            "reaction_seconds",
            "From a pod seen unschedulable to its launch request",
            m.reaction_seconds.clone(),
        );
        Metrics { registry, ..m }
    }

    pub fn encode(&self) -> String {
        self.process.refresh();
        let mut s = String::new();
        prometheus_client::encoding::text::encode_registry(&mut s, &self.process.registry)
            .expect("writing to a String cannot fail");
        prometheus_client::encoding::text::encode(&mut s, &self.registry)
            .expect("writing to a String cannot fail");
        s
    }

    /// Records one call to a cloud provider.
    /// `result`: `ok`, `error`, or `timeout` (no answer within the call's time: given up).
    pub fn cloud_call(
        &self,
        provider: &str,
        operation: &str,
        took: std::time::Duration,
        result: &str,
    ) {
        self.cloud_request_duration_seconds
            .get_or_create(&CloudOperation {
                provider: provider.to_string(),
                operation: operation.to_string(),
            })
            .observe(took.as_secs_f64());
        self.cloud_requests
            .get_or_create(&CloudResult {
                provider: provider.to_string(),
                operation: operation.to_string(),
                result: result.to_string(),
            })
            .inc();
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
