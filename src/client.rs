//! The real transport: a pooled hyper-util client over tokio-rustls (webpki roots, ALPN h2
//! and http/1.1), with the egress policy enforced where connections are made.
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
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::conn_cap::{CappedConnector, ConnCap};
use crate::egress::{is_loopback_name, literal_ip, EgressDenied, EgressPolicy, LOOPBACK_NAME_ADDRS};
use crate::resolver::Resolve;
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

/// A resolver service for hyper-util's connector that applies the egress policy to
/// every resolved address.
#[derive(Clone)]
pub struct GuardedResolver {
    inner: Arc<dyn Resolve>,
    policy: Arc<EgressPolicy>,
}

impl tower_service::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = Box<dyn StdError + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        // RFC 6761: a loopback name is loopback without asking DNS (which may not even
        // answer for `localhost.`); the policy below still decides whether it may be used.
        let resolving: crate::resolver::ResolveFuture = if is_loopback_name(name.as_str()) {
            let addrs = LOOPBACK_NAME_ADDRS.to_vec();
            Box::pin(async move { Ok(addrs) })
        } else {
            self.inner.resolve(name.as_str())
        };
        let policy = self.policy.clone();
        Box::pin(async move {
            let ips = resolving.await?;
            let mut first_denied: Option<EgressDenied> = None;
            let mut allowed = Vec::with_capacity(ips.len());
            for ip in ips {
                match policy.check(ip) {
                    Ok(()) => allowed.push(SocketAddr::new(ip, 0)),
                    Err(denied) => {
                        first_denied.get_or_insert(denied);
                    }
                }
            }
            if allowed.is_empty() {
                if let Some(denied) = first_denied {
                    return Err(Box::new(denied) as Box<dyn StdError + Send + Sync>);
                }
                return Err("the name resolved to no address".into());
            }
            Ok(allowed.into_iter())
        })
    }
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<CappedConnector<HttpConnector<GuardedResolver>>>, Full<Bytes>>;

/// The production [`Transport`].
pub struct HttpTransport {
    /// The client and the policy it was built with, swapped whole by a reload.
    current: ArcSwap<Current>,
    settings: ClientSettings,
    cap: Arc<ConnCap>,
    resolver: Arc<dyn Resolve>,
}

/// A client and the egress policy its resolver applies.
struct Current {
    client: HttpsClient,
    policy: Arc<EgressPolicy>,
}

impl HttpTransport {
    /// Builds the client. The TLS roots are the Mozilla set from `webpki-roots`.
    pub fn new(settings: ClientSettings, policy: EgressPolicy, resolver: Arc<dyn Resolve>) -> Self {
        let cap = ConnCap::new(settings.max_idle_connections);
        let current = Current::new(&settings, &cap, policy, resolver.clone());
        HttpTransport {
            current: ArcSwap::from_pointee(current),
            settings,
            cap,
            resolver,
        }
    }
}

impl Current {
    fn new(settings: &ClientSettings, cap: &Arc<ConnCap>, policy: EgressPolicy, resolver: Arc<dyn Resolve>) -> Self {
        let policy = Arc::new(policy);
        let mut http = HttpConnector::new_with_resolver(GuardedResolver {
            inner: resolver,
            policy: policy.clone(),
        });
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(settings.connect_timeout));
        // Under TLS, so the cap counts and closes the TCP connection itself.
        let http = CappedConnector::new(http, cap.clone());
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        // With a timer the pool closes idle connections when their time is up; without one
        // it only noticed at the next checkout for the same host, so a sweep over many
        // hosts left a socket open to each of them for good.
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(hyper_util::rt::TokioTimer::new())
            .pool_idle_timeout(settings.idle_timeout)
            .pool_max_idle_per_host(settings.pool_max_idle_per_host)
            .build(https);
        Current { client, policy }
    }
}

impl HttpTransport {
    async fn attempt(&self, req: OutboundRequest) -> Result<InboundResponse, TransportError> {
        let current = self.current.load_full();
        if let Some(ip) = literal_ip(&req.url) {
            current
                .policy
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
        let response = current.client.request(request).await.map_err(classify_error)?;
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

impl Transport for HttpTransport {
    /// A new client with the reloaded egress policy, so a tightened allow list applies to
    /// every attempt from now on: the old client's pooled connections are not reused (they
    /// close as their attempts end), and the new one connects afresh through the new policy.
    /// A reload that leaves the policy as it is keeps the client and its connections.
    fn reconfigure(&self, config: &crate::config::Config) -> Result<(), String> {
        let policy = EgressPolicy::new(config.egress.allow_private_targets, config.egress.allow.clone());
        if *self.current.load().policy == policy {
            return Ok(());
        }
        let current = Current::new(&self.settings, &self.cap, policy, self.resolver.clone());
        self.current.store(Arc::new(current));
        Ok(())
    }

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
