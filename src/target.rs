//! Where an ingress request goes: the four target forms of the contract (§2) resolved to
//! one validated `http`/`https` URL, plus the keys derived from it (endpoint key, host key).
//!
//! Pure: no DNS, no config access (routes come in as a lookup closure).
//!
//! The `url` crate follows the WHATWG parser, which is deliberately forgiving (`https:host`,
//! `https:///host`, backslashes as slashes, tabs silently removed, `user@` silently dropped).
//! A forgiving parser in front of an egress check is how request-smuggling and SSRF bugs are
//! born, because two parsers then disagree about which host is meant. So the text is checked
//! strictly *before* `url` sees it, and `url` is used only for the normalisation we want:
//! odd IPv4 spellings (`2130706433`, `0x7f.1`, `127.1`) become dotted quads, which the egress
//! policy then judges like any other literal address.
//!
//! Error messages never echo the target text: it may carry credentials or tokens in its
//! userinfo or query.

use percent_encoding::percent_decode_str;
use url::Url;

/// Longest target URL accepted, in bytes. It is stored with every message and part of the
/// dedupe key, so an unbounded one would be a cheap way to bloat the store.
pub const MAX_TARGET_LEN: usize = 8192;

// The refusals both the strict check of the text and the check of the parsed URL make.
const TOO_LONG: &str = "it is longer than 8192 bytes";
const CREDENTIALS: &str = "it contains credentials (user:password@); send them in an Authorization header instead";
const FRAGMENT: &str = "it contains a fragment (#...), which is never sent to a server";

/// A request's destination, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedTarget {
    /// The URL every attempt is sent to.
    pub url: Url,
    /// The name of the `[[route]]` it came from (form 4), whose signing settings apply.
    pub route: Option<String>,
}

/// Why a request's target could not be resolved. Each is a 400 at ingress.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// None of the four forms is present (e.g. `POST /`).
    #[error(
        "no target URL: send a Courier-Target header, an absolute-form request, a path like \
         /https://receiver.example/hooks, or /r/<route>"
    )]
    Missing,
    /// The target is present but is not an acceptable URL.
    #[error("invalid target URL: {0}")]
    Invalid(&'static str),
    /// The target's scheme is not `http` or `https`.
    #[error("unsupported target scheme {0:?}: only http and https targets are delivered")]
    UnsupportedScheme(String),
    /// `/r/<name>` names no configured route (an empty name when the path is just `/r/`).
    #[error("{}", unknown_route_message(.0))]
    UnknownRoute(String),
    /// `url` refused the text; its error names the part (port, host, IPv4 ...) without echoing it.
    #[error("invalid target URL: {0}")]
    Unparsable(url::ParseError),
}

impl TargetError {
    /// The machine-readable code of the ingress error answer.
    pub fn code(&self) -> &'static str {
        match self {
            TargetError::Missing => "missing_target",
            TargetError::Invalid(_) | TargetError::Unparsable(_) => "invalid_target",
            TargetError::UnsupportedScheme(_) => "unsupported_scheme",
            TargetError::UnknownRoute(_) => "unknown_route",
        }
    }
}

