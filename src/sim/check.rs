//! The invariants: what must hold after every step, and at quiescence.

use super::receiver::{Answer, Seen};
use super::world::World;
use crate::clock::Clock;
use crate::model::{DeadReason, State};
use crate::store::MessageRecord;

/// After every step: the store is consistent, and every acknowledged message exists (or
/// was finished and may have been swept by retention, or was deleted by an operator).
pub fn step(w: &World) -> Result<(), String> {
    let store = w.store();
    let problems = store.audit(false).map_err(|e| e.to_string())?;
    if !problems.is_empty() {
        return Err(format!("store inconsistent: {}", problems.join("; ")));
    }
    // Between steps no pass is half done: a parked message belongs to a paused endpoint.
    for endpoint in store.parked_endpoints().map_err(|e| e.to_string())? {
        if !w.d().context().endpoints().is_paused(&endpoint) {
            return Err(format!("messages parked for {endpoint}, which is not paused"));
        }
    }
    for id in w.model.acked.keys() {
        let rec = store.message(id).map_err(|e| e.to_string())?;
        if rec.is_none() && !w.model.finished.contains(id) {
            return Err(format!("acknowledged message {id} is gone"));
        }
    }
    limits(w)
}

/// How late the scheduler's loop may wake for work it could do: its store-error backoff
/// (`scheduler::STORE_ERROR_BACKOFF`, a pass whose read failed sleeps that long). Every
/// other wait is exact on the simulated clock: the next due time, a token's time, a
/// breaker's probe time, or a freed permit's wake-up.
pub const LATENESS_MS: u64 = 1_000;

/// The loop never sleeps past work it could do. While it is asleep (after a step settled),
/// every open message it can see, not yet attempted and held by no stated limit, must be
/// covered by its timer: the loop wakes no later than [`LATENESS_MS`] after the message's
/// due time (or its host's probe time, while the host's breaker is open).
///
/// The stated limits, each of which wakes the loop itself when it lifts (a freed permit, a
/// resume) or gives the timer above: its endpoint paused; an ordered line that holds it
/// (it is not the head, or the line is blocked); `delivery.max_in_flight`, its host's cap
/// or its endpoint's `max_in_flight` reached; a resume point left by a wake-up whose scan
/// budget ran out, while attempts are in flight (an attempt's end goes on from there, and
/// wraps to the floor) or, for a message past the point, while the loop has a timer; a
/// message whose reads the simulator broke, or that the store holds back after a failed
/// read (until its retry time). A leased message is being attempted.
pub fn awake(w: &World) -> Result<(), String> {
    let Some(asleep) = w.asleep() else {
        return Err("the scheduler's loop is still awake after the step settled".into());
    };
    let d = w.d();
    let store = w.store();
    let now = w.clock.now_ms();
    // Every `delivery.max_in_flight` permit taken (by running attempts, results not yet
    // written, first attempts from their accepts): an attempt's end wakes the loop.
    if d.free_attempt_permits() == 0 {
        return Ok(());
    }
    // With a resume point left, a wake-up whose scan budget ran out leaves the rest to the
    // next one. An attempt's end is one (its walk goes on from the point and wraps to the
    // floor). Else the loop's timer is: what lies past the point was not seen and waits for
    // it; what lies before it was seen, and the wake time asked for it is owed until a walk
    // from the floor, so the timer covers it (a loop that forgot it sleeps past it).
    let in_flight = d.in_flight_count() > 0;
    let past_resume = |rec: &MessageRecord| {
        (asleep.resume.as_ref())
            .is_some_and(|(due, id)| (rec.next_attempt_at_ms, rec.id.as_str()) > (*due, id.as_str()))
    };
    let hosts: std::collections::HashMap<String, crate::limits::HostView> = d
        .hosts()
        .snapshot(false)
        .into_iter()
        .map(|h| (h.host.clone(), h))
        .collect();
    for rec in w.records(State::Pending) {
        let held = w.broken.iter().any(|(b, _, _)| *b == rec.id)
            || store.is_leased(&rec.id)
            || d.context().endpoints().is_paused(&rec.endpoint)
            || held_by_line(w, &rec)
            || endpoint_full(w, &rec)
            || (asleep.resume.is_some() && in_flight)
            || (past_resume(&rec) && asleep.until.is_some());
        use crate::policy::circuit::CircuitState;
        let host = hosts.get(&rec.host);
        let host_full = host.is_some_and(|h| {
            let limit = match h.state {
                // A breaker closing again lets a few through at first.
                CircuitState::Ramping(limit) => limit.min(h.cap),
                _ => h.cap,
            };
            h.in_flight >= limit
        });
        if held || host_full {
            continue;
        }
        let probe = host
            .filter(|h| matches!(h.state, CircuitState::Open | CircuitState::Probing))
            .and_then(|h| h.next_probe_ms)
            .unwrap_or(0);
        // A message that did not read when leased is held back until its retry time.
        let held_back = store.held_back_until(&rec.id, now).unwrap_or(0);
        let due = rec.next_attempt_at_ms.max(probe).max(held_back).max(now);
        if asleep.until.is_none_or(|until| until > due + LATENESS_MS) {
            return Err(format!(
                "the scheduler sleeps until {:?} (now {now}) while {} ({}) is due at {} and nothing holds it \
                 (host {:?}, {} attempts in flight, resume point {:?})",
                asleep.until,
                rec.id,
                rec.endpoint,
                rec.next_attempt_at_ms,
                host,
                d.in_flight_count(),
                asleep.resume
            ));
        }
    }
    Ok(())
}

