//! The clock and randomness seams. Everything that schedules reads time from a [`Clock`],
//! so tests use a [`ManualClock`] that moves only when the test advances it: retry timing
//! is asserted exactly, without sleeping. A duration is measured with a [`Stopwatch`], and
//! randomness nobody replays (ids, jitter of courier's own retries, file names) comes from
//! [`rng`]; what a test or the simulator must replay takes a seeded RNG instead.
//!
//! These are the only places production code reads the wall clock, the monotonic clock
//! or the thread RNG: `clippy.toml` disallows `SystemTime::now`, `Instant::now`,
//! `rand::rng` and `rand::random` elsewhere, and a unit test below checks the same on every
//! build of the suite.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;

/// A boxed future, as returned by [`Clock::sleep_until`].
pub type Sleep<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Wall-clock time in unix milliseconds, and sleeping until a given time.
pub trait Clock: Send + Sync + 'static {
    /// Now, in unix milliseconds.
    fn now_ms(&self) -> u64;
    /// Completes once `now_ms() >= at_ms`.
    fn sleep_until(&self, at_ms: u64) -> Sleep<'_>;
}

/// A shared clock.
pub type SharedClock = Arc<dyn Clock>;

/// The real clock.
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

/// A clock for tests: time stands still until [`ManualClock::advance`] or
/// [`ManualClock::set`] moves it, which wakes every sleeper that is now due.
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicU64,
    moved: Notify,
}

impl ManualClock {
    /// A clock reading `start_ms`.
    pub fn new(start_ms: u64) -> Arc<Self> {
        Arc::new(ManualClock {
            now: AtomicU64::new(start_ms),
            moved: Notify::new(),
        })
    }

    /// Moves time forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
        self.moved.notify_waiters();
    }

    /// Sets the time (it may go backwards, as a stepped wall clock can).
    pub fn set(&self, ms: u64) {
        self.now.store(ms, Ordering::SeqCst);
        self.moved.notify_waiters();
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
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
    async fn system_clock_sleeps_until_a_time() {
        let clock = SystemClock;
        let start = clock.now_ms();
        clock.sleep_until(start + 20).await;
        assert!(clock.now_ms() >= start + 20);
        clock.sleep_until(0).await;
    }
}
