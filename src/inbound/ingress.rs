//! Ingress: where the app's webhooks come in (CONTRACT §2).
//!
//! A request is checked (draining, method, token, control headers, target, egress for IP
//! literals, body size, signing choice), turned into an [`Envelope`], and handed to the
//! store's group commit. The 202 is sent only after the batch holding it is synced; then
//! the scheduler is woken so the first attempt starts at once.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use subtle::ConstantTimeEq;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::delivery::Deliverer;
use crate::envelope::Envelope;
use crate::headers::{forwardable_headers, parse_control_headers, proxy_token};
use crate::inbound::access::AccessPolicy;
use crate::inbound::serve::{self, Body, Refusal};
use crate::store::Accepted;
use crate::target::resolve_target;

/// Longest event id accepted from `webhook-id` / `Idempotency-Key`.
pub const MAX_EVENT_ID_LEN: usize = 256;
/// Time allowed for a whole request body to arrive.
pub const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Extra time, past [`BODY_READ_TIMEOUT`], a drain waits for the accepts under way (their
/// commit after the body).
pub const ACCEPT_COMMIT_MARGIN: std::time::Duration = std::time::Duration::from_secs(5);

/// The ingress requests under way. A drain sets `draining` and then waits for this to
/// reach zero: a request already past the `draining` check commits its message, and the
/// drain must see that message (and any attempt it started) before it walks the store.
#[derive(Debug, Default)]
pub struct AcceptsInProgress {
    count: AtomicUsize,
    idle: Notify,
}

/// One request under way; dropped however its handler ends (answered, failed, cancelled).
pub struct AcceptGuard(Arc<AcceptsInProgress>);

impl Drop for AcceptGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl AcceptsInProgress {
    /// Counts a request in; before its `draining` check (both SeqCst: either the request
    /// sees the flag, or the drain sees the request).
    pub fn enter(self: &Arc<Self>) -> AcceptGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        AcceptGuard(self.clone())
    }

    /// Requests under way now.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Waits until no request is under way, for up to `limit`; whether none is.
    pub async fn wait_idle(&self, limit: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Registered before the count is read, so a last guard dropped in between wakes us.
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.count() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.count() == 0;
            }
        }
    }
}

/// Marks a request that came through an intercepted tunnel (see `crate::intercept`):
/// its `CONNECT` was admitted with the token, so the request needs none. Only courier sets
/// request extensions; a client cannot.
#[derive(Debug, Clone, Copy)]
pub struct Tunnelled;

/// The ingress component.
pub struct Ingress {
    /// Stores each message and starts its delivery.
    deliverer: Arc<Deliverer>,
    access: AccessPolicy,
    draining: Arc<AtomicBool>,
    in_progress: Arc<AcceptsInProgress>,
    /// `ingress.max_pending_bytes`: one permit per body byte held by an accept in progress.
    pending_bytes: Arc<Semaphore>,
}

impl Ingress {
    /// Builds the component (its clock and metrics are `deliverer`'s). `draining` turns true
    /// when shutdown starts. The settings
    /// a reload changes (routes, signing keys, the egress policy, the token) are read from
    /// `deliverer` at each request; the browser rules of `[ingress]` are fixed at start.
    pub fn new(deliverer: Arc<Deliverer>, draining: Arc<AtomicBool>, in_progress: Arc<AcceptsInProgress>) -> Self {
        let config = deliverer.context().config();
        let unix_socket = matches!(config.listen, crate::config::ListenAddr::Unix(_));
        let access = AccessPolicy::ingress(&config.ingress, unix_socket);
        let budget = usize::try_from(config.ingress.max_pending_bytes).unwrap_or(usize::MAX);
        Ingress {
            pending_bytes: Arc::new(Semaphore::new(budget.min(Semaphore::MAX_PERMITS))),
            access,
            deliverer,
            draining,
            in_progress,
        }
    }

