//! What the delivery client does with receivers that misbehave (CONTRACT §3): one that
//! never answers or stalls mid-answer (`request_timeout`), an address whose accept backlog
//! is full so a connect never completes (`connect_timeout`), one that streams an endless
//! body (`max_response_body`), and one that redirects (never followed). Each attempt is
//! classified as the contract says, its host slot is released (a second message to the
//! same host gets through with `max_in_flight_per_host = 1`), and `last_error` is capped
//! and cleaned; a pooled connection left idle is closed after `idle_connection_timeout`,
//! idle connections over all hosts are capped at `max_idle_connections`, and beyond the 64
//! used last they close soon after their host's last use. Every socket is on loopback
//! (127.0.0.1, and 127.0.0.2 or 127.0.1.1 onwards for distinct hosts).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::admin::send;
use crate::support::*;

/// The first line of an endless 503 body: terminal escapes, bell, CR/LF, bidi and
/// zero-width characters that `last_error` must not carry to an operator's terminal.
const HOSTILE_LINE: &str = "\x1b[31mALERT\x07\r\nline2\u{202e}evil\u{200b}|";

/// A receiver on raw TCP, for answers a well-behaved HTTP server never gives. Per request
/// path: `/ok` answers 200 (and keeps the connection), `/silent` reads the request and
/// never answers, `/stall-body` sends a 200 head and part of its body, then nothing,
/// `/huge` streams a 503 whose chunked body never ends.
#[derive(Clone)]
struct RawReceiver {
    addr: std::net::SocketAddr,
    /// Request paths, in arrival order.
    paths: Arc<Mutex<Vec<String>>>,
    /// For `/silent` and `/stall-body`: how long after the request courier closed the connection.
    closed_after: Arc<Mutex<Vec<(String, Duration)>>>,
    /// Body bytes `/huge` managed to write before courier closed the connection.
    huge_written: Arc<AtomicU64>,
    /// Connections courier holds open to it now.
    open: Arc<AtomicU64>,
    /// Connections courier opened to it, ever.
    accepted: Arc<AtomicU64>,
    changed: Arc<tokio::sync::Notify>,
}

impl RawReceiver {
    async fn start() -> RawReceiver {
        Self::start_on("127.0.0.1").await
    }

    /// A receiver on `ip` (any loopback address: all of 127.0.0.0/8 is loopback on Linux).
    async fn start_on(ip: &str) -> RawReceiver {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let rx = RawReceiver {
            addr: listener.local_addr().unwrap(),
            paths: Default::default(),
            closed_after: Default::default(),
            huge_written: Default::default(),
            open: Default::default(),
            accepted: Default::default(),
            changed: Default::default(),
        };
        let r = rx.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let r = r.clone();
                r.accepted.fetch_add(1, Ordering::SeqCst);
                r.open.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let open = r.open.clone();
                    r.serve(stream).await;
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        rx
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn paths(&self) -> Vec<String> {
        self.paths.lock().unwrap().clone()
    }

    /// Reads one request (head and Content-Length body); returns its path.
    async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse().unwrap_or(0))
                    })
                    .unwrap_or(0);
                while buf.len() < end + 4 + len {
                    let mut more = [0u8; 4096];
                    match stream.read(&mut more).await {
                        Ok(0) | Err(_) => return None,
                        Ok(n) => buf.extend_from_slice(&more[..n]),
                    }
                }
                buf.drain(..end + 4 + len);
                return head.split(' ').nth(1).map(str::to_string);
            }
            let mut more = [0u8; 4096];
            match stream.read(&mut more).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&more[..n]),
            }
        }
    }

    /// Waits for the peer to close (EOF or reset), discarding anything it sends.
    async fn until_closed(stream: &mut TcpStream) {
        let mut sink = [0u8; 4096];
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    }

    async fn serve(self, mut stream: TcpStream) {
        let mut buf = Vec::new();
        while let Some(path) = Self::read_request(&mut stream, &mut buf).await {
            self.paths.lock().unwrap().push(path.clone());
            self.changed.notify_waiters();
            let started = Instant::now();
            match path.as_str() {
                "/ok" => {
                    if stream
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                        .await
                        .is_err()
                    {
                        return;
                    }
                    continue;
                }
                "/silent" => {}
                "/stall-body" => {
                    let _ = stream
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nthe first ten")
                        .await;
                }
                "/huge" => {
                    let mut written = 0u64;
                    let first = format!("{HOSTILE_LINE}{}", "y".repeat(400));
                    let head = format!(
                        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{first}\r\n",
                        first.len()
                    );
                    if stream.write_all(head.as_bytes()).await.is_ok() {
                        written += first.len() as u64;
                        let chunk = format!("{:x}\r\n{}\r\n", 64 << 10, "x".repeat(64 << 10));
                        // Endless, but bounded so a broken courier cannot fill the disk or hang the test.
                        while written < (1 << 30) && stream.write_all(chunk.as_bytes()).await.is_ok() {
                            written += 64 << 10;
                        }
                    }
                    self.huge_written.store(written, Ordering::SeqCst);
                    self.changed.notify_waiters();
                    return;
                }
                _ => {
                    let _ = stream
                        .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                        .await;
                    continue;
                }
            }
            // /silent and /stall-body: hold the connection until courier gives up on it.
            Self::until_closed(&mut stream).await;
            self.closed_after.lock().unwrap().push((path, started.elapsed()));
            self.changed.notify_waiters();
            return;
        }
    }

    /// How long after the request courier closed the connection of `path`.
    async fn wait_closed(&self, path: &str) -> Duration {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let changed = self.changed.notified();
            if let Some((_, d)) = self.closed_after.lock().unwrap().iter().find(|(p, _)| p == path) {
                return *d;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("courier never closed the connection of {path}");
            }
        }
    }

    /// Waits until a request for `path` arrived.
    async fn wait_path(&self, path: &str) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let changed = self.changed.notified();
            if self.paths().iter().any(|p| p == path) {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("no request for {path}; saw {:?}", self.paths());
            }
        }
    }
}

