//! Go-style durations ("10m", "1h30m", "500ms", "1.5h").
//!
//! Accepted units: `ns`, `us`/`µs`/`μs`, `ms`, `s`, `m`, `h`. Fractions are
//! truncated to whole nanoseconds, as in Go. Negative values are rejected.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("invalid duration {input:?}: empty")]
    Empty { input: String },
    #[error("invalid duration {input:?}: whitespace is not allowed")]
    Whitespace { input: String },
    #[error("invalid duration {input:?}: negative durations are not allowed")]
    Negative { input: String },
    #[error("invalid duration {input:?}: missing unit after {number:?} (use ms, s, m or h)")]
    MissingUnit { input: String, number: String },
    #[error("invalid duration {input:?}: unknown unit {unit:?} (use ms, s, m or h{})", day_hint(.unit))]
    UnknownUnit { input: String, unit: String },
    #[error("invalid duration {input:?}: {reason}")]
    Malformed { input: String, reason: String },
    #[error("invalid duration {input:?}: too large")]
    OutOfRange { input: String },
}

fn day_hint(unit: &str) -> &'static str {
    match unit {
        "d" => "; e.g. 24h for one day",
        "w" => "; e.g. 168h for one week",
        _ => "",
    }
}

const NANOS_PER_SEC: u128 = 1_000_000_000;

fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" | "µs" | "μs" => 1_000,
        "ms" => 1_000_000,
        "s" => NANOS_PER_SEC,
        "m" => 60 * NANOS_PER_SEC,
        "h" => 3_600 * NANOS_PER_SEC,
        _ => return None,
    })
}

pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let input = || s.to_string();
    if s.is_empty() {
        return Err(DurationError::Empty { input: input() });
    }
    if s.contains(char::is_whitespace) {
        return Err(DurationError::Whitespace { input: input() });
    }
    let mut rest = s;
    if rest.starts_with('-') {
        return Err(DurationError::Negative { input: input() });
    }
    if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(DurationError::Malformed {
            input: input(),
            reason: "missing number".into(),
        });
    }

    let overflow = || DurationError::OutOfRange { input: input() };
    let mut total: u128 = 0;
    while !rest.is_empty() {
        // Number: digits with an optional fraction; at least one digit.
        let int_end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (int_part, after_int) = rest.split_at(int_end);
        let (frac_part, after_num) = match after_int.strip_prefix('.') {
            Some(f) => {
                let end = f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len());
                f.split_at(end)
            }
            None => ("", after_int),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            let reason = match after_num.chars().next() {
                Some('-') => {
                    return Err(DurationError::Negative { input: input() });
                }
                Some(c) => format!("expected a number, found {c:?}"),
                None => "expected a number after \".\"".into(),
            };
            return Err(DurationError::Malformed {
                input: input(),
                reason,
            });
        }
        let number_len = rest.len() - after_num.len();
        let number = rest.get(..number_len).unwrap_or(rest);

        if after_num.starts_with('.') {
            return Err(DurationError::Malformed {
                input: input(),
                reason: "more than one decimal point".into(),
            });
        }
        let unit_end = after_num
            .find(|c: char| c.is_ascii_digit() || matches!(c, '.' | '-' | '+'))
            .unwrap_or(after_num.len());
        let (unit, next) = after_num.split_at(unit_end);
        if unit.is_empty() {
            return Err(DurationError::MissingUnit {
                input: input(),
                number: number.to_string(),
            });
        }
        let Some(scale) = unit_nanos(unit) else {
            return Err(DurationError::UnknownUnit {
                input: input(),
                unit: unit.to_string(),
            });
        };

        let mut whole: u128 = 0;
        for b in int_part.bytes() {
            whole = whole
                .checked_mul(10)
                .and_then(|v| v.checked_add(u128::from(b - b'0')))
                .ok_or_else(overflow)?;
        }
        let mut nanos = whole.checked_mul(scale).ok_or_else(overflow)?;
        // Digits past the 20th are ignored; they add less than 1ns.
        let mut frac: u128 = 0;
        let mut denom: u128 = 1;
        for b in frac_part.bytes().take(20) {
            frac = frac * 10 + u128::from(b - b'0');
            denom *= 10;
        }
        nanos = nanos
            .checked_add(frac * scale / denom)
            .ok_or_else(overflow)?;
        total = total.checked_add(nanos).ok_or_else(overflow)?;
        rest = next;
    }

    let secs = u64::try_from(total / NANOS_PER_SEC).map_err(|_| overflow())?;
    // The remainder is below 10^9, so it fits in u32.
    let sub = (total % NANOS_PER_SEC) as u32;
    Ok(Duration::new(secs, sub))
}

