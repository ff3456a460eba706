//! Go `time.ParseDuration` syntax for flags such as `--header-read-timeout=10s`, so values copied
//! from kubelet and kube-apiserver configurations (`2m0s`, `1h30m`, `500ms`) mean the same here.

use std::time::Duration;

/// Parses a Go duration string: an optional `+`, then one or more decimal numbers with a unit
/// (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), or the bare `0`. Negative durations are refused: no
/// setting of this proxy has a meaning for them.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid duration {text:?} (expected e.g. 30s, 2m0s, 1h30m, 500ms)");
    let s = text.strip_prefix('+').unwrap_or(text);
    if s.starts_with('-') {
        return Err(format!("negative duration {text:?} is not allowed"));
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut rest = s;
    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(invalid()),
        };
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && frac.is_empty()) || frac.contains('.') {
            return Err(invalid());
        }
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| invalid())?
        };
        let mut frac_nanos: u128 = 0;
        let mut scale = unit_nanos;
        for digit in frac.bytes().take(18) {
            scale /= 10;
            frac_nanos += u128::from(digit - b'0') * scale;
        }
        total_nanos = whole
            .checked_mul(unit_nanos)
            .and_then(|n| n.checked_add(frac_nanos))
            .and_then(|n| total_nanos.checked_add(n))
            .ok_or_else(invalid)?;
        rest = next;
    }
    let nanos = u64::try_from(total_nanos).map_err(|_| invalid())?;
    Ok(Duration::from_nanos(nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_forms() {
        let cases = [
            ("0", Duration::ZERO),
            ("10s", Duration::from_secs(10)),
            ("2m0s", Duration::from_secs(120)),
            ("1h30m", Duration::from_secs(5400)),
            ("500ms", Duration::from_millis(500)),
            ("1.5s", Duration::from_millis(1500)),
            (".5s", Duration::from_millis(500)),
            ("1.s", Duration::from_secs(1)),
            ("100us", Duration::from_micros(100)),
            ("100µs", Duration::from_micros(100)),
            ("7ns", Duration::from_nanos(7)),
            ("+3s", Duration::from_secs(3)),
            ("1m1.25s", Duration::from_millis(61_250)),
        ];
        for (text, want) in cases {
            assert_eq!(parse_go_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_bad_forms() {
        for text in [
            "",
            "10",
            "s",
            "1x",
            "1.2.3s",
            "-1s",
            "1 s",
            "..s",
            "99999999999999999999h",
        ] {
            assert!(
                parse_go_duration(text).is_err(),
                "{text:?} should be rejected"
            );
        }
    }
}
