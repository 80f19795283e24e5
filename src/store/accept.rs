//! Group commit for accepts, as one call: [`Store::accept_batch`] checks a batch of accepts
//! for duplicates (against the store and each other, so two racing requests with the same
//! event id cannot both be stored), writes the new ones as one `WriteBatch` with
//! `sync = true`, and only then says what became of each. The thread that gathers the batch
//! (delivery's store writer) is the caller's: under load one fsync covers hundreds of
//! requests; when idle a lone accept is written at once.

use rocksdb::WriteBatch;

use super::codec::MessageRecord;
use super::floor::DueFloor;
use super::lines::LineLocks;
use super::tx::Tx;
use super::{keys, sealing, Accepted, Claim, Leased, NewMessage, Payload, Store, StoreError};
use crate::model::{self, State};

/// One accept ready for its batch. The record and payload are encoded by its caller (see
/// [`Store::accepting`]), so the one thread that writes batches spends its time on the batch
/// and the fsync, not on serialising or sealing.
#[derive(Debug)]
pub struct Accepting {
    record: MessageRecord,
    record_bytes: Vec<u8>,
    payload_bytes: Vec<u8>,
    /// What is sent, when it is written claimed: with `record`, the message to run (kept
    /// apart until then, so the record is not copied for the batch).
    claimed: Option<Payload>,
}

/// What became of one accept of a batch.
// Made and moved once per accept; boxing the message would cost an allocation each.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Settled {
    /// Stored (and synced); with the message to run when it was written claimed.
    New(Option<Leased>),
    /// The same event id and target were accepted before: nothing was stored.
    Duplicate {
        /// The first message's delivery id.
        id: String,
    },
    /// Not stored (the write, or a read it needed, failed).
    Failed(StoreError),
}

impl Settled {
    /// The caller's answer.
    pub fn answer(&self) -> Result<Accepted, StoreError> {
        match self {
            Settled::New(_) => Ok(Accepted::New),
            Settled::Duplicate { id } => Ok(Accepted::Duplicate { id: id.clone() }),
            Settled::Failed(e) => Err(e.again()),
        }
    }
}

impl Store {
    /// `msg` ready for [`Store::accept_batch`], its payload sealed here, on the caller's
    /// thread (CPU only, about a microsecond per KiB). With `claim`, a message that is not
    /// ordered is written already claimed (in flight, no due entry), so no scan, claim read
    /// or claim write stands between its 202 and its first attempt: [`Settled::New`] gives
    /// it back to run. Only the head of an ordered line may start: the batch decides that.
    pub fn accepting(&self, msg: NewMessage, claim: bool) -> Accepting {
        let ring = &self.options.keyring;
        let payload_bytes = sealing::stored_payload(ring, true, msg.record.id.as_bytes(), &msg.payload);
        let NewMessage { mut record, payload } = msg;
        let claimed = (claim && record.fifo.is_none()).then(|| {
            record.state = State::InFlight;
            payload
        });
        Accepting {
            // An ordered record is encoded in its batch, once its place is known.
            record_bytes: record.fifo.map_or_else(|| record.encode(), |_| Vec::new()),
            payload_bytes,
            record,
            claimed,
        }
    }

    /// Durably stores a batch of new messages (one fsync), each unless one with the same
    /// event id and target exists; says what became of each, in the batch's order. One
    /// batch is written at a time.
    pub fn accept_batch(&self, batch: Vec<Accepting>) -> Vec<Settled> {
        let _one = self.accepting.lock().unwrap_or_else(|p| p.into_inner());
        let _counters = self.counter_gate.read().unwrap_or_else(|p| p.into_inner());
        commit(&self.db, &self.due_floor, &self.lines, batch, |batch| {
            if self.faults.fail_accept() {
                return Err(StoreError::Injected);
            }
            self.faults.before_write()?;
            self.db.write_opt(batch, &self.synced).map_err(StoreError::Rocks)
        })
    }

    /// Durably stores one new message, as a batch of its own (tests; courier batches).
    #[cfg(test)]
    pub async fn accept(&self, msg: NewMessage) -> Result<Accepted, StoreError> {
        let accepting = self.accepting(msg, false);
        self.accept_batch(vec![accepting]).remove(0).answer()
    }
}

