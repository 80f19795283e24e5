//! The store writer: one thread that writes both what ingest accepts and what attempts
//! record, taking every job queued while it wrote the last batch as the next batch.
//!
//! One thread rather than one per kind of write: under load the accepts' fsync keeps it
//! busy, so the results that end meanwhile ride in its next turn and wake no thread of
//! their own, and the two never wait for each other in RocksDB's write queue. A turn writes
//! its results first (unsynced: a result lost in a crash is an attempt made again, which
//! the receiver's dedupe absorbs) and ends their attempts, then writes its accepts in one
//! synced batch and answers them.
//!
//! It runs at delivery's priority, not ingest's (see `sys::priority`): a result must not
//! wait for CPU behind the accepts that overload it. Ingest still yields where it begins,
//! on the ingress runtime's threads, and the queue below is the accepts' backpressure.

use std::sync::Weak;

use super::{accept, results, Deliverer};
use crate::batcher::Batcher;

/// The most jobs one turn takes; bounds the latency a turn adds to its last member.
const MAX_BATCH: usize = 1024;
/// Jobs waiting for the writer; past this, callers wait (backpressure).
const QUEUE: usize = 8192;

/// A job for the writer.
pub(super) enum Write {
    /// A message to store (synced) and answer.
    Accept(accept::Job),
    /// An attempt's result to record, or a barrier.
    Result(results::Job),
}

/// Handle to the store writer's thread.
pub(super) struct StoreWriter {
    batcher: Batcher<Write>,
}

impl StoreWriter {
    /// Starts the thread, which works for `d` while it lives.
    pub(super) fn start(d: Weak<Deliverer>, results: results::Writer) -> StoreWriter {
        let batcher = Batcher::start("courier-writer", QUEUE, MAX_BATCH, move |jobs| {
            let (mut accepts, mut ended) = (Vec::new(), Vec::new());
            for job in jobs {
                match job {
                    Write::Accept(job) => accepts.push(job),
                    Write::Result(job) => ended.push(job),
                }
            }
            if !ended.is_empty() {
                results.write_batch(ended, &mut || {});
            }
            if let (false, Some(d)) = (accepts.is_empty(), d.upgrade()) {
                d.write_accepts(accepts);
            }
        });
        StoreWriter { batcher }
    }

    /// Queues a job; `false` once the writer is stopped (the job was not queued).
    pub(super) async fn send(&self, job: Write) -> bool {
        self.batcher.send(job).await
    }

    /// Stops taking jobs and waits until every queued one is done.
    pub(super) fn stop(&self) {
        self.batcher.stop();
    }
}

impl Deliverer {
    /// Stops the store writer once the jobs queued are done (at shutdown, after the drain
    /// and before the store closes): later accepts are refused as closed, later results
    /// are written at the next start (their messages are in flight on disk).
    pub fn stop_writer(&self) {
        self.writer.stop();
    }
}
