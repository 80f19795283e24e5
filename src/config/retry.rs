//! `[retry]` ([`RetryConfig`]), and the readers of the two list-shaped policy values that
//! `[retry]`, `[[route]]` and `[[endpoint]]` share: `schedule` and `statuses`, each checked
//! as the policy will use it, with a machine-readable code.

use std::fmt;
use std::time::Duration;

use serde::de::{Deserializer, Visitor};
use serde::Deserialize;

use super::de::{self, Dur, JitterMode};
use super::error::Problem;
use crate::model::Jitter;
use crate::policy::backoff::{BackoffError, MAX_SCHEDULE_LEN};
use crate::policy::{Backoff, Class, StatusMatch, StatusRules};

section! {
    /// The give-up and backoff policy (`[retry]`).
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct RetryConfig {
        /// Explicit delays before the second, third, ... attempt (the last repeats), instead
        /// of the doubling `base_delay`/`max_delay`. Setting it sets `max_attempts` to its
        /// length plus one unless `max_attempts` is given alongside.
        pub schedule: Option<Vec<Duration>> ["schedule"] = None,
        /// Backoff before the second attempt; doubles per attempt.
        pub base_delay: Duration ["de::one::<Dur, _>"] = Duration::from_secs(60),
        /// Cap of the doubled backoff.
        pub max_delay: Duration ["de::one::<Dur, _>"] = Duration::from_secs(3600),
        /// How the backoff is randomised.
        pub jitter: Jitter ["de::one::<JitterMode, _>"] = Jitter::Equal,
        /// Attempts after which a message is dead-lettered.
        pub max_attempts: u32 = 16,
        /// Time after acceptance past which no attempt is made.
        pub give_up_after: Duration ["de::one::<Dur, _>"] = Duration::from_secs(3 * 86_400),
        /// Attempts allowed while the receiver answers 404.
        pub max_attempts_404: u32 = 5,
        /// Cap of a receiver's `Retry-After`.
        pub max_retry_after: Duration ["de::one::<Dur, _>"] = Duration::from_secs(86_400),
        /// Status rules in front of the seed's table (`[retry] statuses`).
        pub statuses: StatusRules ["statuses"] = StatusRules::default(),
    }
}

impl RetryConfig {
    /// The backoff `[retry]` sets: its schedule, else the doubling delays.
    pub(super) fn backoff(&self) -> Result<Backoff, BackoffError> {
        match &self.schedule {
            Some(schedule) => Backoff::schedule(schedule),
            None => Backoff::exponential(self.base_delay, self.max_delay),
        }
    }
}

/// The attempts a schedule of `delays` stands for: the first attempt, then one per delay.
pub(super) fn implied_attempts(delays: usize) -> u32 {
    u32::try_from(delays).map_or(u32::MAX, |n| n.saturating_add(1))
}

/// `schedule = ["5s", "5m"]`: durations, checked as [`Backoff::schedule`] checks them.
pub(super) fn schedule<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Duration>>, D::Error> {
    let delays = de::list::<Dur, D>(d)?;
    match Backoff::schedule(&delays) {
        Ok(_) => Ok(Some(delays)),
        Err(e) => Err(backoff_problem(&e).into_serde()),
    }
}

/// A backoff that does not build, worded to follow its key (`retry.schedule` + ` must ...`).
pub(super) fn backoff_problem(e: &BackoffError) -> Problem {
    let (code, text) = match e {
        BackoffError::EmptySchedule => ("empty_schedule", " must list at least one delay".to_string()),
        BackoffError::StepTooSmall { index } => ("invalid_duration", format!("[{index}] must be at least 1ms")),
        BackoffError::TooLong { len } => {
            let text = format!(" lists {len} delays; at most {MAX_SCHEDULE_LEN} are allowed");
            ("schedule_too_long", text)
        }
        other => ("invalid_policy_value", other.to_string()),
    };
    Problem::coded(code, text)
}

/// `statuses = { success = [409], permanent = [404, "5xx"] }`: each listed status or class
/// gets its class; one status under two classes is `status_class_conflict`.
pub(super) fn statuses<'de, D: Deserializer<'de>>(d: D) -> Result<StatusRules, D::Error> {
    let lists = StatusLists::deserialize(d)?;
    let rules = [
        (Class::Delivered, lists.success),
        (Class::Retry, lists.retry),
        (Class::Permanent, lists.permanent),
        (Class::RetryLimited, lists.retry_limited),
    ]
    .into_iter()
    .flat_map(|(class, items)| items.into_iter().map(move |Status(status)| (status, class)));
    StatusRules::new(rules).map_err(|e| Problem::coded("status_class_conflict", e.to_string()).into_serde())
}

/// The four lists of `statuses`, one per class.
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct StatusLists {
    success: Vec<Status>,
    retry: Vec<Status>,
    permanent: Vec<Status>,
    retry_limited: Vec<Status>,
}

/// One entry of a status list: a number (`404`) or a text (`"4xx"`, `"404"`). Read by hand
/// so that a wrong type gets serde's own message rather than an untagged enum's.
struct Status(StatusMatch);

impl<'de> Deserialize<'de> for Status {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ItemVisitor;
        impl Visitor<'_> for ItemVisitor {
            type Value = Status;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an HTTP status like 404 or a class like \"4xx\"")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Status, E> {
                StatusMatch::code(v).map(Status).ok_or_else(|| invalid_status(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Status, E> {
                i64::try_from(v).map_or_else(|_| Err(invalid_status(v)), |v| self.visit_i64(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Status, E> {
                v.parse().map(Status).map_err(|_| invalid_status(format_args!("{v:?}")))
            }
        }
        d.deserialize_any(ItemVisitor)
    }
}

fn invalid_status<E: serde::de::Error>(shown: impl fmt::Display) -> E {
    let text = format!("{shown} is not an HTTP status from 100 to 599 or a class like \"4xx\"");
    Problem::coded("invalid_status", text).into_serde()
}
