//! What the admin API does to messages: replay of dead messages (one or in
//! bulk), delete and listing, with the filter listings and bulk replay share (endpoint
//! state is in `endpoints`).
//!
//! Every change an operator is told succeeded is written synced: a 204 for
//! a delete must survive a power loss. `remove` is shared with the retention sweep.
//!
//! Ordered messages: a replay re-enters the line (at the end, or first again when it is
//! the dead head its line is blocked behind), a delete leaves it; both in the same batch as
//! the change itself (see `lines`).

use super::tx::Tx;
use super::{decode_message, keys, locked, MessageRecord, State, Store, StoreError};

impl Store {
    /// Replays a dead message: pending again, attempts reset, a new give-up time (what
    /// `give_up_at` says for it: its policy's window may depend on its endpoint and route),
    /// due now. `Ok(None)` if there is no such message; `Ok(Some(false))` if it is not dead.
    pub fn replay(
        &self,
        id: &str,
        now_ms: u64,
        give_up_at: impl Fn(&MessageRecord) -> u64,
    ) -> Result<Option<bool>, StoreError> {
        let _g = self.lock(id);
        let Some(rec) = self.message(id)? else {
            return Ok(None);
        };
        if rec.state != State::Dead {
            return Ok(Some(false));
        }
        self.replay_all(&[rec], now_ms, &give_up_at)?;
        Ok(Some(true))
    }

    /// Replays the dead records `dead` (the caller holds their stripes and has read them
    /// under them) in one synced write, in order: replayed together, they join their lines
    /// so.
    fn replay_all(
        &self,
        dead: &[MessageRecord],
        now_ms: u64,
        give_up_at: &dyn Fn(&MessageRecord) -> u64,
    ) -> Result<(), StoreError> {
        let _counters = self.counter_gate.read().unwrap_or_else(|p| p.into_inner());
        let _lines = self
            .lines
            .lock(dead.iter().filter(|r| r.fifo.is_some()).map(|r| r.endpoint.as_str()));
        let mut tx = Tx::reading(&self.db, &self.faults);
        for rec in dead {
            let give_up_at_ms = give_up_at(rec);
            self.replay_into(&mut tx, rec.clone(), now_ms, give_up_at_ms)?;
        }
        self.commit(tx, true)
    }

    /// Stages the replay of a dead `rec` (the caller holds its lock, and its line's when it
    /// is ordered).
    fn replay_into(
        &self,
        tx: &mut Tx<'_>,
        mut rec: MessageRecord,
        now_ms: u64,
        give_up_at_ms: u64,
    ) -> Result<(), StoreError> {
        tx.delete(keys::EXPIRY, keys::time_key(self.expires_at(&rec), &rec.id));
        rec.state = State::Pending;
        rec.attempts = 0;
        rec.dead_reason = None;
        rec.finished_at_ms = 0;
        rec.next_attempt_at_ms = now_ms;
        rec.give_up_at_ms = give_up_at_ms;
        // An ordered message is queued only when it heads its line again.
        if rec.fifo.is_none() || tx.join(&mut rec)? {
            tx.enqueue(&rec);
        }
        tx.move_state(&rec.id, State::Dead, State::Pending);
        tx.count(keys::COUNT_DEAD, -1);
        tx.count_open(&rec.endpoint, 1);
        tx.put_record(&rec);
        Ok(())
    }

    /// Replays every dead message matching `filter` (its state is forced to dead), each with
    /// the give-up time `give_up_at` says for it.
    pub fn replay_dead(
        &self,
        filter: &ListFilter,
        now_ms: u64,
        give_up_at: impl Fn(&MessageRecord) -> u64,
    ) -> Result<usize, StoreError> {
        let filter = ListFilter {
            state: Some(State::Dead),
            ..filter.clone()
        };
        let mut cursor = None;
        let mut n = 0;
        loop {
            // One synced write per page: a bulk replay of 100,000 messages is 200 writes.
            let page = self.list(&filter, 500, cursor.as_deref())?;
            let guards = super::lock_stripes(&self.stripes, page.items.iter().map(|r| r.id.as_str()));
            // Re-read under the lock: it may have changed since the listing.
            let mut dead = Vec::new();
            // (A record that does not decode is not listed: it stays dead, for a later replay.)
            for listed in &page.items {
                if let Some(rec) = self.message(&listed.id)?.filter(|r| r.state == State::Dead) {
                    dead.push(rec);
                }
            }
            if !dead.is_empty() {
                // In id (acceptance) order, as listed.
                self.replay_all(&dead, now_ms, &give_up_at)?;
                n += dead.len();
            }
            drop(guards);
            if page.next_cursor.is_none() {
                return Ok(n);
            }
            cursor = page.next_cursor;
        }
    }

