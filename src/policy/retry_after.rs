//! Parsing of a receiver's `Retry-After` header (RFC 9110 §10.2.3): delay-seconds or an HTTP-date.

use std::time::{Duration, UNIX_EPOCH};

/// How long the receiver asked us to wait, measured from `now_ms` (unix millis).
///
/// Accepts a non-negative whole number of seconds (digits only; surrounding whitespace is
/// tolerated) or an HTTP-date in any of the three formats of RFC 9110 (IMF-fixdate, RFC 850,
/// asctime). A date in the past gives `Some(Duration::ZERO)`. Anything else (empty, signs,
/// fractions, garbage) gives `None`, so the caller falls back to its own backoff. Numbers too
/// large for `u64` seconds saturate rather than fail: the caller caps the wait anyway.
pub fn parse_retry_after(value: &str, now_ms: u64) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        // All digits, so the only possible parse failure is overflow.
        return Some(Duration::from_secs(value.parse::<u64>().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    // A date before 1970 is as past as any other.
    let at_ms = at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Some(Duration::from_millis(at_ms.saturating_sub(now_ms)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sun, 06 Nov 1994 08:49:37 GMT, the RFC's example date, in unix millis.
    const RFC_EXAMPLE_MS: u64 = 784_111_777_000;

    fn secs(s: u64) -> Option<Duration> {
        Some(Duration::from_secs(s))
    }

    #[test]
    fn delay_seconds() {
        let table: &[(&str, Option<Duration>)] = &[
            ("0", secs(0)),
            ("1", secs(1)),
            ("120", secs(120)),
            ("0007", secs(7)),
            ("86400", secs(86_400)),
            (" 30", secs(30)),
            ("30 ", secs(30)),
            ("\t30\t", secs(30)),
            ("18446744073709551615", secs(u64::MAX)),
        ];
        for (value, want) in table {
            assert_eq!(parse_retry_after(value, 5_000), *want, "{value:?}");
        }
    }

    #[test]
    fn delay_seconds_do_not_depend_on_now() {
        assert_eq!(parse_retry_after("60", 0), secs(60));
        assert_eq!(parse_retry_after("60", u64::MAX), secs(60));
    }

    #[test]
    fn huge_numbers_saturate() {
        assert_eq!(parse_retry_after("18446744073709551616", 0), secs(u64::MAX));
        assert_eq!(parse_retry_after(&"9".repeat(200), 0), secs(u64::MAX));
    }

    #[test]
    fn garbage_negatives_fractions_and_empty_are_rejected() {
        for value in [
            "",
            " ",
            "\t",
            "-1",
            "-0",
            "+5",
            "1.5",
            "0.0",
            ".5",
            "1e3",
            "0x10",
            "5s",
            "5 s",
            "1 2",
            "abc",
            "now",
            "Sun, 06 Nov 1994",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "٣",
            "1\u{0}",
            "\u{feff}5",
        ] {
            assert_eq!(parse_retry_after(value, RFC_EXAMPLE_MS), None, "{value:?}");
        }
    }

    #[test]
    fn imf_fixdate() {
        let now = RFC_EXAMPLE_MS - 90_000;
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now), secs(90));
        assert_eq!(parse_retry_after("  Sun, 06 Nov 1994 08:49:37 GMT  ", now), secs(90));
    }

    #[test]
    fn rfc850_date() {
        let now = RFC_EXAMPLE_MS - 1_000;
        assert_eq!(parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now), secs(1));
    }

    #[test]
    fn asctime_date() {
        let now = RFC_EXAMPLE_MS - 3_600_000;
        assert_eq!(parse_retry_after("Sun Nov  6 08:49:37 1994", now), secs(3600));
    }

    #[test]
    fn date_keeps_millisecond_precision_of_now() {
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", RFC_EXAMPLE_MS - 1_250),
            Some(Duration::from_millis(1_250))
        );
    }

    #[test]
    fn a_date_now_or_in_the_past_means_no_wait() {
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        assert_eq!(parse_retry_after(date, RFC_EXAMPLE_MS), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(date, RFC_EXAMPLE_MS + 1), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(date, u64::MAX), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", 1_700_000_000_000),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn a_far_future_date() {
        let got = parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", 0);
        assert_eq!(got, secs(253_402_300_799));
    }
}
