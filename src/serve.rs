//! The one HTTP accept loop used by ingress and admin (over TCP or, for ingress, a Unix
//! domain socket), and the JSON answer helpers.
//!
//! Limits that protect courier from its callers live here: a header read timeout
//! (slowloris), a cap on header size, and a cap on concurrent connections (beyond it new
//! connections wait in the kernel's backlog). On stop the loop closes its listener and lets
//! open connections finish the request they are on.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Semaphore};

/// The body type of every answer.
pub type Body = Full<Bytes>;
/// A boxed handler future.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Response<Body>> + Send>>;
/// A request handler: the peer address and the request in, the answer out.
pub type Handler = Arc<dyn Fn(SocketAddr, Request<Incoming>) -> HandlerFuture + Send + Sync>;

/// Limits of one listener.
#[derive(Debug, Clone)]
pub struct ServeLimits {
    /// Time allowed to send the request head.
    pub header_read_timeout: Duration,
    /// Largest request head (bytes).
    pub max_header_bytes: usize,
    /// Connections served at once.
    pub max_connections: usize,
    /// After stop, how long open connections may take to finish their request before they
    /// are closed (a stalled client must not hold up shutdown).
    pub drain_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            header_read_timeout: Duration::from_secs(10),
            max_header_bytes: 64 << 10,
            max_connections: 4096,
            drain_timeout: Duration::from_secs(30),
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

/// Serves `listener` with `handler` until `stop` turns true, then waits for open
/// connections to finish their current request.
pub async fn serve(
    listener: impl Into<Listener>,
    handler: Handler,
    limits: ServeLimits,
    mut stop: watch::Receiver<bool>,
) {
    let listener = listener.into();
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = stop.changed() => break,
        };
        let accepted = tokio::select! {
            accepted = accept(&listener) => accepted,
            _ = stop.changed() => break,
        };
        match accepted {
            Ok(Accepted::Tcp(stream, peer)) => {
                let _ = stream.set_nodelay(true);
                spawn_conn(stream, peer, &handler, &limits, &graceful, permit);
            }
            Ok(Accepted::Unix(stream)) => spawn_conn(stream, UNIX_PEER, &handler, &limits, &graceful, permit),
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    drop(listener);
    if tokio::time::timeout(limits.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open at the end of the drain were closed");
    }
}

/// One accepted connection.
enum Accepted {
    Tcp(tokio::net::TcpStream, SocketAddr),
    Unix(tokio::net::UnixStream),
}

async fn accept(listener: &Listener) -> std::io::Result<Accepted> {
    match listener {
        Listener::Tcp(l) => l.accept().await.map(|(s, peer)| Accepted::Tcp(s, peer)),
        Listener::Unix(l) => l.accept().await.map(|(s, _)| Accepted::Unix(s)),
    }
}

/// Serves one connection on its own task; the permit is its connection slot.
fn spawn_conn<S>(
    stream: S,
    peer: SocketAddr,
    handler: &Handler,
    limits: &ServeLimits,
    graceful: &hyper_util::server::graceful::GracefulShutdown,
    permit: tokio::sync::OwnedSemaphorePermit,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let handler = handler.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let handler = handler.clone();
        async move { Ok::<_, std::convert::Infallible>(handler(peer, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .serve_connection(TokioIo::new(stream), service);
    let conn = graceful.watch(conn);
    tokio::spawn(async move {
        let _ = conn.await;
        drop(permit);
    });
}

/// A JSON answer.
pub fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(value.to_string())))
        .expect("static response parts are valid")
}

/// The one error shape: `{"error": "<code>", "message": "<sentence>"}`.
pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response<Body> {
    json(status, &serde_json::json!({ "error": code, "message": message.into() }))
}

/// A plain-text answer.
pub fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
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
