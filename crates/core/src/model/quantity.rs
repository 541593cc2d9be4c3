//! Kubernetes resource quantities (`resource.Quantity` in apimachinery).
//!
//! Values are kept exactly as `±digits × 10^exp10`; binary suffixes are
//! multiplied out at parse time, so `1Ki` and `1024` compare equal.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

/// Errors from parsing or converting a quantity. Each carries the input text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("malformed quantity {input:?}: {reason}")]
    Malformed { input: String, reason: String },
    #[error("quantity {input:?} is out of range")]
    OutOfRange { input: String },
}

/// A parsed quantity. Equality and hashing compare the numeric value only.
#[derive(Debug, Clone)]
pub struct Quantity {
    text: String,
    negative: bool,
    /// Significant decimal digits (0..=9), no leading or trailing zeros; empty for zero.
    digits: Vec<u8>,
    exp10: i64,
}

/// Largest number of integer digits an i64 magnitude can have.
const I64_DIGITS: i64 = 19;

pub fn parse_quantity(s: &str) -> Result<Quantity, QuantityError> {
    let malformed = |reason: String| QuantityError::Malformed {
        input: s.to_string(),
        reason,
    };
    if s.is_empty() {
        return Err(malformed("empty".into()));
    }
    if s.starts_with(char::is_whitespace) || s.ends_with(char::is_whitespace) {
        return Err(malformed("leading or trailing whitespace".into()));
    }

    let bytes = s.as_bytes();
    let mut pos = 0;
    let mut negative = false;
    if let Some(&c) = bytes.first() {
        if c == b'+' || c == b'-' {
            negative = c == b'-';
            pos = 1;
        }
    }

    // All positions advanced below are over ASCII bytes, so they are char boundaries.
    let mut digits: Vec<u8> = Vec::new();
    let mut any_digit = false;
    while let Some(&c) = bytes.get(pos) {
        if !c.is_ascii_digit() {
            break;
        }
        digits.push(c - b'0');
        any_digit = true;
        pos += 1;
    }
    let mut frac_len: i64 = 0;
    if bytes.get(pos) == Some(&b'.') {
        pos += 1;
        while let Some(&c) = bytes.get(pos) {
            if !c.is_ascii_digit() {
                break;
            }
            digits.push(c - b'0');
            any_digit = true;
            frac_len = frac_len.saturating_add(1);
            pos += 1;
        }
    }
    let rest = s.get(pos..).unwrap_or("");
    if !any_digit {
        return Err(malformed(match rest.chars().next() {
            Some(c) => format!("expected a number, found {c:?}"),
            None => "missing number".into(),
        }));
    }
    if rest.starts_with('.') {
        return Err(malformed("more than one decimal point".into()));
    }

    let (exp10, exp2) = parse_suffix(rest).map_err(malformed)?;

    let mut q = Quantity {
        text: s.to_string(),
        negative,
        digits,
        exp10: exp10.saturating_sub(frac_len),
    };
    q.normalize(exp2);
    // Kubernetes caps quantities at the i64 range; reject anything larger.
    q.to_scaled_ceil(0)?;
    Ok(q)
}

/// Returns (decimal exponent, binary exponent) for a suffix.
fn parse_suffix(suffix: &str) -> Result<(i64, u32), String> {
    let r = match suffix {
        "" => (0, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        _ => {
            let Some(exp) = suffix.strip_prefix(['e', 'E']) else {
                return Err(format!("unknown suffix {suffix:?}"));
            };
            (parse_exponent(exp, suffix)?, 0)
        }
    };
    Ok(r)
}

/// Parses the part after `e`/`E`: optional sign and at least one digit (saturating).
fn parse_exponent(exp: &str, suffix: &str) -> Result<i64, String> {
    let (neg, body) = match exp.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, exp.strip_prefix('+').unwrap_or(exp)),
    };
    if body.is_empty() {
        return Err(format!("missing exponent digits in {suffix:?}"));
    }
    let mut value: i64 = 0;
    for c in body.chars() {
        let Some(d) = c.to_digit(10) else {
            return Err(format!("invalid exponent {suffix:?}"));
        };
        value = value.saturating_mul(10).saturating_add(i64::from(d));
    }
    Ok(if neg { -value } else { value })
}

