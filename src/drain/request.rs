//! The request that hands one stored message to the peer courier's ingress. Pure: time
//! comes from the caller.
//!
//! The peer must store the message as this courier holds it, so it is sent as the app sent
//! it, plus the control headers that carry what ingress decided:
//!
//! - `Courier-Target`: the stored target, exactly (in a header rather than the URL path, so
//!   nothing on the way can normalise it);
//! - `webhook-id`: the event id (the app's `webhook-id` or `Idempotency-Key`, or the one
//!   courier made), so the peer keeps it and its dedupe (event id and target) recognises a
//!   message handed over twice;
//! - `Courier-Endpoint`: the endpoint key (rate limit, pause, stats, ordering);
//! - the signing choice: `Courier-Signing-Key: <name>` (the peer looks the name up in its
//!   own `[signing.keys]`), or `Courier-Signing-Secret` for a per-message secret, or
//!   nothing for the default secrets; `Courier-Signature-Scheme` when the message chose one;
//! - what is left of its give-up policy: `Courier-Max-Attempts` (attempts not yet made, at
//!   least 1) and `Courier-Give-Up-After` (the time left, at least 1 ms), so a message does
//!   not start a fresh budget at the peer;
//! - `Courier-Token`, when the peer's ingress wants one.
//!
//! The method, body and the app's headers go as stored (their `traceparent` too, so the
//! trace goes on at the peer). The route a message came through is not sent: the peer has
//! its own routes; its policy for the endpoint applies there.

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use url::Url;

use crate::headers::{
    COURIER_ENDPOINT, COURIER_GIVE_UP_AFTER, COURIER_MAX_ATTEMPTS, COURIER_SIGNATURE_SCHEME, COURIER_SIGNING_KEY,
    COURIER_SIGNING_SECRET, COURIER_TARGET, COURIER_TOKEN, MAX_ATTEMPTS_LIMIT,
};
use crate::outbound::transport::OutboundRequest;
use crate::signing::Secret;
use crate::store::{MessageRecord, Payload, SigningChoice};

/// The event id header the peer's ingress reads first.
const WEBHOOK_ID: &str = "webhook-id";

/// Where the peer is and how to talk to it.
#[derive(Debug, Clone)]
pub struct PeerAddr {
    /// The peer's ingress (see `config::peer_url`).
    pub url: Url,
    /// Its `ingress_token`, sent as `Courier-Token`.
    pub token: Option<Secret>,
    /// Time allowed for one forward, answer included.
    pub timeout: Duration,
}

