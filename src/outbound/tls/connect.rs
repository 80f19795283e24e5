//! The TLS layer of the outbound connector: for an `https` target it runs the rustls
//! handshake over whatever the inner connector returned (a TCP connection, or a CONNECT
//! tunnel through `egress.proxy`), with the `ClientConfig` the current [`TlsMaterial`]
//! holds for the target's `host:port` and the target's name as SNI; `http` targets pass
//! through. ALPN offers h2 and http/1.1, and a connection that agreed on h2 says so to
//! hyper, as `hyper_rustls` did before per-host configs needed a connector of our own.
//!
//! [`TlsMaterial`]: super::TlsMaterial

use std::error::Error as StdError;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;

use super::TlsHandle;
use crate::outbound::conn_cap::host_key;

type BoxError = Box<dyn StdError + Send + Sync>;

/// Wraps a connector with TLS for `https` targets (see the module docs).
#[derive(Clone)]
pub struct TlsConnector<C> {
    inner: C,
    material: TlsHandle,
}

impl<C> TlsConnector<C> {
    /// TLS over `inner`'s connections, configured by the material `material` holds at
    /// each connection's start.
    pub fn new(inner: C, material: TlsHandle) -> Self {
        TlsConnector { inner, material }
    }
}

/// Why a TLS handshake failed: `tls: <rustls's reason>` (e.g. `tls: invalid peer
/// certificate: UnknownIssuer`), the text an attempt's error shows.
#[derive(Debug, thiserror::Error)]
#[error("tls: {0}")]
pub struct TlsError(String);

impl TlsError {
    fn from_io(e: io::Error) -> TlsError {
        // tokio-rustls carries rustls's own error inside the io::Error; its text is the
        // precise reason (UnknownIssuer, NotValidForName, an alert from the receiver, ...).
        match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
            Some(tls) => TlsError(tls.to_string()),
            None => TlsError(format!("handshake failed: {e}")),
        }
    }
}

impl<C> tower_service::Service<Uri> for TlsConnector<C>
where
    C: tower_service::Service<Uri>,
    C::Response: Read + Write + Connection + Unpin + Send + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = MaybeTls;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = match uri.scheme_str() {
            Some("http") => None,
            Some("https") => {
                let host = uri.host().unwrap_or_default();
                // An IPv6 literal keeps its brackets in a URI; SNI and verification take
                // the bare address.
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                let name = match ServerName::try_from(bare.to_string()) {
                    Ok(name) => name,
                    Err(_) => {
                        let e = TlsError(format!("{host:?} is not a valid server name"));
                        return Box::pin(async move { Err(Box::new(e) as BoxError) });
                    }
                };
                let key = host_key(&uri).unwrap_or_default();
                Some((name, self.material.current().for_host(&key)))
            }
            other => {
                let e = format!("unsupported scheme {other:?}");
                return Box::pin(async move { Err(e.into()) });
            }
        };
        let connecting = self.inner.call(uri);
        Box::pin(async move {
            let io = connecting.await.map_err(Into::into)?;
            let io: Box<dyn Io> = match tls {
                None => Box::new(TokioIo::new(io)),
                Some((name, config)) => Box::new(
                    tokio_rustls::TlsConnector::from(config)
                        .connect(name, TokioIo::new(io))
                        .await
                        .map_err(TlsError::from_io)?,
                ),
            };
            Ok(MaybeTls { io: TokioIo::new(io) })
        })
    }
}

/// A connection made by [`TlsConnector`]: as the inner connector made it, or under TLS.
pub struct MaybeTls {
    io: TokioIo<Box<dyn Io>>,
}

/// Either kind of connection, which says what it is to hyper.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {
    fn connected(&self) -> Connected;
}

impl<T: Read + Write + Connection + Unpin + Send> Io for TokioIo<T> {
    fn connected(&self) -> Connected {
        self.inner().connected()
    }
}

impl<T: Read + Write + Connection + Unpin + Send> Io for tokio_rustls::client::TlsStream<TokioIo<T>> {
    fn connected(&self) -> Connected {
        let (io, session) = self.get_ref();
        let connected = io.inner().connected();
        if session.alpn_protocol() == Some(b"h2") {
            connected.negotiated_h2()
        } else {
            connected
        }
    }
}

impl Connection for MaybeTls {
    fn connected(&self) -> Connected {
        self.io.inner().connected()
    }
}

impl Read for MaybeTls {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

write_through!([] MaybeTls, |_: &MaybeTls| None);
