//! [`Config::validate`]: the rules the types cannot express, checked once every layer is
//! applied. The first broken rule is the error, naming its key.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use base64::Engine as _;
use url::Url;

use super::summary::without_password;
use super::units::format_duration;
use super::{Config, ConfigError, RouteConfig};
use crate::model::SignatureScheme;
use crate::signing::{ed25519, scope, Secret};

impl Config {
    /// Checks the rules the types cannot express (distinct listeners, a token on every
    /// listener off loopback, non-zero limits, unique names, known signing keys, routes
    /// inside their targets, secret formats, ...). The first broken rule is the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_top()?;
        self.validate_retry_and_delivery()?;
        self.circuit.validate()?;
        self.fleet.validate()?;
        self.drain.validate()?;
        self.intercept.validate()?;
        self.validate_routes()?;
        self.validate_hosts_and_endpoints()?;
        self.validate_policies()?;
        self.validate_secrets()?;
        self.tls.validate()
    }

    /// The listeners that serve the network without their token: `("listen", addr)` when
    /// `listen` is not a loopback address and `ingress_token` is unset, likewise
    /// `("admin_listen", addr)` with `admin_token`. [`Config::validate`] refuses any unless
    /// `allow_unauthenticated_network` is set; then the caller should warn about each.
    /// `ops_listen` is never listed: it serves only probes and metrics.
    pub fn unauthenticated_network_listeners(&self) -> Vec<(&'static str, SocketAddr)> {
        // A Unix socket is local: only processes that can open its file reach it.
        let ingress = self.listen.tcp().map(|a| ("listen", a, self.ingress_token.is_some()));
        ingress
            .into_iter()
            .chain([("admin_listen", self.admin_listen, self.admin_token.is_some())])
            .filter(|&(_, addr, has_token)| !has_token && !is_loopback(addr.ip()))
            .map(|(key, addr, _)| (key, addr))
            .collect()
    }

    fn validate_top(&self) -> Result<(), ConfigError> {
        let mut listeners: Vec<_> = self.listen.tcp().map(|a| ("listen", a)).into_iter().collect();
        listeners.push(("admin_listen", self.admin_listen));
        listeners.extend(self.ops_listen.map(|ops| ("ops_listen", ops)));
        for (j, &(key_b, b)) in listeners.iter().enumerate() {
            for &(key_a, a) in &listeners[..j] {
                let problem = format_args!("({b}) must differ from {key_a} ({a})");
                rule(collide(a, b), key_b, problem)?;
            }
        }
        rule(self.data_dir.as_os_str().is_empty(), "data_dir", "must not be empty")?;
        rule(self.max_body < 1, "max_body", "must be at least 1 byte")?;
        // An accept takes its body's size from the budget before reading it: a budget
        // below max_body would refuse the largest bodies max_body allows.
        let (pending, max_body) = (self.ingress.max_pending_bytes, self.max_body);
        let problem = format_args!("({pending}) must be at least max_body ({max_body})");
        rule(pending < max_body, "ingress.max_pending_bytes", problem)?;
        for (key, timeout) in [
            ("ingress.idle_timeout", self.ingress.idle_timeout),
            ("ingress.send_timeout", self.ingress.send_timeout),
            ("admin.idle_timeout", self.admin.idle_timeout),
            ("admin.send_timeout", self.admin.send_timeout),
        ] {
            rule(timeout < Duration::from_secs(1), key, "must be at least 1s")?;
        }
        for (key, token) in [
            ("ingress_token", &self.ingress_token),
            ("admin_token", &self.admin_token),
        ] {
            let empty = token.as_ref().is_some_and(|t| t.expose().trim().is_empty());
            rule(empty, key, "must not be empty (leave it unset to disable auth)")?;
        }
        if let Some(url) = &self.alert_url {
            check_http_url("alert_url", url)?;
        }
        if self.allow_unauthenticated_network {
            return Ok(());
        }
        let Some(&(key, addr)) = self.unauthenticated_network_listeners().first() else {
            return Ok(());
        };
        let token = if key == "listen" {
            "ingress_token"
        } else {
            "admin_token"
        };
        let problem = format_args!(
            "{addr} is not a loopback address and {token} is unset: set {token}, bind 127.0.0.1, \
             or set allow_unauthenticated_network = true to serve the network without a token on purpose"
        );
        Err(ConfigError::invalid(key, problem))
    }

    fn validate_retry_and_delivery(&self) -> Result<(), ConfigError> {
        let (r, d) = (&self.retry, &self.delivery);
        let retry = keyed!(r, "retry"; base_delay, give_up_after);
        let delivery = keyed!(d, "delivery"; connect_timeout, request_timeout, idle_connection_timeout);
        for (key, value) in retry.into_iter().chain(delivery) {
            rule(value.is_zero(), key, "must be greater than 0")?;
        }
        let (max, base) = (format_duration(r.max_delay), format_duration(r.base_delay));
        let problem = format_args!("({max}) must be at least retry.base_delay ({base})");
        rule(r.max_delay < r.base_delay, "retry.max_delay", problem)?;
        let retry = keyed!(r, "retry"; max_attempts, max_attempts_404);
        let delivery = keyed!(d, "delivery"; max_in_flight, max_in_flight_per_host, max_idle_connections,
            rate_per_second, pause_after_permanent_failures);
        for (key, value) in retry.into_iter().chain(delivery) {
            rule(value < 1, key, "must be at least 1")?;
        }
        Ok(())
    }

    fn validate_routes(&self) -> Result<(), ConfigError> {
        let mut names = BTreeSet::new();
        for (i, route) in self.routes.iter().enumerate() {
            let key = |field: &str| format!("route[{i}].{field}");
            let name = &route.name;
            rule(name.is_empty(), &key("name"), "must not be empty")?;
            let allowed = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
            let problem = format_args!("{name:?} may contain only A-Z a-z 0-9 _ -");
            rule(!name.bytes().all(allowed), &key("name"), problem)?;
            let problem = format_args!("{name:?} is used by an earlier route");
            rule(!names.insert(name.as_str()), &key("name"), problem)?;
            check_http_url(&key("url"), &route.url)?;
            let shown = without_password(&route.url);
            let problem = format_args!("{shown:?} is outside route[{i}].targets");
            rule(!scope::allowed(&route.targets, &route.url), &key("url"), problem)?;
            if let Some(signing_key) = &route.signing_key {
                let Some(signing) = self.signing.keys.get(signing_key) else {
                    let problem = format_args!("{signing_key:?} is not a name in signing.keys");
                    return Err(ConfigError::invalid(&key("signing_key"), problem));
                };
                let problem = format_args!("{shown:?} is outside the targets of signing key {signing_key:?}");
                rule(!scope::allowed(&signing.targets, &route.url), &key("url"), problem)?;
            }
        }
        Ok(())
    }

    fn validate_hosts_and_endpoints(&self) -> Result<(), ConfigError> {
        let mut hosts = BTreeSet::new();
        for (i, host) in self.hosts.iter().enumerate() {
            let (key, name) = (format!("host[{i}].host"), &host.host);
            let problem = format_args!("{name:?} must be name:port, like api.example:443");
            rule(!is_host_port(name), &key, problem)?;
            let twice = !hosts.insert(name.to_ascii_lowercase());
            rule(twice, &key, format_args!("{name:?} is listed twice"))?;
            host.tls.validate(i)?;
            let key = format!("host[{i}].max_in_flight");
            rule(host.max_in_flight.is_some_and(|m| m < 1), &key, "must be at least 1")?;
        }
        let mut keys = BTreeSet::new();
        for (i, endpoint) in self.endpoints.iter().enumerate() {
            let (key, name) = (format!("endpoint[{i}].key"), &endpoint.key);
            rule(name.is_empty(), &key, "must not be empty")?;
            let twice = !keys.insert(name.as_str());
            rule(twice, &key, format_args!("{name:?} is listed twice"))?;
            let key = format!("endpoint[{i}].rate_per_second");
            rule(endpoint.rate_per_second == Some(0), &key, "must be at least 1")?;
        }
        Ok(())
    }

    fn validate_secrets(&self) -> Result<(), ConfigError> {
        let signing = &self.signing;
        let effective = |route: &RouteConfig| route.scheme.unwrap_or(signing.scheme);
        // Who signs with each secret list, and with which scheme: the defaults sign with
        // signing.scheme and for every route without a key of its own; a named key for the
        // routes naming it. A secret needs the Standard Webhooks format only where it will
        // sign with that scheme, and a whsk_ key must never meet an HMAC-only scheme.
        let route_users = |key: Option<&str>| -> Vec<SchemeUser> {
            self.routes
                .iter()
                .enumerate()
                .filter(|(_, r)| r.signing_key.as_deref() == key)
                .map(|(i, r)| (effective(r), format!("route[{i}] ({:?})", r.name)))
                .collect()
        };
        let mut default_users = vec![(signing.scheme, "signing.scheme".to_string())];
        default_users.extend(route_users(None));
        check_secrets("signing.secrets", &signing.secrets, &default_users)?;
        for (name, signing_key) in &signing.keys {
            let (secrets, key) = (&signing_key.secrets, format!("signing.keys.{name}"));
            rule(name.is_empty(), "signing.keys", "has an entry with an empty name")?;
            rule(secrets.is_empty(), &key, "must list at least one secret")?;
            check_secrets(&key, secrets, &route_users(Some(name)))?;
        }
        Ok(())
    }
}

