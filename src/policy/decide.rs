//! The whole decision after one attempt (CONTRACT §3): delivered, retry at a given time, or
//! dead-letter with a reason. Combines the status rules ([`Statuses`]), the [`Backoff`] with
//! its jitter, [`parse_retry_after`] and the message's give-up limits; pure, so tests assert
//! exact retry times.

use std::time::Duration;

use super::backoff::Backoff;
use super::classify::{Class, Statuses};
use super::retry_after::parse_retry_after;
use crate::model::{DeadReason, Jitter};

/// What one attempt produced, as far as the policy cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    /// The receiver answered with an HTTP status.
    Status {
        /// The response status code.
        code: u16,
        /// The raw `Retry-After` header value, if the response had one.
        retry_after: Option<String>,
    },
    /// DNS failure, connection refused or reset, TLS failure, timeout: retried.
    NetworkError,
    /// The egress policy refused every address of the target: dead-lettered at once.
    EgressDenied,
}

/// The settings one attempt's decision is made under: what the config says now for the
/// message's endpoint and route (see [`super::book`]). Borrowed from the policy book and
/// `Copy`, so looking it up per attempt allocates nothing.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy<'a> {
    /// The shape of the wait before the next attempt.
    pub backoff: &'a Backoff,
    /// How that wait is randomised.
    pub jitter: Jitter,
    /// Attempt cap for messages whose receiver keeps answering a `retry_limited` status (404).
    pub max_attempts_404: u32,
    /// The longest wait a `Retry-After` header can impose.
    pub max_retry_after: Duration,
    /// What each status means.
    pub statuses: Statuses<'a>,
}

/// The give-up limits of one message, with per-message overrides already applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Dead-letter once this many attempts have been made.
    pub max_attempts: u32,
    /// Dead-letter rather than schedule an attempt after this time (unix millis).
    pub give_up_at_ms: u64,
}

/// What to do with the message after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The receiver has it.
    Delivered,
    /// Attempt again at this time (unix millis).
    RetryAt {
        /// When the next attempt is due.
        at_ms: u64,
    },
    /// Give up and keep it in the dead-letter store.
    Dead(DeadReason),
}

/// Decides what happens after an attempt. `attempts_made` includes the attempt just made.
///
/// By the status's class (the seed's table unless the policy's rules say otherwise):
/// success → delivered; permanent → dead (`permanent_status`); egress refusal → dead
/// (`egress_denied`); retry_limited (404) → dead (`max_attempts`) once
/// `min(max_attempts_404, max_attempts)` attempts were made; any retry → dead
/// (`max_attempts`) once `max_attempts` were made, else wait the jittered backoff (or
/// schedule step), stretched (never shortened) by a `Retry-After` on 429/503 capped at
/// `max_retry_after`; if that lands after the give-up time → dead (`expired`).
pub fn decide(
    result: &AttemptResult,
    attempts_made: u32,
    limits: &Limits,
    policy: &RetryPolicy<'_>,
    now_ms: u64,
    rng: &mut impl rand::Rng,
) -> Decision {
    let retry_after = match result {
        AttemptResult::EgressDenied => return Decision::Dead(DeadReason::EgressDenied),
        AttemptResult::NetworkError => None,
        AttemptResult::Status { code, retry_after } => match policy.statuses.classify(*code) {
            Class::Delivered => return Decision::Delivered,
            Class::Permanent => return Decision::Dead(DeadReason::PermanentStatus),
            Class::RetryLimited if attempts_made >= policy.max_attempts_404.min(limits.max_attempts) => {
                return Decision::Dead(DeadReason::MaxAttempts)
            }
            Class::RetryLimited | Class::Retry => match (code, retry_after) {
                // Only these two statuses carry a meaningful Retry-After (RFC 9110 §10.2.3, RFC 6585).
                (429 | 503, Some(value)) => parse_retry_after(value, now_ms),
                _ => None,
            },
        },
    };
    if attempts_made >= limits.max_attempts {
        return Decision::Dead(DeadReason::MaxAttempts);
    }
    let mut delay = policy.backoff.delay(attempts_made, policy.jitter, rng);
    if let Some(asked) = retry_after {
        delay = delay.max(asked.min(policy.max_retry_after));
    }
    let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
    let at_ms = now_ms.saturating_add(delay_ms);
    if at_ms > limits.give_up_at_ms {
        Decision::Dead(DeadReason::Expired)
    } else {
        Decision::RetryAt { at_ms }
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
