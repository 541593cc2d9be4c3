//! The Alibaba Cloud [`CloudProvider`]: ACK GPU node pools are ESS scaling groups. Launches are
//! `ScaleWithAdjustment` on the pool's spot group (then its on-demand group when spot has no
//! stock), followed through `DescribeScalingActivities` / `DescribeScalingInstances`; removals are
//! `RemoveInstances` with the exact instance id; the catalog comes from ECS
//! `DescribeInstanceTypes` and `DescribeSpotPriceHistory`.
//!
//! - HTTP is plain RPC-style `GET` with the version 1.0 HMAC-SHA1 signature ([`sign`]).
//! - Credentials ([`Credentials`]) never reach a log: this crate logs nothing and every `Debug`
//!   redacts them.
//! - Each API class has a client-side rate limit (`governor`), and a throttled call
//!   (`Throttling`, `Throttling.User`, `Throttling.Api`) is retried with jittered exponential
//!   back-off before [`ProviderError::Throttled`] is returned.
//! - A launch is idempotent per launch id: the `ClientToken` of each `ScaleWithAdjustment` is
//!   derived from it, so a repeated launch gets the first call's scaling activity back, and the
//!   instances that activity created are what the launch reports.

pub mod errors;
pub mod sign;

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

pub use errors::ApiError;
pub use sign::Credentials;

/// ESS API version.
pub const ESS_VERSION: &str = "2014-08-28";
/// ECS API version.
pub const ECS_VERSION: &str = "2014-05-26";
/// Key of the launch id in a scaling activity's `ActivityMetadata`.
pub const METADATA_LAUNCH_ID: &str = "gpu-node-autoscaler.io/launch-id";

/// One node pool as ESS sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct AlibabaPool {
    pub name: String,
    /// The scaling group launches go to first (`asg-...`); its scaling configuration or launch
    /// template buys spot (`SpotStrategy`).
    pub spot_group: String,
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

#[derive(Clone, Debug, PartialEq)]
pub struct AlibabaConfig {
    pub region: String,
    /// ESS endpoint; default `https://ess.aliyuncs.com`.
    pub ess_endpoint: Option<String>,
    /// ECS endpoint; default `https://ecs.<region>.aliyuncs.com`.
    pub ecs_endpoint: Option<String>,
    pub pools: Vec<AlibabaPool>,
    pub rate_limits: RateLimits,
    pub retry: RetryPolicy,
    /// How often a scaling activity is polled while `InProgress`.
    pub activity_poll_interval: Duration,
    /// How long a launch follows its activity before returning what exists so far.
    pub activity_timeout: Duration,
    /// `PageSize` of `DescribeScalingInstances` (1..=50).
    pub page_size: u32,
}

