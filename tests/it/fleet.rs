//! Fleet-wide limits on a real `redis-server` (see `support_redis`): several real couriers
//! share one Redis, and a real receiver counts what reaches it. The host cap holds across
//! the fleet, a killed courier's leases expire, a Redis outage falls back to the local
//! limits divided by `fleet.expected_replicas` and loses nothing, and the rate limit is the
//! fleet's, not each courier's.

use std::collections::HashSet;
use std::time::Duration;

use crate::metrics::parse;
use crate::support::*;
use crate::support_redis::RedisServer;

/// `[fleet]` on `redis` (keys under `prefix`) after `extra` TOML.
fn config(redis: &RedisServer, prefix: &str, extra: &str, fleet_extra: &str) -> String {
    format!(
        "{extra}\n[fleet]\nredis_url = \"{}\"\nkey_prefix = \"{prefix}\"\n{fleet_extra}\n",
        redis.url()
    )
}

/// Starts `n` couriers with the same config, each in its own folder under `dir`.
fn couriers(dir: &tempfile::TempDir, n: usize, cfg: &str) -> Vec<Courier> {
    (0..n)
        .map(|i| {
            let sub = dir.path().join(format!("c{i}"));
            std::fs::create_dir_all(&sub).unwrap();
            Courier::start(&sub, cfg)
        })
        .collect()
}

/// Sends `n` messages through `c` to `url`, bodies `<tag>-<i>`; each must be accepted.
async fn send(c: &Courier, url: &str, tag: &str, n: usize) {
    let target = c.prefixed(url);
    for i in 0..n {
        let a = post(&target, &[], format!("{tag}-{i}")).await;
        assert_eq!(a.status, 202, "{}", a.text());
    }
}

/// Sends `n` messages through each courier to `url`, taking turns, so that every courier
/// has a backlog at the same time.
async fn send_in_turn(cs: &[Courier], url: &str, n: usize) {
    for i in 0..n {
        for (k, c) in cs.iter().enumerate() {
            let a = post(&c.prefixed(url), &[], format!("c{k}-{i}")).await;
            assert_eq!(a.status, 202, "{}", a.text());
        }
    }
}

/// A sample of `c`'s `/metrics` (0 when absent).
async fn metric(c: &Courier, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = get(&c.admin_url("/metrics")).await.text();
    parse(&text).unwrap().value(name, labels).unwrap_or(0.0)
}

/// Waits until `c`'s `courier_fleet_redis_up` reads `want`.
async fn wait_redis_up(c: &Courier, want: f64) {
    eventually(&format!("courier_fleet_redis_up {want}"), || async {
        (metric(c, "courier_fleet_redis_up", &[]).await == want).then_some(())
    })
    .await;
}

/// The Redis key of `host`'s lease set: named by a hash, never the host (see docs/fleet.md).
fn host_set(prefix: &str, host: &str) -> String {
    let digest = <sha2::Sha256 as sha2::Digest>::digest(host.as_bytes());
    format!("{prefix}:host:{}", hex::encode(&digest[..16]))
}

