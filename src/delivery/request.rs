//! The HTTP side of one attempt: the request built from the stored message (a fresh
//! signature, the attempt's own trace span), and the receiver's error answer described for
//! operators with nothing the message sent echoed back.

use std::borrow::Cow;

use bytes::Bytes;

use crate::config::Config;
use crate::outbound::trace::TRACEPARENT;
use crate::outbound::transport::OutboundRequest;
use crate::signing::{self, Secret};
use crate::store::{MessageRecord, Payload, SigningChoice};

/// Why an attempt could not even be built. Courier's (or its operator's) failure, never
/// the receiver's: no attempt is counted.
#[derive(Debug, thiserror::Error)]
pub(super) enum BuildError {
    #[error("signing key {0:?} is not in the config")]
    MissingKey(String),
    #[error("signing key {0:?} may not sign for this target (its targets in [signing.keys] exclude it)")]
    KeyNotAllowed(String),
    #[error("{0}")]
    Signing(#[from] signing::SigningError),
    #[error("stored target is not a URL: {0}")]
    Target(String),
    #[error("{0}")]
    Alert(#[from] super::alert::Unresolved),
    #[error("stored method is invalid")]
    Method,
}

/// The secrets a message signs with. A named key's targets are checked again here, at
/// every attempt, not only at ingress: a message accepted before the key was bound (or
/// before its binding was narrowed) must not be signed for a target now outside it.
fn secrets_for<'a>(config: &'a Config, choice: &SigningChoice, target: &str) -> Result<Cow<'a, [Secret]>, BuildError> {
    Ok(match choice {
        SigningChoice::Default => Cow::Borrowed(&config.signing.secrets),
        SigningChoice::Key(name) => {
            let key = config
                .signing
                .keys
                .get(name)
                .ok_or_else(|| BuildError::MissingKey(name.clone()))?;
            // Parsed as `url` does only here: a named key's targets match `url`'s form.
            let target = url::Url::parse(target).map_err(|e| BuildError::Target(e.to_string()))?;
            if !crate::signing::scope::allowed(&key.targets, &target) {
                return Err(BuildError::KeyNotAllowed(name.clone()));
            }
            Cow::Borrowed(&key.secrets)
        }
        SigningChoice::Inline(secret) => Cow::Owned(vec![Secret::new(secret.clone())]),
    })
}

/// The request for one attempt. Takes the payload's body, which moves into the request
/// instead of being copied on every attempt; the rest stays for the error's scrub.
pub(super) fn build(
    config: &Config,
    rec: &MessageRecord,
    payload: &mut Payload,
    wall_ms: u64,
    timeout: std::time::Duration,
    traceparent: Option<String>,
) -> Result<OutboundRequest, BuildError> {
    let scheme = payload.scheme.unwrap_or(config.signing.scheme);
    let target = super::alert::target_url(&rec.target, config.alert_url.as_ref())?;
    let url: http::Uri = target
        .parse()
        .map_err(|e: http::uri::InvalidUri| BuildError::Target(e.to_string()))?;
    let secrets = secrets_for(config, &payload.signing, target)?;
    let body = std::mem::take(&mut payload.body);
    let fresh = signing::sign(scheme, &secrets, &rec.event_id, (wall_ms / 1000) as i64, &body)?;
    let mut headers = crate::headers::outbound_headers(&payload.headers, signing::signature_headers(scheme));
    // The app's traceparent names the app's span; this attempt is a child of it, so the
    // stored one is replaced (tracestate goes on unchanged).
    if let Some(child) = traceparent {
        headers.retain(|(name, _)| !name.eq_ignore_ascii_case(TRACEPARENT));
        headers.push((Cow::Borrowed(TRACEPARENT), child.into_bytes()));
    }
    headers.extend(
        fresh
            .into_iter()
            .map(|(name, value)| (Cow::Borrowed(name), value.into_bytes())),
    );
    Ok(OutboundRequest {
        method: http::Method::from_bytes(payload.method.as_bytes()).map_err(|_| BuildError::Method)?,
        url,
        headers,
        body: Bytes::from(body),
        timeout,
    })
}

/// What of the message a receiver's error answer must not bring back into `last_error`
/// (see `scrub`): the value of every header the app sent, the body (shared with the
/// request, not copied), and the per-message secret. Borrowed: nothing is allocated unless
/// an answer is scrubbed. (Not the headers courier adds: event id, timestamp and signature
/// are no secret, and errors name them. Transport errors carry none of what was sent.)
pub(super) struct Echo<'a> {
    payload: &'a Payload,
    body: Bytes,
}

impl<'a> Echo<'a> {
    pub(super) fn of(payload: &'a Payload, body: Bytes) -> Self {
        Echo { payload, body }
    }

    fn scrub(&self, text: &str) -> String {
        let mut sent: Vec<&[u8]> = self.payload.headers.iter().map(|(_, v)| v.as_slice()).collect();
        sent.push(&self.body);
        if let SigningChoice::Inline(secret) = &self.payload.signing {
            sent.push(secret.as_bytes());
        }
        crate::scrub::scrub(text, &sent)
    }
}

/// A short description of a non-2xx answer for `last_error`: the status and the start of
/// the body, as text, with what the message sent taken out (cleaned with the rest of the
/// error).
pub(super) fn response_error(status: u16, body: &[u8], echo: &Echo<'_>) -> String {
    let snippet = echo.scrub(&String::from_utf8_lossy(&body[..body.len().min(200)]));
    if crate::redact::clean(&snippet).is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {snippet}")
    }
}
