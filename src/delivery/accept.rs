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
//! which message is the head is decided in its accept batch (see `store::lines`).
//!
//! "No older message waiting" keeps the fast path from overtaking a backlog: once a message
//! had to go to the queue (a busy host, an endpoint out of tokens, all permits taken), new
//! messages follow it there until a scheduler pass finds nothing left waiting.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::{pace, AttemptPermit, Deliverer};
use crate::store::{Accepted, Accepting, Leased, MessageRecord, Settled, StoreError};

/// One accept waiting for its batch: the message, the permits taken for its first attempt,
/// what the accept holds until then, and its caller.
pub(super) struct Job {
    pub(super) accepting: Accepting,
    pub(super) permit: Option<AttemptPermit>,
    pub(super) keep: Box<dyn Send>,
    pub(super) reply: Reply,
}

/// Where an accept's caller waits for its answer.
pub(super) type Reply = oneshot::Sender<Result<Accepted, StoreError>>;

/// A first attempt its accept's write claimed, for delivery to start: the message, its
/// permits, and what the accept holds until the attempt is running (its count, which a
/// drain waits on, and its body's bytes).
pub(super) type Start = (Leased, AttemptPermit, Box<dyn Send>);

/// What one batch of accepts gives back once written: the first attempts to start, and
/// each caller's answer.
pub(super) struct Written {
    pub(super) start: Vec<Start>,
    pub(super) replies: Vec<(Reply, Result<Accepted, StoreError>)>,
}

impl Deliverer {
    /// Writes one batch of accepts and settles each: counted, its first attempt handed
    /// back to start, or the scheduler woken; the callers' answers handed back to send.
    pub(super) fn write_accepts(&self, jobs: Vec<Job>) -> Written {
        let (batch, waiting): (Vec<_>, Vec<_>) = jobs
            .into_iter()
            .map(|j| (j.accepting, (j.permit, j.keep, j.reply)))
            .unzip();
        let settled = self.ctx.store().accept_batch(batch);
        let mut start: Vec<Start> = Vec::new();
        let mut replies = Vec::with_capacity(settled.len());
        let mut queued = false;
        for (settled, (permit, keep, reply)) in settled.into_iter().zip(waiting) {
            replies.push((reply, settled.answer()));
            match (settled, permit) {
                (Settled::New(claimed), permit) => {
                    self.ctx.metrics().accepted();
                    match claimed.zip(permit) {
                        Some((claimed, permit)) => start.push((claimed, permit, keep)),
                        None => queued = true,
                    }
                }
                (not_stored, permit) => {
                    if let Settled::Duplicate { .. } = not_stored {
                        self.ctx.metrics().duplicate();
                    }
                    // The permits taken for a first attempt that will not run go back: a
                    // pass that found them taken may have left a message waiting for them.
                    if let Some(permit) = permit {
                        drop(permit);
                        self.wake_if_waiting();
                    }
                }
            }
        }
        if queued {
            self.ctx.wake();
        }
        Written { start, replies }
    }

    /// The permits for a new message's first attempt, if it can start the moment it is
    /// durable. `None` sends it through the due queue.
    pub(super) fn start_at_accept(&self, rec: &MessageRecord) -> Option<AttemptPermit> {
        // An ordered message starts only as the head of its line, which its accept batch
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
            self.pace.messages_wait();
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
        if waiting {
            self.pace.messages_wait();
        }
    }

    /// Whether due messages wait for a permit (see `queue_first`).
    pub(crate) fn messages_waiting(&self) -> bool {
        self.queue_first.load(Ordering::Acquire)
    }

    /// The gate ingest's accepts pass (see `pace`).
    pub fn pace(&self) -> &Arc<pace::Pace> {
        &self.pace
    }
}
