//! The typed configuration: one tree of plain values ([`Config`]) built from four layers,
//! lowest to highest precedence — the embedded defaults (CONTRACT §7), a TOML file
//! (`--config` or `COURIER_CONFIG`), the `COURIER_*` environment variables of [`ENV_VARS`],
//! and the command-line flags ([`Overrides`]) — then checked by [`Config::validate`].
//!
//! Shape of the code, and why:
//! - The TOML layer is a serde tree of `Option` fields with `deny_unknown_fields` at every
//!   level, so a typo is an error instead of a silently ignored setting. Durations, sizes,
//!   addresses and URLs are read as strings and converted here, so every conversion error
//!   names the key it came from.
//! - The environment is read only through a closure and only for the names in
//!   [`ENV_VARS`]: tests inject variables without touching the process, and the variables
//!   Kubernetes invents for a Service named `courier` (`COURIER_PORT`, ...) are ignored.
//! - Every error is one line naming the place (file and key, variable, flag) and never
//!   contains a secret: tokens and signing secrets are [`Secret`]s from the moment they are
//!   read, values of secret variables are not echoed, and serde's "invalid type" messages
//!   have their quoted string removed because it may be a secret put under the wrong key.
//! - `alert_url` is treated as sensitive too (chat-style alert URLs carry their credential
//!   in the path): `Debug` and [`Config::summary`] show only its origin.

pub mod units;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use ipnet::IpNet;
use serde::Deserialize;
use url::Url;

use crate::model::{Jitter, SignatureScheme};
use crate::signing::Secret;
use units::{format_duration, parse_duration, parse_size};

/// The environment variable naming the TOML file (used when `--config` is not given).
pub const CONFIG_ENV: &str = "COURIER_CONFIG";

/// Every environment variable the env layer reads (besides [`CONFIG_ENV`]), in the order of
/// the config file. Any other `COURIER_*` variable is ignored.
pub const ENV_VARS: [&str; 27] = [
    "COURIER_LISTEN",
    "COURIER_ADMIN_LISTEN",
    "COURIER_DATA_DIR",
    "COURIER_MAX_BODY",
    "COURIER_SHUTDOWN_GRACE",
    "COURIER_RETENTION",
    "COURIER_DEAD_RETENTION",
    "COURIER_INGRESS_TOKEN",
    "COURIER_ADMIN_TOKEN",
    "COURIER_ALERT_URL",
    "COURIER_RETRY_BASE_DELAY",
    "COURIER_RETRY_MAX_DELAY",
    "COURIER_RETRY_JITTER",
    "COURIER_RETRY_MAX_ATTEMPTS",
    "COURIER_RETRY_GIVE_UP_AFTER",
    "COURIER_RETRY_MAX_ATTEMPTS_404",
    "COURIER_RETRY_MAX_RETRY_AFTER",
    "COURIER_DELIVERY_CONNECT_TIMEOUT",
    "COURIER_DELIVERY_REQUEST_TIMEOUT",
    "COURIER_DELIVERY_MAX_IN_FLIGHT_PER_HOST",
    "COURIER_DELIVERY_RATE_PER_SECOND",
    "COURIER_DELIVERY_PAUSE_AFTER_PERMANENT_FAILURES",
    "COURIER_DELIVERY_MAX_RESPONSE_BODY",
    "COURIER_SIGNING_SCHEME",
    "COURIER_SIGNING_SECRETS",
    "COURIER_EGRESS_ALLOW_PRIVATE_TARGETS",
    "COURIER_EGRESS_ALLOW",
];

/// Variables whose values are never echoed in an error (credentials, or URLs that may carry one).
const SENSITIVE_ENV_VARS: [&str; 4] = [
    "COURIER_INGRESS_TOKEN",
    "COURIER_ADMIN_TOKEN",
    "COURIER_SIGNING_SECRETS",
    "COURIER_ALERT_URL",
];

/// A configuration problem: one line naming what is wrong and where (file and key,
/// environment variable, flag, or setting). Never contains a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{place}: {problem}")]
pub struct ConfigError {
    place: String,
    problem: String,
}

impl ConfigError {
    fn new(place: impl Into<String>, problem: impl Into<String>) -> Self {
        // One line, always: the CLI prints this as the single line before exiting.
        let one_line = |s: String| {
            s.split(['\n', '\r'])
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        };
        ConfigError {
            place: one_line(place.into()),
            problem: one_line(problem.into()),
        }
    }

    fn file(origin: &str, problem: impl Into<String>) -> Self {
        ConfigError::new(format!("config {origin}"), problem)
    }

    fn env(name: &str, value: &str, problem: impl Into<String>) -> Self {
        if SENSITIVE_ENV_VARS.contains(&name) {
            ConfigError::new(name, problem)
        } else {
            ConfigError::new(format!("{name}={value:?}"), problem)
        }
    }

    fn invalid(key: &str, problem: impl fmt::Display) -> Self {
        ConfigError::new("invalid config", format!("{key} {problem}"))
    }

    /// Where the problem is: `config <file>`, `<VARIABLE>="<value>"`, `--flag "<value>"` or
    /// `invalid config` (a rule of [`Config::validate`]).
    pub fn place(&self) -> &str {
        &self.place
    }

    /// What is wrong (starts with the key for file and validation problems).
    pub fn problem(&self) -> &str {
        &self.problem
    }
}

/// Settings given as command-line flags: the highest layer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--config FILE` (takes precedence over `COURIER_CONFIG`).
    pub config: Option<PathBuf>,
    /// `--listen ip:port`.
    pub listen: Option<String>,
    /// `--admin-listen ip:port`.
    pub admin_listen: Option<String>,
    /// `--data-dir DIR`.
    pub data_dir: Option<PathBuf>,
}

/// The give-up and backoff policy (`[retry]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryConfig {
    /// Backoff before the second attempt; doubles per attempt.
    pub base_delay: Duration,
    /// Cap of the doubled backoff.
    pub max_delay: Duration,
    /// How the backoff is randomised.
    pub jitter: Jitter,
    /// Attempts after which a message is dead-lettered.
    pub max_attempts: u32,
    /// Time after acceptance past which no attempt is made.
    pub give_up_after: Duration,
    /// Attempts allowed while the receiver answers 404.
    pub max_attempts_404: u32,
    /// Cap of a receiver's `Retry-After`.
    pub max_retry_after: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            base_delay: Duration::from_secs(60),
            max_delay: Duration::from_secs(3600),
            jitter: Jitter::Equal,
            max_attempts: 16,
            give_up_after: Duration::from_secs(3 * 86_400),
            max_attempts_404: 5,
            max_retry_after: Duration::from_secs(86_400),
        }
    }
}

/// Attempt limits (`[delivery]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryConfig {
    /// Per-attempt TCP + TLS connect timeout.
    pub connect_timeout: Duration,
    /// Whole-attempt timeout.
    pub request_timeout: Duration,
    /// Attempts in flight to one `host:port`, unless a `[[host]]` overrides it.
    pub max_in_flight_per_host: u32,
    /// Attempts per second per endpoint, unless an `[[endpoint]]` overrides it.
    pub rate_per_second: u32,
    /// Consecutive permanent failures that pause an endpoint.
    pub pause_after_permanent_failures: u32,
    /// Bytes of a response body kept.
    pub max_response_body: u64,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_in_flight_per_host: 10,
            rate_per_second: 100,
            pause_after_permanent_failures: 100,
            max_response_body: 64 << 10,
        }
    }
}

/// Signature settings (`[signing]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SigningConfig {
    /// The scheme used when neither a route nor the message chooses one.
    pub scheme: SignatureScheme,
    /// Default secrets; all of them sign (rotation). Empty: unsigned unless a message brings one.
    pub secrets: Vec<Secret>,
    /// Named secret sets, referenced by routes and by `Courier-Signing-Key`.
    pub keys: BTreeMap<String, Vec<Secret>>,
}

/// Egress policy openings (`[egress]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressConfig {
    /// Allow every non-global address (loopback, private, link-local, ...).
    pub allow_private_targets: bool,
    /// Networks allowed even though they are not global.
    pub allow: Vec<IpNet>,
}

/// A named route (`[[route]]`): `POST /r/<name>` delivers to `url`.
#[derive(Clone, PartialEq, Eq)]
pub struct RouteConfig {
    /// The name in `/r/<name>`.
    pub name: String,
    /// The target; extra path and query of the request are appended.
    pub url: Url,
    /// The name of a `[signing.keys]` entry to sign with instead of the default secrets.
    pub signing_key: Option<String>,
    /// The scheme for this route instead of `signing.scheme`.
    pub scheme: Option<SignatureScheme>,
}

impl fmt::Debug for RouteConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteConfig")
            .field("name", &self.name)
            .field("url", &without_password(&self.url))
            .field("signing_key", &self.signing_key)
            .field("scheme", &self.scheme)
            .finish()
    }
}

/// A per-host override of the in-flight cap (`[[host]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    /// `name:port` (e.g. `api.example:443`, `[::1]:8080`), compared case-insensitively.
    pub host: String,
    /// Attempts in flight to this host at most.
    pub max_in_flight: u32,
}

/// A per-endpoint override of the rate limit (`[[endpoint]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointConfig {
    /// The endpoint key (by default a target URL without its query).
    pub key: String,
    /// Attempts per second to this endpoint at most.
    pub rate_per_second: u32,
}

/// The whole configuration: values only; the modules that use them own their meaning.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// Ingress listener.
    pub listen: SocketAddr,
    /// Admin listener.
    pub admin_listen: SocketAddr,
    /// Where the store lives.
    pub data_dir: PathBuf,
    /// Largest accepted request body, in bytes.
    pub max_body: u64,
    /// How long in-flight attempts may finish after SIGTERM.
    pub shutdown_grace: Duration,
    /// How long delivered messages are kept.
    pub retention: Duration,
    /// How long dead-lettered messages are kept.
    pub dead_retention: Duration,
    /// Required on ingress when set.
    pub ingress_token: Option<Secret>,
    /// Required on the admin API (but `/healthz`) when set.
    pub admin_token: Option<Secret>,
    /// Where endpoint-paused alerts are posted.
    pub alert_url: Option<Url>,
    /// `[retry]`.
    pub retry: RetryConfig,
    /// `[delivery]`.
    pub delivery: DeliveryConfig,
    /// `[signing]`.
    pub signing: SigningConfig,
    /// `[egress]`.
    pub egress: EgressConfig,
    /// `[[route]]`, in file order.
    pub routes: Vec<RouteConfig>,
    /// `[[host]]`, in file order.
    pub hosts: Vec<HostConfig>,
    /// `[[endpoint]]`, in file order.
    pub endpoints: Vec<EndpointConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8787),
            admin_listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8788),
            data_dir: PathBuf::from("./courier-data"),
            max_body: 1 << 20,
            shutdown_grace: Duration::from_secs(30),
            retention: Duration::from_secs(3 * 86_400),
            dead_retention: Duration::from_secs(30 * 86_400),
            ingress_token: None,
            admin_token: None,
            alert_url: None,
            retry: RetryConfig::default(),
            delivery: DeliveryConfig::default(),
            signing: SigningConfig::default(),
            egress: EgressConfig::default(),
            routes: Vec::new(),
            hosts: Vec::new(),
            endpoints: Vec::new(),
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("admin_listen", &self.admin_listen)
            .field("data_dir", &self.data_dir)
            .field("max_body", &self.max_body)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("retention", &self.retention)
            .field("dead_retention", &self.dead_retention)
            .field("ingress_token", &self.ingress_token)
            .field("admin_token", &self.admin_token)
            .field("alert_url", &self.alert_url.as_ref().map(origin_only))
            .field("retry", &self.retry)
            .field("delivery", &self.delivery)
            .field("signing", &self.signing)
            .field("egress", &self.egress)
            .field("routes", &self.routes)
            .field("hosts", &self.hosts)
            .field("endpoints", &self.endpoints)
            .finish()
    }
}

