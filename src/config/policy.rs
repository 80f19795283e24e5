//! The retry-policy overrides a `[[route]]` or `[[endpoint]]` may set ([`PolicyOverrides`],
//! read from the section's own keys: `shape` gathers them); their checks, each with a
//! machine-readable code; [`Config::policy_book`], the lookup ingress and delivery use; and
//! [`describe_policy`], the line `check-config` prints per section.
//!
//! A section's backoff is one setting: `schedule`, or the exponential `base_delay` /
//! `max_delay` (an unset one of the two taken from `[retry]`, never from a route, so every
//! section's backoff is checked here once and for all). Everything else is inherited field
//! by field: endpoint, then route, then `[retry]` / `[delivery]`.

use std::time::Duration;

use serde::Deserialize;

use super::de::{self, Dur, JitterMode};
use super::retry::{backoff_problem, schedule, statuses};
use super::units::format_duration;
use super::{Config, ConfigError};
use crate::model::Jitter;
use crate::policy::backoff::BackoffError;
use crate::policy::{revision_text, Backoff, Overrides, PolicyBook, RetryPolicy, StatusRules, Statuses};

/// What a `[[route]]` or `[[endpoint]]` sets of the retry policy, as configured; `None` (or
/// no rules) inherits from the less specific sections.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyOverrides {
    /// Explicit delays (exclusive with `base_delay`/`max_delay` in one section).
    #[serde(deserialize_with = "schedule")]
    pub schedule: Option<Vec<Duration>>,
    /// Exponential backoff's first delay (unset: `[retry]`'s).
    #[serde(deserialize_with = "de::opt::<Dur, _>")]
    pub base_delay: Option<Duration>,
    /// Exponential backoff's cap (unset: `[retry]`'s).
    #[serde(deserialize_with = "de::opt::<Dur, _>")]
    pub max_delay: Option<Duration>,
    /// The jitter mode.
    #[serde(deserialize_with = "de::opt::<JitterMode, _>")]
    pub jitter: Option<Jitter>,
    /// Attempts before giving up; a `schedule` without it means the schedule's length + 1.
    pub max_attempts: Option<u32>,
    /// Time from acceptance before giving up.
    #[serde(deserialize_with = "de::opt::<Dur, _>")]
    pub give_up_after: Option<Duration>,
    /// Attempts while the receiver answers a `retry_limited` status.
    pub max_attempts_404: Option<u32>,
    /// Cap of a receiver's `Retry-After`.
    #[serde(deserialize_with = "de::opt::<Dur, _>")]
    pub max_retry_after: Option<Duration>,
    /// Whole-attempt timeout.
    #[serde(deserialize_with = "de::opt::<Dur, _>")]
    pub request_timeout: Option<Duration>,
    /// Attempts in flight to the endpoint at once (`[[endpoint]]` only).
    pub max_in_flight: Option<u32>,
    /// Status rules in front of the less specific sections'.
    #[serde(deserialize_with = "statuses")]
    pub statuses: StatusRules,
}

impl PolicyOverrides {
    /// Whether the section sets nothing of the policy.
    pub fn is_empty(&self) -> bool {
        *self == PolicyOverrides::default()
    }
}

impl Config {
    /// The backoff a section overrides, if it sets one: its schedule, or the exponential
    /// shape with its delays (an unset one taken from `[retry]`).
    fn section_backoff(&self, p: &PolicyOverrides) -> Result<Option<Backoff>, BackoffError> {
        if let Some(schedule) = &p.schedule {
            return Backoff::schedule(schedule).map(Some);
        }
        if p.base_delay.is_none() && p.max_delay.is_none() {
            return Ok(None);
        }
        let base = p.base_delay.unwrap_or(self.retry.base_delay);
        let max = p.max_delay.unwrap_or(self.retry.max_delay);
        Backoff::exponential(base, max).map(Some)
    }

    fn global_backoff(&self) -> Result<Backoff, BackoffError> {
        match &self.retry.schedule {
            Some(schedule) => Backoff::schedule(schedule),
            None => Backoff::exponential(self.retry.base_delay, self.retry.max_delay),
        }
    }

    /// The policy rules no type expresses: every section's backoff builds, its limits are
    /// non-zero.
    pub(super) fn validate_policies(&self) -> Result<(), ConfigError> {
        if let Err(e) = self.global_backoff() {
            return Err(ConfigError::invalid_problem(backoff_problem(&e).at("retry.schedule")));
        }
        for (i, route) in self.routes.iter().enumerate() {
            self.check_section(&format!("route[{i}]"), &route.policy)?;
        }
        for (i, endpoint) in self.endpoints.iter().enumerate() {
            self.check_section(&format!("endpoint[{i}]"), &endpoint.policy)?;
        }
        Ok(())
    }