    /// Handles one request.
    pub async fn handle(self: Arc<Self>, _peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
        // Counted before the `draining` check in `accept`, until the handler ends.
        let _under_way = self.in_progress.enter();
        let (head, body) = req.into_parts();
        let mut body = Some(body);
        match self.accept(&head, &mut body).await {
            Ok(resp) => resp,
            Err(refused) => {
                // What a refused request did not read yet goes before its answer.
                if let Some(rest) = body {
                    drain(rest).await;
                }
                self.refuse(refused)
            }
        }
    }

    /// The answer to a refused request, counted by its code.
    pub fn refuse(&self, refused: Refusal) -> Response<Body> {
        self.deliverer.context().metrics().rejected(refused.code());
        refused.response()
    }

    /// Admits a `CONNECT` as a request is admitted before its target is read: not while
    /// draining, never from a browser, and with the token when one is set.
    pub fn admit_connect(&self, req: &Request<Incoming>) -> Result<(), Refusal> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(shutting_down());
        }
        self.access.check(req.method(), req.uri(), req.headers())?;
        check_token(&self.deliverer.context().settings().config, req.headers(), None)
    }

    /// Takes `body` once it has read it whole; a refusal may leave it unread.
    async fn accept(&self, req: &http::request::Parts, body: &mut Option<Incoming>) -> Result<Response<Body>, Refusal> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(shutting_down());
        }
        // Browsers are not clients: a web page must not have courier sign for it.
        self.access.check(&req.method, &req.uri, &req.headers)?;
        if req.method == http::Method::CONNECT {
            return Err(Refusal::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "CONNECT inside an intercepted tunnel is not supported: send the request itself",
            ));
        }
        let control = parse_control_headers(&req.headers).map_err(|e| Refusal::bad(e.code(), e.to_string()))?;
        // One settings value for the whole accept (the token too), whatever a reload does
        // meanwhile.
        let settings = self.deliverer.context().settings();
        let config = &settings.config;
        if req.extensions.get::<Tunnelled>().is_none() {
            check_token(
                config,
                &req.headers,
                control.token.as_ref().map(crate::signing::Secret::expose),
            )?;
        }
        let resolved = resolve_target(control.target.as_deref(), &req.uri, &|name| config.route_url(name))
            .map_err(|e| Refusal::bad(e.code(), e.to_string()))?;
        // Refused here when the answer is known without DNS (an IP literal or a loopback
        // name); the error already says how an operator opens it, once.
        settings
            .egress
            .check_without_dns(&resolved.url)
            .map_err(|message| Refusal::new(StatusCode::FORBIDDEN, "egress_denied", message))?;
        let route = resolved
            .route
            .as_deref()
            .and_then(|name| config.routes.iter().find(|r| r.name == name));
        let route_fifo = route.and_then(|r| r.fifo);
        let (scheme, signing) = super::signing_choice::choose(config, &control, route, &resolved.url)?;
        let event_id = event_id(&req.headers)?;
        let method = req.method.as_str().to_string();
        let mut headers = forwardable_headers(&req.headers);
        // Kept only when valid: each attempt sends a child of it (see `trace`).
        let trace = crate::outbound::trace::keep_valid(&mut headers);
        let (body, held) = self.read(&req.headers, body, config.max_body).await?;

        // The give-up limits are fixed now, from the message's own headers, else its
        // endpoint's, route's or the global policy (see `policy::settings`).
        let endpoint = control
            .endpoint
            .unwrap_or_else(|| crate::target::default_endpoint_key(&resolved.url));
        let route = route.map(|r| r.name.clone());
        let policy = settings.policies.resolve(route.as_deref(), &endpoint);
        let envelope = Envelope {
            max_attempts: control.max_attempts.unwrap_or(policy.max_attempts),
            give_up_after: control.give_up_after.unwrap_or(policy.give_up_after),
            target: resolved.url,
            endpoint: Some(endpoint),
            route,
            event_id,
            method,
            headers,
            body,
            scheme,
            signing,
        };
        let now = self.deliverer.context().clock().now_ms();
        let mut msg = envelope.into_message(now, &mut crate::clock::rng(), self.deliverer.context().store().ids());
        // A route's ordering; an `[[endpoint]]` that orders wins (delivery applies it).
        msg.record.fifo = route_fifo.map(|on_dead| crate::store::Fifo { on_dead, pos: 0 });
        // A message to alert_url (a drained alert) stores no secret URL either.
        crate::delivery::alert::by_reference(&mut msg.record, config.alert_url.as_ref());
        self.commit(msg, held, config, trace).await
    }

    /// Reads the body (at most `max_body`, within [`BODY_READ_TIMEOUT`]) with its bytes
    /// held from `ingress.max_pending_bytes` (until the commit is settled).
    ///
    /// Bytes are charged as they arrive, never from the declared `Content-Length`: a
    /// client that declares large bodies and sends nothing must not hold the budget (64
    /// such requests once refused every other client for 30 s). A body that stops
    /// arriving holds what came until [`BODY_READ_TIMEOUT`] cuts it.
    /// Takes `incoming` only once it is read whole: a refusal leaves the rest to `handle`.
    async fn read(
        &self,
        headers: &http::HeaderMap,
        incoming: &mut Option<Incoming>,
        max_body: u64,
    ) -> Result<(Vec<u8>, OwnedSemaphorePermit), Refusal> {
        let declared = headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|len| len > max_body) {
            return Err(too_large(max_body));
        }
        // Held until the commit is answered, also when the sender leaves before: without
        // it, held uploads and accepts left waiting on a slow fsync could pile bodies
        // up without bound.
        let mut held = self.hold_bytes(0)?;
        let reading = incoming.as_mut().expect("a request's body is read once");
        // Grown as bytes arrive (never sized from the declared length): one copy, into the
        // buffer the message keeps.
        let mut body = Vec::new();
        let deadline = tokio::time::Instant::now() + BODY_READ_TIMEOUT;
        loop {
            let frame = match tokio::time::timeout_at(deadline, reading.frame()).await {
                Err(_) => return Err(body_timeout()),
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    let message = format!("reading the request body failed: {e}");
                    return Err(Refusal::bad("body_read_failed", message));
                }
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else { continue };
            if (body.len() + data.len()) as u64 > max_body {
                return Err(too_large(max_body));
            }
            held.merge(self.hold_bytes(data.len() as u64)?);
            body.extend_from_slice(&data);
        }
        *incoming = None;
        Ok((body, held))
    }

    /// Stores the message and answers: 202 (new or duplicate), or 503 when it could not be
    /// made durable.
    async fn commit(
        &self,
        msg: crate::store::NewMessage,
        held: OwnedSemaphorePermit,
        config: &crate::config::Config,
        trace: Option<crate::outbound::trace::TraceParent>,
    ) -> Result<Response<Body>, Refusal> {
        let (id, event_id) = (msg.record.id.clone(), msg.record.event_id.clone());
        // Counted as an accept under way, with its bytes held, until the store writer has
        // settled it: a message whose sender went away before the 202 is still committed
        // (the writer has it), so neither a drain waiting for accepts nor the byte budget may
        // let go of it with the handler (dropped with the connection).
        let keep = (self.in_progress.enter(), held);
        // Waits only while delivery is short of CPU (see `delivery::pace`), and only here,
        // with the body read: a client cannot hold a place by sending slowly.
        let pass = self.deliverer.pace().pass().await;
        let outcome = self.deliverer.accept(msg, keep).await;
        drop(pass);
        let (id, status, duplicate) = match outcome {
            Ok(Accepted::New) => {
                let trace_id = trace.as_ref().map(|t| t.trace_id.as_str());
                tracing::debug!(delivery_id = %id, event_id = %event_id, trace_id, "accepted");
                (id, "pending", false)
            }
            Ok(Accepted::Duplicate { id: first }) => {
                // A point read, but still a store call: off the async workers.
                let store = self.deliverer.context().store().clone();
                let looked_up = first.clone();
                let status = match tokio::task::spawn_blocking(move || store.message_shown(&looked_up)).await {
                    Ok(Ok(Some(rec))) => rec.state.as_str(),
                    _ => "pending",
                };
                (first, status, true)
            }
            Err(e) => {
                tracing::error!(error = %e, "could not store an accepted message; answering 503");
                return Err(match e {
                    crate::store::StoreError::Closed => shutting_down(),
                    other => Refusal::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "storage_unavailable",
                        format!("the message could not be stored durably ({other}); retry later"),
                    ),
                });
            }
        };
        let body = AcceptedBody {
            id: &id,
            event_id: &event_id,
            status,
            duplicate,
        };
        Ok(accepted(config, &id, &event_id, &body))
    }

    /// Takes `bytes` from `ingress.max_pending_bytes`, or refuses at once: `503 overloaded`.
    fn hold_bytes(&self, bytes: u64) -> Result<OwnedSemaphorePermit, Refusal> {
        let n = u32::try_from(bytes).unwrap_or(u32::MAX);
        self.pending_bytes.clone().try_acquire_many_owned(n).map_err(|_| {
            Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded",
                "the request bodies being accepted fill ingress.max_pending_bytes; retry shortly",
            )
        })
    }
}

