//! The per-endpoint rate limit: a token bucket holding one second's worth of attempts.
//!
//! Integer math only: tokens are counted in thousandths, so a rate of `r` per second adds
//! exactly `r` thousandths per millisecond and no rounding error accumulates over time.

/// Thousandths of a token in one token.
const MILLI: u64 = 1_000;

/// A token bucket: `rate` tokens per second, burst = `rate` (one second's worth), starting full.
///
/// A rate of 0 means "no limit": every take succeeds (configuration decides whether to allow it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    rate: u64,
    /// Thousandths of a token currently available, at most `rate * MILLI`.
    milli_tokens: u64,
    /// The latest time seen; never moves backwards, so a clock jump back earns no tokens.
    last_ms: u64,
}

impl TokenBucket {
    /// A full bucket for `rate_per_second` attempts per second.
    pub fn new(rate_per_second: u32, now_ms: u64) -> TokenBucket {
        let rate = u64::from(rate_per_second);
        TokenBucket {
            rate,
            milli_tokens: rate * MILLI,
            last_ms: now_ms,
        }
    }

    /// The configured rate, per second.
    pub fn rate(&self) -> u32 {
        // `rate` always comes from a u32.
        u32::try_from(self.rate).unwrap_or(u32::MAX)
    }

    /// Takes one token, or says how many millis until one is available (always >= 1).
    pub fn try_take(&mut self, now_ms: u64) -> Result<(), u64> {
        if self.rate == 0 {
            return Ok(());
        }
        self.refill(now_ms);
        if self.milli_tokens >= MILLI {
            self.milli_tokens -= MILLI;
            return Ok(());
        }
        let missing = MILLI - self.milli_tokens;
        let ready_at = self.last_ms.saturating_add(missing.div_ceil(self.rate));
        Err(ready_at.saturating_sub(now_ms).max(1))
    }

    /// Changes the rate, keeping the tokens already earned (at the old rate) up to the new burst.
    pub fn set_rate(&mut self, rate: u32, now_ms: u64) {
        self.refill(now_ms);
        self.rate = u64::from(rate);
        self.milli_tokens = self.milli_tokens.min(self.rate * MILLI);
    }

