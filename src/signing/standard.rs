//! Standard Webhooks signatures (<https://www.standardwebhooks.com/>), as verified by the
//! `standardwebhooks` and `svix` libraries: `v1,<base64(HMAC-SHA256(key, "<id>.<ts>.<body>"))>`.
//! The asymmetric `v1a` entries over the same content live in [`super::ed25519`].

use base64::alphabet::STANDARD;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;

/// The prefix of a Standard Webhooks secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// Standard base64 that accepts secrets with or without `=` padding, as users paste both.
/// Shared with [`super::ed25519`] so `whsk_`/`whpk_` keys are read as leniently.
pub(super) const LENIENT_BASE64: GeneralPurpose = GeneralPurpose::new(
    &STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// The HMAC key of a secret: the base64 after `whsec_` (the prefix is optional, as in svix).
/// `None` when that is not valid base64 or decodes to an empty key.
pub fn decode_secret(secret: &str) -> Option<Vec<u8>> {
    let encoded = secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret);
    LENIENT_BASE64.decode(encoded).ok().filter(|key| !key.is_empty())
}

/// The content every Standard Webhooks signature covers: `<id>.<timestamp>.<body>`.
pub fn signed_content(event_id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
    [event_id.as_bytes(), b".", timestamp.to_string().as_bytes(), b".", body].concat()
}

/// One signature entry, `v1,<base64>`, for the decoded `key`.
pub fn sign(key: &[u8], event_id: &str, timestamp: i64, body: &[u8]) -> String {
    let timestamp = timestamp.to_string();
    let mac = super::hmac_sha256(key, &[event_id.as_bytes(), b".", timestamp.as_bytes(), b".", body]);
    format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected values computed independently with Python's hmac/hashlib/base64 from the
    // published algorithm, e.g.
    // python3 -c 'import hmac,hashlib,base64; k=base64.b64decode("Y291...v8=");
    //   print(base64.b64encode(hmac.new(k, b"msg_...." + b"1700000000." + body, hashlib.sha256).digest()))'
    // Also checked end to end: a `webhook-signature` header that `signing::sign` produced with
    // SECRET and SECRET_2 at a current timestamp was accepted by the `standardwebhooks` 1.1.0
    // Python package (`Webhook(secret).verify(body, headers)`) for each secret, and rejected
    // for another key.
    const SECRET: &str = "whsec_Y291cmllciBrbm93bi1hbnN3ZXIga2V5IAABAv8=";
    const SECRET_2: &str = "whsec_c2Vjb25kIGtleSBmb3Igcm90YXRpb24=";
    const EVENT_ID: &str = "msg_01HZX3Y4K5M6N7P8Q9R0S1T2V3";
    const TS: i64 = 1_700_000_000;
    const BODY: &[u8] = br#"{"type":"invoice.paid","amount":4200}"#;

    #[test]
    fn known_answers() {
        let key = decode_secret(SECRET).unwrap();
        assert_eq!(key, b"courier known-answer key \x00\x01\x02\xff");
        assert_eq!(
            sign(&key, EVENT_ID, TS, BODY),
            "v1,UptMViLbWgM8n2A8z5BBl3ErAaIXfyAOy9RxrWI9FnU="
        );
        assert_eq!(
            sign(&key, EVENT_ID, TS, b""),
            "v1,TjoMEHExHZBb8pkwp9W+mc493le0SHLLq8c6+T+KYiE="
        );
        let key2 = decode_secret(SECRET_2).unwrap();
        assert_eq!(
            sign(&key2, EVENT_ID, TS, BODY),
            "v1,MPSYyoqNhweNGwbAolWKB2GsXaDpZLBRO274N5w1hfU="
        );
    }

    #[test]
    fn signed_content_is_id_timestamp_body() {
        assert_eq!(signed_content("msg_1", 1_700_000_000, b"{}"), b"msg_1.1700000000.{}");
        assert_eq!(signed_content("e", -5, b""), b"e.-5.");
    }

    #[test]
    fn every_input_changes_the_signature() {
        let key = decode_secret(SECRET).unwrap();
        let base = sign(&key, EVENT_ID, TS, BODY);
        assert_ne!(sign(&key, "msg_other", TS, BODY), base);
        assert_ne!(sign(&key, EVENT_ID, TS + 1, BODY), base);
        assert_ne!(sign(&key, EVENT_ID, TS, b"{}"), base);
        assert_ne!(sign(b"other", EVENT_ID, TS, BODY), base);
    }

    #[test]
    fn secret_decoding() {
        let key = b"courier known-answer key \x00\x01\x02\xff".to_vec();
        let table: &[(&str, Option<Vec<u8>>)] = &[
            (SECRET, Some(key.clone())),
            ("Y291cmllciBrbm93bi1hbnN3ZXIga2V5IAABAv8=", Some(key.clone())),
            ("whsec_Y291cmllciBrbm93bi1hbnN3ZXIga2V5IAABAv8", Some(key.clone())),
            ("whsec_YQ==", Some(b"a".to_vec())),
            ("whsec_YQ", Some(b"a".to_vec())),
            ("whsec_", None),
            ("", None),
            ("whsec_not base64!", None),
            ("whsec_-_-_", None),
            ("whsec_Y", None),
            ("WHSEC_YQ==", None),
        ];
        for (secret, want) in table {
            assert_eq!(decode_secret(secret), *want, "{secret:?}");
        }
    }
}
