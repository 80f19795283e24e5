//! The durable store: RocksDB with one column family per concern.
//!
//! # Layout
//! - `messages`: id → [`MessageRecord`] (state, attempts, times, last result). Small, rewritten
//!   on every transition.
//! - `payloads`: id → [`Payload`] (method, headers, body, signing choice). Written once, so
//!   retries never rewrite the body.
//! - `due`: be64(due ms) ‖ id → [`Routing`]. The scheduler's queue: iteration order is due
//!   order, and the routing value lets it gate on host and endpoint without a point read.
//! - `states`: state byte ‖ id → (). Listing by state in id (= acceptance) order, finding
//!   in-flight messages at start, and the oldest open message.
//! - `parked`: endpoint ‖ 0 ‖ id → (). Messages that came due while their endpoint was paused.
//! - `events`: event id ‖ 0 ‖ target → id. Ingest dedupe.
//! - `history`: id ‖ be32(n) → [`AttemptRecord`].
//! - `endpoints`: endpoint → [`EndpointRecord`] (pause, permanent-failure streak).
//! - `expiry`: be64(remove-at ms) ‖ id → (). Retention sweep order.
//! - `meta`: counters (open, delivered, dead, open per endpoint), merged in the same batch
//!   as the transition they count, so gauges are point reads, never scans.
//!
//! # Durability
//! Accepts go through the [`committer`]: one thread that drains every queued accept into one
//! `WriteBatch` written with `sync = true`, then answers them all. Concurrent requests share
//! one fsync; no caller is answered before its batch is on disk. Every later transition
//! (claim, attempt result, replay) is a batch written without fsync: the WAL write reaches the
//! OS before the call returns, so a killed process loses nothing, and losing one on power
//! failure only repeats an attempt (at-least-once).
//!
//! # Concurrency
//! Read-modify-write of one message (worker, admin, retention) is serialised by a lock
//! striped over the id, so the store needs no global lock and the committer never waits for
//! one (new ids cannot collide with existing ones).

#[cfg(test)]
mod audit;
pub mod codec;
mod committer;
mod floor;
pub mod keys;
mod parking;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamily, ColumnFamilyDescriptor, DBCompressionType, Direction, IteratorMode,
    MergeOperands, Options, ReadOptions, WriteBatch, WriteOptions, DB,
};

pub use codec::{AttemptRecord, CodecError, EndpointRecord, MessageRecord, Payload, Routing, SigningChoice};
pub use floor::FloorMark;

use crate::model::{DeadReason, State};

/// A store operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// RocksDB reported an error (I/O, no space, corruption).
    #[error("storage error: {0}")]
    Rocks(#[from] rocksdb::Error),
    /// Another process holds the data directory.
    #[error("data dir {0} is locked by another courier process")]
    Locked(PathBuf),
    /// The data directory cannot be created or used.
    #[error("data dir {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// A stored record could not be decoded.
    #[error("stored record {key}: {source}")]
    Codec {
        /// Which record.
        key: String,
        /// Why.
        source: CodecError,
    },
    /// The store is closing; nothing new is accepted.
    #[error("store is closed")]
    Closed,
    /// A store call on a blocking thread panicked.
    #[error("store call panicked: {0}")]
    Panicked(String),
    /// A write a test made fail (as on a full disk); see [`Faults`].
    #[error("storage error: injected write failure")]
    Injected,
}

/// Writes to make fail, for tests and the simulator: each counter is how many of the next
/// writes of its kind fail. Always zero in production.
#[derive(Debug, Default)]
pub struct Faults {
    /// Synced accept batches.
    pub fail_accepts: std::sync::atomic::AtomicUsize,
    /// Attempt-result batches.
    pub fail_results: std::sync::atomic::AtomicUsize,
}

impl Faults {
    /// Whether this write fails (and counts it).
    pub(crate) fn take(&self, counter: &std::sync::atomic::AtomicUsize) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        counter.load(Relaxed) > 0 && counter.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1)).is_ok()
    }
}

impl StoreError {
    /// The same error again, for answering several callers with one failure.
    pub(crate) fn again(&self) -> StoreError {
        match self {
            StoreError::Rocks(e) => StoreError::Rocks(e.clone()),
            StoreError::Closed => StoreError::Closed,
            StoreError::Injected => StoreError::Injected,
            other => StoreError::Panicked(other.to_string()),
        }
    }
}

impl StoreError {
    /// A short machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::Rocks(_) | StoreError::Dir { .. } => "storage_error",
            StoreError::Locked(_) => "data_dir_locked",
            StoreError::Codec { .. } => "corrupt_record",
            StoreError::Closed => "shutting_down",
            StoreError::Panicked(_) => "storage_error",
            StoreError::Injected => "storage_error",
        }
    }
}

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
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            retention_ms: 3 * 86_400_000,
            dead_retention_ms: 30 * 86_400_000,
            block_cache_bytes: 8 << 20,
            write_buffer_bytes: 4 << 20,
        }
    }
}

/// A message to accept: its first state and its payload.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// The record, in state pending, due at `next_attempt_at_ms`.
    pub record: MessageRecord,
    /// What will be sent.
    pub payload: Payload,
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