    fn check_section(&self, section: &str, p: &PolicyOverrides) -> Result<(), ConfigError> {
        let invalid = |key: &str, problem: &str| {
            Err(ConfigError::invalid_coded(
                "invalid_policy_value",
                &format!("{section}.{key}"),
                problem,
            ))
        };
        for (key, value) in [
            ("max_attempts", p.max_attempts),
            ("max_attempts_404", p.max_attempts_404),
            ("max_in_flight", p.max_in_flight),
        ] {
            if value == Some(0) {
                return invalid(key, "must be at least 1");
            }
        }
        for (key, value) in [
            ("give_up_after", p.give_up_after),
            ("request_timeout", p.request_timeout),
        ] {
            if value.is_some_and(|d| d.is_zero()) {
                return invalid(key, "must be greater than 0");
            }
        }
        match self.section_backoff(p) {
            Ok(_) => Ok(()),
            Err(BackoffError::BaseTooSmall) => invalid("base_delay", "must be at least 1ms"),
            Err(BackoffError::MaxBelowBase { base_ms, max_ms }) => invalid(
                "max_delay",
                &format!(
                    "({}) must be at least the section's base_delay ({}); an unset one is [retry]'s",
                    format_duration(Duration::from_millis(max_ms)),
                    format_duration(Duration::from_millis(base_ms))
                ),
            ),
            Err(e) => Err(ConfigError::invalid_problem(
                backoff_problem(&e).at(&format!("{section}.schedule")),
            )),
        }
    }

    /// Every section's policy, for ingress (the give-up limits, at accept) and delivery
    /// (the rest, at each attempt). Call on a validated config.
    pub fn policy_book(&self) -> PolicyBook {
        let r = &self.retry;
        let base = RetryPolicy {
            backoff: self.global_backoff().expect("validated: [retry]'s backoff builds"),
            jitter: r.jitter,
            max_attempts: r.max_attempts,
            give_up_after: r.give_up_after,
            max_attempts_404: r.max_attempts_404,
            max_retry_after: r.max_retry_after,
            request_timeout: self.delivery.request_timeout,
            max_in_flight: None,
            statuses: r.statuses.clone(),
        };
        let overrides = |p: &PolicyOverrides| Overrides {
            backoff: self
                .section_backoff(p)
                .expect("validated: every section's backoff builds"),
            jitter: p.jitter,
            max_attempts: p.max_attempts,
            give_up_after: p.give_up_after,
            max_attempts_404: p.max_attempts_404,
            max_retry_after: p.max_retry_after,
            request_timeout: p.request_timeout,
            max_in_flight: p.max_in_flight,
            statuses: p.statuses.clone(),
        };
        PolicyBook::new(
            base,
            self.routes.iter().map(|r| (r.name.clone(), overrides(&r.policy))),
            self.endpoints.iter().map(|e| (e.key.clone(), overrides(&e.policy))),
        )
    }

    /// `check-config`'s lines of effective policies: `[retry]`, each route (for its own
    /// URL's endpoint, so an `[[endpoint]]` of that key shows in it), each endpoint.
    pub(super) fn policy_lines(&self) -> Vec<String> {
        let book = self.policy_book();
        let mut lines = vec![format!("policy [retry]: {}", describe_policy(&book.resolve(None, "")))];
        for route in &self.routes {
            let endpoint = crate::target::default_endpoint_key(&route.url);
            let resolved = book.resolve(Some(&route.name), &endpoint);
            let with = match book.sections(Some(&route.name), &endpoint).0 {
                Some(key) => format!(" with endpoint {key}"),
                None => String::new(),
            };
            lines.push(format!(
                "policy route {}{with}: {}",
                route.name,
                describe_policy(&resolved)
            ));
        }
        for endpoint in &self.endpoints {
            let resolved = book.resolve(None, &endpoint.key);
            lines.push(format!(
                "policy endpoint {}: {}",
                endpoint.key,
                describe_policy(&resolved)
            ));
        }
        lines
    }
}

/// One line describing a resolved policy: backoff, jitter, give-up limits, caps, timeout,
/// status rules (most specific first, then the seed's table) and the revision.
pub fn describe_policy(r: &RetryPolicy<Statuses<'_>>) -> String {
    let d = |ms: u64| format_duration(Duration::from_millis(ms));
    let backoff = match &r.backoff {
        Backoff::Exponential { base_ms, max_ms } => format!("exponential {}..{}", d(*base_ms), d(*max_ms)),
        Backoff::Schedule(steps) => {
            let shown: Vec<String> = steps.iter().map(|ms| d(*ms)).collect();
            format!("schedule [{}]", shown.join(", "))
        }
    };
    let mut rules: Vec<String> = Vec::new();
    for layer in r.statuses.layers() {
        rules.extend(
            layer
                .iter()
                .map(|(status, class)| format!("{status} {}", class.as_str())),
        );
    }
    rules.push("seed table".to_string());
    let cap = r
        .max_in_flight
        .map(|n| format!(", max_in_flight {n}"))
        .unwrap_or_default();
    format!(
        concat!(
            "{}, jitter {}, max_attempts {}, give_up_after {}, max_attempts_404 {}, max_retry_after {}, ",
            "request_timeout {}{}, statuses {}; revision {}"
        ),
        backoff,
        r.jitter.as_str(),
        r.max_attempts,
        format_duration(r.give_up_after),
        r.max_attempts_404,
        format_duration(r.max_retry_after),
        format_duration(r.request_timeout),
        cap,
        rules.join(", "),
        revision_text(r.revision())
    )
}
