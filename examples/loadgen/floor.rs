//! `--floor-only`: courier against baseline (g), the minimal durable forwarder
//! ([`crate::floor_server`]): what courier's delivery path costs over the least a durable
//! forwarder must do. Both take the same path-form POST (`/http://<receiver>/hook`) and
//! deliver to the same in-process receiver.
//!
//! Each pair runs courier, (g), (g), courier (A B B A, so a drift of the machine over the
//! pair weighs on both alike), every run on a fresh process and an empty data dir, in
//! three phases:
//! 1. closed loop, 16 keep-alive connections, warm-up then the window: delivered/s at the
//!    receiver, and per delivered message the process's CPU, context switches (all its
//!    threads) and bytes written to storage;
//! 2. open loop at 8,000/s and at 25% of the pair's (g) closed-loop delivered/s: CPU per
//!    delivered message and the 202's latency from the scheduled send;
//! 3. the sustainable-rate search of [`crate::sustain`], every search of the pair from the
//!    same first guess (the pair's (g) closed-loop delivered/s).
//!
//! Each figure is the median over the runs of each system; the table gives courier's
//! against (g)'s with its target.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::args::Args;
use crate::courier::{cpu_secs, us_per};
use crate::load::{closed_loop, open_loop, Lat, Schedule};
use crate::report::{ms, per_s, ratio, vs};
use crate::run::Ctx;
use crate::sustain::{search_from, Subject};
use crate::{joined, Res};

/// Closed-loop connections.
const CLOSED_CONNS: usize = 16;
/// Open-loop connections (as in the ack-latency and sustainable-rate scenarios).
const OPEN_CONNS: usize = 64;
/// The fixed rate both systems are measured at, besides 25% of (g)'s.
const FIXED_RATE: f64 = 8000.0;

/// The system a run measures.
#[derive(Clone, Copy, PartialEq)]
enum Sys {
    Courier,
    Floor,
}

/// The order of the runs in each pair.
const ORDER: [Sys; 4] = [Sys::Courier, Sys::Floor, Sys::Floor, Sys::Courier];

impl Sys {
    /// How the sustainable-rate machinery starts it (fresh, on an empty data dir).
    fn subject(self) -> Subject {
        match self {
            Sys::Courier => Subject::Courier,
            Sys::Floor => Subject::Floor,
        }
    }

    /// Its name in progress lines and the JSON.
    fn name(self) -> &'static str {
        match self {
            Sys::Courier => "courier",
            Sys::Floor => "(g)",
        }
    }
}

/// A process's counters at one instant, from `/proc`.
#[derive(Clone, Copy, Default)]
struct Counters {
    /// utime + stime, seconds.
    cpu_s: f64,
    /// Voluntary and involuntary context switches, summed over its threads.
    switches: u64,
    /// Bytes it caused to be written to storage (`write_bytes` of `/proc/<pid>/io`).
    written: u64,
}

impl Counters {
    /// Reads them for `pid` (zeros for what cannot be read).
    fn read(pid: u32) -> Counters {
        let field = |text: &str, name: &str| -> u64 {
            text.lines()
                .filter_map(|l| l.strip_prefix(name))
                .filter_map(|v| v.trim().parse::<u64>().ok())
                .sum()
        };
        // /proc/<pid>/status counts the main thread alone; each thread has its own.
        let switches = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks
                    .flatten()
                    .map(|t| std::fs::read_to_string(t.path().join("status")).unwrap_or_default())
                    .map(|s| field(&s, "voluntary_ctxt_switches:") + field(&s, "nonvoluntary_ctxt_switches:"))
                    .sum()
            })
            .unwrap_or(0);
        let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
        Counters {
            cpu_s: cpu_secs(pid),
            switches,
            written: field(&io, "write_bytes:"),
        }
    }

    /// Read at `start` and `end`: what the process did in between. A thread that ended
    /// inside the window takes its switches with it; these servers keep theirs.
    fn in_window(pid: u32, start: Instant, end: Instant) -> tokio::task::JoinHandle<Counters> {
        tokio::spawn(async move {
            tokio::time::sleep_until(start).await;
            let a = Counters::read(pid);
            tokio::time::sleep_until(end).await;
            let b = Counters::read(pid);
            Counters {
                cpu_s: b.cpu_s - a.cpu_s,
                switches: b.switches.saturating_sub(a.switches),
                written: b.written.saturating_sub(a.written),
            }
        })
    }
}

