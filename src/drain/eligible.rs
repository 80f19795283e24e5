//! Which messages a drain forwards. Pure.
//!
//! Forwarded: every open message that no attempt holds — pending (due now or later, waiting
//! for a retry), held by a paused endpoint (parked), or waiting in an ordered line (its line
//! forwards it, in line order). Not forwarded: a message whose attempt is running (its result
//! decides; a running courier's drain waits for those attempts first), and finished ones
//! (delivered, handed off). Dead letters stay: a dead message is not owed another attempt,
//! and its record (reason, history) is what an operator replays from; replay it first to
//! hand it over too.

use crate::model::State;
use crate::store::MessageRecord;

/// What a drain does with one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Forward it now.
    Forward,
    /// Forward it with its ordered line, head first (the line's own walk picks it up).
    WithItsLine,
    /// Leave it: why.
    Leave(Why),
}

/// Why a message is left where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// An attempt is running.
    InFlight,
    /// Dead letters stay (replay them first to hand them over).
    Dead,
    /// Delivered or handed off already.
    Finished,
}

impl Why {
    /// Words for a report.
    pub fn as_str(self) -> &'static str {
        match self {
            Why::InFlight => "an attempt is running",
            Why::Dead => "dead letters stay",
            Why::Finished => "already finished",
        }
    }
}

/// The verdict for `rec`; `leased` says whether the scheduler holds it for an attempt.
/// `in_line_walk` is true when the walk over its ordered line asks (then its place in the
/// line is the walk's business).
pub fn verdict(rec: &MessageRecord, leased: bool, in_line_walk: bool) -> Verdict {
    match rec.state {
        State::InFlight => Verdict::Leave(Why::InFlight),
        State::Pending if leased => Verdict::Leave(Why::InFlight),
        State::Pending if rec.fifo.is_some() && !in_line_walk => Verdict::WithItsLine,
        State::Pending => Verdict::Forward,
        State::Dead => Verdict::Leave(Why::Dead),
        State::Delivered | State::HandedOff => Verdict::Leave(Why::Finished),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::OnDead;
    use crate::store::Fifo;

    fn rec(state: State, fifo: Option<u64>) -> MessageRecord {
        let mut m = crate::store::tests::message("dlv_1", "evt_1", 1).record;
        m.state = state;
        m.fifo = fifo.map(|pos| Fifo {
            on_dead: OnDead::Skip,
            pos,
        });
        m
    }

    #[test]
    fn every_state_and_place_has_its_verdict() {
        use Verdict::*;
        let cases = [
            // (state, ordered at pos, leased, asked by its line's walk) → verdict
            (State::Pending, None, false, false, Forward),
            (State::Pending, None, true, false, Leave(Why::InFlight)),
            (State::InFlight, None, false, false, Leave(Why::InFlight)),
            (State::Pending, Some(0), false, false, WithItsLine),
            (State::Pending, Some(3), false, false, WithItsLine),
            (State::Pending, Some(0), false, true, Forward),
            (State::Pending, Some(0), true, true, Leave(Why::InFlight)),
            (State::InFlight, Some(0), false, true, Leave(Why::InFlight)),
            (State::Dead, None, false, false, Leave(Why::Dead)),
            (State::Dead, Some(0), false, true, Leave(Why::Dead)),
            (State::Delivered, None, false, false, Leave(Why::Finished)),
            (State::HandedOff, None, false, false, Leave(Why::Finished)),
        ];
        for (state, fifo, leased, walk, want) in cases {
            assert_eq!(
                verdict(&rec(state, fifo), leased, walk),
                want,
                "{state:?} fifo {fifo:?} leased {leased} walk {walk}"
            );
        }
        assert_eq!(Why::Dead.as_str(), "dead letters stay");
    }
}
