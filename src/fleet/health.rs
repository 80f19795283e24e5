//! Whether Redis can be used now: a pure state machine, time passed in.
//!
//! `Starting` until the first connection either works (`Up`) or fails (`Down`). Any failed
//! call while `Up` (refused, reset, timed out, an error reply) makes it `Down`: fleet limits
//! stop, the fallback limits apply, and a prober connects again at growing intervals
//! ([`probe_delay_ms`]) until one works. Each transition is reported once, as a [`Change`],
//! so the caller logs one line per outage and one per recovery, however many calls failed.
//!
//! Each connection that works starts a new *generation*. A call's failure names the
//! generation of the connection it used ([`Health::failed`]), and one from an older
//! connection (a late timeout of a call made before an outage) is ignored: it says nothing
//! about the connection in use now, and taking it for an outage would drop a working one.

/// First wait between two connection attempts while Redis is down.
pub const PROBE_BASE_MS: u64 = 500;
/// Longest wait between two connection attempts: how late courier may notice Redis is back.
pub const PROBE_MAX_MS: u64 = 5_000;

/// Where Redis stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum State {
    /// Not connected yet.
    #[default]
    Starting,
    /// Usable: fleet limits are in force.
    Up,
    /// Unusable since `since_ms`, after `failures` failed attempts; the next connection
    /// attempt is due at `next_probe_ms`.
    Down {
        /// When it went down.
        since_ms: u64,
        /// Connection attempts that failed since.
        failures: u32,
        /// When to try again.
        next_probe_ms: u64,
    },
}

/// A transition worth one log line and a gauge update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Redis is usable; `down_ms` is how long it was not (`None` at start).
    Up {
        /// How long the outage lasted.
        down_ms: Option<u64>,
    },
    /// Redis is not usable (`at_start`: it never was since this courier started).
    Down {
        /// The first connection failed.
        at_start: bool,
    },
}

/// Redis's health as this courier sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Health {
    state: State,
    /// Of the connection in use (bumped by each [`Health::succeeded`]); 0 before the first.
    generation: u64,
}

/// The wait after the `failures`-th failed connection attempt in a row: doubling from
/// [`PROBE_BASE_MS`] up to [`PROBE_MAX_MS`].
pub fn probe_delay_ms(failures: u32) -> u64 {
    let doublings = failures.saturating_sub(1).min(16);
    (PROBE_BASE_MS << doublings).min(PROBE_MAX_MS)
}

impl Health {
    /// The state now.
    #[cfg(test)]
    pub fn state(&self) -> State {
        self.state
    }

    /// Whether fleet limits are in force.
    pub fn is_up(&self) -> bool {
        self.state == State::Up
    }

    /// The generation of the connection in use (see the module doc).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// A new connection works: it is the next generation, and fleet limits are on.
    pub fn succeeded(&mut self, now_ms: u64) -> Option<Change> {
        self.generation = self.generation.wrapping_add(1);
        let change = match self.state {
            State::Up => None,
            State::Starting => Some(Change::Up { down_ms: None }),
            State::Down { since_ms, .. } => Some(Change::Up {
                down_ms: Some(now_ms.saturating_sub(since_ms)),
            }),
        };
        self.state = State::Up;
        change
    }

    /// A call on the connection of `generation` failed (`None`: a connection attempt, or
    /// Redis is otherwise known to be unusable): Redis is down, unless that connection is no
    /// longer the one in use (or it already went down), when nothing changes.
    pub fn failed(&mut self, generation: Option<u64>, now_ms: u64) -> Option<Change> {
        if generation.is_some_and(|g| g != self.generation || self.state != State::Up) {
            return None;
        }
        let (change, since_ms, failures) = match self.state {
            State::Starting => (Some(Change::Down { at_start: true }), now_ms, 1),
            State::Up => (Some(Change::Down { at_start: false }), now_ms, 1),
            State::Down { since_ms, failures, .. } => (None, since_ms, failures.saturating_add(1)),
        };
        self.state = State::Down {
            since_ms,
            failures,
            next_probe_ms: now_ms.saturating_add(probe_delay_ms(failures)),
        };
        change
    }

    /// When the prober should try to connect: now while starting, `None` while up.
    pub fn next_probe_ms(&self, now_ms: u64) -> Option<u64> {
        match self.state {
            State::Starting => Some(now_ms),
            State::Up => None,
            State::Down { next_probe_ms, .. } => Some(next_probe_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_delays_double_up_to_the_cap() {
        let table = [
            (0, 500),
            (1, 500),
            (2, 1_000),
            (3, 2_000),
            (4, 4_000),
            (5, 5_000),
            (60, 5_000),
        ];
        for (failures, delay) in table {
            assert_eq!(probe_delay_ms(failures), delay, "after {failures} failures");
        }
        assert_eq!(probe_delay_ms(u32::MAX), PROBE_MAX_MS);
    }

    #[test]
    fn a_first_connection_reports_up_once() {
        let mut h = Health::default();
        assert_eq!(h.next_probe_ms(7), Some(7), "starting: probe at once");
        assert!(!h.is_up());
        assert_eq!(h.succeeded(10), Some(Change::Up { down_ms: None }));
        assert_eq!(h.succeeded(11), None);
        assert!(h.is_up());
        assert_eq!(h.next_probe_ms(11), None);
    }

    #[test]
    fn an_outage_reports_down_once_and_up_once_with_its_length() {
        let mut h = Health::default();
        h.succeeded(0);
        assert_eq!(h.failed(None, 1_000), Some(Change::Down { at_start: false }));
        // Concurrent calls fail too, and the prober's attempts: no further change.
        assert_eq!(h.failed(None, 1_001), None);
        assert_eq!(h.failed(None, 1_600), None);
        assert_eq!(
            h.state(),
            State::Down {
                since_ms: 1_000,
                failures: 3,
                next_probe_ms: 1_600 + 2_000
            }
        );
        assert_eq!(h.next_probe_ms(1_700), Some(3_600));
        assert_eq!(h.succeeded(9_000), Some(Change::Up { down_ms: Some(8_000) }));
        assert!(h.is_up());
        // The next outage starts its backoff over.
        assert_eq!(h.failed(None, 10_000), Some(Change::Down { at_start: false }));
        assert_eq!(h.next_probe_ms(10_000), Some(10_500));
    }

    #[test]
    fn a_late_failure_of_an_old_connection_leaves_the_new_one_up() {
        let mut h = Health::default();
        h.succeeded(0);
        let old = h.generation();
        assert_eq!(h.failed(Some(old), 1_000), Some(Change::Down { at_start: false }));
        // A second call on the same dead connection: no change, no longer backoff.
        assert_eq!(h.failed(Some(old), 1_001), None);
        assert_eq!(h.next_probe_ms(1_001), Some(1_500));
        assert_eq!(h.succeeded(1_500), Some(Change::Up { down_ms: Some(500) }));
        assert_ne!(h.generation(), old);
        // A call made on the old connection times out now: the new one stays in use.
        assert_eq!(h.failed(Some(old), 1_600), None);
        assert!(h.is_up());
        assert_eq!(
            h.failed(Some(h.generation()), 1_700),
            Some(Change::Down { at_start: false })
        );
    }

    #[test]
    fn redis_down_at_start_says_so_once() {
        let mut h = Health::default();
        assert_eq!(h.failed(None, 0), Some(Change::Down { at_start: true }));
        assert_eq!(h.failed(None, 500), None);
        assert_eq!(h.succeeded(2_000), Some(Change::Up { down_ms: Some(2_000) }));
    }
}
