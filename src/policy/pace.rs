//! Ingest's pace when courier's own CPU is what delivery lacks: how many accepts may be in
//! progress at once, decided every tick from what delivery shows.
//!
//! Ingest and delivery share the cores. Under sustained overload the side with more ready
//! work wins them (hundreds of connections against a few dozen attempts), so left alone
//! courier acknowledges faster than it delivers and the backlog and the 202→receiver
//! latency grow without bound while the receiver is fast and idle. The answer is
//! backpressure: slow the 202s until delivery keeps up. But only when the shortfall is
//! courier's CPU: a slow, failing or rate-limited receiver makes messages wait too, and
//! must never slow ingest (storing them is courier's job).
//!
//! The two look alike from the queue (messages wait for a permit); they differ in what
//! delivery's worker threads do meanwhile. Waiting on a receiver, they mostly sleep: little
//! work, whatever its wait for a CPU when they wake. Short of CPU, they have work and wait
//! for a CPU longer than they get one. So the limit comes down (by a quarter a tick, from
//! what is in progress when it first bites) only while messages wait **and** delivery's
//! workers ran at least [`MIN_RUN`] of a core in the last tick **and** waited, runnable, at
//! least as long (as the kernel counts it), and goes back up by an eighth a tick otherwise;
//! once it no longer binds (fewer than half its accepts in use) there is none.
//! Multiplicative down, gentle up: the limit settles where delivery keeps up, and a burst
//! that ends opens ingest again within a second or two.
//!
//! What it cannot tell apart: a receiver at its concurrency cap whose answers courier is
//! slow to read because the cores are full. Delivery then works and waits as above, and
//! ingest is slowed; more CPU would read those answers sooner and free the cap's slots, so
//! that too is delivery short of CPU.

/// How much of a core delivery's workers must have run in a tick for ingest to be slowed:
/// below it, delivery has too little work for more CPU to deliver more (a slow or down
/// receiver's attempts, a few probes).
pub const MIN_RUN: f64 = 0.2;

/// The fewest accepts a limit allows in progress: ingest is slowed, never stopped.
pub const FLOOR: usize = 4;

/// How many accepts may be in progress at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// No limit: delivery keeps up (or it is the receivers that hold it back).
    Open,
    /// At most this many.
    At(usize),
}

/// What one tick saw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tick {
    /// Due messages wait for a permit (the scheduler left some, or an accept could not start).
    pub behind: bool,
    /// How long delivery's workers ran during the tick, summed, over its length (cores).
    pub cpu_run: f64,
    /// How long they waited, runnable, for a CPU, the same way.
    pub cpu_wait: f64,
    /// Accepts in progress at the tick.
    pub in_use: usize,
}

impl Tick {
    /// Delivery is short of CPU, not of receivers.
    pub fn starved(&self) -> bool {
        self.behind && self.cpu_run >= MIN_RUN && self.cpu_wait >= self.cpu_run
    }
}

/// The limit after `tick`, from `limit`.
pub fn next(limit: Limit, tick: Tick) -> Limit {
    match (limit, tick.starved()) {
        (Limit::Open, false) => Limit::Open,
        (Limit::Open, true) => Limit::At(down(tick.in_use)),
        (Limit::At(n), true) => Limit::At(down(n)),
        (Limit::At(n), false) if tick.in_use < n / 2 => Limit::Open,
        (Limit::At(n), false) => Limit::At(n + n / 8 + 1),
    }
}

fn down(n: usize) -> usize {
    (n - n / 4).max(FLOOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tick whose delivery workers ran `cpu_run` and waited `cpu_wait` (cores).
    fn with(behind: bool, cpu_run: f64, cpu_wait: f64, in_use: usize) -> Tick {
        Tick {
            behind,
            cpu_run,
            cpu_wait,
            in_use,
        }
    }

    /// A tick that is starved when `behind`, or not at all.
    fn tick(behind: bool, starved: f64, in_use: usize) -> Tick {
        with(behind, starved, starved * 2.0, in_use)
    }

    #[test]
    fn only_waiting_messages_with_delivery_working_and_waiting_for_a_cpu_slow_ingest() {
        for (behind, run, wait, slowed) in [
            (false, 0.6, 1.1, false), // short of CPU, and keeping up all the same
            (true, 0.04, 0.4, false), // a down or slow receiver: little work, long waits
            (true, 0.19, 1.0, false),
            (true, 0.6, 0.59, false), // working, and getting the CPU it wants
            (true, 0.2, 0.2, true),
            (true, 0.6, 1.1, true),
        ] {
            let after = next(Limit::Open, with(behind, run, wait, 200));
            assert_eq!(after != Limit::Open, slowed, "behind {behind}, run {run}, wait {wait}");
        }
    }

    #[test]
    fn a_limit_first_bites_below_what_is_in_progress_and_comes_down_by_a_quarter_to_the_floor() {
        let mut limit = next(Limit::Open, tick(true, 1.0, 200));
        assert_eq!(limit, Limit::At(150));
        let mut seen = vec![];
        for _ in 0..20 {
            limit = next(limit, tick(true, 1.0, 150));
            let Limit::At(n) = limit else {
                panic!("opened while starved")
            };
            seen.push(n);
        }
        assert_eq!(&seen[..4], &[113, 85, 64, 48]);
        assert_eq!(*seen.last().unwrap(), FLOOR, "{seen:?}");
        assert_eq!(next(Limit::Open, tick(true, 1.0, 0)), Limit::At(FLOOR));
    }

    #[test]
    fn a_limit_goes_up_by_an_eighth_while_it_binds_and_opens_once_it_does_not() {
        let mut limit = Limit::At(FLOOR);
        let mut ticks = 0;
        while let Limit::At(n) = limit {
            // Every pass in use: the limit binds, so it rises step by step.
            let up = next(limit, tick(false, 0.5, n));
            if let Limit::At(m) = up {
                assert_eq!(m, n + n / 8 + 1);
            }
            limit = if n > 300 {
                next(limit, tick(false, 0.5, 100))
            } else {
                up
            };
            ticks += 1;
        }
        // 4 → 300 at +12.5% a tick (about 4 s of 100 ms ticks), after which an ingest
        // using a third of it opens it.
        assert!(ticks < 40, "{ticks}");
        assert_eq!(next(Limit::At(64), tick(false, 1.0, 31)), Limit::Open);
        assert_eq!(next(Limit::At(64), tick(false, 1.0, 32)), Limit::At(73));
    }

    #[test]
    fn starved_again_while_rising_comes_down_from_where_it_got_to() {
        let limit = next(Limit::At(100), tick(false, 1.0, 100));
        assert_eq!(limit, Limit::At(113));
        assert_eq!(next(limit, tick(true, 0.95, 113)), Limit::At(85));
    }
}
