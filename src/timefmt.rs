//! RFC 3339 timestamps for the admin API and alerts (UTC, second precision, millis when
//! not whole), and their parsing for the admin API's `since`/`until` filters.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Formats unix millis as `YYYY-MM-DDTHH:MM:SSZ` (UTC; millis appended when non-zero).
/// Past the year 9999 (a setting of centuries added to now) it reads as that year's end.
pub fn rfc3339(ms: u64) -> String {
    let t = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::PrimitiveDateTime::MAX.assume_utc());
    let frac = match ms % 1000 {
        0 => String::new(),
        frac => format!(".{frac:03}"),
    };
    let (y, m, d) = (t.year(), u8::from(t.month()), t.day());
    let (hh, mm, ss) = (t.hour(), t.minute(), t.second());
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}{frac}Z")
}

/// Parses an RFC 3339 timestamp (`2026-11-30T12:00:00Z`, fractional seconds and numeric
/// offsets allowed, a space for the `T` as people type it) to unix millis.
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    let text = text.trim();
    let spaced = text.len() > 10 && text.as_bytes()[10] == b' ' && text.is_char_boundary(11);
    let t = match spaced {
        true => OffsetDateTime::parse(&format!("{}T{}", &text[..10], &text[11..]), &Rfc3339),
        false => OffsetDateTime::parse(text, &Rfc3339),
    };
    u64::try_from(t.ok()?.unix_timestamp_nanos() / 1_000_000).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants_format_and_parse() {
        let cases: &[(u64, &str)] = &[
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400_000, "2000-02-29T00:00:00Z"),
            (1_700_000_000_000, "2023-11-14T22:13:20Z"),
            (1_700_000_000_250, "2023-11-14T22:13:20.250Z"),
            (4_102_444_800_000, "2100-01-01T00:00:00Z"),
        ];
        for (ms, text) in cases {
            assert_eq!(rfc3339(*ms), *text);
            assert_eq!(parse_rfc3339(text), Some(*ms), "{text}");
        }
    }

    #[test]
    fn offsets_and_garbage() {
        assert_eq!(parse_rfc3339("2023-11-14T23:13:20+01:00"), Some(1_700_000_000_000));
        assert_eq!(parse_rfc3339("2023-11-14T21:13:20-01:00"), Some(1_700_000_000_000));
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20.5Z"), Some(1_700_000_000_500));
        assert_eq!(parse_rfc3339(" 2023-11-14 22:13:20z "), Some(1_700_000_000_000));
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59Z"), None, "before the epoch");
        assert!(
            rfc3339(u64::MAX).starts_with("9999-12-31T23:59:59."),
            "saturates, never panics"
        );
        for bad in [
            "",
            "2023-11-14",
            "2023-13-14T22:13:20Z",
            "2023-11-14T22:13:20",
            "yesterday",
            "2023-11-14T22:13:20+0100",
            "2023-11-14T22:13:20+/0:00",
            "2023-11-14T22:13:20+a0:00",
            "2023-11-14T22:13:20-01:/0",
            "2023-11-14T22:13:20+24:00",
            "2023-11-14T22:13:20+01:60",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
