//! Per-route and per-endpoint policies in the running pipeline: a route's schedule sets the
//! exact attempt times and the attempts a message gets, each attempt records the policy
//! revision it ran under, an endpoint's status rules decide and count, its timeout reaches
//! the transport, and its `max_in_flight` holds messages pending until an answer frees a
//! permit (woken, not polled).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;

use super::tests::{status, Harness, Scripted, T0, WAIT};
use crate::clock::{Clock, ManualClock};
use crate::config::Config;
use crate::envelope::Envelope;
use crate::model::{DeadReason, State};
use crate::outbound::transport::{OutboundRequest, SendFuture, Transport};
use crate::store::SigningChoice;

fn config(toml: &str) -> Config {
    let c = Config::from_toml_str(toml, "test.toml").unwrap();
    c.validate().unwrap();
    c
}

/// Accepts a message as ingress does: the give-up limits resolved from its route and
/// endpoint now.
async fn accept(h: &Harness, url: &str, route: Option<&str>) -> String {
    let target = url::Url::parse(url).unwrap();
    let endpoint = crate::target::default_endpoint_key(&target);
    let settings = h.d.context().settings();
    let policy = settings.policies.resolve(route, &endpoint);
    let env = Envelope {
        max_attempts: policy.max_attempts,
        give_up_after: policy.give_up_after,
        target,
        endpoint: Some(endpoint),
        route: route.map(str::to_string),
        event_id: None,
        method: "POST".into(),
        headers: vec![],
        body: b"{}".to_vec(),
        scheme: None,
        signing: SigningChoice::Default,
    };
    let msg = env.into_message(h.clock.now_ms(), &mut rand::rng(), h.d.context().store().ids());
    let id = msg.record.id.clone();
    h.d.accept(msg, ()).await.unwrap();
    id
}

#[tokio::test]
async fn a_route_schedule_sets_the_attempt_times_and_count_and_attempts_record_their_revision() {
    let cfg = config(
        r#"
[[route]]
name = "billing"
url = "https://r.example/billing"
schedule = ["5s", "1m"]
jitter = "none"
"#,
    );
    let clock = ManualClock::new(T0);
    let t = Scripted::new(clock.clone(), vec![status(503), status(500), status(502)]);
    let h = Harness::start(cfg, t.clone(), clock.clone());
    let id = accept(&h, "https://r.example/billing", Some("billing")).await;
    assert_eq!(h.record(&id).max_attempts, 3, "two delays: three attempts");
    assert_eq!(h.record(&id).route.as_deref(), Some("billing"));

    let mut at = T0;
    for (n, gap) in [(1u32, 5_000u64), (2, 60_000)] {
        assert_eq!(t.wait_calls(n as usize).await[n as usize - 1].0, at, "attempt {n}");
        let rec = h
            .wait_record(&id, "the retry", |r| r.attempts == n && r.state == State::Pending)
            .await;
        assert_eq!(
            rec.next_attempt_at_ms,
            at + gap,
            "the schedule's delay after attempt {n}"
        );
        clock.set(at + gap - 1);
        h.settle().await;
        assert_eq!(t.calls().len(), n as usize, "attempt {} early", n + 1);
        at += gap;
        clock.set(at);
    }
    assert_eq!(t.wait_calls(3).await[2].0, at);
    let rec = h.wait_record(&id, "dead", |r| r.state == State::Dead).await;
    assert_eq!((rec.attempts, rec.dead_reason), (3, Some(DeadReason::MaxAttempts)));

    let revision =
        h.d.context()
            .settings()
            .policies
            .resolve(Some("billing"), "https://r.example/billing")
            .revision();
    let history = h.d.context().store().history_of(&id).unwrap();
    assert_eq!(history.len(), 3);
    assert!(
        history.iter().all(|a| a.policy_revision == Some(revision)),
        "{history:?}"
    );
    assert_ne!(
        revision,
        h.d.context().settings().policies.resolve(None, "x").revision()
    );
    // The same target outside the route gets the global policy.
    assert_eq!(t.calls()[0].1.timeout, Duration::from_secs(30));
}

