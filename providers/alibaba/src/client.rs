//! The provider itself (behind the `client` feature, on by default): the cloud SDK or HTTP
//! client, the `CloudProvider` implementation and what it needs.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use serde_json::Value;

use gpu_node_autoscaler_provider::{
    CapacityType, Catalog, CloudProvider, GpuInfo, GpuVendor, Instance, InstanceState,
    InstanceType, LaunchRequest, LaunchResult, Offering, OfferingKey, ProviderError,
};

pub use crate::credentials::{ChainOverrides, CredentialProvider, CredentialSource};
pub use crate::errors::ApiError;
pub use crate::sign::Credentials;

/// ESS API version.
pub const ESS_VERSION: &str = "2014-08-28";
/// ECS API version.
pub const ECS_VERSION: &str = "2014-05-26";
/// VPC API version.
pub const VPC_VERSION: &str = "2016-04-28";
/// Key of the launch id in a scaling activity's `ActivityMetadata`.
pub const METADATA_LAUNCH_ID: &str = "gpu-node-autoscaler.io/launch-id";
/// Key of the cluster's identity (the `kube-system` Namespace UID) in a scaling activity's
/// `ActivityMetadata` and in the ECS tags of the instances launched: an instance another cluster
/// launched (into a scaling group both were pointed at) is never listed or removed, and one
/// without this cluster's identity is never removed.
pub const TAG_CLUSTER_ID: &str = "gpu-node-autoscaler.io/cluster-id";

/// One node pool as ESS sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct AlibabaPool {
    pub name: String,
    /// The scaling group launches go to first (`asg-...`).
    pub scaling_group: String,
    /// What that group buys: spot (its scaling configuration or launch template has a
    /// `SpotStrategy`) or on-demand.
    pub capacity_type: CapacityType,
    /// Set when that spot group has `CompensateWithOnDemand`: its instances may be on-demand.
    pub compensate_with_on_demand: bool,
    /// A second, on-demand scaling group used when the spot group has no stock.
    pub on_demand_group: Option<String>,
    pub instance_types: Vec<String>,
    /// Zone → vSwitch id (`vsw-...`); the pool's zones are this map's keys.
    pub vswitches: BTreeMap<String, String>,
    /// Instance type → on-demand price per hour (the ECS API has no list prices).
    pub on_demand_prices: BTreeMap<String, f64>,
}

impl AlibabaPool {
    /// Whether the pool can get spot instances.
    pub fn buys_spot(&self) -> bool {
        self.capacity_type == CapacityType::Spot
    }

    /// Whether the pool can get on-demand instances (its group, a second group, or
    /// compensation).
    pub fn buys_on_demand(&self) -> bool {
        self.capacity_type == CapacityType::OnDemand
            || self.on_demand_group.is_some()
            || self.compensate_with_on_demand
    }

    /// Whether the pool can get instances of this capacity type.
    pub fn buys(&self, ct: CapacityType) -> bool {
        match ct {
            CapacityType::Spot => self.buys_spot(),
            CapacityType::OnDemand => self.buys_on_demand(),
            // Its policy check refuses `reserved`: scaling groups buy spot and on-demand.
            CapacityType::Reserved => false,
        }
    }

    /// The pool's groups with what they buy and the policy field naming them.
    pub fn groups(&self) -> Vec<(&str, CapacityType, &'static str)> {
        let mut g = vec![(
            self.scaling_group.as_str(),
            self.capacity_type,
            "alibaba.scalingGroupId",
        )];
        if let Some(od) = &self.on_demand_group {
            g.push((
                od.as_str(),
                CapacityType::OnDemand,
                "alibaba.onDemandScalingGroupId",
            ));
        }
        g
    }
}

/// Client-side rate limits, calls per second.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimits {
    pub describe_per_second: u32,
    pub scale_per_second: u32,
    pub remove_per_second: u32,
}

impl Default for RateLimits {
    fn default() -> RateLimits {
        RateLimits {
            describe_per_second: 20,
            scale_per_second: 5,
            remove_per_second: 5,
        }
    }
}

pub use gpu_node_autoscaler_provider::retry::RetryPolicy;
use gpu_node_autoscaler_provider::retry::{backoff, jitter_unit};
use gpu_node_autoscaler_provider::rng::splitmix64;

#[derive(Clone, Debug, PartialEq)]
pub struct AlibabaConfig {
    pub region: String,
    /// ESS endpoint; default `https://ess.aliyuncs.com`.
    pub ess_endpoint: Option<String>,
    /// ECS endpoint; default `https://ecs.<region>.aliyuncs.com`.
    pub ecs_endpoint: Option<String>,
    /// VPC endpoint (vSwitch checks); default `https://vpc.aliyuncs.com`.
    pub vpc_endpoint: Option<String>,
    pub pools: Vec<AlibabaPool>,
    /// The cluster's identity ([`TAG_CLUSTER_ID`]), when known: written into every launch's
    /// activity metadata and tagged on its instances; `list` leaves out instances that carry
    /// another, and `terminate` refuses any instance that does not carry it.
    pub cluster_id: Option<String>,
    pub rate_limits: RateLimits,
    /// Retries of throttled calls.
    pub retry: RetryPolicy,
    /// Retries of a scale-out or removal refused because the group is busy
    /// (`ScalingActivityInProgress`, `IncorrectScalingGroupStatus`).
    pub busy_retry: RetryPolicy,
    /// How often a scaling activity is polled while `InProgress`.
    pub activity_poll_interval: Duration,
    /// How long a launch follows its activity before returning what exists so far.
    pub activity_timeout: Duration,
    /// `PageSize` of `DescribeScalingInstances` (1..=50).
    pub page_size: u32,
    /// How far back a launch looks for the scaling activities of its launch id.
    pub launch_lookback: Duration,
    /// At most this many pages of `DescribeScalingActivities` are read looking for them.
    pub max_activity_pages: u32,
}

impl AlibabaConfig {
    pub fn new(region: impl Into<String>) -> AlibabaConfig {
        AlibabaConfig {
            region: region.into(),
            ess_endpoint: None,
            ecs_endpoint: None,
            vpc_endpoint: None,
            pools: Vec::new(),
            cluster_id: None,
            rate_limits: RateLimits::default(),
            retry: RetryPolicy::default(),
            busy_retry: RetryPolicy {
                max_attempts: 10,
                base_delay: Duration::from_secs(2),
                max_delay: Duration::from_secs(30),
            },
            activity_poll_interval: Duration::from_secs(5),
            activity_timeout: Duration::from_secs(300),
            page_size: 50,
            launch_lookback: Duration::from_secs(24 * 3600),
            max_activity_pages: 10,
        }
    }

    fn ess_endpoint(&self) -> String {
        self.ess_endpoint
            .clone()
            .unwrap_or_else(|| "https://ess.aliyuncs.com".to_string())
    }

    fn ecs_endpoint(&self) -> String {
        self.ecs_endpoint
            .clone()
            .unwrap_or_else(|| format!("https://ecs.{}.aliyuncs.com", self.region))
    }

    fn vpc_endpoint(&self) -> String {
        self.vpc_endpoint
            .clone()
            .unwrap_or_else(|| "https://vpc.aliyuncs.com".to_string())
    }

