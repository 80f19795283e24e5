//! The pool's sweep timer, which the connection cap can fire early.
//!
//! hyper-util's pool keeps an entry for every idle connection, with the request channel
//! hyper made for it (16–18 KiB of channel blocks), until its sweep finds the connection
//! closed or expired. The sweep runs only when its timer fires, every
//! `idle_connection_timeout` (90 s by default), and hyper-util has no call to run it
//! sooner. So after the cap's linger timer closed the connections of a sweep over 1,000
//! hosts, their entries (18 MiB in a heap profile) outlived the sockets by up to 90 s,
//! and the heap trim that followed could return none of it. [`SweepTimer`] is the timer
//! given to the pool: its sleeps end at their deadline as tokio's do, or as soon as
//! [`Sweep::now`] is called, which makes every pool sweep at once. Sweeping early changes
//! nothing else: the pool evicts only entries that are closed or idle for longer than the
//! timeout, and sets its next sleep as it always does.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::rt::{Sleep, Timer};
use hyper_util::rt::TokioTimer;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

/// Fires the sweeps of every pool whose timer it made.
#[derive(Clone, Default)]
pub struct Sweep(Arc<Notify>);

impl Sweep {
    /// Ends every sleep of this sweep's timers now: each pool sweeps its idle list.
    pub fn now(&self) {
        self.0.notify_waiters();
    }

    /// A timer for a pool, whose sleeps [`Sweep::now`] ends early.
    pub fn timer(&self) -> SweepTimer {
        SweepTimer(self.0.clone())
    }
}

/// tokio's timer, with sleeps that a [`Sweep`] can end early.
#[derive(Clone)]
pub struct SweepTimer(Arc<Notify>);

impl Timer for SweepTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        self.sleep_until(self.now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        Box::pin(EarlySleep {
            // Created, hence registered, before the sleep is first polled: a `now` in between
            // still ends it.
            kick: Box::pin(self.0.clone().notified_owned()),
            sleep: TokioTimer::new().sleep_until(deadline),
        })
    }

    fn now(&self) -> Instant {
        TokioTimer::new().now()
    }
}

/// A sleep that ends at its deadline or at the next [`Sweep::now`].
struct EarlySleep {
    kick: Pin<Box<OwnedNotified>>,
    sleep: Pin<Box<dyn Sleep>>,
}

impl Future for EarlySleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.kick.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        self.sleep.as_mut().poll(cx)
    }
}

impl Sleep for EarlySleep {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Far longer than any wait below: a sleep that ran to it would fail the timeout.
    const LONG: Duration = Duration::from_secs(3600);

    async fn ended<F: Future>(f: F) -> bool {
        tokio::time::timeout(Duration::from_secs(10), f).await.is_ok()
    }

    #[tokio::test]
    async fn a_sleep_ends_at_its_deadline_or_at_the_sweep_whichever_is_first() {
        let sweep = Sweep::default();
        let timer = sweep.timer();
        let start = timer.now();
        timer.sleep(Duration::from_millis(50)).await;
        assert!(
            timer.now() - start >= Duration::from_millis(50),
            "no sweep: the whole sleep"
        );

        // Made before the sweep and polled only after it: still ended by it, as is another
        // timer's of the same sweep.
        let long = timer.sleep(LONG);
        let other = sweep.timer().sleep_until(timer.now() + LONG);
        sweep.now();
        assert!(ended(long).await && ended(other).await, "both ended at the sweep");

        // A sleep made after the sweep waits for its own deadline (or the next sweep).
        let after = tokio::time::timeout(Duration::from_millis(100), timer.sleep(LONG)).await;
        assert!(after.is_err(), "an earlier sweep does not end a later sleep");
        // A sweep of another `Sweep` ends nothing of this one's.
        let mine = timer.sleep(LONG);
        Sweep::default().now();
        assert!(tokio::time::timeout(Duration::from_millis(100), mine).await.is_err());
    }
}
