//! First attempts that wait in memory for their host (`waiting`): seeded runs of accepts
//! through delivery's own accept path (the fast path, the hosts' lines, the queue) and
//! straight into the queue (for the scheduler's passes to line up), with
//! answers held and let go in random amounts, checking that no host ever has more attempts
//! out than its cap and that every accepted message is delivered once, nothing left
//! waiting; and a drain that closes the lines.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tokio::sync::Semaphore;

use super::tests::{config, status, Harness, T0, WAIT};
use crate::clock::{Clock, ManualClock};
use crate::envelope::Envelope;
use crate::model::{Jitter, State};
use crate::outbound::transport::{OutboundRequest, SendFuture, Transport};
use crate::store::SigningChoice;

const HOSTS: [&str; 2] = ["https://a.example/h", "https://b.example/h"];
const CAP: u32 = 2;

/// Holds every request until the test lets answers go (first come, first answered);
/// counts requests out per host and the most ever out at once, and each event's attempts.
struct Held {
    gate: Semaphore,
    out: Mutex<HashMap<String, usize>>,
    most: AtomicUsize,
    seen: Mutex<HashMap<String, usize>>,
}

impl Default for Held {
    fn default() -> Self {
        Held {
            gate: Semaphore::new(0),
            out: Default::default(),
            most: Default::default(),
            seen: Default::default(),
        }
    }
}

impl Transport for Held {
    fn send(&self, req: OutboundRequest) -> SendFuture<'_> {
        Box::pin(async move {
            let host = req.url.host().unwrap().to_string();
            let event = req.headers.iter().find(|(n, _)| n == "webhook-id").unwrap().1.clone();
            *self
                .seen
                .lock()
                .unwrap()
                .entry(String::from_utf8(event).unwrap())
                .or_default() += 1;
            let n = {
                let mut out = self.out.lock().unwrap();
                let n = out.entry(host.clone()).or_default();
                *n += 1;
                *n
            };
            self.most.fetch_max(n, Ordering::SeqCst);
            self.gate.acquire().await.unwrap().forget();
            *self.out.lock().unwrap().get_mut(&host).unwrap() -= 1;
            status(200)
        })
    }
}

/// Accepts a message for `target` through delivery's accept (as ingress does): `event`
/// makes it a duplicate of an earlier one with that id.
async fn accept(h: &Harness, target: &str, event: &str) {
    let env = Envelope {
        target: url::Url::parse(target).unwrap(),
        endpoint: None,
        route: None,
        event_id: Some(event.to_string()),
        method: "POST".into(),
        headers: vec![],
        body: b"{}".to_vec(),
        scheme: None,
        signing: SigningChoice::Default,
        max_attempts: 3,
        give_up_after: Duration::from_secs(3600),
    };
    let store = h.d.context().store();
    let msg = env.into_message(h.clock.now_ms(), &mut rand::rng(), store.ids());
    h.d.accept(msg, ()).await.unwrap();
}

fn harness(held: &Arc<Held>) -> Harness {
    let mut cfg = config(Jitter::None);
    cfg.delivery.max_in_flight_per_host = CAP;
    cfg.delivery.max_in_flight = 64;
    cfg.delivery.rate_per_second = 1_000_000;
    Harness::start(cfg, held.clone(), ManualClock::new(T0))
}

