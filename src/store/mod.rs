//! The durable store: RocksDB with one column family per concern.
//!
//! # Layout
//! One column family per concern, each with its key and value layout in [`keys`]: message
//! records apart from their payloads (a record is rewritten on every transition, a payload
//! never), indexes by due time, state, paused endpoint, event id and expiry, the attempt
//! history, endpoint state, ordered endpoints' lines, and counters.
//!
//! # Durability
//! Accepts are written in batches ([`Store::accept_batch`]: one `WriteBatch` written with
//! `sync = true`, one batch at a time); the caller gathers every accept queued meanwhile,
//! so concurrent requests share one fsync, and answers none before its batch is on disk. Every later transition
//! (claim, attempt result, replay) is a batch written without fsync: the WAL write reaches the
//! OS before the call returns, so a killed process loses nothing, and losing one on power
//! failure only repeats an attempt (at-least-once).
//!
//! # Concurrency
//! Read-modify-write of one message (worker, admin, retention) is serialised by a lock
//! striped over the id, so the store needs no global lock and an accept batch never waits
//! for one (new ids cannot collide with existing ones).

// The `Store` operations live in one child module per concern, each an `impl Store` block
// that sees the private fields and helpers below; each module's doc says what it holds.
mod accept;
mod audit;
mod claim;
pub mod codec;
mod counters;
mod endpoints;
mod error;
mod expiry;
mod finish;
mod floor;
mod format;
mod handoff;
pub mod keyfiles;
pub mod keys;
mod lease;
mod lifecycle;
mod lines;
mod operator;
mod parking;
pub mod seal;
mod sealing;
mod tx;
mod wire;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use rocksdb::{ColumnFamily, DBRawIterator, ReadOptions, WriteBatch, WriteOptions, DB};

pub use crate::model::Transition;
pub use accept::{Accepting, Settled};
pub use audit::Checked;
pub use codec::{
    AttemptRecord, CodecError, EndpointRecord, Fifo, LastAttempt, LineRecord, MessageRecord, Payload, Routing,
    SigningChoice,
};
pub(crate) use counters::CounterDeltas;
#[cfg(not(test))]
use error::walk_step;
#[cfg(not(test))]
pub use error::Faults;
pub use error::StoreError;
pub use expiry::Swept;
pub use floor::FloorMark;
pub use handoff::HandOff;
pub use lifecycle::keys_in_data_dir;
pub use operator::{ListFilter, Page};
pub use seal::{KeyId, Keyring};
pub use sealing::{check_keys, KeysInUse, Rekeyed};
#[cfg(test)]
pub(crate) use tests::faults::fail_walks;
#[cfg(test)]
use tests::faults::walk_step;
#[cfg(test)]
pub use tests::faults::{Faults, ItemFault};

use crate::model::State;

/// Tuning for [`Store::open`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How long delivered messages are kept (millis).
    pub retention_ms: u64,
    /// How long dead messages are kept (millis).
    pub dead_retention_ms: u64,
    /// Block cache size in bytes.
    pub block_cache_bytes: usize,
    /// Memtable size per column family in bytes.
    pub write_buffer_bytes: usize,
    /// The keys payloads are sealed with at rest (empty: stored plain).
    pub keyring: Keyring,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            retention_ms: 3 * 86_400_000,
            dead_retention_ms: 30 * 86_400_000,
            block_cache_bytes: 8 << 20,
            write_buffer_bytes: 4 << 20,
            keyring: Keyring::default(),
        }
    }
}

/// A message with its payload, to accept (its record pending, due at
/// `next_attempt_at_ms`) or as read from the store.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// The record.
    pub record: MessageRecord,
    /// What is sent.
    pub payload: Payload,
}

/// A message leased for an attempt (written in flight at its accept, or leased from the
/// due queue): its record `in_flight`, and what to send. Only the store makes one, so
/// holding one means no other attempt of the message runs.
#[derive(Debug)]
pub struct Leased {
    /// The record, `in_flight`.
    pub record: MessageRecord,
    /// What is sent.
    pub payload: Payload,
    /// How it was taken.
    pub claim: Claim,
}

/// How a message was taken for its attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Written in flight at its accept: stored as [`Leased::record`] says, and nothing but a
    /// delete changes it before its result (which is then staged on it, unread).
    AtAccept,
    /// Leased from the due queue: pending on disk, the lease in memory.
    FromQueue,
}

impl Leased {
    /// `msg`, its record marked in flight: called only by the store, where the lease is
    /// taken or written.
    pub(crate) fn of(mut msg: NewMessage, claim: Claim) -> Leased {
        msg.record.state = crate::model::State::InFlight;
        Leased {
            record: msg.record,
            payload: msg.payload,
            claim,
        }
    }
}

