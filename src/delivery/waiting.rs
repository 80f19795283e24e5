//! First attempts that wait in memory for their host.
//!
//! A new message whose only obstacle is its host's cap (every permit of the host taken, or
//! its breaker's ramp) used to go through the due queue: its accept wrote a due entry, and
//! each permit the host gave back woke a scheduler pass on a blocking thread, which walked
//! the queue, read the record and the payload back and leased a few messages. Under load
//! that is most messages, and a pass per two or three of them cost about twice what the
//! direct path does (docs/benchmarks.md, issue 43 step 10): a host that slowed for a
//! moment knocked courier into a mode it could not afford, and it stayed there.
//!
//! So such a message is written in flight at its accept, as one that starts at once is, and
//! waits here, behind the others of its host, in arrival order (its accept, durable, lets go
//! of ingest's count and byte budget when it arrives, as for one that starts). Every
//! host permit given back, and every arrival, tries the head of its host's line; nothing
//! polls and no pass runs. A waiter refused for anything but its host's cap (all
//! `delivery.max_in_flight` permits taken, its endpoint's cap or rate, an open breaker, a
//! pause) leaves for the due queue, where the scheduler applies the rule that refused it.
//! A crash leaves a waiter in flight on disk, which startup puts back in the queue.
//!
//! Bounded: all lines hold at most `delivery.max_in_flight` messages (those on their way
//! from their accept counted), so at most as many bodies wait as attempts may hold. Past
//! that, and whenever messages already wait in the queue, a new message goes to the queue
//! as before. A drain or a shutdown closes the lines: what waits goes back to the queue, and
//! nothing waits again.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::store::Leased;

/// A host's line: its waiters in arrival order, and the accepts on their way to it.
struct Line<W> {
    waiters: VecDeque<W>,
    coming: usize,
}

impl<W> Default for Line<W> {
    fn default() -> Self {
        Line {
            waiters: VecDeque::new(),
            coming: 0,
        }
    }
}

impl<W> Line<W> {
    fn len(&self) -> usize {
        self.waiters.len() + self.coming
    }
}

/// What becomes of a line's head: it starts (with what it took), waits on, or leaves for the
/// queue.
pub(super) enum Turn<P> {
    Go(P),
    Stay,
    Leave,
}

/// Every host's line (see the module doc); `W` is a waiter, what its accept wrote.
pub(super) struct Waiting<W = Leased> {
    lines: Mutex<Lines<W>>,
    /// Waiters and accepts on their way, all lines: read without the lock by every accept.
    n: AtomicUsize,
}

struct Lines<W> {
    by_host: foldhash::HashMap<String, Line<W>>,
    closed: bool,
}

impl<W> Default for Waiting<W> {
    fn default() -> Self {
        Waiting {
            lines: Mutex::new(Lines {
                by_host: Default::default(),
                closed: false,
            }),
            n: AtomicUsize::new(0),
        }
    }
}

