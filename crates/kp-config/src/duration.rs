//! Go `time.Duration` values as they appear in flags and configuration files.
//!
//! Upstream kube-proxy reads `metav1.Duration` strings such as `30s`, `1m0s`,
//! `2h22m` or `300ms` and writes them back with Go's `Duration.String()`.
//! [`GoDuration`] parses and formats exactly those forms so a file written by
//! either implementation reads the same in the other.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A signed duration with nanosecond resolution, parsed and printed like Go's
/// `time.Duration`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration {
    nanos: i64,
}

/// Why a string is not a Go duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason} (valid examples: \"30s\", \"1m30s\", \"2h22m\", \"300ms\"; units are ns, us, ms, s, m, h)")]
pub struct DurationParseError {
    /// The text that was parsed.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

const NANOS_PER_MICRO: u64 = 1_000;
const NANOS_PER_MILLI: u64 = 1_000_000;
const NANOS_PER_SEC: u64 = 1_000_000_000;
const NANOS_PER_MIN: u64 = 60 * NANOS_PER_SEC;
const NANOS_PER_HOUR: u64 = 60 * NANOS_PER_MIN;

impl GoDuration {
    /// The zero duration, printed as `0s`.
    pub const ZERO: GoDuration = GoDuration { nanos: 0 };

    /// A duration of `nanos` nanoseconds (negative values are allowed, as in Go).
    pub const fn from_nanos(nanos: i64) -> Self {
        GoDuration { nanos }
    }

    /// A duration of whole milliseconds.
    pub const fn from_millis(millis: i64) -> Self {
        GoDuration {
            nanos: millis * NANOS_PER_MILLI as i64,
        }
    }

    /// A duration of whole seconds.
    pub const fn from_secs(secs: i64) -> Self {
        GoDuration {
            nanos: secs * NANOS_PER_SEC as i64,
        }
    }

    /// A duration of whole minutes.
    pub const fn from_mins(mins: i64) -> Self {
        GoDuration {
            nanos: mins * NANOS_PER_MIN as i64,
        }
    }

    /// A duration of whole hours.
    pub const fn from_hours(hours: i64) -> Self {
        GoDuration {
            nanos: hours * NANOS_PER_HOUR as i64,
        }
    }

    /// The signed number of nanoseconds.
    pub const fn as_nanos(self) -> i64 {
        self.nanos
    }

    /// True for the zero duration.
    pub const fn is_zero(self) -> bool {
        self.nanos == 0
    }

    /// True for durations below zero.
    pub const fn is_negative(self) -> bool {
        self.nanos < 0
    }

    /// The duration as a `std::time::Duration`, or `None` when it is negative.
    pub fn to_std(self) -> Option<Duration> {
        u64::try_from(self.nanos).ok().map(Duration::from_nanos)
    }

    /// Parses Go's duration syntax: an optional sign, then one or more decimal
    /// numbers (with optional fraction), each followed by a unit.
    pub fn parse(input: &str) -> Result<Self, DurationParseError> {
        let fail = |reason| DurationParseError {
            input: input.to_owned(),
            reason,
        };
        let (negative, body) = match input.as_bytes().first() {
            Some(b'-') => (true, &input[1..]),
            Some(b'+') => (false, &input[1..]),
            _ => (false, input),
        };
        if body == "0" {
            return Ok(GoDuration::ZERO);
        }
        if body.is_empty() {
            return Err(fail("empty duration"));
        }
        let mut total: u64 = 0;
        let mut rest = body;
        while !rest.is_empty() {
            let (nanos, after) = parse_component(rest).map_err(fail)?;
            total = total.checked_add(nanos).ok_or_else(|| fail("overflow"))?;
            rest = after;
        }
        signed_nanos(total, negative)
            .map(GoDuration::from_nanos)
            .ok_or_else(|| fail("overflow"))
    }
}

/// Parses one `<number><unit>` component, returning its nanoseconds and the rest.
fn parse_component(text: &str) -> Result<(u64, &str), &'static str> {
    let int_len = text.bytes().take_while(u8::is_ascii_digit).count();
    let (int_part, after_int) = text.split_at(int_len);
    let (frac_part, after_num) = match after_int.strip_prefix('.') {
        Some(after_dot) => {
            let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            after_dot.split_at(frac_len)
        }
        None => ("", after_int),
    };
    if int_part.is_empty() && frac_part.is_empty() {
        return Err("expected a number");
    }
    let unit_len = after_num
        .char_indices()
        .find(|(_, c)| c.is_ascii_digit() || *c == '.')
        .map_or(after_num.len(), |(i, _)| i);
    let (unit, rest) = after_num.split_at(unit_len);
    let scale = match unit {
        "" => return Err("missing unit"),
        "ns" => 1,
        "us" | "\u{00b5}s" | "\u{03bc}s" => NANOS_PER_MICRO,
        "ms" => NANOS_PER_MILLI,
        "s" => NANOS_PER_SEC,
        "m" => NANOS_PER_MIN,
        "h" => NANOS_PER_HOUR,
        _ => return Err("unknown unit"),
    };
    let whole: u64 = if int_part.is_empty() {
        0
    } else {
        int_part.parse().map_err(|_| "overflow")?
    };
    let mut nanos = whole.checked_mul(scale).ok_or("overflow")?;
    // The fraction contributes digit * scale / 10^k; digits beyond the unit's
    // resolution are dropped, as Go does.
    let mut divisor: u64 = 1;
    for digit in frac_part.bytes() {
        if divisor >= scale {
            break;
        }
        divisor *= 10;
        nanos = nanos
            .checked_add(u64::from(digit - b'0') * scale / divisor)
            .ok_or("overflow")?;
    }
    Ok((nanos, rest))
}