/// A message claimed for an attempt: now `in_flight`.
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The record (state `in_flight`).
    pub record: MessageRecord,
    /// What to send.
    pub payload: Payload,
}

/// How an attempt ended, as the store records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Try again at this time.
    RetryAt(u64),
    /// Delivered.
    Delivered,
    /// Dead-lettered.
    Dead(DeadReason),
}

/// One finished attempt to record with [`Store::finish_attempts`].
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

/// Counter changes of one batch, summed per counter: a batch of many transitions then
/// merges each counter once instead of once per message.
#[derive(Debug, Default)]
pub(crate) struct CounterDeltas(std::collections::HashMap<Vec<u8>, i64>);

impl CounterDeltas {
    /// Adds `delta` to the counter `key`.
    pub(crate) fn add(&mut self, key: &[u8], delta: i64) {
        match self.0.get_mut(key) {
            Some(v) => *v += delta,
            None => {
                self.0.insert(key.to_vec(), delta);
            }
        }
    }

    /// Appends the merges to `b` (counters that summed to zero are left out).
    pub(crate) fn write_into(self, b: &mut WriteBatch, meta: &ColumnFamily) {
        for (key, delta) in self.0 {
            if delta != 0 {
                b.merge_cf(meta, key, delta.to_le_bytes());
            }
        }
    }
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
    Cut,
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
}

/// A page of messages.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// The messages, in id order.
    pub items: Vec<MessageRecord>,
    /// Where the next page starts, if there may be one.
    pub next_cursor: Option<String>,
}

/// Filter for [`Store::list`] and [`Store::replay_dead`].
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only this state.
    pub state: Option<State>,
    /// Only this endpoint.
    pub endpoint: Option<String>,
    /// Only messages finished at or after this time (millis).
    pub finished_since_ms: Option<u64>,
    /// Only messages finished before this time (millis).
    pub finished_until_ms: Option<u64>,
}

impl ListFilter {
    fn matches(&self, rec: &MessageRecord) -> bool {
        self.state.is_none_or(|s| s == rec.state)
            && self.endpoint.as_deref().is_none_or(|e| e == rec.endpoint)
            && self.finished_since_ms.is_none_or(|t| rec.finished_at_ms >= t)
            && self.finished_until_ms.is_none_or(|t| rec.finished_at_ms < t)
    }
}

const LOCK_STRIPES: usize = 64;

/// The store. Cheap to share behind an `Arc`; every method takes `now` from the caller.
pub struct Store {
    db: Arc<DB>,
    /// No due entry sorts before this time (see [`Store::scan_due`]).
    due_floor: Arc<floor::DueFloor>,
    committer: committer::Committer,
    stripes: Vec<Mutex<()>>,
    plain: WriteOptions,
    synced: WriteOptions,
    /// Synced writes made outside the accept path (tests check that operator changes sync).
    operator_syncs: std::sync::atomic::AtomicU64,
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

fn add_counter(_key: &[u8], existing: Option<&[u8]>, operands: &MergeOperands) -> Option<Vec<u8>> {
    let mut total = existing.map(decode_counter).unwrap_or(0);
    for op in operands {
        total = total.wrapping_add(decode_counter(op));
    }
    Some(total.to_le_bytes().to_vec())
}

fn decode_counter(v: &[u8]) -> i64 {
    v.try_into().map(i64::from_le_bytes).unwrap_or(0)
}

impl Store {
    /// Opens (creating if needed) the store in `dir`, which is created with mode 0700.
    pub fn open(dir: &Path, options: StoreOptions) -> Result<Store, StoreError> {
        create_private_dir(dir)?;
        let cache = Cache::new_lru_cache(options.block_cache_bytes);
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        table.set_bloom_filter(10.0, false);
        table.set_cache_index_and_filter_blocks(true);

        let cf_opts = |name: &str| {
            let mut o = Options::default();
            o.set_block_based_table_factory(&table);
            o.set_write_buffer_size(options.write_buffer_bytes);
            o.set_max_write_buffer_number(3);
            o.set_compression_type(if name == keys::PAYLOADS {
                DBCompressionType::Lz4
            } else {
                DBCompressionType::None
            });
            o.set_level_compaction_dynamic_level_bytes(true);
            if name == keys::META {
                o.set_merge_operator_associative("courier_add_i64", add_counter);
            }
            o
        };

        let mut db_opts = Options::default();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_max_background_jobs(2);
        db_opts.set_max_total_wal_size(64 << 20);
        db_opts.set_db_write_buffer_size(options.write_buffer_bytes * 8);
        db_opts.set_keep_log_file_num(3);
        db_opts.set_max_log_file_size(8 << 20);
        db_opts.set_max_open_files(256);
        db_opts.set_recycle_log_file_num(4);
        // The unused `default` column family is opened with our small write buffer too:
        // with RocksDB's own 64 MiB, the free space RocksDB waits for before it resumes
        // writing after a disk-full error (it reserves the largest write buffer) would be
        // 64 MiB, and on a small volume courier would never accept again by itself.
        let descriptors = keys::CF_NAMES
            .iter()
            .chain(std::iter::once(&rocksdb::DEFAULT_COLUMN_FAMILY_NAME))
            .map(|name| ColumnFamilyDescriptor::new(*name, cf_opts(name)));
        let db = DB::open_cf_descriptors(&db_opts, dir, descriptors).map_err(|e| {
            let text = e.to_string();
            if text.contains("lock") && (text.contains("LOCK") || text.contains("unavailable")) {
                StoreError::Locked(dir.to_path_buf())
            } else {
                StoreError::Rocks(e)
            }
        })?;
        let db = Arc::new(db);
        let due_floor = Arc::new(floor::DueFloor::default());
        let faults = Arc::new(Faults::default());
        let committer = committer::Committer::start(db.clone(), due_floor.clone(), faults.clone());
        Ok(Store {
            db,
            due_floor,
            committer,
            stripes: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            plain: WriteOptions::default(),
            synced: {
                let mut w = WriteOptions::default();
                w.set_sync(true);
                w
            },
            operator_syncs: std::sync::atomic::AtomicU64::new(0),
            faults,
            options,
            path: dir.to_path_buf(),
        })
    }

