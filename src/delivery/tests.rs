//! Component tests: the scheduler and delivery workers over a temp-dir store, driven by a
//! [`ManualClock`] and a scripted transport. Time moves only when a test moves it, so
//! attempt times are asserted exactly.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use tokio::sync::{watch, Notify, Semaphore};

use super::Deliverer;
use crate::clock::{Clock, ManualClock};
use crate::config::Config;
use crate::envelope::Envelope;
use crate::metrics::Metrics;
use crate::model::{Jitter, State};
use crate::outbound::transport::{InboundResponse, OutboundRequest, SendFuture, Transport, TransportError};
use crate::scheduler::Scheduler;
use crate::store::{MessageRecord, SigningChoice, Store, StoreOptions};

pub(crate) const T0: u64 = 1_700_000_000_000;
pub(super) const WAIT: Duration = Duration::from_secs(10);

pub(super) type Step = Result<InboundResponse, TransportError>;

/// A transport that answers from a script, records each call with the clock's time, and
/// can hold calls until the test releases them.
pub(crate) struct Scripted {
    clock: Arc<ManualClock>,
    script: Mutex<VecDeque<Step>>,
    calls: Mutex<Vec<(u64, OutboundRequest)>>,
    called: Notify,
    gate: Option<Semaphore>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    panic_first: bool,
}

pub(super) fn status(code: u16) -> Step {
    Ok(InboundResponse {
        status: code,
        retry_after: None,
        body: Default::default(),
        receipt: None,
    })
}

impl Scripted {
    pub(crate) fn new(clock: Arc<ManualClock>, script: Vec<Step>) -> Arc<Self> {
        Self::build(clock, script, None, false)
    }

    fn build(clock: Arc<ManualClock>, script: Vec<Step>, gate: Option<Semaphore>, panic_first: bool) -> Arc<Self> {
        Arc::new(Scripted {
            clock,
            script: Mutex::new(script.into()),
            calls: Mutex::new(Vec::new()),
            called: Notify::new(),
            gate,
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            panic_first,
        })
    }

    pub(super) fn calls(&self) -> Vec<(u64, OutboundRequest)> {
        self.calls.lock().unwrap().clone()
    }

