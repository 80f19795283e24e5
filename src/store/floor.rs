//! The due floor: a time below which the `due` index holds no entry, so the scheduler can
//! start its walk there instead of seeking through the deletion tombstones a queue leaves
//! at its head.
//!
//! Correctness rests on one rule: every writer of a due entry reports it with
//! [`DueFloor::wrote`] *after* the write is visible. That lowers the floor at once, and
//! also records the earliest due time written since the scheduler's last [`DueFloor::mark`].
//! A raise after a pass is capped by that record, so an entry written after the pass's
//! iterator was created (which the pass may not have seen) is never left below the floor:
//! either it was reported before the raise (and caps it), or after (and lowers the floor).
//! Only the scheduler marks and raises; writers may be many.
//!
//! The floor is a key of the due index, a time and an id, not only a time: a resume puts a
//! whole outage's backlog due in one millisecond, and a floor that could only name that
//! millisecond would make every pass step again over the deletion tombstones of every
//! message already delivered from it (a quadratic drain). A write always lowers the floor
//! to the start of its millisecond, so an entry re-queued with an old (smaller) id is never
//! hidden.

use std::sync::Mutex;

/// What a scan started from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FloorMark {
    /// The floor's time.
    pub floor: u64,
    /// The floor's id within that time ("" for the whole millisecond).
    pub id: String,
}

#[derive(Debug, Default)]
struct Inner {
    floor: FloorMark,
    /// The earliest due time written since the last mark (`None`: nothing written).
    written_since_mark: Option<u64>,
}

/// The floor and the earliest due time written since the last mark.
#[derive(Debug, Default)]
pub struct DueFloor {
    inner: Mutex<Inner>,
}

impl DueFloor {
    /// Reads the floor before a scan and starts recording writes.
    pub fn mark(&self) -> FloorMark {
        let mut g = super::locked(&self.inner);
        g.written_since_mark = None;
        g.floor.clone()
    }

    /// The floor now, without starting a new record.
    #[cfg(test)]
    pub fn peek(&self) -> u64 {
        super::locked(&self.inner).floor.floor
    }

    /// A due entry at `due_ms` was written (and is visible).
    pub fn wrote(&self, due_ms: u64) {
        let mut g = super::locked(&self.inner);
        if (due_ms, "") < (g.floor.floor, g.floor.id.as_str()) {
            g.floor = FloorMark {
                floor: due_ms,
                id: String::new(),
            };
        }
        g.written_since_mark = Some(g.written_since_mark.map_or(due_ms, |w| w.min(due_ms)));
    }

    /// Raises the floor towards `to` (what the pass proved empty below), but never above an
    /// entry written since the mark.
    #[cfg(test)]
    pub fn raise(&self, mark: FloorMark, to: u64) {
        self.raise_to_key(mark, to, "");
    }

    /// Raises the floor towards (`to`, `id`), below which the pass proved nothing live, but
    /// never above an entry written since the mark: a write since the mark in `to`'s
    /// millisecond or earlier caps it at the start of that millisecond.
    pub fn raise_to_key(&self, _mark: FloorMark, to: u64, id: &str) {
        let mut g = super::locked(&self.inner);
        let (to, id) = match g.written_since_mark {
            Some(written) if to >= written => (written, ""),
            _ => (to, id),
        };
        if (to, id) > (g.floor.floor, g.floor.id.as_str()) {
            g.floor = FloorMark {
                floor: to,
                id: id.to_string(),
            };
        }
    }

    /// The floor as a key: (time, id).
    #[cfg(test)]
    pub fn peek_key(&self) -> (u64, String) {
        let g = super::locked(&self.inner);
        (g.floor.floor, g.floor.id.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_since_the_mark_cap_the_raise_and_later_writes_lower_it() {
        let f = DueFloor::default();
        let m = f.mark();
        f.raise(m, 100);
        assert_eq!(f.peek(), 100);
        let m = f.mark();
        f.wrote(150); // above the floor: the floor stays, but the raise may not pass it
        f.raise(m, 200);
        assert_eq!(f.peek(), 150, "an entry written since the mark caps the raise");
        let m = f.mark();
        f.raise(m, 300);
        assert_eq!(f.peek(), 300, "a new mark forgets writes the previous pass covered");
        f.wrote(120); // written after the raise: the floor comes back down
        assert_eq!(f.peek(), 120);
    }

    #[test]
    fn a_key_floor_skips_within_a_millisecond_and_a_write_there_resets_it() {
        let f = DueFloor::default();
        let m = f.mark();
        f.raise_to_key(m, 100, "dlv_5");
        assert_eq!(f.peek_key(), (100, "dlv_5".to_string()));
        let m = f.mark();
        f.raise_to_key(m, 100, "dlv_9");
        assert_eq!(
            f.peek_key(),
            (100, "dlv_9".to_string()),
            "further into the same millisecond"
        );
        f.wrote(100); // an old id re-queued at 100 may sort before dlv_9
        assert_eq!(f.peek_key(), (100, String::new()));
        let m = f.mark();
        f.wrote(100);
        f.raise_to_key(m, 100, "dlv_9");
        assert_eq!(
            f.peek_key(),
            (100, String::new()),
            "a write since the mark caps the raise"
        );
        let m = f.mark();
        f.wrote(150);
        f.raise_to_key(m, 200, "dlv_1");
        assert_eq!(f.peek_key(), (150, String::new()));
    }
}
