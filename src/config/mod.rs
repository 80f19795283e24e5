//! The typed configuration: one tree of plain values ([`Config`]) built from four layers,
//! lowest to highest precedence — the embedded defaults (CONTRACT §7), a TOML file
//! (`--config` or `COURIER_CONFIG`), the `COURIER_*` environment variables of [`ENV_VARS`],
//! and the command-line flags ([`Overrides`]) — then checked by [`Config::validate`].
//!
//! Shape of the code, and why:
//! - One declaration per setting: the field of its section, declared with `section!`,
//!   carries its doc comment, its default (`= value`), how `Debug` shows it when it may hold
//!   a credential (`=> f`), and how the file writes it: its reader (`["de::one::<Dur, _>"]`,
//!   a `deserialize_with`) or a `#[serde(...)]` attribute; the summary names it by that
//!   field (`pairs!`), reload's restart-only list by its path.
//!   The TOML is read straight into this tree (`#[serde(default, deny_unknown_fields)]` at
//!   every level, so a typo is an error instead of a silently ignored setting, and an
//!   unwritten key keeps its default).
//! - Values written as text (durations, sizes, addresses, URLs, ...) are read through the
//!   markers of `de` by their parsers (in `parse`, or beside the type they make).
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
//! - this file: the tree ([`Config`]), [`Config::load`] (the layering), and the lookups the
//!   runtime uses;
//! - the sections, each with its struct: `listen` (the listeners' addresses, `[ingress]`,
//!   `[admin]`), `retry` (with the `schedule` and `statuses` readers), `delivery`,
//!   `circuit`, `log`, `fleet`, `drain`, `signing`, `egress` (with the proxy), `tls`,
//!   `sections` (`[[route]]`, `[[host]]`, `[[endpoint]]`), `policy` (the retry keys of routes
//!   and endpoints, [`PolicyOverrides`], their checks and [`Config::policy_book`]);
//! - `file`: the TOML layer ([`Config::from_toml_str`]) and its one-line errors; `shape`: what
//!   the file's keys mean together (aliases, groups), settled before serde reads them; `de`:
//!   how values written as text are read; `parse` and [`units`]: the shared parsers;
//! - `env`: the table of variables ([`ENV_VARS`]), the environment layer and the flag layer
//!   ([`Overrides`]);
//! - `error`: [`ConfigError`] (a leaf); `validate`: [`Config::validate`] and its rules;
//!   `summary`: [`Config::summary`] and the redacting formatters it shares with `Debug`.