/// Whether the request carries `ingress_token` (when one is set).
fn check_token(
    config: &crate::config::Config,
    headers: &http::HeaderMap,
    header_token: Option<&str>,
) -> Result<(), Refusal> {
    let Some(expected) = &config.ingress_token else {
        return Ok(());
    };
    let expected = expected.expose().as_bytes();
    let given = header_token.map(str::to_string).or_else(|| proxy_token(headers));
    let ok = given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(expected)));
    if ok {
        Ok(())
    } else {
        Err(Refusal::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "ingress needs the token: send Courier-Token: <token> or Proxy-Authorization: Bearer <token> \
             (or Basic with the token as the password, as a proxy URL http://courier:<token>@host carries it)",
        ))
    }
}

fn shutting_down() -> Refusal {
    Refusal::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "shutting_down",
        "courier is shutting down; retry shortly",
    )
}

/// The answer to a body that did not arrive within [`BODY_READ_TIMEOUT`].
fn body_timeout() -> Refusal {
    let message = format!(
        "the request body did not arrive within {}s",
        BODY_READ_TIMEOUT.as_secs()
    );
    Refusal::new(StatusCode::REQUEST_TIMEOUT, "body_read_timeout", message)
}

/// What a refused request may still send, read and dropped, before its answer goes out.
const DRAIN_MAX: usize = 64 << 10;
/// How long a refused request's body is read for at most.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads and drops what is left of a refused request's body (any refusal: a 400 comes
/// before the body is read, a 413 part way), up to [`DRAIN_MAX`] bytes within
/// [`DRAIN_TIMEOUT`], so that the answer goes out after the request's last byte. Over
/// HTTP/2, a client still sending on a stream whose body was dropped could see the stream
/// reset before the answer was written: curl printed "Stream error in the HTTP/2 framing
/// layer" and no status in 4 of 25 runs of the intercept test that found it (inside a TLS
/// tunnel), none in 100 with the rest read first. A larger or slower upload is cut off as
/// before, and its client may see that reset.
async fn drain(mut incoming: Incoming) {
    let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
    let mut left = DRAIN_MAX;
    while let Ok(Some(Ok(frame))) = tokio::time::timeout_at(deadline, incoming.frame()).await {
        let len = frame.data_ref().map_or(0, |d| d.len());
        match left.checked_sub(len) {
            Some(l) => left = l,
            None => return,
        }
    }
}