/// Checks a batch of accepts for duplicates and writes the new ones with `write` (the
/// synced write; a seam so tests can make it fail as a full disk does).
fn commit(
    db: &rocksdb::DB,
    due_floor: &DueFloor,
    lines: &LineLocks,
    batch: Vec<Accepting>,
    write: impl FnOnce(WriteBatch) -> Result<(), StoreError>,
) -> Vec<Settled> {
    // Ordered messages: their lines are locked from the head-or-member decision until the
    // batch is on disk, so no promotion reads a line this batch is changing (see `lines`).
    let ordered: Vec<String> = batch
        .iter()
        .filter(|a| a.record.fifo.is_some())
        .map(|a| a.record.endpoint.clone())
        .collect();
    let _lines = lines.lock(ordered.iter().map(String::as_str));
    let mut gathered = Gathered::new(db, &batch);
    let mut settled: Vec<Option<Settled>> = Vec::with_capacity(batch.len());
    for (i, accepting) in batch.into_iter().enumerate() {
        settled.push(gathered.add(i, accepting));
    }
    if !gathered.stored.is_empty() {
        gathered.write(due_floor, write, &mut settled);
    }
    settled
        .into_iter()
        .map(|s| s.expect("every accept of a batch is settled"))
        .collect()
}

/// One commit's write batch as it is gathered, and what waits for it to be durable.
struct Gathered<'a> {
    tx: Tx<'a>,
    /// Event key to message id, for the accepts already in this batch.
    in_batch: foldhash::HashMap<keys::Key, String>,
    /// Where each stored accept is in the batch, with the message to run.
    stored: Vec<(usize, Option<Leased>)>,
    /// A duplicate of a message in this very batch is answered with the batch's result:
    /// a 202 for it before the synced write would acknowledge what may never be stored
    /// (the write can fail, the process can die before the fsync).
    in_batch_duplicates: Vec<(usize, String)>,
}

impl<'a> Gathered<'a> {
    fn new(db: &'a rocksdb::DB, batch: &[Accepting]) -> Self {
        // Sized for the records up front: growing the batch's buffer copies it each time.
        let bytes: usize = batch
            .iter()
            .map(|a| a.record_bytes.len() + a.payload_bytes.len() + 4 * a.record.id.len() + 256)
            .sum();
        Gathered {
            tx: Tx::with_capacity(db, bytes),
            in_batch: Default::default(),
            stored: Vec::with_capacity(batch.len()),
            in_batch_duplicates: Vec::new(),
        }
    }

    /// Writes the batch with `write` and settles what waited for it.
    fn write(
        self,
        due_floor: &DueFloor,
        write: impl FnOnce(WriteBatch) -> Result<(), StoreError>,
        settled: &mut [Option<Settled>],
    ) {
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
        let failed = |e: &StoreError| Settled::Failed(e.again());
        for (i, claimed) in self.stored {
            settled[i] = Some(outcome.as_ref().map_or_else(failed, |()| Settled::New(claimed)));
        }
        for (i, id) in self.in_batch_duplicates {
            settled[i] = Some(outcome.as_ref().map_or_else(failed, |()| Settled::Duplicate { id }));
        }
    }

    /// Adds the `i`th accept to the batch, or settles it at once (a duplicate of a stored
    /// message, or a failed read).
    fn add(&mut self, i: usize, mut accepting: Accepting) -> Option<Settled> {
        let rec = &accepting.record;
        let event_key = keys::pair_key(&rec.event_id, &rec.target);
        // An event id made from this message's own (new) delivery id names no earlier
        // message, in this batch or the store: there is nothing to look up.
        let own = model::own_event_id(&rec.id, &rec.event_id);
        if let Some(id) = self.in_batch.get(&event_key).filter(|_| !own) {
            self.in_batch_duplicates.push((i, id.clone()));
            return None;
        }
        let first = match own {
            true => Ok(None),
            false => accepted_before(self.tx.db, &event_key, &rec.event_id, &rec.target),
        };
        match first {
            Ok(Some(id)) => Some(Settled::Duplicate { id }),
            Ok(None) => match self.place(&mut accepting) {
                Ok(queued) => {
                    self.put(&accepting, &event_key, queued);
                    self.in_batch.insert(event_key, accepting.record.id.clone());
                    let Accepting { record, claimed, .. } = accepting;
                    self.stored.push((
                        i,
                        claimed.map(|payload| Leased::of(NewMessage { record, payload }, Claim::AtAccept)),
                    ));
                    None
                }
                Err(e) => Some(Settled::Failed(e)),
            },
            Err(e) => Some(Settled::Failed(e)),
        }
    }

