//! First attempts that wait in memory for their host.
//!
//! A message whose only obstacle is its host's cap (every permit of the host taken, or its
//! breaker's ramp) used to wait in the due queue: each permit the host gave back woke a
//! scheduler pass on a blocking thread, which walked the queue, read the record and the
//! payload back and leased a few messages. Under load that is most messages, and a pass per
//! two or three of them cost about twice what the direct path does (docs/benchmarks.md,
//! issue 43 step 10): a host that slowed for a moment knocked courier into a mode it could
//! not afford, and it stayed there.
//!
//! So such a message waits here, behind the others of its host, in arrival order: a new one
//! written in flight at its accept, as one that starts at once is (its accept lets go of
//! ingest's count and byte budget when it arrives, as for one that starts); a due one that
//! a scheduler pass leased (no write, as for one it starts). Every host permit given back,
//! and every arrival, tries the head of its host's line, and so does a permit a scheduler
//! pass took and gave back unused, or an accept dropped unwritten. Nothing polls. A waiter refused for anything but its
//! host's cap (all `delivery.max_in_flight` permits taken, its endpoint's cap or rate, an
//! open breaker, a pause, a delete) leaves for the due queue, where the scheduler applies
//! the rule that refused it. A crash leaves a waiter in flight on disk, or pending with its
//! due entry, and startup puts it back in the queue.
//!
//! Bounded: all lines hold at most `delivery.max_in_flight` messages, so at most as many
//! bodies wait as attempts may hold. Past that, and (for a new message) whenever messages
//! already wait in the queue, a message waits in the queue as before. A drain or a shutdown
//! closes the lines: what waits goes back to the queue, and nothing waits again.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::store::Leased;

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
    /// Waiters in all lines: read without the lock by every accept.
    n: AtomicUsize,
    /// Set once the lines are closed, under the lock (read without it too).
    closed: std::sync::atomic::AtomicBool,
    /// Waiters on their way back to the queue, which a drain waits for.
    leaving: AtomicUsize,
    left: tokio::sync::Notify,
    /// Tests: arrivals turned away (the lines full or closed).
    #[cfg(test)]
    pub(super) turned_away: AtomicUsize,
}

struct Lines<W> {
    /// In host order: a replayed simulation moves the lines in the same order.
    by_host: std::collections::BTreeMap<String, VecDeque<W>>,
}

impl<W> Default for Waiting<W> {
    fn default() -> Self {
        Waiting {
            lines: Mutex::new(Lines {
                by_host: Default::default(),
            }),
            n: AtomicUsize::new(0),
            closed: Default::default(),
            leaving: AtomicUsize::new(0),
            left: tokio::sync::Notify::new(),
            #[cfg(test)]
            turned_away: AtomicUsize::new(0),
        }
    }
}

