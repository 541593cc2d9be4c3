//! Kubernetes resource quantities (`500m`, `64Gi`, `1e3`) and durations (`1s`, `2m30s`, `200ms`).

use std::time::Duration;

/// Parses a resource quantity into thousandths of a unit (so `500m` CPU is 500, `1` is 1000,
/// `1Ki` is 1,024,000). Negative quantities and fractions finer than a thousandth round up.
pub fn parse_quantity_milli(s: &str) -> Result<i128, String> {
    let bad = || {
        format!("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' (got {s:?})")
    };
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let (negative, digits) = match num.as_bytes().first() {
        Some(b'-') => (true, &num[1..]),
        Some(b'+') => (false, &num[1..]),
        _ => (false, num),
    };
    let (int_part, frac_part) = digits.split_once('.').unwrap_or((digits, ""));
    if (int_part.is_empty() && frac_part.is_empty())
        || !int_part.bytes().all(|b| b.is_ascii_digit())
        || !frac_part.bytes().all(|b| b.is_ascii_digit())
        || int_part.len() + frac_part.len() > 30
    {
        return Err(bad());
    }
    // value = mantissa * 10^exp10 * 2^exp2 (in units); result in thousandths.
    let mantissa: i128 = format!("{int_part}{frac_part}")
        .parse::<i128>()
        .map_err(|_| bad())?;
    let mut exp10: i32 = 3 - frac_part.len() as i32;
    let mut exp2: u32 = 0;
    match suffix {
        "" => {}
        "n" => exp10 -= 9,
        "u" => exp10 -= 6,
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        "Ki" => exp2 = 10,
        "Mi" => exp2 = 20,
        "Gi" => exp2 = 30,
        "Ti" => exp2 = 40,
        "Pi" => exp2 = 50,
        "Ei" => exp2 = 60,
        e if e.starts_with(['e', 'E']) => {
            let x: i32 = e[1..].parse().map_err(|_| bad())?;
            if !(-30..=30).contains(&x) {
                return Err(bad());
            }
            exp10 += x;
        }
        _ => return Err(bad()),
    }
    let too_big = || format!("quantity {s:?} is too large");
    let mut v = mantissa.checked_mul(1i128 << exp2).ok_or_else(too_big)?;
    if exp10 >= 0 {
        v = v
            .checked_mul(10i128.checked_pow(exp10 as u32).ok_or_else(too_big)?)
            .ok_or_else(too_big)?;
    } else {
        let d = 10i128.checked_pow((-exp10) as u32).unwrap_or(i128::MAX);
        v = (v + d - 1) / d;
    }
    Ok(if negative { -v } else { v })
}

/// Parses a duration such as `1s`, `200ms`, `2m30s`, `1h`, `1.5s` (Go's `time.ParseDuration` units
/// `ns`, `us`, `ms`, `s`, `m`, `h`); a bare `0` is zero.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad =
        || format!("invalid duration {s:?}: use a number with a unit, e.g. 500ms, 30s, 2m, 1h30m");
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.is_empty() {
        return Err(bad());
    }
    let mut rest = t;
    let mut total = 0f64;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if n == 0 {
            return Err(bad());
        }
        let value: f64 = rest[..n].parse().map_err(|_| bad())?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..u] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += value * scale;
        rest = &rest[u..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity_milli("500m"), Ok(500));
        assert_eq!(parse_quantity_milli("2"), Ok(2000));
        assert_eq!(parse_quantity_milli("1.5"), Ok(1500));
        assert_eq!(parse_quantity_milli("1Ki"), Ok(1_024_000));
        assert_eq!(parse_quantity_milli("64Gi"), Ok(64 * (1i128 << 30) * 1000));
        assert_eq!(parse_quantity_milli("1G"), Ok(1_000_000_000_000));
        assert_eq!(parse_quantity_milli("1e3"), Ok(1_000_000));
        assert_eq!(
            parse_quantity_milli("100n"),
            Ok(1),
            "rounds up to a thousandth"
        );
        assert_eq!(parse_quantity_milli("-1"), Ok(-1000));
        for bad in ["", "abc", "1x", "1.2.3", "Gi", "1e", "--1"] {
            assert!(parse_quantity_milli(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("2m30s"), Ok(Duration::from_secs(150)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "1", "s", "1d", "-1s", "1s2"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
