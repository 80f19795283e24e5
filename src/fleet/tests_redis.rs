//! The fleet's scripts and its release queue against a real `redis-server` (Debian's, as
//! the black-box tests use: `COURIER_TEST_REDIS_SERVER`, else `redis-server` on PATH), on a
//! Unix socket in a temp dir, so parallel tests never share a port. A missing server fails
//! the test (unless `COURIER_TEST_ALLOW_SKIP=1`, never with `COURIER_TEST_REQUIRE_VERIFIERS=1`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

/// A `redis-server` on a Unix socket, killed on drop.
struct Server {
    child: Child,
    _dir: tempfile::TempDir,
    sock: PathBuf,
}

impl Server {
    /// `None` only when the server is missing and skipping is allowed.
    fn start() -> Option<Server> {
        let env = std::env::var_os("COURIER_TEST_REDIS_SERVER").map(PathBuf::from);
        let on_path = || {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .map(|d| d.join("redis-server"))
                .find(|p| p.is_file())
        };
        let Some(bin) = env.or_else(on_path).filter(|p| p.is_file()) else {
            let allowed = std::env::var("COURIER_TEST_ALLOW_SKIP").is_ok_and(|v| v == "1")
                && !std::env::var("COURIER_TEST_REQUIRE_VERIFIERS").is_ok_and(|v| v == "1");
            assert!(
                allowed,
                "no redis-server (set COURIER_TEST_REDIS_SERVER, or run scripts/test.sh)"
            );
            eprintln!("skipped: no redis-server (COURIER_TEST_ALLOW_SKIP=1)");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("redis.sock");
        let child = Command::new(bin)
            .args(["--port", "0", "--save", "", "--appendonly", "no", "--unixsocket"])
            .arg(&sock)
            .arg("--dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let server = Server { child, _dir: dir, sock };
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.conn().is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(server)
    }

    fn url(&self) -> String {
        format!("redis+unix://{}", self.sock.display())
    }

    fn conn(&self) -> redis::RedisResult<redis::Connection> {
        let mut conn = redis::Client::open(self.url())?.get_connection()?;
        redis::cmd("PING").query::<String>(&mut conn)?;
        Ok(conn)
    }

    fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.conn().unwrap()).unwrap()
    }

