//! When leases are renewed: pure, time passed in.
//!
//! A lease lives `ttl` in Redis from its last renewal. A lease is due for renewal once it is
//! a third of the TTL old, so a renewal that fails (or times out: `fleet.timeout` is at most
//! a third of the TTL) leaves a second chance before the lease expires. When some lease is
//! due, every lease at least a sixth of the TTL old goes in the same call: leases granted
//! close together are renewed together, one round trip for a whole batch instead of one per
//! lease. Between renewals the renewer sleeps until the next lease is due; with no lease it
//! does not wake at all.

/// The renewal rule for one TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenewSchedule {
    ttl_ms: u64,
}

/// What to do now: renew `due` (lease ids), then look again at `next_ms` (`None`: no lease left).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewPlan {
    /// Leases to renew now.
    pub due: Vec<u64>,
    /// When the next lease falls due, once `due` is renewed now.
    pub next_ms: Option<u64>,
}

impl RenewSchedule {
    /// The rule for leases living `ttl_ms`.
    pub fn new(ttl_ms: u64) -> Self {
        RenewSchedule { ttl_ms: ttl_ms.max(3) }
    }

    /// A lease's age at which it is renewed.
    pub fn every_ms(&self) -> u64 {
        self.ttl_ms / 3
    }

    /// Which of `leases` (id, last renewed or granted at) to renew at `now_ms`, and when to
    /// look next, supposing those are renewed now.
    pub fn plan(&self, leases: impl IntoIterator<Item = (u64, u64)>, now_ms: u64) -> RenewPlan {
        let every = self.every_ms();
        let leases: Vec<(u64, u64)> = leases.into_iter().collect();
        let any_due = leases.iter().any(|&(_, at)| at.saturating_add(every) <= now_ms);
        let mut due = Vec::new();
        let mut next_ms: Option<u64> = None;
        for (id, at) in leases {
            let renewed_at = if any_due && at.saturating_add(every / 2) <= now_ms {
                due.push(id);
                now_ms
            } else {
                at
            };
            let at = renewed_at.saturating_add(every);
            next_ms = Some(next_ms.map_or(at, |n| n.min(at)));
        }
        RenewPlan { due, next_ms }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: u64 = 9_000; // renewed at 3 s of age; batched from 1.5 s

    #[test]
    fn nothing_to_renew_means_no_wake_up() {
        let s = RenewSchedule::new(TTL);
        assert_eq!(
            s.plan([], 5),
            RenewPlan {
                due: vec![],
                next_ms: None
            }
        );
    }

    #[test]
    fn a_lease_is_renewed_at_a_third_of_its_ttl() {
        let s = RenewSchedule::new(TTL);
        assert_eq!(s.every_ms(), 3_000);
        let plan = s.plan([(1, 1_000)], 3_999);
        assert_eq!(
            plan,
            RenewPlan {
                due: vec![],
                next_ms: Some(4_000)
            }
        );
        let plan = s.plan([(1, 1_000)], 4_000);
        assert_eq!(
            plan,
            RenewPlan {
                due: vec![1],
                next_ms: Some(7_000)
            }
        );
        // Late (the renewer was busy): renewed at once, next from now.
        assert_eq!(s.plan([(1, 1_000)], 6_500).next_ms, Some(9_500));
    }

    #[test]
    fn leases_granted_close_together_share_one_renewal() {
        let s = RenewSchedule::new(TTL);
        // Granted at 0, 1.2 s, 1.5 s and 2.9 s: at 3 s the first is due; the second and
        // third are at least half-way there and go with it; the last waits for the next round.
        let plan = s.plan([(1, 0), (2, 1_200), (3, 1_500), (4, 2_900)], 3_000);
        assert_eq!(plan.due, vec![1, 2, 3]);
        assert_eq!(plan.next_ms, Some(5_900));
        // Renewed as planned: every lease stays at least two thirds of its TTL from expiry.
        for (granted, renewed) in [(0, 3_000), (1_200, 3_000), (1_500, 3_000)] {
            assert!(renewed - granted <= s.every_ms());
        }
    }

    #[test]
    fn a_renewal_plan_never_lets_a_lease_go_past_two_thirds_of_its_ttl() {
        // Simulate a renewer that wakes exactly when told, with leases granted every 137 ms.
        let s = RenewSchedule::new(TTL);
        let mut leases: Vec<(u64, u64)> = Vec::new();
        let mut now = 0;
        let mut next_grant = 0;
        let mut calls = 0;
        while now < 60_000 {
            while next_grant <= now {
                leases.push((leases.len() as u64, next_grant));
                next_grant += 137;
            }
            let plan = s.plan(leases.iter().copied(), now);
            if !plan.due.is_empty() {
                calls += 1;
            }
            for (id, at) in &mut leases {
                if plan.due.contains(id) {
                    *at = now;
                }
                assert!(now - *at <= s.every_ms(), "lease {id} {}ms old at {now}", now - *at);
            }
            now = plan.next_ms.unwrap().min(next_grant);
        }
        // One call per half-period at most, not one per lease.
        assert!(calls <= 2 * 60_000 / 3_000 + 2, "{calls} calls");
    }
}
