//! The whole decision after one attempt (CONTRACT §3): delivered, retry at a given time, or
//! dead-letter with a reason. Combines the status rules ([`Statuses`]), the backoff with its
//! jitter, [`parse_retry_after`] and the message's give-up limits; pure, so tests assert
//! exact retry times.

use std::time::Duration;

use super::backoff::millis;
use super::classify::{Class, Statuses};
use super::retry_after::parse_retry_after;
use super::settings::RetryPolicy;
use crate::model::{DeadReason, Transition};

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

/// The give-up limits of one message, with per-message overrides already applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Dead-letter once this many attempts have been made.
    pub max_attempts: u32,
    /// Dead-letter rather than schedule an attempt after this time (unix millis).
    pub give_up_at_ms: u64,
}

/// Decides what happens after an attempt, under the settings the config gives the attempt
/// (see [`super::book`]) and the message's own `limits` (its policy's give-up values are
/// not read: they were fixed at accept). `attempts_made` includes the attempt just made.
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
    policy: &RetryPolicy<Statuses<'_>>,
    now_ms: u64,
    wall_ms: u64,
    rng: &mut impl rand::Rng,
) -> Transition {
    let (class, retry_after) = match result {
        AttemptResult::EgressDenied => return Transition::Dead(DeadReason::EgressDenied),
        AttemptResult::NetworkError => (Class::Retry, None),
        AttemptResult::Status { code, retry_after } => {
            let class = policy.statuses.classify(*code);
            // Only these two statuses carry a meaningful Retry-After (RFC 9110 §10.2.3, RFC 6585).
            let asked = match (code, retry_after) {
                (429 | 503, Some(value)) => parse_retry_after(value, wall_ms),
                _ => None,
            };
            (class, asked)
        }
    };
    match class {
        Class::Delivered => Transition::Delivered,
        Class::Permanent => Transition::Dead(DeadReason::PermanentStatus),
        Class::RetryLimited if attempts_made >= policy.max_attempts_404.min(limits.max_attempts) => {
            Transition::Dead(DeadReason::MaxAttempts)
        }
        Class::RetryLimited | Class::Retry => retry(attempts_made, retry_after, limits, policy, now_ms, rng),
    }
}

/// A retry's transition: dead once the attempts are spent, else at the jittered backoff
/// (stretched by `retry_after`, capped), or dead if that lands after the give-up time.
fn retry(
    attempts_made: u32,
    retry_after: Option<Duration>,
    limits: &Limits,
    policy: &RetryPolicy<Statuses<'_>>,
    now_ms: u64,
    rng: &mut impl rand::Rng,
) -> Transition {
    if attempts_made >= limits.max_attempts {
        return Transition::Dead(DeadReason::MaxAttempts);
    }
    let mut delay = policy.backoff.delay(attempts_made, policy.jitter, rng);
    if let Some(asked) = retry_after {
        delay = delay.max(asked.min(policy.max_retry_after));
    }
    let at_ms = now_ms.saturating_add(millis(delay));
    if at_ms > limits.give_up_at_ms {
        Transition::Dead(DeadReason::Expired)
    } else {
        Transition::RetryAt(at_ms)
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
