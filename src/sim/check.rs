//! The invariants: what must hold after every step, and at quiescence.

use super::receiver::{Answer, Seen};
use super::world::World;
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
    rates(w, disturbed)?;
    limits(w)
}

/// Per endpoint, never more attempts in any second than its token bucket allows: a full
/// bucket (one second's worth) plus one second of refill. Windows holding a crash or
/// restart are skipped (a new process starts with full buckets).
fn rates(w: &World, disturbed: &[u64]) -> Result<(), String> {
    let rate = u64::from(w.config().delivery.rate_per_second);
    let mut per_endpoint: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for s in w.rx.log() {
        per_endpoint.entry(s.url.clone()).or_default().push(s.at_ms);
    }
    for (endpoint, mut times) in per_endpoint {
        times.sort_unstable();
        let mut start = 0;
        for end in 0..times.len() {
            while times[end] - times[start] >= 1000 {
                start += 1;
            }
            let in_window = (end - start + 1) as u64;
            let quiet = !disturbed.iter().any(|t| *t >= times[start] && *t <= times[end]);
            if in_window > 2 * rate && quiet {
                return Err(format!(
                    "{in_window} attempts to {endpoint} within one second (from {} ms), rate {rate}/s",
                    times[start]
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
        if s.timestamp != (s.at_ms / 1000).to_string() {
            return Err(format!("{id}: webhook-timestamp {} at {} ms", s.timestamp, s.at_ms));
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
    for s in w.rx.log_from(log_start) {
        if paused.contains(&s.url.as_str()) && still.contains(&s.url.as_str()) {
            return Err(format!(
                "{} attempted at {} ms while its endpoint {} was paused",
                s.event_id, s.at_ms, s.url
            ));
        }
    }
    Ok(())
}

/// The hosts whose breaker is open or probing now, with when their (next) probe may go.
pub fn open_breakers(w: &World) -> std::collections::BTreeMap<String, Option<u64>> {
    use crate::policy::circuit::CircuitState;
    w.d()
        .hosts()
        .snapshot(true)
        .into_iter()
        .filter_map(|h| match h.state {
            // Probing: the time a probe out that long is taken for lost, and one may replace it.
            CircuitState::Open | CircuitState::Probing => Some((h.host, h.next_probe_ms)),
            _ => None,
        })
        .collect()
}

/// During a step that began with `open` breakers: no attempt to such a host but its probe,
/// at most one, and not before its probe time (with a probe out already: not before that
/// probe is taken for lost, its probe timeout after it started; the simulated receivers
/// can hold an answer far longer than a real request would wait).
pub fn breakers_held(
    w: &World,
    open: &std::collections::BTreeMap<String, Option<u64>>,
    log_start: usize,
) -> Result<(), String> {
    let mut probes: std::collections::BTreeMap<String, usize> = Default::default();
    for s in w.rx.log_from(log_start) {
        let Ok(url) = url::Url::parse(&s.url) else { continue };
        let host = crate::target::host_key(&url);
        let Some(probe_at) = open.get(&host) else { continue };
        let n = probes.entry(host.clone()).or_default();
        *n += 1;
        match probe_at {
            None => {
                return Err(format!(
                    "{} attempted at {} ms while {host}'s probe was out",
                    s.event_id, s.at_ms
                ))
            }
            Some(at) if s.at_ms < *at => {
                return Err(format!(
                    "{} attempted at {} ms while {host}'s breaker was open until {at} ms",
                    s.event_id, s.at_ms
                ))
            }
            Some(_) if *n > 1 => return Err(format!("{n} attempts to {host} with its breaker open: one probe only")),
            Some(_) => {}
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
        if disturbed.iter().any(|t| *t >= a.at_ms && *t <= b.at_ms) {
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
                    .map_or(0, |d| (d.as_millis() as u64).saturating_sub(a.at_ms)),
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