/// Resolves a request's target from, in order: the `Courier-Target` header value, an
/// absolute-form request target, the path form (`/https://host/path?q`, also percent-encoded
/// or with the `https:/host` slash collapse), or a named route (`/r/<name>[/<extra>][?q]`).
///
/// `routes` maps a route name to its configured URL.
///
/// HTTP/2 requests always carry a scheme and authority in their URI (from the `:scheme` and
/// `:authority` pseudo-headers); the caller must pass only their path-and-query, or every
/// HTTP/2 request would look like an absolute-form request addressed to courier itself.
pub fn resolve_target(
    courier_target: Option<&str>,
    uri: &http::Uri,
    routes: &dyn Fn(&str) -> Option<Url>,
) -> Result<ResolvedTarget, TargetError> {
    let direct = |url| Ok(ResolvedTarget { url, route: None });
    if let Some(text) = courier_target {
        let text = text.trim_matches(|c| c == ' ' || c == '\t');
        if text.is_empty() {
            return Err(TargetError::Invalid("the Courier-Target header is empty"));
        }
        return direct(parse_target(text, false)?);
    }
    if uri.scheme().is_some() {
        return direct(parse_target(&uri.to_string(), false)?);
    }
    let path_and_query = uri.path_and_query().map(|pq| pq.as_str()).unwrap_or("");
    let rest = path_and_query.strip_prefix('/').unwrap_or(path_and_query);
    if let Some(scheme_len) = scheme_prefix_len(rest) {
        let after = &rest[scheme_len..];
        if after.starts_with(':') {
            return direct(parse_target(rest, true)?);
        }
        // Compare bytes: the path may hold non-ASCII, and slicing the str at byte 3 could
        // split a character (a panic found by fuzzing; see the regression test).
        if after
            .as_bytes()
            .get(..3)
            .is_some_and(|p| p.eq_ignore_ascii_case(b"%3a"))
        {
            let decoded = percent_decode_str(rest)
                .decode_utf8()
                .map_err(|_| TargetError::Invalid("the percent-encoded target is not valid UTF-8"))?;
            return direct(parse_target(&decoded, true)?);
        }
    }
    if rest == "r" || rest.starts_with("r/") || rest.starts_with("r?") {
        return resolve_route(uri, routes);
    }
    Err(TargetError::Missing)
}

/// The endpoint key used when the app sends no `Courier-Endpoint`: the target URL without
/// its query (and fragment), in `url`'s normal form.
pub fn default_endpoint_key(url: &Url) -> String {
    // Without a query or fragment the key is the URL's own text: `set_query` re-serialises
    // the whole URL, once per accepted message.
    if url.query().is_none() && url.fragment().is_none() {
        return url.as_str().to_string();
    }
    let mut key = url.clone();
    key.set_query(None);
    key.set_fragment(None);
    key.to_string()
}

/// `host:port` of a target, the unit of the per-host in-flight limit: the port filled in
/// from the scheme when absent, so `https://a.example` and `https://a.example:443` share a
/// limit; IPv6 literals in brackets.
pub fn host_key(url: &Url) -> String {
    host_port(url.host_str().unwrap_or(""), url.port_or_known_default())
}

/// `host:port` (or `host` without a port), lowercased, in one allocation: the key hosts are
/// counted under, here and by the connection cap (`outbound::conn_cap`).
pub fn host_port(host: &str, port: Option<u16>) -> String {
    let mut key = String::with_capacity(host.len() + 6);
    key.push_str(host);
    key.make_ascii_lowercase();
    if let Some(port) = port {
        key.push(':');
        key.push_str(itoa::Buffer::new().format(port));
    }
    key
}

/// Length of the RFC 3986 scheme at the start of `s` (`ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )`),
/// if it starts with one.
fn scheme_prefix_len(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    if !bytes.first()?.is_ascii_alphabetic() {
        return None;
    }
    Some(
        bytes
            .iter()
            .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
            .count(),
    )
}

/// Targets parsed lately on this thread, in a small table indexed by their text's hash (a
/// slot holds the last target that hashed to it): an app sends to a handful of receivers,
/// and checking and parsing one (`url`'s WHATWG parser, IDNA) cost about 8,000 instructions,
/// 4% of a delivered message's (docs/benchmarks.md, issue 43, step 8). Bounded whatever the
/// texts (64 slots of at most [`MAX_TARGET_LEN`] bytes and their URL per thread); a miss
/// costs one parse, as before. Only URLs are kept, never a refusal.
const MEMO_SLOTS: usize = 64;

/// One slot of the table: the text, whether it came from the path, its URL.
type Memo = Option<(Box<str>, bool, Url)>;

thread_local! {
    static PARSED: (foldhash::fast::RandomState, std::cell::RefCell<Vec<Memo>>) =
        (Default::default(), std::cell::RefCell::new(vec![None; MEMO_SLOTS]));
}

