//! The receiver of the many-endpoints scenario: one listener per loopback address
//! `127.0.x.y` (x, y ≥ 1, so never `127.0.0.1`) on one shared port, all served by the same
//! fast logic (200 at once, 410 for paths under `/gone/`); and the readings of courier's
//! open sockets and Prometheus counters that the scenario needs.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::header::HOST;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::load::Conn;
use crate::{err, Res};

/// Hosts one address byte pair can name: x and y each run 1..=254 (0 is avoided so no host
/// is `127.0.0.1` or a `.0` network address, 255 so none looks like a broadcast address).
const PER_X: usize = 254;

/// The loopback address of host `h`: `127.0.(1 + h / 254).(1 + h % 254)` (host 0 is
/// `127.0.1.1`, host 254 `127.0.2.1`).
pub fn host_ip(h: usize) -> Ipv4Addr {
    assert!(h < PER_X * PER_X, "host {h} is beyond 127.0.254.254");
    Ipv4Addr::new(127, 0, (1 + h / PER_X) as u8, (1 + h % PER_X) as u8)
}

/// Answers counted by the receiver, across all its listeners.
#[derive(Default)]
pub struct Answers {
    /// 200s (paths under `/e/`).
    pub ok: AtomicU64,
    /// 410s (paths under `/gone/`).
    pub gone: AtomicU64,
}

impl Answers {
    /// (200s, 410s) so far.
    pub fn read(&self) -> (u64, u64) {
        (self.ok.load(Ordering::Relaxed), self.gone.load(Ordering::Relaxed))
    }
}

/// The many-hosts receiver: `count` listeners on `127.0.x.y:port`, stopped on drop.
pub struct Hosts {
    /// The port every host listens on.
    pub port: u16,
    /// Hosts listening: `127.0.1.1` and the next `count - 1` in [`host_ip`]'s order.
    pub count: usize,
    /// What all the listeners answered.
    pub answers: Arc<Answers>,
    accepts: Vec<JoinHandle<()>>,
}

impl Hosts {
    /// Binds `count` listeners on one free port (a few ports are tried, since the port free
    /// on the first address may be taken on another) and serves them in the background.
    pub async fn start(count: usize) -> Res<Hosts> {
        // Every delivery connection of courier is one descriptor here too, beside `count`
        // listeners: the default soft limit (often 1,024) would be too few.
        raise_fd_limit();
        let mut last = None;
        for _ in 0..5 {
            match bind_all(count).await {
                Ok(listeners) => return Ok(Hosts::serve(listeners)),
                Err(e) => last = Some(e),
            }
        }
        Err(err(format!(
            "could not bind {count} loopback listeners (127.0.x.y) on one port: {}",
            last.map_or_else(String::new, |e| e.to_string())
        )))
    }

    /// Serves every listener with the same logic and counters.
    fn serve(listeners: Vec<TcpListener>) -> Hosts {
        let port = listeners[0].local_addr().map_or(0, |a| a.port());
        let count = listeners.len();
        let answers = Arc::new(Answers::default());
        let accepts = listeners
            .into_iter()
            .map(|l| tokio::spawn(serve_by_path(l, answers.clone())))
            .collect();
        Hosts {
            port,
            count,
            answers,
            accepts,
        }
    }

    /// The listening address of host `h` (`h < count`).
    pub fn addr(&self, h: usize) -> SocketAddr {
        SocketAddr::new(host_ip(h).into(), self.port)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for a in &self.accepts {
            a.abort();
        }
    }
}

/// One listener per host address, all on the port the first one got.
async fn bind_all(count: usize) -> std::io::Result<Vec<TcpListener>> {
    let first = TcpListener::bind((host_ip(0), 0)).await?;
    let port = first.local_addr()?.port();
    let mut all = Vec::with_capacity(count);
    all.push(first);
    for h in 1..count {
        all.push(TcpListener::bind((host_ip(h), port)).await?);
    }
    Ok(all)
}

/// Serves HTTP/1.1 on `listener`: reads each body, then answers 410 when the path starts
/// with `/gone/` and 200 otherwise, with an empty body.
async fn serve_by_path(listener: TcpListener, answers: Arc<Answers>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors, most likely: retrying at once would spin.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let answers = answers.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let answers = answers.clone();
            async move {
                let gone = req.uri().path().starts_with("/gone/");
                let _ = req.into_body().collect().await;
                let status = if gone {
                    answers.gone.fetch_add(1, Ordering::Relaxed);
                    StatusCode::GONE
                } else {
                    answers.ok.fetch_add(1, Ordering::Relaxed);
                    StatusCode::OK
                };
                let mut resp = Response::new(Full::new(Bytes::new()));
                *resp.status_mut() = status;
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

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (best effort).
fn raise_fd_limit() {
    // SAFETY: getrlimit and setrlimit only read and write the struct passed to them.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Open sockets of a process: entries of `/proc/<pid>/fd` that link to `socket:[…]`
/// (listeners, accepted and outgoing connections alike).
pub fn sockets(pid: u32) -> u64 {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    rd.flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:")))
        .count() as u64
}

/// Messages that reached an end in courier's Prometheus text: `courier_delivered_total`
/// plus `courier_dead_letters_total` summed over its `reason` labels. `None` when the
/// delivered counter is missing (not courier's metrics).
pub fn finished_in(text: &str) -> Option<u64> {
    let (mut delivered, mut dead) = (None::<f64>, 0.0);
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        // The name up to its labels: `courier_dead_letters` (a gauge) must not match.
        match series.split('{').next().unwrap_or("") {
            "courier_delivered_total" => *delivered.get_or_insert(0.0) += v,
            "courier_dead_letters_total" => dead += v,
            _ => {}
        }
    }
    delivered.map(|d| (d + dead) as u64)
}

/// A keep-alive connection to courier's admin listener for frequent `/metrics` reads (one
/// connection for the whole run, so polling costs courier no accepts), reopened after an
/// error.
pub struct MetricsPoll {
    addr: SocketAddr,
    conn: Option<Conn>,
}

impl MetricsPoll {
    /// A poller of the admin listener at `addr` (connects on first use).
    pub fn new(addr: SocketAddr) -> MetricsPoll {
        MetricsPoll { addr, conn: None }
    }

    /// Messages finished so far, and the midpoint of the request that read it (the counters
    /// were read somewhere inside it).
    pub async fn finished(&mut self) -> Res<(u64, Instant)> {
        if self.conn.is_none() {
            self.conn = Some(Conn::open(self.addr).await?);
        }
        let req = Request::builder()
            .method(Method::GET)
            .uri("/metrics")
            .header(HOST, self.addr.to_string())
            .body(Full::new(Bytes::new()))?;
        let t0 = Instant::now();
        let answer = self.conn.as_mut().unwrap().send(req).await;
        let at = t0 + (Instant::now() - t0) / 2;
        let (status, body) = answer.inspect_err(|_| self.conn = None)?;
        let n = finished_in(&String::from_utf8_lossy(&body))
            .ok_or_else(|| err(format!("/metrics answered {status} without courier_delivered_total")))?;
        Ok((n, at))
    }
}
