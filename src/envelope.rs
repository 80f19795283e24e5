//! Building the first stored state of a message from what ingress (or courier itself,
//! for alerts) hands over. Pure: time and randomness come from the caller.

use std::time::Duration;

use crate::model::{self, SignatureScheme, State};
use crate::store::{MessageRecord, NewMessage, Payload, SigningChoice};

/// Everything needed to accept one message.
#[derive(Debug, Clone)]
pub struct Envelope {
    /// Where it goes.
    pub target: url::Url,
    /// Endpoint key override (`Courier-Endpoint`); default: the target without its query.
    pub endpoint: Option<String>,
    /// The `[[route]]` it was accepted through, if any: its policy applies at each attempt.
    pub route: Option<String>,
    /// Event id from `webhook-id` / `Idempotency-Key`; default: a new `msg_<ULID>`.
    pub event_id: Option<String>,
    /// HTTP method.
    pub method: String,
    /// Headers to forward.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Body.
    pub body: Vec<u8>,
    /// Signature scheme chosen for this message, if any.
    pub scheme: Option<SignatureScheme>,
    /// Where the signing secrets come from.
    pub signing: SigningChoice,
    /// Give-up by attempts (resolved by the caller: header, endpoint, route, `[retry]`).
    pub max_attempts: u32,
    /// Give-up by time, from acceptance (resolved likewise).
    pub give_up_after: Duration,
}

impl Envelope {
    /// The new message, pending and due at once, its id the next of `ids`.
    pub fn into_message(self, now_ms: u64, rng: &mut impl rand::RngCore, ids: &model::IdSeq) -> NewMessage {
        let id = ids.next_delivery_id(now_ms, rng);
        let event_id = self.event_id.unwrap_or_else(|| model::event_id_for(&id));
        let endpoint = self
            .endpoint
            .unwrap_or_else(|| crate::target::default_endpoint_key(&self.target));
        let host = crate::target::host_key(&self.target);
        let record = MessageRecord {
            id,
            event_id,
            target: self.target.into(),
            endpoint,
            host,
            route: self.route,
            state: State::Pending,
            attempts: 0,
            history_len: 0,
            max_attempts: self.max_attempts,
            accepted_at_ms: now_ms,
            next_attempt_at_ms: now_ms,
            give_up_at_ms: now_ms.saturating_add(self.give_up_after.as_millis() as u64),
            finished_at_ms: 0,
            dead_reason: None,
            last_status: None,
            last_error: None,
            fifo: None,
            last_attempt: None,
        };
        let payload = Payload {
            method: self.method,
            headers: self.headers,
            body: self.body,
            scheme: self.scheme,
            signing: self.signing,
        };
        NewMessage { record, payload }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_new_message_is_pending_and_due_at_acceptance() {
        let env = Envelope {
            target: url::Url::parse("https://r.example/hooks?x=1").unwrap(),
            endpoint: None,
            route: None,
            event_id: None,
            method: "POST".into(),
            headers: vec![],
            body: b"{}".to_vec(),
            scheme: None,
            signing: SigningChoice::Default,
            max_attempts: 16,
            give_up_after: Duration::from_secs(10),
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let m = env.into_message(5_000, &mut rng, &model::IdSeq::default());
        assert_eq!(m.record.state, State::Pending);
        assert_eq!(m.record.next_attempt_at_ms, 5_000);
        assert_eq!(m.record.give_up_at_ms, 15_000);
        assert_eq!(m.record.endpoint, "https://r.example/hooks");
        assert_eq!(m.record.host, "r.example:443");
        assert!(m.record.id.starts_with("dlv_"));
        assert_eq!(
            m.record.event_id,
            format!("msg_{}", &m.record.id[4..]),
            "the delivery id's ULID"
        );
        assert!(crate::model::own_event_id(&m.record.id, &m.record.event_id));
    }
}
