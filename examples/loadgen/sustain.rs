//! The sustainable end-to-end rate: for courier, baseline (f) and nginx, the highest
//! constant open-loop rate whose scheduled send → receiver p99 stays within 100 ms with
//! under one second's worth of messages outstanding at the window's end; latency at 50%
//! and 90% of courier's; and courier's CPU per delivered message beside the baselines'.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::baselines::{rocks_batches, spawn_baseline, Baseline};
use crate::courier::{cpu_in_window, cpu_secs, us_per, Courier, KillOnDrop};
use crate::load::closed_loop;
use crate::nginx::Nginx;
use crate::probe::{probe, Probe, P99_BOUND_MS};
use crate::report::{per_s, ratio, vs};
use crate::run::Ctx;
use crate::{joined, Res};

/// The CPU figures courier's CPU per delivered message is set beside, in microseconds:
/// (a)'s server per request and (b)'s RocksDB per message, at `conns` connections.
#[derive(Debug, Clone, Copy)]
pub struct CpuRef {
    pub conns: usize,
    pub a_us: f64,
    pub b_us: f64,
}

/// A server the search probes.
pub enum Subject {
    /// A fresh courier (its own data dir) for every probe, so no probe inherits another's
    /// backlog or compaction debt.
    Courier,
    /// The same with `[fleet]` on the Redis at this URL, under a key prefix of its own (see
    /// `fleet::fleet_config`), so no probe inherits another's leases either.
    Fleet(String),
    /// The same with the config at this path (`seal::sealed_config`: payloads sealed).
    Sealed(PathBuf),
    /// A stateless forwarder, running throughout: nothing outlives a probe, since every
    /// answer comes after the receiver's.
    Fixed { addr: SocketAddr, pid: u32 },
    /// Baseline (g), the minimal durable forwarder: like courier, started fresh on an empty
    /// data dir for every probe.
    Floor,
}

/// A server up for one probe; a courier or (g) is killed and its data dir removed on drop.
pub struct Live {
    pub addr: SocketAddr,
    pub pid: u32,
    courier: Option<(Courier, PathBuf)>,
    floor: Option<(KillOnDrop, PathBuf)>,
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some((mut c, data)) = self.courier.take() {
            c.kill();
            // A 30 s probe leaves hundreds of MB; eight of them would fill a small /tmp.
            let _ = std::fs::remove_dir_all(data);
        }
        if let Some((child, data)) = self.floor.take() {
            drop(child); // killed and reaped before its files go
            let _ = std::fs::remove_dir_all(data);
        }
    }
}

impl Subject {
    /// Ready for a probe: a courier is started on data dir `data-sustain-<tag>`.
    pub async fn up(&self, cx: &Ctx, tag: &str) -> Res<Live> {
        match self {
            Subject::Fixed { addr, pid } => Ok(Live {
                addr: *addr,
                pid: *pid,
                courier: None,
                floor: None,
            }),
            Subject::Floor => {
                let data = cx.tmp.path().join(format!("data-floor-{tag}"));
                let (child, addr) = spawn_baseline(Baseline::Floor(cx.receiver.addr, &data))?;
                Ok(Live {
                    addr,
                    pid: child.0.id(),
                    courier: None,
                    floor: Some((child, data)),
                })
            }
            Subject::Courier | Subject::Fleet(_) | Subject::Sealed(_) => {
                let data = cx.tmp.path().join(format!("data-sustain-{tag}"));
                let config = match self {
                    Subject::Fleet(url) => crate::fleet::fleet_config(cx, url, tag)?,
                    Subject::Sealed(config) => config.clone(),
                    _ => cx.config()?,
                };
                let (c, _) = Courier::start(&cx.bin, &config, &data)?;
                c.wait_ready().await?;
                Ok(Live {
                    addr: c.ingress,
                    pid: c.pid(),
                    courier: Some((c, data)),
                    floor: None,
                })
            }
        }
    }
}

/// The outcome of one search.
pub struct Search {
    /// The first rate probed: deliveries/s of a short closed loop at 16 connections.
    guess: f64,
    /// The highest rate that passed (0 if none did).
    pub rate: f64,
    /// No probe failed: `rate` is only a lower bound.
    unbounded: bool,
    probes: Vec<Probe>,
}

impl Search {
    /// Where the search started.
    pub fn first_guess(&self) -> f64 {
        self.guess
    }

    /// The lowest rate probed (what a caller falls back to when none passed).
    pub fn lowest(&self) -> f64 {
        self.probes.iter().map(|p| p.rate).fold(f64::INFINITY, f64::min)
    }

    /// The rate for the table, marked `>=` or `<` when the search did not bracket it.
    pub fn show(&self) -> String {
        match (self.rate > 0.0, self.unbounded) {
            (true, false) => per_s(self.rate),
            (true, true) => format!(">= {}", per_s(self.rate)),
            (false, _) => format!("< {}", per_s(self.lowest())),
        }
    }

