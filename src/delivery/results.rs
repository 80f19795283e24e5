//! Attempt results, written in batches. Attempts that end while the previous results are
//! being written are recorded together in one `WriteBatch` by one thread, the way accepts
//! are group-committed: under load, one trip through RocksDB's write queue (which may wait
//! behind the accepts' fsync) serves many attempts, and no async worker ever waits on it.
//! Idle, a lone result is written at once.

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::batcher::Batcher;
use crate::store::{FinishedAttempt, MessageRecord, Store, StoreError};

/// The most results one batch carries.
const MAX_BATCH: usize = 1024;
/// Results waiting for the writer; past this, attempts wait (never reached while the
/// per-host caps bound the attempts in flight to fewer).
const QUEUE: usize = 8192;

type Answer = Result<Option<MessageRecord>, StoreError>;

/// A result to record, or (`None`) a barrier answered once everything queued before it is
/// written.
struct Job {
    item: Option<FinishedAttempt>,
    reply: oneshot::Sender<Answer>,
}

/// Handle to the result-writing thread. Dropping it stops the thread once the queued
/// results are written.
pub(super) struct ResultWriter {
    batcher: Batcher<Job>,
}

impl ResultWriter {
    /// Starts the thread.
    pub(super) fn start(store: Arc<Store>) -> ResultWriter {
        let batcher = Batcher::start("courier-results", QUEUE, MAX_BATCH, move |jobs| {
            write_batch(&store, jobs)
        });
        ResultWriter { batcher }
    }

    async fn send(&self, item: Option<FinishedAttempt>) -> Answer {
        let (reply, answer) = oneshot::channel();
        if !self.batcher.send(Job { item, reply }).await {
            return Err(StoreError::Closed);
        }
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Records one finished attempt; answers as [`Store::finish_attempt`] does, once the
    /// batch holding it is written.
    pub(super) async fn record(&self, item: FinishedAttempt) -> Answer {
        self.send(Some(item)).await
    }

    /// Waits until every result queued before this call is written (or failed). An attempt
    /// cut off while its result waited in the queue still has that result written; whoever
    /// puts the message back in the queue waits for this first, so the write is not taken
    /// for a stale one and the attempt is not forgotten.
    pub(super) async fn flush(&self) {
        let _ = self.send(None).await;
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

fn write_batch(store: &Store, jobs: Vec<Job>) {
    let (mut items, mut replies, mut barriers) = (Vec::new(), Vec::new(), Vec::new());
    for Job { item, reply } in jobs {
        match item {
            Some(item) => {
                items.push(item);
                replies.push(reply);
            }
            None => barriers.push(reply),
        }
    }
    // Two results for one message in a batch cannot both apply: the store answers the
    // second as stale, as it would after the first was written.
    // A panic here must not end the thread (every later result would then wait for
    // ever): it fails this batch, whose attempts retry their results as after a failed
    // write, as they did when each result had a blocking task of its own.
    let answers = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| store.finish_attempts(&items)))
        .unwrap_or_else(|panic| {
            let why = panic_text(panic.as_ref());
            tracing::error!(batch = items.len(), panic = %why, "recording attempt results panicked");
            items.iter().map(|_| Err(StoreError::Panicked(why.clone()))).collect()
        });
    for (reply, answer) in replies.into_iter().zip(answers) {
        let _ = reply.send(answer);
    }
    // Everything queued before a barrier was in this batch or an earlier one.
    for barrier in barriers {
        let _ = barrier.send(Ok(None));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{claim, message};
    use crate::store::{AttemptRecord, Counts, StoreOptions, Transition};

    async fn claimed_store(n: usize) -> (tempfile::TempDir, Arc<Store>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("data"), StoreOptions::default()).unwrap());
        for i in 0..n {
            let id = format!("dlv_{i:03}");
            store.accept(message(&id, &format!("e{i}"), 100)).await.unwrap();
            claim(&store, &id);
        }
        (dir, store)
    }

    fn delivered(id: &str) -> FinishedAttempt {
        FinishedAttempt {
            id: id.into(),
            attempt: AttemptRecord {
                at_ms: 200,
                status: Some(200),
                error: None,
                duration_ms: 1,
            },
            transition: Transition::Delivered,
            now_ms: 200,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_results_are_all_recorded() {
        let (_d, store) = claimed_store(200).await;
        let writer = Arc::new(ResultWriter::start(store.clone()));
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let w = writer.clone();
                tokio::spawn(async move { w.record(delivered(&format!("dlv_{i:03}"))).await })
            })
            .collect();
        for t in tasks {
            let rec = t.await.unwrap().unwrap().expect("recorded");
            assert_eq!(rec.state, crate::model::State::Delivered);
        }
        assert_eq!(
            store.counts().unwrap(),
            Counts {
                open: 0,
                delivered: 200,
                dead: 0
            }
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_result_for_one_message_in_the_same_batch_is_stale_not_doubled() {
        let (_d, store) = claimed_store(2).await;
        // Two results for dlv_000 in one batch: the second must be answered stale, not
        // applied twice.
        let mut jobs = Vec::new();
        let mut answers = Vec::new();
        for id in ["dlv_000", "dlv_001", "dlv_000"] {
            let (reply, answer) = oneshot::channel();
            jobs.push(Job {
                item: Some(delivered(id)),
                reply,
            });
            answers.push(answer);
        }
        write_batch(&store, jobs);
        let mut applied = Vec::new();
        for a in answers {
            applied.push(a.await.unwrap().unwrap().is_some());
        }
        assert_eq!(applied, vec![true, true, false]);
        assert_eq!(store.history("dlv_000").unwrap().len(), 1);
        assert_eq!(store.counts().unwrap().delivered, 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flush_returns_after_every_result_queued_before_it_is_written() {
        let (_d, store) = claimed_store(200).await;
        // Results whose callers no longer wait (as an attempt cut off at shutdown), then a
        // barrier, in one batch: the barrier must not be answered before the batch is
        // written (the batch runs on another thread while this one waits for the barrier).
        let mut jobs = Vec::new();
        for i in 0..200 {
            let (reply, _gone) = oneshot::channel();
            let item = Some(delivered(&format!("dlv_{i:03}")));
            jobs.push(Job { item, reply });
        }
        let (reply, flushed) = oneshot::channel();
        jobs.push(Job { item: None, reply });
        let s = store.clone();
        let thread = std::thread::spawn(move || write_batch(&s, jobs));
        flushed.await.unwrap().unwrap();
        assert_eq!(store.counts().unwrap().delivered, 200);
        thread.join().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_the_writer_ends_its_thread_and_releases_the_store() {
        let (_d, store) = claimed_store(1).await;
        let writer = ResultWriter::start(store.clone());
        assert!(writer.record(delivered("dlv_000")).await.unwrap().is_some());
        drop(writer);
        assert_eq!(Arc::strong_count(&store), 1);
    }
}
