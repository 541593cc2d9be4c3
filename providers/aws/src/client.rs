//! The provider itself (behind the `client` feature, on by default): the cloud SDK or HTTP
//! client, the `CloudProvider` implementation and what it needs.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::{
    CapacityReservationSpecification, CapacityReservationTarget, DefaultTargetCapacityType, Filter,
    FleetLaunchTemplateConfigRequest, FleetLaunchTemplateOverridesRequest,
    FleetLaunchTemplateSpecificationRequest, FleetOnDemandAllocationStrategy, FleetType,
    InstanceLifecycle, InstanceLifecycleType, InstanceMarketOptionsRequest, InstanceStateName,
    InstanceType as Ec2InstanceType, LaunchTemplateSpecification, LocationType, MarketType,
    OnDemandOptionsRequest, ResourceType, SpotAllocationStrategy, SpotOptionsRequest, Tag,
    TagSpecification, TargetCapacitySpecificationRequest,
};
use aws_sdk_ec2::Client;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use gpu_node_autoscaler_provider::{
    CapacityType, Catalog, CloudProvider, GpuInfo, GpuVendor, Instance, InstanceState,
    InstanceType, LaunchRequest, LaunchResult, Offering, OfferingKey, ProviderError, Reservation,
    ReservationKind, LAUNCH_FINGERPRINT_TAG,
};

pub use crate::errors::ApiError;
pub use crate::settings::AutoScalingGroups;

mod asg;

/// Tag carrying the cluster name.
pub const TAG_CLUSTER: &str = "gpu-node-autoscaler.io/cluster";
/// Tag carrying the pool name.
pub const TAG_POOL: &str = "gpu-node-autoscaler.io/pool";
/// Tag carrying the launch id.
pub const TAG_LAUNCH_ID: &str = "gpu-node-autoscaler.io/launch-id";
/// Tag marking what this autoscaler manages; its value is [`MANAGED_BY`].
pub const TAG_MANAGED_BY: &str = "gpu-node-autoscaler.io/managed-by";
/// The identity of the Kubernetes cluster that launched the instance (its `kube-system`
/// Namespace UID): unlike `clusterName`, two clusters cannot share it.
pub const TAG_CLUSTER_ID: &str = "gpu-node-autoscaler.io/cluster-id";
pub const MANAGED_BY: &str = "gpu-node-autoscaler";
/// Tag carrying the capacity reservation an instance was launched into (`cr-...`), the one the
/// launch targeted; EC2's own `CapacityReservationId` of the instance comes first when listing.
pub const TAG_RESERVATION_ID: &str = "gpu-node-autoscaler.io/capacity-reservation-id";

/// A launch template: `id_or_name` starting with `lt-` is an id, anything else a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchTemplateRef {
    pub id_or_name: String,
    /// A version number, `$Default` or `$Latest`.
    pub version: String,
}

impl LaunchTemplateRef {
    pub fn new(id_or_name: impl Into<String>) -> LaunchTemplateRef {
        LaunchTemplateRef {
            id_or_name: id_or_name.into(),
            version: "$Default".to_string(),
        }
    }

    fn is_id(&self) -> bool {
        self.id_or_name.starts_with("lt-")
    }
}

/// How on-demand capacity is chosen among a fleet's overrides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnDemandAllocation {
    /// Keep the request's order (override priorities 1, 2, ...).
    #[default]
    Prioritized,
    LowestPrice,
}

/// How spot capacity is chosen among a fleet's overrides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpotAllocation {
    #[default]
    PriceCapacityOptimized,
    CapacityOptimized,
    LowestPrice,
}

/// One node pool as AWS sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct AwsPool {
    pub name: String,
    pub launch_template: LaunchTemplateRef,
    /// Zone → subnet id; the pool's zones are this map's keys.
    pub subnets: BTreeMap<String, String>,
    /// The instance types the pool may launch.
    pub instance_types: Vec<String>,
    /// Instance type → on-demand $/hour (the EC2 API has no prices).
    pub on_demand_prices: BTreeMap<String, f64>,
    pub on_demand_allocation: OnDemandAllocation,
    pub spot_allocation: SpotAllocation,
}

/// A pool backed by Auto Scaling groups: grown with `SetDesiredCapacity`, shrunk with
/// `TerminateInstanceInAutoScalingGroup`.
#[derive(Clone, Debug, PartialEq)]
pub struct AsgPool {
    pub name: String,
    /// Its groups, named or discovered by tags.
    pub groups: AutoScalingGroups,
    /// The instance types the pool may launch (a group's others are left out); empty: all of
    /// its groups'.
    pub instance_types: Vec<String>,
    /// Instance type → on-demand $/hour.
    pub on_demand_prices: BTreeMap<String, f64>,
    /// The pool's zones and capacity types, for the check of what its groups lack.
    pub zones: Vec<String>,
    pub capacity_types: Vec<CapacityType>,
}

/// Client-side rate limits, calls per second per API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimits {
    /// Each `Describe*` API.
    pub describe_per_second: u32,
    pub create_fleet_per_second: u32,
    pub terminate_per_second: u32,
}

impl Default for RateLimits {
    fn default() -> RateLimits {
        RateLimits {
            describe_per_second: 20,
            create_fleet_per_second: 5,
            terminate_per_second: 5,
        }
    }
}

pub use gpu_node_autoscaler_provider::retry::RetryPolicy;

#[derive(Clone, Debug, PartialEq)]
pub struct AwsConfig {
    pub region: String,
    /// Another EC2 endpoint, e.g. an emulator's `http://127.0.0.1:5000`.
    pub endpoint_url: Option<String>,
    /// Tagged on every instance; with the pool, what `list` filters on.
    pub cluster: String,
    /// The cluster's identity (`TAG_CLUSTER_ID`), when known: tagged on every launch; `list`
    /// leaves out instances tagged with another, and `terminate` refuses any instance not
    /// tagged with it.
    pub cluster_id: Option<String>,
    pub pools: Vec<AwsPool>,
    /// The pools backed by Auto Scaling groups.
    pub group_pools: Vec<AsgPool>,
    /// How long a launch follows a group it grew for its new instances.
    pub group_launch_wait: Duration,
    /// How often it looks meanwhile.
    pub group_poll: Duration,
    /// How long a group whose scaling activity failed is not grown again.
    pub group_failure_hold: Duration,
    /// How long after a group was grown the instances that have not come are given back (the
    /// policy's `maxNodeProvisionTime`), for a launch slower than `group_launch_wait`.
    pub group_provision_time: Duration,
    pub rate_limits: RateLimits,
    pub retry: RetryPolicy,
}

impl AwsConfig {
    pub fn new(region: impl Into<String>, cluster: impl Into<String>) -> AwsConfig {
        AwsConfig {
            region: region.into(),
            endpoint_url: None,
            cluster: cluster.into(),
            cluster_id: None,
            pools: Vec::new(),
            group_pools: Vec::new(),
            group_launch_wait: Duration::from_secs(60),
            group_poll: Duration::from_secs(2),
            group_failure_hold: Duration::from_secs(300),
            group_provision_time: Duration::from_secs(15 * 60),
            rate_limits: RateLimits::default(),
            retry: RetryPolicy::default(),
        }
    }