/// No message waits longer than the policy lets one wait: every pending message is due
/// within the longest backoff or capped `Retry-After` of now, plus what restarts set
/// courier's time back ([`World::clock_drops`]). A wall clock stepped back an hour that
/// courier's time followed would leave every retry an hour away.
pub fn not_stalled(w: &World) -> Result<(), String> {
    let r = &w.config().retry;
    let longest = r.max_delay.max(r.max_retry_after).as_millis() as u64 + w.clock_drops;
    let now = w.clock.now_ms();
    for rec in w.records(State::Pending) {
        if rec.next_attempt_at_ms > now + longest {
            return Err(format!(
                "{} is due at {} ms, {} ms from now: longer than any wait the policy allows ({longest} ms)",
                rec.id,
                rec.next_attempt_at_ms,
                rec.next_attempt_at_ms - now
            ));
        }
    }
    Ok(())
}

/// Whether `rec`'s ordered line holds it: it is not the head, or the line is blocked.
fn held_by_line(w: &World, rec: &MessageRecord) -> bool {
    if rec.fifo.is_none() {
        return false;
    }
    let store = w.store();
    let line = store.quietly(|| store.line(&rec.endpoint).ok().flatten());
    line.is_none_or(|l| l.blocked || l.head != rec.id)
}

/// Whether `rec`'s endpoint is at its own `max_in_flight` cap (its attempts at the
/// receivers: a deleted message's attempt still holds its permit).
fn endpoint_full(w: &World, rec: &MessageRecord) -> bool {
    w.config()
        .endpoints
        .iter()
        .find(|e| e.key == rec.endpoint)
        .and_then(|e| e.policy.max_in_flight)
        .is_some_and(|cap| w.rx.in_flight_to(&rec.target) >= cap as usize)
}

/// The caps: never more in flight to one host than its cap, to one endpoint than its
/// `max_in_flight`, nor in all than `delivery.max_in_flight`; and ordered endpoints'
/// attempts in order, one at a time.
fn limits(w: &World) -> Result<(), String> {
    if let Some(v) = w.rx.order.violations().first() {
        return Err(format!("ordering broken: {v}"));
    }
    let cap = w.config().delivery.max_in_flight_per_host as usize;
    let (per_host, total) = w.rx.max_in_flight();
    let all = w.config().delivery.max_in_flight as usize;
    if total > all {
        return Err(format!(
            "{total} attempts in flight at once, delivery.max_in_flight {all}"
        ));
    }
    for (host, max) in per_host {
        if max > cap {
            return Err(format!("{max} attempts in flight to {host}, cap {cap}"));
        }
    }
    for e in &w.config().endpoints {
        let cap = e.policy.max_in_flight.map_or(usize::MAX, |c| c as usize);
        let max = w.rx.max_in_flight_per_endpoint().get(&e.key).copied().unwrap_or(0);
        if max > cap {
            return Err(format!(
                "{max} attempts in flight to endpoint {}, its max_in_flight {cap}",
                e.key
            ));
        }
    }
    Ok(())
}

