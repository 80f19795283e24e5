//! Where a named signing key may sign: target patterns like `https://*.billing.example/*`.
//!
//! Why this exists: whoever can reach ingress can name any key in `[signing.keys]` with
//! `Courier-Signing-Key`. Without a scope, a caller who may send to its own receiver could
//! name a partner's key, have an arbitrary payload signed with it, and replay the signed
//! request to the partner. A key bound to `targets` signs only for those targets, so the
//! worst such a caller gets is a signature the partner's receiver never sees.
//!
//! A pattern is `scheme://host[:port]/path`:
//! - the scheme matches exactly (`http` or `https`);
//! - the host matches exactly (case-insensitively, after the same normalisation as live
//!   targets: IDNA, lowercase), or `*.suffix` matches any name *under* `suffix` (one or more
//!   labels; not `suffix` itself); a `*` never spans into the port or the path;
//! - the port, when written, must equal the target's (default ports included); when left
//!   out, only the scheme's default port matches;
//! - the path is a glob in which `*` matches any run of characters (slashes included);
//!   a pattern without a path (`https://x.example`) means `/*`. The query is not matched.
//!   A target whose path holds an encoded slash or backslash (`%2F`, `%5C`) matches no
//!   pattern: the receiver may decode it into a path the glob never saw.
//!
//! Pure: no I/O.

use url::Url;

/// One parsed target pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetPattern {
    text: String,
    scheme: String,
    /// Exact host, or the suffix after `*.` when `wildcard`.
    host: String,
    wildcard: bool,
    port: u16,
    path: String,
}

impl TargetPattern {
    /// Parses a pattern; the error is a sentence naming what is wrong.
    pub fn parse(text: &str) -> Result<TargetPattern, String> {
        let bad =
            |why: &str| format!("{text:?} is not a target pattern ({why}); write e.g. \"https://*.billing.example/*\"");
        let (scheme, rest) = text.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return Err(bad("the scheme must be http or https"));
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/*"),
        };
        if authority.contains('@') || path.contains('?') || path.contains('#') {
            return Err(bad("no user, query or fragment"));
        }
        let (wildcard, host_part) = match authority.strip_prefix("*.") {
            Some(suffix) => (true, suffix),
            None => (false, authority),
        };
        if host_part.contains('*') {
            return Err(bad("`*` is allowed only as the first label of the host"));
        }
        // Let the URL parser normalise the host and port exactly as it does for live targets.
        let probe = Url::parse(&format!("{scheme}://{host_part}/")).map_err(|e| bad(&format!("bad host: {e}")))?;
        let host = probe
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no host"))?;
        Ok(TargetPattern {
            text: text.to_string(),
            scheme,
            host: host.to_string(),
            wildcard,
            port: probe.port_or_known_default().unwrap_or_default(),
            path: path.to_string(),
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `target` is inside this pattern.
    pub fn matches(&self, target: &Url) -> bool {
        if target.scheme() != self.scheme {
            return false;
        }
        let Some(host) = target.host_str() else {
            return false;
        };
        let host_ok = match host.strip_suffix(&self.host) {
            Some(under) if self.wildcard => under.len() > 1 && under.ends_with('.'),
            rest => rest == Some(""),
        };
        // An encoded slash or backslash in the path could be decoded by the receiver into a
        // path the glob never saw (`/hooks/..%2Fadmin`): such a target matches nothing.
        let path = target.path();
        let lower = path.to_ascii_lowercase();
        if lower.contains("%2f") || lower.contains("%5c") {
            return false;
        }
        host_ok && target.port_or_known_default() == Some(self.port) && glob(&self.path, path)
    }
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&b| b == b'*')
}

/// Whether `target` is allowed by `patterns`: an empty list allows every target.
pub fn allowed(patterns: &[TargetPattern], target: &Url) -> bool {
    patterns.is_empty() || patterns.iter().any(|p| p.matches(target))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn wildcard_hosts_match_names_under_the_suffix_only() {
        let p = TargetPattern::parse("https://*.billing.example/*").unwrap();
        let cases = [
            ("https://a.billing.example/hook", true),
            ("https://a.b.billing.example/x/y?q=1", true),
            ("https://A.BILLING.example/hook", true),
            ("https://billing.example/hook", false),
            ("https://evilbilling.example/hook", false),
            ("https://evil.example/a.billing.example/", false),
            ("http://a.billing.example/hook", false),
            ("https://a.billing.example:8443/hook", false),
            ("https://a.billing.example.evil/hook", false),
        ];
        for (t, want) in cases {
            assert_eq!(p.matches(&url(t)), want, "{t}");
        }
    }

    #[test]
    fn exact_hosts_ports_and_path_globs() {
        let p = TargetPattern::parse("https://Partner.example:8443/hooks/*").unwrap();
        assert!(p.matches(&url("https://partner.example:8443/hooks/a")));
        assert!(p.matches(&url("https://partner.example:8443/hooks/")));
        assert!(!p.matches(&url("https://partner.example:8443/other")));
        assert!(!p.matches(&url("https://partner.example/hooks/a")));
        let bare = TargetPattern::parse("https://partner.example").unwrap();
        assert!(bare.matches(&url("https://partner.example/anything/at/all")));
        assert!(bare.matches(&url("https://partner.example:443/x")));
        assert!(!bare.matches(&url("https://partner.example.evil/x")));
        assert!(!p.matches(&url("https://partner.example:8443/hooks/..%2Fadmin")));
        assert!(!p.matches(&url("https://partner.example:8443/hooks/a%5c..%5cadmin")));
        let exact = TargetPattern::parse("http://127.0.0.1:9000/hook").unwrap();
        assert!(exact.matches(&url("http://127.0.0.1:9000/hook")));
        assert!(!exact.matches(&url("http://127.0.0.1:9000/hook2")));
        let idn = TargetPattern::parse("https://*.bücher.example/*").unwrap();
        assert!(idn.matches(&url("https://shop.xn--bcher-kva.example/x")));
    }

    #[test]
    fn bad_patterns_are_refused_with_a_reason() {
        for bad in [
            "billing.example",
            "ftp://x.example/*",
            "https://x.*.example/*",
            "https://*/*",
            "https://user@x.example/*",
            "https://x.example/a?b=1",
            "https://",
        ] {
            let e = TargetPattern::parse(bad).unwrap_err();
            assert!(e.contains("not a target pattern"), "{bad}: {e}");
        }
    }

    #[test]
    fn glob_handles_stars_anywhere() {
        assert!(glob("/*", "/"));
        assert!(glob("/a/*/c", "/a/b/b/c"));
        assert!(glob("*x*", "axb"));
        assert!(!glob("/a*", "/b"));
        assert!(glob("/a**", "/a"));
        assert!(!glob("/a", "/ab"));
    }

    #[test]
    fn an_empty_list_allows_everything() {
        assert!(allowed(&[], &url("https://any.example/")));
        let ps = [TargetPattern::parse("https://a.example/*").unwrap()];
        assert!(allowed(&ps, &url("https://a.example/x")));
        assert!(!allowed(&ps, &url("https://b.example/x")));
    }
}
