//! `Courier-Receipt`: a courier's proof that it stored a message, on its ingress's 202.
//!
//! A courier with `ingress_token` set answers each accept (new or duplicate) with
//! `Courier-Receipt: <hex of HMAC-SHA256(ingress_token, "courier-receipt.v1\n<event id>\n<delivery id>")>`.
//! A drain with `[drain] token` set (the peer's `ingress_token`) marks a message handed off
//! only on a receipt it can check for its event id and the peer's delivery id: a listener
//! that merely echoes the event id in a 202 cannot make it. Pure.

use subtle::ConstantTimeEq;

/// The header.
pub const HEADER: &str = "courier-receipt";

/// The receipt for the message with `event_id`, stored as `delivery_id` by the courier whose
/// `ingress_token` is `token`.
pub fn receipt(token: &[u8], event_id: &str, delivery_id: &str) -> String {
    let content = format!("courier-receipt.v1\n{event_id}\n{delivery_id}");
    hex::encode(super::hmac_sha256(token, &[content.as_bytes()]))
}

/// Whether `given` is the [`receipt`] for these ids under `token` (compared in constant time).
pub fn verify(token: &[u8], event_id: &str, delivery_id: &str, given: &str) -> bool {
    receipt(token, event_id, delivery_id)
        .as_bytes()
        .ct_eq(given.as_bytes())
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receipt_binds_the_token_the_event_and_the_delivery() {
        // printf 'courier-receipt.v1\nevt_1\ndlv_peer' | openssl dgst -sha256 -hmac tier-token
        let r = receipt(b"tier-token", "evt_1", "dlv_peer");
        assert_eq!(r, "4540a5862cf39122b5dd6e427beaf4dae02861e3aa27d4f0886e2a5597843435");
        assert!(verify(b"tier-token", "evt_1", "dlv_peer", &r));
        assert!(!verify(b"other-token", "evt_1", "dlv_peer", &r));
        assert!(!verify(b"tier-token", "evt_2", "dlv_peer", &r));
        assert!(!verify(b"tier-token", "evt_1", "dlv_other", &r));
        assert!(!verify(b"tier-token", "evt_1", "dlv_peer", &r.to_uppercase()));
        assert!(!verify(b"tier-token", "evt_1", "dlv_peer", &r[..63]));
        assert!(!verify(b"tier-token", "evt_1", "dlv_peer", ""));
    }
}
