//! The whole run: what every scenario shares ([`Ctx`]), the baselines measured first
//! ([`Base`]), ingest with the receiver down, and the order of the scenarios.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::args::{Args, Plan};
use crate::baselines::{rocks_batches, rocks_threads, spawn_baseline, Baseline};
use crate::courier::{
    courier_bin, cpu_in_window, cpu_over, cpu_secs, dead_port, rss, rss_sampler, us_per, write_config, Courier,
    KillOnDrop,
};
use crate::load::{closed_loop, sequential, Lat, Target};
use crate::receiver::Receiver;
use crate::report::{mib, per_s, ratio, vs, Report, Vs};
use crate::sustain::CpuRef;
use crate::{body_1k, err, joined, Res};

/// What every scenario of one run shares.
pub struct Ctx {
    pub args: Args,
    pub plan: Plan,
    /// The courier binary.
    pub bin: PathBuf,
    /// Data dirs, configs and baseline files; removed at the end.
    pub tmp: tempfile::TempDir,
    pub body: Bytes,
    /// The event-id counter shared by every target, so ids are unique across the run.
    pub seq: Arc<AtomicU64>,
    pub receiver: Arc<Receiver>,
    pub rep: Report,
    /// (scenario, it produced something) pairs; `--smoke` fails if one is false.
    pub checks: Vec<(&'static str, bool)>,
    pub started: std::time::Instant,
}

impl Ctx {
    /// Sizes the run, finds courier, makes the temp dir and starts the receiver.
    pub async fn new(args: Args) -> Res<Ctx> {
        let plan = Plan::from(&args);
        let bin = courier_bin(&args)?;
        let tmp = tempfile::Builder::new()
            .prefix("courier-bench-")
            .tempdir_in(std::env::temp_dir())?;
        eprintln!(
            "loadgen: mode {}, courier {}, data in {}",
            plan.mode,
            bin.display(),
            tmp.path().display()
        );
        let body = body_1k(args.event_body);
        let mut rep = Report::default();
        rep.set(
            "run",
            json!({"mode": plan.mode, "conns": plan.conns, "duration_s": plan.duration.as_secs_f64(),
                   "warmup_s": plan.warmup.as_secs_f64(), "backlog": plan.backlog, "body_bytes": body.len(),
                   "sustain_window_s": plan.sustain_window.as_secs_f64(), "sustain_only": args.sustain_only,
                   "many_only": args.many_only, "fleet_only": args.fleet_only, "many_endpoints": plan.many_sizes,
                   "max_in_flight_per_host": args.max_in_flight, "nproc": std::thread::available_parallelism().map_or(0, |n| n.get())}),
        );
        Ok(Ctx {
            receiver: Receiver::start().await?,
            args,
            plan,
            bin,
            tmp,
            body,
            seq: Arc::new(AtomicU64::new(0)),
            rep,
            checks: Vec::new(),
            started: std::time::Instant::now(),
        })
    }

    /// A target at `addr` sending the run's body with the run's event ids.
    pub fn target(&self, addr: SocketAddr, path: impl Into<String>) -> Target {
        Target {
            addr,
            path: path.into(),
            body: self.body.clone(),
            seq: self.seq.clone(),
        }
    }

    /// The path-form path of a message for the receiver: `/http://<receiver>/hook`.
    pub fn hook_path(&self) -> String {
        format!("/http://{}/hook", self.receiver.addr)
    }

    /// Courier's benchmark config (written once per run).
    pub fn config(&self) -> Res<PathBuf> {
        write_config(self.tmp.path(), "courier", self.args.max_in_flight)
    }

    /// A closed-loop window starting after `warm`, `plan.duration` long.
    pub fn window(&self, warm: Duration) -> (Instant, Instant) {
        let start = Instant::now() + warm;
        (start, start + self.plan.duration)
    }

