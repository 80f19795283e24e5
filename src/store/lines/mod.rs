//! Ordered endpoints: one line per endpoint, the head attempted, the rest waiting.
//!
//! A message accepted for an ordered endpoint (`ordering = "fifo"` on its `[[endpoint]]`
//! or on the `[[route]]` it came through) carries a [`Fifo`] part in its record. Of an
//! endpoint's open ordered messages only one, the *head*, is in the due queue; the others
//! wait in the `lines` column family with no due entry at all, so the scheduler, the
//! accept fast path and every other reader of the queue never see them, and at most one
//! attempt per ordered endpoint can be in flight without any check on the hot path:
//!
//! - `endpoint ‖ 0` → [`LineRecord`]: the head's id, whether the line is blocked behind a
//!   dead head (`on_dead = "block"`), the last position given out and how many wait. It sorts
//!   before its members, so one seek reads the record and then the next member.
//! - `endpoint ‖ 0 ‖ be64(pos)` → id: the waiting members, in position order. Positions
//!   come from the line record's own counter, taken by the store writer in the order it
//!   writes accepts, so a line's order is the order of the 202s (ids alone would not be: an
//!   id is drawn before its accept reaches the store writer, and a clock stepped back
//!   across a restart would sort new ids before old ones).
//!
//! Every change to a line is written in the same `WriteBatch` as the message transition
//! that causes it, so a kill -9 between any two writes leaves a line that is whole:
//! - accept: no line record → the message is the head (due entry as usual); else it is
//!   appended (the batch's own earlier accepts of the endpoint count, see `tx::LineTx`);
//! - the head delivered, or dead with `on_dead = "skip"`, or deleted, or removed by
//!   retention: the next member is promoted (its member key goes, its due entry is written,
//!   due at once) or, with none left, the line record goes;
//! - the head dead with `on_dead = "block"`: the record is marked blocked and nothing is
//!   promoted; delivery then pauses the endpoint (with its alert). A resume unblocks the
//!   line (the next goes) before it activates the endpoint; a replay of the blocked head
//!   makes it the head again, first in line;
//! - a replay of any other dead message appends it at the end: a replay is a new
//!   acceptance as far as order goes (the simplest rule that is crash-safe: its old place
//!   is gone once later messages were delivered);
//! - delete of a waiting member takes it out of the line. Delete of a head whose attempt is
//!   in flight leaves the line record pointing at the deleted id until that attempt ends
//!   (its result or release promotes the next; a crash leaves it for startup), so the next
//!   message's attempt never overlaps it at the receiver.
//!
//! Startup ([`Store::recover_lines`]) repairs what a crash can leave: a head deleted while
//! in flight, and a blocked line whose endpoint was not yet paused.
//!
//! Concurrency: line changes are serialised per endpoint by a lock striped over the
//! endpoint key. Order: id stripes, then the counter gate, then line stripes, several at
//! once only in stripe order; nobody takes an id stripe or the gate while holding a line
//! stripe. An accept batch holds its line stripes across the synced write (a
//! decision head-or-member must not be overtaken by a promotion that read the line before
//! it). A promoted member's record is written under its line's stripe only: every writer of
//! a waiting member's record (delete is the only one: it has no due entry, is never leased,
//! parked or replayed) takes that stripe before reading it.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use super::codec::LineRecord;
use super::StoreError;

// What the store's operations do with lines (delete, retention, resume, startup, admin).
mod ops;
// How a transaction moves a line (join, advance, block, leave).
mod moves;

pub(super) fn decode_line(endpoint: &str, v: &[u8]) -> Result<LineRecord, StoreError> {
    LineRecord::decode(v).map_err(StoreError::codec(format!("line {endpoint}")))
}

/// The line stripes, and the heads deleted while their attempt was in flight.
#[derive(Debug)]
pub(super) struct LineLocks {
    stripes: Vec<Mutex<()>>,
    /// Deleted head id → its endpoint, until its attempt's result or release promotes the
    /// next. Bounded by the attempts in flight; lost in a crash, when startup takes over.
    ghosts: Mutex<HashMap<String, String>>,
}

impl Default for LineLocks {
    fn default() -> Self {
        LineLocks {
            stripes: (0..super::LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            ghosts: Mutex::new(HashMap::new()),
        }
    }
}

impl LineLocks {
    /// The stripes of `endpoints`, taken in stripe order.
    pub(super) fn lock<'a>(&'a self, endpoints: impl Iterator<Item = &'a str>) -> Vec<MutexGuard<'a, ()>> {
        super::lock_stripes(&self.stripes, endpoints)
    }

    pub(super) fn ghost_of(&self, id: &str) -> Option<String> {
        super::locked(&self.ghosts).get(id).cloned()
    }

    /// After a batch is written: the heads it settled stop being ghosts, those it deleted in
    /// flight become ghosts.
    pub(super) fn settle(&self, settled: Vec<String>, ghosted: Vec<(String, String)>) {
        if !settled.is_empty() || !ghosted.is_empty() {
            let mut ghosts = super::locked(&self.ghosts);
            for id in &settled {
                ghosts.remove(id);
            }
            ghosts.extend(ghosted);
        }
    }

    pub(super) fn is_ghost(&self, id: &str) -> bool {
        super::locked(&self.ghosts).contains_key(id)
    }
}
