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
//!
//! Where things live:
//! - this file: the typed tree ([`Config`] and its section structs), its defaults and
//!   `Debug`, [`Config::load`] (the layering), and the lookups the runtime uses;
//! - `error`: [`ConfigError`];
//! - `file`: the serde TOML layer ([`Config::from_toml_str`]) and its error redaction;
//!   `sections`: its `[[route]]`, `[[host]]` and `[[endpoint]]` arrays;
//! - `env`: the environment layer ([`ENV_VARS`]) and the flag layer ([`Overrides`]);
//! - `parse`: the text-to-value conversions the file, env and flag layers share;
//! - `log`: `[log]` ([`LogConfig`]);
//! - `validate`: [`Config::validate`] and its rules;
//! - `summary`: [`Config::summary`] and the redacting formatters it shares with `Debug`;
//! - `policy`: the retry-policy keys of `[[route]]` and `[[endpoint]]` ([`PolicyOverrides`]),
//!   their checks, and [`Config::policy_book`], the lookup delivery uses;
//! - [`units`]: durations and sizes.

mod circuit;
mod drain;
mod env;
mod error;
mod file;
mod listen;
mod log;
mod parse;
mod policy;
mod sections;
mod summary;
pub mod units;
mod validate;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use url::Url;

use crate::model::{Jitter, OnDead, SignatureScheme};
use crate::policy::StatusRules;
use crate::signing::scope::TargetPattern;
use crate::signing::Secret;

pub use circuit::CircuitConfig;
pub use drain::{peer_url, DrainConfig, MAX_CONCURRENCY as DRAIN_MAX_CONCURRENCY};
pub use env::ENV_VARS;
pub use error::ConfigError;
pub use listen::{ListenAddr, DEFAULT_LISTEN_MODE};
pub use log::{LogConfig, LogFormat};
pub use policy::{describe_policy, PolicyOverrides};
pub use summary::PublicKeyEntry;
use summary::{origin_only, without_password};

/// The environment variable naming the TOML file (used when `--config` is not given).
pub const CONFIG_ENV: &str = "COURIER_CONFIG";

/// Settings given as command-line flags: the highest layer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--config FILE` (takes precedence over `COURIER_CONFIG`).
    pub config: Option<PathBuf>,
    /// `--listen ip:port` or `--listen unix:/path`.
    pub listen: Option<String>,
    /// `--admin-listen ip:port`.
    pub admin_listen: Option<String>,
    /// `--ops-listen ip:port`.
    pub ops_listen: Option<String>,
    /// `--data-dir DIR`.
    pub data_dir: Option<PathBuf>,
}

/// The give-up and backoff policy (`[retry]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryConfig {
    /// Explicit delays before the second, third, ... attempt (the last repeats), instead of
    /// the doubling `base_delay`/`max_delay`. Setting it sets `max_attempts` to its length
    /// plus one unless `max_attempts` is given alongside.
    pub schedule: Option<Vec<Duration>>,
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
    /// Status rules in front of the seed's table (`[retry] statuses`).
    pub statuses: StatusRules,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            schedule: None,
            base_delay: Duration::from_secs(60),
            max_delay: Duration::from_secs(3600),
            jitter: Jitter::Equal,
            max_attempts: 16,
            give_up_after: Duration::from_secs(3 * 86_400),
            max_attempts_404: 5,
            max_retry_after: Duration::from_secs(86_400),
            statuses: StatusRules::default(),
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
    /// Attempts in flight at once, all hosts together: bounds memory and sockets after an
    /// outage, when every host's backlog comes due at once.
    pub max_in_flight: u32,
    /// Attempts in flight to one `host:port`, unless a `[[host]]` overrides it.
    pub max_in_flight_per_host: u32,
    /// Attempts per second per endpoint, unless an `[[endpoint]]` overrides it.
    pub rate_per_second: u32,
    /// Consecutive permanent failures that pause an endpoint.
    pub pause_after_permanent_failures: u32,
    /// Bytes of a response body kept.
    pub max_response_body: u64,
    /// How long a pooled connection may sit idle before it is closed.
    pub idle_connection_timeout: Duration,
    /// Idle pooled connections kept open, all hosts together: past it, those of the hosts
    /// used least recently are closed, so a sweep over many receivers does not leave a
    /// socket open to each of them until `idle_connection_timeout`.
    pub max_idle_connections: u32,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_in_flight: 1024,
            max_in_flight_per_host: 10,
            rate_per_second: 100,
            pause_after_permanent_failures: 100,
            max_response_body: 64 << 10,
            idle_connection_timeout: Duration::from_secs(90),
            // As many as may be in flight: a sweep over a thousand receivers (a SaaS sending
            // each customer's webhooks to its own URL) reuses its connections instead of
            // connecting (and, over TLS, handshaking) for every message; measured on the
            // 1,000-host benchmark, 256 made delivery 0.50x of one host's rate, 1,024 0.79x.
            // The cost is a descriptor (lowered at start to fit the descriptor limit) and
            // tens of KiB of buffers per connection.
            max_idle_connections: 1024,
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
    pub keys: BTreeMap<String, SigningKey>,
}