/// Waits until `done` holds, or panics with `what`.
async fn until(what: &str, done: impl Fn() -> bool) {
    tokio::time::timeout(WAIT, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_runs_keep_the_host_caps_and_deliver_every_message_once_with_none_left_waiting() {
    for seed in 0..12u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let held = Arc::new(Held::default());
        let h = harness(&held);
        // (target, event id): a duplicate repeats both. Some messages go straight to the
        // queue instead (as with a busy queue), for passes to put in the hosts' lines.
        let mut events: Vec<(&str, String)> = Vec::new();
        let mut queued = 0;
        for _ in 0..40 {
            // A burst of accepts (some duplicates), then some answers let go.
            let burst: Vec<_> = (0..rng.random_range(1..8))
                .map(|_| {
                    if events.is_empty() || rng.random_bool(0.85) {
                        events.push((HOSTS[rng.random_range(0..2)], format!("evt-{seed}-{}", events.len())));
                        events.last().unwrap().clone()
                    } else {
                        events[rng.random_range(0..events.len())].clone()
                    }
                })
                .collect();
            let accepts = burst.into_iter().map(|(t, e)| {
                let h = &h;
                async move { accept(h, t, &e).await }
            });
            futures_util::future::join_all(accepts).await;
            for _ in 0..rng.random_range(0..3) {
                h.accept_url(HOSTS[rng.random_range(0..2)], vec![]).await;
                queued += 1;
            }
            held.gate.add_permits(rng.random_range(0..6));
            if rng.random_bool(0.3) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        // Every answer goes; everything accepted must then be delivered.
        held.gate.add_permits(10_000);
        let store = h.d.context().store().clone();
        until(&format!("seed {seed}: every message delivered"), || {
            h.d.context().wake();
            let c = store.counts().unwrap();
            c.open == 0 && h.d.in_flight_count() == 0
        })
        .await;
        let c = store.counts().unwrap();
        let all = events.len() + queued;
        assert_eq!(c.delivered as usize, all, "seed {seed}");
        assert!(!h.d.waiting.any(), "seed {seed}: nothing waits for its host");
        assert!(
            held.most.load(Ordering::SeqCst) <= CAP as usize,
            "seed {seed}: a host's cap was passed"
        );
        let seen = held.seen.lock().unwrap();
        assert_eq!(seen.len(), all, "seed {seed}: every event sent");
        assert!(
            seen.values().all(|n| *n == 1),
            "seed {seed}: an event was sent twice: {seen:?}"
        );
    }
}

/// A drain closes the hosts' lines: what waits goes back to the queue (pending, due now,
/// no attempt counted), later accepts do not wait, and the scheduler delivers them all once
/// the held attempts answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_lines_puts_their_waiters_back_in_the_queue() {
    let held = Arc::new(Held::default());
    let h = harness(&held);
    for n in 0..5 {
        accept(&h, HOSTS[0], &format!("evt-{n}")).await;
    }
    until("the host's cap reached", || {
        held.out.lock().unwrap().get("a.example") == Some(&2)
    })
    .await;
    assert!(h.d.waiting.any(), "three wait for the host");
    let store = h.d.context().store().clone();
    let in_flight_on_disk = store.counts().unwrap().open;
    assert_eq!(in_flight_on_disk, 5);
    h.d.close_lines().await;
    assert!(!h.d.waiting.any());
    let filter = crate::store::ListFilter {
        state: Some(State::Pending),
        ..Default::default()
    };
    let pending = store.list(&filter, 100, None).unwrap().items;
    assert_eq!(pending.len(), 3, "the waiters are pending again: {pending:?}");
    assert!(pending
        .iter()
        .all(|r| r.attempts == 0 && r.next_attempt_at_ms <= h.clock.now_ms()));
    // A later message does not wait in a line either.
    accept(&h, HOSTS[0], "evt-5").await;
    assert!(!h.d.waiting.any());
    held.gate.add_permits(100);
    until("every message delivered", || {
        h.d.context().wake();
        store.counts().unwrap().delivered == 6
    })
    .await;
    assert!(held.seen.lock().unwrap().values().all(|n| *n == 1));
}

/// A backlog in the queue held back by its host's cap costs one pass, not one per answer:
/// the pass leases what its host cannot take yet into the host's line, and each answer
/// starts the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_lines_up_a_hosts_backlog_and_answers_start_it_without_passes() {
    let held = Arc::new(Held::default());
    let h = harness(&held);
    backlog_at_cap(&h, &held, 8).await;
    assert!(h.d.waiting.any(), "six wait in the host's line");
    let metrics = h.d.context().metrics().clone();
    let passes = metrics.scheduler_passes();
    answer_one_by_one(&h, &held, 8).await;
    assert!(!h.d.waiting.any());
    assert_eq!(metrics.scheduler_passes(), passes, "the line needed no pass");
}

/// A pass lines up no more than the lines take: one turned away on arrival would be written
/// back to the queue, and leased again by the next pass, which every answer wakes (a slow
/// receiver's backlog kept both cores of a loaded courier busy so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_lines_up_no_more_than_the_lines_take() {
    let held = Arc::new(Held::default());
    let mut cfg = config(Jitter::None);
    cfg.delivery.max_in_flight_per_host = CAP;
    // The lines hold at most this many: far fewer than the backlog a pass may lease.
    cfg.delivery.max_in_flight = 6;
    cfg.delivery.rate_per_second = 1_000_000;
    let h = Harness::start(cfg, held.clone(), ManualClock::new(T0));
    backlog_at_cap(&h, &held, 40).await;
    assert_eq!(h.d.waiting.room(6), 0, "the lines are full");
    answer_one_by_one(&h, &held, 40).await;
    assert!(!h.d.waiting.any());
    assert_eq!(
        held.seen.lock().unwrap().values().sum::<usize>(),
        40,
        "each delivered once"
    );
    assert_eq!(
        h.d.waiting.turned_away.load(Ordering::Relaxed),
        0,
        "none leased for nothing"
    );
}

/// `n` messages for the first host, queued until its cap is reached and the scheduler settled.
async fn backlog_at_cap(h: &Harness, held: &Held, n: usize) {
    for _ in 0..n {
        h.accept_url(HOSTS[0], vec![]).await;
    }
    until("the host's cap reached", || {
        held.out.lock().unwrap().get("a.example") == Some(&2)
    })
    .await;
    h.settle().await;
}

/// Lets `n` answers go, one at a time, each once the result before it is written.
async fn answer_one_by_one(h: &Harness, held: &Held, n: u64) {
    let store = h.d.context().store().clone();
    for done in 1..=n {
        held.gate.add_permits(1);
        until("an answer's result written", || {
            store.counts().unwrap().delivered == done
        })
        .await;
    }
}