    /// The fault switches of this store (tests only set them).
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// The data directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn cf(&self, name: &str) -> &ColumnFamily {
        self.db.cf_handle(name).expect("column family opened at start")
    }

    fn lock(&self, id: &str) -> MutexGuard<'_, ()> {
        self.stripes[stripe_of(id)].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every stripe the ids need, taken in stripe order so that two callers locking
    /// several never deadlock.
    fn lock_many<'a>(&self, ids: impl Iterator<Item = &'a str>) -> Vec<MutexGuard<'_, ()>> {
        let mut stripes: Vec<usize> = ids.map(stripe_of).collect();
        stripes.sort_unstable();
        stripes.dedup();
        stripes
            .iter()
            .map(|i| self.stripes[*i].lock().unwrap_or_else(|p| p.into_inner()))
            .collect()
    }

    fn write(&self, batch: WriteBatch) -> Result<(), StoreError> {
        self.db.write_opt(batch, &self.plain).map_err(StoreError::from)
    }

    /// A write acknowledged to an operator (delete, replay, pause, resume): synced, so a
    /// 204 for a delete is not undone by a power loss. These are rare; the sync is cheap.
    fn write_synced(&self, batch: WriteBatch) -> Result<(), StoreError> {
        self.db.write_opt(batch, &self.synced)?;
        self.operator_syncs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// How many synced operator writes (delete, replay, pause, resume) were made.
    pub fn operator_syncs(&self) -> u64 {
        self.operator_syncs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Durably stores a new message (fsynced, possibly sharing the fsync with concurrent
    /// accepts), unless one with the same event id and target exists.
    pub async fn accept(&self, msg: NewMessage) -> Result<Accepted, StoreError> {
        self.committer.submit(msg).await
    }

    /// Reads a message record.
    pub fn message(&self, id: &str) -> Result<Option<MessageRecord>, StoreError> {
        match self.db.get_pinned_cf(self.cf(keys::MESSAGES), id.as_bytes())? {
            Some(v) => Ok(Some(decode_message(id, &v)?)),
            None => Ok(None),
        }
    }

    /// Reads a message's payload.
    pub fn payload(&self, id: &str) -> Result<Option<Payload>, StoreError> {
        match self.db.get_pinned_cf(self.cf(keys::PAYLOADS), id.as_bytes())? {
            Some(v) => Ok(Some(Payload::decode(&v).map_err(|source| StoreError::Codec {
                key: id.to_string(),
                source,
            })?)),
            None => Ok(None),
        }
    }

    /// A message's attempt history, oldest first.
    pub fn history(&self, id: &str) -> Result<Vec<AttemptRecord>, StoreError> {
        let prefix = id.as_bytes();
        let mut out = Vec::new();
        let mut ro = ReadOptions::default();
        ro.set_iterate_upper_bound(keys::prefix_end(prefix));
        let iter = self.db.iterator_cf_opt(
            self.cf(keys::HISTORY),
            ro,
            IteratorMode::From(prefix, Direction::Forward),
        );
        for item in iter {
            let (k, v) = item?;
            if k.len() != prefix.len() + 4 {
                continue; // another id that merely starts with this one
            }
            out.push(AttemptRecord::decode(&v).map_err(|source| StoreError::Codec {
                key: id.to_string(),
                source,
            })?);
        }
        Ok(out)
    }

    /// The earliest due time in the queue, if any.
    pub fn next_due_ms(&self) -> Result<Option<u64>, StoreError> {
        let mut it = self.db.raw_iterator_cf(self.cf(keys::DUE));
        it.seek_to_first();
        match it.key() {
            Some(k) => Ok(keys::split_time_key(k).map(|(ms, _)| ms)),
            None => {
                it.status()?;
                Ok(None)
            }
        }
    }

    /// Walks the due queue in due order, handing each entry due at or before `now_ms` to
    /// `step`, at most `budget` entries.
    ///
    /// The walk starts at the due floor (see `store::floor`), not at the first key: a queue
    /// consumed from its head leaves a trail of deletion tombstones there, and seeking
    /// through them on every pass would cost more the busier courier is. The returned mark
    /// goes back to [`Store::raise_due_floor`] after the pass.
    ///
    /// `after` continues an earlier walk just past that entry instead of at the floor.
    pub fn scan_due(
        &self,
        now_ms: u64,
        budget: usize,
        after: Option<(u64, &str)>,
        mut step: impl FnMut(DueEntry) -> ScanStep,
    ) -> Result<(ScanEnd, FloorMark), StoreError> {
        let mark = self.due_floor.mark();
        let floor = mark.floor;
        let mut ro = ReadOptions::default();
        ro.set_iterate_lower_bound(keys::time_key(floor, ""));
        ro.set_iterate_upper_bound(keys::time_key(now_ms.saturating_add(1), ""));
        let mut it = self.db.raw_iterator_cf_opt(self.cf(keys::DUE), ro);
        match after {
            Some((due, id)) => {
                let from = keys::time_key(due, id);
                it.seek(&from);
                if it.key() == Some(from.as_slice()) {
                    it.next();
                }
            }
            None => it.seek(keys::time_key(floor, "")),
        }
        let mut seen = 0;
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if seen >= budget {
                return Ok((ScanEnd::Cut, mark));
            }
            seen += 1;
            let Some((due_ms, id)) = keys::split_time_key(k) else {
                it.next();
                continue;
            };
            let routing = Routing::decode(v).map_err(|source| StoreError::Codec {
                key: id.to_string(),
                source,
            })?;
            if step(DueEntry {
                due_ms,
                id: id.to_string(),
                routing,
            }) == ScanStep::Stop
            {
                return Ok((ScanEnd::Cut, mark));
            }
            it.next();
        }
        it.status()?;
        drop(it);
        // Nothing more is due now: report when the next entry is.
        let mut ro = ReadOptions::default();
        ro.set_iterate_lower_bound(keys::time_key(floor, ""));
        let mut it = self.db.raw_iterator_cf_opt(self.cf(keys::DUE), ro);
        it.seek(keys::time_key(now_ms.saturating_add(1), ""));
        let next_due_ms = it.key().and_then(keys::split_time_key).map(|(ms, _)| ms);
        it.status()?;
        Ok((ScanEnd::Exhausted { next_due_ms }, mark))
    }

    /// The current due floor (see [`Store::scan_due`]).
    pub fn due_floor(&self) -> u64 {
        self.due_floor.peek()
    }

    /// Raises the due floor towards `to` after a pass that started at `mark`, but not above
    /// a due entry written since (the pass may have missed it).
    pub fn raise_due_floor(&self, mark: FloorMark, to: u64) {
        self.due_floor.raise(mark, to);
    }

    /// Claims a due entry for an attempt: removes it from the queue and marks the message
    /// `in_flight`. `None` when the entry is stale (the message moved on meanwhile).
    pub fn claim(&self, entry: &DueEntry) -> Result<Option<Claimed>, StoreError> {
        Ok(self.claim_many(std::slice::from_ref(entry))?.pop().flatten())
    }

    /// Claims several due entries in one write (one wait for the WAL, however many):
    /// the answer has one slot per entry, `None` for a stale one.
    pub fn claim_many(&self, entries: &[DueEntry]) -> Result<Vec<Option<Claimed>>, StoreError> {
        let _guards = self.lock_many(entries.iter().map(|e| e.id.as_str()));
        let mut b = WriteBatch::default();
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let due_key = keys::time_key(entry.due_ms, &entry.id);
            b.delete_cf(self.cf(keys::DUE), &due_key);
            let Some(mut rec) = self.message(&entry.id)? else {
                out.push(None);
                continue;
            };
            if rec.state != State::Pending || rec.next_attempt_at_ms != entry.due_ms {
                out.push(None);
                continue;
            }
            let Some(payload) = self.payload(&entry.id)? else {
                return Err(StoreError::Codec {
                    key: entry.id.clone(),
                    source: CodecError::Corrupt("payload", "missing payload"),
                });
            };
            rec.state = State::InFlight;
            self.move_state(&mut b, &rec.id, State::Pending, State::InFlight);
            b.put_cf(self.cf(keys::MESSAGES), rec.id.as_bytes(), rec.encode());
            out.push(Some(Claimed { record: rec, payload }));
        }
        self.write(b)?;
        Ok(out)
    }

    fn move_state(&self, b: &mut WriteBatch, id: &str, from: State, to: State) {
        if from != to {
            b.delete_cf(self.cf(keys::STATES), keys::state_key(from.to_byte(), id));
            b.put_cf(self.cf(keys::STATES), keys::state_key(to.to_byte(), id), []);
        }
    }

    fn count(&self, b: &mut WriteBatch, key: &[u8], delta: i64) {
        b.merge_cf(self.cf(keys::META), key, delta.to_le_bytes());
    }

    /// Adds the due entry of `rec`; the caller reports it with `due_written` after writing.
    fn enqueue(&self, b: &mut WriteBatch, rec: &MessageRecord) {
        let routing = Routing {
            host: rec.host.clone(),
            endpoint: rec.endpoint.clone(),
        };
        b.put_cf(
            self.cf(keys::DUE),
            keys::time_key(rec.next_attempt_at_ms, &rec.id),
            routing.encode(),
        );
    }

    fn retention_of(&self, state: State) -> u64 {
        if state == State::Dead {
            self.options.dead_retention_ms
        } else {
            self.options.retention_ms
        }
    }

    /// Records a finished attempt (attempt number `rec.attempts + 1`) and the transition it
    /// led to. Returns the updated record, or `None` if the message was deleted meanwhile.
    pub fn finish_attempt(
        &self,
        id: &str,
        attempt: &AttemptRecord,
        transition: Transition,
        now_ms: u64,
    ) -> Result<Option<MessageRecord>, StoreError> {
        let item = FinishedAttempt {
            id: id.to_string(),
            attempt: attempt.clone(),
            transition,
            now_ms,
        };
        self.finish_attempts(std::slice::from_ref(&item))
            .pop()
            .unwrap_or(Ok(None))
    }

    /// Records several finished attempts in one write (one trip through RocksDB's write
    /// queue for however many attempts ended together). One answer per item, as
    /// [`Store::finish_attempt`] gives it; an item whose record cannot be read fails alone,
    /// a failed write fails them all. A second item for an id already in the call is
    /// answered `None` (stale), as it would be after the first was written.
    pub fn finish_attempts(&self, items: &[FinishedAttempt]) -> Vec<Result<Option<MessageRecord>, StoreError>> {
        let _guards = self.lock_many(items.iter().map(|i| i.id.as_str()));
        let mut b = WriteBatch::default();
        let mut counters = CounterDeltas::default();
        let mut out = Vec::with_capacity(items.len());
        let mut min_retry = u64::MAX;
        let mut seen = std::collections::HashSet::with_capacity(items.len());
        for item in items {
            if !seen.insert(item.id.as_str()) {
                // Every record is read before any write lands: applying it again would
                // count the attempt twice.
                out.push(Ok(None));
                continue;
            }
            let staged = self.stage_finish(&mut b, &mut counters, item);
            if let (Ok(Some(_)), Transition::RetryAt(at)) = (&staged, item.transition) {
                min_retry = min_retry.min(at);
            }
            out.push(staged);
        }
        if !out.iter().any(|r| matches!(r, Ok(Some(_)))) {
            return out;
        }
        counters.write_into(&mut b, self.cf(keys::META));
        if self.faults.take(&self.faults.fail_results) {
            return out.into_iter().map(|r| r.and(Err(StoreError::Injected))).collect();
        }
        if let Err(e) = self.db.write_opt(b, &self.plain) {
            return out
                .into_iter()
                .map(|r| r.and(Err(StoreError::Rocks(e.clone()))))
                .collect();
        }
        if min_retry != u64::MAX {
            self.due_floor.wrote(min_retry);
        }
        out
    }

    /// Adds one finished attempt's writes to `b`; the caller holds the id's stripe.
    fn stage_finish(
        &self,
        b: &mut WriteBatch,
        counters: &mut CounterDeltas,
        item: &FinishedAttempt,
    ) -> Result<Option<MessageRecord>, StoreError> {
        let FinishedAttempt {
            id,
            attempt,
            transition,
            now_ms,
        } = item;
        let (id, now_ms) = (id.as_str(), *now_ms);
        let Some(mut rec) = self.message(id)? else {
            return Ok(None);
        };
        if rec.state != State::InFlight {
            // Deleted and re-created, or released by recovery: this attempt's result is stale.
            return Ok(None);
        }
        rec.attempts += 1;
        rec.history_len += 1;
        rec.last_status = attempt.status;
        rec.last_error = attempt.error.clone();
        b.put_cf(
            self.cf(keys::HISTORY),
            keys::history_key(id, rec.history_len),
            attempt.encode(),
        );
        match *transition {
            Transition::RetryAt(at) => {
                rec.state = State::Pending;
                rec.next_attempt_at_ms = at;
                self.enqueue(b, &rec);
                self.move_state(b, id, State::InFlight, State::Pending);
            }
            Transition::Delivered | Transition::Dead(_) => {
                let (state, counter) = match *transition {
                    Transition::Dead(reason) => {
                        rec.dead_reason = Some(reason);
                        (State::Dead, keys::COUNT_DEAD)
                    }
                    _ => (State::Delivered, keys::COUNT_DELIVERED),
                };
                rec.state = state;
                rec.next_attempt_at_ms = 0;
                rec.finished_at_ms = now_ms;
                self.move_state(b, id, State::InFlight, state);
                b.put_cf(
                    self.cf(keys::EXPIRY),
                    keys::time_key(now_ms.saturating_add(self.retention_of(state)), id),
                    [],
                );
                counters.add(keys::COUNT_OPEN, -1);
                counters.add(&keys::endpoint_open_key(&rec.endpoint), -1);
                counters.add(counter, 1);
            }
        }
        b.put_cf(self.cf(keys::MESSAGES), id.as_bytes(), rec.encode());
        Ok(Some(rec))
    }

    /// Puts an in-flight message back in the queue, due at `now_ms`, without counting an
    /// attempt: for failures of courier itself, and for rate-limit or shutdown hand-backs.
    pub fn release(&self, id: &str, due_ms: u64) -> Result<bool, StoreError> {
        let _g = self.lock(id);
        let Some(mut rec) = self.message(id)? else {
            return Ok(false);
        };
        if rec.state != State::InFlight {
            return Ok(false);
        }
        rec.state = State::Pending;
        rec.next_attempt_at_ms = due_ms;
        let mut b = WriteBatch::default();
        self.enqueue(&mut b, &rec);
        self.move_state(&mut b, id, State::InFlight, State::Pending);
        b.put_cf(self.cf(keys::MESSAGES), id.as_bytes(), rec.encode());
        self.write(b)?;
        self.due_floor.wrote(due_ms);
        Ok(true)
    }

    /// At start: every message left `in_flight` by a crash goes back to due at `now_ms`
    /// with its attempt count unchanged. Returns how many.
    pub fn recover_in_flight(&self, now_ms: u64) -> Result<usize, StoreError> {
        let ids = self.ids_in_state(State::InFlight, usize::MAX)?;
        let mut n = 0;
        for id in ids {
            if self.release(&id, now_ms)? {
                n += 1;
            }
        }
        Ok(n)
    }

    fn ids_in_state(&self, state: State, limit: usize) -> Result<Vec<String>, StoreError> {
        let prefix = [state.to_byte()];
        let mut ro = ReadOptions::default();
        ro.set_iterate_upper_bound(keys::prefix_end(&prefix));
        let mut it = self.db.raw_iterator_cf_opt(self.cf(keys::STATES), ro);
        it.seek(prefix);
        let mut out = Vec::new();
        while let Some(k) = it.key() {
            if out.len() >= limit {
                break;
            }
            out.push(String::from_utf8_lossy(&k[1..]).into_owned());
            it.next();
        }
        it.status()?;
        Ok(out)
    }

    /// Replays a dead message: pending again, attempts reset, a new give-up time, due now.
    /// `Ok(None)` if there is no such message; `Ok(Some(false))` if it is not dead.
    pub fn replay(&self, id: &str, now_ms: u64, give_up_at_ms: u64) -> Result<Option<bool>, StoreError> {
        let _g = self.lock(id);
        let Some(rec) = self.message(id)? else {
            return Ok(None);
        };
        if rec.state != State::Dead {
            return Ok(Some(false));
        }
        let mut b = WriteBatch::default();
        self.replay_into(&mut b, rec, now_ms, give_up_at_ms);
        self.write_synced(b)?;
        self.due_floor.wrote(now_ms);
        Ok(Some(true))
    }

    /// Adds the replay of a dead `rec` to `b` (the caller holds its lock).
    fn replay_into(&self, b: &mut WriteBatch, mut rec: MessageRecord, now_ms: u64, give_up_at_ms: u64) {
        let id = rec.id.clone();
        let id = id.as_str();
        b.delete_cf(
            self.cf(keys::EXPIRY),
            keys::time_key(rec.finished_at_ms.saturating_add(self.options.dead_retention_ms), id),
        );
        rec.state = State::Pending;
        rec.attempts = 0;
        rec.dead_reason = None;
        rec.finished_at_ms = 0;
        rec.next_attempt_at_ms = now_ms;
        rec.give_up_at_ms = give_up_at_ms;
        self.enqueue(b, &rec);
        self.move_state(b, id, State::Dead, State::Pending);
        self.count(b, keys::COUNT_DEAD, -1);
        self.count(b, keys::COUNT_OPEN, 1);
        self.count(b, &keys::endpoint_open_key(&rec.endpoint), 1);
        b.put_cf(self.cf(keys::MESSAGES), id.as_bytes(), rec.encode());
    }

    /// Replays every dead message matching `filter` (its state is forced to dead).
    pub fn replay_dead(&self, filter: &ListFilter, now_ms: u64, give_up_at_ms: u64) -> Result<usize, StoreError> {
        let filter = ListFilter {
            state: Some(State::Dead),
            ..filter.clone()
        };
        let mut cursor = None;
        let mut n = 0;
        loop {
            // One synced write per page: a bulk replay of 100,000 messages is 200 writes.
            let page = self.list(&filter, 500, cursor.as_deref())?;
            let guards = self.lock_many(page.items.iter().map(|r| r.id.as_str()));
            let mut b = WriteBatch::default();
            let mut in_page = 0;
            for listed in &page.items {
                // Re-read under the lock: it may have changed since the listing.
                if let Some(rec) = self.message(&listed.id)?.filter(|r| r.state == State::Dead) {
                    self.replay_into(&mut b, rec, now_ms, give_up_at_ms);
                    in_page += 1;
                }
            }
            if in_page > 0 {
                self.write_synced(b)?;
                self.due_floor.wrote(now_ms);
                n += in_page;
            }
            drop(guards);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => return Ok(n),
            }
        }
    }

    /// Removes a message and everything indexed under it. `false` if there was none.
    pub fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let _g = self.lock(id);
        let Some(rec) = self.message(id)? else { return Ok(false) };
        let mut b = WriteBatch::default();
        self.remove(&mut b, &rec)?;
        self.write_synced(b)?;
        Ok(true)
    }

    fn remove(&self, b: &mut WriteBatch, rec: &MessageRecord) -> Result<(), StoreError> {
        let id = rec.id.as_str();
        b.delete_cf(self.cf(keys::MESSAGES), id.as_bytes());
        b.delete_cf(self.cf(keys::PAYLOADS), id.as_bytes());
        b.delete_cf(self.cf(keys::STATES), keys::state_key(rec.state.to_byte(), id));
        b.delete_range_cf(
            self.cf(keys::HISTORY),
            keys::history_key(id, 0),
            keys::history_key(id, u32::MAX),
        );
        b.delete_cf(self.cf(keys::HISTORY), keys::history_key(id, u32::MAX));
        let event_key = keys::pair_key(&rec.event_id, &rec.target);
        if self.db.get_pinned_cf(self.cf(keys::EVENTS), &event_key)?.as_deref() == Some(id.as_bytes()) {
            b.delete_cf(self.cf(keys::EVENTS), &event_key);
        }
        match rec.state {
            State::Pending | State::InFlight => {
                b.delete_cf(self.cf(keys::DUE), keys::time_key(rec.next_attempt_at_ms, id));
                b.delete_cf(self.cf(keys::PARKED), keys::pair_key(&rec.endpoint, id));
                self.count(b, keys::COUNT_OPEN, -1);
                self.count(b, &keys::endpoint_open_key(&rec.endpoint), -1);
            }
            State::Delivered | State::Dead => {
                let expiry = rec.finished_at_ms.saturating_add(self.retention_of(rec.state));
                b.delete_cf(self.cf(keys::EXPIRY), keys::time_key(expiry, id));
                let counter = if rec.state == State::Dead {
                    keys::COUNT_DEAD
                } else {
                    keys::COUNT_DELIVERED
                };
                self.count(b, counter, -1);
            }
        }
        Ok(())
    }

    /// Lists messages in id (acceptance) order after `cursor`. With a state filter it walks
    /// that state's index; the endpoint and time filters are applied while walking, with a
    /// bound on how far one page looks, so a page may be short and still carry a cursor.
    pub fn list(&self, filter: &ListFilter, limit: usize, cursor: Option<&str>) -> Result<Page, StoreError> {
        let limit = limit.clamp(1, 1000);
        let budget = limit * 20 + 1000;
        let (cf, prefix): (&str, Vec<u8>) = match filter.state {
            Some(s) => (keys::STATES, vec![s.to_byte()]),
            None => (keys::MESSAGES, Vec::new()),
        };
        let mut ro = ReadOptions::default();
        if !prefix.is_empty() {
            ro.set_iterate_upper_bound(keys::prefix_end(&prefix));
        }
        let mut it = self.db.raw_iterator_cf_opt(self.cf(cf), ro);
        let mut start = prefix.clone();
        if let Some(c) = cursor {
            start.extend_from_slice(c.as_bytes());
            start.push(0); // strictly after the cursor
        }
        it.seek(&start);
        let mut page = Page::default();
        let mut scanned = 0;
        while let Some(k) = it.key() {
            let id = String::from_utf8_lossy(&k[prefix.len()..]).into_owned();
            scanned += 1;
            let rec = if filter.state.is_some() {
                self.message(&id)?
            } else {
                Some(decode_message(&id, it.value().unwrap_or_default())?)
            };
            if let Some(rec) = rec.filter(|r| filter.matches(r)) {
                page.items.push(rec);
                if page.items.len() >= limit {
                    it.next();
                    if it.key().is_some() {
                        page.next_cursor = Some(id);
                    }
                    break;
                }
            }
            if scanned >= budget {
                page.next_cursor = Some(id);
                break;
            }
            it.next();
        }
        it.status()?;
        Ok(page)
    }

    /// The persisted state of every endpoint that has one.
    pub fn endpoints(&self) -> Result<Vec<(String, EndpointRecord)>, StoreError> {
        let mut out = Vec::new();
        for item in self.db.iterator_cf(self.cf(keys::ENDPOINTS), IteratorMode::Start) {
            let (k, v) = item?;
            let key = String::from_utf8_lossy(&k).into_owned();
            let rec = EndpointRecord::decode(&v).map_err(|source| StoreError::Codec {
                key: key.clone(),
                source,
            })?;
            out.push((key, rec));
        }
        Ok(out)
    }

    /// Saves an endpoint's state (a streak change: not synced; losing one to a power
    /// loss only shortens a streak).
    pub fn put_endpoint(&self, key: &str, rec: &EndpointRecord) -> Result<(), StoreError> {
        self.db
            .put_cf_opt(self.cf(keys::ENDPOINTS), key.as_bytes(), rec.encode(), &self.plain)?;
        Ok(())
    }

    /// Saves a pause or resume, synced: it was acknowledged to an operator (or alerted).
    pub fn put_endpoint_synced(&self, key: &str, rec: &EndpointRecord) -> Result<(), StoreError> {
        let mut b = WriteBatch::default();
        b.put_cf(self.cf(keys::ENDPOINTS), key.as_bytes(), rec.encode());
        self.write_synced(b)
    }

    /// Open (pending or in-flight) messages per endpoint, for endpoints that have any.
    pub fn open_per_endpoint(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let mut out = Vec::new();
        let prefix = keys::COUNT_OPEN_ENDPOINT;
        let mut ro = ReadOptions::default();
        ro.set_iterate_upper_bound(keys::prefix_end(prefix));
        let mut it = self.db.raw_iterator_cf_opt(self.cf(keys::META), ro);
        it.seek(prefix);
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            let n = decode_counter(v);
            if n > 0 {
                out.push((String::from_utf8_lossy(&k[prefix.len()..]).into_owned(), n as u64));
            }
            it.next();
        }
        it.status()?;
        Ok(out)
    }

    fn counter(&self, key: &[u8]) -> Result<u64, StoreError> {
        Ok(self
            .db
            .get_pinned_cf(self.cf(keys::META), key)?
            .map(|v| decode_counter(&v).max(0) as u64)
            .unwrap_or(0))
    }

    /// Message counts by state.
    pub fn counts(&self) -> Result<Counts, StoreError> {
        Ok(Counts {
            open: self.counter(keys::COUNT_OPEN)?,
            delivered: self.counter(keys::COUNT_DELIVERED)?,
            dead: self.counter(keys::COUNT_DEAD)?,
        })
    }

    /// Acceptance time of the oldest open message (from the first key of the pending and
    /// in-flight indexes: ids sort by acceptance time).
    pub fn oldest_open_ms(&self) -> Result<Option<u64>, StoreError> {
        let mut oldest: Option<u64> = None;
        for state in [State::Pending, State::InFlight] {
            if let Some(id) = self.ids_in_state(state, 1)?.into_iter().next() {
                if let Some(ms) = crate::model::delivery_id_millis(&id) {
                    oldest = Some(oldest.map_or(ms, |o| o.min(ms)));
                }
            }
        }
        Ok(oldest)
    }

    /// Removes delivered and dead messages whose retention ended at or before `now_ms`,
    /// at most `limit` of them. Returns how many were removed.
    pub fn sweep_expired(&self, now_ms: u64, limit: usize) -> Result<usize, StoreError> {
        let mut ro = ReadOptions::default();
        ro.set_iterate_upper_bound(keys::time_key(now_ms.saturating_add(1), ""));
        let mut it = self.db.raw_iterator_cf_opt(self.cf(keys::EXPIRY), ro);
        it.seek_to_first();
        let mut entries = Vec::new();
        while let Some(k) = it.key() {
            if entries.len() >= limit {
                break;
            }
            if let Some((ms, id)) = keys::split_time_key(k) {
                entries.push((ms, id.to_string()));
            }
            it.next();
        }
        it.status()?;
        drop(it);
        let mut removed = 0;
        for (ms, id) in entries {
            let _g = self.lock(&id);
            let mut b = WriteBatch::default();
            b.delete_cf(self.cf(keys::EXPIRY), keys::time_key(ms, &id));
            if let Some(rec) = self.message(&id)? {
                if matches!(rec.state, State::Delivered | State::Dead) {
                    let due = rec.finished_at_ms.saturating_add(self.retention_of(rec.state));
                    if due <= now_ms {
                        self.remove(&mut b, &rec)?;
                        removed += 1;
                    } else if due != ms {
                        // Retention was lengthened since this entry was written.
                        b.put_cf(self.cf(keys::EXPIRY), keys::time_key(due, &id), []);
                    }
                }
            }
            self.write(b)?;
        }
        Ok(removed)
    }

    /// Compacts every column family, so removed records give their disk space back.
    pub fn compact(&self) {
        self.compact_until(&|| false);
    }

    /// [`Store::compact`], one column family at a time, stopping before the next one once
    /// `stopped()` says so (shutdown must not wait for every family to compact).
    pub fn compact_until(&self, stopped: &dyn Fn() -> bool) {
        for name in keys::CF_NAMES {
            if stopped() {
                return;
            }
            self.db.compact_range_cf(self.cf(name), None::<&[u8]>, None::<&[u8]>);
        }
    }

    /// Whether the store can still write (a cheap synced probe write): readiness.
    pub fn writable(&self) -> bool {
        let mut wo = WriteOptions::default();
        wo.set_sync(false);
        self.db.put_cf_opt(self.cf(keys::META), b"probe", b"", &wo).is_ok()
    }

    /// Stops accepting, waits for queued accepts to be answered, and flushes the WAL
    /// and memtables so the next start has little to replay.
    pub fn close(&self) {
        self.committer.stop();
        if let Err(e) = self.db.flush_wal(true) {
            tracing::warn!(error = %e, "flushing the WAL at close failed");
        }
        for name in keys::CF_NAMES {
            if let Err(e) = self.db.flush_cf(self.cf(name)) {
                tracing::warn!(error = %e, cf = name, "flushing at close failed");
            }
        }
    }
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
    MessageRecord::decode(v).map_err(|source| StoreError::Codec {
        key: id.to_string(),
        source,
    })
}

fn create_private_dir(dir: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let err = |source| StoreError::Dir {
        path: dir.to_path_buf(),
        source,
    };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err)?;
    }
    let meta = std::fs::metadata(dir).map_err(err)?;
    if !meta.is_dir() {
        return Err(err(std::io::Error::other("not a directory")));
    }
    // Per-message signing secrets are stored with their messages: keep the dir private.
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests;
