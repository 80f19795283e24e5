//! The clock and randomness seams. Everything that schedules reads time from a [`Clock`],
//! so tests use a [`ManualClock`] that moves only when the test advances it: retry timing
//! is asserted exactly, without sleeping.
//!
//! Courier's time is not the wall clock itself but a [`Steady`] reading of it: it never
//! goes back and never stands still when the wall clock is stepped back (an NTP step), and
//! jumps with it when it is stepped forward (a VM resumed after a day). What leaves the
//! machine as a time (a signature's timestamp) or arrives as one (a `Retry-After` date)
//! uses [`Clock::wall_ms`]. A duration is measured with a [`Stopwatch`], and
//! randomness nobody replays (ids, jitter of courier's own retries, file names) comes from
//! [`rng`]; what a test or the simulator must replay takes a seeded RNG instead.
//!
//! These are the only places production code reads the wall clock, the monotonic clock
//! or the thread RNG: `clippy.toml` disallows `SystemTime::now`, `Instant::now`,
//! `rand::rng` and `rand::random` elsewhere, and a unit test below checks the same on every
//! build of the suite.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A boxed future, as returned by [`Clock::sleep_until`].
pub type Sleep<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Courier's time in unix milliseconds, and sleeping until a given time.
pub trait Clock: Send + Sync + 'static {
    /// Now, in unix milliseconds: what every schedule and stored time is in.
    fn now_ms(&self) -> u64;
    /// Completes once `now_ms() >= at_ms`.
    fn sleep_until(&self, at_ms: u64) -> Sleep<'_>;
    /// The wall clock itself, for times other machines read or write: a signature's
    /// timestamp, a `Retry-After` date, a certificate's validity.
    fn wall_ms(&self) -> u64 {
        self.now_ms()
    }
    /// From here on [`Clock::now_ms`] reads at least `ms`: the newest time the store
    /// holds, so a restart while the wall clock is behind it does not set courier's time
    /// back (and stall every retry scheduled before the restart).
    fn hold_at_least(&self, _ms: u64) {}
}

/// A shared clock.
pub type SharedClock = Arc<dyn Clock>;

/// The real wall clock, read as it is (certificates' times; tools that schedule nothing).
/// Courier itself runs on a [`SteadyClock`].
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // The seam.
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    fn sleep_until(&self, at_ms: u64) -> Sleep<'_> {
        Box::pin(async move {
            // Re-check after waking: the wall clock may have been stepped while we slept.
            loop {
                let now = self.now_ms();
                if now >= at_ms {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(at_ms - now)).await;
            }
        })
    }
}

/// Courier's time from two readings, the wall clock and a monotonic one: pure, so every
/// step of the wall clock is tested without one.
///
/// - It follows the wall clock while the wall clock moves forward, and jumps with it when
///   it steps forward (a VM resumed, a clock corrected forward): what fell due meanwhile is
///   due, and is released under the same caps and rate limits as any backlog.
/// - When the wall clock steps back, courier's time does not: it goes on from where it was,
///   at half the monotonic rate, until the wall clock catches up (a step back of an hour
///   is absorbed in two). Retries are not stalled for the step's length; while it is
///   absorbed, every wait takes up to twice as long, never less.
#[derive(Debug, Clone, Copy, Default)]
pub struct Steady {
    anchor: Option<Anchor>,
}

/// The last reading courier's time is counted from.
#[derive(Debug, Clone, Copy)]
struct Anchor {
    courier: u64,
    mono: u64,
    /// Courier's time is ahead of the wall clock (it stepped back): half speed.
    ahead: bool,
}

impl Steady {
    /// Courier's time, given the wall clock and the monotonic clock now (milliseconds).
    pub fn read(&mut self, wall: u64, mono: u64) -> u64 {
        let counted = self.anchor.map(|a| {
            let passed = mono.saturating_sub(a.mono);
            a.courier + if a.ahead { passed / 2 } else { passed }
        });
        match counted {
            Some(now) if now > wall => {
                // Anchored once when falling behind, so half speed loses no fractions.
                if !self.anchor.is_some_and(|a| a.ahead) {
                    self.anchor = Some(Anchor {
                        courier: now,
                        mono,
                        ahead: true,
                    });
                }
                now
            }
            _ => {
                self.anchor = Some(Anchor {
                    courier: wall,
                    mono,
                    ahead: false,
                });
                wall
            }
        }
    }

