//! A drain's progress: the counters the forwarding tasks bump ([`Progress`]), the status
//! both `GET /drain` and the offline verb show ([`Status`]), and its arithmetic and wording
//! (remaining, rate, the progress line), which are pure.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Refusals kept for the status (the count is exact; the list is the latest ones).
pub const REFUSALS_KEPT: usize = 20;

/// Where a drain is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// No drain has run.
    #[default]
    Idle,
    /// Still delivering normally, for up to `deliver_for` or until nothing is open.
    Delivering,
    /// No new attempts; waiting for the running ones to finish.
    Stopping,
    /// Forwarding to the peer.
    Forwarding,
    /// The pass is over (messages the peer refused, or that were in flight, stay pending).
    Done,
    /// Stopped early (the peer failed, or courier is shutting down): the rest stay pending.
    Failed,
}

impl Phase {
    /// The name `GET /drain` shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Delivering => "delivering",
            Phase::Stopping => "stopping",
            Phase::Forwarding => "forwarding",
            Phase::Done => "done",
            Phase::Failed => "failed",
        }
    }

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
        let mut s = format!("drain: {}", self.state.as_str());
        if matches!(self.state, Phase::Delivering | Phase::Stopping | Phase::Idle) {
            s.push_str(match self.state {
                Phase::Delivering => " (delivering what it can first)",
                Phase::Stopping => " (waiting for attempts in flight)",
                _ => "",
            });
            return s;
        }
        s.push_str(&format!(": {} of {} handed off", self.handed_off, self.total));
        if self.already_at_peer > 0 {
            s.push_str(&format!(" ({} already at the peer)", self.already_at_peer));
        }
        s.push_str(&format!(
            ", {} remaining, {:.0}/s",
            self.remaining, self.rate_per_second
        ));
        if let Some(eta) = eta_secs(self.remaining, self.rate_per_second).filter(|_| self.state == Phase::Forwarding) {
            s.push_str(&format!(", about {eta}s left"));
        }
        if self.refused > 0 {
            s.push_str(&format!(", {} refused by the peer (still pending here)", self.refused));
        }
        if self.left > 0 {
            s.push_str(&format!(
                ", {} left here (held by an attempt, or behind an ordered line's head that stayed)",
                self.left
            ));
        }
        if let Some(e) = &self.error {
            s.push_str(&format!("; stopped: {e}"));
        }
        if self.delivery_stopped {
            s.push_str(
                "; delivery there stays stopped until courier restarts (ingress refuses, nothing is attempted): \
                 restart it, or drain again",
            );
        }
        s
    }
}

/// Seconds until `remaining` are done at `rate` per second (rounded up); `None` without a rate.
pub fn eta_secs(remaining: u64, rate: f64) -> Option<u64> {
    (rate > 0.0).then(|| (remaining as f64 / rate).ceil() as u64)
}

/// Hand-offs per second over `elapsed_ms` (0 before a millisecond has passed).
pub fn rate(done: u64, elapsed_ms: u64) -> f64 {
    if elapsed_ms == 0 {
        0.0
    } else {
        done as f64 * 1000.0 / elapsed_ms as f64
    }
}

/// The counters of one drain, bumped by its forwarding tasks.
#[derive(Debug, Default)]
pub struct Progress {
    total: AtomicU64,
    handed_off: AtomicU64,
    already: AtomicU64,
    refused: AtomicU64,
    /// Numbers the refusals across passes (`refused` counts one pass's).
    refusal_seq: AtomicU64,
    left: AtomicU64,
    started_ms: AtomicU64,
    refusals: Mutex<VecDeque<Refusal>>,
    stopped: AtomicBool,
    error: Mutex<Option<String>>,
}

