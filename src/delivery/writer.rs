//! The store writer: one thread that writes both what ingest accepts and what attempts
//! record, taking every job queued while it wrote the last batch as the next batch.
//!
//! One thread rather than one per kind of write: under load the accepts' fsync keeps it
//! busy, so the results that end meanwhile ride in its next turn and wake no thread of
//! their own, and the two never wait for each other in RocksDB's write queue. A turn writes
//! its accepts first, in one synced batch, hands their first attempts back to delivery and
//! answers them, then writes its results (unsynced: a result lost in a crash is an attempt
//! made again, which the receiver's dedupe absorbs) and hands their attempts back to be
//! ended. So an accept waits for no result write; the results wait one synced write more.
//! What it hands back are values, taken by one task on delivery's runtime
//! (`lifecycle::settle`): no attempt starts or ends on this thread, and a turn wakes that
//! task once, however many attempts it started or ended. Measured against the other order:
//! 2–12% fewer context switches per delivered message, delivered and CPU unchanged
//! (docs/benchmarks.md, issue 43 step 5).
//!
//! What goes in is here too ([`Deliverer::accept`], and an attempt's result through
//! `record`, `record_ending` and `flush_results`); what a turn does with each kind is in
//! `accept` and `results`.
//!
//! Ingest yields where it begins (accepts wait at `delivery::pace`'s gate while delivery
//! is short of CPU), and the queue below is the accepts' backpressure. The queue is one, first in first out: under an ingest flood a result waits behind at most
//! `QUEUE` jobs, a few turns of `MAX_BATCH`, and the attempt holding it waits to send it.

use std::future::Future;
use std::sync::{Arc, Weak};

use tokio::sync::oneshot;

use super::lifecycle::{self, End, Handback, Handbacks, StreakNote};
use super::{accept, results, Deliverer};
use crate::batcher::Batcher;
use crate::store::{Accepted, FinishedAttempt, NewMessage, StoreError};

/// The most jobs one turn takes; bounds the latency a turn adds to its last member.
const MAX_BATCH: usize = 1024;
/// Jobs waiting for the writer; past this, callers wait (backpressure).
const QUEUE: usize = 8192;

/// A job for the writer.
pub(super) enum Write {
    /// A message to store (synced) and answer. Boxed: a job moves through the queue and
    /// into its batch, and an accept's is several times a result's size.
    Accept(Box<accept::Job>),
    /// An attempt's result to record, or a barrier.
    Result(results::Job),
}

/// Handle to the store writer's thread.
pub(super) struct StoreWriter {
    batcher: Batcher<Write>,
    /// What its turns hand back to delivery, for the simulator to settle at will.
    #[cfg(test)]
    back: Arc<Handbacks>,
}

impl StoreWriter {
    /// Starts the thread, which works for `d` while it lives, and hands what its turns
    /// give back to a task on `rt` (see [`lifecycle::settle`]).
    pub(super) fn start(d: Weak<Deliverer>, results: results::Writer, rt: &tokio::runtime::Handle) -> StoreWriter {
        let back = Arc::new(Handbacks::default());
        rt.spawn(lifecycle::settle(d.clone(), back.clone()));
        let handed = back.clone();
        let batcher = Batcher::start("courier-writer", QUEUE, MAX_BATCH, move |jobs| {
            let (mut accepts, mut ended) = (Vec::new(), Vec::new());
            for job in jobs {
                match job {
                    Write::Accept(job) => accepts.push(*job),
                    Write::Result(job) => ended.push(job),
                }
            }
            if let (false, Some(d)) = (accepts.is_empty(), d.upgrade()) {
                let written = d.write_accepts(accepts);
                drop(d);
                if !written.start.is_empty() || written.freed {
                    handed.push(Handback::Start(written.start, written.freed));
                }
                for (reply, answer) in written.replies {
                    let _ = reply.send(answer);
                }
            }
            if !ended.is_empty() {
                let ended = results.write_batch(ended, &mut || {});
                if !ended.is_empty() {
                    handed.push(Handback::Ended(ended));
                }
            }
        });
        StoreWriter {
            batcher,
            #[cfg(test)]
            back,
        }
    }

