//! `--fleet-only`: what `[fleet]` costs one courier. A real `redis-server` (Debian's, found
//! as the tests find it: `COURIER_TEST_REDIS_SERVER`, else `redis-server` on PATH or in
//! /usr/bin; the run fails without one) on an ephemeral loopback port; courier's sustainable
//! rate searched without `[fleet]` and with it in the same run (a fresh `key_prefix` per
//! probe, so no probe inherits another's leases or rate), and their ratio; then one
//! open-loop window with `[fleet]` at 90% of that rate, with Redis's CPU (`INFO cpu`:
//! `used_cpu_user + used_cpu_sys`) and its calls (`INFO commandstats`) read at the window's
//! edges: Redis CPU and script calls per delivered message, and how many couriers at this
//! rate one Redis core serves.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use crate::args::Args;
use crate::courier::{write_config, KillOnDrop};
use crate::load::{open_loop, Schedule};
use crate::report::{per_s, ratio, vs};
use crate::run::Ctx;
use crate::sustain::{search, Subject};
use crate::{err, Res};

/// A `redis-server` on loopback with nothing on disk, killed on drop.
pub struct RedisServer {
    _child: KillOnDrop,
    pub addr: SocketAddr,
}

impl RedisServer {
    /// Starts one in `dir` on a free loopback port and waits until it answers.
    pub async fn start(dir: &Path) -> Res<RedisServer> {
        let bin = redis_server_bin()?;
        std::fs::create_dir_all(dir)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let child = Command::new(&bin)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| err(format!("starting {}: {e}", bin.display())))?;
        let mut server = RedisServer {
            _child: KillOnDrop(child),
            addr,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.stats().await.is_err() {
            if let Ok(Some(status)) = server._child.0.try_wait() {
                return Err(err(format!("redis-server on {addr} exited ({status})")));
            }
            if Instant::now() > deadline {
                return Err(err(format!("redis-server did not answer on {addr}")));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(server)
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Its CPU so far and its calls per command.
    pub async fn stats(&self) -> Res<RedisStats> {
        let redis = |e: redis::RedisError| err(format!("redis: {e}"));
        let client = redis::Client::open(self.url()).map_err(redis)?;
        let mut conn = client.get_multiplexed_async_connection().await.map_err(redis)?;
        let cpu: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut conn)
            .await
            .map_err(redis)?;
        let cmds: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .map_err(redis)?;
        let field = |name: &str| {
            cpu.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let calls = cmds
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                let n = rest.strip_prefix("calls=")?.split(',').next()?.parse().ok()?;
                Some((name.to_string(), n))
            })
            .collect();
        Ok(RedisStats {
            cpu_s: field("used_cpu_user") + field("used_cpu_sys"),
            calls,
        })
    }
}

/// What `INFO cpu` and `INFO commandstats` say at one moment.
#[derive(Debug, Clone, Default)]
pub struct RedisStats {
    pub cpu_s: f64,
    pub calls: HashMap<String, u64>,
}

impl RedisStats {
    /// Calls of `command` since `before`.
    fn calls_since(&self, before: &RedisStats, command: &str) -> u64 {
        let n = |s: &RedisStats| s.calls.get(command).copied().unwrap_or(0);
        n(self).saturating_sub(n(before))
    }
}

/// The redis-server binary, as the tests find it, or an error saying how to get one.
fn redis_server_bin() -> Res<PathBuf> {
    let from_env = std::env::var_os("COURIER_TEST_REDIS_SERVER").map(PathBuf::from);
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("redis-server"))
            .find(|p| p.is_file())
    });
    from_env
        .or(on_path)
        .or_else(|| Some(PathBuf::from("/usr/bin/redis-server")))
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            err(
                "--fleet-only needs redis-server: install Debian's (apt-get install redis-server, \
                 as scripts/verifiers.sh does) or set COURIER_TEST_REDIS_SERVER",
            )
        })
}

/// Courier's benchmark config with `[fleet]` on `redis_url`, under a key prefix no other
/// probe of the run uses.
pub fn fleet_config(cx: &Ctx, redis_url: &str, tag: &str) -> Res<PathBuf> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = format!("courier-fleet-{n}");
    let path = write_config(cx.tmp.path(), &name, cx.args.max_in_flight)?;
    let mut text = std::fs::read_to_string(&path)?;
    text.push_str(&format!(
        "\n[fleet]\nredis_url = \"{redis_url}\"\nkey_prefix = \"bench-{n}-{tag}\"\n"
    ));
    std::fs::write(&path, text)?;
    Ok(path)
}

