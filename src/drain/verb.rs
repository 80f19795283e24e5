//! `courier drain --to <URL>`: hands this courier's open messages to another courier.
//!
//! Which courier's messages: the data dir of the usual settings (`--data-dir`,
//! `COURIER_DATA_DIR`, `data_dir`). Its RocksDB lock says whether a courier runs on it:
//! - free: nobody serves it (a stopped courier, a volume left by a scaled-down replica), so
//!   the verb opens the store itself, puts back what a crash left in flight, and runs the
//!   forwarding pass here;
//! - locked: a courier runs on it, so the verb asks that courier through its admin API
//!   (`POST /drain`, found like `courier deliveries`), which stops attempting and runs the
//!   same pass itself; the verb follows it with `GET /drain?wait=1s`. That courier drains
//!   only to a peer of its `[drain] to` / `peers`: it refuses any other `--to`.
//!
//! Offline, `--to` may name any peer; one not listed in `[drain] to` / `peers` is reached
//! under the `[egress]` policy, as deliveries are. Either way a plain-http peer needs
//! `[drain] token` (its receipts are what prove it stored a message: `super::receipt`).
//!
//! Either way progress goes to stderr once a second (count, rate, remaining), the last line
//! to stdout, and the exit code is 0 only when every open message was handed off.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::control::{BadPlan, DrainPlan, DrainRequest};
use super::engine::Engine;
use super::progress::{Phase, Progress, Status};
use super::request::PeerAddr;
use crate::args::GlobalArgs;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::store::{Store, StoreError, StoreOptions};

/// How often progress is printed.
const EVERY: Duration = Duration::from_secs(1);

/// `courier drain`.
#[derive(Debug, Args)]
pub struct DrainArgs {
    /// The peer courier's ingress, e.g. http://courier-tier:8787 (also [drain] to, COURIER_DRAIN_TO;
    /// a running courier takes only [drain] to or one of [drain] peers).
    #[arg(long, value_name = "URL")]
    pub to: Option<String>,
    /// Messages forwarded at once, 1 to 256 (also [drain] concurrency; default 16).
    #[arg(long, value_name = "N")]
    pub concurrency: Option<u32>,
    /// With a running courier: keep delivering for up to this long (or until nothing is
    /// open), then forward the rest, e.g. 20s.
    #[arg(long, value_name = "DURATION")]
    pub deliver_for: Option<String>,
}