    /// From here on, reads at least `floor` (see [`Clock::hold_at_least`]).
    pub fn hold_at_least(&mut self, floor: u64, wall: u64, mono: u64) {
        if self.read(wall, mono) < floor {
            self.anchor = Some(Anchor {
                courier: floor,
                mono,
                ahead: floor > wall,
            });
        }
    }
}

/// The clock courier runs on: a [`Steady`] reading of the system's wall and monotonic
/// clocks.
#[derive(Debug)]
pub struct SteadyClock {
    steady: std::sync::Mutex<Steady>,
    started: std::time::Instant,
}

impl SteadyClock {
    /// A clock reading the wall clock now.
    #[allow(clippy::disallowed_methods)] // The seam.
    pub fn new() -> SteadyClock {
        SteadyClock {
            steady: Default::default(),
            started: std::time::Instant::now(),
        }
    }

    fn mono_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn steady(&self) -> std::sync::MutexGuard<'_, Steady> {
        self.steady.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Default for SteadyClock {
    fn default() -> Self {
        SteadyClock::new()
    }
}

/// The longest [`SteadyClock`] sleeps without reading the clock again: tokio's timers run
/// on the monotonic clock, which a wall-clock step forward (or a suspended VM) does not
/// move, so what fell due with such a step is seen within this.
pub const STEP_NOTICED_WITHIN: Duration = Duration::from_secs(5);

impl Clock for SteadyClock {
    fn now_ms(&self) -> u64 {
        // Both clocks read under the lock: a reading taken before another thread's must
        // not be applied after it (courier's time would go back by the difference).
        let mut steady = self.steady();
        steady.read(SystemClock.now_ms(), self.mono_ms())
    }

    fn sleep_until(&self, at_ms: u64) -> Sleep<'_> {
        Box::pin(async move {
            // Re-checked after waking: the wall clock may have stepped forward, and while a
            // step back is absorbed courier's time moves at half speed.
            loop {
                let now = self.now_ms();
                if now >= at_ms {
                    return;
                }
                let left = Duration::from_millis(at_ms - now);
                tokio::time::sleep(left.min(STEP_NOTICED_WITHIN)).await;
            }
        })
    }

    fn wall_ms(&self) -> u64 {
        SystemClock.now_ms()
    }

    fn hold_at_least(&self, ms: u64) {
        let mut steady = self.steady();
        steady.hold_at_least(ms, SystemClock.now_ms(), self.mono_ms());
    }
}

/// Measures how long something real took (a request's round trip), on the monotonic
/// clock: a duration reported, never a time anything is scheduled at.
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch(std::time::Instant);

impl Stopwatch {
    /// Starts measuring.
    #[allow(clippy::disallowed_methods)] // The seam.
    pub fn start() -> Stopwatch {
        Stopwatch(std::time::Instant::now())
    }

    /// How long since [`Stopwatch::start`].
    pub fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
}

/// The thread's RNG, seeded by the OS: for randomness no test replays.
#[allow(clippy::disallowed_methods)] // The seam.
pub fn rng() -> rand::rngs::ThreadRng {
    rand::rng()
}

#[cfg(test)]
pub use manual::ManualClock;

/// Tests: a clock whose time only a test moves.
#[cfg(test)]
mod manual {
    use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::Notify;

    use super::{Clock, Sleep, Steady};

    /// A clock for tests: time stands still until [`ManualClock::advance`] or
    /// [`ManualClock::set`] moves it, which wakes every sleeper that is now due. Its wall clock
    /// can be stepped ([`ManualClock::step_wall`]); [`Clock::now_ms`] is then the [`Steady`]
    /// reading of it, as courier's own clock would give.
    #[derive(Debug)]
    pub struct ManualClock {
        /// The monotonic time: what tests advance.
        now: AtomicU64,
        /// How far the wall clock was stepped from it.
        wall_offset: AtomicI64,
        steady: std::sync::Mutex<Steady>,
        moved: Notify,
    }

    impl ManualClock {
        /// A clock reading `start_ms`.
        pub fn new(start_ms: u64) -> Arc<Self> {
            Arc::new(ManualClock {
                now: AtomicU64::new(start_ms),
                wall_offset: AtomicI64::new(0),
                steady: Default::default(),
                moved: Notify::new(),
            })
        }

