//! The simulated receivers: a [`Transport`] that answers every attempt from the run's seeded
//! randomness — every class of answer the contract names, errors, and slow answers that
//! stay in flight until the simulator releases them — and logs what each receiver saw.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::Rng;
use tokio::sync::oneshot;

use crate::clock::{Clock, ManualClock};
use crate::outbound::transport::{InboundResponse, OutboundRequest, SendFuture, Transport, TransportError};

/// What one receiver saw of one attempt.
#[derive(Debug, Clone)]
pub struct Seen {
    /// `webhook-id`.
    pub event_id: String,
    /// The target.
    pub url: String,
    /// The body.
    pub body: Vec<u8>,
    /// When it arrived (courier's time on the simulated clock).
    pub at_ms: u64,
    /// The wall clock then (stepped by the simulator), which signatures are stamped with.
    pub wall_ms: u64,
    /// Its place in the log (what a start's `World::started_at_log` entry counts).
    pub index: usize,
    /// `webhook-timestamp`.
    pub timestamp: String,
    /// What the receiver answered (`None`: still held, or cut by a crash).
    pub answer: Option<Answer>,
}

/// The answer to one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// An HTTP status, with a `Retry-After` value when one was sent.
    Status(u16, Option<String>),
    /// A timeout.
    Timeout,
    /// A network error.
    Network,
}

struct Held {
    index: usize,
    answer: oneshot::Sender<Answer>,
}

struct State {
    rng: StdRng,
    log: Vec<Seen>,
    /// Attempts that panicked before their request left, per host (they reach no
    /// receiver, but a breaker's probe among them is lost and lets the next go).
    panicked: BTreeMap<String, usize>,
    held: Vec<Held>,
    healthy: bool,
    /// Attempts in flight per host now, the most ever, and the most in total.
    in_flight: BTreeMap<String, usize>,
    max_per_host: BTreeMap<String, usize>,
    max_total: usize,
    /// Attempts in flight per endpoint (the URL: the targets have no query) now, and the most.
    in_flight_endpoint: BTreeMap<String, usize>,
    max_per_endpoint: BTreeMap<String, usize>,
}

/// The receivers of a run.
pub struct SimTransport {
    clock: Arc<ManualClock>,
    state: Mutex<State>,
    /// The ordering invariant, checked as each attempt arrives.
    pub order: super::order::OrderBook,
    /// The running node's store: once a crash armed in it happened, the process is dead
    /// and sends nothing (weak: a crash must be able to close it).
    store: Mutex<std::sync::Weak<crate::store::Store>>,
}

impl SimTransport {
    /// Receivers answering from `rng`.
    pub fn new(clock: Arc<ManualClock>, rng: StdRng) -> Arc<Self> {
        Arc::new(SimTransport {
            clock,
            state: Mutex::new(State {
                rng,
                log: Vec::new(),
                panicked: BTreeMap::new(),
                held: Vec::new(),
                healthy: false,
                in_flight: BTreeMap::new(),
                max_per_host: BTreeMap::new(),
                max_total: 0,
                in_flight_endpoint: BTreeMap::new(),
                max_per_endpoint: BTreeMap::new(),
            }),
            order: Default::default(),
            store: Mutex::new(std::sync::Weak::new()),
        })
    }

    /// Ties the receivers to the running node's `store` (see [`SimTransport::send`]).
    pub fn watch_store(&self, store: &Arc<crate::store::Store>) {
        *self.store.lock().unwrap_or_else(|p| p.into_inner()) = Arc::downgrade(store);
    }

