//! Text-to-value conversions shared by the file, environment and flag layers. Each returns
//! a problem sentence without the place; the caller adds the key, variable or flag.

use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use url::Url;

use super::units::parse_duration;
use crate::signing::scope::TargetPattern;

/// A duration (`30s`), as the file and the variables write it.
pub(super) fn parse_duration_text(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}

/// The URL parser's message, without the URL (it may carry a credential).
pub(super) fn parse_url(text: &str) -> Result<Url, String> {
    Url::parse(text.trim()).map_err(|e| format!("not a valid URL ({e})"))
}

/// A CIDR network, or a bare address meaning just that address (/32 or /128).
pub(super) fn parse_net(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("{text:?} is not an address or CIDR network, like 10.1.0.0/16 or 127.0.0.1"))
}

/// A signing target pattern (see [`crate::signing::scope`]).
pub(super) fn parse_target(text: &str) -> Result<TargetPattern, String> {
    TargetPattern::parse(text.trim())
}

/// A browser origin (`https://app.example`, `http://localhost:3000`), returned as its ASCII
/// serialization: what a browser sends in `Origin` (lowercase, IDNA, default port left out),
/// so the runtime compares it byte for byte with the lowercased header.
pub(super) fn parse_origin(text: &str) -> Result<String, String> {
    const HINT: &str = "an origin is scheme://host[:port], like https://app.example or http://localhost:3000";
    let text = text.trim();
    let bad = |why: &str| Err(format!("{text:?} is not an origin: {why} ({HINT})"));
    if text.contains('*') {
        return bad("wildcards are not supported");
    }
    // The parser's message without the text: a mistyped entry may carry a credential.
    let url = Url::parse(text).map_err(|e| format!("not an origin ({e}); {HINT}"))?;
    if !url.username().is_empty() || url.password().is_some() {
        let problem = format!("is not an origin: it has a user or password (value not shown); {HINT}");
        return Err(problem);
    }
    let why = if !matches!(url.scheme(), "http" | "https") {
        "the scheme must be http or https"
    } else if url.host_str().is_none_or(str::is_empty) {
        "it has no host"
    } else if url.path() != "/" {
        "it has a path"
    } else if url.query().is_some() || url.fragment().is_some() {
        "it has a query or fragment"
    } else {
        return Ok(url.origin().ascii_serialization());
    };
    bad(why)
}

/// An extra `Host` name: a DNS name or IP address, optionally with `:port` (IPv6 in
/// brackets when a port follows). Returned lowercased, without a trailing dot.
pub(super) fn parse_host_entry(text: &str) -> Result<String, String> {
    const HINT: &str = "write a name or address with an optional port, like app.example or 10.0.0.5:8787";
    let bad = |why: &str| Err(format!("{text:?} is not a host: {why} ({HINT})"));
    if text.is_empty() {
        return Err(format!("an empty entry is not a host ({HINT})"));
    }
    if text.contains(['/', '@']) {
        return bad("no scheme, path or user");
    }
    if text.contains(char::is_whitespace) {
        return bad("no spaces");
    }
    if text.contains('*') {
        return bad("wildcards are not supported");
    }
    let lower = text.to_ascii_lowercase();
    let (name, port) = if let Some(rest) = lower.strip_prefix('[') {
        let Some((v6, tail)) = rest.split_once(']') else {
            return bad("unclosed [");
        };
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return bad("not an IPv6 address in the brackets");
        }
        match tail {
            "" => (format!("[{v6}]"), None),
            _ => match tail.strip_prefix(':') {
                Some(port) => (format!("[{v6}]"), Some(port)),
                None => return bad("unexpected text after ]"),
            },
        }
    } else if lower.parse::<std::net::Ipv6Addr>().is_ok() {
        (lower.clone(), None)
    } else {
        let (name, port) = match lower.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (lower.as_str(), None),
        };
        if name.contains(':') {
            return bad("write an IPv6 address with a port in brackets, like [::1]:8787");
        }
        let name = name.strip_suffix('.').unwrap_or(name);
        let label_ok =
            |l: &str| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !name.split('.').all(label_ok) {
            return bad("a name is dot-separated labels of a-z 0-9 - _");
        }
        (name.to_string(), port)
    };
    match port {
        None => Ok(name),
        Some(port) => match port.parse::<u16>() {
            Ok(p) if p != 0 => Ok(format!("{name}:{p}")),
            _ => bad("the port must be a number from 1 to 65535"),
        },
    }
}

/// A `[[host]]` key as `crate::target::host_key` spells a live target's: lowercase, IDNA
/// to punycode, IPv6 in brackets. Text that is not `name:port` is kept for validation to
/// refuse with its own message.
pub(super) fn normalize_host_key(text: &str) -> String {
    let normalized = || {
        let (_, port) = text.rsplit_once(':')?;
        let url = Url::parse(&format!("http://{text}/")).ok()?;
        Some(format!("{}:{port}", url.host_str()?))
    };
    let normalized = super::validate::is_host_port(text).then(normalized).flatten();
    normalized.unwrap_or_else(|| text.to_string())
}

/// An `[[endpoint]]` key: an http(s) URL becomes the default endpoint key of that target
/// (`crate::target::default_endpoint_key`); any other key (set with `Courier-Endpoint`) is
/// kept as written.
pub(super) fn normalize_endpoint_key(text: &str) -> String {
    match Url::parse(text) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => {
            crate::target::default_endpoint_key(&url)
        }
        _ => text.to_string(),
    }
}
