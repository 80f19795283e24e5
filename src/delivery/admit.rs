//! Admission of one attempt: every limit it must pass, in order, and the permit it holds
//! while it runs.
//!
//! Local limits first, all taken without waiting: the global `delivery.max_in_flight`
//! permit (so a host with free slots cannot start attempts past it), the endpoint's
//! `max_in_flight` cap (so an endpoint at its cap does not mark its host full), the host's
//! cap and circuit breaker, then the endpoint's rate ([`Deliverer::admit`]). With `[fleet]`
//! on, the fleet's lease comes last ([`Deliverer::lease_all`]): the scheduler's pass gathers
//! the attempts that passed the local limits and asks for all their leases in one round
//! trip to Redis, the fleet-wide version of the same three limits (host cap, endpoint cap,
//! rate), decided in the pass's order. The local limits stay a second bound: an attempt
//! needs both.
//!
//! While Redis is unavailable the fleet answers "fallback", and the local limits apply
//! divided by `fleet.expected_replicas` (`fleet::share`): the host's and the endpoint's
//! in-flight counts (this attempt included, the batch's later ones not) and the endpoint's
//! token bucket, whose rate is lowered while the outage lasts (and raised again after it).
//!
//! A refused message stays pending (nothing is claimed, nothing counted, its local permits
//! go back), unless its host's cap alone refused it: then it may wait in the host's line
//! (`waiting`). Each refusal says what wakes it: a local permit coming back wakes the
//! scheduler (and moves the host's line) by itself; a fleet refusal gives a time (the first lease in the way expires,
//! or the rate's next slot), and a release elsewhere in the fleet may wake it sooner.

