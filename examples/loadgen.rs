//! A reproducible benchmark of courier against baselines measured in the same run.
//!
//! ```text
//! cargo build --release --bin courier
//! cargo run --release --example loadgen -- [--quick | --smoke] [--json out.json] [--backlog N]
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
//!   batches of N; (c) a direct POST to the receiver with no proxy in between;
//! - ingest (202/s, closed loop, N keep-alive connections each sending back-to-back 1 KiB
//!   JSON POSTs) with the receiver down (a dead port) and up;
//! - ack latency at 25% of the measured maximum (open loop: sends are scheduled at fixed
//!   intervals and latency counts from the scheduled time, so a stall is not hidden by the
//!   sender waiting for it — no coordinated omission);
//! - end to end: 202 → receiver latency idle (one message at a time) and under load, and
//!   deliveries/s;
//! - backlog: N messages accepted for a paused endpoint, then RSS, data-dir size, CPU while
//!   nothing is due, restart-to-ready after kill -9, and the drain rate once resumed.
//!
//! It prints one table (each figure with its ratio to a baseline of the same run) and writes
//! the numbers as JSON (`--json`, default `bench-results.json`). `--smoke` runs every scenario
//! at a tiny scale in seconds and asserts only that each one worked (for CI).

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http::header::{CONTENT_TYPE, HOST};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Command-line flags.
#[derive(Parser, Debug, Clone)]
#[command(about = "Benchmark courier against same-run baselines")]
struct Args {
    /// A shorter run: 3 s per point and a 20,000-message backlog.
    #[arg(long)]
    quick: bool,
    /// A seconds-long run of every scenario at tiny scale; asserts nothing about speed.
    #[arg(long, conflicts_with = "quick")]
    smoke: bool,
    /// Where to write the results as JSON.
    #[arg(long, default_value = "bench-results.json")]
    json: PathBuf,
    /// The courier binary (default: `courier` next to this executable).
    #[arg(long)]
    courier: Option<PathBuf>,
    /// Messages accepted in the backlog scenario (default 1,000,000; 20,000 with --quick).
    #[arg(long)]
    backlog: Option<u64>,
    /// Seconds measured per throughput point (default 10; 3 with --quick).
    #[arg(long)]
    duration: Option<f64>,
    /// Connection counts for the ingest points.
    #[arg(long, value_delimiter = ',')]
    conns: Option<Vec<usize>>,
    /// Per-host in-flight cap given to courier.
    #[arg(long, default_value_t = 64)]
    max_in_flight: u32,
    /// Only the ack-latency scenario, at this many requests per second (receiver up), with
    /// baseline (a) at the same rate: for tuning the tail without the whole run.
    #[arg(long)]
    ack_only: Option<f64>,
    /// Internal: serve baseline (a) and print its port.
    #[arg(long, hide = true)]
    serve_baseline: bool,
    /// Internal: serve baseline (d) (bodies group-committed to a file in this dir) and
    /// print its port.
    #[arg(long, hide = true)]
    serve_durable_baseline: Option<PathBuf>,
    /// Internal: with `--serve-durable-baseline`, commit to RocksDB (baseline (e)).
    #[arg(long, hide = true)]
    rocksdb: bool,
}

/// Sizes and durations of one run.
#[derive(Debug, Clone)]
struct Plan {
    mode: &'static str,
    conns: Vec<usize>,
    warmup: Duration,
    duration: Duration,
    idle_samples: usize,
    backlog: u64,
    cpu_window: Duration,
    drain_timeout: Duration,
}

impl Plan {
    fn from(args: &Args) -> Plan {
        let (mode, conns, warmup, duration, idle, backlog, cpu) = if args.smoke {
            ("smoke", vec![4], 0.1, 0.3, 5, 200, 0.5)
        } else if args.quick {
            ("quick", vec![16, 64, 256], 1.0, 3.0, 100, 20_000, 5.0)
        } else {
            ("full", vec![16, 64, 256], 2.0, 10.0, 300, 1_000_000, 5.0)
        };
        Plan {
            mode,
            conns: args.conns.clone().unwrap_or(conns),
            warmup: Duration::from_secs_f64(warmup),
            duration: Duration::from_secs_f64(args.duration.unwrap_or(duration)),
            idle_samples: idle,
            backlog: args.backlog.unwrap_or(backlog),
            cpu_window: Duration::from_secs_f64(cpu),
            drain_timeout: Duration::from_secs(if args.smoke { 30 } else { 3600 }),
        }
    }
}

/// A failure of the benchmark itself.
#[derive(Debug, thiserror::Error)]
enum Error {
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

fn err(s: impl Into<String>) -> Error {
    Error::Msg(s.into())
}

type Res<T> = Result<T, Error>;

/// The 1 KiB JSON body every POST carries.
fn body_1k() -> Bytes {
    let head = r#"{"type":"invoice.paid","data":{"customer":"cus_0001","amount":4200,"currency":"eur"},"pad":""#;
    let tail = r#""}"#;
    let pad = 1024 - head.len() - tail.len();
    let mut s = String::with_capacity(1024);
    s.push_str(head);
    s.extend(std::iter::repeat_n('x', pad));
    s.push_str(tail);
    assert_eq!(s.len(), 1024);
    Bytes::from(s)
}

// ---------------------------------------------------------------- latency statistics

/// Percentiles of a set of latencies (microseconds).
#[derive(Debug, Clone, Default)]
struct Lat {
    n: usize,
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

impl Lat {
    fn of(mut us: Vec<i64>) -> Lat {
        if us.is_empty() {
            return Lat::default();
        }
        us.sort_unstable();
        let q = |p: f64| us[((us.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0;
        Lat {
            n: us.len(),
            p50: q(0.50),
            p90: q(0.90),
            p99: q(0.99),
            p999: q(0.999),
            max: *us.last().unwrap() as f64 / 1000.0,
        }
    }

    fn json(&self) -> Value {
        json!({"n": self.n, "p50_ms": self.p50, "p90_ms": self.p90, "p99_ms": self.p99,
               "p999_ms": self.p999, "max_ms": self.max})
    }
}

// ---------------------------------------------------------------- HTTP plumbing

/// One keep-alive HTTP/1.1 client connection.
struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Conn {
    async fn open(addr: SocketAddr) -> Res<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { sender })
    }

    /// Sends one request and reads the whole answer.
    async fn send(&mut self, req: Request<Full<Bytes>>) -> Res<(StatusCode, Bytes)> {
        self.sender.ready().await?;
        let resp = self.sender.send_request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}

/// What the load generator sends: a path-form POST to courier (or a plain POST).
#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    path: String,
    body: Bytes,
    /// Unique event ids across the whole run (`webhook-id: lg-<n>`), so deliveries can be
    /// matched to their 202 and no two messages are duplicates of each other.
    seq: Arc<AtomicU64>,
}

impl Target {
    fn request(&self) -> Res<(u64, Request<Full<Bytes>>)> {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let req = Request::builder()
            .method(Method::POST)
            .uri(self.path.as_str())
            .header(HOST, self.addr.to_string())
            .header(CONTENT_TYPE, "application/json")
            .header("webhook-id", format!("lg-{n}"))
            .body(Full::new(self.body.clone()))?;
        Ok((n, req))
    }
}

/// A one-shot request to an admin API.
async fn admin(addr: SocketAddr, method: Method, path: &str) -> Res<(StatusCode, String)> {
    let mut c = Conn::open(addr).await?;
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, addr.to_string())
        .body(Full::new(Bytes::new()))?;
    let (s, b) = c.send(req).await?;
    Ok((s, String::from_utf8_lossy(&b).into_owned()))
}

/// Reads one un-labelled value from courier's Prometheus text.
async fn metric(addr: SocketAddr, name: &str) -> Res<f64> {
    let (_, text) = admin(addr, Method::GET, "/metrics").await?;
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| err(format!("metric {name} not found")))
}

/// Serves HTTP/1.1 on `listener`, answering every request with `status` after reading its
/// body; `on_request` sees each request's headers first.
async fn serve_fixed<F>(listener: TcpListener, status: StatusCode, answer: Bytes, on_request: F)
where
    F: Fn(&http::HeaderMap) + Send + Sync + 'static,
{
    let on_request = Arc::new(on_request);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let on_request = on_request.clone();
        let answer = answer.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let on_request = on_request.clone();
            let answer = answer.clone();
            async move {
                let (parts, body) = req.into_parts();
                let _ = body.collect().await;
                on_request(&parts.headers);
                let mut resp = Response::new(Full::new(answer));
                *resp.status_mut() = status;
                resp.headers_mut()
                    .insert(CONTENT_TYPE, "application/json".parse().unwrap());
                Ok::<_, Infallible>(resp)
            }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The fast local receiver: answers 200 at once, counts deliveries and, when asked, notes
/// the arrival time of each event id.
struct Receiver {
    addr: SocketAddr,
    count: AtomicU64,
    record: AtomicBool,
    arrivals: Mutex<HashMap<u64, Instant>>,
    arrived: Notify,
}

impl Receiver {
    async fn start() -> Res<Arc<Receiver>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let r = Arc::new(Receiver {
            addr: listener.local_addr()?,
            count: AtomicU64::new(0),
            record: AtomicBool::new(false),
            arrivals: Mutex::new(HashMap::new()),
            arrived: Notify::new(),
        });
        let me = r.clone();
        tokio::spawn(serve_fixed(listener, StatusCode::OK, Bytes::new(), move |h| {
            let at = Instant::now();
            me.count.fetch_add(1, Ordering::Relaxed);
            if me.record.load(Ordering::Relaxed) {
                let seq = h
                    .get("webhook-id")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("lg-"))
                    .and_then(|v| v.parse::<u64>().ok());
                if let Some(seq) = seq {
                    me.arrivals.lock().unwrap().entry(seq).or_insert(at);
                    me.arrived.notify_one();
                }
            }
        }));
        Ok(r)
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Waits until the receiver has seen `seq`; returns when it arrived.
    async fn wait_for(&self, seq: u64, within: Duration) -> Option<Instant> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(at) = self.arrivals.lock().unwrap().get(&seq) {
                return Some(*at);
            }
            if tokio::time::timeout_at(deadline, self.arrived.notified())
                .await
                .is_err()
            {
                return self.arrivals.lock().unwrap().get(&seq).copied();
            }
        }
    }

    /// Waits until at least `n` deliveries have been counted.
    async fn wait_count(&self, n: u64, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while self.count() < n {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }
}

