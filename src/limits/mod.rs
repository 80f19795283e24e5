//! The stateful limits an attempt is admitted under: per-host caps with their circuit
//! breakers ([`hosts`]) over semaphores that a reload resizes in place ([`resizable`]),
//! which the endpoint table's per-endpoint `max_in_flight` caps use too (they are kept
//! with the endpoint's other state, in `context::endpoints`). The pure rules they
//! apply (the breaker, the token bucket) are `policy`'s; the fleet-wide limits on Redis are
//! `fleet`'s; delivery's `admit` takes them all in one order, and any of them refuses in
//! one vocabulary ([`Refusal`]).

pub mod hosts;
mod resizable;

pub use hosts::{HostLimiter, HostPermit, HostView};
pub use resizable::Resizable;

/// Why a due message cannot start now, every limit considered, and when to look again
/// (`None`: when a local permit comes back, which wakes the scheduler by itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `delivery.max_in_flight` attempts are running.
    AllBusy,
    /// The host is at its cap, here or fleet-wide.
    HostBusy(Option<u64>),
    /// The host's circuit breaker is open until this time (unix millis).
    CircuitOpen(u64),
    /// The endpoint is at its `max_in_flight` cap, here or fleet-wide.
    EndpointBusy(Option<u64>),
    /// The endpoint's rate limit (local or fleet-wide) has a slot at this time.
    RateLimited(u64),
}
