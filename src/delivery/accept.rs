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
//! had to go to the queue (an endpoint out of tokens, all permits taken), new messages
//! follow it there until a scheduler pass finds nothing left waiting. A message held back
//! only by its host's cap is written claimed too and waits in memory behind the others of
//! its host (`waiting`), which later messages to that host then join.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::waiting::Turn;
use super::{pace, AttemptPermit, Deliverer, Refusal};
use crate::store::{Accepted, Accepting, Leased, MessageRecord, Settled, StoreError};

/// One accept waiting for its batch: the message, how its first attempt starts, what the
/// accept holds until then, and its caller.
pub(super) struct Job {
    pub(super) accepting: Accepting,
    pub(super) first: First,
    pub(super) keep: Box<dyn Send>,
    pub(super) reply: Reply,
}

/// How a new message's first attempt starts, decided before its accept is written.
pub(super) enum First {
    /// At once, with these permits: written claimed.
    Now(AttemptPermit, Unsent),
    /// Once its host gives a permit back: written claimed, it waits in its host's line
    /// (`waiting`).
    Wait,
    /// From the due queue.
    Queue,
}

/// Moves the hosts' lines when dropped with a job never written (its caller went away while
/// the writer's queue was full): the job's permits then go back unseen by their host's
/// line.
pub(super) struct Unsent(Option<std::sync::Weak<Deliverer>>);

impl Unsent {
    fn written(mut self) {
        self.0 = None;
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        if let Some(d) = self.0.take().and_then(|d| d.upgrade()) {
            d.start_all_waiting();
        }
    }
}

/// Where an accept's caller waits for its answer.
pub(super) type Reply = oneshot::Sender<Result<Accepted, StoreError>>;

/// A first attempt its accept's write claimed, for delivery to start: the message, its
/// permits (`None`: it waits for its host's), and what the accept holds until the attempt
/// is running or in its host's line (its count, which a drain waits on, and its body's
/// bytes).
pub(super) type Start = (Leased, Option<AttemptPermit>, Box<dyn Send>);

/// What one batch of accepts gives back once written: the first attempts to start,
/// whether permits went back unused (hosts' lines may move), and each caller's answer.
pub(super) struct Written {
    pub(super) start: Vec<Start>,
    pub(super) freed: bool,
    pub(super) replies: Vec<(Reply, Result<Accepted, StoreError>)>,
}

impl Deliverer {
    /// Writes one batch of accepts and settles each: counted, its first attempt handed
    /// back to start, or the scheduler woken; the callers' answers handed back to send.
    pub(super) fn write_accepts(&self, jobs: Vec<Job>) -> Written {
        let (batch, waiting): (Vec<_>, Vec<_>) = jobs
            .into_iter()
            .map(|j| (j.accepting, (j.first, j.keep, j.reply)))
            .unzip();
        let settled = self.ctx.store().accept_batch(batch);
        let (mut start, mut freed): (Vec<Start>, bool) = (Vec::new(), false);
        let mut replies = Vec::with_capacity(settled.len());
        let mut queued = false;
        for (settled, (first, keep, reply)) in settled.into_iter().zip(waiting) {
            replies.push((reply, settled.answer()));
            match (settled, first) {
                (Settled::New(Some(claimed)), First::Now(permit, unsent)) => {
                    unsent.written();
                    self.ctx.metrics().accepted();
                    start.push((claimed, Some(permit), keep));
                }
                (Settled::New(Some(claimed)), First::Wait) => {
                    self.ctx.metrics().accepted();
                    start.push((claimed, None, keep));
                }
                (settled, first) => {
                    match settled {
                        Settled::New(_) => {
                            self.ctx.metrics().accepted();
                            queued = true;
                        }
                        Settled::Duplicate { .. } => self.ctx.metrics().duplicate(),
                        Settled::Failed(_) => {}
                    }
                    // The permits taken for a first attempt that will not run go back: a
                    // pass that found them taken may have left a message waiting for them,
                    // and so may a host's line.
                    if let First::Now(permit, unsent) = first {
                        unsent.written();
                        drop(permit);
                        self.wake_if_waiting();
                        freed = true;
                    }
                }
            }
        }
        if queued {
            self.ctx.wake();
        }
        Written { start, freed, replies }
    }