/// One open-loop run at a fixed rate.
#[derive(Clone, Default)]
struct Fixed {
    rate: f64,
    delivered: u64,
    delivered_s: f64,
    cpu_us: f64,
    failed: u64,
    /// Scheduled send → 202.
    ack: Lat,
}

/// Everything measured on one system in one slot of a pair.
#[derive(Clone)]
struct Run {
    sys: Sys,
    accepted_s: f64,
    delivered_s: f64,
    /// Per delivered message in the closed loop's window.
    cpu_us: f64,
    switches: f64,
    bytes: f64,
    /// At [`FIXED_RATE`] and at 25% of the pair's (g) closed-loop rate.
    fixed: [Fixed; 2],
    /// The highest passing rate (0 if none passed), and the search as JSON.
    sustain: f64,
    search: Value,
}

impl Run {
    /// As JSON.
    fn json(&self) -> Value {
        let fixed = |f: &Fixed| {
            json!({"rate": f.rate, "delivered_in_window": f.delivered, "delivered_per_s": f.delivered_s,
                   "cpu_us_per_delivered": f.cpu_us,
                   "failed": f.failed, "ack": f.ack.json()})
        };
        json!({"system": self.sys.name(), "closed": {"accepted_per_s": self.accepted_s,
               "delivered_per_s": self.delivered_s, "cpu_us_per_delivered": self.cpu_us,
               "ctx_switches_per_delivered": self.switches, "bytes_written_per_delivered": self.bytes},
               "fixed_rate": fixed(&self.fixed[0]), "quarter_of_g": fixed(&self.fixed[1]),
               "sustain": self.search})
    }
}

/// The window of each closed- and open-loop run: `--duration`, or 8 s (3 s `--quick`,
/// 0.3 s `--smoke`).
fn window(cx: &Ctx) -> Duration {
    match (cx.args.duration, cx.plan.mode) {
        (Some(s), _) => Duration::from_secs_f64(s),
        (None, "full") => Duration::from_secs(8),
        (None, _) => cx.plan.duration,
    }
}

/// Phase 1 of one slot: the closed loop against a fresh `sys`.
async fn closed(cx: &Ctx, sys: Sys, tag: &str) -> Res<Run> {
    let live = sys.subject().up(cx, tag).await?;
    let start = Instant::now() + cx.plan.warmup;
    let end = start + window(cx);
    let counters = Counters::in_window(live.pid, start, end);
    let counted = cx.receiver.count_between(start, end);
    let target = cx.target(live.addr, cx.hook_path());
    let r = closed_loop(&target, CLOSED_CONNS, start, end, None, false).await?;
    let (c, n) = (joined(counters).await?, joined(counted).await?);
    let per = |x: f64| x / n.max(1) as f64;
    Ok(Run {
        sys,
        accepted_s: r.rate(),
        delivered_s: n as f64 / window(cx).as_secs_f64(),
        cpu_us: us_per(c.cpu_s, n),
        switches: per(c.switches as f64),
        bytes: per(c.written as f64),
        fixed: Default::default(),
        sustain: 0.0,
        search: Value::Null,
    })
}

/// Phase 2 of one slot: the open loop at `rate` against a fresh `sys`.
async fn fixed(cx: &Ctx, sys: Sys, tag: &str, rate: f64) -> Res<Fixed> {
    let live = sys.subject().up(cx, tag).await?;
    let s = Schedule::new(OPEN_CONNS, rate, cx.plan.warmup, window(cx));
    let counters = Counters::in_window(live.pid, s.measure_from, s.end);
    let counted = cx.receiver.count_between(s.measure_from, s.end);
    let r = open_loop(&cx.target(live.addr, cx.hook_path()), &s).await?;
    let (c, n) = (joined(counters).await?, joined(counted).await?);
    Ok(Fixed {
        rate,
        delivered: n,
        delivered_s: n as f64 / window(cx).as_secs_f64(),
        cpu_us: us_per(c.cpu_s, n),
        failed: r.failed,
        ack: Lat::of(r.lat_us),
    })
}

