//! When leases are renewed: pure, time passed in.
//!
//! A lease lives `ttl` in Redis from its last renewal. A lease is due for renewal once it is
//! a third of the TTL old, so a renewal that fails (or times out: `fleet.timeout` is at most
//! a third of the TTL) leaves a second chance before the lease expires. When some lease is
//! due, every lease at least a sixth of the TTL old goes in the same call: leases granted
//! close together are renewed together, one round trip for a whole batch instead of one per
//! lease. Between renewals the renewer sleeps until the next lease is due; with no lease it
//! does not wake at all.
//!
//! A lease Redis does not have (lost while Redis was reachable, found missing by a renewal)
//! is due now: without that, a registry of only such leases would give the renewer no
//! timer, and nothing would write them back (or renew the leases taken after them) before
//! they expire under running attempts.

use std::collections::HashMap;

use super::lease::{LeaseEntry, LeaseKeys};

/// The leases of one renewal call: `(id, keys, restore)`, `restore` for a lease to write
/// back even if Redis does not have it.
pub(super) type Batch = Vec<(u64, LeaseKeys, bool)>;

/// The leases of `leases` to renew at `now_ms` with leases living `ttl_ms`, and when to look
/// next supposing those are renewed now (`None`: nothing to renew). `all` (after a
/// reconnect) takes every lease, each written back, and gives no next time.
pub(super) fn plan(ttl_ms: u64, leases: &HashMap<u64, LeaseEntry>, now_ms: u64, all: bool) -> (Batch, Option<u64>) {
    let every = ttl_ms.max(3) / 3;
    let any_due = leases
        .values()
        .any(|e| e.registered && e.renewed_at_ms.saturating_add(every) <= now_ms);
    let mut batch = Vec::new();
    let mut next_ms: Option<u64> = None;
    for (id, e) in leases {
        let due = any_due && e.registered && e.renewed_at_ms.saturating_add(every / 2) <= now_ms;
        if all || due || !e.registered {
            batch.push((*id, e.keys.clone(), all || !e.registered));
        }
        let at = match (e.registered, due) {
            (false, _) => now_ms,
            (true, true) => now_ms.saturating_add(every),
            (true, false) => e.renewed_at_ms.saturating_add(every),
        };
        next_ms = Some(next_ms.map_or(at, |n| n.min(at)));
    }
    (batch, next_ms.filter(|_| !all))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: u64 = 9_000; // renewed at 3 s of age; batched from 1.5 s
    const EVERY: u64 = TTL / 3;

    fn entry(renewed_at_ms: u64, registered: bool) -> LeaseEntry {
        LeaseEntry {
            keys: LeaseKeys {
                host: "h".into(),
                host_wait: "hw".into(),
                endpoint: "e".into(),
                endpoint_wait: "ew".into(),
                capped: false,
            },
            renewed_at_ms,
            registered,
        }
    }

    /// Registered leases granted or renewed at the given times.
    fn leases(at: &[(u64, u64)]) -> HashMap<u64, LeaseEntry> {
        at.iter().map(|&(id, at)| (id, entry(at, true))).collect()
    }

    /// The ids `plan` renews now (with restore), sorted, and its next time.
    fn planned(leases: &HashMap<u64, LeaseEntry>, now_ms: u64) -> (Vec<(u64, bool)>, Option<u64>) {
        let (batch, next) = plan(TTL, leases, now_ms, false);
        let mut ids: Vec<(u64, bool)> = batch.iter().map(|(id, _, restore)| (*id, *restore)).collect();
        ids.sort();
        (ids, next)
    }

    #[test]
    fn nothing_to_renew_means_no_wake_up() {
        assert_eq!(planned(&HashMap::new(), 5), (vec![], None));
    }

    #[test]
    fn a_lease_is_renewed_at_a_third_of_its_ttl() {
        assert_eq!(planned(&leases(&[(1, 1_000)]), 3_999), (vec![], Some(4_000)));
        assert_eq!(planned(&leases(&[(1, 1_000)]), 4_000), (vec![(1, false)], Some(7_000)));
        // Late (the renewer was busy): renewed at once, next from now.
        assert_eq!(planned(&leases(&[(1, 1_000)]), 6_500).1, Some(9_500));
    }

    #[test]
    fn leases_granted_close_together_share_one_renewal() {
        // Granted at 0, 1.2 s, 1.5 s and 2.9 s: at 3 s the first is due; the second and
        // third are at least half-way there and go with it; the last waits for the next round.
        let (due, next) = planned(&leases(&[(1, 0), (2, 1_200), (3, 1_500), (4, 2_900)]), 3_000);
        assert_eq!(due, vec![(1, false), (2, false), (3, false)]);
        assert_eq!(next, Some(5_900));
        // Renewed as planned: every lease stays at least two thirds of its TTL from expiry.
        for (granted, renewed) in [(0, 3_000), (1_200, 3_000), (1_500, 3_000)] {
            assert!(renewed - granted <= EVERY);
        }
    }

    #[test]
    fn a_renewal_plan_never_lets_a_lease_go_past_two_thirds_of_its_ttl() {
        // Simulate a renewer that wakes exactly when told, with leases granted every 137 ms.
        let mut leases: HashMap<u64, LeaseEntry> = HashMap::new();
        let mut now = 0;
        let mut next_grant = 0;
        let mut calls = 0;
        while now < 60_000 {
            while next_grant <= now {
                leases.insert(leases.len() as u64, entry(next_grant, true));
                next_grant += 137;
            }
            let (due, next) = planned(&leases, now);
            if !due.is_empty() {
                calls += 1;
            }
            for (id, e) in &mut leases {
                if due.contains(&(*id, false)) {
                    e.renewed_at_ms = now;
                }
                let age = now - e.renewed_at_ms;
                assert!(age <= EVERY, "lease {id} {age}ms old at {now}");
            }
            now = next.unwrap().min(next_grant);
        }
        // One call per half-period at most, not one per lease.
        assert!(calls <= 2 * 60_000 / 3_000 + 2, "{calls} calls");
    }

    #[test]
    fn leases_redis_lost_are_due_at_once_so_the_renewer_keeps_a_timer() {
        // Every lease found missing by the last renewal: still a timer, and it is now.
        let mut leases = HashMap::from([(1, entry(1_000, false)), (2, entry(1_000, false))]);
        let (ids, next) = planned(&leases, 1_500);
        assert_eq!(next, Some(1_500));
        assert_eq!(ids, vec![(1, true), (2, true)], "written back, not merely renewed");
        // With registered leases too: the earlier of the two.
        leases.insert(3, entry(1_400, true));
        assert_eq!(planned(&leases, 1_500).1, Some(1_500));
        // Only registered leases: their schedule.
        let leases = HashMap::from([(3, entry(1_400, true))]);
        assert_eq!(planned(&leases, 1_500), (vec![], Some(4_400)));
        // After a reconnect: every lease, written back, and no timer from this plan.
        let (ids, next) = plan(TTL, &leases, 1_500, true);
        assert_eq!((ids.len(), ids[0].2, next), (1, true, None));
    }
}
