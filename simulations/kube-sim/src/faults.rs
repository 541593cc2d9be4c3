//! Fault injection: a share of API requests answered with an error, watches ended early, delayed
//! responses. Set by flags at start and through `GET`/`PUT /admin/faults` while running.

use std::time::Duration;

use gpu_node_autoscaler_provider::rng::SplitMix64;
use serde_json::{json, Map, Value};

use crate::status::{ApiError, ApiResult};

/// The fault settings; all off by default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Faults {
    /// Share (0 to 1) of API requests answered with `error_code` instead of being served.
    pub error_rate: f64,
    /// 429 (answered with `Retry-After: 1`) or 500 to 599.
    pub error_code: u16,
    /// Every watch stream ends this long after it started.
    pub watch_close_after: Option<Duration>,
    /// Every API response is delayed this long.
    pub delay: Duration,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            error_rate: 0.0,
            error_code: 500,
            watch_close_after: None,
            delay: Duration::ZERO,
        }
    }
}

/// Checks an error code for injection: 429 or a 5xx.
pub fn check_error_code(code: u16) -> Result<u16, String> {
    if code == 429 || (500..=599).contains(&code) {
        Ok(code)
    } else {
        Err(format!("errorCode must be 429 or 500-599, not {code}"))
    }
}

/// Checks an error rate: a share from 0 to 1.
pub fn check_error_rate(rate: f64) -> Result<f64, String> {
    if (0.0..=1.0).contains(&rate) {
        Ok(rate)
    } else {
        Err(format!("errorRate must be between 0 and 1, not {rate}"))
    }
}

impl Faults {
    /// The settings as `GET /admin/faults` shows them.
    pub fn to_json(&self) -> Value {
        json!({
            "errorRate": self.error_rate,
            "errorCode": self.error_code,
            "watchCloseAfterSeconds": self.watch_close_after.map_or(0.0, |d| d.as_secs_f64()),
            "delayMs": self.delay.as_secs_f64() * 1000.0,
        })
    }

    /// Parses a `PUT /admin/faults` body; absent fields are off (errorCode defaults to 500).
    pub fn from_json(body: &Value) -> ApiResult<Faults> {
        let bad = |m: String| ApiError::bad_request(m);
        let obj: &Map<String, Value> = body
            .as_object()
            .ok_or_else(|| bad("the body must be a JSON object".into()))?;
        let number = |field: &str| -> ApiResult<Option<f64>> {
            match obj.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => match v.as_f64() {
                    Some(x) if x >= 0.0 && x.is_finite() => Ok(Some(x)),
                    _ => Err(bad(format!("{field} must be a number >= 0, not {v}"))),
                },
            }
        };
        for k in obj.keys() {
            if !matches!(
                k.as_str(),
                "errorRate" | "errorCode" | "watchCloseAfterSeconds" | "delayMs"
            ) {
                return Err(bad(format!(
                    "unknown field {k:?} (known: errorRate, errorCode, watchCloseAfterSeconds, delayMs)"
                )));
            }
        }
        let mut f = Faults::default();
        if let Some(r) = number("errorRate")? {
            f.error_rate = check_error_rate(r).map_err(bad)?;
        }
        if let Some(c) = number("errorCode")? {
            if c.fract() != 0.0 || c > u16::MAX as f64 {
                return Err(bad(format!("errorCode must be an integer, not {c}")));
            }
            f.error_code = check_error_code(c as u16).map_err(bad)?;
        }
        f.watch_close_after = number("watchCloseAfterSeconds")?
            .filter(|s| *s > 0.0)
            .map(Duration::from_secs_f64);
        f.delay = Duration::from_secs_f64(number("delayMs")?.unwrap_or(0.0) / 1000.0);
        Ok(f)
    }

    /// The error an injected failure answers with.
    pub fn error(&self) -> ApiError {
        let reason = match self.error_code {
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "InternalError",
        };
        let message = if self.error_code == 429 {
            "the server has received too many requests and has asked us to try again later (injected fault)"
        } else {
            "an error on the server has prevented the request from succeeding (injected fault)"
        };
        ApiError::new(self.error_code, reason, message)
    }
}

/// The fault settings and the seeded random sequence that decides which requests fail.
#[derive(Debug)]
pub struct FaultState {
    pub faults: Faults,
    rng: SplitMix64,
}

impl FaultState {
    pub fn new(faults: Faults, seed: u64) -> Self {
        FaultState {
            faults,
            rng: SplitMix64::new(seed),
        }
    }

    /// The next number of a splitmix64 sequence, as a share in [0, 1).
    fn next_share(&mut self) -> f64 {
        self.rng.next_unit()
    }

    /// Whether the next API request fails (draws from the sequence only when faults are on).
    pub fn roll(&mut self) -> Option<ApiError> {
        let rate = self.faults.error_rate;
        (rate > 0.0 && self.next_share() < rate).then(|| self.faults.error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_and_errors() {
        let f = Faults::from_json(&json!({"errorRate": 0.2, "errorCode": 429, "watchCloseAfterSeconds": 5, "delayMs": 200})).unwrap();
        assert_eq!(f.error_rate, 0.2);
        assert_eq!(f.error_code, 429);
        assert_eq!(f.watch_close_after, Some(Duration::from_secs(5)));
        assert_eq!(f.delay, Duration::from_millis(200));
        assert_eq!(Faults::from_json(&f.to_json()).unwrap(), f);
        assert_eq!(Faults::from_json(&json!({})).unwrap(), Faults::default());
        for bad in [
            json!({"errorRate": 2}),
            json!({"errorCode": 404}),
            json!({"delayMs": -1}),
            json!({"rate": 1}),
            json!([]),
            json!({"errorCode": 500.5}),
        ] {
            assert!(Faults::from_json(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn seeded_share_of_failures() {
        let faults = Faults {
            error_rate: 0.25,
            ..Faults::default()
        };
        let mut a = FaultState::new(faults, 7);
        let mut b = FaultState::new(faults, 7);
        let fa: Vec<bool> = (0..1000).map(|_| a.roll().is_some()).collect();
        let fb: Vec<bool> = (0..1000).map(|_| b.roll().is_some()).collect();
        assert_eq!(fa, fb, "the same seed fails the same requests");
        let n = fa.iter().filter(|x| **x).count();
        assert!((200..300).contains(&n), "{n} of 1000 failed");
        assert!(FaultState::new(Faults::default(), 7).roll().is_none());
    }
}
