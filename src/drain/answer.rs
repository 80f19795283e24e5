//! What the peer's answer to one forwarded message means, and how long to wait before
//! trying again. Pure: the randomness comes from the caller.
//!
//! Only a courier's own 202 for this very event counts: a message is marked handed off only
//! when the peer said it holds it durably (its `event_id` echoes ours; a duplicate answer is
//! as good, the peer already has it) and, with `[drain] token` set, proved it: its
//! `Courier-Receipt` checks for our event id and its delivery id under that token
//! ([`crate::signing::receipt`]), which only a courier whose `ingress_token` it is can make. Anything
//! else that claims success (a proxy's 200, a 202 without courier's body or receipt) stops
//! the drain rather than risk marking a message handed off that nobody holds.
//!
//! A busy peer is tried again after [`RETRY`]'s wait: equal jitter over a base doubling from
//! 250 ms up to 8 s.
//!
//! The peer's `error` and `message` reach the operator's terminal and `GET /drain`: they
//! are cleaned ([`crate::redact::clean`]) and cut to [`PEER_TEXT_CHARS`].

use super::progress::Refusal;
use crate::outbound::transport::{InboundResponse, TransportError};
use crate::policy::Backoff;

/// Tries of one message before the drain gives up on the peer.
pub const MAX_TRIES: u32 = 8;
/// The wait after a try (with [`crate::model::Jitter::Equal`]).
pub const RETRY: Backoff = Backoff::Exponential {
    base_ms: 250,
    max_ms: 8_000,
};
/// Most of the peer's `error` or `message` kept.
pub const PEER_TEXT_CHARS: usize = 200;

/// What one forward came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerAnswer {
    /// The peer holds the message (stored now, or already: `duplicate`).
    Accepted {
        /// The peer's delivery id.
        peer_id: String,
        /// The peer had it already (an earlier hand-off whose answer was lost).
        duplicate: bool,
    },
    /// Worth trying again after a wait (the peer is busy, restarting or unreachable).
    Retry(String),
    /// The peer will not take this message as it is (e.g. `413 body_too_large`): it stays
    /// pending here; the drain goes on with the others.
    Refused(Refusal),
    /// Nothing else will go through either (a wrong token, not a courier, this courier
    /// itself): the drain stops.
    Stop(String),
}

