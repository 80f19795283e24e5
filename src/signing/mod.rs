//! Signing of outbound attempts (CONTRACT §4), fresh on every attempt.
//!
//! [`sign`] turns a scheme, the message's secrets, its event id, the attempt's timestamp and
//! the body into the headers to add; the per-scheme algorithms live in [`standard`],
//! [`ed25519`], [`stripe`] and [`github`] as pure functions. Secrets travel as [`Secret`],
//! which never prints its value, so a stray `{:?}` in a log line cannot leak one.
//!
//! The standard scheme picks the algorithm per secret from its prefix: a `whsec_` (or bare
//! base64) secret gives an HMAC `v1,` entry, a `whsk_` key an Ed25519 `v1a,` entry, so one
//! rotation list may mix them and a receiver migrating to public keys sees both.
//!
//! [`receipt`] is the other way round: the proof a courier's ingress gives that it stored a
//! message, which a drain checks before it marks the message handed off.

pub mod ed25519;
pub mod github;
pub mod receipt;
pub mod scope;
pub mod standard;
pub mod stripe;

use std::borrow::Cow;
use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::model::SignatureScheme;

/// The event id header, sent with every scheme.
pub const WEBHOOK_ID: &str = "webhook-id";
/// The attempt timestamp header (unix seconds), sent with every scheme.
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// The Standard Webhooks signature header.
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";
/// The Stripe signature header.
pub const STRIPE_SIGNATURE: &str = "stripe-signature";
/// The GitHub signature header.
pub const HUB_SIGNATURE_256: &str = "x-hub-signature-256";

/// A signing secret or token. Its `Debug` and `Display` print `Secret(***)`, never the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    /// The secret value itself; only for computing signatures or comparing tokens.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Secret {
        Secret(value)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// A secret that cannot sign with its scheme. The message never contains the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigningError {
    /// The secret does not have the shape its scheme requires.
    #[error("invalid signing secret for scheme {scheme}: {expected}")]
    InvalidSecret {
        /// The scheme's name (`standard`, `stripe`, `github`).
        scheme: &'static str,
        /// What the scheme expects instead.
        expected: &'static str,
    },
    /// An Ed25519 (`whsk_`) key chosen with a scheme that has only HMAC signatures.
    #[error(
        "an Ed25519 (whsk_) key cannot sign with scheme {scheme}: only the standard scheme has \
         asymmetric (v1a) signatures"
    )]
    SchemeMismatch {
        /// The HMAC-only scheme's name (`stripe`, `github`).
        scheme: &'static str,
    },
}

impl SigningError {
    /// The machine-readable error code for HTTP answers.
    pub fn code(&self) -> &'static str {
        match self {
            SigningError::InvalidSecret { .. } => "invalid_signing_secret",
            SigningError::SchemeMismatch { .. } => "signing_scheme_mismatch",
        }
    }
}

/// Checks that `secret` can sign with `scheme`: `standard` needs `whsec_` followed by standard
/// base64 (padding optional; the prefix may be omitted, as svix allows) of a non-empty key,
/// or an Ed25519 key `whsk_` followed by the base64 of its 32-byte seed; `stripe` and
/// `github` need a non-empty string that is not a `whsk_` key (they are HMAC only); `none`
/// accepts anything.
pub fn validate_secret(scheme: SignatureScheme, secret: &str) -> Result<(), SigningError> {
    decode(scheme, secret).map(drop)
}

/// A secret made into the key it signs with.
enum Key<'a> {
    /// An HMAC key: a `whsec_` secret's bytes (standard), or the secret as it is.
    Hmac(Cow<'a, [u8]>),
    /// A `whsk_` key (standard only).
    Ed25519(ed25519_dalek::SigningKey),
}

/// The key `secret` signs with under `scheme` (see [`validate_secret`]).
fn decode(scheme: SignatureScheme, secret: &str) -> Result<Key<'_>, SigningError> {
    let invalid = |expected| SigningError::InvalidSecret {
        scheme: scheme.as_str(),
        expected,
    };
    let asymmetric = ed25519::is_secret(secret);
    match scheme {
        SignatureScheme::Standard if asymmetric => ed25519::decode_secret(secret)
            .map(Key::Ed25519)
            .ok_or_else(|| invalid("expected whsk_ followed by the base64 of a 32-byte Ed25519 seed")),
        SignatureScheme::Standard => standard::decode_secret(secret)
            .map(|key| Key::Hmac(key.into()))
            .ok_or_else(|| invalid("expected whsec_ followed by the base64 of a non-empty key")),
        SignatureScheme::Stripe | SignatureScheme::Github if asymmetric => Err(SigningError::SchemeMismatch {
            scheme: scheme.as_str(),
        }),
        SignatureScheme::Stripe | SignatureScheme::Github if secret.is_empty() => {
            Err(invalid("expected a non-empty secret"))
        }
        _ => Ok(Key::Hmac(secret.as_bytes().into())),
    }
}

