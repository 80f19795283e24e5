//! The auto-pause alert: a JSON message to `alert_url`, accepted into courier's own
//! pipeline so it is stored, retried and signed like any other message.
//!
//! `alert_url` is a secret (chat-style alert URLs carry their credential in the path), so
//! an alert never stores it: its target is a reference, `alert:` and the URL's redacted key
//! (`alert:https://ops.example/[alert_url]`), resolved to the configured `alert_url` at each
//! attempt and at a drain's forward. No message an app sends can carry such a target
//! (ingress takes http and https targets only), so no app can send through it. A message
//! an app (or a draining peer) sends to exactly `alert_url` is stored by reference too.
//! The reference resolves while `alert_url` has the same origin (a rotated chat URL on the
//! same host takes its pending alerts along); unset, or moved to another origin, the alert
//! stays pending, as a message whose signing key left the config does.

use url::Url;

use super::Deliverer;
use crate::envelope::Envelope;
use crate::store::{EndpointRecord, MessageRecord, SigningChoice};

/// How an alert's stored target starts.
const REFERENCE: &str = "alert:";

/// An alert whose reference the config no longer resolves.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the alert's target {0} is not the configured alert_url (unset, or now at another origin); it stays pending until alert_url is set back to that origin, or it is deleted")]
pub struct Unresolved(
    /// The redacted key the reference names.
    pub String,
);

impl Unresolved {
    /// The machine-readable code.
    pub fn code(&self) -> &'static str {
        "alert_url_unresolved"
    }
}

/// The stored target of a message to `alert_url`: the reference, never the URL.
pub fn reference(alert_url: &Url) -> String {
    format!("{REFERENCE}{}", crate::redact::alert_key(alert_url))
}

/// Whether a stored target is an alert's reference (not a URL).
pub fn is_reference(target: &str) -> bool {
    target.starts_with(REFERENCE)
}

/// Stores `rec`'s target by reference when it is exactly `alert_url`, and its endpoint key
/// as the redacted one when it was derived from that URL (its path holds the secret too).
pub fn by_reference(rec: &mut MessageRecord, alert_url: Option<&Url>) {
    if let Some(url) = alert_url.filter(|u| u.as_str() == rec.target) {
        rec.target = reference(url);
        if rec.endpoint == crate::target::default_endpoint_key(url) {
            rec.endpoint = crate::redact::alert_key(url);
        }
    }
}

/// The URL a stored `target` sends to: the target itself, or for a reference the configured
/// `alert_url` when it still has the origin the reference names.
pub fn target_url<'a>(target: &'a str, alert_url: Option<&'a Url>) -> Result<&'a str, Unresolved> {
    let Some(key) = target.strip_prefix(REFERENCE) else {
        return Ok(target);
    };
    match alert_url {
        Some(url) if crate::redact::alert_key(url) == key => Ok(url.as_str()),
        _ => Err(Unresolved(key.to_string())),
    }
}

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
        target: url.clone(),
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
    let mut msg = d.with_rng(|rng| env.into_message(now_ms, rng, d.ctx.store().ids()));
    by_reference(&mut msg.record, Some(&url));
    // Counted as accepted by `accept`.
    if let Err(e) = d.accept(msg, ()).await {
        tracing::error!(endpoint = %crate::redact::url_for_log(endpoint), error = %e, "storing the pause alert failed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alert_stores_a_reference_that_names_no_secret_and_resolves_to_the_configured_url() {
        let url = |s: &str| s.parse::<Url>().unwrap();
        let alert = url("https://hooks.chat.example/services/T0/B0/SECRETPATH?k=SECRETQUERY");
        let stored = reference(&alert);
        assert_eq!(stored, "alert:https://hooks.chat.example/[alert_url]");
        assert!(is_reference(&stored) && !is_reference(alert.as_str()));
        assert_eq!(target_url(&stored, Some(&alert)), Ok(alert.as_str()));
        // Rotated on the same host: the pending alert goes to the new URL.
        let rotated = url("https://hooks.chat.example/services/T0/B0/NEWPATH");
        assert_eq!(target_url(&stored, Some(&rotated)), Ok(rotated.as_str()));
        // Unset, or at another origin (scheme and port count): it does not resolve.
        let key = "https://hooks.chat.example/[alert_url]".to_string();
        for now in [
            None,
            Some(url("https://other.example/x")),
            Some(url("http://hooks.chat.example/services/T0/B0/SECRETPATH")),
            Some(url("https://hooks.chat.example:8443/services/T0/B0/SECRETPATH")),
        ] {
            assert_eq!(
                target_url(&stored, now.as_ref()),
                Err(Unresolved(key.clone())),
                "{now:?}"
            );
        }
        let err = Unresolved(key).to_string();
        assert!(!err.contains("SECRET"), "{err}");
        // Any other target is its own URL, whatever alert_url is.
        assert_eq!(
            target_url("https://r.example/[alert_url]", Some(&alert)),
            Ok("https://r.example/[alert_url]")
        );
        assert_eq!(target_url("https://r.example/h", None), Ok("https://r.example/h"));
    }

    #[test]
    fn only_a_target_that_is_exactly_alert_url_is_stored_by_reference() {
        let alert: Url = "https://hooks.chat.example/services/SECRETPATH".parse().unwrap();
        let mut rec = crate::store::tests::message("dlv_1", "evt_1", 1_000).record;
        for (target, alert_url, want) in [
            (
                alert.as_str(),
                Some(&alert),
                "alert:https://hooks.chat.example/[alert_url]",
            ),
            (alert.as_str(), None, alert.as_str()),
            (
                "https://hooks.chat.example/services/OTHER",
                Some(&alert),
                "https://hooks.chat.example/services/OTHER",
            ),
        ] {
            rec.target = target.to_string();
            rec.endpoint = crate::target::default_endpoint_key(&target.parse().unwrap());
            let derived = rec.endpoint.clone();
            by_reference(&mut rec, alert_url);
            assert_eq!(rec.target, want);
            // The derived endpoint key holds the path too: redacted with the target.
            let referenced = want.starts_with("alert:");
            let endpoint = if referenced {
                "https://hooks.chat.example/[alert_url]"
            } else {
                derived.as_str()
            };
            assert_eq!(rec.endpoint, endpoint);
        }
        // An endpoint the app named is its own: left as it is.
        rec.target = alert.to_string();
        rec.endpoint = "chat".into();
        by_reference(&mut rec, Some(&alert));
        assert_eq!(rec.endpoint, "chat");
    }
}
