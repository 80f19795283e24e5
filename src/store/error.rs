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

/// Store operations to make fail, for tests and the simulator: each counter is how many of
/// the next writes of its kind fail, and the unreadable set names messages whose record
/// reads fail until healed. Always empty in production (one relaxed load per read).
#[derive(Debug, Default)]
pub struct Faults {
    /// Synced accept batches.
    pub fail_accepts: std::sync::atomic::AtomicUsize,
    /// Attempt-result batches.
    pub fail_results: std::sync::atomic::AtomicUsize,
    /// Messages whose record reads fail as a record that does not decode would, one at a
    /// time per item: the per-message read errors the scheduler, the result writer and a
    /// release must survive without stalling the others.
    unreadable: std::sync::Mutex<std::collections::HashSet<String>>,
    /// How many are unreadable: the read path looks at this, not at the lock.
    unreadable_n: std::sync::atomic::AtomicUsize,
    /// A crash armed by [`Faults::crash_after`]: writes still allowed before it (0: none
    /// armed).
    writes_before_crash: std::sync::atomic::AtomicUsize,
    /// The armed crash happened: from that write on, every write fails (the process is gone).
    crashed: std::sync::atomic::AtomicBool,
}

impl Faults {
    /// Whether this write fails (and counts it).
    pub(crate) fn take(&self, counter: &std::sync::atomic::AtomicUsize) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        counter.load(Relaxed) > 0 && counter.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1)).is_ok()
    }

    /// Makes every read of `id`'s record fail until [`Faults::heal`].
    pub fn make_unreadable(&self, id: &str) {
        let mut set = self.unreadable.lock().unwrap_or_else(|p| p.into_inner());
        set.insert(id.to_string());
        self.unreadable_n.store(set.len(), std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes `id`'s record readable again.
    pub fn heal(&self, id: &str) {
        let mut set = self.unreadable.lock().unwrap_or_else(|p| p.into_inner());
        set.remove(id);
        self.unreadable_n.store(set.len(), std::sync::atomic::Ordering::SeqCst);
    }

    /// Arms a crash inside the next writes, wherever they are (a commit batch, a pass's park,
    /// a resume page, a replay page, a sweep chunk, a line promotion, a hand-off): `writes`
    /// more writes land, and the one after them and every later one fail, as if the process
    /// died right there. The simulator then drops everything in memory and reopens.
    pub fn crash_after(&self, writes: usize) {
        use std::sync::atomic::Ordering::SeqCst;
        self.writes_before_crash.store(writes + 1, SeqCst);
    }

    /// Whether an armed crash happened.
    pub fn crashed(&self) -> bool {
        self.crashed.load(std::sync::atomic::Ordering::SeqCst)
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
        if self.crashed() {
            return Err(StoreError::Injected);
        }
        Ok(())
    }

    /// The error a read of `id`'s record gives now, if it was made unreadable.
    pub(crate) fn read_of(&self, id: &str) -> Result<(), StoreError> {
        if self.unreadable_n.load(std::sync::atomic::Ordering::Relaxed) == 0
            || !self.unreadable.lock().unwrap_or_else(|p| p.into_inner()).contains(id)
        {
            return Ok(());
        }
        Err(StoreError::Codec {
            key: id.to_string(),
            source: CodecError::Corrupt("message", "injected read failure"),
        })
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
