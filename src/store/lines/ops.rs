//! The store's operations on ordered lines: taking a message out of its line (delete,
//! retention), writing a batch with its line changes, unblocking at a resume, repairing at
//! start, and what the admin API reads (a line, a message's place, the waiting count). The
//! layout and the rules are in the parent module's doc.

use rocksdb::WriteBatch;

use super::{LineRecord, LineTx};
use crate::model::OnDead;
use crate::store::{keys, MessageRecord, State, Store, StoreError};

impl Store {
    /// What leaving the store does to `rec`'s line (delete, retention; the caller holds
    /// its id stripe and its line stripe): a waiting member leaves it; a head whose attempt
    /// is in flight stays the head until that attempt ends (see the module doc); any other
    /// head (or the dead one the line is blocked behind) hands over to the next.
    pub(in crate::store) fn unline(
        &self,
        b: &mut WriteBatch,
        tx: &mut LineTx,
        rec: &MessageRecord,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let Some(fifo) = rec.fifo else { return Ok(()) };
        let open = matches!(rec.state, State::Pending | State::InFlight);
        if open && fifo.pos > 0 {
            return tx.leave(&self.db, b, &rec.endpoint, fifo.pos);
        }
        let in_flight = rec.state == State::InFlight || self.leases.contains(&rec.id);
        if open && in_flight {
            let line = tx.record(&self.db, &rec.endpoint)?;
            if line.as_ref().is_some_and(|l| l.head == rec.id) {
                tx.ghosted.push((rec.id.clone(), rec.endpoint.clone()));
            }
            return Ok(());
        }
        tx.advance(&self.db, b, &rec.endpoint, &rec.id, now_ms)
    }

    /// A finished attempt of a head deleted while it was in flight: the next goes now.
    pub(in crate::store) fn settle_ghost(
        &self,
        b: &mut WriteBatch,
        tx: &mut LineTx,
        id: &str,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        if let Some(endpoint) = self.lines.ghost_of(id) {
            tx.advance(&self.db, b, &endpoint, id, now_ms)?;
            tx.settled.push(id.to_string());
        }
        Ok(())
    }

    /// Writes `b` with the line changes of `tx` (plainly, or synced for an operator) and
    /// reports its due entries; the caller holds the line stripes.
    pub(in crate::store) fn write_with_lines(
        &self,
        mut b: WriteBatch,
        mut tx: LineTx,
        synced: bool,
    ) -> Result<(), StoreError> {
        let min_due = tx.min_due;
        let ghosted = std::mem::take(&mut tx.ghosted);
        let settled = tx.write_into(&self.db, &mut b);
        if synced {
            self.write_synced(b)?;
        } else {
            self.write(b)?;
        }
        self.forget_ghosts(&settled);
        if !ghosted.is_empty() {
            self.lines.ghosts().extend(ghosted);
        }
        if let Some(due) = min_due {
            self.due_floor.wrote(due);
        }
        Ok(())
    }

    pub(in crate::store) fn forget_ghosts(&self, ids: &[String]) {
        if !ids.is_empty() {
            let mut ghosts = self.lines.ghosts();
            for id in ids {
                ghosts.remove(id);
            }
        }
    }

    /// An ordered endpoint's line, if it has one.
    pub fn line(&self, endpoint: &str) -> Result<Option<LineRecord>, StoreError> {
        Ok(LineTx::default().record(&self.db, endpoint)?.take())
    }

    /// How many messages are ahead of an open ordered message in its line: 0 for the head,
    /// n for the n-th waiting behind it. Counts the members ahead (admin only).
    pub fn line_position(&self, rec: &MessageRecord) -> Result<Option<u64>, StoreError> {
        let Some(fifo) = rec
            .fifo
            .filter(|_| matches!(rec.state, State::Pending | State::InFlight))
        else {
            return Ok(None);
        };
        if fifo.pos == 0 {
            return Ok(Some(0));
        }
        let from = keys::line_member_key(&rec.endpoint, 0);
        let mut it = self.range(keys::LINES, &from, Some(keys::line_member_key(&rec.endpoint, fifo.pos)));
        let mut ahead = 1; // the head
        while it.key().is_some() {
            ahead += 1;
            it.next();
        }
        it.status()?;
        Ok(Some(ahead))
    }

