//! The clock seam. Everything that schedules reads time from a [`Clock`], so tests use a
//! [`ManualClock`] that moves only when the test advances it: retry timing is asserted
//! exactly, without sleeping.

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
