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
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};

use super::control::DrainControl;
use super::plan::{DrainPlan, DrainRequest, NotStarted};
use super::progress::{Phase, Progress, Status};
use crate::args::GlobalArgs;
use crate::clock::{SharedClock, SystemClock};
use crate::config::Config;
use crate::inbound::serve::{self, Body};
use crate::redact::url_for_log;
use crate::store::{Store, StoreError};

/// Longest `POST /drain` body.
const MAX_BODY: usize = 16 << 10;
/// Longest `GET /drain?wait=`.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// How often the offline verb prints progress.
const EVERY: Duration = Duration::from_secs(1);

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
}

/// The `POST /drain` body (empty: every default), or why it is bad.
async fn read_request(req: Request<Incoming>) -> Result<DrainRequest, NotStarted> {
    let bad = |message: String| NotStarted("invalid_request", message);
    // Bounded in size and time: a client that stops sending must not hold the request.
    let reading = Limited::new(req.into_body(), MAX_BODY).collect();
    let body = match tokio::time::timeout(crate::inbound::ingress::BODY_READ_TIMEOUT, reading).await {
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
    match Store::open(&config.data_dir, crate::args::store_options(&config)) {
        Ok(store) => Ok(offline(config, Arc::new(store), plan).await),
        Err(StoreError::Locked(_)) => running(&config, plan).await,
        Err(e) => Err(e.to_string()),
    }
}

/// The pass here, on a store nobody else has open.
async fn offline(config: Arc<Config>, store: Arc<Store>, plan: DrainPlan) -> Status {
    let clock: SharedClock = Arc::new(SystemClock);
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
        printed_refusals = status
            .refusals
            .last()
            .map_or(printed_refusals, |r| r.seq.max(printed_refusals));
        if status.state.ended() {
            return Ok(status);
        }
        eprintln!("{}", status.line());
        let next = admin.call_with(http::Method::GET, "/drain?wait=1s", None).await;
        answer = next.map_err(|e| e.to_string())?;
    }
}
