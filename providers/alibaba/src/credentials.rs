//! Where the provider's credentials come from, and keeping temporary ones fresh.
//!
//! The chain, in order (the order of Alibaba Cloud's default credential chain):
//! 1. environment variables: `ALIBABA_CLOUD_ACCESS_KEY_ID`, `ALIBABA_CLOUD_ACCESS_KEY_SECRET`,
//!    optionally `ALIBABA_CLOUD_SECURITY_TOKEN`;
//! 2. ACK RRSA / OIDC: `ALIBABA_CLOUD_ROLE_ARN`, `ALIBABA_CLOUD_OIDC_PROVIDER_ARN` and
//!    `ALIBABA_CLOUD_OIDC_TOKEN_FILE` → STS `AssumeRoleWithOIDC` (anonymous: the OIDC token is
//!    the proof), giving temporary credentials with a `SecurityToken`;
//! 3. the ECS instance RAM role, from the metadata service
//!    (`<metadata>/latest/meta-data/ram/security-credentials/<role>`), in hardened mode first
//!    (a session token from `PUT <metadata>/latest/api/token`, sent as
//!    `X-aliyun-ecs-metadata-token`), falling back to plain requests unless
//!    `ALIBABA_CLOUD_IMDSV1_DISABLED` is true.
//!
//! Temporary credentials are cached and fetched again [`REFRESH_BEFORE_EXPIRY`] before they
//! expire; the OIDC token file is read again at each refresh (ACK rotates it). Nothing here logs,
//! every `Debug` redacts the secret, the STS token and the OIDC token, and error messages carry
//! neither.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::sign::{self, Credentials, ENV_ACCESS_KEY_ID, ENV_ACCESS_KEY_SECRET};

pub const ENV_ROLE_ARN: &str = "ALIBABA_CLOUD_ROLE_ARN";
pub const ENV_OIDC_PROVIDER_ARN: &str = "ALIBABA_CLOUD_OIDC_PROVIDER_ARN";
pub const ENV_OIDC_TOKEN_FILE: &str = "ALIBABA_CLOUD_OIDC_TOKEN_FILE";
pub const ENV_ROLE_SESSION_NAME: &str = "ALIBABA_CLOUD_ROLE_SESSION_NAME";
pub const ENV_STS_REGION: &str = "ALIBABA_CLOUD_STS_REGION";
pub const ENV_VPC_ENDPOINT_ENABLED: &str = "ALIBABA_CLOUD_VPC_ENDPOINT_ENABLED";
/// The ECS instance's RAM role name (else the metadata service is asked for it).
pub const ENV_ECS_METADATA: &str = "ALIBABA_CLOUD_ECS_METADATA";
pub const ENV_ECS_METADATA_DISABLED: &str = "ALIBABA_CLOUD_ECS_METADATA_DISABLED";
pub const ENV_IMDSV1_DISABLED: &str = "ALIBABA_CLOUD_IMDSV1_DISABLED";

/// The ECS metadata service.
pub const DEFAULT_METADATA_URL: &str = "http://100.100.100.200";
/// STS's public endpoint.
pub const DEFAULT_STS_ENDPOINT: &str = "https://sts.aliyuncs.com";
pub const STS_VERSION: &str = "2015-04-01";
/// Header carrying the hardened-mode metadata session token.
pub const METADATA_TOKEN_HEADER: &str = "X-aliyun-ecs-metadata-token";
/// Header asking for a metadata session token of this many seconds.
pub const METADATA_TOKEN_TTL_HEADER: &str = "X-aliyun-ecs-metadata-token-ttl-seconds";
/// Temporary credentials are fetched again this long before they expire.
pub const REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(180);
/// `DurationSeconds` asked of `AssumeRoleWithOIDC` (STS allows 900..=43200).
pub const DEFAULT_OIDC_DURATION: Duration = Duration::from_secs(3600);

