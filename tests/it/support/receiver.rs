//! The scripted HTTP receiver the black-box tests deliver to: what it saw of each request
//! ([`Seen`]), what it answers ([`Reply`], held by a [`Gate`] when a test needs attempts in
//! flight), and how many requests it had in progress at once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::WAIT;

/// What the receiver saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Headers (lowercase names, in order).
    pub headers: Vec<(String, Vec<u8>)>,
    /// Body.
    pub body: Vec<u8>,
    /// When it arrived.
    pub at: Instant,
}

impl Seen {
    /// The first value of a header, as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    /// Every value of a header.
    pub fn headers_named(&self, name: &str) -> Vec<String> {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect()
    }
}

/// A latch a receiver's answers can wait on: closed until the test opens it, so a test
/// holds attempts in flight exactly as long as it needs to look at them.
#[derive(Debug, Clone, Default)]
pub struct Gate(Arc<(std::sync::atomic::AtomicBool, tokio::sync::Notify)>);

impl Gate {
    /// A closed gate.
    pub fn new() -> Gate {
        Gate::default()
    }

    /// Opens it: every answer waiting on it goes out, and later ones do not wait.
    pub fn open(&self) {
        self.0 .0.store(true, std::sync::atomic::Ordering::SeqCst);
        self.0 .1.notify_waiters();
    }

    async fn passed(&self) {
        loop {
            let opened = self.0 .1.notified();
            if self.0 .0.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            opened.await;
        }
    }
}

/// What the receiver answers.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// Delay before answering.
    pub delay: Duration,
    /// Response body.
    pub body: Bytes,
    /// Answer only once this gate is open.
    pub gate: Option<Gate>,
}

impl Reply {
    /// A plain status.
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: vec![],
            delay: Duration::ZERO,
            body: Bytes::new(),
            gate: None,
        }
    }

    /// With a body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Reply {
        self.body = body.into();
        self
    }

    /// With a header.
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// After a delay.
    pub fn after(mut self, d: Duration) -> Reply {
        self.delay = d;
        self
    }

    /// Once `gate` is open.
    pub fn until(mut self, gate: &Gate) -> Reply {
        self.gate = Some(gate.clone());
        self
    }
}

type Script = Arc<dyn Fn(usize, &Seen) -> Reply + Send + Sync>;

struct ReceiverState {
    seen: Mutex<Vec<Seen>>,
    changed: tokio::sync::Notify,
    in_flight: std::sync::atomic::AtomicUsize,
    max_in_flight: std::sync::atomic::AtomicUsize,
    /// Per path: requests being answered now, and the most ever at once.
    per_path: Mutex<HashMap<String, (usize, usize)>>,
    script: Mutex<Script>,
}

/// A scripted HTTP receiver on 127.0.0.1:0.
#[derive(Clone)]
pub struct Receiver {
    /// Its address.
    pub addr: SocketAddr,
    state: Arc<ReceiverState>,
    stop: Arc<tokio::sync::Notify>,
}

impl Receiver {
    /// A receiver answering 200 to everything.
    pub async fn start() -> Receiver {
        Self::scripted(|_, _| Reply::status(200)).await
    }

    /// A receiver answering with `script(n, request)` (n counts from 0).
    pub async fn scripted(script: impl Fn(usize, &Seen) -> Reply + Send + Sync + 'static) -> Receiver {
        Self::on(SocketAddr::from(([127, 0, 0, 1], 0)), Arc::new(script)).await
    }

    /// A receiver on a given address (to bring a "down" receiver back on its old port).
    pub async fn start_on(addr: SocketAddr) -> Receiver {
        Self::on(addr, Arc::new(|_, _| Reply::status(200))).await
    }