/// One `[signing.keys]` entry: `name = ["whsec_…"]`, or
/// `name = { secrets = ["whsec_…"], targets = ["https://*.billing.example/*"] }`.
/// `Debug` shows the secrets as `Secret(***)` and the targets as written.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SigningKey {
    /// The secrets; all of them sign (rotation).
    pub secrets: Vec<Secret>,
    /// Where this key may sign; empty: anywhere.
    pub targets: Vec<TargetPattern>,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("secrets", &self.secrets)
            .field("targets", &patterns(&self.targets))
            .finish()
    }
}

/// Who may reach a listener besides server-side clients on loopback names (`[ingress]`,
/// `[admin]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListenerAccess {
    /// Origins whose web pages may send requests, as ASCII origin serializations
    /// (`https://app.example`, `http://localhost:3000`): lowercase, no path, default port
    /// omitted.
    pub allowed_origins: Vec<String>,
    /// Extra names the `Host` header may carry (`name` or `name:port`, `[v6]:port`),
    /// lowercase, without a trailing dot.
    pub hosts: Vec<String>,
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
    /// Where this route may deliver (its URL plus the appended path); empty: anywhere.
    pub targets: Vec<TargetPattern>,
    /// `ordering = "fifo"`: messages sent through this route are ordered, with what a dead
    /// head does (`on_dead`); `None`: `ordering = "none"` (the default).
    pub fifo: Option<OnDead>,
    /// Retry settings for the messages accepted through this route.
    pub policy: PolicyOverrides,
}

impl fmt::Debug for RouteConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteConfig")
            .field("name", &self.name)
            .field("url", &without_password(&self.url))
            .field("signing_key", &self.signing_key)
            .field("scheme", &self.scheme)
            .field("targets", &patterns(&self.targets))
            .field("fifo", &self.fifo)
            .field("policy", &self.policy)
            .finish()
    }
}

/// A per-host override of the in-flight cap (`[[host]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    /// `name:port` (e.g. `api.example:443`, `[::1]:8080`), normalised at load exactly as
    /// live targets are (lowercase, IDNA to punycode), so the limiter's lookup is exact.
    pub host: String,
    /// Attempts in flight to this host at most.
    pub max_in_flight: u32,
}

/// Per-endpoint settings (`[[endpoint]]`): its rate limit, its ordering, its retry policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointConfig {
    /// The endpoint key (by default a target URL without its query). A key that is an
    /// http(s) URL is normalised at load as live targets' default keys are (lowercase
    /// host, punycode, default port dropped, `/` path), so the lookup is exact.
    pub key: String,
    /// Attempts per second to this endpoint at most; `None`: `delivery.rate_per_second`.
    pub rate_per_second: Option<u32>,
    /// `ordering = "fifo"`: every message to this endpoint is ordered, with what a dead head
    /// does (`on_dead`); `None`: `ordering = "none"` (the default).
    pub fifo: Option<OnDead>,
    /// Retry settings (and the in-flight cap) for this endpoint's messages.
    pub policy: PolicyOverrides,
}