/// The error of the rule at `key`, when it is `broken`.
pub(super) fn rule(broken: bool, key: &str, problem: impl fmt::Display) -> Result<(), ConfigError> {
    match broken {
        true => Err(ConfigError::invalid(key, problem)),
        false => Ok(()),
    }
}

fn check_http_url(key: &str, url: &Url) -> Result<(), ConfigError> {
    let problem = format_args!("must be an http or https URL (not {:?})", url.scheme());
    rule(!matches!(url.scheme(), "http" | "https"), key, problem)?;
    rule(url.host_str().is_none_or(str::is_empty), key, "must have a host")
}

/// Whether two listeners would fight over a port. Port 0 asks the OS for a free port, so
/// two such listeners never collide; an unspecified address collides with every address on
/// the same port.
fn collide(a: SocketAddr, b: SocketAddr) -> bool {
    let overlap = a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified();
    a.port() != 0 && a.port() == b.port() && overlap
}

/// 127.0.0.0/8 and ::1 (also as `::ffff:127.x.y.z`). The unspecified addresses (0.0.0.0,
/// ::) are not loopback: they serve every interface.
fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// `name:port` or `[v6]:port` with a non-zero port.
pub(super) fn is_host_port(text: &str) -> bool {
    let (host, port) = match text.strip_prefix('[') {
        Some(rest) => match rest.split_once("]:") {
            Some((v6, port)) => (v6.parse::<std::net::Ipv6Addr>().is_ok().then_some(v6), port),
            None => return false,
        },
        None => match text.rsplit_once(':') {
            Some((host, port)) => (Some(host), port),
            None => return false,
        },
    };
    let host_ok = host.is_some_and(|h| {
        !h.is_empty() && !h.contains(['/', ' ', '@', '?', '#']) && (text.starts_with('[') || !h.contains(':'))
    });
    host_ok && port.parse::<u16>().is_ok_and(|p| p != 0)
}

