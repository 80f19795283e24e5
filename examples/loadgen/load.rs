//! Load generation: latency statistics, client connections, the closed loop, and the open
//! loop with its pacing thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::net::SocketAddr;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::args::Plan;
use crate::receiver::Tracker;
use crate::{err, Error, Res};

/// Percentiles of a set of latencies (given in microseconds, kept in milliseconds).
#[derive(Debug, Clone, Default)]
pub struct Lat {
    pub n: usize,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Lat {
    /// The percentiles of `us` (microseconds); all zero when empty.
    pub fn of(mut us: Vec<i64>) -> Lat {
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

    /// As JSON, in milliseconds.
    pub fn json(&self) -> Value {
        json!({"n": self.n, "p50_ms": self.p50, "p90_ms": self.p90, "p99_ms": self.p99,
               "p999_ms": self.p999, "max_ms": self.max})
    }
}

/// One keep-alive HTTP/1.1 client connection.
pub struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Conn {
    /// Connects (`TCP_NODELAY`) and completes the HTTP/1.1 handshake.
    pub async fn open(addr: SocketAddr) -> Res<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { sender })
    }

    /// Sends one request and reads the whole answer.
    pub async fn send(&mut self, req: Request<Full<Bytes>>) -> Res<(StatusCode, Bytes)> {
        self.sender.ready().await?;
        let resp = self.sender.send_request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}

/// What the load generator sends: a path-form POST to courier (or a plain POST).
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub path: String,
    pub body: Bytes,
    /// Unique event ids across the whole run (`webhook-id: lg-<n>`), so deliveries can be
    /// matched to their 202 and no two messages are duplicates of each other.
    pub seq: Arc<AtomicU64>,
}

impl Target {
    /// The next request, with a fresh event id; returns the id's number with it.
    pub fn request(&self) -> Res<(u64, Request<Full<Bytes>>)> {
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

/// What a load run measured inside its window.
#[derive(Debug, Default)]
pub struct LoadResult {
    /// 2xx answers completed inside the window.
    pub accepted: u64,
    /// Other answers and transport errors inside the window.
    pub failed: u64,
    /// 2xx answers completed over the whole run (warm-up included).
    pub accepted_total: u64,
    pub secs: f64,
    pub lat_us: Vec<i64>,
    /// (event seq, when its 202 arrived) for every 202 of a closed-loop run, when asked.
    pub acks: Vec<(u64, Instant)>,
}

impl LoadResult {
    /// 2xx answers per second in the window.
    pub fn rate(&self) -> f64 {
        self.accepted as f64 / self.secs.max(1e-9)
    }

    /// Adds one connection's counts and samples to the total.
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
pub async fn closed_loop(
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

/// The schedule of an open-loop run: send i at `start + i / rate`, for `start..end`; sends
/// scheduled before `measure_from` are warm-up.
#[derive(Clone)]
pub struct Schedule {
    pub conns: usize,
    pub rate: f64,
    pub start: Instant,
    pub measure_from: Instant,
    pub end: Instant,
    /// Enter `seq → scheduled time` of every measured send here before sending it.
    pub track: Option<Arc<Tracker>>,
    /// Once set, no further send is released and the run ends as soon as the sends under
    /// way are answered (a sustainable-rate probe already known to fail).
    pub abort: Arc<AtomicBool>,
}

impl Schedule {
    /// A run at `rate` starting in 200 ms (time for the connections to open): `warmup`, then
    /// `window` measured.
    pub fn new(conns: usize, rate: f64, warmup: Duration, window: Duration) -> Schedule {
        let start = Instant::now() + Duration::from_millis(200);
        Schedule {
            conns,
            rate,
            start,
            measure_from: start + warmup,
            end: start + warmup + window,
            track: None,
            abort: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Time between two scheduled sends.
    pub fn interval(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.rate.max(1.0))
    }

    /// The number of sends in the whole run.
    pub fn total(&self) -> u64 {
        ((self.end - self.start).as_secs_f64() / self.interval().as_secs_f64()).ceil() as u64
    }

    /// The number of sends scheduled at or before `t`.
    pub fn due_by(&self, t: Instant) -> u64 {
        if t < self.start {
            return 0;
        }
        let n = (t - self.start).as_nanos() / self.interval().as_nanos().max(1) + 1;
        (n as u64).min(self.total())
    }
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
pub async fn open_loop(t: &Target, s: &Schedule) -> Res<LoadResult> {
    let next = Arc::new(AtomicU64::new(0));
    let interval = s.interval();
    let released = Arc::new(tokio::sync::Semaphore::new(0));
    let total = s.total();
    let pacer = {
        let (released, abort) = (released.clone(), s.abort.clone());
        let (start, conns) = (s.start.into_std(), s.conns);
        std::thread::spawn(move || pace(&released, start, interval, total, conns, &abort))
    };
    let mut tasks = Vec::new();
    for _ in 0..s.conns {
        let (t, s) = (t.clone(), s.clone());
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
                if i >= total || s.abort.load(Ordering::Relaxed) {
                    break;
                }
                let at = s.start + interval * (i as u32);
                let (seq, req) = t.request()?;
                let measured = at >= s.measure_from;
                if let Some(track) = s.track.as_ref().filter(|_| measured) {
                    track.due.lock().unwrap().insert(seq, at);
                }
                let outcome = conn.send(req).await;
                let done = Instant::now();
                match outcome {
                    Ok((st, _)) if st.is_success() => {
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
    total_r.secs = (s.end - s.measure_from).as_secs_f64();
    Ok(total_r)
}

/// Releases one permit per scheduled send (send i at `start + i * interval`, `total` sends)
/// once its time has come, sleeping on the OS's high-resolution timer in between; then one
/// more permit per connection so every connection task sees the end. Stops early once
/// `abort` is set.
fn pace(
    released: &tokio::sync::Semaphore,
    start: std::time::Instant,
    interval: Duration,
    total: u64,
    conns: usize,
    abort: &AtomicBool,
) {
    let mut given = 0u64;
    while given < total && !abort.load(Ordering::Relaxed) {
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
            // Bounded, so an abort is seen within a millisecond even at low rates.
            std::thread::sleep((next - now).min(Duration::from_millis(1)));
        }
    }
    released.add_permits(conns);
}

/// An open-loop run at `rate` starting in 200 ms: `plan.warmup` of warm-up, then
/// `plan.duration` measured.
pub async fn paced(t: &Target, conns: usize, rate: f64, plan: &Plan) -> Res<LoadResult> {
    open_loop(t, &Schedule::new(conns, rate, plan.warmup, plan.duration)).await
}

/// Sequential requests, one at a time on one connection: latency of each.
pub async fn sequential(t: &Target, n: usize) -> Res<Vec<i64>> {
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