fn too_large(max: u64) -> Refusal {
    Refusal::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("the body is larger than max_body ({max} bytes)"),
    )
}

/// The 202's body (CONTRACT §2), serialised from its fields: a `serde_json::Value` would
/// build a map and its strings for every accept. `duplicate` is written only when true.
#[derive(serde::Serialize)]
struct AcceptedBody<'a> {
    id: &'a str,
    event_id: &'a str,
    status: &'a str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    duplicate: bool,
}

/// The 202 for a message stored as `id`; with `ingress_token` set, its `Courier-Receipt`
/// (the proof a draining courier checks before it marks a message handed off).
fn accepted(config: &crate::config::Config, id: &str, event_id: &str, body: &AcceptedBody<'_>) -> Response<Body> {
    let mut resp = serve::json(StatusCode::ACCEPTED, body);
    if let Ok(v) = http::HeaderValue::from_str(id) {
        // A static name: a `&str` one is parsed and copied for every answer.
        resp.headers_mut()
            .insert(http::HeaderName::from_static("courier-delivery-id"), v);
    }
    if let Some(token) = &config.ingress_token {
        let receipt = crate::signing::receipt::receipt(token.expose().as_bytes(), event_id, id);
        if let Ok(v) = http::HeaderValue::from_str(&receipt) {
            resp.headers_mut().insert(crate::signing::receipt::HEADER, v);
        }
    }
    resp
}