/// [`parse_strictly`], remembered per thread (it is a pure function of its arguments).
fn parse_target(text: &str, from_path: bool) -> Result<Url, TargetError> {
    use std::hash::BuildHasher;
    PARSED.with(|(hasher, table)| {
        let slot = hasher.hash_one((text, from_path)) as usize % MEMO_SLOTS;
        let hit = |m: &Memo| matches!(m, Some((t, f, _)) if **t == *text && *f == from_path);
        if let Some((_, _, url)) = table.borrow().get(slot).filter(|m| hit(m)).and_then(Option::as_ref) {
            return Ok(url.clone());
        }
        let url = parse_strictly(text, from_path)?;
        table.borrow_mut()[slot] = Some((text.into(), from_path, url.clone()));
        Ok(url)
    })
}

/// Checks a target strictly, then parses it. `from_path` allows the `https:/host` form that
/// some proxies produce by merging the double slash of a URL carried in a path.
fn parse_strictly(text: &str, from_path: bool) -> Result<Url, TargetError> {
    if text.len() > MAX_TARGET_LEN {
        return Err(TargetError::Invalid(TOO_LONG));
    }
    if text.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(TargetError::Invalid("it contains whitespace or control characters"));
    }
    let scheme_len = match scheme_prefix_len(text) {
        Some(n) if text[n..].starts_with(':') => n,
        _ => return Err(TargetError::Invalid("it does not start with http:// or https://")),
    };
    let scheme = text[..scheme_len].to_ascii_lowercase();
    let after_colon = &text[scheme_len + 1..];
    if scheme != "http" && scheme != "https" {
        if after_colon.starts_with(|c: char| c.is_ascii_digit()) {
            // `localhost:8080/x` reads as scheme "localhost"; the mistake is the missing scheme.
            return Err(TargetError::Invalid(
                "it has no scheme (write http:// or https:// before the host)",
            ));
        }
        let mut shown = scheme;
        shown.truncate(32);
        return Err(TargetError::UnsupportedScheme(shown));
    }
    let (hier, collapsed) = if let Some(h) = after_colon.strip_prefix("//") {
        (h, false)
    } else if let Some(h) = after_colon.strip_prefix('/').filter(|_| from_path) {
        (h, true)
    } else {
        return Err(TargetError::Invalid("the scheme must be followed by // and a host"));
    };
    let authority_end = hier.find(['/', '?', '#']).unwrap_or(hier.len());
    let authority = &hier[..authority_end];
    if authority.is_empty() {
        return Err(TargetError::Invalid("it has no host"));
    }
    if authority.contains('@') {
        return Err(TargetError::Invalid(CREDENTIALS));
    }
    let before_query = &hier[..hier.find('?').unwrap_or(hier.len())];
    if before_query.contains('\\') {
        return Err(TargetError::Invalid("it contains a backslash before the query"));
    }
    if hier.contains('#') {
        return Err(TargetError::Invalid(FRAGMENT));
    }
    let url = if collapsed {
        Url::parse(&format!("{scheme}://{hier}"))
    } else {
        Url::parse(text)
    }
    .map_err(TargetError::Unparsable)?;
    validate_parsed(&url)?;
    Ok(url)
}