use std::collections::HashMap;

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
    /// The local part of what one attempt to `endpoint` on `host` needs at `now_ms`, in the
    /// order the module doc gives: the local permits and a rate token. With `[fleet]` on
    /// ([`Deliverer::fleet`]) the attempt also needs its fleet lease, from
    /// [`Deliverer::lease_all`], before it may start.
    pub fn admit(&self, host: &str, endpoint: &str, now_ms: u64) -> Result<AttemptPermit, Refusal> {
        let all = self
            .all_attempts
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refusal::AllBusy)?;
        // Taken in the order written (see the module doc).
        let permit = AttemptPermit {
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
        // Taken before the fleet's slot: a local refusal costs the fleet nothing. A token
        // taken for a message the fleet then refuses is not given back, which only makes
        // this courier's own bound stricter for a moment.
        self.ctx
            .endpoints()
            .try_rate_shared(endpoint, now_ms, divisor)
            .map_err(|wait| Refusal::RateLimited(now_ms + wait))?;
        Ok(permit)
    }

    /// The fleet's leases for attempts [`Deliverer::admit`] let through: `routes[i]` (host,
    /// endpoint) holding `permits[i]`, in the order they should be served. One round trip
    /// to Redis for all (at most `fleet.timeout`; call it from a blocking thread, as the
    /// scheduler's pass is). Each answer is the permit with its lease, or the refusal (its
    /// local permits given back at once, before the next answer is decided).
    pub fn lease_all(
        &self,
        routes: &[(&str, &str)],
        permits: Vec<AttemptPermit>,
        now_ms: u64,
    ) -> Vec<Result<AttemptPermit, Refusal>> {
        let Some(fleet) = &self.fleet else {
            return permits.into_iter().map(Ok).collect();
        };
        let endpoints = self.ctx.endpoints();
        let reqs: Vec<LeaseRequest<'_>> = routes
            .iter()
            .map(|&(host, endpoint)| LeaseRequest {
                host,
                endpoint,
                host_cap: self.hosts.cap(host),
                endpoint_cap: endpoints.cap_usage(endpoint).map(|(_, cap)| cap),
                rate: endpoints.rate_of(endpoint),
            })
            .collect();
        // Under the fallback each attempt is held to this courier's share as if admitted
        // alone, in order: the batch's later attempts hold their local permits already and
        // must not count against it.
        let (mut hosts_later, mut endpoints_later) = (HashMap::new(), HashMap::new());
        for req in &reqs {
            *hosts_later.entry(req.host).or_insert(0u32) += 1;
            *endpoints_later.entry(req.endpoint).or_insert(0u32) += 1;
        }
        let acquired = fleet.acquire_many(&reqs);
        reqs.iter()
            .zip(permits)
            .zip(acquired)
            .map(|((req, mut permit), acquired)| {
                let host_later = hosts_later.get_mut(req.host).map_or(0, |n| {
                    *n -= 1;
                    *n
                });
                let endpoint_later = endpoints_later.get_mut(req.endpoint).map_or(0, |n| {
                    *n -= 1;
                    *n
                });
                let lease = match acquired {
                    Acquired::Granted(lease) => lease,
                    Acquired::HostBusy { retry_ms } => return Err(Refusal::HostBusy(Some(now_ms + retry_ms))),
                    Acquired::EndpointBusy { retry_ms } => return Err(Refusal::EndpointBusy(Some(now_ms + retry_ms))),
                    Acquired::RateLimited { retry_ms } => return Err(Refusal::RateLimited(now_ms + retry_ms)),
                    Acquired::Fallback { replicas, lease } => {
                        // This attempt's permits are counted already: over the share means
                        // refused, and a finishing attempt here wakes the scheduler.
                        let running = self.hosts.in_flight(req.host).saturating_sub(host_later);
                        if running > share(req.host_cap, replicas) {
                            return Err(Refusal::HostBusy(None));
                        }
                        if let Some((used, cap)) = endpoints.cap_usage(req.endpoint) {
                            if used.saturating_sub(endpoint_later) > share(cap, replicas) {
                                return Err(Refusal::EndpointBusy(None));
                            }
                        }
                        lease
                    }
                };
                permit._fleet = Some(lease);
                Ok(permit)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rand::SeedableRng;

    use super::*;
    use crate::clock::ManualClock;
    use crate::config::{Config, FleetConfig};
    use crate::delivery::tests::{Scripted, T0};
    use crate::fleet::{Fleet, FleetParts};
    use crate::metrics::Metrics;
    use crate::store::{Store, StoreOptions};

    /// With Redis unreachable, a pass's batch is held to this courier's share as if each
    /// attempt had been admitted alone, in order: the batch's later attempts, whose local
    /// permits are taken already, do not count against the earlier ones.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_under_the_fallback_keeps_the_share_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("data"), StoreOptions::default()).unwrap());
        let clock = ManualClock::new(T0);
        let mut config = Config::default();
        config.delivery.max_in_flight_per_host = 6;
        let nobody = format!("redis+unix://{}", dir.path().join("none.sock").display());
        let fleet_cfg = FleetConfig {
            redis_url: Some(url::Url::parse(&nobody).unwrap()),
            expected_replicas: 3,
            ..FleetConfig::default()
        };
        let metrics = Arc::new(Metrics::default());
        let parts = FleetParts {
            runtime: tokio::runtime::Handle::current(),
            wake: Arc::new(crate::sys::wake::Wake::default()),
            ca_pem: None,
            metrics: metrics.clone(),
        };
        let fleet = Fleet::start(&fleet_cfg, parts).unwrap();
        let ctx = crate::context::Context::new(
            store,
            clock.clone(),
            Arc::new(config),
            metrics,
            Arc::new(crate::sys::wake::Wake::default()),
            tokio::runtime::Handle::current(),
        )
        .unwrap();
        let transport = Scripted::new(clock, vec![]);
        let d = Deliverer::new(ctx, transport, rand::rngs::StdRng::seed_from_u64(1), fleet);
        let (host, endpoint) = ("f.example:443", "https://f.example/");
        let decided = tokio::task::spawn_blocking(move || {
            // One attempt running already; a pass then gathers four more (6 / 3: a share of 2).
            let running = d.admit(host, endpoint, T0).unwrap();
            let permits: Vec<_> = (0..4).map(|_| d.admit(host, endpoint, T0).unwrap()).collect();
            assert_eq!(d.hosts.in_flight(host), 5);
            let answers = d.lease_all(&[(host, endpoint); 4], permits, T0);
            let refusals: Vec<_> = answers.iter().map(|a| a.as_ref().err().copied()).collect();
            // Refused permits went back as they were decided: the one running and one more.
            let in_flight = d.hosts.in_flight(host);
            drop((running, answers));
            (refusals, in_flight)
        })
        .await
        .unwrap();
        let busy = Some(Refusal::HostBusy(None));
        assert_eq!(decided, (vec![None, busy, busy, busy], 2));
    }
}