impl<W> Waiting<W> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Lines<W>> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any message waits in a line, or is on its way to one.
    pub(super) fn any(&self) -> bool {
        self.n.load(Ordering::Acquire) > 0
    }

    /// Whether a message for `host` must wait behind others already: then it may not start
    /// at its accept even with a permit free (it would overtake them).
    pub(super) fn has(&self, host: &str) -> bool {
        self.n.load(Ordering::Acquire) > 0 && self.lock().by_host.contains_key(host)
    }

    /// Takes a place in `host`'s line for a message on its way from its accept, if all lines
    /// hold fewer than `total`.
    pub(super) fn reserve(&self, host: &str, total: u32) -> bool {
        let mut lines = self.lock();
        if lines.closed || self.n.load(Ordering::Acquire) >= total as usize {
            return false;
        }
        lines.by_host.entry(host.to_string()).or_default().coming += 1;
        self.n.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Gives back a place taken for a message that was not stored (or not claimed).
    pub(super) fn unreserve(&self, host: &str) {
        let mut lines = self.lock();
        if let Some(line) = lines.by_host.get_mut(host) {
            line.coming = line.coming.saturating_sub(1);
            self.n.fetch_sub(1, Ordering::AcqRel);
            if line.len() == 0 {
                lines.by_host.remove(host);
            }
        }
    }

    /// A message that reserved its place in `host`'s line arrives there; answered back
    /// when the lines are closed.
    pub(super) fn arrive(&self, host: &str, w: W) -> Option<W> {
        let mut lines = self.lock();
        let closed = lines.closed;
        let Some(line) = lines.by_host.get_mut(host) else {
            return Some(w);
        };
        line.coming = line.coming.saturating_sub(1);
        if closed {
            self.n.fetch_sub(1, Ordering::AcqRel);
            if line.len() == 0 {
                lines.by_host.remove(host);
            }
            return Some(w);
        }
        line.waiters.push_back(w);
        None
    }

    /// Takes `host`'s waiters from the head while `turn` lets them go or leave; stops at the
    /// first that stays. Answers those that go (with what `turn` gave) and those that leave.
    #[allow(clippy::type_complexity)]
    pub(super) fn take<P>(&self, host: &str, mut turn: impl FnMut(&W) -> Turn<P>) -> (Vec<(W, P)>, Vec<W>) {
        let (mut go, mut leave) = (Vec::new(), Vec::new());
        if self.n.load(Ordering::Acquire) == 0 {
            return (go, leave);
        }
        let mut lines = self.lock();
        let Some(line) = lines.by_host.get_mut(host) else {
            return (go, leave);
        };
        while let Some(head) = line.waiters.front() {
            match turn(head) {
                Turn::Stay => break,
                Turn::Go(p) => go.push((line.waiters.pop_front().expect("a head"), p)),
                Turn::Leave => leave.push(line.waiters.pop_front().expect("a head")),
            }
        }
        self.n.fetch_sub(go.len() + leave.len(), Ordering::AcqRel);
        if line.len() == 0 {
            lines.by_host.remove(host);
        }
        (go, leave)
    }

    /// The hosts with waiters now.
    pub(super) fn hosts(&self) -> Vec<String> {
        if self.n.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        self.lock().by_host.keys().cloned().collect()
    }

    /// Closes every line (a drain, a shutdown): answers the waiters, for the queue; those
    /// still on their way are answered back by [`Waiting::arrive`].
    pub(super) fn close(&self) -> Vec<W> {
        let mut lines = self.lock();
        lines.closed = true;
        let mut all = Vec::new();
        lines.by_host.retain(|_, line| {
            all.extend(line.waiters.drain(..));
            line.coming > 0
        });
        self.n.fetch_sub(all.len(), Ordering::AcqRel);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lines_hold_the_total_with_the_accepts_on_their_way() {
        let w = Waiting::<&str>::default();
        assert!(w.reserve("a", 3) && w.reserve("a", 3));
        assert!(w.reserve("b", 3));
        assert!(!w.reserve("c", 3), "all lines are full, though nobody arrived yet");
        w.unreserve("b");
        assert!(!w.has("b"), "an empty line is forgotten");
        assert!(w.has("a"));
    }

    #[test]
    fn waiters_go_in_arrival_order_until_one_stays_and_those_refused_otherwise_leave() {
        let w = Waiting::default();
        for id in ["m1", "m2", "m3", "m4"] {
            assert!(w.reserve("a", 10));
            assert!(w.arrive("a", id).is_none());
        }
        let mut n = 0;
        let (go, leave) = w.take("a", |id| {
            n += 1;
            match *id {
                "m1" => Turn::Go(1),
                "m2" => Turn::Leave,
                "m3" => Turn::Stay,
                _ => unreachable!("m4 waits behind m3"),
            }
        });
        assert_eq!(n, 3);
        assert_eq!(go, [("m1", 1)]);
        assert_eq!(leave, ["m2"]);
        let (go, _) = w.take("a", |_| Turn::Go(()));
        assert_eq!(go.len(), 2);
        assert!(!w.has("a"));
        assert_eq!(w.n.load(Ordering::Acquire), 0);
    }

    #[test]
    fn closed_lines_answer_their_waiters_and_every_later_arrival_and_take_no_reservation() {
        let w = Waiting::default();
        assert!(w.reserve("a", 10) && w.reserve("a", 10));
        assert!(w.arrive("a", "m1").is_none());
        assert_eq!(w.close(), ["m1"]);
        assert_eq!(w.arrive("a", "m2"), Some("m2"));
        assert!(!w.reserve("a", 10));
        assert_eq!(w.n.load(Ordering::Acquire), 0);
        assert!(!w.has("a"));
    }
}
