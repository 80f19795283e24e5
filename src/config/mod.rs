//! The typed configuration: one tree of plain values ([`Config`]) built from four layers,
//! lowest to highest precedence — the embedded defaults (CONTRACT §7), a TOML file
//! (`--config` or `COURIER_CONFIG`), the `COURIER_*` environment variables of [`ENV_VARS`],
//! and the command-line flags ([`Overrides`]) — then checked by [`Config::validate`].
//!
//! Shape of the code, and why:
//! - One definition per setting: the field of its section struct carries its doc comment,
//!   the section's `Default` its default, and a `#[serde(...)]` attribute how the file
//!   writes it. The TOML is read straight into this tree (`#[serde(default,
//!   deny_unknown_fields)]` at every level, so a typo is an error instead of a silently
//!   ignored setting, and an unwritten key keeps its default). Adding a section is one file
//!   with its struct and one field here.
//! - Values written as text (durations, sizes, addresses, URLs, ...) are read through the
//!   markers of `de` by their parsers (in `parse`, or beside the type they make: `listen`,
//!   `log`, `proxy`).
//! - A variable is another spelling of one key: `env`'s table turns each set variable into
//!   that key's TOML value, put over the file's document, and serde reads the whole once, so
//!   a setting reads the same from either.
//! - The environment is read only through a closure and only for the names in
//!   [`ENV_VARS`]: tests inject variables without touching the process, and the variables
//!   Kubernetes invents for a Service named `courier` (`COURIER_PORT`, ...) are ignored.
//! - Every error is one line naming the place (file, key and line; variable; flag) and never
//!   contains a secret: tokens and signing secrets are [`Secret`]s from the moment they are
//!   read, values of secret variables are not echoed, and serde's "invalid type" messages
//!   have their quoted string removed because it may be a secret put under the wrong key.
//! - `alert_url` is treated as sensitive too (chat-style alert URLs carry their credential
//!   in the path): `Debug` and [`Config::summary`] show only its origin.
//!
//! Where things live:
//! - this file: the tree ([`Config`]), its defaults and `Debug`, [`Config::load`] (the
//!   layering), and the lookups the runtime uses;
//! - the sections, each with its struct and defaults: `access` (`[ingress]`, `[admin]`),
//!   `retry` (with the `schedule` and `statuses` readers), `delivery`, `circuit`, `log`,
//!   `signing`, `egress` (with `proxy`), `tls`, `sections` (`[[route]]`, `[[host]]`, `[[endpoint]]`), `policy`
//!   (the retry keys of routes and endpoints, [`PolicyOverrides`], their checks and
//!   [`Config::policy_book`]), `listen` (the ingress address and its parsers);
//! - `file`: the TOML layer ([`Config::from_toml_str`]) and its one-line errors; `shape`: what
//!   the file's keys mean together (aliases, groups), settled before serde reads them; `de`:
//!   how values written as text are read; `parse` and [`units`]: the shared parsers;
//! - `env`: the table of variables ([`ENV_VARS`]), the environment layer and the flag layer
//!   ([`Overrides`]);
//! - `error`: [`ConfigError`] (a leaf: it asks no other module anything); `validate`: [`Config::validate`] and its rules; `summary`:
//!   [`Config::summary`] and the redacting formatters it shares with `Debug`.

mod access;
mod circuit;
mod de;
mod delivery;
mod drain;
mod egress;
mod env;
mod error;
mod file;
mod fleet;
mod listen;
mod log;
mod parse;
mod policy;
mod proxy;
mod retry;
mod sections;
mod shape;
mod signing;
mod summary;
mod tls;
pub mod units;
mod validate;

#[cfg(test)]
mod tests;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use url::Url;

use crate::signing::scope::TargetPattern;
use crate::signing::Secret;
use de::{Dur, Link, Size};
use listen::{Ingress, Mode, Tcp};

pub use access::{IngressConfig, ListenerAccess, DEFAULT_IDLE_TIMEOUT};
pub use circuit::CircuitConfig;
pub use delivery::DeliveryConfig;
pub use drain::{peer_url, DrainConfig, MAX_CONCURRENCY as DRAIN_MAX_CONCURRENCY};
pub use egress::EgressConfig;
pub use env::ENV_VARS;
pub use error::ConfigError;
pub use fleet::{redis_origin, FleetConfig, PasswordSource};
pub use listen::{ListenAddr, DEFAULT_LISTEN_MODE};
pub use log::{LogConfig, LogFormat};
pub use policy::{describe_policy, PolicyOverrides};
pub use proxy::EgressProxy;
pub use retry::RetryConfig;
pub use sections::{EndpointConfig, HostConfig, RouteConfig};
pub use signing::{SigningConfig, SigningKey};
use summary::origin_only;
pub use summary::PublicKeyEntry;
pub use tls::{HostTls, TlsConfig, TlsRoots, TlsVersion};

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

