//! The real transport: a pooled hyper-util client over tokio-rustls (the roots, CAs and
//! client certificates of `crate::tls`, ALPN h2 and http/1.1), with the egress policy
//! enforced where connections are made.
//!
//! The connector, outermost first: [`TlsConnector`] (TLS for https targets, per-host
//! config read from the swappable [`TlsHandle`]) → [`CappedConnector`] (counts the
//! connection under the target's `host:port`) → TCP through [`GuardedResolver`].
//!
//! Host names are resolved through the [`Resolve`] seam by [`GuardedResolver`], which drops
//! every address the policy refuses before the connector sees it, so the socket is opened
//! to exactly an address that was checked, on every attempt (a later DNS answer pointing
//! at a private address is refused too). IP-literal targets never reach a resolver, so
//! [`HttpTransport::send`] checks them itself before sending.
//!
//! Idle pooled connections are bounded per host by hyper-util's pool and, all hosts
//! together, by [`crate::conn_cap`] (`delivery.max_idle_connections`).

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::conn_cap::{CappedConnector, ConnCap};
use crate::egress::{literal_ip, EgressDenied, EgressPolicy};
pub use crate::resolver::GuardedResolver;
use crate::resolver::Resolve;
use crate::tls::{TlsConnector, TlsHandle};
use crate::transport::{InboundResponse, OutboundRequest, SendFuture, Transport, TransportError};

/// Settings of the HTTP client.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    /// Bound on TCP connect.
    pub connect_timeout: Duration,
    /// How much of a response body is kept.
    pub max_response_body: usize,
    /// Idle connections kept per host.
    pub pool_max_idle_per_host: usize,
    /// How long a pooled connection may sit idle before it is closed.
    pub idle_timeout: Duration,
    /// Idle connections kept, all hosts together (see [`crate::conn_cap`]).
    pub max_idle_connections: usize,
}

type HttpsClient = Client<TlsConnector<CappedConnector<HttpConnector<GuardedResolver>>>, Full<Bytes>>;

/// The production [`Transport`].
pub struct HttpTransport {
    client: HttpsClient,
    policy: Arc<EgressPolicy>,
    settings: ClientSettings,
    cap: Arc<ConnCap>,
}

impl HttpTransport {
    /// Builds the client: TLS from `tls` (read at each new connection, so swapping its
    /// material applies to the connections made from then on).
    pub fn new(settings: ClientSettings, policy: EgressPolicy, resolver: Arc<dyn Resolve>, tls: TlsHandle) -> Self {
        let policy = Arc::new(policy);
        let guard = GuardedResolver::new(resolver, policy.clone());
        let egress = tcp(guard, settings.connect_timeout);
        // Under TLS, so the cap counts and closes the TCP connection itself.
        let cap = ConnCap::new(settings.max_idle_connections);
        let https = TlsConnector::new(CappedConnector::new(egress, cap.clone()), tls);
        // With a timer the pool closes idle connections when their time is up; without one
        // it only noticed at the next checkout for the same host, so a sweep over many
        // hosts left a socket open to each of them for good.
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(hyper_util::rt::TokioTimer::new())
            .pool_idle_timeout(settings.idle_timeout)
            .pool_max_idle_per_host(settings.pool_max_idle_per_host)
            .build(https);
        HttpTransport {
            client,
            policy,
            settings,
            cap,
        }
    }

    async fn attempt(&self, req: OutboundRequest) -> Result<InboundResponse, TransportError> {
        if let Some(ip) = literal_ip(&req.url) {
            self.policy
                .check(ip)
                .map_err(|d| TransportError::EgressDenied(d.to_string()))?;
        }
        let mut builder = http::Request::builder().method(req.method).uri(req.url.as_str());
        for (name, value) in &req.headers {
            builder = builder.header(name.as_str(), value.as_slice());
        }
        let request = builder
            .body(Full::new(req.body))
            .map_err(|e| TransportError::Network(e.to_string()))?;
        // Held until the body is read: while any request to a host runs, the cap leaves the
        // host's connections alone; its end is when an idle one may be closed.
        let _busy = self.cap.begin(request.uri());
        let response = self.client.request(request).await.map_err(classify_error)?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut body = response.into_body();
        let mut kept = BytesMut::new();
        // Read only what we keep; the rest is dropped with the connection.
        while kept.len() < self.settings.max_response_body {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        let room = self.settings.max_response_body - kept.len();
                        kept.extend_from_slice(&data[..data.len().min(room)]);
                    }
                }
                // The status is what decides; a body cut short does not change it.
                Some(Err(_)) | None => break,
            }
        }
        // The body goes first (its connection back to the pool, or closed when cut short),
        // then the guard: the request is over when the cap looks at the idle total.
        drop(body);
        Ok(InboundResponse {
            status,
            retry_after,
            body: kept.freeze(),
        })
    }
}

/// A TCP connector through `resolver`, as every outbound connection is made.
fn tcp<R>(resolver: R, connect_timeout: Duration) -> HttpConnector<R> {
    let mut http = HttpConnector::new_with_resolver(resolver);
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    http
}

impl Transport for HttpTransport {
    fn send(&self, req: OutboundRequest) -> SendFuture<'_> {
        Box::pin(async move {
            // The message's policy's request_timeout (delivery.request_timeout unless its
            // route or endpoint says otherwise).
            let limit = req.timeout;
            match tokio::time::timeout(limit, self.attempt(req)).await {
                Ok(result) => result,
                Err(_) => Err(TransportError::Timeout(format!(
                    "no complete response within {}ms",
                    limit.as_millis()
                ))),
            }
        })
    }
}

/// Maps a client error to a transport error, finding an egress refusal or a timeout
/// anywhere in its cause chain.
fn classify_error(err: hyper_util::client::legacy::Error) -> TransportError {
    let mut parts = vec![err.to_string()];
    let mut source: Option<&(dyn StdError + 'static)> = err.source();
    let mut timed_out = false;
    while let Some(e) = source {
        if let Some(denied) = e.downcast_ref::<EgressDenied>() {
            return TransportError::EgressDenied(denied.to_string());
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            timed_out |= io.kind() == std::io::ErrorKind::TimedOut;
        }
        let text = e.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        source = e.source();
    }
    let message = parts.join(": ");
    if timed_out {
        TransportError::Timeout(message)
    } else {
        TransportError::Network(message)
    }
}
