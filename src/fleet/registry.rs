//! The leases this courier holds: asked of Redis a scheduler pass's at once, registered for
//! renewal (see `schedule`), and released through a bounded queue that the releaser (see
//! `tasks`) empties one call at a time: group commit, so a busy courier's releases share
//! calls and an idle one's goes at once.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::lease::{self, LeaseEntry, LeaseKeys, LeaseRequest};
use super::{Acquired, Inner, Lease, Outcome, MAX_LEASES, MAX_PER_CALL, MAX_QUEUED_RELEASES};

impl Inner {
    /// One call of [`Fleet::acquire_many`]: at most [`MAX_PER_CALL`] requests.
    pub(super) fn acquire_some(self: &Arc<Self>, reqs: &[LeaseRequest<'_>]) -> Vec<Acquired> {
        let Some((generation, conn)) = self.connection() else {
            return reqs.iter().map(|req| self.fallback(req, Outcome::Fallback)).collect();
        };
        let first = self.next_lease.fetch_add(reqs.len() as u64, Ordering::Relaxed);
        let mut memo: HashMap<(&str, &str, bool), LeaseKeys> = HashMap::new();
        let keys: Vec<LeaseKeys> = reqs
            .iter()
            .map(|req| {
                let key = (req.host, req.endpoint, req.endpoint_cap.is_some());
                memo.entry(key).or_insert_with(|| self.keys.lease(req)).clone()
            })
            .collect();
        let members: Vec<String> = (first..).take(reqs.len()).map(|id| self.member(id)).collect();
        let call = lease::acquire_call(
            &self.keys,
            reqs.iter()
                .zip(&keys)
                .zip(&members)
                .map(|((r, k), m)| (r, k, m.as_str())),
            self.ttl_ms,
        );
        // Set before the call, not after a refusal: the release that frees the slot may be
        // published (and reach the subscriber) before the refused reply reaches us, and a
        // flag set after it would miss that wake-up (leaving the message to its timer, up
        // to a whole `lease_ttl`). A grant leaves the flag set: at worst the next release
        // costs the scheduler one pass for nothing.
        self.waiting.store(true, Ordering::Release);
        let reply = self
            .parts
            .runtime
            .block_on(self.call::<Vec<i64>>(Some(generation), conn, call, ""));
        let Some(reply) = reply.filter(|r| r.len() == 2 * reqs.len()) else {
            // A timed-out call may still have granted leases in Redis: never renewed, they
            // expire within the TTL.
            return reqs.iter().map(|req| self.fallback(req, Outcome::Error)).collect();
        };
        let mut granted = Vec::new();
        let acquired = reply
            .chunks(2)
            .zip(keys)
            .enumerate()
            .map(|(i, (answer, keys))| {
                let retry_ms = u64::try_from(answer[1]).unwrap_or(1).max(1);
                let (outcome, acquired) = match answer[0] {
                    0 => {
                        granted.push((first + i as u64, keys));
                        (Outcome::Granted, None)
                    }
                    1 => (Outcome::HostBusy, Some(Acquired::HostBusy { retry_ms })),
                    2 => (Outcome::EndpointBusy, Some(Acquired::EndpointBusy { retry_ms })),
                    _ => (Outcome::RateLimited, Some(Acquired::RateLimited { retry_ms })),
                };
                self.parts.metrics.fleet_acquired(outcome);
                acquired
            })
            .collect::<Vec<_>>();
        let mut leases = self.hold(granted, true).into_iter();
        acquired
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Acquired::Granted(leases.next().expect("one lease per grant"))))
            .collect()
    }

    /// A lease decided without Redis (it is unavailable: `outcome` says how it was found).
    fn fallback(self: &Arc<Self>, req: &LeaseRequest<'_>, outcome: Outcome) -> Acquired {
        self.parts.metrics.fleet_acquired(outcome);
        let id = self.next_lease.fetch_add(1, Ordering::Relaxed);
        let lease = self.hold(vec![(id, self.keys.lease(req))], false).pop();
        Acquired::Fallback {
            replicas: self.config.expected_replicas,
            lease: lease.expect("one lease"),
        }
    }

    /// Registers leases this courier now holds (for renewal and release): `(id, keys)`
    /// each, all `registered` in Redis or none.
    fn hold(self: &Arc<Self>, new: Vec<(u64, LeaseKeys)>, registered: bool) -> Vec<Lease> {
        if new.is_empty() {
            return Vec::new();
        }
        let now_ms = self.now_ms();
        let mut leases = self.lock_leases();
        // Read under the lock the renewer plans under: a renewer without a timer never
        // misses these leases (a `Notify` keeps the ring if it is not waiting yet).
        let idle = self.renewer_idle.load(Ordering::Acquire);
        let held = new
            .into_iter()
            .map(|(id, keys)| {
                if leases.len() < MAX_LEASES {
                    let entry = LeaseEntry {
                        keys,
                        renewed_at_ms: now_ms,
                        registered,
                    };
                    leases.insert(id, entry);
                }
                Lease {
                    inner: self.clone(),
                    id,
                }
            })
            .collect();
        drop(leases);
        // The renewer sleeps with no timer while there is nothing to renew; a lease Redis
        // does not have yet is written at once when Redis is up.
        if idle || (!registered && self.is_up()) {
            self.lease_added.notify_one();
        }
        held
    }

    /// Ends a lease: out of the registry (so it is renewed no more), and queued for the
    /// releaser's next call if Redis has it (see `tasks::release`). Until that call ran,
    /// Redis counts the lease as held: a release can be late, never early.
    pub(super) fn release(&self, id: u64) {
        let Some(entry) = self.lock_leases().remove(&id) else {
            return;
        };
        // Not in Redis (taken while it was down), or Redis unreachable: nothing to remove
        // now; a lease Redis has expires by itself, as one past the queue's bound does.
        if !entry.registered || !self.is_up() {
            return;
        }
        let mut queue = self.releases.lock().unwrap_or_else(|p| p.into_inner());
        if queue.len() >= MAX_QUEUED_RELEASES {
            return;
        }
        queue.push((id, entry.keys));
        let first = queue.len() == 1;
        drop(queue);
        // A queue with more in it is the releaser's already: it takes the queue before each
        // call, and waits for a ring only once it found the queue empty.
        if first {
            self.release_queued.notify_one();
        }
    }

    /// The next release call's leases: up to [`MAX_PER_CALL`] from the queue, oldest first.
    pub(super) fn take_releases(&self) -> Vec<(u64, LeaseKeys)> {
        let mut queue = self.releases.lock().unwrap_or_else(|p| p.into_inner());
        if queue.len() <= MAX_PER_CALL {
            return std::mem::take(&mut *queue);
        }
        queue.drain(..MAX_PER_CALL).collect()
    }
}