    /// As JSON, every probe included.
    pub fn json(&self) -> Value {
        json!({"rate": self.rate, "lower_bound_only": self.unbounded, "guess": self.guess,
               "probes": self.probes.iter().map(Probe::json).collect::<Vec<_>>()})
    }

    /// Whether every probe ran (something reached the receiver in each).
    pub fn worked(&self) -> bool {
        !self.probes.is_empty() && self.probes.iter().all(|p| p.delivered_rate > 0.0)
    }
}

/// Where the search starts: deliveries per second through `subj` in a short closed loop at
/// 16 connections (`--smoke` starts at a fixed 2,000/s instead, to stay within seconds).
async fn guess(cx: &Ctx, subj: &Subject) -> Res<f64> {
    if cx.args.smoke {
        return Ok(2000.0);
    }
    let live = subj.up(cx, "guess").await?;
    let start = Instant::now() + std::time::Duration::from_millis(300);
    let end = start + cx.plan.short_window;
    let counted = cx.receiver.count_between(start, end);
    closed_loop(&cx.target(live.addr, cx.hook_path()), 16, start, end, None, false).await?;
    Ok(joined(counted).await? as f64 / cx.plan.short_window.as_secs_f64())
}

/// Searches for the highest passing rate of `subj`: from the guess, up by 1.5x while
/// probes pass, or down (towards 90% of what was delivered, 1.2x to 3x lower) while they
/// fail, then bisecting (geometric mean) the passing and failing rates until they are
/// within 5% of each other or `plan.sustain_probes` probes were run.
pub async fn search(cx: &Ctx, name: &str, subj: &Subject) -> Res<Search> {
    search_from(cx, name, subj, None).await
}

/// [`search`], starting at `first` when given (so two subjects compared start alike: where
/// a search starts changes where it ends by more than the 5% it resolves).
pub async fn search_from(cx: &Ctx, name: &str, subj: &Subject, first: Option<f64>) -> Res<Search> {
    let guess = match first {
        Some(rate) => rate,
        None => guess(cx, subj).await?.max(50.0),
    };
    eprintln!("  {name}: first guess {}", per_s(guess));
    let (mut lo, mut hi) = (None::<f64>, None::<f64>);
    let mut probes = Vec::new();
    let mut rate = guess;
    for k in 0..cx.plan.sustain_probes {
        let live = subj.up(cx, &k.to_string()).await?;
        let p = probe(cx, live.addr, rate, true, None).await?;
        drop(live);
        let seen = if p.aborted {
            format!("{} delivered", per_s(p.delivered_rate))
        } else {
            format!(
                "p50 {} p99 {}, backlog {}, lost {}",
                p.q(p.lat.p50),
                p.q(p.lat.p99),
                p.backlog,
                p.lost
            )
        };
        eprintln!(
            "  {name}: probe {} at {}: {seen} -> {}",
            k + 1,
            per_s(rate),
            p.verdict()
        );
        if p.ok {
            lo = Some(lo.map_or(rate, |l| l.max(rate)));
        } else {
            hi = Some(hi.map_or(rate, |h| h.min(rate)));
        }
        let next = match (lo, hi) {
            (Some(l), None) => l * 1.5,
            (None, Some(h)) => (0.9 * p.delivered_rate).clamp(h / 3.0, h / 1.2),
            (Some(l), Some(h)) if h / l > 1.05 => (l * h).sqrt(),
            _ => {
                probes.push(p);
                break;
            }
        };
        probes.push(p);
        rate = next;
    }
    Ok(Search {
        guess,
        rate: lo.unwrap_or(0.0),
        unbounded: hi.is_none(),
        probes,
    })
}

/// (a)'s server CPU per request and (b)'s RocksDB CPU per message, both at 64, measured as
/// the full baselines measure them (`plan.duration` each) when they did not run
/// (`--sustain-only`). A shorter (b) would read low: its CPU includes the flushes and
/// compactions its writes cause, and a 1 s run leaves most of those out.
async fn measure_cpu_ref(cx: &Ctx) -> Res<CpuRef> {
    let (a, addr) = spawn_baseline(Baseline::Bare)?;
    let start = Instant::now() + cx.plan.warmup;
    let end = start + cx.plan.duration;
    let cpu = cpu_in_window(a.0.id(), start, end);
    let r = closed_loop(&cx.target(addr, cx.hook_path()), 64, start, end, None, false).await?;
    let a_us = us_per(joined(cpu).await?, r.accepted);
    drop(a);
    let (dir, dur, body) = (cx.tmp.path().join("rocks-cpu"), cx.plan.duration, cx.body.clone());
    // Nothing else runs in this process meanwhile, so its CPU is RocksDB's.
    let c0 = cpu_secs(std::process::id());
    let (_, written) = joined(tokio::task::spawn_blocking(move || rocks_batches(&dir, 64, dur, &body))).await??;
    let b_us = us_per(cpu_secs(std::process::id()) - c0, written);
    Ok(CpuRef { conns: 64, a_us, b_us })
}

