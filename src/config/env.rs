//! The environment layer ([`ENV_VARS`], read only through a closure) and the flag layer
//! ([`Overrides`]), each overwriting what the layers below set.

use std::path::PathBuf;

use super::error::Problem;
use super::listen::parse_mode;
use super::log::parse_log_format;
use super::parse::{
    parse_bool, parse_duration_text, parse_host_entry, parse_ingress_listen, parse_jitter, parse_listen, parse_net,
    parse_origin, parse_scheme, parse_size_text, parse_u32, parse_url, split_list,
};
use super::policy::{implied_attempts, parse_schedule};
use super::{Config, ConfigError, Overrides};
use crate::signing::Secret;

/// Every environment variable the env layer reads (besides [`CONFIG_ENV`]), in the order of
/// the config file. Any other `COURIER_*` variable is ignored.
pub const ENV_VARS: [&str; 45] = [
    "COURIER_LISTEN",
    "COURIER_LISTEN_MODE",
    "COURIER_ADMIN_LISTEN",
    "COURIER_OPS_LISTEN",
    "COURIER_DATA_DIR",
    "COURIER_MAX_BODY",
    "COURIER_SHUTDOWN_GRACE",
    "COURIER_RETENTION",
    "COURIER_DEAD_RETENTION",
    "COURIER_INGRESS_TOKEN",
    "COURIER_ADMIN_TOKEN",
    "COURIER_ALLOW_UNAUTHENTICATED_NETWORK",
    "COURIER_ALERT_URL",
    "COURIER_INGRESS_ALLOWED_ORIGINS",
    "COURIER_INGRESS_HOSTS",
    "COURIER_ADMIN_ALLOWED_ORIGINS",
    "COURIER_ADMIN_HOSTS",
    "COURIER_RETRY_BASE_DELAY",
    "COURIER_RETRY_MAX_DELAY",
    "COURIER_RETRY_JITTER",
    // Before MAX_ATTEMPTS: a schedule sets max_attempts unless that variable is set too.
    "COURIER_RETRY_SCHEDULE",
    "COURIER_RETRY_MAX_ATTEMPTS",
    "COURIER_RETRY_GIVE_UP_AFTER",
    "COURIER_RETRY_MAX_ATTEMPTS_404",
    "COURIER_RETRY_MAX_RETRY_AFTER",
    "COURIER_DELIVERY_CONNECT_TIMEOUT",
    "COURIER_DELIVERY_REQUEST_TIMEOUT",
    "COURIER_DELIVERY_MAX_IN_FLIGHT",
    "COURIER_DELIVERY_MAX_IN_FLIGHT_PER_HOST",
    "COURIER_DELIVERY_RATE_PER_SECOND",
    "COURIER_DELIVERY_PAUSE_AFTER_PERMANENT_FAILURES",
    "COURIER_DELIVERY_MAX_RESPONSE_BODY",
    "COURIER_DELIVERY_IDLE_CONNECTION_TIMEOUT",
    "COURIER_DELIVERY_MAX_IDLE_CONNECTIONS",
    "COURIER_CIRCUIT_FAILURES",
    "COURIER_CIRCUIT_PROBE_DELAY",
    "COURIER_CIRCUIT_PROBE_MAX_DELAY",
    "COURIER_LOG_FORMAT",
    "COURIER_DRAIN_TO",
    "COURIER_DRAIN_TOKEN",
    "COURIER_DRAIN_CONCURRENCY",
    "COURIER_SIGNING_SCHEME",
    "COURIER_SIGNING_SECRETS",
    "COURIER_EGRESS_ALLOW_PRIVATE_TARGETS",
    "COURIER_EGRESS_ALLOW",
];

/// Variables whose values are never echoed in an error (credentials, or URLs that may carry one).
pub(super) const SENSITIVE_ENV_VARS: [&str; 5] = [
    "COURIER_INGRESS_TOKEN",
    "COURIER_ADMIN_TOKEN",
    "COURIER_DRAIN_TOKEN",
    "COURIER_SIGNING_SECRETS",
    "COURIER_ALERT_URL",
];