    /// Every problem of the configuration, one message each, naming the pool and field.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.region.trim().is_empty() {
            out.push("region must not be empty".to_string());
        }
        if self.cluster.trim().is_empty() {
            out.push("cluster name must not be empty".to_string());
        }
        let mut names = BTreeSet::new();
        for p in &self.pools {
            if !names.insert(&p.name) {
                out.push(format!("duplicate pool {:?}", p.name));
            }
            if p.launch_template.id_or_name.trim().is_empty() {
                out.push(format!(
                    "pool {}: launch template must not be empty",
                    p.name
                ));
            }
            if p.launch_template.version.trim().is_empty() {
                out.push(format!(
                    "pool {}: launch template version must not be empty",
                    p.name
                ));
            }
            if p.subnets.is_empty() {
                out.push(format!("pool {}: no subnets", p.name));
            }
            for (zone, subnet) in &p.subnets {
                if !subnet.starts_with("subnet-") {
                    out.push(format!(
                        "pool {}: subnet {subnet:?} of zone {zone} is not a subnet id (subnet-...)",
                        p.name
                    ));
                }
            }
            if p.instance_types.is_empty() {
                out.push(format!("pool {}: no instance types", p.name));
            }
        }
        for p in &self.group_pools {
            if !names.insert(&p.name) {
                out.push(format!("duplicate pool {:?}", p.name));
            }
            if matches!(&p.groups, AutoScalingGroups::Named(n) if n.is_empty()) {
                out.push(format!("pool {}: names no Auto Scaling group", p.name));
            }
        }
        if self.retry.max_attempts == 0 {
            out.push("retry.max_attempts must be at least 1".to_string());
        }
        out
    }
}

/// Why [`AwsProvider::new`] refused a configuration.
#[derive(Debug, thiserror::Error)]
pub enum AwsError {
    #[error("invalid AWS provider configuration: {}", .0.join("; "))]
    InvalidConfig(Vec<String>),
}

/// One rate limiter per EC2 API.
struct Limiters {
    describe_instances: DefaultDirectRateLimiter,
    describe_instance_types: DefaultDirectRateLimiter,
    describe_offerings: DefaultDirectRateLimiter,
    describe_spot_prices: DefaultDirectRateLimiter,
    create_fleet: DefaultDirectRateLimiter,
    terminate: DefaultDirectRateLimiter,
    /// Each Auto Scaling `Describe*` API and tagging.
    autoscaling: DefaultDirectRateLimiter,
    /// `SetDesiredCapacity`.
    scale: DefaultDirectRateLimiter,
}

fn limiter(per_second: u32) -> DefaultDirectRateLimiter {
    RateLimiter::direct(Quota::per_second(
        NonZeroU32::new(per_second).unwrap_or(NonZeroU32::MIN),
    ))
}

/// The AWS provider. `Send + Sync`; every method takes `&self`.
pub struct AwsProvider {
    client: Client,
    autoscaling: aws_sdk_autoscaling::Client,
    eks: aws_sdk_eks::Client,
    config: AwsConfig,
    limits: Limiters,
    jitter_counter: AtomicU64,
    groups: std::sync::Mutex<asg::GroupState>,
}