/// The event id: `webhook-id`, else `Idempotency-Key`, else none (a new one is made).
fn event_id(headers: &http::HeaderMap) -> Result<Option<String>, Refusal> {
    for name in ["webhook-id", "idempotency-key"] {
        let mut values = headers.get_all(name).iter();
        let Some(v) = values.next() else { continue };
        if values.next().is_some() {
            return Err(Refusal::bad(
                "invalid_event_id",
                format!("{name} is given more than once"),
            ));
        }
        let text = v
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|t| !t.is_empty() && t.len() <= MAX_EVENT_ID_LEN && t.bytes().all(|b| b.is_ascii_graphic()));
        return match text {
            Some(t) => Ok(Some(t.to_string())),
            None => Err(Refusal::bad(
                "invalid_event_id",
                format!("{name} must be 1 to {MAX_EVENT_ID_LEN} visible ASCII characters"),
            )),
        };
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_id_prefers_webhook_id_then_idempotency_key() {
        let mut h = http::HeaderMap::new();
        assert!(event_id(&h).unwrap().is_none());
        h.insert("idempotency-key", "k-1".parse().unwrap());
        assert_eq!(event_id(&h).unwrap().as_deref(), Some("k-1"));
        h.insert("webhook-id", "evt_9".parse().unwrap());
        assert_eq!(event_id(&h).unwrap().as_deref(), Some("evt_9"));
        h.insert("webhook-id", "has space".parse().unwrap());
        assert!(event_id(&h).is_err());
        h.insert("webhook-id", "x".repeat(MAX_EVENT_ID_LEN + 1).parse().unwrap());
        assert!(event_id(&h).is_err());
        h.remove("webhook-id");
        h.append("idempotency-key", "k-2".parse().unwrap());
        assert!(event_id(&h).is_err(), "two keys are ambiguous");
    }
}

#[cfg(test)]
mod in_progress_tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn the_wait_ends_when_the_last_request_ends_or_at_its_limit() {
        let accepts = Arc::new(AcceptsInProgress::default());
        assert!(accepts.wait_idle(Duration::ZERO).await, "none under way");
        let (first, second) = (accepts.enter(), accepts.enter());
        assert!(!accepts.wait_idle(Duration::from_millis(20)).await, "bounded");
        drop(first);
        let a = accepts.clone();
        let waiter = tokio::spawn(async move { a.wait_idle(Duration::from_secs(60)).await });
        drop(second);
        let ended = tokio::time::timeout(Duration::from_secs(10), waiter).await;
        assert!(ended.expect("woken, not timed out").unwrap());
        assert_eq!(accepts.count(), 0);
    }
}
