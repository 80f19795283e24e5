//! A running courier's drain: `POST /drain` starts it, `GET /drain` shows it (admin API).
//!
//! Who may ask is the admin API's business (its token, or loopback without one); where to
//! is the config's: only `[drain] to` or a peer listed in `[drain] peers`. Any other peer is
//! refused (`403 drain_peer_not_allowed`) before anything changes, as is a plain-http peer
//! without `[drain] token` (`400 drain_peer_unauthenticated`: nothing could prove it stored
//! what it is sent; see [`super::answer`]).
//!
//! The steps, each finished before the next:
//! 1. ingress answers `503 shutting_down` and `/readyz` 503 (what a shutdown does first):
//!    nothing new comes in, and a Service stops routing here;
//! 2. with `deliver_for`, courier keeps delivering as usual until nothing is open or the
//!    time is up (it waits on attempts ending, never polls);
//! 3. the scheduler stops (no new attempts); new accepts (courier's own pause alerts, and
//!    ingress requests already past the `draining` check, which the drain waits for) go to
//!    the queue instead of to an attempt; the attempts running get `shutdown_grace` to
//!    finish, then are cut off and requeued, as at shutdown;
//! 4. the forwarding pass ([`Engine`]) hands every open message to the peer.
//!
//! Afterwards courier stays up, drained: ingress refuses, nothing is attempted, until it is
//! stopped (a pod's `preStop` returns and the kubelet sends SIGTERM). A second `POST` with
//! the same peer joins the drain under way (a `preStop` retried, or the verb run again);
//! after a drain ended, it runs another pass (what the peer refused may go now). SIGTERM
//! during a drain stops it: what is not handed off stays pending, as after a kill.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use url::Url;

use super::engine::Engine;
use super::progress::{Phase, Progress, Status};
use super::request::PeerAddr;
use crate::delivery::Deliverer;
use crate::inbound::ingress::AcceptsInProgress;
use crate::inbound::serve::{self, Body};
use crate::redact::url_for_log;

/// Longest `POST /drain` body.
const MAX_BODY: usize = 16 << 10;
/// Longest `GET /drain?wait=`.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// Longest `deliver_for`.
pub const MAX_DELIVER_FOR: Duration = Duration::from_secs(3600);

/// The body of `POST /drain`; every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// The peer's ingress (default `[drain] to`).
    pub to: Option<String>,
    /// Messages forwarded at once (default `[drain] concurrency`).
    pub concurrency: Option<u32>,
    /// Deliver as usual for up to this long first, e.g. `"20s"` (default: forward at once).
    pub deliver_for: Option<String>,
}

/// A drain's settings, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainPlan {
    /// The peer.
    pub to: Url,
    /// Messages forwarded at once.
    pub concurrency: u32,
    /// Delivering first, for up to this long.
    pub deliver_for: Duration,
    /// The peer is `[drain] to` or one of `[drain] peers`: the operator's choice, so the
    /// egress policy is open for it ([`super::peer_transport`]).
    pub listed: bool,
}

/// A bad `POST /drain` (or `courier drain` flags): the error code and the sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadPlan(pub &'static str, pub String);

/// The code of a peer that is not one of `[drain]`'s (`403`).
const NOT_ALLOWED: &str = "drain_peer_not_allowed";

impl BadPlan {
    /// The status `POST /drain` answers with.
    pub fn status(&self) -> StatusCode {
        if self.0 == NOT_ALLOWED {
            StatusCode::FORBIDDEN
        } else {
            StatusCode::BAD_REQUEST
        }
    }
}