impl std::fmt::Debug for AwsProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client holds the credentials provider: never print it.
        f.debug_struct("AwsProvider")
            .field("region", &self.config.region)
            .field("endpoint_url", &self.config.endpoint_url)
            .field("cluster", &self.config.cluster)
            .field(
                "pools",
                &self
                    .config
                    .pools
                    .iter()
                    .map(|p| &p.name)
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// The response of one `CreateFleet` call, reduced to what the provider uses.
struct FleetOutcome {
    /// (instance id, offering).
    instances: Vec<(String, OfferingKey)>,
    /// (offering, code, message); the offering is `None` when the error names none we know.
    errors: Vec<(Option<OfferingKey>, String, String)>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn tag_filter(key: &str, value: &str) -> Filter {
    Filter::builder()
        .name(format!("tag:{key}"))
        .values(value)
        .build()
}

fn state_filter(states: &[&str]) -> Filter {
    Filter::builder()
        .name("instance-state-name")
        .set_values(Some(states.iter().map(|s| s.to_string()).collect()))
        .build()
}

fn gpu_vendor(manufacturer: &str) -> Option<GpuVendor> {
    match manufacturer.to_ascii_lowercase().as_str() {
        "nvidia" => Some(GpuVendor::Nvidia),
        "amd" => Some(GpuVendor::Amd),
        _ => None,
    }
}

impl AwsProvider {
    /// Builds the EC2 client (credentials from the default chain) after checking the
    /// configuration. Makes no API call.
    pub async fn new(config: AwsConfig) -> Result<AwsProvider, AwsError> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(AwsError::InvalidConfig(problems));
        }
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(config.region.clone()))
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(Duration::from_secs(60))
                    .build(),
            );
        if let Some(url) = &config.endpoint_url {
            loader = loader.endpoint_url(url.clone());
        }
        let sdk = loader.load().await;
        let r = &config.rate_limits;
        let limits = Limiters {
            describe_instances: limiter(r.describe_per_second),
            describe_instance_types: limiter(r.describe_per_second),
            describe_offerings: limiter(r.describe_per_second),
            describe_spot_prices: limiter(r.describe_per_second),
            create_fleet: limiter(r.create_fleet_per_second),
            terminate: limiter(r.terminate_per_second),
            autoscaling: limiter(r.describe_per_second),
            scale: limiter(r.create_fleet_per_second),
        };
        Ok(AwsProvider {
            client: Client::new(&sdk),
            autoscaling: aws_sdk_autoscaling::Client::new(&sdk),
            eks: aws_sdk_eks::Client::new(&sdk),
            config,
            limits,
            jitter_counter: AtomicU64::new(0),
            groups: Default::default(),
        })
    }

    /// (instance type, zone) for every zone of the region that offers one of `type_names`.
    async fn offered_zones(
        &self,
        type_names: &[String],
    ) -> Result<BTreeSet<(String, String)>, ProviderError> {
        let mut offered: BTreeSet<(String, String)> = BTreeSet::new();
        let mut token: Option<String> = None;
        loop {
            let resp = self
                .call(
                    "DescribeInstanceTypeOfferings",
                    &self.limits.describe_offerings,
                    || {
                        self.client
                            .describe_instance_type_offerings()
                            .location_type(LocationType::AvailabilityZone)
                            .filters(
                                Filter::builder()
                                    .name("instance-type")
                                    .set_values(Some(type_names.to_vec()))
                                    .build(),
                            )
                            .set_next_token(token.clone())
                            .send()
                    },
                )
                .await
                .map_err(ApiError::into_provider_error)?;
            for o in resp.instance_type_offerings() {
                if let (Some(t), Some(z)) = (o.instance_type(), o.location()) {
                    offered.insert((t.as_str().to_string(), z.to_string()));
                }
            }
            token = resp
                .next_token()
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            if token.is_none() {
                break;
            }
        }
        Ok(offered)
    }

    /// Checks the configuration against the account before any launch: every pool's instance
    /// types offered in each of its zones, its subnets existing in the zones they are listed for,
    /// its launch template existing. One message per problem, naming the pool and field.
    pub async fn validate(&self) -> Result<Vec<String>, ProviderError> {
        let mut problems = Vec::new();
        let mut types: BTreeSet<String> = BTreeSet::new();
        for p in &self.config.pools {
            types.extend(p.instance_types.iter().cloned());
        }
        let types: Vec<String> = types.into_iter().collect();
        let offered = if types.is_empty() {
            BTreeSet::new()
        } else {
            self.offered_zones(&types).await?
        };
        for p in &self.config.pools {
            for t in &p.instance_types {
                if !offered.iter().any(|(ot, _)| ot == t) {
                    problems.push(format!(
                        "pool {}: instanceTypes: {t} is not offered in region {}",
                        p.name, self.config.region
                    ));
                    continue;
                }
                for zone in p.subnets.keys() {
                    if !offered.contains(&(t.clone(), zone.clone())) {
                        problems.push(format!(
                            "pool {}: instanceTypes: {t} is not offered in zone {zone}",
                            p.name
                        ));
                    }
                }
            }
        }
        // Subnets: where they are, if they exist.
        let ids: Vec<String> = self
            .config
            .pools
            .iter()
            .flat_map(|p| p.subnets.values().cloned())
            .collect();
        let mut zone_of: BTreeMap<String, String> = BTreeMap::new();
        if !ids.is_empty() {
            let resp = self
                .call("DescribeSubnets", &self.limits.describe_instances, || {
                    self.client
                        .describe_subnets()
                        .filters(
                            Filter::builder()
                                .name("subnet-id")
                                .set_values(Some(ids.clone()))
                                .build(),
                        )
                        .send()
                })
                .await
                .map_err(ApiError::into_provider_error)?;
            for s in resp.subnets() {
                if let (Some(id), Some(z)) = (s.subnet_id(), s.availability_zone()) {
                    zone_of.insert(id.to_string(), z.to_string());
                }
            }
        }
        for p in &self.config.pools {
            for (zone, id) in &p.subnets {
                match zone_of.get(id) {
                    None => problems.push(format!(
                        "pool {}: aws.subnets.{zone}: subnet {id} not found",
                        p.name
                    )),
                    Some(z) if z != zone => problems.push(format!(
                        "pool {}: aws.subnets.{zone}: subnet {id} is in zone {z}",
                        p.name
                    )),
                    Some(_) => {}
                }
            }
        }
        // Launch templates, by id or by name.
        for p in &self.config.pools {
            let lt = &p.launch_template.id_or_name;
            let by_id = lt.starts_with("lt-");
            let found = self
                .call(
                    "DescribeLaunchTemplates",
                    &self.limits.describe_instances,
                    || {
                        let req = self.client.describe_launch_templates();
                        if by_id {
                            req.launch_template_ids(lt.clone()).send()
                        } else {
                            req.filters(
                                Filter::builder()
                                    .name("launch-template-name")
                                    .values(lt.clone())
                                    .build(),
                            )
                            .send()
                        }
                    },
                )
                .await;
            let exists = match found {
                Ok(r) => !r.launch_templates().is_empty(),
                Err(e) if e.code.as_deref().is_some_and(|c| c.contains("NotFound")) => false,
                Err(e) => return Err(e.into_provider_error()),
            };
            if !exists {
                problems.push(format!(
                    "pool {}: aws.launchTemplate: launch template {lt} not found",
                    p.name
                ));
            }
        }
        Ok(problems)
    }

    pub fn config(&self) -> &AwsConfig {
        &self.config
    }

    fn pool(&self, name: &str) -> Result<&AwsPool, ProviderError> {
        self.config
            .pools
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| ProviderError::InvalidRequest {
                message: format!("unknown pool {name:?} (not in the AWS provider's configuration)"),
            })
    }

    /// Calls `f` after waiting for `limiter`, retrying throttled calls with jittered back-off.
    async fn call<T, E, F, Fut>(
        &self,
        operation: &'static str,
        limiter: &DefaultDirectRateLimiter,
        mut f: F,
    ) -> Result<T, ApiError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, SdkError<E>>>,
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let retry = &self.config.retry;
        let mut attempt = 0u32;
        loop {
            limiter.until_ready().await;
            let err = match f().await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let code = err.code().map(str::to_string);
            let message = match err.message() {
                Some(m) => m.to_string(),
                None => DisplayErrorContext(&err).to_string(),
            };
            if !crate::errors::is_throttle(code.as_deref()) {
                return Err(ApiError {
                    operation,
                    code,
                    message,
                    throttled_after: None,
                });
            }
            let seed = (now_ms() as u64) ^ self.jitter_counter.fetch_add(1, Ordering::Relaxed);
            let delay = gpu_node_autoscaler_provider::retry::backoff(
                retry.base_delay,
                retry.max_delay,
                attempt,
                gpu_node_autoscaler_provider::retry::jitter_unit(seed),
            );
            attempt += 1;
            if attempt >= retry.max_attempts.max(1) {
                return Err(ApiError {
                    operation,
                    code,
                    message,
                    throttled_after: Some(delay),
                });
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// Every instance (any state but `terminated`) with all the given tags, as EC2 returns them.
    async fn describe_tagged(
        &self,
        tags: &[(&str, &str)],
        states: &[&str],
    ) -> Result<Vec<aws_sdk_ec2::types::Instance>, ProviderError> {
        let mut filters: Vec<Filter> = tags.iter().map(|(k, v)| tag_filter(k, v)).collect();
        filters.push(state_filter(states));
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let resp = self
                .call("DescribeInstances", &self.limits.describe_instances, || {
                    self.client
                        .describe_instances()
                        .set_filters(Some(filters.clone()))
                        .set_next_token(token.clone())
                        .max_results(1000)
                        .send()
                })
                .await
                .map_err(ApiError::into_provider_error)?;
            for r in resp.reservations() {
                out.extend(r.instances().iter().cloned());
            }
            token = resp
                .next_token()
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            if token.is_none() {
                return Ok(out);
            }
        }
    }

    fn to_instance(&self, i: &aws_sdk_ec2::types::Instance) -> Option<Instance> {
        let id = i.instance_id()?.to_string();
        let zone = i
            .placement()
            .and_then(|p| p.availability_zone())
            .unwrap_or_default()
            .to_string();
        let tag = |k: &str| {
            i.tags()
                .iter()
                .find(|t| t.key() == Some(k))
                .and_then(|t| t.value())
                .unwrap_or_default()
                .to_string()
        };
        // In a reservation: as EC2 says, else as the targeted launch tagged it.
        let reservation_id = i
            .capacity_reservation_id()
            .map(str::to_string)
            .or_else(|| Some(tag(TAG_RESERVATION_ID)).filter(|r| !r.is_empty()));
        let capacity_type = match i.instance_lifecycle() {
            _ if reservation_id.is_some() => CapacityType::Reserved,
            Some(InstanceLifecycleType::CapacityBlock) => CapacityType::Reserved,
            Some(InstanceLifecycleType::Spot) => CapacityType::Spot,
            _ => CapacityType::OnDemand,
        };
        let state = match i.state().and_then(|s| s.name()) {
            Some(InstanceStateName::Pending) => InstanceState::Pending,
            Some(InstanceStateName::Running) => InstanceState::Running,
            Some(InstanceStateName::Terminated) => InstanceState::Terminated,
            _ => InstanceState::ShuttingDown,
        };
        Some(Instance {
            provider_id: crate::plan::provider_id(&zone, &id),
            id,
            pool: tag(TAG_POOL),
            launch_id: tag(TAG_LAUNCH_ID),
            offering: OfferingKey {
                instance_type: i
                    .instance_type()
                    .map(|t| t.as_str().to_string())
                    .unwrap_or_default(),
                zone,
                capacity_type,
            },
            state,
            launched_at_ms: i
                .launch_time()
                .and_then(|t| t.to_millis().ok())
                .unwrap_or(0),
            reservation_id,
            launch_fingerprint: Some(tag(LAUNCH_FINGERPRINT_TAG)).filter(|f| !f.is_empty()),
            // Our name without an identity while ours is known: never terminated (`check_owned`).
            unclaimed: self.config.cluster_id.is_some() && tag(TAG_CLUSTER_ID).is_empty(),
        })
    }

    /// The tags of a launch's instances: the request's, then ours (cluster, pool, launch id,
    /// managed-by, cluster identity) and, for a launch into a reservation, its id.
    fn launch_tags(
        &self,
        pool: &AwsPool,
        request: &LaunchRequest,
        reservation: Option<&str>,
    ) -> Vec<Tag> {
        let mut tags: BTreeMap<&str, &str> = request
            .tags
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        tags.insert(TAG_CLUSTER, &self.config.cluster);
        tags.insert(TAG_POOL, &pool.name);
        tags.insert(TAG_LAUNCH_ID, &request.launch_id);
        tags.insert(TAG_MANAGED_BY, MANAGED_BY);
        if let Some(id) = &self.config.cluster_id {
            tags.insert(TAG_CLUSTER_ID, id);
        }
        if let Some(r) = reservation {
            tags.insert(TAG_RESERVATION_ID, r);
        }
        tags.iter()
            .map(|(k, v)| Tag::builder().key(*k).value(*v).build())
            .collect()
    }

    /// One `RunInstances` into reservation `r` (targeted by id; a Capacity Block with market
    /// type `capacity-block`): at least one and at most `count` instances of `offering`, from
    /// the pool's launch template in the offering's subnet, tagged as every launch. `done`: how
    /// many of the launch id's instances exist already (part of the client token). Returns the
    /// ids EC2 launched.
    async fn run_in_reservation(
        &self,
        pool: &AwsPool,
        request: &LaunchRequest,
        offering: &OfferingKey,
        r: &Reservation,
        count: u32,
        done: u32,
    ) -> Result<Vec<String>, ApiError> {
        let lt = &pool.launch_template;
        let spec = if lt.is_id() {
            LaunchTemplateSpecification::builder().launch_template_id(&lt.id_or_name)
        } else {
            LaunchTemplateSpecification::builder().launch_template_name(&lt.id_or_name)
        }
        .version(&lt.version)
        .build();
        let tag_specs = vec![TagSpecification::builder()
            .resource_type(ResourceType::Instance)
            .set_tags(Some(self.launch_tags(pool, request, Some(&r.id))))
            .build()];
        let target = CapacityReservationSpecification::builder()
            .capacity_reservation_target(
                CapacityReservationTarget::builder()
                    .capacity_reservation_id(&r.id)
                    .build(),
            )
            .build();
        let market = (r.kind == ReservationKind::CapacityBlock).then(|| {
            InstanceMarketOptionsRequest::builder()
                .market_type(MarketType::CapacityBlock)
                .build()
        });
        let subnet = &pool.subnets[&offering.zone];
        let token = crate::plan::reservation_client_token(&request.launch_id, &r.id, done, count);
        let resp = self
            .call("RunInstances", &self.limits.create_fleet, || {
                self.client
                    .run_instances()
                    .launch_template(spec.clone())
                    .instance_type(Ec2InstanceType::from(offering.instance_type.as_str()))
                    .subnet_id(subnet)
                    .min_count(1)
                    .max_count(i32::try_from(count).unwrap_or(i32::MAX))
                    .client_token(&token)
                    .capacity_reservation_specification(target.clone())
                    .set_instance_market_options(market.clone())
                    .set_tag_specifications(Some(tag_specs.clone()))
                    .send()
            })
            .await?;
        Ok(resp
            .instances()
            .iter()
            .filter_map(|i| i.instance_id().map(str::to_string))
            .collect())
    }

    /// Launches up to `remaining` instances of the reserved offerings `group` (in order) into
    /// the request's reservations of each, and returns how many are still to launch. An
    /// offering left short (its reservations used up, EC2 refusing them for lack of room, or
    /// none in the request) fails with insufficient capacity, that offering only; a call
    /// throttled or over quota before anything launched is the launch's error.
    async fn launch_reserved(
        &self,
        pool: &AwsPool,
        request: &LaunchRequest,
        group: &[OfferingKey],
        mut remaining: u32,
        result: &mut LaunchResult,
    ) -> Result<u32, ProviderError> {
        for o in group {
            if remaining == 0 {
                break;
            }
            let mut failed: Option<ProviderError> = None;
            for r in request
                .reservations
                .iter()
                .filter(|r| r.offering() == *o && r.available > 0)
            {
                let mut room = r.available;
                while remaining > 0 && room > 0 {
                    let n = remaining.min(room);
                    let done = request.count - remaining;
                    let ids = match self.run_in_reservation(pool, request, o, r, n, done).await {
                        Ok(ids) => ids,
                        Err(e) if crate::errors::is_reservation_short(e.code.as_deref()) => break,
                        Err(e) => {
                            let e = e.into_provider_error();
                            let whole_call = matches!(
                                e,
                                ProviderError::Throttled { .. }
                                    | ProviderError::QuotaExceeded { .. }
                            );
                            if whole_call && result.launched.is_empty() {
                                return Err(e);
                            }
                            failed = Some(e);
                            break;
                        }
                    };
                    if ids.is_empty() {
                        break;
                    }
                    let k = (ids.len() as u32).min(remaining);
                    for id in ids {
                        result.launched.push(Instance {
                            provider_id: crate::plan::provider_id(&o.zone, &id),
                            id,
                            pool: pool.name.clone(),
                            launch_id: request.launch_id.clone(),
                            offering: o.clone(),
                            state: InstanceState::Pending,
                            launched_at_ms: now_ms(),
                            reservation_id: Some(r.id.clone()),
                            launch_fingerprint: request.tags.get(LAUNCH_FINGERPRINT_TAG).cloned(),
                            unclaimed: false,
                        });
                    }
                    remaining -= k;
                    room = room.saturating_sub(k);
                }
                if remaining == 0 || failed.is_some() {
                    break;
                }
            }
            if remaining > 0 {
                let e = failed.unwrap_or_else(|| ProviderError::InsufficientCapacity {
                    offering: o.clone(),
                });
                result.failures.push((o.clone(), e));
            }
        }
        Ok(remaining)
    }

    async fn create_fleet(
        &self,
        pool: &AwsPool,
        request: &LaunchRequest,
        capacity_type: CapacityType,
        offerings: &[OfferingKey],
        count: u32,
    ) -> Result<FleetOutcome, ApiError> {
        let lt = &pool.launch_template;
        let spec = if lt.is_id() {
            FleetLaunchTemplateSpecificationRequest::builder().launch_template_id(&lt.id_or_name)
        } else {
            FleetLaunchTemplateSpecificationRequest::builder().launch_template_name(&lt.id_or_name)
        }
        .version(&lt.version)
        .build();
        let mut ltc =
            FleetLaunchTemplateConfigRequest::builder().launch_template_specification(spec);
        for (i, o) in offerings.iter().enumerate() {
            let subnet = &pool.subnets[&o.zone];
            let mut ov = FleetLaunchTemplateOverridesRequest::builder()
                .instance_type(Ec2InstanceType::from(o.instance_type.as_str()))
                .subnet_id(subnet);
            if capacity_type == CapacityType::OnDemand
                && pool.on_demand_allocation == OnDemandAllocation::Prioritized
            {
                ov = ov.priority((i + 1) as f64);
            }
            ltc = ltc.overrides(ov.build());
        }
        let count_i32 = i32::try_from(count).unwrap_or(i32::MAX);
        let mut target =
            TargetCapacitySpecificationRequest::builder().total_target_capacity(count_i32);
        target = match capacity_type {
            CapacityType::Spot => target
                .default_target_capacity_type(DefaultTargetCapacityType::Spot)
                .spot_target_capacity(count_i32),
            // Reserved offerings are launched by `RunInstances` into their reservations
            // (`launch_reserved`), never by a fleet.
            CapacityType::OnDemand | CapacityType::Reserved => target
                .default_target_capacity_type(DefaultTargetCapacityType::OnDemand)
                .on_demand_target_capacity(count_i32),
        };
        let tag_list = self.launch_tags(pool, request, None);
        // An instant fleet takes tags for the fleet and its instances; volumes get theirs from
        // the launch template (see docs/aws.md).
        let tag_specs: Vec<TagSpecification> = [ResourceType::Instance, ResourceType::Fleet]
            .into_iter()
            .map(|rt| {
                TagSpecification::builder()
                    .resource_type(rt)
                    .set_tags(Some(tag_list.clone()))
                    .build()
            })
            .collect();
        let ltc = ltc.build();
        let target = target.build();
        // An atomic request (a gang's nodes): all `count` or none, in one zone, of one type. EC2
        // takes `MinTargetCapacity` only on an instant fleet, and only with
        // `SingleAvailabilityZone` or `SingleInstanceType`: both are set.
        let atomic = request.atomic.then_some(count_i32);
        let token = crate::plan::client_token(&request.launch_id, capacity_type, count, offerings);
        let resp = self
            .call("CreateFleet", &self.limits.create_fleet, || {
                let mut b = self
                    .client
                    .create_fleet()
                    .r#type(FleetType::Instant)
                    .client_token(&token)
                    .launch_template_configs(ltc.clone())
                    .target_capacity_specification(target.clone())
                    .set_tag_specifications(Some(tag_specs.clone()));
                b = match capacity_type {
                    CapacityType::Spot => b.spot_options(
                        SpotOptionsRequest::builder()
                            .allocation_strategy(match pool.spot_allocation {
                                SpotAllocation::PriceCapacityOptimized => {
                                    SpotAllocationStrategy::PriceCapacityOptimized
                                }
                                SpotAllocation::CapacityOptimized => {
                                    SpotAllocationStrategy::CapacityOptimized
                                }
                                SpotAllocation::LowestPrice => SpotAllocationStrategy::LowestPrice,
                            })
                            .set_min_target_capacity(atomic)
                            .set_single_availability_zone(atomic.map(|_| true))
                            .set_single_instance_type(atomic.map(|_| true))
                            .build(),
                    ),
                    CapacityType::OnDemand | CapacityType::Reserved => {
                        let od = OnDemandOptionsRequest::builder()
                            .allocation_strategy(match pool.on_demand_allocation {
                                OnDemandAllocation::Prioritized => {
                                    FleetOnDemandAllocationStrategy::Prioritized
                                }
                                OnDemandAllocation::LowestPrice => {
                                    FleetOnDemandAllocationStrategy::LowestPrice
                                }
                            })
                            .set_min_target_capacity(atomic)
                            .set_single_availability_zone(atomic.map(|_| true))
                            .set_single_instance_type(atomic.map(|_| true));
                        b.on_demand_options(od.build())
                    }
                };
                b.send()
            })
            .await?;

        // Zone of an override: its own, else the zone of its subnet in the pool.
        let zone_of = |subnet: Option<&str>, az: Option<&str>| -> Option<String> {
            az.map(str::to_string).or_else(|| {
                let s = subnet?;
                pool.subnets
                    .iter()
                    .find(|(_, id)| id.as_str() == s)
                    .map(|(z, _)| z.clone())
            })
        };
        let lifecycle_ct = |l: Option<&InstanceLifecycle>| match l {
            Some(InstanceLifecycle::Spot) => CapacityType::Spot,
            Some(InstanceLifecycle::OnDemand) if capacity_type != CapacityType::Reserved => {
                CapacityType::OnDemand
            }
            _ => capacity_type,
        };
        let mut outcome = FleetOutcome {
            instances: Vec::new(),
            errors: Vec::new(),
        };
        for fi in resp.instances() {
            let ov = fi
                .launch_template_and_overrides()
                .and_then(|l| l.overrides());
            let zone = zone_of(
                ov.and_then(|o| o.subnet_id()).or(fi.subnet_id()),
                ov.and_then(|o| o.availability_zone())
                    .or(fi.availability_zone()),
            );
            let instance_type = fi
                .instance_type()
                .or(ov.and_then(|o| o.instance_type()))
                .map(|t| t.as_str().to_string());
            let key = match (instance_type, zone) {
                (Some(t), Some(z)) => OfferingKey {
                    instance_type: t,
                    zone: z,
                    capacity_type: lifecycle_ct(fi.lifecycle()),
                },
                // Without overrides in the response, the first requested offering.
                _ => offerings[0].clone(),
            };
            for id in fi.instance_ids() {
                outcome.instances.push((id.clone(), key.clone()));
            }
        }
        for e in resp.errors() {
            let ov = e
                .launch_template_and_overrides()
                .and_then(|l| l.overrides());
            let key = ov.and_then(|o| {
                Some(OfferingKey {
                    instance_type: o.instance_type()?.as_str().to_string(),
                    zone: zone_of(o.subnet_id(), o.availability_zone())?,
                    capacity_type: lifecycle_ct(e.lifecycle()),
                })
            });
            outcome.errors.push((
                key,
                e.error_code().unwrap_or("Unknown").to_string(),
                e.error_message().unwrap_or_default().to_string(),
            ));
        }
        Ok(outcome)
    }
}

