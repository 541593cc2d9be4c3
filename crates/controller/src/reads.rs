//! What a pass reads from the cloud and from Prometheus before it decides, run as one task the
//! loop does not wait on: the pools' instances (and those of pools that may hold orphans), the
//! prices when they are due, capacity reservations, launch template versions, the interruption
//! queue and the GPUs' XID errors. The calls run together, each with its own time-out; the loop
//! keeps turning meanwhile (probes, drains, launches, leadership) and takes the answers once
//! they are all in.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use gpu_node_autoscaler_core::model::node::GpuXid;
use gpu_node_autoscaler_core::policy::GpuMetrics;
use gpu_node_autoscaler_provider::interruptions::{InterruptionSource, Received};
use gpu_node_autoscaler_provider::{
    Catalog, CloudProvider, GroupTemplate, Instance, ProviderError, Reservation,
};
use tracing::warn;

use crate::gpu_metrics;
use crate::store::ClusterState;

/// A provider with the pool (or cloud) it is asked for.
pub type Asked = Vec<(String, Arc<dyn CloudProvider>)>;

/// Pools not in the policy whose instances of ours are listed too → the provider that listed
/// them last (`None`: not known yet).
pub type OrphanPools = BTreeMap<String, Option<Arc<dyn CloudProvider>>>;

/// What to read, with everything the task needs of the controller.
pub struct Input {
    /// Per cloud, when its prices are due.
    pub prices: Asked,
    /// Per cloud, when its groups (Auto Scaling groups and the like) are due to be read again.
    pub groups: Asked,
    /// The instances, when a policy is in force.
    pub listing: Option<Listing>,
    /// Per provider (with a pool of it that plans reserved capacity).
    pub reservations: Asked,
    /// Per provider (with a pool of it).
    pub launch_versions: Asked,
    /// The interruption queue and until when its read may wait.
    pub queue: Option<(Arc<dyn InterruptionSource>, tokio::time::Instant)>,
    /// Prometheus, when its XID series are due.
    pub gpu_metrics: Option<(reqwest::Client, GpuMetrics)>,
}

pub struct Listing {
    /// The policy's pools and their providers.
    pub pools: Asked,
    /// One provider per cloud, for orphan pools whose provider is not known.
    pub clouds: Vec<Arc<dyn CloudProvider>>,
    pub orphan_pools: OrphanPools,
    /// For the pools Nodes are labelled with.
    pub state: Arc<Mutex<ClusterState>>,
}

/// What the interruption queue answered (`None`: its read ran out of the pass's budget for the
/// queue), and how long the read took.
pub type QueueRead = (Option<Result<Vec<Received>, String>>, std::time::Duration);

/// A cloud's groups' templates per pool, with its catalog (for the groups' instance types).
pub type GroupsRead = Result<(BTreeMap<String, Vec<GroupTemplate>>, Catalog), ProviderError>;

/// The answers.
pub struct Reads {
    pub prices: Vec<(String, Result<Catalog, ProviderError>)>,
    pub groups: Vec<(String, GroupsRead)>,
    /// The instances and the orphan pools still worth listing, or what failed.
    pub listing: Option<Result<(Vec<Instance>, OrphanPools), String>>,
    pub reservations: Vec<Reservation>,
    pub launch_versions: BTreeMap<String, String>,
    pub queue: Option<QueueRead>,
    pub gpu_metrics: Option<Result<BTreeMap<String, Vec<GpuXid>>, String>>,
}

/// Reads everything asked, the calls together.
pub async fn run(input: Input) -> Reads {
    // Prices and groups both need a cloud's catalog: read once a pass, then shared.
    let catalogs_and_groups = async {
        let mut catalogs: BTreeMap<String, Result<Catalog, ProviderError>> = BTreeMap::new();
        for (cloud, provider) in input.prices.iter().chain(&input.groups) {
            if !catalogs.contains_key(cloud) {
                catalogs.insert(cloud.clone(), provider.catalog().await);
            }
        }
        let mut groups = Vec::new();
        for (cloud, provider) in &input.groups {
            let read = match provider.templates().await {
                Ok(t) => catalogs[cloud].clone().map(|c| (t, c)),
                Err(e) => Err(e),
            };
            groups.push((cloud.clone(), read));
        }
        let prices: Vec<_> = input
            .prices
            .iter()
            .map(|(cloud, _)| (cloud.clone(), catalogs[cloud].clone()))
            .collect();
        (prices, groups)
    };
    let listing = async {
        match input.listing {
            Some(l) => Some(list_instances(l).await),
            None => None,
        }
    };
    let reservations = async {
        let mut out = Vec::new();
        for (pool, provider) in input.reservations {
            match provider.reservations().await {
                Ok(r) => out.extend(r),
                Err(e) => warn!(
                    "listing the capacity reservations of {} (pool {pool}): {e}; its reservations \
                     are not planned in this pass",
                    provider.name(),
                ),
            }
        }
        out
    };
    let launch_versions = async {
        let mut out = BTreeMap::new();
        for (pool, provider) in input.launch_versions {
            match provider.launch_versions().await {
                Ok(v) => out.extend(v),
                Err(e) => warn!(
                    "resolving the launch template versions of {} (pool {pool}): {e}; drift by a \
                     new version is not looked for in this pass",
                    provider.name(),
                ),
            }
        }
        out
    };
    let queue = async {
        let (q, until) = input.queue?;
        let started = tokio::time::Instant::now();
        let read = tokio::time::timeout_at(until, q.receive(100)).await.ok();
        Some((read, started.elapsed()))
    };
    let gpu = async {
        let (http, cfg) = input.gpu_metrics?;
        Some(gpu_metrics::read(&http, &cfg).await)
    };
    let ((prices, groups), listing, reservations, launch_versions, queue, gpu_metrics) = tokio::join!(
        catalogs_and_groups,
        listing,
        reservations,
        launch_versions,
        queue,
        gpu
    );
    Reads {
        prices,
        groups,
        listing,
        reservations,
        launch_versions,
        queue,
        gpu_metrics,
    }
}