/// Declares a section of the tree: its struct (each field with its doc and how the file
/// writes it; `["de::one::<Dur, _>"]` after the type is the field's `deserialize_with`
/// reader), its `Default` from the value after each field's `=` (a section with keys the
/// file must write has none), its `KEYS`, and its `Debug`, which shows a field written
/// `=> f` as `f(&value)` (a URL that may carry a credential).
macro_rules! section {
    (@shown $value:expr) => { &$value };
    (@shown $value:expr, $shown:expr) => { &($shown)(&$value) };
    (@debug $name:ident $($field:ident $($shown:expr)?),*) => {
        impl $name {
            /// Its fields' names, in order: the keys the file writes, where no `rename` says
            /// otherwise (`shape` gathers a group's keys by them).
            pub const KEYS: &'static [&'static str] = &[$(stringify!($field)),*];
        }
        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($name))
                    $(.field(stringify!($field), section!(@shown self.$field $(, $shown)?)))*
                    .finish()
            }
        }
    };
    ($(#[$attr:meta])* pub struct $name:ident {
        $($(#[$field_attr:meta])* pub $field:ident: $ty:ty $([$reader:literal])? = $default:expr $(=> $shown:expr)?,)*
    }) => {
        $(#[$attr])*
        pub struct $name {
            $($(#[$field_attr])* $(#[serde(deserialize_with = $reader)])? pub $field: $ty,)*
        }
        impl Default for $name {
            fn default() -> Self {
                $name { $($field: $default,)* }
            }
        }
        section!(@debug $name $($field $($shown)?),*);
    };
    ($(#[$attr:meta])* pub struct $name:ident {
        $($(#[$field_attr:meta])* pub $field:ident: $ty:ty $([$reader:literal])? $(=> $shown:expr)?,)*
    }) => {
        $(#[$attr])*
        pub struct $name {
            $($(#[$field_attr])* $(#[serde(deserialize_with = $reader)])? pub $field: $ty,)*
        }
        section!(@debug $name $($field $($shown)?),*);
    };
}

/// Declares an enum of a setting's values, each with the one spelling the file writes:
/// serde reads exactly those, and `as_str` gives them back for the summary. The drain's
/// `Phase` is spelled the same way (with `Serialize` added), for its status.
macro_rules! spelled {
    ($(#[$attr:meta])* pub enum $name:ident { $($(#[$variant_attr:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$attr])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
        pub enum $name {
            $($(#[$variant_attr])* #[serde(rename = $text)] $variant,)*
        }
        impl $name {
            /// The value as written.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }
        }
    };
}
pub(crate) use spelled;

/// `key value, key value, ...`: the named fields of a section as `check-config` shows
/// them, each through its formatter where one is given (`field: dur`), else `Display`.
macro_rules! pairs {
    (@shown $value:expr) => { $value };
    (@shown $value:expr, $shown:expr) => { ($shown)(&$value) };
    ($section:expr; $($field:ident $(: $shown:expr)?),* $(,)?) => {
        [$(format!("{} {}", stringify!($field), pairs!(@shown $section.$field $(, $shown)?))),*].join(", ")
    };
}

/// `("section.field", value)` for the named fields of a section (`("field", value)` without
/// the section's name): a rule's key is its path.
macro_rules! keyed {
    ($section:expr, $name:literal; $($field:ident),* $(,)?) => {
        [$((concat!($name, ".", stringify!($field)), $section.$field)),*]
    };
    ($section:expr; $($field:ident),* $(,)?) => { [$((stringify!($field), $section.$field)),*] };
}

mod circuit;
mod de;
mod delivery;
mod drain;
mod egress;
mod env;
mod error;
mod file;
mod fleet;
mod intercept;
mod listen;
mod log;
mod parse;
mod policy;
mod retry;
mod sections;
mod shape;
mod signing;
mod store;
mod summary;
mod tls;
pub mod units;
mod validate;

#[cfg(test)]
mod tests;

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use url::Url;

use crate::signing::scope::TargetPattern;
use crate::signing::Secret;
use de::{Dur, Link, Size};
use listen::{Ingress, Mode, Tcp};

pub use circuit::CircuitConfig;
pub use delivery::DeliveryConfig;
pub use drain::{peer_url, DrainConfig, MAX_CONCURRENCY as DRAIN_MAX_CONCURRENCY};
pub use egress::{EgressConfig, EgressProxy};
pub use env::ENV_VARS;
pub use error::ConfigError;
pub use fleet::{redis_origin, FleetConfig, PasswordSource};
pub use intercept::{HostPattern, InterceptConfig};
pub use listen::{
    IngressConfig, ListenAddr, ListenerAccess, DEFAULT_IDLE_TIMEOUT, DEFAULT_LISTEN_MODE, DEFAULT_SEND_TIMEOUT,
};
pub use log::{LogConfig, LogFormat};
pub use policy::{describe_policy, PolicyOverrides};
pub use retry::RetryConfig;
pub use sections::{EndpointConfig, HostConfig, RouteConfig};
pub use signing::{SigningConfig, SigningKey};
pub use store::StoreConfig;
use summary::origin_only;
pub use summary::PublicKeyEntry;
pub use tls::{HostTls, TlsConfig, TlsRoots, TlsVersion};

/// The environment variable naming the TOML file (used when `--config` is not given).
pub const CONFIG_ENV: &str = "COURIER_CONFIG";

/// Settings given as command-line flags: the highest layer. They are the flags every
/// command shares (`courier --help` shows these docs), so the CLI declares them here too.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct Overrides {
    /// TOML config file (also COURIER_CONFIG).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Ingress address, ip:port or unix:/path (also COURIER_LISTEN; the socket mode is listen_mode).
    #[arg(long, global = true, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Admin address, ip:port (also COURIER_ADMIN_LISTEN).
    #[arg(long, global = true, value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// Read-only probes and metrics address, ip:port (also COURIER_OPS_LISTEN; off by default).
    #[arg(long, global = true, value_name = "ADDR")]
    pub ops_listen: Option<String>,
    /// Data directory (also COURIER_DATA_DIR).
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

section! {
    /// The whole configuration: values only; the modules that use them own their meaning.
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct Config {
        /// Ingress listener: TCP or a Unix domain socket.
        pub listen: ListenAddr ["de::one::<Ingress, _>"] = SocketAddr::from(([127, 0, 0, 1], 8787)).into(),
        /// Permission bits of the ingress socket file (`listen_mode`); only used with `unix:`.
        pub listen_mode: u32 ["de::one::<Mode, _>"] = DEFAULT_LISTEN_MODE => |mode: &u32| Octal(*mode),
        /// Admin listener.
        pub admin_listen: SocketAddr ["de::one::<Tcp, _>"] = SocketAddr::from(([127, 0, 0, 1], 8788)),
        /// Probes and metrics listener (no token); unset: served on the admin listener only.
        pub ops_listen: Option<SocketAddr> ["de::opt::<Tcp, _>"] = None,
        /// Where the store lives.
        pub data_dir: PathBuf = PathBuf::from("./courier-data"),
        /// Largest accepted request body, in bytes.
        pub max_body: u64 ["de::one::<Size, _>"] = 1 << 20,
        /// How long in-flight attempts may finish after SIGTERM.
        pub shutdown_grace: Duration ["de::one::<Dur, _>"] = Duration::from_secs(30),
        /// How long delivered messages are kept.
        pub retention: Duration ["de::one::<Dur, _>"] = Duration::from_secs(3 * 86_400),
        /// How long dead-lettered messages are kept.
        pub dead_retention: Duration ["de::one::<Dur, _>"] = Duration::from_secs(30 * 86_400),
        /// Required on ingress when set.
        pub ingress_token: Option<Secret> = None,
        /// Required on the admin API (but `/healthz`) when set.
        pub admin_token: Option<Secret> = None,
        /// Serve a non-loopback `listen`/`admin_listen` without its token, on purpose.
        pub allow_unauthenticated_network: bool = false,
        /// Where endpoint-paused alerts are posted.
        pub alert_url: Option<Url> ["de::opt::<Link, _>"] = None => |url: &Option<Url>| url.as_ref().map(origin_only),
        /// `[ingress]`: browser origins and extra `Host` names ingress accepts, its idle
        /// timeout and the bytes its accepts in progress may hold.
        pub ingress: IngressConfig = IngressConfig::default(),
        /// `[admin]`: browser origins and extra `Host` names the admin API accepts.
        pub admin: ListenerAccess = ListenerAccess::default(),
        /// `[retry]`.
        pub retry: RetryConfig = RetryConfig::default(),
        /// `[delivery]`.
        pub delivery: DeliveryConfig = DeliveryConfig::default(),
        /// `[circuit]`: the per-host circuit breaker.
        pub circuit: CircuitConfig = CircuitConfig::default(),
        /// `[log]`: the log line format.
        pub log: LogConfig = LogConfig::default(),
        /// `[fleet]`: fleet-wide limits on Redis.
        pub fleet: FleetConfig = FleetConfig::default(),
        /// `[drain]`: where `courier drain` hands open messages over.
        pub drain: DrainConfig = DrainConfig::default(),
        /// `[signing]`.
        pub signing: SigningConfig = SigningConfig::default(),
        /// `[egress]` (also spelled at the top level, CONTRACT §6: see `shape`).
        pub egress: EgressConfig = EgressConfig::default(),
        /// `[tls]`: trust and versions toward receivers.
        pub tls: TlsConfig = TlsConfig::default(),
        /// `[intercept]`: `CONNECT` terminated for listed hosts, tunnelled for others.
        pub intercept: InterceptConfig = InterceptConfig::default(),
        /// `[store]`: the keys payloads are sealed with at rest.
        pub store: StoreConfig = StoreConfig::default(),
        /// `[[route]]`, in file order.
        #[serde(rename = "route")]
        pub routes: Vec<RouteConfig> = Vec::new(),
        /// `[[host]]`, in file order.
        #[serde(rename = "host")]
        pub hosts: Vec<HostConfig> = Vec::new(),
        /// `[[endpoint]]`, in file order.
        #[serde(rename = "endpoint")]
        pub endpoints: Vec<EndpointConfig> = Vec::new(),
    }
}

/// A file mode as `Debug` shows it: as the file writes it (`0660`).
struct Octal(u32);

impl fmt::Debug for Octal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

impl Config {
    /// Builds the configuration from every layer — defaults, the TOML file (`flags.config`,
    /// else `COURIER_CONFIG`; a missing or unreadable file is an error), the variables of
    /// [`ENV_VARS`] read through `env`, then `flags` — and validates it.
    pub fn load(flags: &Overrides, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        // An empty COURIER_CONFIG (e.g. `COURIER_CONFIG=${X}` with X unset) means "no file".
        let from_env = || env(CONFIG_ENV).filter(|p| !p.trim().is_empty()).map(PathBuf::from);
        let path = flags.config.clone().or_else(from_env);
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
