//! Chaos: concurrent senders, a receiver that cycles through up, slow and failing (503),
//! and courier SIGKILLed at random moments and restarted, again and again. At the end every
//! message courier acknowledged with 202 has arrived at least once, and duplicates stay
//! within what at-least-once allows (attempts in flight at a kill).
//!
//! Sized to run in about a minute. For a longer soak, the test (not courier) reads
//! `COURIER_CHAOS_KILLS` (default 10) and `COURIER_CHAOS_SECS` (default 45, the time the
//! senders and the killer run), e.g. `COURIER_CHAOS_KILLS=100 COURIER_CHAOS_SECS=600`.
//! The random schedule's seed is printed; `COURIER_CHAOS_SEED` replays one.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::{Rng, SeedableRng};

use crate::support::*;

const SENDERS: usize = 4;
/// Most attempts courier runs at once against the one receiver host.
const MAX_IN_FLIGHT: usize = 32;
/// How long each receiver mood lasts.
const PHASE: Duration = Duration::from_millis(1500);

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}")),
        Err(_) => default,
    }
}

/// Posts one message; `Some(status)` if courier answered, `None` if the connection failed
/// (courier was being killed) or no answer came in time.
async fn try_post(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    url: &str,
    event_id: &str,
) -> Option<u16> {
    let req = hyper::Request::post(url)
        .header("webhook-id", event_id)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(format!("{{\"id\":\"{event_id}\"}}"))))
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(5), client.request(req)).await {
        Ok(Ok(resp)) => Some(resp.status().as_u16()),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_messages_survive_repeated_sigkills() {
    let kills = env_number("COURIER_CHAOS_KILLS", 10) as usize;
    let secs = env_number("COURIER_CHAOS_SECS", 45);
    let seed = env_number(
        "COURIER_CHAOS_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
    );
    eprintln!("chaos: seed {seed}, {kills} kills over {secs}s (COURIER_CHAOS_SEED={seed} replays the schedule)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    // The receiver: counts the 2xx answers it gave per event id. Its mood follows the clock
    // until `calm` is set, then it only says 200.
    let delivered: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let calm = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let rx = {
        let delivered = delivered.clone();
        let calm = calm.clone();
        Receiver::scripted(move |_, seen| {
            let phase = (started.elapsed().as_millis() / PHASE.as_millis()) % 3;
            let reply = match (calm.load(Ordering::SeqCst), phase) {
                (true, _) | (false, 0) => Reply::status(200),
                (false, 1) => Reply::status(200).after(Duration::from_millis(200)),
                _ => return Reply::status(503).header("retry-after", "0"),
            };
            if let Some(id) = seen.header("webhook-id") {
                *delivered.lock().unwrap().entry(id).or_default() += 1;
            }
            reply
        })
        .await
    };

    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[retry]\nbase_delay = \"50ms\"\nmax_delay = \"500ms\"\njitter = \"full\"\nmax_attempts = 1000\n\
         give_up_after = \"1h\"\n[delivery]\nmax_in_flight_per_host = {MAX_IN_FLIGHT}\nrate_per_second = 10000\n"
    );
    let mut courier = Courier::start(dir.path(), &config);
    let ingress = Arc::new(Mutex::new(courier.ingress));

    // Senders: each posts its own numbered event ids and keeps the ones answered 202.
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut senders = Vec::new();
    for s in 0..SENDERS {
        let (stop, acked, ingress, target) = (stop.clone(), acked.clone(), ingress.clone(), rx.url(&format!("/s{s}")));
        senders.push(tokio::spawn(async move {
            let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
            let mut other = HashMap::<Option<u16>, usize>::new();
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let addr: SocketAddr = *ingress.lock().unwrap();
                let id = format!("chaos-{s}-{n}");
                n += 1;
                match try_post(&client, &format!("http://{addr}/{target}"), &id).await {
                    Some(202) => acked.lock().unwrap().push(id),
                    status => *other.entry(status).or_default() += 1,
                }
                // Load shaping, not synchronisation: about 50 messages a second per sender.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other
        }));
    }

    // The killer: SIGKILL at random moments, restart at once on the same data dir.
    let mean = Duration::from_secs(secs) / kills.max(1) as u32;
    for _ in 0..kills {
        let wait = mean.mul_f64(rng.random_range(0.2..1.8));
        tokio::time::sleep(wait).await;
        tokio::task::block_in_place(|| courier.restart());
        *ingress.lock().unwrap() = courier.ingress;
    }
    stop.store(true, Ordering::SeqCst);
    let mut refused = HashMap::<Option<u16>, usize>::new();
    for s in senders {
        for (k, v) in s.await.unwrap() {
            *refused.entry(k).or_default() += v;
        }
    }

    // Drain: the receiver calms down; every acknowledged id must arrive.
    calm.store(true, Ordering::SeqCst);
    let acked = acked.lock().unwrap().clone();
    let drain_started = Instant::now();
    let deadline = drain_started + Duration::from_secs(120);
    let missing = loop {
        let missing: Vec<String> = {
            let got = delivered.lock().unwrap();
            acked.iter().filter(|id| !got.contains_key(*id)).cloned().collect()
        };
        if missing.is_empty() || Instant::now() > deadline {
            break missing;
        }
        // Wake on the next request the receiver sees (or re-check after a while).
        let seen = rx.seen().len();
        let _ = rx.wait_for_within(seen + 1, Duration::from_secs(1)).await;
    };

    let got = delivered.lock().unwrap().clone();
    let duplicates: usize = acked
        .iter()
        .map(|id| got.get(id).copied().unwrap_or(0).saturating_sub(1))
        .sum();
    let unacked_arrived = got.keys().filter(|id| !acked.contains(id)).count();
    eprintln!(
        "chaos: acked {}, kills {kills}, lost {}, duplicates {duplicates}, arrived without an ack {unacked_arrived}, \
         not acked {refused:?}, receiver requests {}, drained in {:?}",
        acked.len(),
        missing.len(),
        rx.seen().len(),
        drain_started.elapsed()
    );
    // Every failure names the seed, to replay its kill schedule.
    let replay = format!("COURIER_CHAOS_SEED={seed} COURIER_CHAOS_KILLS={kills} COURIER_CHAOS_SECS={secs}");
    assert!(
        acked.len() >= 100,
        "the senders got too few acks ({}) to mean anything (replay: {replay})",
        acked.len()
    );
    assert!(
        missing.is_empty(),
        "{} acknowledged messages never arrived, e.g. {:?} (replay: {replay}); courier log:\n{}",
        missing.len(),
        &missing[..missing.len().min(5)],
        courier.log.all()
    );
    // At-least-once: a duplicate is an attempt that was in flight at a kill.
    let bound = kills * MAX_IN_FLIGHT;
    assert!(
        duplicates <= bound,
        "{duplicates} duplicates for {kills} kills (bound {bound}; replay: {replay})"
    );
}
