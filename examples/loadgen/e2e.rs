//! End to end with the receiver up (idle and under closed-loop load), and ack latency in
//! the open loop beside baselines (a), (d) and (e) at the same rate.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::args::{Args, Plan};
use crate::baselines::{spawn_baseline, Baseline};
use crate::courier::{courier_bin, cpu_secs, rss_sampler, us_per, write_config, Courier};
use crate::load::{closed_loop, paced, Conn, Lat, Target};
use crate::receiver::Receiver;
use crate::report::{mib, ms, per_s, ratio, vs};
use crate::run::{Base, Ctx};
use crate::{body_1k, err, joined, Res};

/// 202 → receiver latency idle (one message at a time) and under each closed-loop load,
/// with deliveries/s counted at the receiver in the same window. `load_rss` is the peak RSS
/// seen so far (receiver down); the row shows the peak of both. Returns deliveries/s per
/// connection count.
pub async fn receiver_up(cx: &mut Ctx, base: &Base, mut load_rss: u64) -> Res<HashMap<usize, f64>> {
    let plan = cx.plan.clone();
    let direct = base.direct.clone();
    let mut deliveries_at = HashMap::new();
    eprintln!("courier, receiver up");
    let (up, _) = Courier::start(&cx.bin, &cx.config()?, &cx.tmp.path().join("data-up"))?;
    up.wait_ready().await?;
    let to_up = cx.target(up.ingress, cx.hook_path());
    cx.receiver.record.store(true, Ordering::Relaxed);
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
            let at = cx
                .receiver
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
    cx.rep.row(
        "idle 202->receiver p50",
        ms(idle_ack.p50),
        vec![vs(
            "(c) direct POST p50",
            ms(direct.p50),
            ratio(idle_ack.p50, direct.p50),
        )],
    );
    cx.rep.row(
        "idle 202->receiver p99",
        ms(idle_ack.p99),
        vec![vs(
            "(c) direct POST p99",
            ms(direct.p99),
            ratio(idle_ack.p99, direct.p99),
        )],
    );
    cx.rep.row(
        "idle POST->receiver p50 / p99",
        format!("{:.2} / {:.2} ms", idle_post.p50, idle_post.p99),
        vec![],
    );
    cx.rep.set("e2e_idle_ack_to_receiver", idle_ack.json());
    cx.rep.set("e2e_idle_post_to_receiver", idle_post.json());
    cx.checks.push(("idle end to end", idle_ack.n > 0));
    cx.receiver.arrivals.lock().unwrap().clear();

    // Under load: closed loop at each connection count, deliveries counted in the same window.
    let mut up_json = serde_json::Map::new();
    for &n in &plan.conns {
        let (s, e) = cx.window(plan.warmup);
        let rcv0 = cx.receiver.count();
        let counter = cx.receiver.count_between(s, e);
        let sampler = rss_sampler(up.pid(), e);
        let r = closed_loop(&to_up, n, s, e, None, true).await?;
        let delivered_in_window = joined(counter).await?;
        let peak = joined(sampler).await?;
        load_rss = load_rss.max(peak);
        let t_end = Instant::now();
        let caught_up = cx
            .receiver
            .wait_count(
                rcv0 + r.accepted_total,
                plan.drain_timeout.min(Duration::from_secs(300)),
            )
            .await;
        let catch_up_s = (Instant::now() - t_end).as_secs_f64();
        let deliveries = delivered_in_window as f64 / plan.duration.as_secs_f64();
        let arrivals = cx.receiver.take_arrivals();
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
        cx.rep.row(
            format!("ingest 202/s, {n} conns, receiver up"),
            per_s(r.rate()),
            base.vs_ab(n, r.rate()),
        );
        cx.rep.row(
            format!("deliveries/s to receiver, {n} conns"),
            per_s(deliveries),
            vec![vs(
                format!("(a) hyper 202, {n} conns"),
                per_s(base.a[&n]),
                ratio(deliveries, base.a[&n]),
            )],
        );
        cx.rep.row(
            format!("202->receiver p50 / p99, {n} conns"),
            format!("{:.1} / {:.1} ms", e2e.p50, e2e.p99),
            vec![vs("(c) direct POST p99", ms(direct.p99), ratio(e2e.p99, direct.p99))],
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
        deliveries_at.insert(n, deliveries);
    }
    cx.receiver.record.store(false, Ordering::Relaxed);
    cx.rep.set("ingest_receiver_up", Value::Object(up_json));
    cx.rep.row("RSS under ingest load (peak)", mib(load_rss), vec![]);
    cx.rep.set("load_rss_peak_bytes", json!(load_rss));
    Ok(deliveries_at)
}

/// Ack latency at 25% of `max_ingest` in the open loop against a fresh courier, then
/// baselines (a), (d) and (e) at the same rate.
pub async fn ack_latency(cx: &mut Ctx, base: &Base, max_ingest: f64) -> Res<()> {
    // Ack latency at 25% of the maximum ingest rate (open loop), and baselines (a) and (d) at
    // that rate. On a fresh courier: the instance above was just overloaded on purpose (its
    // deliveries seconds behind), and the flushes and compactions that work leaves behind
    // would be measured instead of courier at 25% load; and with it stopped, the baselines
    // do not share the machine with them either.
    let plan = cx.plan.clone();
    let (fresh, _) = Courier::start(&cx.bin, &cx.config()?, &cx.tmp.path().join("data-ack"))?;
    fresh.wait_ready().await?;
    let to_fresh = cx.target(fresh.ingress, cx.hook_path());
    let [(_, a_addr), (_, d_addr)] = base.servers.as_ref().ok_or_else(|| err("(a) and (d) were stopped"))?;
    let to_base = cx.target(*a_addr, cx.hook_path());
    let to_durable = cx.target(*d_addr, cx.hook_path());
    let rate = (max_ingest * 0.25).max(10.0);
    let ol_conns = 64.min(plan.conns.iter().copied().max().unwrap_or(64)).max(4);
    // (e): (d) with RocksDB as the durable write, for the latency scenario only; measured
    // just before and just after courier, so both see the disk in the state courier met.
    let (rocks_base, rocks_addr) = spawn_baseline(Baseline::Rocks(cx.tmp.path()))?;
    let to_rocks = cx.target(rocks_addr, cx.hook_path());
    let ack_rocks_before = paced(&to_rocks, ol_conns, rate, &plan).await?;
    let ack = paced(&to_fresh, ol_conns, rate, &plan).await?;
    drop(fresh);
    let ack_rocks_after = paced(&to_rocks, ol_conns, rate, &plan).await?;
    drop(rocks_base);
    let ack_base = paced(&to_base, ol_conns, rate, &plan).await?;
    let ack_durable = paced(&to_durable, ol_conns, rate, &plan).await?;
    let mut rocks_lat = ack_rocks_before.lat_us;
    rocks_lat.extend(ack_rocks_after.lat_us);
    let ack_el = Lat::of(rocks_lat);
    let (ack_l, ack_bl) = (Lat::of(ack.lat_us.clone()), Lat::of(ack_base.lat_us.clone()));
    let ack_dl = Lat::of(ack_durable.lat_us.clone());
    let baselines = [
        ("(a) hyper 202", &ack_bl),
        ("(d) hyper + fdatasync", &ack_dl),
        ("(e) hyper + rocksdb sync", &ack_el),
    ];
    type Pick = fn(&Lat) -> f64;
    let quantiles: [(&str, Pick); 4] = [
        ("p50", |l| l.p50),
        ("p90", |l| l.p90),
        ("p99", |l| l.p99),
        ("p99.9", |l| l.p999),
    ];
    for (q, pick) in quantiles {
        let mut row: Vec<_> = baselines
            .iter()
            .map(|(name, b)| {
                vs(
                    format!("{name}, same rate, {q}"),
                    ms(pick(b)),
                    ratio(pick(&ack_l), pick(b)),
                )
            })
            .collect();
        row.push(vs(
            format!("(c) direct POST {q}"),
            ms(pick(&base.direct)),
            ratio(pick(&ack_l), pick(&base.direct)),
        ));
        cx.rep.row(
            format!("ack {q} at 25% load ({}, open loop)", per_s(rate)),
            ms(pick(&ack_l)),
            row,
        );
    }
    cx.rep.set(
        "ack_latency_25pct",
        json!({"rate": rate, "max_ingest": max_ingest, "conns": ol_conns, "achieved": ack.rate(), "failed": ack.failed,
               "latency": ack_l.json(), "baseline_a_latency": ack_bl.json(), "baseline_d_latency": ack_dl.json(),
               "baseline_e_latency": ack_el.json()}),
    );
    cx.checks.push(("ack latency", ack_l.n > 0));
    Ok(())
}

/// The ack-latency scenario alone (see `--ack-only`).
pub async fn ack_only(args: Args, rate: f64) -> Res<()> {
    let plan = Plan::from(&args);
    let bin = courier_bin(&args)?;
    let tmp = tempfile::Builder::new()
        .prefix("courier-bench-")
        .tempdir_in(std::env::temp_dir())?;
    let (body, seq) = (body_1k(args.event_body), Arc::new(AtomicU64::new(0)));
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
        // Again after courier: the disk as courier left it.
        ("baseline (e)", rocks_addr),
    ] {
        let t = Target {
            addr,
            path: path.clone(),
            body: body.clone(),
            seq: seq.clone(),
        };
        // Courier's CPU per message over the run, every message delivered (for tuning the
        // work per message at a fixed rate).
        let cpu_before = (addr == up.ingress).then(|| cpu_secs(up.pid()));
        let r = paced(&t, 64, rate, &plan).await?;
        let cpu = cpu_before.map_or(String::new(), |c0| {
            format!(
                ", {:.1} us CPU per message",
                us_per(cpu_secs(up.pid()) - c0, r.accepted)
            )
        });
        let l = Lat::of(r.lat_us.clone());
        eprintln!(
            "{name:>12} at {}: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms ({} answered, {} failed){cpu}",
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
