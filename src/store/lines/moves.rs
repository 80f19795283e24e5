//! What a transaction does to a line: a message joins it, its head leaves and the next
//! member is promoted, a dead head blocks it, a waiting member leaves it. Staged on a
//! [`Tx`] with the batch's other writes, so a line moves only when its batch is written.

use super::decode_line;
use crate::model::OnDead;
use crate::store::tx::Tx;
use crate::store::LineRecord;
use crate::store::{keys, page, Fifo, MessageRecord, State, StoreError};

impl Tx<'_> {
    /// `endpoint`'s line record, read once per batch.
    pub(in crate::store) fn line(&mut self, endpoint: &str) -> Result<&mut Option<LineRecord>, StoreError> {
        if !self.lines.records.contains_key(endpoint) {
            let stored = crate::store::get(self.db, keys::LINES, &keys::line_key(endpoint))?;
            let stored = stored.map(|v| decode_line(endpoint, &v)).transpose()?;
            self.lines.records.insert(endpoint.to_string(), stored);
        }
        Ok(self.lines.records.get_mut(endpoint).expect("inserted above"))
    }

    /// An ordered message enters its line (accepted, or replayed): it becomes the head when
    /// the line has none, or is the blocked head itself (`true`: queue it), else it waits at
    /// the end (its member key is added here and `rec.fifo.pos` set).
    pub(in crate::store) fn join(&mut self, rec: &mut MessageRecord) -> Result<bool, StoreError> {
        let endpoint = rec.endpoint.clone();
        let fifo = rec.fifo.as_mut().expect("only ordered messages join a line");
        let member = match self.line(&endpoint)? {
            line @ None => {
                *line = Some(LineRecord {
                    head: rec.id.clone(),
                    ..LineRecord::default()
                });
                None
            }
            // The dead head the line is blocked behind, replayed: first again.
            Some(l) if l.head == rec.id => {
                l.blocked = false;
                None
            }
            Some(l) => {
                l.tail += 1;
                l.waiting += 1;
                Some(l.tail)
            }
        };
        fifo.pos = member.unwrap_or(0);
        if let Some(pos) = member {
            self.put(keys::LINES, keys::line_member_key(&endpoint, pos), rec.id.as_bytes());
            self.count(keys::COUNT_LINED, 1);
        }
        self.lines.dirty.insert(endpoint);
        Ok(member.is_none())
    }

    /// The head `id` of `endpoint`'s line left it: the next member is promoted, due at
    /// `now_ms`, or the line ends. Nothing happens when `id` is not the head.
    ///
    /// All or nothing: the members are read first, and this transaction changes only once
    /// every read has succeeded. A result batch is written for its other items when this
    /// one fails, and must not carry half of a line's move.
    pub(in crate::store) fn advance(&mut self, endpoint: &str, id: &str, now_ms: u64) -> Result<(), StoreError> {
        let after = self.lines.taken.get(endpoint).copied();
        let Some(line) = self.line(endpoint)?.clone() else {
            return Ok(());
        };
        if line.head != id {
            return Ok(());
        }
        let prefix = keys::line_key(endpoint);
        let start = keys::line_member_key(endpoint, after.map_or(0, |pos| pos.saturating_add(1)));
        // Member keys leaving the line (the promoted one last), and the promoted record.
        let mut leaving: Vec<(Vec<u8>, u64)> = Vec::new();
        let members = (&start[..], Some(keys::prefix_end(&prefix)));
        let (promoted, _) = page(self.db, keys::LINES, members, 1, |k, v| {
            let Some((_, Some(pos))) = keys::split_line_key(k) else {
                return Ok(None);
            };
            leaving.push((k.to_vec(), pos));
            let rec = self.message(&String::from_utf8_lossy(v))?;
            // A member whose record moved on (never written so, but never worth stopping
            // a line for): dropped, and the next one looked at.
            Ok(rec.filter(|r| r.state == State::Pending && r.fifo.is_some_and(|f| f.pos == pos)))
        })?;
        // Every read succeeded: from here on nothing fails.
        let mut line = line;
        for (key, pos) in leaving {
            self.delete(keys::LINES, key);
            line.waiting = line.waiting.saturating_sub(1);
            self.count(keys::COUNT_LINED, -1);
            self.lines.taken.insert(endpoint.to_string(), pos);
        }
        let head = promoted.into_iter().next().map(|mut rec| {
            rec.fifo = rec.fifo.map(|f| Fifo { pos: 0, ..f });
            rec.next_attempt_at_ms = now_ms;
            self.enqueue(&rec);
            self.put_record(&rec);
            rec.id
        });
        self.lines.records.insert(
            endpoint.to_string(),
            head.map(|head| LineRecord {
                head,
                blocked: false,
                ..line
            }),
        );
        self.lines.dirty.insert(endpoint.to_string());
        Ok(())
    }

    /// The head `id` died with `on_dead = "block"`: the line stays behind it.
    fn block(&mut self, endpoint: &str, id: &str) -> Result<(), StoreError> {
        if let Some(line) = self.line(endpoint)? {
            if line.head == id {
                line.blocked = true;
                self.lines.dirty.insert(endpoint.to_string());
            }
        }
        Ok(())
    }

    /// What the result of `rec`'s attempt, which leaves it in `state`, does to its line (the
    /// caller holds the line stripe): delivered, or dead with `skip`, hands over to the
    /// next; dead with `block` blocks the line; a retry changes nothing.
    pub(in crate::store) fn after_attempt(
        &mut self,
        rec: &MessageRecord,
        state: State,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let Some(fifo) = rec.fifo else { return Ok(()) };
        match state {
            State::Dead if fifo.on_dead == OnDead::Block => self.block(&rec.endpoint, &rec.id),
            State::Delivered | State::Dead => self.advance(&rec.endpoint, &rec.id, now_ms),
            _ => Ok(()),
        }
    }

    /// A waiting member leaves its line (deleted).
    pub(super) fn leave(&mut self, endpoint: &str, pos: u64) -> Result<(), StoreError> {
        self.delete(keys::LINES, keys::line_member_key(endpoint, pos));
        self.count(keys::COUNT_LINED, -1);
        if let Some(line) = self.line(endpoint)? {
            line.waiting = line.waiting.saturating_sub(1);
            self.lines.dirty.insert(endpoint.to_string());
        }
        Ok(())
    }
}