    async fn on(addr: SocketAddr, script: Script) -> Receiver {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ReceiverState {
            seen: Mutex::new(Vec::new()),
            changed: tokio::sync::Notify::new(),
            in_flight: Default::default(),
            max_in_flight: Default::default(),
            per_path: Default::default(),
            script: Mutex::new(script),
        });
        let stop = Arc::new(tokio::sync::Notify::new());
        let st = state.clone();
        let stp = stop.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
                    _ = stp.notified() => return,
                };
                let st = st.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                        let st = st.clone();
                        async move { Ok::<_, std::convert::Infallible>(handle(st, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Receiver { addr, state, stop }
    }

    /// Replaces the script.
    pub fn set_script(&self, script: impl Fn(usize, &Seen) -> Reply + Send + Sync + 'static) {
        *self.state.script.lock().unwrap() = Arc::new(script);
    }

    /// A URL on this receiver.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Everything seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// Waits until at least `n` requests were seen; panics after [`WAIT`].
    pub async fn wait_for(&self, n: usize) -> Vec<Seen> {
        self.wait_for_within(n, WAIT)
            .await
            .unwrap_or_else(|| panic!("receiver saw {} requests, expected {n}", self.seen().len()))
    }

    /// Waits until at least `n` requests were seen, or `timeout`.
    pub async fn wait_for_within(&self, n: usize, timeout: Duration) -> Option<Vec<Seen>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.state.changed.notified();
            let seen = self.seen();
            if seen.len() >= n {
                return Some(seen);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return None;
            }
        }
    }

    /// Most requests ever being answered at once.
    pub fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Requests being answered now on `path` (path and query).
    pub fn in_flight_on(&self, path: &str) -> usize {
        self.state.per_path.lock().unwrap().get(path).map_or(0, |p| p.0)
    }

    /// Most requests ever being answered at once on `path` (path and query).
    pub fn max_in_flight_on(&self, path: &str) -> usize {
        self.state.per_path.lock().unwrap().get(path).map_or(0, |p| p.1)
    }

    /// Starts the maxima over (for a new phase of a test): from what is in flight now.
    pub fn reset_max_in_flight(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let mut per_path = self.state.per_path.lock().unwrap();
        for p in per_path.values_mut() {
            p.1 = p.0;
        }
        self.state
            .max_in_flight
            .store(self.state.in_flight.load(SeqCst), SeqCst);
    }

    /// Stops accepting new connections.
    pub fn stop(&self) {
        self.stop.notify_waiters();
    }
}

async fn handle(st: Arc<ReceiverState>, req: hyper::Request<Incoming>) -> hyper::Response<Full<Bytes>> {
    use std::sync::atomic::Ordering::SeqCst;
    // Ends the request's counts however the handler ends: answered, or dropped because
    // the client went away (a killed courier).
    struct InFlight(Arc<ReceiverState>);
    impl Drop for InFlight {
        fn drop(&mut self) {
            self.0.in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let now = st.in_flight.fetch_add(1, SeqCst) + 1;
    st.max_in_flight.fetch_max(now, SeqCst);
    let in_flight = InFlight(st.clone());
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes().to_vec()).unwrap_or_default();
    let seen = Seen {
        method: parts.method.to_string(),
        path: parts.uri.path_and_query().map(|p| p.to_string()).unwrap_or_default(),
        headers: parts
            .headers
            .iter()
            .map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec()))
            .collect(),
        body,
        at: Instant::now(),
    };
    let path = seen.path.clone();
    {
        let mut per_path = st.per_path.lock().unwrap();
        let p = per_path.entry(path.clone()).or_default();
        p.0 += 1;
        p.1 = p.1.max(p.0);
    }
    // The same for its count on the path.
    struct OnPath(Arc<ReceiverState>, String);
    impl Drop for OnPath {
        fn drop(&mut self) {
            if let Some(p) = self.0.per_path.lock().unwrap().get_mut(&self.1) {
                p.0 -= 1;
            }
        }
    }
    let on_path = OnPath(st.clone(), path);
    let n = {
        let mut all = st.seen.lock().unwrap();
        all.push(seen.clone());
        all.len() - 1
    };
    let script = st.script.lock().unwrap().clone();
    let reply = script(n, &seen);
    st.changed.notify_waiters();
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    if let Some(gate) = &reply.gate {
        gate.passed().await;
    }
    drop(in_flight);
    drop(on_path);
    let mut resp = hyper::Response::builder().status(reply.status);
    for (k, v) in &reply.headers {
        resp = resp.header(k, v);
    }
    resp.body(Full::new(reply.body.clone())).unwrap()
}