    /// Calls of `command` so far (`INFO commandstats`).
    fn calls(&self, command: &str) -> u64 {
        let info: String = self.query(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    }

    /// Leases in `host`'s set under `prefix`.
    fn held(&self, prefix: &str, host: &str) -> u64 {
        self.query(&["ZCARD", &format!("{prefix}:host:{}", lease::key_id(host))])
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One courier's fleet on its own runtime (the fleet's tasks run there).
struct Courier {
    fleet: Fleet,
    _rt: tokio::runtime::Runtime,
}

impl Courier {
    /// A fleet on `url` under `prefix`, once Redis is up (for a reachable `url`).
    fn start(url: &str, prefix: &str, lease_ttl: Duration, expect_up: bool) -> Courier {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let cfg = FleetConfig {
            redis_url: Some(url::Url::parse(url).unwrap()),
            key_prefix: prefix.into(),
            lease_ttl,
            expected_replicas: 3,
            ..FleetConfig::default()
        };
        let parts = FleetParts {
            runtime: rt.handle().clone(),
            wake: Arc::new(crate::sys::wake::Wake::default()),
            ca_pem: None,
            metrics: Arc::new(Metrics::default()),
        };
        let fleet = Fleet::start(&cfg, parts).unwrap().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while expect_up && !fleet.is_up() {
            assert!(Instant::now() < deadline, "the fleet never connected");
            std::thread::sleep(Duration::from_millis(5));
        }
        Courier { fleet, _rt: rt }
    }
}

fn req<'a>(host: &'a str, endpoint: &'a str, host_cap: u32, endpoint_cap: Option<u32>, rate: u32) -> LeaseRequest<'a> {
    LeaseRequest {
        host,
        endpoint,
        host_cap,
        endpoint_cap,
        rate,
    }
}

/// Each answer as a letter: `g` granted, `h` host busy, `e` endpoint busy, `r` rate
/// limited, `f` fallback; and the leases granted.
fn answers(acquired: Vec<Acquired>) -> (String, Vec<Lease>) {
    let mut leases = Vec::new();
    let mut text = String::new();
    for a in acquired {
        text.push(match a {
            Acquired::Granted(lease) => {
                leases.push(lease);
                'g'
            }
            Acquired::HostBusy { retry_ms }
            | Acquired::EndpointBusy { retry_ms }
            | Acquired::RateLimited { retry_ms }
                if retry_ms == 0 =>
            {
                panic!("a refusal without a time")
            }
            Acquired::HostBusy { .. } => 'h',
            Acquired::EndpointBusy { .. } => 'e',
            Acquired::RateLimited { .. } => 'r',
            Acquired::Fallback { .. } => 'f',
        });
    }
    (text, leases)
}

/// Waits until `check` holds (for the releaser, which runs on its own task).
fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

const TTL: Duration = Duration::from_secs(10);

#[test]
fn a_batch_counts_each_grant_before_checking_the_next_request() {
    let Some(redis) = Server::start() else { return };
    let c = Courier::start(&redis.url(), "cap", TTL, true);
    let reqs = vec![req("a.example:443", "https://a.example/1", 3, None, 0); 5];
    let (got, leases) = answers(c.fleet.acquire_many(&reqs));
    assert_eq!(got, "ggghh", "five requests for a host with a cap of 3");
    assert_eq!(redis.held("cap", "a.example:443"), 3);
    // Another courier's batch counts the leases held already.
    let other = Courier::start(&redis.url(), "cap", TTL, true);
    let (got, _) = answers(other.fleet.acquire_many(&reqs[..2]));
    assert_eq!(got, "hh");
    drop(leases);
    eventually("the three released", || redis.held("cap", "a.example:443") == 0);
    let (got, _more) = answers(other.fleet.acquire_many(&reqs));
    assert_eq!(got, "ggghh", "the released slots are free again, and no more");
}

#[test]
fn mixed_hosts_and_endpoints_in_one_batch_each_keep_their_own_cap() {
    let Some(redis) = Server::start() else { return };
    let c = Courier::start(&redis.url(), "mixed", TTL, true);
    let (a, b, h) = ("a.example:443", "b.example:443", "h.example:443");
    let reqs = [
        req(a, "https://a.example/", 2, None, 0),
        req(b, "https://b.example/", 1, None, 0),
        req(a, "https://a.example/", 2, None, 0),
        req(b, "https://b.example/", 1, None, 0),
        req(a, "https://a.example/", 2, None, 0),
        // One host, two endpoints, the first capped at 1: its second request is refused
        // by the endpoint, and the uncapped endpoint still goes.
        req(h, "https://h.example/capped", 5, Some(1), 0),
        req(h, "https://h.example/capped", 5, Some(1), 0),
        req(h, "https://h.example/free", 5, None, 0),
    ];
    let (got, _leases) = answers(c.fleet.acquire_many(&reqs));
    assert_eq!(got, "ggghhgeg");
    assert_eq!(
        (redis.held("mixed", a), redis.held("mixed", b), redis.held("mixed", h)),
        (2, 1, 2)
    );
    let endpoint = format!("mixed:endpoint:{}", lease::key_id("https://h.example/capped"));
    assert_eq!(redis.query::<u64>(&["ZCARD", &endpoint]), 1);
    // Refusals by a cap left wait markers (a release then publishes); none for `a`'s
    // endpoint, which has no cap.
    let marker = |kind: &str, key: &str| format!("mixed:{kind}-wait:{}", lease::key_id(key));
    assert_eq!(
        redis.query::<u64>(&["EXISTS", &marker("host", a), &marker("host", b)]),
        2
    );
    assert_eq!(
        redis.query::<u64>(&["EXISTS", &marker("endpoint", "https://h.example/capped")]),
        1
    );
    assert_eq!(redis.query::<u64>(&["EXISTS", &marker("host", h)]), 0);
}

#[test]
fn the_rate_counts_each_grant_of_a_batch_and_a_refusal_takes_nothing() {
    let Some(redis) = Server::start() else { return };
    let c = Courier::start(&redis.url(), "rate", TTL, true);
    let (host, ep) = ("r.example:443", "https://r.example/");
    // A burst of one second's worth (3 at 3/s), then the rate says wait (about 1/3 s).
    let reqs = vec![req(host, ep, 100, None, 3); 5];
    let acquired = c.fleet.acquire_many(&reqs);
    let waits: Vec<u64> = acquired
        .iter()
        .filter_map(|a| match a {
            Acquired::RateLimited { retry_ms } => Some(*retry_ms),
            _ => None,
        })
        .collect();
    let (got, _leases) = answers(acquired);
    assert_eq!(got, "gggrr");
    assert!(waits.iter().all(|w| (1..=334).contains(w)), "{waits:?}");
    // Refused by the rate: no lease taken for them.
    assert_eq!(redis.held("rate", host), 3);
    // The TAT was written once, and expires (an idle endpoint leaves nothing).
    let key = format!("rate:rate:{}", lease::key_id(ep));
    let ttl: i64 = redis.query(&["PTTL", &key]);
    assert!((900..=1_002).contains(&ttl), "{ttl}");
    let (got, _) = answers(c.fleet.acquire_many(&[req(host, ep, 100, None, 3)]));
    assert_eq!(got, "r", "still within the same second");
}

#[test]
fn with_redis_unreachable_every_request_of_a_batch_falls_back() {
    let dir = tempfile::tempdir().unwrap();
    let nobody = format!("redis+unix://{}", dir.path().join("none.sock").display());
    let c = Courier::start(&nobody, "down", TTL, false);
    let reqs = vec![req("d.example:443", "https://d.example/", 3, None, 0); 4];
    let acquired = c.fleet.acquire_many(&reqs);
    assert!(
        acquired
            .iter()
            .all(|a| matches!(a, Acquired::Fallback { replicas: 3, .. })),
        "{acquired:?}"
    );
    // Local leases, written to Redis once it is back: held by the registry until dropped.
    assert_eq!(c.fleet.inner.lock_leases().len(), 4);
    drop(acquired);
    assert!(c.fleet.inner.lock_leases().is_empty());
}

#[test]
fn releases_queued_together_go_in_few_calls_and_publish_once_for_a_waiter() {
    let Some(redis) = Server::start() else { return };
    let c = Courier::start(&redis.url(), "rel", TTL, true);
    let host = "q.example:443";
    let reqs = vec![req(host, "https://q.example/", 50, None, 0); 51];
    let (got, leases) = answers(c.fleet.acquire_many(&reqs));
    assert_eq!(got, format!("{}h", "g".repeat(50)), "the last one refused: a waiter");
    let zrem = redis.calls("zrem");
    drop(leases);
    eventually("fifty leases released", || redis.held("rel", host) == 0);
    let calls = redis.calls("zrem") - zrem;
    assert!(calls < 25, "fifty releases in {calls} calls: not batched");
    assert_eq!(
        redis.calls("publish"),
        1,
        "one publish for the batch that found the waiter"
    );
    // Released with nobody waiting: no publish.
    let (_, leases) = answers(c.fleet.acquire_many(&reqs[..10]));
    drop(leases);
    eventually("ten more released", || redis.held("rel", host) == 0);
    assert_eq!(redis.calls("publish"), 1);
}

#[test]
fn a_released_lease_is_renewed_no_more_while_a_held_one_is() {
    let Some(redis) = Server::start() else { return };
    // Leases live 600 ms unless renewed (every 200 ms).
    let c = Courier::start(&redis.url(), "renew", Duration::from_millis(600), true);
    let host = "n.example:443";
    let (got, mut leases) = answers(c.fleet.acquire_many(&[req(host, "https://n.example/", 5, None, 0); 2]));
    assert_eq!(got, "gg");
    let kept = leases.pop().unwrap();
    let released = leases.pop().unwrap();
    let (kept_member, released_member) = (c.fleet.inner.member(kept.id), c.fleet.inner.member(released.id));
    drop(released);
    std::thread::sleep(Duration::from_millis(1_500));
    let set = format!("renew:host:{}", lease::key_id(host));
    let score = |m: &str| redis.query::<Option<f64>>(&["ZSCORE", &set, m]);
    assert!(score(&kept_member).is_some(), "the held lease was renewed past its TTL");
    assert!(score(&released_member).is_none(), "the released lease stays released");
    drop(kept);
    eventually("the held one released", || redis.held("renew", host) == 0);
}

/// Several couriers' passes (random batches over a few hosts and endpoints) and their
/// queued releases race on one Redis; whatever the interleaving, no more leases are ever
/// held for a host (or a capped endpoint) than its cap. A lease counts as held here from
/// its grant to just before it is dropped, a span inside the one Redis counts it for (a
/// queued release removes it later still), so an over-grant anywhere shows here.
#[test]
fn racing_batches_and_releases_never_hold_more_than_the_caps() {
    let Some(redis) = Server::start() else { return };
    let seed: u64 = std::env::var("COURIER_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    eprintln!("seed {seed} (COURIER_TEST_SEED)");
    let hosts = [("a.example:443", 3), ("b.example:443", 1), ("c.example:443", 5)];
    let endpoints = [
        ("https://a.example/1", Some(2)),
        ("https://a.example/2", None),
        ("https://c.example/", Some(1)),
    ];
    let held: Arc<HashMap<&str, AtomicU32>> = Arc::new(
        hosts
            .iter()
            .map(|(h, _)| *h)
            .chain(endpoints.iter().map(|(e, _)| *e))
            .map(|k| (k, AtomicU32::new(0)))
            .collect(),
    );
    let granted = Arc::new(AtomicU32::new(0));
    let threads: Vec<_> = (0..4u64)
        .map(|k| {
            let (url, held, granted) = (redis.url(), held.clone(), granted.clone());
            std::thread::spawn(move || {
                let c = Courier::start(&url, "race", TTL, true);
                let mut rng = StdRng::seed_from_u64(seed * 31 + k);
                let mut mine: Vec<(usize, usize, Lease)> = Vec::new();
                for _ in 0..300 {
                    let picks: Vec<(usize, usize)> = (0..rng.random_range(1..=8))
                        .map(|_| {
                            let e = rng.random_range(0..endpoints.len());
                            (if e == 2 { 2 } else { rng.random_range(0..2) }, e)
                        })
                        .collect();
                    let reqs: Vec<_> = picks
                        .iter()
                        .map(|&(h, e)| req(hosts[h].0, endpoints[e].0, hosts[h].1, endpoints[e].1, 0))
                        .collect();
                    for ((h, e), a) in picks.into_iter().zip(c.fleet.acquire_many(&reqs)) {
                        let Acquired::Granted(lease) = a else { continue };
                        granted.fetch_add(1, Ordering::Relaxed);
                        let n = held[hosts[h].0].fetch_add(1, Ordering::SeqCst) + 1;
                        assert!(
                            n <= hosts[h].1,
                            "{n} leases held for {} (cap {})",
                            hosts[h].0,
                            hosts[h].1
                        );
                        if let Some(cap) = endpoints[e].1 {
                            let n = held[endpoints[e].0].fetch_add(1, Ordering::SeqCst) + 1;
                            assert!(n <= cap, "{n} leases held for {} (cap {cap})", endpoints[e].0);
                        }
                        mine.push((h, e, lease));
                    }
                    // Some attempts end: uncounted here first, then released.
                    while !mine.is_empty() && rng.random_bool(0.6) {
                        let (h, e, lease) = mine.swap_remove(rng.random_range(0..mine.len()));
                        held[hosts[h].0].fetch_sub(1, Ordering::SeqCst);
                        if endpoints[e].1.is_some() {
                            held[endpoints[e].0].fetch_sub(1, Ordering::SeqCst);
                        }
                        drop(lease);
                    }
                    if rng.random_bool(0.2) {
                        std::thread::sleep(Duration::from_micros(rng.random_range(0..500)));
                    }
                }
                for (h, e, lease) in mine {
                    held[hosts[h].0].fetch_sub(1, Ordering::SeqCst);
                    if endpoints[e].1.is_some() {
                        held[endpoints[e].0].fetch_sub(1, Ordering::SeqCst);
                    }
                    drop(lease);
                }
                // Kept (its runtime running) until its releases are in.
                c
            })
        })
        .collect();
    let _couriers: Vec<Courier> = threads
        .into_iter()
        .map(|t| t.join().expect("a courier broke a cap"))
        .collect();
    let granted = granted.load(Ordering::Relaxed);
    assert!(granted > 300, "the couriers got leases: {granted}");
    eventually("every lease released", || {
        hosts.iter().all(|(h, _)| redis.held("race", h) == 0)
    });
}
