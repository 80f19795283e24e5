//! The one front of a drain, the same request either way ([`DrainRequest`]): the admin
//! API's `/drain` route ([`DrainControl::handle`]), and `courier drain --to <URL>`.
//!
//! The verb hands over the messages of the data dir of the usual settings (`--data-dir`,
//! `COURIER_DATA_DIR`, `data_dir`), and its RocksDB lock says how:
//! - free: nobody serves it (a stopped courier, a volume left by a scaled-down replica), so
//!   the verb opens the store, puts back what a crash left in flight, and runs the pass
//!   here; `--to` may name any peer (an unlisted one under the `[egress]` policy);
//! - locked: the courier running on it is asked through its admin API (`POST /drain`, found
//!   like `courier deliveries`) and followed with `GET /drain?wait=1s`; it drains only to a
//!   peer of its `[drain] to` / `peers`.
//!
//! Progress goes to stderr once a second, the last line to stdout; the exit code is 0 only
//! when every open message was handed off.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use url::Url;

use super::plan::{DrainPlan, DrainRequest, NotStarted};
use super::progress::{Phase, Progress, Status};
use crate::args::GlobalArgs;
use crate::clock::{SharedClock, SteadyClock};
use crate::config::Config;
use crate::delivery::Deliverer;
use crate::inbound::ingress::{AcceptsInProgress, ACCEPT_COMMIT_MARGIN, BODY_READ_TIMEOUT};
use crate::inbound::serve::{self, Body};
use crate::redact::url_for_log;
use crate::store::{Store, StoreError};

/// Longest `POST /drain` body.
const MAX_BODY: usize = 16 << 10;
/// Longest `GET /drain?wait=`.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// How often the offline verb prints progress.
const EVERY: Duration = Duration::from_secs(1);

/// The `POST /drain` body (empty: every default), or why it is bad.
async fn read_request(req: Request<Incoming>) -> Result<DrainRequest, NotStarted> {
    let bad = |message: String| NotStarted("invalid_request", message);
    // Bounded in size and time: a client that stops sending must not hold the request.
    let reading = Limited::new(req.into_body(), MAX_BODY).collect();
    let body = match tokio::time::timeout(BODY_READ_TIMEOUT, reading).await {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(e)) => return Err(bad(format!("reading the body failed: {e}"))),
        Err(_) => return Err(bad("the body did not arrive in time".into())),
    };
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(DrainRequest::default());
    }
    serde_json::from_slice(&body).map_err(|e| {
        bad(format!(
            "the body must be JSON like {{\"to\": \"http://courier-tier:8787\"}}: {e}"
        ))
    })
}

/// Runs `courier drain`; the exit code is 0 when everything open was handed off, 1 when some
/// of it stays here (refused, in flight, the peer failed), 2 for bad settings.
pub fn run(global: &GlobalArgs, request: DrainRequest) -> ExitCode {
    let usage = |message: &str| {
        eprintln!("courier: {message}");
        ExitCode::from(2)
    };
    let config = match crate::args::load_config(global) {
        Ok(c) => Arc::new(c),
        Err(e) => return usage(&e.to_string()),
    };
    crate::args::init_logging(config.log.format, "warn");
    let plan = match request.plan(&config.drain, false) {
        Ok(plan) => plan,
        Err(NotStarted(_, message)) => return usage(&message),
    };
    let status = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(drain(config, plan)),
        Err(e) => Err(format!("cannot start the runtime: {e}")),
    };
    match status {
        Ok(status) => {
            println!("{}", status.line());
            ExitCode::from(u8::from(!status.complete()))
        }
        Err(e) => {
            eprintln!("courier: {}", crate::redact::escape(&e));
            ExitCode::FAILURE
        }
    }
}

/// Drains the data dir here, or asks the courier that runs on it.
async fn drain(config: Arc<Config>, plan: DrainPlan) -> Result<Status, String> {
    if !config.data_dir.is_dir() {
        return Err(format!(
            "no data dir at {} (give the drained courier's --data-dir)",
            config.data_dir.display()
        ));
    }
    let options = crate::args::store_options(&config).map_err(|e| e.to_string())?;
    match Store::open(&config.data_dir, options) {
        Ok(store) => Ok(offline(config, Arc::new(store), plan).await),
        Err(StoreError::Locked(_)) => running(&config, plan).await,
        Err(e) => Err(e.to_string()),
    }
}

