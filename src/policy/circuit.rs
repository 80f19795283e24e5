//! The host circuit breaker, as a pure state machine (time passed in, no I/O).
//!
//! When a host is down, every pending message to it would wake on its own backoff and make
//! its own doomed attempt, and all of them would rush it when it returns. After
//! `circuit.failures` consecutive failures (network errors, timeouts, or a status in
//! `circuit.statuses` without `Retry-After`) the breaker *opens*: the host's messages stay
//! due but are not attempted (no attempt is counted). At the probe time one attempt goes
//! out (*probing*); if it fails, the breaker opens again for twice as long (up to
//! `circuit.probe_max_delay`). If the receiver answers, the breaker *ramps*: two attempts
//! may be in flight, then twice as many after each answer, up to the host's cap, where it
//! is *closed* again. Any answer that is not a counted failure (a 404 or 410 too: the host
//! is up) counts as one.

/// How long past its probe time an open breaker with nothing due is remembered.
const FORGET_AFTER_MS: u64 = 600_000;

/// Breaker settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitSettings {
    /// Consecutive failures that open the breaker; 0 turns it off.
    pub failures: u32,
    /// Wait before the first probe.
    pub probe_delay_ms: u64,
    /// The longest wait between probes.
    pub probe_max_delay_ms: u64,
    /// How long a probe may go unanswered before another is allowed (a probe cut off
    /// without a result must not hold the host shut for good).
    pub probe_timeout_ms: u64,
}

/// Where a host's breaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CircuitState {
    /// Attempts go out up to the host's cap.
    #[default]
    Closed,
    /// No attempt until the probe time.
    Open,
    /// One probe attempt is out.
    Probing,
    /// Back up: at most this many attempts in flight, doubling with each answer.
    Ramping(u32),
}

impl CircuitState {
    /// The name the admin API and logs use.
    pub fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::Probing => "probing",
            CircuitState::Ramping(_) => "ramping",
        }
    }
}

/// What an attempt's result was, as the breaker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostOutcome {
    /// The host answered (any status that is not a counted failure).
    Answered,
    /// A network error, a timeout, or a counted status without `Retry-After`.
    Failed,
    /// Says nothing about the host (refused by the egress policy, courier's own failure).
    Neutral,
}

/// Whether an attempt may start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Yes (within the host's cap, which the caller enforces).
    Yes,
    /// No; ask again at this time (or when an attempt to the host ends, if `None`).
    Wait(Option<u64>),
}

/// One host's breaker.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Circuit {
    state: CircuitState,
    /// Consecutive counted failures while closed.
    failures: u32,
    /// Consecutive opens without an answer: the probe delay doubles with each.
    opens: u32,
    /// Open: when the probe may go. Probing: when a lost probe may be replaced.
    next_probe_ms: u64,
    /// Probes started: names the probe now out, so only its own end can count as lost.
    probes: u64,
    /// Times it opened: an attempt admitted before the latest opening carries an older
    /// epoch, and its failure (a slow timeout arriving late) says nothing new.
    epoch: u64,
}

/// A change worth a log line and a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitChange {
    /// Opened (or opened again after a failed probe) until the probe time.
    Opened {
        /// When the probe may go.
        probe_at_ms: u64,
    },
    /// The probe was answered: ramping up.
    Recovering,
    /// Back to the host's full cap.
    Closed,
}

impl Circuit {
    /// The state now.
    pub fn state(&self) -> CircuitState {
        self.state
    }

    /// The epoch an attempt admitted now belongs to (pass it back to [`Circuit::record`]).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Consecutive counted failures (while closed).
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// When the next probe may go, while open or probing.
    pub fn next_probe_ms(&self) -> Option<u64> {
        matches!(self.state, CircuitState::Open | CircuitState::Probing).then_some(self.next_probe_ms)
    }

