//! Many endpoints (issue "Thousands of receivers"): N messages, one to each of N distinct
//! endpoints spread over H loopback hosts, against the same N messages to one endpoint in
//! the same run: how fast they all reach an end, courier's memory and sockets during the
//! run and once settled, and the admin endpoint list's latency at that scale.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::HOST;
use http::{Method, Request};
use http_body_util::Full;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::args::Args;
use crate::courier::{cpu_secs, rss, us_per, Courier};
use crate::fanout::{send_all, Layout, SENDERS};
use crate::hosts::{sockets, Hosts, MetricsPoll};
use crate::load::{Conn, Lat};
use crate::report::{mib, ms, per_s, ratio, vs};
use crate::run::Ctx;
use crate::{joined, Res};

/// How often `/metrics` is read while messages are outstanding: the finish time is
/// interpolated between two reads, so this bounds its error (2% of a 1 s run).
const POLL: Duration = Duration::from_millis(20);
/// RSS and sockets are sampled every this many polls (100 ms): counting a thousand
/// descriptors costs this process a few milliseconds.
const SAMPLE_EVERY: u32 = 5;
/// Targets from the issues (the RSS one as issue 26 set it), recorded beside the figures in
/// the JSON.
const TARGET_RATE_RATIO: f64 = 0.8;
const TARGET_RSS_RATIO: f64 = 1.3;
const TARGET_ADMIN_P99_MS: f64 = 10.0;

/// What one run (one layout, one N) measured.
#[derive(Debug, Default)]
struct Outcome {
    /// Messages answered 2xx, and those still refused after five tries.
    accepted: u64,
    failed: u64,
    /// First send to last 202.
    ingest_s: f64,
    /// First send to the moment `/metrics` showed every accepted message finished
    /// (interpolated between two reads); until the last read when that never came.
    finish_s: f64,
    /// Whether every accepted message finished in time.
    done: bool,
    finished: u64,
    rss_peak: u64,
    rss_after: u64,
    sockets_peak: u64,
    sockets_after: u64,
    /// courier's CPU from the first send to the finish, per finished message (µs).
    cpu_us: f64,
    /// The receiver's (200, 410) answers during the run.
    answers: (u64, u64),
}

impl Outcome {
    /// Finished messages per second: all of them over the time until the last finished.
    fn rate(&self) -> f64 {
        self.finished as f64 / self.finish_s.max(1e-9)
    }

    /// As JSON (bytes, seconds, microseconds).
    fn json(&self) -> Value {
        json!({"accepted": self.accepted, "failed": self.failed, "ingest_s": self.ingest_s,
               "ingest_rate": self.accepted as f64 / self.ingest_s.max(1e-9),
               "finish_s": self.finish_s, "finished": self.finished, "all_finished": self.done,
               "finished_per_s": self.rate(), "rss_peak_bytes": self.rss_peak, "rss_settled_bytes": self.rss_after,
               "sockets_peak": self.sockets_peak, "sockets_settled": self.sockets_after,
               "cpu_us_per_finished": self.cpu_us, "receiver_200": self.answers.0, "receiver_410": self.answers.1})
    }
}

/// A courier for one run, killed and its data dir removed on drop (a 1M run leaves
/// gigabytes).
struct Up {
    courier: Courier,
    data: PathBuf,
}