    /// Whether the node crashed inside a write (an armed crash): it can send nothing more.
    fn node_dead(&self) -> bool {
        let store = self.store.lock().unwrap_or_else(|p| p.into_inner()).upgrade();
        store.is_some_and(|s| s.faults().crashed())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// From now on every attempt is answered 200 at once (the end of a run).
    pub fn heal(&self) {
        self.lock().healthy = true;
    }

    /// Attempts held open now.
    pub fn held(&self) -> usize {
        self.lock().held.len()
    }

    /// The event ids of the attempts held open now.
    pub fn held_events(&self) -> Vec<String> {
        let st = self.lock();
        st.held.iter().map(|h| st.log[h.index].event_id.clone()).collect()
    }

    /// Answers every held attempt (200 or 500, from the run's randomness).
    pub fn release_all(&self) {
        let mut st = self.lock();
        let held = std::mem::take(&mut st.held);
        for h in held {
            let answer = if st.healthy || st.rng.random_bool(0.5) {
                Answer::Status(200, None)
            } else {
                Answer::Status(500, None)
            };
            st.log[h.index].answer = Some(answer.clone());
            let _ = h.answer.send(answer);
        }
    }

    /// Forgets held attempts without answering (their courier crashed): nothing is in
    /// flight any more.
    pub fn drop_held(&self) {
        let mut st = self.lock();
        st.held.clear();
        st.in_flight.clear();
        st.in_flight_endpoint.clear();
        self.order.reset_in_flight();
    }

    /// The most attempts ever in flight at once to one host, per host, and in total.
    pub fn max_in_flight(&self) -> (BTreeMap<String, usize>, usize) {
        let st = self.lock();
        (st.max_per_host.clone(), st.max_total)
    }

    /// Attempts in flight to `endpoint` now.
    pub fn in_flight_to(&self, endpoint: &str) -> usize {
        self.lock().in_flight_endpoint.get(endpoint).copied().unwrap_or(0)
    }

    /// The most attempts ever in flight at once to one endpoint, per endpoint.
    pub fn max_in_flight_per_endpoint(&self) -> BTreeMap<String, usize> {
        self.lock().max_per_endpoint.clone()
    }

    fn ended(&self, host: &str, url: &str) {
        self.order.ended(url);
        let mut st = self.lock();
        if let Some(n) = st.in_flight.get_mut(host) {
            *n = n.saturating_sub(1);
        }
        if let Some(n) = st.in_flight_endpoint.get_mut(url) {
            *n = n.saturating_sub(1);
        }
    }

    /// Attempts to `host` that panicked before their request left, so far.
    pub fn panicked(&self, host: &str) -> usize {
        self.lock().panicked.get(host).copied().unwrap_or(0)
    }

    /// Everything seen so far.
    pub fn log(&self) -> Vec<Seen> {
        self.lock().log.clone()
    }

    /// How many attempts were seen so far.
    pub fn log_len(&self) -> usize {
        self.lock().log.len()
    }

    /// The attempts seen from the `start`-th on (a step's, when `start` is the length
    /// before it).
    pub fn log_from(&self, start: usize) -> Vec<Seen> {
        self.lock().log.get(start..).unwrap_or_default().to_vec()
    }

    /// Attempts seen per event id.
    pub fn seen_per_event(&self) -> BTreeMap<String, Vec<Seen>> {
        let mut out: BTreeMap<String, Vec<Seen>> = BTreeMap::new();
        for s in self.log() {
            out.entry(s.event_id.clone()).or_default().push(s);
        }
        out
    }

    /// An answer; a `Retry-After` date is on the receiver's wall clock, `wall_ms`.
    fn draw(&self, rng: &mut StdRng, wall_ms: u64) -> Option<Answer> {
        let roll = rng.random_range(0..100);
        Some(match roll {
            0..=34 => Answer::Status(if rng.random_bool(0.5) { 200 } else { 204 }, None),
            35..=39 => Answer::Status([400, 401, 403, 410, 422][rng.random_range(0..5)], None),
            40..=44 => Answer::Status(404, None),
            45..=49 => Answer::Status(408, None),
            50..=57 => {
                let after = rng.random_bool(0.7).then(|| rng.random_range(0..120).to_string());
                Answer::Status(429, after)
            }
            58..=65 => {
                let at =
                    std::time::UNIX_EPOCH + std::time::Duration::from_millis(wall_ms + rng.random_range(0..300_000));
                let after = rng.random_bool(0.7).then(|| httpdate::fmt_http_date(at));
                Answer::Status(503, after)
            }
            66..=73 => Answer::Status([500, 502, 504, 599][rng.random_range(0..4)], None),
            74..=78 => Answer::Timeout,
            79..=83 => Answer::Network,
            84..=88 => Answer::Status([301, 302, 307][rng.random_range(0..3)], None),
            _ => return None, // slow: held until released
        })
    }
}

/// `host:port` of an attempt's URI, as the delivery side keys hosts (`target::host_key`).
fn uri_host_key(uri: &http::Uri) -> String {
    crate::outbound::conn_cap::host_key(uri).map_or_else(String::new, |k| k.to_string())
}

fn header(req: &OutboundRequest, name: &str) -> String {
    req.headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_default()
}

fn respond(answer: Answer) -> Result<InboundResponse, TransportError> {
    match answer {
        Answer::Status(status, retry_after) => Ok(InboundResponse {
            status,
            retry_after,
            body: Default::default(),
            receipt: None,
        }),
        Answer::Timeout => Err(TransportError::Timeout("simulated".into())),
        Answer::Network => Err(TransportError::Network("simulated reset".into())),
    }
}

/// The message of the worker panics the receivers cause.
const SIMULATED_PANIC: &str = "simulated worker panic";

/// Keeps the simulated worker panics out of the test output (thousands of seeds make
/// thousands); every other panic goes to the hook that was installed before.
fn quiet_simulated_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied());
            if message != Some(SIMULATED_PANIC) {
                previous(info);
            }
        }));
    });
}

