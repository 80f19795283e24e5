//! The retry-policy overrides a `[[route]]` or `[[endpoint]]` may set ([`PolicyOverrides`],
//! read from the section's own keys: `shape` gathers them); their checks, each with a
//! machine-readable code; [`Config::policy_book`], the lookup ingress and delivery use; and
//! [`describe_policy`], the line `check-config` prints per section.
//!
//! A section's backoff is one setting: `schedule`, or the exponential `base_delay` /
//! `max_delay` (an unset one of the two taken from `[retry]`, never from a route, so every
//! section's backoff is checked here once and for all). Everything else is inherited field
//! by field: endpoint, then route, then `[retry]` / `[delivery]`.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::de::{self, Dur, JitterMode};
use super::error::Problem;
use super::retry::{backoff_problem, schedule, statuses};
use super::summary::{dur, list};
use super::{Config, ConfigError};
use crate::model::Jitter;
use crate::policy::backoff::BackoffError;
use crate::policy::{revision_text, Backoff, Overrides, PolicyBook, RetryPolicy, StatusRules, Statuses};

section! {
    /// What a `[[route]]` or `[[endpoint]]` sets of the retry policy, as configured; `None`
    /// (or no rules) inherits from the less specific sections.
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct PolicyOverrides {
        /// Explicit delays (exclusive with `base_delay`/`max_delay` in one section).
        pub schedule: Option<Vec<Duration>> ["schedule"] = None,
        /// Exponential backoff's first delay (unset: `[retry]`'s).
        pub base_delay: Option<Duration> ["de::opt::<Dur, _>"] = None,
        /// Exponential backoff's cap (unset: `[retry]`'s).
        pub max_delay: Option<Duration> ["de::opt::<Dur, _>"] = None,
        /// The jitter mode.
        pub jitter: Option<Jitter> ["de::opt::<JitterMode, _>"] = None,
        /// Attempts before giving up; a `schedule` without it means the schedule's length + 1.
        pub max_attempts: Option<u32> = None,
        /// Time from acceptance before giving up.
        pub give_up_after: Option<Duration> ["de::opt::<Dur, _>"] = None,
        /// Attempts while the receiver answers a `retry_limited` status.
        pub max_attempts_404: Option<u32> = None,
        /// Cap of a receiver's `Retry-After`.
        pub max_retry_after: Option<Duration> ["de::opt::<Dur, _>"] = None,
        /// Whole-attempt timeout.
        pub request_timeout: Option<Duration> ["de::opt::<Dur, _>"] = None,
        /// Attempts in flight to the endpoint at once (`[[endpoint]]` only).
        pub max_in_flight: Option<u32> = None,
        /// Status rules in front of the less specific sections'.
        pub statuses: StatusRules ["statuses"] = StatusRules::default(),
    }
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

    /// The policy rules no type expresses: every section's backoff builds, its limits are
    /// non-zero.
    pub(super) fn validate_policies(&self) -> Result<(), ConfigError> {
        if let Err(e) = self.retry.backoff() {
            return Err(ConfigError::invalid_problem(backoff_problem(&e).at("retry.schedule")));
        }
        let routes = self.routes.iter().map(|r| ("route", &r.policy));
        let endpoints = self.endpoints.iter().map(|e| ("endpoint", &e.policy));
        for (i, (array, policy)) in routes.enumerate().chain(endpoints.enumerate()) {
            self.check_section(&format!("{array}[{i}]"), policy)?;
        }
        Ok(())
    }

    fn check_section(&self, section: &str, p: &PolicyOverrides) -> Result<(), ConfigError> {
        let rule = |broken: bool, key: &str, problem: &dyn fmt::Display| match broken {
            true => Err(ConfigError::invalid_problem(Problem::coded(
                "invalid_policy_value",
                format!("{section}.{key} {problem}"),
            ))),
            false => Ok(()),
        };
        for (key, value) in keyed!(p; max_attempts, max_attempts_404, max_in_flight) {
            rule(value == Some(0), key, &"must be at least 1")?;
        }
        for (key, value) in keyed!(p; give_up_after, request_timeout) {
            rule(value.is_some_and(|d| d.is_zero()), key, &"must be greater than 0")?;
        }
        match self.section_backoff(p) {
            Ok(_) => Ok(()),
            Err(BackoffError::BaseTooSmall) => rule(true, "base_delay", &"must be at least 1ms"),
            Err(BackoffError::MaxBelowBase { base_ms, max_ms }) => {
                let (max, base) = (ms(max_ms), ms(base_ms));
                let problem = format_args!(
                    "({max}) must be at least the section's base_delay ({base}); an unset one is [retry]'s"
                );
                rule(true, "max_delay", &problem)
            }
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
            backoff: r.backoff().expect("validated: [retry]'s backoff builds"),
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
            let with = book.sections(Some(&route.name), &endpoint).0;
            let with = with.map(|key| format!(" with endpoint {key}")).unwrap_or_default();
            let policy = describe_policy(&book.resolve(Some(&route.name), &endpoint));
            lines.push(format!("policy route {}{with}: {policy}", route.name));
        }
        for endpoint in &self.endpoints {
            let policy = describe_policy(&book.resolve(None, &endpoint.key));
            lines.push(format!("policy endpoint {}: {policy}", endpoint.key));
        }
        lines
    }
}

/// One line describing a resolved policy: backoff, jitter, give-up limits, caps, timeout,
/// status rules (most specific first, then the seed's table) and the revision.
pub fn describe_policy(r: &RetryPolicy<Statuses<'_>>) -> String {
    let backoff = match &r.backoff {
        Backoff::Exponential { base_ms, max_ms } => format!("exponential {}..{}", ms(*base_ms), ms(*max_ms)),
        Backoff::Schedule(steps) => format!("schedule [{}]", list(steps.iter().map(|step| ms(*step)))),
    };
    let rules = r.statuses.layers().flat_map(|layer| layer.iter());
    let rules = rules.map(|(status, class)| format!("{status} {}", class.as_str()));
    let rules = list(rules.chain(["seed table".to_string()]));
    let cap = r.max_in_flight.map(|n| format!(", max_in_flight {n}"));
    let (cap, revision) = (cap.unwrap_or_default(), revision_text(r.revision()));
    let settings = pairs!(r; jitter: |j: &Jitter| j.as_str(), max_attempts, give_up_after: dur, max_attempts_404,
        max_retry_after: dur, request_timeout: dur);
    format!("{backoff}, {settings}{cap}, statuses {rules}; revision {revision}")
}

/// A whole number of milliseconds as the file writes a duration.
fn ms(ms: u64) -> String {
    dur(&Duration::from_millis(ms))
}
