//! Fault injection, for tests and the simulator: the store's hooks (`before_write`,
//! `read_of`, ...) ask these switches, which tests set. Production builds have a no-op
//! `Faults` instead (`store::error`).

use std::sync::atomic::Ordering::SeqCst;

use crate::store::{CodecError, StoreError};

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
/// until healed.
#[derive(Debug, Default)]
pub struct Faults {
    /// Synced accept batches.
    pub fail_accepts: std::sync::atomic::AtomicUsize,
    /// Attempt-result batches.
    pub fail_results: std::sync::atomic::AtomicUsize,
    /// Writes of any kind, wherever they are (a commit batch, a result batch, a park, a
    /// release, a promotion, a replay, a sweep chunk, an endpoint's state, a rekey), as a
    /// full disk fails them: the process lives on.
    pub fail_writes: std::sync::atomic::AtomicUsize,
    /// Record reads of any message (a lease, a result's read, a release, a resume page, a
    /// replay, a line member a promotion reads), as an I/O error fails them.
    pub fail_reads: std::sync::atomic::AtomicUsize,
    /// Messages whose reads fail, and how: the per-message read errors the scheduler, the
    /// store writer, a release, a resume, a replay and a sweep must survive without
    /// stalling the others.
    broken: std::sync::Mutex<std::collections::HashMap<String, ItemFault>>,
    /// How many are broken: the read path looks at this, not at the lock.
    broken_n: std::sync::atomic::AtomicUsize,
    /// Broken items read as healthy, and no armed crash lands on a read, while set: the
    /// simulator's own checks read through.
    suspended: std::sync::atomic::AtomicBool,
    /// A crash armed by `Faults::crash_at_read`: record reads still allowed before it.
    reads_before_crash: std::sync::atomic::AtomicUsize,
    /// A crash armed by `Faults::crash_after`: writes still allowed before it (0: none
    /// armed).
    writes_before_crash: std::sync::atomic::AtomicUsize,
    /// The armed crash happened: from that write on, every write fails (the process is gone).
    crashed: std::sync::atomic::AtomicBool,
}

impl Faults {
    /// Whether this accept batch fails (and counts it).
    pub(crate) fn fail_accept(&self) -> bool {
        self.take(&self.fail_accepts)
    }

    /// Whether this result batch fails (and counts it).
    pub(crate) fn fail_result(&self) -> bool {
        self.take(&self.fail_results)
    }

    /// Whether this write fails (and counts it).
    fn take(&self, counter: &std::sync::atomic::AtomicUsize) -> bool {
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
        if self.take(&self.fail_writes) {
            return Err(StoreError::Injected);
        }
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
        if self.take(&self.fail_reads) {
            return Err(StoreError::Injected);
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

/// The switches tests set.
impl Faults {
    /// Makes every read of `id`'s record fail as one that does not decode, until
    /// [`Faults::heal`].
    pub(crate) fn make_unreadable(&self, id: &str) {
        self.break_item(id, ItemFault::Corrupt);
    }

    /// Makes reads of `id` fail as `how` says, until [`Faults::heal`].
    pub(crate) fn break_item(&self, id: &str, how: ItemFault) {
        let mut map = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        map.insert(id.to_string(), how);
        self.broken_n.store(map.len(), SeqCst);
    }

    /// Makes `id` read again.
    pub(crate) fn heal(&self, id: &str) {
        let mut map = self.broken.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(id);
        self.broken_n.store(map.len(), SeqCst);
    }

    /// While `on`, broken items read as healthy (for the simulator's own reads); returns
    /// whether they did before, so nested reads restore it.
    pub(crate) fn suspend(&self, on: bool) -> bool {
        self.suspended.swap(on, SeqCst)
    }

    /// Arms a crash at a record read: `reads` more message reads succeed, and the process
    /// dies at the next one (it and every later write fail), wherever it is: a pass's
    /// lease, a result write's read, a resume page, a replay page, a sweep chunk.
    pub(crate) fn crash_at_read(&self, reads: usize) {
        self.reads_before_crash.store(reads + 1, SeqCst);
    }

    /// Arms a crash inside the next writes, wherever they are (a commit batch, a pass's park,
    /// a resume page, a replay page, a sweep chunk, a line promotion, a hand-off): `writes`
    /// more writes land, and the one after them and every later one fail, as if the process
    /// died right there. The simulator then drops everything in memory and reopens.
    pub(crate) fn crash_after(&self, writes: usize) {
        self.writes_before_crash.store(writes + 1, SeqCst);
    }

    /// Whether an armed crash happened.
    pub(crate) fn crashed(&self) -> bool {
        self.crashed.load(SeqCst)
    }
}

thread_local! {
    /// Iterator walks to fail on this thread (the simulator runs a store on one thread).
    static FAIL_WALKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Makes the next `n` iterator walks on this thread fail (a due scan, a page of any index),
/// as an I/O error in the middle of a walk does; returns how many were still to fail.
pub(crate) fn fail_walks(n: usize) -> usize {
    FAIL_WALKS.with(|w| w.replace(n))
}

/// Called at the end of every iterator walk: `Err` if a test made it fail.
pub(crate) fn walk_step() -> Result<(), StoreError> {
    FAIL_WALKS.with(|w| match w.get() {
        0 => Ok(()),
        n => {
            w.set(n - 1);
            Err(StoreError::Injected)
        }
    })
}