/// Shortest form that `parse_duration` reads back exactly, e.g. "0s", "500ms",
/// "1.5s", "1m30s", "1h5s", "2h".
pub fn format_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let nanos = d.subsec_nanos();
    if secs == 0 {
        return match nanos {
            0 => "0s".into(),
            n if n < 1_000 => format!("{n}ns"),
            n if n < 1_000_000 => format!("{}µs", decimal(u64::from(n / 1_000), n % 1_000, 3)),
            n => format!("{}ms", decimal(u64::from(n / 1_000_000), n % 1_000_000, 6)),
        };
    }
    let (h, m, s) = (secs / 3_600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || nanos > 0 {
        out.push_str(&format!("{}s", decimal(s, nanos, 9)));
    }
    out
}

/// `whole.frac` with `frac` zero-padded to `width` digits and trailing zeros removed.
fn decimal(whole: u64, frac: u32, width: usize) -> String {
    if frac == 0 {
        return whole.to_string();
    }
    let f = format!("{frac:0width$}");
    format!("{whole}.{}", f.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random strings over `alphabet`.
    fn random_strings(alphabet: &[&str], count: usize, max_len: u64) -> Vec<String> {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (0..count)
            .map(|_| {
                let len = next() % (max_len + 1);
                (0..len)
                    .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                    .collect()
            })
            .collect()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn ok(s: &str) -> Duration {
        match parse_duration(s) {
            Ok(d) => d,
            Err(e) => panic!("{s:?} should parse: {e}"),
        }
    }

    #[test]
    fn parses_common_forms() {
        assert_eq!(ok("10m"), ms(600_000));
        assert_eq!(ok("1h30m"), ms(5_400_000));
        assert_eq!(ok("500ms"), ms(500));
        assert_eq!(ok("90s"), ms(90_000));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0s"), Duration::ZERO);
        assert_eq!(ok("1.5h"), ms(5_400_000));
        assert_eq!(ok(".5s"), ms(500));
        assert_eq!(ok("5.s"), ms(5_000));
        assert_eq!(ok("1h0m5s"), ms(3_605_000));
        assert_eq!(ok("1m1m"), ms(120_000));
        assert_eq!(ok("+5s"), ms(5_000));
        assert_eq!(ok("100ns"), Duration::from_nanos(100));
        assert_eq!(ok("3us"), Duration::from_micros(3));
        assert_eq!(ok("3µs"), Duration::from_micros(3));
        assert_eq!(ok("3μs"), Duration::from_micros(3));
        assert_eq!(ok("1.0000000001s"), Duration::from_secs(1));
        assert_eq!(
            ok("0.3333333333333333333333333h"),
            Duration::new(1199, 999_999_999)
        );
    }

    #[test]
    fn rejects_bad_input() {
        let err = |s: &str| parse_duration(s).unwrap_err();
        assert!(matches!(err(""), DurationError::Empty { .. }));
        assert!(matches!(err(" 1s"), DurationError::Whitespace { .. }));
        assert!(matches!(err("1s "), DurationError::Whitespace { .. }));
        assert!(matches!(err("1h 30m"), DurationError::Whitespace { .. }));
        assert!(matches!(err("-1s"), DurationError::Negative { .. }));
        assert!(matches!(err("1h-5m"), DurationError::Negative { .. }));
        assert!(matches!(err("10"), DurationError::MissingUnit { .. }));
        assert!(matches!(err("1h30"), DurationError::MissingUnit { .. }));
        assert!(matches!(err("10d"), DurationError::UnknownUnit { .. }));
        assert!(matches!(err("10sec"), DurationError::UnknownUnit { .. }));
        assert!(matches!(err("10S"), DurationError::UnknownUnit { .. }));
        assert!(matches!(err("1.2.3s"), DurationError::Malformed { .. }));
        assert!(matches!(err("."), DurationError::Malformed { .. }));
        assert!(matches!(err(".s"), DurationError::Malformed { .. }));
        assert!(matches!(err("s"), DurationError::Malformed { .. }));
        assert!(matches!(err("+"), DurationError::Malformed { .. }));
        assert!(matches!(err("00"), DurationError::MissingUnit { .. }));
        assert!(matches!(
            err("99999999999999999999999999h"),
            DurationError::OutOfRange { .. }
        ));
        assert!(matches!(
            err("1000000000000000000000000000000000000000000s"),
            DurationError::OutOfRange { .. }
        ));
        assert!(matches!(
            err("18446744073709551616s"),
            DurationError::OutOfRange { .. }
        ));
        assert_eq!(ok("18446744073709551615s"), Duration::from_secs(u64::MAX));
    }

    #[test]
    fn error_messages() {
        let msg = |s: &str| parse_duration(s).unwrap_err().to_string();
        assert_eq!(
            msg("10d"),
            "invalid duration \"10d\": unknown unit \"d\" (use ms, s, m or h; e.g. 24h for one day)"
        );
        assert_eq!(
            msg("10x"),
            "invalid duration \"10x\": unknown unit \"x\" (use ms, s, m or h)"
        );
        assert_eq!(
            msg("10"),
            "invalid duration \"10\": missing unit after \"10\" (use ms, s, m or h)"
        );
        assert_eq!(
            msg("-5m"),
            "invalid duration \"-5m\": negative durations are not allowed"
        );
        assert_eq!(msg(""), "invalid duration \"\": empty");
    }

    #[test]
    fn no_panic_on_random_inputs() {
        let alphabet = [
            "0", "1", "9", ".", "+", "-", "h", "m", "s", "n", "u", "µ", "d", " ", "é",
        ];
        for s in random_strings(&alphabet, 20_000, 12) {
            if let Ok(d) = parse_duration(&s) {
                assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{s}");
            }
        }
    }

    #[test]
    fn formats_canonically() {
        assert_eq!(format_duration(Duration::ZERO), "0s");
        assert_eq!(format_duration(ms(500)), "500ms");
        assert_eq!(format_duration(ms(90_000)), "1m30s");
        assert_eq!(format_duration(ms(600_000)), "10m");
        assert_eq!(format_duration(ms(3_600_000)), "1h");
        assert_eq!(format_duration(ms(5_400_000)), "1h30m");
        assert_eq!(format_duration(ms(3_605_000)), "1h5s");
        assert_eq!(format_duration(ms(45_000)), "45s");
        assert_eq!(format_duration(ms(1_500)), "1.5s");
        assert_eq!(format_duration(ms(60_500)), "1m0.5s");
        assert_eq!(format_duration(ms(90_000_000)), "25h");
        assert_eq!(format_duration(Duration::from_micros(1_500)), "1.5ms");
        assert_eq!(format_duration(Duration::from_nanos(1_500)), "1.5µs");
        assert_eq!(format_duration(Duration::from_nanos(7)), "7ns");
        assert_eq!(format_duration(Duration::new(1, 1)), "1.000000001s");
    }

    #[test]
    fn round_trip() {
        let mut samples: Vec<Duration> = [
            0,
            1,
            999,
            1_000,
            1_001,
            59_999,
            60_000,
            3_599_999,
            3_600_000,
            86_400_000,
            u64::from(u32::MAX),
        ]
        .into_iter()
        .map(ms)
        .collect();
        // Deterministic pseudo-random milliseconds and nanoseconds.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for i in 0..5_000 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let v = x >> (i % 40 + 20);
            samples.push(ms(v));
            samples.push(Duration::from_nanos(v));
        }
        samples.push(Duration::new(u64::MAX, 999_999_999));
        for d in samples {
            let s = format_duration(d);
            assert_eq!(parse_duration(&s), Ok(d), "{s}");
        }
    }
}