/// At quiescence (receivers healthy, endpoints resumed, clock past every due time).
pub fn quiescent(w: &World, disturbed: &[u64]) -> Result<(), String> {
    let store = w.store();
    let problems = store.audit(true).map_err(|e| e.to_string())?;
    if !problems.is_empty() {
        return Err(format!("store inconsistent at quiescence: {}", problems.join("; ")));
    }
    let seen = w.rx.seen_per_event();
    for (id, (event, target, body)) in &w.model.acked {
        let rec = match store.message(id).map_err(|e| e.to_string())? {
            Some(rec) => rec,
            None if w.model.finished.contains(id) => continue,
            None => return Err(format!("acknowledged message {id} lost")),
        };
        match rec.state {
            State::Delivered => {}
            State::Dead if rec.dead_reason.is_some() => {}
            other => return Err(format!("{id} is {other:?} at quiescence ({:?})", rec.dead_reason)),
        }
        let attempts: Vec<&Seen> = seen.get(event).map(|v| v.iter().collect()).unwrap_or_default();
        message(w, id, &rec, target, body, &attempts, disturbed)?;
    }
    // A handed-off message is the peer's, a deleted one nobody's: neither is attempted
    // here again (an attempt under way then was seen before).
    let log = w.rx.log();
    for (gone, events) in [
        ("handed off", &w.model.handed_off),
        ("deleted", &w.model.deleted_events),
    ] {
        for (event, seen_then) in events {
            if log
                .get(*seen_then..)
                .unwrap_or_default()
                .iter()
                .any(|s| s.event_id == *event)
            {
                return Err(format!("{event} was attempted after it was {gone}"));
            }
        }
    }
    rates(w)?;
    limits(w)
}

/// Per endpoint, the token bucket's own bound: over any interval from one attempt to a
/// later one, at most its burst (one second's worth, `rate`) plus what the rate refills in
/// that interval, `rate × length`. A restart starts a new process with full buckets, so an
/// interval is counted from the last start before its end.
fn rates(w: &World) -> Result<(), String> {
    let rate = i64::from(w.config().delivery.rate_per_second);
    let burst = rate;
    let mut per_endpoint: std::collections::BTreeMap<String, Vec<(usize, u64)>> = Default::default();
    for (i, s) in w.rx.log().into_iter().enumerate() {
        per_endpoint.entry(s.url).or_default().push((i, s.at_ms));
    }
    for (endpoint, attempts) in per_endpoint {
        // With g(k) = 1000·k − rate·t_k over the attempts since the last start, attempts
        // i..=j break the bound when g(j) − g(i) > 1000·(burst − 1).
        // The smallest g so far, and the attempt's time and index (the interval's start).
        let (mut min_g, mut base, mut start) = ((i64::MAX, 0u64, 0usize), 0usize, 0usize);
        for (k, (index, at)) in attempts.iter().enumerate() {
            let this_start = w.started_at_log.iter().filter(|s| **s <= *index).count();
            if this_start != start {
                (min_g, base, start) = ((i64::MAX, 0, 0), k, this_start);
            }
            let g = 1000 * (k - base) as i64 - rate * *at as i64;
            if g < min_g.0 {
                min_g = (g, *at, k);
            }
            if g - min_g.0 > 1000 * (burst - 1) {
                return Err(format!(
                    "{endpoint}: {} attempts from {} ms to {at} ms, more than its bucket allows (rate {rate}/s, burst {burst})",
                    k - min_g.2 + 1,
                    min_g.1
                ));
            }
        }
    }
    Ok(())
}

fn is_2xx(a: &Option<Answer>) -> bool {
    matches!(a, Some(Answer::Status(s, _)) if (200..300).contains(s))
}

/// One message against what its receiver saw.
fn message(
    w: &World,
    id: &str,
    rec: &MessageRecord,
    target: &str,
    body: &[u8],
    seen: &[&Seen],
    disturbed: &[u64],
) -> Result<(), String> {
    let cut = w.model.cut.get(&rec.event_id).copied().unwrap_or(0) as usize;
    let recorded = rec.history_len as usize;
    // Its history as read back (the `history` entries and the attempt the record keeps)
    // lists every attempt the record counts, with the last one's status.
    let history = w.store().history(rec).map_err(|e| format!("{id}: history: {e}"))?;
    if history.len() != recorded || history.last().map(|a| a.status) != (recorded > 0).then_some(rec.last_status) {
        return Err(format!(
            "{id}: {recorded} attempts recorded, the history lists {} ending {:?} (record: {:?})",
            history.len(),
            history.last().map(|a| a.status),
            rec.last_status
        ));
    }
    if seen.len() < recorded {
        return Err(format!(
            "{id}: {recorded} attempts recorded, the receiver saw {}",
            seen.len()
        ));
    }
    if seen.len() - recorded > cut {
        return Err(format!(
            "{id}: the receiver saw {} attempts, {recorded} recorded, only {cut} cut by a crash",
            seen.len()
        ));
    }
    let successes = seen.iter().filter(|s| is_2xx(&s.answer)).count();
    if successes > 1 + cut {
        return Err(format!("{id}: delivered {successes} times with {cut} attempts cut"));
    }
    if rec.state == State::Delivered && successes == 0 {
        return Err(format!("{id}: delivered, but the receiver never answered 2xx"));
    }
    dead_reason(w, id, rec)?;
    for s in seen {
        if s.body != body || s.url != target {
            return Err(format!("{id}: the receiver saw another body or target"));
        }
        if s.timestamp != (s.wall_ms / 1000).to_string() {
            return Err(format!(
                "{id}: webhook-timestamp {} at {} ms on the wall clock",
                s.timestamp, s.wall_ms
            ));
        }
    }
    gaps(w, id, seen, disturbed)
}