    /// Queues a job (see [`Batcher::send`]); `false` once the writer is stopped (the job
    /// was not queued).
    pub(super) fn send(&self, job: Write) -> impl Future<Output = bool> + Send + 'static {
        self.batcher.send(job)
    }

    /// Stops taking jobs and waits until every queued one is done.
    pub(super) fn stop(&self) {
        self.batcher.stop();
    }

    /// Tests: starts and ends at once what the turns handed back so far (the simulator,
    /// in the middle of a scheduler pass).
    #[cfg(test)]
    pub(super) fn settle_now(&self, d: &Arc<Deliverer>) {
        self.back.settle_now(d);
    }
}

impl Deliverer {
    /// Stores a new message durably (fsynced, possibly sharing the fsync with concurrent
    /// accepts), unless one with the same event id and target exists; when its first
    /// attempt can start now, it is written claimed and that attempt is started.
    ///
    /// What follows the write (the accept counted, the attempt started or the scheduler
    /// woken) is done by the store writer's turn and delivery's settling task, not by this
    /// future: once the job is queued, it happens even if the caller has gone. `keep` (an
    /// accept's count, its body's bytes) is held until the attempt is started, or waits in
    /// its host's line.
    ///
    /// The job is made when this is called, and queued then unless the queue is full (see
    /// [`Batcher::send`]); the future waits for room if it must, then for the writer's
    /// answer, and is small, so its caller's is too.
    pub fn accept(
        &self,
        mut msg: NewMessage,
        keep: impl Send + 'static,
    ) -> impl Future<Output = Result<Accepted, StoreError>> + Send + 'static {
        self.order(&mut msg.record);
        let first = self.start_at_accept(&msg.record);
        let claim = !matches!(first, accept::First::Queue);
        let accepting = self.ctx.store().accepting(msg, claim);
        let (reply, answer) = oneshot::channel();
        let job = accept::Job {
            accepting,
            first,
            keep: Box::new(keep),
            reply,
        };
        let queued = self.writer.send(Write::Accept(Box::new(job)));
        async move {
            if !queued.await {
                return Err(StoreError::Closed);
            }
            answer.await.map_err(|_| StoreError::Closed)?
        }
    }

    async fn send_result(&self, item: Option<(FinishedAttempt, StreakNote)>) -> lifecycle::Answer {
        let (reply, answer) = oneshot::channel();
        if !self
            .writer
            .send(Write::Result(results::Job::Waiting(item, reply)))
            .await
        {
            return Err(StoreError::Closed);
        }
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Records one finished attempt and, if it applied, its streak; answers once the batch
    /// holding it is written.
    pub(super) async fn record(&self, item: FinishedAttempt, note: StreakNote) -> lifecycle::Answer {
        self.send_result(Some((item, note))).await
    }

    /// Records the result `end` holds, and hands `end` back to delivery once the batch
    /// holding it is written: the caller need not wait (nor be woken). Once the writer has
    /// stopped, `end` is dropped unrun.
    pub(super) async fn record_ending(&self, end: Box<End>) {
        self.writer.send(Write::Result(results::Job::End(end))).await;
    }

    /// Waits until every result queued before this call is written (or failed). An attempt
    /// cut off while its result waited in the queue still has that result written; whoever
    /// puts the message back in the queue waits for this first, so the write is not taken
    /// for a stale one and the attempt is not forgotten.
    pub(super) async fn flush_results(&self) {
        let _ = self.send_result(None).await;
    }

    /// Stops the store writer once the jobs queued are done (at shutdown, after the drain
    /// and before the store closes): later accepts are refused as closed, later results
    /// are written at the next start (their messages are in flight on disk).
    pub fn stop_writer(&self) {
        self.writer.stop();
    }
}
