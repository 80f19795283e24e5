//! The retry-policy keys: `schedule` and `statuses` in `[retry]`, and the overrides a
//! `[[route]]` or `[[endpoint]]` may set ([`PolicyOverrides`]); their checks, each with a
//! machine-readable code; [`Config::policy_book`], the lookup ingress and delivery use; and
//! [`describe_policy`], the line `check-config` prints per section.
//!
//! A section's backoff is one setting: `schedule`, or the exponential `base_delay` /
//! `max_delay` (an unset one of the two taken from `[retry]`, never from a route, so every
//! section's backoff is checked here once and for all). Everything else is inherited field
//! by field: endpoint, then route, then `[retry]` / `[delivery]`.

use std::fmt;
use std::time::Duration;

use serde::de::{Deserializer, Visitor};
use serde::Deserialize;

use super::error::Problem;
use super::parse::{parse_duration_text, parse_jitter};
use super::units::format_duration;
use super::{Config, ConfigError};
use crate::model::Jitter;
use crate::policy::backoff::{BackoffError, MAX_SCHEDULE_LEN};
use crate::policy::book::revision_text;
use crate::policy::{Backoff, BasePolicy, Class, Overrides, PolicyBook, Resolved, StatusMatch, StatusRules};

/// What a `[[route]]` or `[[endpoint]]` sets of the retry policy, as configured; `None` (or
/// no rules) inherits from the less specific sections.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyOverrides {
    /// Explicit delays (exclusive with `base_delay`/`max_delay` in one section).
    pub schedule: Option<Vec<Duration>>,
    /// Exponential backoff's first delay (unset: `[retry]`'s).
    pub base_delay: Option<Duration>,
    /// Exponential backoff's cap (unset: `[retry]`'s).
    pub max_delay: Option<Duration>,
    /// The jitter mode.
    pub jitter: Option<Jitter>,
    /// Attempts before giving up; a `schedule` without it means the schedule's length + 1.
    pub max_attempts: Option<u32>,
    /// Time from acceptance before giving up.
    pub give_up_after: Option<Duration>,
    /// Attempts while the receiver answers a `retry_limited` status.
    pub max_attempts_404: Option<u32>,
    /// Cap of a receiver's `Retry-After`.
    pub max_retry_after: Option<Duration>,
    /// Whole-attempt timeout.
    pub request_timeout: Option<Duration>,
    /// Attempts in flight to the endpoint at once (`[[endpoint]]` only).
    pub max_in_flight: Option<u32>,
    /// Status rules in front of the less specific sections'.
    pub statuses: StatusRules,
}

impl PolicyOverrides {
    /// Whether the section sets nothing of the policy.
    pub fn is_empty(&self) -> bool {
        *self == PolicyOverrides::default()
    }
}

/// The policy keys of a section, as written (see `file.rs`'s `with_policy_keys!`).
#[derive(Default)]
pub(super) struct FilePolicy {
    pub(super) schedule: Option<Vec<String>>,
    pub(super) base_delay: Option<String>,
    pub(super) max_delay: Option<String>,
    pub(super) jitter: Option<String>,
    pub(super) max_attempts: Option<u32>,
    pub(super) give_up_after: Option<String>,
    pub(super) max_attempts_404: Option<u32>,
    pub(super) max_retry_after: Option<String>,
    pub(super) request_timeout: Option<String>,
    pub(super) max_in_flight: Option<u32>,
    pub(super) statuses: Option<FileStatuses>,
}

/// `statuses = { success = [409], permanent = [404, "5xx"] }`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct FileStatuses {
    success: Option<Vec<StatusItem>>,
    retry: Option<Vec<StatusItem>>,
    permanent: Option<Vec<StatusItem>>,
    retry_limited: Option<Vec<StatusItem>>,
}

/// One entry of a status list: a number (`404`) or a text (`"4xx"`, `"404"`). Read by hand
/// so that a wrong type gets serde's own message rather than an untagged enum's.
enum StatusItem {
    Number(i64),
    Text(String),
}

