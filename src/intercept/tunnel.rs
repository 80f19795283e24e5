//! The two kinds of tunnel once their `CONNECT` is answered: an intercepted one (TLS
//! terminated, requests served by ingress as absolute-form `https://` requests) and a
//! passthrough one (bytes copied to the checked address until either side is done, the
//! tunnel is idle, or courier stops).
//!
//! Either is checked again at each reload against what it was admitted under
//! ([`Admitted`]): one the new settings revoke is closed (an intercepted one as a stop
//! closes it, the request in progress answered first), and each request inside an
//! intercepted tunnel is checked too, so none is served under a revoked token even while
//! the close is under way.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::TokioIo;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit};

use super::admitted::Admitted;
use super::{Intercept, Target};
use crate::inbound::ingress::Tunnelled;
use crate::inbound::serve::{self, Handler, Refusal, TcpSocket};
use crate::metrics::{Metrics, TunnelKind};
use crate::outbound::egress::EgressDenied;
use crate::outbound::proxy::Egress;
use crate::outbound::resolver::GuardedResolver;

/// Counts a tunnel open in the metrics until dropped.
struct Open(Arc<Metrics>, TunnelKind);

impl Open {
    fn new(intercept: &Intercept, kind: TunnelKind) -> Open {
        let metrics = intercept.parts.ctx.metrics().clone();
        metrics.tunnel(kind, true);
        Open(metrics, kind)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.tunnel(self.1, false);
    }
}

/// The connection a `CONNECT` answered 200 hands over (with its socket, when HTTP/1 gave
/// it), counted open as a tunnel of `kind` until the returned guard drops; `None` when the
/// client left before the upgrade.
async fn take_over(
    this: &Intercept,
    req: Request<Incoming>,
    kind: TunnelKind,
) -> Option<(TokioIo<hyper::upgrade::Upgraded>, Option<TcpSocket>, Open)> {
    let socket = req.extensions().get::<TcpSocket>().copied();
    let upgraded = hyper::upgrade::on(req).await.ok()?;
    Some((TokioIo::new(upgraded), socket, Open::new(this, kind)))
}

/// Serves an intercepted tunnel: the client's TLS handshake (within the header timeout),
/// then its requests, each addressed to `https://<target><path>`.
pub(super) async fn intercepted(
    this: Arc<Intercept>,
    req: Request<Incoming>,
    tls: Arc<ServerConfig>,
    target: Target,
    peer: SocketAddr,
    permit: OwnedSemaphorePermit,
    standing: Standing,
) {
    let Some((client, socket, _open)) = take_over(&this, req, TunnelKind::Intercept).await else {
        return;
    };
    let limits = this.parts.limits.clone();
    let io = End {
        inner: client,
        socket,
        watch: None,
    };
    let accepting = tokio_rustls::TlsAcceptor::from(tls).accept(io);
    let stream = match tokio::time::timeout(limits.header_read_timeout, accepting).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return this.tls_failed(peer.ip(), &target, &e),
        Err(_) => return,
    };
    // Turned true at stop or revocation: the connection is then closed as a stop closes it.
    let close = Arc::new(watch::Sender::new(false));
    let (ingress, closing) = (this.parts.ingress.clone(), close.clone());
    let ctx = this.parts.ctx.clone();
    let admitted = standing.admitted.clone();
    let authority = Arc::<str>::from(target.authority.as_str());
    let handler: Handler = Arc::new(move |peer, req: Request<Incoming>| -> serve::HandlerFuture {
        if let Err(revoked) = admitted.check(&ctx.settings()) {
            closing.send_replace(true);
            return Box::pin(std::future::ready(ingress.refuse(revoked.refusal())));
        }
        let req = addressed(req, &authority);
        Box::pin(ingress.clone().handle(peer, req))
    });
    let requests = this.requests.clone();
    let serving = serve::serve_tls(stream, peer, handler, limits, requests, close.subscribe(), permit);
    let watching = async {
        standing.lost(&this, &target, TunnelKind::Intercept).await;
        close.send_replace(true);
        // The connection ends the tunnel, once closed.
        std::future::pending::<()>().await
    };
    tokio::select! {
        _ = serving => {}
        _ = watching => {}
    }
}

/// What a tunnel was admitted under, and the reloads that may revoke it (subscribed to
/// before the admission's last check, so none falls between).
pub(super) struct Standing {
    admitted: Admitted,
    reloads: watch::Receiver<u64>,
}

impl Standing {
    /// The standing of a tunnel about to open; refused when the settings now revoke it (a
    /// reload since the checks before read them).
    pub(super) fn checked(
        admitted: Admitted,
        reloads: watch::Receiver<u64>,
        ctx: &crate::context::Context,
    ) -> Result<Standing, Refusal> {
        admitted.check(&ctx.settings()).map_err(|r| r.refusal())?;
        Ok(Standing { admitted, reloads })
    }

