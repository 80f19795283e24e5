//! `[intercept]`: HTTPS interception with no URL change (see `crate::intercept`). An app
//! that sets `HTTPS_PROXY=http://<courier>` sends `CONNECT host:443`; a host listed in
//! `hosts` is terminated by courier with a certificate its CA signs, one in `passthrough`
//! is tunnelled untouched under the egress policy, and any other is refused.
//!
//! The patterns are read into [`HostPattern`]s, which the component matches `CONNECT`
//! hosts against.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::de::{self, text, Dur};
use super::summary::{dur, list};
use super::validate::rule;
use super::ConfigError;

/// Default `[intercept] max_tunnels`.
pub const DEFAULT_MAX_TUNNELS: u32 = 1024;

section! {
    /// `[intercept]`.
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct InterceptConfig {
        /// Hosts whose `CONNECT` courier terminates: names, `*.suffix` patterns, IP literals.
        pub hosts: Vec<HostPattern> ["de::list::<Pattern, _>"] = Vec::new(),
        /// Hosts tunnelled byte for byte (patterns as `hosts`, or `"*"` for any other).
        pub passthrough: Vec<HostPattern> ["de::list::<Pattern, _>"] = Vec::new(),
        /// The certificate the apps trust (PEM); default `<data_dir>/intercept-ca.pem`, made
        /// at first start (a root whose key is not kept).
        pub ca_cert: Option<PathBuf> = None,
        /// The key that signs leaves (PEM), then its certificate when it is an intermediate's
        /// (courier's own: a name-constrained one); default `<data_dir>/intercept-ca.key`.
        /// Refused unless the owner's only (mode 0600 or 0400).
        pub ca_key: Option<PathBuf> = None,
        /// Tunnels open at once (both kinds); past it a `CONNECT` gets 503 `overloaded`.
        pub max_tunnels: u32 = DEFAULT_MAX_TUNNELS,
        /// A tunnel with no byte either way for this long is closed.
        pub idle_timeout: Duration ["de::one::<Dur, _>"] = Duration::from_secs(60),
    }
}

impl InterceptConfig {
    /// Whether any `CONNECT` is served (something is listed).
    pub fn enabled(&self) -> bool {
        !self.hosts.is_empty() || !self.passthrough.is_empty()
    }

    /// The CA certificate and key files: as configured, else beside the store (the one
    /// directory every deployment keeps across restarts; docs/delivery.md says what that
    /// means for backups).
    pub fn ca_files(&self, data_dir: &std::path::Path) -> (PathBuf, PathBuf) {
        let cert = self
            .ca_cert
            .clone()
            .unwrap_or_else(|| data_dir.join("intercept-ca.pem"));
        let key = self.ca_key.clone().unwrap_or_else(|| data_dir.join("intercept-ca.key"));
        (cert, key)
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        rule(
            self.hosts.contains(&HostPattern::Any),
            "intercept.hosts",
            "\"*\" would intercept every site; list the webhook receivers (names, *.suffix or IP addresses)",
        )?;
        rule(
            self.ca_cert.is_some() != self.ca_key.is_some(),
            "intercept.ca_cert",
            "and intercept.ca_key go together (give both, or neither for the default files in data_dir)",
        )?;
        rule(self.max_tunnels == 0, "intercept.max_tunnels", "must be at least 1")?;
        rule(
            self.idle_timeout.is_zero(),
            "intercept.idle_timeout",
            "must be longer than 0s",
        )
    }

    /// The summary line.
    pub(super) fn summary(&self) -> String {
        if !self.enabled() {
            return "intercept: off (no hosts or passthrough listed)".to_string();
        }
        let files = match &self.ca_cert {
            Some(cert) => format!("ca_cert {}", cert.display()),
            None => "ca_cert <data_dir>/intercept-ca.pem".to_string(),
        };
        format!(
            "intercept: hosts [{}], passthrough [{}], {files}, max_tunnels {}, idle_timeout {}",
            list(&self.hosts),
            list(&self.passthrough),
            self.max_tunnels,
            dur(&self.idle_timeout)
        )
    }
}

text!(/// An `[intercept]` host pattern.
    Pattern: HostPattern = HostPattern::parse);

/// A host as `[intercept] hosts` and `passthrough` list it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// Exactly this name (lowercase, no trailing dot).
    Name(String),
    /// `*.suffix`: any name under `suffix`, not `suffix` itself.
    Under(String),
    /// This address.
    Ip(IpAddr),
    /// `*`: any host (passthrough only).
    Any,
}