/// Checks that hold for every resolved URL, including route URLs built by joining.
fn validate_parsed(url: &Url) -> Result<(), TargetError> {
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(TargetError::UnsupportedScheme(url.scheme().to_string()));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(TargetError::Invalid("it has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(TargetError::Invalid(CREDENTIALS));
    }
    if url.fragment().is_some() {
        return Err(TargetError::Invalid(FRAGMENT));
    }
    if url.port() == Some(0) {
        return Err(TargetError::Invalid("port 0 cannot be connected to"));
    }
    if url.as_str().len() > MAX_TARGET_LEN {
        return Err(TargetError::Invalid(TOO_LONG));
    }
    Ok(())
}

/// Form 4: `/r/<name>[/<extra path>][?query]` joined onto the route's URL.
fn resolve_route(uri: &http::Uri, routes: &dyn Fn(&str) -> Option<Url>) -> Result<ResolvedTarget, TargetError> {
    let after = uri.path().strip_prefix("/r").unwrap_or("");
    let after = after.strip_prefix('/').unwrap_or(after);
    let (raw_name, extra) = match after.find('/') {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, ""),
    };
    if raw_name.is_empty() {
        return Err(TargetError::UnknownRoute(String::new()));
    }
    let name = percent_decode_str(raw_name)
        .decode_utf8()
        .map_err(|_| TargetError::Invalid("the route name is not valid UTF-8"))?;
    let Some(base) = routes(&name) else {
        let mut shown: String = name.chars().take(64).collect();
        if shown.len() < name.len() {
            shown.push('…');
        }
        return Err(TargetError::UnknownRoute(shown));
    };
    let extra = extra.trim_start_matches('/');
    // A backslash is a slash to the URL parser (`..\admin` would climb): refused. An
    // encoded slash stays data (`a%2Fb`), but a receiver may decode it, so a dot segment
    // between encoded separators is refused like a plain one.
    if extra.contains('\\') {
        return Err(TargetError::Invalid(
            "the extra path after the route name contains a backslash",
        ));
    }
    let decoded_separators = extra.to_ascii_lowercase().replace("%2f", "/").replace("%5c", "/");
    if decoded_separators.split('/').any(is_dot_segment) {
        // `..` would let a caller step outside the path prefix the operator configured.
        return Err(TargetError::Invalid(
            "the extra path after the route name contains . or .. segments",
        ));
    }
    let mut url = base.clone();
    if !extra.is_empty() || after.len() > raw_name.len() {
        let joined = format!("{}/{extra}", base.path().trim_end_matches('/'));
        url.set_path(&joined);
    }
    let request_query = uri.query().filter(|q| !q.is_empty());
    match (base.query().filter(|q| !q.is_empty()), request_query) {
        (Some(own), Some(req)) => url.set_query(Some(&format!("{own}&{req}"))),
        (None, Some(req)) => url.set_query(Some(req)),
        (own, None) => url.set_query(own),
    }
    validate_parsed(&url)?;
    Ok(ResolvedTarget {
        url,
        route: Some(name.into_owned()),
    })
}

fn unknown_route_message(name: &str) -> String {
    if name.is_empty() {
        "the path /r/ must be followed by a route name, like /r/billing".to_string()
    } else {
        format!("no route named {name:?} is configured")
    }
}