impl Quantity {
    /// Multiplies in `2^exp2` and strips leading/trailing zeros.
    fn normalize(&mut self, exp2: u32) {
        let lead = self.digits.iter().take_while(|&&d| d == 0).count();
        self.digits.drain(..lead);
        if exp2 > 0 && !self.digits.is_empty() {
            let factor: u128 = 1u128 << exp2;
            let mut carry: u128 = 0;
            for d in self.digits.iter_mut().rev() {
                let v = u128::from(*d) * factor + carry;
                *d = (v % 10) as u8;
                carry = v / 10;
            }
            let mut prefix = Vec::new();
            while carry > 0 {
                prefix.push((carry % 10) as u8);
                carry /= 10;
            }
            prefix.reverse();
            prefix.append(&mut self.digits);
            self.digits = prefix;
        }
        let trail = self.digits.iter().rev().take_while(|&&d| d == 0).count();
        self.digits.truncate(self.digits.len() - trail);
        self.exp10 = self.exp10.saturating_add(trail as i64);
        if self.digits.is_empty() {
            self.negative = false;
            self.exp10 = 0;
        }
    }

    /// `ceil(value × 10^extra)` as i64.
    fn to_scaled_ceil(&self, extra: i64) -> Result<i64, QuantityError> {
        if self.digits.is_empty() {
            return Ok(0);
        }
        let out_of_range = || QuantityError::OutOfRange {
            input: self.text.clone(),
        };
        let e = self.exp10.saturating_add(extra);
        let n = self.digits.len() as i64;
        // Integer digits of the scaled value; the fraction is nonzero iff e < 0,
        // because the last stored digit is nonzero.
        let int_len = n.saturating_add(e);
        if int_len > I64_DIGITS {
            return Err(out_of_range());
        }
        let mut magnitude: i128 = 0;
        for i in 0..int_len.max(0) {
            let d = self.digits.get(i as usize).copied().unwrap_or(0);
            magnitude = magnitude * 10 + i128::from(d);
        }
        let has_fraction = e < 0;
        let value = if self.negative {
            -magnitude
        } else if has_fraction {
            magnitude + 1
        } else {
            magnitude
        };
        i64::try_from(value).map_err(|_| out_of_range())
    }

    /// Value × 1000, rounded towards +infinity (Kubernetes `MilliValue`).
    pub fn to_milli_ceil(&self) -> Result<i64, QuantityError> {
        self.to_scaled_ceil(3)
    }

    /// Value rounded towards +infinity (Kubernetes `Value`).
    pub fn to_units_ceil(&self) -> Result<i64, QuantityError> {
        self.to_scaled_ceil(0)
    }

    pub fn is_negative(&self) -> bool {
        self.negative
    }

    pub fn is_zero(&self) -> bool {
        self.digits.is_empty()
    }

    /// Nearest f64 (may lose precision).
    pub fn as_f64(&self) -> f64 {
        if self.digits.is_empty() {
            return 0.0;
        }
        let mut s = String::with_capacity(self.digits.len() + 24);
        if self.negative {
            s.push('-');
        }
        s.extend(self.digits.iter().map(|&d| char::from(b'0' + d)));
        s.push('e');
        s.push_str(&self.exp10.to_string());
        s.parse().unwrap_or(f64::NAN)
    }

    /// The original text.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.negative == other.negative && self.digits == other.digits && self.exp10 == other.exp10
    }
}

impl Eq for Quantity {}