impl<W> Waiting<W> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Lines<W>> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any message waits in a line.
    pub(super) fn any(&self) -> bool {
        self.n.load(Ordering::Acquire) > 0
    }

    /// Whether a message for `host` must wait behind others already: then it may not start
    /// at its accept even with a permit free (it would overtake them).
    pub(super) fn has(&self, host: &str) -> bool {
        self.any() && self.lock().by_host.contains_key(host)
    }

    /// How many more the lines take before they hold `total` (none once closed; checked
    /// again on arrival).
    pub(super) fn room(&self, total: u32) -> usize {
        match self.closed.load(Ordering::Acquire) {
            true => 0,
            false => (total as usize).saturating_sub(self.n.load(Ordering::Acquire)),
        }
    }

    /// A message arrives in `host`'s line; answered back, for the queue, when the lines hold
    /// `total` already or are closed.
    pub(super) fn arrive(&self, host: &str, w: W, total: u32) -> Option<W> {
        let mut lines = self.lock();
        // `closed` is set under this lock (see `close`): read here, it is exact.
        if self.room(total) == 0 {
            #[cfg(test)]
            self.turned_away.fetch_add(1, Ordering::Relaxed);
            return Some(w);
        }
        lines.by_host.entry(host.to_string()).or_default().push_back(w);
        self.n.fetch_add(1, Ordering::AcqRel);
        None
    }

    /// Takes `host`'s waiters from the head while `turn` lets them go or leave; stops at the
    /// first that stays. Answers those that go (with what `turn` gave) and those that leave.
    #[allow(clippy::type_complexity)]
    pub(super) fn take<P>(&self, host: &str, mut turn: impl FnMut(&W) -> Turn<P>) -> (Vec<(W, P)>, Vec<W>) {
        let (mut go, mut leave) = (Vec::new(), Vec::new());
        if !self.any() {
            return (go, leave);
        }
        let mut lines = self.lock();
        let Some(line) = lines.by_host.get_mut(host) else {
            return (go, leave);
        };
        while let Some(head) = line.front() {
            match turn(head) {
                Turn::Stay => break,
                Turn::Go(p) => go.push((line.pop_front().expect("a head"), p)),
                Turn::Leave => leave.push(line.pop_front().expect("a head")),
            }
        }
        self.n.fetch_sub(go.len() + leave.len(), Ordering::AcqRel);
        if line.is_empty() {
            lines.by_host.remove(host);
        }
        (go, leave)
    }

    /// The hosts with waiters now.
    pub(super) fn hosts(&self) -> Vec<String> {
        if !self.any() {
            return Vec::new();
        }
        self.lock().by_host.keys().cloned().collect()
    }

    /// Closes every line (a drain, a shutdown): answers the waiters, for the queue; later
    /// arrivals are answered back by [`Waiting::arrive`].
    pub(super) fn close(&self) -> Vec<W> {
        let mut lines = self.lock();
        self.closed.store(true, Ordering::Release);
        let all: Vec<W> = std::mem::take(&mut lines.by_host).into_values().flatten().collect();
        self.n.fetch_sub(all.len(), Ordering::AcqRel);
        all
    }

    /// Counts `n` waiters on their way back to the queue until [`Waiting::back`].
    pub(super) fn leave(&self, n: usize) {
        self.leaving.fetch_add(n, Ordering::AcqRel);
    }

    /// `n` waiters are back in the queue.
    pub(super) fn back(&self, n: usize) {
        if self.leaving.fetch_sub(n, Ordering::AcqRel) == n {
            self.left.notify_waiters();
        }
    }

    /// Waits until no waiter is on its way back to the queue.
    pub(super) async fn all_back(&self) {
        loop {
            let left = self.left.notified();
            if self.leaving.load(Ordering::Acquire) == 0 {
                return;
            }
            left.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lines_hold_the_total_and_an_empty_line_is_forgotten() {
        let w = Waiting::default();
        assert!(w.arrive("a", "m1", 3).is_none() && w.arrive("a", "m2", 3).is_none());
        assert!(w.arrive("b", "m3", 3).is_none());
        assert_eq!(w.room(3), 0);
        assert_eq!(w.arrive("c", "m4", 3), Some("m4"), "all lines are full");
        let (go, _) = w.take("b", |_| Turn::Go(()));
        assert_eq!(go.len(), 1);
        assert!(!w.has("b"), "an empty line is forgotten");
        assert!(w.has("a"));
    }

    #[test]
    fn waiters_go_in_arrival_order_until_one_stays_and_those_refused_otherwise_leave() {
        let w = Waiting::default();
        for id in ["m1", "m2", "m3", "m4"] {
            assert!(w.arrive("a", id, 10).is_none());
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
        assert!(!w.has("a") && !w.any());
    }

    #[test]
    fn closed_lines_answer_their_waiters_and_every_later_arrival() {
        let w = Waiting::default();
        assert!(w.arrive("a", "m1", 10).is_none());
        assert_eq!(w.close(), ["m1"]);
        assert_eq!(w.arrive("a", "m2", 10), Some("m2"));
        assert!(!w.any() && !w.has("a") && w.room(10) == 0);
    }

    #[tokio::test]
    async fn all_back_waits_for_the_waiters_on_their_way_to_the_queue() {
        let w = std::sync::Arc::new(Waiting::<()>::default());
        w.all_back().await;
        w.leave(2);
        let waiting = tokio::spawn({
            let w = w.clone();
            async move { w.all_back().await }
        });
        w.back(1);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        w.back(1);
        waiting.await.unwrap();
    }
}