/// Waits until the message's first attempt is recorded; returns the delivery.
async fn first_attempt(c: &Courier, id: &str) -> Value {
    eventually(&format!("{id}'s first attempt to be recorded"), || async {
        let v = delivery(c, id).await;
        (v["attempts"] == 1).then_some(v)
    })
    .await
}

/// The first attempt failed and is retried later: pending, one history entry, and the
/// duration of that attempt in milliseconds.
fn assert_retried(v: &Value) -> u64 {
    assert_eq!(v["state"], "pending", "retried, not dead nor delivered: {v}");
    assert_eq!(v["attempts"], 1, "{v}");
    let history = v["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{v}");
    history[0]["duration_ms"].as_u64().unwrap()
}

/// Retries far away, so each test sees exactly one attempt per message.
const ONE_ATTEMPT: &str = "[retry]\nbase_delay = \"1h\"\njitter = \"none\"\n";

async fn in_flight_gauge(c: &Courier) -> String {
    let m = get(&c.admin_url("/metrics")).await.text();
    m.lines()
        .find(|l| l.starts_with("courier_in_flight "))
        .unwrap_or("courier_in_flight missing")
        .to_string()
}

#[tokio::test]
async fn a_receiver_that_never_answers_or_stalls_mid_body_is_cut_at_request_timeout() {
    let rx = RawReceiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(
        d.path(),
        &format!("{ONE_ATTEMPT}[delivery]\nrequest_timeout = \"500ms\"\nmax_in_flight_per_host = 1\n"),
    );
    let silent = send(&c, &rx.url("/silent"), "a").await;
    rx.wait_path("/silent").await;
    // Both wait for the one slot of this host: each gets it only when the attempt before
    // it gave its slot back.
    let stalled = send(&c, &rx.url("/stall-body"), "b").await;
    rx.wait_path("/stall-body").await;
    let ok = send(&c, &rx.url("/ok"), "c").await;
    wait_state(&c, &ok, "delivered").await;

    for (id, path) in [(&silent, "/silent"), (&stalled, "/stall-body")] {
        let v = first_attempt(&c, id).await;
        let took = assert_retried(&v);
        assert!(
            (450..3000).contains(&took),
            "{path}: the attempt took {took}ms, want the 500ms request_timeout: {v}"
        );
        // A timeout is a network error: no status, even when a 200 head had arrived.
        assert_eq!(v["last_status"], Value::Null, "{path}: {v}");
        let err = v["last_error"].as_str().unwrap_or_default();
        assert!(err.starts_with("timeout") && err.contains("500ms"), "{path}: {v}");
        // Courier let go of the connection at the timeout, not later.
        let closed = rx.wait_closed(path).await;
        assert!(
            closed < Duration::from_secs(3),
            "{path}: courier held the connection for {closed:?}"
        );
    }
    assert_eq!(rx.paths(), ["/silent", "/stall-body", "/ok"]);
    eventually("no attempt in flight", || async {
        (in_flight_gauge(&c).await == "courier_in_flight 0").then_some(())
    })
    .await;
}

