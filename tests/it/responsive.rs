//! Bulk operator work never freezes ingress: a replay of 100,000 dead messages runs while
//! apps keep getting their 202s, on a runtime with a single worker thread (where a store
//! call made on the worker would stop everything else until it returned).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::app::{self, Seams};
use courier::config::Config;
use courier::envelope::Envelope;
use courier::model::DeadReason;
use courier::store::{AttemptRecord, FinishedAttempt, ScanStep, SigningChoice, Store, Transition};

use crate::support::*;

const DEAD: usize = 100_000;
/// The longest an accept or a `/readyz` may take while the replay runs: far below the
/// replay's length, far above an answer's time on a loaded machine.
const ANSWER_BOUND: Duration = Duration::from_secs(2);
const DAY_MS: u64 = 86_400_000;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `n` dead messages to `target`, written through the store directly (due tomorrow, so
/// the running scheduler never sees them pending).
async fn fill_dead(store: &Arc<Store>, target: &str, n: usize) {
    let later = now_ms() + DAY_MS;
    let mut rng = rand::rng();
    for chunk in 0..n.div_ceil(1000) {
        let mut batch = Vec::new();
        for i in 0..1000.min(n - chunk * 1000) {
            let env = Envelope {
                target: url::Url::parse(target).unwrap(),
                endpoint: None,
                route: None,
                event_id: Some(format!("evt-{chunk}-{i}")),
                method: "POST".into(),
                headers: vec![],
                body: b"{}".to_vec(),
                scheme: None,
                signing: SigningChoice::Default,
                max_attempts: 3,
                give_up_after: Duration::from_secs(3 * 86_400),
            };
            let mut msg = env.into_message(later, &mut rng, store.ids());
            msg.record.next_attempt_at_ms = later;
            batch.push(store.accepting(msg, false));
        }
        let s = store.clone();
        let settled = tokio::task::spawn_blocking(move || s.accept_batch(batch))
            .await
            .unwrap();
        for one in settled {
            one.answer().unwrap();
        }
    }
    let s = store.clone();
    tokio::task::spawn_blocking(move || loop {
        let mut due = Vec::new();
        s.scan_due(later + 1, 1000, None, |e| {
            due.push(e);
            ScanStep::Continue
        })
        .unwrap();
        if due.is_empty() {
            return;
        }
        let leased = s.lease_many(&due, later);
        let finished: Vec<FinishedAttempt> = leased
            .into_iter()
            .filter_map(|r| r.unwrap())
            .map(|c| FinishedAttempt {
                id: c.record.id,
                attempt: AttemptRecord {
                    at_ms: later,
                    status: Some(410),
                    error: None,
                    duration_ms: 1,
                    policy_revision: None,
                    span_id: None,
                },
                transition: Transition::Dead(DeadReason::PermanentStatus),
                now_ms: later,
            })
            .collect();
        let mut finishes: Vec<_> = finished.iter().map(FinishedAttempt::as_finish).collect();
        for r in s.finish_attempts(&mut finishes) {
            r.unwrap();
        }
    })
    .await
    .unwrap();
}

/// Finding: admin handlers called the store on the async workers; a bulk replay (one
/// locked write per message) froze ingress and `/readyz` for its whole length.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn ingress_keeps_answering_while_100k_dead_messages_are_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::from_toml_str("allow_private_targets = true\n", "test").unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.admin_listen = "127.0.0.1:0".parse().unwrap();
    config.data_dir = dir.path().join("data");
    let running = app::start(config, Seams::default()).await.unwrap();
    let (ingress, admin) = (running.ingress_addr.tcp().expect("a TCP listener"), running.admin_addr);
    let store = running.deliverer.context().store().clone();
    let dead_target = "http://127.0.0.1:9/dead";
    fill_dead(&store, dead_target, DEAD).await;
    assert_eq!(store.counts().unwrap().dead, DEAD as u64);
    // Replayed messages park at once: the test measures the replay, not their delivery.
    let d = running.deliverer.clone();
    tokio::task::spawn_blocking(move || d.context().set_paused(dead_target, true))
        .await
        .unwrap()
        .unwrap();

    let done = Arc::new(AtomicBool::new(false));
    let replay_started = Instant::now();
    let replay = {
        let done = done.clone();
        tokio::spawn(async move {
            let a = post(&format!("http://{admin}/deliveries/retry?state=dead"), &[], "").await;
            done.store(true, Ordering::SeqCst);
            (a, Instant::now())
        })
    };
    // Rounds of one accept and one /readyz, each answer timed, for as long as the replay
    // runs: (when the round ended, the accept's time, /readyz's time).
    let mut rounds: Vec<(Instant, Duration, Duration)> = Vec::new();
    while !done.load(Ordering::SeqCst) {
        let started = Instant::now();
        let a = post(&format!("http://{ingress}/http://127.0.0.1:9/live"), &[], "x").await;
        assert_eq!(a.status, 202, "{}", a.text());
        let accepted = Instant::now();
        let r = get(&format!("http://{admin}/readyz")).await;
        let ended = Instant::now();
        if !done.load(Ordering::SeqCst) {
            assert_eq!(r.status, 200, "/readyz during the replay: {}", r.text());
            rounds.push((ended, accepted - started, ended - accepted));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (a, replay_ended) = replay.await.unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["requeued"], DEAD);
    let replay_took = replay_ended - replay_started;
    // Responsive throughout, not once: several rounds, every answer within ANSWER_BOUND,
    // and no stretch of the replay (from its start, between rounds, to its end) longer
    // than two answers and the pause between rounds without one.
    let slowest = rounds.iter().map(|r| r.1.max(r.2)).max().unwrap_or_default();
    let mut marks: Vec<Instant> = vec![replay_started];
    marks.extend(rounds.iter().map(|r| r.0));
    marks.push(replay_ended);
    let longest_gap = marks
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]))
        .max()
        .unwrap();
    eprintln!(
        "replay of {DEAD} took {replay_took:?}: {} rounds answered meanwhile, slowest answer {slowest:?}, \
         longest stretch without one {longest_gap:?}",
        rounds.len()
    );
    assert!(
        rounds.len() >= 5,
        "ingress and /readyz answered {} times while the replay ran ({replay_took:?})",
        rounds.len()
    );
    assert!(
        slowest < ANSWER_BOUND,
        "an answer during the replay took {slowest:?} (bound {ANSWER_BOUND:?})"
    );
    assert!(
        longest_gap < 2 * ANSWER_BOUND + Duration::from_millis(100),
        "{longest_gap:?} of the {replay_took:?} replay went without an answer"
    );
    running.shutdown();
    running.wait().await;
}