/// The request that forwards `rec` (with its `payload`) to `peer` at `now_ms`; an error
/// for a stored method that is not an HTTP method (a record no courier writes).
pub fn forward_request(
    peer: &PeerAddr,
    rec: &MessageRecord,
    payload: Payload,
    now_ms: u64,
) -> Result<OutboundRequest, String> {
    let method = http::Method::from_bytes(payload.method.as_bytes())
        .map_err(|_| format!("stored method {:?} is not an HTTP method", payload.method))?;
    // The app's own event id headers are replaced by the one courier keeps.
    let mut headers: Vec<(Cow<'static, str>, Vec<u8>)> = payload
        .headers
        .into_iter()
        .filter(|(name, _)| !name.eq_ignore_ascii_case(WEBHOOK_ID))
        .map(|(name, value)| (Cow::Owned(name), value))
        .collect();
    let mut control = |name: &'static str, value: String| headers.push((Cow::Borrowed(name), value.into_bytes()));
    control(WEBHOOK_ID, rec.event_id.clone());
    control(COURIER_TARGET, rec.target.clone());
    control(COURIER_ENDPOINT, rec.endpoint.clone());
    match payload.signing {
        SigningChoice::Default => {}
        SigningChoice::Key(name) => control(COURIER_SIGNING_KEY, name),
        SigningChoice::Inline(secret) => control(COURIER_SIGNING_SECRET, secret),
    }
    if let Some(scheme) = payload.scheme {
        control(COURIER_SIGNATURE_SCHEME, scheme.as_str().to_string());
    }
    let (attempts_left, time_left_ms) = budget_left(rec, now_ms);
    control(COURIER_MAX_ATTEMPTS, attempts_left.to_string());
    control(COURIER_GIVE_UP_AFTER, format!("{time_left_ms}ms"));
    if let Some(token) = &peer.token {
        control(COURIER_TOKEN, token.expose().to_string());
    }
    Ok(OutboundRequest {
        method,
        url: peer
            .url
            .as_str()
            .parse()
            .map_err(|e| format!("peer URL {}: {e}", peer.url))?,
        headers,
        body: Bytes::from(payload.body),
        timeout: peer.timeout,
    })
}

/// What is left of `rec`'s give-up policy at `now_ms`: attempts not yet made (1 at least:
/// a message is never given up without an attempt) and time until its give-up time (1 ms
/// at least, so one attempt is still made, as here).
pub fn budget_left(rec: &MessageRecord, now_ms: u64) -> (u32, u64) {
    let attempts = rec
        .max_attempts
        .saturating_sub(rec.attempts)
        .clamp(1, MAX_ATTEMPTS_LIMIT);
    (attempts, rec.give_up_at_ms.saturating_sub(now_ms).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SignatureScheme;

    fn peer(token: Option<&str>) -> PeerAddr {
        PeerAddr {
            url: Url::parse("http://tier.example:8787/").unwrap(),
            token: token.map(|t| Secret::new(t.into())),
            timeout: Duration::from_secs(7),
        }
    }

    fn stored(signing: SigningChoice, scheme: Option<SignatureScheme>) -> (MessageRecord, Payload) {
        let m = crate::store::tests::message("dlv_1", "evt_app_1", 1_000);
        let mut rec = m.record;
        rec.target = "https://r.example/hooks/a?x=1".into();
        rec.endpoint = "billing".into();
        rec.max_attempts = 16;
        rec.attempts = 3;
        rec.give_up_at_ms = 61_000;
        let payload = Payload {
            method: "PUT".into(),
            headers: vec![
                ("content-type".into(), b"application/json".to_vec()),
                ("Webhook-Id".into(), b"stale".to_vec()),
                (
                    "traceparent".into(),
                    b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_vec(),
                ),
            ],
            body: b"{\"a\":1}".to_vec(),
            scheme,
            signing,
        };
        (rec, payload)
    }

    fn header<'a>(req: &'a OutboundRequest, name: &str) -> Vec<&'a str> {
        req.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| std::str::from_utf8(v).unwrap())
            .collect()
    }

    #[test]
    fn a_message_goes_as_stored_with_its_event_id_target_endpoint_and_budget() {
        let (rec, payload) = stored(SigningChoice::Default, None);
        let req = forward_request(&peer(Some("tier-token")), &rec, payload, 21_000).unwrap();
        assert_eq!(req.method, http::Method::PUT);
        assert_eq!(req.url.to_string(), "http://tier.example:8787/");
        assert_eq!(&req.body[..], b"{\"a\":1}");
        assert_eq!(req.timeout, Duration::from_secs(7));
        assert_eq!(header(&req, "webhook-id"), ["evt_app_1"], "the kept event id, once");
        assert_eq!(header(&req, "courier-target"), ["https://r.example/hooks/a?x=1"]);
        assert_eq!(header(&req, "courier-endpoint"), ["billing"]);
        assert_eq!(header(&req, "courier-max-attempts"), ["13"]);
        assert_eq!(header(&req, "courier-give-up-after"), ["40000ms"]);
        assert_eq!(header(&req, "courier-token"), ["tier-token"]);
        assert_eq!(header(&req, "content-type"), ["application/json"]);
        assert_eq!(header(&req, "traceparent").len(), 1, "the trace goes on");
        assert!(header(&req, "courier-signing-key").is_empty() && header(&req, "courier-signing-secret").is_empty());
        assert!(
            header(&req, "courier-signature-scheme").is_empty(),
            "the peer's default scheme"
        );
        // Every control header is one the peer's ingress accepts.
        let mut map = http::HeaderMap::new();
        for (n, v) in &req.headers {
            map.append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(v).unwrap(),
            );
        }
        let control = crate::headers::parse_control_headers(&map).unwrap();
        assert_eq!(control.max_attempts, Some(13));
        assert_eq!(control.give_up_after, Some(Duration::from_secs(40)));
    }

    #[test]
    fn the_signing_choice_and_scheme_travel_with_the_message() {
        let (rec, payload) = stored(SigningChoice::Key("billing".into()), Some(SignatureScheme::Stripe));
        let req = forward_request(&peer(None), &rec, payload, 0).unwrap();
        assert_eq!(header(&req, "courier-signing-key"), ["billing"]);
        assert_eq!(header(&req, "courier-signature-scheme"), ["stripe"]);
        assert!(header(&req, "courier-token").is_empty());
        let (rec, payload) = stored(SigningChoice::Inline("whsec_aW5saW5l".into()), None);
        let req = forward_request(&peer(None), &rec, payload, 0).unwrap();
        assert_eq!(header(&req, "courier-signing-secret"), ["whsec_aW5saW5l"]);
    }

    #[test]
    fn the_budget_left_never_reaches_zero() {
        let (mut rec, _) = stored(SigningChoice::Default, None);
        assert_eq!(budget_left(&rec, 1_000), (13, 60_000));
        rec.attempts = 16;
        rec.give_up_at_ms = 500;
        assert_eq!(budget_left(&rec, 1_000), (1, 1), "past both limits: one attempt left");
        rec.max_attempts = 5_000;
        rec.attempts = 0;
        assert_eq!(
            budget_left(&rec, 0).0,
            MAX_ATTEMPTS_LIMIT,
            "what the peer's ingress takes"
        );
    }

    #[test]
    fn a_method_no_courier_stores_is_an_error() {
        let (rec, mut payload) = stored(SigningChoice::Default, None);
        payload.method = "BAD METHOD".into();
        assert!(forward_request(&peer(None), &rec, payload, 0).is_err());
    }
}