/// The answer to an accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accepted {
    /// Stored (and synced).
    New,
    /// The same event id and target were accepted before: nothing was stored.
    Duplicate {
        /// The first message's delivery id.
        id: String,
    },
}

/// One finished attempt, owned: what a result written again is made of (see
/// [`FinishedAttempt::as_finish`]).
#[derive(Debug, Clone)]
pub struct FinishedAttempt {
    /// The message.
    pub id: String,
    /// What happened (it becomes attempt number `attempts + 1` in the history).
    pub attempt: AttemptRecord,
    /// Where the message goes next.
    pub transition: Transition,
    /// When the attempt ended.
    pub now_ms: u64,
}

impl FinishedAttempt {
    /// The result as [`Store::finish_attempts`] takes it, staged on the stored record.
    pub fn as_finish(&self) -> Finish<'_> {
        Finish {
            id: &self.id,
            attempt: &self.attempt,
            transition: self.transition,
            now_ms: self.now_ms,
            carried: None,
        }
    }
}

/// One finished attempt to record with [`Store::finish_attempts`], borrowed from whoever
/// holds it (an attempt's end, queued to the store writer): nothing is copied to record
/// it.
#[derive(Debug)]
pub struct Finish<'a> {
    /// The message.
    pub id: &'a str,
    /// What happened (it becomes attempt number `attempts + 1` in the history).
    pub attempt: &'a AttemptRecord,
    /// Where the message goes next.
    pub transition: Transition,
    /// When the attempt ended.
    pub now_ms: u64,
    /// The record the attempt started from, when it was written in flight at accept
    /// ([`Claim::AtAccept`]): only a delete can change such a record before its result, so
    /// the result is staged on it rather than on a read of it, and it is left as staged
    /// (whether or not the write then lands). `None`: read it.
    pub carried: Option<&'a mut MessageRecord>,
}

/// What became of one result of [`Store::finish_attempts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultWrite {
    /// Written.
    Written,
    /// Not this attempt's to write: the message was deleted, or moved on, meanwhile (or an
    /// earlier item of the same call was its result).
    Stale,
}

/// One due entry seen by [`Store::scan_due`].
#[derive(Debug, Clone)]
pub struct DueEntry {
    /// When it is due.
    pub due_ms: u64,
    /// Delivery id.
    pub id: String,
    /// Host and endpoint.
    pub routing: Routing,
}

/// What the scan callback wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanStep {
    /// Look at the next entry.
    Continue,
    /// Stop scanning.
    Stop,
}

/// How a [`Store::scan_due`] walk ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanEnd {
    /// Every due entry was seen; the next one (if any) is due at this time.
    Exhausted {
        /// Due time of the first entry after `now`.
        next_due_ms: Option<u64>,
    },
    /// The budget ran out or the callback stopped: more may be due now.
    Cut {
        /// The earliest retry time of the held-back entries the walk passed over (see
        /// `lease`): they lie before where the next walk resumes, so this is a wake time
        /// the scheduler owes them.
        held_until: Option<u64>,
    },
}

/// Message counts kept by the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Pending or in flight.
    pub open: u64,
    /// Delivered and still retained.
    pub delivered: u64,
    /// Dead and still retained.
    pub dead: u64,
    /// Handed off to another courier and still retained.
    pub handed_off: u64,
}

const LOCK_STRIPES: usize = 64;

/// The store. Cheap to share behind an `Arc`; every method takes `now` from the caller.
pub struct Store {
    db: Arc<DB>,
    /// Held shared by every writer that can raise a per-endpoint open counter (the accept
    /// batches, replays), and exclusively while zero counters are removed, so a removal
    /// never loses an increment that raced it.
    counter_gate: std::sync::RwLock<()>,
    /// No due entry sorts before this time (see [`Store::scan_due`]).
    due_floor: Arc<floor::DueFloor>,
    /// Held while an accept batch is checked and written: one at a time, so two batches
    /// cannot both store one event id (see `accept`).
    accepting: Mutex<()>,
    stripes: Vec<Mutex<()>>,
    synced: WriteOptions,
    /// Synced writes made outside the accept path (tests check that operator changes sync).
    operator_syncs: std::sync::atomic::AtomicU64,
    /// Delivery ids for everything accepted into this store, in acceptance order.
    ids: crate::model::IdSeq,
    /// Messages the scheduler took for an attempt (see `lease`).
    leases: lease::Leases,
    /// Messages written in flight at accept and deleted while their attempt ran, from the
    /// delete to that attempt's result or release: their results, staged on the record the
    /// attempt carries, are stale (see `finish`). At most one entry per attempt in flight,
    /// plus, until the next start, those whose release delivery gave up on after store
    /// failures (a few, bounded by its background retries: see `delivery::requeue`).
    deleted_in_flight: Mutex<foldhash::HashSet<String>>,
    /// Ordered endpoints' line stripes  and deleted heads.
    lines: lines::LineLocks,
    /// Writes a test has asked to fail.
    faults: Arc<Faults>,
    options: StoreOptions,
    path: PathBuf,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Store {
    /// Where ids for new messages come from: one increasing sequence per open store.
    pub fn ids(&self) -> &crate::model::IdSeq {
        &self.ids
    }

    fn cf(&self, name: &str) -> &ColumnFamily {
        cf_of(&self.db, name)
    }

    fn range(&self, cf: &str, from: &[u8], until: Option<Vec<u8>>) -> DBRawIterator<'_> {
        range_in(&self.db, cf, from, until)
    }