// ---------------------------------------------------------------- load generation

/// What a load run measured inside its window.
#[derive(Debug, Default)]
struct LoadResult {
    /// 202s completed inside the window.
    accepted: u64,
    /// Other answers and transport errors inside the window.
    failed: u64,
    /// 202s completed over the whole run (warm-up included).
    accepted_total: u64,
    secs: f64,
    lat_us: Vec<i64>,
    /// (event seq, when its 202 arrived) for every 202 of the run.
    acks: Vec<(u64, Instant)>,
}

impl LoadResult {
    fn rate(&self) -> f64 {
        self.accepted as f64 / self.secs.max(1e-9)
    }

    fn merge(&mut self, o: LoadResult) {
        self.accepted += o.accepted;
        self.failed += o.failed;
        self.accepted_total += o.accepted_total;
        self.lat_us.extend(o.lat_us);
        self.acks.extend(o.acks);
    }
}

/// Closed loop: `conns` connections each send back-to-back POSTs from now until `end`
/// (or until `limit` requests have been issued in total); only answers that complete in
/// `[start, end]` count. Any 2xx counts as accepted (courier answers 202, the receiver 200).
async fn closed_loop(
    t: &Target,
    conns: usize,
    start: Instant,
    end: Instant,
    limit: Option<u64>,
    keep_acks: bool,
) -> Res<LoadResult> {
    let issued = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let t = t.clone();
        let issued = issued.clone();
        tasks.push(tokio::spawn(async move {
            let mut r = LoadResult::default();
            let mut conn = None;
            loop {
                if Instant::now() >= end {
                    break;
                }
                if conn.is_none() {
                    match Conn::open(t.addr).await {
                        Ok(c) => conn = Some(c),
                        Err(_) => {
                            r.failed += 1;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    }
                }
                if let Some(limit) = limit {
                    if issued.fetch_add(1, Ordering::Relaxed) >= limit {
                        break;
                    }
                }
                let (seq, req) = t.request()?;
                let sent = Instant::now();
                let outcome = conn.as_mut().unwrap().send(req).await;
                let done = Instant::now();
                let in_window = done >= start && done <= end;
                match outcome {
                    Ok((s, _)) if s.is_success() => {
                        r.accepted_total += 1;
                        if keep_acks {
                            r.acks.push((seq, done));
                        }
                        if in_window {
                            r.accepted += 1;
                            r.lat_us.push((done - sent).as_micros() as i64);
                        }
                    }
                    Ok(_) => r.failed += u64::from(in_window),
                    Err(_) => {
                        r.failed += u64::from(in_window);
                        conn = None;
                    }
                }
            }
            Ok::<_, Error>(r)
        }));
    }
    let mut total = LoadResult::default();
    for task in tasks {
        total.merge(task.await.map_err(|e| err(e.to_string()))??);
    }
    total.secs = (end.min(Instant::now()) - start).as_secs_f64();
    Ok(total)
}

/// Open loop: request i is scheduled at `start + i / rate`; a pool of `conns` connections
/// takes the next scheduled request as soon as it is free, and latency is measured from the
/// scheduled time, so time spent waiting for a free connection counts (no coordinated
/// omission). Requests scheduled before `measure_from` are warm-up.
///
/// The schedule is kept by [`pace`] on its own thread rather than by tokio's timer: tokio's
/// timer wheel fires on millisecond ticks, so a send scheduled between ticks would start up to
/// 1 ms late and the generator's own lag would be charged to the server (it showed as a
/// 1.2 ms p50 for the bare hyper baseline at 5k/s).
async fn open_loop(
    t: &Target,
    conns: usize,
    rate: f64,
    start: Instant,
    measure_from: Instant,
    end: Instant,
) -> Res<LoadResult> {
    let next = Arc::new(AtomicU64::new(0));
    let interval = Duration::from_secs_f64(1.0 / rate.max(1.0));
    let released = Arc::new(tokio::sync::Semaphore::new(0));
    let total = ((end - start).as_secs_f64() / interval.as_secs_f64()).ceil() as u64;
    let pacer = {
        let released = released.clone();
        let start = start.into_std();
        std::thread::spawn(move || pace(&released, start, interval, total, conns))
    };
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let t = t.clone();
        let next = next.clone();
        let released = released.clone();
        tasks.push(tokio::spawn(async move {
            let mut r = LoadResult::default();
            let mut conn = Conn::open(t.addr).await?;
            loop {
                // A permit exists only once a send's scheduled time has passed; the i-th
                // index is taken after at least i + 1 permits were released.
                released.acquire().await.map_err(|e| err(e.to_string()))?.forget();
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let at = start + interval * (i as u32);
                let (_, req) = t.request()?;
                let outcome = conn.send(req).await;
                let done = Instant::now();
                let measured = at >= measure_from;
                match outcome {
                    Ok((s, _)) if s.is_success() => {
                        r.accepted_total += 1;
                        if measured {
                            r.accepted += 1;
                            r.lat_us.push((done - at).as_micros() as i64);
                        }
                    }
                    Ok(_) => r.failed += u64::from(measured),
                    Err(_) => {
                        r.failed += u64::from(measured);
                        conn = Conn::open(t.addr).await?;
                    }
                }
            }
            Ok::<_, Error>(r)
        }));
    }
    let mut total_r = LoadResult::default();
    for task in tasks {
        total_r.merge(task.await.map_err(|e| err(e.to_string()))??);
    }
    pacer.join().map_err(|_| err("the pacer thread panicked"))?;
    total_r.secs = (end - measure_from).as_secs_f64();
    Ok(total_r)
}

