//! Ed25519 signatures of the Standard Webhooks spec (`v1a`): the asymmetric twin of
//! [`super::standard`]. The signed content is the same `<id>.<timestamp>.<body>`; the entry
//! is `v1a,<base64 of the 64-byte signature>`, so one `webhook-signature` header can carry
//! `v1,` and `v1a,` entries side by side during a migration.
//!
//! Key encoding. The spec says only "standard ed25519 key pair, base64 encoded, prefixed
//! with `whsk_` for the secret key, and `whpk_` for the public key". Its reference Go library
//! (`libraries/go/webhook_asymmetric.go` in standard-webhooks/standard-webhooks) settles the
//! bytes: the secret is `ed25519.NewKeyFromSeed(base64(...))`, i.e. the **32-byte seed**
//! (RFC 8032's private key), and the public key is the 32-byte point, both in standard
//! base64 with padding. courier writes exactly that. When reading a secret it also accepts
//! the 64-byte `seed ‖ public key` form that libsodium, PyNaCl's `SigningKey._signing_key`
//! and Go's `ed25519.PrivateKey` hold, but only when the public half belongs to the seed:
//! a pasted pair whose halves disagree is refused instead of signing with a key the
//! receivers do not expect. Unlike `whsec_`, the prefix is required: bare base64 already
//! means an HMAC secret, and the prefix is what makes a secret asymmetric.
//!
//! Pure: no I/O, no randomness (`courier keys generate` draws the seed and calls
//! [`encode_secret`]).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ed25519_dalek::{Signer as _, SigningKey};

/// The prefix of an Ed25519 secret key.
pub const SECRET_PREFIX: &str = "whsk_";
/// The prefix of an Ed25519 public key.
pub const PUBLIC_PREFIX: &str = "whpk_";
/// The signature identifier of Ed25519 entries in `webhook-signature`.
pub const VERSION: &str = "v1a";

/// Whether `secret` is meant as an Ed25519 key (it has the `whsk_` prefix), valid or not.
/// Used to route a secret to this module and to refuse it with HMAC-only schemes.
pub fn is_secret(secret: &str) -> bool {
    secret.starts_with(SECRET_PREFIX)
}

/// The signing key of `whsk_<base64>`: a 32-byte seed, or 64 bytes of seed and its own
/// public key. `None` for anything else (no prefix, bad base64, wrong length, halves that
/// disagree).
pub fn decode_secret(secret: &str) -> Option<SigningKey> {
    let encoded = secret.strip_prefix(SECRET_PREFIX)?;
    let bytes = super::standard::LENIENT_BASE64.decode(encoded).ok()?;
    if let Ok(seed) = <[u8; 32]>::try_from(bytes.as_slice()) {
        return Some(SigningKey::from_bytes(&seed));
    }
    let pair = <[u8; 64]>::try_from(bytes.as_slice()).ok()?;
    // Checks that the second half is the seed's public key.
    SigningKey::from_keypair_bytes(&pair).ok()
}

/// `whsk_<base64 of seed>`, the form courier generates and the reference libraries read.
pub fn encode_secret(seed: &[u8; 32]) -> String {
    format!("{SECRET_PREFIX}{}", STANDARD.encode(seed))
}

/// The `whpk_<base64>` public key of a `whsk_` secret, or `None` when it is not a valid one.
pub fn public_key(secret: &str) -> Option<String> {
    let key = decode_secret(secret)?.verifying_key();
    Some(format!("{PUBLIC_PREFIX}{}", STANDARD.encode(key.as_bytes())))
}

/// The public key of `whpk_<base64>`: `None` unless it is 32 bytes that decode to a curve
/// point. For the tests' receivers; courier itself only signs.
#[cfg(test)]
pub fn decode_public(public: &str) -> Option<ed25519_dalek::VerifyingKey> {
    let encoded = public.strip_prefix(PUBLIC_PREFIX)?;
    let bytes = super::standard::LENIENT_BASE64.decode(encoded).ok()?;
    ed25519_dalek::VerifyingKey::from_bytes(&<[u8; 32]>::try_from(bytes.as_slice()).ok()?).ok()
}

