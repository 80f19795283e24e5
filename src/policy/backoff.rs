//! Exponential backoff with jitter (CONTRACT §3): `base = min(base_delay * 2^(n-1), max_delay)`
//! after n attempts, then randomised by the configured [`Jitter`] mode.
//!
//! Delays have whole-millisecond resolution, like every time courier stores (`now_ms`),
//! so the bounds hold exactly on the values the scheduler uses. Sub-millisecond parts of
//! the configured delays are dropped (config durations are whole milliseconds anyway).

use std::time::Duration;

use crate::model::Jitter;

/// A backoff configuration that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackoffError {
    /// `base_delay` is below one millisecond, which would retry in a tight loop.
    #[error("base_delay must be at least 1ms")]
    BaseTooSmall,
    /// `max_delay` is shorter than `base_delay`.
    #[error("max_delay ({max_ms}ms) must not be shorter than base_delay ({base_ms}ms)")]
    MaxBelowBase {
        /// The configured base delay, in millis.
        base_ms: u64,
        /// The configured maximum delay, in millis.
        max_ms: u64,
    },
}

/// A validated backoff: exponential growth from `base_delay`, capped at `max_delay`, with jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base_ms: u64,
    max_ms: u64,
    jitter: Jitter,
}

impl Backoff {
    /// Builds a backoff; `base_delay` must be at least 1ms and `max_delay >= base_delay`.
    pub fn new(base_delay: Duration, max_delay: Duration, jitter: Jitter) -> Result<Backoff, BackoffError> {
        let base_ms = millis(base_delay);
        let max_ms = millis(max_delay);
        if base_ms == 0 {
            return Err(BackoffError::BaseTooSmall);
        }
        if max_ms < base_ms {
            return Err(BackoffError::MaxBelowBase { base_ms, max_ms });
        }
        Ok(Backoff {
            base_ms,
            max_ms,
            jitter,
        })
    }

    /// The jitter mode.
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The un-jittered delay after `attempts_made` attempts: `min(base_delay * 2^(n-1), max_delay)`.
    /// Zero attempts is treated like one (the first retry waits `base_delay`).
    pub fn base(&self, attempts_made: u32) -> Duration {
        Duration::from_millis(self.base_ms_after(attempts_made))
    }

    /// The delay before the next attempt after `attempts_made` attempts, jittered:
    /// equal → uniform in `[base/2, base]` (lower end rounded up to a whole milli),
    /// full → `[0, base]`, none → `base`.
    pub fn delay(&self, attempts_made: u32, rng: &mut impl rand::Rng) -> Duration {
        let base = self.base_ms_after(attempts_made);
        let ms = match self.jitter {
            Jitter::None => base,
            Jitter::Full => rng.random_range(0..=base),
            Jitter::Equal => rng.random_range(base - base / 2..=base),
        };
        Duration::from_millis(ms)
    }

