//! RFC 3339 timestamps for the admin API and alerts (UTC, second precision), and their
//! parsing for the admin API's `since`/`until` filters. Pure civil-calendar arithmetic.

/// Formats unix millis as `YYYY-MM-DDTHH:MM:SSZ` (UTC; millis appended when non-zero).
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    let (hh, mm, ss) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    let frac = match ms % 1000 {
        0 => String::new(),
        frac => format!(".{frac:03}"),
    };
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}{frac}Z")
}

/// Parses an RFC 3339 timestamp (`2026-11-30T12:00:00Z`, fractional seconds and numeric
/// offsets allowed) to unix millis.
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    let b = text.trim().as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = std::str::from_utf8(&b[r]).ok()?;
        s.bytes().all(|c| c.is_ascii_digit()).then(|| s.parse().ok())?
    };
    let (y, mo, d, h, mi, s) = (
        num(0..4)?,
        num(5..7)?,
        num(8..10)?,
        num(11..13)?,
        num(14..16)?,
        num(17..19)?,
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut i = 19;
    let mut millis = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
        let digits = std::str::from_utf8(&b[start..i.min(start + 3)]).ok()?;
        millis = digits.parse::<i64>().ok()? * 10i64.pow(3 - digits.len() as u32);
    }
    let offset_secs = match b.get(i..)? {
        [b'Z' | b'z'] => 0,
        // Digits checked like the date's: a `/` in an offset once underflowed a byte.
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (hh, mm) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if hh > 23 || mm > 59 {
                return None;
            }
            (hh * 3600 + mm * 60) * if *sign == b'+' { 1 } else { -1 }
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo as u32, d as u32);
    let total = (days * 86_400 + h * 3600 + mi * 60 + s - offset_secs) * 1000 + millis;
    u64::try_from(total).ok()
}

// Howard Hinnant's days-from-civil algorithms (public domain), proleptic Gregorian.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
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
