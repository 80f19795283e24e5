//! The one HTTP accept loop used by ingress and admin (over TCP or, for ingress, a Unix
//! domain socket), and the JSON answer helpers.
//!
//! Each connection speaks HTTP/1.1 or HTTP/2 with prior knowledge (h2c: the client sends
//! the HTTP/2 preface straight away, no `Upgrade`), told apart by its first bytes; apps
//! whose clients pool h2 connections use the same port as everyone else. There is no TLS,
//! so no ALPN and no `Upgrade: h2c` dance (hyper does not serve it, and clients that pool
//! h2 over cleartext use prior knowledge).
//!
//! Limits that protect courier from its callers live here: a header read timeout
//! (slowloris), a cap on header size, and a cap on concurrent connections (beyond it new
//! connections wait in the kernel's backlog), and a deadline for every state a connection
//! can be in ([`progress`]): idle for `idle_timeout` → closed gracefully (HTTP/2: GOAWAY),
//! so idle pooled clients cannot hold every slot; an answer the client takes none of for
//! `send_timeout` → dropped, so clients that never read cannot either. On stop the loop
//! closes its listener and lets open connections finish the request they are on, for up to
//! `drain_timeout`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder as AutoBuilder;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Semaphore};

use super::progress;

/// The body type of every answer.
pub type Body = Full<Bytes>;
/// A boxed handler future.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;
/// A request handler: the peer address and the request in, the answer out.
pub type Handler = Arc<dyn Fn(SocketAddr, Request<Incoming>) -> HandlerFuture + Send + Sync>;

/// Limits of one listener.
#[derive(Debug, Clone)]
pub struct ServeLimits {
    /// Time allowed to send the request head (HTTP/1.1), and the first bytes of a new
    /// connection (either protocol).
    pub header_read_timeout: Duration,
    /// Largest request head (bytes); for HTTP/2, the largest header list.
    pub max_header_bytes: usize,
    /// Connections served at once.
    pub max_connections: usize,
    /// Requests in progress at once, all connections together. HTTP/1.1 has one request
    /// in progress per connection, so the connection cap bounds it already; one HTTP/2
    /// connection carries up to 128, so without this a few clients could have far more
    /// requests (and bodies) in progress than connections. Past it a request is answered
    /// `503 overloaded` with `Retry-After: 1` at once.
    pub max_requests: usize,
    /// After stop, how long open connections may take to finish their request before they
    /// are closed (a stalled client must not hold up shutdown).
    pub drain_timeout: Duration,
    /// A connection with no request in progress this long is closed gracefully.
    pub idle_timeout: Duration,
    /// A connection whose client takes none of an answer this long is dropped (see
    /// [`progress`]).
    pub send_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 64 << 10,
            max_connections: 4096,
            max_requests: 4096,
            drain_timeout: Duration::from_secs(30),
            idle_timeout: crate::config::DEFAULT_IDLE_TIMEOUT,
            send_timeout: crate::config::DEFAULT_SEND_TIMEOUT,
        }
    }
}

/// A bound listener: TCP, or a Unix domain socket (ingress only).
#[derive(Debug)]
pub enum Listener {
    /// A TCP listener.
    Tcp(TcpListener),
    /// A Unix domain socket listener.
    Unix(UnixListener),
}

impl From<TcpListener> for Listener {
    fn from(l: TcpListener) -> Self {
        Listener::Tcp(l)
    }
}

/// The peer handed to handlers for a Unix socket connection: a socket has no IP address,
/// and only local processes that can open its file reach it, so it counts as loopback.
pub const UNIX_PEER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// Requests served at once on one HTTP/2 connection. The connection cap counts
/// connections, so this bounds what one client can have in progress; an HTTP/1.1 client
/// would need as many connections for as many requests.
const MAX_STREAMS_PER_CONNECTION: u32 = 128;

/// The HTTP/1.1 + HTTP/2 connection builder with `limits` applied to both protocols.
fn builder(limits: &ServeLimits) -> AutoBuilder<TokioExecutor> {
    let mut b = AutoBuilder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192));
    b.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        // A peer that vanished without a FIN would hold its connection slot forever: h2
        // connections are pooled and long-lived, and HTTP/1.1's header timeout does not
        // apply to them. Pings find it; an idle but live client is kept.
        .keep_alive_interval(Duration::from_secs(60))
        .keep_alive_timeout(Duration::from_secs(20));
    b
}

