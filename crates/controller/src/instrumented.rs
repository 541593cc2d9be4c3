//! A cloud provider whose every call is timed and counted (`cloud_request_duration_seconds`,
//! `cloud_requests_total`), per provider and operation, and given up after an explicit time
//! ([`CallTimeouts`]): a cloud that does not answer makes the call fail (`result="timeout"`), it
//! does not hold the control loop until the liveness probe restarts the process.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_node_autoscaler_provider::{
    Catalog, CloudProvider, Instance, LaunchRequest, LaunchResult, ProviderError, Reservation,
};

use crate::metrics::Metrics;

/// How long each kind of call may take, retries within the provider included. Listing and
/// terminating are awaited within a pass: well under the 60 s after which `/healthz` fails. A
/// launch runs as a task the loop does not wait on, and an ESS scaling activity is awaited for
/// up to 300 s; it is given up before the loop counts it stuck (15 minutes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallTimeouts {
    pub list: Duration,
    pub terminate: Duration,
    pub catalog: Duration,
    pub launch: Duration,
}

impl Default for CallTimeouts {
    fn default() -> CallTimeouts {
        CallTimeouts {
            list: Duration::from_secs(20),
            terminate: Duration::from_secs(20),
            catalog: Duration::from_secs(30),
            launch: Duration::from_secs(600),
        }
    }
}

/// What a call that timed out says (the controller reports calls whose error says so).
pub const TIMED_OUT: &str = "did not answer within";

pub struct Instrumented {
    inner: Arc<dyn CloudProvider>,
    metrics: Arc<Metrics>,
    timeouts: CallTimeouts,
}

impl Instrumented {
    pub fn wrap(inner: Arc<dyn CloudProvider>, metrics: Arc<Metrics>) -> Arc<dyn CloudProvider> {
        Instrumented::with_timeouts(inner, metrics, CallTimeouts::default())
    }

    pub fn with_timeouts(
        inner: Arc<dyn CloudProvider>,
        metrics: Arc<Metrics>,
        timeouts: CallTimeouts,
    ) -> Arc<dyn CloudProvider> {
        Arc::new(Instrumented {
            inner,
            metrics,
            timeouts,
        })
    }

    /// Runs one call within `limit`, timed and counted.
    async fn call<T>(
        &self,
        operation: &str,
        limit: Duration,
        f: impl Future<Output = Result<T, ProviderError>>,
    ) -> Result<T, ProviderError> {
        let t = Instant::now();
        let (r, result) = match tokio::time::timeout(limit, f).await {
            Ok(r) => {
                let result = if r.is_ok() { "ok" } else { "error" };
                (r, result)
            }
            Err(_) => (
                Err(ProviderError::Other {
                    message: format!(
                        "{} {operation} {TIMED_OUT} {}s (given up; what the cloud did is found \
                         again by the instances' tags)",
                        self.inner.name(),
                        limit.as_secs()
                    ),
                }),
                "timeout",
            ),
        };
        self.metrics
            .cloud_call(self.inner.name(), operation, t.elapsed(), result);
        r
    }
}

#[async_trait::async_trait]
impl CloudProvider for Instrumented {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn catalog(&self) -> Result<Catalog, ProviderError> {
        self.call("catalog", self.timeouts.catalog, self.inner.catalog())
            .await
    }

    async fn launch(&self, request: &LaunchRequest) -> Result<LaunchResult, ProviderError> {
        self.call("launch", self.timeouts.launch, self.inner.launch(request))
            .await
    }

    async fn terminate(&self, instance_id: &str) -> Result<(), ProviderError> {
        self.call(
            "terminate",
            self.timeouts.terminate,
            self.inner.terminate(instance_id),
        )
        .await
    }

    async fn list(&self, pool: &str) -> Result<Vec<Instance>, ProviderError> {
        self.call("list", self.timeouts.list, self.inner.list(pool))
            .await
    }

    async fn launch_versions(
        &self,
    ) -> Result<std::collections::BTreeMap<String, String>, ProviderError> {
        self.call(
            "launch_versions",
            self.timeouts.list,
            self.inner.launch_versions(),
        )
        .await
    }

    /// Within a catalog's time: read with it when a policy is applied.
    async fn templates(
        &self,
    ) -> Result<
        std::collections::BTreeMap<String, Vec<gpu_node_autoscaler_provider::GroupTemplate>>,
        ProviderError,
    > {
        self.call("templates", self.timeouts.catalog, self.inner.templates())
            .await
    }