#[async_trait::async_trait]
impl CloudProvider for AwsProvider {
    fn name(&self) -> &str {
        "aws"
    }

    async fn catalog(&self) -> Result<Catalog, ProviderError> {
        // What the group pools' groups offer.
        let group_offers = if self.config.group_pools.is_empty() {
            Vec::new()
        } else {
            self.group_offerings().await?
        };
        // Types, and which zones each pool wants them in.
        let mut types: BTreeSet<&str> = BTreeSet::new();
        for (k, _, _) in &group_offers {
            types.insert(&k.instance_type);
        }
        let mut missing_prices: BTreeSet<&str> = BTreeSet::new();
        for p in &self.config.pools {
            for t in &p.instance_types {
                types.insert(t);
                if !p.on_demand_prices.contains_key(t) {
                    missing_prices.insert(t);
                }
            }
        }
        if !missing_prices.is_empty() {
            return Err(ProviderError::InvalidRequest {
                message: format!(
                    "no on-demand price for instance type(s) {} (the EC2 API has none: set \
                     prices.<type>.onDemand in the pool)",
                    missing_prices.into_iter().collect::<Vec<_>>().join(", ")
                ),
            });
        }
        if types.is_empty() {
            return Ok(Catalog::default());
        }
        let type_list: Vec<Ec2InstanceType> =
            types.iter().map(|t| Ec2InstanceType::from(*t)).collect();

        // Shapes.
        let mut shapes: BTreeMap<String, InstanceType> = BTreeMap::new();
        // At most 100 types per call.
        for chunk in type_list.chunks(100) {
            let mut token: Option<String> = None;
            loop {
                let resp = self
                    .call(
                        "DescribeInstanceTypes",
                        &self.limits.describe_instance_types,
                        || {
                            self.client
                                .describe_instance_types()
                                .set_instance_types(Some(chunk.to_vec()))
                                .set_next_token(token.clone())
                                .send()
                        },
                    )
                    .await
                    .map_err(ApiError::into_provider_error)?;
                for info in resp.instance_types() {
                    let Some(name) = info.instance_type().map(|t| t.as_str().to_string()) else {
                        continue;
                    };
                    let gpu = info.gpu_info().and_then(|g| {
                        let d = g.gpus().first()?;
                        Some(GpuInfo {
                            model: d.name()?.to_string(),
                            vendor: gpu_vendor(d.manufacturer().unwrap_or_default())?,
                            count: g
                                .gpus()
                                .iter()
                                .filter_map(|d| d.count())
                                .sum::<i32>()
                                .max(0) as u32,
                            memory_mib: d
                                .memory_info()
                                .and_then(|m| m.size_in_mib())
                                .unwrap_or(0)
                                .max(0) as u64,
                        })
                    });
                    shapes.insert(
                        name.clone(),
                        InstanceType {
                            vcpu: info
                                .v_cpu_info()
                                .and_then(|v| v.default_v_cpus())
                                .unwrap_or(0)
                                .max(0) as u32,
                            memory_mib: info
                                .memory_info()
                                .and_then(|m| m.size_in_mib())
                                .unwrap_or(0)
                                .max(0) as u64,
                            gpu,
                            on_demand_price: None,
                            name,
                        },
                    );
                }
                token = resp
                    .next_token()
                    .filter(|t| !t.is_empty())
                    .map(str::to_string);
                if token.is_none() {
                    break;
                }
            }
        }
        let unknown: Vec<&str> = types
            .iter()
            .copied()
            .filter(|t| !shapes.contains_key(*t))
            .collect();
        if !unknown.is_empty() {
            return Err(ProviderError::InvalidRequest {
                message: format!(
                    "instance type(s) unknown to EC2 in {}: {}",
                    self.config.region,
                    unknown.join(", ")
                ),
            });
        }

        // Zones offering each type.
        let type_names: Vec<String> = types.iter().map(|t| t.to_string()).collect();
        let offered = self.offered_zones(&type_names).await?;

        // Latest spot price per type × zone.
        let mut spot: BTreeMap<(String, String), (i64, f64)> = BTreeMap::new();
        let mut token: Option<String> = None;
        let now = aws_sdk_ec2::primitives::DateTime::from(SystemTime::now());
        loop {
            let resp = self
                .call(
                    "DescribeSpotPriceHistory",
                    &self.limits.describe_spot_prices,
                    || {
                        self.client
                            .describe_spot_price_history()
                            .set_instance_types(Some(type_list.clone()))
                            .product_descriptions("Linux/UNIX")
                            .start_time(now)
                            .set_next_token(token.clone())
                            .send()
                    },
                )
                .await
                .map_err(ApiError::into_provider_error)?;
            for p in resp.spot_price_history() {
                let (Some(t), Some(z), Some(price)) = (
                    p.instance_type(),
                    p.availability_zone(),
                    p.spot_price().and_then(|s| s.parse::<f64>().ok()),
                ) else {
                    continue;
                };
                let at = p.timestamp().and_then(|t| t.to_millis().ok()).unwrap_or(0);
                let k = (t.as_str().to_string(), z.to_string());
                if spot.get(&k).is_none_or(|(seen, _)| at >= *seen) {
                    spot.insert(k, (at, price));
                }
            }
            token = resp
                .next_token()
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            if token.is_none() {
                break;
            }
        }

        let mut offerings: BTreeMap<OfferingKey, Offering> = BTreeMap::new();
        let mut od_price: BTreeMap<&str, f64> = BTreeMap::new();
        for p in &self.config.pools {
            for t in &p.instance_types {
                let price = p.on_demand_prices[t];
                od_price.entry(t).or_insert(price);
                for zone in p.subnets.keys() {
                    let is_offered = offered.contains(&(t.clone(), zone.clone()));
                    let od = OfferingKey {
                        instance_type: t.clone(),
                        zone: zone.clone(),
                        capacity_type: CapacityType::OnDemand,
                    };
                    offerings.entry(od.clone()).or_insert(Offering {
                        key: od,
                        price_per_hour: price,
                        available: is_offered,
                    });
                    let sp = OfferingKey {
                        instance_type: t.clone(),
                        zone: zone.clone(),
                        capacity_type: CapacityType::Spot,
                    };
                    let spot_price = spot.get(&(t.clone(), zone.clone())).map(|(_, p)| *p);
                    offerings.entry(sp.clone()).or_insert(Offering {
                        key: sp,
                        price_per_hour: spot_price.unwrap_or(price),
                        available: is_offered && spot_price.is_some(),
                    });
                }
            }
        }
        for (key, price, available) in &group_offers {
            od_price.entry(&key.instance_type).or_insert(*price);
            let is_offered = offered.contains(&(key.instance_type.clone(), key.zone.clone()));
            let price = match key.capacity_type {
                CapacityType::Spot => spot
                    .get(&(key.instance_type.clone(), key.zone.clone()))
                    .map_or(*price, |(_, p)| *p),
                _ => *price,
            };
            let o = offerings.entry(key.clone()).or_insert(Offering {
                key: key.clone(),
                price_per_hour: price,
                available: false,
            });
            o.available |= *available && is_offered;
        }
        let instance_types = shapes
            .into_values()
            .map(|mut t| {
                t.on_demand_price = od_price.get(t.name.as_str()).copied();
                t
            })
            .collect();
        Ok(Catalog {
            instance_types,
            offerings: offerings.into_values().collect(),
        })
    }

