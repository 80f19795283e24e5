//! The environment layer ([`ENV_VARS`], read only through a closure) and the flag layer
//! ([`Overrides`]), each overwriting what the layers below set.

use std::path::PathBuf;

use super::de::{
    Dur, Format, HostEntry, Ingress, JitterMode, Link, Mode, Name, Net, NoProxy, Origin, Proxy, Size, Tcp, Text,
};
use super::error::Problem;
use super::parse::{parse_bool, parse_ingress_listen, parse_listen, parse_u32, split_list};
use super::retry::{check_schedule, implied_attempts};
use super::{Config, ConfigError, Overrides};
use crate::signing::Secret;

/// What a variable sets: its field, read with the parser the file uses for it.
type Setter = fn(&mut Config, &str) -> Result<(), Problem>;

/// Every variable of the env layer and what it sets, in the order of the config file; one
/// entry per variable, so a name cannot lose its setter.
const SETTERS: [(&str, Setter); 56] = [
    ("COURIER_LISTEN", |c, v| set(&mut c.listen, Ingress::parse(v))),
    ("COURIER_LISTEN_MODE", |c, v| set(&mut c.listen_mode, Mode::parse(v))),
    ("COURIER_ADMIN_LISTEN", |c, v| set(&mut c.admin_listen, Tcp::parse(v))),
    ("COURIER_OPS_LISTEN", |c, v| {
        set(&mut c.ops_listen, Tcp::parse(v).map(Some))
    }),
    ("COURIER_DATA_DIR", |c, v| set(&mut c.data_dir, Ok(PathBuf::from(v)))),
    ("COURIER_MAX_BODY", |c, v| set(&mut c.max_body, Size::parse(v))),
    ("COURIER_SHUTDOWN_GRACE", |c, v| {
        set(&mut c.shutdown_grace, Dur::parse(v))
    }),
    ("COURIER_RETENTION", |c, v| set(&mut c.retention, Dur::parse(v))),
    ("COURIER_DEAD_RETENTION", |c, v| {
        set(&mut c.dead_retention, Dur::parse(v))
    }),
    ("COURIER_INGRESS_TOKEN", |c, v| {
        set(&mut c.ingress_token, Ok(Some(secret(v))))
    }),
    ("COURIER_ADMIN_TOKEN", |c, v| {
        set(&mut c.admin_token, Ok(Some(secret(v))))
    }),
    ("COURIER_ALLOW_UNAUTHENTICATED_NETWORK", |c, v| {
        set(&mut c.allow_unauthenticated_network, bool_of(v))
    }),
    ("COURIER_ALERT_URL", |c, v| {
        set(&mut c.alert_url, Link::parse(v).map(Some))
    }),
    ("COURIER_INGRESS_ALLOWED_ORIGINS", |c, v| {
        set(&mut c.ingress.allowed_origins, list::<Origin>(v))
    }),
    ("COURIER_INGRESS_HOSTS", |c, v| {
        set(&mut c.ingress.hosts, list::<HostEntry>(v))
    }),
    ("COURIER_INGRESS_IDLE_TIMEOUT", |c, v| {
        set(&mut c.ingress.idle_timeout, Dur::parse(v))
    }),
    ("COURIER_INGRESS_MAX_PENDING_BYTES", |c, v| {
        set(&mut c.ingress.max_pending_bytes, Size::parse(v))
    }),
    ("COURIER_INGRESS_ALLOW_GET", |c, v| {
        set(&mut c.ingress.allow_get, bool_of(v))
    }),
    ("COURIER_ADMIN_ALLOWED_ORIGINS", |c, v| {
        set(&mut c.admin.allowed_origins, list::<Origin>(v))
    }),
    ("COURIER_ADMIN_HOSTS", |c, v| {
        set(&mut c.admin.hosts, list::<HostEntry>(v))
    }),
    ("COURIER_ADMIN_IDLE_TIMEOUT", |c, v| {
        set(&mut c.admin.idle_timeout, Dur::parse(v))
    }),
    ("COURIER_RETRY_BASE_DELAY", |c, v| {
        set(&mut c.retry.base_delay, Dur::parse(v))
    }),
    ("COURIER_RETRY_MAX_DELAY", |c, v| {
        set(&mut c.retry.max_delay, Dur::parse(v))
    }),
    ("COURIER_RETRY_JITTER", |c, v| {
        set(&mut c.retry.jitter, JitterMode::parse(v))
    }),
    // Before MAX_ATTEMPTS: a schedule sets max_attempts unless that variable is set too.
    ("COURIER_RETRY_SCHEDULE", set_schedule),
    ("COURIER_RETRY_MAX_ATTEMPTS", |c, v| {
        set(&mut c.retry.max_attempts, u32_of(v))
    }),
    ("COURIER_RETRY_GIVE_UP_AFTER", |c, v| {
        set(&mut c.retry.give_up_after, Dur::parse(v))
    }),
    ("COURIER_RETRY_MAX_ATTEMPTS_404", |c, v| {
        set(&mut c.retry.max_attempts_404, u32_of(v))
    }),
    ("COURIER_RETRY_MAX_RETRY_AFTER", |c, v| {
        set(&mut c.retry.max_retry_after, Dur::parse(v))
    }),
    ("COURIER_DELIVERY_CONNECT_TIMEOUT", |c, v| {
        set(&mut c.delivery.connect_timeout, Dur::parse(v))
    }),
    ("COURIER_DELIVERY_REQUEST_TIMEOUT", |c, v| {
        set(&mut c.delivery.request_timeout, Dur::parse(v))
    }),
    ("COURIER_DELIVERY_MAX_IN_FLIGHT", |c, v| {
        set(&mut c.delivery.max_in_flight, u32_of(v))
    }),
    ("COURIER_DELIVERY_MAX_IN_FLIGHT_PER_HOST", |c, v| {
        set(&mut c.delivery.max_in_flight_per_host, u32_of(v))
    }),
    ("COURIER_DELIVERY_RATE_PER_SECOND", |c, v| {
        set(&mut c.delivery.rate_per_second, u32_of(v))
    }),
    ("COURIER_DELIVERY_PAUSE_AFTER_PERMANENT_FAILURES", |c, v| {
        set(&mut c.delivery.pause_after_permanent_failures, u32_of(v))
    }),
    ("COURIER_DELIVERY_MAX_RESPONSE_BODY", |c, v| {
        set(&mut c.delivery.max_response_body, Size::parse(v))
    }),
    ("COURIER_DELIVERY_IDLE_CONNECTION_TIMEOUT", |c, v| {
        set(&mut c.delivery.idle_connection_timeout, Dur::parse(v))
    }),
    ("COURIER_DELIVERY_MAX_IDLE_CONNECTIONS", |c, v| {
        set(&mut c.delivery.max_idle_connections, u32_of(v))
    }),
    ("COURIER_CIRCUIT_FAILURES", |c, v| {
        set(&mut c.circuit.failures, u32_of(v))
    }),
    ("COURIER_CIRCUIT_PROBE_DELAY", |c, v| {
        set(&mut c.circuit.probe_delay, Dur::parse(v))
    }),
    ("COURIER_CIRCUIT_PROBE_MAX_DELAY", |c, v| {
        set(&mut c.circuit.probe_max_delay, Dur::parse(v))
    }),
    ("COURIER_LOG_FORMAT", |c, v| set(&mut c.log.format, Format::parse(v))),
    ("COURIER_FLEET_REDIS_URL", |c, v| fleet(c, "COURIER_FLEET_REDIS_URL", v)),
    ("COURIER_FLEET_REDIS_PASSWORD", |c, v| {
        fleet(c, "COURIER_FLEET_REDIS_PASSWORD", v)
    }),
    ("COURIER_FLEET_EXPECTED_REPLICAS", |c, v| {
        fleet(c, "COURIER_FLEET_EXPECTED_REPLICAS", v)
    }),
    ("COURIER_FLEET_KEY_PREFIX", |c, v| {
        fleet(c, "COURIER_FLEET_KEY_PREFIX", v)
    }),
    // Blank: unset (clears what the file set).
    ("COURIER_DRAIN_TO", |c, v| {
        set(
            &mut c.drain.to,
            Ok(Some(v.trim().to_string()).filter(|t| !t.is_empty())),
        )
    }),
    ("COURIER_DRAIN_PEERS", |c, v| {
        set(
            &mut c.drain.peers,
            items(v).map(|p| p.into_iter().map(str::to_string).collect()),
        )
    }),
    ("COURIER_DRAIN_TOKEN", |c, v| {
        set(&mut c.drain.token, Ok(Some(secret(v))))
    }),
    ("COURIER_DRAIN_CONCURRENCY", |c, v| {
        set(&mut c.drain.concurrency, u32_of(v))
    }),
    ("COURIER_SIGNING_SCHEME", |c, v| {
        set(&mut c.signing.scheme, Name::parse(v))
    }),
    ("COURIER_SIGNING_SECRETS", |c, v| {
        // The message must not say which secret is empty by quoting it, only where.
        set(
            &mut c.signing.secrets,
            items(v).map(|s| s.into_iter().map(secret).collect()),
        )
    }),
    ("COURIER_EGRESS_ALLOW_PRIVATE_TARGETS", |c, v| {
        set(&mut c.egress.allow_private_targets, bool_of(v))
    }),
    ("COURIER_EGRESS_ALLOW", |c, v| set(&mut c.egress.allow, list::<Net>(v))),
    // Blank: no proxy (clears what the file set).
    ("COURIER_EGRESS_PROXY", |c, v| {
        let proxy = (!v.trim().is_empty()).then(|| Proxy::parse(v)).transpose();
        set(&mut c.egress.proxy, proxy)
    }),
    ("COURIER_EGRESS_NO_PROXY", |c, v| {
        set(&mut c.egress.no_proxy, list::<NoProxy>(v))
    }),
];

