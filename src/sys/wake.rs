//! The scheduler's wake-up: rung by whatever may have made work for it (an accept that
//! went to the queue, a freed permit, a resume, a lease released elsewhere in the fleet),
//! waited on by its loop alone.

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

/// The scheduler's wake-up (see the module doc). Rings while the loop works are kept for
/// its next wait, as one.
#[derive(Debug, Default)]
pub struct Wake {
    notify: Notify,
    /// Tests: rings so far, which tell a sleeping loop with a ring pending from a settled
    /// one (see `scheduler::Nap`).
    #[cfg(test)]
    rung: std::sync::atomic::AtomicU64,
}

impl Wake {
    /// Wakes the loop, now or at its next wait.
    pub fn ring(&self) {
        self.notify.notify_one();
        // After the notify: a loop whose wait began before this count is woken by it.
        #[cfg(test)]
        self.rung.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// What the loop waits on.
    pub fn notified(&self) -> Notified<'_> {
        self.notify.notified()
    }

    /// Tests: rings so far.
    #[cfg(test)]
    pub(crate) fn rung(&self) -> u64 {
        self.rung.load(std::sync::atomic::Ordering::SeqCst)
    }
}
