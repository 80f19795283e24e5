//! The backlog scenario: N messages accepted for a paused endpoint, then memory, disk and
//! CPU while nothing is due, restart after kill -9, and the drain once resumed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde_json::json;
use tokio::time::Instant;

use crate::courier::{admin, cpu_over, cpu_secs, dir_size, metric, rss, us_per, Courier};
use crate::load::{closed_loop, Conn};
use crate::report::{mib, per_s};
use crate::run::{Base, Ctx};
use crate::{err, Res};

/// Backlog: the endpoint paused (as an operator does while its receiver is down), then
/// `plan.backlog` messages accepted, courier left to settle, measured, killed with -9,
/// restarted, and the endpoint resumed until the receiver has every message.
pub async fn backlog(cx: &mut Ctx, base: &Base) -> Res<()> {
    let plan = cx.plan.clone();
    eprintln!("backlog: {} messages for a paused endpoint", plan.backlog);
    let (bin, cfg, data) = (cx.bin.clone(), cx.config()?, cx.tmp.path().join("data-backlog"));
    let (mut bl, _) = Courier::start(&bin, &cfg, &data)?;
    bl.wait_ready().await?;
    let to_bl = cx.target(bl.ingress, format!("/http://{}/backlog", cx.receiver.addr));
    // One delivered message makes the endpoint known, so it can be paused.
    let before = cx.receiver.count();
    let mut c = Conn::open(bl.ingress).await?;
    c.send(to_bl.request()?.1).await?;
    if !cx.receiver.wait_count(before + 1, Duration::from_secs(10)).await {
        return Err(err("the first backlog message was not delivered"));
    }
    let key = format!("http://{}/backlog", cx.receiver.addr);
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
    let bl_disk = dir_size(&data);
    let bl_cpu = cpu_over(bl.pid(), plan.cpu_window).await;
    bl.kill();
    drop(bl);
    let t_restart = Instant::now();
    let (bl2, to_listen) = Courier::start(&bin, &cfg, &data)?;
    bl2.wait_ready().await?;
    let restart_s = (Instant::now() - t_restart).as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after_restart = rss(bl2.pid());
    let pending_after = metric(bl2.admin, "courier_pending").await.unwrap_or(-1.0);
    // Drain: resume the endpoint and count deliveries.
    let c0 = cx.receiver.count();
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
    let drained = cx.receiver.wait_count(c0 + accepted, plan.drain_timeout).await;
    let drain_s = (Instant::now() - t_drain).as_secs_f64();
    sampler_end.store(true, Ordering::Relaxed);
    let _ = sampler.await;
    let drain_cpu = (cpu_secs(bl2.pid()) - cpu0) / drain_s;
    let delivered = cx.receiver.count() - c0;
    let drain_rate = delivered as f64 / drain_s;
    drop(bl2);

    // Compared with the baselines at the measured connection count nearest the fill's.
    let near = plan.conns.iter().copied().min_by_key(|c| c.abs_diff(64)).unwrap_or(64);
    cx.rep.row(
        format!(
            "backlog fill: {accepted} accepted, {} conns",
            64.min(*plan.conns.iter().max().unwrap_or(&64))
        ),
        per_s(fill_rate),
        base.vs_ab(near, fill_rate),
    );
    cx.rep.row(
        "CPU per 202, backlog fill (accept and park)",
        format!("{fill_cpu_us:.1} us"),
        vec![],
    );
    cx.rep
        .row(format!("backlog RSS ({accepted} pending)"), mib(bl_rss), vec![]);
    cx.rep.row("backlog data-dir size", mib(bl_disk), vec![]);
    cx.rep.row(
        format!("backlog CPU, nothing due ({:.1} s)", plan.cpu_window.as_secs_f64()),
        format!("{:.2}% core", bl_cpu * 100.0),
        vec![],
    );
    cx.rep.row(
        "backlog restart-to-ready (kill -9)",
        format!("{restart_s:.3} s"),
        vec![],
    );
    cx.rep.row("backlog RSS after restart", mib(rss_after_restart), vec![]);
    cx.rep.row(
        format!("backlog drain, max_in_flight_per_host {}", cx.args.max_in_flight),
        per_s(drain_rate),
        vec![],
    );
    cx.rep.row(
        "backlog RSS during drain (peak)",
        mib(peak.load(Ordering::Relaxed)),
        vec![],
    );
    cx.rep.set(
        "backlog",
        json!({"accepted": accepted, "failed": r.failed, "fill_s": fill_s, "fill_rate": fill_rate, "fill_cpu_us_per_202": fill_cpu_us,
               "settle_s": settle_s, "settle_cpu_cores": settle_cpu, "pending_metric": pending, "rss_bytes": bl_rss, "data_dir_bytes": bl_disk,
               "cpu_nothing_due_cores": bl_cpu, "cpu_window_s": plan.cpu_window.as_secs_f64(),
               "restart_to_listening_s": to_listen.as_secs_f64(), "restart_to_ready_s": restart_s,
               "rss_after_restart_bytes": rss_after_restart, "pending_after_restart": pending_after,
               "drained": drained, "delivered": delivered, "drain_s": drain_s, "drain_rate": drain_rate,
               "drain_cpu_cores": drain_cpu, "drain_rss_peak_bytes": peak.load(Ordering::Relaxed),
               "max_in_flight_per_host": cx.args.max_in_flight}),
    );
    cx.checks.push(("backlog accepted", accepted == plan.backlog));
    cx.checks.push(("backlog drained", drained && delivered >= accepted));
    cx.checks.push(("restart", restart_s > 0.0));
    Ok(())
}
