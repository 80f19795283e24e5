//! Putting messages back in the queue after courier's own failure (a panic, a cut-off, a
//! result that could not be written) and at startup, without an attempt counted.
//!
//! A message leased by the scheduler has its due entry still on disk: a release that fails
//! ends the lease anyway (see `Store::release`) and the scheduler meets the message again
//! where it was. A message written in flight at accept, or left in flight by a crash, has
//! no due entry: nothing but its release puts it back. When that release fails because its
//! record does not read, it is tried again in the background, 1 s doubling to 5 min (scaled
//! by the result retry wait), until it reads or courier stops, so that a record that heals
//! is delivered without a restart. An attempt's result whose record does not read waits so
//! too (`record_later`): the message stays leased, so it is not sent again, and the
//! attempt's permits are free. Bounded: at most [`WAITING_TO_READ_MAX`] wait at once; past that,
//! a release is left to the next start, and a result's attempt is given up (the message is
//! sent again once it reads).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::lifecycle::StreakNote;
use super::{Deliverer, STORE_TRIES};
use crate::store::{FinishedAttempt, StoreError};

/// Most releases and result writes waiting in the background for their record to read.
pub(super) const WAITING_TO_READ_MAX: usize = 1024;
/// The longest wait between two tries in the background, in result retry waits (5 min).
const LONGEST_WAIT: u32 = 300;

impl Deliverer {
    /// Puts a message back in the queue, due at `due_ms`, after courier's own failure (no
    /// attempt counted), and wakes the scheduler. A release that fails still ends a lease
    /// (see `Store::release`): the message is then seen again where it was, and a second
    /// release could end the lease of an attempt started since, so it is not tried again. A
    /// message written in flight at accept has no lease: its release is tried again a few
    /// times, then in the background (see the module doc).
    pub(super) async fn requeue(&self, id: &str, due_ms: u64) {
        let leased = self.ctx.store().is_leased(id);
        for n in 0..STORE_TRIES {
            let (store, released) = (self.ctx.store().clone(), id.to_string());
            let e = match crate::sys::blocking::run(move || store.release(&released, due_ms)).await {
                Ok(Ok(_)) => break,
                Ok(Err(StoreError::Closed)) | Err(_) => break,
                Ok(Err(e)) => e,
            };
            if leased {
                tracing::error!(delivery_id = %id, error = %e, "requeueing a message failed; it is tried again where it was");
                break;
            }
            if n + 1 == STORE_TRIES {
                self.release_later(id.to_string(), due_ms, e);
                break;
            }
            tracing::error!(delivery_id = %id, error = %e, "requeueing a message failed; trying again");
            tokio::time::sleep(self.store_backoff(n)).await;
        }
        // Back in the queue, maybe due before the scheduler's next wake-up.
        self.ctx.wake();
    }

    /// Releases `id` once it reads again, in the background (see the module doc).
    fn release_later(&self, id: String, due_ms: u64, error: StoreError) {
        let store = self.ctx.store().clone();
        let went = self.when_it_reads(id.clone(), "requeueing a message", error, move || {
            let (s, i) = (store.clone(), id.clone());
            async move {
                match crate::sys::blocking::run(move || s.release(&i, due_ms)).await {
                    Ok(r) => r.map(|_| ()),
                    Err(e) => Err(StoreError::Panicked(e)),
                }
            }
        });
        if !went {
            tracing::error!("that message goes back at the next start");
        }
    }

    /// Writes an attempt's result once its record reads again, in the background (see
    /// the module doc); `false` past the bound (the caller gives the attempt up).
    pub(super) fn record_later(self: &Arc<Self>, item: FinishedAttempt, streak: StreakNote, error: StoreError) -> bool {
        let d = self.clone();
        self.when_it_reads(item.id.clone(), "writing an attempt's result", error, move || {
            let (d, item, streak) = (d.clone(), item.clone(), streak.clone());
            async move { d.record(item, streak).await.map(|_| ()) }
        })
    }

    /// Runs `op` in the background until it succeeds or the store closes, 1 result retry
    /// wait doubling to [`LONGEST_WAIT`] of them; `false` (and nothing run) when
    /// [`WAITING_TO_READ_MAX`] wait already.
    fn when_it_reads<F, Fut>(&self, id: String, what: &'static str, error: StoreError, mut op: F) -> bool
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<(), StoreError>> + Send,
    {
        if self.waiting_to_read.fetch_add(1, Ordering::SeqCst) >= WAITING_TO_READ_MAX {
            self.waiting_to_read.fetch_sub(1, Ordering::SeqCst);
            tracing::error!(delivery_id = %id, %error, "{what} failed: its record does not read");
            return false;
        }
        tracing::error!(delivery_id = %id, %error, "{what} failed: its record does not read; tried again in the background until it does");
        let (ctx, count) = (self.ctx.clone(), self.waiting_to_read.clone());
        let (first, most) = (self.result_retry(), self.result_retry() * LONGEST_WAIT);
        self.ctx.runtime().spawn(async move {
            let mut wait = first;
            loop {
                tokio::time::sleep(wait).await;
                match op().await {
                    Ok(()) => {
                        tracing::info!(delivery_id = %id, "{what} succeeded: its record reads again");
                        ctx.wake();
                        break;
                    }
                    Err(StoreError::Closed) => break,
                    Err(_) => wait = wait.saturating_mul(2).min(most),
                }
            }
            count.fetch_sub(1, Ordering::SeqCst);
        });
        true
    }

    /// Releases and result writes waiting in the background for their record to read.
    #[cfg(test)]
    pub fn waiting_to_read(&self) -> usize {
        self.waiting_to_read.load(Ordering::SeqCst)
    }

    /// What startup puts right before anything is scheduled: messages left in flight by
    /// the last process go back to the queue with their attempt count (courier's failure,
    /// not the receiver's; one whose record does not read goes back in the background once
    /// it does), ordered lines are repaired (see `Store::recover_lines`), an endpoint whose
    /// line is blocked behind a dead head is paused (a crash can fall between the block and
    /// its pause), and parked messages of endpoints that are not paused are requeued.
    /// Returns (requeued in-flight, requeued parked, endpoints paused here).
    pub fn recover_at_start(&self) -> Result<(usize, usize, Vec<String>), StoreError> {
        let now = self.ctx.clock().now_ms();
        let (in_flight, unreadable) = self.ctx.store().recover_in_flight(now)?;
        for (id, e) in unreadable {
            self.release_later(id, now, e);
        }
        let mut paused = Vec::new();
        for endpoint in self.ctx.store().recover_lines(now)? {
            if !self.ctx.endpoints().is_paused(&endpoint) {
                self.ctx.endpoints().set_paused(&endpoint, true, now);
                self.ctx.persist_endpoint(&endpoint, true)?;
                paused.push(endpoint);
            }
        }
        Ok((in_flight, self.ctx.recover_parked()?, paused))
    }
}
