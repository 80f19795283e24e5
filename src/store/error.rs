//! What a store operation can fail with, and the faults tests inject.

use std::path::PathBuf;

use super::CodecError;

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

/// How one message's reads fail, as a test breaks it (`Faults::break_item`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemFault {
    /// Its record does not decode (a bit flipped on disk): a failure of this message alone.
    Corrupt,
    /// Its payload is missing (its record reads).
    NoPayload,
    /// Reading its record fails as the storage does on an I/O error: nothing tells it from a
    /// store-wide failure.
    Io,
}

/// Store operations to make fail, for tests and the simulator: each counter is how many of
/// the next writes of its kind fail, and the broken set names messages whose reads fail
/// until healed. Always empty in production (one relaxed load per read).
#[derive(Debug, Default)]
pub struct Faults {
    /// Synced accept batches.
    pub fail_accepts: std::sync::atomic::AtomicUsize,
    /// Attempt-result batches.
    pub fail_results: std::sync::atomic::AtomicUsize,
    /// Messages whose reads fail, and how: the per-message read errors the scheduler, the
    /// result writer, a release, a resume, a replay and a sweep must survive without
    /// stalling the others.
    pub(super) broken: std::sync::Mutex<std::collections::HashMap<String, ItemFault>>,
    /// How many are broken: the read path looks at this, not at the lock.
    pub(super) broken_n: std::sync::atomic::AtomicUsize,
    /// Broken items read as healthy, and no armed crash lands on a read, while set: the
    /// simulator's own checks read through.
    pub(super) suspended: std::sync::atomic::AtomicBool,
    /// A crash armed by `Faults::crash_at_read`: record reads still allowed before it.
    pub(super) reads_before_crash: std::sync::atomic::AtomicUsize,
    /// A crash armed by `Faults::crash_after`: writes still allowed before it (0: none
    /// armed).
    pub(super) writes_before_crash: std::sync::atomic::AtomicUsize,
    /// The armed crash happened: from that write on, every write fails (the process is gone).
    pub(super) crashed: std::sync::atomic::AtomicBool,
}

impl Faults {
    /// Whether this write fails (and counts it).
    pub(crate) fn take(&self, counter: &std::sync::atomic::AtomicUsize) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        counter.load(Relaxed) > 0 && counter.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1)).is_ok()
    }

    /// How `id` is broken now, if it is.
    fn broken(&self, id: &str) -> Option<ItemFault> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.broken_n.load(Relaxed) == 0 || self.suspended.load(Relaxed) {
            return None;
        }
        self.broken.lock().unwrap_or_else(|p| p.into_inner()).get(id).copied()
    }

    /// Called before every write: `Err` once an armed crash has happened.
    pub(crate) fn before_write(&self) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        // Production: two relaxed loads of zeros.
        let quiet = std::sync::atomic::Ordering::Relaxed;
        if self.writes_before_crash.load(quiet) == 0 && !self.crashed.load(quiet) {
            return Ok(());
        }
        let left = self
            .writes_before_crash
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .unwrap_or(0);
        if left == 1 {
            self.crashed.store(true, SeqCst);
        }
        if self.crashed.load(SeqCst) {
            return Err(StoreError::Injected);
        }
        Ok(())
    }

    /// The error a read of `id`'s record gives now, if it was broken (or an armed crash
    /// lands on this read).
    pub(crate) fn read_of(&self, id: &str) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::{Relaxed, SeqCst};
        if self.suspended.load(Relaxed) {
            return Ok(());
        }
        // The read the crash lands on fails; later reads of the dead process may see what
        // they like (nothing it does is written any more), and the simulator's own checks
        // read on.
        if self.reads_before_crash.load(Relaxed) > 0 {
            let left = self
                .reads_before_crash
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .unwrap_or(0);
            if left == 1 {
                self.crashed.store(true, SeqCst);
                return Err(StoreError::Injected);
            }
        }
        match self.broken(id) {
            Some(ItemFault::Corrupt) => Err(StoreError::Codec {
                key: id.to_string(),
                source: CodecError::Corrupt("message", "injected read failure"),
            }),
            Some(ItemFault::Io) => Err(StoreError::Injected),
            Some(ItemFault::NoPayload) | None => Ok(()),
        }
    }

    /// Whether `id`'s payload reads as missing now.
    pub(crate) fn payload_missing(&self, id: &str) -> bool {
        self.broken(id) == Some(ItemFault::NoPayload)
    }
}

impl StoreError {
    /// Makes a record under `key` that does not decode a store error.
    pub(crate) fn codec(key: impl Into<String>) -> impl FnOnce(CodecError) -> StoreError {
        let key = key.into();
        move |source| StoreError::Codec { key, source }
    }

    /// The same error again, for answering several callers with one failure.
    pub(crate) fn again(&self) -> StoreError {
        match self {
            StoreError::Rocks(e) => StoreError::Rocks(e.clone()),
            StoreError::Closed => StoreError::Closed,
            StoreError::Injected => StoreError::Injected,
            other => StoreError::Panicked(other.to_string()),
        }
    }

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