/// A listener that never accepts and whose backlog (`listen(0)`: one connection) is full:
/// the kernel drops further SYNs, so a connect to it neither succeeds nor is refused.
async fn full_backlog() -> (std::net::SocketAddr, TcpListener, std::net::TcpStream) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr().unwrap();
    // Kept open, and never accepted from, for the test's lifetime.
    let listener = socket.listen(0).unwrap();
    // Fill the accept queue with one connection nobody accepts.
    let filler = std::net::TcpStream::connect(addr).unwrap();
    // Prove the queue is full: another connect must hang, not succeed or be refused.
    let probe = tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr)).await;
    assert!(probe.is_err(), "the backlog is not full: {probe:?}");
    (addr, listener, filler)
}

#[tokio::test]
async fn connect_timeout_bounds_a_connect_that_is_never_accepted() {
    let (addr, _listener, _filler) = full_backlog().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(
        d.path(),
        &format!(
            "{ONE_ATTEMPT}[delivery]\nconnect_timeout = \"300ms\"\nrequest_timeout = \"10s\"\nmax_in_flight_per_host = 1\n"
        ),
    );
    // Two messages to the same host with one slot: the second is attempted only once the
    // first's failed connect gave the slot back.
    let first = send(&c, &format!("http://{addr}/a"), "a").await;
    let second = send(&c, &format!("http://{addr}/b"), "b").await;
    for id in [&first, &second] {
        let v = first_attempt(&c, id).await;
        let took = assert_retried(&v);
        assert!(
            (250..3000).contains(&took),
            "the connect was given up after {took}ms, want the 300ms connect_timeout (request_timeout is 10s): {v}"
        );
        assert_eq!(v["last_status"], Value::Null, "{v}");
        let err = v["last_error"].as_str().unwrap_or_default();
        assert!(err.starts_with("timeout"), "a connect timeout is a timeout: {v}");
    }
    eventually("no attempt in flight", || async {
        (in_flight_gauge(&c).await == "courier_in_flight 0").then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_endless_response_body_is_read_only_up_to_max_response_body() {
    let rx = RawReceiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(
        d.path(),
        &format!(
            "{ONE_ATTEMPT}[delivery]\nmax_response_body = \"1KiB\"\nrequest_timeout = \"10s\"\nmax_in_flight_per_host = 1\n"
        ),
    );
    let huge = send(&c, &rx.url("/huge"), "a").await;
    rx.wait_path("/huge").await;
    let ok = send(&c, &rx.url("/ok"), "b").await;
    wait_state(&c, &ok, "delivered").await;

    let v = first_attempt(&c, &huge).await;
    let took = assert_retried(&v);
    // Courier stopped reading at 1 KiB: the status decided at once, long before the
    // 10s request_timeout an endless read would end at.
    assert!(took < 5000, "the attempt took {took}ms: the endless body was read: {v}");
    assert_eq!(v["last_status"], 503, "classified by its status: {v}");
    // The sender was cut off: courier dropped the connection instead of draining it.
    let deadline = Instant::now() + WAIT;
    while rx.huge_written.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let written = rx.huge_written.load(Ordering::SeqCst);
    assert!(
        written > 0 && written < 256 << 20,
        "the receiver wrote {written} bytes before courier closed the connection"
    );

    // last_error: the status and the start of the body, capped, with nothing that could
    // disguise itself on a terminal.
    let err = v["last_error"].as_str().unwrap();
    assert!(err.starts_with("HTTP 503: [31mALERTline2evil|yyy"), "{err:?}");
    assert!(
        err.chars().count() <= "HTTP 503: ".len() + 200,
        "last_error is not capped ({} chars): {err:?}",
        err.chars().count()
    );
    assert!(
        !err.chars()
            .any(|ch| ch.is_control() || matches!(ch, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}')),
        "{err:?}"
    );
    assert_eq!(v["history"][0]["error"], err, "{v}");
}

#[tokio::test]
async fn redirects_are_failed_attempts_and_never_followed() {
    let elsewhere = Receiver::start().await;
    let to = elsewhere.url("/moved");
    let rx = Receiver::scripted(move |_, s| {
        let code: u16 = s.path.trim_start_matches('/').parse().unwrap();
        Reply::status(code).header("location", &to)
    })
    .await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), ONE_ATTEMPT);
    let mut ids = Vec::new();
    for code in [301u16, 302, 303, 307, 308] {
        ids.push((code, send(&c, &rx.url(&format!("/{code}")), "x").await));
    }
    for (code, id) in &ids {
        // Recorded only after the attempt ended: had courier followed the Location, the
        // second receiver would have been asked within that same attempt.
        let v = first_attempt(&c, id).await;
        assert_retried(&v);
        assert_eq!(v["last_status"], *code, "{v}");
    }
    assert_eq!(rx.seen().len(), 5);
    assert!(
        elsewhere.seen().is_empty(),
        "a redirect was followed: {:?}",
        elsewhere.seen().iter().map(|s| &s.path).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn an_idle_pooled_connection_is_closed_after_the_idle_timeout() {
    let rx = RawReceiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), "[delivery]\nidle_connection_timeout = \"1s\"\n");
    let id = send(&c, &rx.url("/ok"), "one").await;
    wait_state(&c, &id, "delivered").await;
    assert_eq!(rx.open.load(Ordering::SeqCst), 1, "kept for reuse after the answer");
    // No further request to this host: only the pool's own timer can close it.
    eventually("the idle connection closed by courier", || async {
        (rx.open.load(Ordering::SeqCst) == 0).then_some(())
    })
    .await;
    // And a later message opens a new one.
    let again = send(&c, &rx.url("/ok"), "two").await;
    wait_state(&c, &again, "delivered").await;
}

/// Courier's established TCP connections to any of `to`, read from `/proc/<pid>/net/tcp`
/// (its network namespace's IPv4 sockets; courier's ends are those whose remote address is
/// a receiver's). `None` where `/proc` cannot be read.
fn established_to(pid: u32, to: &[std::net::SocketAddr]) -> Option<usize> {
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).ok()?;
    // `AABBCCDD:PPPP`: the address as the kernel's in-memory u32 printed in hex (so in
    // host byte order), the port in hex.
    let parse = |field: &str| -> Option<std::net::SocketAddr> {
        let (ip, port) = field.split_once(':')?;
        let ip = u32::from_str_radix(ip, 16).ok()?.to_ne_bytes();
        Some((std::net::Ipv4Addr::from(ip), u16::from_str_radix(port, 16).ok()?).into())
    };
    let count = table
        .lines()
        .skip(1)
        .filter(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // cols[2] is the remote address, cols[3] the state: 01 is ESTABLISHED.
            cols.len() > 3 && cols[3] == "01" && parse(cols[2]).is_some_and(|remote| to.contains(&remote))
        })
        .count();
    Some(count)
}