/// The pass here, on a store nobody else has open.
async fn offline(config: Arc<Config>, store: Arc<Store>, plan: DrainPlan) -> Status {
    let clock: SharedClock = Arc::new(SteadyClock::new());
    // As a start does (`Context::new`): never before what the store accepted last.
    clock.hold_at_least(store.ids().newest_ms());
    let to = url_for_log(plan.to.as_str());
    let dir = config.data_dir.display().to_string();
    if !plan.deliver_for.is_zero() {
        eprintln!("drain: no courier runs on {dir}: nothing delivers from it, so everything open is forwarded now (--deliver-for applies to a running courier)");
    }
    eprintln!("drain: {dir} is not in use; forwarding its open messages to {to}");
    let progress = Arc::new(Progress::new(to, Phase::Forwarding));
    // As a start would: what a crash left in flight is open again, lines are whole.
    let (s, now) = (store.clone(), clock.now_ms());
    let recovered = tokio::task::spawn_blocking(move || {
        for (id, e) in s.recover_in_flight(now)?.1 {
            eprintln!("drain: message {id} does not read ({e}); it stays here");
        }
        s.recover_lines(now)
    });
    if let Ok(Err(e)) | Err(e) = recovered.await.map_err(|e| StoreError::Panicked(e.to_string())) {
        progress.fail(format!("preparing the store failed: {e}"));
        progress.set(Phase::Failed);
        return progress.status(clock.now_ms());
    }
    let metrics = Arc::new(crate::metrics::Metrics::default());
    let forwarding = super::engine::forward(store.clone(), config, plan, clock.clone(), metrics, progress.clone());
    let mut pass = tokio::spawn(forwarding);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + EVERY, EVERY);
    let ok = loop {
        tokio::select! {
            ok = &mut pass => break ok.unwrap_or(false),
            _ = tick.tick() => eprintln!("{}", progress.status(clock.now_ms()).line()),
        }
    };
    // Flushed and closed, so the next courier on this dir starts from a clean store.
    let _ = tokio::task::spawn_blocking(move || store.close()).await;
    if !ok {
        progress.set(Phase::Failed);
    }
    progress.status(clock.now_ms())
}

/// Asks the courier that runs on the data dir to drain, and follows it.
async fn running(config: &Config, plan: DrainPlan) -> Result<Status, String> {
    let admin = crate::operator::AdminClient::new(config);
    let dir = config.data_dir.display();
    eprintln!("drain: a courier runs on {dir}; asking it to drain through its admin API");
    let body = serde_json::json!({
        "to": plan.to.as_str(),
        "concurrency": plan.concurrency,
        "deliver_for": format!("{}ms", plan.deliver_for.as_millis()),
    });
    let started = admin.call_with(http::Method::POST, "/drain", Some(&body)).await;
    let mut answer = started.map_err(|e| match e {
        crate::operator::OperatorError::Api { code, message, .. } => {
            format!("the courier running on {dir} did not start the drain: {message} ({code})")
        }
        e => e.to_string(),
    })?;
    let mut printed_refusals = 0;
    loop {
        let status: Status = serde_json::from_value(answer.1)
            .map_err(|e| format!("the admin API's /drain answer is not understood: {e}"))?;
        for r in status.refusals.iter().filter(|r| r.seq > printed_refusals) {
            eprintln!(
                "drain: {} (event {}) refused by the peer: {} {}: {}; it stays pending",
                r.id, r.event_id, r.status, r.code, r.message
            );
        }
        printed_refusals = status.refusals.iter().fold(printed_refusals, |n, r| n.max(r.seq));
        if status.state.ended() {
            return Ok(status);
        }
        eprintln!("{}", status.line());
        let next = admin.call_with(http::Method::GET, "/drain?wait=1s", None).await;
        answer = next.map_err(|e| e.to_string())?;
    }
}

/// The drain under way (or the last one).
struct Current {
    to: Url,
    progress: Arc<Progress>,
    task: AbortHandle,
}