impl Config {
    /// Builds the configuration from every layer — defaults, the TOML file (`flags.config`,
    /// else `COURIER_CONFIG`; a missing or unreadable file is an error), the variables of
    /// [`ENV_VARS`] read through `env`, then `flags` — and validates it.
    pub fn load(flags: &Overrides, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        // An empty COURIER_CONFIG (e.g. `COURIER_CONFIG=${X}` with X unset) means "no file".
        let path = flags
            .config
            .clone()
            .or_else(|| env(CONFIG_ENV).filter(|p| !p.trim().is_empty()).map(PathBuf::from));
        let mut config = match path {
            Some(path) => {
                let origin = path.display().to_string();
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| ConfigError::file(&origin, format!("cannot read the file: {e}")))?;
                Config::from_toml_str(&text, &origin)?
            }
            None => Config::default(),
        };
        config.apply_env(env)?;
        config.apply_flags(flags)?;
        config.validate()?;
        Ok(config)
    }

    /// The defaults overlaid with the TOML `text`; `origin` (usually the file path) names it
    /// in errors. Does not validate: call [`Config::validate`].
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|e| toml_error(text, origin, &e))?;
        let mut config = Config::default();
        config
            .apply_file(file)
            .map_err(|problem| ConfigError::file(origin, problem))?;
        Ok(config)
    }

    /// Checks the rules the types cannot express (non-zero limits, unique names, known
    /// signing keys, secret formats, ...). The first broken rule is the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_top()?;
        self.validate_retry_and_delivery()?;
        self.validate_routes()?;
        self.validate_hosts_and_endpoints()?;
        self.validate_secrets()
    }

    /// A few human lines describing the effective settings, for `courier check-config`.
    /// Tokens and secrets are reported as set or counted, never shown.
    pub fn summary(&self) -> String {
        let set = |s: &Option<Secret>| if s.is_some() { "set" } else { "unset" };
        let r = &self.retry;
        let d = &self.delivery;
        let mut lines = vec![
            format!(
                "listen {} (ingress), {} (admin); data_dir {}",
                self.listen,
                self.admin_listen,
                self.data_dir.display()
            ),
            format!(
                "max_body {}; ingress_token {}; admin_token {}; alert_url {}",
                format_size(self.max_body),
                set(&self.ingress_token),
                set(&self.admin_token),
                self.alert_url.as_ref().map_or_else(|| "unset".to_string(), origin_only)
            ),
            format!(
                "shutdown_grace {}; retention {} (delivered), {} (dead)",
                format_duration(self.shutdown_grace),
                format_duration(self.retention),
                format_duration(self.dead_retention)
            ),
            format!(
                concat!(
                    "retry: base_delay {}, max_delay {}, jitter {}, max_attempts {}, max_attempts_404 {}, ",
                    "give_up_after {}, max_retry_after {}"
                ),
                format_duration(r.base_delay),
                format_duration(r.max_delay),
                jitter_name(r.jitter),
                r.max_attempts,
                r.max_attempts_404,
                format_duration(r.give_up_after),
                format_duration(r.max_retry_after)
            ),
            format!(
                concat!(
                    "delivery: connect_timeout {}, request_timeout {}, max_in_flight_per_host {}, rate_per_second {}, ",
                    "pause_after_permanent_failures {}, max_response_body {}"
                ),
                format_duration(d.connect_timeout),
                format_duration(d.request_timeout),
                d.max_in_flight_per_host,
                d.rate_per_second,
                d.pause_after_permanent_failures,
                format_size(d.max_response_body)
            ),
        ];
        let keys: Vec<String> = self
            .signing
            .keys
            .iter()
            .map(|(name, s)| format!("{name} ({})", count(s.len(), "secret")))
            .collect();
        lines.push(format!(
            "signing: scheme {}, {} by default, keys: {}",
            self.signing.scheme.as_str(),
            count(self.signing.secrets.len(), "secret"),
            if keys.is_empty() {
                "none".to_string()
            } else {
                keys.join(", ")
            }
        ));
        let allow: Vec<String> = self.egress.allow.iter().map(IpNet::to_string).collect();
        lines.push(format!(
            "egress: private targets {}, allow: {}",
            if self.egress.allow_private_targets {
                "allowed"
            } else {
                "refused"
            },
            if allow.is_empty() {
                "none".to_string()
            } else {
                allow.join(", ")
            }
        ));
        for route in &self.routes {
            lines.push(format!(
                "route {} -> {} (signing key {}, scheme {})",
                route.name,
                without_password(&route.url),
                route.signing_key.as_deref().unwrap_or("default"),
                route.scheme.unwrap_or(self.signing.scheme).as_str()
            ));
        }
        for host in &self.hosts {
            lines.push(format!("host {}: max_in_flight {}", host.host, host.max_in_flight));
        }
        for endpoint in &self.endpoints {
            lines.push(format!(
                "endpoint {}: rate_per_second {}",
                endpoint.key, endpoint.rate_per_second
            ));
        }
        lines.join("\n")
    }

    /// The URL of the named route.
    pub fn route_url(&self, name: &str) -> Option<Url> {
        self.routes.iter().find(|r| r.name == name).map(|r| r.url.clone())
    }

    /// The in-flight cap for a `host:port` key: its `[[host]]` override, else
    /// `delivery.max_in_flight_per_host`.
    pub fn host_max_in_flight(&self, host_key: &str) -> u32 {
        self.hosts
            .iter()
            .find(|h| h.host.eq_ignore_ascii_case(host_key))
            .map_or(self.delivery.max_in_flight_per_host, |h| h.max_in_flight)
    }

    /// The rate limit for an endpoint key: its `[[endpoint]]` override, else
    /// `delivery.rate_per_second`.
    pub fn endpoint_rate(&self, key: &str) -> u32 {
        self.endpoints
            .iter()
            .find(|e| e.key == key)
            .map_or(self.delivery.rate_per_second, |e| e.rate_per_second)
    }

    /// The secrets of a `[signing.keys]` entry.
    pub fn signing_key(&self, name: &str) -> Option<&[Secret]> {
        self.signing.keys.get(name).map(Vec::as_slice)
    }

    fn apply_file(&mut self, file: FileConfig) -> Result<(), String> {
        set(&mut self.listen, "listen", file.listen, parse_listen)?;
        set(&mut self.admin_listen, "admin_listen", file.admin_listen, parse_listen)?;
        set(&mut self.data_dir, "data_dir", file.data_dir, |s| Ok(PathBuf::from(s)))?;
        set(&mut self.max_body, "max_body", file.max_body, parse_size_text)?;
        set(
            &mut self.shutdown_grace,
            "shutdown_grace",
            file.shutdown_grace,
            parse_duration_text,
        )?;
        set(&mut self.retention, "retention", file.retention, parse_duration_text)?;
        set(
            &mut self.dead_retention,
            "dead_retention",
            file.dead_retention,
            parse_duration_text,
        )?;
        if let Some(token) = file.ingress_token {
            self.ingress_token = Some(Secret::new(token));
        }
        if let Some(token) = file.admin_token {
            self.admin_token = Some(Secret::new(token));
        }
        set_opt(&mut self.alert_url, "alert_url", file.alert_url, parse_url)?;

        if let Some(retry) = file.retry {
            let r = &mut self.retry;
            set(
                &mut r.base_delay,
                "retry.base_delay",
                retry.base_delay,
                parse_duration_text,
            )?;
            set(
                &mut r.max_delay,
                "retry.max_delay",
                retry.max_delay,
                parse_duration_text,
            )?;
            set(&mut r.jitter, "retry.jitter", retry.jitter, parse_jitter)?;
            r.max_attempts = retry.max_attempts.unwrap_or(r.max_attempts);
            set(
                &mut r.give_up_after,
                "retry.give_up_after",
                retry.give_up_after,
                parse_duration_text,
            )?;
            r.max_attempts_404 = retry.max_attempts_404.unwrap_or(r.max_attempts_404);
            set(
                &mut r.max_retry_after,
                "retry.max_retry_after",
                retry.max_retry_after,
                parse_duration_text,
            )?;
        }
        if let Some(delivery) = file.delivery {
            let d = &mut self.delivery;
            set(
                &mut d.connect_timeout,
                "delivery.connect_timeout",
                delivery.connect_timeout,
                parse_duration_text,
            )?;
            set(
                &mut d.request_timeout,
                "delivery.request_timeout",
                delivery.request_timeout,
                parse_duration_text,
            )?;
            d.max_in_flight_per_host = delivery.max_in_flight_per_host.unwrap_or(d.max_in_flight_per_host);
            d.rate_per_second = delivery.rate_per_second.unwrap_or(d.rate_per_second);
            d.pause_after_permanent_failures = delivery
                .pause_after_permanent_failures
                .unwrap_or(d.pause_after_permanent_failures);
            set(
                &mut d.max_response_body,
                "delivery.max_response_body",
                delivery.max_response_body,
                parse_size_text,
            )?;
        }
        if let Some(signing) = file.signing {
            set(&mut self.signing.scheme, "signing.scheme", signing.scheme, parse_scheme)?;
            if let Some(secrets) = signing.secrets {
                self.signing.secrets = secrets.into_iter().map(Secret::new).collect();
            }
            if let Some(keys) = signing.keys {
                self.signing.keys = keys
                    .into_iter()
                    .map(|(name, s)| (name, s.into_iter().map(Secret::new).collect()))
                    .collect();
            }
        }

        // CONTRACT §6 spells these two at the top level; §7 puts them in [egress]. Both are
        // accepted, but not both spellings of the same setting at once.
        let egress = file.egress.unwrap_or_default();
        let private = one_of(
            "egress.allow_private_targets",
            egress.allow_private_targets,
            file.allow_private_targets,
        )?;
        let allow = one_of("egress.allow", egress.allow, file.egress_allow)?;
        if let Some(private) = private {
            self.egress.allow_private_targets = private;
        }
        if let Some(allow) = allow {
            self.egress.allow = allow
                .iter()
                .enumerate()
                .map(|(i, net)| parse_net(net).map_err(|e| format!("egress.allow[{i}]: {e}")))
                .collect::<Result<_, _>>()?;
        }

        if let Some(routes) = file.route {
            self.routes = routes
                .into_iter()
                .enumerate()
                .map(|(i, r)| r.into_route(i))
                .collect::<Result<_, _>>()?;
        }
        if let Some(hosts) = file.host {
            self.hosts = hosts
                .into_iter()
                .enumerate()
                .map(|(i, h)| {
                    Ok(HostConfig {
                        host: h.host.ok_or_else(|| format!("host[{i}]: missing key \"host\""))?,
                        max_in_flight: h
                            .max_in_flight
                            .ok_or_else(|| format!("host[{i}]: missing key \"max_in_flight\""))?,
                    })
                })
                .collect::<Result<_, String>>()?;
        }
        if let Some(endpoints) = file.endpoint {
            self.endpoints = endpoints
                .into_iter()
                .enumerate()
                .map(|(i, e)| {
                    Ok(EndpointConfig {
                        key: e.key.ok_or_else(|| format!("endpoint[{i}]: missing key \"key\""))?,
                        rate_per_second: e
                            .rate_per_second
                            .ok_or_else(|| format!("endpoint[{i}]: missing key \"rate_per_second\""))?,
                    })
                })
                .collect::<Result<_, String>>()?;
        }
        Ok(())
    }

    fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        for name in ENV_VARS {
            if let Some(value) = env(name) {
                self.set_from_env(name, &value)
                    .map_err(|problem| ConfigError::env(name, &value, problem))?;
            }
        }
        Ok(())
    }

    fn set_from_env(&mut self, name: &str, v: &str) -> Result<(), String> {
        let (r, d) = (&mut self.retry, &mut self.delivery);
        match name {
            "COURIER_LISTEN" => self.listen = parse_listen(v)?,
            "COURIER_ADMIN_LISTEN" => self.admin_listen = parse_listen(v)?,
            "COURIER_DATA_DIR" => self.data_dir = PathBuf::from(v),
            "COURIER_MAX_BODY" => self.max_body = parse_size_text(v)?,
            "COURIER_SHUTDOWN_GRACE" => self.shutdown_grace = parse_duration_text(v)?,
            "COURIER_RETENTION" => self.retention = parse_duration_text(v)?,
            "COURIER_DEAD_RETENTION" => self.dead_retention = parse_duration_text(v)?,
            "COURIER_INGRESS_TOKEN" => self.ingress_token = Some(Secret::new(v.to_string())),
            "COURIER_ADMIN_TOKEN" => self.admin_token = Some(Secret::new(v.to_string())),
            "COURIER_ALERT_URL" => self.alert_url = Some(parse_url(v)?),
            "COURIER_RETRY_BASE_DELAY" => r.base_delay = parse_duration_text(v)?,
            "COURIER_RETRY_MAX_DELAY" => r.max_delay = parse_duration_text(v)?,
            "COURIER_RETRY_JITTER" => r.jitter = parse_jitter(v)?,
            "COURIER_RETRY_MAX_ATTEMPTS" => r.max_attempts = parse_u32(v)?,
            "COURIER_RETRY_GIVE_UP_AFTER" => r.give_up_after = parse_duration_text(v)?,
            "COURIER_RETRY_MAX_ATTEMPTS_404" => r.max_attempts_404 = parse_u32(v)?,
            "COURIER_RETRY_MAX_RETRY_AFTER" => r.max_retry_after = parse_duration_text(v)?,
            "COURIER_DELIVERY_CONNECT_TIMEOUT" => d.connect_timeout = parse_duration_text(v)?,
            "COURIER_DELIVERY_REQUEST_TIMEOUT" => d.request_timeout = parse_duration_text(v)?,
            "COURIER_DELIVERY_MAX_IN_FLIGHT_PER_HOST" => d.max_in_flight_per_host = parse_u32(v)?,
            "COURIER_DELIVERY_RATE_PER_SECOND" => d.rate_per_second = parse_u32(v)?,
            "COURIER_DELIVERY_PAUSE_AFTER_PERMANENT_FAILURES" => d.pause_after_permanent_failures = parse_u32(v)?,
            "COURIER_DELIVERY_MAX_RESPONSE_BODY" => d.max_response_body = parse_size_text(v)?,
            "COURIER_SIGNING_SCHEME" => self.signing.scheme = parse_scheme(v)?,
            "COURIER_SIGNING_SECRETS" => {
                // The message must not say which secret is empty by quoting it, only where.
                self.signing.secrets = split_list(v)
                    .map_err(|i| format!("item {} of the comma-separated list is empty", i + 1))?
                    .into_iter()
                    .map(|s| Secret::new(s.to_string()))
                    .collect();
            }
            "COURIER_EGRESS_ALLOW_PRIVATE_TARGETS" => self.egress.allow_private_targets = parse_bool(v)?,
            "COURIER_EGRESS_ALLOW" => {
                self.egress.allow = split_list(v)
                    .map_err(|i| format!("item {} of the comma-separated list is empty", i + 1))?
                    .into_iter()
                    .map(parse_net)
                    .collect::<Result<_, _>>()?;
            }
            // Unreachable by construction: every name of ENV_VARS has an arm above.
            _ => {}
        }
        Ok(())
    }

    fn apply_flags(&mut self, flags: &Overrides) -> Result<(), ConfigError> {
        if let Some(listen) = &flags.listen {
            self.listen = parse_listen(listen).map_err(|e| ConfigError::new(format!("--listen {listen:?}"), e))?;
        }
        if let Some(admin) = &flags.admin_listen {
            self.admin_listen =
                parse_listen(admin).map_err(|e| ConfigError::new(format!("--admin-listen {admin:?}"), e))?;
        }
        if let Some(dir) = &flags.data_dir {
            self.data_dir = dir.clone();
        }
        Ok(())
    }

    fn validate_top(&self) -> Result<(), ConfigError> {
        let (a, b) = (self.listen, self.admin_listen);
        // Port 0 asks the OS for a free port, so two such listeners never collide; an
        // unspecified address collides with every address on the same port.
        let overlap = a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified();
        if a.port() != 0 && a.port() == b.port() && overlap {
            return Err(ConfigError::invalid(
                "admin_listen",
                format_args!("({b}) must differ from listen ({a})"),
            ));
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::invalid("data_dir", "must not be empty"));
        }
        if self.max_body < 1 {
            return Err(ConfigError::invalid("max_body", "must be at least 1 byte"));
        }
        for (key, token) in [
            ("ingress_token", &self.ingress_token),
            ("admin_token", &self.admin_token),
        ] {
            if token.as_ref().is_some_and(|t| t.expose().trim().is_empty()) {
                return Err(ConfigError::invalid(
                    key,
                    "must not be empty (leave it unset to disable auth)",
                ));
            }
        }
        if let Some(url) = &self.alert_url {
            check_http_url("alert_url", url)?;
        }
        Ok(())
    }

    fn validate_retry_and_delivery(&self) -> Result<(), ConfigError> {
        let (r, d) = (&self.retry, &self.delivery);
        let positive = [
            ("retry.base_delay", r.base_delay),
            ("retry.give_up_after", r.give_up_after),
            ("delivery.connect_timeout", d.connect_timeout),
            ("delivery.request_timeout", d.request_timeout),
        ];
        for (key, value) in positive {
            if value.is_zero() {
                return Err(ConfigError::invalid(key, "must be greater than 0"));
            }
        }
        if r.max_delay < r.base_delay {
            return Err(ConfigError::invalid(
                "retry.max_delay",
                format_args!(
                    "({}) must be at least retry.base_delay ({})",
                    format_duration(r.max_delay),
                    format_duration(r.base_delay)
                ),
            ));
        }
        let at_least_one = [
            ("retry.max_attempts", r.max_attempts),
            ("retry.max_attempts_404", r.max_attempts_404),
            ("delivery.max_in_flight_per_host", d.max_in_flight_per_host),
            ("delivery.rate_per_second", d.rate_per_second),
            (
                "delivery.pause_after_permanent_failures",
                d.pause_after_permanent_failures,
            ),
        ];
        for (key, value) in at_least_one {
            if value < 1 {
                return Err(ConfigError::invalid(key, "must be at least 1"));
            }
        }
        Ok(())
    }

    fn validate_routes(&self) -> Result<(), ConfigError> {
        let mut names = BTreeSet::new();
        for (i, route) in self.routes.iter().enumerate() {
            let key = |field: &str| format!("route[{i}].{field}");
            let name = &route.name;
            if name.is_empty() {
                return Err(ConfigError::invalid(&key("name"), "must not be empty"));
            }
            if !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(ConfigError::invalid(
                    &key("name"),
                    format_args!("{name:?} may contain only A-Z a-z 0-9 _ -"),
                ));
            }
            if !names.insert(name.as_str()) {
                return Err(ConfigError::invalid(
                    &key("name"),
                    format_args!("{name:?} is used by an earlier route"),
                ));
            }
            check_http_url(&key("url"), &route.url)?;
            if let Some(signing_key) = &route.signing_key {
                if !self.signing.keys.contains_key(signing_key) {
                    return Err(ConfigError::invalid(
                        &key("signing_key"),
                        format_args!("{signing_key:?} is not a name in signing.keys"),
                    ));
                }
            }
        }
        Ok(())
    }

    fn validate_hosts_and_endpoints(&self) -> Result<(), ConfigError> {
        let mut hosts = BTreeSet::new();
        for (i, host) in self.hosts.iter().enumerate() {
            let key = format!("host[{i}].host");
            if !is_host_port(&host.host) {
                return Err(ConfigError::invalid(
                    &key,
                    format_args!("{:?} must be name:port, like api.example:443", host.host),
                ));
            }
            if !hosts.insert(host.host.to_ascii_lowercase()) {
                return Err(ConfigError::invalid(
                    &key,
                    format_args!("{:?} is listed twice", host.host),
                ));
            }
            if host.max_in_flight < 1 {
                return Err(ConfigError::invalid(
                    &format!("host[{i}].max_in_flight"),
                    "must be at least 1",
                ));
            }
        }
        let mut keys = BTreeSet::new();
        for (i, endpoint) in self.endpoints.iter().enumerate() {
            let key = format!("endpoint[{i}].key");
            if endpoint.key.is_empty() {
                return Err(ConfigError::invalid(&key, "must not be empty"));
            }
            if !keys.insert(endpoint.key.as_str()) {
                return Err(ConfigError::invalid(
                    &key,
                    format_args!("{:?} is listed twice", endpoint.key),
                ));
            }
            if endpoint.rate_per_second < 1 {
                return Err(ConfigError::invalid(
                    &format!("endpoint[{i}].rate_per_second"),
                    "must be at least 1",
                ));
            }
        }
        Ok(())
    }

    fn validate_secrets(&self) -> Result<(), ConfigError> {
        let signing = &self.signing;
        let effective = |route: &RouteConfig| route.scheme.unwrap_or(signing.scheme);
        // A secret needs the Standard Webhooks format only where it will sign with that scheme.
        let defaults_standard = signing.scheme == SignatureScheme::Standard
            || self
                .routes
                .iter()
                .any(|r| r.signing_key.is_none() && effective(r) == SignatureScheme::Standard);
        check_secrets("signing.secrets", &signing.secrets, defaults_standard)?;
        for (name, secrets) in &signing.keys {
            let key = format!("signing.keys.{name}");
            if name.is_empty() {
                return Err(ConfigError::invalid("signing.keys", "has an entry with an empty name"));
            }
            if secrets.is_empty() {
                return Err(ConfigError::invalid(&key, "must list at least one secret"));
            }
            let standard = self
                .routes
                .iter()
                .any(|r| r.signing_key.as_deref() == Some(name.as_str()) && effective(r) == SignatureScheme::Standard);
            check_secrets(&key, secrets, standard)?;
        }
        Ok(())
    }
}

