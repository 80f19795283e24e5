//! The TOML layer: the file as serde reads it (`FileConfig` and its sections, every key
//! optional, unknown keys rejected; the `[[route]]`, `[[host]]` and `[[endpoint]]` arrays
//! are in `sections`), its conversion onto the defaults, and the rewriting of toml/serde
//! errors into one line that names the key and never quotes a value.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::error::Problem;
use super::listen::parse_mode;
use super::parse::{
    parse_duration_text, parse_each, parse_host_entry, parse_ingress_listen, parse_jitter, parse_listen, parse_net,
    parse_origin, parse_scheme, parse_size_text, parse_target, parse_url,
};
use super::policy::{conflicting_backoff, implied_attempts, parse_schedule, parse_statuses, FileStatuses};
use super::sections::{FileEndpoint, FileHost, FileRoute};
use super::{Config, ConfigError, ListenerAccess, SigningKey};
use crate::signing::Secret;

impl Config {
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

    fn apply_file(&mut self, file: FileConfig) -> Result<(), Problem> {
        set(&mut self.listen, "listen", file.listen, parse_ingress_listen)?;
        set(&mut self.listen_mode, "listen_mode", file.listen_mode, parse_mode)?;
        set(&mut self.admin_listen, "admin_listen", file.admin_listen, parse_listen)?;
        set_opt(&mut self.ops_listen, "ops_listen", file.ops_listen, parse_listen)?;
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
        if let Some(allow) = file.allow_unauthenticated_network {
            self.allow_unauthenticated_network = allow;
        }
        set_opt(&mut self.alert_url, "alert_url", file.alert_url, parse_url)?;
        if let Some(access) = file.ingress {
            access.apply("ingress", &mut self.ingress)?;
        }
        if let Some(access) = file.admin {
            access.apply("admin", &mut self.admin)?;
        }

        if let Some(mut retry) = file.retry {
            let r = &mut self.retry;
            if let Some(items) = retry.schedule.take() {
                if retry.base_delay.is_some() || retry.max_delay.is_some() {
                    return Err(conflicting_backoff("retry"));
                }
                let steps = parse_schedule("retry.schedule", &items)?;
                if retry.max_attempts.is_none() {
                    r.max_attempts = implied_attempts(&steps);
                }
                r.schedule = Some(steps);
            }
            if let Some(statuses) = retry.statuses.take() {
                r.statuses = parse_statuses("retry.statuses", statuses)?;
            }
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
            d.max_in_flight = delivery.max_in_flight.unwrap_or(d.max_in_flight);
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
            set(
                &mut d.idle_connection_timeout,
                "delivery.idle_connection_timeout",
                delivery.idle_connection_timeout,
                parse_duration_text,
            )?;
            d.max_idle_connections = delivery.max_idle_connections.unwrap_or(d.max_idle_connections);
        }
        if let Some(circuit) = file.circuit {
            circuit.apply(&mut self.circuit)?;
        }
        if let Some(log) = file.log {
            log.apply(&mut self.log)?;
        }
        self.drain = file.drain.unwrap_or_default();
        if let Some(signing) = file.signing {
            set(&mut self.signing.scheme, "signing.scheme", signing.scheme, parse_scheme)?;
            if let Some(secrets) = signing.secrets {
                self.signing.secrets = secrets.into_iter().map(Secret::new).collect();
            }
            if let Some(keys) = signing.keys {
                self.signing.keys = keys
                    .into_iter()
                    .map(|(name, key)| {
                        let key = key.into_key(&name)?;
                        Ok((name, key))
                    })
                    .collect::<Result<_, String>>()?;
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
                .map(|(i, h)| h.into_host(i))
                .collect::<Result<_, _>>()?;
        }
        if let Some(endpoints) = file.endpoint {
            self.endpoints = endpoints
                .into_iter()
                .enumerate()
                .map(|(i, e)| e.into_endpoint(i))
                .collect::<Result<_, _>>()?;
        }
        Ok(())
    }
}

/// The TOML file, as written: every key optional, unknown keys rejected at every level.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    listen_mode: Option<String>,
    admin_listen: Option<String>,
    data_dir: Option<String>,
    max_body: Option<String>,
    shutdown_grace: Option<String>,
    retention: Option<String>,
    dead_retention: Option<String>,
    ingress_token: Option<String>,
    admin_token: Option<String>,
    ops_listen: Option<String>,
    allow_unauthenticated_network: Option<bool>,
    alert_url: Option<String>,
    ingress: Option<FileAccess>,
    admin: Option<FileAccess>,
    /// CONTRACT §6's spelling of `egress.allow_private_targets`.
    allow_private_targets: Option<bool>,
    /// CONTRACT §6's spelling of `egress.allow`.
    egress_allow: Option<Vec<String>>,
    retry: Option<FileRetry>,
    delivery: Option<FileDelivery>,
    circuit: Option<super::circuit::FileCircuit>,
    log: Option<super::log::FileLog>,
    drain: Option<super::drain::DrainConfig>,
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
    schedule: Option<Vec<String>>,
    statuses: Option<FileStatuses>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDelivery {
    connect_timeout: Option<String>,
    request_timeout: Option<String>,
    max_in_flight: Option<u32>,
    max_in_flight_per_host: Option<u32>,
    rate_per_second: Option<u32>,
    pause_after_permanent_failures: Option<u32>,
    max_response_body: Option<String>,
    idle_connection_timeout: Option<String>,
    max_idle_connections: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSigning {
    scheme: Option<String>,
    secrets: Option<Vec<String>>,
    keys: Option<BTreeMap<String, FileSigningKey>>,
}

/// A `[signing.keys]` entry in either spelling: the list of secrets, or a table with
/// `secrets` and `targets`. Deserialized by hand rather than `#[serde(untagged)]` so a
/// mistake in either form gets serde's precise message (unknown key, wrong type) with its
/// path, instead of "data did not match any variant".
enum FileSigningKey {
    Secrets(Vec<String>),
    Table(FileSigningKeyTable),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSigningKeyTable {
    secrets: Option<Vec<String>>,
    targets: Option<Vec<String>>,
}

impl<'de> Deserialize<'de> for FileSigningKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = FileSigningKey;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of secrets or a table with secrets and targets")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Vec::deserialize(SeqAccessDeserializer::new(seq)).map(FileSigningKey::Secrets)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                FileSigningKeyTable::deserialize(MapAccessDeserializer::new(map)).map(FileSigningKey::Table)
            }
        }
        deserializer.deserialize_any(KeyVisitor)
    }
}