/// A running courier's drain, which `POST /drain` starts and `GET /drain` shows. Where it
/// may send is checked before anything changes ([`super::plan`]): a refused peer leaves
/// courier serving.
///
/// The steps, each finished before the next:
/// 1. ingress answers `503 shutting_down` and `/readyz` 503 (what a shutdown does first):
///    nothing new comes in, and a Service stops routing here;
/// 2. with `deliver_for`, courier keeps delivering as usual until nothing is open or the
///    time is up (it waits on attempts ending, never polls);
/// 3. the scheduler stops (no new attempts); new accepts (courier's own pause alerts, and
///    ingress requests already past the `draining` check, which the drain waits for) go to
///    the queue instead of to an attempt; the attempts running get `shutdown_grace` to
///    finish, then are cut off and requeued, as at shutdown;
/// 4. the forwarding pass ([`super::engine`]) hands every open message to the peer.
///
/// Afterwards courier stays up, drained: ingress refuses, nothing is attempted, until it is
/// stopped (a pod's `preStop` returns and the kubelet sends SIGTERM). A second `POST` with
/// the same peer joins the drain under way (a `preStop` retried, or the verb run again);
/// after a drain ended, it runs another pass (what the peer refused may go now). SIGTERM
/// during a drain stops it: what is not handed off stays pending, as after a kill.
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

/// The drain under way, if one is.
fn under_way(current: &Option<Current>) -> Option<&Current> {
    current.as_ref().filter(|c| !c.progress.update(|s| s.state.ended()))
}

