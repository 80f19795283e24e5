//! Accepting a message, and starting its first attempt at once when nothing stands in the
//! way.
//!
//! The plain path to a first attempt is: the accept's synced write puts the message in the
//! due queue; the scheduler, woken, walks the queue, reads the record and the payload back,
//! and claims the message with a second write; then the attempt runs. When the message's
//! endpoint is active with a token to spare, its host and courier have a free attempt
//! permit (and its endpoint one, under a `max_in_flight` cap), and no older message is
//! waiting in the queue, every step of that is known to
//! succeed before the accept is even written. So the permit is taken first, the message is
//! written already claimed (in flight, no due entry) in the accept's own synced write, and
//! the attempt starts from the record and payload still in memory. Nothing is acknowledged
//! earlier than before (the 202 still waits for the same fsync), and a crash leaves the
//! message in flight on disk, which startup puts back in the queue like any other attempt
//! that was cut off.
//!
//! An ordered message never takes this path: only the head of its line may start, and
//! which message is the head is decided by the commit thread (see `store::lines`).
//!
//! "No older message waiting" keeps the fast path from overtaking a backlog: once a message
//! had to go to the queue (a busy host, an endpoint out of tokens, all permits taken), new
//! messages follow it there until a scheduler pass finds nothing left waiting.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

use super::{AttemptPermit, Deliverer};
use crate::store::{Accepted, Leased, MessageRecord, NewMessage, StoreError, Stored};

/// A first attempt waiting to be started on delivery's runtime, with what its accept holds
/// until then (see [`Deliverer::accept`]).
pub(super) type Starting = (Leased, AttemptPermit, Box<dyn Send>);

impl Deliverer {
    /// Stores a new message durably; when its first attempt can start now, it is written
    /// claimed and that attempt is started. Answers as [`crate::store::Store::accept`].
    ///
    /// What follows the write (the accept counted, the attempt started or the scheduler
    /// woken) is set off by the commit thread the moment the outcome is known, not by this
    /// future: it happens even if the caller has gone (a sender that left before its 202).
    /// `keep` (an accept's count, its body's bytes) is held until the attempt is started.
    pub async fn accept(
        self: &Arc<Self>,
        mut msg: NewMessage,
        keep: impl Send + 'static,
    ) -> Result<Accepted, StoreError> {
        self.order(&mut msg.record);
        let permit = self.start_at_accept(&msg.record);
        let claim = permit.is_some();
        let d = self.clone();
        let then = Box::new(move |stored: Stored| match stored {
            Stored::New(claimed) => {
                d.ctx.metrics().accepted();
                match claimed.zip(permit) {
                    Some((claimed, permit)) => d.start_soon(claimed, permit, Box::new(keep)),
                    None => d.ctx.wake(),
                }
            }
            not_stored => {
                if let Stored::Duplicate = not_stored {
                    d.ctx.metrics().duplicate();
                }
                // The permits taken for a first attempt that will not run go back: a pass
                // that found them taken may have left a message waiting for them.
                if let Some(permit) = permit {
                    drop(permit);
                    d.wake_if_waiting();
                }
            }
        });
        self.ctx.store().accept_then(msg, claim, then).await
    }

    /// Starts a first attempt from the commit thread. The attempts of one batch go to
    /// delivery's runtime together, in one task: one wake-up of a delivery thread per
    /// batch rather than one per message (each a context switch on a busy machine).
    fn start_soon(self: &Arc<Self>, claimed: Leased, permit: AttemptPermit, keep: Box<dyn Send>) {
        let mut starting = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        starting.push((claimed, permit, keep));
        if starting.len() > 1 {
            return; // the task below is not yet run: it takes this one too
        }
        drop(starting);
        let d = self.clone();
        self.ctx.runtime().spawn(async move {
            let batch = std::mem::take(&mut *d.starting.lock().unwrap_or_else(|p| p.into_inner()));
            for (claimed, permit, keep) in batch {
                d.dispatch(claimed, permit);
                drop(keep);
            }
        });
    }

    /// The permits for a new message's first attempt, if it can start the moment it is
    /// durable. `None` sends it through the due queue.
    fn start_at_accept(&self, rec: &MessageRecord) -> Option<AttemptPermit> {
        // An ordered message starts only as the head of its line, which the commit thread
        // decides: it goes through the queue (and leaves `queue_first` alone, as its wait
        // is its line's, not the host's).
        // With `[fleet]` on, a first attempt needs a lease from Redis, and ingress never
        // talks to Redis (an outage must not slow or refuse accepts): it goes through the
        // queue, whose pass the accept wakes at once.
        if rec.fifo.is_some()
            || self.fleet.is_some()
            || self.queue_first.load(Ordering::Acquire)
            || self.ctx.endpoints().is_paused(&rec.endpoint)
        {
            return None;
        }
        // Without `[fleet]`, admission is the local permits and a rate token.
        let taken = self.admit(&rec.host, &rec.endpoint, self.ctx.clock().now_ms()).ok();
        if taken.is_none() {
            // This one waits in the queue: later ones must not overtake it.
            self.queue_first.store(true, Ordering::Release);
        }
        taken
    }

    /// Gives an attempt's host permit back once the receiver has answered, keeping the
    /// global one (see [`AttemptPermit`]); the scheduler is woken only when messages wait.
    pub(super) fn host_permit_returned(&self, permit: AttemptPermit) -> OwnedSemaphorePermit {
        let global = permit.into_global();
        self.wake_if_waiting();
        global
    }

    /// Wakes the scheduler when messages wait for a permit that was just freed.
    pub(super) fn wake_if_waiting(&self) {
        if self.queue_first.load(Ordering::Acquire) || self.passing.load(Ordering::Acquire) {
            self.ctx.wake();
        }
    }

    /// Told by the scheduler when a pass starts.
    pub(crate) fn pass_started(&self) {
        self.passing.store(true, Ordering::Release);
    }

    /// Told by the scheduler after each pass whether due messages were left waiting.
    pub(crate) fn set_queue_waiting(&self, waiting: bool) {
        // In this order: at every moment one of the two says to wake.
        self.queue_first.store(waiting, Ordering::Release);
        self.passing.store(false, Ordering::Release);
    }
}