/// The cloud's instances of every pool, and of the pools not in the policy that may hold
/// orphans.
async fn list_instances(l: Listing) -> Result<(Vec<Instance>, OrphanPools), String> {
    let mut out: Vec<Instance> = Vec::new();
    // Pool by pool together: a slow cloud costs one call's time-out, not one per pool.
    let listings = futures::future::join_all(l.pools.iter().map(|(pool, provider)| async move {
        provider
            .list(pool)
            .await
            .map_err(|e| format!("listing the instances of pool {pool}: {e}"))
    }))
    .await;
    for listed in listings {
        out.extend(listed?);
    }
    let in_policy: BTreeSet<&str> = l.pools.iter().map(|(p, _)| p.as_str()).collect();
    let labelled = |pool: &str| {
        let s = l.state.lock().unwrap();
        s.nodes.items.values().any(|n| n.pool() == Some(pool))
    };
    let mut orphan_pools = l.orphan_pools;
    // Pools Nodes are labelled with that the policy does not have.
    let labels: BTreeSet<String> = {
        let s = l.state.lock().unwrap();
        s.nodes
            .items
            .values()
            .filter_map(|n| n.pool())
            .filter(|p| !in_policy.contains(p))
            .map(str::to_string)
            .collect()
    };
    for pool in labels {
        orphan_pools.entry(pool).or_insert(None);
    }
    let mut found = OrphanPools::new();
    for (pool, known) in &orphan_pools {
        let candidates: Vec<Arc<dyn CloudProvider>> = match known {
            Some(p) => vec![p.clone()],
            None => l.clouds.clone(),
        };
        let mut listed_by = known.clone();
        let mut any = false;
        for provider in candidates {
            let listed = provider.list(pool).await.map_err(|e| {
                format!("listing the instances of pool {pool} (not in the policy): {e}")
            })?;
            if !listed.is_empty() {
                any = true;
                listed_by = Some(provider.clone());
            }
            out.extend(listed);
        }
        // A pool with nothing of ours left and no Node is forgotten.
        if any || labelled(pool) {
            found.insert(pool.clone(), listed_by);
        }
    }
    Ok((out, found))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use gpu_node_autoscaler_provider::{LaunchRequest, LaunchResult};

    use super::*;

    /// A cloud whose every read waits a little and answers nothing, counting the reads under
    /// way at once.
    #[derive(Default)]
    struct Slow {
        now: AtomicUsize,
        most: AtomicUsize,
    }

    impl Slow {
        async fn read(&self) {
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.now.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[async_trait::async_trait]
    impl CloudProvider for Slow {
        fn name(&self) -> &str {
            "slow"
        }
        async fn catalog(&self) -> Result<Catalog, ProviderError> {
            self.read().await;
            Ok(Catalog::default())
        }
        async fn launch(&self, _: &LaunchRequest) -> Result<LaunchResult, ProviderError> {
            unreachable!("no launch is read")
        }
        async fn terminate(&self, _: &str) -> Result<(), ProviderError> {
            unreachable!("no termination is read")
        }
        async fn list(&self, _: &str) -> Result<Vec<Instance>, ProviderError> {
            self.read().await;
            Ok(Vec::new())
        }
        async fn reservations(&self) -> Result<Vec<Reservation>, ProviderError> {
            self.read().await;
            Ok(Vec::new())
        }
        async fn launch_versions(&self) -> Result<BTreeMap<String, String>, ProviderError> {
            self.read().await;
            Ok(BTreeMap::new())
        }
    }

    #[tokio::test]
    async fn stall_a_passs_reads_of_a_slow_cloud_run_together_not_one_after_another() {
        let slow = Arc::new(Slow::default());
        let cloud: Arc<dyn CloudProvider> = slow.clone();
        let asked = || vec![("a10g".to_string(), cloud.clone())];
        let input = Input {
            prices: vec![("slow".to_string(), cloud.clone())],
            groups: Vec::new(),
            listing: Some(Listing {
                pools: vec![
                    ("a10g".to_string(), cloud.clone()),
                    ("l4".to_string(), cloud.clone()),
                ],
                clouds: vec![cloud.clone()],
                orphan_pools: OrphanPools::new(),
                state: Arc::new(Mutex::new(ClusterState::default())),
            }),
            reservations: asked(),
            launch_versions: asked(),
            queue: None,
            gpu_metrics: None,
        };
        let reads = run(input).await;
        // Prices, two pools' listings, reservations and versions: all under way at once, so a
        // slow cloud costs a pass one call's time, not five.
        assert_eq!(slow.most.load(Ordering::SeqCst), 5);
        assert_eq!(reads.prices.len(), 1);
        assert!(matches!(reads.listing, Some(Ok((ref i, _))) if i.is_empty()));
    }
}