/// The answer for a message with delivery id `own_id` and event id `event_id`; with
/// `receipt_key` (`[drain] token`), a 202 counts only with a valid receipt.
pub fn classify(
    own_id: &str,
    event_id: &str,
    receipt_key: Option<&[u8]>,
    result: &Result<InboundResponse, TransportError>,
) -> PeerAnswer {
    let resp = match result {
        Ok(resp) => resp,
        Err(TransportError::EgressDenied(e)) => {
            return PeerAnswer::Stop(format!(
                "the peer cannot be reached: {e} (a peer not listed in [drain] to or [drain] peers is under [egress])"
            ))
        }
        Err(e) => return PeerAnswer::Retry(e.to_string()),
    };
    let body: serde_json::Value = serde_json::from_slice(&resp.body).unwrap_or(serde_json::Value::Null);
    let text = |key: &str| {
        crate::redact::clean(body[key].as_str().unwrap_or_default())
            .chars()
            .take(PEER_TEXT_CHARS)
            .collect::<String>()
    };
    match resp.status {
        202 if body["event_id"].as_str() == Some(event_id) && body["id"].is_string() => {
            let peer_id = body["id"].as_str().unwrap_or_default().to_string();
            let proved = |key| {
                resp.receipt
                    .as_deref()
                    .is_some_and(|r| crate::signing::receipt::verify(key, event_id, &peer_id, r))
            };
            if !receipt_key.is_none_or(proved) {
                return PeerAnswer::Stop(
                    "the peer's 202 carries no valid Courier-Receipt: it is not a courier whose ingress_token is [drain] token"
                        .into(),
                );
            }
            if peer_id == own_id {
                // Only this courier (or a copy of its data dir) holds this delivery id: the
                // "duplicate" is the message itself, and marking it handed off would lose it.
                return PeerAnswer::Stop(format!(
                    "the peer answered with this message's own delivery id {own_id}: it is this courier (or a copy of its data dir)"
                ));
            }
            PeerAnswer::Accepted {
                duplicate: body["duplicate"].as_bool().unwrap_or(false),
                peer_id,
            }
        }
        408 | 429 | 500..=599 => PeerAnswer::Retry(format!("{} {}: {}", resp.status, text("error"), text("message"))),
        401 => PeerAnswer::Stop(
            "the peer refused the token (401): set [drain] token (COURIER_DRAIN_TOKEN) to its ingress_token".into(),
        ),
        421 => PeerAnswer::Stop(format!(
            "the peer refused its own name (421 {}): add the name --to uses to its [ingress] hosts",
            text("message")
        )),
        400..=499 if body["error"].is_string() => PeerAnswer::Refused(Refusal {
            seq: 0,
            id: own_id.into(),
            event_id: event_id.into(),
            status: resp.status,
            code: text("error"),
            message: text("message"),
        }),
        status => PeerAnswer::Stop(format!(
            "the peer answered {status} without courier's answer for this message: is --to a courier's ingress?"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn answer(status: u16, body: serde_json::Value) -> Result<InboundResponse, TransportError> {
        Ok(InboundResponse {
            status,
            retry_after: None,
            body: body.to_string().into(),
            receipt: None,
        })
    }

    fn classify_one(status: u16, body: serde_json::Value) -> PeerAnswer {
        classify("dlv_own", "evt_1", None, &answer(status, body))
    }

    #[test]
    fn only_a_couriers_202_for_this_event_hands_a_message_off() {
        use serde_json::json;
        let accepted = |duplicate| PeerAnswer::Accepted {
            peer_id: "dlv_peer".into(),
            duplicate,
        };
        let stored = json!({"id": "dlv_peer", "event_id": "evt_1", "status": "pending"});
        assert_eq!(classify_one(202, stored), accepted(false));
        let dup = json!({"id": "dlv_peer", "event_id": "evt_1", "status": "delivered", "duplicate": true});
        assert_eq!(classify_one(202, dup), accepted(true));
        for (status, body) in [
            (202, json!({"id": "dlv_peer", "event_id": "evt_OTHER"})),
            (202, json!({"event_id": "evt_1"})),
            (200, json!({"id": "dlv_peer", "event_id": "evt_1"})),
            (200, serde_json::Value::Null),
            (302, serde_json::Value::Null),
            (404, serde_json::Value::Null),
        ] {
            assert!(
                matches!(classify_one(status, body.clone()), PeerAnswer::Stop(_)),
                "{status} {body}"
            );
        }
        let myself = json!({"id": "dlv_own", "event_id": "evt_1", "duplicate": true});
        assert!(matches!(classify_one(202, myself), PeerAnswer::Stop(e) if e.contains("own delivery id")));
    }

    #[test]
    fn busy_peers_are_retried_wrong_settings_stop_and_one_message_can_be_refused() {
        use serde_json::json;
        let err = |code: &str| json!({"error": code, "message": "m"});
        for status in [408, 429, 500, 502, 503, 504] {
            assert!(
                matches!(classify_one(status, err("shutting_down")), PeerAnswer::Retry(_)),
                "{status}"
            );
        }
        for e in [
            TransportError::Network("connection refused".into()),
            TransportError::Timeout("no answer".into()),
        ] {
            assert!(matches!(classify("d", "e", None, &Err(e)), PeerAnswer::Retry(_)));
        }
        assert!(matches!(
            classify("d", "e", None, &Err(TransportError::EgressDenied("x".into()))),
            PeerAnswer::Stop(e) if e.contains("[drain] peers")
        ));
        assert!(matches!(classify_one(401, err("unauthorized")), PeerAnswer::Stop(e) if e.contains("[drain] token")));
        assert!(
            matches!(classify_one(421, err("misdirected_request")), PeerAnswer::Stop(e) if e.contains("[ingress] hosts"))
        );
        for (status, code) in [
            (413, "body_too_large"),
            (400, "unknown_signing_key"),
            (403, "egress_denied"),
        ] {
            assert_eq!(
                classify_one(status, err(code)),
                PeerAnswer::Refused(Refusal {
                    seq: 0,
                    id: "dlv_own".into(),
                    event_id: "evt_1".into(),
                    status,
                    code: code.into(),
                    message: "m".into()
                })
            );
        }
    }

    #[test]
    fn with_a_token_only_a_202_with_the_peers_receipt_counts() {
        use serde_json::json;
        let stored = || answer(202, json!({"id": "dlv_peer", "event_id": "evt_1", "status": "pending"}));
        let with = |receipt: Option<String>| {
            let mut a = stored();
            a.as_mut().unwrap().receipt = receipt;
            classify("dlv_own", "evt_1", Some(b"tier-token"), &a)
        };
        let good = crate::signing::receipt::receipt(b"tier-token", "evt_1", "dlv_peer");
        assert!(matches!(
            with(Some(good)),
            PeerAnswer::Accepted { duplicate: false, .. }
        ));
        for bad in [
            None,
            Some(crate::signing::receipt::receipt(b"other-token", "evt_1", "dlv_peer")),
            Some(crate::signing::receipt::receipt(b"tier-token", "evt_1", "dlv_x")),
            Some("00".repeat(32)),
        ] {
            assert!(
                matches!(with(bad.clone()), PeerAnswer::Stop(e) if e.contains("no valid Courier-Receipt")),
                "{bad:?}"
            );
        }
        // Without a token an https peer's 202 is believed as it is.
        assert!(matches!(
            classify("dlv_own", "evt_1", None, &stored()),
            PeerAnswer::Accepted { .. }
        ));
    }

    #[test]
    fn the_peers_text_is_cleaned_and_cut() {
        let hostile = format!("\x1b[2J\x1b]0;owned\x07fine\u{202E}{}", "x".repeat(5_000));
        let body = serde_json::json!({"error": "bad\r\ncode", "message": hostile});
        match classify_one(413, body) {
            PeerAnswer::Refused(Refusal { code, message, .. }) => {
                assert_eq!(code, "badcode");
                assert!(message.starts_with("[2J]0;ownedfinexxx"), "{message:?}");
                assert_eq!(message.chars().count(), PEER_TEXT_CHARS);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn retries_wait_longer_each_time_within_bounds() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for (tries, base_ms) in [
            (1, 250),
            (2, 500),
            (3, 1_000),
            (5, 4_000),
            (6, 8_000),
            (7, 8_000),
            (60, 8_000),
        ] {
            for _ in 0..50 {
                let d = RETRY.delay(tries, crate::model::Jitter::Equal, &mut rng).as_millis() as u64;
                assert!((base_ms / 2..=base_ms).contains(&d), "try {tries}: {d} ms");
            }
        }
        // The whole patience for one message, at most: the sum of the bases.
        let most: u64 = (1..MAX_TRIES)
            .map(|t| 250u64 << (t - 1).min(5))
            .map(|b| b.min(8_000))
            .sum();
        assert_eq!(most, 250 + 500 + 1_000 + 2_000 + 4_000 + 8_000 + 8_000);
    }
}
