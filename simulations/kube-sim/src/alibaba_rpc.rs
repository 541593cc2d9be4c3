//! A small Alibaba Cloud RPC client for the ESS bridge: GET requests signed with signature
//! version 1.0 (HMAC-SHA1 keyed with `AccessKeySecret&` over `GET&%2F&` and the percent-encoded
//! canonicalized query, base64), credentials from the environment, throttled answers retried.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use gpu_node_autoscaler_provider::retry::{backoff, jitter_unit, RetryPolicy};
use gpu_node_autoscaler_provider::rng::splitmix64;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use sha1::Sha1;

pub const ENV_ACCESS_KEY_ID: &str = "ALIBABA_CLOUD_ACCESS_KEY_ID";
pub const ENV_ACCESS_KEY_SECRET: &str = "ALIBABA_CLOUD_ACCESS_KEY_SECRET";
pub const ENV_SECURITY_TOKEN: &str = "ALIBABA_CLOUD_SECURITY_TOKEN";

/// An AccessKey pair, with an STS token when it is temporary. Its `Debug` shows the key id's
/// first characters only.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key_id: String,
    pub access_key_secret: String,
    pub security_token: Option<String>,
}

impl Credentials {
    pub fn new(id: impl Into<String>, secret: impl Into<String>) -> Credentials {
        Credentials {
            access_key_id: id.into(),
            access_key_secret: secret.into(),
            security_token: None,
        }
    }

    /// From `ALIBABA_CLOUD_ACCESS_KEY_ID`, `ALIBABA_CLOUD_ACCESS_KEY_SECRET` and, optionally,
    /// `ALIBABA_CLOUD_SECURITY_TOKEN`.
    pub fn from_env() -> Result<Credentials, String> {
        Credentials::from_lookup(|k| std::env::var(k).ok())
    }

    fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Credentials, String> {
        let non_empty = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let missing: Vec<&str> = [ENV_ACCESS_KEY_ID, ENV_ACCESS_KEY_SECRET]
            .into_iter()
            .filter(|k| non_empty(k).is_none())
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "Alibaba Cloud credentials: {} not set",
                missing.join(" and ")
            ));
        }
        Ok(Credentials {
            access_key_id: non_empty(ENV_ACCESS_KEY_ID).unwrap_or_default(),
            access_key_secret: non_empty(ENV_ACCESS_KEY_SECRET).unwrap_or_default(),
            security_token: non_empty(ENV_SECURITY_TOKEN),
        })
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self.access_key_id.chars().take(4).collect();
        f.debug_struct("Credentials")
            .field("access_key_id", &format!("{shown}****"))
            .finish_non_exhaustive()
    }
}