/// A dead message's reason agrees with its record, as `policy::decide` gives it:
/// `max_attempts` only at its limit (`min(max_attempts_404, max_attempts)` after a 404),
/// `permanent_status` only after a permanent answer, `expired` only when the longest wait
/// the policy allows from the last answer passes the give-up time, and never
/// `egress_denied` (the simulated receivers never refuse an address).
fn dead_reason(w: &World, id: &str, rec: &MessageRecord) -> Result<(), String> {
    let Some(reason) = rec.dead_reason.filter(|_| rec.state == State::Dead) else {
        return Ok(());
    };
    let r = &w.config().retry;
    let longest_wait = r.max_delay.max(r.max_retry_after).as_millis() as u64;
    let consistent = match reason {
        DeadReason::MaxAttempts => {
            rec.attempts == rec.max_attempts
                || (rec.last_status == Some(404) && rec.attempts >= r.max_attempts_404.min(rec.max_attempts))
        }
        DeadReason::PermanentStatus => matches!(rec.last_status, Some(400 | 401 | 403 | 410 | 422)),
        DeadReason::Expired => rec.attempts < rec.max_attempts && rec.finished_at_ms + longest_wait > rec.give_up_at_ms,
        DeadReason::EgressDenied => false,
    };
    if consistent {
        return Ok(());
    }
    Err(format!(
        "{id}: dead ({}) after {} of {} attempts, last status {:?}, finished at {} ms, give-up at {} ms",
        reason.as_str(),
        rec.attempts,
        rec.max_attempts,
        rec.last_status,
        rec.finished_at_ms,
        rec.give_up_at_ms
    ))
}

/// After a step that began and ended with `paused` endpoints paused: none of them got an
/// attempt during it (the receivers' log from `log_start`). Attempts started before the
/// pause were logged before it: every step waits for its attempts to start.
pub fn paused_untouched(w: &World, paused: &[&str], log_start: usize) -> Result<(), String> {
    let still: Vec<&str> = w.paused();
    for (i, s) in w.rx.log_from(log_start).into_iter().enumerate() {
        if paused.contains(&s.url.as_str()) && still.contains(&s.url.as_str()) {
            return Err(format!(
                "{} attempted at {} ms while its endpoint {} was paused (attempt {} of the run; starts at {:?})",
                s.event_id,
                s.at_ms,
                s.url,
                log_start + i,
                w.started_at_log
            ));
        }
    }
    Ok(())
}

/// The hosts whose breaker is open or probing now: when their (next) probe may go, and
/// their attempts lost so far (panicked before the request left).
pub fn open_breakers(w: &World) -> Breakers {
    use crate::policy::circuit::CircuitState;
    let hosts = w
        .d()
        .hosts()
        .snapshot(true)
        .into_iter()
        .filter_map(|h| match h.state {
            // Probing: the time a probe out that long is taken for lost, and one may replace it.
            CircuitState::Open | CircuitState::Probing => {
                let panicked = w.rx.panicked(&h.host);
                Some((h.host, (h.next_probe_ms, panicked)))
            }
            _ => None,
        })
        .collect();
    Breakers {
        hosts,
        held: w.rx.held_events().into_iter().collect(),
    }
}

/// What [`open_breakers`] saw at the start of a step.
pub struct Breakers {
    hosts: std::collections::BTreeMap<String, (Option<u64>, usize)>,
    /// The attempts held open by their receivers then, by event id.
    held: std::collections::BTreeSet<String>,
}

