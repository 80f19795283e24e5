//! One store write in the making: its `WriteBatch`, its counter changes summed, its line
//! changes (see `lines`), and what must follow once it is on disk.
//!
//! Every transition is staged on a [`Tx`] and written with [`Store::commit`] (an accept
//! batch writes its own, synced): the due entries a batch writes are reported to the due
//! floor only after the write (the floor's one rule, see `floor`), and the deleted heads it
//! makes or settles become or stop being ghosts only then, so a failed write changes nothing.

use std::collections::{HashMap, HashSet};

use rocksdb::{WriteBatch, DB};

use super::{cf_of, keys, CounterDeltas, LineRecord, MessageRecord, Routing, State, Store, StoreError};

/// A write batch being staged, with what its writing must be followed by.
pub(super) struct Tx<'a> {
    pub(super) db: &'a DB,
    /// The store's fault switches, for the records a transaction reads (see
    /// [`Tx::message`]); tests and the simulator set them.
    faults: Option<&'a super::Faults>,
    b: WriteBatch,
    counters: CounterDeltas,
    pub(super) lines: LineTx,
    /// The earliest due entry this batch writes, for the due floor.
    min_due: Option<u64>,
}

/// What follows a written [`Tx`]: the due floor comes down to its earliest entry, and the
/// line changes' deleted heads are remembered or forgotten.
pub(super) struct Written {
    pub(super) min_due: Option<u64>,
    settled: Vec<String>,
    ghosted: Vec<(String, String)>,
}

impl<'a> Tx<'a> {
    pub(super) fn new(db: &'a DB) -> Self {
        Tx::with_capacity(db, 0)
    }

    /// A transaction whose record reads go through `faults` (see [`Tx::message`]).
    pub(super) fn reading(db: &'a DB, faults: &'a super::Faults) -> Self {
        Tx {
            faults: Some(faults),
            ..Tx::new(db)
        }
    }

    /// Reads a message record, as [`super::Store::message`] does.
    pub(super) fn message(&self, id: &str) -> Result<Option<super::MessageRecord>, StoreError> {
        if let Some(f) = self.faults {
            f.read_of(id)?;
        }
        super::message_in(self.db, id)
    }

    pub(super) fn with_capacity(db: &'a DB, bytes: usize) -> Self {
        Tx {
            db,
            faults: None,
            b: WriteBatch::with_capacity_bytes(bytes),
            counters: CounterDeltas::default(),
            lines: LineTx::default(),
            min_due: None,
        }
    }

    pub(super) fn put(&mut self, cf: &str, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        self.b.put_cf(cf_of(self.db, cf), key, value);
    }

    pub(super) fn delete(&mut self, cf: &str, key: impl AsRef<[u8]>) {
        self.b.delete_cf(cf_of(self.db, cf), key);
    }

    pub(super) fn delete_range(&mut self, cf: &str, from: Vec<u8>, to: Vec<u8>) {
        self.b.delete_range_cf(cf_of(self.db, cf), from, to);
    }

    pub(super) fn count(&mut self, key: &[u8], delta: i64) {
        self.counters.add(key, delta);
    }

    /// The open counters (all and the endpoint's) change by `delta`.
    pub(super) fn count_open(&mut self, endpoint: &str, delta: i64) {
        self.count(keys::COUNT_OPEN, delta);
        self.counters.add_owned(keys::endpoint_open_key(endpoint), delta);
    }

    /// Writes the record of `rec`.
    pub(super) fn put_record(&mut self, rec: &MessageRecord) {
        self.put(keys::MESSAGES, rec.id.as_bytes(), rec.encode());
    }

    /// The due entry of `rec` (at `next_attempt_at_ms`).
    pub(super) fn enqueue(&mut self, rec: &MessageRecord) {
        let routing = Routing {
            host: rec.host.clone(),
            endpoint: rec.endpoint.clone(),
        };
        self.put_due(rec.next_attempt_at_ms, &rec.id, &routing.encode());
    }

    /// A due entry (its routing encoded), reported to the due floor once written.
    pub(super) fn put_due(&mut self, at: u64, id: &str, routing: &[u8]) {
        self.put(keys::DUE, keys::time_key(at, id), routing);
        self.min_due = Some(self.min_due.map_or(at, |m| m.min(at)));
    }

    /// Moves `id` in the state index.
    pub(super) fn move_state(&mut self, id: &str, from: State, to: State) {
        if from != to {
            self.delete(keys::STATES, keys::state_key(from.to_byte(), id));
            self.put(keys::STATES, keys::state_key(to.to_byte(), id), []);
        }
    }

    /// The batch to write, and what follows once it is written.
    pub(super) fn seal(mut self) -> (WriteBatch, Written) {
        let (settled, ghosted) = self.lines.write_into(self.db, &mut self.b);
        self.counters.write_into(&mut self.b, cf_of(self.db, keys::META));
        let written = Written {
            min_due: self.min_due,
            settled,
            ghosted,
        };
        (self.b, written)
    }
}

impl Store {
    /// Writes `tx` (plainly, or synced for an operator), then reports its due entries and
    /// settles its ghosts; the caller holds the stripes `tx` was staged under.
    pub(super) fn commit(&self, tx: Tx<'_>, synced: bool) -> Result<(), StoreError> {
        let (b, written) = tx.seal();
        self.write(b, synced)?;
        self.lines.settle(written.settled, written.ghosted);
        if let Some(due) = written.min_due {
            self.due_floor.wrote(due);
        }
        Ok(())
    }
}

/// The line changes of one [`Tx`] (made by `lines`): line records read once and changed in memory (so
/// several accepts of one endpoint in one batch see each other), and the ghosts it makes
/// and settles. [`LineTx::write_into`] adds the changed records to the batch.
#[derive(Debug, Default)]
pub(super) struct LineTx {
    pub(super) records: HashMap<String, Option<LineRecord>>,
    pub(super) dirty: HashSet<String>,
    /// Per endpoint, the last member position promoted in this batch.
    pub(super) taken: HashMap<String, u64>,
    /// Ghosts this batch settles (forgotten once it is written).
    pub(super) settled: Vec<String>,
    /// Heads this batch deletes while their attempt is in flight (id, endpoint): ghosts
    /// once it is written, not before (a failed write changes nothing).
    pub(super) ghosted: Vec<(String, String)>,
}

impl LineTx {
    pub(super) fn is_empty(&self) -> bool {
        self.dirty.is_empty() && self.settled.is_empty()
    }

    /// Adds the changed line records to `b`; answers the ghosts settled and made.
    #[allow(clippy::type_complexity)]
    pub(super) fn write_into(self, db: &DB, b: &mut WriteBatch) -> (Vec<String>, Vec<(String, String)>) {
        for endpoint in &self.dirty {
            let key = keys::line_key(endpoint);
            match self.records.get(endpoint).and_then(Option::as_ref) {
                Some(line) => b.put_cf(cf_of(db, keys::LINES), key, line.encode()),
                None => b.delete_cf(cf_of(db, keys::LINES), key),
            }
        }
        (self.settled, self.ghosted)
    }
}
