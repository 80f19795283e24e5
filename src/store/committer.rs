//! Group commit for accepts. One thread owns every synced write: it takes all accepts
//! queued while the previous fsync ran, checks them for duplicates (against the store and
//! each other, so two racing requests with the same event id cannot both be stored), writes
//! them as one `WriteBatch` with `sync = true`, and only then answers each caller. Under
//! load one fsync covers hundreds of requests; when idle a lone accept is written at once.

use std::collections::HashMap;
use std::sync::Arc;

use rocksdb::{WriteBatch, WriteOptions, DB};
use tokio::sync::oneshot;

use super::codec::MessageRecord;
use super::floor::DueFloor;
use super::lines::LineLocks;
use super::tx::Tx;
use super::{cf_of, keys, Accepted, Faults, StoreError};
use crate::batcher::Batcher;
use crate::model::State;

/// The most accepts one batch carries; bounds the latency a batch adds to its last member.
const MAX_BATCH: usize = 1024;
/// Accepts waiting for the committer; past this, callers wait (backpressure).
const QUEUE: usize = 8192;

/// One accept waiting for its batch. The records are encoded by the caller, so the one
/// commit thread spends its time on the batch and the fsync, not on serialising.
pub(super) struct Job {
    record: MessageRecord,
    record_bytes: Vec<u8>,
    payload_bytes: Vec<u8>,
    reply: Waiter,
}

/// Run on the commit thread once an accept's outcome is known (`None`: not stored), just
/// before its caller is answered. What must happen whether or not the caller is still there
/// (the first attempt's start, the accept's count) happens here, and is done by the time a
/// 202 is sent; dropped unrun when the accept never reached a batch.
pub(super) type Then = Box<dyn FnOnce(Option<&Accepted>) + Send>;

/// Who waits for an accept: its caller, and what runs once it is settled.
pub(super) struct Waiter {
    reply: oneshot::Sender<Result<Accepted, StoreError>>,
    then: Then,
}

impl Waiter {
    /// Runs `then`, then answers the caller.
    fn answer(self, outcome: Result<Accepted, StoreError>) {
        (self.then)(outcome.as_ref().ok());
        let _ = self.reply.send(outcome);
    }
}

/// Handle to the committer thread.
pub(super) struct Committer {
    batcher: Batcher<Job>,
}

impl Committer {
    pub(super) fn start(
        db: Arc<DB>,
        due_floor: Arc<DueFloor>,
        faults: Arc<Faults>,
        counter_gate: Arc<std::sync::RwLock<()>>,
        lines: Arc<LineLocks>,
    ) -> Committer {
        let mut synced = WriteOptions::default();
        synced.set_sync(true);
        // The commit thread works for ingest: it runs at ingest's priority (see `priority`).
        let lower = crate::sys::priority::lower_current_thread;
        let batcher = Batcher::start_with("courier-commit", QUEUE, MAX_BATCH, lower, move |jobs| {
            let _counters = counter_gate.read().unwrap_or_else(|p| p.into_inner());
            commit(&db, &due_floor, &lines, jobs, |batch| {
                if faults.fail_accept() {
                    return Err(StoreError::Injected);
                }
                faults.before_write()?;
                db.write_opt(batch, &synced).map_err(StoreError::Rocks)
            })
        });
        Committer { batcher }
    }

    /// Queues an accept (its record, and its payload already encoded) and waits until it
    /// is durable (or refused); `then` runs on the commit thread once that is known.
    pub(super) async fn submit(
        &self,
        record: MessageRecord,
        payload_bytes: Vec<u8>,
        then: Then,
    ) -> Result<Accepted, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            // An ordered record is encoded on the commit thread, once its place is known.
            record_bytes: record.fifo.map_or_else(|| record.encode(), |_| Vec::new()),
            payload_bytes,
            record,
            reply: Waiter { reply, then },
        };
        if !self.batcher.send(job).await {
            return Err(StoreError::Closed);
        }
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Stops taking accepts and waits until every queued one is answered.
    pub(super) fn stop(&self) {
        self.batcher.stop();
    }
}

