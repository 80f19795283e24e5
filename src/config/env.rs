//! The environment layer ([`ENV_VARS`]) and the flag layer ([`Overrides`]).
//!
//! A variable is another spelling of one file key: [`VARS`] says which key, and how the
//! variable's text becomes that key's TOML value (a string, a number, a boolean, a
//! comma-separated list). The values are put over the file's document once `shape` has
//! settled it, and serde reads the whole once, so a variable is read by exactly the parser
//! of its key. Each set variable is first read on its own, in the order of the table, so a
//! bad value is reported under the variable's name, and a secret one without its value.

use toml_edit::{Array, Item, Table, Value};

use super::error::Problem;
use super::file::{dotted, read, serde_message};
use super::listen::{parse_ingress_listen, parse_listen};
use super::retry::implied_attempts;
use super::{Config, ConfigError, Overrides};
use crate::signing::Secret;

/// How a variable's text becomes its key's value.
#[derive(Clone, Copy)]
enum Kind {
    /// A string, as given (the key's parser trims where it should).
    Text,
    /// A string, trimmed.
    Trim,
    /// A string, trimmed; blank unsets the key (clears what the file set).
    Clear,
    /// A whole number from 0 to `u32::MAX`.
    Int,
    /// `true`, `false`, `1` or `0`, any case.
    Bool,
    /// Comma-separated items, each trimmed; blank is the empty list.
    List,
    /// Comma-separated durations; blank unsets the key (no schedule).
    Schedule,
    /// No file key (the file is often checked in): set on the tree after it is read.
    EnvOnly,
}
use Kind::*;

/// A secret variable: its value is never echoed in an error.
const SECRET: bool = true;
const SHOWN: bool = false;

/// The variable that sets the Redis password, which only the environment may set.
const REDIS_PASSWORD: &str = "COURIER_FLEET_REDIS_PASSWORD";