impl FileSigningKey {
    fn into_key(self, name: &str) -> Result<SigningKey, String> {
        let key = format!("signing.keys.{name}");
        let (secrets, targets) = match self {
            FileSigningKey::Secrets(secrets) => (secrets, Vec::new()),
            FileSigningKey::Table(table) => (
                table.secrets.ok_or_else(|| format!("{key}: missing key \"secrets\""))?,
                table.targets.unwrap_or_default(),
            ),
        };
        Ok(SigningKey {
            secrets: secrets.into_iter().map(Secret::new).collect(),
            targets: parse_each(&format!("{key}.targets"), &targets, parse_target)?,
        })
    }
}

/// `[ingress]` and `[admin]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileAccess {
    allowed_origins: Option<Vec<String>>,
    hosts: Option<Vec<String>>,
}

impl FileAccess {
    fn apply(self, section: &str, access: &mut ListenerAccess) -> Result<(), String> {
        if let Some(origins) = self.allowed_origins {
            access.allowed_origins = parse_each(&format!("{section}.allowed_origins"), &origins, parse_origin)?;
        }
        if let Some(hosts) = self.hosts {
            access.hosts = parse_each(&format!("{section}.hosts"), &hosts, parse_host_entry)?;
        }
        Ok(())
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileEgress {
    allow_private_targets: Option<bool>,
    allow: Option<Vec<String>>,
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
pub(super) fn redact_quoted_string(message: &str) -> String {
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
