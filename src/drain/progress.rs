//! What a drain has done ([`Status`]): what `GET /drain` answers and the verb prints (count,
//! rate, remaining), kept by [`Progress`] while the forwarding tasks count.

use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Refusals kept for the status (the count is exact; the list is the latest ones).
pub const REFUSALS_KEPT: usize = 20;

crate::config::spelled! {
    /// Where a drain is (as `GET /drain` and the verb's lines name it).
    #[derive(Serialize)]
    pub enum Phase {
        /// No drain has run.
        #[default]
        Idle = "idle",
        /// Still delivering normally, for up to `deliver_for` or until nothing is open.
        Delivering = "delivering",
        /// No new attempts; waiting for the running ones to finish.
        Stopping = "stopping",
        /// Forwarding to the peer.
        Forwarding = "forwarding",
        /// The pass is over (messages the peer refused, or that were in flight, stay pending).
        Done = "done",
        /// Stopped early (the peer failed, or courier is shutting down): the rest stay pending.
        Failed = "failed",
    }
}

impl Phase {
    /// Whether the drain has ended.
    pub fn ended(self) -> bool {
        matches!(self, Phase::Done | Phase::Failed)
    }
}

/// One message the peer would not take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// Its number among this drain's refusals (from 1), so a reader prints each once.
    pub seq: u64,
    /// Delivery id here.
    pub id: String,
    /// Event id.
    pub event_id: String,
    /// The peer's status.
    pub status: u16,
    /// The peer's error code.
    pub code: String,
    /// The peer's sentence.
    pub message: String,
}

/// What `GET /drain` answers, and what the verb prints from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Status {
    /// Where the drain is.
    pub state: Phase,
    /// The peer (as shown in logs).
    pub to: Option<String>,
    /// Messages to hand off: open when forwarding began, then after each pass what was
    /// handed off plus what is open (so a message replayed during the drain counts).
    pub total: u64,
    /// Handed off (the peer answered 202).
    pub handed_off: u64,
    /// Of those, the peer had already (a repeated hand-off).
    pub already_at_peer: u64,
    /// Refused by the peer (in the latest pass): still pending here.
    pub refused: u64,
    /// Left here for another reason (an attempt held it, or it waits behind an ordered
    /// line's head that stayed; in the latest pass): still open here.
    pub left: u64,
    /// Not yet forwarded.
    pub remaining: u64,
    /// Since forwarding began.
    pub elapsed_ms: u64,
    /// Hand-offs per second since forwarding began.
    pub rate_per_second: f64,
    /// Why it stopped early.
    pub error: Option<String>,
    /// The latest refusals.
    pub refusals: Vec<Refusal>,
    /// A running courier's drain that failed: its delivery stays stopped (ingress refuses,
    /// nothing is attempted) until courier restarts. Absent from older couriers' answers.
    #[serde(default)]
    pub delivery_stopped: bool,
}

impl Status {
    /// Whether everything that was open is handed off: nothing refused, left or remaining,
    /// and no early stop.
    pub fn complete(&self) -> bool {
        self.state == Phase::Done && self.refused == 0 && self.left == 0 && self.remaining == 0
    }

    /// One line for stderr: count, rate, remaining.
    pub fn line(&self) -> String {
        let state = self.state.as_str();
        match self.state {
            Phase::Idle => return format!("drain: {state}"),
            Phase::Delivering => return format!("drain: {state} (delivering what it can first)"),
            Phase::Stopping => return format!("drain: {state} (waiting for attempts in flight)"),
            Phase::Forwarding | Phase::Done | Phase::Failed => {}
        }
        let eta = (self.rate_per_second > 0.0 && self.state == Phase::Forwarding)
            .then(|| (self.remaining as f64 / self.rate_per_second).ceil() as u64);
        let parts = [
            (self.already_at_peer > 0).then(|| format!(" ({} already at the peer)", self.already_at_peer)),
            Some(format!(", {} remaining, {:.0}/s", self.remaining, self.rate_per_second)),
            eta.map(|eta| format!(", about {eta}s left")),
            (self.refused > 0).then(|| format!(", {} refused by the peer (still pending here)", self.refused)),
            (self.left > 0).then(|| {
                let why = "held by an attempt, or behind an ordered line's head that stayed";
                format!(", {} left here ({why})", self.left)
            }),
            self.error.as_ref().map(|e| format!("; stopped: {e}")),
            self.delivery_stopped.then(|| {
                "; delivery there stays stopped until courier restarts (ingress refuses, nothing is attempted): \
                 restart it, or drain again"
                    .to_string()
            }),
        ];
        let (done, total) = (self.handed_off, self.total);
        let parts: String = parts.into_iter().flatten().collect();
        format!("drain: {state}: {done} of {total} handed off{parts}")
    }
}