/// Checks a batch of accepts for duplicates, writes the new ones with `write` (the synced
/// write; a seam so tests can make it fail as a full disk does) and answers every caller.
fn commit(
    db: &DB,
    due_floor: &DueFloor,
    lines: &LineLocks,
    jobs: Vec<Job>,
    write: impl FnOnce(WriteBatch) -> Result<(), StoreError>,
) {
    // Ordered messages: their lines are locked from the head-or-member decision until the
    // batch is on disk, so no promotion reads a line this batch is changing (see `lines`).
    let ordered: Vec<String> = jobs
        .iter()
        .filter(|j| j.record.fifo.is_some())
        .map(|j| j.record.endpoint.clone())
        .collect();
    let _lines = lines.lock(ordered.iter().map(String::as_str));
    let mut gathered = Gathered::new(db, &jobs);
    for job in jobs {
        gathered.add(job);
    }
    if !gathered.stored.is_empty() {
        gathered.write(due_floor, write);
    }
}

/// One commit's write batch as it is gathered, and who to answer once it is durable.
struct Gathered<'a> {
    tx: Tx<'a>,
    /// Event key to message id, for the accepts already in this batch.
    in_batch: HashMap<Vec<u8>, String>,
    stored: Vec<Waiter>,
    /// A duplicate of a message in this very batch is answered with the batch's result:
    /// a 202 for it before the synced write would acknowledge what may never be stored
    /// (the write can fail, the process can die before the fsync).
    in_batch_duplicates: Vec<(Waiter, String)>,
}

impl<'a> Gathered<'a> {
    fn new(db: &'a DB, jobs: &[Job]) -> Self {
        // Sized for the records up front: growing the batch's buffer copies it each time.
        let bytes: usize = jobs
            .iter()
            .map(|j| j.record_bytes.len() + j.payload_bytes.len() + 4 * j.record.id.len() + 256)
            .sum();
        Gathered {
            tx: Tx::with_capacity(db, bytes),
            in_batch: HashMap::new(),
            stored: Vec::with_capacity(jobs.len()),
            in_batch_duplicates: Vec::new(),
        }
    }

    /// Writes the batch with `write` and answers every caller with its result.
    fn write(self, due_floor: &DueFloor, write: impl FnOnce(WriteBatch) -> Result<(), StoreError>) {
        // Nothing to settle: accepts only join lines.
        let (batch, written) = self.tx.seal();
        let outcome = write(batch);
        match &outcome {
            // Only now are the entries visible: report them to the scheduler's floor.
            Ok(()) => {
                if let Some(due) = written.min_due {
                    due_floor.wrote(due);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, batch = self.stored.len(), "synced write of accepted messages failed")
            }
        }
        let answer = |accepted: Accepted| match &outcome {
            Ok(()) => Ok(accepted),
            Err(e) => Err(e.again()),
        };
        for waiter in self.stored {
            waiter.answer(answer(Accepted::New));
        }
        for (waiter, id) in self.in_batch_duplicates {
            waiter.answer(answer(Accepted::Duplicate { id }));
        }
    }

