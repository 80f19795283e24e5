//! `[drain]`: where `courier drain` hands this courier's open messages over (another
//! courier's ingress, e.g. a courier tier behind a Service), the other peers a running
//! courier may be asked to drain to, the token that ingress wants, and how many messages are
//! forwarded at once. See `crate::drain`.
//!
//! The verb's `--to` and `--concurrency` override the section and its `COURIER_DRAIN_*`
//! variables; a running courier's `POST /drain` takes only `to` or a listed peer
//! ([`DrainConfig::lists`]).

use serde::Deserialize;
use url::Url;

use super::summary::set;
use super::validate::rule;
use super::ConfigError;
use crate::signing::Secret;

/// Default `[drain] concurrency`: messages in flight to the peer at once.
pub const DEFAULT_CONCURRENCY: u32 = 16;
/// Largest `[drain] concurrency`.
pub const MAX_CONCURRENCY: u32 = 256;

section! {
    /// `[drain]`.
    /// `Debug` shows the token as `Secret(***)`.
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct DrainConfig {
        /// The peer courier's ingress, `http(s)://host:port` (a path prefix is kept).
        pub to: Option<String> = None,
        /// Other peers `POST /drain` may name (besides `to`).
        pub peers: Vec<String> = Vec::new(),
        /// The peer's `ingress_token`, sent as `Courier-Token` (a secret: never shown).
        pub token: Option<Secret> = None,
        /// Messages forwarded to the peer at once.
        pub concurrency: u32 = DEFAULT_CONCURRENCY,
    }
}

impl DrainConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(to) = &self.to {
            peer_url(to).map_err(|e| ConfigError::invalid("drain.to", e))?;
        }
        for peer in &self.peers {
            peer_url(peer).map_err(|e| ConfigError::invalid("drain.peers", format_args!("{peer:?} {e}")))?;
        }
        let (range, problem) = (1..=MAX_CONCURRENCY, format_args!("must be 1 to {MAX_CONCURRENCY}"));
        rule(!range.contains(&self.concurrency), "drain.concurrency", problem)
    }

    /// Whether `url` is a peer the operator configured (`to` or one of `peers`), compared
    /// as [`peer_url`] normalises them.
    pub fn lists(&self, url: &Url) -> bool {
        self.to
            .iter()
            .chain(&self.peers)
            .any(|peer| peer_url(peer).is_ok_and(|p| p == *url))
    }

    /// The summary line (the token only as set or not).
    pub(super) fn summary(&self) -> String {
        let to = self.to.as_deref().unwrap_or("(unset: give --to)");
        let peers = match self.peers.is_empty() {
            true => "none".to_string(),
            false => format!("[{}]", self.peers.join(", ")),
        };
        let settings = pairs!(self; token: set, concurrency);
        format!("drain: to {to}, peers {peers}, {settings}")
    }
}

/// A peer courier's ingress as `[drain] to`, `COURIER_DRAIN_TO`, `--to` and `POST /drain`
/// take it: an absolute `http` or `https` URL with a host, and nothing that would be lost or
/// leak on the way (no user or password: the token goes in `[drain] token`; no query or
/// fragment: the target is sent in `Courier-Target`). The error says what is wrong.
pub fn peer_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text.trim())
        .map_err(|e| format!("must be a courier's ingress URL like http://courier-tier:8787 ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("must be an http:// or https:// URL with a host, like http://courier-tier:8787".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not carry a user or password (the peer's ingress token goes in [drain] token)".into());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("must not have a query or fragment".into());
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_section_deserializes_over_the_defaults_and_is_checked() {
        assert_eq!(Config::default().drain, DrainConfig::default());
        let c = Config::from_toml_str(
            "[drain]\nto = \"http://courier-tier:8787\"\ntoken = \"t0k\"\nconcurrency = 4\n",
            "t",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.drain.to.as_deref(), Some("http://courier-tier:8787"));
        assert_eq!(c.drain.token.as_ref().map(Secret::expose), Some("t0k"));
        assert_eq!(c.drain.concurrency, 4);
        assert!(!format!("{:?}", c.drain).contains("t0k"), "the token is never shown");
        assert!(!c.summary().contains("t0k"));
        assert!(c
            .summary()
            .contains("drain: to http://courier-tier:8787, peers none, token set, concurrency 4"));
        let only_to = Config::from_toml_str("[drain]\nto = \"http://t:1\"\n", "t").unwrap();
        assert_eq!(
            only_to.drain.concurrency, DEFAULT_CONCURRENCY,
            "a missing key keeps its default"
        );
        for (toml, problem) in [
            ("concurrency = 0", "drain.concurrency must be 1 to 256"),
            ("concurrency = 257", "drain.concurrency must be 1 to 256"),
            ("to = \"courier-tier:8787\"", "drain.to must be"),
            ("to = \"ftp://t/\"", "drain.to must be an http:// or https:// URL"),
            ("to = \"http://u:p@t/\"", "drain.to must not carry a user or password"),
            ("to = \"http://t/?x=1\"", "drain.to must not have a query"),
            ("peers = [\"http://a:1\", \"tier:1\"]", "drain.peers \"tier:1\" must be"),
        ] {
            let c = Config::from_toml_str(&format!("[drain]\n{toml}\n"), "t").unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(problem), "{toml}: {e}");
        }
        assert!(
            Config::from_toml_str("[drain]\nconcurency = 3\n", "t").is_err(),
            "unknown key"
        );
    }

    #[test]
    fn the_listed_peers_are_to_and_peers_compared_normalised() {
        let c = Config::from_toml_str(
            "[drain]\nto = \"http://tier:8787\"\npeers = [\"https://Other.example/c/\", \"http://[::1]:9\"]\ntoken = \"t\"\n",
            "t",
        )
        .unwrap();
        c.validate().unwrap();
        assert!(c
            .summary()
            .contains("drain: to http://tier:8787, peers [https://Other.example/c/, http://[::1]:9], token set"));
        let lists = |u: &str| c.drain.lists(&peer_url(u).unwrap());
        for yes in ["http://tier:8787/", "https://other.example:443/c/", "http://[0::1]:9"] {
            assert!(lists(yes), "{yes}");
        }
        for no in [
            "http://tier:8788",
            "https://tier:8787",
            "https://other.example/c",
            "http://127.0.0.1:9",
        ] {
            assert!(!lists(no), "{no}");
        }
        assert!(!DrainConfig::default().lists(&peer_url("http://tier:8787").unwrap()));
    }

    #[test]
    fn a_peer_url_keeps_its_path_prefix() {
        assert_eq!(
            peer_url(" https://h.example/couriers/a ").unwrap().path(),
            "/couriers/a"
        );
        assert_eq!(peer_url("http://[::1]:8787").unwrap().port(), Some(8787));
    }
}
