//! The wait before the next attempt (CONTRACT §3), in one of two shapes:
//! - exponential: `base = min(base_delay * 2^(n-1), max_delay)` after n attempts;
//! - an explicit schedule (Svix's list, e.g. `["5s", "5m", "30m", "2h"]`): after n attempts
//!   the base is the n-th delay, and the last one repeats once the list runs out.
//!
//! Either base is then randomised by the [`Jitter`] mode, which is separate from the shape
//! so a route or endpoint can override one without restating the other.
//!
//! Delays have whole-millisecond resolution, like every time courier stores (`now_ms`),
//! so the bounds hold exactly on the values the scheduler uses. Sub-millisecond parts of
//! the configured delays are dropped (config durations are whole milliseconds anyway).

use std::sync::Arc;
use std::time::Duration;

use crate::model::Jitter;

/// The longest schedule accepted: as many retries as a message may have attempts
/// (`Courier-Max-Attempts` allows up to 1000).
pub const MAX_SCHEDULE_LEN: usize = 1000;

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
    /// A schedule with no delay in it.
    #[error("schedule must list at least one delay")]
    EmptySchedule,
    /// A schedule delay below one millisecond (a retry in a tight loop).
    #[error("schedule[{index}] must be at least 1ms")]
    StepTooSmall {
        /// Where in the list.
        index: usize,
    },
    /// More delays than a message can have attempts.
    #[error("schedule lists {len} delays; at most {MAX_SCHEDULE_LEN} are allowed")]
    TooLong {
        /// How many were given.
        len: usize,
    },
}

/// A validated backoff shape. Cheap to clone: a schedule is shared, not copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backoff {
    /// Doubling from `base_ms`, capped at `max_ms`.
    Exponential {
        /// The wait after the first attempt, in millis (at least 1).
        base_ms: u64,
        /// The cap, in millis (at least `base_ms`).
        max_ms: u64,
    },
    /// The n-th delay after n attempts; the last one repeats (each at least 1ms).
    Schedule(Arc<[u64]>),
}

impl Backoff {
    /// An exponential backoff; `base_delay` must be at least 1ms and `max_delay >= base_delay`.
    pub fn exponential(base_delay: Duration, max_delay: Duration) -> Result<Backoff, BackoffError> {
        let base_ms = millis(base_delay);
        let max_ms = millis(max_delay);
        if base_ms == 0 {
            return Err(BackoffError::BaseTooSmall);
        }
        if max_ms < base_ms {
            return Err(BackoffError::MaxBelowBase { base_ms, max_ms });
        }
        Ok(Backoff::Exponential { base_ms, max_ms })
    }

    /// An explicit schedule: one to [`MAX_SCHEDULE_LEN`] delays, each at least 1ms.
    pub fn schedule(delays: &[Duration]) -> Result<Backoff, BackoffError> {
        if delays.is_empty() {
            return Err(BackoffError::EmptySchedule);
        }
        if delays.len() > MAX_SCHEDULE_LEN {
            return Err(BackoffError::TooLong { len: delays.len() });
        }
        let steps: Vec<u64> = delays.iter().map(|d| millis(*d)).collect();
        if let Some(index) = steps.iter().position(|ms| *ms == 0) {
            return Err(BackoffError::StepTooSmall { index });
        }
        Ok(Backoff::Schedule(steps.into()))
    }

    /// The schedule's delays in millis, if this is a schedule.
    pub fn steps(&self) -> Option<&[u64]> {
        match self {
            Backoff::Schedule(steps) => Some(steps),
            Backoff::Exponential { .. } => None,
        }
    }

    /// The un-jittered delay after `attempts_made` attempts. Zero attempts is treated like
    /// one (the first retry waits `base_delay`, or the schedule's first delay).
    #[cfg(test)]
    pub fn base(&self, attempts_made: u32) -> Duration {
        Duration::from_millis(self.base_ms_after(attempts_made))
    }

    /// The delay before the next attempt after `attempts_made` attempts, jittered:
    /// equal → uniform in `[base/2, base]` (lower end rounded up to a whole milli),
    /// full → `[0, base]`, none → `base`.
    pub fn delay(&self, attempts_made: u32, jitter: Jitter, rng: &mut impl rand::Rng) -> Duration {
        let base = self.base_ms_after(attempts_made);
        let ms = match jitter {
            Jitter::None => base,
            Jitter::Full => rng.random_range(0..=base),
            Jitter::Equal => rng.random_range(base - base / 2..=base),
        };
        Duration::from_millis(ms)
    }