/// Every variable of the env layer: its key, how it reads, whether it is secret. In the
/// order of the config file, which is the order a bad value is found in.
#[rustfmt::skip]
const VARS: [(&str, &str, Kind, bool); 59] = [
    ("COURIER_LISTEN",                                   "listen",                                  Text,      SHOWN),
    ("COURIER_LISTEN_MODE",                              "listen_mode",                             Text,      SHOWN),
    ("COURIER_ADMIN_LISTEN",                             "admin_listen",                            Text,      SHOWN),
    ("COURIER_OPS_LISTEN",                               "ops_listen",                              Text,      SHOWN),
    ("COURIER_DATA_DIR",                                 "data_dir",                                Text,      SHOWN),
    ("COURIER_MAX_BODY",                                 "max_body",                                Text,      SHOWN),
    ("COURIER_SHUTDOWN_GRACE",                           "shutdown_grace",                          Text,      SHOWN),
    ("COURIER_RETENTION",                                "retention",                               Text,      SHOWN),
    ("COURIER_DEAD_RETENTION",                           "dead_retention",                          Text,      SHOWN),
    ("COURIER_INGRESS_TOKEN",                            "ingress_token",                           Text,      SECRET),
    ("COURIER_ADMIN_TOKEN",                              "admin_token",                             Text,      SECRET),
    ("COURIER_ALLOW_UNAUTHENTICATED_NETWORK",            "allow_unauthenticated_network",           Bool,      SHOWN),
    ("COURIER_ALERT_URL",                                "alert_url",                               Text,      SECRET),
    ("COURIER_INGRESS_ALLOWED_ORIGINS",                  "ingress.allowed_origins",                 List,      SHOWN),
    ("COURIER_INGRESS_HOSTS",                            "ingress.hosts",                           List,      SHOWN),
    ("COURIER_INGRESS_IDLE_TIMEOUT",                     "ingress.idle_timeout",                    Text,      SHOWN),
    ("COURIER_INGRESS_SEND_TIMEOUT",                     "ingress.send_timeout",                    Text,      SHOWN),
    ("COURIER_INGRESS_MAX_PENDING_BYTES",                "ingress.max_pending_bytes",               Text,      SHOWN),
    ("COURIER_INGRESS_ALLOW_GET",                        "ingress.allow_get",                       Bool,      SHOWN),
    ("COURIER_ADMIN_ALLOWED_ORIGINS",                    "admin.allowed_origins",                   List,      SHOWN),
    ("COURIER_ADMIN_HOSTS",                              "admin.hosts",                             List,      SHOWN),
    ("COURIER_ADMIN_IDLE_TIMEOUT",                       "admin.idle_timeout",                      Text,      SHOWN),
    ("COURIER_ADMIN_SEND_TIMEOUT",                       "admin.send_timeout",                      Text,      SHOWN),
    ("COURIER_RETRY_BASE_DELAY",                         "retry.base_delay",                        Text,      SHOWN),
    ("COURIER_RETRY_MAX_DELAY",                          "retry.max_delay",                         Text,      SHOWN),
    ("COURIER_RETRY_JITTER",                             "retry.jitter",                            Text,      SHOWN),
    // A schedule stands for its attempts, unless COURIER_RETRY_MAX_ATTEMPTS is set too.
    ("COURIER_RETRY_SCHEDULE",                           "retry.schedule",                          Schedule,  SHOWN),
    ("COURIER_RETRY_MAX_ATTEMPTS",                       "retry.max_attempts",                      Int,       SHOWN),
    ("COURIER_RETRY_GIVE_UP_AFTER",                      "retry.give_up_after",                     Text,      SHOWN),
    ("COURIER_RETRY_MAX_ATTEMPTS_404",                   "retry.max_attempts_404",                  Int,       SHOWN),
    ("COURIER_RETRY_MAX_RETRY_AFTER",                    "retry.max_retry_after",                   Text,      SHOWN),
    ("COURIER_DELIVERY_CONNECT_TIMEOUT",                 "delivery.connect_timeout",                Text,      SHOWN),
    ("COURIER_DELIVERY_REQUEST_TIMEOUT",                 "delivery.request_timeout",                Text,      SHOWN),
    ("COURIER_DELIVERY_MAX_IN_FLIGHT",                   "delivery.max_in_flight",                  Int,       SHOWN),
    ("COURIER_DELIVERY_MAX_IN_FLIGHT_PER_HOST",          "delivery.max_in_flight_per_host",         Int,       SHOWN),
    ("COURIER_DELIVERY_RATE_PER_SECOND",                 "delivery.rate_per_second",                Int,       SHOWN),
    ("COURIER_DELIVERY_PAUSE_AFTER_PERMANENT_FAILURES",  "delivery.pause_after_permanent_failures", Int,       SHOWN),
    ("COURIER_DELIVERY_MAX_RESPONSE_BODY",               "delivery.max_response_body",              Text,      SHOWN),
    ("COURIER_DELIVERY_IDLE_CONNECTION_TIMEOUT",         "delivery.idle_connection_timeout",        Text,      SHOWN),
    ("COURIER_DELIVERY_MAX_IDLE_CONNECTIONS",            "delivery.max_idle_connections",           Int,       SHOWN),
    ("COURIER_CIRCUIT_FAILURES",                         "circuit.failures",                        Int,       SHOWN),
    ("COURIER_CIRCUIT_PROBE_DELAY",                      "circuit.probe_delay",                     Text,      SHOWN),
    ("COURIER_CIRCUIT_PROBE_MAX_DELAY",                  "circuit.probe_max_delay",                 Text,      SHOWN),
    ("COURIER_LOG_FORMAT",                               "log.format",                              Text,      SHOWN),
    ("COURIER_FLEET_REDIS_URL",                          "fleet.redis_url",                         Text,      SECRET),
    (REDIS_PASSWORD,                                     "fleet.password",                          EnvOnly,   SECRET),
    ("COURIER_FLEET_EXPECTED_REPLICAS",                  "fleet.expected_replicas",                 Int,       SHOWN),
    ("COURIER_FLEET_KEY_PREFIX",                         "fleet.key_prefix",                        Trim,      SHOWN),
    ("COURIER_DRAIN_TO",                                 "drain.to",                                Clear,     SHOWN),
    ("COURIER_DRAIN_PEERS",                              "drain.peers",                             List,      SHOWN),
    ("COURIER_DRAIN_TOKEN",                              "drain.token",                             Text,      SECRET),
    ("COURIER_DRAIN_CONCURRENCY",                        "drain.concurrency",                       Int,       SHOWN),
    ("COURIER_SIGNING_SCHEME",                           "signing.scheme",                          Text,      SHOWN),
    ("COURIER_SIGNING_SECRETS",                          "signing.secrets",                         List,      SECRET),
    ("COURIER_EGRESS_ALLOW_PRIVATE_TARGETS",             "egress.allow_private_targets",            Bool,      SHOWN),
    ("COURIER_EGRESS_ALLOW",                             "egress.allow",                            List,      SHOWN),
    // Its URL may carry a password.
    ("COURIER_EGRESS_PROXY",                             "egress.proxy",                            Clear,     SECRET),
    ("COURIER_EGRESS_NO_PROXY",                          "egress.no_proxy",                         List,      SHOWN),
    ("COURIER_STORE_ENCRYPTION_KEY_FILES",               "store.encryption_key_files",              List,      SHOWN),
];

