//! A reproducible benchmark of courier against baselines measured in the same run.
//!
//! ```text
//! cargo build --release --bin courier
//! cargo run --release --example loadgen -- [--quick | --smoke] [--sustain-only | --many-only | --fleet-only | --floor-only] [--json out.json] [--backlog N]
//! ```
//!
//! It starts the release `courier` binary (found next to this executable, or `--courier PATH`)
//! on temporary data dirs with loopback delivery allowed, a fast receiver (hyper, answers 200)
//! inside this process, and measures:
//!
//! - baselines: (a) a minimal hyper server answering 202 with no persistence, in a child
//!   process (this binary re-executed with `--serve-baseline`) — the network and HTTP limit;
//!   (b) RocksDB's own `sync = true` write rate for courier's per-message record set, with N
//!   threads each writing single records (RocksDB's group commit) and with one thread writing
//!   batches of N; (c) a direct POST to the receiver with no proxy in between; (d) and (e)
//!   durable 202s (group-committed fdatasync, RocksDB); (f) a non-durable forwarding proxy
//!   that answers 202 once the receiver answered; (g) the minimal durable forwarder (synced
//!   RocksDB group commit, 202, forward, delete; `--floor-only` only); and nginx as a peer
//!   proxy when installed;
//! - ingest (202/s, closed loop, N keep-alive connections each sending back-to-back 1 KiB
//!   JSON POSTs) with the receiver down (a dead port) and up;
//! - ack latency at 25% of the measured maximum (open loop: sends are scheduled at fixed
//!   intervals and latency counts from the scheduled time, so a stall is not hidden by the
//!   sender waiting for it — no coordinated omission);
//! - end to end: 202 → receiver latency idle (one message at a time) and under load, and
//!   deliveries/s;
//! - sustainable rate: the highest open-loop rate whose scheduled-send → receiver p99 stays
//!   within 100 ms with under one second of backlog, for courier, (f) and nginx; latency at
//!   50% and 90% of it; courier's CPU per delivered message;
//! - backlog: N messages accepted for a paused endpoint, then RSS, data-dir size, CPU while
//!   nothing is due, restart-to-ready after kill -9, and the drain rate once resumed;
//! - many endpoints: N messages to N distinct endpoints over up to 1,000 loopback hosts
//!   (`127.0.x.y`; one in ten answers 410) against N messages to one endpoint: finished/s,
//!   courier's RSS and open sockets (peak and settled), and `GET /endpoints?limit=100`
//!   latency at that scale;
//! - fleet (`--fleet-only` only): courier's sustainable rate with `[fleet]` on a
//!   `redis-server` this run starts (Debian's; the run fails without one) and without it,
//!   their ratio, and Redis's CPU and script calls per delivered message. Not part of
//!   `--smoke`'s run (two searches take longer than its seconds): smoke-test it with
//!   `--smoke --fleet-only`;
//! - floor (`--floor-only` only, `--pairs N`): courier against (g) in pairs run courier,
//!   (g), (g), courier, each on a fresh data dir: closed-loop delivered/s with CPU, context
//!   switches and bytes written per delivered message, CPU and ack latency at fixed rates,
//!   the sustainable rate; medians, ratios and their targets. Not part of the full run (12
//!   runs of three phases per 3 pairs); smoke-tested with `--smoke --floor-only`.
//!
//! It prints one table (each figure with its ratio to a baseline of the same run) and writes
//! the numbers as JSON (`--json`, default `bench-results.json`). `--smoke` runs every scenario
//! at a tiny scale in seconds and asserts only that each one worked (for CI).
//!
//! Modules: [`args`] (flags and run sizes), [`load`] (closed and open loops, pacing),
//! [`receiver`], [`courier`] (the courier process and `/proc` readings), [`baselines`] and
//! [`nginx`] and [`floor_server`] (the servers compared with), [`report`], and one module per
//! group of scenarios: [`run`], [`e2e`], [`sustain`] (with [`probe`]), [`backlog`], [`many`]
//! (with [`hosts`] and [`fanout`]), [`fleet`], [`seal`] and [`floor`].
#![allow(clippy::disallowed_methods)] // A tool: real time and fresh randomness are what it wants.

mod args;
mod backlog;
mod baselines;
mod courier;
mod e2e;
mod fanout;
mod fleet;
mod floor;
mod floor_server;
mod hosts;
mod load;
mod many;
mod nginx;
mod probe;
mod receiver;
mod report;
mod run;
mod seal;
mod sustain;