        /// Moves time forward by `by`.
        pub fn advance(&self, by: Duration) {
            self.now.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
            self.moved.notify_waiters();
        }

        /// Sets the monotonic time, forward only (the wall clock steps with
        /// [`ManualClock::step_wall`]).
        pub fn set(&self, ms: u64) {
            debug_assert!(ms >= self.mono_ms(), "a manual clock's monotonic time never goes back");
            self.now.fetch_max(ms, Ordering::SeqCst);
            self.moved.notify_waiters();
        }

        /// Moves time forward until [`Clock::now_ms`] reads at least `ms` (while a step back is
        /// absorbed, that takes twice as long).
        pub fn advance_to(&self, ms: u64) {
            loop {
                let now = self.now_ms();
                if now >= ms {
                    return;
                }
                self.advance(Duration::from_millis(ms - now));
            }
        }

        /// Steps the wall clock by `by_ms` (back when negative), as NTP or a resumed VM does.
        pub fn step_wall(&self, by_ms: i64) {
            self.wall_offset.fetch_add(by_ms, Ordering::SeqCst);
            self.moved.notify_waiters();
        }

        /// Forgets courier's reading of the clock, as a restarted process does.
        pub fn restart(&self) {
            *self.steady() = Steady::default();
        }

        fn steady(&self) -> std::sync::MutexGuard<'_, Steady> {
            self.steady.lock().unwrap_or_else(|p| p.into_inner())
        }