    /// Prints the table, writes the JSON, and (with `--smoke`) fails if a scenario did not
    /// produce anything.
    pub fn finish(mut self) -> Res<()> {
        let table = self.rep.table();
        println!("{table}");
        self.rep.set("table", json!(table));
        self.rep.set("elapsed_s", json!(self.started.elapsed().as_secs_f64()));
        std::fs::write(
            &self.args.json,
            serde_json::to_string_pretty(&Value::Object(self.rep.json.clone())).unwrap(),
        )?;
        eprintln!(
            "wrote {} ({:.0} s)",
            self.args.json.display(),
            self.started.elapsed().as_secs_f64()
        );
        if self.args.smoke {
            // Every scenario must have produced something; nothing is said about speed.
            let failed: Vec<_> = self.checks.iter().filter(|(_, ok)| !ok).map(|(n, _)| *n).collect();
            if !failed.is_empty() {
                return Err(err(format!("smoke: failed scenarios: {failed:?}")));
            }
            eprintln!("smoke: every scenario ran");
        }
        Ok(())
    }
}

/// The baselines measured at the start of a full run, per connection count; (a) and (d)
/// stay up for the ack-latency scenario.
pub struct Base {
    /// (c): a direct POST to the receiver, one at a time.
    pub direct: Lat,
    pub a: HashMap<usize, f64>,
    /// CPU per answered request during (a): (server, load generator), in microseconds.
    pub cpu_a: HashMap<usize, (f64, f64)>,
    pub b_threads: HashMap<usize, f64>,
    pub b_batch: HashMap<usize, f64>,
    /// RocksDB's CPU per message written in batches of N, in microseconds.
    pub cpu_b: HashMap<usize, f64>,
    pub d: HashMap<usize, f64>,
    /// The (a) and (d) servers (stopped once the ack-latency scenario is done with them).
    pub servers: Option<[(KillOnDrop, SocketAddr); 2]>,
}

impl Base {
    /// A rate of courier's beside (a), (b) and (d) at `n` connections.
    pub fn vs_ab(&self, n: usize, rate: f64) -> Vec<Vs> {
        vec![
            vs(
                format!("(a) hyper 202, {n} conns"),
                per_s(self.a[&n]),
                ratio(rate, self.a[&n]),
            ),
            vs(
                format!("(b) rocksdb {n} sync threads"),
                per_s(self.b_threads[&n]),
                ratio(rate, self.b_threads[&n]),
            ),
            vs(
                format!("(b) rocksdb batches of {n}"),
                per_s(self.b_batch[&n]),
                ratio(rate, self.b_batch[&n]),
            ),
            vs(
                format!("(d) hyper + fdatasync, {n} conns"),
                per_s(self.d[&n]),
                ratio(rate, self.d[&n]),
            ),
        ]
    }

