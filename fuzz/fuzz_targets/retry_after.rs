//! Fuzzes the `Retry-After` parser: never panics, and a date never yields a wait longer
//! than the distance from `now` to the largest date it can express.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let now_ms = u64::from_le_bytes(data[..8].try_into().unwrap());
    let Ok(text) = std::str::from_utf8(&data[8..]) else {
        return;
    };
    let parsed = courier::policy::retry_after::parse_retry_after(text, now_ms);
    if let Some(wait) = parsed {
        if !text.trim().bytes().all(|b| b.is_ascii_digit()) {
            // An HTTP-date is at most year 9999.
            assert!(wait.as_secs() <= 253_402_300_799, "{text:?} -> {wait:?}");
        }
    }
});
