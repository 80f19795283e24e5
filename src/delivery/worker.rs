//! One attempt, start to finish: look up the message's policy (its endpoint's and route's
//! sections over the global one, as the config says now), sign with a fresh timestamp,
//! send through the transport within the policy's timeout, decide, record the result (with
//! the policy's revision) and the transition in the store, update the endpoint's streak,
//! and log and count the outcome in one place.

use std::sync::Arc;

use bytes::Bytes;

use super::end::{blocks_its_line, End, Sent, StreakNote};
use super::running::Running;
use super::{AttemptPermit, Deliverer, SELF_FAILURE_DELAY};
use crate::config::Config;
use crate::outbound::trace::{new_span_id, TraceParent, TRACEPARENT};
use crate::outbound::transport::{OutboundRequest, TransportError};
use crate::policy::circuit::{CircuitChange, HostOutcome};
use crate::policy::{decide, AttemptResult, Limits};
use crate::signing::{self, Secret};
use crate::store::{AttemptRecord, FinishedAttempt, Leased, MessageRecord, Payload, SigningChoice};

/// Why an attempt could not even be built. Courier's (or its operator's) failure, never
/// the receiver's: no attempt is counted.
#[derive(Debug, thiserror::Error)]
enum BuildError {
    #[error("signing key {0:?} is not in the config")]
    MissingKey(String),
    #[error("signing key {0:?} may not sign for this target (its targets in [signing.keys] exclude it)")]
    KeyNotAllowed(String),
    #[error("{0}")]
    Signing(#[from] signing::SigningError),
    #[error("stored target is not a URL: {0}")]
    Target(#[from] url::ParseError),
    #[error("{0}")]
    Alert(#[from] super::alert::Unresolved),
    #[error("stored method is invalid")]
    Method,
}

/// The secrets a message signs with. A named key's targets are checked again here, at
/// every attempt, not only at ingress: a message accepted before the key was bound (or
/// before its binding was narrowed) must not be signed for a target now outside it.
fn secrets_for(config: &Config, choice: &SigningChoice, target: &url::Url) -> Result<Vec<Secret>, BuildError> {
    Ok(match choice {
        SigningChoice::Default => config.signing.secrets.clone(),
        SigningChoice::Key(name) => {
            let key = config
                .signing
                .keys
                .get(name)
                .ok_or_else(|| BuildError::MissingKey(name.clone()))?;
            if !crate::signing::scope::allowed(&key.targets, target) {
                return Err(BuildError::KeyNotAllowed(name.clone()));
            }
            key.secrets.clone()
        }
        SigningChoice::Inline(secret) => vec![Secret::new(secret.clone())],
    })
}

/// The request for one attempt. Takes the payload's body, which moves into the request
/// instead of being copied on every attempt; the rest stays for the error's scrub.
fn build(
    config: &Config,
    rec: &MessageRecord,
    payload: &mut Payload,
    wall_ms: u64,
    timeout: std::time::Duration,
    traceparent: Option<String>,
) -> Result<OutboundRequest, BuildError> {
    let scheme = payload.scheme.unwrap_or(config.signing.scheme);
    let url = url::Url::parse(super::alert::target_url(&rec.target, config.alert_url.as_ref())?)?;
    let secrets = secrets_for(config, &payload.signing, &url)?;
    let body = std::mem::take(&mut payload.body);
    let fresh = signing::sign(scheme, &secrets, &rec.event_id, (wall_ms / 1000) as i64, &body)?;
    let mut headers = crate::headers::outbound_headers(&payload.headers, signing::signature_headers(scheme));
    // The app's traceparent names the app's span; this attempt is a child of it, so the
    // stored one is replaced (tracestate goes on unchanged).
    if let Some(child) = traceparent {
        headers.retain(|(name, _)| !name.eq_ignore_ascii_case(TRACEPARENT));
        headers.push((TRACEPARENT.to_string(), child.into_bytes()));
    }
    headers.extend(
        fresh
            .into_iter()
            .map(|(name, value)| (name.to_string(), value.into_bytes())),
    );
    Ok(OutboundRequest {
        method: http::Method::from_bytes(payload.method.as_bytes()).map_err(|_| BuildError::Method)?,
        url,
        headers,
        body: Bytes::from(body),
        timeout,
    })
}

/// Runs one attempt of a claimed message: build the request, send it, judge the answer,
/// and hand the result to the store writer, which ends the attempt once it is written
/// ([`End`]): this task does not wait for the write, so nothing wakes it after.
///
/// The host part of `permit` is given back the moment the receiver has answered (or the
/// send failed): the host's cap limits requests at the receiver, and the result write that
/// follows may wait behind other writes' fsync without holding a receiver slot. The global
/// part is held until the result is written.
pub(super) async fn attempt(d: Arc<Deliverer>, claimed: Leased, permit: AttemptPermit, running: Running) {
    let Leased {
        record: rec,
        mut payload,
    } = claimed;
    let started_ms = d.ctx.clock().now_ms();
    // What the config says now for this endpoint and route: a lookup, nothing allocated.
    // One settings value for the whole attempt, whatever a reload does meanwhile.
    let settings = d.ctx.settings();
    let policy = settings.policies.resolve(rec.route.as_deref(), &rec.endpoint);
    // A span of its own per attempt, so retries show as siblings under the app's span.
    let trace = TraceParent::from_headers(&payload.headers);
    let span_id = trace.as_ref().map(|_| d.with_rng(new_span_id));
    let traceparent = trace.as_ref().zip(span_id.as_deref()).map(|(t, s)| t.child(s));
    let trace_id = trace.map(|t| t.trace_id);
    let timeout = policy.request_timeout;
    // The receiver checks the signature's timestamp against its own wall clock.
    let wall_ms = d.ctx.clock().wall_ms();
    let req = match build(&settings.config, &rec, &mut payload, wall_ms, timeout, traceparent) {
        Ok(req) => req,
        Err(e) => {
            drop(permit);
            tracing::error!(delivery_id = %rec.id, event_id = %rec.event_id, error = %e,
                "cannot build the attempt; message stays pending until the config is fixed");
            d.requeue(&rec.id, started_ms + SELF_FAILURE_DELAY.as_millis() as u64)
                .await;
            running.settle();
            return;
        }
    };
    let echo = Echo::of(&payload, req.body.clone());
    let (sent, global) = send(&d, &settings.config, &rec, req, permit, started_ms, &echo).await;
    let limits = Limits {
        max_attempts: rec.max_attempts,
        give_up_at_ms: rec.give_up_at_ms,
    };
    let transition = d.with_rng(|rng| {
        decide(
            &sent.result,
            rec.attempts + 1,
            &limits,
            &policy,
            sent.now,
            sent.wall,
            rng,
        )
    });
    let item = FinishedAttempt {
        id: rec.id.clone(),
        attempt: AttemptRecord {
            at_ms: started_ms,
            status: sent.status,
            error: sent.error.clone(),
            duration_ms: sent.duration.as_millis().min(u32::MAX as u128) as u32,
            policy_revision: Some(policy.revision()),
            span_id: span_id.clone(),
        },
        transition,
        now_ms: sent.now,
    };
    let note = StreakNote {
        endpoint: rec.endpoint.clone(),
        blocks_line: blocks_its_line(&rec, transition),
    };
    let end = End {
        d: d.clone(),
        rec,
        ids: (trace_id, span_id),
        sent,
        transition,
        global,
        running,
        retry: (item.clone(), note.clone()),
    };
    d.record_ending(item, note, end).await;
}

/// Sends the request, counted in its endpoint's in-flight number exactly while it is out;
/// gives the host permit back once answered and returns the global one.
async fn send(
    d: &Deliverer,
    config: &Config,
    rec: &MessageRecord,
    req: OutboundRequest,
    permit: AttemptPermit,
    started_ms: u64,
    echo: &Echo<'_>,
) -> (Sent, tokio::sync::OwnedSemaphorePermit) {
    d.ctx.metrics().attempt_started();
    // The guard's drop ends the count once, whether the send returns, panics or is cut off.
    let counted = InFlight::start(d, &rec.endpoint, started_ms);
    let timer = crate::clock::Stopwatch::start();
    let answer = d.transport.send(req).await;
    let duration = timer.elapsed();
    let (now, wall) = (d.ctx.clock().now_ms(), d.ctx.clock().wall_ms());
    drop(counted);
    host_outcome(d, config, &rec.host, permit.host_epoch(), &answer, now);
    let global = d.host_permit_returned(permit);
    let (result, status, error) = match &answer {
        Ok(resp) => (
            AttemptResult::Status {
                code: resp.status,
                retry_after: resp.retry_after.clone(),
            },
            Some(resp.status),
            (!(200..300).contains(&resp.status)).then(|| response_error(resp.status, &resp.body, echo)),
        ),
        Err(TransportError::EgressDenied(msg)) => (AttemptResult::EgressDenied, None, Some(msg.clone())),
        Err(e) => (AttemptResult::NetworkError, None, Some(e.to_string())),
    };
    // Shown to operators (admin API, CLI): nothing that can disguise itself on a terminal.
    let error = error.map(|e| crate::redact::clean(&e));
    let sent = Sent {
        result,
        status,
        error,
        duration,
        now,
        wall,
    };
    (sent, global)
}

/// One attempt counted as in flight to its endpoint until dropped.
struct InFlight<'a> {
    d: &'a Deliverer,
    endpoint: &'a str,
}

impl<'a> InFlight<'a> {
    fn start(d: &'a Deliverer, endpoint: &'a str, now_ms: u64) -> Self {
        d.ctx.endpoints().started(endpoint, now_ms);
        InFlight { d, endpoint }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.d
            .ctx
            .endpoints()
            .finished(self.endpoint, self.d.ctx.clock().now_ms());
    }
}

/// Tells the host's circuit breaker how the attempt went; logs and counts a change.
fn host_outcome(
    d: &Deliverer,
    config: &Config,
    host: &str,
    epoch: u64,
    sent: &Result<crate::outbound::transport::InboundResponse, TransportError>,
    now: u64,
) {
    let outcome = match sent {
        Ok(resp) if resp.retry_after.is_none() && config.circuit.counts(resp.status) => HostOutcome::Failed,
        Ok(_) => HostOutcome::Answered,
        Err(TransportError::EgressDenied(_)) => HostOutcome::Neutral,
        Err(_) => HostOutcome::Failed,
    };
    match d.hosts.record(host, outcome, epoch, now) {
        None => {}
        Some(CircuitChange::Opened { probe_at_ms }) => {
            d.ctx.metrics().circuit_opened();
            tracing::warn!(
                host,
                probe_in_ms = probe_at_ms.saturating_sub(now),
                "host circuit open: its messages wait (no attempts counted) until a probe gets an answer"
            );
        }
        Some(CircuitChange::Recovering) => {
            tracing::info!(host, "host answered the probe; circuit ramping up to its cap");
            d.ctx.wake();
        }
        Some(CircuitChange::Closed) => {
            tracing::info!(host, "host circuit closed");
            d.ctx.wake();
        }
    }
}

/// What of the message a receiver's error answer must not bring back into `last_error`
/// (see `scrub`): the value of every header the app sent, the body (shared with the
/// request, not copied), and the per-message secret. Borrowed: nothing is allocated unless
/// an answer is scrubbed. (Not the headers courier adds: event id, timestamp and signature
/// are no secret, and errors name them. Transport errors carry none of what was sent.)
struct Echo<'a> {
    payload: &'a Payload,
    body: Bytes,
}

impl<'a> Echo<'a> {
    fn of(payload: &'a Payload, body: Bytes) -> Self {
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
fn response_error(status: u16, body: &[u8], echo: &Echo<'_>) -> String {
    let snippet = echo.scrub(&String::from_utf8_lossy(&body[..body.len().min(200)]));
    if crate::redact::clean(&snippet).is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {snippet}")
    }
}