    async fn launch(&self, request: &LaunchRequest) -> Result<LaunchResult, ProviderError> {
        if let Some(pool) = self.group_pool(&request.pool) {
            if request.count == 0 || request.launch_id.is_empty() || request.offerings.is_empty() {
                return Err(ProviderError::InvalidRequest {
                    message: "a launch needs a count, a launch id and offerings".into(),
                });
            }
            return self.launch_in_groups(pool, request).await;
        }
        let pool = self.pool(&request.pool)?;
        if request.count == 0 {
            return Err(ProviderError::InvalidRequest {
                message: "count must be at least 1".into(),
            });
        }
        if request.launch_id.is_empty() {
            return Err(ProviderError::InvalidRequest {
                message: "empty launch id".into(),
            });
        }
        if request.offerings.is_empty() {
            return Err(ProviderError::InvalidRequest {
                message: "no offerings to launch".into(),
            });
        }
        let mut result = LaunchResult::default();
        // Offerings in zones without a subnet cannot be launched.
        let usable: Vec<OfferingKey> = request
            .offerings
            .iter()
            .filter(|o| {
                let ok = pool.subnets.contains_key(&o.zone);
                if !ok {
                    result.failures.push((
                        (*o).clone(),
                        ProviderError::InvalidRequest {
                            message: format!(
                                "pool {}: zone {} has no subnet in aws.subnets",
                                pool.name, o.zone
                            ),
                        },
                    ));
                }
                ok
            })
            .cloned()
            .collect();

        // What this launch id already has (a retry, or a repeat after a restart).
        let existing = self
            .describe_tagged(
                &[
                    (TAG_CLUSTER, &self.config.cluster),
                    (TAG_LAUNCH_ID, &request.launch_id),
                ],
                &["pending", "running", "stopping", "stopped"],
            )
            .await?;
        if let Some(other) = existing.iter().find_map(|i| {
            let p = i
                .tags()
                .iter()
                .find(|t| t.key() == Some(TAG_POOL))
                .and_then(|t| t.value())?;
            (p != pool.name).then(|| p.to_string())
        }) {
            return Err(ProviderError::InvalidRequest {
                message: format!(
                    "launch id {} already used for pool {other}",
                    request.launch_id
                ),
            });
        }
        let mut remaining = request.count.saturating_sub(existing.len() as u32);

        for (capacity_type, group) in crate::plan::group_by_capacity_type(&usable) {
            if remaining == 0 {
                break;
            }
            if capacity_type == CapacityType::Reserved {
                remaining = self
                    .launch_reserved(pool, request, &group, remaining, &mut result)
                    .await?;
                continue;
            }
            let outcome = match self
                .create_fleet(pool, request, capacity_type, &group, remaining)
                .await
            {
                Ok(o) => o,
                Err(e) => {
                    let e = e.into_provider_error();
                    let whole_call = matches!(
                        e,
                        ProviderError::Throttled { .. } | ProviderError::QuotaExceeded { .. }
                    );
                    if whole_call && result.launched.is_empty() {
                        return Err(e);
                    }
                    for o in &group {
                        result.failures.push((o.clone(), e.clone()));
                    }
                    continue;
                }
            };
            let launched_now = outcome.instances.len() as u32;
            for (id, key) in outcome.instances {
                result.launched.push(Instance {
                    provider_id: crate::plan::provider_id(&key.zone, &id),
                    id,
                    pool: pool.name.clone(),
                    launch_id: request.launch_id.clone(),
                    offering: key,
                    state: InstanceState::Pending,
                    launched_at_ms: now_ms(),
                    reservation_id: None,
                    launch_fingerprint: request.tags.get(LAUNCH_FINGERPRINT_TAG).cloned(),
                    unclaimed: false,
                });
            }
            remaining = remaining.saturating_sub(launched_now);
            for (key, code, message) in outcome.errors {
                let key = key.unwrap_or_else(|| group[0].clone());
                let e = crate::errors::fleet_error(&key, &code, &message);
                if !result
                    .failures
                    .iter()
                    .any(|(k, old)| *k == key && *old == e)
                {
                    result.failures.push((key, e));
                }
            }
            if remaining > 0 && launched_now == 0 && outcome_had_no_error(&result, &group) {
                // EC2 fulfilled nothing and said nothing: count it against the group.
                for o in &group {
                    result.failures.push((
                        o.clone(),
                        ProviderError::InsufficientCapacity {
                            offering: o.clone(),
                        },
                    ));
                }
            }
        }
        Ok(result)
    }

