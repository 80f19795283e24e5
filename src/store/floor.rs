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

use std::sync::Mutex;

/// What a scan started from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloorMark {
    /// The floor value.
    pub floor: u64,
}

#[derive(Debug)]
struct Inner {
    floor: u64,
    written_since_mark: u64,
}

/// The floor and the earliest due time written since the last mark.
#[derive(Debug)]
pub struct DueFloor {
    inner: Mutex<Inner>,
}

impl Default for DueFloor {
    fn default() -> Self {
        DueFloor {
            inner: Mutex::new(Inner {
                floor: 0,
                written_since_mark: u64::MAX,
            }),
        }
    }
}

impl DueFloor {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the floor before a scan and starts recording writes.
    pub fn mark(&self) -> FloorMark {
        let mut g = self.lock();
        g.written_since_mark = u64::MAX;
        FloorMark { floor: g.floor }
    }

    /// The floor now, without starting a new record.
    pub fn peek(&self) -> u64 {
        self.lock().floor
    }

    /// A due entry at `due_ms` was written (and is visible).
    pub fn wrote(&self, due_ms: u64) {
        let mut g = self.lock();
        g.floor = g.floor.min(due_ms);
        g.written_since_mark = g.written_since_mark.min(due_ms);
    }

    /// Raises the floor towards `to` (what the pass proved empty below), but never above an
    /// entry written since the mark.
    pub fn raise(&self, _mark: FloorMark, to: u64) {
        let mut g = self.lock();
        let to = to.min(g.written_since_mark);
        if to > g.floor {
            g.floor = to;
        }
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
}