/// The whole configuration: values only; the modules that use them own their meaning.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// Ingress listener: TCP or a Unix domain socket.
    pub listen: ListenAddr,
    /// Permission bits of the ingress socket file (`listen_mode`); only used with `unix:`.
    pub listen_mode: u32,
    /// Admin listener.
    pub admin_listen: SocketAddr,
    /// Probes and metrics listener (no token); unset: served on the admin listener only.
    pub ops_listen: Option<SocketAddr>,
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
    /// Serve a non-loopback `listen`/`admin_listen` without its token, on purpose.
    pub allow_unauthenticated_network: bool,
    /// Where endpoint-paused alerts are posted.
    pub alert_url: Option<Url>,
    /// `[ingress]`: browser origins and extra `Host` names ingress accepts.
    pub ingress: ListenerAccess,
    /// `[admin]`: browser origins and extra `Host` names the admin API accepts.
    pub admin: ListenerAccess,
    /// `[retry]`.
    pub retry: RetryConfig,
    /// `[delivery]`.
    pub delivery: DeliveryConfig,
    /// `[circuit]`: the per-host circuit breaker.
    pub circuit: CircuitConfig,
    /// `[log]`: the log line format.
    pub log: LogConfig,
    /// `[drain]`: where `courier drain` hands open messages over.
    pub drain: DrainConfig,
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
            listen: ListenAddr::Tcp(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8787)),
            listen_mode: DEFAULT_LISTEN_MODE,
            admin_listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8788),
            ops_listen: None,
            data_dir: PathBuf::from("./courier-data"),
            max_body: 1 << 20,
            shutdown_grace: Duration::from_secs(30),
            retention: Duration::from_secs(3 * 86_400),
            dead_retention: Duration::from_secs(30 * 86_400),
            ingress_token: None,
            admin_token: None,
            allow_unauthenticated_network: false,
            alert_url: None,
            ingress: ListenerAccess::default(),
            admin: ListenerAccess::default(),
            retry: RetryConfig::default(),
            delivery: DeliveryConfig::default(),
            circuit: CircuitConfig::default(),
            log: LogConfig::default(),
            drain: DrainConfig::default(),
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
            .field("listen_mode", &format_args!("{:04o}", self.listen_mode))
            .field("admin_listen", &self.admin_listen)
            .field("ops_listen", &self.ops_listen)
            .field("data_dir", &self.data_dir)
            .field("max_body", &self.max_body)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("retention", &self.retention)
            .field("dead_retention", &self.dead_retention)
            .field("ingress_token", &self.ingress_token)
            .field("admin_token", &self.admin_token)
            .field("allow_unauthenticated_network", &self.allow_unauthenticated_network)
            .field("alert_url", &self.alert_url.as_ref().map(origin_only))
            .field("ingress", &self.ingress)
            .field("admin", &self.admin)
            .field("retry", &self.retry)
            .field("delivery", &self.delivery)
            .field("log", &self.log)
            .field("drain", &self.drain)
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

    /// The URL of the named route.
    pub fn route_url(&self, name: &str) -> Option<Url> {
        self.routes.iter().find(|r| r.name == name).map(|r| r.url.clone())
    }

    /// The secrets of a `[signing.keys]` entry.
    pub fn signing_key(&self, name: &str) -> Option<&[Secret]> {
        self.signing.keys.get(name).map(|key| key.secrets.as_slice())
    }

    /// The targets a `[signing.keys]` entry may sign for: empty when it is unscoped (it
    /// signs anywhere) or unknown.
    pub fn signing_key_targets(&self, name: &str) -> &[TargetPattern] {
        self.signing.keys.get(name).map_or(&[], |key| key.targets.as_slice())
    }
}

/// Target patterns as written, for `Debug`.
fn patterns(targets: &[TargetPattern]) -> Vec<&str> {
    targets.iter().map(TargetPattern::as_str).collect()
}