    fn refill(&mut self, now_ms: u64) {
        if now_ms <= self.last_ms {
            return;
        }
        let earned = (now_ms - self.last_ms).saturating_mul(self.rate);
        self.milli_tokens = self.milli_tokens.saturating_add(earned).min(self.rate * MILLI);
        self.last_ms = now_ms;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_700_000_000_000;

    fn drain(bucket: &mut TokenBucket, now: u64) -> usize {
        let mut n = 0;
        while bucket.try_take(now).is_ok() {
            n += 1;
            assert!(n <= 1_000_000, "bucket never empties");
        }
        n
    }

    #[test]
    fn starts_with_a_burst_of_one_second() {
        for rate in [1, 2, 3, 7, 100, 1000, 5000] {
            let mut b = TokenBucket::new(rate, T0);
            assert_eq!(drain(&mut b, T0), rate as usize, "rate {rate}");
        }
    }

    #[test]
    fn wait_times_after_the_burst_are_exact() {
        // (rate, wait after the burst): 1000 thousandths of a token at `rate` per ms, rounded up.
        let table = [(1, 1000), (2, 500), (3, 334), (7, 143), (100, 10), (1000, 1), (5000, 1)];
        for (rate, wait) in table {
            let mut b = TokenBucket::new(rate, T0);
            drain(&mut b, T0);
            assert_eq!(b.try_take(T0), Err(wait), "rate {rate}");
            assert_eq!(b.try_take(T0 + wait - 1), Err(1), "rate {rate}");
            assert_eq!(b.try_take(T0 + wait), Ok(()), "rate {rate}");
        }
    }

    #[test]
    fn rate_100_gives_one_token_every_10ms() {
        let mut b = TokenBucket::new(100, T0);
        drain(&mut b, T0);
        assert_eq!(b.try_take(T0 + 3), Err(7));
        assert_eq!(b.try_take(T0 + 9), Err(1));
        assert_eq!(b.try_take(T0 + 10), Ok(()));
        assert_eq!(b.try_take(T0 + 10), Err(10));
        assert_eq!(b.try_take(T0 + 45), Ok(()));
        assert_eq!(b.try_take(T0 + 45), Ok(()));
        assert_eq!(b.try_take(T0 + 45), Ok(()));
        assert_eq!(b.try_take(T0 + 45), Err(5));
    }

    #[test]
    fn exactly_rate_per_second_after_the_burst() {
        for rate in [1u32, 3, 7, 10, 100, 333] {
            let mut b = TokenBucket::new(rate, T0);
            let mut taken = 0u64;
            for ms in 0..=10_000u64 {
                while b.try_take(T0 + ms).is_ok() {
                    taken += 1;
                }
            }
            assert_eq!(taken, u64::from(rate) * 11, "rate {rate}");
        }
    }

    #[test]
    fn waiting_the_announced_time_always_succeeds() {
        for rate in [1u32, 3, 7, 100, 999] {
            let mut b = TokenBucket::new(rate, T0);
            let mut now = T0;
            let mut taken = 0u64;
            while now < T0 + 5_000 {
                match b.try_take(now) {
                    Ok(()) => taken += 1,
                    Err(wait) => {
                        assert!(wait >= 1);
                        now += wait;
                        assert_eq!(b.try_take(now), Ok(()), "rate {rate} at {now}");
                        taken += 1;
                    }
                }
            }
            // Never more than burst + 5 seconds' worth.
            assert!(taken <= u64::from(rate) * 6, "rate {rate}: {taken}");
        }
    }

    #[test]
    fn idle_time_refills_only_up_to_the_burst() {
        let mut b = TokenBucket::new(5, T0);
        drain(&mut b, T0);
        assert_eq!(drain(&mut b, T0 + 3_600_000), 5);
    }

    #[test]
    fn clock_going_backwards_earns_nothing_and_does_not_panic() {
        let mut b = TokenBucket::new(10, T0);
        drain(&mut b, T0);
        assert_eq!(b.try_take(T0 - 5_000), Err(5_100));
        assert_eq!(b.try_take(0), Err(T0 + 100));
        // Back to the original time: still nothing earned for the detour.
        assert_eq!(b.try_take(T0), Err(100));
        assert_eq!(b.try_take(T0 + 100), Ok(()));
        // Tokens already held can still be spent while the clock is behind.
        let mut full = TokenBucket::new(2, T0);
        assert_eq!(full.try_take(T0 - 1), Ok(()));
        assert_eq!(full.try_take(T0 - 1), Ok(()));
        assert_eq!(full.try_take(T0 - 1), Err(501));
    }

    #[test]
    fn extreme_times_do_not_overflow() {
        let mut b = TokenBucket::new(u32::MAX, 0);
        assert_eq!(b.try_take(u64::MAX), Ok(()));
        let mut slow = TokenBucket::new(1, u64::MAX - 10);
        assert_eq!(slow.try_take(u64::MAX - 10), Ok(()));
        assert!(slow.try_take(u64::MAX - 10).is_err());
        assert!(slow.try_take(u64::MAX).is_err());
    }

    #[test]
    fn zero_rate_means_unlimited() {
        let mut b = TokenBucket::new(0, T0);
        for _ in 0..10_000 {
            assert_eq!(b.try_take(T0), Ok(()));
        }
        let mut limited = TokenBucket::new(1, T0);
        limited.set_rate(0, T0);
        assert_eq!(drain_some(&mut limited, T0, 50), 50);
    }

    fn drain_some(bucket: &mut TokenBucket, now: u64, n: usize) -> usize {
        (0..n).filter(|_| bucket.try_take(now).is_ok()).count()
    }

    #[test]
    fn set_rate_keeps_earned_tokens_up_to_the_new_burst() {
        let mut b = TokenBucket::new(100, T0);
        assert_eq!(drain_some(&mut b, T0, 90), 90);
        // 10 tokens left; lowering the rate to 5 clamps them to the new burst.
        b.set_rate(5, T0);
        assert_eq!(b.rate(), 5);
        assert_eq!(drain(&mut b, T0), 5);
        assert_eq!(b.try_take(T0), Err(200));
        // Raising the rate does not hand out a free burst.
        b.set_rate(50, T0 + 100);
        assert_eq!(b.try_take(T0 + 100), Err(10));
        assert_eq!(b.try_take(T0 + 110), Ok(()));
    }
}