    /// How a new message's first attempt starts: at once (its permits taken), behind its
    /// host's line, or from the due queue.
    pub(super) fn start_at_accept(&self, rec: &MessageRecord) -> First {
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
            return First::Queue;
        }
        // Behind the messages its host's line holds already, or the host's cap alone in
        // the way: it waits in memory for the host (see `waiting`).
        let host_line = || {
            (self.waiting.room(self.ctx.config().delivery.max_in_flight) > 0).then(|| {
                self.pace.messages_wait();
                First::Wait
            })
        };
        let taken = match self.waiting.has(&rec.host) {
            true => host_line().ok_or(Refusal::HostBusy(None)),
            false => match self.admit(&rec.host, &rec.endpoint, self.ctx.clock().now_ms()) {
                Ok(permit) => Ok(First::Now(permit, Unsent(Some(self.me.clone())))),
                Err(Refusal::HostBusy(None)) => host_line().ok_or(Refusal::HostBusy(None)),
                Err(other) => Err(other),
            },
        };
        taken.unwrap_or_else(|_| {
            // This one waits in the queue: later ones must not overtake it.
            self.queue_first.store(true, Ordering::Release);
            self.pace.messages_wait();
            First::Queue
        })
    }

    /// A first attempt written claimed without its host's permit takes its place in its
    /// host's line, and the line moves if it can (a permit may have come back meanwhile).
    pub(crate) fn wait_for_host(self: &Arc<Self>, claimed: Leased, keep: Box<dyn Send>) {
        let host = claimed.record.host.clone();
        match self
            .waiting
            .arrive(&host, claimed, self.ctx.config().delivery.max_in_flight)
        {
            None => {
                drop(keep);
                self.start_waiting(&host);
            }
            // Closed or full lines: held until it is back in the queue (a drain waits).
            Some(turned) => self.leave_line(vec![turned], keep),
        }
    }

    /// Starts the waiters at the head of `host`'s line while their permits can be taken;
    /// those refused for anything but the host's cap leave for the queue. Called whenever
    /// the host may have a permit free: one given back, or a waiter arrived.
    pub(crate) fn start_waiting(self: &Arc<Self>, host: &str) {
        // Called after every answer: nothing more when no line holds anyone.
        if !self.waiting.any() {
            return;
        }
        let now = self.ctx.clock().now_ms();
        let store = self.ctx.store();
        let (go, leave) = self.waiting.take(host, |w| {
            let rec = &w.record;
            if self.ctx.endpoints().is_paused(&rec.endpoint) || store.deleted_while_taken(&rec.id) {
                return Turn::Leave;
            }
            match self.admit(host, &rec.endpoint, now) {
                Ok(permit) => Turn::Go(permit),
                Err(Refusal::HostBusy(None)) => Turn::Stay,
                Err(_) => Turn::Leave,
            }
        });
        for (w, permit) in go {
            self.dispatch(w, permit);
        }
        self.leave_line(leave, Box::new(()));
    }

    /// How many more due messages a scheduler pass found held back by their host's cap
    /// alone the hosts' lines take.
    pub(crate) fn line_room(&self) -> usize {
        self.waiting.room(self.ctx.config().delivery.max_in_flight)
    }

    /// [`Deliverer::start_waiting`] for every host with a line (a permit went back whose
    /// host is not known here).
    pub(crate) fn start_all_waiting(self: &Arc<Self>) {
        for host in self.waiting.hosts() {
            self.start_waiting(&host);
        }
    }

    /// Closes the hosts' lines (a drain, a shutdown): what waits goes back to the queue,
    /// and from now on nothing waits in memory.
    pub async fn close_lines(&self) {
        let closed = self.waiting.close();
        self.waiting.leave(closed.len());
        self.requeue_all(closed).await;
        self.waiting.all_back().await;
    }

    /// Puts waiters back in the queue (written in flight at their accept, they have no
    /// due entry), due now, on a task of their own.
    fn leave_line(self: &Arc<Self>, leave: Vec<Leased>, keep: Box<dyn Send>) {
        if !leave.is_empty() {
            // Later messages must not overtake them.
            self.queue_first.store(true, Ordering::Release);
            self.waiting.leave(leave.len());
            let d = self.clone();
            self.ctx.runtime().spawn(async move {
                d.requeue_all(leave).await;
                drop(keep);
            });
        }
    }

    /// Puts each back in the queue, counted back as it is.
    async fn requeue_all(&self, leave: Vec<Leased>) {
        let now = self.ctx.clock().now_ms();
        for w in leave {
            // One a pass leased from the queue is still there: its lease ends where it was.
            let due = match w.claim {
                crate::store::Claim::FromQueue => w.record.next_attempt_at_ms,
                crate::store::Claim::AtAccept => now,
            };
            self.requeue(&w.record.id, due).await;
            self.waiting.back(1);
        }
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

    /// Whether messages wait for a permit: in the due queue (see `queue_first`) or in a
    /// host's line (see `waiting`).
    pub(crate) fn messages_waiting(&self) -> bool {
        self.queue_first.load(Ordering::Acquire) || self.waiting.any()
    }

    /// The gate ingest's accepts pass (see `pace`).
    pub fn pace(&self) -> &Arc<pace::Pace> {
        &self.pace
    }
}