impl AlibabaConfig {
    pub fn new(region: impl Into<String>) -> AlibabaConfig {
        AlibabaConfig {
            region: region.into(),
            ess_endpoint: None,
            ecs_endpoint: None,
            pools: Vec::new(),
            rate_limits: RateLimits::default(),
            retry: RetryPolicy::default(),
            activity_poll_interval: Duration::from_secs(5),
            activity_timeout: Duration::from_secs(300),
            page_size: 50,
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
            check_group("spotGroup", &p.spot_group);
            if let Some(g) = &p.on_demand_group {
                check_group("onDemandGroup", g);
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

/// A `ClientToken` (≤ 64 ASCII characters) derived from the launch id and the group's role.
pub fn client_token(launch_id: &str, role: CapacityType) -> String {
    // FNV-1a: stable across releases and platforms, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in launch_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let readable: String = launch_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(32)
        .collect();
    format!("gna-{}-{readable}-{h:016x}", role.as_str())
}

fn splitmix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
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
    let s = spec.trim();
    let lower = s.to_ascii_lowercase();
    let vendor = if lower.starts_with("amd") {
        GpuVendor::Amd
    } else {
        GpuVendor::Nvidia
    };
    let model = s
        .split_once(' ')
        .filter(|(v, _)| matches!(v.to_ascii_lowercase().as_str(), "nvidia" | "amd"))
        .map(|(_, m)| m.trim().to_string())
        .unwrap_or_else(|| s.to_string());
    (vendor, model)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
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

#[derive(Clone, Copy)]
enum Api {
    Ess,
    Ecs,
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
    credentials: Credentials,
    config: AlibabaConfig,
    limits: Limiters,
    counter: AtomicU64,
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
    /// Checks the configuration and builds the HTTP client. Makes no API call.
    pub fn new(
        config: AlibabaConfig,
        credentials: Credentials,
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
        Ok(AlibabaProvider {
            http,
            credentials,
            config,
            limits,
            counter: AtomicU64::new(0),
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
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        splitmix((now_ms() as u64) ^ n.rotate_left(32) ^ u64::from(std::process::id()))
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
        };
        let mut all: BTreeMap<String, String> = params.iter().cloned().collect();
        let nonce = format!("{:016x}{:016x}", self.next_seed(), self.next_seed());
        let common = [
            ("Action", action.to_string()),
            ("Version", version.to_string()),
            ("Format", "JSON".to_string()),
            ("RegionId", self.config.region.clone()),
            ("AccessKeyId", self.credentials.access_key_id.clone()),
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
        if let Some(t) = &self.credentials.security_token {
            all.insert("SecurityToken".to_string(), t.clone());
        }
        let query = sign::signed_query("GET", &all, &self.credentials.access_key_secret);
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

    /// Scales `group` out by `count` for a launch and follows the activity to its end.
    async fn scale_group(
        &self,
        group: &str,
        role: CapacityType,
        count: u32,
        launch_id: &str,
    ) -> Result<GroupOutcome, ProviderError> {
        let metadata = serde_json::json!({ METADATA_LAUNCH_ID: launch_id }).to_string();
        let params = vec![
            ("ScalingGroupId".to_string(), group.to_string()),
            (
                "AdjustmentType".to_string(),
                "QuantityChangeInCapacity".to_string(),
            ),
            ("AdjustmentValue".to_string(), count.to_string()),
            ("ClientToken".to_string(), client_token(launch_id, role)),
            ("ActivityMetadata".to_string(), metadata),
        ];
        let activity_id = match self
            .call(Api::Ess, "ScaleWithAdjustment", &self.limits.scale, &params)
            .await
        {
            Ok(v) => str_of(&v, "ScalingActivityId").to_string(),
            Err(e) => {
                let code = e.code.clone().unwrap_or_default();
                if !e.is_throttle()
                    && (errors::is_no_stock(&code, &e.message) || errors::is_quota(&code, ""))
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
        let deadline = tokio::time::Instant::now() + self.config.activity_timeout;
        let activity = loop {
            let acts = self
                .activities(group, std::slice::from_ref(&activity_id))
                .await
                .map_err(ApiError::into_provider_error)?;
            let a = acts.get(&activity_id).cloned().unwrap_or(Value::Null);
            let status = str_of(&a, "StatusCode").to_string();
            let status = if status.is_empty() {
                str_of(&a, "Status").to_string()
            } else {
                status
            };
            if !(status.is_empty() || status == "InProgress")
                || tokio::time::Instant::now() >= deadline
            {
                break a;
            }
            tokio::time::sleep(self.config.activity_poll_interval).await;
        };
        let instances = self
            .scaling_instances(group, Some(&activity_id), None)
            .await
            .map_err(ApiError::into_provider_error)?;
        let status = match str_of(&activity, "StatusCode") {
            "" => str_of(&activity, "Status"),
            s => s,
        };
        let failure = if matches!(status, "Failed" | "Rejected" | "Warning")
            && (instances.len() as u32) < count
        {
            let code = match str_of(&activity, "ErrorCode") {
                "" => status.to_string(),
                c => c.to_string(),
            };
            let message = [
                str_of(&activity, "ErrorMessage"),
                str_of(&activity, "StatusMessage"),
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
        }
    }

    /// The groups of a pool with their role.
    fn groups(pool: &AlibabaPool) -> Vec<(&str, CapacityType)> {
        let mut g = vec![(pool.spot_group.as_str(), CapacityType::Spot)];
        if let Some(od) = &pool.on_demand_group {
            g.push((od.as_str(), CapacityType::OnDemand));
        }
        g
    }

    /// The group holding `instance_id` among every configured pool's groups.
    async fn group_of(&self, instance_id: &str) -> Result<Option<String>, ProviderError> {
        for pool in &self.config.pools {
            for (group, _) in Self::groups(pool) {
                match self.scaling_instances(group, None, Some(instance_id)).await {
                    Ok(found) if found.iter().any(|s| s.id == instance_id) => {
                        return Ok(Some(group.to_string()))
                    }
                    Ok(_) => {}
                    Err(e)
                        if e.code
                            .as_deref()
                            .is_some_and(|c| errors::GONE_CODES.contains(&c)) => {}
                    Err(e) => return Err(e.into_provider_error()),
                }
            }
        }
        Ok(None)
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
                .call(
                    Api::Ecs,
                    "DescribeSpotPriceHistory",
                    &self.limits.describe,
                    &p,
                )
                .await
                .map_err(ApiError::into_provider_error)?;
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
                let v = self
                    .call(Api::Ecs, "DescribeInstanceTypes", &self.limits.describe, &p)
                    .await
                    .map_err(ApiError::into_provider_error)?;
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
        let spot = self.spot_prices(&types).await?;
        let mut offerings = BTreeMap::new();
        for p in &self.config.pools {
            for t in &p.instance_types {
                let od = p.on_demand_prices[t];
                for zone in p.vswitches.keys() {
                    let key = |ct| OfferingKey {
                        instance_type: t.clone(),
                        zone: zone.clone(),
                        capacity_type: ct,
                    };
                    let sp = spot.get(&(t.clone(), zone.clone()));
                    offerings.insert(
                        key(CapacityType::Spot),
                        Offering {
                            key: key(CapacityType::Spot),
                            price_per_hour: sp.copied().unwrap_or(od),
                            available: sp.is_some(),
                        },
                    );
                    if p.on_demand_group.is_some() || p.compensate_with_on_demand {
                        offerings.insert(
                            key(CapacityType::OnDemand),
                            Offering {
                                key: key(CapacityType::OnDemand),
                                price_per_hour: od,
                                available: true,
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
        for (group, role) in Self::groups(pool) {
            let missing = request.count.saturating_sub(result.launched.len() as u32);
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
                    let e = errors::offering_error(&key, &code, &message);
                    result.failures.push((key, e));
                }
            }
        }
        Ok(result)
    }

    async fn terminate(&self, instance_id: &str) -> Result<(), ProviderError> {
        let id = instance_id_of(&self.config.region, instance_id);
        let Some(group) = self.group_of(id).await? else {
            return Ok(()); // in none of our groups: already removed
        };
        let p = vec![
            ("ScalingGroupId".to_string(), group),
            ("InstanceIds.1".to_string(), id.to_string()),
            ("RemovePolicy".to_string(), "release".to_string()),
            ("DecreaseDesiredCapacity".to_string(), "true".to_string()),
        ];
        match self
            .call(Api::Ess, "RemoveInstances", &self.limits.remove, &p)
            .await
        {
            Ok(_) => Ok(()),
            Err(e)
                if e.code
                    .as_deref()
                    .is_some_and(|c| errors::GONE_CODES.contains(&c)) =>
            {
                Ok(())
            }
            Err(e) => Err(e.into_provider_error()),
        }
    }

    async fn list(&self, pool: &str) -> Result<Vec<Instance>, ProviderError> {
        let pool = self.pool(pool)?;
        let mut out = Vec::new();
        for (group, role) in Self::groups(pool) {
            let found = self
                .scaling_instances(group, None, None)
                .await
                .map_err(ApiError::into_provider_error)?;
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
            for s in &found {
                let launch_id = acts
                    .get(&s.activity_id)
                    .and_then(|a| a.get("ActivityMetadata"))
                    .and_then(Value::as_str)
                    .and_then(|m| serde_json::from_str::<Value>(m).ok())
                    .and_then(|m| {
                        m.get(METADATA_LAUNCH_ID)
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    })
                    .unwrap_or_default();
                out.push(self.to_instance(pool, role, &launch_id, s));
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
            spot_group: "asg-spot".into(),
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
        bad.spot_group = "sg-1".into();
        bad.on_demand_group = Some("asg-od".into());
        bad.vswitches
            .insert("cn-hangzhou-j".into(), "subnet-1".into());
        bad.instance_types.clear();
        c.pools.push(bad);
        c.page_size = 0;
        let p = c.problems().join("\n");
        for want in [
            "duplicate pool \"gpu\"",
            "spotGroup \"sg-1\" is not a scaling group id",
            "onDemandGroup asg-od is used by another pool",
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
        let a = client_token("launch-1", CapacityType::Spot);
        assert_eq!(a, client_token("launch-1", CapacityType::Spot));
        assert_ne!(a, client_token("launch-1", CapacityType::OnDemand));
        assert_ne!(a, client_token("launch-2", CapacityType::Spot));
        let long = client_token(&"x".repeat(500), CapacityType::OnDemand);
        assert!(long.len() <= 64 && long.is_ascii(), "{long}");
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
    }
}