/// The TOML file, as written: every key optional, unknown keys rejected at every level.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    admin_listen: Option<String>,
    data_dir: Option<String>,
    max_body: Option<String>,
    shutdown_grace: Option<String>,
    retention: Option<String>,
    dead_retention: Option<String>,
    ingress_token: Option<String>,
    admin_token: Option<String>,
    alert_url: Option<String>,
    /// CONTRACT §6's spelling of `egress.allow_private_targets`.
    allow_private_targets: Option<bool>,
    /// CONTRACT §6's spelling of `egress.allow`.
    egress_allow: Option<Vec<String>>,
    retry: Option<FileRetry>,
    delivery: Option<FileDelivery>,
    signing: Option<FileSigning>,
    egress: Option<FileEgress>,
    route: Option<Vec<FileRoute>>,
    host: Option<Vec<FileHost>>,
    endpoint: Option<Vec<FileEndpoint>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRetry {
    base_delay: Option<String>,
    max_delay: Option<String>,
    jitter: Option<String>,
    max_attempts: Option<u32>,
    give_up_after: Option<String>,
    max_attempts_404: Option<u32>,
    max_retry_after: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDelivery {
    connect_timeout: Option<String>,
    request_timeout: Option<String>,
    max_in_flight_per_host: Option<u32>,
    rate_per_second: Option<u32>,
    pause_after_permanent_failures: Option<u32>,
    max_response_body: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSigning {
    scheme: Option<String>,
    secrets: Option<Vec<String>>,
    keys: Option<BTreeMap<String, Vec<String>>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileEgress {
    allow_private_targets: Option<bool>,
    allow: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRoute {
    name: Option<String>,
    url: Option<String>,
    signing_key: Option<String>,
    scheme: Option<String>,
}

impl FileRoute {
    fn into_route(self, i: usize) -> Result<RouteConfig, String> {
        let missing = |key: &str| format!("route[{i}]: missing key {key:?}");
        let url = self.url.ok_or_else(|| missing("url"))?;
        Ok(RouteConfig {
            name: self.name.ok_or_else(|| missing("name"))?,
            url: parse_url(&url).map_err(|e| format!("route[{i}].url: {e}"))?,
            signing_key: self.signing_key,
            scheme: self
                .scheme
                .map(|s| parse_scheme(&s))
                .transpose()
                .map_err(|e| format!("route[{i}].scheme: {e}"))?,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileHost {
    host: Option<String>,
    max_in_flight: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEndpoint {
    key: Option<String>,
    rate_per_second: Option<u32>,
}

/// Turns toml's multi-line error (which quotes the offending source line, possibly a
/// secret) into one line: the dotted key when known, the message, and the line number.
fn toml_error(text: &str, origin: &str, error: &toml::de::Error) -> ConfigError {
    let message = redact_quoted_string(error.message());
    let line = error
        .span()
        .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
    let at = line.map(|l| format!(" (line {l})")).unwrap_or_default();
    // toml names the enclosing table only when deserializing from an already-parsed table,
    // so the same error is reproduced that way to learn its path.
    let path = toml::from_str::<toml::Table>(text)
        .ok()
        .and_then(|table| FileConfig::deserialize(table).err())
        .filter(|e| e.message() == error.message())
        .and_then(|e| {
            e.to_string()
                .lines()
                .find_map(|l| l.strip_prefix("in `")?.strip_suffix('`').map(str::to_string))
        });
    if let Some(field) = message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split('`').next())
    {
        let key = match &path {
            Some(p) => format!("{p}.{field}"),
            None => field.to_string(),
        };
        return ConfigError::file(origin, format!("unknown key {key:?}{at}"));
    }
    match path {
        Some(p) => ConfigError::file(origin, format!("{p}: {message}{at}")),
        None => ConfigError::file(origin, format!("{message}{at}")),
    }
}

/// serde reports a mistyped string by quoting it (`invalid type: string "whsec_..", expected
/// a sequence`); the value may be a secret under the wrong key, so it is dropped.
fn redact_quoted_string(message: &str) -> String {
    let Some(start) = message.find("string \"") else {
        return message.to_string();
    };
    let body = &message[start + "string \"".len()..];
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            '"' if !escaped => return format!("{}a string{}", &message[..start], &body[i + 1..]),
            _ => escaped = false,
        }
    }
    format!("{}a string", &message[..start])
}

/// Overwrites `slot` with the parsed `value` when the file sets it.
fn set<T>(
    slot: &mut T,
    key: &str,
    value: Option<String>,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<(), String> {
    if let Some(text) = value {
        *slot = parse(&text).map_err(|e| format!("{key}: {e}"))?;
    }
    Ok(())
}

fn set_opt<T>(
    slot: &mut Option<T>,
    key: &str,
    value: Option<String>,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<(), String> {
    if let Some(text) = value {
        *slot = Some(parse(&text).map_err(|e| format!("{key}: {e}"))?);
    }
    Ok(())
}

fn one_of<T>(key: &str, in_section: Option<T>, top_level: Option<T>) -> Result<Option<T>, String> {
    match (in_section, top_level) {
        (Some(_), Some(_)) => {
            let alias = key
                .replace('.', "_")
                .replace("egress_allow_private_targets", "allow_private_targets");
            Err(format!(
                "{key} and the top-level {alias} are the same setting: set only one"
            ))
        }
        (a, b) => Ok(a.or(b)),
    }
}

/// `ip:port`, `[v6]:port`, or `localhost:port` (meaning 127.0.0.1).
fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Some(port) = text.strip_prefix("localhost:") {
        if let Ok(port) = port.parse::<u16>() {
            return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
        }
    }
    text.parse()
        .map_err(|_| "expected ip:port, like 127.0.0.1:8787".to_string())
}

fn parse_duration_text(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}

fn parse_size_text(text: &str) -> Result<u64, String> {
    parse_size(text).map_err(|e| e.to_string())
}

fn parse_u32(text: &str) -> Result<u32, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("expected a whole number from 0 to {}", u32::MAX))
}

fn parse_bool(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        _ => Err("expected true, false, 1 or 0".to_string()),
    }
}

/// The URL parser's message, without the URL (it may carry a credential).
fn parse_url(text: &str) -> Result<Url, String> {
    Url::parse(text.trim()).map_err(|e| format!("not a valid URL ({e})"))
}

fn parse_jitter(text: &str) -> Result<Jitter, String> {
    text.trim()
        .to_ascii_lowercase()
        .parse()
        .map_err(|e: crate::model::UnknownName| e.to_string())
}

fn parse_scheme(text: &str) -> Result<SignatureScheme, String> {
    text.parse().map_err(|e: crate::model::UnknownName| e.to_string())
}

/// A CIDR network, or a bare address meaning just that address (/32 or /128).
fn parse_net(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("{text:?} is not an address or CIDR network, like 10.1.0.0/16 or 127.0.0.1"))
}

/// Splits a comma-separated list; a blank value is the empty list, an empty item is an error
/// (the index of the empty item).
fn split_list(text: &str) -> Result<Vec<&str>, usize> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(str::trim)
        .enumerate()
        .map(|(i, item)| if item.is_empty() { Err(i) } else { Ok(item) })
        .collect()
}

fn check_http_url(key: &str, url: &Url) -> Result<(), ConfigError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ConfigError::invalid(
            key,
            format_args!("must be an http or https URL (not {:?})", url.scheme()),
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::invalid(key, "must have a host"));
    }
    Ok(())
}