/// Every environment variable the env layer reads (besides [`CONFIG_ENV`]), in the order of
/// the config file. Any other `COURIER_*` variable is ignored.
///
/// [`CONFIG_ENV`]: super::CONFIG_ENV
pub const ENV_VARS: [&str; SETTERS.len()] = {
    let mut names = [""; SETTERS.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = SETTERS[i].0;
        i += 1;
    }
    names
};

/// Variables whose values are never echoed in an error (credentials, or URLs that may carry one).
pub(super) const SENSITIVE_ENV_VARS: [&str; 8] = [
    "COURIER_EGRESS_PROXY",
    "COURIER_INGRESS_TOKEN",
    "COURIER_ADMIN_TOKEN",
    "COURIER_DRAIN_TOKEN",
    "COURIER_SIGNING_SECRETS",
    "COURIER_ALERT_URL",
    "COURIER_FLEET_REDIS_URL",
    "COURIER_FLEET_REDIS_PASSWORD",
];

impl Config {
    pub(super) fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        for (name, setter) in SETTERS {
            if let Some(value) = env(name) {
                setter(self, &value).map_err(|problem| ConfigError::env(name, &value, problem))?;
            }
        }
        Ok(())
    }

    pub(super) fn apply_flags(&mut self, flags: &Overrides) -> Result<(), ConfigError> {
        if let Some(listen) = &flags.listen {
            self.listen =
                parse_ingress_listen(listen).map_err(|e| ConfigError::new(format!("--listen {listen:?}"), e))?;
        }
        if let Some(admin) = &flags.admin_listen {
            self.admin_listen =
                parse_listen(admin).map_err(|e| ConfigError::new(format!("--admin-listen {admin:?}"), e))?;
        }
        if let Some(ops) = &flags.ops_listen {
            self.ops_listen =
                Some(parse_listen(ops).map_err(|e| ConfigError::new(format!("--ops-listen {ops:?}"), e))?);
        }
        if let Some(dir) = &flags.data_dir {
            self.data_dir = dir.clone();
        }
        Ok(())
    }
}

