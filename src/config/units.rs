//! Human units in config values and headers: durations (`250ms`, `30s`, `1m`, `1h`,
//! `3d`) and sizes (`64KiB`, `1MiB`). Pure parsing, exhaustively tested.

use std::time::Duration;

/// A value that is not a valid duration or size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// The text is not `<number><unit>`.
    #[error("invalid {kind} {given:?}: expected a whole number and a unit, like {example}")]
    Invalid {
        /// `duration` or `size`.
        kind: &'static str,
        /// What was given.
        given: String,
        /// A valid example.
        example: &'static str,
    },
    /// The number is too large to represent.
    #[error("{kind} {given:?} is too large")]
    TooLarge {
        /// `duration` or `size`.
        kind: &'static str,
        /// What was given.
        given: String,
    },
}

/// Parses a duration: a whole number followed by `ms`, `s`, `m`, `h` or `d`
/// (several parts may be joined: `1h30m`). A bare `0` is zero.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let (invalid, too_large) = errors("duration", text, "250ms, 30s, 1m, 1h, 3d");
    let s = text.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut total_ms: u64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(invalid());
        }
        let number: u64 = rest[..digits].parse().map_err(|_| too_large())?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let factor: u64 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(invalid()),
        };
        rest = &rest[unit_len..];
        total_ms = number
            .checked_mul(factor)
            .and_then(|ms| total_ms.checked_add(ms))
            .ok_or_else(&too_large)?;
    }
    Ok(Duration::from_millis(total_ms))
}

/// Parses a size: a whole number with an optional unit `B`, `KiB`, `MiB`, `GiB`
/// (binary) or `KB`, `MB`, `GB` (decimal). A bare number is bytes.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let (invalid, too_large) = errors("size", text, "64KiB, 1MiB, 512B");
    let s = text.trim();
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(invalid());
    }
    let number: u64 = s[..digits].parse().map_err(|_| too_large())?;
    let factor: u64 = match s[digits..].trim_start() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return Err(invalid()),
    };
    number.checked_mul(factor).ok_or_else(too_large)
}

/// The two errors of a `kind` of value given as `text`.
fn errors<'a>(
    kind: &'static str,
    text: &'a str,
    example: &'static str,
) -> (impl Fn() -> UnitError + 'a, impl Fn() -> UnitError + 'a) {
    let given = move || text.to_string();
    let invalid = move || UnitError::Invalid {
        kind,
        given: given(),
        example,
    };
    (invalid, move || UnitError::TooLarge { kind, given: given() })
}

/// Formats a duration the way config files write it (`1h`, `30s`, `250ms`), choosing the
/// largest unit that divides it exactly.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    if ms == 0 {
        return "0s".to_string();
    }
    for (unit, factor) in [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
        if ms.is_multiple_of(factor) {
            return format!("{}{unit}", ms / factor);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_every_unit() {
        let cases: &[(&str, u64)] = &[
            ("250ms", 250),
            ("30s", 30_000),
            ("1m", 60_000),
            ("1h", 3_600_000),
            ("3d", 259_200_000),
            ("72h", 259_200_000),
            ("1h30m", 5_400_000),
            ("0", 0),
            ("0s", 0),
            (" 5s ", 5_000),
        ];
        for (text, ms) in cases {
            assert_eq!(parse_duration(text), Ok(Duration::from_millis(*ms)), "{text}");
        }
    }

    #[test]
    fn bad_durations_are_errors() {
        for text in [
            "",
            "s",
            "10",
            "1.5s",
            "-1s",
            "10 s",
            "5sec",
            "1w",
            "ms",
            "1h 30m",
            "99999999999999999999s",
        ] {
            assert!(parse_duration(text).is_err(), "{text:?} should be rejected");
        }
        assert!(matches!(
            parse_duration("999999999999999d"),
            Err(UnitError::TooLarge { .. })
        ));
        let msg = parse_duration("5sec").unwrap_err().to_string();
        assert!(msg.contains("5sec") && msg.contains("30s"), "{msg}");
    }

    #[test]
    fn sizes_in_every_unit() {
        let cases: &[(&str, u64)] = &[
            ("1MiB", 1 << 20),
            ("64KiB", 64 << 10),
            ("2GiB", 2 << 30),
            ("512B", 512),
            ("512", 512),
            ("1KB", 1000),
            ("1kB", 1000),
            ("3MB", 3_000_000),
            ("1GB", 1_000_000_000),
            ("1 MiB", 1 << 20),
        ];
        for (text, n) in cases {
            assert_eq!(parse_size(text), Ok(*n), "{text}");
        }
    }

    #[test]
    fn bad_sizes_are_errors() {
        for text in ["", "MiB", "1.5MiB", "1mib", "1TiB", "-1", "ten", "99999999999999999999"] {
            assert!(parse_size(text).is_err(), "{text:?} should be rejected");
        }
        assert!(matches!(parse_size("99999999999GiB"), Err(UnitError::TooLarge { .. })));
    }

    #[test]
    fn durations_format_back_to_their_spelling() {
        for text in ["250ms", "30s", "1m", "1h", "3d", "0s", "90s"] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
    }
}
