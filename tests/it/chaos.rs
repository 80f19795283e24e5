//! Chaos (payloads sealed at rest): concurrent senders, a receiver that cycles through up, slow and failing (503),
//! and courier SIGKILLed at random moments and restarted, again and again. At the end every
//! message courier acknowledged with 202 has arrived at least once, and duplicates stay
//! within what at-least-once allows (attempts in flight at a kill).
//!
//! Sized to run in about a minute. For a longer soak, the test (not courier) reads
//! `COURIER_CHAOS_KILLS` (default 10) and `COURIER_CHAOS_SECS` (default 45, the time the
//! senders and the killer run), e.g. `COURIER_CHAOS_KILLS=100 COURIER_CHAOS_SECS=600`.
//! The random schedule's seed is printed; `COURIER_CHAOS_SEED` replays one.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use crate::support::load::{config, env_number, sealed, seed, Load, Tally, MAX_IN_FLIGHT};
use crate::support::*;

/// How long each receiver mood lasts.
const PHASE: Duration = Duration::from_millis(1500);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_messages_survive_repeated_sigkills() {
    let kills = env_number("COURIER_CHAOS_KILLS", 10) as usize;
    let secs = env_number("COURIER_CHAOS_SECS", 45);
    let seed = seed("COURIER_CHAOS_SEED");
    eprintln!("chaos: seed {seed}, {kills} kills over {secs}s (COURIER_CHAOS_SEED={seed} replays the schedule)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    // The receiver's mood follows the clock: up, slow, failing, until it calms down.
    let started = Instant::now();
    let tally = Tally::start(move |_| match (started.elapsed().as_millis() / PHASE.as_millis()) % 3 {
        0 => Reply::status(200),
        1 => Reply::status(200).after(Duration::from_millis(200)),
        _ => Reply::status(503).header("retry-after", "0"),
    })
    .await;

    let dir = tempfile::tempdir().unwrap();
    let mut courier = Courier::start(dir.path(), &sealed(dir.path(), &config("50ms", "500ms")));
    // About 50 messages a second per sender.
    let load = Load::start(courier.ingress, &tally.rx, "chaos", (20, 20));

    // The killer: SIGKILL at random moments, restart at once on the same data dir.
    let mean = Duration::from_secs(secs) / kills.max(1) as u32;
    for _ in 0..kills {
        let wait = mean.mul_f64(rng.random_range(0.2..1.8));
        tokio::time::sleep(wait).await;
        tokio::task::block_in_place(|| courier.restart());
        load.moved(courier.ingress);
    }
    let (acked, refused) = load.stop().await;

    // Drain: the receiver calms down; every acknowledged id must arrive.
    let drain_started = Instant::now();
    let missing = tally.calm_down(&acked, Duration::from_secs(120)).await;
    let (duplicates, unacked_arrived) = tally.duplicates(&acked);
    eprintln!(
        "chaos: acked {}, kills {kills}, lost {}, duplicates {duplicates}, arrived without an ack {unacked_arrived}, \
         not acked {refused:?}, receiver requests {}, drained in {:?}",
        acked.len(),
        missing.len(),
        tally.rx.seen().len(),
        drain_started.elapsed()
    );
    // Every failure names the seed, to replay its kill schedule.
    let replay = format!("COURIER_CHAOS_SEED={seed} COURIER_CHAOS_KILLS={kills} COURIER_CHAOS_SECS={secs}");
    assert!(
        acked.len() >= 100,
        "the senders got too few acks ({}) to mean anything (replay: {replay})",
        acked.len()
    );
    let missing: Vec<&String> = missing.iter().map(|(id, _)| id).collect();
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