/// ACK RRSA: a RAM role assumed with the pod's OIDC token.
#[derive(Clone, PartialEq, Eq)]
pub struct OidcRole {
    pub role_arn: String,
    pub oidc_provider_arn: String,
    /// Read at every refresh: the token is rotated by the kubelet.
    pub token_file: PathBuf,
    pub session_name: String,
    pub duration: Duration,
    pub sts_endpoint: String,
}

/// The RAM role of the ECS instance we run on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EcsRamRole {
    /// `None`: asked of the metadata service.
    pub role: Option<String>,
    /// Base URL of the metadata service (tests point it at a local fake).
    pub metadata_url: String,
    /// Refuse plain (tokenless) metadata requests.
    pub imdsv1_disabled: bool,
}

/// Where credentials come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CredentialSource {
    Static(Credentials),
    Oidc(OidcRole),
    EcsRamRole(EcsRamRole),
}

impl fmt::Debug for OidcRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No secret here (the token stays in its file), but keep the shape explicit.
        f.debug_struct("OidcRole")
            .field("role_arn", &self.role_arn)
            .field("oidc_provider_arn", &self.oidc_provider_arn)
            .field("token_file", &self.token_file)
            .field("session_name", &self.session_name)
            .field("duration", &self.duration)
            .field("sts_endpoint", &self.sts_endpoint)
            .finish()
    }
}

/// Endpoints the chain uses, overridable (tests, private networks).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChainOverrides {
    /// Instead of [`DEFAULT_METADATA_URL`].
    pub metadata_url: Option<String>,
    /// Instead of the STS endpoint derived from `ALIBABA_CLOUD_STS_REGION` /
    /// `ALIBABA_CLOUD_VPC_ENDPOINT_ENABLED` (default [`DEFAULT_STS_ENDPOINT`]).
    pub sts_endpoint: Option<String>,
}

fn truthy(v: Option<String>) -> bool {
    v.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes"))
}

impl CredentialSource {
    /// The chain over the process environment.
    pub fn from_env(overrides: &ChainOverrides) -> Result<CredentialSource, String> {
        CredentialSource::from_lookup(|k| std::env::var(k).ok(), overrides)
    }

