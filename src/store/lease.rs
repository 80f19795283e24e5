//! Leases: how the scheduler takes a due message for an attempt without writing anything.
//!
//! A claim used to be a store write (pending → in flight, due entry removed) that every
//! attempt waited for before it could start; under load that write queued behind the
//! accepts' fsync while the attempt held its host permit, and the delivery rate fell to the
//! host cap divided by that wait. The write bought nothing a crash needs: after a crash every
//! message that is not finished must be tried again anyway, and a pending message with its
//! due entry is exactly that. So a lease is a mark in memory: the message stays pending with
//! its due entry on disk, the scheduler skips it while it is leased, and the attempt's result
//! write moves it on from pending in one step (`finish`). The lease ends when that write
//! lands, or when the attempt is handed back (`release`).
//!
//! Bounded: a lease is taken with an attempt permit, and outlives it only while its result
//! waits in the result writer's bounded queue.
//!
//! Readers that show state (the admin API) see a leased message as `in_flight`.

use std::collections::HashSet;
use std::sync::Mutex;

use super::{keys, Claimed, DueEntry, ListFilter, MessageRecord, Page, State, Store, StoreError};

/// Ids of messages leased for an attempt.
#[derive(Debug, Default)]
pub(super) struct Leases {
    ids: Mutex<HashSet<String>>,
}

impl Leases {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.ids.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn contains(&self, id: &str) -> bool {
        self.lock().contains(id)
    }

    pub(super) fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    fn insert(&self, id: &str) -> bool {
        self.lock().insert(id.to_string())
    }

    fn sorted(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.lock().iter().cloned().collect();
        ids.sort_unstable();
        ids
    }
}

impl Store {
    /// Whether a message is leased for an attempt right now.
    pub fn is_leased(&self, id: &str) -> bool {
        self.leases.contains(id)
    }

    /// Leases due entries for an attempt, reading each record and payload: the answer has
    /// one slot per entry, `None` for an entry that is stale (the message moved on since the
    /// scan, or is leased already). Writes nothing.
    pub fn lease_many(&self, entries: &[DueEntry]) -> Result<Vec<Option<Claimed>>, StoreError> {
        let _guards = self.lock_many(entries.iter().map(|e| e.id.as_str()));
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            if self.leases.contains(&entry.id) {
                out.push(None);
                continue;
            }
            let Some(Claimed {
                record: mut rec,
                payload,
            }) = self.due_message(entry)?
            else {
                out.push(None);
                continue;
            };
            self.leases.insert(&rec.id);
            rec.state = State::InFlight;
            out.push(Some(Claimed { record: rec, payload }));
        }
        Ok(out)
    }

    /// A message as readers see it: `in_flight` while leased. The lease is looked at before
    /// the record is read: a result or release writes the record first and ends the lease
    /// after, so this never shows the record from before such a write as no longer leased.
    pub fn message_shown(&self, id: &str) -> Result<Option<MessageRecord>, StoreError> {
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
        let mut ids = self.ids_in_state(State::InFlight, usize::MAX)?;
        ids.extend(self.leases.sorted());
        ids.sort_unstable();
        ids.dedup();
        if let Some(c) = cursor {
            ids.retain(|id| id.as_str() > c);
        }
        let mut page = Page::default();
        for (i, id) in ids.iter().enumerate() {
            let Some(rec) = self.message_shown(id)? else {
                continue;
            };
            if !filter.matches(&rec) {
                continue;
            }
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

    /// The due entry of a leased message, which its result write removes.
    pub(super) fn leased_due_key(rec: &MessageRecord) -> Vec<u8> {
        keys::time_key(rec.next_attempt_at_ms, &rec.id)
    }
}
