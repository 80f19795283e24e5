//! Admission of one attempt: every limit it must pass, in order, and the permit it holds
//! while it runs.
//!
//! Local limits first, all taken without waiting: the global `delivery.max_in_flight`
//! permit (so a host with free slots cannot start attempts past it), the endpoint's
//! `max_in_flight` cap (so an endpoint at its cap does not mark its host full), the host's
//! cap and circuit breaker, then the endpoint's rate. With `[fleet]` on, the fleet's lease
//! comes last: one round trip to Redis, made only for an attempt that can otherwise start,
//! and it is the fleet-wide version of the same three limits (host cap, endpoint cap,
//! rate). The local limits stay a second bound: an attempt needs both.
//!
//! While Redis is unavailable the fleet answers "fallback", and the local limits apply
//! divided by `fleet.expected_replicas` (`fleet::share`): the host's and the endpoint's
//! in-flight counts (this attempt included) and the endpoint's token bucket, whose rate is
//! lowered while the outage lasts (and raised again after it).
//!
//! A refused message stays pending (nothing is claimed, nothing counted). Each refusal
//! says what wakes it: a local permit coming back wakes the scheduler by itself; a fleet
//! refusal gives a time (the first lease in the way expires, or the rate's next slot),
//! and a release elsewhere in the fleet may wake it sooner.

use tokio::sync::OwnedSemaphorePermit;

use super::Deliverer;
use crate::fleet::{share, Acquired, Lease, LeaseRequest};
use crate::limits::{HostPermit, Refusal};

/// What an attempt holds while it runs: one of the `delivery.max_in_flight` permits, one
/// of its host's, one of its endpoint's if the endpoint has a `max_in_flight` cap, and its
/// fleet lease with `[fleet]` on. The host's, the endpoint's and the lease go back when the
/// receiver has answered (the caps limit requests at the receiver); the global one when the
/// result is written, so attempts whose results cannot be written yet (a full disk) are
/// bounded too.
#[derive(Debug)]
pub struct AttemptPermit {
    all: OwnedSemaphorePermit,
    host: HostPermit,
    _endpoint: Option<OwnedSemaphorePermit>,
    _fleet: Option<Lease>,
}

impl AttemptPermit {
    /// The host breaker's epoch when the attempt was admitted.
    pub fn host_epoch(&self) -> u64 {
        self.host.epoch()
    }

    /// Gives the host's (and endpoint's, and the fleet's) permit back and keeps the global one.
    pub(super) fn into_global(self) -> OwnedSemaphorePermit {
        self.all
    }
}

impl Deliverer {
    /// Everything one attempt to `endpoint` on `host` needs at `now_ms`, in the order the
    /// module doc gives: the local permits, a rate token, and with `[fleet]` on the fleet's
    /// lease. With the fleet on this may wait for one round trip to Redis (at most
    /// `fleet.timeout`): call it from a blocking thread, as the scheduler's pass is.
    pub fn admit(&self, host: &str, endpoint: &str, now_ms: u64) -> Result<AttemptPermit, Refusal> {
        let all = self
            .all_attempts
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refusal::AllBusy)?;
        // Taken in the order written (see the module doc).
        let mut permit = AttemptPermit {
            all,
            _endpoint: self.ctx.endpoints().try_cap(endpoint)?,
            host: self.hosts.try_acquire(host, self.ctx.clock().now_ms())?,
            _fleet: None,
        };
        // Under the fallback the local bucket runs at this courier's share of the rate.
        let divisor = match &self.fleet {
            Some(fleet) if !fleet.is_up() => fleet.replicas(),
            _ => 1,
        };
        // Taken before the fleet's slot: a local refusal costs no round trip. A token taken
        // for a message the fleet then refuses is not given back, which only makes this
        // courier's own bound stricter for a moment.
        self.ctx
            .endpoints()
            .try_rate_shared(endpoint, now_ms, divisor)
            .map_err(|wait| Refusal::RateLimited(now_ms + wait))?;
        let Some(fleet) = &self.fleet else {
            return Ok(permit);
        };
        let host_cap = self.hosts.cap(host);
        let endpoint_cap = self.ctx.endpoints().cap_usage(endpoint).map(|(_, cap)| cap);
        let req = LeaseRequest {
            host,
            endpoint,
            host_cap,
            endpoint_cap,
            rate: self.ctx.endpoints().rate_of(endpoint),
        };
        match fleet.acquire(&req) {
            Acquired::Granted(lease) => {
                permit._fleet = Some(lease);
                Ok(permit)
            }
            Acquired::HostBusy { retry_ms } => Err(Refusal::HostBusy(Some(now_ms + retry_ms))),
            Acquired::EndpointBusy { retry_ms } => Err(Refusal::EndpointBusy(Some(now_ms + retry_ms))),
            Acquired::RateLimited { retry_ms } => Err(Refusal::RateLimited(now_ms + retry_ms)),
            Acquired::Fallback { replicas, lease } => {
                // This attempt's permits are counted already: over the share means refused,
                // and a finishing attempt here wakes the scheduler.
                if self.hosts.in_flight(host) > share(host_cap, replicas) {
                    return Err(Refusal::HostBusy(None));
                }
                if let Some((used, cap)) = self.ctx.endpoints().cap_usage(endpoint) {
                    if used > share(cap, replicas) {
                        return Err(Refusal::EndpointBusy(None));
                    }
                }
                permit._fleet = Some(lease);
                Ok(permit)
            }
        }
    }
}