    /// Messages waiting in lines behind their heads, all endpoints.
    pub fn lined(&self) -> Result<u64, StoreError> {
        self.counter(keys::COUNT_LINED)
    }

    /// A resume of `endpoint`: a line blocked behind a dead head goes on with the next
    /// message (due at `now_ms`). Returns whether it was blocked.
    pub fn unblock_line(&self, endpoint: &str, now_ms: u64) -> Result<bool, StoreError> {
        let _line = self.lines.lock(std::iter::once(endpoint));
        let mut tx = LineTx::default();
        let head = match tx.record(&self.db, endpoint)? {
            Some(line) if line.blocked => line.head.clone(),
            _ => return Ok(false),
        };
        let mut b = WriteBatch::default();
        tx.advance(&self.db, &mut b, endpoint, &head, now_ms)?;
        self.write_with_lines(b, tx, true)?;
        Ok(true)
    }

    /// At start, after in-flight messages went back to the queue: every line whose head is
    /// gone (deleted while its attempt was in flight) or finished without blocking goes on
    /// with its next message. Returns the endpoints whose lines are blocked, which must be
    /// paused (a crash can fall between the blocking write and the pause).
    pub fn recover_lines(&self, now_ms: u64) -> Result<Vec<String>, StoreError> {
        let mut blocked = Vec::new();
        for endpoint in self.line_endpoints()? {
            let _line = self.lines.lock(std::iter::once(endpoint.as_str()));
            let mut tx = LineTx::default();
            let Some(line) = tx.record(&self.db, &endpoint)?.clone() else {
                // Members without a line record: never written so (the audit checks it);
                // said loudly rather than guessed at.
                tracing::error!(endpoint = %crate::redact::url_for_log(&endpoint),
                    "ordered messages wait in a line that has no head record");
                continue;
            };
            let head = match self.message(&line.head) {
                Ok(head) => head.map(|h| h.state),
                // One line waits for its head to read; the others and the start go on. A
                // blocked line stays paused meanwhile.
                Err(e @ StoreError::Codec { .. }) => {
                    tracing::error!(endpoint = %crate::redact::url_for_log(&endpoint), error = %e,
                        "the head of an ordered line does not read; the line waits for it");
                    if line.blocked {
                        blocked.push(endpoint.clone());
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            if line.blocked && head == Some(State::Dead) {
                blocked.push(endpoint.clone());
                continue;
            }
            if matches!(head, Some(State::Pending | State::InFlight)) {
                continue;
            }
            let mut b = WriteBatch::default();
            tx.advance(&self.db, &mut b, &endpoint, &line.head, now_ms)?;
            tracing::warn!(endpoint = %crate::redact::url_for_log(&endpoint), "ordered line repaired at start");
            self.write_with_lines(b, tx, false)?;
        }
        Ok(blocked)
    }

    /// Every endpoint with a line, in key order: one seek per line, not one read per member
    /// (there is a line per ordered endpoint, which the config bounds).
    pub fn line_endpoints(&self) -> Result<Vec<String>, StoreError> {
        self.endpoints_in(keys::LINES)
    }

    /// What the result of `rec`'s attempt does to its line (the caller holds the line
    /// stripe): delivered, or dead with `skip`, hands over to the next; dead with `block`
    /// blocks the line; a retry changes nothing.
    pub(in crate::store) fn line_after_attempt(
        &self,
        b: &mut WriteBatch,
        tx: &mut LineTx,
        rec: &MessageRecord,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let Some(fifo) = rec.fifo else { return Ok(()) };
        match rec.state {
            State::Delivered => tx.advance(&self.db, b, &rec.endpoint, &rec.id, now_ms),
            State::Dead if fifo.on_dead == OnDead::Block => tx.block(&self.db, &rec.endpoint, &rec.id),
            State::Dead => tx.advance(&self.db, b, &rec.endpoint, &rec.id, now_ms),
            _ => Ok(()),
        }
    }

    /// Whether `id` is a head deleted while its attempt was in flight (audit).
    #[cfg(test)]
    pub(in crate::store) fn is_ghost_head(&self, id: &str) -> bool {
        self.lines.is_ghost(id)
    }
}
