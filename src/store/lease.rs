//! Leases: how the scheduler takes a due message for an attempt without writing anything.
//!
//! A claim used to be a store write (pending → in flight, due entry removed) that every
//! attempt waited for; under load it queued behind the accepts' fsync while the attempt held
//! its host permit, and the delivery rate fell to the host cap divided by that wait. The
//! write bought nothing a crash needs: after a crash every unfinished message must be tried
//! again anyway, and a pending message with its due entry is exactly that. So a lease is a
//! mark in memory: the message stays pending with its due entry, the scheduler skips it while
//! it is leased, and the result write moves it on from pending in one step (`finish`). The
//! lease ends when that write lands, or when the attempt is handed back (`release`). Bounded:
//! a lease is taken with an attempt permit, and outlives it only while its result waits in
//! the store writer's bounded queue.
//!
//! No lease outlives its attempt, whatever fails. A result that cannot be written keeps its
//! lease for the worker's retry (the message must not start again meanwhile); a release ends
//! the lease even when its write fails, and then lowers the due floor to the entry the lease
//! kept (still where it was), so the next pass sees the message again: that is why a lease
//! remembers its entry's due time.
//!
//! A message whose record or payload cannot be read when the scheduler leases it is not
//! leased and fails alone ([`Store::lease_many`] answers the error in its slot and hands over
//! the other leases). Its entry is then *held back*: the due walk passes over it until its
//! retry time (1 s, doubling to 5 min), keeps the floor below it, and reports that time as a
//! wake-up. So nothing queued behind it waits for it, no permit or rate token is spent on it,
//! and the error is logged once per retry, not once per pass. It stays pending with its due
//! entry, as a retry would leave it (visible in the admin API and the scheduler's log), and
//! once it reads it is delivered, its attempts counted from where they were. It is not
//! dead-lettered: most read errors heal (a disk, a full device), and a record that does not
//! decode cannot be rewritten as dead without guessing at what it said. At most
//! [`HELD_MAX`] entries are held back; past that a failing entry is tried again at every
//! pass (still alone), and entries held for messages gone meanwhile are dropped first.
//!
//! Readers that show state (the admin API) see a leased message as `in_flight`.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

use super::{locked, Claim, DueEntry, Leased, ListFilter, MessageRecord, Page, State, Store, StoreError};

/// The first wait before a message that could not be read is tried again; it doubles with
/// each failure, up to [`HELD_RETRY_MAX_MS`].
const HELD_RETRY_MS: u64 = 1_000;
const HELD_RETRY_MAX_MS: u64 = 300_000;
/// Most entries held back at once.
pub(super) const HELD_MAX: usize = 1024;

/// Messages leased for an attempt: id → the due time of the entry the lease leaves in the
/// queue. And the entries held back because their message could not be read.
#[derive(Debug, Default)]
pub(super) struct Leases {
    ids: Mutex<foldhash::HashMap<String, u64>>,
    held: Mutex<foldhash::HashMap<String, Held>>,
    /// How many are held: the due walk looks at this, not at the lock.
    held_n: AtomicUsize,
}

/// An entry held back after its message could not be read.
#[derive(Debug, Clone, Copy)]
struct Held {
    failures: u32,
    retry_at_ms: u64,
}

impl Leases {
    pub(super) fn contains(&self, id: &str) -> bool {
        locked(&self.ids).contains_key(id)
    }

    /// Ends a lease; answers the due time of the entry it kept, if it was leased.
    pub(super) fn remove(&self, id: &str) -> Option<u64> {
        locked(&self.ids).remove(id)
    }

    /// When a held-back message may be tried again, if that is after `now_ms`.
    pub(super) fn held_until(&self, id: &str, now_ms: u64) -> Option<u64> {
        if self.held_n.load(Relaxed) == 0 {
            return None;
        }
        locked(&self.held)
            .get(id)
            .map(|h| h.retry_at_ms)
            .filter(|at| *at > now_ms)
    }

    /// The message could not be read: hold its entry back, longer each time.
    fn hold(&self, id: &str, now_ms: u64) {
        let mut held = locked(&self.held);
        if held.len() >= HELD_MAX && !held.contains_key(id) {
            // Entries whose retry time is long past were not seen since: their message is gone.
            held.retain(|_, h| h.retry_at_ms.saturating_add(HELD_RETRY_MAX_MS) > now_ms);
            if held.len() >= HELD_MAX {
                return;
            }
        }
        let h = held.entry(id.to_string()).or_insert(Held {
            failures: 0,
            retry_at_ms: 0,
        });
        h.failures = h.failures.saturating_add(1);
        let wait = HELD_RETRY_MS
            .saturating_mul(1 << (h.failures - 1).min(20))
            .min(HELD_RETRY_MAX_MS);
        h.retry_at_ms = now_ms.saturating_add(wait);
        self.held_n.store(held.len(), Relaxed);
    }