    fn lock(&self, id: &str) -> MutexGuard<'_, ()> {
        locked(&self.stripes[stripe_of(id)])
    }

    /// Writes `batch`, `synced` when the write is acknowledged to an operator (delete,
    /// replay, pause, resume), so a 204 for a delete is not undone by a power loss. These
    /// are rare; the sync is cheap.
    fn write(&self, batch: WriteBatch, synced: bool) -> Result<(), StoreError> {
        self.faults.before_write()?;
        if !synced {
            return Ok(self.db.write(batch)?);
        }
        self.db.write_opt(batch, &self.synced)?;
        self.operator_syncs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Reads a message record.
    pub fn message(&self, id: &str) -> Result<Option<MessageRecord>, StoreError> {
        self.faults.read_of(id)?;
        message_in(&self.db, id)
    }

    /// Reads a message's payload.
    pub fn payload(&self, id: &str) -> Result<Option<Payload>, StoreError> {
        if self.faults.payload_missing(id) {
            return Ok(None);
        }
        let Some(v) = get(&self.db, keys::PAYLOADS, id.as_bytes())? else {
            return Ok(None);
        };
        let plain = self
            .options
            .keyring
            .open(keys::PAYLOADS, id.as_bytes(), &v)
            .map_err(|e| StoreError::codec(id)(e.into()))?;
        Payload::decode(&plain).map(Some).map_err(StoreError::codec(id))
    }

    /// The attempt history of `rec` (as read), oldest first: its `history` entries, then
    /// the last attempt its record keeps. An entry numbered from the kept one on was written
    /// after `rec` was read (the kept attempt moved there): left out, as `rec` knows nothing
    /// of it.
    pub fn history(&self, rec: &MessageRecord) -> Result<Vec<AttemptRecord>, StoreError> {
        let id = rec.id.as_str();
        let prefix = id.as_bytes();
        let kept = rec.last_attempt.is_some().then_some(rec.history_len);
        let range = (prefix, Some(keys::prefix_end(prefix)));
        let (mut out, _) = page(&self.db, keys::HISTORY, range, usize::MAX, |k, v| {
            // (A longer key is another id that merely starts with this one.)
            let number = k
                .strip_prefix(prefix)
                .and_then(|n| <[u8; 4]>::try_from(n).ok())
                .map(u32::from_be_bytes);
            number
                .filter(|n| kept.is_none_or(|kept| *n < kept))
                .map(|_| AttemptRecord::decode(v).map_err(StoreError::codec(id)))
                .transpose()
        })?;
        if let Some(last) = rec.last_attempt.clone() {
            out.push(last.with(rec.last_status, rec.last_error.clone()));
        }
        Ok(out)
    }

    /// The history of message `id` (tests): empty when there is no such message.
    #[cfg(test)]
    pub fn history_of(&self, id: &str) -> Result<Vec<AttemptRecord>, StoreError> {
        self.message(id)?.map_or(Ok(Vec::new()), |rec| self.history(&rec))
    }

    /// The endpoints of the `endpoint ‖ 0 ‖ …` keys of `cf` (`parked`, `lines`), in key
    /// order: one seek per endpoint, past all its keys.
    fn endpoints_in(&self, cf: &str) -> Result<Vec<String>, StoreError> {
        let mut it = self.range(cf, &[], None);
        let mut out = Vec::new();
        while let Some(k) = it.key() {
            let end = k.iter().position(|b| *b == 0).unwrap_or(k.len());
            out.push(String::from_utf8_lossy(&k[..end]).into_owned());
            let next = keys::prefix_end(&[&k[..end], &[0][..]].concat());
            it.seek(next);
        }
        it.status()?;
        Ok(out)
    }

    /// When a finished message is removed: delivered and handed-off ones are kept for
    /// `retention_ms`, dead ones for `dead_retention_ms`.
    fn expires_at(&self, rec: &MessageRecord) -> u64 {
        let keep = match rec.state {
            State::Dead => self.options.dead_retention_ms,
            _ => self.options.retention_ms,
        };
        rec.finished_at_ms.saturating_add(keep)
    }

    /// Stages `rec`'s arrival in a finished state at `finished_at_ms`: its retention entry,
    /// and its move from the open counters to its state's.
    fn stage_finished(&self, tx: &mut tx::Tx<'_>, rec: &MessageRecord) {
        tx.put(keys::EXPIRY, keys::time_key(self.expires_at(rec), &rec.id), []);
        tx.count_open(&rec.endpoint, -1);
        tx.count(finished_counter(rec.state), 1);
    }
}

