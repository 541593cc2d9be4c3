//! Wall-clock instants as plain values, so every decision can take `now` as a parameter.

use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

/// Milliseconds since the Unix epoch (UTC).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Time(pub i64);

impl Time {
    pub const EPOCH: Time = Time(0);

    pub fn from_secs(secs: i64) -> Time {
        Time(secs.saturating_mul(1000))
    }

    /// Parses an RFC 3339 timestamp such as `2026-11-21T10:00:00Z`.
    pub fn parse_rfc3339(s: &str) -> Result<Time, String> {
        chrono::DateTime::parse_from_rfc3339(s)
            .map(|t| Time(t.timestamp_millis()))
            .map_err(|e| format!("invalid RFC 3339 time {s:?}: {e}"))
    }

    pub fn to_rfc3339(self) -> String {
        match chrono::DateTime::from_timestamp_millis(self.0) {
            Some(t) => t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            None => format!("{}ms", self.0),
        }
    }

    /// `self - earlier`, zero when `earlier` is later.
    pub fn since(self, earlier: Time) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0).max(0) as u64)
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        Time(
            self.0
                .saturating_add(d.as_millis().min(i64::MAX as u128) as i64),
        )
    }
}

impl Sub<Duration> for Time {
    type Output = Time;
    fn sub(self, d: Duration) -> Time {
        Time(
            self.0
                .saturating_sub(d.as_millis().min(i64::MAX as u128) as i64),
        )
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip() {
        let t = Time::parse_rfc3339("2026-11-21T10:00:00Z").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-11-21T10:00:00Z");
        assert_eq!(
            (t + Duration::from_secs(90)).to_rfc3339(),
            "2026-11-21T10:01:30Z"
        );
        assert!(Time::parse_rfc3339("yesterday").is_err());
    }

    #[test]
    fn since_saturates_at_zero() {
        assert_eq!(Time(1000).since(Time(5000)), Duration::ZERO);
        assert_eq!(Time(5000).since(Time(1000)), Duration::from_secs(4));
    }
}