    /// The first source of the chain whose variables are set. Pure: nothing is fetched yet.
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
        overrides: &ChainOverrides,
    ) -> Result<CredentialSource, String> {
        let non_empty = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let env_err = match Credentials::from_lookup(&get) {
            Ok(c) => return Ok(CredentialSource::Static(c)),
            // Half an AccessKey is a mistake, not a reason to try the next source.
            Err(e)
                if [ENV_ACCESS_KEY_ID, ENV_ACCESS_KEY_SECRET]
                    .iter()
                    .any(|k| non_empty(k).is_some()) =>
            {
                return Err(e)
            }
            Err(e) => e,
        };
        let oidc = [ENV_ROLE_ARN, ENV_OIDC_PROVIDER_ARN, ENV_OIDC_TOKEN_FILE];
        let set: Vec<&str> = oidc
            .iter()
            .copied()
            .filter(|k| non_empty(k).is_some())
            .collect();
        if set.len() == oidc.len() {
            let sts_endpoint =
                overrides
                    .sts_endpoint
                    .clone()
                    .unwrap_or_else(|| match non_empty(ENV_STS_REGION) {
                        Some(r) if truthy(get(ENV_VPC_ENDPOINT_ENABLED)) => {
                            format!("https://sts-vpc.{}.aliyuncs.com", r.trim())
                        }
                        Some(r) => format!("https://sts.{}.aliyuncs.com", r.trim()),
                        None => DEFAULT_STS_ENDPOINT.to_string(),
                    });
            return Ok(CredentialSource::Oidc(OidcRole {
                role_arn: non_empty(ENV_ROLE_ARN).unwrap_or_default(),
                oidc_provider_arn: non_empty(ENV_OIDC_PROVIDER_ARN).unwrap_or_default(),
                token_file: PathBuf::from(non_empty(ENV_OIDC_TOKEN_FILE).unwrap_or_default()),
                session_name: non_empty(ENV_ROLE_SESSION_NAME)
                    .unwrap_or_else(|| "gpu-node-autoscaler".to_string()),
                duration: DEFAULT_OIDC_DURATION,
                sts_endpoint,
            }));
        }
        if !set.is_empty() {
            let missing: Vec<&str> = oidc.iter().copied().filter(|k| !set.contains(k)).collect();
            return Err(format!(
                "Alibaba Cloud credentials: {} set but {} not (all three are needed for RRSA/OIDC)",
                set.join(", "),
                missing.join(", ")
            ));
        }
        if truthy(get(ENV_ECS_METADATA_DISABLED)) {
            return Err(format!(
                "{env_err}; no RRSA/OIDC variables ({}); the ECS instance RAM role is disabled \
                 ({ENV_ECS_METADATA_DISABLED})",
                oidc.join(", ")
            ));
        }
        Ok(CredentialSource::EcsRamRole(EcsRamRole {
            role: non_empty(ENV_ECS_METADATA).map(|r| r.trim().to_string()),
            metadata_url: overrides
                .metadata_url
                .clone()
                .unwrap_or_else(|| DEFAULT_METADATA_URL.to_string()),
            imdsv1_disabled: truthy(get(ENV_IMDSV1_DISABLED)),
        }))
    }

    /// What the source is, for messages (no secret).
    pub fn describe(&self) -> String {
        match self {
            CredentialSource::Static(_) => "AccessKey from the environment".to_string(),
            CredentialSource::Oidc(o) => format!("RRSA/OIDC role {}", o.role_arn),
            CredentialSource::EcsRamRole(r) => match &r.role {
                Some(role) => format!("ECS instance RAM role {role}"),
                None => "ECS instance RAM role".to_string(),
            },
        }
    }
}

impl From<Credentials> for CredentialSource {
    fn from(c: Credentials) -> CredentialSource {
        CredentialSource::Static(c)
    }
}

/// Why credentials could not be had. Never carries a secret or a token.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot get Alibaba Cloud credentials ({source_name}): {message}")]
pub struct CredentialError {
    pub source_name: String,
    pub message: String,
    /// The STS / metadata error code, when there was one.
    pub code: Option<String>,
}

#[derive(Clone)]
struct Cached {
    credentials: Credentials,
    /// Milliseconds since the Unix epoch; `None` for credentials that do not expire.
    expires_ms: Option<i64>,
}

/// Credentials from a [`CredentialSource`], cached, and refreshed before they expire. Concurrent
/// callers share one refresh.
pub struct CredentialProvider {
    source: CredentialSource,
    http: reqwest::Client,
    cached: tokio::sync::Mutex<Option<Cached>>,
    refresh_before_expiry: Duration,
}

impl fmt::Debug for CredentialProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialProvider")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl From<Credentials> for CredentialProvider {
    fn from(c: Credentials) -> CredentialProvider {
        CredentialProvider::new(CredentialSource::Static(c))
    }
}

impl From<CredentialSource> for CredentialProvider {
    fn from(s: CredentialSource) -> CredentialProvider {
        CredentialProvider::new(s)
    }
}

/// `2021-10-20T04:27:09Z` → milliseconds since the Unix epoch.
fn parse_expiration(s: &str) -> Option<i64> {
    chrono::NaiveDateTime::parse_from_str(s.trim(), "%Y-%m-%dT%H:%M:%SZ")
        .ok()
        .map(|t| t.and_utc().timestamp_millis())
}

impl CredentialProvider {
    pub fn new(source: CredentialSource) -> CredentialProvider {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        CredentialProvider {
            source,
            http,
            cached: tokio::sync::Mutex::new(None),
            refresh_before_expiry: REFRESH_BEFORE_EXPIRY,
        }
    }

