//! The retry policy: everything courier decides after an attempt, as pure functions.
//!
//! Nothing here reads a clock, touches the network or draws global randomness: callers pass
//! `now_ms` (unix millis) and an `&mut impl rand::Rng`, so tests assert exact times.
//!
//! - [`classify`] maps a response status to success / retry / permanent / retry_limited:
//!   the seed's table, and the rules a config section puts in front of it.
//! - [`backoff`] computes the delay before the next attempt (exponential, or an explicit
//!   schedule) with jitter.
//! - [`retry_after`] parses a receiver's `Retry-After` header (seconds or HTTP-date).
//! - [`rate`] is the per-endpoint token bucket.
//! - [`circuit`] is the per-host circuit breaker.
//! - [`decide`] combines them with the give-up limits into one
//!   [`Transition`](crate::model::Transition): where the message goes, which is also how the
//!   store, the metrics and the endpoint's streak count the attempt.
//! - [`pace`] is how many accepts may be in progress while delivery is short of CPU.
//! - [`settings`] is the full set of retry settings, what a config section overrides of it,
//!   and how a message's sections lay over the global set; [`book`] looks them up.

pub mod backoff;
pub mod book;
pub mod circuit;
pub mod classify;
pub mod decide;
pub mod pace;
pub mod rate;
pub mod retry_after;
pub mod settings;

pub use backoff::{Backoff, BackoffError};
pub use book::PolicyBook;
pub use classify::{classify, Class, StatusError, StatusMatch, StatusRules, Statuses};
pub use decide::{decide, AttemptResult, Limits};
pub use rate::TokenBucket;
pub use retry_after::parse_retry_after;
pub use settings::{resolve, revision_text, Overrides, RetryPolicy};