/// Every environment variable the env layer reads (besides [`CONFIG_ENV`]), in the order of
/// the config file. Any other `COURIER_*` variable is ignored.
///
/// [`CONFIG_ENV`]: super::CONFIG_ENV
pub const ENV_VARS: [&str; VARS.len()] = {
    let mut names = [""; VARS.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = VARS[i].0;
        i += 1;
    }
    names
};

/// The file's settled document `root` (empty without a file) with the set variables put
/// over it, read into the tree.
pub(super) fn overlay(mut root: Table, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    for (name, key, kind, secret) in VARS {
        let Some(text) = env(name) else { continue };
        if matches!(kind, EnvOnly) {
            continue;
        }
        let fail = |problem: Problem| ConfigError::env(name, &text, secret, problem);
        let value = value(kind, &text).map_err(fail)?;
        let mut alone = Table::new();
        put(&mut alone, key, value.clone());
        read(alone).map_err(|e| {
            let problem = serde_message(e.inner().message());
            match kind {
                // A schedule's problem says where in it, as the variable's always has.
                Schedule => fail(problem.at(&format!("the schedule{}", &dotted(e.path())[key.len()..]))),
                _ => fail(problem),
            }
        })?;
        if let (Schedule, Some(Value::Array(steps))) = (kind, &value) {
            if env("COURIER_RETRY_MAX_ATTEMPTS").is_none() {
                let attempts = i64::from(implied_attempts(steps.len()));
                put(&mut root, "retry.max_attempts", Some(attempts.into()));
            }
        }
        put(&mut root, key, value);
    }
    // Every value read alone above: what is left to fail is the file's, already read.
    let mut config =
        read(root).map_err(|e| ConfigError::new("environment", serde_message(e.inner().message()).text))?;
    if let Some(password) = env(REDIS_PASSWORD) {
        config.fleet.password = Some(Secret::new(password));
    }
    Ok(config)
}

/// The TOML value `text` stands for; `None` unsets the key.
fn value(kind: Kind, text: &str) -> Result<Option<Value>, Problem> {
    let blank = text.trim().is_empty();
    Ok(Some(match kind {
        Text => text.into(),
        Trim => text.trim().into(),
        Clear | Schedule if blank => return Ok(None),
        Clear => text.trim().into(),
        Int => match text.trim().parse::<u32>() {
            Ok(n) => i64::from(n).into(),
            Err(_) => return Err(format!("expected a whole number from 0 to {}", u32::MAX).into()),
        },
        Bool => match text.trim().to_ascii_lowercase().as_str() {
            "true" | "1" => true.into(),
            "false" | "0" => false.into(),
            _ => return Err("expected true, false, 1 or 0".into()),
        },
        List if blank => Value::Array(Array::new()),
        // The message must not say which item is empty by quoting it, only where.
        List => match text.split(',').map(str::trim).position(str::is_empty) {
            Some(i) => return Err(format!("item {} of the comma-separated list is empty", i + 1).into()),
            None => Value::Array(text.split(',').map(str::trim).collect()),
        },
        Schedule => Value::Array(text.split(',').collect::<Array>()),
        EnvOnly => return Ok(None),
    }))
}

/// Sets (or with `None` removes) the dotted `key` in `root`, making its tables as needed.
fn put(root: &mut Table, key: &str, value: Option<Value>) {
    let mut table: &mut dyn toml_edit::TableLike = root;
    let (sections, last) = key.rsplit_once('.').map_or(("", key), |(s, l)| (s, l));
    for section in sections.split('.').filter(|s| !s.is_empty()) {
        // A section that is no table is the file's error, reported when the file was read.
        let Some(inner) = table
            .entry(section)
            .or_insert(Item::Table(Table::new()))
            .as_table_like_mut()
        else {
            return;
        };
        table = inner;
    }
    match value {
        Some(value) => table.insert(last, Item::Value(value)),
        None => table.remove(last),
    };
}

impl Config {
    /// Sets the settings given as flags; a bad value is named by its flag.
    pub(super) fn apply_flags(&mut self, flags: &Overrides) -> Result<(), ConfigError> {
        let flag = |name: &str, text: &str, e: String| ConfigError::new(format!("{name} {text:?}"), e);
        if let Some(text) = &flags.listen {
            self.listen = parse_ingress_listen(text).map_err(|e| flag("--listen", text, e))?;
        }
        if let Some(text) = &flags.admin_listen {
            self.admin_listen = parse_listen(text).map_err(|e| flag("--admin-listen", text, e))?;
        }
        if let Some(text) = &flags.ops_listen {
            self.ops_listen = Some(parse_listen(text).map_err(|e| flag("--ops-listen", text, e))?);
        }
        if let Some(dir) = &flags.data_dir {
            self.data_dir = dir.clone();
        }
        Ok(())
    }
}
