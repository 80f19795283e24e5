//! The retry policy: everything courier decides after an attempt, as pure functions.
//!
//! Nothing here reads a clock, touches the network or draws global randomness: callers pass
//! `now_ms` (unix millis) and an `&mut impl rand::Rng`, so tests assert exact times.
//!
//! - [`classify`] maps a response status to delivered / retry / permanent / not-found.
//! - [`backoff`] computes the exponential delay with jitter before the next attempt.
//! - [`retry_after`] parses a receiver's `Retry-After` header (seconds or HTTP-date).
//! - [`rate`] is the per-endpoint token bucket.
//! - [`circuit`] is the per-host circuit breaker.
//! - [`decide`] combines them with the give-up limits into one [`Decision`].

pub mod backoff;
pub mod circuit;
pub mod classify;
pub mod decide;
pub mod rate;
pub mod retry_after;

pub use backoff::{Backoff, BackoffError};
pub use classify::{classify, Class};
pub use decide::{decide, AttemptResult, Decision, Limits, RetryPolicy};
pub use rate::TokenBucket;
pub use retry_after::parse_retry_after;
