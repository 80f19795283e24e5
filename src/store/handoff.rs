//! What `courier drain` needs from the store: the pending messages in acceptance order, a
//! page at a time, and the hand-off transition.
//!
//! A hand-off is written only after the peer courier answered 202 for the message, so it
//! takes a pending message straight to `handed_off`, a terminal state kept for `retention`
//! like a delivered message: out of the due queue (or its paused endpoint's parked set, or
//! its ordered line, whose next message then heads the line), out of the open counters, into
//! the expiry index. A message in flight (claimed on disk, or leased by the scheduler) is
//! never handed off: its attempt's result owns its next transition. The write is not synced:
//! a hand-off lost to a power cut leaves the message pending, and the next drain forwards it
//! again, which the peer's dedupe (event id and target) answers as a duplicate.

use super::tx::Tx;
use super::{keys, State, Store, StoreError};

/// What [`Store::hand_off`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandOff {
    /// Now `handed_off`.
    Done,
    /// Not pending (in flight, finished or dead): left as it is.
    NotPending(State),
    /// Pending on disk but leased for an attempt that is running: left as it is.
    Leased,
    /// No such message (deleted meanwhile).
    Gone,
}

impl Store {
    /// Up to `limit` ids of `state`, in id (acceptance) order, strictly after `after`.
    pub fn ids_after(&self, state: State, after: Option<&str>, limit: usize) -> Result<Vec<String>, StoreError> {
        let prefix = [state.to_byte()];
        // From the cursor: the keys handed off behind it are tombstones a seek from the
        // prefix would step over again on every page.
        let range = (&keys::after(&prefix, after)[..], Some(keys::prefix_end(&prefix)));
        let (ids, _) = super::page(&self.db, keys::STATES, range, limit, |k, _| {
            Ok(Some(String::from_utf8_lossy(&k[1..]).into_owned()))
        })?;
        Ok(ids)
    }

    /// Marks a pending message handed off (the peer answered 202 for it) at `now_ms`.
    pub fn hand_off(&self, id: &str, now_ms: u64) -> Result<HandOff, StoreError> {
        let _g = self.lock(id);
        let Some(rec) = self.message(id)? else {
            return Ok(HandOff::Gone);
        };
        let _line = self.lines.lock(rec.fifo.map(|_| rec.endpoint.as_str()).into_iter());
        // Read again under the line's stripe: a promotion may have moved it meanwhile.
        let Some(mut rec) = self.message(id)? else {
            return Ok(HandOff::Gone);
        };
        if rec.state != State::Pending {
            return Ok(HandOff::NotPending(rec.state));
        }
        if self.leases.contains(id) {
            return Ok(HandOff::Leased);
        }
        let mut tx = Tx::reading(&self.db, &self.faults);
        // Out of wherever it waits: the due queue, its paused endpoint's parked set, or its
        // line (a waiting member leaves it; a head hands over to the next, due now).
        tx.delete(keys::DUE, keys::time_key(rec.next_attempt_at_ms, id));
        tx.delete(keys::PARKED, keys::pair_key(&rec.endpoint, id));
        self.unline(&mut tx, &rec, now_ms)?;
        rec.state = State::HandedOff;
        rec.next_attempt_at_ms = 0;
        rec.finished_at_ms = now_ms;
        if let Some(fifo) = rec.fifo.as_mut() {
            fifo.pos = 0; // it has left its line
        }
        tx.move_state(id, State::Pending, State::HandedOff);
        self.stage_finished(&mut tx, &rec);
        tx.put_record(&rec);
        self.commit(tx, false)?;
        Ok(HandOff::Done)
    }
}