    /// Every problem of the configuration, one message each, naming the pool and field.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.region.trim().is_empty() {
            out.push("region must not be empty".to_string());
        }
        let mut names = BTreeSet::new();
        let mut groups = BTreeSet::new();
        for p in &self.pools {
            if !names.insert(&p.name) {
                out.push(format!("duplicate pool {:?}", p.name));
            }
            let mut check_group = |field: &str, g: &String| {
                if !g.starts_with("asg-") {
                    out.push(format!(
                        "pool {}: {field} {g:?} is not a scaling group id (asg-...)",
                        p.name
                    ));
                } else if !groups.insert(g.clone()) {
                    out.push(format!(
                        "pool {}: {field} {g} is used by another pool",
                        p.name
                    ));
                }
            };
            for (g, _, field) in p.groups() {
                check_group(field, &g.to_string());
            }
            if !p.buys_spot() && p.on_demand_group.is_some() {
                out.push(format!(
                    "pool {}: alibaba.onDemandScalingGroupId needs a spot alibaba.scalingGroupId",
                    p.name
                ));
            }
            if !p.buys_spot() && p.compensate_with_on_demand {
                out.push(format!(
                    "pool {}: alibaba.compensateWithOnDemand needs a spot alibaba.scalingGroupId",
                    p.name
                ));
            }
            if p.instance_types.is_empty() {
                out.push(format!("pool {}: no instance types", p.name));
            }
            if p.vswitches.is_empty() {
                out.push(format!("pool {}: no vSwitches", p.name));
            }
            for (zone, v) in &p.vswitches {
                if !v.starts_with("vsw-") {
                    out.push(format!(
                        "pool {}: vSwitch {v:?} of zone {zone} is not a vSwitch id (vsw-...)",
                        p.name
                    ));
                }
            }
        }
        if self.retry.max_attempts == 0 {
            out.push("retry.max_attempts must be at least 1".to_string());
        }
        if self.busy_retry.max_attempts == 0 {
            out.push("busy_retry.max_attempts must be at least 1".to_string());
        }
        if self.max_activity_pages == 0 {
            out.push("max_activity_pages must be at least 1".to_string());
        }
        if self.page_size == 0 || self.page_size > 50 {
            out.push(format!("page_size {} must be 1..=50", self.page_size));
        }
        if self.activity_poll_interval.is_zero() {
            out.push("activity_poll_interval must be positive".to_string());
        }
        out
    }
}

/// Why [`AlibabaProvider::new`] refused to start.
#[derive(Debug, thiserror::Error)]
pub enum AlibabaError {
    #[error("invalid Alibaba Cloud provider configuration: {}", .0.join("; "))]
    InvalidConfig(Vec<String>),
    #[error("cannot build the HTTP client: {0}")]
    Http(String),
}

/// ACK's node `spec.providerID`: `<region>.<instance-id>`.
pub fn provider_id(region: &str, instance_id: &str) -> String {
    format!("{region}.{instance_id}")
}

/// The instance id in an instance id or an ACK provider id.
pub fn instance_id_of<'a>(region: &str, id: &'a str) -> &'a str {
    id.strip_prefix(region)
        .and_then(|rest| rest.strip_prefix('.'))
        .unwrap_or(id)
}

/// A `ClientToken` (≤ 64 ASCII characters) derived from the launch id, the group's role and the
/// count asked. ESS answers a repeated token with the first call's activity, and a token reused
/// with other parameters with `IdempotentParameterMismatch`: so a retry asking for fewer
/// instances (some exist already) is another token.
pub fn client_token(launch_id: &str, role: CapacityType, count: u32) -> String {
    let role_char = match role {
        CapacityType::Spot => 's',
        CapacityType::OnDemand => 'o',
        CapacityType::Reserved => 'r',
    };
    use std::hash::Hasher;
    // FNV-1a: stable across releases and platforms, unlike std's hasher.
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(format!("{launch_id}\n{role_char}\n{count}").as_bytes());
    let h = hasher.finish();
    let readable: String = launch_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(30)
        .collect();
    format!("gna-{role_char}{count}-{readable}-{h:016x}")
}

/// `LifecycleState` of a scaling instance → our state.
pub fn instance_state(lifecycle: &str) -> InstanceState {
    match lifecycle {
        "Pending" | "Pending:Wait" => InstanceState::Pending,
        "Removing" | "Removing:Wait" => InstanceState::ShuttingDown,
        _ => InstanceState::Running,
    }
}

/// ESS times: `2014-08-14T10:58Z` (`CreationTime`) or `2014-08-14T10:58:00Z` (`CreatedTime`).
pub fn parse_time_ms(s: &str) -> Option<i64> {
    for fmt in ["%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%MZ"] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(s, fmt) {
            return Some(t.and_utc().timestamp_millis());
        }
    }
    None
}

