//! The end of an attempt: recording its result and the transition it led to (retry,
//! delivered, dead), and handing an in-flight message back without counting an attempt
//! (release, and recovery of what a crash left in flight).
//!
//! Results are batched: the workers' results that end together are written in one batch,
//! with their counter changes summed (see `counters`).

use super::tx::Tx;
use super::{keys, locked, Finish, LastAttempt, MessageRecord, ResultWrite, State, Store, StoreError, Transition};

impl Store {
    /// Records finished attempts (each attempt number `attempts + 1`) and the transitions
    /// they led to, in one write (one trip through RocksDB's write queue for however many
    /// attempts ended together). One answer per item; an item whose record cannot be read
    /// fails alone, a failed write fails them all. A second item for an id already in the
    /// call is answered stale, as it would be after the first was written.
    pub fn finish_attempts(&self, items: &mut [Finish<'_>]) -> Vec<Result<ResultWrite, StoreError>> {
        let _guards = super::lock_stripes(&self.stripes, items.iter().map(|i| i.id));
        // Each record is had once, here (carried, or read): the ordered ones say which lines
        // to lock (after the id stripes, as every line change does), before anything is
        // staged. A second item for an id already in the call has none (`None`): every
        // record is read before any write lands, so applying it again would count the
        // attempt twice.
        let mut seen = foldhash::HashSet::with_capacity_and_hasher(items.len(), Default::default());
        let records: Vec<Option<Result<Option<Rec<'_>>, StoreError>>> = items
            .iter_mut()
            .map(|item| {
                seen.insert(item.id)
                    .then(|| self.record_of(item.id, item.carried.take()))
            })
            .collect();
        let mut line_endpoints: Vec<String> = Vec::new();
        for (item, rec) in items.iter().zip(&records) {
            match rec {
                Some(Ok(Some(rec))) if rec.fifo.is_some() => line_endpoints.push(rec.endpoint.clone()),
                Some(Ok(None)) => line_endpoints.extend(self.lines.ghost_of(item.id)),
                _ => {}
            }
        }
        let _lines = self.lines.lock(line_endpoints.iter().map(String::as_str));
        let mut tx = Tx::reading(&self.db, &self.faults);
        let out: Vec<_> = (items.iter().zip(records))
            .map(|(item, rec)| match rec {
                None => Ok(ResultWrite::Stale),
                Some(Err(e)) => Err(e),
                Some(Ok(mut rec)) => self.stage_finish(&mut tx, item, rec.as_deref_mut()),
            })
            .collect();
        // A stale result of a head deleted in flight still moves its line on.
        let staged = out.iter().any(|r| matches!(r, Ok(ResultWrite::Written))) || !tx.lines.is_empty();
        let written = if !staged {
            Ok(())
        } else if self.faults.fail_result() {
            Err(StoreError::Injected)
        } else {
            self.commit(tx, false)
        };
        if let Err(e) = written {
            return out.into_iter().map(|r| r.and(Err(e.again()))).collect();
        }
        // Only now, with the stripes still held: the scheduler must not lease a message
        // again before its result is visible.
        self.end_leases(items, &out);
        out
    }

    /// The record a result is staged on (the caller holds its stripe): the one the attempt
    /// carries when it was written in flight at accept ([`super::Claim::AtAccept`]), which
    /// nothing but a delete changes meanwhile (a message in flight is not replayed, parked,
    /// handed off or moved in a line, and is released only by its own attempt, after its
    /// result), so no read and decode per delivered message; else the stored one.
    fn record_of<'a>(&self, id: &str, carried: Option<&'a mut MessageRecord>) -> Result<Option<Rec<'a>>, StoreError> {
        match carried {
            Some(rec) => Ok((!locked(&self.deleted_in_flight).contains(id)).then_some(Rec::Carried(rec))),
            None => Ok(self.message(id)?.map(Rec::Read)),
        }
    }

    /// Ends the leases of the items whose result was written (or stale), and forgets their
    /// deletes in flight. An item that failed wrote nothing (see [`Store::stage_finish`])
    /// and keeps its lease: its worker retries the result, which must not then be taken for
    /// stale, and the message must not start again meanwhile.
    fn end_leases(&self, items: &[Finish<'_>], out: &[Result<ResultWrite, StoreError>]) {
        let failed: foldhash::HashSet<&str> = items
            .iter()
            .zip(out)
            .filter(|(_, r)| r.is_err())
            .map(|(item, _)| item.id)
            .collect();
        let mut deleted = locked(&self.deleted_in_flight);
        for item in items.iter().filter(|i| !failed.contains(i.id)) {
            self.leases.remove(item.id);
            if !deleted.is_empty() {
                deleted.remove(item.id);
            }
        }
    }

    /// Stages one finished attempt's writes on `tx`, updating `rec` to what is written; the
    /// caller holds the id's stripe and, for an ordered message, its line's.
    ///
    /// All or nothing: an item that fails adds nothing, because the batch is still written
    /// for the others. Everything that can fail (the reads of its line) comes first and
    /// changes `tx` only once it has all succeeded (see `Tx::advance`); the writes after it
    /// cannot fail.
    fn stage_finish(
        &self,
        tx: &mut Tx<'_>,
        item: &Finish<'_>,
        rec: Option<&mut MessageRecord>,
    ) -> Result<ResultWrite, StoreError> {
        let Finish {
            id,
            attempt,
            transition,
            now_ms,
            ..
        } = item;
        let (id, now_ms) = (*id, *now_ms);
        let Some(rec) = rec else {
            // Deleted while in flight: if it headed a line, the next goes now.
            self.settle_ghost(tx, id, now_ms)?;
            return Ok(ResultWrite::Stale);
        };
        // In flight on disk (claimed at accept), or pending on disk and leased (claimed by
        // the scheduler): its due entry goes with this write.
        let from = match rec.state {
            State::InFlight => State::InFlight,
            State::Pending if self.leases.contains(id) => State::Pending,
            // Deleted and re-created, or released by recovery: this attempt's result is stale.
            _ => return Ok(ResultWrite::Stale),
        };
        let old_due = keys::time_key(rec.next_attempt_at_ms, id);
        // The only step that can fail, before any write of this item and any change to
        // `rec` (an ordered one: its line moves on with this result).
        let state = match *transition {
            Transition::RetryAt(_) => State::Pending,
            Transition::Delivered => State::Delivered,
            Transition::Dead(_) => State::Dead,
        };
        tx.after_attempt(rec, state, now_ms)?;
        // The attempt before this one leaves the record for the history (the record keeps
        // only the last); a record from before it kept one has all its attempts there.
        let earlier = rec
            .last_attempt
            .take()
            .map(|a| (rec.history_len, a.with(rec.last_status, rec.last_error.take())));
        rec.attempts += 1;
        rec.history_len += 1;
        rec.last_status = attempt.status;
        rec.last_error = attempt.error.clone();
        rec.last_attempt = Some(LastAttempt::of(attempt));
        rec.state = state;
        match *transition {
            Transition::RetryAt(at) => rec.next_attempt_at_ms = at,
            Transition::Delivered => {}
            Transition::Dead(reason) => rec.dead_reason = Some(reason),
        }
        if rec.state != State::Pending {
            (rec.next_attempt_at_ms, rec.finished_at_ms) = (0, now_ms);
        }
        if from == State::Pending {
            tx.delete(keys::DUE, old_due);
        }
        if let Some((number, earlier)) = earlier {
            tx.put(keys::HISTORY, keys::history_key(id, number), earlier.encode());
        }
        if rec.state == State::Pending {
            tx.enqueue(rec);
        } else {
            self.stage_finished(tx, rec);
        }
        tx.move_state(id, from, rec.state);
        tx.put_record(rec);
        Ok(ResultWrite::Written)
    }

    /// Puts an in-flight message back in the queue, due at `now_ms`, without counting an
    /// attempt: for failures of courier itself, and for rate-limit or shutdown hand-backs.
    ///
    /// A release that fails (its record unreadable, its write refused) still ends the lease:
    /// the message is then pending with its due entry where it was, and the floor comes
    /// down to that entry, so the scheduler sees it again (see `lease`). A message written
    /// in flight at accept has no lease; the caller retries its release.
    pub fn release(&self, id: &str, due_ms: u64) -> Result<bool, StoreError> {
        let _g = self.lock(id);
        let released = self.release_locked(id, due_ms);
        if released.is_err() {
            self.end_lease_in_place(id);
        }
        released
    }

    /// [`Store::release`] under the id's stripe.
    fn release_locked(&self, id: &str, due_ms: u64) -> Result<bool, StoreError> {
        let leased = self.leases.contains(id);
        let Some(mut rec) = self.message(id)? else {
            self.leases.remove(id);
            locked(&self.deleted_in_flight).remove(id);
            // Deleted while in flight: if it headed a line, the next goes now.
            if let Some(endpoint) = self.lines.ghost_of(id) {
                let _line = self.lines.lock(std::iter::once(endpoint.as_str()));
                let mut tx = Tx::reading(&self.db, &self.faults);
                self.settle_ghost(&mut tx, id, due_ms)?;
                self.commit(tx, false)?;
            }
            return Ok(false);
        };
        let mut tx = Tx::reading(&self.db, &self.faults);
        match rec.state {
            State::InFlight => tx.move_state(id, State::InFlight, State::Pending),
            State::Pending if leased => {
                if rec.next_attempt_at_ms == due_ms {
                    // Still in the queue where it was: ending the lease is the release. The
                    // scheduler's floor may have passed the entry while it was leased.
                    self.leases.remove(id);
                    self.due_floor.wrote(due_ms);
                    return Ok(true);
                }
                tx.delete(keys::DUE, keys::time_key(rec.next_attempt_at_ms, id));
            }
            _ => {
                self.leases.remove(id);
                return Ok(false);
            }
        }
        rec.state = State::Pending;
        rec.next_attempt_at_ms = due_ms;
        tx.enqueue(&rec);
        tx.put_record(&rec);
        self.commit(tx, false)?;
        self.leases.remove(id);
        Ok(true)
    }

    /// At start: every message left `in_flight` by a crash goes back to due at `now_ms`
    /// with its attempt count unchanged. Returns how many, and those whose record does not
    /// decode (they stay in flight; the others go on without them).
    pub fn recover_in_flight(&self, now_ms: u64) -> Result<(usize, Vec<(String, StoreError)>), StoreError> {
        let ids = self.ids_after(State::InFlight, None, usize::MAX)?;
        let (mut n, mut unreadable) = (0, Vec::new());
        for id in ids {
            match self.release(&id, now_ms) {
                Ok(released) => n += usize::from(released),
                Err(e @ StoreError::Codec { .. }) => unreadable.push((id, e)),
                Err(e) => return Err(e),
            }
        }
        Ok((n, unreadable))
    }
}

/// The record a result is staged on: the attempt's own (carried), or one read for it.
// One per result, for the length of the call: boxing the read one would cost an
// allocation each.
#[allow(clippy::large_enum_variant)]
enum Rec<'a> {
    Carried(&'a mut MessageRecord),
    Read(MessageRecord),
}

impl std::ops::Deref for Rec<'_> {
    type Target = MessageRecord;
    fn deref(&self) -> &MessageRecord {
        match self {
            Rec::Carried(rec) => rec,
            Rec::Read(rec) => rec,
        }
    }
}

impl std::ops::DerefMut for Rec<'_> {
    fn deref_mut(&mut self) -> &mut MessageRecord {
        match self {
            Rec::Carried(rec) => rec,
            Rec::Read(rec) => rec,
        }
    }
}