impl<'de> Deserialize<'de> for StatusItem {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ItemVisitor;
        impl Visitor<'_> for ItemVisitor {
            type Value = StatusItem;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an HTTP status like 404 or a class like \"4xx\"")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<StatusItem, E> {
                Ok(StatusItem::Number(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<StatusItem, E> {
                i64::try_from(v)
                    .map(StatusItem::Number)
                    .map_err(|_| E::custom("status out of range"))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<StatusItem, E> {
                Ok(StatusItem::Text(v.to_string()))
            }
        }
        deserializer.deserialize_any(ItemVisitor)
    }
}

impl FilePolicy {
    /// Converts the keys of section `section` (`route[0]`, `endpoint[2]`).
    pub(super) fn into_overrides(self, section: &str) -> Result<PolicyOverrides, Problem> {
        let key = |k: &str| format!("{section}.{k}");
        let schedule = self
            .schedule
            .map(|items| parse_schedule(&key("schedule"), &items))
            .transpose()?;
        if schedule.is_some() && (self.base_delay.is_some() || self.max_delay.is_some()) {
            return Err(conflicting_backoff(section));
        }
        let duration = |k: &str, v: Option<String>| v.map(|t| parse_policy_duration(&key(k), &t)).transpose();
        Ok(PolicyOverrides {
            max_attempts: self
                .max_attempts
                .or_else(|| schedule.as_ref().map(|s| implied_attempts(s))),
            schedule,
            base_delay: duration("base_delay", self.base_delay)?,
            max_delay: duration("max_delay", self.max_delay)?,
            jitter: self
                .jitter
                .map(|j| {
                    parse_jitter(&j).map_err(|e| Problem::coded("invalid_value", format!("{}: {e}", key("jitter"))))
                })
                .transpose()?,
            give_up_after: duration("give_up_after", self.give_up_after)?,
            max_attempts_404: self.max_attempts_404,
            max_retry_after: duration("max_retry_after", self.max_retry_after)?,
            request_timeout: duration("request_timeout", self.request_timeout)?,
            max_in_flight: self.max_in_flight,
            statuses: self
                .statuses
                .map(|s| parse_statuses(&key("statuses"), s))
                .transpose()?
                .unwrap_or_default(),
        })
    }
}

/// The attempts a schedule of `delays` stands for: the first attempt, then one per delay.
pub(super) fn implied_attempts(delays: &[Duration]) -> u32 {
    u32::try_from(delays.len()).map_or(u32::MAX, |n| n.saturating_add(1))
}

pub(super) fn conflicting_backoff(section: &str) -> Problem {
    Problem::coded(
        "conflicting_backoff",
        format!(
            "{section}: schedule and base_delay/max_delay are both set; a section's backoff is either \
             an explicit schedule or exponential"
        ),
    )
}

/// A schedule's delays (`["5s", "5m"]`), checked as [`Backoff::schedule`] checks them.
pub(super) fn parse_schedule<S: AsRef<str>>(key: &str, items: &[S]) -> Result<Vec<Duration>, Problem> {
    let delays = items
        .iter()
        .enumerate()
        .map(|(i, text)| parse_policy_duration(&format!("{key}[{i}]"), text.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    Backoff::schedule(&delays).map_err(|e| backoff_problem(key, &e))?;
    Ok(delays)
}

fn backoff_problem(key: &str, e: &BackoffError) -> Problem {
    match e {
        BackoffError::EmptySchedule => Problem::coded("empty_schedule", format!("{key} must list at least one delay")),
        BackoffError::StepTooSmall { index } => {
            Problem::coded("invalid_duration", format!("{key}[{index}] must be at least 1ms"))
        }
        BackoffError::TooLong { len } => Problem::coded(
            "schedule_too_long",
            format!("{key} lists {len} delays; at most {MAX_SCHEDULE_LEN} are allowed"),
        ),
        other => Problem::coded("invalid_policy_value", format!("{key}: {other}")),
    }
}

fn parse_policy_duration(key: &str, text: &str) -> Result<Duration, Problem> {
    parse_duration_text(text).map_err(|e| Problem::coded("invalid_duration", format!("{key}: {e}")))
}

/// A section's `statuses` table: each listed status (or `4xx` class) gets its class; one
/// status under two classes is `status_class_conflict`.
pub(super) fn parse_statuses(key: &str, file: FileStatuses) -> Result<StatusRules, Problem> {
    let mut rules = Vec::new();
    let lists = [
        (Class::Delivered, file.success),
        (Class::Retry, file.retry),
        (Class::Permanent, file.permanent),
        (Class::RetryLimited, file.retry_limited),
    ];
    for (class, items) in lists {
        for (i, item) in items.unwrap_or_default().into_iter().enumerate() {
            let parsed = match &item {
                StatusItem::Number(n) => StatusMatch::code(*n).ok_or_else(|| n.to_string()),
                StatusItem::Text(t) => t.parse::<StatusMatch>().map_err(|_| format!("{t:?}")),
            };
            let status = parsed.map_err(|shown| {
                Problem::coded(
                    "invalid_status",
                    format!(
                        "{key}.{}[{i}]: {shown} is not an HTTP status from 100 to 599 or a class like \"4xx\"",
                        class.as_str()
                    ),
                )
            })?;
            rules.push((status, class));
        }
    }
    StatusRules::new(rules).map_err(|e| Problem::coded("status_class_conflict", format!("{key}: {e}")))
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
            return Err(ConfigError::invalid_problem(backoff_problem("retry.schedule", &e)));
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
            Err(e) => Err(ConfigError::invalid_problem(backoff_problem(
                &format!("{section}.schedule"),
                &e,
            ))),
        }
    }

    /// Every section's policy, for ingress (the give-up limits, at accept) and delivery
    /// (the rest, at each attempt). Call on a validated config.
    pub fn policy_book(&self) -> PolicyBook {
        let r = &self.retry;
        let base = BasePolicy {
            backoff: self.global_backoff().expect("validated: [retry]'s backoff builds"),
            jitter: r.jitter,
            max_attempts: r.max_attempts,
            give_up_after: r.give_up_after,
            max_attempts_404: r.max_attempts_404,
            max_retry_after: r.max_retry_after,
            request_timeout: self.delivery.request_timeout,
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
            let with = match resolved.endpoint_section() {
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
pub fn describe_policy(r: &Resolved<'_>) -> String {
    let d = |ms: u64| format_duration(Duration::from_millis(ms));
    let backoff = match r.backoff() {
        Backoff::Exponential { base_ms, max_ms } => format!("exponential {}..{}", d(*base_ms), d(*max_ms)),
        Backoff::Schedule(steps) => {
            let shown: Vec<String> = steps.iter().map(|ms| d(*ms)).collect();
            format!("schedule [{}]", shown.join(", "))
        }
    };
    let mut rules: Vec<String> = Vec::new();
    for layer in r.statuses().layers() {
        rules.extend(
            layer
                .iter()
                .map(|(status, class)| format!("{status} {}", class.as_str())),
        );
    }
    rules.push("seed table".to_string());
    let cap = r
        .max_in_flight()
        .map(|n| format!(", max_in_flight {n}"))
        .unwrap_or_default();
    format!(
        concat!(
            "{}, jitter {}, max_attempts {}, give_up_after {}, max_attempts_404 {}, max_retry_after {}, ",
            "request_timeout {}{}, statuses {}; revision {}"
        ),
        backoff,
        r.jitter().as_str(),
        r.max_attempts(),
        format_duration(r.give_up_after()),
        r.max_attempts_404(),
        format_duration(r.max_retry_after()),
        format_duration(r.request_timeout()),
        cap,
        rules.join(", "),
        revision_text(r.revision())
    )
}
