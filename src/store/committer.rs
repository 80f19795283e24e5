//! Group commit for accepts. One thread owns every synced write: it takes all accepts
//! queued while the previous fsync ran, checks them for duplicates (against the store and
//! each other, so two racing requests with the same event id cannot both be stored), writes
//! them as one `WriteBatch` with `sync = true`, and only then answers each caller. Under
//! load one fsync covers hundreds of requests; when idle a lone accept is written at once.

use std::collections::HashMap;
use std::sync::Arc;

use rocksdb::{WriteBatch, WriteOptions, DB};
use tokio::sync::oneshot;

use super::codec::{MessageRecord, Routing};
use super::floor::DueFloor;
use super::{keys, Accepted, CounterDeltas, NewMessage, StoreError};
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
    reply: oneshot::Sender<Result<Accepted, StoreError>>,
}

/// Handle to the committer thread.
pub(super) struct Committer {
    batcher: Batcher<Job>,
}

impl Committer {
    /// Starts the thread.
    pub(super) fn start(db: Arc<DB>, due_floor: Arc<DueFloor>) -> Committer {
        let mut synced = WriteOptions::default();
        synced.set_sync(true);
        let batcher = Batcher::start("courier-commit", QUEUE, MAX_BATCH, move |jobs| {
            commit(&db, &due_floor, &synced, jobs)
        });
        Committer { batcher }
    }

    /// Queues an accept and waits until it is durable (or refused).
    pub(super) async fn submit(&self, msg: NewMessage) -> Result<Accepted, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            record_bytes: msg.record.encode(),
            payload_bytes: msg.payload.encode(),
            record: msg.record,
            reply,
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

fn commit(db: &DB, due_floor: &DueFloor, synced: &WriteOptions, jobs: Vec<Job>) {
    let cf = |name| db.cf_handle(name).expect("column family opened at start");
    // Sized for the records up front: growing the batch's buffer copies it each time.
    let bytes: usize = jobs
        .iter()
        .map(|j| j.record_bytes.len() + j.payload_bytes.len() + 4 * j.record.id.len() + 256)
        .sum();
    let mut batch = WriteBatch::with_capacity_bytes(bytes);
    let mut counters = CounterDeltas::default();
    let mut in_batch: HashMap<Vec<u8>, String> = HashMap::new();
    let mut stored = Vec::with_capacity(jobs.len());
    let mut min_due = u64::MAX;
    for job in jobs {
        let rec = &job.record;
        let event_key = keys::pair_key(&rec.event_id, &rec.target);
        if let Some(id) = in_batch.get(&event_key) {
            let _ = job.reply.send(Ok(Accepted::Duplicate { id: id.clone() }));
            continue;
        }
        match db.get_pinned_cf(cf(keys::EVENTS), &event_key) {
            Ok(Some(id)) => {
                let id = String::from_utf8_lossy(&id).into_owned();
                let _ = job.reply.send(Ok(Accepted::Duplicate { id }));
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                let _ = job.reply.send(Err(StoreError::Rocks(e)));
                continue;
            }
        }
        let id = rec.id.as_str();
        let routing = Routing {
            host: rec.host.clone(),
            endpoint: rec.endpoint.clone(),
        };
        batch.put_cf(cf(keys::MESSAGES), id.as_bytes(), &job.record_bytes);
        batch.put_cf(cf(keys::PAYLOADS), id.as_bytes(), &job.payload_bytes);
        min_due = min_due.min(rec.next_attempt_at_ms);
        batch.put_cf(
            cf(keys::DUE),
            keys::time_key(rec.next_attempt_at_ms, id),
            routing.encode(),
        );
        batch.put_cf(cf(keys::STATES), keys::state_key(State::Pending.to_byte(), id), []);
        batch.put_cf(cf(keys::EVENTS), &event_key, id.as_bytes());
        counters.add(keys::COUNT_OPEN, 1);
        counters.add(&keys::endpoint_open_key(&rec.endpoint), 1);
        in_batch.insert(event_key, rec.id.clone());
        stored.push(job.reply);
    }
    if stored.is_empty() {
        return;
    }
    counters.write_into(&mut batch, cf(keys::META));
    match db.write_opt(batch, synced) {
        Ok(()) => {
            // Only now are the entries visible: report them to the scheduler's floor.
            due_floor.wrote(min_due);
            for reply in stored {
                let _ = reply.send(Ok(Accepted::New));
            }
        }
        Err(e) => {
            tracing::error!(error = %e, batch = stored.len(), "synced write of accepted messages failed");
            for reply in stored {
                let _ = reply.send(Err(StoreError::Rocks(e.clone())));
            }
        }
    }
}