/// RFC 3986 as the signature wants it: only `A-Z a-z 0-9 - _ . ~` stay literal, every other
/// byte is `%XY` (upper-case hex).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The query string of a signed GET: the parameters sorted by name, each side percent-encoded,
/// then `Signature`.
pub fn signed_query(params: &BTreeMap<String, String>, access_key_secret: &str) -> String {
    let query = params
        .iter()
        .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    let to_sign = format!("GET&{}&{}", percent_encode("/"), percent_encode(&query));
    let key = format!("{access_key_secret}&");
    let mut mac = Hmac::<Sha1>::new_from_slice(key.as_bytes()).expect("HMAC takes any key length");
    mac.update(to_sign.as_bytes());
    let signature = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    format!("{query}&Signature={}", percent_encode(&signature))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One number per call of this process, mixed with the time and the process id.
fn next_seed() -> u64 {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    splitmix64(now_ms() ^ n.rotate_left(32) ^ u64::from(std::process::id()))
}

/// A `SignatureNonce` no other call draws: the process id, its call number, the time and a draw.
fn nonce() -> String {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let n = CALLS.fetch_add(1, Ordering::Relaxed);
    format!(
        "{:08x}{n:08x}{:012x}{:04x}",
        std::process::id(),
        now_ms() & 0xffff_ffff_ffff,
        next_seed() & 0xffff
    )
}

/// An error answer: its `Code` (if the body had one) and the text to log.
struct CallError {
    code: Option<String>,
    text: String,
}

/// Signed RPC calls in one region with one pair of credentials.
pub struct Client {
    http: reqwest::Client,
    region: String,
    credentials: Credentials,
    retry: RetryPolicy,
}

impl Client {
    pub fn new(region: &str, credentials: Credentials) -> Result<Client, String> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Client {
            http,
            region: region.to_string(),
            credentials,
            retry: RetryPolicy::default(),
        })
    }

    /// `action` of the API at `endpoint` (whose `Version` is `version`), the answer's JSON;
    /// `Throttling*` answers are retried with jittered back-off.
    pub async fn call(
        &self,
        endpoint: &str,
        version: &str,
        action: &str,
        params: &[(String, String)],
    ) -> Result<Value, String> {
        let mut attempt = 0u32;
        loop {
            let err = match self.call_once(endpoint, version, action, params).await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let throttled = err
                .code
                .as_deref()
                .is_some_and(|c| c == "Throttling" || c.starts_with("Throttling."));
            attempt += 1;
            if !throttled || attempt >= self.retry.max_attempts.max(1) {
                return Err(err.text);
            }
            let delay = backoff(
                self.retry.base_delay,
                self.retry.max_delay,
                attempt - 1,
                jitter_unit(next_seed()),
            );
            tokio::time::sleep(delay).await;
        }
    }

    async fn call_once(
        &self,
        endpoint: &str,
        version: &str,
        action: &str,
        params: &[(String, String)],
    ) -> Result<Value, CallError> {
        let c = &self.credentials;
        let mut all: BTreeMap<String, String> = params.iter().cloned().collect();
        let common = [
            ("Action", action.to_string()),
            ("Version", version.to_string()),
            ("Format", "JSON".to_string()),
            ("RegionId", self.region.clone()),
            ("AccessKeyId", c.access_key_id.clone()),
            ("SignatureMethod", "HMAC-SHA1".to_string()),
            ("SignatureVersion", "1.0".to_string()),
            ("SignatureNonce", nonce()),
            (
                "Timestamp",
                chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string(),
            ),
        ];
        for (k, v) in common {
            all.insert(k.to_string(), v);
        }
        if let Some(t) = &c.security_token {
            all.insert("SecurityToken".to_string(), t.clone());
        }
        let url = format!(
            "{}/?{}",
            endpoint.trim_end_matches('/'),
            signed_query(&all, &c.access_key_secret)
        );
        // Without the URL: it carries the AccessKeyId and the STS token.
        let transport = |e: reqwest::Error| CallError {
            code: None,
            text: format!("{action} failed: {}", e.without_url()),
        };
        let resp = self.http.get(url).send().await.map_err(transport)?;
        let status = resp.status();
        let body = resp.text().await.map_err(transport)?;
        let json: Value = match serde_json::from_str(&body) {
            Ok(v) if status.is_success() => return Ok(v),
            Ok(v) => v,
            Err(_) => Value::Null,
        };
        // Alibaba answers errors with a non-2xx status and `{"Code", "Message", "RequestId"}`.
        let field = |k: &str| json.get(k).and_then(Value::as_str).map(str::to_string);
        let message = field("Message").unwrap_or_else(|| {
            format!(
                "HTTP {status}: {}",
                body.chars().take(200).collect::<String>()
            )
        });
        let code = field("Code");
        let rid = field("RequestId")
            .map(|r| format!(" (RequestId {r})"))
            .unwrap_or_default();
        let text = match &code {
            Some(c) => format!("{action} failed: {c}: {message}{rid}"),
            None => format!("{action} failed: {message}{rid}"),
        };
        Err(CallError { code, text })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The worked example of Alibaba Cloud's signature documentation (DescribeRegions, secret
    /// `testsecret`).
    #[test]
    fn the_documented_example_signs_the_same() {
        let params: BTreeMap<String, String> = [
            ("AccessKeyId", "testid"),
            ("Action", "DescribeRegions"),
            ("Format", "XML"),
            ("SignatureMethod", "HMAC-SHA1"),
            ("SignatureNonce", "3ee8c1b8-83d3-44af-a94f-4e0ad82fd6cf"),
            ("SignatureVersion", "1.0"),
            ("Timestamp", "2016-02-23T12:46:24Z"),
            ("Version", "2014-05-26"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let query = signed_query(&params, "testsecret");
        assert!(
            query.ends_with("&Signature=OLeaidS1JvxuMvnyHOwuJ%2BuX5qY%3D"),
            "{query}"
        );
        assert!(query.starts_with("AccessKeyId=testid&Action=DescribeRegions&Format=XML&"));
        assert!(query.contains("&Timestamp=2016-02-23T12%3A46%3A24Z&"));
    }

    #[test]
    fn percent_encoding_keeps_only_unreserved_bytes() {
        assert_eq!(percent_encode("a-Z_0.~"), "a-Z_0.~");
        assert_eq!(percent_encode("a b*c/é"), "a%20b%2Ac%2F%C3%A9");
    }

    #[test]
    fn credentials_come_from_the_environment_variables() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        let c = Credentials::from_lookup(env(&[
            (ENV_ACCESS_KEY_ID, "id"),
            (ENV_ACCESS_KEY_SECRET, "secret"),
        ]))
        .unwrap();
        assert_eq!(c, Credentials::new("id", "secret"));
        let c = Credentials::from_lookup(env(&[
            (ENV_ACCESS_KEY_ID, "id"),
            (ENV_ACCESS_KEY_SECRET, "secret"),
            (ENV_SECURITY_TOKEN, "token"),
        ]))
        .unwrap();
        assert_eq!(c.security_token.as_deref(), Some("token"));
        let e = Credentials::from_lookup(env(&[(ENV_ACCESS_KEY_ID, " ")])).unwrap_err();
        assert!(e.contains("ALIBABA_CLOUD_ACCESS_KEY_ID and ALIBABA_CLOUD_ACCESS_KEY_SECRET"));
        assert!(!format!("{:?}", Credentials::new("LTAI5t", "s3cret")).contains("s3cret"));
    }
}
