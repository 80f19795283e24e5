//! One probe of the sustainable-rate search: an open-loop run at a fixed rate, every
//! message matched at the receiver by its event id, judged against the bounds.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::courier::cpu_in_window;
use crate::load::{open_loop, Lat, Schedule};
use crate::receiver::Tracker;
use crate::report::ms;
use crate::run::Ctx;
use crate::{joined, Res};

/// The p99 bound of scheduled send → receiver latency, in milliseconds.
pub const P99_BOUND_MS: f64 = 100.0;

/// The latency given to a message that never reached the receiver (one hour, in
/// microseconds): later than any bound, so a lost message counts against the p99.
const LOST_US: i64 = 3_600_000_000;

/// Connections of the open loop's pool (as in the ack-latency scenario).
const CONNS: usize = 64;

/// What one open-loop run at a fixed rate measured.
#[derive(Debug, Clone, Default)]
pub struct Probe {
    pub rate: f64,
    /// Within both bounds: p99 ≤ 100 ms and under one second's worth of backlog.
    pub ok: bool,
    /// Stopped early: more messages were already over 100 ms late than the p99 allows.
    pub aborted: bool,
    /// Scheduled send → receiver arrival of the measured sends (a lost one counts as 1 h).
    pub lat: Lat,
    /// Sends scheduled in the measured window.
    pub sent: u64,
    /// Measured sends that never reached the receiver (failed, or later than the grace).
    pub lost: u64,
    /// Measured sends answered other than 2xx, or cut off.
    pub failed: u64,
    /// Scheduled by the window's end (or the early stop) but not yet at the receiver then.
    pub backlog: u64,
    /// Deliveries counted at the receiver inside the window.
    pub delivered: u64,
    /// Deliveries per second over the part of the run that took place (an estimate of
    /// capacity when overloaded, used to aim the next probe).
    pub delivered_rate: f64,
    /// CPU seconds of the process asked about, over the window (0 if none was asked).
    pub cpu_s: f64,
    /// Length of the measured window (to the early stop, if any), in seconds.
    pub secs: f64,
    /// Per 500 ms of scheduled sends from the window's start: the slice's start in seconds,
    /// its sent → arrival latencies, and how many of them were over the bound.
    pub timeline: Vec<(f64, Lat, usize)>,
    /// When the measured window began, as wall-clock time (seconds since the epoch), to set beside other logs.
    pub window_start: String,
}

impl Probe {
    /// The sent → arrival quantile as text: `lost` when the messages beyond it never arrived.
    pub fn q(&self, v: f64) -> String {
        if v >= (LOST_US / 1000) as f64 {
            "lost".into()
        } else {
            ms(v)
        }
    }

    /// Why it passed or failed, for the progress lines.
    pub fn verdict(&self) -> String {
        if self.aborted {
            return "fail (stopped early: over 1% of messages known > 100 ms late)".into();
        }
        let mut why = Vec::new();
        if self.lat.p99 > P99_BOUND_MS {
            why.push(format!("p99 {}", self.q(self.lat.p99)));
        }
        if self.backlog as f64 >= self.rate {
            why.push(format!("backlog {}", self.backlog));
        }
        if why.is_empty() {
            "ok".into()
        } else {
            format!("fail ({})", why.join(", "))
        }
    }

    /// As JSON (latencies in milliseconds).
    pub fn json(&self) -> Value {
        json!({"rate": self.rate, "ok": self.ok, "aborted": self.aborted, "sent": self.sent, "lost": self.lost,
               "failed": self.failed, "backlog": self.backlog, "delivered_in_window": self.delivered,
               "delivered_rate": self.delivered_rate, "window_s": self.secs, "cpu_s": self.cpu_s,
               "sched_to_receiver": self.lat.json()})
    }
}

/// What the watcher saw at the receiver during a probe.
struct Watch {
    aborted: bool,
    /// Receiver count when the measured window began, and when it ended (or the probe
    /// was stopped).
    at_from: u64,
    at_end: u64,
    /// When it stopped watching.
    until: Instant,
}