/// `[fleet]` reads its own variables (`FleetConfig::set_from_env`).
fn fleet(c: &mut Config, name: &str, v: &str) -> Result<(), Problem> {
    c.fleet.set_from_env(name, v).map_err(Problem::from)
}

fn set<T>(slot: &mut T, value: Result<T, Problem>) -> Result<(), Problem> {
    *slot = value?;
    Ok(())
}

fn secret(v: &str) -> Secret {
    Secret::new(v.to_string())
}

fn bool_of(v: &str) -> Result<bool, Problem> {
    parse_bool(v).map_err(Problem::from)
}

fn u32_of(v: &str) -> Result<u32, Problem> {
    parse_u32(v).map_err(Problem::from)
}

/// The items of a comma-separated list (blank: the empty list); an empty item is named by
/// its position, never quoted.
fn items(v: &str) -> Result<Vec<&str>, Problem> {
    split_list(v).map_err(|i| Problem::from(format!("item {} of the comma-separated list is empty", i + 1)))
}

/// Each item of a comma-separated list read with `P`.
fn list<P: Text>(v: &str) -> Result<Vec<P::Value>, Problem> {
    items(v)?.into_iter().map(P::parse).collect()
}

/// Comma-separated durations; blank means no schedule (the exponential backoff). A
/// schedule stands for its attempts, unless `COURIER_RETRY_MAX_ATTEMPTS` (read after it)
/// says otherwise.
fn set_schedule(c: &mut Config, v: &str) -> Result<(), Problem> {
    if v.trim().is_empty() {
        c.retry.schedule = None;
        return Ok(());
    }
    let steps = v
        .split(',')
        .enumerate()
        .map(|(i, item)| Dur::parse(item).map_err(|p| p.at(&format!("the schedule[{i}]"))))
        .collect::<Result<Vec<_>, _>>()?;
    check_schedule(&steps).map_err(|p| p.at("the schedule"))?;
    c.retry.max_attempts = implied_attempts(steps.len());
    c.retry.schedule = Some(steps);
    Ok(())
}
