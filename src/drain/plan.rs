//! What a drain is asked to do, checked: one struct is both the `POST /drain` body and the
//! flags of `courier drain`, so the two fronts cannot drift apart.
//!
//! The guard on where a drain sends lives here: a running courier drains only to `[drain]
//! to` or a peer listed in `[drain] peers` (`403 drain_peer_not_allowed`), and a plain-http
//! peer needs `[drain] token` either way (`400 drain_peer_unauthenticated`: nothing could
//! prove it stored what it is sent; see [`super::answer`]).

use std::time::Duration;

use clap::Args;
use hyper::StatusCode;
use serde::Deserialize;
use url::Url;

use crate::config::{DrainConfig, DRAIN_MAX_CONCURRENCY};
use crate::redact::url_for_log;

/// Longest `deliver_for`.
pub const MAX_DELIVER_FOR: Duration = Duration::from_secs(3600);

/// The body of `POST /drain` and the flags of `courier drain`; every field optional.
#[derive(Debug, Default, Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// The peer courier's ingress, e.g. http://courier-tier:8787 (also [drain] to, COURIER_DRAIN_TO;
    /// a running courier takes only [drain] to or one of [drain] peers).
    #[arg(long, value_name = "URL")]
    pub to: Option<String>,
    /// Messages forwarded at once, 1 to 256 (also [drain] concurrency; default 16).
    #[arg(long, value_name = "N")]
    pub concurrency: Option<u32>,
    /// With a running courier: keep delivering for up to this long (or until nothing is
    /// open), then forward the rest, e.g. 20s.
    #[arg(long, value_name = "DURATION")]
    pub deliver_for: Option<String>,
}

/// A drain's settings, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainPlan {
    /// The peer.
    pub to: Url,
    /// Messages forwarded at once.
    pub concurrency: u32,
    /// Delivering first, for up to this long.
    pub deliver_for: Duration,
    /// The peer is `[drain] to` or one of `[drain] peers`: the operator's choice, so the
    /// egress policy is open for it.
    pub listed: bool,
}

/// Why a drain did not start (a bad request or flags, a peer not allowed, another drain
/// under way, a shutdown): the error code and the sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotStarted(pub &'static str, pub String);