impl DrainControl {
    /// Handles `/drain` (the admin API has checked the token).
    pub async fn handle(self: &Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let ok = |status: StatusCode, s: Status| serve::json(status, &serde_json::to_value(s).unwrap_or_default());
        match *req.method() {
            Method::GET => {
                let query = req.uri().query().unwrap_or_default().as_bytes();
                let wait = url::form_urlencoded::parse(query).find(|(k, _)| k == "wait");
                match wait.map(|(_, v)| crate::config::units::parse_duration(&v)) {
                    Some(Err(e)) => serve::error(StatusCode::BAD_REQUEST, "invalid_request", format!("wait: {e}")),
                    Some(Ok(wait)) => ok(StatusCode::OK, self.status_after(wait.min(MAX_WAIT)).await),
                    None => ok(StatusCode::OK, self.status()),
                }
            }
            Method::POST => match read_request(req).await.and_then(|request| self.start(request)) {
                Ok(status) => ok(StatusCode::ACCEPTED, status),
                Err(e) => serve::error(e.status(), e.0, e.1),
            },
            _ => serve::error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{} is not allowed on /drain", req.method()),
            ),
        }
    }

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

    fn lock(&self) -> MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current (or last) drain's status.
    pub fn status(&self) -> Status {
        let Some(progress) = self.lock().as_ref().map(|c| c.progress.clone()) else {
            return Status::default();
        };
        let mut status = progress.status(self.d.context().clock().now_ms());
        // Nothing undoes the drain's stop short of a restart: say so where it is read.
        status.delivery_stopped = status.state == Phase::Failed;
        status
    }

    /// The status once the drain under way has ended, or `wait` is over.
    pub async fn status_after(&self, wait: Duration) -> Status {
        let mut ended = self.ended.subscribe();
        if under_way(&self.lock()).is_some() && !wait.is_zero() {
            let _ = tokio::time::timeout(wait, ended.changed()).await;
        }
        self.status()
    }

    /// Starts a drain, or joins the one under way to the same peer; the request is checked
    /// before anything changes.
    pub fn start(self: &Arc<Self>, request: DrainRequest) -> Result<Status, NotStarted> {
        let plan = request.plan(&self.d.context().config().drain, true)?;
        let mut current = self.lock();
        // Read under the lock `abort` takes after setting it: a drain either starts before
        // the abort (which then stops it) or not at all.
        if self.closed.load(Ordering::SeqCst) {
            // A drain started now would be cut off at once.
            let why = "courier is shutting down; drain its data dir once it has stopped (courier drain --data-dir)";
            return Err(NotStarted("shutting_down", why.into()));
        }
        if let Some(c) = under_way(&current) {
            if c.to != plan.to {
                let why = "wait for it (GET /drain) or drain to the same peer";
                let running = url_for_log(c.to.as_str());
                return Err(NotStarted(
                    "drain_running",
                    format!("a drain to {running} is under way; {why}"),
                ));
            }
        } else {
            let first = if plan.deliver_for.is_zero() {
                Phase::Stopping
            } else {
                Phase::Delivering
            };
            let progress = Arc::new(Progress::new(url_for_log(plan.to.as_str()), first));
            let to = plan.to.clone();
            let task = tokio::spawn(self.clone().run(plan, progress.clone()));
            let task = task.abort_handle();
            *current = Some(Current { to, progress, task });
        }
        drop(current);
        Ok(self.status())
    }

    /// Stops a drain under way (shutdown): what is not handed off stays pending.
    pub fn abort(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Some(c) = under_way(&self.lock()) {
            c.task.abort();
            c.progress.fail("courier is shutting down".into());
            c.progress.set(Phase::Failed);
            self.ended.send_modify(|n| *n += 1);
        }
    }

    async fn run(self: Arc<Self>, plan: DrainPlan, progress: Arc<Progress>) {
        self.draining.store(true, Ordering::SeqCst);
        tracing::info!(to = %url_for_log(plan.to.as_str()), deliver_for_ms = plan.deliver_for.as_millis() as u64,
            "drain: started; ingress refuses new messages from now on");
        if !plan.deliver_for.is_zero() {
            self.deliver_until_empty(plan.deliver_for).await;
            progress.set(Phase::Stopping);
        }
        self.stop_attempts().await;
        let d = &self.d;
        let ctx = d.context();
        let (store, clock, metrics) = (ctx.store().clone(), ctx.clock().clone(), ctx.metrics().clone());
        let ok = super::engine::forward(store, ctx.config(), plan, clock, metrics, progress.clone()).await;
        let status = progress.status(ctx.clock().now_ms());
        tracing::info!(
            handed_off = status.handed_off,
            already_at_peer = status.already_at_peer,
            refused = status.refused,
            left = status.left,
            error = status.error.as_deref(),
            "drain: {}",
            status.state.as_str()
        );
        if !ok {
            tracing::warn!("drain: delivery stays stopped until courier restarts (ingress refuses, nothing is attempted); restart it, or drain again");
        }
        self.ended.send_modify(|n| *n += 1);
    }

    /// Step 3: no attempt holds a message any more, and none starts.
    async fn stop_attempts(&self) {
        // What is accepted from now on (courier's own alerts, requests already past
        // ingress's check) waits in the queue rather than starting an attempt at accept.
        // Set before the scheduler stops, so no accept dispatches between its last pass and
        // the stop; and again after, as that last pass may have cleared it.
        self.d.set_queue_waiting(true);
        let _ = self.stop_scheduler.send(true);
        let _ = self.scheduler_stopped.clone().wait_for(|s| *s).await;
        self.d.set_queue_waiting(true);
        // What waits in memory for its host goes back to the queue, to be forwarded (after
        // the scheduler's last pass, which may line up more).
        self.d.close_lines().await;
        // Requests that passed ingress's `draining` check before it was set commit their
        // message now: wait for them, so the walk sees it. Bounded by the time a body has
        // to arrive; one that still commits later is met by the engine's re-count.
        let under_way = self.accepts.count();
        if under_way > 0 {
            tracing::info!(count = under_way, "drain: waiting for ingress requests under way");
        }
        if !self.accepts.wait_idle(BODY_READ_TIMEOUT + ACCEPT_COMMIT_MARGIN).await {
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
    }

    /// Delivers as usual until nothing is open or `budget` is over, checking each time the
    /// attempts in flight run out (the only moment the open count can reach zero).
    async fn deliver_until_empty(&self, budget: Duration) {
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            let idle = self.d.next_idle();
            let store = self.d.context().store().clone();
            let open = tokio::task::spawn_blocking(move || store.counts().map(|c| c.open)).await;
            if matches!(open, Ok(Ok(0))) {
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