/// A scheme a secret list signs with, and the setting that makes it (`signing.scheme`,
/// `route[0] ("billing")`), for the error message.
type SchemeUser = (SignatureScheme, String);

fn check_secrets(key: &str, secrets: &[Secret], users: &[SchemeUser]) -> Result<(), ConfigError> {
    let standard = users.iter().any(|(scheme, _)| *scheme == SignatureScheme::Standard);
    let hmac_only = users
        .iter()
        .find(|(scheme, _)| matches!(scheme, SignatureScheme::Stripe | SignatureScheme::Github));
    for (i, secret) in secrets.iter().enumerate() {
        let (item, secret) = (format!("{key}[{i}]"), secret.expose());
        rule(secret.is_empty(), &item, "must not be empty")?;
        // A whsk_ key is only ever an Ed25519 key, so it is checked wherever it is listed:
        // a message may still pick it with Courier-Signing-Key.
        if ed25519::is_secret(secret) {
            let problem = "is not an Ed25519 secret key: expected whsk_ followed by the base64 of a 32-byte seed, \
                 as `courier keys generate` prints (value not shown)";
            rule(ed25519::decode_secret(secret).is_none(), &item, problem)?;
            if let Some((scheme, who)) = hmac_only {
                let scheme = scheme.as_str();
                let problem = format_args!(
                    "is an Ed25519 key (whsk_), which signs only with the standard scheme, but {who} signs with it \
                     using the {scheme} scheme (HMAC only); use a separate [signing.keys] entry"
                );
                return Err(ConfigError::invalid(&item, problem));
            }
            continue;
        }
        let problem = "is used with the standard scheme and must be whsec_ followed by base64, or an Ed25519 \
             whsk_ key (value not shown)";
        rule(standard && !is_standard_secret(secret), &item, problem)?;
    }
    Ok(())
}

/// `whsec_<base64>` or bare base64 (as svix accepts), standard alphabet, padding optional,
/// decoding to at least one byte: as lenient as the signer's decoder, so what passes here signs.
pub(super) fn is_standard_secret(secret: &str) -> bool {
    const ENGINE: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true),
    );
    let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
    ENGINE.decode(encoded).is_ok_and(|key| !key.is_empty())
}