/// The whole scenario: the three searches, the 50% and 90% points, CPU per delivered
/// message; rows, JSON (`sustain`) and smoke checks. `cpu_ref` comes from the run's
/// baselines, or is measured here when absent. Returns courier's sustainable rate.
pub async fn scenario(cx: &mut Ctx, cpu_ref: Option<CpuRef>) -> Res<f64> {
    eprintln!(
        "sustainable rate: open loop, p99 sched->receiver <= {P99_BOUND_MS} ms and backlog < 1 s, {} s windows",
        cx.plan.sustain_window.as_secs_f64()
    );
    let courier = search(cx, "courier", &Subject::Courier).await?;
    let (f_child, f_addr) = spawn_baseline(Baseline::Forward(cx.receiver.addr))?;
    let f_pid = f_child.0.id();
    let f_subj = Subject::Fixed {
        addr: f_addr,
        pid: f_pid,
    };
    let fwd = search(cx, "(f) forwarder", &f_subj).await?;
    let nginx = match Nginx::start(&cx.tmp.path().join("nginx"), cx.receiver.addr).await {
        Ok(n) => {
            let subj = Subject::Fixed {
                addr: n.addr,
                pid: n.pid(),
            };
            Ok((n.version.clone(), search(cx, "nginx", &subj).await?))
        }
        Err(reason) => {
            eprintln!("  nginx: skipped: {reason}");
            Err(reason)
        }
    };

    // Latency at 50% and 90% of courier's rate (of the lowest rate probed if none passed),
    // each on a fresh courier; CPU per delivered message at 50%, and (f) at that same rate.
    let base_rate = if courier.rate > 0.0 {
        courier.rate
    } else {
        courier.lowest()
    };
    let mut at = HashMap::new();
    for pct in [50u32, 90] {
        let live = Subject::Courier.up(cx, &format!("at{pct}")).await?;
        let p = probe(cx, live.addr, base_rate * f64::from(pct) / 100.0, false, Some(live.pid)).await?;
        eprintln!(
            "  courier at {pct}% ({}): p50 {} p99 {}, {} delivered in the window",
            per_s(p.rate),
            p.q(p.lat.p50),
            p.q(p.lat.p99),
            p.delivered
        );
        at.insert(pct, p);
    }
    let f50 = probe(cx, f_addr, base_rate * 0.5, false, Some(f_pid)).await?;
    drop(f_child);
    let cpu_ref = match cpu_ref {
        Some(c) => c,
        None => measure_cpu_ref(cx).await?,
    };
    let (c50, c90) = (&at[&50], &at[&90]);
    let courier_us = us_per(c50.cpu_s, c50.delivered);
    let f_us = us_per(f50.cpu_s, f50.delivered);

    // The rows.
    let mut compared = vec![vs(
        "(f) forwarding proxy, same search",
        fwd.show(),
        ratio(courier.rate, fwd.rate),
    )];
    if let Ok((version, n)) = &nginx {
        compared.push(vs(
            format!("{version} proxy_pass, same search"),
            n.show(),
            ratio(courier.rate, n.rate),
        ));
    }
    cx.rep.row(
        format!("sustainable rate, sched->receiver p99 <= {P99_BOUND_MS:.0} ms"),
        courier.show(),
        compared,
    );
    if let Err(reason) = &nginx {
        let short: String = reason.chars().take(40).collect();
        cx.rep.row(format!("nginx peer row skipped: {short}"), "", vec![]);
    }
    let pair = |p: &Probe| format!("{} / {}", p.q(p.lat.p50), p.q(p.lat.p99));
    cx.rep.row(
        format!("sched->receiver p50 / p99 at 50% ({})", per_s(c50.rate)),
        pair(c50),
        vec![vs(
            "(f) same rate, p99",
            f50.q(f50.lat.p99),
            ratio(c50.lat.p99, f50.lat.p99),
        )],
    );
    cx.rep.row(
        format!("sched->receiver p50 / p99 at 90% ({})", per_s(c90.rate)),
        pair(c90),
        vec![],
    );
    let n = cpu_ref.conns;
    let sum = cpu_ref.a_us + cpu_ref.b_us + f_us;
    cx.rep.row(
        format!("CPU per delivered message at 50% ({})", per_s(c50.rate)),
        format!("{courier_us:.1} us"),
        vec![
            vs(
                format!("(a) hyper server per 202, {n} conns"),
                format!("{:.1} us", cpu_ref.a_us),
                ratio(courier_us, cpu_ref.a_us),
            ),
            vs(
                format!("(b) rocksdb per message, batches of {n}"),
                format!("{:.1} us", cpu_ref.b_us),
                ratio(courier_us, cpu_ref.b_us),
            ),
            vs(
                "(f) forwarder per request, same rate",
                format!("{f_us:.1} us"),
                ratio(courier_us, f_us),
            ),
            vs("(a)+(b)+(f) together", format!("{sum:.1} us"), ratio(courier_us, sum)),
        ],
    );

    let nginx_json = match &nginx {
        Ok((version, n)) => json!({"version": version, "search": n.json()}),
        Err(reason) => json!({"skipped": reason}),
    };
    cx.rep.set(
        "sustain",
        json!({"criteria": {"p99_ms": P99_BOUND_MS, "backlog_below_one_second": true,
                            "window_s": cx.plan.sustain_window.as_secs_f64(), "warmup_s": cx.plan.sustain_warmup.as_secs_f64(),
                            "max_probes": cx.plan.sustain_probes, "conns": 64},
               "courier": courier.json(), "baseline_f_forwarder": fwd.json(), "nginx": nginx_json,
               "courier_vs_f": ratio(courier.rate, fwd.rate),
               "courier_at_50pct": c50.json(), "courier_at_90pct": c90.json(), "baseline_f_at_50pct": f50.json(),
               "cpu_per_delivered": {"rate": c50.rate, "courier_us": courier_us, "baseline_a_server_us": cpu_ref.a_us,
                                     "baseline_b_rocksdb_us": cpu_ref.b_us, "baseline_f_forwarder_us": f_us,
                                     "a_b_f_sum_us": sum, "reference_conns": n}}),
    );
    cx.checks.push(("sustain: courier search", courier.worked()));
    cx.checks.push(("sustain: (f) search", fwd.worked()));
    if let Ok((_, n)) = &nginx {
        cx.checks.push(("sustain: nginx search", n.worked()));
    }
    cx.checks.push((
        "sustain: 50% and 90% points",
        c50.lat.n > 0 && c90.lat.n > 0 && f50.lat.n > 0,
    ));
    Ok(courier.rate)
}