    /// Returns when courier stops, or when a reload revokes the tunnel (said on one line).
    async fn lost(mut self, this: &Intercept, target: &Target, kind: TunnelKind) {
        let mut stop = this.parts.stop.clone();
        loop {
            let reloaded = tokio::select! {
                _ = stop.wait_for(|stopped| *stopped) => return,
                changed = self.reloads.changed() => changed.is_ok(),
            };
            if !reloaded {
                // No more reloads can come.
                return std::future::pending().await;
            }
            let settings = this.parts.ctx.settings();
            if let Err(revoked) = self.admitted.check(&settings) {
                tracing::info!(host = %target.host, kind = ?kind, reason = %revoked,
                    "a reload revoked an open tunnel; closing it");
                return;
            }
        }
    }
}

/// One end of a tunnel. The client's end asks the kernel to acknowledge each segment at
/// once (`TCP_QUICKACK`, set again before every read: the kernel drops back to delayed
/// acknowledgements on its own); in a passthrough tunnel both ends also note when a byte
/// last moved, for the idle watchdog.
///
/// Why the acknowledgements: clients write a request inside TLS as two records, head then
/// body (Python's urllib3 does), and some leave Nagle's algorithm on for a tunnel's socket
/// (urllib3 sets `TCP_NODELAY` only on the connections it makes itself). The body then
/// waits for the head's acknowledgement, which a delayed ACK holds back 40 ms while courier
/// waits for the body: measured, 44 ms per request against 1 ms in the prefix form.
/// Outside a tunnel, such clients send on a socket with `TCP_NODELAY` and none of this
/// happens.
struct End<T> {
    inner: T,
    socket: Option<TcpSocket>,
    watch: Option<Watch>,
}

/// When a byte last moved through a tunnel (ms since `start`), and since when each end's
/// writes have waited for its peer to read (ms since `start` + 1; 0: not waiting), shared
/// by its two ends; `side` is the end this copy belongs to.
#[derive(Clone)]
struct Watch {
    start: tokio::time::Instant,
    seen: Arc<AtomicU64>,
    blocked: Arc<[AtomicU64; 2]>,
    /// Woken when a write starts to wait: its deadline may be the next one.
    wake: Arc<tokio::sync::Notify>,
    side: usize,
}

impl Watch {
    fn new() -> Self {
        Watch {
            start: tokio::time::Instant::now(),
            seen: Arc::new(AtomicU64::new(0)),
            blocked: Arc::new([AtomicU64::new(0), AtomicU64::new(0)]),
            wake: Arc::new(tokio::sync::Notify::new()),
            side: 0,
        }
    }

    /// The same watch, for the other end.
    fn other_end(&self) -> Self {
        Watch {
            side: 1 - self.side,
            ..self.clone()
        }
    }

    fn moved(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.seen.fetch_max(ms, Ordering::Relaxed);
    }

    fn last(&self) -> tokio::time::Instant {
        self.start + std::time::Duration::from_millis(self.seen.load(Ordering::Relaxed))
    }

