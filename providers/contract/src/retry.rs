//! Retrying throttled cloud calls: one policy and one back-off for every provider.

use std::time::Duration;

/// Retries of throttled calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Calls in all, the first included (at least 1).
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
        }
    }
}

/// Exponential back-off with jitter: attempt 0 waits about `base`, each later one twice as long,
/// capped at `max`; the wait is drawn from `[d/2, d]` with `unit` in `[0, 1)`.
pub fn backoff(base: Duration, max: Duration, attempt: u32, unit: f64) -> Duration {
    let d = base
        .saturating_mul(2u32.saturating_pow(attempt.min(20)))
        .min(max);
    d.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
}

/// A number in `[0, 1)` from a seed (splitmix64): jitter needs no better randomness.
pub fn jitter_unit(seed: u64) -> f64 {
    crate::rng::unit(seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_is_capped_and_jittered_down_to_half() {
        let (base, max) = (Duration::from_millis(100), Duration::from_millis(500));
        assert_eq!(backoff(base, max, 0, 0.0), Duration::from_millis(50));
        assert_eq!(backoff(base, max, 2, 0.0), Duration::from_millis(200));
        assert_eq!(backoff(base, max, 9, 0.0), Duration::from_millis(250));
        assert_eq!(backoff(base, max, u32::MAX, 1.0), max);
        for s in 0..1000 {
            assert!((0.0..1.0).contains(&jitter_unit(s)));
        }
    }
}