    fn base_ms_after(&self, attempts_made: u32) -> u64 {
        let exponent = attempts_made.saturating_sub(1);
        // Past 63 doublings any base >= 1ms overflows u64, so the cap has long applied.
        if exponent >= 64 {
            return self.max_ms;
        }
        self.base_ms
            .checked_mul(1u64 << exponent)
            .map_or(self.max_ms, |ms| ms.min(self.max_ms))
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const MIN: Duration = Duration::from_secs(60);
    const HOUR: Duration = Duration::from_secs(3600);

    fn backoff(jitter: Jitter) -> Backoff {
        Backoff::new(MIN, HOUR, jitter).unwrap()
    }

    #[test]
    fn construction_is_validated() {
        assert_eq!(
            Backoff::new(Duration::ZERO, HOUR, Jitter::None),
            Err(BackoffError::BaseTooSmall)
        );
        assert_eq!(
            Backoff::new(Duration::from_micros(999), HOUR, Jitter::None),
            Err(BackoffError::BaseTooSmall)
        );
        assert_eq!(
            Backoff::new(HOUR, MIN, Jitter::None),
            Err(BackoffError::MaxBelowBase {
                base_ms: 3_600_000,
                max_ms: 60_000
            })
        );
        assert!(Backoff::new(MIN, MIN, Jitter::None).is_ok());
        assert!(Backoff::new(Duration::from_millis(1), Duration::MAX, Jitter::Full).is_ok());
        assert_eq!(
            BackoffError::BaseTooSmall.to_string(),
            "base_delay must be at least 1ms"
        );
    }

    #[test]
    fn base_doubles_from_base_delay_up_to_max_delay() {
        let b = backoff(Jitter::None);
        let table = [
            (0, 60),
            (1, 60),
            (2, 120),
            (3, 240),
            (4, 480),
            (5, 960),
            (6, 1920),
            (7, 3600),
            (8, 3600),
            (16, 3600),
            (64, 3600),
            (65, 3600),
            (u32::MAX, 3600),
        ];
        for (n, secs) in table {
            assert_eq!(b.base(n), Duration::from_secs(secs), "n = {n}");
        }
    }

    #[test]
    fn base_never_overflows_with_huge_limits() {
        let b = Backoff::new(Duration::from_millis(1), Duration::MAX, Jitter::None).unwrap();
        assert_eq!(b.base(1), Duration::from_millis(1));
        assert_eq!(b.base(64), Duration::from_millis(1 << 63));
        assert_eq!(b.base(65), Duration::from_millis(u64::MAX));
        assert_eq!(b.base(u32::MAX), Duration::from_millis(u64::MAX));
        let big = Backoff::new(Duration::from_millis(u64::MAX / 2), Duration::MAX, Jitter::Equal).unwrap();
        assert_eq!(big.base(3), Duration::from_millis(u64::MAX));
        let mut rng = StdRng::seed_from_u64(3);
        assert!(big.delay(u32::MAX, &mut rng) >= Duration::from_millis(u64::MAX / 2));
    }

    #[test]
    fn no_jitter_is_exactly_base() {
        let b = backoff(Jitter::None);
        let mut rng = StdRng::seed_from_u64(42);
        for n in [1, 2, 3, 7, 100] {
            assert_eq!(b.delay(n, &mut rng), b.base(n));
        }
    }

    #[test]
    fn equal_jitter_exact_values_for_a_fixed_seed() {
        let b = backoff(Jitter::Equal);
        let mut rng = StdRng::seed_from_u64(42);
        let got: Vec<u64> = (1..=8).map(|n| b.delay(n, &mut rng).as_millis() as u64).collect();
        assert_eq!(got, EQUAL_SEED_42);
        for (n, ms) in (1..=8).zip(got) {
            let base = b.base(n).as_millis() as u64;
            assert!(
                ms >= base / 2 && ms <= base,
                "n = {n}: {ms} not in [{}, {base}]",
                base / 2
            );
        }
    }

    #[test]
    fn full_jitter_exact_values_for_a_fixed_seed() {
        let b = backoff(Jitter::Full);
        let mut rng = StdRng::seed_from_u64(42);
        let got: Vec<u64> = (1..=8).map(|n| b.delay(n, &mut rng).as_millis() as u64).collect();
        assert_eq!(got, FULL_SEED_42);
        for (n, ms) in (1..=8).zip(got) {
            assert!(ms <= b.base(n).as_millis() as u64, "n = {n}");
        }
    }

    const EQUAL_SEED_42: [u64; 8] = [
        45_797, 92_564, 196_376, 337_416, 496_484, 1_358_358, 3_127_364, 3_328_653,
    ];
    const FULL_SEED_42: [u64; 8] = [31_593, 65_127, 152_752, 194_833, 32_969, 796_717, 2_654_728, 3_057_306];

    #[test]
    fn equal_jitter_rounds_the_lower_bound_up() {
        // base 3ms: base/2 = 1.5ms, so the smallest whole-milli delay allowed is 2ms.
        let b = Backoff::new(Duration::from_millis(3), Duration::from_millis(3), Jitter::Equal).unwrap();
        let mut rng = StdRng::seed_from_u64(0);
        for _ in 0..1000 {
            let d = b.delay(1, &mut rng);
            assert!(d >= Duration::from_millis(2) && d <= Duration::from_millis(3), "{d:?}");
        }
    }

    #[test]
    fn jittered_delays_cover_their_range() {
        let b = Backoff::new(Duration::from_millis(10), Duration::from_millis(10), Jitter::Full).unwrap();
        let mut rng = StdRng::seed_from_u64(9);
        let mut seen = [false; 11];
        for _ in 0..2000 {
            seen[b.delay(1, &mut rng).as_millis() as usize] = true;
        }
        assert!(seen.iter().all(|s| *s), "{seen:?}");
    }

    #[test]
    fn property_delays_stay_in_bounds_and_base_is_monotone() {
        let mut meta = StdRng::seed_from_u64(0xC0FFEE);
        for _ in 0..10_000 {
            let base_ms = meta.random_range(1..=120_000u64);
            let max_ms = base_ms.saturating_mul(meta.random_range(1..=1_000u64));
            let n = if meta.random_bool(0.1) {
                meta.random::<u32>()
            } else {
                meta.random_range(0..=80u32)
            };
            let seed = meta.random::<u64>();
            for jitter in [Jitter::Equal, Jitter::Full, Jitter::None] {
                let b = Backoff::new(Duration::from_millis(base_ms), Duration::from_millis(max_ms), jitter).unwrap();
                let base = b.base(n);
                assert!(base >= Duration::from_millis(base_ms) && base <= Duration::from_millis(max_ms));
                assert!(b.base(n.saturating_add(1)) >= base, "base not monotone at n = {n}");
                assert!(n == 0 || b.base(n - 1) <= base, "base not monotone at n = {n}");
                let d = b.delay(n, &mut StdRng::seed_from_u64(seed));
                let lower = match jitter {
                    Jitter::Equal => base / 2,
                    Jitter::Full => Duration::ZERO,
                    Jitter::None => base,
                };
                assert!(
                    d >= lower && d <= base,
                    "{jitter:?} n = {n}: {d:?} not in [{lower:?}, {base:?}]"
                );
            }
        }
    }
}
