//! The fast in-process receiver every delivery goes to, and the fixed-answer HTTP server it
//! shares with baseline (a).

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::Res;

/// Serves HTTP/1.1 on `listener`, answering every request with `status` after reading its
/// body; `on_request` sees each request's headers first.
pub async fn serve_fixed<F>(listener: TcpListener, status: StatusCode, answer: Bytes, on_request: F)
where
    F: Fn(&http::HeaderMap) + Send + Sync + 'static,
{
    let on_request = Arc::new(on_request);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let on_request = on_request.clone();
        let answer = answer.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let on_request = on_request.clone();
            let answer = answer.clone();
            async move {
                let (parts, body) = req.into_parts();
                let _ = body.collect().await;
                on_request(&parts.headers);
                let mut resp = Response::new(Full::new(answer));
                *resp.status_mut() = status;
                resp.headers_mut()
                    .insert(CONTENT_TYPE, "application/json".parse().unwrap());
                Ok::<_, Infallible>(resp)
            }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The scheduled times of the messages an open-loop probe measures, and what the receiver
/// saw of them so far: a probe can tell how many are late while it runs.
pub struct Tracker {
    /// Event seq → scheduled send time, entered before the send.
    pub due: Mutex<HashMap<u64, Instant>>,
    /// Later than this after its scheduled time is late.
    pub bound: Duration,
    /// Tracked messages received, and how many of them late.
    pub arrived: AtomicU64,
    pub late: AtomicU64,
}

impl Tracker {
    /// An empty tracker for messages late after `bound`.
    pub fn new(bound: Duration) -> Arc<Tracker> {
        Arc::new(Tracker {
            due: Mutex::new(HashMap::new()),
            bound,
            arrived: AtomicU64::new(0),
            late: AtomicU64::new(0),
        })
    }

    /// Notes a tracked message's arrival (first arrivals only: the caller dedupes).
    fn arrive(&self, seq: u64, at: Instant) {
        let Some(due) = self.due.lock().unwrap().get(&seq).copied() else {
            return;
        };
        self.arrived.fetch_add(1, Ordering::Relaxed);
        if at - due > self.bound {
            self.late.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The fast local receiver: answers 200 at once, counts deliveries and, when asked, notes
/// the arrival time of each event id.
pub struct Receiver {
    pub addr: SocketAddr,
    count: AtomicU64,
    /// While set, each delivery's arrival is noted in `arrivals` by its event seq.
    pub record: AtomicBool,
    pub arrivals: Mutex<HashMap<u64, Instant>>,
    arrived: Notify,
    /// While set (and `record` is), arrivals are also checked against its schedule.
    pub tracker: Mutex<Option<Arc<Tracker>>>,
}

impl Receiver {
    /// Listens on a free loopback port and serves in the background.
    pub async fn start() -> Res<Arc<Receiver>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let r = Arc::new(Receiver {
            addr: listener.local_addr()?,
            count: AtomicU64::new(0),
            record: AtomicBool::new(false),
            arrivals: Mutex::new(HashMap::new()),
            arrived: Notify::new(),
            tracker: Mutex::new(None),
        });
        let me = r.clone();
        tokio::spawn(serve_fixed(listener, StatusCode::OK, Bytes::new(), move |h| {
            let at = Instant::now();
            me.count.fetch_add(1, Ordering::Relaxed);
            if me.record.load(Ordering::Relaxed) {
                let seq = h
                    .get("webhook-id")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("lg-"))
                    .and_then(|v| v.parse::<u64>().ok());
                if let Some(seq) = seq {
                    let first = match me.arrivals.lock().unwrap().entry(seq) {
                        Entry::Vacant(v) => {
                            v.insert(at);
                            true
                        }
                        Entry::Occupied(_) => false,
                    };
                    if first {
                        if let Some(t) = me.tracker.lock().unwrap().clone() {
                            t.arrive(seq, at);
                        }
                    }
                    me.arrived.notify_one();
                }
            }
        }));
        Ok(r)
    }

    /// Deliveries received so far (all of them, recorded or not).
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Deliveries received between `start` and `end`, counted by a task (so the load can run
    /// meanwhile); await it after `end`.
    pub fn count_between(
        self: &Arc<Self>,
        start: tokio::time::Instant,
        end: tokio::time::Instant,
    ) -> tokio::task::JoinHandle<u64> {
        let recv = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(start).await;
            let c0 = recv.count();
            tokio::time::sleep_until(end).await;
            recv.count() - c0
        })
    }

    /// Takes the arrivals noted so far, leaving none.
    pub fn take_arrivals(&self) -> HashMap<u64, Instant> {
        std::mem::take(&mut *self.arrivals.lock().unwrap())
    }

    /// Waits until the receiver has seen `seq`; returns when it arrived.
    pub async fn wait_for(&self, seq: u64, within: Duration) -> Option<Instant> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(at) = self.arrivals.lock().unwrap().get(&seq) {
                return Some(*at);
            }
            if tokio::time::timeout_at(deadline, self.arrived.notified())
                .await
                .is_err()
            {
                return self.arrivals.lock().unwrap().get(&seq).copied();
            }
        }
    }

    /// Waits until at least `n` deliveries have been counted.
    pub async fn wait_count(&self, n: u64, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while self.count() < n {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }
}