    /// Worth remembering at `now_ms` once nothing is in flight to the host: open or
    /// probing, with the probe time not long past. A closed breaker's few failures, a ramp,
    /// or an open breaker nothing came due for (its messages gone) may be forgotten: the
    /// next attempt to the host then decides afresh, as a probe would.
    pub fn worth_keeping(&self, now_ms: u64) -> bool {
        matches!(self.state, CircuitState::Open | CircuitState::Probing)
            && now_ms <= self.next_probe_ms.saturating_add(FORGET_AFTER_MS)
    }

    /// Whether an attempt may start now, with `in_flight` attempts to the host running.
    /// Saying yes while open starts the probe.
    pub fn admit(&mut self, s: &CircuitSettings, in_flight: u32, now_ms: u64) -> Admit {
        match self.state {
            CircuitState::Closed => Admit::Yes,
            CircuitState::Open | CircuitState::Probing if now_ms >= self.next_probe_ms => {
                self.state = CircuitState::Probing;
                self.next_probe_ms = now_ms.saturating_add(s.probe_timeout_ms);
                self.probes += 1;
                Admit::Yes
            }
            CircuitState::Open | CircuitState::Probing => Admit::Wait(Some(self.next_probe_ms)),
            CircuitState::Ramping(limit) if in_flight < limit => Admit::Yes,
            CircuitState::Ramping(_) => Admit::Wait(None),
        }
    }

    /// Applies the outcome of an attempt admitted in `epoch` ([`Circuit::epoch`] when it was
    /// admitted); `cap` is the host's in-flight cap. Returns the change,
    /// if the state changed.
    pub fn record(
        &mut self,
        s: &CircuitSettings,
        outcome: HostOutcome,
        epoch: u64,
        cap: u32,
        now_ms: u64,
    ) -> Option<CircuitChange> {
        // A failure of an attempt admitted before the breaker last opened was part of that
        // outage already: it must not reopen a breaker that is probing or ramping since.
        if s.failures == 0 || (outcome == HostOutcome::Failed && epoch < self.epoch) {
            return None;
        }
        match (outcome, self.state) {
            (HostOutcome::Neutral, _) => None,
            (HostOutcome::Answered, CircuitState::Closed) => {
                self.failures = 0;
                None
            }
            (HostOutcome::Answered, CircuitState::Open | CircuitState::Probing) => {
                self.failures = 0;
                Some(self.ramp_to(2, cap))
            }
            (HostOutcome::Answered, CircuitState::Ramping(limit)) => {
                Some(self.ramp_to(limit.saturating_mul(2), cap)).filter(|c| *c == CircuitChange::Closed)
            }
            (HostOutcome::Failed, CircuitState::Closed) => {
                self.failures += 1;
                (self.failures >= s.failures).then(|| self.open(s, now_ms))
            }
            // A failed probe, or a failure while ramping: the host is not back after all.
            (HostOutcome::Failed, CircuitState::Probing | CircuitState::Ramping(_)) => Some(self.open(s, now_ms)),
            // An attempt that started before the breaker opened: nothing new.
            (HostOutcome::Failed, CircuitState::Open) => None,
        }
    }

    /// The probe now out, if probing: pass it to [`Circuit::probe_lost`] if it ends
    /// without an outcome that moved the breaker on.
    pub fn probe(&self) -> Option<u64> {
        (self.state == CircuitState::Probing).then_some(self.probes)
    }

    /// Probe `probe` ended without a result that says anything about the host (its permit
    /// went unused, the message was gone, courier failed on it, egress refused it): another
    /// may go at once rather than after the probe timeout.
    pub fn probe_lost(&mut self, probe: u64) {
        if self.probe() == Some(probe) {
            self.state = CircuitState::Open;
            self.next_probe_ms = 0;
        }
    }