/// `name:port` or `[v6]:port` with a non-zero port.
fn is_host_port(text: &str) -> bool {
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

fn check_secrets(key: &str, secrets: &[Secret], standard: bool) -> Result<(), ConfigError> {
    for (i, secret) in secrets.iter().enumerate() {
        if secret.expose().is_empty() {
            return Err(ConfigError::invalid(&format!("{key}[{i}]"), "must not be empty"));
        }
        if standard && !is_standard_secret(secret.expose()) {
            return Err(ConfigError::invalid(
                &format!("{key}[{i}]"),
                "is used with the standard scheme and must be whsec_ followed by base64 (value not shown)",
            ));
        }
    }
    Ok(())
}

/// `whsec_<base64>` or bare base64 (as svix accepts), standard alphabet, padding optional,
/// decoding to at least one byte: as lenient as the signer's decoder, so what passes here signs.
fn is_standard_secret(secret: &str) -> bool {
    const ENGINE: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent)
            .with_decode_allow_trailing_bits(true),
    );
    let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
    ENGINE.decode(encoded).is_ok_and(|key| !key.is_empty())
}

fn without_password(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        // Cannot fail: the URL already has a password, so it can have one.
        let _ = shown.set_password(Some("***"));
    }
    shown.to_string()
}

/// `scheme://host[:port]`, plus `/…` when there is more: alert URLs often carry their
/// credential in the path.
fn origin_only(url: &Url) -> String {
    let origin = url.origin().ascii_serialization();
    if url.as_str().trim_end_matches('/').len() > origin.len() {
        format!("{origin}/…")
    } else {
        origin
    }
}

fn jitter_name(jitter: Jitter) -> &'static str {
    match jitter {
        Jitter::Equal => "equal",
        Jitter::Full => "full",
        Jitter::None => "none",
    }
}

fn format_size(bytes: u64) -> String {
    for (unit, factor) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= factor && bytes.is_multiple_of(factor) {
            return format!("{}{unit}", bytes / factor);
        }
    }
    format!("{bytes}B")
}

fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::path::Path;

    /// CONTRACT §7, verbatim.
    const CONTRACT_EXAMPLE: &str = r#"
listen = "127.0.0.1:8787"
admin_listen = "127.0.0.1:8788"
data_dir = "./courier-data"
max_body = "1MiB"
shutdown_grace = "30s"
retention = "3d"
dead_retention = "30d"
# ingress_token = "..."            # unset: no auth on ingress
# admin_token = "..."              # unset: no auth on admin
# alert_url = "https://ops.example/alerts"