    /// Removes a message and everything indexed under it. `false` if there was none. An
    /// ordered message leaves its line; the next of a deleted head is due at `now_ms`.
    pub fn delete(&self, id: &str, now_ms: u64) -> Result<bool, StoreError> {
        let _g = self.lock(id);
        let Some(rec) = self.message(id)? else { return Ok(false) };
        let _line = self.lines.lock(rec.fifo.map(|_| rec.endpoint.as_str()).into_iter());
        // Read again under the line's stripe: a promotion may have moved it meanwhile.
        let Some(rec) = self.message(id)? else { return Ok(false) };
        let mut tx = Tx::reading(&self.db, &self.faults);
        self.remove(&mut tx, &rec, now_ms)?;
        self.commit(tx, true)?;
        if rec.state == State::InFlight || self.leases.contains(&rec.id) {
            // Its attempt's result is staged on the record the attempt carries: stale now.
            // And one waiting for its host must not start (`deleted_while_taken`).
            locked(&self.deleted_in_flight).insert(rec.id);
        }
        Ok(true)
    }

    /// Whether `id` was deleted since it was taken for an attempt (written in flight, or
    /// leased): memory only, for a message that waits in its host's line.
    pub fn deleted_while_taken(&self, id: &str) -> bool {
        let deleted = locked(&self.deleted_in_flight);
        !deleted.is_empty() && deleted.contains(id)
    }

    /// Stages the removal of `rec` and everything indexed under it (the caller holds its
    /// lock, and its line's when it is ordered). Shared by `delete` and the retention sweep
    /// (`expiry`).
    pub(super) fn remove(&self, tx: &mut Tx<'_>, rec: &MessageRecord, now_ms: u64) -> Result<(), StoreError> {
        self.unline(tx, rec, now_ms)?;
        let id = rec.id.as_str();
        tx.delete(keys::MESSAGES, id);
        tx.delete(keys::PAYLOADS, id);
        tx.delete(keys::STATES, keys::state_key(rec.state.to_byte(), id));
        tx.delete_range(
            keys::HISTORY,
            keys::history_key(id, 0).to_vec(),
            keys::history_key(id, u32::MAX).to_vec(),
        );
        tx.delete(keys::HISTORY, keys::history_key(id, u32::MAX));
        // A message whose event id is its own delivery id's has no `events` entry (see
        // `accept`); another's may be there under the same pair, and stays.
        let event_key = keys::pair_key(&rec.event_id, &rec.target);
        if !crate::model::own_event_id(id, &rec.event_id)
            && super::get(&self.db, keys::EVENTS, &event_key)?.as_deref() == Some(id.as_bytes())
        {
            tx.delete(keys::EVENTS, &event_key);
        }
        if rec.state.is_finished() {
            tx.delete(keys::EXPIRY, keys::time_key(self.expires_at(rec), id));
            tx.count(super::finished_counter(rec.state), -1);
        } else {
            tx.delete(keys::DUE, keys::time_key(rec.next_attempt_at_ms, id));
            tx.delete(keys::PARKED, keys::pair_key(&rec.endpoint, id));
            tx.count_open(&rec.endpoint, -1);
        }
        Ok(())
    }

    /// Lists messages in id (acceptance) order after `cursor`. With a state filter it walks
    /// that state's index; the endpoint and time filters are applied while walking, with a
    /// bound on how far one page looks, so a page may be short and still carry a cursor.
    pub fn list(&self, filter: &ListFilter, limit: usize, cursor: Option<&str>) -> Result<Page, StoreError> {
        let limit = limit.clamp(1, 1000);
        if filter.state == Some(State::InFlight) {
            return self.list_in_flight(filter, limit, cursor);
        }
        let budget = limit * 20 + 1000;
        let (cf, prefix): (&str, Vec<u8>) = match filter.state {
            Some(s) => (keys::STATES, vec![s.to_byte()]),
            None => (keys::MESSAGES, Vec::new()),
        };
        let start = keys::after(&prefix, cursor);
        let mut it = self.range(cf, &start, (!prefix.is_empty()).then(|| keys::prefix_end(&prefix)));
        let mut page = Page::default();
        let mut scanned = 0;
        while let Some(k) = it.key() {
            let id = String::from_utf8_lossy(&k[prefix.len()..]).into_owned();
            scanned += 1;
            // Shown as readers see it: a leased message is in flight, not pending.
            let read = if filter.state.is_some() {
                self.message_shown(&id)
            } else {
                self.faults
                    .read_of(&id)
                    .and_then(|()| decode_message(&id, it.value().unwrap_or_default()))
                    .map(|r| Some(self.shown(r)))
            };
            let rec = match read {
                // One record that does not decode hides only itself: reading it by id
                // answers `corrupt_record`.
                Err(e @ StoreError::Codec { .. }) => {
                    tracing::error!(delivery_id = %id, error = %e, "listing: a message record does not decode; left out");
                    None
                }
                other => other?,
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
    pub(super) fn matches(&self, rec: &MessageRecord) -> bool {
        self.state.is_none_or(|s| s == rec.state)
            && self.endpoint.as_deref().is_none_or(|e| e == rec.endpoint)
            && self.finished_since_ms.is_none_or(|t| rec.finished_at_ms >= t)
            && self.finished_until_ms.is_none_or(|t| rec.finished_at_ms < t)
    }
}
