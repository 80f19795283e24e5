//! Parking: the messages of a paused endpoint are moved out of the due queue into the
//! `parked` set (endpoint ‖ 0 ‖ id), so the scheduler does not meet them on every pass;
//! a resume puts them back, due at once.
//!
//! What keeps a parked message from being forgotten:
//! - the caller decides to park and writes the park under the same gate as a resume
//!   ([`crate::context::Context::set_paused`]), so a resume cannot slip between the
//!   decision and the write;
//! - a resume first persists the endpoint as active, then moves its parked messages back in
//!   batches; if courier dies in between, [`Store::parked_endpoints`] lets startup find the
//!   endpoints whose messages are still parked and requeue those of active ones.
//!
//! One message that cannot be read holds up no other. A park that cannot read a record
//! leaves its entry in the queue, held back as the scheduler's lease holds it (see
//! `lease`), and parks the rest. A parked key keeps the entry it replaced (its due time and
//! routing), so a resume that cannot read a record puts that entry back as it was (the record was not
//! changed by the park, so it agrees) instead of leaving the message parked behind an
//! active endpoint; the scheduler's lease then meets the unreadable record and holds it
//! back until it reads. Keys written before the entry was kept (an empty value) are left
//! parked for the next resume or start.

use super::tx::Tx;
use super::{keys, DueEntry, State, Store, StoreError};

/// The due entry a parked key replaced: its due time and encoded routing.
type ParkedEntry = (u64, Vec<u8>);

/// Messages moved per write when an endpoint resumes.
const UNPARK_BATCH: usize = 1000;

impl Store {
    /// Moves due messages of paused endpoints out of the queue into their endpoints' parked
    /// sets, in one write, at `now_ms`, so the scheduler does not see them again until the
    /// endpoint resumes. An entry whose record cannot be read stays in the queue, held back
    /// (see the module doc).
    pub fn park_many(&self, entries: &[DueEntry], now_ms: u64) -> Result<(), StoreError> {
        let _guards = super::lock_stripes(&self.stripes, entries.iter().map(|e| e.id.as_str()));
        let mut tx = Tx::reading(&self.db, &self.faults);
        for entry in entries {
            let rec = match self.message(&entry.id) {
                Ok(rec) => rec,
                Err(e) => {
                    tracing::error!(delivery_id = %entry.id, error = %e,
                        "parking a message failed: its record does not read; it stays queued and is tried again");
                    self.hold_back(entry, now_ms);
                    continue;
                }
            };
            tx.delete(keys::DUE, keys::time_key(entry.due_ms, &entry.id));
            if rec.is_some_and(|r| r.state == State::Pending && r.next_attempt_at_ms == entry.due_ms) {
                tx.put(
                    keys::PARKED,
                    keys::pair_key(&entry.routing.endpoint, &entry.id),
                    [&entry.due_ms.to_be_bytes()[..], &entry.routing.encode()].concat(),
                );
            }
        }
        self.commit(tx, false)
    }

    /// Puts every parked message of `endpoint` back in the queue, due at `now_ms`, a batch
    /// of `UNPARK_BATCH` per write. Returns how many went back.
    pub fn unpark_endpoint(&self, endpoint: &str, now_ms: u64) -> Result<usize, StoreError> {
        let prefix = keys::pair_prefix(endpoint);
        let mut moved = 0;
        let mut after: Option<String> = None;
        loop {
            // Each batch continues after the last one: seeking from the prefix again would
            // step over every parked key already moved (now deletion tombstones), which made
            // resuming a large backlog quadratic.
            let parked = self.parked_ids(&prefix, after.as_deref())?;
            let Some((last, _)) = parked.last() else {
                return Ok(moved);
            };
            after = Some(last.clone());
            let _guards = super::lock_stripes(&self.stripes, parked.iter().map(|(id, _)| id.as_str()));
            let mut tx = Tx::reading(&self.db, &self.faults);
            for (id, parked_due) in &parked {
                let rec = match (self.message(id), parked_due) {
                    (Ok(rec), _) => rec,
                    (Err(e), Some((due_ms, routing))) => {
                        // Back in the queue as it was: the record (unchanged by the park)
                        // still says `due_ms`, and the lease holds it back until it reads.
                        tracing::error!(delivery_id = %id, error = %e,
                            "resuming a message whose record does not read: queued again as it was parked");
                        tx.delete(keys::PARKED, keys::pair_key(endpoint, id));
                        tx.put_due(*due_ms, id, routing);
                        continue;
                    }
                    (Err(e), None) => {
                        tracing::error!(delivery_id = %id, error = %e,
                            "resuming a message whose record does not read: it stays parked until the next resume or start");
                        continue;
                    }
                };
                tx.delete(keys::PARKED, keys::pair_key(endpoint, id));
                if let Some(mut rec) = rec.filter(|r| r.state == State::Pending) {
                    rec.next_attempt_at_ms = now_ms;
                    tx.enqueue(&rec);
                    tx.put_record(&rec);
                    moved += 1;
                }
            }
            self.commit(tx, false)?;
        }
    }

    /// Up to [`UNPARK_BATCH`] parked ids under `prefix`, after `after` when given, each with
    /// the due entry it replaced (due time and encoded routing), if the key kept it.
    fn parked_ids(&self, prefix: &[u8], after: Option<&str>) -> Result<Vec<(String, Option<ParkedEntry>)>, StoreError> {
        let range = (&keys::after(prefix, after)[..], Some(keys::prefix_end(prefix)));
        let (ids, _) = super::page(&self.db, keys::PARKED, range, UNPARK_BATCH, |k, v| {
            let due = (v.len() > 8).then(|| {
                let (ms, routing) = v.split_at(8);
                (
                    u64::from_be_bytes(ms.try_into().expect("eight bytes")),
                    routing.to_vec(),
                )
            });
            Ok(Some((String::from_utf8_lossy(&k[prefix.len()..]).into_owned(), due)))
        })?;
        Ok(ids)
    }

    /// Every endpoint with at least one parked message (one seek per endpoint, not one
    /// read per message).
    pub fn parked_endpoints(&self) -> Result<Vec<String>, StoreError> {
        self.endpoints_in(keys::PARKED)
    }
}
