//! The due floor: a time below which the `due` index holds no entry, so the scheduler can
//! start its walk there instead of seeking through the deletion tombstones a queue leaves
//! at its head.
//!
//! Correctness rests on one rule: every writer of a due entry reports it with
//! [`DueFloor::wrote`] *after* the write is visible, which lowers the floor and bumps an
//! epoch; the scheduler raises the floor only if the epoch did not move since it read the
//! floor (before it created its iterator). So an entry written after the iterator's
//! snapshot either bumps the epoch before the raise (no raise) or lowers the floor after it.

use std::sync::Mutex;

/// What a scan started from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloorMark {
    /// The floor value.
    pub floor: u64,
    epoch: u64,
}

/// The floor and its write epoch.
#[derive(Debug, Default)]
pub struct DueFloor {
    inner: Mutex<(u64, u64)>,
}

impl DueFloor {
    /// Reads the floor before a scan.
    pub fn mark(&self) -> FloorMark {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        FloorMark { floor: g.0, epoch: g.1 }
    }

    /// A due entry at `due_ms` was written (and is visible).
    pub fn wrote(&self, due_ms: u64) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.0 = g.0.min(due_ms);
        g.1 = g.1.wrapping_add(1);
    }

    /// Raises the floor to `to` if nothing was written since `mark`.
    pub fn raise(&self, mark: FloorMark, to: u64) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.1 == mark.epoch && to > g.0 {
            g.0 = to;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_after_the_mark_blocks_the_raise_or_lowers_after_it() {
        let f = DueFloor::default();
        let m = f.mark();
        f.raise(m, 100);
        assert_eq!(f.mark().floor, 100);
        let m = f.mark();
        f.wrote(150); // at or above the floor: the value stays, the epoch moves
        f.raise(m, 200);
        assert_eq!(f.mark().floor, 100, "a write since the mark blocks the raise");
        let m = f.mark();
        f.raise(m, 300);
        f.wrote(120); // written after the raise: the floor comes back down
        assert_eq!(f.mark().floor, 120);
    }
}