impl DrainRequest {
    /// The plan, with `[drain]`'s defaults for what the request leaves out. With
    /// `listed_only` (a running courier's `POST /drain`) the peer must be one of `[drain]`'s;
    /// a plain-http peer always needs `[drain] token`.
    pub fn plan(self, defaults: &crate::config::DrainConfig, listed_only: bool) -> Result<DrainPlan, BadPlan> {
        let to = self.to.or_else(|| defaults.to.clone()).ok_or_else(|| {
            BadPlan(
                "missing_peer",
                "no peer to drain to: give \"to\" (courier drain --to URL), or set [drain] to / COURIER_DRAIN_TO"
                    .into(),
            )
        })?;
        let to = crate::config::peer_url(&to).map_err(|e| BadPlan("invalid_peer", format!("to {e}")))?;
        let listed = defaults.lists(&to);
        if listed_only && !listed {
            return Err(BadPlan(
                NOT_ALLOWED,
                format!(
                    "{} is not a drain peer of this courier: it drains only to [drain] to or a peer listed in [drain] peers",
                    url_for_log(to.as_str())
                ),
            ));
        }
        if to.scheme() == "http" && defaults.token.is_none() {
            return Err(BadPlan(
                "drain_peer_unauthenticated",
                format!(
                    "{} is plain http and [drain] token is not set, so nothing proves the peer stored what it is sent: \
                     set [drain] token (COURIER_DRAIN_TOKEN) to the peer's ingress_token, or use https",
                    url_for_log(to.as_str())
                ),
            ));
        }
        let concurrency = self.concurrency.unwrap_or(defaults.concurrency);
        if !(1..=crate::config::DRAIN_MAX_CONCURRENCY).contains(&concurrency) {
            return Err(BadPlan(
                "invalid_request",
                format!("concurrency must be 1 to {}", crate::config::DRAIN_MAX_CONCURRENCY),
            ));
        }
        let deliver_for = match self.deliver_for {
            None => Duration::ZERO,
            Some(text) => crate::config::units::parse_duration(&text)
                .ok()
                .filter(|d| *d <= MAX_DELIVER_FOR)
                .ok_or_else(|| {
                    BadPlan(
                        "invalid_request",
                        format!("deliver_for {text:?} must be a duration up to 1h, like 20s"),
                    )
                })?,
        };
        Ok(DrainPlan {
            to,
            concurrency,
            deliver_for,
            listed,
        })
    }
}

/// Why `POST /drain` did not start a drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotStarted {
    /// A drain to this other peer (as shown in logs) is under way.
    Running(String),
    /// Courier is shutting down: a drain started now would be cut off at once.
    ShuttingDown,
}

/// The drain under way (or the last one).
struct Current {
    to: Url,
    phase: Arc<Mutex<Phase>>,
    progress: Arc<Progress>,
    task: AbortHandle,
}

impl Current {
    fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The drain of this running courier.
pub struct DrainControl {
    d: Arc<Deliverer>,
    draining: Arc<AtomicBool>,
    accepts: Arc<AcceptsInProgress>,
    stop_scheduler: Arc<watch::Sender<bool>>,
    scheduler_stopped: watch::Receiver<bool>,
    current: Mutex<Option<Current>>,
    /// Set by [`DrainControl::abort`] (shutdown): no drain starts after it.
    closed: AtomicBool,
    /// Bumped when a drain ends: `GET /drain?wait=` returns then.
    ended: watch::Sender<u64>,
}

impl DrainControl {
    /// The control over a courier's delivery: `draining` is the flag ingress and `/readyz`
    /// read; `accepts` counts the ingress requests under way; `stop_scheduler` stops the
    /// scheduler, which sets `scheduler_stopped` once it has returned.
    pub fn new(
        d: Arc<Deliverer>,
        draining: Arc<AtomicBool>,
        accepts: Arc<AcceptsInProgress>,
        stop_scheduler: Arc<watch::Sender<bool>>,
        scheduler_stopped: watch::Receiver<bool>,
    ) -> Self {
        DrainControl {
            d,
            draining,
            accepts,
            stop_scheduler,
            scheduler_stopped,
            current: Mutex::new(None),
            closed: AtomicBool::new(false),
            ended: watch::channel(0).0,
        }
    }

