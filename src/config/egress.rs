//! `[egress]` ([`EgressConfig`]): the openings in the egress policy, and the HTTP proxy
//! attempts go through (`egress.proxy`) with the targets that go direct (`egress.no_proxy`),
//! used by [`crate::outbound::proxy`]. CONTRACT §6 also spells `allow_private_targets` and
//! `allow` at the top level (`egress_allow`); `shape` moves those into this section.
//!
//! The proxy URL may carry `user:pass@` credentials, so it is held as a [`Secret`]: its
//! `Debug`, the `check-config` summary and every error show the proxy's origin at most,
//! never the URL as written.

use std::fmt;
use std::net::IpAddr;

use http::Uri;
use hyper_util::client::proxy::matcher::Matcher;
use ipnet::IpNet;
use serde::Deserialize;
use url::Url;

use super::de::{self, text, Net};
use crate::signing::Secret;

section! {
    /// Egress policy openings (`[egress]`).
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct EgressConfig {
        /// Allow every non-global address (loopback, private, link-local, ...).
        pub allow_private_targets: bool = false,
        /// Networks allowed even though they are not global.
        pub allow: Vec<IpNet> ["de::list::<Net, _>"] = Vec::new(),
        /// The HTTP proxy every attempt goes through (credentials hidden).
        pub proxy: Option<EgressProxy> ["de::opt::<Proxy, _>"] = None,
        /// Hosts, domain suffixes and networks reached directly.
        pub no_proxy: Vec<String> ["de::list::<NoProxy, _>"] = Vec::new(),
    }
}

text!(/// `egress.proxy`: an `http://` URL (never quoted: it may carry a password).
    Proxy: EgressProxy = parse_proxy);
text!(/// An `egress.no_proxy` entry: a host, `.domain` suffix, address, network or `*`.
    NoProxy: String = parse_no_proxy);

/// `egress.proxy`: an `http://[user:pass@]host[:port]` URL.
#[derive(Clone, PartialEq, Eq)]
pub struct EgressProxy {
    /// As written (credentials included): only [`EgressProxy::expose`] gives it out.
    url: Secret,
    /// `http://host:port`.
    origin: String,
    credentials: bool,
}

impl EgressProxy {
    /// `http://host:port`, without credentials: what may be shown.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Whether the URL carries credentials (sent as `Proxy-Authorization: Basic`).
    #[cfg(test)]
    pub fn has_credentials(&self) -> bool {
        self.credentials
    }

    /// The URL as written, credentials included: only to build the proxy client with.
    pub fn expose(&self) -> &str {
        self.url.expose()
    }

    /// The one-line description `check-config` and `Debug` show.
    pub fn describe(&self) -> String {
        let creds = if self.credentials { " (credentials set)" } else { "" };
        format!("{}{creds}", self.origin)
    }
}

impl fmt::Debug for EgressProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EgressProxy({})", self.describe())
    }
}

/// Parses `egress.proxy`. The errors never quote the value (it may carry a password).
pub(super) fn parse_proxy(text: &str) -> Result<EgressProxy, String> {
    const SHAPE: &str = "must be an http:// URL like http://proxy.internal:3128 (user:pass@ allowed)";
    let url = Url::parse(text.trim()).map_err(|_| SHAPE.to_string())?;
    if url.scheme() != "http" {
        return Err(format!(
            "{SHAPE}; courier speaks plain HTTP to the proxy (CONNECT carries TLS)"
        ));
    }
    let host = url.host_str().ok_or_else(|| SHAPE.to_string())?;
    if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
        return Err(format!("{SHAPE}: no path, query or fragment"));
    }
    // The proxy client parses the URL with the `http` crate: a URL it cannot read would
    // otherwise mean no proxy at all, silently.
    let matcher = Matcher::builder().all(text.trim()).build();
    let probe = Uri::from_static("http://courier.invalid/");
    if matcher.intercept(&probe).is_none() {
        return Err(SHAPE.to_string());
    }
    let port = url.port_or_known_default().unwrap_or(80);
    Ok(EgressProxy {
        url: Secret::new(text.trim().to_string()),
        origin: format!("http://{host}:{port}"),
        credentials: !url.username().is_empty() || url.password().is_some(),
    })
}