/// The overload check: courier's deliveries/s at the most connections of the closed-loop
/// points (256 in a full run), as a ratio to the sustainable rate; delivery should not
/// collapse under more load than it can sustain (target: at least 0.8x).
pub fn overload_row(cx: &mut Ctx, deliveries: &HashMap<usize, f64>, sustainable: f64) {
    let Some((&n, &d)) = deliveries.iter().max_by_key(|(n, _)| **n) else {
        return;
    };
    cx.rep.row(
        format!("deliveries/s at {n} conns vs sustainable rate"),
        per_s(d),
        vec![vs(
            "sustainable rate (open loop)",
            per_s(sustainable),
            ratio(d, sustainable),
        )],
    );
    cx.rep.set(
        "overload",
        json!({"conns": n, "deliveries_per_s": d, "sustainable_rate": sustainable, "ratio": ratio(d, sustainable)}),
    );
}

/// `--probe-at RATE`: one probe of a fresh courier at `rate`, run to its end, with its
/// latency per 500 ms slice and courier's CPU per delivered message.
pub async fn probe_at(args: crate::args::Args, rate: f64) -> Res<()> {
    let cx = Ctx::new(args).await?;
    let live = Subject::Courier.up(&cx, "at").await?;
    let p = probe(&cx, live.addr, rate, false, Some(live.pid)).await?;
    // RocksDB's own log (flushes, compactions, stalls, with wall-clock times) is kept
    // beside the JSON results, for setting against the slices.
    let log = cx.args.json.with_extension("rocksdb.LOG");
    let _ = std::fs::copy(cx.tmp.path().join("data-sustain-at").join("LOG"), &log);
    eprintln!("window start (UTC): {}; RocksDB log: {}", p.window_start, log.display());
    eprintln!("  slice   n     p50      p99      max   late");
    for (t, l, late) in &p.timeline {
        eprintln!(
            "  {t:5.1} {:5} {:>8} {:>8} {:>8} {late:5}",
            l.n,
            p.q(l.p50),
            p.q(l.p99),
            p.q(l.max)
        );
    }
    eprintln!(
        "courier at {}: p50 {} p99 {} p99.9 {}, {} delivered, CPU {:.1} us per delivered message -> {}",
        per_s(rate),
        p.q(p.lat.p50),
        p.q(p.lat.p99),
        p.q(p.lat.p999),
        p.delivered,
        us_per(p.cpu_s, p.delivered),
        p.verdict()
    );
    Ok(())
}