/// Serves `listener` with `handler` until `stop` turns true, then waits for open
/// connections to finish their current request (each is closed gracefully: HTTP/2 gets a
/// GOAWAY), for up to `drain_timeout`.
pub async fn serve(
    listener: impl Into<Listener>,
    handler: Handler,
    limits: ServeLimits,
    mut stop: watch::Receiver<bool>,
) {
    let listener = listener.into();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let requests = Arc::new(Semaphore::new(limits.max_requests));
    let builder = builder(&limits);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = stop.changed() => break,
        };
        let conn = Conn {
            handler: handler.clone(),
            requests: requests.clone(),
            limits: limits.clone(),
            stop: stop.clone(),
            permit,
        };
        let accepted = tokio::select! {
            accepted = listener.accept(conn, &builder) => accepted,
            _ = stop.changed() => break,
        };
        if let Err(e) = accepted {
            // EMFILE and friends: back off briefly instead of spinning.
            tracing::warn!(error = %e, "accept failed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    drop(listener);
    // Every connection holds a slot until it ends: all slots back means all closed.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(limits.drain_timeout, slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!("connections still open at the end of the drain are left to close on their own");
    }
}

/// An HTTP/2 request as the handlers expect every request: origin-form.
///
/// hyper gives an HTTP/2 request an absolute URI built from `:scheme` and `:authority`,
/// which name courier itself. Left as is, ingress would read every HTTP/2 request as a
/// proxy (absolute-form) request addressed to courier, and the `Host` checks in
/// [`crate::inbound::access`] (skipped for absolute-form) would never run. So the URI keeps only its
/// path and query, and `:authority` becomes `Host` (RFC 9113 §8.3.1: they carry the same
/// thing) unless the client also sent a `Host`.
fn as_origin_form<B>(req: Request<B>) -> Request<B> {
    if req.version() != http::Version::HTTP_2 {
        return req;
    }
    let (mut parts, body) = req.into_parts();
    if let Some(authority) = parts.uri.authority() {
        if !parts.headers.contains_key(http::header::HOST) {
            if let Ok(host) = http::HeaderValue::from_str(authority.as_str()) {
                parts.headers.insert(http::header::HOST, host);
            }
        }
    }
    if let Some(pq) = parts.uri.path_and_query() {
        if let Ok(uri) = http::Uri::try_from(pq.as_str()) {
            parts.uri = uri;
        }
    }
    Request::from_parts(parts, body)
}

impl Listener {
    /// Accepts one connection and serves it as `conn` on a task of its own.
    async fn accept(&self, conn: Conn, builder: &AutoBuilder<TokioExecutor>) -> std::io::Result<()> {
        match self {
            Listener::Tcp(l) => {
                let (stream, peer) = l.accept().await?;
                let _ = stream.set_nodelay(true);
                tokio::spawn(conn.run(stream, peer, builder.clone()));
            }
            Listener::Unix(l) => {
                tokio::spawn(conn.run(l.accept().await?.0, UNIX_PEER, builder.clone()));
            }
        }
        Ok(())
    }
}

/// A stream that can say when its first bytes are there.
trait Readable: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Waits until a byte can be read (or the peer closed), without reading it.
    fn ready(&self) -> impl Future<Output = std::io::Result<()>> + Send;

    /// The TCP socket under it, if it is one (see [`TcpSocket`]).
    fn tcp_socket(&self) -> Option<TcpSocket> {
        None
    }
}

/// The descriptor of the TCP connection an HTTP/1 request came on, in the request's
/// extensions: a `CONNECT` tunnel tunes the socket it takes over (see `crate::intercept`).
/// The upgrade hands the connection to the tunnel, so the descriptor stays valid as long as
/// the tunnel holds it. (HTTP/2 requests carry none: their connection is not handed over.)
#[derive(Debug, Clone, Copy)]
pub struct TcpSocket(pub std::os::fd::RawFd);