/// `GPUSpec` such as `NVIDIA A10` → (vendor, model `A10`).
pub fn gpu_model(spec: &str) -> (GpuVendor, String) {
    GpuVendor::split_name(spec)
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `StatusCode` (or `Status`) of a scaling activity.
fn activity_status(a: &Value) -> &str {
    match str_of(a, "StatusCode") {
        "" => str_of(a, "Status"),
        s => s,
    }
}

/// A value of a scaling activity's `ActivityMetadata` (a JSON object in a string).
fn metadata_of(a: &Value, key: &str) -> Option<String> {
    let m: Value = serde_json::from_str(a.get("ActivityMetadata")?.as_str()?).ok()?;
    m.get(key).and_then(Value::as_str).map(str::to_string)
}

/// The launch id in a scaling activity's `ActivityMetadata`.
fn launch_id_of(a: &Value) -> Option<String> {
    metadata_of(a, METADATA_LAUNCH_ID)
}

/// Whether a `DescribeAvailableResource` zone or resource has stock: `StatusCategory`
/// `WithStock` or `ClosedWithStock` (low, still sold), else `Status` `Available`.
fn has_stock(v: &Value) -> bool {
    match str_of(v, "StatusCategory") {
        "WithStock" | "ClosedWithStock" => true,
        "" => matches!(str_of(v, "Status"), "Available" | ""),
        _ => false,
    }
}

/// `v[outer][inner]` as a list (ESS/ECS wrap every list so).
fn list_of<'a>(v: &'a Value, outer: &str, inner: &str) -> Vec<&'a Value> {
    match v.get(outer).and_then(|o| o.get(inner)) {
        Some(Value::Array(a)) => a.iter().collect(),
        Some(one @ Value::Object(_)) => vec![one],
        _ => Vec::new(),
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn num_of(v: &Value, key: &str) -> Option<f64> {
    match v.get(key)? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// The RPC API a call goes to (its endpoint and `Version`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Ess,
    Ecs,
    Vpc,
}

struct Limiters {
    describe: DefaultDirectRateLimiter,
    scale: DefaultDirectRateLimiter,
    remove: DefaultDirectRateLimiter,
}

fn limiter(per_second: u32) -> DefaultDirectRateLimiter {
    RateLimiter::direct(Quota::per_second(
        NonZeroU32::new(per_second).unwrap_or(NonZeroU32::MIN),
    ))
}

/// One scaling instance, as `DescribeScalingInstances` lists it.
#[derive(Clone, Debug, PartialEq)]
struct ScalingInstance {
    id: String,
    zone: String,
    instance_type: Option<String>,
    lifecycle: String,
    activity_id: String,
    spot_strategy: Option<String>,
    created_ms: Option<i64>,
}

/// What one scaling group did for a launch.
struct GroupOutcome {
    instances: Vec<ScalingInstance>,
    /// (code, message) of a failed or short activity or a refused call.
    failure: Option<(String, String)>,
}

/// The Alibaba Cloud provider. `Send + Sync`; every method takes `&self`.
pub struct AlibabaProvider {
    http: reqwest::Client,
    credentials: CredentialProvider,
    config: AlibabaConfig,
    limits: Limiters,
    /// One per scaling group: ESS runs one scaling activity per group at a time, so scale-outs
    /// and removals of a group are queued here rather than refused by ESS.
    group_locks: BTreeMap<String, tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for AlibabaProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlibabaProvider")
            .field("region", &self.config.region)
            .field("ess_endpoint", &self.config.ess_endpoint())
            .field("ecs_endpoint", &self.config.ecs_endpoint())
            .field("credentials", &self.credentials)
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

impl AlibabaProvider {
    /// Checks the configuration and builds the HTTP client. Makes no API call (credentials from
    /// OIDC or the instance role are fetched at the first call).
    pub fn new(
        config: AlibabaConfig,
        credentials: impl Into<CredentialProvider>,
    ) -> Result<AlibabaProvider, AlibabaError> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(AlibabaError::InvalidConfig(problems));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| AlibabaError::Http(e.to_string()))?;
        let r = &config.rate_limits;
        let limits = Limiters {
            describe: limiter(r.describe_per_second),
            scale: limiter(r.scale_per_second),
            remove: limiter(r.remove_per_second),
        };
        let group_locks = config
            .pools
            .iter()
            .flat_map(|p| p.groups())
            .map(|(g, _, _)| (g.to_string(), tokio::sync::Mutex::new(())))
            .collect();
        Ok(AlibabaProvider {
            http,
            credentials: credentials.into(),
            config,
            limits,
            group_locks,
        })
    }

    pub fn config(&self) -> &AlibabaConfig {
        &self.config
    }

    fn pool(&self, name: &str) -> Result<&AlibabaPool, ProviderError> {
        self.config
            .pools
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| ProviderError::InvalidRequest {
                message: format!(
                    "unknown pool {name:?} (not in the Alibaba Cloud provider's configuration)"
                ),
            })
    }

    fn next_seed(&self) -> u64 {
        // One sequence for the whole process: two providers (a policy reload builds a new one
        // while the old one still works) never draw the same nonce in the same millisecond.
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        splitmix64((now_ms() as u64) ^ n.rotate_left(32) ^ u64::from(std::process::id()))
    }

    /// A nonce no other call draws: this process's id and call number (distinct across
    /// processes and calls), the time (distinct across restarts that reuse the id) and a draw.
    fn next_nonce(&self) -> String {
        static CALLS: AtomicU64 = AtomicU64::new(0);
        let n = CALLS.fetch_add(1, Ordering::Relaxed);
        format!(
            "{:08x}{n:08x}{:012x}{:04x}",
            std::process::id(),
            now_ms() as u64 & 0xffff_ffff_ffff,
            self.next_seed() & 0xffff
        )
    }

    /// One signed call, no retry.
    async fn call_once(
        &self,
        api: Api,
        action: &'static str,
        params: &[(String, String)],
    ) -> Result<Value, ApiError> {
        let (endpoint, version) = match api {
            Api::Ess => (self.config.ess_endpoint(), ESS_VERSION),
            Api::Ecs => (self.config.ecs_endpoint(), ECS_VERSION),
            Api::Vpc => (self.config.vpc_endpoint(), VPC_VERSION),
        };
        let credentials = self.credentials.credentials().await.map_err(|e| ApiError {
            operation: action,
            code: e.code.clone(),
            message: e.to_string(),
            http_status: None,
            request_id: None,
            throttled_after: None,
        })?;
        let mut all: BTreeMap<String, String> = params.iter().cloned().collect();
        let nonce = self.next_nonce();
        let common = [
            ("Action", action.to_string()),
            ("Version", version.to_string()),
            ("Format", "JSON".to_string()),
            ("RegionId", self.config.region.clone()),
            ("AccessKeyId", credentials.access_key_id.clone()),
            ("SignatureMethod", "HMAC-SHA1".to_string()),
            ("SignatureVersion", "1.0".to_string()),
            ("SignatureNonce", nonce),
            (
                "Timestamp",
                chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            ),
        ];
        for (k, v) in common {
            all.insert(k.to_string(), v);
        }
        if let Some(t) = &credentials.security_token {
            all.insert("SecurityToken".to_string(), t.clone());
        }
        let query = crate::sign::signed_query("GET", &all, &credentials.access_key_secret);
        let url = format!("{}/?{query}", endpoint.trim_end_matches('/'));
        let transport = |e: reqwest::Error| ApiError {
            operation: action,
            code: None,
            // Without the URL: it carries the AccessKeyId and the STS token.
            message: e.without_url().to_string(),
            http_status: None,
            request_id: None,
            throttled_after: None,
        };
        let resp = self.http.get(url).send().await.map_err(transport)?;
        let status = resp.status();
        let body = resp.text().await.map_err(transport)?;
        let json: Option<Value> = serde_json::from_str(&body).ok();
        // Alibaba answers errors with a non-2xx status and `{"Code", "Message", "RequestId"}`.
        let json = match json {
            Some(v) if status.is_success() => return Ok(v),
            Some(v) => v,
            None => Value::Null,
        };
        let code = json.get("Code").and_then(Value::as_str).map(str::to_string);
        let message = match json.get("Message").and_then(Value::as_str) {
            Some(m) => m.to_string(),
            None => format!(
                "HTTP {status}: {}",
                body.chars().take(200).collect::<String>()
            ),
        };
        Err(ApiError {
            operation: action,
            code,
            message,
            http_status: Some(status.as_u16()),
            request_id: json
                .get("RequestId")
                .and_then(Value::as_str)
                .map(str::to_string),
            throttled_after: None,
        })
    }

    /// A call after waiting for `limiter`, throttled answers retried with jittered back-off.
    async fn call(
        &self,
        api: Api,
        action: &'static str,
        limiter: &DefaultDirectRateLimiter,
        params: &[(String, String)],
    ) -> Result<Value, ApiError> {
        let retry = &self.config.retry;
        let mut attempt = 0u32;
        loop {
            limiter.until_ready().await;
            let mut err = match self.call_once(api, action, params).await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if !err.is_throttle() {
                return Err(err);
            }
            let delay = backoff(
                retry.base_delay,
                retry.max_delay,
                attempt,
                jitter_unit(self.next_seed()),
            );
            attempt += 1;
            if attempt >= retry.max_attempts.max(1) {
                err.throttled_after = Some(delay);
                return Err(err);
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// A `Describe*` call at the describe rate, its error as a [`ProviderError`].
    async fn describe(
        &self,
        api: Api,
        action: &'static str,
        params: &[(String, String)],
    ) -> Result<Value, ProviderError> {
        self.call(api, action, &self.limits.describe, params)
            .await
            .map_err(ApiError::into_provider_error)
    }

    /// `DescribeScalingInstances` of a group, all pages, optionally of one activity / instance.
    async fn scaling_instances(
        &self,
        group: &str,
        activity: Option<&str>,
        instance: Option<&str>,
    ) -> Result<Vec<ScalingInstance>, ApiError> {
        let mut out = Vec::new();
        let size = self.config.page_size;
        let mut page = 1u32;
        loop {
            let mut p = vec![
                ("ScalingGroupId".to_string(), group.to_string()),
                ("PageNumber".to_string(), page.to_string()),
                ("PageSize".to_string(), size.to_string()),
            ];
            if let Some(a) = activity {
                p.push(("ScalingActivityId".to_string(), a.to_string()));
            }
            if let Some(i) = instance {
                p.push(("InstanceIds.1".to_string(), i.to_string()));
            }
            let v = self
                .call(
                    Api::Ess,
                    "DescribeScalingInstances",
                    &self.limits.describe,
                    &p,
                )
                .await?;
            let items = list_of(&v, "ScalingInstances", "ScalingInstance");
            let n = items.len();
            for i in items {
                let opt = |k: &str| Some(str_of(i, k).to_string()).filter(|s| !s.is_empty());
                out.push(ScalingInstance {
                    id: str_of(i, "InstanceId").to_string(),
                    zone: str_of(i, "ZoneId").to_string(),
                    instance_type: opt("InstanceType"),
                    lifecycle: str_of(i, "LifecycleState").to_string(),
                    activity_id: str_of(i, "ScalingActivityId").to_string(),
                    spot_strategy: opt("SpotStrategy"),
                    created_ms: parse_time_ms(str_of(i, "CreatedTime"))
                        .or_else(|| parse_time_ms(str_of(i, "CreationTime"))),
                });
            }
            let total = num_of(&v, "TotalCount").unwrap_or(0.0) as u64;
            if n == 0 || u64::from(page) * u64::from(size) >= total {
                return Ok(out);
            }
            page += 1;
        }
    }

    /// `DescribeScalingActivities` of the given ids: id → activity JSON.
    async fn activities(
        &self,
        group: &str,
        ids: &[String],
    ) -> Result<BTreeMap<String, Value>, ApiError> {
        let mut out = BTreeMap::new();
        for chunk in ids.chunks(20) {
            let mut p = vec![
                ("ScalingGroupId".to_string(), group.to_string()),
                ("PageSize".to_string(), "50".to_string()),
            ];
            for (i, id) in chunk.iter().enumerate() {
                p.push((format!("ScalingActivityId.{}", i + 1), id.clone()));
            }
            let v = self
                .call(
                    Api::Ess,
                    "DescribeScalingActivities",
                    &self.limits.describe,
                    &p,
                )
                .await?;
            for a in list_of(&v, "ScalingActivities", "ScalingActivity") {
                out.insert(str_of(a, "ScalingActivityId").to_string(), a.clone());
            }
        }
        Ok(out)
    }

    /// A call that ESS may refuse while the group is busy (an activity in progress, or a group
    /// not `Active` for a moment): retried with back-off up to `busy_retry.max_attempts` calls.
    async fn call_when_idle(
        &self,
        action: &'static str,
        limiter: &DefaultDirectRateLimiter,
        params: &[(String, String)],
    ) -> Result<Value, ApiError> {
        let retry = &self.config.busy_retry;
        let mut attempt = 0u32;
        loop {
            let mut err = match self.call(Api::Ess, action, limiter, params).await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if !err.code.as_deref().is_some_and(crate::errors::is_busy) {
                return Err(err);
            }
            attempt += 1;
            if attempt >= retry.max_attempts.max(1) {
                err.message = format!(
                    "{} (the scaling group stayed busy for {attempt} attempts)",
                    err.message
                );
                return Err(err);
            }
            let delay = backoff(
                retry.base_delay,
                retry.max_delay,
                attempt - 1,
                jitter_unit(self.next_seed()),
            );
            tokio::time::sleep(delay).await;
        }
    }

    /// The queue of a scaling group's scale-outs and removals.
    async fn lock_group(&self, group: &str) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match self.group_locks.get(group) {
            Some(m) => Some(m.lock().await),
            None => None,
        }
    }

    /// Polls an activity until it leaves `InProgress` or `activity_timeout` passes; returns its
    /// last description (`Null` when ESS does not know it).
    async fn follow_activity(
        &self,
        group: &str,
        activity_id: &str,
    ) -> Result<Value, ProviderError> {
        let deadline = tokio::time::Instant::now() + self.config.activity_timeout;
        loop {
            let acts = self
                .activities(group, &[activity_id.to_string()])
                .await
                .map_err(ApiError::into_provider_error)?;
            let a = acts.get(activity_id).cloned().unwrap_or(Value::Null);
            let status = activity_status(&a);
            if !(status.is_empty() || status == "InProgress")
                || tokio::time::Instant::now() >= deadline
            {
                return Ok(a);
            }
            tokio::time::sleep(self.config.activity_poll_interval).await;
        }
    }

    /// The scaling activities of `group` started for `launch_id` (by their `ActivityMetadata`),
    /// newest first, among those of the last `launch_lookback`.
    async fn launch_activities(
        &self,
        group: &str,
        launch_id: &str,
    ) -> Result<Vec<Value>, ProviderError> {
        let oldest = now_ms() - self.config.launch_lookback.as_millis() as i64;
        let mut out = Vec::new();
        for page in 1..=self.config.max_activity_pages {
            let p = vec![
                ("ScalingGroupId".to_string(), group.to_string()),
                ("PageNumber".to_string(), page.to_string()),
                ("PageSize".to_string(), "50".to_string()),
            ];
            let v = self
                .describe(Api::Ess, "DescribeScalingActivities", &p)
                .await?;
            let items = list_of(&v, "ScalingActivities", "ScalingActivity");
            let mut older = false;
            for a in &items {
                if parse_time_ms(str_of(a, "StartTime")).is_some_and(|t| t < oldest) {
                    older = true;
                    continue;
                }
                if launch_id_of(a).as_deref() == Some(launch_id) {
                    out.push((*a).clone());
                }
            }
            let total = num_of(&v, "TotalCount").unwrap_or(0.0) as u64;
            if items.is_empty() || older || u64::from(page) * 50 >= total {
                break;
            }
        }
        Ok(out)
    }

    /// Scales `group` out by `count` for a launch and follows the activity to its end. Queued
    /// behind the group's other scale-outs and removals of this process; retried while ESS says
    /// the group is busy.
    async fn scale_group(
        &self,
        group: &str,
        role: CapacityType,
        count: u32,
        launch_id: &str,
    ) -> Result<GroupOutcome, ProviderError> {
        let _queued = self.lock_group(group).await;
        let mut metadata = serde_json::json!({ METADATA_LAUNCH_ID: launch_id });
        if let Some(id) = &self.config.cluster_id {
            metadata[TAG_CLUSTER_ID] = Value::String(id.clone());
        }
        let metadata = metadata.to_string();
        let params = vec![
            ("ScalingGroupId".to_string(), group.to_string()),
            (
                "AdjustmentType".to_string(),
                "QuantityChangeInCapacity".to_string(),
            ),
            ("AdjustmentValue".to_string(), count.to_string()),
            (
                "ClientToken".to_string(),
                client_token(launch_id, role, count),
            ),
            ("ActivityMetadata".to_string(), metadata),
        ];
        let activity_id = match self
            .call_when_idle("ScaleWithAdjustment", &self.limits.scale, &params)
            .await
        {
            Ok(v) => str_of(&v, "ScalingActivityId").to_string(),
            Err(e) => {
                let code = e.code.clone().unwrap_or_default();
                if !e.is_throttle()
                    && (crate::errors::is_no_stock(&code, &e.message)
                        || crate::errors::is_quota(&code, ""))
                {
                    return Ok(GroupOutcome {
                        instances: Vec::new(),
                        failure: Some((code, e.message)),
                    });
                }
                return Err(e.into_provider_error());
            }
        };
        if activity_id.is_empty() {
            return Err(ProviderError::Other {
                message: "ScaleWithAdjustment returned no ScalingActivityId".to_string(),
            });
        }
        let activity = self.follow_activity(group, &activity_id).await?;
        self.activity_outcome(group, &activity_id, &activity, count)
            .await
    }

    /// ECS `DescribeInstances` (`InstanceIds` as a JSON array, ≤ 100 per call) for the scaling
    /// instances whose listing lacks the instance type or the `SpotStrategy`: which type ESS
    /// picked among the group's, and whether a compensating group's instance is spot.
    async fn complete_from_ecs(
        &self,
        instances: &mut [ScalingInstance],
    ) -> Result<(), ProviderError> {
        let ids: Vec<String> = instances
            .iter()
            .filter(|s| s.instance_type.is_none() || s.spot_strategy.is_none())
            .map(|s| s.id.clone())
            .collect();
        let mut details: BTreeMap<String, (String, String)> = BTreeMap::new();
        for v in self.ecs_instances(&ids).await? {
            for i in list_of(&v, "Instances", "Instance") {
                details.insert(
                    str_of(i, "InstanceId").to_string(),
                    (
                        str_of(i, "InstanceType").to_string(),
                        str_of(i, "SpotStrategy").to_string(),
                    ),
                );
            }
        }
        for s in instances.iter_mut() {
            if let Some((t, spot)) = details.get(&s.id) {
                if s.instance_type.is_none() && !t.is_empty() {
                    s.instance_type = Some(t.clone());
                }
                if s.spot_strategy.is_none() && !spot.is_empty() {
                    s.spot_strategy = Some(spot.clone());
                }
            }
        }
        Ok(())
    }

    /// ECS DescribeInstances of `ids`, 100 at a time: one answer per call.
    async fn ecs_instances(&self, ids: &[String]) -> Result<Vec<Value>, ProviderError> {
        let mut out = Vec::new();
        for chunk in ids.chunks(100) {
            let p = vec![
                (
                    "InstanceIds".to_string(),
                    serde_json::to_string(chunk).unwrap_or_default(),
                ),
                ("PageSize".to_string(), "100".to_string()),
            ];
            out.push(self.describe(Api::Ecs, "DescribeInstances", &p).await?);
        }
        Ok(out)
    }

    /// The cluster identity ([`TAG_CLUSTER_ID`]) ECS tags on `ids` carry, where they carry one.
    async fn ecs_identities(
        &self,
        ids: &[String],
    ) -> Result<BTreeMap<String, String>, ProviderError> {
        let mut out = BTreeMap::new();
        for v in self.ecs_instances(ids).await? {
            for i in list_of(&v, "Instances", "Instance") {
                if let Some(t) = list_of(i, "Tags", "Tag")
                    .into_iter()
                    .find(|t| str_of(t, "TagKey") == TAG_CLUSTER_ID)
                {
                    out.insert(
                        str_of(i, "InstanceId").to_string(),
                        str_of(t, "TagValue").to_string(),
                    );
                }
            }
        }
        Ok(out)
    }

    /// The instances an activity created, and its failure when it ended short of `count`.
    async fn activity_outcome(
        &self,
        group: &str,
        activity_id: &str,
        activity: &Value,
        count: u32,
    ) -> Result<GroupOutcome, ProviderError> {
        let mut instances = self
            .scaling_instances(group, Some(activity_id), None)
            .await
            .map_err(ApiError::into_provider_error)?;
        self.complete_from_ecs(&mut instances).await?;
        let status = activity_status(activity);
        let failure = if matches!(status, "Failed" | "Rejected" | "Warning")
            && (instances.len() as u32) < count
        {
            let code = match str_of(activity, "ErrorCode") {
                "" => status.to_string(),
                c => c.to_string(),
            };
            let message = [
                str_of(activity, "ErrorMessage"),
                str_of(activity, "StatusMessage"),
            ]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
            Some((code, message))
        } else {
            None
        };
        Ok(GroupOutcome { instances, failure })
    }

    /// Not another cluster's: no identity, or ours (instances of older versions, and of the
    /// group itself, carry none: listed and counted, but not removed, see `check_owned`).
    fn may_be_ours(&self, cluster_id: Option<&str>) -> bool {
        match (self.config.cluster_id.as_deref(), cluster_id) {
            (Some(ours), Some(theirs)) => ours == theirs,
            _ => true,
        }
    }

    /// ECS `TagResources`: the cluster's identity on instances just launched (≤ 50 per call).
    async fn tag_as_ours(&self, instances: &[Instance]) -> Result<(), ProviderError> {
        let Some(cluster_id) = &self.config.cluster_id else {
            return Ok(());
        };
        for chunk in instances.chunks(50) {
            let mut p = vec![
                ("ResourceType".to_string(), "instance".to_string()),
                ("Tag.1.Key".to_string(), TAG_CLUSTER_ID.to_string()),
                ("Tag.1.Value".to_string(), cluster_id.clone()),
            ];
            for (i, inst) in chunk.iter().enumerate() {
                p.push((format!("ResourceId.{}", i + 1), inst.id.clone()));
            }
            self.call(Api::Ecs, "TagResources", &self.limits.scale, &p)
                .await
                .map_err(ApiError::into_provider_error)?;
        }
        Ok(())
    }

    /// Refuses to remove an instance of `group` that does not carry this cluster's identity
    /// (when known): its ECS tag, or, when none (tagging after the launch is best effort), the
    /// metadata of the scaling activity that launched it. Instances without an identity
    /// (launched by the group itself, by ACK, or by a version before the identity) are listed
    /// but not removed until tagged.
    async fn check_owned(&self, group: &str, s: &ScalingInstance) -> Result<(), ProviderError> {
        let Some(ours) = self.config.cluster_id.as_deref() else {
            return Ok(());
        };
        let id = s.id.as_str();
        let p = vec![
            (
                "InstanceIds".to_string(),
                serde_json::to_string(&[id]).unwrap_or_default(),
            ),
            ("PageSize".to_string(), "100".to_string()),
        ];
        let v = self.describe(Api::Ecs, "DescribeInstances", &p).await?;
        let tagged = list_of(&v, "Instances", "Instance")
            .into_iter()
            .filter(|i| str_of(i, "InstanceId") == id)
            .flat_map(|i| list_of(i, "Tags", "Tag"))
            .find(|t| str_of(t, "TagKey") == TAG_CLUSTER_ID)
            .map(|t| str_of(t, "TagValue").to_string());
        let theirs = match tagged {
            Some(t) => Some(t),
            None if !s.activity_id.is_empty() => self
                .activities(group, std::slice::from_ref(&s.activity_id))
                .await
                .map_err(ApiError::into_provider_error)?
                .get(&s.activity_id)
                .and_then(|a| metadata_of(a, TAG_CLUSTER_ID)),
            None => None,
        };
        match theirs {
            Some(t) if t == ours => Ok(()),
            Some(t) => Err(ProviderError::InvalidRequest {
                message: format!(
                    "instance {id} has {TAG_CLUSTER_ID} {t:?}, not this cluster's {ours:?}: \
                     not removed"
                ),
            }),
            None => Err(ProviderError::InvalidRequest {
                message: format!(
                    "instance {id} carries no {TAG_CLUSTER_ID} (launched by its scaling group, \
                     by ACK or by a version before the identity): not removed; tag it \
                     {TAG_CLUSTER_ID}={ours} to hand it to this cluster"
                ),
            }),
        }
    }

    fn to_instance(
        &self,
        pool: &AlibabaPool,
        role: CapacityType,
        launch_id: &str,
        s: &ScalingInstance,
    ) -> Instance {
        let capacity_type = match s.spot_strategy.as_deref() {
            Some("NoSpot") => CapacityType::OnDemand,
            Some("SpotWithPriceLimit" | "SpotAsPriceGo") => CapacityType::Spot,
            _ => role,
        };
        Instance {
            id: s.id.clone(),
            provider_id: provider_id(&self.config.region, &s.id),
            pool: pool.name.clone(),
            launch_id: launch_id.to_string(),
            offering: OfferingKey {
                instance_type: s
                    .instance_type
                    .clone()
                    .or_else(|| pool.instance_types.first().cloned())
                    .unwrap_or_default(),
                zone: s.zone.clone(),
                capacity_type,
            },
            state: instance_state(&s.lifecycle),
            launched_at_ms: s.created_ms.unwrap_or_else(now_ms),
            reservation_id: None,
            launch_fingerprint: None,
            unclaimed: false,
        }
    }

    /// The group holding `instance_id` among every configured pool's groups, with the instance
    /// as that group lists it.
    async fn group_of(
        &self,
        instance_id: &str,
    ) -> Result<Option<(String, ScalingInstance)>, ProviderError> {
        for pool in &self.config.pools {
            for (group, _, _) in pool.groups() {
                match self.scaling_instances(group, None, Some(instance_id)).await {
                    Ok(found) => {
                        if let Some(s) = found.into_iter().find(|s| s.id == instance_id) {
                            return Ok(Some((group.to_string(), s)));
                        }
                    }
                    Err(e)
                        if e.code
                            .as_deref()
                            .is_some_and(|c| crate::errors::GONE_CODES.contains(&c)) => {}
                    Err(e) => return Err(e.into_provider_error()),
                }
            }
        }
        Ok(None)
    }

    /// ECS `DescribeAvailableResource` (`DestinationResource=InstanceType`) of one zone, for spot
    /// (`SpotAsPriceGo`) or on-demand (`NoSpot`) pay-as-you-go instances: the types offered there,
    /// each with whether it has stock (`WithStock` or `ClosedWithStock`, not `WithoutStock` /
    /// `SoldOut`).
    async fn zone_stock(
        &self,
        zone: &str,
        ct: CapacityType,
    ) -> Result<BTreeMap<String, bool>, ProviderError> {
        let spot_strategy = match ct {
            CapacityType::Spot => "SpotAsPriceGo",
            CapacityType::OnDemand | CapacityType::Reserved => "NoSpot",
        };
        let p = vec![
            (
                "DestinationResource".to_string(),
                "InstanceType".to_string(),
            ),
            ("ZoneId".to_string(), zone.to_string()),
            ("InstanceChargeType".to_string(), "PostPaid".to_string()),
            ("SpotStrategy".to_string(), spot_strategy.to_string()),
            ("IoOptimized".to_string(), "optimized".to_string()),
            ("ResourceType".to_string(), "instance".to_string()),
        ];
        let v = self
            .describe(Api::Ecs, "DescribeAvailableResource", &p)
            .await?;
        let mut out = BTreeMap::new();
        for z in list_of(&v, "AvailableZones", "AvailableZone") {
            if str_of(z, "ZoneId") != zone {
                continue;
            }
            let zone_ok = has_stock(z);
            for r in list_of(z, "AvailableResources", "AvailableResource") {
                if str_of(r, "Type") != "InstanceType" {
                    continue;
                }
                for t in list_of(r, "SupportedResources", "SupportedResource") {
                    let name = str_of(t, "Value");
                    if !name.is_empty() {
                        out.insert(name.to_string(), zone_ok && has_stock(t));
                    }
                }
            }
        }
        Ok(out)
    }

    /// [`Self::zone_stock`] of every (zone, capacity type) the pools buy in.
    async fn stock(
        &self,
    ) -> Result<BTreeMap<(String, CapacityType), BTreeMap<String, bool>>, ProviderError> {
        let mut wanted = BTreeSet::new();
        for p in &self.config.pools {
            for zone in p.vswitches.keys() {
                for ct in CapacityType::ALL.into_iter().filter(|ct| p.buys(*ct)) {
                    wanted.insert((zone.clone(), ct));
                }
            }
        }
        let mut out = BTreeMap::new();
        for (zone, ct) in wanted {
            let types = self.zone_stock(&zone, ct).await?;
            out.insert((zone, ct), types);
        }
        Ok(out)
    }

    /// Checks the configuration against the account before any launch: every scaling group
    /// exists in the region and is `Active`, has the pool's vSwitches (and
    /// `CompensateWithOnDemand` when the pool counts on it); every vSwitch exists in the zone it
    /// is listed for; every instance type is offered in each zone for what the pool buys. One
    /// message per problem, naming the pool and its policy field.
    pub async fn validate(&self) -> Result<Vec<String>, ProviderError> {
        let mut problems = Vec::new();
        let all: Vec<String> = self
            .config
            .pools
            .iter()
            .flat_map(|p| p.groups())
            .map(|(g, _, _)| g.to_string())
            .collect();
        let mut found: BTreeMap<String, Value> = BTreeMap::new();
        for chunk in all.chunks(20) {
            let mut p = vec![("PageSize".to_string(), "50".to_string())];
            for (i, g) in chunk.iter().enumerate() {
                p.push((format!("ScalingGroupId.{}", i + 1), g.clone()));
            }
            let v = self.describe(Api::Ess, "DescribeScalingGroups", &p).await?;
            for g in list_of(&v, "ScalingGroups", "ScalingGroup") {
                found.insert(str_of(g, "ScalingGroupId").to_string(), g.clone());
            }
        }
        let region = &self.config.region;
        for pool in &self.config.pools {
            for (group, role, field) in pool.groups() {
                let Some(g) = found.get(group) else {
                    problems.push(format!(
                        "pool {}: {field}: scaling group {group} not found in region {region} \
                         (or not active)",
                        pool.name
                    ));
                    continue;
                };
                let state = str_of(g, "LifecycleState");
                if !state.is_empty() && state != "Active" {
                    problems.push(format!(
                        "pool {}: {field}: scaling group {group} is {state}, not Active",
                        pool.name
                    ));
                }
                let mut vsws: BTreeSet<String> = match g.get("VSwitchIds") {
                    Some(Value::Array(a)) => a
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect(),
                    Some(_) => list_of(g, "VSwitchIds", "VSwitchId")
                        .into_iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect(),
                    None => BTreeSet::new(),
                };
                if !str_of(g, "VSwitchId").is_empty() {
                    vsws.insert(str_of(g, "VSwitchId").to_string());
                }
                for (zone, vsw) in &pool.vswitches {
                    if !vsws.contains(vsw) {
                        problems.push(format!(
                            "pool {}: alibaba.vSwitches.{zone}: vSwitch {vsw} is not a vSwitch of \
                             scaling group {group}",
                            pool.name
                        ));
                    }
                }
                let compensates = g.get("CompensateWithOnDemand").and_then(Value::as_bool);
                if role == CapacityType::Spot
                    && pool.compensate_with_on_demand
                    && compensates == Some(false)
                {
                    problems.push(format!(
                        "pool {}: alibaba.compensateWithOnDemand: scaling group {group} does not \
                         have CompensateWithOnDemand",
                        pool.name
                    ));
                }
            }
        }
        // vSwitches: where they are, if they exist.
        for pool in &self.config.pools {
            for (zone, vsw) in &pool.vswitches {
                let p = vec![
                    ("VSwitchId".to_string(), vsw.clone()),
                    ("PageSize".to_string(), "50".to_string()),
                ];
                let v = self.describe(Api::Vpc, "DescribeVSwitches", &p).await?;
                let at = list_of(&v, "VSwitches", "VSwitch")
                    .into_iter()
                    .find(|s| str_of(s, "VSwitchId") == vsw)
                    .map(|s| str_of(s, "ZoneId").to_string());
                match at {
                    None => problems.push(format!(
                        "pool {}: alibaba.vSwitches.{zone}: vSwitch {vsw} not found in region \
                         {region}",
                        pool.name
                    )),
                    Some(z) if z != *zone => problems.push(format!(
                        "pool {}: alibaba.vSwitches.{zone}: vSwitch {vsw} is in zone {z}",
                        pool.name
                    )),
                    Some(_) => {}
                }
            }
        }
        // Instance types offered in each zone, for what the pool buys.
        let stock = self.stock().await?;
        for pool in &self.config.pools {
            for t in &pool.instance_types {
                for zone in pool.vswitches.keys() {
                    for ct in CapacityType::ALL {
                        let Some(types) = stock.get(&(zone.clone(), ct)) else {
                            continue;
                        };
                        if pool.buys(ct) && !types.contains_key(t) {
                            problems.push(format!(
                                "pool {}: instanceTypes: {t} is not offered in zone {zone} ({ct})",
                                pool.name
                            ));
                        }
                    }
                }
            }
        }
        Ok(problems)
    }

    /// Spot prices: (type, zone) → the latest price, per type of `types`.
    async fn spot_prices(
        &self,
        types: &BTreeSet<String>,
    ) -> Result<BTreeMap<(String, String), f64>, ProviderError> {
        let mut latest: BTreeMap<(String, String), (String, f64)> = BTreeMap::new();
        for t in types {
            let p = vec![
                ("InstanceType".to_string(), t.clone()),
                ("NetworkType".to_string(), "vpc".to_string()),
                ("OSType".to_string(), "linux".to_string()),
            ];
            let v = self
                .describe(Api::Ecs, "DescribeSpotPriceHistory", &p)
                .await?;
            for s in list_of(&v, "SpotPrices", "SpotPriceType") {
                let (zone, ts) = (str_of(s, "ZoneId"), str_of(s, "Timestamp"));
                let Some(price) = num_of(s, "SpotPrice") else {
                    continue;
                };
                let key = (t.clone(), zone.to_string());
                // ISO-8601 UTC timestamps order as strings.
                if latest.get(&key).is_none_or(|(old, _)| old.as_str() <= ts) {
                    latest.insert(key, (ts.to_string(), price));
                }
            }
        }
        Ok(latest.into_iter().map(|(k, (_, p))| (k, p)).collect())
    }
}

#[async_trait::async_trait]
impl CloudProvider for AlibabaProvider {
    fn name(&self) -> &str {
        "alibaba"
    }

    async fn catalog(&self) -> Result<Catalog, ProviderError> {
        let types: BTreeSet<String> = self
            .config
            .pools
            .iter()
            .flat_map(|p| p.instance_types.iter().cloned())
            .collect();
        let missing: Vec<String> = self
            .config
            .pools
            .iter()
            .flat_map(|p| {
                p.instance_types
                    .iter()
                    .filter(|t| !p.on_demand_prices.contains_key(*t))
                    .map(move |t| format!("{}/{t}", p.name))
            })
            .collect();
        if !missing.is_empty() {
            return Err(ProviderError::InvalidRequest {
                message: format!(
                    "no on-demand price configured for {} (the ECS API has no list prices)",
                    missing.join(", ")
                ),
            });
        }
        let list: Vec<String> = types.iter().cloned().collect();
        let mut shapes: BTreeMap<String, InstanceType> = BTreeMap::new();
        for chunk in list.chunks(10) {
            let mut token = String::new();
            loop {
                let mut p: Vec<(String, String)> = chunk
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (format!("InstanceTypes.{}", i + 1), t.clone()))
                    .collect();
                p.push(("MaxResults".to_string(), "100".to_string()));
                if !token.is_empty() {
                    p.push(("NextToken".to_string(), token.clone()));
                }
                let v = self.describe(Api::Ecs, "DescribeInstanceTypes", &p).await?;
                for t in list_of(&v, "InstanceTypes", "InstanceType") {
                    let name = str_of(t, "InstanceTypeId").to_string();
                    let gpus = num_of(t, "GPUAmount").unwrap_or(0.0) as u32;
                    let gpu = (gpus > 0).then(|| {
                        let (vendor, model) = gpu_model(str_of(t, "GPUSpec"));
                        GpuInfo {
                            model,
                            vendor,
                            count: gpus,
                            memory_mib: (num_of(t, "GPUMemorySize").unwrap_or(0.0) * 1024.0).round()
                                as u64,
                        }
                    });
                    shapes.insert(
                        name.clone(),
                        InstanceType {
                            name,
                            vcpu: num_of(t, "CpuCoreCount").unwrap_or(0.0) as u32,
                            memory_mib: (num_of(t, "MemorySize").unwrap_or(0.0) * 1024.0).round()
                                as u64,
                            gpu,
                            on_demand_price: None,
                        },
                    );
                }
                token = str_of(&v, "NextToken").to_string();
                if token.is_empty() {
                    break;
                }
            }
        }
        let unknown: Vec<&String> = types.iter().filter(|t| !shapes.contains_key(*t)).collect();
        if !unknown.is_empty() {
            return Err(ProviderError::InvalidRequest {
                message: format!(
                    "instance types not known in region {}: {unknown:?}",
                    self.config.region
                ),
            });
        }
        let spot_types: BTreeSet<String> = self
            .config
            .pools
            .iter()
            .filter(|p| p.buys_spot())
            .flat_map(|p| p.instance_types.iter().cloned())
            .collect();
        let spot = self.spot_prices(&spot_types).await?;
        let stock = self.stock().await?;
        let mut offerings = BTreeMap::new();
        for p in &self.config.pools {
            for t in &p.instance_types {
                let od = p.on_demand_prices[t];
                for zone in p.vswitches.keys() {
                    for ct in CapacityType::ALL {
                        // Only what ECS offers in the zone exists; its stock says if available.
                        let Some(available) = stock
                            .get(&(zone.clone(), ct))
                            .and_then(|types| types.get(t))
                            .filter(|_| p.buys(ct))
                        else {
                            continue;
                        };
                        let key = OfferingKey {
                            instance_type: t.clone(),
                            zone: zone.clone(),
                            capacity_type: ct,
                        };
                        // Without a spot price, SpotAsPriceGo's ceiling: the on-demand price.
                        let price = match ct {
                            CapacityType::Spot => spot.get(&(t.clone(), zone.clone())).copied(),
                            CapacityType::OnDemand | CapacityType::Reserved => None,
                        }
                        .unwrap_or(od);
                        offerings.insert(
                            key.clone(),
                            Offering {
                                key,
                                price_per_hour: price,
                                available: *available,
                            },
                        );
                    }
                }
                if let Some(shape) = shapes.get_mut(t) {
                    shape.on_demand_price = Some(od);
                }
            }
        }
        Ok(Catalog {
            instance_types: shapes.into_values().collect(),
            offerings: offerings.into_values().collect(),
        })
    }

    async fn launch(&self, request: &LaunchRequest) -> Result<LaunchResult, ProviderError> {
        let pool = self.pool(&request.pool)?;
        let mut result = LaunchResult::default();
        if request.count == 0 {
            return Ok(result);
        }
        if request.launch_id.is_empty() {
            return Err(ProviderError::InvalidRequest {
                message: "empty launch id".into(),
            });
        }
        let wants = |ct: CapacityType| {
            request.offerings.is_empty() || request.offerings.iter().any(|o| o.capacity_type == ct)
        };
        let of_type = |ct: CapacityType| -> Vec<OfferingKey> {
            let listed: Vec<OfferingKey> = request
                .offerings
                .iter()
                .filter(|o| o.capacity_type == ct)
                .cloned()
                .collect();
            if !listed.is_empty() {
                return listed;
            }
            pool.instance_types
                .iter()
                .flat_map(|t| {
                    pool.vswitches.keys().map(move |z| OfferingKey {
                        instance_type: t.clone(),
                        zone: z.clone(),
                        capacity_type: ct,
                    })
                })
                .collect()
        };
        // What this launch id has already (a retry, or a repeat after a restart): the instances
        // of its earlier activities, which are followed to their end first.
        let mut existing = 0u32;
        for (group, _, _) in pool.groups() {
            for a in self.launch_activities(group, &request.launch_id).await? {
                let id = str_of(&a, "ScalingActivityId").to_string();
                let a = if activity_status(&a) == "InProgress" {
                    self.follow_activity(group, &id).await?
                } else {
                    a
                };
                if activity_status(&a) == "InProgress" {
                    // Still creating after activity_timeout: it may yet deliver everything, so
                    // nothing more is asked for this launch id.
                    existing = request.count;
                    continue;
                }
                let found = self
                    .scaling_instances(group, Some(&id), None)
                    .await
                    .map_err(ApiError::into_provider_error)?;
                // Instances removed since still count: they were created for this launch.
                let created = num_of(&a, "CreatedCapacity").unwrap_or(0.0) as u32;
                existing = existing.saturating_add(created.max(found.len() as u32));
            }
        }
        for (group, role, _) in pool.groups() {
            let missing = request
                .count
                .saturating_sub(existing.saturating_add(result.launched.len() as u32));
            if missing == 0 || !wants(role) {
                continue;
            }
            let outcome = self
                .scale_group(group, role, missing, &request.launch_id)
                .await?;
            result.launched.extend(
                outcome
                    .instances
                    .iter()
                    .map(|s| self.to_instance(pool, role, &request.launch_id, s)),
            );
            if let Some((code, message)) = outcome.failure {
                for key in of_type(role) {
                    let e = crate::errors::offering_error(&key, &code, &message);
                    result.failures.push((key, e));
                }
            }
        }
        // Best effort: the activity's metadata names the cluster as well, for as long as ESS
        // keeps the activity.
        let _ = self.tag_as_ours(&result.launched).await;
        Ok(result)
    }

    async fn terminate(&self, instance_id: &str) -> Result<(), ProviderError> {
        let id = instance_id_of(&self.config.region, instance_id);
        let Some((group, listed)) = self.group_of(id).await? else {
            return Ok(()); // in none of our groups: already removed
        };
        self.check_owned(&group, &listed).await?;
        let p = vec![
            ("ScalingGroupId".to_string(), group.clone()),
            ("InstanceIds.1".to_string(), id.to_string()),
            ("RemovePolicy".to_string(), "release".to_string()),
            ("DecreaseDesiredCapacity".to_string(), "true".to_string()),
        ];
        let _queued = self.lock_group(&group).await;
        match self
            .call_when_idle("RemoveInstances", &self.limits.remove, &p)
            .await
        {
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
        let pool = self.pool(pool)?;
        let mut out = Vec::new();
        for (group, role, _) in pool.groups() {
            let mut found = self
                .scaling_instances(group, None, None)
                .await
                .map_err(ApiError::into_provider_error)?;
            self.complete_from_ecs(&mut found).await?;
            // The launch id of each instance, from its activity's metadata.
            let ids: Vec<String> = found
                .iter()
                .map(|s| s.activity_id.clone())
                .filter(|a| !a.is_empty())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let acts = if ids.is_empty() {
                BTreeMap::new()
            } else {
                self.activities(group, &ids)
                    .await
                    .map_err(ApiError::into_provider_error)?
            };
            let identity_of = |s: &ScalingInstance| {
                acts.get(&s.activity_id)
                    .and_then(|a| metadata_of(a, TAG_CLUSTER_ID))
            };
            // Without an identity in its activity: the ECS tag, if someone tagged it since.
            let tagged = if self.config.cluster_id.is_some() {
                let untold: Vec<String> = found
                    .iter()
                    .filter(|s| identity_of(s).is_none())
                    .map(|s| s.id.clone())
                    .collect();
                self.ecs_identities(&untold).await?
            } else {
                BTreeMap::new()
            };
            for s in &found {
                let act = acts.get(&s.activity_id);
                let cluster = identity_of(s).or_else(|| tagged.get(&s.id).cloned());
                if !self.may_be_ours(cluster.as_deref()) {
                    continue; // launched by another cluster into this group
                }
                let launch_id = act.and_then(launch_id_of).unwrap_or_default();
                let mut i = self.to_instance(pool, role, &launch_id, s);
                // No identity (the group's own, ACK's, an older version's): never removed
                // (`check_owned`), so never given up either.
                i.unclaimed = self.config.cluster_id.is_some() && cluster.is_none();
                out.push(i);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> AlibabaPool {
        AlibabaPool {
            name: "gpu".into(),
            scaling_group: "asg-spot".into(),
            capacity_type: CapacityType::Spot,
            compensate_with_on_demand: false,
            on_demand_group: Some("asg-od".into()),
            instance_types: vec!["ecs.gn7i-c8g1.2xlarge".into()],
            vswitches: [("cn-hangzhou-i".to_string(), "vsw-1".to_string())].into(),
            on_demand_prices: BTreeMap::new(),
        }
    }

    #[test]
    fn config_problems_name_pool_and_field() {
        let mut c = AlibabaConfig::new("cn-hangzhou");
        c.pools.push(pool());
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        let mut bad = pool();
        bad.name = "gpu".into();
        bad.scaling_group = "sg-1".into();
        bad.on_demand_group = Some("asg-od".into());
        bad.vswitches
            .insert("cn-hangzhou-j".into(), "subnet-1".into());
        bad.instance_types.clear();
        c.pools.push(bad);
        let mut od_only = pool();
        od_only.name = "od".into();
        od_only.scaling_group = "asg-od2".into();
        od_only.capacity_type = CapacityType::OnDemand;
        od_only.on_demand_group = Some("asg-od3".into());
        od_only.compensate_with_on_demand = true;
        c.pools.push(od_only);
        c.page_size = 0;
        c.busy_retry.max_attempts = 0;
        let p = c.problems().join("\n");
        for want in [
            "duplicate pool \"gpu\"",
            "alibaba.scalingGroupId \"sg-1\" is not a scaling group id",
            "alibaba.onDemandScalingGroupId asg-od is used by another pool",
            "pool od: alibaba.onDemandScalingGroupId needs a spot alibaba.scalingGroupId",
            "pool od: alibaba.compensateWithOnDemand needs a spot alibaba.scalingGroupId",
            "busy_retry.max_attempts must be at least 1",
            "vSwitch \"subnet-1\" of zone cn-hangzhou-j",
            "pool gpu: no instance types",
            "page_size 0",
        ] {
            assert!(p.contains(want), "missing {want:?} in\n{p}");
        }
    }

    #[test]
    fn provider_ids_and_tokens() {
        assert_eq!(provider_id("cn-hangzhou", "i-bp1"), "cn-hangzhou.i-bp1");
        assert_eq!(instance_id_of("cn-hangzhou", "cn-hangzhou.i-bp1"), "i-bp1");
        assert_eq!(instance_id_of("cn-hangzhou", "i-bp1"), "i-bp1");
        let a = client_token("launch-1", CapacityType::Spot, 2);
        assert_eq!(a, client_token("launch-1", CapacityType::Spot, 2));
        assert_ne!(a, client_token("launch-1", CapacityType::OnDemand, 2));
        assert_ne!(a, client_token("launch-2", CapacityType::Spot, 2));
        // A retry asking for fewer is another request, so another token.
        assert_ne!(a, client_token("launch-1", CapacityType::Spot, 1));
        let long = client_token(&"x".repeat(500), CapacityType::OnDemand, u32::MAX);
        assert!(long.len() <= 64 && long.is_ascii(), "{long}");
        // ESS keeps a token's activity: a token must not change between releases, or a call
        // retried across an upgrade would scale out twice.
        assert_eq!(a, "gna-s2-launch-1-96dd2903b6a0f58f");
    }

    #[test]
    fn parsing_helpers() {
        assert_eq!(parse_time_ms("1970-01-01T00:01Z"), Some(60_000));
        assert_eq!(parse_time_ms("1970-01-01T00:01:02Z"), Some(62_000));
        assert_eq!(parse_time_ms("yesterday"), None);
        assert_eq!(
            gpu_model("NVIDIA A10"),
            (GpuVendor::Nvidia, "A10".to_string())
        );
        assert_eq!(
            gpu_model("AMD MI300X"),
            (GpuVendor::Amd, "MI300X".to_string())
        );
        assert_eq!(gpu_model("T4"), (GpuVendor::Nvidia, "T4".to_string()));
        assert_eq!(instance_state("Pending:Wait"), InstanceState::Pending);
        assert_eq!(instance_state("InService"), InstanceState::Running);
        assert_eq!(instance_state("Removing"), InstanceState::ShuttingDown);
        let zone =
            |cat: &str, status: &str| serde_json::json!({"StatusCategory": cat, "Status": status});
        assert!(has_stock(&zone("WithStock", "Available")));
        assert!(has_stock(&zone("ClosedWithStock", "Available")));
        assert!(!has_stock(&zone("WithoutStock", "SoldOut")));
        assert!(!has_stock(&zone("", "SoldOut")));
        assert!(has_stock(&zone("", "Available")));
        let act = serde_json::json!({
            "StatusCode": "Successful",
            "ActivityMetadata": "{\"gpu-node-autoscaler.io/launch-id\":\"l-1\"}",
        });
        assert_eq!(launch_id_of(&act).as_deref(), Some("l-1"));
        assert_eq!(activity_status(&act), "Successful");
        assert_eq!(
            launch_id_of(&serde_json::json!({"ActivityMetadata": "not json"})),
            None
        );
    }
}