impl NotStarted {
    /// The status `POST /drain` answers with.
    pub fn status(&self) -> StatusCode {
        match self.0 {
            "drain_peer_not_allowed" => StatusCode::FORBIDDEN,
            "drain_running" => StatusCode::CONFLICT,
            "shutting_down" => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

impl DrainRequest {
    /// The plan, with `[drain]`'s defaults for what the request leaves out. With
    /// `listed_only` (a running courier's `POST /drain`) the peer must be one of `[drain]`'s;
    /// a plain-http peer always needs `[drain] token`.
    pub fn plan(self, defaults: &DrainConfig, listed_only: bool) -> Result<DrainPlan, NotStarted> {
        let to = self.to.or_else(|| defaults.to.clone()).ok_or_else(|| {
            NotStarted(
                "missing_peer",
                "no peer to drain to: give \"to\" (courier drain --to URL), or set [drain] to / COURIER_DRAIN_TO"
                    .into(),
            )
        })?;
        let to = crate::config::peer_url(&to).map_err(|e| NotStarted("invalid_peer", format!("to {e}")))?;
        let (listed, shown) = (defaults.lists(&to), url_for_log(to.as_str()));
        if listed_only && !listed {
            let why = "it drains only to [drain] to or a peer listed in [drain] peers";
            return Err(NotStarted(
                "drain_peer_not_allowed",
                format!("{shown} is not a drain peer of this courier: {why}"),
            ));
        }
        if to.scheme() == "http" && defaults.token.is_none() {
            return Err(NotStarted(
                "drain_peer_unauthenticated",
                format!(
                    "{shown} is plain http and [drain] token is not set, so nothing proves the peer stored what it is sent: \
                     set [drain] token (COURIER_DRAIN_TOKEN) to the peer's ingress_token, or use https"
                ),
            ));
        }
        let concurrency = self.concurrency.unwrap_or(defaults.concurrency);
        if !(1..=DRAIN_MAX_CONCURRENCY).contains(&concurrency) {
            let message = format!("concurrency must be 1 to {DRAIN_MAX_CONCURRENCY}");
            return Err(NotStarted("invalid_request", message));
        }
        let deliver_for = match self.deliver_for {
            None => Duration::ZERO,
            Some(text) => crate::config::units::parse_duration(&text)
                .ok()
                .filter(|d| *d <= MAX_DELIVER_FOR)
                .ok_or_else(|| {
                    let message = format!("deliver_for {text:?} must be a duration up to 1h, like 20s");
                    NotStarted("invalid_request", message)
                })?,
        };
        Ok(DrainPlan {
            to,
            concurrency,
            deliver_for,
            listed,
        })
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DrainConfig;
    use crate::signing::Secret;

    fn plan(r: DrainRequest, defaults: &DrainConfig) -> Result<DrainPlan, NotStarted> {
        r.plan(defaults, false)
    }

    fn to(url: &str) -> DrainRequest {
        DrainRequest {
            to: Some(url.into()),
            ..DrainRequest::default()
        }
    }

    #[test]
    fn a_request_takes_drain_defaults_and_is_checked() {
        let defaults = DrainConfig {
            to: Some("http://tier:8787".into()),
            token: Some(Secret::new("t".into())),
            ..DrainConfig::default()
        };
        let p = plan(DrainRequest::default(), &defaults).unwrap();
        assert_eq!(
            (p.to.as_str(), p.concurrency, p.deliver_for, p.listed),
            ("http://tier:8787/", 16, Duration::ZERO, true)
        );
        let p = plan(
            DrainRequest {
                to: Some("https://other:1/x".into()),
                concurrency: Some(2),
                deliver_for: Some("20s".into()),
            },
            &defaults,
        )
        .unwrap();
        assert_eq!(
            (p.to.as_str(), p.concurrency, p.deliver_for, p.listed),
            ("https://other:1/x", 2, Duration::from_secs(20), false)
        );
        let code = |r: DrainRequest, d: &DrainConfig| plan(r, d).unwrap_err().0;
        assert_eq!(code(DrainRequest::default(), &DrainConfig::default()), "missing_peer");
        let with = |to: &str, c: Option<u32>, d: Option<&str>| DrainRequest {
            to: Some(to.into()),
            concurrency: c,
            deliver_for: d.map(str::to_string),
        };
        assert_eq!(code(with("tier:8787", None, None), &defaults), "invalid_peer");
        assert_eq!(code(with("http://t", Some(0), None), &defaults), "invalid_request");
        assert_eq!(code(with("http://t", Some(257), None), &defaults), "invalid_request");
        assert_eq!(code(with("http://t", None, Some("2h")), &defaults), "invalid_request");
        assert_eq!(code(with("http://t", None, Some("soon")), &defaults), "invalid_request");
        assert!(
            serde_json::from_str::<DrainRequest>(r#"{"too": "x"}"#).is_err(),
            "unknown fields"
        );
    }

    #[test]
    fn a_running_courier_drains_only_to_its_configured_peers_and_http_needs_the_token() {
        let defaults = DrainConfig {
            to: Some("http://tier:8787".into()),
            peers: vec!["https://other.example/couriers/".into(), "http://[::1]:9".into()],
            token: Some(Secret::new("t".into())),
            ..DrainConfig::default()
        };
        let listed = |r: DrainRequest| r.plan(&defaults, true);
        // Compared as normalised URLs.
        for ok in [
            "http://TIER:8787/",
            " http://tier:8787",
            "https://other.example:443/couriers/",
            "http://[0:0::1]:9",
        ] {
            assert!(listed(to(ok)).is_ok_and(|p| p.listed), "{ok}");
        }
        assert!(listed(DrainRequest::default()).is_ok(), "[drain] to");
        for not in [
            "http://127.0.0.1:30999",
            "http://tier:8788",
            "https://other.example/couriers/x",
            "https://tier:8787",
        ] {
            let e = listed(to(not)).unwrap_err();
            assert_eq!(
                (e.0, e.status()),
                ("drain_peer_not_allowed", StatusCode::FORBIDDEN),
                "{not}"
            );
        }
        // The offline verb may name any peer.
        assert!(to("http://127.0.0.1:30999")
            .plan(&defaults, false)
            .is_ok_and(|p| !p.listed));

        // No token: https is believed on its 202, plain http is refused before anything is sent.
        let no_token = DrainConfig {
            token: None,
            ..defaults.clone()
        };
        for listed_only in [true, false] {
            let e = to("http://tier:8787").plan(&no_token, listed_only).unwrap_err();
            assert_eq!(
                (e.0, e.status()),
                ("drain_peer_unauthenticated", StatusCode::BAD_REQUEST)
            );
            assert!(e.1.contains("[drain] token") && e.1.contains("https"), "{}", e.1);
            assert!(to("https://other.example/couriers/")
                .plan(&no_token, listed_only)
                .is_ok());
        }
        let e = to("http://elsewhere:1").plan(&no_token, true).unwrap_err();
        assert_eq!(
            e.0, "drain_peer_not_allowed",
            "an unlisted peer is refused as such first"
        );
    }
}