/// The counter of retained finished messages in `state` (delivered, dead or handed off).
fn finished_counter(state: State) -> &'static [u8] {
    match state {
        State::Dead => keys::COUNT_DEAD,
        State::HandedOff => keys::COUNT_HANDED_OFF,
        _ => keys::COUNT_DELIVERED,
    }
}

/// Up to `limit` items `item` makes of the keys and values of `cf` from `from` to `until`
/// (as [`range_in`]), in key order (a key it makes none of does not count), and the key
/// after the last one looked at, if there is one.
fn page<T>(
    db: &DB,
    cf: &str,
    (from, until): (&[u8], Option<Vec<u8>>),
    limit: usize,
    mut item: impl FnMut(&[u8], &[u8]) -> Result<Option<T>, StoreError>,
) -> Result<(Vec<T>, Option<Vec<u8>>), StoreError> {
    let mut it = range_in(db, cf, from, until);
    let mut out = Vec::new();
    while let (Some(k), Some(v)) = (it.key(), it.value()) {
        if out.len() >= limit {
            break;
        }
        out.extend(item(k, v)?);
        it.next();
    }
    it.status()?;
    walk_step()?;
    Ok((out, it.key().map(<[u8]>::to_vec)))
}

/// A raw iterator over `cf` from `from` (also its lower bound) to `until` (exclusive; `None`:
/// the end), positioned at `from`.
fn range_in<'a>(db: &'a DB, cf: &str, from: &[u8], until: Option<Vec<u8>>) -> DBRawIterator<'a> {
    let mut ro = ReadOptions::default();
    ro.set_iterate_lower_bound(from.to_vec());
    if let Some(until) = until {
        ro.set_iterate_upper_bound(until);
    }
    let mut it = db.raw_iterator_cf_opt(cf_of(db, cf), ro);
    it.seek(from);
    it
}

/// A column family opened at start.
fn cf_of<'a>(db: &'a DB, name: &str) -> &'a ColumnFamily {
    db.cf_handle(name).expect("column family opened at start")
}

/// The value of `key` in `cf`, read with default options made once: `get_pinned_cf` makes
/// (allocates and frees) fresh ones per read, and the reads on the message path (an
/// accept's event id, a leased message's record and payload) are per message.
fn get<'a>(db: &'a DB, cf: &str, key: &[u8]) -> Result<Option<rocksdb::DBPinnableSlice<'a>>, rocksdb::Error> {
    static DEFAULTS: std::sync::LazyLock<ReadOptions> = std::sync::LazyLock::new(ReadOptions::default);
    db.get_pinned_cf_opt(cf_of(db, cf), key, &DEFAULTS)
}

/// The message record of `id` (for the parts that hold the `DB`, not the `Store`).
fn message_in(db: &DB, id: &str) -> Result<Option<MessageRecord>, StoreError> {
    let v = get(db, keys::MESSAGES, id.as_bytes())?;
    v.map(|v| decode_message(id, &v)).transpose()
}

/// The stripes of `keys` (ids, or endpoints for the line locks) out of `stripes`, taken in
/// stripe order so that two callers locking several never deadlock.
fn lock_stripes<'a, 'k>(stripes: &'a [Mutex<()>], keys: impl Iterator<Item = &'k str>) -> Vec<MutexGuard<'a, ()>> {
    let mut picked: Vec<usize> = keys.map(stripe_of).collect();
    picked.sort_unstable();
    picked.dedup();
    picked.iter().map(|i| locked(&stripes[*i])).collect()
}

/// `m` locked, even if a panic poisoned it.
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The lock stripe of an id (FNV-1a: cheap and good enough to spread ids).
fn stripe_of(id: &str) -> usize {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in id.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    (h % LOCK_STRIPES as u64) as usize
}

fn decode_message(id: &str, v: &[u8]) -> Result<MessageRecord, StoreError> {
    MessageRecord::decode(v).map_err(StoreError::codec(id))
}

#[cfg(test)]
pub(crate) mod tests;