/// Every body seen once: nothing lost, nothing doubled.
fn assert_each_once(seen: &[Seen], expected: usize) {
    let bodies: HashSet<&[u8]> = seen.iter().map(|s| s.body.as_slice()).collect();
    assert_eq!(bodies.len(), expected, "distinct messages delivered");
    assert_eq!(seen.len(), expected, "no message delivered twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_couriers_never_send_one_host_more_than_its_cap_together() {
    let Some(redis) = RedisServer::start() else { return };
    let rx = Receiver::scripted(|_, _| Reply::status(200).after(Duration::from_millis(150))).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&redis, "cap", "[delivery]\nmax_in_flight_per_host = 5\n", "");
    let cs = couriers(&dir, 3, &cfg);
    for c in &cs {
        wait_redis_up(c, 1.0).await;
    }
    send_in_turn(&cs, &rx.url("/hook"), 20).await;
    // While leases are held, Redis names the host by a hash only (see docs/fleet.md).
    let host_set = host_set("cap", &rx.addr.to_string());
    let names: Vec<String> = eventually("leases in Redis under the hashed host", || async {
        let names: Vec<String> = redis.query(&["KEYS", "cap:*"]);
        names.contains(&host_set).then_some(names)
    })
    .await;
    let addr = rx.addr.to_string();
    assert!(names.iter().all(|n| !n.contains(&addr)), "{names:?}");
    let seen = rx.wait_for(60).await;
    let all_arrived = std::time::Instant::now();
    assert_each_once(&seen, 60);
    // Alone, each courier would have 5 in flight: 15 at once. Together they keep to 5.
    eprintln!(
        "three couriers, cap 5: at most {} in flight at the receiver",
        rx.max_in_flight()
    );
    assert!(rx.max_in_flight() <= 5, "{} in flight at once", rx.max_in_flight());
    assert!(
        rx.max_in_flight() >= 3,
        "the cap is used, not serialised: {}",
        rx.max_in_flight()
    );
    let mut busy = 0.0;
    for c in &cs {
        busy += metric(c, "courier_fleet_acquires_total", &[("outcome", "host_busy")]).await;
        assert_eq!(
            metric(c, "courier_fleet_acquires_total", &[("outcome", "fallback")]).await,
            0.0
        );
    }
    assert!(busy > 0.0, "the couriers waited for each other's leases");
    // Every lease released as its answer came (none left to expire): the set is empty
    // well before the last leases (taken as the last requests went out) could have expired
    // (lease_ttl, 10 s by default).
    eventually("every lease released", || async {
        let n: u64 = redis.query(&["ZCARD", &host_set]);
        (n == 0).then_some(())
    })
    .await;
    let released_in = all_arrived.elapsed();
    assert!(
        released_in < Duration::from_secs(5),
        "the last leases went {released_in:?} after the last request arrived: expired, not released"
    );
    // Every lease was taken and released in Redis; each acquire call carries one pass's
    // requests and each release call the releases queued meanwhile, so there are at most
    // one call per request (grants and refusals) plus one per release, and fewer when
    // they were batched. A release call publishes only when someone was refused meanwhile.
    let stats = redis.command_stats();
    let calls = |name: &str| stats.iter().find(|s| s.0 == name).map_or(0, |s| s.1);
    eprintln!("fleet cost after 60 attempts, 3 couriers: {stats:?}");
    assert!(calls("zadd") >= 1 && calls("zrem") >= 1, "{stats:?}");
    assert!(calls("evalsha") as f64 <= 2.0 * 60.0 + busy, "{stats:?}");
    assert!(calls("publish") as f64 <= busy, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_couriers_leases_expire_and_the_others_get_the_whole_cap() {
    let Some(redis) = RedisServer::start() else { return };
    let held = Gate::new();
    let gate = held.clone();
    // /a (the courier that dies) and /long hang until the end; /b answers after a while.
    let rx = Receiver::scripted(move |_, seen| {
        if seen.path == "/b" {
            Reply::status(200).after(Duration::from_millis(500))
        } else {
            Reply::status(200).until(&gate)
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &redis,
        "kill",
        "[delivery]\nmax_in_flight_per_host = 4\n",
        "lease_ttl = \"2s\"",
    );
    // The first courier dies holding 3 slots; the third holds the fourth all along (its
    // renewals keep the host's set alive, so only the dead courier's leases expiring one by
    // one can free the other three); the second has a backlog.
    let mut cs = couriers(&dir, 3, &cfg);
    for c in &cs {
        wait_redis_up(c, 1.0).await;
    }
    send(&cs[0], &rx.url("/a"), "a", 3).await;
    eventually("3 attempts in flight from the first courier", || async {
        (rx.in_flight_on("/a") == 3).then_some(())
    })
    .await;
    send(&cs[2], &rx.url("/long"), "long", 1).await;
    eventually("the third courier's long attempt in flight", || async {
        (rx.in_flight_on("/long") == 1).then_some(())
    })
    .await;
    send(&cs[1], &rx.url("/b"), "b", 6).await;
    eventually("the second courier refused by the fleet", || async {
        let busy = metric(&cs[1], "courier_fleet_acquires_total", &[("outcome", "host_busy")]).await;
        (busy > 0.0).then_some(())
    })
    .await;
    assert_eq!(rx.max_in_flight_on("/b"), 0, "nothing got past the fleet cap");
    cs[0].kill();
    // Its leases are never released: they expire (lease_ttl 2 s), and their three slots go
    // to the second courier; the third's lease, renewed, keeps the fourth.
    let seen = rx.wait_for(10).await;
    assert_eq!(seen.iter().filter(|s| s.path == "/b").count(), 6);
    assert_eq!(rx.max_in_flight_on("/b"), 3, "the survivors use the whole cap, no more");
    assert_eq!(rx.in_flight_on("/long"), 1);
    held.open();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_loses_nothing_and_the_fleet_comes_back() {
    let Some(mut redis) = RedisServer::start() else { return };
    // Each courier's first message is held until after the outage: its lease, granted by
    // Redis before the kill, must be written back to the restarted (empty) Redis.
    let held = Gate::new();
    let gate = held.clone();
    let rx = Receiver::scripted(move |_, seen| {
        if seen.body.ends_with(b"-0") {
            Reply::status(200).until(&gate)
        } else {
            Reply::status(200).after(Duration::from_millis(200))
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &redis,
        "outage",
        "[delivery]\nmax_in_flight_per_host = 4\n",
        "expected_replicas = 2\nlease_ttl = \"3s\"",
    );
    let cs = couriers(&dir, 2, &cfg);
    for c in &cs {
        wait_redis_up(c, 1.0).await;
    }
    // Both couriers send to the same host (one path each, to tell them apart there): its
    // cap of 4 is the fleet's, 2 per courier (4 / expected_replicas) while Redis is away.
    let paths = ["/c0", "/c1"];
    for (i, c) in cs.iter().enumerate() {
        send(c, &rx.url(paths[i]), &format!("c{i}"), 40).await;
    }
    eventually("both first messages held in flight", || async {
        paths.iter().all(|p| rx.in_flight_on(p) >= 1).then_some(())
    })
    .await;
    rx.wait_for(10).await;
    // Fleet phase: the two together within the host's cap (each alone may use all 4).
    assert!(
        rx.max_in_flight() <= 4,
        "{} in flight before the outage",
        rx.max_in_flight()
    );
    redis.kill();
    for c in &cs {
        wait_redis_up(c, 0.0).await;
    }
    // Outage phase, once the attempts started under the fleet's limits have ended: each
    // courier within its fallback share of 2 (the held attempt included).
    eventually("attempts of the fleet phase ended", || async {
        paths.iter().all(|p| rx.in_flight_on(p) <= 2).then_some(())
    })
    .await;
    rx.reset_max_in_flight();
    let before = rx.seen().len();
    rx.wait_for(before + 8).await;
    for path in paths {
        let max = rx.max_in_flight_on(path);
        assert!(
            max <= 2,
            "{path}: {max} in flight at once under the fallback share of 2"
        );
    }
    eventually("both couriers delivering under the fallback", || async {
        for c in &cs {
            if metric(c, "courier_fleet_acquires_total", &[("outcome", "fallback")]).await == 0.0 {
                return None;
            }
        }
        Some(())
    })
    .await;
    redis.restart();
    for c in &cs {
        wait_redis_up(c, 1.0).await;
        // The held attempt's lease, which the restarted Redis lost, was written back.
        let restored = metric(c, "courier_fleet_leases_restored_total", &[]).await;
        assert!(restored > 0.0, "leases restored: {restored}");
    }
    // Fleet phase again, once the fallback's attempts (of a courier still reconnecting
    // while the other was back) have ended: the two together within the cap.
    eventually("back within the fleet's cap", || async {
        (rx.in_flight_on("/c0") + rx.in_flight_on("/c1") <= 4).then_some(())
    })
    .await;
    rx.reset_max_in_flight();
    let before = rx.seen().len();
    rx.wait_for(before + 8).await;
    assert!(
        rx.max_in_flight() <= 4,
        "{} in flight after the outage",
        rx.max_in_flight()
    );
    held.open();
    let seen = rx.wait_for(80).await;
    assert_each_once(&seen, 80);
    for c in &cs {
        let log = c.log.all();
        assert_eq!(
            log.matches("fleet: Redis unavailable").count(),
            1,
            "one line per outage:\n{log}"
        );
        assert_eq!(log.matches("fleet: Redis is back").count(), 1, "{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_of_an_endpoint_is_the_fleets() {
    const N: usize = 10;
    let Some(redis) = RedisServer::start() else { return };
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(&redis, "rate", &format!("[delivery]\nrate_per_second = {N}\n"), "");
    let cs = couriers(&dir, 3, &cfg);
    for c in &cs {
        wait_redis_up(c, 1.0).await;
    }
    send_in_turn(&cs, &rx.url("/limited"), 20).await;
    let seen = rx.wait_for(60).await;
    assert_each_once(&seen, 60);
    let mut at: Vec<_> = seen.iter().map(|s| s.at).collect();
    at.sort();
    // Most requests in any one second: the burst (one second's worth, N) plus N more
    // during that second. Each courier alone would allow that much: three send ~6N.
    let busiest = (0..at.len())
        .map(|i| {
            at[i..]
                .iter()
                .take_while(|t| t.duration_since(at[i]) < Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap();
    assert!(busiest <= 2 * N, "{busiest} requests within one second at {N}/s");
    // 60 at N/s after a burst of N take at least 5 s; three couriers alone take 1 s.
    let span = at[at.len() - 1].duration_since(at[0]);
    assert!(span >= Duration::from_secs(3), "60 requests in {span:?} at {N}/s");
    let mut limited = 0.0;
    for c in &cs {
        limited += metric(c, "courier_fleet_acquires_total", &[("outcome", "rate_limited")]).await;
    }
    assert!(limited > 0.0, "the fleet's rate held messages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_from_the_start_accepts_go_on_under_the_fallback_limits() {
    let rx = Receiver::scripted(|_, _| Reply::status(200).after(Duration::from_millis(100))).await;
    let d = tempfile::tempdir().unwrap();
    let nobody = dead_addr();
    let c = Courier::start(
        d.path(),
        &format!(
            "[delivery]\nmax_in_flight_per_host = 6\n[fleet]\nredis_url = \"redis://:s3kr1t@{nobody}\"\nexpected_replicas = 3\n"
        ),
    );
    send(&c, &rx.url("/h"), "m", 20).await;
    let seen = rx.wait_for(20).await;
    assert_each_once(&seen, 20);
    // 6 / 3 replicas: two at a time while Redis is away.
    assert!(
        rx.max_in_flight() <= 2,
        "{} in flight under the fallback",
        rx.max_in_flight()
    );
    assert_eq!(metric(&c, "courier_fleet_redis_up", &[]).await, 0.0);
    let log = c.log.all();
    assert_eq!(log.matches("fleet: Redis unavailable at start").count(), 1, "{log}");
    assert!(!log.contains("s3kr1t"), "the password is never logged:\n{log}");
    // check-config shows where Redis is, never the password.
    let out = std::process::Command::new(bin())
        .args(["check-config", "--config"])
        .arg(&c.config_path)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("fleet: redis redis://{nobody} (password from the URL)")),
        "{text}"
    );
    assert!(!text.contains("s3kr1t"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_password_file_is_read_again_when_courier_reconnects() {
    let Some(redis) = RedisServer::start() else { return };
    let _: String = redis.query(&["CONFIG", "SET", "requirepass", "first-secret"]);
    let rx = Receiver::start().await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("redis-password");
    std::fs::write(&secret, "first-secret\n").unwrap();
    let sub = dir.path().join("c");
    std::fs::create_dir_all(&sub).unwrap();
    let cfg = config(
        &redis,
        "rotate",
        "",
        &format!("password_file = \"{}\"", secret.display()),
    );
    let c = Courier::start(&sub, &cfg);
    wait_redis_up(&c, 1.0).await;
    // The secret rotates: the file first (as a mounted secret is updated), then Redis, which
    // then drops every client so that all must authenticate again.
    std::fs::write(&secret, "second-secret\n").unwrap();
    let _: String = redis.query_as("first-secret", &["CONFIG", "SET", "requirepass", "second-secret"]);
    let _: u64 = redis.query_as("second-secret", &["CLIENT", "KILL", "TYPE", "normal"]);
    let _: u64 = redis.query_as("second-secret", &["CLIENT", "KILL", "TYPE", "pubsub"]);
    // The next acquire finds the connection gone; the reconnect must use the new secret.
    send(&c, &rx.url("/r"), "r", 3).await;
    rx.wait_for(3).await;
    assert!(
        c.log.wait_for("fleet: Redis unavailable", WAIT).is_some(),
        "the cut connection was noticed:\n{}",
        c.log.all()
    );
    wait_redis_up(&c, 1.0).await;
    let log = c.log.all();
    assert_eq!(log.matches("fleet: Redis is back").count(), 1, "{log}");
    assert!(!log.contains("first-secret") && !log.contains("second-secret"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_redis_loses_while_reachable_are_written_back_and_renewal_goes_on() {
    let Some(redis) = RedisServer::start() else { return };
    let held = Gate::new();
    let gate = held.clone();
    // The first courier's attempts (/a…) hang until the end; the second's answer at once.
    let rx = Receiver::scripted(move |_, seen| {
        if seen.path.starts_with("/a") {
            Reply::status(200).until(&gate)
        } else {
            Reply::status(200)
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        &redis,
        "lost",
        "[delivery]\nmax_in_flight_per_host = 2\n",
        "lease_ttl = \"2s\"",
    );
    let cs = couriers(&dir, 2, &cfg);
    for c in &cs {
        wait_redis_up(c, 1.0).await;
    }
    let set = host_set("lost", &rx.addr.to_string());
    send(&cs[0], &rx.url("/a1"), "a1", 1).await;
    eventually("the first attempt in flight", || async {
        (rx.in_flight_on("/a1") == 1).then_some(())
    })
    .await;
    // Redis loses the lease while it stays reachable (a flush, an eviction, a failover to a
    // replica that had not seen it): no call fails, the next renewal finds it missing.
    let _: String = redis.query(&["FLUSHALL"]);
    eventually("the lost lease written back", || async {
        let n: u64 = redis.query(&["ZCARD", &set]);
        (n == 1).then_some(())
    })
    .await;
    assert!(metric(&cs[0], "courier_fleet_leases_restored_total", &[]).await >= 1.0);
    assert!(
        cs[0].log.all().contains("fleet: Redis no longer had leases"),
        "{}",
        cs[0].log.all()
    );
    // A second attempt's lease, taken after the loss: it must be renewed too.
    send(&cs[0], &rx.url("/a2"), "a2", 1).await;
    eventually("the second attempt in flight", || async {
        (rx.in_flight_on("/a2") == 1).then_some(())
    })
    .await;
    send(&cs[1], &rx.url("/b"), "b", 3).await;
    // The second courier is refused and looks again when the first lease in its way would
    // expire (at most a TTL, 2 s, ahead). Two TTLs later, refused again meanwhile, both of
    // the first courier's leases were renewed: had either not been, it would have expired
    // and the second courier got its slot at its next look.
    let busy = || async { metric(&cs[1], "courier_fleet_acquires_total", &[("outcome", "host_busy")]).await };
    eventually("the second courier refused", || async {
        (busy().await > 0.0).then_some(())
    })
    .await;
    let first = busy().await;
    let since = std::time::Instant::now();
    eventually("refused again for two lease TTLs, or let through", || async {
        let refused = since.elapsed() >= Duration::from_secs(4) && busy().await >= first + 2.0;
        (refused || rx.max_in_flight_on("/b") > 0).then_some(())
    })
    .await;
    assert_eq!(
        rx.max_in_flight_on("/b"),
        0,
        "the first courier's two leases expired under running attempts: 3 in flight over a cap of 2"
    );
    held.open();
    rx.wait_for(5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rediss_connection_trusts_the_ca_of_tls_ca_file() {
    let pki = crate::support_tls::Pki::new("redis");
    let Some(redis) = RedisServer::start_tls(&pki) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let fleet = format!("[fleet]\nredis_url = \"{}\"\nkey_prefix = \"tls\"\n", redis.tls_url());
    // Without the private CA the handshake fails: the public roots do not know it.
    let untrusted = dir.path().join("untrusted");
    std::fs::create_dir_all(&untrusted).unwrap();
    let c = Courier::start(&untrusted, &fleet);
    assert!(
        c.log.wait_for("fleet: Redis unavailable", WAIT).is_some(),
        "{}",
        c.log.all()
    );
    assert_eq!(metric(&c, "courier_fleet_redis_up", &[]).await, 0.0);
    drop(c);
    let trusted = dir.path().join("trusted");
    std::fs::create_dir_all(&trusted).unwrap();
    let ca = crate::support_tls::toml_path(&pki.ca_file);
    let c = Courier::start(&trusted, &format!("[tls]\nca_file = {ca}\n{fleet}"));
    wait_redis_up(&c, 1.0).await;
}
