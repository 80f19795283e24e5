//! The JSON the admin API shows of a delivery and of the retry policy its next attempt
//! gets: one rendering, shared by `GET /deliveries`, `GET /deliveries/<id>` and the CLI's
//! `--json`.

use serde_json::{json, Value};

use crate::config::units::format_duration;
use crate::model::State;
use crate::policy::{revision_text, Backoff, PolicyBook};
use crate::store::{AttemptRecord, MessageRecord};
use crate::timefmt::rfc3339;

fn time_or_null(ms: u64) -> Value {
    if ms == 0 {
        Value::Null
    } else {
        Value::String(rfc3339(ms))
    }
}

/// The target as the admin API shows it: never userinfo, and `alert_url` only as its
/// redacted key (its path may be the credential).
pub fn shown_target(target: &str, endpoint: &str, alert_url: Option<&url::Url>) -> String {
    // An alert stored by reference (`alert:` and the redacted key) shows as it is stored.
    if crate::delivery::alert::is_reference(target) {
        return target.to_string();
    }
    match url::Url::parse(target) {
        // The current alert_url, or an alert stored under an earlier one (its endpoint key
        // is the redacted form, so it is recognised after a rotation too).
        Ok(url)
            if alert_url.is_some_and(|a| a.as_str() == url.as_str()) || endpoint == crate::redact::alert_key(&url) =>
        {
            crate::redact::alert_key(&url)
        }
        Ok(mut url) => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.to_string()
        }
        Err(_) => target.to_string(),
    }
}

/// The JSON of one delivery (CONTRACT §5); `history` only when given; the target as
/// [`shown_target`] shows it.
pub fn delivery_json(rec: &MessageRecord, history: Option<&[AttemptRecord]>, alert_url: Option<&url::Url>) -> Value {
    let mut v = json!({
        "id": rec.id,
        "event_id": rec.event_id,
        "target": shown_target(&rec.target, &rec.endpoint, alert_url),
        "endpoint": rec.endpoint,
        "route": rec.route,
        "state": rec.state.as_str(),
        "attempts": rec.attempts,
        "max_attempts": rec.max_attempts,
        "accepted_at": time_or_null(rec.accepted_at_ms),
        // A message waiting in an ordered line has no due time until it heads its line.
        "next_attempt_at": if rec.state == State::Pending && rec.fifo.is_none_or(|f| f.pos == 0) { time_or_null(rec.next_attempt_at_ms) } else { Value::Null },
        "give_up_at": time_or_null(rec.give_up_at_ms),
        "finished_at": time_or_null(rec.finished_at_ms),
        "dead_reason": rec.dead_reason.map(|r| r.as_str()),
        "last_status": rec.last_status,
        "last_error": rec.last_error,
    });
    // Added for ordered messages only: an unordered one's JSON is exactly as before.
    if let Some(fifo) = rec.fifo {
        v["ordering"] = json!("fifo");
        v["on_dead"] = json!(fifo.on_dead.as_str());
    }
    if let Some(history) = history {
        v["history"] = history
            .iter()
            .map(|a| {
                json!({
                    "at": rfc3339(a.at_ms),
                    "status": a.status,
                    "error": a.error,
                    "duration_ms": a.duration_ms,
                    "policy_revision": a.policy_revision.map(revision_text),
                    // The span this attempt sent in its traceparent (null without a trace).
                    "span_id": a.span_id,
                })
            })
            .collect();
    }
    v
}

/// The policy a message's next attempt is made under, as the config says now: every value
/// with the sections it came from, and the revision its attempts' `policy_revision` can be
/// compared with. The give-up limits are the message's own (`max_attempts`, `give_up_at`).
pub fn policy_json(book: &PolicyBook, route: Option<&str>, endpoint: &str) -> Value {
    let p = &book.resolve(route, endpoint);
    let (endpoint_section, route_section) = book.sections(route, endpoint);
    let d = |ms: u64| format_duration(std::time::Duration::from_millis(ms));
    let backoff = match &p.backoff {
        Backoff::Exponential { base_ms, max_ms } => {
            json!({ "kind": "exponential", "base_delay": d(*base_ms), "max_delay": d(*max_ms) })
        }
        Backoff::Schedule(steps) => {
            json!({ "kind": "schedule", "schedule": steps.iter().map(|ms| d(*ms)).collect::<Vec<_>>() })
        }
    };
    let statuses: Vec<Value> = p
        .statuses
        .layers()
        .flat_map(|rules| rules.iter())
        .map(|(status, class)| json!({ "status": status.to_string(), "class": class.as_str() }))
        .collect();
    json!({
        "revision": revision_text(p.revision()),
        "endpoint_section": endpoint_section,
        "route_section": route_section,
        "backoff": backoff,
        "jitter": p.jitter.as_str(),
        "max_attempts_404": p.max_attempts_404,
        "max_retry_after": format_duration(p.max_retry_after),
        "request_timeout": format_duration(p.request_timeout),
        "max_in_flight": p.max_in_flight,
        "statuses": statuses,
        "summary": crate::config::describe_policy(p),
    })
}
