//! A cloud provider whose every call is timed and counted (`cloud_request_duration_seconds`,
//! `cloud_requests_total`), per provider and operation.

use std::sync::Arc;
use std::time::Instant;

use gpu_node_autoscaler_provider::{
    Catalog, CloudProvider, Instance, LaunchRequest, LaunchResult, ProviderError,
};

use crate::metrics::Metrics;

pub struct Instrumented {
    inner: Arc<dyn CloudProvider>,
    metrics: Arc<Metrics>,
}

impl Instrumented {
    pub fn wrap(inner: Arc<dyn CloudProvider>, metrics: Arc<Metrics>) -> Arc<dyn CloudProvider> {
        Arc::new(Instrumented { inner, metrics })
    }

    fn record<T>(&self, operation: &str, since: Instant, r: &Result<T, ProviderError>) {
        self.metrics
            .cloud_call(self.inner.name(), operation, since.elapsed(), r.is_ok());
    }
}

#[async_trait::async_trait]
impl CloudProvider for Instrumented {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn catalog(&self) -> Result<Catalog, ProviderError> {
        let t = Instant::now();
        let r = self.inner.catalog().await;
        self.record("catalog", t, &r);
        r
    }

    async fn launch(&self, request: &LaunchRequest) -> Result<LaunchResult, ProviderError> {
        let t = Instant::now();
        let r = self.inner.launch(request).await;
        self.record("launch", t, &r);
        r
    }

    async fn terminate(&self, instance_id: &str) -> Result<(), ProviderError> {
        let t = Instant::now();
        let r = self.inner.terminate(instance_id).await;
        self.record("terminate", t, &r);
        r
    }

    async fn list(&self, pool: &str) -> Result<Vec<Instance>, ProviderError> {
        let t = Instant::now();
        let r = self.inner.list(pool).await;
        self.record("list", t, &r);
        r
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
        };
        assert!(p.launch(&request).await.is_err());
        let text = metrics.encode();
        for line in [
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