/// Redis's share of one window with `[fleet]` on.
struct Window {
    rate: f64,
    secs: f64,
    delivered: u64,
    cpu_s: f64,
    evalsha: u64,
    publish: u64,
}

/// One open-loop window at `rate` through a fresh courier with `[fleet]` on, with Redis's
/// CPU and calls read at the measured window's edges.
async fn redis_window(cx: &Ctx, redis: &RedisServer, rate: f64) -> Res<Window> {
    let live = Subject::Fleet(redis.url()).up(cx, "redis-cpu").await?;
    let s = Schedule::new(64, rate, cx.plan.sustain_warmup, cx.plan.sustain_window);
    let (from, end) = (s.measure_from, s.end);
    let recv = cx.receiver.clone();
    let meter = async {
        tokio::time::sleep_until(from).await;
        let (before, c0) = (redis.stats().await?, recv.count());
        tokio::time::sleep_until(end).await;
        let (after, c1) = (redis.stats().await?, recv.count());
        Res::Ok((before, after, c1 - c0))
    };
    let target = cx.target(live.addr, cx.hook_path());
    let (sent, measured) = tokio::join!(open_loop(&target, &s), meter);
    sent?;
    let (before, after, delivered) = measured?;
    Ok(Window {
        rate,
        secs: (end - from).as_secs_f64(),
        delivered,
        cpu_s: after.cpu_s - before.cpu_s,
        evalsha: after.calls_since(&before, "evalsha"),
        publish: after.calls_since(&before, "publish"),
    })
}

/// `--fleet-only`: the scenario alone, one table.
pub async fn fleet_only(args: Args) -> Res<()> {
    let mut cx = Ctx::new(args).await?;
    scenario(&mut cx).await?;
    cx.finish()
}

/// The scenario: both searches, the Redis window; rows, JSON (`fleet`) and smoke checks.
pub async fn scenario(cx: &mut Ctx) -> Res<()> {
    let redis = RedisServer::start(&cx.tmp.path().join("redis")).await?;
    let version = Command::new(redis_server_bin()?)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    eprintln!("fleet: {version} on {}", redis.addr);
    let alone = search(cx, "courier without [fleet]", &Subject::Courier).await?;
    let fleet = search(cx, "courier with [fleet]", &Subject::Fleet(redis.url())).await?;
    let base = if fleet.rate > 0.0 { fleet.rate } else { fleet.lowest() };
    let w = redis_window(cx, &redis, base * 0.9).await?;
    let us_per_msg = w.cpu_s * 1e6 / w.delivered.max(1) as f64;
    let calls_per_msg = w.evalsha as f64 / w.delivered.max(1) as f64;
    // One core's worth of Redis CPU over what one courier at this rate costs it.
    let couriers = if w.cpu_s > 0.0 { w.secs / w.cpu_s } else { f64::INFINITY };
    eprintln!(
        "  redis at {}: {} delivered in {:.1} s, {:.3} s CPU, {} EVALSHA, {} PUBLISH",
        per_s(w.rate),
        w.delivered,
        w.secs,
        w.cpu_s,
        w.evalsha,
        w.publish
    );
    cx.rep.row(
        "sustainable rate with [fleet] (local redis-server)",
        fleet.show(),
        vec![vs(
            "without [fleet], same search",
            alone.show(),
            ratio(fleet.rate, alone.rate),
        )],
    );
    cx.rep.row(
        format!("Redis CPU per delivered message at {}", per_s(w.rate)),
        format!("{us_per_msg:.1} us"),
        vec![],
    );
    cx.rep.row(
        format!("script calls per delivered message at {}", per_s(w.rate)),
        format!("{calls_per_msg:.3}"),
        vec![],
    );
    cx.rep.row(
        format!("couriers one Redis core serves at {}", per_s(w.rate)),
        format!("{couriers:.1}"),
        vec![],
    );
    cx.rep.set(
        "fleet",
        json!({"redis": version, "without_fleet": alone.json(), "with_fleet": fleet.json(),
               "ratio": ratio(fleet.rate, alone.rate),
               "redis_window": {"rate": w.rate, "window_s": w.secs, "delivered": w.delivered,
                                "redis_cpu_s": w.cpu_s, "evalsha": w.evalsha, "publish": w.publish,
                                "redis_cpu_us_per_delivered": us_per_msg,
                                "script_calls_per_delivered": calls_per_msg,
                                "couriers_per_redis_core": couriers}}),
    );
    cx.checks.push(("fleet: search without [fleet]", alone.worked()));
    cx.checks.push(("fleet: search with [fleet]", fleet.worked()));
    cx.checks
        .push(("fleet: redis window", w.delivered > 0 && w.evalsha > 0));
    Ok(())
}