    /// Whether the message is queued (gets a due entry). An ordered message is queued only
    /// as the head of its line; otherwise it waits in the line with no due entry (and its
    /// record carries its place).
    fn place(&mut self, a: &mut Accepting) -> Result<bool, StoreError> {
        if a.record.fifo.is_none() {
            return Ok(a.record.state == State::Pending);
        }
        a.record.state = State::Pending;
        let head = self.tx.join(&mut a.record)?;
        a.record_bytes = a.record.encode();
        Ok(head)
    }

    /// Puts the message's record, payload, due entry (when `queued`), state and event keys.
    fn put(&mut self, a: &Accepting, event_key: &[u8], queued: bool) {
        let rec = &a.record;
        let id = rec.id.as_str();
        let tx = &mut self.tx;
        tx.put(keys::MESSAGES, id, &a.record_bytes);
        tx.put(keys::PAYLOADS, id, &a.payload_bytes);
        // A message claimed at accept (its first attempt starts once this write is durable)
        // is stored in flight with no due entry, as a claim would leave it; a crash before
        // its result puts it back in the queue like any other attempt in flight.
        if queued {
            tx.enqueue(rec);
        }
        tx.put(keys::STATES, keys::state_key(rec.state.to_byte(), id), []);
        // A message whose event id is its own delivery id's is found by that id.
        if !model::own_event_id(id, &rec.event_id) {
            tx.put(keys::EVENTS, event_key, id);
        }
        tx.count_open(&rec.endpoint, 1);
    }
}

/// The message accepted before with `event_id` for `target`, if any: the `events` index,
/// else (an event id of the form courier makes from a delivery id) that message, when it
/// carries the pair.
fn accepted_before(
    db: &rocksdb::DB,
    event_key: &[u8],
    event_id: &str,
    target: &str,
) -> Result<Option<String>, StoreError> {
    if let Some(id) = super::get(db, keys::EVENTS, event_key)? {
        return Ok(Some(String::from_utf8_lossy(&id).into_owned()));
    }
    let Some(id) = model::delivery_id_of_event(event_id) else {
        return Ok(None);
    };
    let found = match super::message_in(db, &id) {
        Ok(found) => found,
        // A record that does not read cannot say it is the same message: this one is
        // stored (a possible duplicate rather than a refused accept).
        Err(StoreError::Codec { .. }) => None,
        Err(e) => return Err(e),
    };
    Ok(found
        .filter(|rec| rec.event_id == event_id && rec.target == target)
        .map(|_| id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::message;
    use crate::store::StoreOptions;

    fn open() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("data"), StoreOptions::default()).unwrap();
        (dir, store)
    }

    fn batch(store: &Store, msgs: Vec<NewMessage>) -> Vec<Accepting> {
        msgs.into_iter().map(|m| store.accepting(m, false)).collect()
    }

    /// Finding: a second accept of the same (event id, target) in one batch was answered
    /// `Duplicate` (a 202) before the batch's synced write, so a failed write left the
    /// duplicate sender with a 202 for a message that was never stored.
    #[test]
    fn a_duplicate_in_a_failed_batch_gets_the_failure_not_a_202() {
        let (_dir, store) = open();
        let both = batch(&store, vec![message("dlv_1", "evt", 10), message("dlv_2", "evt", 10)]);
        let settled = commit(&store.db, &store.due_floor, &store.lines, both, |_| {
            Err(StoreError::Panicked("disk full (test)".into()))
        });
        assert!(settled[0].answer().is_err(), "the first sender gets the failure");
        assert!(
            settled[1].answer().is_err(),
            "the duplicate sender must not get a 202 for what was not stored"
        );
        assert!(store.message("dlv_1").unwrap().is_none());
    }

    #[test]
    fn a_duplicate_in_a_written_batch_is_answered_after_the_write() {
        let (_dir, store) = open();
        let three = batch(
            &store,
            vec![
                message("dlv_1", "evt", 10),
                message("dlv_2", "evt", 10),
                message("dlv_3", "evt-other", 10),
            ],
        );
        let answers: Vec<_> = store.accept_batch(three).iter().map(|s| s.answer().unwrap()).collect();
        assert_eq!(
            answers,
            [Accepted::New, Accepted::Duplicate { id: "dlv_1".into() }, Accepted::New]
        );
        assert!(store.message("dlv_1").unwrap().is_some());
        assert!(
            store.message("dlv_2").unwrap().is_none(),
            "the duplicate stores nothing"
        );
    }
}