    async fn terminate(&self, instance_id: &str) -> Result<(), ProviderError> {
        let id = crate::plan::instance_id_of(instance_id);
        if !crate::plan::is_instance_id(id) {
            return Err(ProviderError::InvalidRequest {
                message: format!("{instance_id:?} is not an EC2 instance id"),
            });
        }
        if self.terminate_in_group(id).await? {
            return Ok(());
        }
        self.check_owned(id).await?;
        let r = self
            .call("TerminateInstances", &self.limits.terminate, || {
                self.client.terminate_instances().instance_ids(id).send()
            })
            .await;
        match r {
            Ok(_) => Ok(()),
            Err(e)
                if e.code
                    .as_deref()
                    .is_some_and(|c| crate::errors::GONE_CODES.contains(&c)) =>
            {
                Ok(())
            }
            Err(e) => Err(e.into_provider_error()),
        }
    }

    async fn list(&self, pool: &str) -> Result<Vec<Instance>, ProviderError> {
        if let Some(p) = self.group_pool(pool) {
            return self.list_groups(p).await;
        }
        let found = self
            .describe_tagged(
                &[(TAG_CLUSTER, &self.config.cluster), (TAG_POOL, pool)],
                &["pending", "running", "stopping", "shutting-down"],
            )
            .await?;
        let mut out: Vec<Instance> = found
            .iter()
            .filter(|i| self.may_be_ours(i))
            .filter_map(|i| self.to_instance(i))
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// `DescribeCapacityReservations` of the account, states `active` and `scheduled` (a
    /// Capacity Block bought for later), all pages.
    async fn reservations(&self) -> Result<Vec<Reservation>, ProviderError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let resp = self
                .call(
                    "DescribeCapacityReservations",
                    &self.limits.describe_instances,
                    || {
                        self.client
                            .describe_capacity_reservations()
                            .filters(
                                Filter::builder()
                                    .name("state")
                                    .values("active")
                                    .values("scheduled")
                                    .build(),
                            )
                            .set_next_token(token.clone())
                            .send()
                    },
                )
                .await
                .map_err(ApiError::into_provider_error)?;
            out.extend(
                resp.capacity_reservations()
                    .iter()
                    .filter_map(reservation_of),
            );
            token = resp
                .next_token()
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            if token.is_none() {
                break;
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// Each group pool's groups as templates: their instance types (those of the pool's when it
    /// lists some), zones, capacity type and `node-template` tags, in the pool's order.
    async fn templates(
        &self,
    ) -> Result<BTreeMap<String, Vec<gpu_node_autoscaler_provider::GroupTemplate>>, ProviderError>
    {
        let mut out = BTreeMap::new();
        for p in &self.config.group_pools {
            let mut templates = Vec::new();
            for g in self.pool_groups(p).await? {
                let managed = match crate::groups::managed_node_group(&g.tags) {
                    Some((cluster, group)) => self.describe_node_group(cluster, group).await?,
                    None => None,
                };
                templates.push(crate::groups::group_template(
                    &g,
                    &p.instance_types,
                    managed.as_ref(),
                ));
            }
            out.insert(p.name.clone(), templates);
        }
        Ok(out)
    }

    /// `DescribeLaunchTemplateVersions` of each pool whose launch template version is
    /// `$Latest` or `$Default`: the version number it resolves to now, with the template's id
    /// and its image (`lt-0abc version 7 (ami-0def)`). A new default or latest version is what
    /// drifts the pool's nodes.
    async fn launch_versions(&self) -> Result<BTreeMap<String, String>, ProviderError> {
        let mut out = BTreeMap::new();
        for p in &self.config.pools {
            let lt = &p.launch_template;
            if !matches!(lt.version.as_str(), "$Latest" | "$Default") {
                continue;
            }
            let resp = self
                .call(
                    "DescribeLaunchTemplateVersions",
                    &self.limits.describe_instances,
                    || {
                        let req = self
                            .client
                            .describe_launch_template_versions()
                            .versions(lt.version.clone());
                        if lt.is_id() {
                            req.launch_template_id(lt.id_or_name.clone()).send()
                        } else {
                            req.launch_template_name(lt.id_or_name.clone()).send()
                        }
                    },
                )
                .await
                .map_err(ApiError::into_provider_error)?;
            let v =
                resp.launch_template_versions()
                    .first()
                    .ok_or_else(|| ProviderError::NotFound {
                        id: format!("{} version {}", lt.id_or_name, lt.version),
                    })?;
            out.insert(p.name.clone(), launch_version_of(v));
        }
        Ok(out)
    }
}

/// A launch template version as the fingerprint records it: the template's id, the version's
/// number, and the image it launches where it names one.
pub fn launch_version_of(v: &aws_sdk_ec2::types::LaunchTemplateVersion) -> String {
    let mut s = format!(
        "{} version {}",
        v.launch_template_id().unwrap_or_default(),
        v.version_number().unwrap_or_default()
    );
    if let Some(image) = v.launch_template_data().and_then(|d| d.image_id()) {
        s.push_str(&format!(" ({image})"));
    }
    s
}

/// A reservation as EC2 describes it; `None` without its id, type or zone.
pub fn reservation_of(r: &aws_sdk_ec2::types::CapacityReservation) -> Option<Reservation> {
    let ms = |d: Option<&aws_sdk_ec2::primitives::DateTime>| d.and_then(|d| d.to_millis().ok());
    Some(Reservation {
        id: r.capacity_reservation_id()?.to_string(),
        kind: match r.reservation_type() {
            Some(aws_sdk_ec2::types::CapacityReservationType::CapacityBlock) => {
                ReservationKind::CapacityBlock
            }
            _ => ReservationKind::Default,
        },
        instance_type: r.instance_type()?.to_string(),
        zone: r.availability_zone()?.to_string(),
        total: r.total_instance_count().unwrap_or(0).max(0) as u32,
        available: r.available_instance_count().unwrap_or(0).max(0) as u32,
        start_ms: ms(r.start_date()),
        end_ms: ms(r.end_date()),
        tags: r
            .tags()
            .iter()
            .filter_map(|t| Some((t.key()?.to_string(), t.value()?.to_string())))
            .collect(),
        price_per_hour: None,
    })
}

fn tag_of<'a>(i: &'a aws_sdk_ec2::types::Instance, key: &str) -> Option<&'a str> {
    i.tags()
        .iter()
        .find(|t| t.key() == Some(key))
        .and_then(|t| t.value())
}