[retry]
base_delay = "1m"
max_delay = "1h"
jitter = "equal"                  # equal | full | none
max_attempts = 16
give_up_after = "3d"
max_attempts_404 = 5
max_retry_after = "24h"

[delivery]
connect_timeout = "10s"
request_timeout = "30s"
max_in_flight_per_host = 10
rate_per_second = 100
pause_after_permanent_failures = 100
max_response_body = "64KiB"

[signing]
scheme = "standard"               # standard | stripe | github | none
# secrets = ["whsec_..."]         # default secrets; all of them sign (rotation)

# [signing.keys]
# billing = ["whsec_new...", "whsec_old..."]

[egress]
allow_private_targets = false
# allow = ["127.0.0.1/32", "10.1.0.0/16"]

# [[route]]                       # POST /r/billing
# name = "billing"
# url = "https://billing.example/hooks"
# signing_key = "billing"
# scheme = "stripe"

# [[host]]                        # per-host override of the in-flight cap
# host = "api.bigcustomer.example:443"
# max_in_flight = 50

# [[endpoint]]                    # per-endpoint override of the rate limit
# key = "https://slow.example/hook"
# rate_per_second = 5
"#;

    const STD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const STD_SECRET_2: &str = "whsec_c2VjcmV0LW51bWJlci10d28=";

    /// Every key of §7 set to a non-default value (secrets are valid and recognisable).
    fn full_toml() -> String {
        format!(
            r#"
listen = "0.0.0.0:9001"
admin_listen = "[::1]:9002"
data_dir = "/var/lib/courier"
max_body = "2MiB"
shutdown_grace = "0"
retention = "1d"
dead_retention = "7d"
ingress_token = "tok-INGRESS-5ecret"
admin_token = "tok-ADMIN-5ecret"
alert_url = "https://ops.example/alerts/T000/B000/xyzSECRETPATH"

[retry]
base_delay = "250ms"
max_delay = "10m"
jitter = "full"
max_attempts = 8
give_up_after = "2h"
max_attempts_404 = 2
max_retry_after = "1h"

[delivery]
connect_timeout = "2s"
request_timeout = "5s"
max_in_flight_per_host = 4
rate_per_second = 20
pause_after_permanent_failures = 7
max_response_body = "1KiB"

[signing]
scheme = "standard"
secrets = ["{STD_SECRET}", "{STD_SECRET_2}"]

[signing.keys]
billing = ["sk-BILLING-5ecret-new", "sk-BILLING-5ecret-old"]
partner = ["{STD_SECRET}"]

[egress]
allow_private_targets = true
allow = ["127.0.0.1/32", "10.1.0.0/16", "::1", "192.168.1.7"]

[[route]]
name = "billing"
url = "https://billing.example/hooks"
signing_key = "billing"
scheme = "stripe"

[[route]]
name = "partner-2_x"
url = "http://partner.example:8080/in?a=1"
signing_key = "partner"

[[host]]
host = "api.bigcustomer.example:443"
max_in_flight = 50

[[endpoint]]
key = "https://slow.example/hook"
rate_per_second = 5
"#
        )
    }

    const SECRET_MARKERS: [&str; 6] = [
        "5ecret",
        "SECRETPATH",
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "c2VjcmV0LW51bWJlci10d28",
        "hunter2",
        "s3kr1t",
    ];

    fn assert_no_secret(text: &str) {
        for marker in SECRET_MARKERS {
            assert!(!text.contains(marker), "secret {marker:?} leaked in: {text}");
        }
    }

    fn parse(text: &str) -> Config {
        match Config::from_toml_str(text, "test.toml") {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn env_from(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    /// A file under the system temp dir, unique per test, removed on drop.
    struct TempFile(PathBuf);
    impl TempFile {
        fn new(name: &str, text: &str) -> TempFile {
            let path = std::env::temp_dir().join(format!("courier-config-test-{}-{name}.toml", std::process::id()));
            std::fs::write(&path, text).expect("write temp file");
            TempFile(path)
        }
    }
    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn defaults_are_exactly_the_contract() {
        let d = Config::default();
        assert_eq!(d.listen, "127.0.0.1:8787".parse::<SocketAddr>().unwrap());
        assert_eq!(d.admin_listen, "127.0.0.1:8788".parse::<SocketAddr>().unwrap());
        assert_eq!(d.data_dir, PathBuf::from("./courier-data"));
        assert_eq!(d.max_body, 1_048_576);
        assert_eq!(d.shutdown_grace, secs(30));
        assert_eq!(d.retention, secs(3 * 86_400));
        assert_eq!(d.dead_retention, secs(30 * 86_400));
        assert_eq!(
            (
                d.ingress_token.is_none(),
                d.admin_token.is_none(),
                d.alert_url.is_none()
            ),
            (true, true, true)
        );
        let r = &d.retry;
        assert_eq!(
            (r.base_delay, r.max_delay, r.jitter),
            (secs(60), secs(3600), Jitter::Equal)
        );
        assert_eq!(
            (r.max_attempts, r.give_up_after, r.max_attempts_404),
            (16, secs(72 * 3600), 5)
        );
        assert_eq!(r.max_retry_after, secs(24 * 3600));
        let dl = &d.delivery;
        assert_eq!((dl.connect_timeout, dl.request_timeout), (secs(10), secs(30)));
        assert_eq!(
            (
                dl.max_in_flight_per_host,
                dl.rate_per_second,
                dl.pause_after_permanent_failures
            ),
            (10, 100, 100)
        );
        assert_eq!(dl.max_response_body, 65_536);
        assert_eq!(d.signing.scheme, SignatureScheme::Standard);
        assert!(d.signing.secrets.is_empty() && d.signing.keys.is_empty());
        assert!(!d.egress.allow_private_targets && d.egress.allow.is_empty());
        assert!(d.routes.is_empty() && d.hosts.is_empty() && d.endpoints.is_empty());
        d.validate().unwrap();
    }

    #[test]
    fn the_contract_example_file_is_the_defaults() {
        assert_eq!(parse(CONTRACT_EXAMPLE), Config::default());
        assert_eq!(parse(""), Config::default());
    }

    #[test]
    fn the_full_example_parses_every_key() {
        let c = parse(&full_toml());
        c.validate().unwrap();
        assert_eq!(c.listen, "0.0.0.0:9001".parse::<SocketAddr>().unwrap());
        assert_eq!(c.admin_listen, "[::1]:9002".parse::<SocketAddr>().unwrap());
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/courier"));
        assert_eq!(
            (c.max_body, c.shutdown_grace, c.retention, c.dead_retention),
            (2 << 20, secs(0), secs(86_400), secs(7 * 86_400))
        );
        assert_eq!(c.ingress_token.as_ref().map(Secret::expose), Some("tok-INGRESS-5ecret"));
        assert_eq!(c.admin_token.as_ref().map(Secret::expose), Some("tok-ADMIN-5ecret"));
        assert_eq!(
            c.alert_url.as_ref().map(Url::as_str),
            Some("https://ops.example/alerts/T000/B000/xyzSECRETPATH")
        );
        let r = &c.retry;
        assert_eq!(
            (r.base_delay, r.max_delay, r.jitter),
            (Duration::from_millis(250), secs(600), Jitter::Full)
        );
        assert_eq!(
            (r.max_attempts, r.give_up_after, r.max_attempts_404, r.max_retry_after),
            (8, secs(7200), 2, secs(3600))
        );
        let d = &c.delivery;
        assert_eq!((d.connect_timeout, d.request_timeout), (secs(2), secs(5)));
        assert_eq!(
            (
                d.max_in_flight_per_host,
                d.rate_per_second,
                d.pause_after_permanent_failures
            ),
            (4, 20, 7)
        );
        assert_eq!(d.max_response_body, 1024);
        let secrets: Vec<&str> = c.signing.secrets.iter().map(Secret::expose).collect();
        assert_eq!(secrets, [STD_SECRET, STD_SECRET_2]);
        assert_eq!(c.signing_key("billing").map(|s| s.len()), Some(2));
        assert_eq!(
            c.signing_key("billing").map(|s| s[1].expose()),
            Some("sk-BILLING-5ecret-old")
        );
        assert!(c.signing_key("nope").is_none());
        assert!(c.egress.allow_private_targets);
        let allow: Vec<String> = c.egress.allow.iter().map(IpNet::to_string).collect();
        assert_eq!(allow, ["127.0.0.1/32", "10.1.0.0/16", "::1/128", "192.168.1.7/32"]);
        assert_eq!(c.routes.len(), 2);
        assert_eq!(c.routes[0].signing_key.as_deref(), Some("billing"));
        assert_eq!(c.routes[0].scheme, Some(SignatureScheme::Stripe));
        assert_eq!(c.routes[1].scheme, None);
        assert_eq!(
            c.route_url("billing").map(String::from),
            Some("https://billing.example/hooks".to_string())
        );
        assert_eq!(
            c.route_url("partner-2_x").map(String::from),
            Some("http://partner.example:8080/in?a=1".to_string())
        );
        assert_eq!(c.route_url("missing"), None);
        assert_eq!(c.host_max_in_flight("api.bigcustomer.example:443"), 50);
        assert_eq!(c.host_max_in_flight("API.BigCustomer.example:443"), 50);
        assert_eq!(c.host_max_in_flight("api.bigcustomer.example:8443"), 4);
        assert_eq!(c.endpoint_rate("https://slow.example/hook"), 5);
        assert_eq!(c.endpoint_rate("https://other.example/hook"), 20);
    }

    #[test]
    fn each_layer_overrides_the_one_below() {
        let text = concat!(
            "listen = \"127.0.0.1:1001\"\nadmin_listen = \"127.0.0.1:1002\"\ndata_dir = \"/from/file\"\n",
            "[retry]\nmax_attempts = 3\nbase_delay = \"5s\"\n"
        );
        let file = TempFile::new("layers", text);
        let flags_file = Overrides {
            config: Some(file.0.clone()),
            ..Overrides::default()
        };
        // defaults < file
        let c = Config::load(&flags_file, &no_env).unwrap();
        assert_eq!((c.listen.port(), c.admin_listen.port()), (1001, 1002));
        assert_eq!(c.data_dir, PathBuf::from("/from/file"));
        assert_eq!(
            (c.retry.max_attempts, c.retry.base_delay, c.retry.max_delay),
            (3, secs(5), secs(3600))
        );
        // file < env
        let env = env_from(&[
            ("COURIER_LISTEN", "127.0.0.1:2001"),
            ("COURIER_DATA_DIR", "/from/env"),
            ("COURIER_RETRY_MAX_ATTEMPTS", "4"),
        ]);
        let c = Config::load(&flags_file, &env).unwrap();
        assert_eq!((c.listen.port(), c.admin_listen.port()), (2001, 1002));
        assert_eq!(c.data_dir, PathBuf::from("/from/env"));
        assert_eq!((c.retry.max_attempts, c.retry.base_delay), (4, secs(5)));
        // env < flags
        let flags = Overrides {
            config: Some(file.0.clone()),
            listen: Some("localhost:3001".into()),
            admin_listen: Some("127.0.0.1:3002".into()),
            data_dir: Some(PathBuf::from("/from/flag")),
        };
        let c = Config::load(&flags, &env).unwrap();
        assert_eq!(c.listen, "127.0.0.1:3001".parse::<SocketAddr>().unwrap());
        assert_eq!(c.admin_listen.port(), 3002);
        assert_eq!(c.data_dir, PathBuf::from("/from/flag"));
        assert_eq!(c.retry.max_attempts, 4);
    }

    #[test]
    fn the_file_comes_from_the_flag_else_courier_config() {
        let a = TempFile::new("from-env", "listen = \"127.0.0.1:4001\"\n");
        let b = TempFile::new("from-flag", "listen = \"127.0.0.1:4002\"\n");
        let a_path = a.0.display().to_string();
        let env = env_from(&[("COURIER_CONFIG", &a_path)]);
        assert_eq!(Config::load(&Overrides::default(), &env).unwrap().listen.port(), 4001);
        let flags = Overrides {
            config: Some(b.0.clone()),
            ..Overrides::default()
        };
        assert_eq!(Config::load(&flags, &env).unwrap().listen.port(), 4002);
        // An empty COURIER_CONFIG means no file.
        let env = env_from(&[("COURIER_CONFIG", "")]);
        assert_eq!(Config::load(&Overrides::default(), &env).unwrap(), Config::default());
    }

    #[test]
    fn a_missing_or_unreadable_file_names_the_path_and_the_os_error() {
        let missing = std::env::temp_dir().join("courier-config-test-does-not-exist.toml");
        let flags = Overrides {
            config: Some(missing.clone()),
            ..Overrides::default()
        };
        let msg = Config::load(&flags, &no_env).unwrap_err().to_string();
        assert!(
            msg.contains(&missing.display().to_string()) && msg.contains("os error"),
            "{msg}"
        );
        let dir = std::env::temp_dir();
        let flags = Overrides {
            config: Some(dir.clone()),
            ..Overrides::default()
        };
        let msg = Config::load(&flags, &no_env).unwrap_err().to_string();
        assert!(msg.starts_with(&format!("config {}", dir.display())), "{msg}");
    }

    #[test]
    fn the_file_is_validated_by_load() {
        let file = TempFile::new("invalid", "[retry]\nmax_attempts = 0\n");
        let flags = Overrides {
            config: Some(file.0.clone()),
            ..Overrides::default()
        };
        let msg = Config::load(&flags, &no_env).unwrap_err().to_string();
        assert!(msg.contains("retry.max_attempts"), "{msg}");
    }

    type Check = fn(&Config) -> bool;

    /// One row per variable of ENV_VARS: a non-default value and how to see it took effect.
    const ENV_CASES: &[(&str, &str, Check)] = &[
        ("COURIER_LISTEN", "127.0.0.1:7001", |c| c.listen.port() == 7001),
        ("COURIER_ADMIN_LISTEN", "localhost:7002", |c| {
            c.admin_listen == SocketAddr::from(([127, 0, 0, 1], 7002))
        }),
        ("COURIER_DATA_DIR", "/data", |c| c.data_dir == Path::new("/data")),
        ("COURIER_MAX_BODY", "5MiB", |c| c.max_body == 5 << 20),
        ("COURIER_SHUTDOWN_GRACE", "0", |c| c.shutdown_grace.is_zero()),
        ("COURIER_RETENTION", "1h", |c| c.retention == Duration::from_secs(3600)),
        ("COURIER_DEAD_RETENTION", "2d", |c| {
            c.dead_retention == Duration::from_secs(172_800)
        }),
        ("COURIER_INGRESS_TOKEN", "hunter2", |c| {
            c.ingress_token.as_ref().is_some_and(|t| t.expose() == "hunter2")
        }),
        ("COURIER_ADMIN_TOKEN", "s3kr1t", |c| {
            c.admin_token.as_ref().is_some_and(|t| t.expose() == "s3kr1t")
        }),
        ("COURIER_ALERT_URL", "https://ops.example/a", |c| {
            c.alert_url
                .as_ref()
                .is_some_and(|u| u.as_str() == "https://ops.example/a")
        }),
        ("COURIER_RETRY_BASE_DELAY", "2s", |c| {
            c.retry.base_delay == Duration::from_secs(2)
        }),
        ("COURIER_RETRY_MAX_DELAY", "2h", |c| {
            c.retry.max_delay == Duration::from_secs(7200)
        }),
        ("COURIER_RETRY_JITTER", "none", |c| c.retry.jitter == Jitter::None),
        ("COURIER_RETRY_MAX_ATTEMPTS", "3", |c| c.retry.max_attempts == 3),
        ("COURIER_RETRY_GIVE_UP_AFTER", "1h", |c| {
            c.retry.give_up_after == Duration::from_secs(3600)
        }),
        ("COURIER_RETRY_MAX_ATTEMPTS_404", "1", |c| c.retry.max_attempts_404 == 1),
        ("COURIER_RETRY_MAX_RETRY_AFTER", "5m", |c| {
            c.retry.max_retry_after == Duration::from_secs(300)
        }),
        ("COURIER_DELIVERY_CONNECT_TIMEOUT", "1s", |c| {
            c.delivery.connect_timeout == Duration::from_secs(1)
        }),
        ("COURIER_DELIVERY_REQUEST_TIMEOUT", "500ms", |c| {
            c.delivery.request_timeout == Duration::from_millis(500)
        }),
        ("COURIER_DELIVERY_MAX_IN_FLIGHT_PER_HOST", "2", |c| {
            c.delivery.max_in_flight_per_host == 2
        }),
        ("COURIER_DELIVERY_RATE_PER_SECOND", "9", |c| {
            c.delivery.rate_per_second == 9
        }),
        ("COURIER_DELIVERY_PAUSE_AFTER_PERMANENT_FAILURES", "3", |c| {
            c.delivery.pause_after_permanent_failures == 3
        }),
        ("COURIER_DELIVERY_MAX_RESPONSE_BODY", "1KiB", |c| {
            c.delivery.max_response_body == 1024
        }),
        ("COURIER_SIGNING_SCHEME", "github", |c| {
            c.signing.scheme == SignatureScheme::Github
        }),
        ("COURIER_SIGNING_SECRETS", "ghs-1, ghs-2", |c| {
            c.signing.secrets.iter().map(Secret::expose).eq(["ghs-1", "ghs-2"])
        }),
        ("COURIER_EGRESS_ALLOW_PRIVATE_TARGETS", "1", |c| {
            c.egress.allow_private_targets
        }),
        ("COURIER_EGRESS_ALLOW", "10.0.0.0/8, ::1", |c| {
            c.egress
                .allow
                .iter()
                .map(IpNet::to_string)
                .eq(["10.0.0.0/8", "::1/128"])
        }),
    ];

    #[test]
    fn every_env_var_sets_its_key() {
        let covered: Vec<&str> = ENV_CASES.iter().map(|(n, _, _)| *n).collect();
        assert_eq!(covered, ENV_VARS, "the table covers every variable");
        for (name, value, check) in ENV_CASES {
            // The github scheme lets COURIER_SIGNING_SECRETS hold non-standard secrets.
            let env = env_from(&[(name, value), ("COURIER_SIGNING_SCHEME", "github")]);
            let c = Config::load(&Overrides::default(), &env).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(check(&c), "{name}={value:?} did not take effect");
            assert!(
                !check(&Config::default()) || *name == "COURIER_SIGNING_SCHEME",
                "{name}: the value is the default"
            );
        }
    }

    #[test]
    fn env_values_override_the_file() {
        let base = parse(&full_toml());
        for (name, value, check) in ENV_CASES {
            let mut c = base.clone();
            c.apply_env(&env_from(&[(name, value)]))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(check(&c), "{name}={value:?} did not override the file");
        }
    }

    #[test]
    fn env_booleans_and_lists() {
        let cases: &[(&str, bool)] = &[
            ("true", true),
            ("TRUE", true),
            ("1", true),
            ("false", false),
            ("0", false),
            (" False ", false),
        ];
        for (text, want) in cases {
            let mut c = Config {
                egress: EgressConfig {
                    allow_private_targets: !want,
                    allow: vec![],
                },
                ..Config::default()
            };
            c.apply_env(&env_from(&[("COURIER_EGRESS_ALLOW_PRIVATE_TARGETS", text)]))
                .unwrap();
            assert_eq!(c.egress.allow_private_targets, *want, "{text}");
        }
        // A blank list clears what the file set.
        let mut c = parse(&full_toml());
        c.apply_env(&env_from(&[
            ("COURIER_EGRESS_ALLOW", ""),
            ("COURIER_SIGNING_SECRETS", " "),
        ]))
        .unwrap();
        assert!(c.egress.allow.is_empty() && c.signing.secrets.is_empty());
    }

    #[test]
    fn bad_env_values_name_the_variable_and_value() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "COURIER_RETRY_MAX_ATTEMPTS",
                "x",
                "COURIER_RETRY_MAX_ATTEMPTS=\"x\": expected a whole number",
            ),
            (
                "COURIER_RETRY_MAX_ATTEMPTS",
                "-1",
                "COURIER_RETRY_MAX_ATTEMPTS=\"-1\": ",
            ),
            ("COURIER_LISTEN", "8787", "COURIER_LISTEN=\"8787\": expected ip:port"),
            (
                "COURIER_ADMIN_LISTEN",
                "example.com:1",
                "COURIER_ADMIN_LISTEN=\"example.com:1\": ",
            ),
            ("COURIER_MAX_BODY", "1TB", "COURIER_MAX_BODY=\"1TB\": invalid size"),
            (
                "COURIER_SHUTDOWN_GRACE",
                "30",
                "COURIER_SHUTDOWN_GRACE=\"30\": invalid duration",
            ),
            (
                "COURIER_RETRY_JITTER",
                "half",
                "COURIER_RETRY_JITTER=\"half\": unknown jitter",
            ),
            (
                "COURIER_SIGNING_SCHEME",
                "hmac",
                "COURIER_SIGNING_SCHEME=\"hmac\": unknown signature scheme",
            ),
            (
                "COURIER_EGRESS_ALLOW_PRIVATE_TARGETS",
                "yes",
                "COURIER_EGRESS_ALLOW_PRIVATE_TARGETS=\"yes\": expected true",
            ),
            (
                "COURIER_EGRESS_ALLOW",
                "10.0.0.0/8,,::1",
                "COURIER_EGRESS_ALLOW=\"10.0.0.0/8,,::1\": item 2",
            ),
            (
                "COURIER_EGRESS_ALLOW",
                "10.0.0.0/33",
                "COURIER_EGRESS_ALLOW=\"10.0.0.0/33\": \"10.0.0.0/33\" is not",
            ),
            (
                "COURIER_DELIVERY_RATE_PER_SECOND",
                "99999999999",
                "COURIER_DELIVERY_RATE_PER_SECOND=\"99999999999\"",
            ),
            (
                "COURIER_ALERT_URL",
                "not a url s3kr1t",
                "COURIER_ALERT_URL: not a valid URL",
            ),
            (
                "COURIER_SIGNING_SECRETS",
                "hunter2,,x",
                "COURIER_SIGNING_SECRETS: item 2 of the comma-separated list is empty",
            ),
        ];
        for (name, value, want) in cases {
            let msg = Config::load(&Overrides::default(), &env_from(&[(name, value)]))
                .unwrap_err()
                .to_string();
            assert!(msg.starts_with(want), "{name}={value:?}: got {msg:?}, want {want:?}");
            assert!(!msg.contains('\n'), "{msg}");
            assert_no_secret(&msg);
        }
    }

    #[test]
    fn other_courier_variables_are_ignored_and_never_read() {
        let asked = RefCell::new(Vec::new());
        let env = |name: &str| {
            asked.borrow_mut().push(name.to_string());
            // Kubernetes' service variables, and garbage for anything else.
            match name {
                "COURIER_PORT" => Some("tcp://10.0.0.1:8787".to_string()),
                "COURIER_SERVICE_HOST" => Some("10.0.0.1".to_string()),
                n if ENV_VARS.contains(&n) || n == CONFIG_ENV => None,
                _ => Some("garbage".to_string()),
            }
        };
        assert_eq!(Config::load(&Overrides::default(), &env).unwrap(), Config::default());
        for name in asked.borrow().iter() {
            assert!(ENV_VARS.contains(&name.as_str()) || name == CONFIG_ENV, "read {name}");
        }
    }

    #[test]
    fn flags_accept_ip_port_and_localhost() {
        let cases: &[(&str, &str)] = &[
            ("127.0.0.1:9000", "127.0.0.1:9000"),
            ("localhost:9000", "127.0.0.1:9000"),
            ("0.0.0.0:0", "0.0.0.0:0"),
            ("[::1]:9000", "[::1]:9000"),
            (" 10.0.0.1:80 ", "10.0.0.1:80"),
        ];
        for (text, want) in cases {
            assert_eq!(parse_listen(text), Ok(want.parse::<SocketAddr>().unwrap()), "{text}");
        }
        for text in [
            "",
            "9000",
            "localhost",
            "localhost:",
            "localhost:99999",
            "example.com:80",
            "127.0.0.1",
            "::1:80",
        ] {
            assert!(parse_listen(text).is_err(), "{text:?}");
        }
        let flags = Overrides {
            listen: Some("nope".into()),
            ..Overrides::default()
        };
        let msg = Config::load(&flags, &no_env).unwrap_err().to_string();
        assert!(msg.starts_with("--listen \"nope\": expected ip:port"), "{msg}");
        let flags = Overrides {
            admin_listen: Some(":1".into()),
            ..Overrides::default()
        };
        let msg = Config::load(&flags, &no_env).unwrap_err().to_string();
        assert!(msg.starts_with("--admin-listen \":1\": "), "{msg}");
    }

    #[test]
    fn unknown_keys_are_rejected_at_every_level() {
        let cases: &[(&str, &str)] = &[
            ("lissten = \"x\"\n", "unknown key \"lissten\" (line 1)"),
            (
                "[retry]\nmax_atempts = 3\n",
                "unknown key \"retry.max_atempts\" (line 2)",
            ),
            ("[delivery]\nrate = 3\n", "unknown key \"delivery.rate\" (line 2)"),
            ("[signing]\nsecret = []\n", "unknown key \"signing.secret\" (line 2)"),
            (
                "[egress]\nallow_private = true\n",
                "unknown key \"egress.allow_private\" (line 2)",
            ),
            (
                "[[route]]\nname = \"a\"\nurl = \"https://a.example\"\nkey = \"k\"\n",
                "unknown key \"route.key\" (line 4)",
            ),
            (
                "[[host]]\nhost = \"a:1\"\nmax_in_flight = 1\nrate = 1\n",
                "unknown key \"host.rate\" (line 4)",
            ),
            (
                "[[endpoint]]\nkey = \"k\"\nrate = 1\n",
                "unknown key \"endpoint.rate\" (line 3)",
            ),
            ("[metrics]\nport = 1\n", "unknown key \"metrics\" (line 1)"),
            ("[[routes]]\nname = \"a\"\n", "unknown key \"routes\" (line 1)"),
        ];
        for (text, want) in cases {
            let msg = Config::from_toml_str(text, "/etc/courier.toml")
                .unwrap_err()
                .to_string();
            assert_eq!(msg, format!("config /etc/courier.toml: {want}"), "{text:?}");
        }
    }

    #[test]
    fn bad_file_values_name_the_key() {
        let cases: &[(&str, &str)] = &[
            (
                "[retry]\nmax_attempts = \"x\"\n",
                "retry.max_attempts: invalid type: a string, expected u32 (line 2)",
            ),
            (
                "[retry]\nmax_attempts = -1\n",
                "retry.max_attempts: invalid value: integer `-1`, expected u32 (line 2)",
            ),
            (
                "max_body = 1048576\n",
                "max_body: invalid type: integer `1048576`, expected a string (line 1)",
            ),
            (
                "[retry]\nbase_delay = 60\n",
                "retry.base_delay: invalid type: integer `60`",
            ),
            (
                "[retry]\nbase_delay = \"5sec\"\n",
                "retry.base_delay: invalid duration \"5sec\"",
            ),
            ("[retry]\njitter = \"half\"\n", "retry.jitter: unknown jitter \"half\""),
            (
                "[delivery]\nmax_response_body = \"1TB\"\n",
                "delivery.max_response_body: invalid size",
            ),
            ("listen = \"localhost\"\n", "listen: expected ip:port"),
            ("admin_listen = \"x:1\"\n", "admin_listen: expected ip:port"),
            ("alert_url = \"::\"\n", "alert_url: not a valid URL"),
            (
                "[signing]\nscheme = \"hmac\"\n",
                "signing.scheme: unknown signature scheme \"hmac\"",
            ),
            (
                "[signing.keys]\nbilling = \"x\"\n",
                "signing.keys.billing: invalid type: a string, expected a sequence (line 2)",
            ),
            (
                "[egress]\nallow = [\"10.0.0.300\"]\n",
                "egress.allow[0]: \"10.0.0.300\" is not",
            ),
            (
                "[egress]\nallow_private_targets = \"yes\"\n",
                "egress.allow_private_targets: invalid type: a string, expected a boolean",
            ),
            ("[[route]]\nname = \"a\"\n", "route[0]: missing key \"url\""),
            (
                "[[route]]\nurl = \"https://a.example\"\n",
                "route[0]: missing key \"name\"",
            ),
            (
                "[[route]]\nname = \"a\"\nurl = \"nope\"\n",
                "route[0].url: not a valid URL",
            ),
            (
                "[[route]]\nname = \"a\"\nurl = \"http:///\"\n",
                "route[0].url: not a valid URL (empty host)",
            ),
            (
                "[[route]]\nname = \"a\"\nurl = \"https://a.example\"\nscheme = \"x\"\n",
                "route[0].scheme: unknown signature scheme",
            ),
            ("[[host]]\nhost = \"a:1\"\n", "host[0]: missing key \"max_in_flight\""),
            ("[[host]]\nmax_in_flight = 1\n", "host[0]: missing key \"host\""),
            (
                "[[endpoint]]\nkey = \"k\"\n",
                "endpoint[0]: missing key \"rate_per_second\"",
            ),
            (
                "[[endpoint]]\nrate_per_second = 1\n",
                "endpoint[0]: missing key \"key\"",
            ),
            ("retry = 3\n", "retry: invalid type: integer `3`"),
            ("listen = \"x\nport = 1\n", "invalid basic string (line 1)"),
            ("listen = \"a\"\nlisten = \"b\"\n", "duplicate key `listen`"),
        ];
        for (text, want) in cases {
            let msg = Config::from_toml_str(text, "c.toml").unwrap_err().to_string();
            let want = format!("config c.toml: {want}");
            assert!(msg.starts_with(&want), "{text:?}: got {msg:?}, want {want:?}");
            assert!(!msg.contains('\n'), "{msg}");
        }
    }

    #[test]
    fn egress_accepts_the_top_level_spellings_of_section_6() {
        let c = parse("allow_private_targets = true\negress_allow = [\"127.0.0.1/32\", \"10.1.0.0/16\"]\n");
        assert!(c.egress.allow_private_targets);
        assert_eq!(c.egress.allow.len(), 2);
        let msg = Config::from_toml_str("egress_allow = []\n[egress]\nallow = []\n", "c.toml")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("egress.allow") && msg.contains("egress_allow"), "{msg}");
        let msg = Config::from_toml_str(
            "allow_private_targets = true\n[egress]\nallow_private_targets = true\n",
            "c.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains("egress.allow_private_targets and the top-level allow_private_targets"),
            "{msg}"
        );
    }

    /// Each validation rule: a TOML snippet breaking it, and the text the error must contain.
    const INVALID: &[(&str, &str)] = &[
        ("listen = \"127.0.0.1:9000\"\nadmin_listen = \"127.0.0.1:9000\"", "admin_listen (127.0.0.1:9000) must differ from listen"),
        ("listen = \"0.0.0.0:9000\"\nadmin_listen = \"127.0.0.1:9000\"", "admin_listen (127.0.0.1:9000) must differ from listen"),
        ("data_dir = \"\"", "data_dir must not be empty"),
        ("max_body = \"0\"", "max_body must be at least 1 byte"),
        ("[retry]\nbase_delay = \"0s\"", "retry.base_delay must be greater than 0"),
        ("[retry]\nbase_delay = \"2h\"", "retry.max_delay (1h) must be at least retry.base_delay (2h)"),
        ("[retry]\nmax_attempts = 0", "retry.max_attempts must be at least 1"),
        ("[retry]\nmax_attempts_404 = 0", "retry.max_attempts_404 must be at least 1"),
        ("[retry]\ngive_up_after = \"0\"", "retry.give_up_after must be greater than 0"),
        ("[delivery]\nrequest_timeout = \"0ms\"", "delivery.request_timeout must be greater than 0"),
        ("[delivery]\nconnect_timeout = \"0s\"", "delivery.connect_timeout must be greater than 0"),
        ("[delivery]\nmax_in_flight_per_host = 0", "delivery.max_in_flight_per_host must be at least 1"),
        ("[delivery]\nrate_per_second = 0", "delivery.rate_per_second must be at least 1"),
        ("[delivery]\npause_after_permanent_failures = 0", "delivery.pause_after_permanent_failures must be at least 1"),
        ("ingress_token = \"\"", "ingress_token must not be empty"),
        ("admin_token = \"  \"", "admin_token must not be empty"),
        ("alert_url = \"ftp://ops.example/a\"", "alert_url must be an http or https URL"),
        ("alert_url = \"mailto:ops@example.com\"", "alert_url must be an http or https URL"),
        ("[[route]]\nname = \"\"\nurl = \"https://a.example\"", "route[0].name must not be empty"),
        ("[[route]]\nname = \"a/b\"\nurl = \"https://a.example\"", "route[0].name \"a/b\" may contain only"),
        ("[[route]]\nname = \"b c\"\nurl = \"https://a.example\"", "route[0].name \"b c\" may contain only"),
        ("[[route]]\nname = \"a\"\nurl = \"https://a.example\"\n[[route]]\nname = \"a\"\nurl = \"https://b.example\"", "route[1].name \"a\" is used by an earlier route"),
        ("[[route]]\nname = \"a\"\nurl = \"ftp://a.example\"", "route[0].url must be an http or https URL"),
        ("[[route]]\nname = \"a\"\nurl = \"https://a.example\"\nsigning_key = \"k\"", "route[0].signing_key \"k\" is not a name in signing.keys"),
        ("[[host]]\nhost = \"api.example\"\nmax_in_flight = 1", "host[0].host \"api.example\" must be name:port"),
        ("[[host]]\nhost = \"api.example:0\"\nmax_in_flight = 1", "host[0].host"),
        ("[[host]]\nhost = \"::1:443\"\nmax_in_flight = 1", "host[0].host"),
        ("[[host]]\nhost = \"https://a:443\"\nmax_in_flight = 1", "host[0].host"),
        ("[[host]]\nhost = \"a:443\"\nmax_in_flight = 0", "host[0].max_in_flight must be at least 1"),
        ("[[host]]\nhost = \"a:443\"\nmax_in_flight = 1\n[[host]]\nhost = \"A:443\"\nmax_in_flight = 2", "host[1].host \"A:443\" is listed twice"),
        ("[[endpoint]]\nkey = \"\"\nrate_per_second = 1", "endpoint[0].key must not be empty"),
        ("[[endpoint]]\nkey = \"k\"\nrate_per_second = 0", "endpoint[0].rate_per_second must be at least 1"),
        ("[[endpoint]]\nkey = \"k\"\nrate_per_second = 1\n[[endpoint]]\nkey = \"k\"\nrate_per_second = 2", "endpoint[1].key \"k\" is listed twice"),
        ("[signing]\nsecrets = [\"\"]\nscheme = \"stripe\"", "signing.secrets[0] must not be empty"),
        ("[signing]\nsecrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\", \"hunter2!\"]", "signing.secrets[1] is used with the standard scheme"),
        ("[signing]\nscheme = \"github\"\nsecrets = [\"hunter2!\"]\n[[route]]\nname = \"r\"\nurl = \"https://a.example\"\nscheme = \"standard\"", "signing.secrets[0] is used with the standard scheme"),
        ("[signing.keys]\nk = [\"hunter2!\"]\n[[route]]\nname = \"r\"\nurl = \"https://a.example\"\nsigning_key = \"k\"", "signing.keys.k[0] is used with the standard scheme"),
        ("[signing.keys]\nk = [\"\"]", "signing.keys.k[0] must not be empty"),
        ("[signing.keys]\nk = []", "signing.keys.k must list at least one secret"),
        ("[signing.keys]\n\"\" = [\"x\"]", "signing.keys has an entry with an empty name"),
    ];

    #[test]
    fn every_validation_rule_has_a_failing_case() {
        for (text, want) in INVALID {
            let config = parse(text);
            let msg = config.validate().unwrap_err().to_string();
            assert!(
                msg.starts_with("invalid config: ") && msg.contains(want),
                "{text:?}: got {msg:?}, want {want:?}"
            );
            assert!(!msg.contains('\n'), "{msg}");
            assert_no_secret(&msg);
        }
    }

    #[test]
    fn valid_edge_cases_pass_validation() {
        let cases = [
            "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"",
            "listen = \"127.0.0.1:9000\"\nadmin_listen = \"127.0.0.2:9000\"",
            "shutdown_grace = \"0\"\nretention = \"0\"",
            "[retry]\nbase_delay = \"1h\"\nmax_delay = \"1h\"",
            // Non-standard secrets are fine where they never sign with the standard scheme.
            "[signing]\nscheme = \"stripe\"\nsecrets = [\"sk_test_hunter2\"]",
            "[signing.keys]\ngh = [\"plain text\"]\n[[route]]\nname = \"gh\"\nurl = \"https://gh.example\"\nsigning_key = \"gh\"\nscheme = \"github\"",
            "[signing.keys]\nunused = [\"plain text\"]",
            // svix also accepts bare base64, and padding is optional.
            "[signing]\nsecrets = [\"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\", \"whsec_c2VjcmV0\", \"whsec_YQ\", \"whsec_YQ==\"]",
            "[[host]]\nhost = \"[::1]:8080\"\nmax_in_flight = 1\n[[host]]\nhost = \"10.0.0.1:80\"\nmax_in_flight = 1",
            "alert_url = \"http://127.0.0.1:9/alerts\"",
        ];
        for text in cases {
            if let Err(e) = parse(text).validate() {
                panic!("{text:?}: {e}");
            }
        }
    }

    #[test]
    fn standard_secret_format() {
        let cases: &[(&str, bool)] = &[
            ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", true),
            ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", true),
            ("whsec_YQ==", true),
            ("whsec_YQ", true),
            ("whsec_", false),
            ("whsec_YQ=", true),
            ("whsec_YR", true),
            ("whsec_Y", false),
            ("whsec_a-b_", false),
            ("whsec_ YQ", false),
            ("hunter2!", false),
            ("", false),
        ];
        for (secret, ok) in cases {
            assert_eq!(is_standard_secret(secret), *ok, "{secret:?}");
        }
    }

    #[test]
    fn host_port_form() {
        let cases: &[(&str, bool)] = &[
            ("api.example:443", true),
            ("10.0.0.1:80", true),
            ("[::1]:8080", true),
            ("localhost:1", true),
            ("api.example", false),
            ("api.example:", false),
            (":443", false),
            ("api.example:0", false),
            ("api.example:65536", false),
            ("::1:443", false),
            ("[::1]", false),
            ("[nope]:80", false),
            ("a b:80", false),
            ("user@a:80", false),
        ];
        for (text, ok) in cases {
            assert_eq!(is_host_port(text), *ok, "{text:?}");
        }
    }

    #[test]
    fn networks_and_bare_addresses() {
        let cases: &[(&str, Option<&str>)] = &[
            ("10.1.0.0/16", Some("10.1.0.0/16")),
            ("127.0.0.1", Some("127.0.0.1/32")),
            ("::1", Some("::1/128")),
            ("fd00::/8", Some("fd00::/8")),
            (" 192.168.0.1/32 ", Some("192.168.0.1/32")),
            ("10.0.0.0/33", None),
            ("localhost", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(
                parse_net(text).ok().map(|n| n.to_string()).as_deref(),
                *want,
                "{text:?}"
            );
        }
    }

    #[test]
    fn quoted_strings_are_removed_from_serde_messages() {
        let cases: &[(&str, &str)] = &[
            (
                "invalid type: string \"whsec_x\", expected u32",
                "invalid type: a string, expected u32",
            ),
            (
                "invalid type: string \"a\\\"b\", expected a sequence",
                "invalid type: a string, expected a sequence",
            ),
            ("invalid type: string \"unterminated", "invalid type: a string"),
            (
                "invalid value: integer `-1`, expected u32",
                "invalid value: integer `-1`, expected u32",
            ),
        ];
        for (message, want) in cases {
            assert_eq!(redact_quoted_string(message), *want);
        }
    }

    #[test]
    fn secrets_never_leak() {
        let config = parse(&full_toml());
        assert_no_secret(&format!("{config:?}"));
        assert_no_secret(&config.summary());
        let from_env = Config::load(
            &Overrides::default(),
            &env_from(&[("COURIER_INGRESS_TOKEN", "hunter2"), ("COURIER_ADMIN_TOKEN", "s3kr1t")]),
        )
        .unwrap();
        assert_no_secret(&format!("{from_env:?}"));
        assert_no_secret(&from_env.summary());
        // Secret values put in the wrong place, or on a line with a syntax error.
        let bad_files = [
            "[signing]\nsecrets = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
            "ingress_token = [\"tok-INGRESS-5ecret\"]\n",
            "ingress_token = \"tok-INGRESS-5ecret\n",
            "ingress_token = tok-INGRESS-5ecret\n",
            "[signing.keys]\nbilling = \"sk-BILLING-5ecret\"\n",
            "[signing.keys]\nbilling = [\"sk-BILLING-5ecret\", 3]\n",
            "alert_url = \"https://ops.example/alerts/SECRETPATH\"\nalert_url = \"x\"\n",
            "alert_url = \"https//ops.example/SECRETPATH\"\n",
        ];
        for text in bad_files {
            let msg = Config::from_toml_str(text, "c.toml").unwrap_err().to_string();
            assert_no_secret(&msg);
        }
        let url_with_password = parse("[[route]]\nname = \"a\"\nurl = \"https://user:s3kr1t@a.example/h\"\n");
        assert_no_secret(&format!("{url_with_password:?}"));
        assert_no_secret(&url_with_password.summary());
    }

    #[test]
    fn summary_describes_the_settings() {
        let summary = parse(&full_toml()).summary();
        for want in [
            "listen 0.0.0.0:9001 (ingress), [::1]:9002 (admin); data_dir /var/lib/courier",
            "max_body 2MiB; ingress_token set; admin_token set; alert_url https://ops.example/…",
            "shutdown_grace 0s; retention 1d (delivered), 7d (dead)",
            "retry: base_delay 250ms, max_delay 10m, jitter full, max_attempts 8",
            "max_response_body 1KiB",
            "signing: scheme standard, 2 secrets by default, keys: billing (2 secrets), partner (1 secret)",
            "egress: private targets allowed, allow: 127.0.0.1/32, 10.1.0.0/16, ::1/128, 192.168.1.7/32",
            "route billing -> https://billing.example/hooks (signing key billing, scheme stripe)",
            "route partner-2_x -> http://partner.example:8080/in?a=1 (signing key partner, scheme standard)",
            "host api.bigcustomer.example:443: max_in_flight 50",
            "endpoint https://slow.example/hook: rate_per_second 5",
        ] {
            assert!(summary.contains(want), "missing {want:?} in:\n{summary}");
        }
        let default = Config::default().summary();
        assert!(
            default.contains("ingress_token unset; admin_token unset; alert_url unset"),
            "{default}"
        );
        assert!(
            default.contains("max_response_body 64KiB") && default.contains("max_body 1MiB"),
            "{default}"
        );
    }

    #[test]
    fn error_accessors() {
        let e = Config::from_toml_str("x = 1", "f.toml").unwrap_err();
        assert_eq!(e.place(), "config f.toml");
        assert_eq!(e.problem(), "unknown key \"x\" (line 1)");
        assert_eq!(ConfigError::new("a\nb", "c\r\nd").to_string(), "a b: c d");
    }
}
