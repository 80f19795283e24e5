//! Attempt results, written in batches. Attempts that end while the previous results are
//! being written are recorded together in one `WriteBatch` by one thread, the way accepts
//! are group-committed: under load, one trip through RocksDB's write queue (which may wait
//! behind the accepts' fsync) serves many attempts, and no async worker ever waits on it.
//! Idle, a lone result is written at once.
//!
//! The same thread applies each written result to its endpoint's permanent-failure streak
//! and writes the endpoints that changed in one more write per batch, so a permanent
//! failure costs about what a success does: no write of its own, no task of its own, and
//! the store read that brings back a forgotten endpoint's streak happens here, off the
//! async workers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::endpoints::{EndpointChange, EndpointTable, StreakEvent};
use crate::batcher::Batcher;
use crate::store::{EndpointRecord, FinishedAttempt, MessageRecord, Store, StoreError};

/// The most results one batch carries.
const MAX_BATCH: usize = 1024;
/// Results waiting for the writer; past this, attempts wait (never reached while the
/// per-host caps bound the attempts in flight to fewer).
const QUEUE: usize = 8192;

/// What a result means for its endpoint's streak.
#[derive(Debug, Clone)]
pub(super) struct StreakNote {
    /// Endpoint key.
    pub endpoint: String,
    /// How the streak sees the attempt.
    pub event: StreakEvent,
    /// The status, for the alert.
    pub status: Option<u16>,
}

/// A written result.
#[derive(Debug)]
pub(super) struct Recorded {
    /// As [`Store::finish_attempt`] answers: the record, or `None` if the result was stale.
    pub message: Option<MessageRecord>,
    /// What it did to the endpoint (already written).
    pub endpoint: EndpointChange,
}

type Answer = Result<Recorded, StoreError>;

/// A result to record, or (`None`) a barrier answered once everything queued before it is
/// written.
struct Job {
    item: Option<(FinishedAttempt, StreakNote)>,
    reply: oneshot::Sender<Answer>,
}

/// What the writer thread works with.
struct Writer {
    store: Arc<Store>,
    endpoints: Arc<EndpointTable>,
    /// Held across each endpoint write (see `Deliverer::persist_lock`).
    persist_order: Arc<Mutex<()>>,
    /// `Deliverer::pause_gate`: held from the look at the pause flag to the pause a blocked
    /// line makes, so a resume cannot fall between them (and leave an active endpoint with
    /// a blocked line).
    pause_gate: Arc<Mutex<()>>,
}

/// Handle to the result-writing thread. Dropping it stops the thread once the queued
/// results are written.
pub(super) struct ResultWriter {
    batcher: Batcher<Job>,
}

impl ResultWriter {
    /// Starts the thread. Endpoint writes take `persist_order` as every endpoint write does;
    /// a pause for a blocked line takes `pause_gate` as every pause does.
    pub(super) fn start(
        store: Arc<Store>,
        endpoints: Arc<EndpointTable>,
        persist_order: Arc<Mutex<()>>,
        pause_gate: Arc<Mutex<()>>,
    ) -> ResultWriter {
        let w = Writer {
            store,
            endpoints,
            persist_order,
            pause_gate,
        };
        let batcher = Batcher::start("courier-results", QUEUE, MAX_BATCH, move |jobs| w.write_batch(jobs));
        ResultWriter { batcher }
    }

