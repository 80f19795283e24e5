//! The auto-pause alert: a JSON message to `alert_url`, accepted into courier's own
//! pipeline so it is stored, retried and signed like any other message.

use super::Deliverer;
use crate::envelope::Envelope;
use crate::store::{EndpointRecord, SigningChoice};

/// The alert body (CONTRACT §5), the same whichever way the endpoint paused itself (a
/// streak of permanent failures, or an ordered line blocked behind a dead head: the log
/// line says which).
pub fn alert_body(endpoint: &str, rec: &EndpointRecord, now_ms: u64) -> Vec<u8> {
    let at = crate::timefmt::rfc3339(now_ms);
    serde_json::json!({
        "type": "endpoint.paused",
        "endpoint": endpoint,
        "streak": rec.streak,
        "last_status": rec.last_status,
        "at": at,
    })
    .to_string()
    .into_bytes()
}

/// Enqueues the alert for a paused endpoint, if `alert_url` is set. The alert endpoint
/// itself never alerts about itself (that would loop).
pub async fn endpoint_paused(d: &std::sync::Arc<Deliverer>, endpoint: &str, rec: &EndpointRecord, now_ms: u64) {
    let Some(url) = d.ctx.config().alert_url.clone() else {
        return;
    };
    // The alert's own endpoint key is the redacted form of alert_url, so neither
    // `/endpoints` nor a log line shows its path (where chat-style URLs keep their credential).
    let key = crate::redact::alert_key(&url);
    if key == endpoint {
        return;
    }
    // Alerts are courier's own messages: whatever [[endpoint]] matches the alert key.
    let settings = d.ctx.settings();
    let policy = settings.policies.resolve(None, &key);
    let env = Envelope {
        target: url,
        endpoint: Some(key),
        route: None,
        event_id: None,
        method: "POST".into(),
        headers: vec![("content-type".into(), b"application/json".to_vec())],
        body: alert_body(endpoint, rec, now_ms),
        scheme: None,
        signing: SigningChoice::Default,
        max_attempts: policy.max_attempts,
        give_up_after: policy.give_up_after,
    };
    let msg = d.with_rng(|rng| env.into_message(now_ms, rng, d.ctx.store().ids()));
    // Counted as accepted by `accept`.
    if let Err(e) = d.accept(msg, ()).await {
        tracing::error!(endpoint = %crate::redact::url_for_log(endpoint), error = %e, "storing the pause alert failed")
    }
}