/// Runs one probe at `rate` against the server at `addr`, which must deliver each message
/// to the run's receiver: the open loop of [`Schedule`] (64 connections, latency from the
/// scheduled time), `plan.sustain_warmup` then `plan.sustain_window` measured. Each
/// measured message's latency runs from its scheduled send to its arrival at the receiver.
///
/// With `abortable`, a watcher stops the run as soon as the verdict is certain: once more
/// than 1% of the window's messages are known to be over 100 ms late, the p99 bound has
/// failed whatever follows. Known late: arrived more than 100 ms after their scheduled time
/// (the receiver checks each arrival against the [`Tracker`]), plus at least as many as
/// were due over 100 ms ago minus all that arrived. An overloaded probe then costs about a
/// second instead of a whole window.
///
/// `cpu_pid`: a process whose CPU over the window is read (`utime + stime`).
pub async fn probe(cx: &Ctx, addr: SocketAddr, rate: f64, abortable: bool, cpu_pid: Option<u32>) -> Res<Probe> {
    let plan = &cx.plan;
    let recv = cx.receiver.clone();
    let late = Duration::from_secs_f64(P99_BOUND_MS / 1000.0);
    let track = Tracker::new(late);
    recv.take_arrivals();
    *recv.tracker.lock().unwrap() = Some(track.clone());
    recv.record.store(true, Ordering::Relaxed);
    let count0 = recv.count();
    let mut s = Schedule::new(CONNS, rate, plan.sustain_warmup, plan.sustain_window);
    s.track = Some(track.clone());
    let before = s.due_by(s.measure_from);
    let allowed = ((s.total() - before) as f64 * 0.01).ceil() as u64 + 1;
    let watcher = {
        let (recv, s, track) = (recv.clone(), s.clone(), track.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(s.measure_from).await;
            let at_from = recv.count();
            loop {
                let now = Instant::now();
                if now >= s.end {
                    break;
                }
                if abortable && now >= s.measure_from + late {
                    // Late for sure: arrived late, or due over 100 ms ago and not arrived
                    // (at least: due then, minus every arrival so far).
                    let due = s.due_by(now - late).saturating_sub(before);
                    let missing = due.saturating_sub(track.arrived.load(Ordering::Relaxed));
                    if track.late.load(Ordering::Relaxed) + missing > allowed {
                        s.abort.store(true, Ordering::Relaxed);
                        let at_end = recv.count();
                        return Watch {
                            aborted: true,
                            at_from,
                            at_end,
                            until: now,
                        };
                    }
                }
                tokio::time::sleep_until((now + Duration::from_millis(10)).min(s.end)).await;
            }
            let at_end = recv.count();
            Watch {
                aborted: false,
                at_from,
                at_end,
                until: Instant::now(),
            }
        })
    };
    let cpu = cpu_pid.map(|pid| cpu_in_window(pid, s.measure_from, s.end));
    // The window starts in the future (after the connections open and the warm-up).
    let wall = std::time::SystemTime::now() + s.measure_from.saturating_duration_since(Instant::now());
    let wall = wall
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let r = open_loop(&cx.target(addr, cx.hook_path()), &s).await?;
    let w = joined(watcher).await?;
    let cpu_s = match cpu {
        // Not awaited when stopped early: it would wait for the window's end.
        Some(c) if !w.aborted => joined(c).await?,
        Some(c) => {
            c.abort();
            0.0
        }
        None => 0.0,
    };
    // At the window's end, or when the probe was stopped.
    let backlog = s.due_by(w.until.min(s.end)).saturating_sub(w.at_end - count0);
    let mut p = Probe {
        rate,
        aborted: w.aborted,
        failed: r.failed,
        backlog,
        delivered: w.at_end - w.at_from,
        delivered_rate: (w.at_end - count0) as f64 / (w.until - s.start).as_secs_f64().max(1e-3),
        cpu_s,
        secs: (w.until.min(s.end) - s.measure_from).as_secs_f64(),
        window_start: format!("{wall:.6}"),
        ..Probe::default()
    };
    if !w.aborted {
        // Let the messages under way arrive (every accepted one is delivered once), so a
        // latency past the window's end is measured rather than counted as lost.
        let grace = Duration::from_secs(if cx.args.smoke { 1 } else { 2 });
        if (backlog as f64) < rate {
            recv.wait_count(count0 + r.accepted_total, grace).await;
        }
        let arrivals = recv.take_arrivals();
        let due = std::mem::take(&mut *track.due.lock().unwrap());
        let timed: Vec<(Instant, i64)> = due
            .iter()
            .map(|(seq, at)| {
                (
                    *at,
                    arrivals.get(seq).map_or(LOST_US, |got| (*got - *at).as_micros() as i64),
                )
            })
            .collect();
        p.timeline = timeline(&timed, s.measure_from);
        let lat: Vec<i64> = timed.into_iter().map(|(_, l)| l).collect();
        p.sent = lat.len() as u64;
        p.lost = lat.iter().filter(|l| **l == LOST_US).count() as u64;
        p.lat = Lat::of(lat);
        p.ok = p.lat.n > 0 && p.lat.p99 <= P99_BOUND_MS && (backlog as f64) < rate;
    }
    recv.record.store(false, Ordering::Relaxed);
    *recv.tracker.lock().unwrap() = None;
    recv.take_arrivals();
    Ok(p)
}

/// The latencies of `timed` (scheduled time, latency in µs) by 500 ms slice of the
/// scheduled time from `from`.
fn timeline(timed: &[(Instant, i64)], from: Instant) -> Vec<(f64, Lat, usize)> {
    let mut slices: std::collections::BTreeMap<u64, Vec<i64>> = Default::default();
    for (at, l) in timed {
        let k = (at.saturating_duration_since(from).as_millis() / 500) as u64;
        slices.entry(k).or_default().push(*l);
    }
    let bound = (P99_BOUND_MS * 1000.0) as i64;
    slices
        .into_iter()
        .map(|(k, v)| {
            let late = v.iter().filter(|l| **l > bound).count();
            (k as f64 * 0.5, Lat::of(v), late)
        })
        .collect()
}