    fn ramp_to(&mut self, limit: u32, cap: u32) -> CircuitChange {
        if limit >= cap {
            // Only a host back at its full cap earns a fresh probe delay: one that answers a
            // probe but fails under load keeps backing off.
            self.opens = 0;
            self.state = CircuitState::Closed;
            CircuitChange::Closed
        } else {
            self.state = CircuitState::Ramping(limit);
            CircuitChange::Recovering
        }
    }

    fn open(&mut self, s: &CircuitSettings, now_ms: u64) -> CircuitChange {
        let delay = s
            .probe_delay_ms
            .saturating_mul(1u64 << self.opens.min(32))
            .min(s.probe_max_delay_ms);
        self.opens = self.opens.saturating_add(1);
        self.epoch += 1;
        self.failures = 0;
        self.state = CircuitState::Open;
        self.next_probe_ms = now_ms.saturating_add(delay);
        CircuitChange::Opened {
            probe_at_ms: self.next_probe_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: CircuitSettings = CircuitSettings {
        failures: 3,
        probe_delay_ms: 1_000,
        probe_max_delay_ms: 5_000,
        probe_timeout_ms: 30_000,
    };

    fn fail(c: &mut Circuit, now: u64) -> Option<CircuitChange> {
        c.record(&S, HostOutcome::Failed, c.epoch(), 10, now)
    }

    #[test]
    fn consecutive_failures_open_it_and_an_answer_in_between_resets_the_count() {
        let mut c = Circuit::default();
        assert_eq!(fail(&mut c, 0), None);
        assert_eq!(fail(&mut c, 0), None);
        assert_eq!(
            c.record(&S, HostOutcome::Answered, c.epoch(), 10, 0),
            None,
            "a 404 says the host is up"
        );
        assert_eq!(c.failures(), 0);
        assert_eq!(c.record(&S, HostOutcome::Neutral, c.epoch(), 10, 0), None);
        assert_eq!(fail(&mut c, 0), None);
        assert_eq!(fail(&mut c, 0), None);
        assert_eq!(fail(&mut c, 100), Some(CircuitChange::Opened { probe_at_ms: 1_100 }));
        assert_eq!(c.state(), CircuitState::Open);
        assert_eq!(c.admit(&S, 0, 1_099), Admit::Wait(Some(1_100)));
    }

    #[test]
    fn one_probe_at_a_time_and_failed_probes_back_off_up_to_the_limit() {
        let mut c = Circuit::default();
        for _ in 0..3 {
            fail(&mut c, 0);
        }
        let mut now = 1_000;
        for expected_delay in [2_000, 4_000, 5_000, 5_000] {
            assert_eq!(c.admit(&S, 0, now), Admit::Yes, "the probe");
            assert_eq!(c.state(), CircuitState::Probing);
            assert_eq!(c.admit(&S, 1, now), Admit::Wait(Some(now + 30_000)), "only one probe");
            // Attempts that started before the breaker opened change nothing.
            assert_eq!(
                fail(&mut c, now),
                Some(CircuitChange::Opened {
                    probe_at_ms: now + expected_delay
                })
            );
            assert_eq!(fail(&mut c, now), None);
            now += expected_delay;
        }
    }

    #[test]
    fn a_lost_probe_is_replaced_after_the_probe_timeout() {
        let mut c = Circuit::default();
        for _ in 0..3 {
            fail(&mut c, 0);
        }
        assert_eq!(c.admit(&S, 0, 1_000), Admit::Yes);
        assert_eq!(c.admit(&S, 0, 30_999), Admit::Wait(Some(31_000)));
        assert_eq!(c.admit(&S, 0, 31_000), Admit::Yes);
    }

    #[test]
    fn an_answered_probe_ramps_up_to_the_cap_then_closes() {
        let mut c = Circuit::default();
        for _ in 0..3 {
            fail(&mut c, 0);
        }
        assert_eq!(c.admit(&S, 0, 1_000), Admit::Yes);
        assert_eq!(
            c.record(&S, HostOutcome::Answered, c.epoch(), 10, 1_100),
            Some(CircuitChange::Recovering)
        );
        assert_eq!(c.state(), CircuitState::Ramping(2));
        assert_eq!(c.admit(&S, 1, 1_100), Admit::Yes);
        assert_eq!(c.admit(&S, 2, 1_100), Admit::Wait(None), "at the ramp's limit");
        assert_eq!(c.record(&S, HostOutcome::Answered, c.epoch(), 10, 1_200), None);
        assert_eq!(c.state(), CircuitState::Ramping(4));
        assert_eq!(c.record(&S, HostOutcome::Answered, c.epoch(), 10, 1_200), None);
        assert_eq!(c.state(), CircuitState::Ramping(8));
        assert_eq!(
            c.record(&S, HostOutcome::Answered, c.epoch(), 10, 1_200),
            Some(CircuitChange::Closed)
        );
        assert_eq!((c.state(), c.failures()), (CircuitState::Closed, 0));
        assert!(!c.worth_keeping(1_200));
        // A failure while ramping opens it again, the delay doubled: the host answered a
        // probe but never got back to its cap.
        let mut c = Circuit::default();
        for _ in 0..3 {
            fail(&mut c, 0);
        }
        c.admit(&S, 0, 1_000);
        c.record(&S, HostOutcome::Answered, c.epoch(), 10, 1_000);
        assert_eq!(fail(&mut c, 1_500), Some(CircuitChange::Opened { probe_at_ms: 3_500 }));
    }

    #[test]
    fn zero_failures_turns_it_off() {
        let off = CircuitSettings { failures: 0, ..S };
        let mut c = Circuit::default();
        for _ in 0..100 {
            assert_eq!(c.record(&off, HostOutcome::Failed, 0, 10, 0), None);
        }
        assert_eq!(c.admit(&off, 0, 0), Admit::Yes);
    }

    #[test]
    fn a_lost_probe_lets_the_next_go_at_once_but_only_its_own_loss_counts() {
        let mut c = Circuit::default();
        for _ in 0..3 {
            fail(&mut c, 0);
        }
        assert_eq!(c.admit(&S, 0, 1_000), Admit::Yes);
        let first = c.probe().unwrap();
        c.probe_lost(first);
        assert_eq!(c.state(), CircuitState::Open);
        assert_eq!(c.admit(&S, 0, 1_001), Admit::Yes, "no probe timeout to wait out");
        let second = c.probe().unwrap();
        c.probe_lost(first);
        assert_eq!(c.probe(), Some(second), "an older probe's loss changes nothing");
        assert_eq!(fail(&mut c, 1_002), Some(CircuitChange::Opened { probe_at_ms: 3_002 }));
        c.probe_lost(second);
        assert_eq!(c.next_probe_ms(), Some(3_002), "answered: not lost");
    }

    #[test]
    fn a_late_failure_from_before_the_opening_does_not_reopen_and_backoff_survives_a_flap() {
        let mut c = Circuit::default();
        let before = c.epoch();
        for _ in 0..3 {
            fail(&mut c, 0);
        }
        assert_eq!(c.admit(&S, 0, 1_000), Admit::Yes);
        c.record(&S, HostOutcome::Answered, c.epoch(), 10, 1_100);
        assert_eq!(c.state(), CircuitState::Ramping(2));
        // A timeout of an attempt that started before the breaker opened arrives late.
        assert_eq!(c.record(&S, HostOutcome::Failed, before, 10, 1_200), None);
        assert_eq!(c.state(), CircuitState::Ramping(2));
        // A real failure while ramping reopens it, and the delay keeps doubling: the host
        // answered one probe but did not get back to its cap.
        assert_eq!(
            c.record(&S, HostOutcome::Failed, c.epoch(), 10, 1_300),
            Some(CircuitChange::Opened { probe_at_ms: 3_300 })
        );
    }
}