    /// Adds one accept to the batch, or answers it at once (a duplicate of a stored
    /// message, or a failed read).
    fn add(&mut self, mut job: Job) {
        let event_key = keys::pair_key(&job.record.event_id, &job.record.target);
        if let Some(id) = self.in_batch.get(&event_key) {
            self.in_batch_duplicates.push((job.reply, id.clone()));
            return;
        }
        let db = self.tx.db;
        let answered = match db.get_pinned_cf(cf_of(db, keys::EVENTS), &event_key) {
            Ok(Some(id)) => Ok(Accepted::Duplicate {
                id: String::from_utf8_lossy(&id).into_owned(),
            }),
            Ok(None) => match self.place(&mut job) {
                Ok(queued) => {
                    self.put(&job, &event_key, queued);
                    self.in_batch.insert(event_key, job.record.id.clone());
                    self.stored.push(job.reply);
                    return;
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(StoreError::Rocks(e)),
        };
        job.reply.answer(answered);
    }

    /// Whether the message is queued (gets a due entry). An ordered message is queued only
    /// as the head of its line; otherwise it waits in the line with no due entry (and its
    /// record carries its place).
    fn place(&mut self, job: &mut Job) -> Result<bool, StoreError> {
        if job.record.fifo.is_none() {
            return Ok(job.record.state == State::Pending);
        }
        job.record.state = State::Pending;
        let head = self.tx.join(&mut job.record)?;
        job.record_bytes = job.record.encode();
        Ok(head)
    }

    /// Puts the message's record, payload, due entry (when `queued`), state and event keys.
    fn put(&mut self, job: &Job, event_key: &[u8], queued: bool) {
        let rec = &job.record;
        let id = rec.id.as_str();
        let tx = &mut self.tx;
        tx.put(keys::MESSAGES, id, &job.record_bytes);
        tx.put(keys::PAYLOADS, id, &job.payload_bytes);
        // A message claimed at accept (its first attempt starts once this write is durable)
        // is stored in flight with no due entry, as a claim would leave it; a crash before
        // its result puts it back in the queue like any other attempt in flight.
        if queued {
            tx.enqueue(rec);
        }
        tx.put(keys::STATES, keys::state_key(rec.state.to_byte(), id), []);
        tx.put(keys::EVENTS, event_key, id);
        tx.count_open(&rec.endpoint, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::message;
    use crate::store::NewMessage;
    use crate::store::{Store, StoreOptions};

    fn job(msg: NewMessage) -> (Job, oneshot::Receiver<Result<Accepted, StoreError>>) {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            record_bytes: msg.record.encode(),
            payload_bytes: msg.payload.encode(),
            record: msg.record,
            reply: Waiter {
                reply,
                then: Box::new(|_| {}),
            },
        };
        (job, answer)
    }

    fn open() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("data"), StoreOptions::default()).unwrap();
        (dir, store)
    }

    /// Finding: a second accept of the same (event id, target) in one batch was answered
    /// `Duplicate` (a 202) before the batch's synced write, so a failed write left the
    /// duplicate sender with a 202 for a message that was never stored.
    #[test]
    fn a_duplicate_in_a_failed_batch_gets_the_failure_not_a_202() {
        let (_dir, store) = open();
        let (first, a1) = job(message("dlv_1", "evt", 10));
        let (dup, a2) = job(message("dlv_2", "evt", 10));
        commit(&store.db, &store.due_floor, &store.lines, vec![first, dup], |_| {
            Err(StoreError::Panicked("disk full (test)".into()))
        });
        assert!(
            a1.blocking_recv().unwrap().is_err(),
            "the first sender gets the failure"
        );
        assert!(
            a2.blocking_recv().unwrap().is_err(),
            "the duplicate sender must not get a 202 for what was not stored"
        );
        assert!(store.message("dlv_1").unwrap().is_none());
    }

    #[test]
    fn a_duplicate_in_a_written_batch_is_answered_after_the_write() {
        let (_dir, store) = open();
        let (first, a1) = job(message("dlv_1", "evt", 10));
        let (dup, a2) = job(message("dlv_2", "evt", 10));
        let (other, a3) = job(message("dlv_3", "evt-other", 10));
        let db = store.db.clone();
        commit(
            &store.db,
            &store.due_floor,
            &store.lines,
            vec![first, dup, other],
            move |batch| db.write(batch).map_err(StoreError::Rocks),
        );
        assert_eq!(a1.blocking_recv().unwrap().unwrap(), Accepted::New);
        assert_eq!(
            a2.blocking_recv().unwrap().unwrap(),
            Accepted::Duplicate { id: "dlv_1".into() }
        );
        assert_eq!(a3.blocking_recv().unwrap().unwrap(), Accepted::New);
        assert!(store.message("dlv_1").unwrap().is_some());
        assert!(
            store.message("dlv_2").unwrap().is_none(),
            "the duplicate stores nothing"
        );
    }
}
