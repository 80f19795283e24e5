//! The arrays of tables: `[[route]]` ([`RouteConfig`]), `[[host]]` ([`HostConfig`]) and
//! `[[endpoint]]` ([`EndpointConfig`]). Routes and endpoints also take the retry-policy keys
//! and `ordering`/`on_dead`, hosts their TLS keys, which the file writes beside their own
//! keys; `shape` gathers those into the `(policy)`, `(ordering)` and `(tls)` groups these
//! structs read.

use serde::{Deserialize, Deserializer};
use url::Url;

use super::de::{self, EndpointKey, HostKey, Link, Name, Target};
use super::error::Problem;
use super::summary::{patterns, without_password};
use super::{Config, HostTls, PolicyOverrides};
use crate::model::{OnDead, Ordering, SignatureScheme};
use crate::signing::scope::TargetPattern;

section! {
    /// A named route (`[[route]]`): `POST /r/<name>` delivers to `url`.
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct RouteConfig {
        /// The name in `/r/<name>`.
        pub name: String,
        /// The target; extra path and query of the request are appended.
        pub url: Url ["de::one::<Link, _>"] => without_password,
        /// The name of a `[signing.keys]` entry to sign with instead of the default secrets.
        #[serde(default)]
        pub signing_key: Option<String>,
        /// The scheme for this route instead of `signing.scheme`.
        #[serde(default, deserialize_with = "de::opt::<Name<SignatureScheme>, _>")]
        pub scheme: Option<SignatureScheme>,
        /// Where this route may deliver (its URL plus the appended path); empty: anywhere.
        #[serde(default, deserialize_with = "de::list::<Target, _>")]
        pub targets: Vec<TargetPattern> => patterns,
        /// `ordering = "fifo"`: messages sent through this route are ordered, with what a
        /// dead head does (`on_dead`); `None`: `ordering = "none"` (the default).
        #[serde(default, rename = "(ordering)", deserialize_with = "fifo")]
        pub fifo: Option<OnDead>,
        /// Retry settings for the messages accepted through this route.
        #[serde(default, rename = "(policy)")]
        pub policy: PolicyOverrides,
    }
}

/// Per-host settings (`[[host]]`): the in-flight cap, and TLS toward the host.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// `name:port` (e.g. `api.example:443`, `[::1]:8080`), normalised at load exactly as
    /// live targets are (lowercase, IDNA to punycode), so the limiter's lookup is exact.
    #[serde(deserialize_with = "de::one::<HostKey, _>")]
    pub host: String,
    /// Attempts in flight to this host at most; `None`: `delivery.max_in_flight_per_host`.
    #[serde(default)]
    pub max_in_flight: Option<u32>,
    /// TLS toward this host: extra CAs, a client certificate.
    #[serde(default, rename = "(tls)")]
    pub tls: HostTls,
}

/// Per-endpoint settings (`[[endpoint]]`): its rate limit, its ordering, its retry policy.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// The endpoint key (by default a target URL without its query). A key that is an
    /// http(s) URL is normalised at load as live targets' default keys are (lowercase
    /// host, punycode, default port dropped, `/` path), so the lookup is exact.
    #[serde(deserialize_with = "de::one::<EndpointKey, _>")]
    pub key: String,
    /// Attempts per second to this endpoint at most; `None`: `delivery.rate_per_second`.
    #[serde(default)]
    pub rate_per_second: Option<u32>,
    /// `ordering = "fifo"`: every message to this endpoint is ordered, with what a dead head
    /// does (`on_dead`); `None`: `ordering = "none"` (the default).
    #[serde(default, rename = "(ordering)", deserialize_with = "fifo")]
    pub fifo: Option<OnDead>,
    /// Retry settings (and the in-flight cap) for this endpoint's messages.
    #[serde(default, rename = "(policy)")]
    pub policy: PolicyOverrides,
}

section! {
    /// The `(ordering)` group: `ordering` and `on_dead` of a route or an endpoint.
    #[derive(Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct Sequence {
        /// `ordering`: `none` or `fifo`.
        pub ordering: Ordering ["de::one::<Name<Ordering>, _>"] = Ordering::default(),
        /// What a dead head does; only with `fifo`.
        pub on_dead: Option<OnDead> ["de::opt::<Name<OnDead>, _>"] = None,
    }
}

/// `Some` when the messages are ordered. `on_dead` without `ordering = "fifo"` is an error:
/// it would do nothing, and a typo'd ordering must not pass silently.
fn fifo<'de, D: Deserializer<'de>>(d: D) -> Result<Option<OnDead>, D::Error> {
    let Sequence { ordering, on_dead } = Sequence::deserialize(d)?;
    match ordering {
        Ordering::Fifo => Ok(Some(on_dead.unwrap_or_default())),
        Ordering::None if on_dead.is_some() => {
            Err(Problem::from(".on_dead: applies only with ordering = \"fifo\"").into_serde())
        }
        Ordering::None => Ok(None),
    }
}

impl Config {
    /// The rules of a section that join its keys to its other values, checked once the file
    /// is read (only the file has routes and endpoints).
    pub(super) fn check_sections(&self) -> Result<(), Problem> {
        let capped = |(_, r): &(usize, &RouteConfig)| r.policy.max_in_flight.is_some();
        if let Some((i, route)) = self.routes.iter().enumerate().find(capped) {
            // One endpoint has one cap, whichever route its messages came through.
            let key = crate::target::default_endpoint_key(&route.url);
            let problem = format!(
                "route[{i}].max_in_flight: the in-flight cap is per endpoint; set it in an [[endpoint]] \
                 with key = {key:?}"
            );
            return Err(Problem::coded("per_endpoint_setting", problem));
        }
        let idle = |e: &EndpointConfig| e.rate_per_second.is_none() && e.fifo.is_none() && e.policy.is_empty();
        if let Some(i) = self.endpoints.iter().position(idle) {
            let problem = format!("endpoint[{i}]: sets nothing (give rate_per_second, ordering or a retry setting)");
            return Err(Problem::coded("empty_section", problem));
        }
        Ok(())
    }
}