/// One pair, A B B A, phase by phase; its runs in order and its JSON.
async fn pair(cx: &Ctx, p: usize) -> Res<(Vec<Run>, Value)> {
    let mut runs = Vec::new();
    for (i, sys) in ORDER.into_iter().enumerate() {
        let r = closed(cx, sys, &format!("floor-{p}-{i}-closed")).await?;
        eprintln!(
            "  pair {} closed loop, {}: {} delivered ({} accepted), {:.1} us CPU, {:.2} switches, {:.0} B written per delivered",
            p + 1,
            sys.name(),
            per_s(r.delivered_s),
            per_s(r.accepted_s),
            r.cpu_us,
            r.switches,
            r.bytes
        );
        runs.push(r);
    }
    let g_rate = mean(runs.iter().filter(|r| r.sys == Sys::Floor).map(|r| r.delivered_s));
    let rates = [FIXED_RATE, (g_rate * 0.25).max(50.0)];
    for (i, run) in runs.iter_mut().enumerate() {
        for (k, rate) in rates.into_iter().enumerate() {
            let f = fixed(cx, run.sys, &format!("floor-{p}-{i}-fixed{k}"), rate).await?;
            eprintln!(
                "  pair {} at {}, {}: {} delivered, {:.1} us CPU per delivered, ack p50 {} p99 {}",
                p + 1,
                per_s(rate),
                run.sys.name(),
                f.delivered,
                f.cpu_us,
                ms(f.ack.p50),
                ms(f.ack.p99)
            );
            run.fixed[k] = f;
        }
    }
    // Where a search starts moves where it ends by more than the 5% it resolves: every
    // search of the pair starts at the same rate.
    let first = Some(g_rate.max(50.0));
    for (i, run) in runs.iter_mut().enumerate() {
        let name = format!("pair {} run {} {}", p + 1, i + 1, run.sys.name());
        let s = search_from(cx, &name, &run.sys.subject(), first).await?;
        run.sustain = s.rate;
        run.search = s.json();
    }
    let json = json!({"g_closed_delivered_per_s": g_rate, "rates": rates,
                      "runs": runs.iter().map(Run::json).collect::<Vec<_>>()});
    Ok((runs, json))
}

/// The mean of some figures (0 if none).
fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = v.collect();
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// The median of some figures (0 if none; the mean of the middle two of an even count).
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    }
}

/// What a figure's target bounds.
#[derive(Clone, Copy)]
enum Bound {
    /// courier / (g) at least this.
    AtLeast(f64),
    /// courier / (g) at most this.
    AtMost(f64),
    /// courier's own figure at most this.
    CourierAtMost(f64),
    /// Shown, not judged.
    Shown,
}

impl Bound {
    /// The target as text and whether courier meets it (a ratio to a (g) that measured
    /// nothing meets none).
    fn judge(self, courier: f64, g: f64) -> Option<(String, bool)> {
        let r = ratio(courier, g);
        match self {
            Bound::AtLeast(b) => Some((format!(">= {b:.2}x"), g > 0.0 && r >= b)),
            Bound::AtMost(b) => Some((format!("<= {b:.2}x"), g > 0.0 && r <= b)),
            Bound::CourierAtMost(b) => Some((format!("<= {b:.1} (courier)"), courier <= b)),
            Bound::Shown => None,
        }
    }
}

/// A row of the table: its label, the figure of a run, how it is shown, its target.
type Spec = (String, Box<dyn Fn(&Run) -> f64>, fn(f64) -> String, Bound);

/// A row of the table.
fn spec(
    label: impl Into<String>,
    figure: impl Fn(&Run) -> f64 + 'static,
    show: fn(f64) -> String,
    bound: Bound,
) -> Spec {
    (label.into(), Box::new(figure), show, bound)
}