    /// Within a listing's time: the reservations are read within the pass, as the instances.
    async fn reservations(&self) -> Result<Vec<Reservation>, ProviderError> {
        self.call(
            "reservations",
            self.timeouts.list,
            self.inner.reservations(),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake;

    #[async_trait::async_trait]
    impl CloudProvider for Fake {
        fn name(&self) -> &str {
            "fake"
        }
        async fn catalog(&self) -> Result<Catalog, ProviderError> {
            Ok(Catalog::default())
        }
        async fn launch(&self, _: &LaunchRequest) -> Result<LaunchResult, ProviderError> {
            Err(ProviderError::QuotaExceeded {
                message: "no more".into(),
            })
        }
        async fn terminate(&self, _: &str) -> Result<(), ProviderError> {
            Ok(())
        }
        async fn list(&self, _: &str) -> Result<Vec<Instance>, ProviderError> {
            Ok(Vec::new())
        }
        async fn reservations(&self) -> Result<Vec<Reservation>, ProviderError> {
            Ok(vec![Reservation {
                id: "cr-0odcr".into(),
                kind: gpu_node_autoscaler_provider::ReservationKind::Default,
                instance_type: "g5.xlarge".into(),
                zone: "us-east-1a".into(),
                total: 2,
                available: 1,
                start_ms: None,
                end_ms: None,
                tags: Default::default(),
                price_per_hour: None,
            }])
        }
    }

    /// A cloud whose listing never answers (an API endpoint that accepts the connection and says
    /// nothing).
    struct Stuck;

    #[async_trait::async_trait]
    impl CloudProvider for Stuck {
        fn name(&self) -> &str {
            "stuck"
        }
        async fn catalog(&self) -> Result<Catalog, ProviderError> {
            Ok(Catalog::default())
        }
        async fn launch(&self, _: &LaunchRequest) -> Result<LaunchResult, ProviderError> {
            Ok(LaunchResult::default())
        }
        async fn terminate(&self, _: &str) -> Result<(), ProviderError> {
            std::future::pending().await
        }
        async fn list(&self, _: &str) -> Result<Vec<Instance>, ProviderError> {
            std::future::pending().await
        }
    }

    #[tokio::test]
    async fn stall_a_cloud_call_that_never_answers_fails_after_its_timeout_and_is_counted() {
        let metrics = Arc::new(Metrics::new());
        let short = Duration::from_millis(50);
        let timeouts = CallTimeouts {
            list: short,
            terminate: short,
            catalog: short,
            launch: short,
        };
        let p = Instrumented::with_timeouts(Arc::new(Stuck), metrics.clone(), timeouts);
        let e = p.list("a10g").await.unwrap_err();
        assert!(e.to_string().contains(TIMED_OUT), "{e}");
        // Every default is explicit, and a listing gives up well before /healthz would fail.
        let d = CallTimeouts::default();
        assert!(d.list < Duration::from_secs(30) && d.terminate < Duration::from_secs(30));
        assert!(p.terminate("i-1").await.is_err());
        assert!(p.catalog().await.is_ok(), "an answer in time is kept");
        let text = metrics.encode();
        for line in [
            r#"gpu_node_autoscaler_cloud_requests_total{provider="stuck",operation="list",result="timeout"} 1"#,
            r#"gpu_node_autoscaler_cloud_requests_total{provider="stuck",operation="terminate",result="timeout"} 1"#,
            r#"gpu_node_autoscaler_cloud_requests_total{provider="stuck",operation="catalog",result="ok"} 1"#,
        ] {
            assert!(text.contains(line), "{line} not in {text}");
        }
    }

    #[tokio::test]
    async fn every_call_is_timed_and_counted_by_operation_and_result() {
        let metrics = Arc::new(Metrics::new());
        let p = Instrumented::wrap(Arc::new(Fake), metrics.clone());
        assert_eq!(p.name(), "fake");
        p.list("a10g").await.unwrap();
        p.list("a10g").await.unwrap();
        p.terminate("i-1").await.unwrap();
        let request = LaunchRequest {
            launch_id: "l".into(),
            pool: "a10g".into(),
            count: 1,
            offerings: Vec::new(),
            tags: Default::default(),
            reservations: Vec::new(),
            atomic: false,
        };
        assert!(p.launch(&request).await.is_err());
        // The account's reservations come through, not the trait's default of none.
        let r = p.reservations().await.unwrap();
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].id, "cr-0odcr");
        let text = metrics.encode();
        for line in [
            r#"gpu_node_autoscaler_cloud_requests_total{provider="fake",operation="reservations",result="ok"} 1"#,
            r#"gpu_node_autoscaler_cloud_requests_total{provider="fake",operation="list",result="ok"} 2"#,
            r#"gpu_node_autoscaler_cloud_requests_total{provider="fake",operation="terminate",result="ok"} 1"#,
            r#"gpu_node_autoscaler_cloud_requests_total{provider="fake",operation="launch",result="error"} 1"#,
            r#"gpu_node_autoscaler_cloud_request_duration_seconds_count{provider="fake",operation="list"} 2"#,
        ] {
            assert!(text.contains(line), "{line} not in {text}");
        }
        // The process' own, from /proc/self.
        let rss = text
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .and_then(|v| v.parse::<f64>().ok())
            .expect("process_resident_memory_bytes");
        assert!(rss > 1e6, "{rss}");
        assert!(text.contains("gpu_node_autoscaler_build_info{version=\""));
    }
}