/// Peeks one byte: readiness alone can be spurious, and must not consume what hyper reads.
fn peek_one(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    let mut byte = 0u8;
    // SAFETY: a one-byte buffer we own; MSG_PEEK leaves the data in the socket.
    let n = unsafe { libc::recv(fd, (&mut byte as *mut u8).cast(), 1, libc::MSG_PEEK) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

macro_rules! readable_by_peek {
    ($t:ty, $socket:expr) => {
        impl Readable for $t {
            fn tcp_socket(&self) -> Option<TcpSocket> {
                ($socket)(self)
            }

            async fn ready(&self) -> std::io::Result<()> {
                use std::os::fd::AsRawFd;
                loop {
                    self.readable().await?;
                    match self.try_io(tokio::io::Interest::READABLE, || peek_one(self.as_raw_fd())) {
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        other => return other,
                    }
                }
            }
        }
    };
}
readable_by_peek!(tokio::net::TcpStream, |s: &tokio::net::TcpStream| {
    use std::os::fd::AsRawFd;
    Some(TcpSocket(s.as_raw_fd()))
});
readable_by_peek!(tokio::net::UnixStream, |_: &tokio::net::UnixStream| None);

/// A TLS stream inside a tunnel: its handshake is done, so the first bytes are due now
/// (and the first head's timeout, counted from here, still applies).
impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Readable for tokio_rustls::server::TlsStream<S> {
    fn ready(&self) -> impl Future<Output = std::io::Result<()>> + Send {
        // Not an `async fn`: its future would hold `&self`, and a TLS stream is not `Sync`.
        std::future::ready(Ok(()))
    }
}

/// Serves the requests of one TLS connection inside a tunnel as a listener's connection
/// is served (its limits, idle timeout and graceful stop), holding `permit` until it ends;
/// each request takes one of `requests` while in progress.
pub async fn serve_tls<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    stream: tokio_rustls::server::TlsStream<S>,
    peer: SocketAddr,
    handler: Handler,
    limits: ServeLimits,
    requests: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let builder = builder(&limits);
    let conn = Conn {
        handler,
        requests,
        limits,
        stop,
        permit,
    };
    conn.run(stream, peer, builder).await
}

/// What one connection task needs: the slot it holds until it ends, and its limits.
struct Conn {
    handler: Handler,
    requests: Arc<Semaphore>,
    limits: ServeLimits,
    stop: watch::Receiver<bool>,
    permit: tokio::sync::OwnedSemaphorePermit,
}

impl Conn {
    /// Serves one connection; each request takes one of `requests` while its handler runs.
    /// The connection ends at the deadlines of [`progress`]: dropped when its first head is
    /// late or it stops taking its answers, closed gracefully when idle or at `stop`.
    async fn run<S: Readable>(self, stream: S, peer: SocketAddr, builder: AutoBuilder<TokioExecutor>) {
        let Conn {
            handler,
            requests,
            limits,
            mut stop,
            permit,
        } = self;
        let connected = tokio::time::Instant::now();
        let shared: progress::Shared = Arc::new(watch::Sender::new(progress::Activity::new(connected)));
        let mut seen = shared.subscribe();
        let counted = shared.clone();
        let socket = stream.tcp_socket();
        let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            // Only where a CONNECT takes the whole connection over (HTTP/1): an HTTP/2
            // tunnel is one stream of a connection that goes on without it. (Other requests
            // carry none: the first extension costs an allocation on the ingest path.)
            let takes_over = req.method() == http::Method::CONNECT && req.version() < http::Version::HTTP_2;
            if let Some(socket) = socket.filter(|_| takes_over) {
                req.extensions_mut().insert(socket);
            }
            let in_progress = progress::InProgress::enter(&counted);
            let handler = handler.clone();
            let slot = requests.clone().try_acquire_owned();
            async move {
                let resp = match slot {
                    Ok(_slot) => handler(peer, as_origin_form(req)).await,
                    Err(_) => overloaded(),
                };
                let unsent = in_progress.answered();
                Ok::<_, std::convert::Infallible>(resp.map(|body| progress::Answer::new(body, unsent)))
            }
        });
        let timeouts = progress::Timeouts {
            first_head: connected + limits.header_read_timeout,
            idle: limits.idle_timeout,
            send: limits.send_timeout,
            drain: limits.drain_timeout,
        };
        // Telling HTTP/1.1 from HTTP/2 waits for the first bytes, and HTTP/1.1's header
        // timeout only starts after that: without this, a client that connects and sends
        // nothing would hold its connection slot for good.
        if !matches!(
            tokio::time::timeout_at(timeouts.first_head, stream.ready()).await,
            Ok(Ok(()))
        ) {
            return;
        }
        let io = TokioIo::new(progress::Watched::new(stream, shared.clone()));
        // With upgrades: a `CONNECT` answered 2xx hands its connection to the tunnel.
        let conn = builder.serve_connection_with_upgrades(io, service);
        tokio::pin!(conn);
        let mut closing = None;
        loop {
            // Seen first, then read and armed in one step: a change after it finds the
            // timer set (or wakes this task), one before it is in what is read.
            seen.borrow_and_update();
            let now = tokio::time::Instant::now();
            let mut wake = None;
            shared.send_if_modified(|a| {
                wake = progress::wake_at(a, closing, &timeouts, now);
                a.armed = wake;
                false
            });
            tokio::select! {
                _ = &mut conn => break,
                _ = seen.changed() => {}
                _ = stop.changed(), if closing.is_none() => {
                    conn.as_mut().graceful_shutdown();
                    closing = Some(progress::Closing::Stop(tokio::time::Instant::now()));
                }
                _ = tokio::time::sleep_until(wake.unwrap_or(timeouts.first_head)), if wake.is_some() => {
                    // Changes that only put a deadline off wake no one: look again now.
                    let (now, activity) = (tokio::time::Instant::now(), *seen.borrow_and_update());
                    match progress::next_deadline(&activity, closing, &timeouts) {
                        Some((at, progress::Action::Close)) if at <= now => {
                            conn.as_mut().graceful_shutdown();
                            closing = Some(progress::Closing::Idle(now));
                        }
                        // Dropping the connection closes it and frees its slot.
                        Some((at, progress::Action::Drop)) if at <= now => break,
                        _ => {}
                    }
                }
            }
        }
        drop(permit);
    }
}