    fn base_ms_after(&self, attempts_made: u32) -> u64 {
        let index = attempts_made.saturating_sub(1);
        match self {
            Backoff::Schedule(steps) => {
                // Never empty (checked when built); past its end the last delay repeats.
                let last = steps.len() - 1;
                steps[(index as usize).min(last)]
            }
            Backoff::Exponential { base_ms, max_ms } => {
                // Past 63 doublings any base >= 1ms overflows u64, so the cap has long applied.
                if index >= 64 {
                    return *max_ms;
                }
                base_ms.checked_mul(1u64 << index).map_or(*max_ms, |ms| ms.min(*max_ms))
            }
        }
    }
}

/// `d` in whole millis, saturating.
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const MIN: Duration = Duration::from_secs(60);
    const HOUR: Duration = Duration::from_secs(3600);

    /// An exponential backoff and a jitter mode, as one value (the tests of the shape
    /// and of jitter were written against it before the two were separated).
    #[derive(Debug, PartialEq, Eq)]
    struct Jittered(Backoff, Jitter);

    impl Jittered {
        fn base(&self, n: u32) -> Duration {
            self.0.base(n)
        }
        fn delay(&self, n: u32, rng: &mut impl Rng) -> Duration {
            self.0.delay(n, self.1, rng)
        }
    }

    fn jittered(base: Duration, max: Duration, jitter: Jitter) -> Result<Jittered, BackoffError> {
        Backoff::exponential(base, max).map(|b| Jittered(b, jitter))
    }

    fn backoff(jitter: Jitter) -> Jittered {
        jittered(MIN, HOUR, jitter).unwrap()
    }

    #[test]
    fn construction_is_validated() {
        assert_eq!(
            jittered(Duration::ZERO, HOUR, Jitter::None),
            Err(BackoffError::BaseTooSmall)
        );
        assert_eq!(
            jittered(Duration::from_micros(999), HOUR, Jitter::None),
            Err(BackoffError::BaseTooSmall)
        );
        assert_eq!(
            jittered(HOUR, MIN, Jitter::None),
            Err(BackoffError::MaxBelowBase {
                base_ms: 3_600_000,
                max_ms: 60_000
            })
        );
        assert!(jittered(MIN, MIN, Jitter::None).is_ok());
        assert!(jittered(Duration::from_millis(1), Duration::MAX, Jitter::Full).is_ok());
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
        let b = jittered(Duration::from_millis(1), Duration::MAX, Jitter::None).unwrap();
        assert_eq!(b.base(1), Duration::from_millis(1));
        assert_eq!(b.base(64), Duration::from_millis(1 << 63));
        assert_eq!(b.base(65), Duration::from_millis(u64::MAX));
        assert_eq!(b.base(u32::MAX), Duration::from_millis(u64::MAX));
        let big = jittered(Duration::from_millis(u64::MAX / 2), Duration::MAX, Jitter::Equal).unwrap();
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
        let b = jittered(Duration::from_millis(3), Duration::from_millis(3), Jitter::Equal).unwrap();
        let mut rng = StdRng::seed_from_u64(0);
        for _ in 0..1000 {
            let d = b.delay(1, &mut rng);
            assert!(d >= Duration::from_millis(2) && d <= Duration::from_millis(3), "{d:?}");
        }
    }

    #[test]
    fn jittered_delays_cover_their_range() {
        let b = jittered(Duration::from_millis(10), Duration::from_millis(10), Jitter::Full).unwrap();
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
                let b = jittered(Duration::from_millis(base_ms), Duration::from_millis(max_ms), jitter).unwrap();
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

    fn secs(list: &[u64]) -> Vec<Duration> {
        list.iter().map(|s| Duration::from_secs(*s)).collect()
    }

    /// Svix's default schedule: 5s, 5m, 30m, 2h, 5h, 10h, 10h.
    const SVIX: [u64; 7] = [5, 300, 1800, 7200, 18_000, 36_000, 36_000];

    #[test]
    fn a_schedule_is_validated() {
        assert_eq!(Backoff::schedule(&[]), Err(BackoffError::EmptySchedule));
        assert_eq!(
            Backoff::schedule(&[Duration::from_secs(1), Duration::ZERO]),
            Err(BackoffError::StepTooSmall { index: 1 })
        );
        assert_eq!(
            Backoff::schedule(&[Duration::from_micros(500)]),
            Err(BackoffError::StepTooSmall { index: 0 })
        );
        let long = vec![Duration::from_secs(1); MAX_SCHEDULE_LEN + 1];
        assert_eq!(
            Backoff::schedule(&long),
            Err(BackoffError::TooLong {
                len: MAX_SCHEDULE_LEN + 1
            })
        );
        assert!(Backoff::schedule(&long[1..]).is_ok());
        assert!(Backoff::schedule(&[Duration::from_millis(1)]).is_ok());
        assert_eq!(
            BackoffError::EmptySchedule.to_string(),
            "schedule must list at least one delay"
        );
        assert_eq!(
            BackoffError::StepTooSmall { index: 3 }.to_string(),
            "schedule[3] must be at least 1ms"
        );
    }

    #[test]
    fn a_schedule_gives_the_nth_delay_after_n_attempts_and_repeats_its_last() {
        let b = Backoff::schedule(&secs(&SVIX)).unwrap();
        assert_eq!(b.steps(), Some(&SVIX.map(|s| s * 1000)[..]));
        let table = [
            (0, 5),
            (1, 5),
            (2, 300),
            (3, 1800),
            (4, 7200),
            (5, 18_000),
            (6, 36_000),
            (7, 36_000),
            (8, 36_000),
            (1000, 36_000),
            (u32::MAX, 36_000),
        ];
        for (n, want) in table {
            assert_eq!(b.base(n), Duration::from_secs(want), "n = {n}");
            let mut rng = StdRng::seed_from_u64(1);
            assert_eq!(b.delay(n, Jitter::None, &mut rng), Duration::from_secs(want), "n = {n}");
        }
        let one = Backoff::schedule(&secs(&[7])).unwrap();
        for n in [0, 1, 2, 50] {
            assert_eq!(one.base(n), Duration::from_secs(7));
        }
        assert_eq!(Backoff::exponential(MIN, HOUR).unwrap().steps(), None);
    }

    #[test]
    fn jitter_applies_to_a_schedule_as_to_the_exponential_shape() {
        let b = Backoff::schedule(&secs(&[10, 20])).unwrap();
        let mut rng = StdRng::seed_from_u64(42);
        let equal: Vec<u64> = (1..=3)
            .map(|n| b.delay(n, Jitter::Equal, &mut rng).as_millis() as u64)
            .collect();
        assert_eq!(equal, SCHEDULE_EQUAL_SEED_42);
        for (n, ms) in (1..=3).zip(&equal) {
            let base = b.base(n).as_millis() as u64;
            assert!(*ms >= base / 2 && *ms <= base, "n = {n}: {ms}");
        }
        let mut rng = StdRng::seed_from_u64(42);
        let full: Vec<u64> = (1..=3)
            .map(|n| b.delay(n, Jitter::Full, &mut rng).as_millis() as u64)
            .collect();
        assert_eq!(full, SCHEDULE_FULL_SEED_42);
        for (n, ms) in (1..=3).zip(&full) {
            assert!(*ms <= b.base(n).as_millis() as u64, "n = {n}: {ms}");
        }
    }

    const SCHEDULE_EQUAL_SEED_42: [u64; 3] = [7633, 15427, 16365];
    const SCHEDULE_FULL_SEED_42: [u64; 3] = [5266, 10855, 12729];

    #[test]
    fn property_schedule_delays_stay_in_bounds() {
        let mut meta = StdRng::seed_from_u64(0x5C4ED);
        for _ in 0..5_000 {
            let len = meta.random_range(1..=20usize);
            let steps: Vec<Duration> = (0..len)
                .map(|_| Duration::from_millis(meta.random_range(1..=86_400_000u64)))
                .collect();
            let b = Backoff::schedule(&steps).unwrap();
            let n = meta.random_range(0..=40u32);
            let want = steps[(n.saturating_sub(1) as usize).min(len - 1)];
            assert_eq!(b.base(n), want, "n = {n}");
            let seed = meta.random::<u64>();
            for jitter in [Jitter::Equal, Jitter::Full, Jitter::None] {
                let d = b.delay(n, jitter, &mut StdRng::seed_from_u64(seed));
                let lower = match jitter {
                    Jitter::Equal => want / 2,
                    Jitter::Full => Duration::ZERO,
                    Jitter::None => want,
                };
                assert!(d >= lower && d <= want, "{jitter:?} n = {n}: {d:?}");
            }
        }
    }
}