impl Drop for Up {
    fn drop(&mut self) {
        self.courier.kill();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// `--many-only`: this scenario alone.
pub async fn many_only(args: Args) -> Res<()> {
    let mut cx = Ctx::new(args).await?;
    scenario(&mut cx).await;
    cx.finish()
}

/// The scenario at each of `plan.many_sizes`: rows, JSON (`many`) and smoke checks. A
/// failure becomes a row and a failed check, so the rest of the run's table still prints.
pub async fn scenario(cx: &mut Ctx) {
    if let Err(e) = sizes(cx).await {
        eprintln!("  many endpoints failed: {e}");
        let short: String = e.to_string().chars().take(40).collect();
        cx.rep.row(format!("many endpoints failed: {short}"), "", vec![]);
        cx.rep.set("many", json!({"error": e.to_string()}));
        cx.checks.push(("many endpoints", false));
    }
}

/// Every size: the one-endpoint run, then the many-endpoints run and the admin timing.
async fn sizes(cx: &mut Ctx) -> Res<()> {
    let plan = cx.plan.clone();
    let most = plan.many_sizes.iter().map(|&n| hosts_for(cx, n)).max().unwrap_or(1);
    let rx = Arc::new(Hosts::start(most).await?);
    eprintln!(
        "many endpoints: sizes {:?}, receiver on {} loopback hosts from {} (port {})",
        plan.many_sizes,
        rx.count,
        rx.addr(0).ip(),
        rx.port
    );
    let mut out = serde_json::Map::new();
    for &n in &plan.many_sizes {
        let hosts = hosts_for(cx, n);
        let (one, _) = run(cx, &rx, Layout::One, n).await?;
        let gone_every = cx.args.gone_every.max(1);
        let (many, up) = run(cx, &rx, Layout::Many { hosts, gone_every }, n).await?;
        let admin = admin_timing(cx, up.courier.admin).await?;
        drop(up);
        rows(cx, n, hosts, &one, &many, &admin);
        let rate_ratio = ratio(many.rate(), one.rate());
        let rss_ratio = ratio(many.rss_after as f64, one.rss_after as f64);
        out.insert(
            n.to_string(),
            json!({"endpoints": n, "hosts": hosts, "senders": SENDERS, "gone_every": gone_every,
                   "one_endpoint": one.json(), "many_endpoints": many.json(), "admin_endpoints_limit_100": admin.json(),
                   "finished_rate_ratio": rate_ratio, "rss_settled_ratio": rss_ratio,
                   "rss_peak_ratio": ratio(many.rss_peak as f64, one.rss_peak as f64),
                   "sockets_settled_ratio": ratio(many.sockets_after as f64, one.sockets_after as f64),
                   "meets": {"finished_rate_ratio_at_least_0_8": rate_ratio >= TARGET_RATE_RATIO,
                             "rss_settled_ratio_at_most_1_3": rss_ratio <= TARGET_RSS_RATIO,
                             "admin_p99_at_most_10_ms": admin.lat.n > 0 && admin.lat.p99 <= TARGET_ADMIN_P99_MS}}),
        );
        // Worked = every message reached an end in both runs; nothing about speed.
        cx.checks.push((
            "many endpoints: one-endpoint run finished",
            one.done && one.failed == 0 && one.accepted == n,
        ));
        cx.checks.push((
            "many endpoints: many-endpoint run finished",
            many.done && many.failed == 0 && many.accepted == n,
        ));
        cx.checks.push(("many endpoints: admin list answered", admin.lat.n > 0));
    }
    cx.rep.set(
        "many",
        json!({"sizes": plan.many_sizes, "max_hosts": plan.many_hosts, "settle_s": plan.many_settle.as_secs_f64(),
               "targets": {"finished_rate_ratio_min": TARGET_RATE_RATIO, "rss_settled_ratio_max": TARGET_RSS_RATIO,
                           "admin_p99_ms_max": TARGET_ADMIN_P99_MS},
               "results": Value::Object(out)}),
    );
    Ok(())
}

/// H for N endpoints: `min(N, plan.many_hosts)`, at least 1.
fn hosts_for(cx: &Ctx, n: u64) -> usize {
    (n.min(cx.plan.many_hosts as u64) as usize).max(1)
}

/// The table rows of one size.
fn rows(cx: &mut Ctx, n: u64, hosts: usize, one: &Outcome, many: &Outcome, admin: &AdminTiming) {
    let k = short(n);
    let base = format!("one endpoint, {k} messages");
    cx.rep.row(
        format!("many: {k} endpoints / {hosts} hosts, finished/s"),
        per_s(many.rate()),
        vec![vs(base.clone(), per_s(one.rate()), ratio(many.rate(), one.rate()))],
    );
    let pairs = [
        ("RSS settled", many.rss_after, one.rss_after, true),
        ("RSS peak", many.rss_peak, one.rss_peak, true),
        ("open sockets settled", many.sockets_after, one.sockets_after, false),
        ("open sockets peak", many.sockets_peak, one.sockets_peak, false),
    ];
    for (what, m, o, bytes) in pairs {
        let show = |v: u64| if bytes { mib(v) } else { v.to_string() };
        cx.rep.row(
            format!("many: {k} endpoints, {what}"),
            show(m),
            vec![vs(base.clone(), show(o), ratio(m as f64, o as f64))],
        );
    }
    // Two decimals while they fit the value column.
    let (p50, p99) = (admin.lat.p50, admin.lat.p99);
    let lat = if p99 < 100.0 {
        format!("{p50:.2} / {p99:.2} ms")
    } else {
        format!("{p50:.0} / {p99:.0} ms")
    };
    cx.rep.row(
        format!("admin /endpoints?limit=100 p50 / p99, {k} endpoints"),
        lat,
        vec![],
    );
    cx.rep.row(
        format!("admin /endpoints?limit=100 answer KiB / items, {k}"),
        format!("{} / {}", admin.bytes.div_ceil(1024), admin.items),
        vec![],
    );
}

/// `10k`, `100k`, `1M` (or the plain number when it is not a round thousand).
fn short(n: u64) -> String {
    match n {
        n if n >= 1_000_000 && n.is_multiple_of(1_000_000) => format!("{}M", n / 1_000_000),
        n if n >= 1000 && n.is_multiple_of(1000) => format!("{}k", n / 1000),
        n => n.to_string(),
    }
}

/// One run on a fresh courier: N messages sent closed-loop by [`SENDERS`] connections as
/// fast as courier accepts them, `/metrics` polled until every accepted message was
/// delivered or dead-lettered, RSS and sockets sampled meanwhile (peak) and read again
/// `plan.many_settle` after the finish (settled). The courier is handed back still running
/// (for the admin timing).
async fn run(cx: &Ctx, rx: &Arc<Hosts>, layout: Layout, n: u64) -> Res<(Outcome, Up)> {
    let name = match layout {
        Layout::One => "one endpoint".to_string(),
        Layout::Many { hosts, gone_every: 1 } => format!("{n} endpoints over {hosts} hosts, every one 410"),
        Layout::Many { hosts, .. } => format!("{n} endpoints over {hosts} hosts"),
    };
    let tag = match layout {
        Layout::One => "one",
        Layout::Many { .. } => "many",
    };
    let data = cx.tmp.path().join(format!("data-many-{tag}-{n}"));
    let (courier, _) = Courier::start(&cx.bin, &cx.config()?, &data)?;
    let up = Up { courier, data };
    up.courier.wait_ready().await?;
    let (pid, admin) = (up.courier.pid(), up.courier.admin);
    let mut poll = MetricsPoll::new(admin);
    let (f0, _) = poll.finished().await?;
    let answers0 = rx.answers.read();
    let cpu0 = cpu_secs(pid);
    let deadline = Instant::now() + cx.plan.drain_timeout;
    let target = Arc::new(AtomicU64::new(u64::MAX));
    let t0 = Instant::now();
    let watch = tokio::spawn(watch(poll, pid, f0, target.clone(), deadline));
    let sent = send_all(cx, up.courier.ingress, rx.clone(), layout, n, deadline).await;
    let ingest_s = (Instant::now() - t0).as_secs_f64();
    // The watcher waits for this many; set even after a failed send so it stops.
    let (accepted, failed) = sent.as_ref().map_or((0, 0), |s| *s);
    target.store(accepted, Ordering::Relaxed);
    let w = joined(watch).await?;
    sent?;
    let cpu_s = cpu_secs(pid) - cpu0;
    tokio::time::sleep(cx.plan.many_settle).await;
    let (a1, g1) = rx.answers.read();
    let finished = w.finished;
    let o = Outcome {
        accepted,
        failed,
        ingest_s,
        finish_s: (w.finish_at.unwrap_or(w.last_at) - t0).as_secs_f64(),
        done: w.finish_at.is_some(),
        finished,
        rss_peak: w.rss_peak,
        rss_after: rss(pid),
        sockets_peak: w.sockets_peak,
        sockets_after: sockets(pid),
        cpu_us: us_per(cpu_s, finished),
        answers: (a1 - answers0.0, g1 - answers0.1),
    };
    eprintln!(
        "  {name}: {accepted} accepted in {ingest_s:.2} s ({failed} failed), {finished} finished in {:.2} s = {}; \
         RSS peak {} settled {}; sockets peak {} settled {}",
        o.finish_s,
        per_s(o.rate()),
        mib(o.rss_peak),
        mib(o.rss_after),
        o.sockets_peak,
        o.sockets_after
    );
    // The 410s' dead letters are logged as warnings; they are the scenario, not a problem.
    let warnings: Vec<_> = up
        .courier
        .warnings()
        .into_iter()
        .filter(|l| !l.contains("dead-lettered"))
        .collect();
    if !warnings.is_empty() {
        eprintln!("  courier warnings: {warnings:?}");
    }
    Ok((o, up))
}

/// What the watcher saw.
struct Watched {
    /// When every accepted message had finished (interpolated); `None` if not in time.
    finish_at: Option<Instant>,
    /// The last read: its time and messages finished since the run began.
    last_at: Instant,
    finished: u64,
    rss_peak: u64,
    sockets_peak: u64,
}

/// Reads `/metrics` every [`POLL`] (and RSS and sockets every [`SAMPLE_EVERY`] reads) until
/// the finished count has grown by `target` since `f0` (`target` is set once every send
/// was answered) or `deadline` passes. The finish time is interpolated linearly between
/// the last read below the target and the first at or above it. The end is read from
/// courier rather than counted at the receiver: a 410 is an end only once courier has
/// recorded the dead letter, and in both runs the figure is courier's own.
async fn watch(mut poll: MetricsPoll, pid: u32, f0: u64, target: Arc<AtomicU64>, deadline: Instant) -> Watched {
    let (mut prev, mut k) = ((Instant::now(), 0u64), 0u32);
    let mut w = Watched {
        finish_at: None,
        last_at: prev.0,
        finished: 0,
        rss_peak: rss(pid),
        sockets_peak: sockets(pid),
    };
    loop {
        tokio::time::sleep(POLL).await;
        k += 1;
        if k.is_multiple_of(SAMPLE_EVERY) {
            w.rss_peak = w.rss_peak.max(rss(pid));
            w.sockets_peak = w.sockets_peak.max(sockets(pid));
        }
        if let Ok((f, at)) = poll.finished().await {
            let f = f.saturating_sub(f0);
            (w.last_at, w.finished) = (at, f);
            let want = target.load(Ordering::Relaxed);
            if f >= want {
                let (pt, pf) = prev;
                let share = if f > pf {
                    want.saturating_sub(pf) as f64 / (f - pf) as f64
                } else {
                    1.0
                };
                w.finish_at = Some(pt + (at - pt).mul_f64(share.clamp(0.0, 1.0)));
                w.finished = want;
                // The last moments of a run can be its peak: sampled once more.
                w.rss_peak = w.rss_peak.max(rss(pid));
                w.sockets_peak = w.sockets_peak.max(sockets(pid));
                return w;
            }
            prev = (at, f);
        }
        if Instant::now() > deadline {
            return w;
        }
    }
}

/// Latency of `GET /endpoints?limit=100` and what it answered.
#[derive(Default)]
struct AdminTiming {
    lat: Lat,
    status: u16,
    /// The first answer's size, and the items in it (counted as `"key":` occurrences: a
    /// full parse of an unpaged answer listing a million endpoints would cost gigabytes).
    bytes: usize,
    items: usize,
    next_cursor: bool,
    reconnects: u32,
}

impl AdminTiming {
    /// As JSON (latency in milliseconds).
    fn json(&self) -> Value {
        json!({"latency": self.lat.json(), "status": self.status, "body_bytes": self.bytes, "items": self.items,
               "has_next_cursor": self.next_cursor, "reconnects": self.reconnects})
    }
}

/// `plan.many_admin_requests` sequential `GET /endpoints?limit=100` on one keep-alive
/// connection to the admin listener (fewer if they take longer than
/// `plan.many_admin_budget` in all: without paging each answer lists every endpoint).
async fn admin_timing(cx: &Ctx, addr: SocketAddr) -> Res<AdminTiming> {
    let mut t = AdminTiming::default();
    let mut conn = Conn::open(addr).await?;
    let end = Instant::now() + cx.plan.many_admin_budget;
    let mut us = Vec::with_capacity(cx.plan.many_admin_requests);
    for _ in 0..cx.plan.many_admin_requests {
        if !us.is_empty() && Instant::now() > end {
            break;
        }
        let req = Request::builder()
            .method(Method::GET)
            .uri("/endpoints?limit=100")
            .header(HOST, addr.to_string())
            .body(Full::new(Bytes::new()))?;
        let sent = Instant::now();
        let (status, body) = match conn.send(req).await {
            Ok(a) => a,
            Err(_) if t.reconnects < 3 => {
                t.reconnects += 1;
                conn = Conn::open(addr).await?;
                continue;
            }
            Err(e) => return Err(e),
        };
        us.push((Instant::now() - sent).as_micros() as i64);
        if t.status == 0 {
            let text = String::from_utf8_lossy(&body);
            t.status = status.as_u16();
            t.bytes = body.len();
            t.items = text.matches("\"key\":").count();
            t.next_cursor = text.contains("\"next_cursor\":") && !text.contains("\"next_cursor\":null");
        }
    }
    t.lat = Lat::of(us);
    eprintln!(
        "  admin GET /endpoints?limit=100: {} requests, p50 {} p99 {}; answered {} with {} bytes, {} items",
        t.lat.n,
        ms(t.lat.p50),
        ms(t.lat.p99),
        t.status,
        t.bytes,
        t.items
    );
    Ok(t)
}