#[tokio::test]
async fn an_endpoint_s_status_rules_decide_and_count_and_its_timeout_reaches_the_transport() {
    let cfg = config(
        r#"
[[endpoint]]
key = "https://r.example/conflict"
request_timeout = "3s"
statuses = { success = [409], permanent = [404] }
"#,
    );
    let clock = ManualClock::new(T0);
    let t = Scripted::new(clock.clone(), vec![status(409), status(404), status(409)]);
    let h = Harness::start(cfg, t.clone(), clock.clone());
    let ok = accept(&h, "https://r.example/conflict", None).await;
    let rec = h.wait_record(&ok, "delivery", |r| r.state == State::Delivered).await;
    assert_eq!((rec.attempts, rec.last_status), (1, Some(409)));
    let gone = accept(&h, "https://r.example/conflict", None).await;
    let rec = h.wait_record(&gone, "dead", |r| r.state == State::Dead).await;
    assert_eq!((rec.attempts, rec.dead_reason), (1, Some(DeadReason::PermanentStatus)));
    // Elsewhere the seed's table: 409 is retried.
    let other = accept(&h, "https://r.example/other", None).await;
    let rec = h
        .wait_record(&other, "retry", |r| r.attempts == 1 && r.state == State::Pending)
        .await;
    assert_eq!(rec.last_status, Some(409));

    let timeouts: Vec<Duration> = t.calls().iter().map(|(_, r)| r.timeout).collect();
    assert_eq!(
        timeouts,
        [Duration::from_secs(3), Duration::from_secs(3), Duration::from_secs(30)]
    );
    // A worker counts its outcome just after its result is written: wait for the counts.
    let wants = [
        "courier_attempts_total{outcome=\"delivered\"} 1\n",
        "courier_attempts_total{outcome=\"permanent\"} 1\n",
        "courier_attempts_total{outcome=\"retry\"} 1\n",
    ];
    let counted = tokio::time::timeout(WAIT, async {
        loop {
            let metrics = h.d.context().metrics().render(&Default::default());
            if wants.iter().all(|w| metrics.contains(w)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert!(
        counted.is_ok(),
        "{wants:?} in\n{}",
        h.d.context().metrics().render(&Default::default())
    );
}

/// Holds every call until the test releases it, and records how many calls to each path
/// were in flight at once.
struct Held {
    gate: Semaphore,
    calls: Mutex<Vec<String>>,
    now: Mutex<HashMap<String, usize>>,
    max: Mutex<HashMap<String, usize>>,
    called: tokio::sync::Notify,
}

impl Held {
    fn new() -> Arc<Held> {
        Arc::new(Held {
            gate: Semaphore::new(0),
            calls: Mutex::new(Vec::new()),
            now: Mutex::new(HashMap::new()),
            max: Mutex::new(HashMap::new()),
            called: tokio::sync::Notify::new(),
        })
    }

    fn calls_to(&self, path: &str) -> usize {
        self.calls.lock().unwrap().iter().filter(|p| *p == path).count()
    }

    async fn wait_calls(&self, n: usize) {
        tokio::time::timeout(WAIT, async {
            loop {
                let called = self.called.notified();
                if self.calls.lock().unwrap().len() >= n {
                    return;
                }
                called.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("expected {n} calls, saw {:?}", self.calls.lock().unwrap()));
    }
}

impl Transport for Held {
    fn send(&self, req: OutboundRequest) -> SendFuture<'_> {
        Box::pin(async move {
            let path = req.url.path().to_string();
            {
                let mut now = self.now.lock().unwrap();
                let n = now.entry(path.clone()).or_default();
                *n += 1;
                let mut max = self.max.lock().unwrap();
                let m = max.entry(path.clone()).or_default();
                *m = (*m).max(*n);
            }
            self.calls.lock().unwrap().push(path.clone());
            self.called.notify_waiters();
            self.gate.acquire().await.unwrap().forget();
            *self.now.lock().unwrap().get_mut(&path).unwrap() -= 1;
            status(200)
        })
    }
}

#[tokio::test]
async fn an_endpoint_at_its_cap_holds_messages_pending_and_a_freed_permit_wakes_the_next() {
    let cfg = config(
        r#"
[[endpoint]]
key = "https://r.example/cap"
max_in_flight = 1
"#,
    );
    let clock = ManualClock::new(T0);
    let t = Held::new();
    let h = Harness::start(cfg, t.clone(), clock.clone());
    let mut capped = Vec::new();
    for _ in 0..3 {
        capped.push(accept(&h, "https://r.example/cap", None).await);
    }
    let free = accept(&h, "https://r.example/free", None).await;
    // One attempt to the capped endpoint; its host (cap 10) still serves the other one.
    t.wait_calls(2).await;
    h.settle().await;
    assert_eq!((t.calls_to("/cap"), t.calls_to("/free")), (1, 1));
    let states: Vec<State> = capped.iter().map(|id| h.record(id).state).collect();
    assert_eq!(
        states.iter().filter(|s| **s == State::Pending).count(),
        2,
        "held back unclaimed: {states:?}"
    );
    assert!(h.d.context().metrics().endpoint_capped_count() > 0);
    assert_eq!(
        h.d.context().endpoints().cap_usage("https://r.example/cap"),
        Some((1, 1))
    );

    // Waiting costs nothing: no timer, so no pass runs until something happens.
    let passes = h.d.context().metrics().scheduler_passes();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        h.d.context().metrics().scheduler_passes(),
        passes,
        "the scheduler polled"
    );

    // Each answer frees the permit and wakes the scheduler: the clock never moves.
    t.gate.add_permits(10);
    t.wait_calls(4).await;
    for id in capped.iter().chain([&free]) {
        h.wait_record(id, "delivery", |r| r.state == State::Delivered).await;
    }
    assert_eq!(
        t.max.lock().unwrap()["/cap"],
        1,
        "never two at once to the capped endpoint"
    );
    assert_eq!(
        h.d.context().endpoints().cap_usage("https://r.example/cap"),
        Some((0, 1))
    );
    assert!(h.record(&capped[2]).attempts == 1, "waiting counted no attempt");
}