fn is_dot_segment(segment: &str) -> bool {
    let lower = segment.to_ascii_lowercase();
    matches!(lower.as_str(), "." | ".." | "%2e" | "%2e%2e" | ".%2e" | "%2e.")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes(name: &str) -> Option<Url> {
        let url = match name {
            "billing" => "https://b.example/hooks",
            "slash" => "https://s.example/hooks/",
            "root" => "https://root.example",
            "q" => "https://q.example/in?key=abc",
            "ünï" => "https://u.example/x",
            _ => return None,
        };
        Some(Url::parse(url).unwrap())
    }

    fn resolve(header: Option<&str>, uri: &str) -> Result<ResolvedTarget, TargetError> {
        let uri: http::Uri = uri.parse().unwrap();
        resolve_target(header, &uri, &routes)
    }

    /// The per-thread table answers exactly what a fresh parse does: for more texts than it
    /// has slots (so texts evict each other), each asked several times, in both forms (the
    /// collapsed `https:/host` is valid only from the path), refusals among them.
    #[test]
    fn remembered_parses_answer_what_a_fresh_parse_does() {
        let mut texts: Vec<String> = (0..3 * MEMO_SLOTS)
            .map(|i| format!("https://h{}.example:{}/p?{i}", i % 7, 8000 + i))
            .collect();
        texts.extend(
            [
                "https:/collapsed.example/x",
                "ftp://a.example/",
                "https://u@a.example/",
                "http://0x7f.1/",
            ]
            .map(String::from),
        );
        for round in 0..3 {
            for text in texts.iter().rev().skip(round) {
                for from_path in [false, true] {
                    assert_eq!(
                        parse_target(text, from_path),
                        parse_strictly(text, from_path),
                        "{text} {from_path}"
                    );
                }
            }
        }
        assert_eq!(
            parse_target("http://0x7f.1/", true).unwrap().as_str(),
            "http://127.0.0.1/"
        );
    }

    #[test]
    fn every_form_resolves() {
        let cases: &[(Option<&str>, &str, &str, Option<&str>)] = &[
            // 1: header, which wins over everything else
            (
                Some("https://receiver.example/hooks?x=1"),
                "/",
                "https://receiver.example/hooks?x=1",
                None,
            ),
            (
                Some("https://h.example/a"),
                "/https://other.example/",
                "https://h.example/a",
                None,
            ),
            (Some("https://h.example/a"), "/r/billing", "https://h.example/a", None),
            (Some("  http://h.example  "), "/", "http://h.example/", None),
            (Some("HTTPS://H.Example:443/A"), "/", "https://h.example/A", None),
            (Some("http://h.example:8080"), "/", "http://h.example:8080/", None),
            (
                Some("https://[2001:4860::8888]:8443/x"),
                "/",
                "https://[2001:4860::8888]:8443/x",
                None,
            ),
            (
                Some("https://bücher.example/"),
                "/",
                "https://xn--bcher-kva.example/",
                None,
            ),
            (
                Some("https://h.example/a%20b?q=%2F"),
                "/",
                "https://h.example/a%20b?q=%2F",
                None,
            ),
            // 2: absolute-form
            (
                None,
                "http://receiver.example/hooks",
                "http://receiver.example/hooks",
                None,
            ),
            (
                None,
                "http://receiver.example:9000/h?a=b",
                "http://receiver.example:9000/h?a=b",
                None,
            ),
            // 3: path form
            (None, "/https://r.example/h?x=1", "https://r.example/h?x=1", None),
            (None, "/http://r.example", "http://r.example/", None),
            (
                None,
                "/https://r.example/a/b/c?x=1&y=2",
                "https://r.example/a/b/c?x=1&y=2",
                None,
            ),
            (None, "/https%3A%2F%2Fr.example%2Fh", "https://r.example/h", None),
            (
                None,
                "/https%3a%2f%2fr.example%2fh%3Fx%3D1",
                "https://r.example/h?x=1",
                None,
            ),
            (
                None,
                "/https%3A%2F%2Fr.example%2Fh?x=1",
                "https://r.example/h?x=1",
                None,
            ),
            (None, "/https:/r.example/h", "https://r.example/h", None),
            (None, "/http:/r.example", "http://r.example/", None),
            (None, "/HTTPS://R.EXAMPLE/h", "https://r.example/h", None),
            (None, "/https://127.0.0.1:8080/x", "https://127.0.0.1:8080/x", None),
            (None, "/https://[::1]/x", "https://[::1]/x", None),
            // odd IPv4 spellings normalise (the egress policy then refuses them)
            (None, "/http://2130706433/", "http://127.0.0.1/", None),
            (None, "/http://0x7f.1/", "http://127.0.0.1/", None),
            (None, "/http://0177.0.0.1/", "http://127.0.0.1/", None),
            (None, "/http://127.1/", "http://127.0.0.1/", None),
            // 4: routes
            (None, "/r/billing", "https://b.example/hooks", Some("billing")),
            (
                None,
                "/r/billing/x?y=1",
                "https://b.example/hooks/x?y=1",
                Some("billing"),
            ),
            (None, "/r/billing?y=1", "https://b.example/hooks?y=1", Some("billing")),
            (None, "/r/billing/", "https://b.example/hooks/", Some("billing")),
            (None, "/r/billing//x", "https://b.example/hooks/x", Some("billing")),
            (None, "/r/billing/a/b/", "https://b.example/hooks/a/b/", Some("billing")),
            (None, "/r/slash", "https://s.example/hooks/", Some("slash")),
            (None, "/r/slash/x", "https://s.example/hooks/x", Some("slash")),
            (None, "/r/root", "https://root.example/", Some("root")),
            (None, "/r/root/x", "https://root.example/x", Some("root")),
            (None, "/r/q", "https://q.example/in?key=abc", Some("q")),
            (None, "/r/q?y=1", "https://q.example/in?key=abc&y=1", Some("q")),
            (
                None,
                "/r/q/x?y=1&z=2",
                "https://q.example/in/x?key=abc&y=1&z=2",
                Some("q"),
            ),
            (None, "/r/billing?", "https://b.example/hooks", Some("billing")),
            (None, "/r/%C3%BCn%C3%AF/p", "https://u.example/x/p", Some("ünï")),
            (
                None,
                "/r/billing/a%2Fb",
                "https://b.example/hooks/a%2Fb",
                Some("billing"),
            ),
        ];
        for (header, uri, want, route) in cases {
            let got = resolve(*header, uri).unwrap_or_else(|e| panic!("{header:?} {uri}: {e}"));
            assert_eq!(got.url.as_str(), *want, "{header:?} {uri}");
            assert_eq!(got.route.as_deref(), *route, "{header:?} {uri}");
        }
    }

    #[test]
    fn malformed_targets_are_refused_with_their_code() {
        let cases: &[(Option<&str>, &str, &str)] = &[
            (None, "/", "missing_target"),
            (None, "/hooks", "missing_target"),
            (None, "/receiver.example/hooks", "missing_target"),
            (None, "/?x=1", "missing_target"),
            (None, "/rr/billing", "missing_target"),
            (None, "/r/nope", "unknown_route"),
            (None, "/r/nope/x?y=1", "unknown_route"),
            (None, "/r/", "unknown_route"),
            (None, "/r", "unknown_route"),
            (None, "/r/Billing", "unknown_route"),
            (None, "/ftp://r.example/x", "unsupported_scheme"),
            (None, "/file:///etc/passwd", "unsupported_scheme"),
            (None, "/ws://r.example/x", "unsupported_scheme"),
            (None, "/wss://r.example/x", "unsupported_scheme"),
            (None, "/javascript:alert(1)", "unsupported_scheme"),
            (None, "/gopher://r.example/", "unsupported_scheme"),
            (None, "/ftp%3A%2F%2Fr.example", "unsupported_scheme"),
            (None, "ftp://r.example/x", "unsupported_scheme"),
            (Some("data:text/plain,hi"), "/", "unsupported_scheme"),
            (Some("mailto:a@b.example"), "/", "unsupported_scheme"),
            (Some("file:///etc/passwd"), "/", "unsupported_scheme"),
            (Some(""), "/", "invalid_target"),
            (Some("   "), "/", "invalid_target"),
            (Some("receiver.example/hooks"), "/", "invalid_target"),
            (Some("localhost:8080/x"), "/", "invalid_target"),
            (Some("//receiver.example/hooks"), "/", "invalid_target"),
            (Some("https://"), "/", "invalid_target"),
            (Some("https:///x"), "/", "invalid_target"),
            (Some("https:r.example"), "/", "invalid_target"),
            (Some("https:/r.example"), "/", "invalid_target"),
            (Some("http://:80/"), "/", "invalid_target"),
            (Some("https://?x"), "/", "invalid_target"),
            (Some("https://user:pw@r.example/"), "/", "invalid_target"),
            (Some("https://user@r.example/"), "/", "invalid_target"),
            (Some("https://@r.example/"), "/", "invalid_target"),
            (Some("https://r.example/#frag"), "/", "invalid_target"),
            (Some("https://r.example/#"), "/", "invalid_target"),
            (Some("https://r.example/a b"), "/", "invalid_target"),
            (Some("https://r.exa\tmple/"), "/", "invalid_target"),
            (Some("https://r.example/\n"), "/", "invalid_target"),
            (Some("https://r.example/\u{7f}"), "/", "invalid_target"),
            (Some("https://r.example\\@evil.example/"), "/", "invalid_target"),
            (Some("https:\\\\r.example/"), "/", "invalid_target"),
            (Some("https://r.example:99999/"), "/", "invalid_target"),
            (Some("https://r.example:0/"), "/", "invalid_target"),
            (Some("https://r.example:port/"), "/", "invalid_target"),
            (Some("https://[::1/"), "/", "invalid_target"),
            (Some("https://[zz::1]/"), "/", "invalid_target"),
            (Some("https://256.0.0.1/"), "/", "invalid_target"),
            (Some("https://r%00.example/"), "/", "invalid_target"),
            (Some("https://exa<mple.com/"), "/", "invalid_target"),
            (None, "/https:///r.example", "invalid_target"),
            (None, "/https://user:pw@r.example/", "invalid_target"),
            (None, "/https%3A%2F%2Fr.example%2F%23frag", "invalid_target"),
            (None, "/https%3A%2F%2Fr.example%2F%0A", "invalid_target"),
            (None, "/https%3A%2F%2Fr.example%2F%FF", "invalid_target"),
            (None, "/https%3A%2F%2Fu%3Ap%40r.example%2F", "invalid_target"),
            (None, "/r/billing/../admin", "invalid_target"),
            (None, "/r/billing/a/%2E%2E/admin", "invalid_target"),
            (None, "/r/billing/./x", "invalid_target"),
            (None, "/r/billing/..%5Cadmin", "invalid_target"),
            (None, "/r/billing/a%2F..%2Fadmin", "invalid_target"),
            (None, "/r/%FF", "invalid_target"),
            (None, "http://user:pw@r.example/", "invalid_target"),
        ];
        for (header, uri, code) in cases {
            let err = resolve(*header, uri).expect_err(&format!("{header:?} {uri} should fail"));
            assert_eq!(err.code(), *code, "{header:?} {uri}: {err}");
        }
        assert!(cases.len() >= 25);
    }

    #[test]
    fn too_long_targets_are_refused() {
        let long = format!("https://r.example/{}", "a".repeat(MAX_TARGET_LEN));
        assert_eq!(resolve(Some(&long), "/").unwrap_err().code(), "invalid_target");
    }

    #[test]
    fn messages_are_sentences_that_never_echo_credentials() {
        for text in [
            "https://user:hunter2@r.example/",
            "ftp://user:hunter2@r.example/",
            "https://user:hunter2@r.example:99999/",
            "https://r.example/?token=hunter2#x",
        ] {
            let err = resolve(Some(text), "/").unwrap_err();
            let msg = err.to_string();
            assert!(!msg.contains("hunter2"), "{msg}");
            assert!(msg.len() > 20, "{msg}");
        }
        let msg = resolve(None, "/r/nope").unwrap_err().to_string();
        assert!(msg.contains("\"nope\""), "{msg}");
        let msg = resolve(None, "/ftp://x.example").unwrap_err().to_string();
        assert!(msg.contains("\"ftp\"") && msg.contains("http"), "{msg}");
        assert!(resolve(None, "/").unwrap_err().to_string().contains("Courier-Target"));
    }

    #[test]
    fn endpoint_key_drops_query_and_fragment() {
        let cases = [
            ("https://r.example/h?x=1", "https://r.example/h"),
            ("https://r.example/h", "https://r.example/h"),
            ("https://r.example", "https://r.example/"),
            ("https://r.example:8443/a/b?x#y", "https://r.example:8443/a/b"),
            ("https://R.Example:443/h?", "https://r.example/h"),
            ("https://r.example/h#f", "https://r.example/h"),
        ];
        for (url, key) in cases {
            assert_eq!(default_endpoint_key(&Url::parse(url).unwrap()), key, "{url}");
        }
    }

    #[test]
    fn host_key_fills_in_the_default_port() {
        let cases = [
            ("https://r.example/h", "r.example:443"),
            ("http://r.example/h", "r.example:80"),
            ("https://r.example:8443/", "r.example:8443"),
            ("http://r.example:443/", "r.example:443"),
            ("https://R.EXAMPLE/", "r.example:443"),
            ("https://127.0.0.1/", "127.0.0.1:443"),
            ("http://[::1]:8080/", "[::1]:8080"),
            ("https://[2001:db8::1]/", "[2001:db8::1]:443"),
        ];
        for (url, key) in cases {
            assert_eq!(host_key(&Url::parse(url).unwrap()), key, "{url}");
        }
    }

    /// Found by fuzzing (`fuzz/`, target `target_parse`): a path whose third byte after a
    /// scheme-like prefix falls inside a multi-byte character panicked on a str slice.
    #[test]
    fn non_ascii_paths_never_panic() {
        let no_routes = |_: &str| None;
        for path in [
            "/r/'\u{661}*",
            "/r/x\u{e9}",
            "/a/x\u{e9}",
            "/http\u{e9}",
            "/h:\u{e9}",
            "/x%3\u{e9}",
        ] {
            let uri: http::Uri = path.parse().unwrap_or_else(|e| panic!("{path}: {e}"));
            let got = resolve_target(None, &uri, &no_routes);
            assert!(got.is_err(), "{path}: {got:?}");
        }
    }
}
