//! Fuzzes control-header parsing: arbitrary `name: value` lines become a header map (as far
//! as `http` accepts them), then `Courier-*` headers are parsed and the forwardable rest is
//! filtered. Never panics, and nothing named `Courier-*` or `Proxy-*` is ever forwarded.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut headers = http::HeaderMap::new();
    for line in data.split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let value = value.strip_prefix(b" ").unwrap_or(value);
        let (Ok(name), Ok(value)) = (http::HeaderName::from_bytes(name), http::HeaderValue::from_bytes(value)) else {
            continue;
        };
        headers.append(name, value);
    }
    let _ = courier::headers::parse_control_headers(&headers);
    let _ = courier::headers::proxy_bearer(&headers);
    for (name, _) in courier::headers::forwardable_headers(&headers) {
        let lower = name.to_ascii_lowercase();
        assert!(!lower.starts_with("courier-") && !lower.starts_with("proxy-"), "{name}");
    }
});
