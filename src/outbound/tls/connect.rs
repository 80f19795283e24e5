//! The TLS step of an outbound connection: for an `https` target the rustls handshake runs
//! over the connection the egress route made (a TCP connection, or a CONNECT tunnel through
//! `egress.proxy`), with the `ClientConfig` the [`TlsMaterial`] holds for the target's
//! `host:port` and the target's name as SNI; `http` targets pass through. ALPN offers h2 and
//! http/1.1, and a connection that agreed on h2 says so to hyper, as `hyper_rustls` did
//! before per-host configs needed a connector of our own.

use std::io;
use std::sync::Arc;

use http::Uri;
use hyper::rt::{Read, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;

use super::TlsMaterial;
use crate::outbound::conn_cap::host_key;
use crate::outbound::BoxError;

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

/// What a connection to `uri` takes from TLS: the server name and config of an `https`
/// target (`None` for `http`).
pub type Handshake = Option<(ServerName<'static>, Arc<ClientConfig>)>;

/// A connection as hyper gets it: as the egress route made it, or under TLS.
pub type MaybeTls = TokioIo<Box<dyn Io>>;

impl TlsMaterial {
    /// The handshake a connection to `uri` will need; refused (before connecting) for a
    /// scheme other than `http`/`https` or a host that is no server name.
    pub fn handshake_for(&self, uri: &Uri) -> Result<Handshake, BoxError> {
        match uri.scheme_str() {
            Some("http") => Ok(None),
            Some("https") => {
                let host = uri.host().unwrap_or_default();
                // An IPv6 literal keeps its brackets in a URI; SNI and verification take
                // the bare address.
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                let name = ServerName::try_from(bare.to_string())
                    .map_err(|_| TlsError(format!("{host:?} is not a valid server name")))?;
                let key = host_key(uri).unwrap_or_default();
                Ok(Some((name, self.for_host(&key))))
            }
            other => Err(format!("unsupported scheme {other:?}").into()),
        }
    }
}

/// Runs `handshake` (when there is one) over `io`.
pub async fn connect<T>(handshake: Handshake, io: T) -> Result<MaybeTls, TlsError>
where
    T: Read + Write + Connection + Unpin + Send + 'static,
{
    let io: Box<dyn Io> = match handshake {
        None => Box::new(TokioIo::new(io)),
        Some((name, config)) => Box::new(
            tokio_rustls::TlsConnector::from(config)
                .connect(name, TokioIo::new(io))
                .await
                .map_err(TlsError::from_io)?,
        ),
    };
    Ok(TokioIo::new(io))
}

/// Either kind of connection, which says what it is to hyper.
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {
    /// What hyper is told about the connection.
    fn connected(&self) -> Connected;
}

impl Connection for Box<dyn Io> {
    fn connected(&self) -> Connected {
        (**self).connected()
    }
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