/// The rows of the table, in order.
fn specs(quarter: f64) -> Vec<Spec> {
    let us: fn(f64) -> String = |v| format!("{v:.1} us");
    let n: fn(f64) -> String = |v| format!("{v:.2}");
    let bytes: fn(f64) -> String = |v| format!("{v:.0} B");
    let mut rows = vec![
        spec(
            "delivered/s, closed loop, 16 conns",
            |r| r.delivered_s,
            per_s,
            Bound::AtLeast(0.75),
        ),
        spec("CPU per delivered, closed loop", |r| r.cpu_us, us, Bound::AtMost(1.5)),
        spec(
            "context switches per delivered, closed loop",
            |r| r.switches,
            n,
            Bound::CourierAtMost(2.0),
        ),
        spec(
            "bytes written per delivered, closed loop",
            |r| r.bytes,
            bytes,
            Bound::AtMost(1.5),
        ),
    ];
    // The fixed rates: 8,000/s, then a quarter of (g)'s closed loop, where the ack latency
    // has its targets.
    let (f8, q) = (per_s(FIXED_RATE), format!("25% of (g), {}", per_s(quarter)));
    let ack = [[Bound::Shown; 2], [Bound::AtMost(1.3), Bound::AtMost(1.5)]];
    for (i, (at, [p50, p99])) in [f8, q].into_iter().zip(ack).enumerate() {
        rows.push(spec(
            format!("delivered/s at {at}"),
            move |r| r.fixed[i].delivered_s,
            per_s,
            Bound::Shown,
        ));
        rows.push(spec(
            format!("CPU per delivered at {at}"),
            move |r| r.fixed[i].cpu_us,
            us,
            Bound::AtMost(1.5),
        ));
        rows.push(spec(format!("ack p50 at {at}"), move |r| r.fixed[i].ack.p50, ms, p50));
        rows.push(spec(format!("ack p99 at {at}"), move |r| r.fixed[i].ack.p99, ms, p99));
    }
    rows.push(spec(
        "sustainable rate, sched->receiver p99 <= 100 ms",
        |r| r.sustain,
        per_s,
        Bound::AtLeast(0.75),
    ));
    rows
}

/// The medians' rows and JSON.
fn report(cx: &mut Ctx, runs: &[Run], quarter: f64) -> Value {
    let of = |sys: Sys, f: &dyn Fn(&Run) -> f64| median(runs.iter().filter(|r| r.sys == sys).map(f).collect());
    let mut out = Vec::new();
    for (label, f, show, bound) in specs(quarter) {
        let (c, g) = (of(Sys::Courier, &f), of(Sys::Floor, &f));
        let compared = vec![vs("(g) median", show(g), ratio(c, g))];
        let label = format!("floor: {label}");
        let judged = bound.judge(c, g);
        match &judged {
            Some((t, pass)) => {
                let verdict = if *pass { "pass" } else { "FAIL" };
                cx.rep.judged(&label, show(c), compared, format!("{t}: {verdict}"));
            }
            None => cx.rep.row(&label, show(c), compared),
        }
        out.push(
            json!({"metric": label, "courier_median": c, "g_median": g, "ratio": ratio(c, g),
                        "target": judged.as_ref().map(|j| &j.0), "pass": judged.map(|j| j.1)}),
        );
    }
    Value::Array(out)
}

/// `--floor-only`: the scenario alone, one table.
pub async fn floor_only(args: Args) -> Res<()> {
    let mut cx = Ctx::new(args).await?;
    scenario(&mut cx).await?;
    cx.finish()
}

/// The scenario: every pair, then the medians; rows, JSON (`floor`) and checks.
pub async fn scenario(cx: &mut Ctx) -> Res<()> {
    let pairs = cx.args.pairs.unwrap_or(if cx.args.smoke { 1 } else { 3 });
    eprintln!(
        "floor: courier vs (g), {pairs} pairs of courier-(g)-(g)-courier, {} s windows",
        window(cx).as_secs_f64()
    );
    let (mut runs, mut pairs_json) = (Vec::new(), Vec::new());
    for p in 0..pairs {
        let (r, j) = pair(cx, p).await?;
        runs.extend(r);
        pairs_json.push(j);
    }
    let quarter = median(runs.iter().map(|r| r.fixed[1].rate).collect());
    let table = report(cx, &runs, quarter);
    cx.rep.set(
        "floor",
        json!({"config": {"pairs": pairs, "order": ORDER.map(Sys::name), "closed_conns": CLOSED_CONNS,
                          "open_conns": OPEN_CONNS, "warmup_s": cx.plan.warmup.as_secs_f64(),
                          "window_s": window(cx).as_secs_f64(), "fixed_rate": FIXED_RATE,
                          "sustain_window_s": cx.plan.sustain_window.as_secs_f64(),
                          "sustain_max_probes": cx.plan.sustain_probes},
               "pairs": pairs_json, "medians": table}),
    );
    let delivered = |sys: Sys| runs.iter().filter(|r| r.sys == sys).all(|r| r.delivered_s > 0.0);
    cx.checks.push(("floor: courier delivered", delivered(Sys::Courier)));
    cx.checks.push(("floor: (g) delivered", delivered(Sys::Floor)));
    Ok(())
}