/// Runs the verb; the exit code is 0 when everything open was handed off, 1 when some of it
/// stays here (refused, in flight, the peer failed), 2 for bad settings.
pub fn run(global: &GlobalArgs, args: DrainArgs) -> ExitCode {
    let config = match crate::args::load_config(global) {
        Ok(c) => c,
        Err(e) => return usage(&e.to_string()),
    };
    crate::args::init_logging(config.log.format, "warn");
    let request = DrainRequest {
        to: args.to,
        concurrency: args.concurrency,
        deliver_for: args.deliver_for,
    };
    let plan = match request.plan(&config.drain, false) {
        Ok(plan) => plan,
        Err(BadPlan(_, message)) => return usage(&message),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return failed(&format!("cannot start the runtime: {e}")),
    };
    let status = runtime.block_on(async {
        if !config.data_dir.is_dir() {
            return Err(format!(
                "no data dir at {} (give the drained courier's --data-dir)",
                config.data_dir.display()
            ));
        }
        match Store::open(&config.data_dir, store_options(&config)) {
            Ok(store) => Ok(offline(&config, Arc::new(store), plan).await),
            Err(StoreError::Locked(_)) => running(&config, plan).await,
            Err(e) => Err(e.to_string()),
        }
    });
    match status {
        Ok(status) => {
            println!("{}", status.line());
            if status.complete() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => failed(&e),
    }
}

fn usage(message: &str) -> ExitCode {
    eprintln!("courier: {message}");
    ExitCode::from(2)
}

fn failed(message: &str) -> ExitCode {
    eprintln!("courier: {}", crate::redact::escape(message));
    ExitCode::FAILURE
}

fn store_options(config: &Config) -> StoreOptions {
    StoreOptions {
        retention_ms: config.retention.as_millis() as u64,
        dead_retention_ms: config.dead_retention.as_millis() as u64,
        ..StoreOptions::default()
    }
}

/// The pass here, on a store nobody else has open.
async fn offline(config: &Config, store: Arc<Store>, plan: DrainPlan) -> Status {
    let clock: Arc<SystemClock> = Arc::new(SystemClock);
    let to = crate::redact::url_for_log(plan.to.as_str());
    if !plan.deliver_for.is_zero() {
        eprintln!("drain: no courier runs on {}: nothing delivers from it, so everything open is forwarded now (--deliver-for applies to a running courier)", config.data_dir.display());
    }
    eprintln!(
        "drain: {} is not in use; forwarding its open messages to {to}",
        config.data_dir.display()
    );
    // As a start would: what a crash left in flight is open again, lines are whole.
    let (s, now) = (store.clone(), clock.now_ms());
    let recovered = tokio::task::spawn_blocking(move || {
        for (id, e) in s.recover_in_flight(now)?.1 {
            eprintln!("drain: message {id} does not read ({e}); it stays here");
        }
        s.recover_lines(now)
    })
    .await;
    let progress = Arc::new(Progress::default());
    if let Ok(Err(e)) | Err(e) = recovered.map_err(|e| StoreError::Panicked(e.to_string())) {
        progress.fail(format!("preparing the store failed: {e}"));
        return progress.status(Phase::Failed, Some(to), clock.now_ms());
    }
    let transport = match super::peer_transport_blocking(Arc::new(config.clone()), plan.concurrency, plan.listed).await
    {
        Ok(t) => t,
        Err(e) => {
            progress.fail(format!("cannot make the peer client: {e}"));
            return progress.status(Phase::Failed, Some(to), clock.now_ms());
        }
    };
    let engine = Arc::new(Engine {
        store: store.clone(),
        transport,
        peer: PeerAddr {
            url: plan.to,
            token: config.drain.token.clone(),
            timeout: config.delivery.request_timeout,
        },
        clock: clock.clone(),
        metrics: Arc::new(crate::metrics::Metrics::default()),
        concurrency: plan.concurrency as usize,
        progress: progress.clone(),
    });
    let mut pass = tokio::spawn(engine.run());
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + EVERY, EVERY);
    let ok = loop {
        tokio::select! {
            ok = &mut pass => break ok.unwrap_or(false),
            _ = tick.tick() => eprintln!("{}", progress.status(Phase::Forwarding, Some(to.clone()), clock.now_ms()).line()),
        }
    };
    // Flushed and closed, so the next courier on this dir starts from a clean store.
    let _ = tokio::task::spawn_blocking(move || store.close()).await;
    let phase = if ok { Phase::Done } else { Phase::Failed };
    progress.status(phase, Some(to), clock.now_ms())
}

/// Asks the courier that runs on the data dir to drain, and follows it.
async fn running(config: &Config, plan: DrainPlan) -> Result<Status, String> {
    let admin = crate::operator::AdminClient::new(config);
    eprintln!(
        "drain: a courier runs on {}; asking it to drain through its admin API",
        config.data_dir.display()
    );
    let body = serde_json::json!({
        "to": plan.to.as_str(),
        "concurrency": plan.concurrency,
        "deliver_for": format!("{}ms", plan.deliver_for.as_millis()),
    });
    let started = admin
        .call_with(http::Method::POST, "/drain", Some(&body))
        .await
        .map_err(|e| match e {
            crate::operator::OperatorError::Api { code, message, .. } => format!(
                "the courier running on {} did not start the drain: {message} ({code})",
                config.data_dir.display()
            ),
            e => e.to_string(),
        })?;
    let mut status = parse(started.1)?;
    let mut printed_refusals = 0;
    loop {
        for r in &status.refusals {
            if r.seq > printed_refusals {
                eprintln!(
                    "drain: {} (event {}) refused by the peer: {} {}: {}; it stays pending",
                    r.id, r.event_id, r.status, r.code, r.message
                );
                printed_refusals = r.seq;
            }
        }
        if status.state.ended() {
            return Ok(status);
        }
        eprintln!("{}", status.line());
        let (_, next) = admin
            .call_with(http::Method::GET, "/drain?wait=1s", None)
            .await
            .map_err(|e| e.to_string())?;
        status = parse(next)?;
    }
}

fn parse(v: serde_json::Value) -> Result<Status, String> {
    serde_json::from_value(v).map_err(|e| format!("the admin API's /drain answer is not understood: {e}"))
}