    /// Handles `/drain` (the admin API has checked the token).
    pub async fn handle(self: &Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        match *req.method() {
            Method::POST => self.post(req).await,
            Method::GET => {
                let wait = req
                    .uri()
                    .query()
                    .and_then(|q| url::form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == "wait"))
                    .map(|(_, v)| crate::config::units::parse_duration(&v));
                match wait {
                    Some(Err(e)) => serve::error(StatusCode::BAD_REQUEST, "invalid_request", format!("wait: {e}")),
                    Some(Ok(wait)) => self.get(wait.min(MAX_WAIT)).await,
                    None => self.get(Duration::ZERO).await,
                }
            }
            _ => serve::error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{} is not allowed on /drain", req.method()),
            ),
        }
    }

    async fn post(self: &Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let bad = |code: &str, message: String| serve::error(StatusCode::BAD_REQUEST, code, message);
        // Bounded in size and time: a client that stops sending must not hold the request.
        let reading = Limited::new(req.into_body(), MAX_BODY).collect();
        let body = match tokio::time::timeout(crate::inbound::ingress::BODY_READ_TIMEOUT, reading).await {
            Ok(Ok(body)) => body.to_bytes(),
            Ok(Err(e)) => return bad("invalid_request", format!("reading the body failed: {e}")),
            Err(_) => return bad("invalid_request", "the body did not arrive in time".into()),
        };
        let request: DrainRequest = if body.iter().all(u8::is_ascii_whitespace) {
            DrainRequest::default()
        } else {
            match serde_json::from_slice(&body) {
                Ok(r) => r,
                Err(e) => {
                    return bad(
                        "invalid_request",
                        format!("the body must be JSON like {{\"to\": \"http://courier-tier:8787\"}}: {e}"),
                    )
                }
            }
        };
        // Checked before anything changes: a refused peer leaves courier serving.
        let plan = match request.plan(&self.d.context().config().drain, true) {
            Ok(plan) => plan,
            Err(e) => return serve::error(e.status(), e.0, e.1),
        };
        match self.start(plan) {
            Ok(status) => serve::json(StatusCode::ACCEPTED, &serde_json::to_value(status).unwrap_or_default()),
            Err(NotStarted::Running(running_to)) => serve::error(
                StatusCode::CONFLICT,
                "drain_running",
                format!("a drain to {running_to} is under way; wait for it (GET /drain) or drain to the same peer"),
            ),
            Err(NotStarted::ShuttingDown) => serve::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "courier is shutting down; drain its data dir once it has stopped (courier drain --data-dir)",
            ),
        }
    }

    async fn get(&self, wait: Duration) -> Response<Body> {
        let mut ended = self.ended.subscribe();
        let running = self.lock().as_ref().is_some_and(|c| !c.phase().ended());
        if running && !wait.is_zero() {
            let _ = tokio::time::timeout(wait, ended.changed()).await;
        }
        serve::json(StatusCode::OK, &serde_json::to_value(self.status()).unwrap_or_default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current (or last) drain's status.
    pub fn status(&self) -> Status {
        match self.lock().as_ref() {
            None => Status::default(),
            Some(c) => {
                let phase = c.phase();
                let mut status = c.progress.status(
                    phase,
                    Some(url_for_log(c.to.as_str())),
                    self.d.context().clock().now_ms(),
                );
                // Nothing undoes the drain's stop short of a restart: say so where it is read.
                status.delivery_stopped = phase == Phase::Failed;
                status
            }
        }
    }

    /// Starts a drain, or joins the one under way to the same peer; `Err` when a drain
    /// to another peer is under way, or courier is shutting down.
    pub fn start(self: &Arc<Self>, plan: DrainPlan) -> Result<Status, NotStarted> {
        let mut current = self.lock();
        // Read under the lock `abort` takes after setting it: a drain either starts before
        // the abort (which then stops it) or not at all.
        if self.closed.load(Ordering::SeqCst) {
            return Err(NotStarted::ShuttingDown);
        }
        if let Some(c) = current.as_ref().filter(|c| !c.phase().ended()) {
            if c.to != plan.to {
                return Err(NotStarted::Running(url_for_log(c.to.as_str())));
            }
        } else {
            let first = if plan.deliver_for.is_zero() {
                Phase::Stopping
            } else {
                Phase::Delivering
            };
            let phase = Arc::new(Mutex::new(first));
            let progress = Arc::new(Progress::default());
            let task = tokio::spawn(self.clone().run(plan.clone(), phase.clone(), progress.clone()));
            *current = Some(Current {
                to: plan.to,
                phase,
                progress,
                task: task.abort_handle(),
            });
        }
        drop(current);
        Ok(self.status())
    }

    /// Stops a drain under way (shutdown): what is not handed off stays pending.
    pub fn abort(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Some(c) = self.lock().as_ref().filter(|c| !c.phase().ended()) {
            c.task.abort();
            c.progress.fail("courier is shutting down".into());
            *c.phase.lock().unwrap_or_else(|p| p.into_inner()) = Phase::Failed;
            self.ended.send_modify(|n| *n += 1);
        }
    }

    async fn run(self: Arc<Self>, plan: DrainPlan, phase: Arc<Mutex<Phase>>, progress: Arc<Progress>) {
        let set = |p: Phase| *phase.lock().unwrap_or_else(|e| e.into_inner()) = p;
        let to = url_for_log(plan.to.as_str());
        self.draining.store(true, Ordering::SeqCst);
        tracing::info!(to = %to, deliver_for_ms = plan.deliver_for.as_millis() as u64,
            "drain: started; ingress refuses new messages from now on");
        if !plan.deliver_for.is_zero() {
            self.deliver_until_empty(plan.deliver_for).await;
            set(Phase::Stopping);
        }
        // No new attempts: what is accepted from now on (courier's own alerts, requests
        // already past ingress's check) waits in the queue rather than starting an attempt
        // at accept. Set before the scheduler stops, so no accept dispatches between its
        // last pass and the stop; and again after, as that last pass may have cleared it.
        self.d.set_queue_waiting(true);
        let _ = self.stop_scheduler.send(true);
        let mut stopped = self.scheduler_stopped.clone();
        let _ = stopped.wait_for(|s| *s).await;
        self.d.set_queue_waiting(true);
        // Requests that passed ingress's `draining` check before it was set commit their
        // message now: wait for them, so the walk below sees it. Bounded by the time a body
        // has to arrive; one that still commits later is met by the engine's re-count.
        let under_way = self.accepts.count();
        if under_way > 0 {
            tracing::info!(count = under_way, "drain: waiting for ingress requests under way");
        }
        let limit = crate::inbound::ingress::BODY_READ_TIMEOUT + crate::inbound::ingress::ACCEPT_COMMIT_MARGIN;
        if !self.accepts.wait_idle(limit).await {
            tracing::warn!(
                count = self.accepts.count(),
                "drain: ingress requests were still under way after the body timeout; forwarding anyway"
            );
        }
        let cut = self.d.drain(self.d.context().config().shutdown_grace).await;
        if cut > 0 {
            tracing::warn!(
                count = cut,
                "drain: attempts still running after shutdown_grace were cut off; they are forwarded"
            );
        }
        set(Phase::Forwarding);
        let config = self.d.context().config();
        let transport = match super::peer_transport_blocking(config.clone(), plan.concurrency, plan.listed).await {
            Ok(t) => t,
            Err(e) => {
                progress.fail(format!("cannot make the peer client: {e}"));
                set(Phase::Failed);
                return;
            }
        };
        let engine = Arc::new(Engine {
            store: self.d.context().store().clone(),
            transport,
            peer: PeerAddr {
                url: plan.to,
                token: config.drain.token.clone(),
                timeout: config.delivery.request_timeout,
            },
            clock: self.d.context().clock().clone(),
            metrics: self.d.context().metrics().clone(),
            concurrency: plan.concurrency as usize,
            progress: progress.clone(),
        });
        let finished = if engine.run().await { Phase::Done } else { Phase::Failed };
        set(finished);
        let status = progress.status(finished, Some(to), self.d.context().clock().now_ms());
        tracing::info!(
            handed_off = status.handed_off,
            already_at_peer = status.already_at_peer,
            refused = status.refused,
            left = status.left,
            error = status.error.as_deref(),
            "drain: {}",
            status.state.as_str()
        );
        if finished == Phase::Failed {
            tracing::warn!("drain: delivery stays stopped until courier restarts (ingress refuses, nothing is attempted); restart it, or drain again");
        }
        self.ended.send_modify(|n| *n += 1);
    }

    /// Delivers as usual until nothing is open or `budget` is over, checking each time the
    /// attempts in flight run out (the only moment the open count can reach zero).
    async fn deliver_until_empty(&self, budget: Duration) {
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            let idle = self.d.next_idle();
            let store = self.d.context().store().clone();
            let open = tokio::task::spawn_blocking(move || store.counts().map(|c| c.open))
                .await
                .ok()
                .and_then(Result::ok);
            if open == Some(0) {
                tracing::info!("drain: nothing open is left; nothing to forward");
                return;
            }
            tokio::select! {
                _ = idle => {}
                _ = tokio::time::sleep_until(deadline) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DrainConfig;
    use crate::signing::Secret;

    fn plan(r: DrainRequest, defaults: &DrainConfig) -> Result<DrainPlan, BadPlan> {
        r.plan(defaults, false)
    }

    fn to(url: &str) -> DrainRequest {
        DrainRequest {
            to: Some(url.into()),
            ..DrainRequest::default()
        }
    }

    #[test]
    fn a_request_takes_drain_defaults_and_is_checked() {
        let defaults = DrainConfig {
            to: Some("http://tier:8787".into()),
            token: Some(Secret::new("t".into())),
            ..DrainConfig::default()
        };
        let p = plan(DrainRequest::default(), &defaults).unwrap();
        assert_eq!(
            (p.to.as_str(), p.concurrency, p.deliver_for, p.listed),
            ("http://tier:8787/", 16, Duration::ZERO, true)
        );
        let p = plan(
            DrainRequest {
                to: Some("https://other:1/x".into()),
                concurrency: Some(2),
                deliver_for: Some("20s".into()),
            },
            &defaults,
        )
        .unwrap();
        assert_eq!(
            (p.to.as_str(), p.concurrency, p.deliver_for, p.listed),
            ("https://other:1/x", 2, Duration::from_secs(20), false)
        );
        let code = |r: DrainRequest, d: &DrainConfig| plan(r, d).unwrap_err().0;
        assert_eq!(code(DrainRequest::default(), &DrainConfig::default()), "missing_peer");
        let with = |to: &str, c: Option<u32>, d: Option<&str>| DrainRequest {
            to: Some(to.into()),
            concurrency: c,
            deliver_for: d.map(str::to_string),
        };
        assert_eq!(code(with("tier:8787", None, None), &defaults), "invalid_peer");
        assert_eq!(code(with("http://t", Some(0), None), &defaults), "invalid_request");
        assert_eq!(code(with("http://t", Some(257), None), &defaults), "invalid_request");
        assert_eq!(code(with("http://t", None, Some("2h")), &defaults), "invalid_request");
        assert_eq!(code(with("http://t", None, Some("soon")), &defaults), "invalid_request");
        assert!(
            serde_json::from_str::<DrainRequest>(r#"{"too": "x"}"#).is_err(),
            "unknown fields"
        );
    }

    #[test]
    fn a_running_courier_drains_only_to_its_configured_peers_and_http_needs_the_token() {
        let defaults = DrainConfig {
            to: Some("http://tier:8787".into()),
            peers: vec!["https://other.example/couriers/".into(), "http://[::1]:9".into()],
            token: Some(Secret::new("t".into())),
            ..DrainConfig::default()
        };
        let listed = |r: DrainRequest| r.plan(&defaults, true);
        // Compared as normalised URLs.
        for ok in [
            "http://TIER:8787/",
            " http://tier:8787",
            "https://other.example:443/couriers/",
            "http://[0:0::1]:9",
        ] {
            assert!(listed(to(ok)).is_ok_and(|p| p.listed), "{ok}");
        }
        assert!(listed(DrainRequest::default()).is_ok(), "[drain] to");
        for not in [
            "http://127.0.0.1:30999",
            "http://tier:8788",
            "https://other.example/couriers/x",
            "https://tier:8787",
        ] {
            let e = listed(to(not)).unwrap_err();
            assert_eq!(
                (e.0, e.status()),
                ("drain_peer_not_allowed", StatusCode::FORBIDDEN),
                "{not}"
            );
        }
        // The offline verb may name any peer.
        assert!(to("http://127.0.0.1:30999")
            .plan(&defaults, false)
            .is_ok_and(|p| !p.listed));

        // No token: https is believed on its 202, plain http is refused before anything is sent.
        let no_token = DrainConfig {
            token: None,
            ..defaults.clone()
        };
        for listed_only in [true, false] {
            let e = to("http://tier:8787").plan(&no_token, listed_only).unwrap_err();
            assert_eq!(
                (e.0, e.status()),
                ("drain_peer_unauthenticated", StatusCode::BAD_REQUEST)
            );
            assert!(e.1.contains("[drain] token") && e.1.contains("https"), "{}", e.1);
            assert!(to("https://other.example/couriers/")
                .plan(&no_token, listed_only)
                .is_ok());
        }
        let e = to("http://elsewhere:1").plan(&no_token, true).unwrap_err();
        assert_eq!(
            e.0, "drain_peer_not_allowed",
            "an unlisted peer is refused as such first"
        );
    }
}