    async fn send(&self, item: Option<(FinishedAttempt, StreakNote)>) -> Answer {
        let (reply, answer) = oneshot::channel();
        if !self.batcher.send(Job { item, reply }).await {
            return Err(StoreError::Closed);
        }
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Records one finished attempt and, if it applied, its streak; answers once the batch
    /// holding it is written.
    pub(super) async fn record(&self, item: FinishedAttempt, note: StreakNote) -> Answer {
        self.send(Some((item, note))).await
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

impl Writer {
    fn write_batch(&self, jobs: Vec<Job>) {
        let (mut items, mut notes, mut replies, mut barriers) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for Job { item, reply } in jobs {
            match item {
                Some((item, note)) => {
                    items.push(item);
                    notes.push(note);
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
        let answers = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.store.finish_attempts(&items)))
            .unwrap_or_else(|panic| {
                let why = panic_text(panic.as_ref());
                tracing::error!(batch = items.len(), panic = %why, "recording attempt results panicked");
                items.iter().map(|_| Err(StoreError::Panicked(why.clone()))).collect()
            });
        let now_ms = items.iter().map(|i| i.now_ms).max().unwrap_or(0);
        let changes = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.apply_streaks(&notes, &answers, now_ms)
        }))
        .unwrap_or_else(|panic| {
            tracing::error!(panic = %panic_text(panic.as_ref()), "recording endpoint streaks panicked");
            vec![EndpointChange::None; notes.len()]
        });
        for ((reply, answer), endpoint) in replies.into_iter().zip(answers).zip(changes) {
            let _ = reply.send(answer.map(|message| Recorded { message, endpoint }));
        }
        // Everything queued before a barrier was in this batch or an earlier one.
        for barrier in barriers {
            let _ = barrier.send(Ok(Recorded {
                message: None,
                endpoint: EndpointChange::None,
            }));
        }
    }

    /// Applies the written results to their endpoints' streaks and writes the endpoints that
    /// changed (synced if one was paused: an alert is about to tell someone). A stale result
    /// is not this attempt's to count. A failed write is logged, as a failed streak write
    /// always was: it only shortens a streak.
    fn apply_streaks(
        &self,
        notes: &[StreakNote],
        answers: &[Result<Option<MessageRecord>, StoreError>],
        now_ms: u64,
    ) -> Vec<EndpointChange> {
        let mut changes = Vec::with_capacity(notes.len());
        // Endpoint → the record its last change in this batch left.
        let mut dirty: HashMap<&str, EndpointRecord> = HashMap::new();
        let mut synced = false;
        for (note, answer) in notes.iter().zip(answers) {
            let change = match answer {
                Ok(Some(rec)) => {
                    let change = self
                        .endpoints
                        .record(&note.endpoint, note.event, note.status, now_ms, || {
                            self.store.endpoint(&note.endpoint)
                        })
                        .unwrap_or_else(|e| {
                            tracing::error!(endpoint = %crate::redact::url_for_log(&note.endpoint), error = %e,
                                "reading endpoint state failed; its streak starts again");
                            EndpointChange::None
                        });
                    // The head of an ordered line died with `on_dead = "block"`: the line was
                    // blocked in the result's own batch; the endpoint pauses, as after a
                    // streak (written with this batch's endpoint writes, and alerted).
                    let dead = rec.state == crate::model::State::Dead;
                    let blocks = dead && rec.fifo.is_some_and(|f| f.on_dead == crate::model::OnDead::Block);
                    if blocks && !matches!(change, EndpointChange::Paused(_)) {
                        let _gate = self.pause_gate.lock().unwrap_or_else(|p| p.into_inner());
                        if self.endpoints.is_paused(&note.endpoint) {
                            change
                        } else {
                            EndpointChange::Paused(self.endpoints.set_paused(&note.endpoint, true, now_ms))
                        }
                    } else {
                        change
                    }
                }
                _ => EndpointChange::None,
            };
            if let EndpointChange::Changed(rec) | EndpointChange::Paused(rec) = &change {
                synced |= matches!(change, EndpointChange::Paused(_));
                dirty.insert(&note.endpoint, rec.clone());
            }
            changes.push(change);
        }
        if !dirty.is_empty() {
            let _order = self.persist_order.lock().unwrap_or_else(|p| p.into_inner());
            // The state as it is now, not as each result left it: a resume may have
            // overtaken it, and the last write must be the latest state. (An entry with an
            // unwritten change is never forgotten, so the fallback is for safety only.)
            let (recs, changes): (Vec<_>, Vec<_>) = dirty
                .into_iter()
                .map(|(k, last)| {
                    let (rec, n) = self
                        .endpoints
                        .loaded_record(k)
                        .map_or((last, None), |(r, n)| (r, Some(n)));
                    ((k.to_string(), rec), n)
                })
                .unzip();
            match self.store.put_endpoints(&recs, now_ms, synced) {
                Ok(()) => {
                    for ((key, _), n) in recs.iter().zip(changes) {
                        if let Some(n) = n {
                            self.endpoints.saved(key, n);
                        }
                    }
                }
                Err(e) => tracing::error!(endpoints = recs.len(), error = %e, "saving endpoint state failed"),
            }
        }
        changes
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

    fn table() -> Arc<EndpointTable> {
        Arc::new(EndpointTable::new(100, Default::default(), 3, 86_400_000, vec![], 0))
    }

    fn writer(store: &Arc<Store>, endpoints: &Arc<EndpointTable>) -> Writer {
        Writer {
            store: store.clone(),
            endpoints: endpoints.clone(),
            persist_order: Default::default(),
            pause_gate: Default::default(),
        }
    }

    fn start(store: &Arc<Store>) -> ResultWriter {
        ResultWriter::start(store.clone(), table(), Default::default(), Default::default())
    }

    fn note(endpoint: &str, event: StreakEvent, status: u16) -> StreakNote {
        StreakNote {
            endpoint: endpoint.into(),
            event,
            status: Some(status),
        }
    }

    fn success() -> StreakNote {
        note("e", StreakEvent::Success, 200)
    }

    fn delivered(id: &str) -> FinishedAttempt {
        FinishedAttempt {
            id: id.into(),
            attempt: AttemptRecord {
                at_ms: 200,
                status: Some(200),
                error: None,
                duration_ms: 1,
                policy_revision: None,
                span_id: None,
            },
            transition: Transition::Delivered,
            now_ms: 200,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_results_are_all_recorded() {
        let (_d, store) = claimed_store(200).await;
        let writer = Arc::new(start(&store));
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let w = writer.clone();
                tokio::spawn(async move { w.record(delivered(&format!("dlv_{i:03}")), success()).await })
            })
            .collect();
        for t in tasks {
            let rec = t.await.unwrap().unwrap().message.expect("recorded");
            assert_eq!(rec.state, crate::model::State::Delivered);
        }
        assert_eq!(
            store.counts().unwrap(),
            Counts {
                open: 0,
                delivered: 200,
                dead: 0,
                handed_off: 0
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
                item: Some((delivered(id), success())),
                reply,
            });
            answers.push(answer);
        }
        writer(&store, &table()).write_batch(jobs);
        let mut applied = Vec::new();
        for a in answers {
            applied.push(a.await.unwrap().unwrap().message.is_some());
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
            let item = Some((delivered(&format!("dlv_{i:03}")), success()));
            jobs.push(Job { item, reply });
        }
        let (reply, flushed) = oneshot::channel();
        jobs.push(Job { item: None, reply });
        let w = writer(&store, &table());
        let thread = std::thread::spawn(move || w.write_batch(jobs));
        flushed.await.unwrap().unwrap();
        assert_eq!(store.counts().unwrap().delivered, 200);
        thread.join().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_the_writer_ends_its_thread_and_releases_the_store() {
        let (_d, store) = claimed_store(1).await;
        let writer = start(&store);
        assert!(writer
            .record(delivered("dlv_000"), success())
            .await
            .unwrap()
            .message
            .is_some());
        drop(writer);
        assert_eq!(Arc::strong_count(&store), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn streaks_count_written_results_once_and_start_from_the_stored_record() {
        let (_d, store) = claimed_store(5).await;
        // "far" failed twice before courier forgot it in memory: its record is on disk only.
        let stored = crate::store::EndpointRecord {
            paused: false,
            streak: 2,
            last_status: Some(410),
        };
        store.put_endpoint("far", &stored, 50).unwrap();
        let endpoints = table();
        let gone = |id: &str| FinishedAttempt {
            transition: Transition::Dead(crate::model::DeadReason::PermanentStatus),
            ..delivered(id)
        };
        let mut jobs = Vec::new();
        let mut answers = Vec::new();
        let batch = [
            (gone("dlv_000"), note("near", StreakEvent::PermanentFailure, 410)),
            (gone("dlv_001"), note("far", StreakEvent::PermanentFailure, 410)),
            // Stale: already in this batch, so it must not count again.
            (gone("dlv_001"), note("far", StreakEvent::PermanentFailure, 410)),
            (delivered("dlv_002"), note("healed", StreakEvent::Success, 200)),
        ];
        store.put_endpoint("healed", &stored, 50).unwrap();
        for (item, n) in batch {
            let (reply, answer) = oneshot::channel();
            jobs.push(Job {
                item: Some((item, n)),
                reply,
            });
            answers.push(answer);
        }
        writer(&store, &endpoints).write_batch(jobs);
        let mut changes = Vec::new();
        for a in answers {
            changes.push(a.await.unwrap().unwrap().endpoint);
        }
        let streak = |n| crate::store::EndpointRecord {
            paused: n >= 3,
            streak: n,
            last_status: Some(410),
        };
        assert_eq!(
            changes,
            vec![
                EndpointChange::Changed(streak(1)),
                EndpointChange::Paused(streak(3)),
                EndpointChange::None,
                EndpointChange::Changed(Default::default()),
            ]
        );
        // Written with the batch: the pause (synced), the new streak, the healed one gone.
        assert_eq!(store.endpoint("far").unwrap(), Some(streak(3)));
        assert_eq!(store.endpoint("near").unwrap(), Some(streak(1)));
        assert_eq!(store.endpoint("healed").unwrap(), None);
        assert!(endpoints.is_paused("far"));
    }
}