        fn mono_ms(&self) -> u64 {
            self.now.load(Ordering::SeqCst)
        }
    }

    impl Clock for ManualClock {
        fn now_ms(&self) -> u64 {
            let mut steady = self.steady();
            steady.read(self.wall_ms(), self.mono_ms())
        }

        fn sleep_until(&self, at_ms: u64) -> Sleep<'_> {
            Box::pin(async move {
                loop {
                    // Register interest before reading the time so an advance in between is not missed.
                    let moved = self.moved.notified();
                    if self.now_ms() >= at_ms {
                        return;
                    }
                    moved.await;
                }
            })
        }

        fn wall_ms(&self) -> u64 {
            self.mono_ms()
                .saturating_add_signed(self.wall_offset.load(Ordering::SeqCst))
        }

        fn hold_at_least(&self, ms: u64) {
            let mut steady = self.steady();
            steady.hold_at_least(ms, self.wall_ms(), self.mono_ms());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `clippy.toml` disallows, checked on every run of the suite (the suite does
    /// not run clippy: that would build RocksDB a second time). Production files only:
    /// test code measures real time freely.
    #[test]
    fn only_the_seams_read_the_clock_or_the_thread_rng() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut found = Vec::new();
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                if path.is_dir() {
                    if !matches!(name.as_str(), "tests" | "sim") {
                        dirs.push(path);
                    }
                    continue;
                }
                let test_file = name == "tests.rs" || name.starts_with("tests_") || name.ends_with("_tests.rs");
                if !name.ends_with(".rs") || test_file || path == root.join("clock.rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                // A file's unit tests sit at its end, behind `#[cfg(test)] mod`.
                let production = text.split("#[cfg(test)]\nmod ").next().unwrap_or_default();
                for (n, line) in production.lines().enumerate() {
                    let std_instant = line.contains("Instant::now") && !line.contains("tokio::time::Instant::now");
                    let banned = ["SystemTime::now", "rand::rng(", "rand::random", "thread_rng"];
                    if std_instant || banned.iter().any(|b| line.contains(b)) {
                        found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
        assert!(found.is_empty(), "use the seams in src/clock.rs:\n{}", found.join("\n"));
    }

    #[test]
    fn steady_time_follows_a_wall_clock_that_only_moves_forward() {
        let mut s = Steady::default();
        for (wall, mono) in [(1_000, 5), (1_000, 5), (1_001, 6), (1_501, 506), (90_000, 506)] {
            assert_eq!(s.read(wall, mono), wall, "a forward step is taken whole");
        }
    }

    #[test]
    fn a_step_back_is_absorbed_at_half_speed_never_by_standing_still() {
        let mut s = Steady::default();
        assert_eq!(s.read(10_000_000, 0), 10_000_000);
        // The wall clock steps back an hour.
        let back = 3_600_000;
        let wall = |mono: u64| 10_000_000 - back + mono;
        assert_eq!(s.read(wall(0), 0), 10_000_000, "never back");
        assert_eq!(s.read(wall(1), 1), 10_000_000, "half of a millisecond");
        assert_eq!(s.read(wall(2), 2), 10_000_001);
        assert_eq!(s.read(wall(3), 3), 10_000_001, "no fraction lost to frequent reads");
        assert_eq!(
            s.read(wall(10_000), 10_000),
            10_005_000,
            "a 10 s wait takes 20 s, not an hour"
        );
        // Caught up after twice the step, and then it is the wall clock again.
        assert_eq!(s.read(wall(2 * back), 2 * back), wall(2 * back));
        assert_eq!(s.read(wall(2 * back + 7), 2 * back + 7), wall(2 * back + 7));
    }

    #[test]
    fn a_held_time_is_never_read_below_and_catches_up_like_a_step_back() {
        let mut s = Steady::default();
        s.hold_at_least(5_000, 1_000, 0);
        assert_eq!(s.read(1_000, 0), 5_000);
        assert_eq!(s.read(1_100, 100), 5_050);
        s.hold_at_least(10, 1_100, 100);
        assert_eq!(s.read(1_100, 100), 5_050, "a lower floor changes nothing");
        let mut fresh = Steady::default();
        fresh.hold_at_least(10, 1_000, 0);
        assert_eq!(fresh.read(1_000, 0), 1_000);
    }

    /// Seeded runs of forward moves and wall steps both ways: courier's time never goes
    /// back, is never behind the wall clock, moves at least half as fast as the monotonic
    /// clock, and is never further ahead than the steps back added up.
    #[test]
    fn steady_time_holds_its_invariants_under_random_steps() {
        use rand::{Rng, SeedableRng};
        for seed in 0..200u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let (mut s, mut mono, mut wall, mut backs) = (Steady::default(), 0u64, 1u64 << 40, 0u64);
            let mut last = s.read(wall, mono);
            for _ in 0..500 {
                let passed = rng.random_range(0..100_000);
                mono += passed;
                wall += passed;
                match rng.random_range(0..10) {
                    0 => {
                        let by = rng.random_range(0..86_400_000);
                        wall -= by;
                        backs += by;
                    }
                    1 => wall += rng.random_range(0..86_400_000),
                    _ => {}
                }
                let now = s.read(wall, mono);
                assert!(now >= last, "seed {seed}: back from {last} to {now}");
                assert!(now >= wall, "seed {seed}: behind the wall clock");
                assert!(now + 1 >= last + passed / 2, "seed {seed}: slower than half speed");
                assert!(now - wall <= backs, "seed {seed}: ahead by more than the steps back");
                last = now;
            }
        }
    }

    #[tokio::test]
    async fn a_manual_clock_stepped_back_goes_on_and_its_wall_clock_steps() {
        let clock = ManualClock::new(1_000_000);
        assert_eq!(clock.now_ms(), 1_000_000);
        clock.step_wall(-600_000);
        assert_eq!((clock.now_ms(), clock.wall_ms()), (1_000_000, 400_000));
        clock.advance_to(1_000_010);
        assert_eq!(clock.now_ms(), 1_000_010);
        assert_eq!(clock.wall_ms(), 400_020, "ten milliseconds took twenty");
        clock.restart();
        assert_eq!(clock.now_ms(), 400_020, "a restarted process reads the wall clock");
        clock.hold_at_least(1_000_010);
        assert_eq!(clock.now_ms(), 1_000_010);
        clock.step_wall(86_400_000);
        assert_eq!(clock.now_ms(), clock.wall_ms(), "a step forward is taken whole");
    }

    #[tokio::test]
    async fn manual_sleepers_wake_only_when_time_reaches_them() {
        let clock = ManualClock::new(1_000);
        let c2 = clock.clone();
        let sleeper = tokio::spawn(async move { c2.sleep_until(1_500).await });
        tokio::task::yield_now().await;
        clock.advance(Duration::from_millis(499));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished());
        clock.advance(Duration::from_millis(1));
        tokio::time::timeout(Duration::from_secs(5), sleeper)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(clock.now_ms(), 1_500);
    }

    #[tokio::test]
    async fn the_steady_clock_sleeps_until_a_time() {
        let clock = SteadyClock::new();
        let start = clock.now_ms();
        clock.sleep_until(start + 20).await;
        assert!(clock.now_ms() >= start + 20);
        clock.sleep_until(0).await;
    }
}