impl AwsProvider {
    /// Not another cluster's: our cluster name, and no cluster identity but ours.
    fn may_be_ours(&self, i: &aws_sdk_ec2::types::Instance) -> bool {
        tag_of(i, TAG_CLUSTER) == Some(self.config.cluster.as_str())
            && match (&self.config.cluster_id, tag_of(i, TAG_CLUSTER_ID)) {
                (Some(ours), Some(theirs)) => ours == theirs,
                _ => true,
            }
    }

    /// Refuses to terminate an instance EC2 shows without our cluster's tags (name and, when
    /// known, identity). One not visible yet (just launched, EC2 is eventually consistent) is
    /// one of ours: instance ids come from our own launches and listings.
    async fn check_owned(&self, id: &str) -> Result<(), ProviderError> {
        let resp = self
            .call("DescribeInstances", &self.limits.describe_instances, || {
                self.client.describe_instances().instance_ids(id).send()
            })
            .await;
        let resp = match resp {
            Ok(r) => r,
            Err(e)
                if e.code
                    .as_deref()
                    .is_some_and(|c| crate::errors::GONE_CODES.contains(&c)) =>
            {
                return Ok(());
            }
            Err(e) => return Err(e.into_provider_error()),
        };
        for i in resp.reservations().iter().flat_map(|r| r.instances()) {
            // Already on its way out (one of a group's, taken out before): nothing to refuse.
            if matches!(
                i.state().and_then(|s| s.name()),
                Some(InstanceStateName::Terminated | InstanceStateName::ShuttingDown)
            ) {
                continue;
            }
            let owned = tag_of(i, TAG_CLUSTER) == Some(self.config.cluster.as_str())
                && self
                    .config
                    .cluster_id
                    .as_deref()
                    .is_none_or(|ours| tag_of(i, TAG_CLUSTER_ID) == Some(ours));
            if !owned {
                return Err(ProviderError::InvalidRequest {
                    message: format!(
                        "instance {id} is not this cluster's (tags {TAG_CLUSTER}={:?}, \
                         {TAG_CLUSTER_ID}={:?}; this cluster: {:?}, {:?}): not terminated",
                        tag_of(i, TAG_CLUSTER),
                        tag_of(i, TAG_CLUSTER_ID),
                        self.config.cluster,
                        self.config.cluster_id
                    ),
                });
            }
        }
        Ok(())
    }
}