/// The answer past [`ServeLimits::max_requests`].
fn overloaded() -> Response<Body> {
    let message = "too many requests in progress on this listener; retry shortly";
    Refusal::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", message).response()
}

/// A refused request: its status, machine-readable code and sentence, answered in the one
/// error shape ([`error`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl Refusal {
    /// A refusal with `status`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        let message = message.into();
        Refusal { status, code, message }
    }

    /// A `400 Bad Request` refusal.
    pub fn bad(code: &'static str, message: impl Into<String>) -> Self {
        Refusal::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// The answer; a 503 says when to retry: 1 s when `overloaded` (capacity frees as
    /// requests end), else 5 s.
    pub fn response(&self) -> Response<Body> {
        let mut resp = error(self.status, self.code, self.message.clone());
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            let wait = if self.code == "overloaded" { "1" } else { "5" };
            resp.headers_mut()
                .insert(http::header::RETRY_AFTER, http::HeaderValue::from_static(wait));
        }
        resp
    }

    /// The machine-readable code of the answer.
    pub fn code(&self) -> &'static str {
        self.code
    }
}

/// A JSON answer: a `serde_json::Value`, or a struct serialised straight from its fields.
pub fn json(status: StatusCode, value: &impl serde::Serialize) -> Response<Body> {
    let body = serde_json::to_string(value).expect("JSON values and string-keyed structs serialise");
    text(status, "application/json", body)
}

/// The one error shape: `{"error": "<code>", "message": "<sentence>"}`.
pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response<Body> {
    json(status, &serde_json::json!({ "error": code, "message": message.into() }))
}

/// A plain-text answer.
pub fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, http::HeaderValue::from_static(content_type))
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

/// An empty answer.
pub fn empty(status: StatusCode) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(Full::new(Bytes::new()))
        .expect("static response parts are valid")
}

#[cfg(test)]
#[path = "serve_tests.rs"]
mod tests;