use bytes::Bytes;
use clap::Parser;

use crate::args::Args;

/// A failure of the benchmark itself.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Msg(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("http: {0}")]
    Hyper(#[from] hyper::Error),
    #[error("http: {0}")]
    Http(#[from] http::Error),
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
}

/// A benchmark failure with a message.
pub fn err(s: impl Into<String>) -> Error {
    Error::Msg(s.into())
}

/// The benchmark's result type.
pub type Res<T> = Result<T, Error>;

/// Awaits a spawned task, turning a panic or cancellation into an [`Error`].
pub async fn joined<T>(h: tokio::task::JoinHandle<T>) -> Res<T> {
    h.await.map_err(|e| err(e.to_string()))
}

/// The 1 KiB JSON body every POST carries: padded with `x` (it packs to a few percent), or
/// with `event`, a typical event (ids, amounts, URLs: it packs to about 85% on its own), for
/// what compression does with real payloads.
pub fn body_1k(event: bool) -> Bytes {
    let mut s = String::with_capacity(1024);
    if event {
        // Ids from a fixed generator: the same body every run, no two ids alike.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut id = |prefix: &str, n: usize| {
            let alphabet = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
            let mut out = prefix.to_string();
            for _ in 0..n {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                out.push(alphabet[(x >> 58) as usize % alphabet.len()] as char);
            }
            out
        };
        s.push_str(&format!(
            r#"{{"id":"{}","object":"event","type":"invoice.paid","created":1733500000,"data":{{"object":{{"id":"{}","customer":"{}","charge":"{}","payment_intent":"{}","subscription":"{}","amount_due":4200,"amount_paid":4200,"currency":"eur","customer_email":"jane.doe@example.com","hosted_invoice_url":"https://invoice.example.com/i/{}","invoice_pdf":"https://pay.example.com/invoice/{}/pdf","lines":[{{"id":"{}","amount":4200,"price":"{}","product":"{}","period":{{"start":1733500000,"end":1736178400}}}}],"status":"paid"}}}},"request":{{"id":"{}","idempotency_key":"{}"}},"note":""#,
            id("evt_", 24), id("in_", 24), id("cus_", 14), id("ch_", 24), id("pi_", 24), id("sub_", 24),
            id("", 40), id("", 40), id("il_", 24), id("price_", 24), id("prod_", 14), id("req_", 14), id("", 36)
        ));
        let pad = 1024 - s.len() - 2;
        s.push_str(&id("", pad));
    } else {
        s.push_str(r#"{"type":"invoice.paid","data":{"customer":"cus_0001","amount":4200,"currency":"eur"},"pad":""#);
        s.extend(std::iter::repeat_n('x', 1024 - s.len() - 2));
    }
    s.push_str(r#""}"#);
    assert_eq!(s.len(), 1024);
    Bytes::from(s)
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let result = if let Some(flag) = &args.serve_floor_baseline {
        // (g) builds a runtime of its own (two workers, as the forwarder it copies).
        floor_server::serve(flag)
    } else {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        run_on(&rt, args)
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs what the flags ask for on `rt`.
fn run_on(rt: &tokio::runtime::Runtime, args: Args) -> Res<()> {
    if args.serve_baseline {
        rt.block_on(baselines::serve_baseline())
    } else if let Some(dir) = args.serve_durable_baseline.clone() {
        rt.block_on(baselines::serve_durable_baseline(dir, args.rocksdb))
    } else if let Some(receiver) = args.serve_forward_baseline {
        rt.block_on(baselines::serve_forward_baseline(receiver))
    } else if let Some(rate) = args.ack_only {
        rt.block_on(e2e::ack_only(args, rate))
    } else if let Some(rate) = args.probe_at {
        rt.block_on(sustain::probe_at(args, rate))
    } else if args.sustain_only {
        rt.block_on(run::sustain_only(args))
    } else if args.many_only {
        rt.block_on(many::many_only(args))
    } else if args.fleet_only {
        rt.block_on(fleet::fleet_only(args))
    } else if args.seal_only {
        rt.block_on(seal::seal_only(args))
    } else if args.floor_only {
        rt.block_on(floor::floor_only(args))
    } else {
        rt.block_on(run::run(args))
    }
}