impl Transport for SimTransport {
    fn send(&self, req: OutboundRequest) -> SendFuture<'_> {
        if self.node_dead() {
            // Never reaches a receiver: nothing is logged.
            return Box::pin(async { Err(TransportError::Network("the node crashed".into())) });
        }
        let (now, wall) = (self.clock.now_ms(), self.clock.wall_ms());
        let mut st = self.lock();
        // A worker that panics before its request leaves (a bug in courier, not the
        // receiver's doing): the message must be requeued, uncounted, its lease ended.
        if !st.healthy && st.rng.random_ratio(1, 40) {
            *st.panicked.entry(uri_host_key(&req.url)).or_default() += 1;
            drop(st);
            quiet_simulated_panics();
            return Box::pin(async { panic!("{SIMULATED_PANIC}") });
        }
        let answer = if st.healthy {
            Some(Answer::Status(200, None))
        } else {
            let mut rng = std::mem::replace(&mut st.rng, rand::SeedableRng::seed_from_u64(0));
            let a = self.draw(&mut rng, wall);
            st.rng = rng;
            a
        };
        let host = uri_host_key(&req.url);
        let now_host = {
            let n = st.in_flight.entry(host.clone()).or_default();
            *n += 1;
            *n
        };
        let total: usize = st.in_flight.values().sum();
        let max = st.max_per_host.entry(host.clone()).or_default();
        *max = (*max).max(now_host);
        st.max_total = st.max_total.max(total);
        let url = req.url.to_string();
        let now_endpoint = {
            let n = st.in_flight_endpoint.entry(url.clone()).or_default();
            *n += 1;
            *n
        };
        let max = st.max_per_endpoint.entry(url.clone()).or_default();
        *max = (*max).max(now_endpoint);
        let index = st.log.len();
        let event = header(&req, crate::signing::WEBHOOK_ID);
        let store = self.store.lock().unwrap_or_else(|p| p.into_inner()).upgrade();
        self.order.started(&url, &event, now, store.as_deref());
        st.log.push(Seen {
            event_id: header(&req, crate::signing::WEBHOOK_ID),
            url: req.url.to_string(),
            body: req.body.to_vec(),
            at_ms: now,
            wall_ms: wall,
            index,
            timestamp: header(&req, crate::signing::WEBHOOK_TIMESTAMP),
            answer: answer.clone(),
        });
        // Ends the attempt at the receiver however its future ends: answered, or dropped by
        // courier (an attempt cut off closes its connection; the receiver stops waiting).
        let attempt = Attempt {
            rx: self,
            index,
            host,
            url,
        };
        match answer {
            Some(a) => Box::pin(async move {
                drop(attempt);
                respond(a)
            }),
            None => {
                let (tx, rx) = oneshot::channel();
                st.held.push(Held { index, answer: tx });
                Box::pin(async move {
                    match rx.await {
                        Ok(a) => {
                            drop(attempt);
                            respond(a)
                        }
                        // Dropped by a crash: this attempt never ends (its task is gone).
                        Err(_) => std::future::pending().await,
                    }
                })
            }
        }
    }
}

/// One attempt at a receiver, ended when dropped (see [`SimTransport::send`]).
struct Attempt<'a> {
    rx: &'a SimTransport,
    index: usize,
    host: String,
    url: String,
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        self.rx.lock().held.retain(|h| h.index != self.index);
        self.rx.ended(&self.host, &self.url);
    }
}
