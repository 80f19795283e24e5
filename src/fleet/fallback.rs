//! The limits each courier keeps to while Redis is unavailable: its local limit divided by
//! `fleet.expected_replicas`, rounded up and at least 1, so the fleet together stays near
//! the limit (a little over it when the division is not exact, never at zero).

/// This courier's share of `limit` among `replicas` couriers. A `limit` of 0 means "no
/// limit" (a rate of 0) and stays 0.
pub fn share(limit: u32, replicas: u32) -> u32 {
    if limit == 0 {
        return 0;
    }
    limit.div_ceil(replicas.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_round_up_and_never_reach_zero() {
        let table = [
            // (limit, replicas, share)
            (10, 1, 10),
            (10, 2, 5),
            (10, 3, 4),
            (10, 4, 3),
            (10, 10, 1),
            (10, 50, 1),
            (5, 3, 2),
            (1, 3, 1),
            (100, 3, 34),
            (u32::MAX, 2, u32::MAX / 2 + 1),
            (0, 3, 0),
            (7, 0, 7),
        ];
        for (limit, replicas, want) in table {
            assert_eq!(share(limit, replicas), want, "{limit} / {replicas}");
        }
    }

    #[test]
    fn the_fleet_together_stays_within_one_share_of_the_limit() {
        for limit in 1..=200u32 {
            for replicas in 1..=60u32 {
                let s = share(limit, replicas);
                assert!(s >= 1);
                let total = u64::from(s) * u64::from(replicas);
                assert!(
                    total >= u64::from(limit),
                    "{limit}/{replicas}: the fleet keeps its limit"
                );
                if s > 1 {
                    assert!(
                        total < u64::from(limit) + u64::from(replicas),
                        "{limit}/{replicas}: {total}"
                    );
                }
            }
        }
    }
}