    /// Notes what this end's write came to: waiting for the peer, or moving.
    fn wrote<T>(&self, polled: &Poll<std::io::Result<T>>) {
        let slot = &self.blocked[self.side];
        match polled {
            Poll::Pending if slot.load(Ordering::Relaxed) == 0 => {
                slot.store(self.start.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
                self.wake.notify_one();
            }
            Poll::Ready(_) => slot.store(0, Ordering::Relaxed),
            Poll::Pending => {}
        }
    }

    /// When the tunnel ends unless something moves: no byte either way for `idle`, or a
    /// write its peer has not taken for `send`.
    fn deadline(&self, idle: std::time::Duration, send: std::time::Duration) -> tokio::time::Instant {
        let stalled = self
            .blocked
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .filter(|&ms| ms > 0)
            .min();
        let idle_end = self.last() + idle;
        stalled.map_or(idle_end, |ms| {
            idle_end.min(self.start + std::time::Duration::from_millis(ms - 1) + send)
        })
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for End<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(TcpSocket(fd)) = self.socket {
            let on: libc::c_int = 1;
            // SAFETY: `fd` is the socket `inner` owns (HTTP/1 handed the connection over
            // whole; it closes only when `inner` is dropped, after this), and `on` is a
            // c_int of the size passed. A failure only leaves delayed ACKs on.
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_QUICKACK,
                    (&on as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Some(watch) = self.watch.as_ref().filter(|_| buf.filled().len() > before) {
            watch.moved();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for End<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Some(watch) = &self.watch {
            if let Poll::Ready(Ok(1..)) = &polled {
                watch.moved();
            }
            watch.wrote(&polled);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// `req` as the absolute-form request it stands for (`https://<authority><path>`), marked
/// as coming through an admitted tunnel.
fn addressed<B>(req: Request<B>, authority: &str) -> Request<B> {
    let (mut parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    if let Ok(uri) = http::Uri::try_from(format!("https://{authority}{path}")) {
        parts.uri = uri;
    }
    parts.extensions.insert(Tunnelled);
    Request::from_parts(parts, body)
}

/// Connects to a passthrough target under the egress policy: an IP literal checked, a
/// name resolved and its address checked (the socket goes to that address), through
/// `egress.proxy` when it applies, as delivery connects. `admitted` comes back with the
/// address and the policy, for the checks at later reloads.
pub(super) async fn dial(
    this: &Intercept,
    target: &Target,
    admitted: Admitted,
) -> Result<(TcpStream, Admitted), Refusal> {
    let settings = this.parts.ctx.settings();
    let guard = GuardedResolver::new(this.parts.resolver.clone(), Arc::new(settings.egress.clone()));
    let failed = |e: crate::outbound::BoxError| {
        // The policy's refusal may sit under the connector's own error.
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e.as_ref());
        let mut reasons = Vec::new();
        while let Some(err) = source {
            if let Some(denied) = err.downcast_ref::<EgressDenied>() {
                return Refusal::new(http::StatusCode::FORBIDDEN, "egress_denied", denied.to_string());
            }
            reasons.push(err.to_string());
            source = err.source();
        }
        reasons.dedup();
        let message = format!("cannot connect to {}: {}", target.authority, reasons.join(": "));
        Refusal::new(http::StatusCode::BAD_GATEWAY, "tunnel_failed", message)
    };
    let literal = target.host.parse().ok();
    if let Some(ip) = literal {
        guard.check(ip).map_err(|e| failed(Box::new(e)))?;
    }
    let egress = Egress::new(
        guard,
        this.parts.resolver.clone(),
        this.proxy.clone(),
        this.connect_timeout,
    );
    let uri: http::Uri = format!("https://{}/", target.authority)
        .parse()
        .map_err(|_| Refusal::bad("invalid_target", "CONNECT needs a host:port target"))?;
    let proxied = this.proxy.as_ref().is_some_and(|p| p.intercepts(&uri));
    // Bounded as a whole: a proxy that never answers the CONNECT must not hold the
    // request (and its tunnel slot) forever.
    let connecting = tokio::time::timeout(this.connect_timeout, egress.connect(uri));
    let (io, _) = connecting
        .await
        .map_err(|_| failed(format!("no connection within {:?}", this.connect_timeout).into()))?
        .map_err(failed)?;
    let stream = io.into_inner();
    // Direct, the peer is the address the policy checked; through a proxy, only a literal
    // is known.
    let direct = (!proxied).then(|| stream.peer_addr().ok().map(|a| a.ip())).flatten();
    let admitted = admitted.dialled(literal.or(direct), &settings.egress);
    Ok((stream, admitted))
}

/// Copies a passthrough tunnel's bytes both ways, until done, idle, stopped or revoked.
pub(super) async fn passthrough(
    this: Arc<Intercept>,
    req: Request<Incoming>,
    upstream: TcpStream,
    _permit: OwnedSemaphorePermit,
    target: Target,
    standing: Standing,
) {
    let Some((client, socket, _open)) = take_over(&this, req, TunnelKind::Passthrough).await else {
        return;
    };
    // The same client, the same split writes: acknowledged at once here too.
    tokio::select! {
        _ = copy_until_idle(client, socket, upstream, (this.idle_timeout, this.parts.limits.send_timeout)) => {}
        _ = standing.lost(&this, &target, TunnelKind::Passthrough) => {}
    }
}

/// Copies `a` (the client, on `a_socket`) ↔ `b`, both ways at once, until both sides have
/// finished sending (each end's write side is shut when the other's read ends), an error,
/// no byte either way for `idle`, or a write that waited `send` for its peer to read (a
/// peer that stops reading would otherwise hold the tunnel while the other way flows).
async fn copy_until_idle<A, B>(
    a: A,
    a_socket: Option<TcpSocket>,
    b: B,
    (idle, send): (std::time::Duration, std::time::Duration),
) where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let watch = Watch::new();
    let mut a = End {
        inner: a,
        socket: a_socket,
        watch: Some(watch.clone()),
    };
    let mut b = End {
        inner: b,
        socket: None,
        watch: Some(watch.other_end()),
    };
    let copying = tokio::io::copy_bidirectional(&mut a, &mut b);
    tokio::pin!(copying);
    loop {
        // A timer to the nearest deadline; on waking, what moved since puts it off.
        tokio::select! {
            _ = &mut copying => return,
            _ = watch.wake.notified() => {}
            _ = tokio::time::sleep_until(watch.deadline(idle, send)) => {
                if watch.deadline(idle, send) <= tokio::time::Instant::now() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "tunnel_tests.rs"]
mod tests;