/// One drain's status while its forwarding tasks count (a lock taken for a few counter
/// bumps per message forwarded), and when forwarding began.
#[derive(Debug, Default)]
pub struct Progress(Mutex<(Status, u64)>);

impl Progress {
    /// A drain to `to` (as shown in logs), starting in `phase`.
    pub fn new(to: String, phase: Phase) -> Self {
        let status = Status {
            state: phase,
            to: Some(to),
            ..Status::default()
        };
        Progress(Mutex::new((status, 0)))
    }

    /// Changes the counts.
    pub fn update<T>(&self, f: impl FnOnce(&mut Status) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()).0)
    }

    /// The drain moves on to `phase`.
    pub fn set(&self, phase: Phase) {
        self.update(|s| s.state = phase);
    }

    /// Forwarding begins at `now_ms` with `total` open messages.
    pub fn begin(&self, total: u64, now_ms: u64) {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        (counts.0.total, counts.1) = (total, now_ms);
    }

    /// One message refused by the peer; numbered on from the last one kept, across passes
    /// (whatever `refusal.seq` says).
    pub fn refused(&self, mut refusal: Refusal) {
        self.update(|s| {
            s.refused += 1;
            refusal.seq = s.refusals.last().map_or(0, |r| r.seq) + 1;
            if s.refusals.len() == REFUSALS_KEPT {
                s.refusals.remove(0);
            }
            s.refusals.push(refusal);
        });
    }

    /// The drain stops early: why (the first reason is kept).
    pub fn fail(&self, why: String) {
        self.update(|s| s.error = s.error.take().or(Some(why)));
    }

    /// Whether the drain stopped early: no new forwards start.
    pub fn stopped(&self) -> bool {
        self.update(|s| s.error.is_some())
    }

    /// The status at `now_ms`.
    pub fn status(&self, now_ms: u64) -> Status {
        let (mut s, started_ms) = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        s.remaining = s.total.saturating_sub(s.handed_off + s.refused + s.left);
        if matches!(s.state, Phase::Forwarding | Phase::Done | Phase::Failed) {
            s.elapsed_ms = now_ms.saturating_sub(started_ms);
        }
        if s.elapsed_ms > 0 {
            s.rate_per_second = s.handed_off as f64 * 1000.0 / s.elapsed_ms as f64;
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(p: &Progress, phase: Phase, now_ms: u64) -> Status {
        p.set(phase);
        p.status(now_ms)
    }

    fn handed_off(p: &Progress, already: bool) {
        p.update(|s| {
            s.handed_off += 1;
            s.already_at_peer += u64::from(already);
        });
    }

    fn refusal(id: &str) -> Refusal {
        Refusal {
            seq: 0,
            id: id.into(),
            event_id: format!("evt-{id}"),
            status: 413,
            code: "body_too_large".into(),
            message: "too big".into(),
        }
    }

    #[test]
    fn remaining_and_rate_come_from_the_counters() {
        let p = Progress::default();
        p.begin(100, 1_000);
        for i in 0..40 {
            handed_off(&p, i < 5);
        }
        p.refused(refusal("dlv_r"));
        p.update(|s| s.left += 1);
        let s = at(&p, Phase::Forwarding, 3_000);
        assert_eq!(
            (s.total, s.handed_off, s.already_at_peer, s.refused, s.left, s.remaining),
            (100, 40, 5, 1, 1, 58)
        );
        assert_eq!(s.elapsed_ms, 2_000);
        assert_eq!(s.rate_per_second, 20.0);
        assert_eq!(
            s.line(),
            "drain: forwarding: 40 of 100 handed off (5 already at the peer), 58 remaining, 20/s, about 3s left, \
             1 refused by the peer (still pending here), 1 left here (held by an attempt, or behind an ordered \
             line's head that stayed)"
        );
        assert!(!s.complete());
        // More hand-offs than the total (messages replayed meanwhile) never underflow.
        for _ in 0..100 {
            handed_off(&p, false);
        }
        assert_eq!(at(&p, Phase::Done, 3_000).remaining, 0);
    }

    #[test]
    fn a_clean_pass_is_complete_and_an_early_stop_says_why() {
        let p = Progress::default();
        p.begin(2, 0);
        handed_off(&p, false);
        handed_off(&p, true);
        let done = at(&p, Phase::Done, 500);
        assert!(done.complete());
        assert_eq!(
            done.line(),
            "drain: done: 2 of 2 handed off (1 already at the peer), 0 remaining, 4/s"
        );
        p.fail("the peer refused the token".into());
        p.fail("a later reason".into());
        let failed = at(&p, Phase::Failed, 500);
        assert!(!failed.complete());
        assert!(
            failed.line().ends_with("; stopped: the peer refused the token"),
            "the first reason"
        );
        let frozen = Status {
            delivery_stopped: true,
            ..failed
        };
        assert!(
            frozen.line().ends_with(
                "; stopped: the peer refused the token; delivery there stays stopped until courier restarts \
                 (ingress refuses, nothing is attempted): restart it, or drain again"
            ),
            "{}",
            frozen.line()
        );
        assert_eq!(
            Status::default().line(),
            "drain: idle",
            "nothing to count before forwarding"
        );
        assert_eq!(
            at(&p, Phase::Stopping, 9).line(),
            "drain: stopping (waiting for attempts in flight)"
        );
    }

    #[test]
    fn refusals_are_numbered_across_passes() {
        let p = Progress::default();
        p.begin(3, 0);
        handed_off(&p, false);
        p.refused(refusal("dlv_r"));
        // Another pass meets the refused message again: its counts start over.
        p.update(|s| (s.refused, s.left) = (0, 0));
        p.refused(refusal("dlv_r"));
        handed_off(&p, false);
        let s = at(&p, Phase::Done, 0);
        assert_eq!((s.total, s.handed_off, s.refused, s.remaining), (3, 2, 1, 0));
        assert_eq!(
            s.refusals.iter().map(|r| r.seq).collect::<Vec<_>>(),
            [1, 2],
            "numbered across passes"
        );
    }

    #[test]
    fn refusals_are_numbered_and_only_the_latest_kept() {
        let p = Progress::default();
        for i in 0..(REFUSALS_KEPT + 5) {
            p.refused(refusal(&format!("dlv_{i}")));
        }
        let s = at(&p, Phase::Done, 0);
        assert_eq!(s.refused, (REFUSALS_KEPT + 5) as u64);
        assert_eq!(s.refusals.len(), REFUSALS_KEPT);
        assert_eq!(s.refusals.first().map(|r| r.seq), Some(6));
        assert_eq!(s.refusals.last().map(|r| r.id.as_str()), Some("dlv_24"));
    }

    #[test]
    fn the_status_round_trips_as_json() {
        let p = Progress::default();
        p.begin(3, 0);
        p.refused(refusal("dlv_x"));
        let s = at(&p, Phase::Failed, 10);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["state"], "failed");
        assert_eq!(json["refusals"][0]["code"], "body_too_large");
        assert_eq!(serde_json::from_value::<Status>(json).unwrap(), s);
        let p = Progress::default();
        p.begin(10, 0);
        let line = at(&p, Phase::Forwarding, 0).line();
        assert_eq!(
            line, "drain: forwarding: 0 of 10 handed off, 10 remaining, 0/s",
            "no rate, no estimate"
        );
    }
}