/// Receivers on `n` distinct loopback hosts, the `i`th on `host(i)`.
async fn receivers_on(n: usize, host: impl Fn(usize) -> String) -> Vec<RawReceiver> {
    let mut hosts = Vec::new();
    for i in 0..n {
        hosts.push(RawReceiver::start_on(&host(i)).await);
    }
    hosts
}

/// One message to each host, all due at once; returns when every one is delivered.
async fn sweep(c: &Courier, hosts: &[RawReceiver]) {
    let mut ids = Vec::new();
    for h in hosts {
        ids.push(send(c, &h.url("/ok"), "sweep").await);
    }
    for id in &ids {
        wait_state(c, id, "delivered").await;
    }
}

#[tokio::test]
async fn idle_connections_over_all_hosts_are_capped_and_a_host_under_the_cap_reuses_its_own() {
    const CAP: u64 = 4;
    const HOSTS: usize = 16;
    // Distinct hosts: 127.0.0.2 to 127.0.0.17, each its own `host:port`.
    let hosts = receivers_on(HOSTS, |i| format!("127.0.0.{}", i + 2)).await;
    let addrs: Vec<_> = hosts.iter().map(|h| h.addr).collect();
    let d = tempfile::tempdir().unwrap();
    // An idle timeout far beyond the test: only the cap can close these connections.
    let c = Courier::start(
        d.path(),
        &format!("[delivery]\nmax_idle_connections = {CAP}\nidle_connection_timeout = \"10m\"\n"),
    );

    // Under the cap, a host's connection is kept and reused: two messages, one after the
    // other, one connection.
    for body in ["one", "two"] {
        let id = send(&c, &hosts[0].url("/ok"), body).await;
        wait_state(&c, &id, "delivered").await;
    }
    assert_eq!(hosts[0].paths(), ["/ok", "/ok"]);
    assert_eq!(
        (
            hosts[0].accepted.load(Ordering::SeqCst),
            hosts[0].open.load(Ordering::SeqCst)
        ),
        (1, 1),
        "the second message reused the first's connection"
    );

    // A sweep: one message to each host, all due at once.
    sweep(&c, &hosts).await;
    let accepted: u64 = hosts.iter().map(|h| h.accepted.load(Ordering::SeqCst)).sum();
    assert!(accepted >= HOSTS as u64, "each host was connected to: {accepted}");

    // Once every attempt has ended, courier holds at most the cap, seen from both ends.
    // Without the cap all 16 would stay open for the 10 minute idle timeout.
    let deadline = Instant::now() + WAIT;
    loop {
        let open: u64 = hosts.iter().map(|h| h.open.load(Ordering::SeqCst)).sum();
        let courier_side = established_to(c.pid(), &addrs);
        if open <= CAP && courier_side.is_none_or(|n| n as u64 <= CAP) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "courier holds {open} connections open to the receivers ({courier_side:?} established on its side), \
             over max_idle_connections = {CAP}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The cap keeps what it may: the hosts used last are not closed down to nothing.
    let open: u64 = hosts.iter().map(|h| h.open.load(Ordering::SeqCst)).sum();
    assert!(open >= 1, "every connection was closed: {open}");
}

#[tokio::test]
async fn beyond_the_64_idle_connections_used_last_a_sweeps_connections_close_soon_after_it() {
    // The documented number kept for `idle_connection_timeout` (under the default
    // max_idle_connections of 1024, which these never reach).
    const KEPT: u64 = 64;
    const HOSTS: usize = 80;
    // Distinct hosts: 127.0.1.1 to 127.0.1.80, each its own `host:port`.
    let hosts = receivers_on(HOSTS, |i| format!("127.0.1.{}", i + 1)).await;
    let addrs: Vec<_> = hosts.iter().map(|h| h.addr).collect();
    let d = tempfile::tempdir().unwrap();
    // An idle timeout far beyond the test: only the linger can close these connections.
    let c = Courier::start(d.path(), "[delivery]\nidle_connection_timeout = \"10m\"\n");
    sweep(&c, &hosts).await;
    let accepted: u64 = hosts.iter().map(|h| h.accepted.load(Ordering::SeqCst)).sum();
    assert_eq!(accepted, HOSTS as u64, "one connection to each host");

    // The sweep is over: courier comes down to the kept ones, seen from both ends, and
    // keeps those (closing one at a time, it never goes below).
    let open = eventually("courier down to the idle connections it keeps", || async {
        let open: u64 = hosts.iter().map(|h| h.open.load(Ordering::SeqCst)).sum();
        let courier_side = established_to(c.pid(), &addrs);
        (open <= KEPT && courier_side.is_none_or(|n| n as u64 <= KEPT)).then_some(open)
    })
    .await;
    assert_eq!(open, KEPT, "the connections of the hosts used last stay open");
}