/// Parses one `egress.no_proxy` entry: a host (`api.example`, which also covers its
/// subdomains), a domain suffix (`.internal`), an IP address, a CIDR network, or `*`.
pub(super) fn parse_no_proxy(text: &str) -> Result<String, String> {
    let entry = text.trim().to_ascii_lowercase();
    let bare = entry.trim_start_matches('[').trim_end_matches(']');
    if entry == "*" || bare.parse::<IpAddr>().is_ok() || entry.parse::<IpNet>().is_ok() {
        return Ok(bare.to_string());
    }
    let name = entry.strip_prefix('.').unwrap_or(&entry);
    let label_ok = |l: &str| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !name.is_empty() && name.trim_end_matches('.').split('.').all(label_ok) {
        return Ok(entry.trim_end_matches('.').to_string());
    }
    Err(format!(
        "{text:?} is not a host, .domain suffix, IP address, CIDR network or * (no ports or schemes)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_proxy_url_keeps_its_credentials_out_of_sight() {
        let p = parse_proxy("http://user:p%40ss@Proxy.Internal:3128").unwrap();
        assert_eq!(p.origin(), "http://proxy.internal:3128");
        assert!(p.has_credentials());
        assert_eq!(
            format!("{p:?}"),
            "EgressProxy(http://proxy.internal:3128 (credentials set))"
        );
        assert_eq!(p.expose(), "http://user:p%40ss@Proxy.Internal:3128");
        let p = parse_proxy("http://10.0.0.5").unwrap();
        assert_eq!((p.origin(), p.has_credentials()), ("http://10.0.0.5:80", false));
        for bad in [
            "https://user:hunter2@proxy:3128",
            "socks5://user:hunter2@proxy:1080",
            "proxy:3128",
            "http://user:hunter2@proxy:3128/path",
            "http://user:hunter2@proxy:3128/?q",
            "",
        ] {
            let e = parse_proxy(bad).unwrap_err();
            assert!(!e.contains("hunter2"), "{bad}: {e}");
        }
    }

    #[test]
    fn no_proxy_entries_are_hosts_suffixes_addresses_or_networks() {
        for (text, want) in [
            ("API.example", "api.example"),
            (".internal", ".internal"),
            ("localhost", "localhost"),
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("127.0.0.1", "127.0.0.1"),
            ("[::1]", "::1"),
            ("fd00::/8", "fd00::/8"),
            ("*", "*"),
            ("svc.cluster.local.", "svc.cluster.local"),
        ] {
            assert_eq!(parse_no_proxy(text).as_deref(), Ok(want), "{text}");
        }
        for bad in [
            "",
            ".",
            "a.example:443",
            "http://a.example",
            "a,b",
            "a b",
            "10.0.0.0/33",
        ] {
            assert!(parse_no_proxy(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_egress_section_takes_both_and_the_summary_shows_the_origin_only() {
        let c = Config::from_toml_str(
            "[egress]\nproxy = \"http://u:hunter2@proxy.internal:3128\"\nno_proxy = [\".internal\", \"10.0.0.0/8\"]\n",
            "t",
        )
        .unwrap();
        c.validate().unwrap();
        let p = c.egress.proxy.as_ref().unwrap();
        assert_eq!(p.origin(), "http://proxy.internal:3128");
        assert_eq!(c.egress.no_proxy, [".internal", "10.0.0.0/8"]);
        for shown in [c.summary(), format!("{c:?}")] {
            assert!(shown.contains("http://proxy.internal:3128"), "{shown}");
            assert!(!shown.contains("hunter2"), "{shown}");
        }
        let e = Config::from_toml_str("[egress]\nproxy = \"ftp://u:hunter2@p:21\"\n", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("egress.proxy") && !e.contains("hunter2"), "{e}");
        let e = Config::from_toml_str("[egress]\nno_proxy = [\"a\", \"b:1\"]\n", "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("egress.no_proxy[1]"), "{e}");
    }
}