/// One signature entry, `v1a,<base64>`, over `content` (from
/// [`super::standard::signed_content`]). Ed25519 is deterministic: the same key and content
/// always give the same signature, which is what makes the known-answer tests possible.
pub fn sign(key: &SigningKey, content: &[u8]) -> String {
    format!("{VERSION},{}", STANDARD.encode(key.sign(content).to_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signing::standard::signed_content;

    // Known answer from the spec's reference Go library
    // (libraries/go/webhook_asymmetric_test.go, TestAsymmetricWebhookSign): the secret is
    // the base64 of the 32-byte seed "TESTSIGNINGKEYDONOTUSETHISFORANY". The public key was
    // computed independently with Python `cryptography` (Ed25519PrivateKey.from_private_bytes),
    // which also reproduces the signature.
    const GO_SEED_B64: &str = "VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk=";
    const GO_PUBLIC: &str = "whpk_ZlN4eg7dSSqi0moX9hQUk3orrOouK3QVQSlJa248c/g=";
    const GO_SIGNATURE: &str =
        "v1a,tQ9V2XOqn7jL/DQenEFpqIugdBVtiMmER5mhSkXBNwM0mkATuDe6KYYUuxqtaiHeYGb7KaaBRdM5WqyeFiL8Ag==";

    // courier's own known answer, made with Python `cryptography` over the same fixtures as
    // the HMAC known answers in `signing::tests`.
    const SECRET: &str = "whsk_Y291cmllciBlZDI1NTE5IGtub3duLWFuc3dlciBrZXk=";
    const PUBLIC: &str = "whpk_SgxHe1+cbw9OFG7edwgundcRpId0LhJMbVzadLmMNiU=";
    const EVENT_ID: &str = "msg_01HZX3Y4K5M6N7P8Q9R0S1T2V3";
    const TS: i64 = 1_700_000_000;
    const BODY: &[u8] = br#"{"type":"invoice.paid","amount":4200}"#;
    const SIGNATURE: &str =
        "v1a,vVm8+H7U4ZjdVnMvoC1yYTc/nE0YVvexEaRJ5/FIVIu64OWwqadELvgUStuPdCdSQF+eJW4p37crCZqp8gqCCQ==";

    fn unhex(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    #[test]
    fn reference_library_known_answer() {
        let secret = format!("{SECRET_PREFIX}{GO_SEED_B64}");
        let key = decode_secret(&secret).unwrap();
        let content = signed_content(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sign(&key, &content), GO_SIGNATURE);
        assert_eq!(public_key(&secret).as_deref(), Some(GO_PUBLIC));
    }

    #[test]
    fn courier_known_answer() {
        let key = decode_secret(SECRET).unwrap();
        assert_eq!(key.to_bytes(), *b"courier ed25519 known-answer key");
        assert_eq!(sign(&key, &signed_content(EVENT_ID, TS, BODY)), SIGNATURE);
        assert_eq!(public_key(SECRET).as_deref(), Some(PUBLIC));
        assert_eq!(encode_secret(&key.to_bytes()), SECRET);
    }

    #[test]
    fn rfc8032_test_vector_1() {
        // RFC 8032 §7.1, TEST 1: the empty message.
        let seed: [u8; 32] = unhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
            .try_into()
            .unwrap();
        let public = unhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a");
        let signature = unhex(concat!(
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555",
            "fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
        ));
        let key = decode_secret(&encode_secret(&seed)).unwrap();
        assert_eq!(key.verifying_key().as_bytes().as_slice(), public.as_slice());
        assert_eq!(sign(&key, b""), format!("v1a,{}", STANDARD.encode(&signature)));
    }

    #[test]
    fn signatures_verify_with_the_public_key_and_only_for_their_content() {
        let key = decode_secret(SECRET).unwrap();
        let public = decode_public(PUBLIC).unwrap();
        let content = signed_content(EVENT_ID, TS, BODY);
        let entry = sign(&key, &content);
        let bytes = STANDARD.decode(entry.strip_prefix("v1a,").unwrap()).unwrap();
        let signature = ed25519_dalek::Signature::from_slice(&bytes).unwrap();
        assert!(public.verify_strict(&content, &signature).is_ok());
        assert!(public
            .verify_strict(&signed_content(EVENT_ID, TS + 1, BODY), &signature)
            .is_err());
        assert!(public
            .verify_strict(&signed_content("msg_other", TS, BODY), &signature)
            .is_err());
        assert!(public
            .verify_strict(&signed_content(EVENT_ID, TS, b"{}"), &signature)
            .is_err());
    }

    #[test]
    fn secret_decoding() {
        let seed = *b"courier ed25519 known-answer key";
        let key = SigningKey::from_bytes(&seed);
        let mut pair = seed.to_vec();
        pair.extend_from_slice(key.verifying_key().as_bytes());
        let mut wrong_pair = pair.clone();
        wrong_pair[40] ^= 1;
        let b64 = |b: &[u8]| STANDARD.encode(b);
        let unpadded = SECRET.trim_end_matches('=').to_string();
        let table: Vec<(String, Option<[u8; 32]>)> = vec![
            (SECRET.to_string(), Some(seed)),
            (unpadded, Some(seed)),
            (format!("whsk_{}", b64(&pair)), Some(seed)),
            (format!("whsk_{}", b64(&wrong_pair)), None),
            (format!("whsk_{}", b64(&seed[..31])), None),
            (
                format!("whsk_{}", b64(&[seed.as_slice(), b"x".as_slice()].concat())),
                None,
            ),
            ("whsk_".to_string(), None),
            ("whsk_not*base64".to_string(), None),
            // The prefix is required: bare base64 is an HMAC secret.
            (b64(&seed), None),
            (format!("whsec_{}", b64(&seed)), None),
            (format!("WHSK_{}", b64(&seed)), None),
            (format!("whpk_{}", b64(&seed)), None),
        ];
        for (secret, want) in table {
            assert_eq!(decode_secret(&secret).map(|k| k.to_bytes()), want, "{secret:?}");
            assert_eq!(is_secret(&secret), secret.starts_with("whsk_"), "{secret:?}");
        }
    }

    #[test]
    fn public_key_decoding() {
        assert!(decode_public(PUBLIC).is_some());
        assert!(decode_public(PUBLIC.trim_end_matches('=')).is_some());
        assert!(decode_public(&PUBLIC[5..]).is_none(), "the prefix is required");
        assert!(decode_public(SECRET).is_none());
        assert!(decode_public("whpk_AAAA").is_none());
        assert!(public_key("whsec_c2VjcmV0").is_none());
    }
}