    /// How long before expiry temporary credentials are fetched again.
    pub fn with_refresh_before_expiry(mut self, d: Duration) -> CredentialProvider {
        self.refresh_before_expiry = d;
        self
    }

    pub fn source(&self) -> &CredentialSource {
        &self.source
    }

    /// Current credentials: cached ones while they are fresh, else fetched again. A failed
    /// refresh still returns cached credentials that have not expired yet.
    pub async fn credentials(&self) -> Result<Credentials, CredentialError> {
        if let CredentialSource::Static(c) = &self.source {
            return Ok(c.clone());
        }
        let mut cached = self.cached.lock().await;
        let now = crate::now_ms();
        let margin = self.refresh_before_expiry.as_millis() as i64;
        if let Some(c) = cached.as_ref() {
            if c.expires_ms.is_none_or(|e| now + margin < e) {
                return Ok(c.credentials.clone());
            }
        }
        match self.fetch().await {
            Ok(fresh) => {
                let out = fresh.credentials.clone();
                *cached = Some(fresh);
                Ok(out)
            }
            Err(e) => match cached.as_ref() {
                Some(c) if c.expires_ms.is_some_and(|x| now < x) => Ok(c.credentials.clone()),
                _ => Err(e),
            },
        }
    }

    fn error(&self, code: Option<String>, message: impl Into<String>) -> CredentialError {
        CredentialError {
            source_name: self.source.describe(),
            message: message.into(),
            code,
        }
    }

    async fn fetch(&self) -> Result<Cached, CredentialError> {
        match &self.source {
            CredentialSource::Static(c) => Ok(Cached {
                credentials: c.clone(),
                expires_ms: None,
            }),
            CredentialSource::Oidc(o) => self.assume_role_with_oidc(o).await,
            CredentialSource::EcsRamRole(r) => self.ecs_ram_role(r).await,
        }
    }

