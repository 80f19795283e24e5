//! The TOML layer's arrays of tables — `[[route]]`, `[[host]]`, `[[endpoint]]` — as serde
//! reads them, and their conversion into the typed sections. Routes and endpoints carry the
//! retry-policy keys too (see `policy`).

use serde::Deserialize;

use super::error::Problem;
use super::parse::{normalize_endpoint_key, normalize_host_key, parse_each, parse_scheme, parse_target, parse_url};
use super::policy::{FilePolicy, FileStatuses};
use super::{EndpointConfig, HostConfig, RouteConfig};
use crate::model::{OnDead, Ordering};

/// Declares a section struct with the retry-policy keys after its own, and `take_policy`
/// to move them out. serde cannot combine `flatten` with `deny_unknown_fields`, so the keys
/// are spelled into each struct, from this one list.
macro_rules! with_policy_keys {
    ($(#[$meta:meta])* struct $name:ident { $($field:ident: $ty:ty,)* }) => {
        $(#[$meta])*
        pub(super) struct $name {
            $($field: $ty,)*
            schedule: Option<Vec<String>>,
            base_delay: Option<String>,
            max_delay: Option<String>,
            jitter: Option<String>,
            max_attempts: Option<u32>,
            give_up_after: Option<String>,
            max_attempts_404: Option<u32>,
            max_retry_after: Option<String>,
            request_timeout: Option<String>,
            max_in_flight: Option<u32>,
            statuses: Option<FileStatuses>,
        }

        impl $name {
            fn take_policy(&mut self) -> FilePolicy {
                FilePolicy {
                    schedule: self.schedule.take(),
                    base_delay: self.base_delay.take(),
                    max_delay: self.max_delay.take(),
                    jitter: self.jitter.take(),
                    max_attempts: self.max_attempts.take(),
                    give_up_after: self.give_up_after.take(),
                    max_attempts_404: self.max_attempts_404.take(),
                    max_retry_after: self.max_retry_after.take(),
                    request_timeout: self.request_timeout.take(),
                    max_in_flight: self.max_in_flight.take(),
                    statuses: self.statuses.take(),
                }
            }
        }
    };
}

with_policy_keys! {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct FileRoute {
        name: Option<String>,
        url: Option<String>,
        signing_key: Option<String>,
        scheme: Option<String>,
        targets: Option<Vec<String>>,
        ordering: Option<String>,
        on_dead: Option<String>,
    }
}

impl FileRoute {
    pub(super) fn into_route(mut self, i: usize) -> Result<RouteConfig, Problem> {
        let missing = |key: &str| format!("route[{i}]: missing key {key:?}");
        let url = self.url.take().ok_or_else(|| missing("url"))?;
        let url = parse_url(&url).map_err(|e| format!("route[{i}].url: {e}"))?;
        let policy = self.take_policy();
        if policy.max_in_flight.is_some() {
            // One endpoint has one cap, whichever route its messages came through.
            return Err(Problem::coded(
                "per_endpoint_setting",
                format!(
                    "route[{i}].max_in_flight: the in-flight cap is per endpoint; set it in an [[endpoint]] \
                     with key = {:?}",
                    crate::target::default_endpoint_key(&url)
                ),
            ));
        }
        Ok(RouteConfig {
            name: self.name.ok_or_else(|| missing("name"))?,
            url,
            signing_key: self.signing_key,
            scheme: self
                .scheme
                .map(|s| parse_scheme(&s))
                .transpose()
                .map_err(|e| format!("route[{i}].scheme: {e}"))?,
            targets: parse_each(
                &format!("route[{i}].targets"),
                &self.targets.unwrap_or_default(),
                parse_target,
            )?,
            fifo: parse_fifo(self.ordering, self.on_dead, &format!("route[{i}]"))?,
            policy: policy.into_overrides(&format!("route[{i}]"))?,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileHost {
    host: Option<String>,
    max_in_flight: Option<u32>,
    #[serde(default, deserialize_with = "super::tls::one_or_many")]
    ca_file: Vec<std::path::PathBuf>,
    client_cert: Option<std::path::PathBuf>,
    client_key: Option<std::path::PathBuf>,
}

impl FileHost {
    pub(super) fn into_host(self, i: usize) -> Result<HostConfig, Problem> {
        Ok(HostConfig {
            host: normalize_host_key(&self.host.ok_or_else(|| format!("host[{i}]: missing key \"host\""))?),
            max_in_flight: self.max_in_flight,
            tls: super::HostTls {
                ca_file: self.ca_file,
                client_cert: self.client_cert,
                client_key: self.client_key,
            },
        })
    }
}

with_policy_keys! {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct FileEndpoint {
        key: Option<String>,
        rate_per_second: Option<u32>,
        ordering: Option<String>,
        on_dead: Option<String>,
    }
}

impl FileEndpoint {
    pub(super) fn into_endpoint(mut self, i: usize) -> Result<EndpointConfig, Problem> {
        let policy = self.take_policy();
        let key = self.key.ok_or_else(|| format!("endpoint[{i}]: missing key \"key\""))?;
        let policy = policy.into_overrides(&format!("endpoint[{i}]"))?;
        if self.rate_per_second.is_none() && self.ordering.is_none() && policy.is_empty() {
            return Err(Problem::coded(
                "empty_section",
                format!("endpoint[{i}]: sets nothing (give rate_per_second, ordering or a retry setting)"),
            ));
        }
        Ok(EndpointConfig {
            key: normalize_endpoint_key(&key),
            rate_per_second: self.rate_per_second,
            fifo: parse_fifo(self.ordering, self.on_dead, &format!("endpoint[{i}]"))?,
            policy,
        })
    }
}

/// `ordering` and `on_dead` of an `[[endpoint]]` or `[[route]]` (`place`): `Some` when the
/// messages are ordered. `on_dead` without `ordering = "fifo"` is an error: it would do
/// nothing, and a typo'd ordering must not pass silently.
fn parse_fifo(ordering: Option<String>, on_dead: Option<String>, place: &str) -> Result<Option<OnDead>, String> {
    let ordering = match ordering {
        Some(o) => o
            .trim()
            .parse::<Ordering>()
            .map_err(|e| format!("{place}.ordering: {e}"))?,
        None => Ordering::None,
    };
    let on_dead = on_dead
        .map(|d| d.trim().parse::<OnDead>())
        .transpose()
        .map_err(|e| format!("{place}.on_dead: {e}"))?;
    match ordering {
        Ordering::Fifo => Ok(Some(on_dead.unwrap_or_default())),
        Ordering::None if on_dead.is_some() => Err(format!("{place}.on_dead: applies only with ordering = \"fifo\"")),
        Ordering::None => Ok(None),
    }
}