fn signed_nanos(total: u64, negative: bool) -> Option<i64> {
    if negative {
        // i64::MIN has no positive counterpart; Go accepts "-2562047h47m16.854775808s".
        if total == i64::MIN.unsigned_abs() {
            return Some(i64::MIN);
        }
        i64::try_from(total).ok().map(|n| -n)
    } else {
        i64::try_from(total).ok()
    }
}

/// Writes `value / 10^precision` with the fraction's trailing zeros removed.
fn write_fraction(out: &mut String, value: u64, precision: u32) {
    let scale = 10u64.pow(precision);
    out.push_str(&(value / scale).to_string());
    let frac = value % scale;
    if frac != 0 {
        let digits = format!("{frac:0width$}", width = precision as usize);
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
}

impl fmt::Display for GoDuration {
    /// Formats like Go's `time.Duration.String()`: `0s`, `300ms`, `1.5s`,
    /// `1m30s`, `24h0m0s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        if self.nanos < 0 {
            out.push('-');
        }
        let u = self.nanos.unsigned_abs();
        if u < NANOS_PER_SEC {
            match u {
                0 => out.push_str("0s"),
                1..1_000 => {
                    out.push_str(&u.to_string());
                    out.push_str("ns");
                }
                1_000..1_000_000 => {
                    write_fraction(&mut out, u, 3);
                    out.push_str("\u{00b5}s");
                }
                _ => {
                    write_fraction(&mut out, u, 6);
                    out.push_str("ms");
                }
            }
            return f.write_str(&out);
        }
        let hours = u / NANOS_PER_HOUR;
        let mins = (u / NANOS_PER_MIN) % 60;
        if hours > 0 {
            out.push_str(&format!("{hours}h"));
        }
        if u >= NANOS_PER_MIN {
            out.push_str(&format!("{mins}m"));
        }
        write_fraction(&mut out, u % NANOS_PER_MIN, 9);
        out.push('s');
        f.write_str(&out)
    }
}

impl FromStr for GoDuration {
    type Err = DurationParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GoDuration::parse(s)
    }
}

impl From<Duration> for GoDuration {
    /// Converts, saturating at Go's maximum duration (about 292 years).
    fn from(d: Duration) -> Self {
        GoDuration::from_nanos(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DurationVisitor)
    }
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = GoDuration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration string such as \"30s\", \"1m30s\" or \"300ms\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<GoDuration, E> {
        GoDuration::parse(v).map_err(E::custom)
    }

    /// An explicit `null` reads as the zero value, which defaulting then fills.
    fn visit_unit<E: de::Error>(self) -> Result<GoDuration, E> {
        Ok(GoDuration::ZERO)
    }

    fn visit_none<E: de::Error>(self) -> Result<GoDuration, E> {
        Ok(GoDuration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[track_caller]
    fn roundtrip(input: &str, formatted: &str) {
        let d = GoDuration::parse(input).unwrap();
        assert_eq!(d.to_string(), formatted, "formatting {input}");
        assert_eq!(
            GoDuration::parse(formatted).unwrap(),
            d,
            "reparsing {formatted}"
        );
    }

    #[test]
    fn parses_and_formats_like_go() {
        roundtrip("0", "0s");
        roundtrip("0s", "0s");
        roundtrip("30s", "30s");
        roundtrip("1m", "1m0s");
        roundtrip("90s", "1m30s");
        roundtrip("1m30s", "1m30s");
        roundtrip("2h22m", "2h22m0s");
        roundtrip("24h", "24h0m0s");
        roundtrip("300ms", "300ms");
        roundtrip("250ms", "250ms");
        roundtrip("1.5s", "1.5s");
        roundtrip("1.5ms", "1.5ms");
        roundtrip("1500us", "1.5ms");
        roundtrip("2µs", "2µs");
        roundtrip("7ns", "7ns");
        roundtrip("-1s", "-1s");
        roundtrip("+5m", "5m0s");
        roundtrip(".5h", "30m0s");
        roundtrip("1h1m1.001s", "1h1m1.001s");
    }

    #[test]
    fn rejects_what_go_rejects() {
        for bad in [
            "",
            "-",
            "s",
            "10",
            "1x",
            "1.s.",
            "1h-1m",
            "abc",
            "9999999999999999999h",
            ".",
        ] {
            let err = GoDuration::parse(bad).unwrap_err();
            assert_eq!(err.input, bad);
            assert!(err.to_string().contains("valid examples"), "{err}");
        }
    }

    #[test]
    fn extremes_do_not_overflow() {
        assert_eq!(
            GoDuration::parse("2562047h47m16.854775807s").unwrap(),
            GoDuration::from_nanos(i64::MAX)
        );
        assert_eq!(
            GoDuration::parse("-2562047h47m16.854775808s").unwrap(),
            GoDuration::from_nanos(i64::MIN)
        );
        assert_eq!(
            GoDuration::from_nanos(i64::MIN).to_string(),
            "-2562047h47m16.854775808s"
        );
        assert!(GoDuration::parse("2562047h47m16.854775808s").is_err());
    }

    #[test]
    fn converts_to_std_only_when_not_negative() {
        assert_eq!(
            GoDuration::from_secs(3).to_std(),
            Some(Duration::from_secs(3))
        );
        assert_eq!(GoDuration::from_secs(-3).to_std(), None);
    }
}