    /// Temporary credentials out of a JSON object with `AccessKeyId`, `AccessKeySecret`,
    /// `SecurityToken` and `Expiration`.
    fn temporary(&self, v: &Value, what: &str) -> Result<Cached, CredentialError> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let (id, secret, token) = (s("AccessKeyId"), s("AccessKeySecret"), s("SecurityToken"));
        if id.is_empty() || secret.is_empty() || token.is_empty() {
            return Err(self.error(
                None,
                format!("{what} answered without AccessKeyId, AccessKeySecret and SecurityToken"),
            ));
        }
        let expiration = s("Expiration");
        let expires_ms = parse_expiration(&expiration).ok_or_else(|| {
            self.error(
                None,
                format!("{what} answered an unreadable Expiration {expiration:?}"),
            )
        })?;
        Ok(Cached {
            credentials: Credentials {
                access_key_id: id,
                access_key_secret: secret,
                security_token: Some(token),
            },
            expires_ms: Some(expires_ms),
        })
    }

    fn transport(&self, what: &str, e: reqwest::Error) -> CredentialError {
        self.error(None, format!("{what}: {}", e.without_url()))
    }

    async fn assume_role_with_oidc(&self, o: &OidcRole) -> Result<Cached, CredentialError> {
        let token = std::fs::read_to_string(&o.token_file).map_err(|e| {
            self.error(
                None,
                format!(
                    "cannot read the OIDC token file {}: {e}",
                    o.token_file.display()
                ),
            )
        })?;
        let token = token.trim();
        if token.is_empty() {
            return Err(self.error(
                None,
                format!("the OIDC token file {} is empty", o.token_file.display()),
            ));
        }
        let query = [
            ("Action", "AssumeRoleWithOIDC".to_string()),
            ("Format", "JSON".to_string()),
            ("Version", STS_VERSION.to_string()),
            (
                "Timestamp",
                chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            ),
        ];
        // The token goes in the body, never in the URL.
        let body = [
            ("RoleArn", o.role_arn.as_str()),
            ("OIDCProviderArn", o.oidc_provider_arn.as_str()),
            ("OIDCToken", token),
            ("RoleSessionName", o.session_name.as_str()),
            ("DurationSeconds", &o.duration.as_secs().to_string()),
        ]
        .iter()
        .map(|(k, v)| format!("{}={}", sign::percent_encode(k), sign::percent_encode(v)))
        .collect::<Vec<_>>()
        .join("&");
        let url = format!(
            "{}/?{}",
            o.sts_endpoint.trim_end_matches('/'),
            query
                .iter()
                .map(|(k, v)| format!("{k}={}", sign::percent_encode(v)))
                .collect::<Vec<_>>()
                .join("&")
        );
        let what = "STS AssumeRoleWithOIDC";
        let resp = self
            .http
            .post(url)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .map_err(|e| self.transport(what, e))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| self.transport(what, e))?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if !status.is_success() {
            let code = v.get("Code").and_then(Value::as_str).map(str::to_string);
            let message = v
                .get("Message")
                .and_then(Value::as_str)
                .map_or_else(|| format!("HTTP {status}"), str::to_string);
            return Err(self.error(
                code.clone(),
                format!("{what} failed: {}: {message}", code.unwrap_or_default()),
            ));
        }
        self.temporary(v.get("Credentials").unwrap_or(&Value::Null), what)
    }

    async fn ecs_ram_role(&self, r: &EcsRamRole) -> Result<Cached, CredentialError> {
        let base = r.metadata_url.trim_end_matches('/');
        // Hardened mode: a session token first.
        let token = match self
            .http
            .put(format!("{base}/latest/api/token"))
            .header(METADATA_TOKEN_TTL_HEADER, "21600")
            .send()
            .await
        {
            Ok(resp) if resp.status().is_success() => Some(
                resp.text()
                    .await
                    .map_err(|e| self.transport("metadata token", e))?,
            ),
            Ok(resp) if r.imdsv1_disabled => {
                return Err(self.error(
                    None,
                    format!(
                        "the metadata service refused a session token (HTTP {}) and \
                         {ENV_IMDSV1_DISABLED} forbids plain requests",
                        resp.status()
                    ),
                ))
            }
            Err(e) if r.imdsv1_disabled => return Err(self.transport("metadata token", e)),
            _ => None,
        };
        let get = |path: String| {
            let mut req = self.http.get(format!("{base}{path}"));
            if let Some(t) = &token {
                req = req.header(METADATA_TOKEN_HEADER, t.trim());
            }
            req.send()
        };
        let text_of = |what: &'static str, resp: reqwest::Response| async move {
            let status = resp.status();
            let body = resp.text().await.map_err(|e| self.transport(what, e))?;
            if status.is_success() {
                Ok(body)
            } else {
                Err(self.error(None, format!("{what}: HTTP {status}")))
            }
        };
        const PREFIX: &str = "/latest/meta-data/ram/security-credentials/";
        let role = match &r.role {
            Some(role) => role.clone(),
            None => {
                let what = "metadata role name";
                let resp = get(PREFIX.to_string())
                    .await
                    .map_err(|e| self.transport(what, e))?;
                let body = text_of(what, resp).await?;
                match body.lines().map(str::trim).find(|l| !l.is_empty()) {
                    Some(l) => l.to_string(),
                    None => {
                        return Err(self.error(None, "no RAM role is attached to this instance"))
                    }
                }
            }
        };
        let what = "metadata RAM role credentials";
        let resp = get(format!("{PREFIX}{}", sign::percent_encode(&role)))
            .await
            .map_err(|e| self.transport(what, e))?;
        let body = text_of(what, resp).await?;
        let v: Value = serde_json::from_str(&body)
            .map_err(|_| self.error(None, format!("{what}: not JSON")))?;
        let code = v.get("Code").and_then(Value::as_str).unwrap_or("Success");
        if code != "Success" {
            return Err(self.error(Some(code.to_string()), format!("{what}: Code {code}")));
        }
        self.temporary(&v, what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn chain_order_env_then_oidc_then_ecs_role() {
        let none = ChainOverrides::default();
        let all = [
            (ENV_ACCESS_KEY_ID, "LTAIid"),
            (ENV_ACCESS_KEY_SECRET, "secret"),
            (ENV_ROLE_ARN, "acs:ram::1:role/r"),
            (ENV_OIDC_PROVIDER_ARN, "acs:ram::1:oidc-provider/p"),
            (ENV_OIDC_TOKEN_FILE, "/var/run/token"),
        ];
        assert!(matches!(
            CredentialSource::from_lookup(lookup(&all), &none).unwrap(),
            CredentialSource::Static(_)
        ));
        let CredentialSource::Oidc(o) =
            CredentialSource::from_lookup(lookup(&all[2..]), &none).unwrap()
        else {
            panic!("not OIDC")
        };
        assert_eq!(o.role_arn, "acs:ram::1:role/r");
        assert_eq!(o.sts_endpoint, DEFAULT_STS_ENDPOINT);
        assert_eq!(o.token_file, PathBuf::from("/var/run/token"));
        let mut vpc = all[2..].to_vec();
        vpc.push((ENV_STS_REGION, "cn-hangzhou"));
        vpc.push((ENV_VPC_ENDPOINT_ENABLED, "true"));
        let CredentialSource::Oidc(o) = CredentialSource::from_lookup(lookup(&vpc), &none).unwrap()
        else {
            panic!("not OIDC")
        };
        assert_eq!(o.sts_endpoint, "https://sts-vpc.cn-hangzhou.aliyuncs.com");
        let r = CredentialSource::from_lookup(lookup(&[(ENV_ECS_METADATA, "node-role")]), &none)
            .unwrap();
        assert_eq!(
            r,
            CredentialSource::EcsRamRole(EcsRamRole {
                role: Some("node-role".into()),
                metadata_url: DEFAULT_METADATA_URL.into(),
                imdsv1_disabled: false,
            })
        );
        let over = ChainOverrides {
            metadata_url: Some("http://127.0.0.1:1".into()),
            sts_endpoint: None,
        };
        let CredentialSource::EcsRamRole(r) =
            CredentialSource::from_lookup(lookup(&[]), &over).unwrap()
        else {
            panic!("not the ECS role")
        };
        assert_eq!(
            (r.role, r.metadata_url.as_str()),
            (None, "http://127.0.0.1:1")
        );
    }

    #[test]
    fn partial_oidc_and_disabled_metadata_are_errors_naming_variables() {
        let none = ChainOverrides::default();
        let e =
            CredentialSource::from_lookup(lookup(&[(ENV_ROLE_ARN, "acs:ram::1:role/r")]), &none)
                .unwrap_err();
        assert!(
            e.contains(ENV_OIDC_PROVIDER_ARN) && e.contains(ENV_OIDC_TOKEN_FILE),
            "{e}"
        );
        let e =
            CredentialSource::from_lookup(lookup(&[(ENV_ECS_METADATA_DISABLED, "true")]), &none)
                .unwrap_err();
        assert!(
            e.contains(ENV_ACCESS_KEY_ID) && e.contains(ENV_ECS_METADATA_DISABLED),
            "{e}"
        );
        // Half an AccessKey does not fall through to the instance role.
        let e = CredentialSource::from_lookup(lookup(&[(ENV_ACCESS_KEY_ID, "LTAIid")]), &none)
            .unwrap_err();
        assert!(e.contains(ENV_ACCESS_KEY_SECRET), "{e}");
    }

    #[test]
    fn expiration_is_parsed() {
        assert_eq!(parse_expiration("1970-01-01T00:01:00Z"), Some(60_000));
        assert_eq!(parse_expiration("soon"), None);
    }
}