    /// The message was read: it is no longer held back.
    fn release_hold(&self, id: &str) {
        if self.held_n.load(Relaxed) > 0 {
            let mut held = locked(&self.held);
            held.remove(id);
            self.held_n.store(held.len(), Relaxed);
        }
    }
}

impl Store {
    /// Whether a message is leased for an attempt right now.
    pub fn is_leased(&self, id: &str) -> bool {
        self.leases.contains(id)
    }

    /// Tests: when a held-back message may be tried again, if after `now_ms`.
    #[cfg(test)]
    pub(crate) fn held_back_until(&self, id: &str, now_ms: u64) -> Option<u64> {
        self.leases.held_until(id, now_ms)
    }

    /// Leases due entries for an attempt at `now_ms`, reading each record and payload: the
    /// answer has one slot per entry, `None` for an entry that is stale (the message moved
    /// on since the scan, or is leased already), the error for one that cannot be read (not
    /// leased, and held back: see the module doc). Writes nothing.
    pub fn lease_many(&self, entries: &[DueEntry], now_ms: u64) -> Vec<Result<Option<Leased>, StoreError>> {
        let _guards = super::lock_stripes(&self.stripes, entries.iter().map(|e| e.id.as_str()));
        entries.iter().map(|entry| self.lease(entry, now_ms)).collect()
    }

    /// One entry of [`Store::lease_many`]; the caller holds its stripe.
    fn lease(&self, entry: &DueEntry, now_ms: u64) -> Result<Option<Leased>, StoreError> {
        if self.leases.contains(&entry.id) {
            return Ok(None);
        }
        let read = self.due_message(entry).inspect_err(|_| self.hold_back(entry, now_ms))?;
        self.leases.release_hold(&entry.id);
        let Some(msg) = read else { return Ok(None) };
        locked(&self.leases.ids).insert(entry.id.clone(), entry.due_ms);
        Ok(Some(Leased::of(msg, Claim::FromQueue)))
    }

    /// Holds back a due entry whose message could not be read (see the module doc).
    pub(super) fn hold_back(&self, entry: &DueEntry, now_ms: u64) {
        self.leases.hold(&entry.id, now_ms);
        // The pass that handed it over may raise the floor past it (it took the entry as
        // dispatched): reported as a write is, so the raise stops below it.
        self.due_floor.wrote(entry.due_ms);
    }

    /// Ends a lease whose entry stays in the queue where it was (a release that could not
    /// be written): the floor comes down to it, or the scheduler, which passed over it
    /// while leased, would never look at it again.
    pub(super) fn end_lease_in_place(&self, id: &str) {
        if let Some(due_ms) = self.leases.remove(id) {
            self.due_floor.wrote(due_ms);
        }
    }

    /// A message as readers see it: `in_flight` while leased. Read under the id's stripe: a
    /// result or release writes the record and ends the lease under it, so a reader sees
    /// both before or both after, never the written retry (its attempt counted) as still in
    /// flight, nor the record from before the write as no longer leased.
    pub fn message_shown(&self, id: &str) -> Result<Option<MessageRecord>, StoreError> {
        let _g = self.lock(id);
        let leased = self.leases.contains(id);
        Ok(self.message(id)?.map(|mut rec| {
            if leased && rec.state == State::Pending {
                rec.state = State::InFlight;
            }
            rec
        }))
    }

    /// A record as readers see it: `in_flight` while leased (for records already read, as
    /// a listing reads them).
    pub fn shown(&self, mut rec: MessageRecord) -> MessageRecord {
        if rec.state == State::Pending && self.leases.contains(&rec.id) {
            rec.state = State::InFlight;
        }
        rec
    }

    /// [`Store::list`] for state `in_flight`: the messages written in flight (claimed at
    /// accept) and those leased, in id order. Both sets are bounded by the attempts in
    /// flight and the results waiting to be written.
    pub(super) fn list_in_flight(
        &self,
        filter: &ListFilter,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<Page, StoreError> {
        let mut ids = self.ids_after(State::InFlight, None, usize::MAX)?;
        ids.extend(locked(&self.leases.ids).keys().cloned());
        ids.sort_unstable();
        ids.dedup();
        if let Some(c) = cursor {
            ids.retain(|id| id.as_str() > c);
        }
        let mut page = Page::default();
        for (i, id) in ids.iter().enumerate() {
            let Some(rec) = self.message_shown(id)?.filter(|r| filter.matches(r)) else {
                continue;
            };
            page.items.push(rec);
            if page.items.len() >= limit {
                if i + 1 < ids.len() {
                    page.next_cursor = Some(id.clone());
                }
                break;
            }
        }
        Ok(page)
    }
}