/// Checks that no secret of a configured list (the defaults or a named key) is an Ed25519
/// key when `scheme` is HMAC only. Ingress calls this for the scheme a message chose: the
/// config check cannot know that a caller will pick `stripe` with `Courier-Signature-Scheme`,
/// and without it such a message would be stored and then fail to sign on every attempt.
pub fn check_scheme(scheme: SignatureScheme, secrets: &[Secret]) -> Result<(), SigningError> {
    let hmac_only = matches!(scheme, SignatureScheme::Stripe | SignatureScheme::Github);
    if hmac_only && secrets.iter().any(|s| ed25519::is_secret(s.expose())) {
        return Err(SigningError::SchemeMismatch {
            scheme: scheme.as_str(),
        });
    }
    Ok(())
}

/// The headers `scheme` writes (lowercase names), so the outbound filter can drop stale copies
/// the app sent. `webhook-id` and `webhook-timestamp` are written by every scheme.
pub fn signature_headers(scheme: SignatureScheme) -> &'static [&'static str] {
    match scheme {
        SignatureScheme::Standard => &[WEBHOOK_ID, WEBHOOK_TIMESTAMP, WEBHOOK_SIGNATURE],
        SignatureScheme::Stripe => &[WEBHOOK_ID, WEBHOOK_TIMESTAMP, STRIPE_SIGNATURE],
        SignatureScheme::Github => &[WEBHOOK_ID, WEBHOOK_TIMESTAMP, HUB_SIGNATURE_256],
        SignatureScheme::None => &[WEBHOOK_ID, WEBHOOK_TIMESTAMP],
    }
}

