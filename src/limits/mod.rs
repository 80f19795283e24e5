//! The stateful limits an attempt is admitted under: per-host caps with their circuit
//! breakers ([`hosts`]) and per-endpoint `max_in_flight` caps ([`endpoint_caps`]), both
//! over semaphores that a reload resizes in place ([`resizable`]). The pure rules they
//! apply (the breaker, the token bucket) are `policy`'s; the fleet-wide limits on Redis are
//! `fleet`'s; delivery's `admit` takes them all in one order.

pub mod endpoint_caps;
pub mod hosts;
mod resizable;

pub use endpoint_caps::EndpointCaps;
pub use hosts::{HostLimiter, HostPermit, HostRefusal, HostView};