impl Progress {
    /// Forwarding begins at `now_ms` with `total` open messages.
    pub fn begin(&self, total: u64, now_ms: u64) {
        self.total.store(total, Ordering::Relaxed);
        self.started_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Another pass begins: it meets again what the last one refused or left, so those
    /// counts start over (hand-offs and the refusals' numbering go on).
    pub fn new_pass(&self) {
        self.refused.store(0, Ordering::Relaxed);
        self.left.store(0, Ordering::Relaxed);
    }

    /// A pass ended with `open` messages still open here: the total becomes what was
    /// handed off plus those, so a message that became open during the drain counts.
    pub fn recount(&self, open: u64) {
        let handed_off = self.handed_off.load(Ordering::Relaxed);
        self.total.store(handed_off + open, Ordering::Relaxed);
    }

    /// What this pass refused or left here (both stay open).
    pub fn stayed(&self) -> u64 {
        self.refused.load(Ordering::Relaxed) + self.left.load(Ordering::Relaxed)
    }

    /// One message handed off (`already`: the peer had it).
    pub fn handed_off(&self, already: bool) {
        self.handed_off.fetch_add(1, Ordering::Relaxed);
        if already {
            self.already.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// One message refused by the peer.
    pub fn refused(&self, mut refusal: Refusal) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        let seq = self.refusal_seq.fetch_add(1, Ordering::Relaxed) + 1;
        refusal.seq = seq;
        let mut kept = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() == REFUSALS_KEPT {
            kept.pop_front();
        }
        kept.push_back(refusal);
    }

    /// `n` messages left here (an attempt holds them, or their line's head stays).
    pub fn left(&self, n: u64) {
        self.left.fetch_add(n, Ordering::Relaxed);
    }

    /// The drain stops early: why (the first reason is kept).
    pub fn fail(&self, why: String) {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(why);
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// Whether the drain stopped early: no new forwards start.
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// Why it stopped early, if it did.
    pub fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The status in `state` at `now_ms`.
    pub fn status(&self, state: Phase, to: Option<String>, now_ms: u64) -> Status {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (total, handed_off, refused, left) = (
            load(&self.total),
            load(&self.handed_off),
            load(&self.refused),
            load(&self.left),
        );
        let forwarding = matches!(state, Phase::Forwarding | Phase::Done | Phase::Failed);
        let elapsed_ms = if forwarding {
            now_ms.saturating_sub(load(&self.started_ms))
        } else {
            0
        };
        Status {
            state,
            to,
            total,
            handed_off,
            already_at_peer: load(&self.already),
            refused,
            left,
            remaining: total.saturating_sub(handed_off + refused + left),
            elapsed_ms,
            rate_per_second: rate(handed_off, elapsed_ms),
            error: self.error(),
            refusals: self
                .refusals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned()
                .collect(),
            delivery_stopped: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            p.handed_off(i < 5);
        }
        p.refused(refusal("dlv_r"));
        p.left(1);
        let s = p.status(Phase::Forwarding, Some("http://tier:8787/".into()), 3_000);
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
            p.handed_off(false);
        }
        assert_eq!(p.status(Phase::Done, None, 3_000).remaining, 0);
    }

    #[test]
    fn a_clean_pass_is_complete_and_an_early_stop_says_why() {
        let p = Progress::default();
        p.begin(2, 0);
        p.handed_off(false);
        p.handed_off(true);
        let done = p.status(Phase::Done, None, 500);
        assert!(done.complete());
        assert_eq!(
            done.line(),
            "drain: done: 2 of 2 handed off (1 already at the peer), 0 remaining, 4/s"
        );
        p.fail("the peer refused the token".into());
        p.fail("a later reason".into());
        let failed = p.status(Phase::Failed, None, 500);
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
            p.status(Phase::Stopping, None, 9).line(),
            "drain: stopping (waiting for attempts in flight)"
        );
    }

    #[test]
    fn another_pass_counts_again_what_stays_and_the_total_follows_what_is_open() {
        let p = Progress::default();
        p.begin(3, 0);
        p.handed_off(false);
        p.refused(refusal("dlv_r"));
        // A replayed message became open: after the pass 2 are open, 1 of them refused.
        p.recount(2);
        assert_eq!((p.stayed(), p.status(Phase::Forwarding, None, 0).total), (1, 3));
        p.new_pass();
        p.refused(refusal("dlv_r"));
        p.handed_off(false);
        p.recount(1);
        let s = p.status(Phase::Done, None, 0);
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
        let s = p.status(Phase::Done, None, 0);
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
        let s = p.status(Phase::Failed, Some("http://t/".into()), 10);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["state"], "failed");
        assert_eq!(json["refusals"][0]["code"], "body_too_large");
        assert_eq!(serde_json::from_value::<Status>(json).unwrap(), s);
        assert_eq!(eta_secs(10, 4.0), Some(3));
        assert_eq!(eta_secs(10, 0.0), None);
    }
}