impl HostPattern {
    /// Reads `text`: a DNS name, `*.suffix`, an IP literal (IPv6 with or without brackets)
    /// or `*`. No ports or schemes: a listed host is served on any port its `CONNECT` names.
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        let entry = text.trim().to_ascii_lowercase();
        let bare = entry.trim_start_matches('[').trim_end_matches(']');
        if entry == "*" {
            return Ok(HostPattern::Any);
        }
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(HostPattern::Ip(ip));
        }
        let (under, name) = match entry.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, entry.as_str()),
        };
        let name = name.strip_suffix('.').unwrap_or(name);
        let label_ok = |l: &str| {
            !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
            return Err(format!(
                "{text:?} is not a host name, *.suffix, IP address or * (no ports or schemes; IDNs as punycode)"
            ));
        }
        Ok(match under {
            true => HostPattern::Under(name.to_string()),
            false => HostPattern::Name(name.to_string()),
        })
    }

    /// Whether `host` (a `CONNECT` authority's host: lowercase, brackets removed, no
    /// trailing dot) is one this pattern names.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Name(name) => host == name,
            HostPattern::Under(suffix) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
            HostPattern::Ip(ip) => host.parse::<IpAddr>().is_ok_and(|h| h == *ip),
            HostPattern::Any => true,
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Name(name) => f.write_str(name),
            HostPattern::Under(suffix) => write!(f, "*.{suffix}"),
            HostPattern::Ip(ip) => write!(f, "{ip}"),
            HostPattern::Any => f.write_str("*"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HostPattern;
    use crate::config::Config;

    #[test]
    fn patterns_read_and_match_exactly() {
        let p = |t: &str| HostPattern::parse(t).unwrap();
        assert_eq!(p(" Hooks.Example. "), HostPattern::Name("hooks.example".into()));
        assert_eq!(p("*.R.example"), HostPattern::Under("r.example".into()));
        assert_eq!(p("[::1]"), HostPattern::Ip("::1".parse().unwrap()));
        assert_eq!(p("*"), HostPattern::Any);
        for (pattern, host, yes) in [
            ("hooks.example", "hooks.example", true),
            ("hooks.example", "a.hooks.example", false),
            ("hooks.example", "hooks.example.evil", false),
            ("*.r.example", "a.r.example", true),
            ("*.r.example", "a.b.r.example", true),
            ("*.r.example", "r.example", false),
            ("*.r.example", "ar.example", false),
            ("*.r.example", ".r.example", false),
            ("203.0.113.7", "203.0.113.7", true),
            ("203.0.113.7", "203.0.113.8", false),
            ("::1", "::1", true),
            ("::1", "0:0::1", true),
            ("*", "anything.example", true),
        ] {
            assert_eq!(p(pattern).matches(host), yes, "{pattern} {host}");
        }
        for bad in [
            "",
            "a.example:443",
            "https://a.example",
            "*.",
            "a*.example",
            "a..example",
            "bad host",
            "*.*.x",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(p("*.r.example").to_string(), "*.r.example");
    }

    fn check(toml: &str) -> Result<Config, String> {
        let c = Config::from_toml_str(&format!("[intercept]\n{toml}\n"), "t").map_err(|e| e.to_string())?;
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn the_section_is_read_checked_and_summarised() {
        assert!(!Config::default().intercept.enabled());
        assert!(Config::default().summary().contains("intercept: off"));
        let c = check(
            "hosts = [\"Hooks.Partner.example\", \"*.receivers.example\", \"203.0.113.7\"]\n\
             passthrough = [\"*\"]\nmax_tunnels = 8\nidle_timeout = \"5s\"",
        )
        .unwrap();
        assert!(c.intercept.enabled());
        assert_eq!(c.intercept.max_tunnels, 8);
        let s = c.summary();
        assert!(
            s.contains("intercept: hosts [hooks.partner.example, *.receivers.example, 203.0.113.7], passthrough [*]"),
            "{s}"
        );
        assert!(
            s.contains("ca_cert <data_dir>/intercept-ca.pem, max_tunnels 8, idle_timeout 5s"),
            "{s}"
        );
        let (cert, key) = c.intercept.ca_files(std::path::Path::new("/d"));
        assert_eq!(
            (cert.to_str(), key.to_str()),
            (Some("/d/intercept-ca.pem"), Some("/d/intercept-ca.key"))
        );
        for (toml, problem) in [
            ("hosts = [\"*\"]", "intercept.hosts \"*\" would intercept every site"),
            ("hosts = [\"a.example:443\"]", "intercept.hosts"),
            ("hosts = [\"*.\"]", "intercept.hosts"),
            ("hosts = [\"a*.example\"]", "intercept.hosts"),
            ("passthrough = [\"bad host\"]", "intercept.passthrough"),
            (
                "ca_cert = \"/x.pem\"",
                "intercept.ca_cert and intercept.ca_key go together",
            ),
            (
                "hosts = [\"a.example\"]\nmax_tunnels = 0",
                "intercept.max_tunnels must be at least 1",
            ),
            ("idle_timeout = \"0s\"", "intercept.idle_timeout must be longer than 0s"),
        ] {
            let e = check(toml).unwrap_err();
            assert!(e.contains(problem), "{toml}: {e}");
        }
        assert!(check("host = []").is_err(), "unknown key");
    }
}