/// Releases one permit per scheduled send (send i at `start + i * interval`, `total` sends)
/// once its time has come, sleeping on the OS's high-resolution timer in between; then one
/// more permit per connection so every connection task sees the end.
fn pace(released: &tokio::sync::Semaphore, start: std::time::Instant, interval: Duration, total: u64, conns: usize) {
    let mut given = 0u64;
    while given < total {
        let now = std::time::Instant::now();
        let due = if now < start {
            0
        } else {
            ((now - start).as_nanos() / interval.as_nanos().max(1)) as u64 + 1
        }
        .min(total);
        if due > given {
            released.add_permits((due - given) as usize);
            given = due;
            continue;
        }
        let next = start + interval * (given as u32);
        if next > now {
            std::thread::sleep(next - now);
        }
    }
    released.add_permits(conns);
}

/// An open-loop run at `rate` starting in 200 ms: `plan.warmup` of warm-up, then
/// `plan.duration` measured.
async fn paced(t: &Target, conns: usize, rate: f64, plan: &Plan) -> Res<LoadResult> {
    let start = Instant::now() + Duration::from_millis(200);
    let measure_from = start + plan.warmup;
    open_loop(t, conns, rate, start, measure_from, measure_from + plan.duration).await
}

/// Sequential requests, one at a time on one connection: latency of each.
async fn sequential(t: &Target, n: usize) -> Res<Vec<i64>> {
    let mut conn = Conn::open(t.addr).await?;
    let mut lat = Vec::with_capacity(n);
    for i in 0..n + 10 {
        let (_, req) = t.request()?;
        let sent = Instant::now();
        let (s, _) = conn.send(req).await?;
        if !s.is_success() {
            return Err(err(format!("direct POST answered {s}")));
        }
        if i >= 10 {
            lat.push((Instant::now() - sent).as_micros() as i64);
        }
    }
    Ok(lat)
}

// ---------------------------------------------------------------- processes

/// Resident memory of a process in bytes.
fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// utime + stime of a process, in seconds.
fn cpu_secs(pid: u32) -> f64 {
    static TICK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let tick = *TICK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    });
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at `state`, field 3.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / tick // utime is field 14, stime 15
}

/// Bytes under a directory.
fn dir_size(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else { return 0 };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Samples a process's RSS every 100 ms until `end`; returns the peak.
fn rss_sampler(pid: u32, end: Instant) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut peak = rss(pid);
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(100)).await;
            peak = peak.max(rss(pid));
        }
        peak
    })
}