    pub(super) async fn wait_calls(&self, n: usize) -> Vec<(u64, OutboundRequest)> {
        tokio::time::timeout(WAIT, async {
            loop {
                let called = self.called.notified();
                let calls = self.calls();
                if calls.len() >= n {
                    return calls;
                }
                called.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("expected {n} calls, saw {}", self.calls().len()))
    }
}

impl Transport for Scripted {
    fn send(&self, req: OutboundRequest) -> SendFuture<'_> {
        Box::pin(async move {
            let n = {
                let mut calls = self.calls.lock().unwrap();
                calls.push((self.clock.now_ms(), req));
                calls.len()
            };
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(now, Ordering::SeqCst);
            self.called.notify_waiters();
            if self.panic_first && n == 1 {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                panic!("scripted transport panics on its first call");
            }
            if let Some(gate) = &self.gate {
                gate.acquire().await.unwrap().forget();
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.script.lock().unwrap().pop_front().unwrap_or_else(|| status(200))
        })
    }
}

pub(crate) struct Harness {
    _dir: tempfile::TempDir,
    pub(super) clock: Arc<ManualClock>,
    pub(crate) d: Arc<Deliverer>,
    stop: watch::Sender<bool>,
}

impl Harness {
    pub(crate) fn start(config: Config, transport: Arc<dyn Transport>, clock: Arc<ManualClock>) -> Harness {
        let h = Self::without_scheduler(config, transport, clock);
        h.start_scheduler();
        h
    }

    /// A harness whose scheduler the test starts itself (to act between a pass's steps).
    pub(super) fn without_scheduler(config: Config, transport: Arc<dyn Transport>, clock: Arc<ManualClock>) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("data"), StoreOptions::default()).unwrap());
        let d = Self::deliverer(store, config, transport, clock.clone());
        let (stop, _) = watch::channel(false);
        Harness {
            _dir: dir,
            clock,
            d,
            stop,
        }
    }

    fn deliverer(
        store: Arc<Store>,
        config: Config,
        transport: Arc<dyn Transport>,
        clock: Arc<ManualClock>,
    ) -> Arc<Deliverer> {
        let ctx = crate::context::Context::new(
            store,
            clock,
            Arc::new(config),
            Arc::new(Metrics::default()),
            Arc::new(crate::sys::wake::Wake::default()),
            tokio::runtime::Handle::current(),
        )
        .unwrap();
        Deliverer::new(ctx, transport, rand::rngs::StdRng::seed_from_u64(42), None)
    }

    pub(super) fn start_scheduler(&self) {
        tokio::spawn(Scheduler::new(self.d.clone()).run(self.stop.subscribe()));
    }

    /// Every entry of the due queue that is due now.
    fn due_now(&self) -> Vec<crate::store::DueEntry> {
        let mut out = Vec::new();
        self.d
            .context()
            .store()
            .scan_due(self.clock.now_ms(), 1000, None, |e| {
                out.push(e);
                crate::store::ScanStep::Continue
            })
            .unwrap();
        out
    }

    async fn accept(&self, path: &str, headers: Vec<(String, Vec<u8>)>) -> String {
        self.accept_url(&format!("https://r.example{path}"), headers).await
    }

    pub(super) async fn accept_url(&self, url: &str, headers: Vec<(String, Vec<u8>)>) -> String {
        let env = Envelope {
            target: url::Url::parse(url).unwrap(),
            endpoint: None,
            route: None,
            event_id: None,
            method: "POST".into(),
            headers,
            body: b"{\"n\":1}".to_vec(),
            scheme: None,
            signing: SigningChoice::Default,
            max_attempts: self.d.context().config().retry.max_attempts,
            give_up_after: self.d.context().config().retry.give_up_after,
        };
        let msg = env.into_message(self.clock.now_ms(), &mut rand::rng(), self.d.context().store().ids());
        let id = msg.record.id.clone();
        self.d.context().store().accept(msg).await.unwrap();
        self.d.context().wake();
        id
    }

    /// Wakes the scheduler and waits until a whole pass has run since and none has run for
    /// 20 ms: what it would do with the current clock and permits has been done.
    pub(super) async fn settle(&self) {
        let before = self.d.context().metrics().scheduler_passes();
        let passes = || self.d.context().metrics().scheduler_passes();
        tokio::time::timeout(WAIT, async {
            // Two passes: the first may have started before the test changed anything.
            while passes() < before + 2 {
                self.d.context().wake();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            // A wake-up sent while a pass ran is kept for the next one: on a loaded machine
            // that pass may come after this returns, and a test counting passes from here
            // would take it for a poll. Settled means no pass for a while.
            loop {
                let seen = passes();
                tokio::time::sleep(Duration::from_millis(20)).await;
                if passes() == seen {
                    break;
                }
            }
        })
        .await
        .expect("the scheduler ran a pass");
    }

    /// The record as readers see it (a leased message is in flight).
    pub(super) fn record(&self, id: &str) -> MessageRecord {
        self.d.context().store().message_shown(id).unwrap().unwrap()
    }

    /// Waits until the message's stored record satisfies `pred` (the worker records
    /// results asynchronously after the transport returns).
    pub(super) async fn wait_record(
        &self,
        id: &str,
        what: &str,
        pred: impl Fn(&MessageRecord) -> bool,
    ) -> MessageRecord {
        tokio::time::timeout(WAIT, async {
            loop {
                let rec = self.record(id);
                if pred(&rec) {
                    return rec;
                }
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{id}: timed out waiting for {what}; record: {:?}", self.record(id)))
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

pub(crate) fn config(jitter: Jitter) -> Config {
    let mut c = Config::default();
    c.retry.base_delay = Duration::from_secs(60);
    c.retry.max_delay = Duration::from_secs(3600);
    c.retry.jitter = jitter;
    // These tests time retries of failing hosts; the breaker has tests of its own.
    c.circuit.failures = 0;
    c.signing.secrets = vec![crate::signing::Secret::new("whsec_c2VjcmV0".into())];
    c
}

fn header(req: &OutboundRequest, name: &str) -> String {
    req.headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .unwrap()
}

#[tokio::test]
async fn attempts_happen_exactly_at_the_backoff_offsets_with_fresh_timestamps() {
    let clock = ManualClock::new(T0);
    let t = Scripted::new(
        clock.clone(),
        vec![
            status(503),
            status(500),
            Err(TransportError::Network("reset".into())),
            status(200),
        ],
    );
    let h = Harness::start(config(Jitter::None), t.clone(), clock.clone());
    let id = h.accept("/hook", vec![]).await;

    // Attempt n+1 is due base_delay * 2^(n-1) after attempt n: 1m, 2m, 4m.
    let mut expected_at = T0;
    for (n, gap) in [(1u32, 60_000u64), (2, 120_000), (3, 240_000)] {
        let calls = t.wait_calls(n as usize).await;
        assert_eq!(calls[n as usize - 1].0, expected_at, "attempt {n} time");
        let rec = h
            .wait_record(&id, "the retry to be scheduled", |r| {
                r.attempts == n && r.state == State::Pending
            })
            .await;
        assert_eq!(rec.next_attempt_at_ms, expected_at + gap, "retry after attempt {n}");
        // One millisecond early: nothing may happen.
        clock.set(expected_at + gap - 1);
        h.settle().await;
        assert_eq!(t.calls().len(), n as usize, "attempt {} fired early", n + 1);
        expected_at += gap;
        clock.set(expected_at);
    }
    let calls = t.wait_calls(4).await;
    assert_eq!(calls[3].0, expected_at);
    let rec = h.wait_record(&id, "delivery", |r| r.state == State::Delivered).await;
    assert_eq!(rec.attempts, 4);

    // Every attempt: same event id, a timestamp read from the clock at that attempt.
    let ids: Vec<String> = calls.iter().map(|(_, r)| header(r, "webhook-id")).collect();
    assert!(ids.iter().all(|i| *i == ids[0]));
    for (at, req) in &calls {
        assert_eq!(header(req, "webhook-timestamp"), (at / 1000).to_string());
        assert!(header(req, "webhook-signature").starts_with("v1,"));
    }
    let stamps: std::collections::HashSet<String> = calls.iter().map(|(_, r)| header(r, "webhook-timestamp")).collect();
    assert_eq!(stamps.len(), 4, "a fresh timestamp (and signature) on every attempt");
}

#[tokio::test]
async fn retry_after_on_429_pushes_the_next_attempt_past_the_backoff() {
    let clock = ManualClock::new(T0);
    let ra = Ok(InboundResponse {
        status: 429,
        retry_after: Some("600".into()),
        body: Default::default(),
        receipt: None,
    });
    let t = Scripted::new(clock.clone(), vec![ra, status(200)]);
    let h = Harness::start(config(Jitter::None), t.clone(), clock.clone());
    let id = h.accept("/ra", vec![]).await;
    t.wait_calls(1).await;
    let rec = h
        .wait_record(&id, "retry", |r| r.attempts == 1 && r.state == State::Pending)
        .await;
    assert_eq!(
        rec.next_attempt_at_ms,
        T0 + 600_000,
        "max(1m backoff, Retry-After 600s)"
    );
    clock.set(T0 + 600_000);
    assert_eq!(t.wait_calls(2).await[1].0, T0 + 600_000);
}

#[tokio::test]
async fn equal_jitter_stays_within_half_to_full_backoff() {
    // Many samples: one sample cannot tell equal jitter from none (60s is in range too).
    const N: usize = 24;
    let clock = ManualClock::new(T0);
    let t = Scripted::new(clock.clone(), (0..N).map(|_| status(503)).collect());
    let h = Harness::start(config(Jitter::Equal), t.clone(), clock.clone());
    let mut ids = Vec::new();
    for n in 0..N {
        ids.push(h.accept(&format!("/j{n}"), vec![]).await);
    }
    t.wait_calls(N).await;
    let mut waits = Vec::new();
    for id in &ids {
        let rec = h
            .wait_record(id, "retry", |r| r.attempts == 1 && r.state == State::Pending)
            .await;
        waits.push(rec.next_attempt_at_ms - T0);
    }
    for wait in &waits {
        assert!(
            (30_000..=60_000).contains(wait),
            "equal jitter of a 1m base gave {wait}ms: {waits:?}"
        );
    }
    // Spread over the range, not stuck at one end (24 uniform draws: each half is hit).
    assert!(
        waits.iter().any(|w| *w < 45_000) && waits.iter().any(|w| *w > 45_000),
        "not jittered over [30s, 60s]: {waits:?}"
    );
}

/// Two attempts run; the other three wait (in the queue, or leased into the host's line,
/// which the admin API shows `in_flight` too), and none is sent past the cap.
#[tokio::test]
async fn the_host_permit_is_taken_before_a_message_is_attempted() {
    let clock = ManualClock::new(T0);
    let t = Scripted::build(clock.clone(), vec![], Some(Semaphore::new(0)), false);
    let mut cfg = config(Jitter::None);
    cfg.delivery.max_in_flight_per_host = 2;
    let h = Harness::start(cfg, t.clone(), clock.clone());
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(h.accept(&format!("/p{i}"), vec![]).await);
    }
    t.wait_calls(2).await;
    // With both permits held, a pass may start nothing more.
    h.settle().await;
    let states: Vec<State> = ids.iter().map(|id| h.record(id).state).collect();
    assert!(
        states.iter().all(|s| matches!(s, State::InFlight | State::Pending)),
        "{states:?}"
    );
    assert_eq!(t.calls().len(), 2);
    t.gate.as_ref().unwrap().add_permits(5);
    t.wait_calls(5).await;
    for id in &ids {
        h.wait_record(id, "delivery", |r| r.state == State::Delivered).await;
    }
    assert_eq!(t.max_in_flight.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn rate_limited_messages_wait_for_a_token_without_counting_an_attempt() {
    let clock = ManualClock::new(T0);
    let t = Scripted::new(clock.clone(), vec![]);
    let mut cfg = config(Jitter::None);
    cfg.delivery.rate_per_second = 1;
    let h = Harness::start(cfg, t.clone(), clock.clone());
    let a = h.accept("/same", vec![]).await;
    t.wait_calls(1).await;
    let b = h.accept("/same", vec![]).await;
    h.settle().await;
    assert_eq!(t.calls().len(), 1, "the bucket of 1/s is empty");
    let rec = h.record(&b);
    assert_eq!((rec.state, rec.attempts), (State::Pending, 0));
    clock.set(T0 + 1_000);
    assert_eq!(t.wait_calls(2).await[1].0, T0 + 1_000, "sent at the next free slot");
    h.wait_record(&a, "delivery", |r| r.state == State::Delivered).await;
    let rec = h.wait_record(&b, "delivery", |r| r.state == State::Delivered).await;
    assert_eq!(rec.attempts, 1);
}

#[tokio::test]
async fn a_panicking_worker_is_courier_s_failure_not_an_attempt() {
    let clock = ManualClock::new(T0);
    let t = Scripted::build(clock.clone(), vec![], None, true);
    let h = Harness::start(config(Jitter::None), t.clone(), clock.clone());
    let id = h.accept("/panic", vec![]).await;
    t.wait_calls(1).await;
    let rec = h
        .wait_record(&id, "requeue after the panic", |r| r.state == State::Pending)
        .await;
    assert_eq!(rec.attempts, 0, "a panic is not an attempt");
    assert_eq!(
        rec.next_attempt_at_ms,
        T0 + super::SELF_FAILURE_DELAY.as_millis() as u64
    );
    clock.set(rec.next_attempt_at_ms);
    t.wait_calls(2).await;
    let rec = h.wait_record(&id, "delivery", |r| r.state == State::Delivered).await;
    assert_eq!(rec.attempts, 1);
}

#[tokio::test]
async fn a_paused_endpoint_holds_its_messages_until_resumed() {
    let clock = ManualClock::new(T0);
    let t = Scripted::new(clock.clone(), vec![]);
    let h = Harness::start(config(Jitter::None), t.clone(), clock.clone());
    h.d.context().set_paused("https://r.example/held", true).unwrap();
    let held = h.accept("/held", vec![]).await;
    let free = h.accept("/free", vec![]).await;
    h.wait_record(&free, "delivery", |r| r.state == State::Delivered).await;
    assert_eq!(t.calls().len(), 1);
    assert_eq!(h.record(&held).state, State::Pending);
    h.d.context().set_paused("https://r.example/held", false).unwrap();
    h.wait_record(&held, "delivery after resume", |r| r.state == State::Delivered)
        .await;
}

#[tokio::test]
async fn another_host_is_served_behind_a_long_blocked_backlog() {
    let clock = ManualClock::new(T0);
    // Calls to the blocked host hang until the gate opens; the other host's answer at once.
    let t = Scripted::build(clock.clone(), vec![], Some(Semaphore::new(0)), false);
    let mut cfg = config(Jitter::None);
    cfg.delivery.max_in_flight_per_host = 1;
    let h = Harness::start(cfg, t.clone(), clock.clone());
    let n = 3 * crate::scheduler::Limits::DEFAULT.skip_run + 10;
    for i in 0..n {
        h.accept_url(&format!("https://blocked.example/b{i}"), vec![]).await;
    }
    t.wait_calls(1).await;
    let other = h.accept_url("https://other.example/x", vec![]).await;
    let calls = t.wait_calls(2).await;
    assert_eq!(
        calls[1].1.url.host(),
        Some("other.example"),
        "the other host was reached"
    );
    assert_eq!(h.record(&other).state, State::InFlight);
    assert_eq!(t.calls().len(), 2, "the blocked host still has one attempt in flight");
    t.gate.as_ref().unwrap().add_permits(n + 1);
    h.wait_record(&other, "delivery", |r| r.state == State::Delivered).await;
}

const HELD: &str = "https://r.example/held";

/// Finding: the scheduler decided to park in a pass (the endpoint looked paused) but wrote
/// the park after its scan; a resume landing in between ran its unpark first, and the park
/// then left the message in the parked set of an active endpoint, forever.
#[tokio::test]
async fn a_resume_between_the_park_decision_and_the_park_write_strands_nothing() {
    let clock = ManualClock::new(T0);
    let t = Scripted::new(clock.clone(), vec![]);
    let h = Harness::without_scheduler(config(Jitter::None), t.clone(), clock.clone());
    h.d.context().set_paused(HELD, true).unwrap();
    let held = h.accept("/held", vec![]).await;
    // The pass: it scans while the endpoint is paused and decides to park...
    let decided = h.due_now();
    assert_eq!(decided.len(), 1);
    // ...the operator resumes before the park is written...
    h.d.context().set_paused(HELD, false).unwrap();
    // ...and the park write re-checks under the pause gate: nothing parked.
    let (parked, left) = h.d.context().park_paused(decided).unwrap();
    assert_eq!((parked, left), (0, Some(T0)));
    assert!(h.d.context().store().parked_endpoints().unwrap().is_empty());
    h.start_scheduler();
    h.wait_record(&held, "delivery", |r| r.state == State::Delivered).await;
}

/// Finding: a crash in the middle of a resume (endpoint persisted active, messages still
/// parked) left them parked forever; startup now requeues them.
#[tokio::test]
async fn messages_left_parked_for_an_active_endpoint_are_requeued_at_startup() {
    let clock = ManualClock::new(T0);
    let t = Scripted::new(clock.clone(), vec![]);
    let mut h = Harness::without_scheduler(config(Jitter::None), t.clone(), clock.clone());
    h.d.context().set_paused(HELD, true).unwrap();
    let held = h.accept("/held", vec![]).await;
    let (parked, _) = h.d.context().park_paused(h.due_now()).unwrap();
    assert_eq!(parked, 1);
    // The resume's first write lands, then courier dies before the unpark.
    h.d.context()
        .store()
        .put_endpoint(HELD, &crate::store::EndpointRecord::default(), T0)
        .unwrap();
    assert!(h.due_now().is_empty());
    // Restart: a new delivery context over the same store.
    let d = Harness::deliverer(
        h.d.context().store().clone(),
        config(Jitter::None),
        t.clone(),
        clock.clone(),
    );
    assert!(!d.context().endpoints().is_paused(HELD));
    assert_eq!(d.context().recover_parked().unwrap(), 1);
    assert!(d.context().store().parked_endpoints().unwrap().is_empty());
    h.d = d;
    assert_eq!(h.due_now().len(), 1);
    h.start_scheduler();
    h.wait_record(&held, "delivery after restart", |r| r.state == State::Delivered)
        .await;
}

#[tokio::test]
async fn a_paused_endpoint_keeps_its_parked_messages_across_a_restart() {
    let clock = ManualClock::new(T0);
    let t = Scripted::new(clock.clone(), vec![]);
    let h = Harness::without_scheduler(config(Jitter::None), t.clone(), clock.clone());
    h.d.context().set_paused(HELD, true).unwrap();
    h.accept("/held", vec![]).await;
    assert_eq!(h.d.context().park_paused(h.due_now()).unwrap().0, 1);
    let d = Harness::deliverer(h.d.context().store().clone(), config(Jitter::None), t, clock);
    assert_eq!(d.context().recover_parked().unwrap(), 0);
    assert_eq!(d.context().store().parked_endpoints().unwrap(), vec![HELD.to_string()]);
}

/// Finding: an attempt's endpoint write carried the snapshot it computed; a resume landing
/// between that computation and the write was undone by it (paused again after restart).
#[tokio::test]
async fn a_resume_overtaking_an_attempt_s_endpoint_write_is_not_undone() {
    let clock = ManualClock::new(T0);
    let t = Scripted::new(clock.clone(), vec![]);
    let mut cfg = config(Jitter::None);
    cfg.delivery.pause_after_permanent_failures = 1;
    let h = Harness::without_scheduler(cfg.clone(), t.clone(), clock.clone());
    // The attempt's result pauses the endpoint in memory...
    let change =
        h.d.context()
            .endpoints()
            .record(HELD, crate::context::endpoints::PERMANENT, Some(410), T0, || {
                h.d.context().store().endpoint(HELD)
            })
            .unwrap();
    assert!(matches!(change, crate::context::endpoints::EndpointChange::Paused(_)));
    // ...the operator resumes (and that is written)...
    h.d.context().set_paused(HELD, false).unwrap();
    // ...then the attempt's write lands, late: it writes the state as it is now.
    h.d.context().persist_endpoint(HELD, true).unwrap();
    let restarted = Harness::deliverer(h.d.context().store().clone(), cfg, t, clock);
    assert!(
        !restarted.context().endpoints().is_paused(HELD),
        "the resume survives a restart"
    );
}

/// Finding: an endpoint that ever failed was never forgotten (its last status kept it
/// "worth remembering" after a success), in memory or on disk.
#[tokio::test]
async fn endpoints_not_seen_within_the_retention_window_are_forgotten() {
    let clock = ManualClock::new(T0);
    let t = Scripted::new(clock.clone(), vec![]);
    let h = Harness::without_scheduler(config(Jitter::None), t.clone(), clock.clone());
    let failing = "https://r.example/failing";
    h.d.context()
        .endpoints()
        .record(failing, crate::context::endpoints::PERMANENT, Some(410), T0, || {
            h.d.context().store().endpoint(failing)
        })
        .unwrap();
    h.d.context().persist_endpoint(failing, false).unwrap();
    h.d.context().set_paused(HELD, true).unwrap();
    let healed = "https://r.example/healed";
    h.d.context()
        .endpoints()
        .record(healed, crate::context::endpoints::PERMANENT, Some(410), T0, || {
            h.d.context().store().endpoint(healed)
        })
        .unwrap();
    h.d.context()
        .endpoints()
        .record(healed, crate::model::Transition::Delivered, Some(200), T0, || {
            h.d.context().store().endpoint(healed)
        })
        .unwrap();
    h.d.context().persist_endpoint(healed, false).unwrap();
    assert_eq!(
        h.d.context().store().endpoints().unwrap().len(),
        2,
        "the failing and the paused one"
    );
    // Within the window nothing is forgotten.
    clock.advance(h.d.context().config().retention);
    assert_eq!(h.d.context().expire_endpoints().unwrap(), (0, 0));
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        h.d.context().expire_endpoints().unwrap(),
        (2, 1),
        "the failing and the healed one in memory; the failing one's record on disk"
    );
    assert!(h.d.context().endpoints().get(failing).is_none() && h.d.context().endpoints().get(healed).is_none());
    let kept: Vec<String> =
        h.d.context()
            .store()
            .endpoints()
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
    assert_eq!(kept, vec![HELD.to_string()], "a paused endpoint is kept however old");
}

/// A named key's targets are checked again when signing: a message accepted before the
/// key was bound (or its binding narrowed) is never signed for a target outside it.
#[tokio::test]
async fn a_key_bound_elsewhere_never_signs_a_stored_message() {
    let clock = ManualClock::new(T0);
    let t = Scripted::new(clock.clone(), vec![]);
    let mut cfg = config(Jitter::None);
    cfg.signing.keys.insert(
        "partner".into(),
        crate::config::SigningKey {
            secrets: vec![crate::signing::Secret::new("whsec_c2VjcmV0".into())],
            targets: vec![crate::signing::scope::TargetPattern::parse("https://partner.example/*").unwrap()],
        },
    );
    let h = Harness::start(cfg, t.clone(), clock.clone());
    let env = Envelope {
        target: url::Url::parse("https://r.example/elsewhere").unwrap(),
        endpoint: None,
        route: None,
        event_id: None,
        method: "POST".into(),
        headers: vec![],
        body: b"{}".to_vec(),
        scheme: None,
        signing: SigningChoice::Key("partner".into()),
        max_attempts: 16,
        give_up_after: Duration::from_secs(3600),
    };
    let msg = env.into_message(T0, &mut rand::rng(), h.d.context().store().ids());
    let id = msg.record.id.clone();
    h.d.context().store().accept(msg).await.unwrap();
    h.settle().await;
    assert!(t.calls().is_empty(), "nothing was signed or sent");
    let rec = h.record(&id);
    assert_eq!(
        (rec.state, rec.attempts),
        (State::Pending, 0),
        "courier's refusal, not an attempt"
    );
}

/// An attempt's end reaches `lifecycle::settle` after its result is written, and the
/// written result ends the lease: the message can be leased and sent again first. The late
/// end must leave the registry entry of that next attempt alone, or shutdown and the drain
/// would not wait for (nor cut off) an attempt still sending. Fails with the registry keyed
/// by message id alone.
#[tokio::test]
async fn a_late_end_leaves_the_next_attempt_of_its_message_in_the_registry() {
    let clock = ManualClock::new(T0);
    // The first send answers 500 at once; the second is held at the receiver.
    let t = Scripted::build(clock.clone(), vec![status(500)], Some(Semaphore::new(1)), false);
    let mut c = config(Jitter::None);
    c.retry.base_delay = Duration::from_millis(1);
    let h = Harness::without_scheduler(c, t.clone(), clock.clone());
    let id = h.accept("/hook", vec![]).await;
    let lease_and_dispatch = |h: &Harness| {
        let entries = h.due_now();
        assert_eq!(entries.len(), 1, "due: {entries:?}");
        let now = h.clock.now_ms();
        let claimed = h.d.context().store().lease_many(&entries, now).pop();
        let claimed = claimed.unwrap().unwrap().expect("leased");
        let permit = h.d.admit(&claimed.record.host, &claimed.record.endpoint, now);
        h.d.dispatch(claimed, permit.expect("permits"));
    };
    lease_and_dispatch(&h);
    t.wait_calls(1).await;
    // The store writer writes the retry on its thread; this test's runtime, where the end
    // is settled, does not run meanwhile.
    let written = std::time::Instant::now();
    while h.record(&id).attempts < 1 {
        assert!(
            written.elapsed() < Duration::from_secs(10),
            "the result was never written"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    clock.set(T0 + 10);
    lease_and_dispatch(&h);
    t.wait_calls(2).await;
    // The first attempt's end, handed back by the writer, is settled now.
    h.d.settle_handed_back();
    assert_eq!(
        h.d.in_flight_ids(),
        vec![id.clone()],
        "the second attempt, still sending, is running"
    );
    t.gate.as_ref().unwrap().add_permits(1);
    h.wait_record(&id, "delivery", |r| r.state == State::Delivered).await;
}