/// The whole configuration: values only; the modules that use them own their meaning.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Ingress listener: TCP or a Unix domain socket.
    #[serde(deserialize_with = "de::one::<Ingress, _>")]
    pub listen: ListenAddr,
    /// Permission bits of the ingress socket file (`listen_mode`); only used with `unix:`.
    #[serde(deserialize_with = "de::one::<Mode, _>")]
    pub listen_mode: u32,
    /// Admin listener.
    #[serde(deserialize_with = "de::one::<Tcp, _>")]
    pub admin_listen: SocketAddr,
    /// Probes and metrics listener (no token); unset: served on the admin listener only.
    #[serde(deserialize_with = "de::opt::<Tcp, _>")]
    pub ops_listen: Option<SocketAddr>,
    /// Where the store lives.
    pub data_dir: PathBuf,
    /// Largest accepted request body, in bytes.
    #[serde(deserialize_with = "de::one::<Size, _>")]
    pub max_body: u64,
    /// How long in-flight attempts may finish after SIGTERM.
    #[serde(deserialize_with = "de::one::<Dur, _>")]
    pub shutdown_grace: Duration,
    /// How long delivered messages are kept.
    #[serde(deserialize_with = "de::one::<Dur, _>")]
    pub retention: Duration,
    /// How long dead-lettered messages are kept.
    #[serde(deserialize_with = "de::one::<Dur, _>")]
    pub dead_retention: Duration,
    /// Required on ingress when set.
    pub ingress_token: Option<Secret>,
    /// Required on the admin API (but `/healthz`) when set.
    pub admin_token: Option<Secret>,
    /// Serve a non-loopback `listen`/`admin_listen` without its token, on purpose.
    pub allow_unauthenticated_network: bool,
    /// Where endpoint-paused alerts are posted.
    #[serde(deserialize_with = "de::opt::<Link, _>")]
    pub alert_url: Option<Url>,
    /// `[ingress]`: browser origins and extra `Host` names ingress accepts, its idle
    /// timeout and the bytes its accepts in progress may hold.
    pub ingress: IngressConfig,
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
    /// `[fleet]`: fleet-wide limits on Redis.
    pub fleet: FleetConfig,
    /// `[drain]`: where `courier drain` hands open messages over.
    pub drain: DrainConfig,
    /// `[signing]`.
    pub signing: SigningConfig,
    /// `[egress]` (also spelled at the top level, CONTRACT §6: see `shape`).
    pub egress: EgressConfig,
    /// `[tls]`: trust and versions toward receivers.
    pub tls: TlsConfig,
    /// `[[route]]`, in file order.
    #[serde(rename = "route")]
    pub routes: Vec<RouteConfig>,
    /// `[[host]]`, in file order.
    #[serde(rename = "host")]
    pub hosts: Vec<HostConfig>,
    /// `[[endpoint]]`, in file order.
    #[serde(rename = "endpoint")]
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
            ingress: IngressConfig::default(),
            admin: ListenerAccess::default(),
            retry: RetryConfig::default(),
            delivery: DeliveryConfig::default(),
            circuit: CircuitConfig::default(),
            log: LogConfig::default(),
            fleet: FleetConfig::default(),
            drain: DrainConfig::default(),
            signing: SigningConfig::default(),
            egress: EgressConfig::default(),
            tls: TlsConfig::default(),
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
            .field("circuit", &self.circuit)
            .field("log", &self.log)
            .field("fleet", &self.fleet)
            .field("drain", &self.drain)
            .field("signing", &self.signing)
            .field("egress", &self.egress)
            .field("tls", &self.tls)
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
        let file = match path {
            Some(path) => {
                let origin = path.display().to_string();
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| ConfigError::file(&origin, format!("cannot read the file: {e}")))?;
                Some((text, origin))
            }
            None => None,
        };
        let config = Config::layered(file.as_ref().map(|(t, o)| (t.as_str(), o.as_str())), env, flags)?;
        config.validate()?;
        Ok(config)
    }

    /// The layers over the defaults — the file (`text`, `origin`), the environment, the
    /// flags — without validation. The file is read alone first, so its errors come first
    /// and name its keys and lines.
    pub(super) fn layered(
        file: Option<(&str, &str)>,
        env: &dyn Fn(&str) -> Option<String>,
        flags: &Overrides,
    ) -> Result<Config, ConfigError> {
        let root = match file {
            Some((text, origin)) => {
                let root = file::document(text, origin)?;
                Config::from_document(root.clone(), text, origin)?;
                root
            }
            None => toml_edit::Table::new(),
        };
        let mut config = env::overlay(root, env)?;
        config.apply_flags(flags)?;
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