impl Ord for Quantity {
    /// Numeric order (`1Ki` > `1000`, `-1` < `0`).
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        // Zero has no digits and no sign of its own.
        let sign = |q: &Quantity| match (q.digits.is_empty(), q.negative) {
            (true, _) => 0i8,
            (false, true) => -1,
            (false, false) => 1,
        };
        let (sa, sb) = (sign(self), sign(other));
        if sa != sb || sa == 0 {
            return sa.cmp(&sb);
        }
        // Same sign, both non-zero: compare magnitudes by their leading digit's position, then
        // digit by digit.
        let magnitude = {
            let top_a = self.digits.len() as i64 + self.exp10;
            let top_b = other.digits.len() as i64 + other.exp10;
            top_a.cmp(&top_b).then_with(|| {
                let n = self.digits.len().max(other.digits.len());
                (0..n)
                    .map(|i| {
                        let a = self.digits.get(i).copied().unwrap_or(0);
                        let b = other.digits.get(i).copied().unwrap_or(0);
                        a.cmp(&b)
                    })
                    .find(|o| *o != Ordering::Equal)
                    .unwrap_or(Ordering::Equal)
            })
        };
        if sa < 0 {
            magnitude.reverse()
        } else {
            magnitude
        }
    }
}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Hash for Quantity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.negative.hash(state);
        self.digits.hash(state);
        self.exp10.hash(state);
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_quantity(s)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_order() {
        let q = |s: &str| parse_quantity(s).unwrap();
        assert!(q("80Gi") > q("80G"));
        assert!(q("81920Mi") == q("80Gi"));
        assert!(q("1Ki") > q("1000"));
        assert!(q("500m") < q("1"));
        assert!(q("-1") < q("0"));
        assert!(q("-2") < q("-1"));
        assert!(q("0") == q("0Gi"));
        assert!(q("1.5") > q("1.25"));
        assert!(q("100") > q("99"));
    }

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

    fn q(s: &str) -> Quantity {
        match parse_quantity(s) {
            Ok(q) => q,
            Err(e) => panic!("{s:?} should parse: {e}"),
        }
    }

    fn milli(s: &str) -> i64 {
        q(s).to_milli_ceil().expect("milli in range")
    }

    fn units(s: &str) -> i64 {
        q(s).to_units_ceil().expect("units in range")
    }

    #[test]
    fn milli_values() {
        assert_eq!(milli("500m"), 500);
        assert_eq!(milli("1"), 1000);
        assert_eq!(milli("0.5"), 500);
        assert_eq!(milli(".5"), 500);
        assert_eq!(milli("5."), 5000);
        assert_eq!(milli("1E-3"), 1);
        assert_eq!(milli("0.1m"), 1);
        assert_eq!(milli("1500u"), 2);
        assert_eq!(milli("1n"), 1);
        assert_eq!(milli("2000m"), 2000);
        assert_eq!(milli("+250m"), 250);
        assert_eq!(milli("0"), 0);
        assert_eq!(milli("-0.0"), 0);
    }

    #[test]
    fn unit_values() {
        assert_eq!(units("1.5Gi"), 1_610_612_736);
        assert_eq!(units("16Gi"), 17_179_869_184);
        assert_eq!(units("1e3"), 1000);
        assert_eq!(units("12e+2"), 1200);
        assert_eq!(units("100k"), 100_000);
        assert_eq!(units("1M"), 1_000_000);
        assert_eq!(units("1Mi"), 1_048_576);
        assert_eq!(units("1Ki"), 1024);
        assert_eq!(units("1Ei"), 1 << 60);
        assert_eq!(units("2E"), 2_000_000_000_000_000_000);
        assert_eq!(units("500m"), 1);
        assert_eq!(units("1001m"), 2);
        assert_eq!(units("0.5Ki"), 512);
        assert_eq!(units("1.25Ki"), 1280);
        assert_eq!(units("007"), 7);
        assert_eq!(units("9223372036854775807"), i64::MAX);
    }

    #[test]
    fn negative_values_round_towards_positive_infinity() {
        let n = q("-1");
        assert!(n.is_negative());
        assert!(!n.is_zero());
        assert_eq!(n.to_milli_ceil(), Ok(-1000));
        assert_eq!(n.to_units_ceil(), Ok(-1));
        assert_eq!(units("-1.5"), -1);
        assert_eq!(milli("-0.1m"), 0);
        assert_eq!(units("-9223372036854775808"), i64::MIN);
        assert!(!q("-0").is_negative());
        assert!(q("-0").is_zero());
    }

    #[test]
    fn tiny_values_round_up() {
        assert_eq!(milli("1e-30"), 1);
        assert_eq!(units("1e-30"), 1);
        assert_eq!(milli("1e-999999999999999999999999"), 1);
        assert_eq!(milli("-1e-30"), 0);
        assert_eq!(
            milli("0.000000000000000000000000000000000000000000001Ei"),
            1
        );
        assert!(!q("1e-30").is_zero());
    }

    #[test]
    fn out_of_range() {
        for s in [
            "1e30",
            "9999999999Ei",
            "9223372036854775808",
            "-9223372036854775809",
            "1e999999999999999999999999",
            "8Ei",
        ] {
            assert_eq!(
                parse_quantity(s),
                Err(QuantityError::OutOfRange { input: s.into() }),
                "{s}"
            );
        }
        // Fits in units, but not in milli-units.
        let big = q("9223372036854775807");
        assert!(matches!(
            big.to_milli_ceil(),
            Err(QuantityError::OutOfRange { .. })
        ));
        assert_eq!(q("9e15").to_milli_ceil(), Ok(9_000_000_000_000_000_000));
        assert!(q("1e16").to_milli_ceil().is_err());
        assert_eq!(
            parse_quantity("1e30").unwrap_err().to_string(),
            "quantity \"1e30\" is out of range"
        );
    }

    #[test]
    fn malformed() {
        for s in [
            "", "1.0.0", "abc", "1 ", " 1", "1ki", "1e", "e3", "--1", ".", "-", "+", "1.5.",
            "1e3.5", "1e+", "1e-", "1Kib", "1KI", "1 Ki", "1_000", "1,5", "0x10", "1ee3", "1µ",
            "∞", "1é", "Ki", "m", "1mm", "1e3m",
        ] {
            match parse_quantity(s) {
                Err(QuantityError::Malformed { input, .. }) => assert_eq!(input, s),
                other => panic!("{s:?} should be malformed, got {other:?}"),
            }
        }
    }

    #[test]
    fn error_messages() {
        let msg = |s: &str| parse_quantity(s).unwrap_err().to_string();
        assert_eq!(
            msg("12x"),
            "malformed quantity \"12x\": unknown suffix \"x\""
        );
        assert_eq!(msg(""), "malformed quantity \"\": empty");
        assert_eq!(
            msg("1ki"),
            "malformed quantity \"1ki\": unknown suffix \"ki\""
        );
        assert_eq!(
            msg("1.0.0"),
            "malformed quantity \"1.0.0\": more than one decimal point"
        );
        assert_eq!(
            msg("1e"),
            "malformed quantity \"1e\": missing exponent digits in \"e\""
        );
        assert_eq!(
            msg("--1"),
            "malformed quantity \"--1\": expected a number, found '-'"
        );
        assert_eq!(
            msg(" 1"),
            "malformed quantity \" 1\": leading or trailing whitespace"
        );
    }

    #[test]
    fn value_equality_display_and_fromstr() {
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("1k"), q("1e3"));
        assert_eq!(q("1000m"), q("1"));
        assert_eq!(q("0.50"), q("500m"));
        assert_ne!(q("1M"), q("1Mi"));
        assert_eq!(q("0"), q("-0"));
        let parsed: Quantity = "1.5Gi".parse().unwrap();
        assert_eq!(parsed.to_string(), "1.5Gi");
        assert_eq!(parsed.as_str(), "1.5Gi");
        assert_eq!(q("+007.50").to_string(), "+007.50");
    }

    #[test]
    fn as_f64_values() {
        assert_eq!(q("500m").as_f64(), 0.5);
        assert_eq!(q("1.5Gi").as_f64(), 1_610_612_736.0);
        assert_eq!(q("-2k").as_f64(), -2000.0);
        assert_eq!(q("0").as_f64(), 0.0);
        assert_eq!(q("1e-30").as_f64(), 1e-30);
        assert_eq!(q("1E").as_f64(), 1e18);
    }

    #[test]
    fn no_panic_on_random_inputs() {
        let alphabet = [
            "0", "1", "9", ".", "+", "-", "e", "E", "K", "i", "m", "M", "G", "n", "µ", " ", "x",
        ];
        for s in random_strings(&alphabet, 20_000, 12) {
            if let Ok(v) = parse_quantity(&s) {
                let _ = (v.to_milli_ceil(), v.to_units_ceil(), v.as_f64());
                assert_eq!(v.to_string(), s);
            }
        }
    }

    #[test]
    fn no_panic_on_odd_inputs() {
        let long = "9".repeat(5000);
        let long_frac = format!("0.{}1", "0".repeat(5000));
        for s in [
            long.as_str(),
            long_frac.as_str(),
            "1e-9223372036854775808",
            "1e9223372036854775807",
            "0e999999999999",
            "0.0000Ei",
            "\u{0}",
            "1\u{301}",
            "ÿ",
        ] {
            if let Ok(v) = parse_quantity(s) {
                let _ = (v.to_milli_ceil(), v.to_units_ceil(), v.as_f64());
            }
        }
        assert_eq!(milli(&long_frac), 1);
        assert!(q("0e999999999999").is_zero());
    }
}