/// A running courier.
struct Courier {
    child: Child,
    ingress: SocketAddr,
    admin: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Courier {
    /// Starts the binary and waits for its `listening` line; returns it and the time it took.
    fn start(bin: &Path, config: &Path, data: &Path) -> Res<(Courier, Duration)> {
        let t0 = std::time::Instant::now();
        let mut child = Command::new(bin)
            .arg("serve")
            .arg("--config")
            .arg(config)
            .arg("--data-dir")
            .arg(data)
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .env("COURIER_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| err(format!("starting {}: {e}", bin.display())))?;
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let l = log.clone();
        std::thread::spawn(move || {
            // Keep reading to the end so courier never blocks on a full pipe.
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening") {
                    let _ = tx.send(line.clone());
                }
                let mut l = l.lock().unwrap();
                if l.len() < 200 {
                    l.push(line);
                }
            }
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).map_err(|_| {
            let _ = child.kill();
            err(format!("courier did not start: {}", log.lock().unwrap().join("\n")))
        })?;
        let took = t0.elapsed();
        let addr = |key: &str| -> Res<SocketAddr> {
            let at = line
                .find(&format!("{key}="))
                .ok_or_else(|| err(format!("no {key}= in {line}")))?;
            let rest = &line[at + key.len() + 1..];
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '\x1b')
                .unwrap_or(rest.len());
            rest[..end].parse().map_err(|_| err(format!("bad {key} in {line}")))
        };
        let c = Courier {
            ingress: addr("ingress")?,
            admin: addr("admin")?,
            child,
            log,
        };
        Ok((c, took))
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Polls `/readyz` until 200.
    async fn wait_ready(&self) -> Res<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok((s, _)) = admin(self.admin, Method::GET, "/readyz").await {
                if s == StatusCode::OK {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(err("courier never became ready"));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn warnings(&self) -> Vec<String> {
        let l = self.log.lock().unwrap();
        l.iter()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .take(5)
            .cloned()
            .collect()
    }
}

impl Drop for Courier {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A child process killed when this goes out of scope (also on an early error return).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// CPU seconds a process uses between `start` and `end`, read at those two instants.
fn cpu_in_window(pid: u32, start: Instant, end: Instant) -> tokio::task::JoinHandle<f64> {
    tokio::spawn(async move {
        tokio::time::sleep_until(start).await;
        let c0 = cpu_secs(pid);
        tokio::time::sleep_until(end).await;
        cpu_secs(pid) - c0
    })
}

/// CPU time per request in microseconds.
fn us_per(cpu_s: f64, requests: u64) -> f64 {
    cpu_s * 1e6 / requests.max(1) as f64
}

/// CPU used by a process over `window`, as a fraction of one core.
async fn cpu_over(pid: u32, window: Duration) -> f64 {
    let c0 = cpu_secs(pid);
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    (cpu_secs(pid) - c0) / (Instant::now() - t0).as_secs_f64()
}

// ---------------------------------------------------------------- baseline (b): RocksDB

/// Opens a RocksDB with courier's WAL settings.
fn rocks_open(dir: &Path) -> Res<rocksdb::DB> {
    let mut o = rocksdb::Options::default();
    o.create_if_missing(true);
    o.set_max_background_jobs(2);
    o.set_max_total_wal_size(64 << 20);
    o.set_write_buffer_size(4 << 20);
    o.set_recycle_log_file_num(4);
    o.set_compression_type(rocksdb::DBCompressionType::Lz4);
    Ok(rocksdb::DB::open(&o, dir)?)
}

/// The writes courier makes to accept one message: the record, the payload (body and
/// headers), the due-index entry, the state-index entry and the event-id entry.
fn rocks_record(batch: &mut rocksdb::WriteBatch, id: &str, body: &[u8]) {
    let meta = [b'm'; 300];
    let mut payload = Vec::with_capacity(body.len() + 120);
    payload.extend_from_slice(b"content-type: application/json\r\nuser-agent: app/1.0\r\nwebhook-id: lg-0\r\n");
    payload.extend_from_slice(body);
    batch.put(format!("m{id}"), meta);
    batch.put(format!("p{id}"), &payload);
    batch.put(format!("d00000{id}"), b"127.0.0.1:9000 http://127.0.0.1:9000/hook");
    batch.put(format!("s0{id}"), b"");
    batch.put(format!("elg-{id}http://127.0.0.1:9000/hook"), id.as_bytes());
}

/// `threads` threads each writing one message's records per synced write, for `dur`.
fn rocks_threads(dir: &Path, threads: usize, dur: Duration, body: &Bytes) -> Res<f64> {
    let db = Arc::new(rocks_open(dir)?);
    let done = Arc::new(AtomicU64::new(0));
    let t0 = std::time::Instant::now();
    let end = t0 + dur;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (db, done, body) = (db.clone(), done.clone(), body.clone());
            std::thread::spawn(move || {
                let mut wo = rocksdb::WriteOptions::default();
                wo.set_sync(true);
                let mut i = 0u64;
                while std::time::Instant::now() < end {
                    let mut b = rocksdb::WriteBatch::default();
                    rocks_record(&mut b, &format!("{t:05}{i:014}"), &body);
                    db.write_opt(b, &wo).expect("synced write");
                    i += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| err("rocksdb writer panicked"))?;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64())
}

/// One thread committing batches of `batch` messages with one synced write each, for `dur`:
/// the rate and the number of messages written.
fn rocks_batches(dir: &Path, batch: usize, dur: Duration, body: &Bytes) -> Res<(f64, u64)> {
    let db = rocks_open(dir)?;
    let mut wo = rocksdb::WriteOptions::default();
    wo.set_sync(true);
    let t0 = std::time::Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < dur {
        let mut b = rocksdb::WriteBatch::default();
        for _ in 0..batch {
            rocks_record(&mut b, &format!("{n:019}"), body);
            n += 1;
        }
        db.write_opt(b, &wo)?;
    }
    Ok((n as f64 / t0.elapsed().as_secs_f64(), n))
}

// ---------------------------------------------------------------- the report

/// One line of the table: a figure and its comparisons with same-run baselines.
struct Row {
    metric: String,
    value: String,
    vs: Vec<(String, String, f64)>,
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
    json: serde_json::Map<String, Value>,
}

impl Report {
    fn row(&mut self, metric: impl Into<String>, value: impl Into<String>, vs: Vec<(String, String, f64)>) {
        let row = Row {
            metric: metric.into(),
            value: value.into(),
            vs,
        };
        eprintln!(
            "  {:<52} {:>14} {}",
            row.metric,
            row.value,
            row.vs
                .iter()
                .map(|(n, v, r)| format!("| {n} {v} ({r:.2}x)"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        self.rows.push(row);
    }

    fn set(&mut self, key: &str, v: Value) {
        self.json.insert(key.to_string(), v);
    }

    fn table(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "| {:<54} | {:>16} | {:<44} | {:>7} |\n",
            "metric", "courier", "baseline (same run)", "ratio"
        ));
        out.push_str(&format!("|{:-<56}|{:->18}|{:-<46}|{:->9}|\n", "", ":", "", ":"));
        for r in &self.rows {
            if r.vs.is_empty() {
                out.push_str(&format!(
                    "| {:<54} | {:>16} | {:<44} | {:>7} |\n",
                    r.metric, r.value, "", ""
                ));
            }
            for (i, (name, v, ratio)) in r.vs.iter().enumerate() {
                let (m, val) = if i == 0 {
                    (r.metric.as_str(), r.value.as_str())
                } else {
                    ("", "")
                };
                out.push_str(&format!(
                    "| {:<54} | {:>16} | {:<44} | {:>7} |\n",
                    m,
                    val,
                    format!("{name}: {v}"),
                    format!("{ratio:.2}x")
                ));
            }
        }
        out
    }
}

fn per_s(x: f64) -> String {
    let n = x.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    format!("{out}/s")
}

fn ms(x: f64) -> String {
    format!("{x:.2} ms")
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else {
        a / b
    }
}

// ---------------------------------------------------------------- the run

fn courier_bin(args: &Args) -> Res<PathBuf> {
    if let Some(p) = &args.courier {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe()?;
    exe.ancestors()
        .skip(1)
        .map(|d| d.join("courier"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            err("no courier binary next to this one: run `cargo build --release --bin courier` or pass --courier")
        })
}

fn write_config(dir: &Path, name: &str, max_in_flight: u32) -> Res<PathBuf> {
    // Loopback allowed; a failed first attempt waits an hour (so a dead receiver is tried
    // once per message, not in a loop); the per-endpoint rate limit is lifted so the
    // in-flight cap per host is the only delivery limit.
    let text = format!(
        "[egress]\nallow_private_targets = true\n\n[retry]\nbase_delay = \"1h\"\njitter = \"none\"\n\n\
         [delivery]\nmax_in_flight_per_host = {max_in_flight}\nrate_per_second = 1000000\n"
    );
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text)?;
    Ok(p)
}

/// A port with nothing listening on it (bound, then released).
async fn dead_port() -> Res<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    Ok(l.local_addr()?)
}

/// The ack-latency scenario alone (see `--ack-only`).
async fn ack_only(args: Args, rate: f64) -> Res<()> {
    let plan = Plan::from(&args);
    let bin = courier_bin(&args)?;
    let tmp = tempfile::Builder::new()
        .prefix("courier-bench-")
        .tempdir_in(std::env::temp_dir())?;
    let (body, seq) = (body_1k(), Arc::new(AtomicU64::new(0)));
    let receiver = Receiver::start().await?;
    let (_a, base_addr) = spawn_baseline(Baseline::Bare)?;
    let (_d, durable_addr) = spawn_baseline(Baseline::File(tmp.path()))?;
    let (_e, rocks_addr) = spawn_baseline(Baseline::Rocks(tmp.path()))?;
    let cfg = write_config(tmp.path(), "courier", args.max_in_flight)?;
    let (up, _) = Courier::start(&bin, &cfg, &tmp.path().join("data"))?;
    up.wait_ready().await?;
    let path = format!("/http://{}/hook", receiver.addr);
    for (name, addr) in [
        ("baseline (a)", base_addr),
        ("baseline (d)", durable_addr),
        ("baseline (e)", rocks_addr),
        ("courier", up.ingress),
    ] {
        let t = Target {
            addr,
            path: path.clone(),
            body: body.clone(),
            seq: seq.clone(),
        };
        let r = paced(&t, 64, rate, &plan).await?;
        let l = Lat::of(r.lat_us.clone());
        eprintln!(
            "{name:>12} at {}: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms ({} answered, {} failed)",
            per_s(rate),
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            l.max,
            r.accepted,
            r.failed
        );
    }
    Ok(())
}

async fn run(args: Args) -> Res<()> {
    let plan = Plan::from(&args);
    let bin = courier_bin(&args)?;
    let tmp = tempfile::Builder::new()
        .prefix("courier-bench-")
        .tempdir_in(std::env::temp_dir())?;
    let body = body_1k();
    let seq = Arc::new(AtomicU64::new(0));
    let mut rep = Report::default();
    let started = std::time::Instant::now();
    let smoke = args.smoke;
    eprintln!(
        "loadgen: mode {}, courier {}, data in {}",
        plan.mode,
        bin.display(),
        tmp.path().display()
    );
    rep.set(
        "run",
        json!({"mode": plan.mode, "conns": plan.conns, "duration_s": plan.duration.as_secs_f64(),
               "warmup_s": plan.warmup.as_secs_f64(), "backlog": plan.backlog, "body_bytes": body.len(),
               "max_in_flight_per_host": args.max_in_flight, "nproc": std::thread::available_parallelism().map_or(0, |n| n.get())}),
    );

    let receiver = Receiver::start().await?;
    let to_receiver = Target {
        addr: receiver.addr,
        path: "/hook".into(),
        body: body.clone(),
        seq: seq.clone(),
    };
    let window = |warm: Duration| {
        let start = Instant::now() + warm;
        (start, start + plan.duration)
    };

    // (c) a direct POST to the receiver, one at a time.
    eprintln!("baseline (c): direct POST to the receiver");
    let direct = Lat::of(sequential(&to_receiver, plan.idle_samples).await?);
    rep.set("baseline_c_direct_post", direct.json());

    // (a) a hyper server answering 202, in a child process.
    eprintln!("baseline (a): hyper 202 server in a child process");
    let (baseline, base_addr) = spawn_baseline(Baseline::Bare)?;
    let to_base = Target {
        addr: base_addr,
        path: format!("/http://{}/hook", receiver.addr),
        body: body.clone(),
        seq: seq.clone(),
    };
    let mut base_a = HashMap::new();
    // CPU per answered request: (server, load generator), in microseconds.
    let mut cpu_a: HashMap<usize, (f64, f64)> = HashMap::new();
    let mut base_a_json = serde_json::Map::new();
    let me = std::process::id();
    for &n in &plan.conns {
        let (s, e) = window(plan.warmup);
        let (srv_cpu, own_cpu) = (cpu_in_window(baseline.0.id(), s, e), cpu_in_window(me, s, e));
        let r = closed_loop(&to_base, n, s, e, None, false).await?;
        let srv = us_per(srv_cpu.await.map_err(|e| err(e.to_string()))?, r.accepted);
        let client = us_per(own_cpu.await.map_err(|e| err(e.to_string()))?, r.accepted);
        let lat = Lat::of(r.lat_us.clone());
        eprintln!(
            "  (a) {n} conns: {} (CPU per request: server {srv:.1} us, load generator {client:.1} us)",
            per_s(r.rate())
        );
        base_a.insert(n, r.rate());
        cpu_a.insert(n, (srv, client));
        base_a_json.insert(
            n.to_string(),
            json!({"rate": r.rate(), "failed": r.failed, "latency": lat.json(),
                   "server_cpu_us_per_request": srv, "loadgen_cpu_us_per_request": client}),
        );
    }
    rep.set("baseline_a_hyper_202", Value::Object(base_a_json));

    // (b) RocksDB synced writes: N writer threads, and one thread writing batches of N.
    eprintln!("baseline (b): RocksDB sync=true writes");
    let mut base_b_threads = HashMap::new();
    let mut base_b_batch = HashMap::new();
    let mut cpu_b: HashMap<usize, f64> = HashMap::new();
    let mut base_b_json = serde_json::Map::new();
    for &n in &plan.conns {
        let (d1, d2) = (
            tmp.path().join(format!("rocks-t{n}")),
            tmp.path().join(format!("rocks-b{n}")),
        );
        let (dur, b1, b2) = (plan.duration, body.clone(), body.clone());
        let t = tokio::task::spawn_blocking(move || rocks_threads(&d1, n, dur, &b1))
            .await
            .map_err(|e| err(e.to_string()))??;
        // This process does nothing else meanwhile, so its CPU is RocksDB's (writes,
        // WAL, and the flushes and compactions of its background threads).
        let c0 = cpu_secs(me);
        let (b, written) = tokio::task::spawn_blocking(move || rocks_batches(&d2, n, dur, &b2))
            .await
            .map_err(|e| err(e.to_string()))??;
        let b_us = us_per(cpu_secs(me) - c0, written);
        eprintln!(
            "  (b) {n}: {n} threads {} | batches of {n} {} ({b_us:.1} us CPU per message)",
            per_s(t),
            per_s(b)
        );
        base_b_threads.insert(n, t);
        base_b_batch.insert(n, b);
        cpu_b.insert(n, b_us);
        base_b_json.insert(
            n.to_string(),
            json!({"threads_rate": t, "batch_rate": b, "batch_cpu_us_per_message": b_us}),
        );
    }
    rep.set("baseline_b_rocksdb_sync", Value::Object(base_b_json));

    // (d) the bare server of (a) with a group-committed fdatasync of each body to a file.
    eprintln!("baseline (d): hyper 202 after a group-committed fdatasync, in a child process");
    let (durable, durable_addr) = spawn_baseline(Baseline::File(tmp.path()))?;
    let to_durable = Target {
        addr: durable_addr,
        path: format!("/http://{}/hook", receiver.addr),
        body: body.clone(),
        seq: seq.clone(),
    };
    let mut base_d = HashMap::new();
    let mut base_d_json = serde_json::Map::new();
    for &n in &plan.conns {
        let (s, e) = window(plan.warmup);
        let r = closed_loop(&to_durable, n, s, e, None, false).await?;
        let lat = Lat::of(r.lat_us.clone());
        eprintln!("  (d) {n} conns: {}", per_s(r.rate()));
        base_d.insert(n, r.rate());
        base_d_json.insert(
            n.to_string(),
            json!({"rate": r.rate(), "failed": r.failed, "latency": lat.json()}),
        );
    }
    rep.set("baseline_d_hyper_fdatasync", Value::Object(base_d_json));
    let vs_ab = |n: usize, rate: f64| {
        vec![
            (
                format!("(a) hyper 202, {n} conns"),
                per_s(base_a[&n]),
                ratio(rate, base_a[&n]),
            ),
            (
                format!("(b) rocksdb {n} sync threads"),
                per_s(base_b_threads[&n]),
                ratio(rate, base_b_threads[&n]),
            ),
            (
                format!("(b) rocksdb batches of {n}"),
                per_s(base_b_batch[&n]),
                ratio(rate, base_b_batch[&n]),
            ),
            (
                format!("(d) hyper + fdatasync, {n} conns"),
                per_s(base_d[&n]),
                ratio(rate, base_d[&n]),
            ),
        ]
    };

    // Ingest with the receiver down: a dead port, each message tried once, then due in 1 h.
    eprintln!("courier, receiver down (dead port)");
    let dead = dead_port().await?;
    let cfg = write_config(tmp.path(), "courier", args.max_in_flight)?;
    let (down, _) = Courier::start(&bin, &cfg, &tmp.path().join("data-down"))?;
    down.wait_ready().await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_rss = rss(down.pid());
    let idle_cpu = cpu_over(down.pid(), Duration::from_secs(1)).await;
    rep.row("idle RSS (fresh, 1 s after ready)", mib(idle_rss), vec![]);
    rep.set("idle_rss_bytes", json!(idle_rss));
    rep.set("idle_cpu_fraction", json!(idle_cpu));
    let to_down = Target {
        addr: down.ingress,
        path: format!("/http://{dead}/hook"),
        body: body.clone(),
        seq: seq.clone(),
    };
    let mut max_ingest: f64 = 0.0;
    let mut cpu_down: HashMap<usize, f64> = HashMap::new();
    let mut down_json = serde_json::Map::new();
    let mut load_rss: u64 = 0;
    for &n in &plan.conns {
        let (s, e) = window(plan.warmup);
        let sampler = rss_sampler(down.pid(), e);
        let cpu_w = cpu_in_window(down.pid(), s, e);
        let r = closed_loop(&to_down, n, s, e, None, false).await?;
        let cpu_s = cpu_w.await.map_err(|e| err(e.to_string()))?;
        let cpu = cpu_s / plan.duration.as_secs_f64();
        let per_202 = us_per(cpu_s, r.accepted);
        let peak = sampler.await.map_err(|e| err(e.to_string()))?;
        load_rss = load_rss.max(peak);
        let lat = Lat::of(r.lat_us.clone());
        max_ingest = max_ingest.max(r.rate());
        rep.row(
            format!("ingest 202/s, {n} conns, receiver down"),
            per_s(r.rate()),
            vs_ab(n, r.rate()),
        );
        down_json.insert(
            n.to_string(),
            json!({"rate": r.rate(), "failed": r.failed, "latency": lat.json(), "rss_peak_bytes": peak,
                   "courier_cpu_cores": cpu, "courier_cpu_us_per_202": per_202}),
        );
        cpu_down.insert(n, per_202);
    }
    rep.set("ingest_receiver_down", Value::Object(down_json));
    // Where the CPU goes: courier's CPU per 202 beside the CPU the bare hyper server spends
    // per answer and RocksDB spends per message written in batches; and the rate a server
    // doing only those two things could reach on this machine with this load generator.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
    let mut bound_json = serde_json::Map::new();
    for &n in &plan.conns {
        let ((srv, client), b_us, c_us) = (cpu_a[&n], cpu_b[&n], cpu_down[&n]);
        rep.row(
            format!("CPU per 202, {n} conns, receiver down"),
            format!("{c_us:.1} us"),
            vec![
                (
                    format!("(a) hyper server per 202, {n} conns"),
                    format!("{srv:.1} us"),
                    ratio(c_us, srv),
                ),
                (
                    format!("(b) rocksdb per message, batches of {n}"),
                    format!("{b_us:.1} us"),
                    ratio(c_us, b_us),
                ),
                (
                    "(a)+(b) together".into(),
                    format!("{:.1} us", srv + b_us),
                    ratio(c_us, srv + b_us),
                ),
            ],
        );
        let bound = cores * 1e6 / (client + srv + b_us);
        rep.row(
            format!("bound: (a)+(b) work only, {n} conns"),
            per_s(bound),
            vec![(
                format!("(a) hyper 202, {n} conns"),
                per_s(base_a[&n]),
                ratio(bound, base_a[&n]),
            )],
        );
        bound_json.insert(
            n.to_string(),
            json!({"cores": cores, "loadgen_cpu_us": client, "server_a_cpu_us": srv, "rocksdb_b_cpu_us": b_us,
                   "courier_cpu_us": c_us, "bound_rate": bound, "bound_vs_a": bound / base_a[&n]}),
        );
    }
    rep.set("cpu_bound", Value::Object(bound_json));
    if !down.warnings().is_empty() {
        eprintln!("  courier warnings: {:?}", down.warnings());
    }
    drop(down);

    // Receiver up: end to end.
    eprintln!("courier, receiver up");
    let (up, _) = Courier::start(&bin, &cfg, &tmp.path().join("data-up"))?;
    up.wait_ready().await?;
    let to_up = Target {
        addr: up.ingress,
        path: format!("/http://{}/hook", receiver.addr),
        body: body.clone(),
        seq: seq.clone(),
    };
    receiver.record.store(true, Ordering::Relaxed);
    // Idle: one message at a time, the next only after the previous was delivered.
    let mut idle_ack = Vec::new();
    let mut idle_post = Vec::new();
    {
        let mut conn = Conn::open(up.ingress).await?;
        for i in 0..plan.idle_samples + 5 {
            let (n, req) = to_up.request()?;
            let sent = Instant::now();
            let (s, _) = conn.send(req).await?;
            let acked = Instant::now();
            if s != StatusCode::ACCEPTED {
                return Err(err(format!("courier answered {s}")));
            }
            let at = receiver
                .wait_for(n, Duration::from_secs(10))
                .await
                .ok_or_else(|| err("an idle message was not delivered within 10 s"))?;
            if i >= 5 {
                // Signed: the delivery may reach the receiver before the 202 reaches us.
                idle_ack
                    .push(at.duration_since(acked).as_micros() as i64 - acked.duration_since(at).as_micros() as i64);
                idle_post.push((at - sent).as_micros() as i64);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let idle_ack = Lat::of(idle_ack);
    let idle_post = Lat::of(idle_post);
    rep.row(
        "idle 202->receiver p50",
        ms(idle_ack.p50),
        vec![(
            "(c) direct POST p50".into(),
            ms(direct.p50),
            ratio(idle_ack.p50, direct.p50),
        )],
    );
    rep.row(
        "idle 202->receiver p99",
        ms(idle_ack.p99),
        vec![(
            "(c) direct POST p99".into(),
            ms(direct.p99),
            ratio(idle_ack.p99, direct.p99),
        )],
    );
    rep.row(
        "idle POST->receiver p50 / p99",
        format!("{:.2} / {:.2} ms", idle_post.p50, idle_post.p99),
        vec![],
    );
    rep.set("e2e_idle_ack_to_receiver", idle_ack.json());
    rep.set("e2e_idle_post_to_receiver", idle_post.json());
    receiver.arrivals.lock().unwrap().clear();

    // Under load: closed loop at each connection count, deliveries counted in the same window.
    let mut up_json = serde_json::Map::new();
    for &n in &plan.conns {
        let (s, e) = window(plan.warmup);
        let rcv0 = receiver.count();
        let recv = receiver.clone();
        let counter = tokio::spawn(async move {
            tokio::time::sleep_until(s).await;
            let c0 = recv.count();
            tokio::time::sleep_until(e).await;
            recv.count() - c0
        });
        let sampler = rss_sampler(up.pid(), e);
        let r = closed_loop(&to_up, n, s, e, None, true).await?;
        let delivered_in_window = counter.await.map_err(|e| err(e.to_string()))?;
        let peak = sampler.await.map_err(|e| err(e.to_string()))?;
        load_rss = load_rss.max(peak);
        let t_end = Instant::now();
        let caught_up = receiver
            .wait_count(
                rcv0 + r.accepted_total,
                plan.drain_timeout.min(Duration::from_secs(300)),
            )
            .await;
        let catch_up_s = (Instant::now() - t_end).as_secs_f64();
        let deliveries = delivered_in_window as f64 / plan.duration.as_secs_f64();
        let arrivals = std::mem::take(&mut *receiver.arrivals.lock().unwrap());
        let e2e: Vec<i64> = r
            .acks
            .iter()
            .filter(|(_, acked)| *acked >= s && *acked <= e)
            .filter_map(|(n, acked)| {
                arrivals.get(n).map(|at| {
                    at.duration_since(*acked).as_micros() as i64 - acked.duration_since(*at).as_micros() as i64
                })
            })
            .collect();
        let e2e = Lat::of(e2e);
        rep.row(
            format!("ingest 202/s, {n} conns, receiver up"),
            per_s(r.rate()),
            vs_ab(n, r.rate()),
        );
        rep.row(
            format!("deliveries/s to receiver, {n} conns"),
            per_s(deliveries),
            vec![(
                format!("(a) hyper 202, {n} conns"),
                per_s(base_a[&n]),
                ratio(deliveries, base_a[&n]),
            )],
        );
        rep.row(
            format!("202->receiver p50 / p99, {n} conns"),
            format!("{:.1} / {:.1} ms", e2e.p50, e2e.p99),
            vec![("(c) direct POST p99".into(), ms(direct.p99), ratio(e2e.p99, direct.p99))],
        );
        up_json.insert(
            n.to_string(),
            json!({"ingest_rate": r.rate(), "failed": r.failed, "deliveries_per_s": deliveries,
                   "ack_latency": Lat::of(r.lat_us.clone()).json(), "e2e_ack_to_receiver": e2e.json(),
                   "caught_up": caught_up, "catch_up_s": catch_up_s, "rss_peak_bytes": peak}),
        );
        if !caught_up {
            eprintln!("  deliveries did not catch up within the timeout");
        }
    }
    receiver.record.store(false, Ordering::Relaxed);
    rep.set("ingest_receiver_up", Value::Object(up_json));
    rep.row("RSS under ingest load (peak)", mib(load_rss), vec![]);
    rep.set("load_rss_peak_bytes", json!(load_rss));

    // Ack latency at 25% of the maximum ingest rate (open loop), and baselines (a) and (d) at
    // that rate. On a fresh courier: the instance above was just overloaded on purpose (its
    // deliveries seconds behind), and the flushes and compactions that work leaves behind
    // would be measured instead of courier at 25% load; and with it stopped, the baselines
    // do not share the machine with them either.
    drop(up);
    let (fresh, _) = Courier::start(&bin, &cfg, &tmp.path().join("data-ack"))?;
    fresh.wait_ready().await?;
    let to_fresh = Target {
        addr: fresh.ingress,
        path: format!("/http://{}/hook", receiver.addr),
        body: body.clone(),
        seq: seq.clone(),
    };
    let rate = (max_ingest * 0.25).max(10.0);
    let ol_conns = 64.min(plan.conns.iter().copied().max().unwrap_or(64)).max(4);
    let ack = paced(&to_fresh, ol_conns, rate, &plan).await?;
    drop(fresh);
    let ack_base = paced(&to_base, ol_conns, rate, &plan).await?;
    let ack_durable = paced(&to_durable, ol_conns, rate, &plan).await?;
    // (e): (d) with RocksDB as the durable write, for the latency scenario only.
    let (rocks_base, rocks_addr) = spawn_baseline(Baseline::Rocks(tmp.path()))?;
    let to_rocks = Target {
        addr: rocks_addr,
        ..to_durable.clone()
    };
    let ack_rocks = paced(&to_rocks, ol_conns, rate, &plan).await?;
    drop(rocks_base);
    let ack_el = Lat::of(ack_rocks.lat_us.clone());
    let (ack_l, ack_bl) = (Lat::of(ack.lat_us.clone()), Lat::of(ack_base.lat_us.clone()));
    let ack_dl = Lat::of(ack_durable.lat_us.clone());
    let baselines = [
        ("(a) hyper 202", &ack_bl),
        ("(d) hyper + fdatasync", &ack_dl),
        ("(e) hyper + rocksdb sync", &ack_el),
    ];
    type Pick = fn(&Lat) -> f64;
    let quantiles: [(&str, Pick); 2] = [("p50", |l| l.p50), ("p99", |l| l.p99)];
    for (q, pick) in quantiles {
        let mut vs: Vec<_> = baselines
            .iter()
            .map(|(name, b)| {
                (
                    format!("{name}, same rate, {q}"),
                    ms(pick(b)),
                    ratio(pick(&ack_l), pick(b)),
                )
            })
            .collect();
        vs.push((
            format!("(c) direct POST {q}"),
            ms(pick(&direct)),
            ratio(pick(&ack_l), pick(&direct)),
        ));
        rep.row(
            format!("ack {q} at 25% load ({}, open loop)", per_s(rate)),
            ms(pick(&ack_l)),
            vs,
        );
    }
    rep.set(
        "ack_latency_25pct",
        json!({"rate": rate, "max_ingest": max_ingest, "conns": ol_conns, "achieved": ack.rate(), "failed": ack.failed,
               "latency": ack_l.json(), "baseline_a_latency": ack_bl.json(), "baseline_d_latency": ack_dl.json(),
               "baseline_e_latency": ack_el.json()}),
    );
    drop(baseline);
    drop(durable);

    // Backlog: the endpoint paused (as an operator does while its receiver is down).
    eprintln!("backlog: {} messages for a paused endpoint", plan.backlog);
    let (mut bl, _) = Courier::start(&bin, &cfg, &tmp.path().join("data-backlog"))?;
    bl.wait_ready().await?;
    let to_bl = Target {
        addr: bl.ingress,
        path: format!("/http://{}/backlog", receiver.addr),
        body: body.clone(),
        seq: seq.clone(),
    };
    // One delivered message makes the endpoint known, so it can be paused.
    let before = receiver.count();
    let mut c = Conn::open(bl.ingress).await?;
    c.send(to_bl.request()?.1).await?;
    if !receiver.wait_count(before + 1, Duration::from_secs(10)).await {
        return Err(err("the first backlog message was not delivered"));
    }
    let key = format!("http://{}/backlog", receiver.addr);
    let enc = utf8_percent_encode(&key, NON_ALPHANUMERIC).to_string();
    let (s, b) = admin(bl.admin, Method::POST, &format!("/endpoints/{enc}/pause")).await?;
    if !s.is_success() {
        return Err(err(format!("pause answered {s}: {b}")));
    }
    let t0 = Instant::now();
    let fill_cpu0 = cpu_secs(bl.pid());
    let far = t0 + Duration::from_secs(86_400);
    let sampler_end = Arc::new(AtomicBool::new(false));
    let r = closed_loop(
        &to_bl,
        64.min(*plan.conns.iter().max().unwrap_or(&64)),
        t0,
        far,
        Some(plan.backlog),
        false,
    )
    .await?;
    let fill_s = (Instant::now() - t0).as_secs_f64();
    let accepted = r.accepted_total;
    let fill_rate = accepted as f64 / fill_s;
    eprintln!(
        "  accepted {accepted} in {fill_s:.1} s ({}), failed {}",
        per_s(fill_rate),
        r.failed
    );
    // Wait for courier to settle (messages parked), then measure.
    let settle0 = Instant::now();
    let mut settle_cpu;
    loop {
        settle_cpu = cpu_over(bl.pid(), Duration::from_millis(500)).await;
        if settle_cpu < 0.02 || Instant::now() - settle0 > Duration::from_secs(600) {
            break;
        }
    }
    let settle_s = (Instant::now() - settle0).as_secs_f64();
    let fill_cpu_us = us_per(cpu_secs(bl.pid()) - fill_cpu0, accepted);
    let pending = metric(bl.admin, "courier_pending").await.unwrap_or(-1.0);
    let bl_rss = rss(bl.pid());
    let bl_disk = dir_size(&tmp.path().join("data-backlog"));
    let bl_cpu = cpu_over(bl.pid(), plan.cpu_window).await;
    bl.kill();
    drop(bl);
    let t_restart = Instant::now();
    let (bl2, to_listen) = Courier::start(&bin, &cfg, &tmp.path().join("data-backlog"))?;
    bl2.wait_ready().await?;
    let restart_s = (Instant::now() - t_restart).as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after_restart = rss(bl2.pid());
    let pending_after = metric(bl2.admin, "courier_pending").await.unwrap_or(-1.0);
    // Drain: resume the endpoint and count deliveries.
    let c0 = receiver.count();
    let cpu0 = cpu_secs(bl2.pid());
    let peak = Arc::new(AtomicU64::new(0));
    let (p, pid, stop) = (peak.clone(), bl2.pid(), sampler_end.clone());
    let sampler = tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            p.fetch_max(rss(pid), Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let t_drain = Instant::now();
    let (s, b) = admin(bl2.admin, Method::POST, &format!("/endpoints/{enc}/resume")).await?;
    if !s.is_success() {
        return Err(err(format!("resume answered {s}: {b}")));
    }
    let drained = receiver.wait_count(c0 + accepted, plan.drain_timeout).await;
    let drain_s = (Instant::now() - t_drain).as_secs_f64();
    sampler_end.store(true, Ordering::Relaxed);
    let _ = sampler.await;
    let drain_cpu = (cpu_secs(bl2.pid()) - cpu0) / drain_s;
    let delivered = receiver.count() - c0;
    let drain_rate = delivered as f64 / drain_s;
    drop(bl2);

    rep.row(
        format!(
            "backlog fill: {accepted} accepted, {} conns",
            64.min(*plan.conns.iter().max().unwrap_or(&64))
        ),
        per_s(fill_rate),
        vs_ab(64.min(*plan.conns.iter().max().unwrap_or(&64)), fill_rate),
    );
    rep.row(
        "CPU per 202, backlog fill (accept and park)",
        format!("{fill_cpu_us:.1} us"),
        vec![],
    );
    rep.row(format!("backlog RSS ({accepted} pending)"), mib(bl_rss), vec![]);
    rep.row("backlog data-dir size", mib(bl_disk), vec![]);
    rep.row(
        format!("backlog CPU, nothing due ({:.1} s)", plan.cpu_window.as_secs_f64()),
        format!("{:.2}% core", bl_cpu * 100.0),
        vec![],
    );
    rep.row(
        "backlog restart-to-ready (kill -9)",
        format!("{restart_s:.3} s"),
        vec![],
    );
    rep.row("backlog RSS after restart", mib(rss_after_restart), vec![]);
    rep.row(
        format!("backlog drain, max_in_flight_per_host {}", args.max_in_flight),
        per_s(drain_rate),
        vec![],
    );
    rep.row(
        "backlog RSS during drain (peak)",
        mib(peak.load(Ordering::Relaxed)),
        vec![],
    );
    rep.set(
        "backlog",
        json!({"accepted": accepted, "failed": r.failed, "fill_s": fill_s, "fill_rate": fill_rate, "fill_cpu_us_per_202": fill_cpu_us,
               "settle_s": settle_s, "settle_cpu_cores": settle_cpu, "pending_metric": pending, "rss_bytes": bl_rss, "data_dir_bytes": bl_disk,
               "cpu_nothing_due_cores": bl_cpu, "cpu_window_s": plan.cpu_window.as_secs_f64(),
               "restart_to_listening_s": to_listen.as_secs_f64(), "restart_to_ready_s": restart_s,
               "rss_after_restart_bytes": rss_after_restart, "pending_after_restart": pending_after,
               "drained": drained, "delivered": delivered, "drain_s": drain_s, "drain_rate": drain_rate,
               "drain_cpu_cores": drain_cpu, "drain_rss_peak_bytes": peak.load(Ordering::Relaxed),
               "max_in_flight_per_host": args.max_in_flight}),
    );

    let table = rep.table();
    println!("{table}");
    rep.set("table", json!(table));
    rep.set("elapsed_s", json!(started.elapsed().as_secs_f64()));
    std::fs::write(
        &args.json,
        serde_json::to_string_pretty(&Value::Object(rep.json.clone())).unwrap(),
    )?;
    eprintln!(
        "wrote {} ({:.0} s)",
        args.json.display(),
        started.elapsed().as_secs_f64()
    );

    if smoke {
        // Every scenario must have produced something; nothing is said about speed.
        let checks = [
            ("baseline (a)", base_a.values().all(|r| *r > 0.0)),
            (
                "baseline (b)",
                base_b_threads.values().chain(base_b_batch.values()).all(|r| *r > 0.0),
            ),
            ("ingest", max_ingest > 0.0),
            ("ack latency", ack_l.n > 0),
            ("idle end to end", idle_ack.n > 0),
            ("backlog accepted", accepted == plan.backlog),
            ("backlog drained", drained && delivered >= accepted),
            ("restart", restart_s > 0.0),
        ];
        let failed: Vec<_> = checks.iter().filter(|(_, ok)| !ok).map(|(n, _)| *n).collect();
        if !failed.is_empty() {
            return Err(err(format!("smoke: failed scenarios: {failed:?}")));
        }
        eprintln!("smoke: every scenario ran");
    }
    Ok(())
}

/// Baseline (a): answers every POST with 202 and a body like courier's, storing nothing.
async fn serve_baseline() -> Res<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?);
    let answer = Bytes::from_static(br#"{"id":"dlv_01JD0000000000000000000000","event_id":"lg-0","status":"pending"}"#);
    serve_fixed(listener, StatusCode::ACCEPTED, answer, |_| {}).await;
    Ok(())
}

/// Baseline (d): the least a durable 202 can cost here. The bare hyper server of (a), but
/// each request's body is handed to one thread that appends every body queued meanwhile
/// to a plain file and `fdatasync`s it once, then answers them all (group commit, the
/// shape of courier's accept path, without RocksDB, dedupe or scheduling).
///
/// Baseline (e), with `rocksdb`: the same, but the thread writes baseline (b)'s record set
/// for each body into one RocksDB `WriteBatch` with `sync = true`: courier's accept path
/// with nothing but its durable write.
async fn serve_durable_baseline(dir: PathBuf, rocksdb: bool) -> Res<()> {
    use std::io::Write;
    type Job = (Bytes, tokio::sync::oneshot::Sender<()>);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Job>(8192);
    let (mut file, db) = if rocksdb {
        (None, Some(rocks_open(&dir.join("baseline-e"))?))
    } else {
        (Some(std::fs::File::create(dir.join("baseline-d.log"))?), None)
    };
    std::thread::spawn(move || {
        let mut synced = rocksdb::WriteOptions::default();
        synced.set_sync(true);
        let mut n = 0u64;
        while let Some(first) = rx.blocking_recv() {
            let mut jobs = vec![first];
            while let Ok(job) = rx.try_recv() {
                jobs.push(job);
            }
            if let Some(db) = &db {
                let mut b = rocksdb::WriteBatch::default();
                for (body, _) in &jobs {
                    rocks_record(&mut b, &format!("{n:019}"), body);
                    n += 1;
                }
                db.write_opt(b, &synced).expect("baseline (e) write");
            } else if let Some(file) = file.as_mut() {
                for (body, _) in &jobs {
                    file.write_all(body).expect("baseline (d) write");
                }
                file.sync_data().expect("baseline (d) fdatasync");
            }
            for (_, reply) in jobs {
                let _ = reply.send(());
            }
        }
    });
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let tx = tx.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let tx = tx.clone();
            async move {
                let body = req
                    .into_body()
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let (reply, done) = tokio::sync::oneshot::channel();
                let ok = tx.send((body, reply)).await.is_ok() && done.await.is_ok();
                let mut resp = Response::new(Full::new(Bytes::from_static(b"{}")));
                *resp.status_mut() = if ok {
                    StatusCode::ACCEPTED
                } else {
                    StatusCode::INTERNAL_SERVER_ERROR
                };
                Ok::<_, Infallible>(resp)
            }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// A baseline server run in a child process.
#[derive(Clone, Copy)]
enum Baseline<'a> {
    /// (a): answers 202, stores nothing.
    Bare,
    /// (d): answers after a group-committed `fdatasync` of a file in this dir.
    File(&'a Path),
    /// (e): answers after a synced RocksDB group commit in this dir.
    Rocks(&'a Path),
}

/// Starts a baseline server (this binary re-executed with the flag that serves it),
/// returning the child and the address it printed.
fn spawn_baseline(which: Baseline) -> Res<(KillOnDrop, SocketAddr)> {
    let mut cmd = Command::new(std::env::current_exe()?);
    match which {
        Baseline::Bare => cmd.arg("--serve-baseline"),
        Baseline::File(dir) => cmd.arg("--serve-durable-baseline").arg(dir),
        Baseline::Rocks(dir) => cmd.arg("--serve-durable-baseline").arg(dir).arg("--rocksdb"),
    };
    let mut child = KillOnDrop(cmd.stdout(Stdio::piped()).stdin(Stdio::null()).spawn()?);
    let mut first = String::new();
    BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut first)?;
    let addr = first
        .trim()
        .parse()
        .map_err(|_| err(format!("baseline server said {first:?}")))?;
    Ok((child, addr))
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = if args.serve_baseline {
        rt.block_on(serve_baseline())
    } else if let Some(dir) = args.serve_durable_baseline.clone() {
        rt.block_on(serve_durable_baseline(dir, args.rocksdb))
    } else if let Some(rate) = args.ack_only {
        rt.block_on(ack_only(args, rate))
    } else {
        rt.block_on(run(args))
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