/// The headers to add to one attempt (lowercase names): always `webhook-id` and
/// `webhook-timestamp` (unix seconds), plus the scheme's signature header when there is at
/// least one secret. Every secret signs (rotation), in the order given, except with `github`,
/// whose header carries one signature: the first secret signs. With `standard`, `whsk_`
/// keys give `v1a,` entries and the others `v1,` entries in the same header.
pub fn sign(
    scheme: SignatureScheme,
    secrets: &[Secret],
    event_id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<Vec<(&'static str, String)>, SigningError> {
    let mut headers = vec![
        (WEBHOOK_ID, event_id.to_string()),
        (WEBHOOK_TIMESTAMP, timestamp.to_string()),
    ];
    // The scheme's signature header, after the two every scheme writes.
    let Some(&header) = signature_headers(scheme).get(2).filter(|_| !secrets.is_empty()) else {
        return Ok(headers);
    };
    // Ed25519 signs one contiguous buffer: build it once, and only if a key needs it.
    let mut content = None;
    let mut entries = Vec::with_capacity(secrets.len());
    // Every secret is checked (once per attempt: an Ed25519 seed's decoding derives its
    // key), even those that do not sign.
    for secret in secrets {
        let entry = match decode(scheme, secret.expose())? {
            Key::Ed25519(key) => {
                let content = content.get_or_insert_with(|| standard::signed_content(event_id, timestamp, body));
                ed25519::sign(&key, content)
            }
            Key::Hmac(key) => match scheme {
                SignatureScheme::Standard => standard::sign(&key, event_id, timestamp, body),
                SignatureScheme::Stripe => stripe::sign(&key, timestamp, body),
                _ if entries.is_empty() => github::sign(&key, body),
                _ => continue,
            },
        };
        entries.push(entry);
    }
    let value = match scheme {
        SignatureScheme::Stripe => format!("t={timestamp},{}", entries.join(",")),
        // One key (as nearly always): its entry is the value.
        _ if entries.len() == 1 => entries.pop().unwrap_or_default(),
        _ => entries.join(" "),
    };
    headers.push((header, value));
    Ok(headers)
}

/// HMAC-SHA256 of the concatenation of `parts` under `key`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC accepts keys of any length, so the error branch is unreachable; an all-zero
    // result would fail verification loudly rather than panic a worker.
    let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(key) else {
        return [0; 32];
    };
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_Y291cmllciBrbm93bi1hbnN3ZXIga2V5IAABAv8=";
    const SECRET_2: &str = "whsec_c2Vjb25kIGtleSBmb3Igcm90YXRpb24=";
    const EVENT_ID: &str = "msg_01HZX3Y4K5M6N7P8Q9R0S1T2V3";
    const TS: i64 = 1_700_000_000;
    const BODY: &[u8] = br#"{"type":"invoice.paid","amount":4200}"#;
    // Known answers computed with Python's hmac module (see the scheme modules).
    const STD_1: &str = "v1,UptMViLbWgM8n2A8z5BBl3ErAaIXfyAOy9RxrWI9FnU=";
    const STD_2: &str = "v1,MPSYyoqNhweNGwbAolWKB2GsXaDpZLBRO274N5w1hfU=";
    const STRIPE_1: &str = "ca4324d716bb4ca8881350fc81a5633bbb86273b725c4b84e7f98cfb1aa1d195";
    const STRIPE_2: &str = "c05113adc438d64a05f448c6ddcf5553a0b7ea1644b744601c1d1a3f03ca9e85";
    const GITHUB: &str = "d677c39b83f630c79be91ee9ff92052eab168d765a46c797926d285a3376c937";
    // An Ed25519 key and its known answer over the same fixtures (see `ed25519`'s tests).
    const ED_SECRET: &str = "whsk_Y291cmllciBlZDI1NTE5IGtub3duLWFuc3dlciBrZXk=";
    const ED_1: &str = "v1a,vVm8+H7U4ZjdVnMvoC1yYTc/nE0YVvexEaRJ5/FIVIu64OWwqadELvgUStuPdCdSQF+eJW4p37crCZqp8gqCCQ==";

    fn secrets(values: &[&str]) -> Vec<Secret> {
        values.iter().map(|v| Secret::new(v.to_string())).collect()
    }

    type Headers = Vec<(&'static str, String)>;

    fn ids() -> Headers {
        vec![(WEBHOOK_ID, EVENT_ID.to_string()), (WEBHOOK_TIMESTAMP, TS.to_string())]
    }

    fn with(extra: (&'static str, &str)) -> Headers {
        let mut h = ids();
        h.push((extra.0, extra.1.to_string()));
        h
    }

    #[test]
    fn headers_per_scheme() {
        use SignatureScheme as S;
        let stripe_1 = format!("t={TS},v1={STRIPE_1}");
        let stripe_2 = format!("t={TS},v1={STRIPE_1},v1={STRIPE_2}");
        let github = format!("sha256={GITHUB}");
        let std_2 = format!("{STD_1} {STD_2}");
        // A mixed rotation list: one header, one entry per secret, in the configured order.
        let mixed = format!("{ED_1} {STD_1}");
        let mixed_2 = format!("{STD_1} {ED_1} {STD_2}");
        let table: Vec<(S, Vec<&str>, Headers)> = vec![
            (S::Standard, vec![SECRET], with((WEBHOOK_SIGNATURE, STD_1))),
            (S::Standard, vec![SECRET, SECRET_2], with((WEBHOOK_SIGNATURE, &std_2))),
            (S::Standard, vec![], ids()),
            (S::Standard, vec![ED_SECRET], with((WEBHOOK_SIGNATURE, ED_1))),
            (S::Standard, vec![ED_SECRET, SECRET], with((WEBHOOK_SIGNATURE, &mixed))),
            (
                S::Standard,
                vec![SECRET, ED_SECRET, SECRET_2],
                with((WEBHOOK_SIGNATURE, &mixed_2)),
            ),
            (S::None, vec![ED_SECRET], ids()),
            (
                S::Stripe,
                vec!["sk_test_stripe_secret_\u{e9}"],
                with((STRIPE_SIGNATURE, &stripe_1)),
            ),
            (
                S::Stripe,
                vec!["sk_test_stripe_secret_\u{e9}", "whsec_stripe_old"],
                with((STRIPE_SIGNATURE, &stripe_2)),
            ),
            (S::Stripe, vec![], ids()),
            (
                S::Github,
                vec!["It's a Secret to Everybody"],
                with((HUB_SIGNATURE_256, &github)),
            ),
            (
                S::Github,
                vec!["It's a Secret to Everybody", "other"],
                with((HUB_SIGNATURE_256, &github)),
            ),
            (S::Github, vec![], ids()),
            (S::None, vec![SECRET], ids()),
            (S::None, vec!["anything at all", ""], ids()),
            (S::None, vec![], ids()),
        ];
        for (scheme, values, want) in table {
            let got = sign(scheme, &secrets(&values), EVENT_ID, TS, BODY);
            assert_eq!(got, Ok(want), "{scheme:?} with {} secrets", values.len());
        }
    }

    #[test]
    fn negative_and_zero_timestamps_are_written_as_given() {
        let got = sign(SignatureScheme::None, &[], "e", 0, b"").unwrap();
        assert_eq!(got[1], (WEBHOOK_TIMESTAMP, "0".to_string()));
    }

    #[test]
    fn invalid_secrets_fail_without_revealing_them() {
        use SignatureScheme as S;
        let table = [
            (S::Standard, "whsec_not*base64*secret"),
            (S::Standard, "whsec_"),
            (S::Standard, ""),
            (S::Standard, "whsk_not*base64*secret"),
            (S::Standard, "whsk_c2hvcnQ="),
            (S::Stripe, ""),
            (S::Github, ""),
        ];
        for (scheme, bad) in table {
            let err = sign(scheme, &secrets(&[SECRET, bad]), EVENT_ID, TS, BODY).unwrap_err();
            assert_eq!(err.code(), "invalid_signing_secret");
            let message = err.to_string();
            assert!(message.contains(scheme.as_str()), "{message}");
            // Only the bare prefix may show up (it is part of the hint), never a secret's body.
            assert!(bad.len() <= "whsec_".len() || !message.contains(bad), "{message}");
            assert!(!message.contains("not*base64"), "{message}");
            assert_eq!(validate_secret(scheme, bad), Err(err));
        }
    }

    #[test]
    fn secret_validation_table() {
        use SignatureScheme as S;
        let table = [
            (S::Standard, SECRET, true),
            (S::Standard, "Y291cmllciBrbm93bi1hbnN3ZXIga2V5IAABAv8=", true),
            (S::Standard, "whsec_YQ", true),
            (S::Standard, "whsec_YQ==", true),
            (S::Standard, "whsec_", false),
            (S::Standard, "whsec_????", false),
            (S::Standard, "plain text secret", false),
            (S::Standard, "", false),
            (S::Standard, ED_SECRET, true),
            (S::Standard, "whsk_Y291cmllciBlZDI1NTE5IGtub3duLWFuc3dlciBrZXk", true),
            (S::Standard, "whsk_c2hvcnQ=", false),
            (S::Standard, "whsk_", false),
            (S::Stripe, ED_SECRET, false),
            (S::Github, ED_SECRET, false),
            (S::Github, "whsk_anything", false),
            (S::None, ED_SECRET, true),
            (S::Stripe, "whsec_anything", true),
            (S::Stripe, "x", true),
            (S::Stripe, "", false),
            (S::Github, "It's a Secret to Everybody", true),
            (S::Github, "", false),
            (S::None, "", true),
            (S::None, "whsec_????", true),
        ];
        for (scheme, secret, ok) in table {
            assert_eq!(validate_secret(scheme, secret).is_ok(), ok, "{scheme:?} {secret:?}");
        }
    }

    #[test]
    fn ed25519_keys_are_refused_by_hmac_only_schemes() {
        use SignatureScheme as S;
        for scheme in [S::Stripe, S::Github] {
            let err = sign(scheme, &secrets(&["hmac", ED_SECRET]), EVENT_ID, TS, BODY).unwrap_err();
            assert_eq!(err.code(), "signing_scheme_mismatch");
            assert!(err.to_string().contains(scheme.as_str()), "{err}");
            assert!(!err.to_string().contains(&ED_SECRET[5..]), "{err}");
            assert_eq!(check_scheme(scheme, &secrets(&["hmac", ED_SECRET])), Err(err));
            assert_eq!(check_scheme(scheme, &secrets(&["hmac", SECRET])), Ok(()));
        }
        for scheme in [S::Standard, S::None] {
            assert_eq!(check_scheme(scheme, &secrets(&[ED_SECRET, SECRET])), Ok(()));
        }
    }

    #[test]
    fn signature_headers_cover_every_header_sign_writes() {
        use SignatureScheme as S;
        for (scheme, secret) in [
            (S::Standard, SECRET),
            (S::Stripe, "s"),
            (S::Github, "s"),
            (S::None, "s"),
        ] {
            let written = sign(scheme, &secrets(&[secret]), EVENT_ID, TS, BODY).unwrap();
            let names: Vec<&str> = written.iter().map(|(name, _)| *name).collect();
            assert_eq!(names, signature_headers(scheme), "{scheme:?}");
            assert!(names.iter().all(|n| n.bytes().all(|b| !b.is_ascii_uppercase())));
        }
    }

    #[test]
    fn secrets_never_print() {
        let secret = Secret::new("whsec_topsecret".to_string());
        assert_eq!(format!("{secret:?}"), "Secret(***)");
        assert_eq!(format!("{secret}"), "Secret(***)");
        assert_eq!(format!("{:?}", vec![secret.clone()]), "[Secret(***)]");
        assert_eq!(secret.expose(), "whsec_topsecret");
        assert_eq!(Secret::from("whsec_topsecret".to_string()), secret);
    }
}