    /// The CPU figures courier's CPU per delivered message is set beside: (a)'s server and
    /// (b)'s RocksDB per message at 64 connections (or the nearest count measured).
    pub fn cpu_ref(&self) -> Option<CpuRef> {
        let n = *self.cpu_b.keys().min_by_key(|n| (**n as i64 - 64).abs())?;
        Some(CpuRef {
            conns: n,
            a_us: self.cpu_a[&n].0,
            b_us: self.cpu_b[&n],
        })
    }
}

/// The full run (or `--quick`, `--smoke`): every scenario, one table.
pub async fn run(args: Args) -> Res<()> {
    let mut cx = Ctx::new(args).await?;
    let mut base = baselines(&mut cx).await?;
    let (max_ingest, down_rss) = ingest_down(&mut cx, &base).await?;
    let deliveries = crate::e2e::receiver_up(&mut cx, &base, down_rss).await?;
    crate::e2e::ack_latency(&mut cx, &base, max_ingest).await?;
    // (a) and (d) are not needed any more: stopped, so they hold no memory or sockets.
    base.servers = None;
    let sustainable = crate::sustain::scenario(&mut cx, base.cpu_ref()).await?;
    crate::sustain::overload_row(&mut cx, &deliveries, sustainable);
    crate::backlog::backlog(&mut cx, &base).await?;
    crate::many::scenario(&mut cx).await;
    cx.finish()
}

/// `--sustain-only`: the sustainable-rate scenarios alone (with their own short measurement
/// of the (a) and (b) CPU figures).
pub async fn sustain_only(args: Args) -> Res<()> {
    let mut cx = Ctx::new(args).await?;
    crate::sustain::scenario(&mut cx, None).await?;
    cx.finish()
}

/// Baselines (c), (a), (b) and (d), measured at each connection count.
async fn baselines(cx: &mut Ctx) -> Res<Base> {
    let plan = cx.plan.clone();
    let to_receiver = cx.target(cx.receiver.addr, "/hook");

    // (c) a direct POST to the receiver, one at a time.
    eprintln!("baseline (c): direct POST to the receiver");
    let direct = Lat::of(sequential(&to_receiver, plan.idle_samples).await?);
    cx.rep.set("baseline_c_direct_post", direct.json());

    // (a) a hyper server answering 202, in a child process.
    eprintln!("baseline (a): hyper 202 server in a child process");
    let (a_child, a_addr) = spawn_baseline(Baseline::Bare)?;
    let to_base = cx.target(a_addr, cx.hook_path());
    let (mut a, mut cpu_a) = (HashMap::new(), HashMap::new());
    let mut a_json = serde_json::Map::new();
    let me = std::process::id();
    for &n in &plan.conns {
        let (s, e) = cx.window(plan.warmup);
        let (srv_cpu, own_cpu) = (cpu_in_window(a_child.0.id(), s, e), cpu_in_window(me, s, e));
        let r = closed_loop(&to_base, n, s, e, None, false).await?;
        let srv = us_per(joined(srv_cpu).await?, r.accepted);
        let client = us_per(joined(own_cpu).await?, r.accepted);
        let lat = Lat::of(r.lat_us.clone());
        eprintln!(
            "  (a) {n} conns: {} (CPU per request: server {srv:.1} us, load generator {client:.1} us)",
            per_s(r.rate())
        );
        a.insert(n, r.rate());
        cpu_a.insert(n, (srv, client));
        a_json.insert(
            n.to_string(),
            json!({"rate": r.rate(), "failed": r.failed, "latency": lat.json(),
                   "server_cpu_us_per_request": srv, "loadgen_cpu_us_per_request": client}),
        );
    }
    cx.rep.set("baseline_a_hyper_202", Value::Object(a_json));

    // (b) RocksDB synced writes: N writer threads, and one thread writing batches of N.
    eprintln!("baseline (b): RocksDB sync=true writes");
    let (mut b_threads, mut b_batch, mut cpu_b) = (HashMap::new(), HashMap::new(), HashMap::new());
    let mut b_json = serde_json::Map::new();
    for &n in &plan.conns {
        let (d1, d2) = (
            cx.tmp.path().join(format!("rocks-t{n}")),
            cx.tmp.path().join(format!("rocks-b{n}")),
        );
        let (dur, b1, b2) = (plan.duration, cx.body.clone(), cx.body.clone());
        let t = joined(tokio::task::spawn_blocking(move || rocks_threads(&d1, n, dur, &b1))).await??;
        // This process does nothing else meanwhile, so its CPU is RocksDB's (writes,
        // WAL, and the flushes and compactions of its background threads).
        let c0 = cpu_secs(me);
        let (b, written) = joined(tokio::task::spawn_blocking(move || rocks_batches(&d2, n, dur, &b2))).await??;
        let b_us = us_per(cpu_secs(me) - c0, written);
        eprintln!(
            "  (b) {n}: {n} threads {} | batches of {n} {} ({b_us:.1} us CPU per message)",
            per_s(t),
            per_s(b)
        );
        b_threads.insert(n, t);
        b_batch.insert(n, b);
        cpu_b.insert(n, b_us);
        b_json.insert(
            n.to_string(),
            json!({"threads_rate": t, "batch_rate": b, "batch_cpu_us_per_message": b_us}),
        );
    }
    cx.rep.set("baseline_b_rocksdb_sync", Value::Object(b_json));

    // (d) the bare server of (a) with a group-committed fdatasync of each body to a file.
    eprintln!("baseline (d): hyper 202 after a group-committed fdatasync, in a child process");
    let (d_child, d_addr) = spawn_baseline(Baseline::File(cx.tmp.path()))?;
    let to_durable = cx.target(d_addr, cx.hook_path());
    let mut d = HashMap::new();
    let mut d_json = serde_json::Map::new();
    for &n in &plan.conns {
        let (s, e) = cx.window(plan.warmup);
        let r = closed_loop(&to_durable, n, s, e, None, false).await?;
        let lat = Lat::of(r.lat_us.clone());
        eprintln!("  (d) {n} conns: {}", per_s(r.rate()));
        d.insert(n, r.rate());
        d_json.insert(
            n.to_string(),
            json!({"rate": r.rate(), "failed": r.failed, "latency": lat.json()}),
        );
    }
    cx.rep.set("baseline_d_hyper_fdatasync", Value::Object(d_json));
    cx.checks.push(("baseline (a)", a.values().all(|r| *r > 0.0)));
    cx.checks.push((
        "baseline (b)",
        b_threads.values().chain(b_batch.values()).all(|r| *r > 0.0),
    ));
    Ok(Base {
        direct,
        a,
        cpu_a,
        b_threads,
        b_batch,
        cpu_b,
        d,
        servers: Some([(a_child, a_addr), (d_child, d_addr)]),
    })
}

/// Ingest with the receiver down (a dead port: each message tried once, then due in 1 h),
/// at each connection count, and where the CPU goes. Returns the highest ingest rate and
/// the peak RSS under this load.
async fn ingest_down(cx: &mut Ctx, base: &Base) -> Res<(f64, u64)> {
    let plan = cx.plan.clone();
    eprintln!("courier, receiver down (dead port)");
    let dead = dead_port().await?;
    let (down, _) = Courier::start(&cx.bin, &cx.config()?, &cx.tmp.path().join("data-down"))?;
    down.wait_ready().await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_rss = rss(down.pid());
    let idle_cpu = cpu_over(down.pid(), Duration::from_secs(1)).await;
    cx.rep.row("idle RSS (fresh, 1 s after ready)", mib(idle_rss), vec![]);
    cx.rep.set("idle_rss_bytes", json!(idle_rss));
    cx.rep.set("idle_cpu_fraction", json!(idle_cpu));
    let to_down = cx.target(down.ingress, format!("/http://{dead}/hook"));
    let mut max_ingest: f64 = 0.0;
    let mut cpu_down: HashMap<usize, f64> = HashMap::new();
    let mut down_json = serde_json::Map::new();
    let mut load_rss: u64 = 0;
    for &n in &plan.conns {
        let (s, e) = cx.window(plan.warmup);
        let sampler = rss_sampler(down.pid(), e);
        let cpu_w = cpu_in_window(down.pid(), s, e);
        let r = closed_loop(&to_down, n, s, e, None, false).await?;
        let cpu_s = joined(cpu_w).await?;
        let cpu = cpu_s / plan.duration.as_secs_f64();
        let per_202 = us_per(cpu_s, r.accepted);
        let peak = joined(sampler).await?;
        load_rss = load_rss.max(peak);
        let lat = Lat::of(r.lat_us.clone());
        max_ingest = max_ingest.max(r.rate());
        cx.rep.row(
            format!("ingest 202/s, {n} conns, receiver down"),
            per_s(r.rate()),
            base.vs_ab(n, r.rate()),
        );
        down_json.insert(
            n.to_string(),
            json!({"rate": r.rate(), "failed": r.failed, "latency": lat.json(), "rss_peak_bytes": peak,
                   "courier_cpu_cores": cpu, "courier_cpu_us_per_202": per_202}),
        );
        cpu_down.insert(n, per_202);
    }
    cx.rep.set("ingest_receiver_down", Value::Object(down_json));
    cx.checks.push(("ingest", max_ingest > 0.0));
    // Where the CPU goes: courier's CPU per 202 beside the CPU the bare hyper server spends
    // per answer and RocksDB spends per message written in batches; and the rate a server
    // doing only those two things could reach on this machine with this load generator.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
    let mut bound_json = serde_json::Map::new();
    for &n in &plan.conns {
        let ((srv, client), b_us, c_us) = (base.cpu_a[&n], base.cpu_b[&n], cpu_down[&n]);
        cx.rep.row(
            format!("CPU per 202, {n} conns, receiver down"),
            format!("{c_us:.1} us"),
            vec![
                vs(
                    format!("(a) hyper server per 202, {n} conns"),
                    format!("{srv:.1} us"),
                    ratio(c_us, srv),
                ),
                vs(
                    format!("(b) rocksdb per message, batches of {n}"),
                    format!("{b_us:.1} us"),
                    ratio(c_us, b_us),
                ),
                vs(
                    "(a)+(b) together",
                    format!("{:.1} us", srv + b_us),
                    ratio(c_us, srv + b_us),
                ),
            ],
        );
        let bound = cores * 1e6 / (client + srv + b_us);
        cx.rep.row(
            format!("bound: (a)+(b) work only, {n} conns"),
            per_s(bound),
            vec![vs(
                format!("(a) hyper 202, {n} conns"),
                per_s(base.a[&n]),
                ratio(bound, base.a[&n]),
            )],
        );
        bound_json.insert(
            n.to_string(),
            json!({"cores": cores, "loadgen_cpu_us": client, "server_a_cpu_us": srv, "rocksdb_b_cpu_us": b_us,
                   "courier_cpu_us": c_us, "bound_rate": bound, "bound_vs_a": bound / base.a[&n]}),
        );
    }
    cx.rep.set("cpu_bound", Value::Object(bound_json));
    if !down.warnings().is_empty() {
        eprintln!("  courier warnings: {:?}", down.warnings());
    }
    Ok((max_ingest, load_rss))
}
