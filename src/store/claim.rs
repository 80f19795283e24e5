//! The scheduler's side of the due queue: walking it in due order from the due floor,
//! moving the floor up after a pass, and reading what a due entry points at.
//!
//! Courier takes a due message for an attempt with an in-memory lease (`lease`), or writes
//! it in flight at accept (`Store::accepting` with `claim`); what happens after the attempt is
//! in `finish`.

use super::{
    keys, CodecError, DueEntry, FloorMark, MessageRecord, NewMessage, Routing, ScanEnd, ScanStep, State, Store,
    StoreError,
};

impl Store {
    /// Walks the due queue in due order, handing each entry due at or before `now_ms` to
    /// `step`, at most `budget` entries.
    ///
    /// The walk starts at the due floor (see `store::floor`), not at the first key: a queue
    /// consumed from its head leaves a trail of deletion tombstones there, and seeking
    /// through them on every pass would cost more the busier courier is. The returned mark
    /// goes back to [`Store::raise_due_floor_to_key`] after the pass.
    ///
    /// `after` continues an earlier walk just past that entry instead of at the floor.
    ///
    /// An entry held back because its message could not be read (see `lease`) is passed
    /// over until its retry time, which then counts as the next due time (of a cut walk
    /// too: the next walk resumes past it); it is reported to the floor as a write is, so
    /// the raise after this walk stays below it.
    pub fn scan_due(
        &self,
        now_ms: u64,
        budget: usize,
        after: Option<(u64, &str)>,
        mut step: impl FnMut(DueEntry) -> ScanStep,
    ) -> Result<(ScanEnd, FloorMark), StoreError> {
        let mark = self.due_floor.mark();
        let floor = keys::time_key(mark.floor, &mark.id);
        let mut it = self.range(
            keys::DUE,
            &floor,
            Some(keys::time_key(now_ms.saturating_add(1), "").to_vec()),
        );
        if let Some((due, id)) = after {
            let from = keys::time_key(due, id);
            it.seek(&from);
            if it.key() == Some(from.as_slice()) {
                it.next();
            }
        }
        let mut seen = 0;
        let mut held_until: Option<u64> = None;
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if seen >= budget {
                return Ok((ScanEnd::Cut { held_until }, mark));
            }
            seen += 1;
            let Some((due_ms, id)) = keys::split_time_key(k) else {
                it.next();
                continue;
            };
            if let Some(at) = self.leases.held_until(id, now_ms) {
                self.due_floor.wrote(due_ms);
                held_until = Some(held_until.map_or(at, |h| h.min(at)));
                it.next();
                continue;
            }
            let routing = Routing::decode(v).map_err(StoreError::codec(id))?;
            if step(DueEntry {
                due_ms,
                id: id.to_string(),
                routing,
            }) == ScanStep::Stop
            {
                return Ok((ScanEnd::Cut { held_until }, mark));
            }
            it.next();
        }
        it.status()?;
        super::walk_step()?;
        drop(it);
        // Nothing more is due now: report when the next entry is (at or above the floor).
        let it = self.range(
            keys::DUE,
            &keys::time_key(now_ms.saturating_add(1), "").max(floor),
            None,
        );
        let next_due_ms = it.key().and_then(keys::split_time_key).map(|(ms, _)| ms);
        it.status()?;
        let next_due_ms = next_due_ms.into_iter().chain(held_until).min();
        Ok((ScanEnd::Exhausted { next_due_ms }, mark))
    }

    /// Raises the due floor towards (`to`, `id`) after a pass that started at `mark` (nothing
    /// live is left below it), but not above a due entry written since (the pass may have
    /// missed it).
    pub fn raise_due_floor_to_key(&self, mark: FloorMark, to: u64, id: &str) {
        self.due_floor.raise_to_key(mark, to, id);
    }

    /// The message a due entry points at, with its payload, if the entry is current (the
    /// message is pending and due at the entry's time); `None` for a stale entry.
    pub(super) fn due_message(&self, entry: &DueEntry) -> Result<Option<NewMessage>, StoreError> {
        let current = |r: &MessageRecord| r.state == State::Pending && r.next_attempt_at_ms == entry.due_ms;
        let Some(record) = self.message(&entry.id)?.filter(current) else {
            return Ok(None);
        };
        let Some(payload) = self.payload(&entry.id)? else {
            return Err(StoreError::Codec {
                key: entry.id.clone(),
                source: CodecError::Corrupt("payload", "missing payload"),
            });
        };
        Ok(Some(NewMessage { record, payload }))
    }
}