/// During a step that began with `open` breakers: no attempt to such a host but its probe,
/// at most one, and not before its probe time (with a probe out already: not before that
/// probe is taken for lost, its probe timeout after it started; the simulated receivers
/// can hold an answer far longer than a real request would wait). A probe answered so that
/// the breaker closes lets what follows go as the closed breaker allows; a probe lost (its
/// attempt cut off, or panicked before its request left) lets the next probe go at once.
pub fn breakers_held(w: &World, open: &Breakers, log_start: usize) -> Result<(), String> {
    let held_now: std::collections::BTreeSet<String> = w.rx.held_events().into_iter().collect();
    let log = w.rx.log();
    let host_of = |s: &Seen| url::Url::parse(&s.url).ok().map(|u| crate::target::host_key(&u));
    // Per host: attempts lost during the step (held at its start or started in it, ended
    // with no answer) and panicked ones; each lets one more probe go, at once.
    let lost = |host: &str, panicked_before: usize| -> usize {
        let cut = log
            .iter()
            .enumerate()
            .filter(|(i, s)| {
                s.answer.is_none()
                    && !held_now.contains(&s.event_id)
                    && (*i >= log_start || open.held.contains(&s.event_id))
                    && host_of(s).as_deref() == Some(host)
            })
            .count();
        cut + w.rx.panicked(host).saturating_sub(panicked_before)
    };
    let mut probes: std::collections::BTreeMap<String, usize> = Default::default();
    // Hosts whose probe was answered in a way that closes the breaker.
    let mut closed = std::collections::BTreeSet::new();
    let closes = |a: &Option<Answer>| matches!(a, Some(Answer::Status(status, retry_after)) if retry_after.is_some() || !w.config().circuit.counts(*status));
    // Attempts held at the step's start and answered in it: an answer that closes the
    // breaker counts whenever the attempt started (the host is alive).
    for s in log.get(..log_start).unwrap_or_default() {
        if open.held.contains(&s.event_id) && closes(&s.answer) {
            closed.extend(host_of(s));
        }
    }
    for s in log.get(log_start..).unwrap_or_default() {
        let Some(host) = host_of(s) else { continue };
        let Some((probe_at, panicked)) = open.hosts.get(&host).filter(|_| !closed.contains(&host)) else {
            continue;
        };
        if closes(&s.answer) {
            closed.insert(host.clone());
        }
        let n = probes.entry(host.clone()).or_default();
        *n += 1;
        let lost = lost(&host, *panicked);
        match probe_at {
            _ if *n > 1 + lost => return Err(format!("{n} attempts to {host} with its breaker open: one probe only")),
            None if lost == 0 => {
                return Err(format!(
                    "{} attempted at {} ms while {host}'s probe was out",
                    s.event_id, s.at_ms
                ))
            }
            Some(at) if s.at_ms < *at && lost == 0 => {
                return Err(format!(
                    "{} attempted at {} ms while {host}'s breaker was open until {at} ms",
                    s.event_id, s.at_ms
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// No attempt before its time: between two attempts with nothing in between that may move
/// a message forward (a crash or restart, a resume, a replay), at least the smallest backoff
/// the policy allows, and at least the receiver's capped `Retry-After`.
fn gaps(w: &World, id: &str, seen: &[&Seen], disturbed: &[u64]) -> Result<(), String> {
    let r = &w.config().retry;
    let (base, max) = (r.base_delay.as_millis() as u64, r.max_delay.as_millis() as u64);
    let max_retry_after = r.max_retry_after.as_millis() as u64;
    let mut n = 0u32; // attempts since the last disturbance
    for pair in seen.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        n += 1;
        // A restart in between is a disturbance whatever the times say: courier's time
        // may go back at one (see `World::clock_drops`).
        let restarted = w.started_at_log.iter().any(|s| a.index < *s && *s <= b.index);
        if restarted || disturbed.iter().any(|t| *t >= a.at_ms && *t <= b.at_ms) {
            n = 0;
            continue;
        }
        let backoff = base.saturating_mul(1 << (n - 1).min(30)).min(max);
        let mut least = backoff / 2; // equal jitter: [base/2, base]
        if let Some(Answer::Status(429 | 503, Some(after))) = &a.answer {
            let wait = match after.parse::<u64>() {
                Ok(secs) => secs * 1000,
                Err(_) => httpdate::parse_http_date(after)
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| (d.as_millis() as u64).saturating_sub(a.wall_ms)),
            };
            least = least.max(wait.min(max_retry_after));
        }
        if let Some(Answer::Status(s, _)) = &a.answer {
            if matches!(s, 400 | 401 | 403 | 410 | 422) || (200..300).contains(s) {
                return Err(format!("{id}: attempted again after a final answer {s}"));
            }
        }
        if b.at_ms < a.at_ms + least {
            return Err(format!(
                "{id}: attempt {} came {} ms after the previous ({:?}), before the {least} ms it must wait",
                n + 1,
                b.at_ms - a.at_ms,
                a.answer
            ));
        }
    }
    Ok(())
}