/// Whether no failure was recorded for any offering of `group`.
fn outcome_had_no_error(result: &LaunchResult, group: &[OfferingKey]) -> bool {
    !result.failures.iter().any(|(k, _)| group.contains(k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::primitives::DateTime;
    use aws_sdk_ec2::types::{CapacityReservation, CapacityReservationType};

    #[test]
    fn a_capacity_reservation_is_read_with_its_type_counts_window_and_tags() {
        let block = CapacityReservation::builder()
            .capacity_reservation_id("cr-0block")
            .reservation_type(CapacityReservationType::CapacityBlock)
            .instance_type("p5.48xlarge")
            .availability_zone("us-east-1b")
            .total_instance_count(4)
            .available_instance_count(1)
            .start_date(DateTime::from_millis(1_000_000))
            .end_date(DateTime::from_millis(9_000_000))
            .tags(Tag::builder().key("team").value("ml").build())
            .build();
        let r = reservation_of(&block).unwrap();
        assert_eq!(r.kind, ReservationKind::CapacityBlock);
        assert_eq!(
            (r.id.as_str(), r.instance_type.as_str(), r.zone.as_str()),
            ("cr-0block", "p5.48xlarge", "us-east-1b")
        );
        assert_eq!((r.total, r.available), (4, 1));
        assert_eq!((r.start_ms, r.end_ms), (Some(1_000_000), Some(9_000_000)));
        assert_eq!(r.tags.get("team").map(String::as_str), Some("ml"));
        // An ODCR without an end date; one without a zone is left out.
        let odcr = CapacityReservation::builder()
            .capacity_reservation_id("cr-0odcr")
            .instance_type("p5.48xlarge")
            .availability_zone("us-east-1a")
            .total_instance_count(2)
            .available_instance_count(2)
            .build();
        let r = reservation_of(&odcr).unwrap();
        assert_eq!(r.kind, ReservationKind::Default);
        assert_eq!(r.end_ms, None);
        let no_zone = CapacityReservation::builder()
            .capacity_reservation_id("cr-x")
            .instance_type("p5.48xlarge")
            .build();
        assert_eq!(reservation_of(&no_zone), None);
    }
}