impl Config {
    pub(super) fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        for name in ENV_VARS {
            if let Some(value) = env(name) {
                self.set_from_env(name, &value)
                    .map_err(|problem| ConfigError::env(name, &value, problem))?;
            }
        }
        Ok(())
    }

    fn set_from_env(&mut self, name: &str, v: &str) -> Result<(), Problem> {
        let (r, d) = (&mut self.retry, &mut self.delivery);
        match name {
            "COURIER_LISTEN" => self.listen = parse_ingress_listen(v)?,
            "COURIER_LISTEN_MODE" => self.listen_mode = parse_mode(v)?,
            "COURIER_ADMIN_LISTEN" => self.admin_listen = parse_listen(v)?,
            "COURIER_OPS_LISTEN" => self.ops_listen = Some(parse_listen(v)?),
            "COURIER_DATA_DIR" => self.data_dir = PathBuf::from(v),
            "COURIER_MAX_BODY" => self.max_body = parse_size_text(v)?,
            "COURIER_SHUTDOWN_GRACE" => self.shutdown_grace = parse_duration_text(v)?,
            "COURIER_RETENTION" => self.retention = parse_duration_text(v)?,
            "COURIER_DEAD_RETENTION" => self.dead_retention = parse_duration_text(v)?,
            "COURIER_INGRESS_TOKEN" => self.ingress_token = Some(Secret::new(v.to_string())),
            "COURIER_ADMIN_TOKEN" => self.admin_token = Some(Secret::new(v.to_string())),
            "COURIER_ALLOW_UNAUTHENTICATED_NETWORK" => self.allow_unauthenticated_network = parse_bool(v)?,
            "COURIER_ALERT_URL" => self.alert_url = Some(parse_url(v)?),
            "COURIER_INGRESS_ALLOWED_ORIGINS" => self.ingress.allowed_origins = parse_list(v, parse_origin)?,
            "COURIER_INGRESS_HOSTS" => self.ingress.hosts = parse_list(v, parse_host_entry)?,
            "COURIER_ADMIN_ALLOWED_ORIGINS" => self.admin.allowed_origins = parse_list(v, parse_origin)?,
            "COURIER_ADMIN_HOSTS" => self.admin.hosts = parse_list(v, parse_host_entry)?,
            "COURIER_RETRY_BASE_DELAY" => r.base_delay = parse_duration_text(v)?,
            "COURIER_RETRY_MAX_DELAY" => r.max_delay = parse_duration_text(v)?,
            "COURIER_RETRY_JITTER" => r.jitter = parse_jitter(v)?,
            // Comma-separated durations; blank means no schedule (the exponential backoff).
            "COURIER_RETRY_SCHEDULE" if v.trim().is_empty() => r.schedule = None,
            "COURIER_RETRY_SCHEDULE" => {
                let items: Vec<&str> = v.split(',').map(str::trim).collect();
                let steps = parse_schedule("the schedule", &items)?;
                r.max_attempts = implied_attempts(&steps);
                r.schedule = Some(steps);
            }
            "COURIER_RETRY_MAX_ATTEMPTS" => r.max_attempts = parse_u32(v)?,
            "COURIER_RETRY_GIVE_UP_AFTER" => r.give_up_after = parse_duration_text(v)?,
            "COURIER_RETRY_MAX_ATTEMPTS_404" => r.max_attempts_404 = parse_u32(v)?,
            "COURIER_RETRY_MAX_RETRY_AFTER" => r.max_retry_after = parse_duration_text(v)?,
            "COURIER_DELIVERY_CONNECT_TIMEOUT" => d.connect_timeout = parse_duration_text(v)?,
            "COURIER_DELIVERY_REQUEST_TIMEOUT" => d.request_timeout = parse_duration_text(v)?,
            "COURIER_DELIVERY_MAX_IN_FLIGHT" => d.max_in_flight = parse_u32(v)?,
            "COURIER_DELIVERY_MAX_IN_FLIGHT_PER_HOST" => d.max_in_flight_per_host = parse_u32(v)?,
            "COURIER_DELIVERY_RATE_PER_SECOND" => d.rate_per_second = parse_u32(v)?,
            "COURIER_DELIVERY_PAUSE_AFTER_PERMANENT_FAILURES" => d.pause_after_permanent_failures = parse_u32(v)?,
            "COURIER_DELIVERY_MAX_RESPONSE_BODY" => d.max_response_body = parse_size_text(v)?,
            "COURIER_DELIVERY_IDLE_CONNECTION_TIMEOUT" => d.idle_connection_timeout = parse_duration_text(v)?,
            "COURIER_DELIVERY_MAX_IDLE_CONNECTIONS" => d.max_idle_connections = parse_u32(v)?,
            "COURIER_CIRCUIT_FAILURES" => self.circuit.failures = parse_u32(v)?,
            "COURIER_CIRCUIT_PROBE_DELAY" => self.circuit.probe_delay = parse_duration_text(v)?,
            "COURIER_CIRCUIT_PROBE_MAX_DELAY" => self.circuit.probe_max_delay = parse_duration_text(v)?,
            "COURIER_LOG_FORMAT" => self.log.format = parse_log_format(v)?,
            "COURIER_DRAIN_TO" => self.drain.to = Some(v.trim().to_string()).filter(|t| !t.is_empty()),
            "COURIER_DRAIN_TOKEN" => self.drain.token = Some(Secret::new(v.to_string())),
            "COURIER_DRAIN_CONCURRENCY" => self.drain.concurrency = parse_u32(v)?,
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
            "COURIER_EGRESS_ALLOW" => self.egress.allow = parse_list(v, parse_net)?,
            // Unreachable by construction: every name of ENV_VARS has an arm above.
            _ => {}
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

/// Parses each item of a comma-separated list (blank: the empty list).
fn parse_list<T>(v: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    split_list(v)
        .map_err(|i| format!("item {} of the comma-separated list is empty", i + 1))?
        .into_iter()
        .map(parse)
        .collect()
}
