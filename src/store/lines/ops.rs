//! The store's operations on ordered lines: taking a message out of its line (delete,
//! retention), writing a batch with its line changes, unblocking at a resume, repairing at
//! start, and what the admin API reads (a line, a message's place, the waiting count). The
//! layout and the rules are in the parent module's doc.

use crate::store::tx::Tx;
use crate::store::LineRecord;
use crate::store::{keys, MessageRecord, State, Store, StoreError};

impl Store {
    /// What leaving the store does to `rec`'s line (delete, retention; the caller holds
    /// its id stripe and its line stripe): a waiting member leaves it; a head whose attempt
    /// is in flight stays the head until that attempt ends (see the module doc); any other
    /// head (or the dead one the line is blocked behind) hands over to the next.
    pub(in crate::store) fn unline(&self, tx: &mut Tx<'_>, rec: &MessageRecord, now_ms: u64) -> Result<(), StoreError> {
        let Some(fifo) = rec.fifo else { return Ok(()) };
        let open = matches!(rec.state, State::Pending | State::InFlight);
        if open && fifo.pos > 0 {
            return tx.leave(&rec.endpoint, fifo.pos);
        }
        let in_flight = rec.state == State::InFlight || self.leases.contains(&rec.id);
        if open && in_flight {
            if tx.line(&rec.endpoint)?.as_ref().is_some_and(|l| l.head == rec.id) {
                tx.lines.ghosted.push((rec.id.clone(), rec.endpoint.clone()));
            }
            return Ok(());
        }
        tx.advance(&rec.endpoint, &rec.id, now_ms)
    }

    /// A finished attempt of a head deleted while it was in flight: the next goes now.
    pub(in crate::store) fn settle_ghost(&self, tx: &mut Tx<'_>, id: &str, now_ms: u64) -> Result<(), StoreError> {
        if let Some(endpoint) = self.lines.ghost_of(id) {
            tx.advance(&endpoint, id, now_ms)?;
            tx.lines.settled.push(id.to_string());
        }
        Ok(())
    }

    /// An ordered endpoint's line, if it has one.
    pub fn line(&self, endpoint: &str) -> Result<Option<LineRecord>, StoreError> {
        Ok(Tx::reading(&self.db, &self.faults).line(endpoint)?.take())
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
        let ahead = (&from[..], Some(keys::line_member_key(&rec.endpoint, fifo.pos).to_vec()));
        let (members, _) = crate::store::page(&self.db, keys::LINES, ahead, usize::MAX, |_, _| Ok(Some(())))?;
        Ok(Some(1 + members.len() as u64)) // the head, and the members ahead
    }

    /// Messages waiting in lines behind their heads, all endpoints.
    pub fn lined(&self) -> Result<u64, StoreError> {
        self.counter(keys::COUNT_LINED)
    }

    /// A resume of `endpoint`: a line blocked behind a dead head goes on with the next
    /// message (due at `now_ms`). Returns whether it was blocked.
    pub fn unblock_line(&self, endpoint: &str, now_ms: u64) -> Result<bool, StoreError> {
        let _line = self.lines.lock(std::iter::once(endpoint));
        let mut tx = Tx::reading(&self.db, &self.faults);
        let head = match tx.line(endpoint)? {
            Some(line) if line.blocked => line.head.clone(),
            _ => return Ok(false),
        };
        tx.advance(endpoint, &head, now_ms)?;
        self.commit(tx, true)?;
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
            let mut tx = Tx::reading(&self.db, &self.faults);
            let Some(line) = tx.line(&endpoint)?.clone() else {
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
            tx.advance(&endpoint, &line.head, now_ms)?;
            tracing::warn!(endpoint = %crate::redact::url_for_log(&endpoint), "ordered line repaired at start");
            self.commit(tx, false)?;
        }
        Ok(blocked)
    }

    /// Every endpoint with a line, in key order: one seek per line, not one read per member
    /// (there is a line per ordered endpoint, which the config bounds).
    pub fn line_endpoints(&self) -> Result<Vec<String>, StoreError> {
        self.endpoints_in(keys::LINES)
    }

    /// Whether `id` is a head deleted while its attempt was in flight (audit).
    pub(in crate::store) fn is_ghost_head(&self, id: &str) -> bool {
        self.lines.is_ghost(id)
    }
}
