//! The real transport: a pooled hyper-util client over tokio-rustls (the roots, CAs and
//! client certificates of `crate::outbound::tls`, ALPN h2 and http/1.1), direct or through
//! `egress.proxy` (`crate::outbound::proxy`), with the egress policy enforced where connections are
//! made.
//!
//! Each connection, in the order `Connector` makes it: the TLS handshake it will need is
//! settled first (an unknown scheme or a host that is no server name is refused before
//! connecting); then the egress route ([`Egress`]: direct TCP through [`GuardedResolver`],
//! or the proxy); then the [`ConnCap`] counts it under the target's `host:port`, proxied or
//! not; then TLS runs over it for an https target.
//!
//! Host names are resolved through the [`Resolve`] seam by [`GuardedResolver`], which drops
//! every address the policy refuses before the connector sees it, so the socket is opened
//! to exactly an address that was checked, on every attempt (a later DNS answer pointing
//! at a private address is refused too). IP-literal targets never reach a resolver, so
//! [`HttpTransport::send`] checks them itself before sending.
//!
//! An http target through the proxy is sent in absolute form to the address that was
//! checked (`POST http://203.0.113.7:8080/hook`, `Host: hooks.example:8080`), so the proxy
//! never resolves the name itself; a 407 from the proxy is an attempt error, not the
//! receiver's answer.
//!
//! Idle pooled connections are bounded per host by hyper-util's pool and, all hosts
//! together, by [`crate::outbound::conn_cap`] (`delivery.max_idle_connections`).

use std::borrow::Cow;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use bytes::{Bytes, BytesMut};
use http::Uri;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::config::{Config, DeliveryConfig};
use crate::outbound::conn_cap::{host_key, ConnCap};
use crate::outbound::egress::{uri_literal_ip, EgressDenied, EgressPolicy};
use crate::outbound::proxy::{Egress, ProxyRoute};
pub use crate::outbound::resolver::GuardedResolver;
use crate::outbound::resolver::Resolve;
use crate::outbound::tls::{self, MaybeTls, TlsMaterial};
use crate::outbound::transport::{InboundResponse, OutboundRequest, SendFuture, Transport, TransportError};
use crate::outbound::BoxError;

/// The production [`Transport`].
pub struct HttpTransport {
    /// The client and the egress policy it was built with, swapped whole by a reload.
    current: ArcSwap<Current>,
    /// What every client is built from.
    parts: Parts,
}

struct Parts {
    resolver: Arc<dyn Resolve>,
    proxy: Option<Arc<ProxyRoute>>,
    /// `[delivery]` as the process started with it (a reload does not change the pool).
    delivery: DeliveryConfig,
    cap: Arc<ConnCap>,
}

/// A client and the guarded resolver (its egress policy) it connects through.
struct Current {
    client: Client<Connector, Full<Bytes>>,
    guard: GuardedResolver,
}

impl HttpTransport {
    /// Builds the client of `config` (`[delivery]`, `[egress]`) with the TLS material `tls`,
    /// resolving through `resolver`.
    pub fn new(config: &Config, resolver: Arc<dyn Resolve>, tls: TlsMaterial) -> Self {
        let proxy = config.egress.proxy.as_ref();
        let parts = Parts {
            resolver,
            proxy: proxy.map(|proxy| Arc::new(ProxyRoute::new(proxy, &config.egress.no_proxy))),
            cap: ConnCap::new(config.delivery.max_idle_connections as usize),
            delivery: config.delivery.clone(),
        };
        HttpTransport {
            current: ArcSwap::from_pointee(parts.client(EgressPolicy::from_config(config), tls)),
            parts,
        }
    }
}

impl Parts {
    fn client(&self, policy: EgressPolicy, tls: TlsMaterial) -> Current {
        let guard = GuardedResolver::new(self.resolver.clone(), Arc::new(policy));
        let connector = Connector {
            egress: Egress::new(
                guard.clone(),
                self.resolver.clone(),
                self.proxy.clone(),
                self.delivery.connect_timeout,
            ),
            cap: self.cap.clone(),
            tls: Arc::new(tls),
        };
        // With a timer the pool closes idle connections when their time is up; without one
        // it only noticed at the next checkout for the same host, so a sweep over many
        // hosts left a socket open to each of them for good. The cap's timer also sweeps
        // when the cap has closed connections (see `sweep`).
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(self.cap.pool_timer())
            .pool_idle_timeout(self.delivery.idle_connection_timeout)
            .pool_max_idle_per_host(self.delivery.max_in_flight_per_host as usize)
            .build(connector);
        Current { client, guard }
    }
}

/// Makes every outbound connection (see the module docs).
#[derive(Clone)]
struct Connector {
    egress: Egress,
    cap: Arc<ConnCap>,
    tls: Arc<TlsMaterial>,
}

impl tower_service::Service<Uri> for Connector {
    type Response = MaybeTls;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<MaybeTls, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Its TCP connectors are always ready (their resolvers are).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let handshake = this.tls.handshake_for(&uri)?;
            let key = host_key(&uri);
            let (io, proxied) = this.egress.connect(uri).await?;
            // Under TLS, so the cap counts and closes the TCP connection itself.
            let io = this.cap.count(key, io, proxied);
            Ok(tls::connect(handshake, io).await?)
        })
    }
}

impl HttpTransport {
    /// For an http target the proxy intercepts: the URL rewritten to the checked address,
    /// and the `Host` and `Proxy-Authorization` headers to send with it. `None`: no rewrite.
    async fn through_proxy(&self, current: &Current, uri: &Uri) -> Result<Option<ProxiedHttp<'_>>, TransportError> {
        let Some(proxy) = self.parts.proxy.as_ref().filter(|_| uri.scheme_str() == Some("http")) else {
            return Ok(None);
        };
        if !proxy.intercepts(uri) {
            return Ok(None);
        }
        let mut url = url::Url::parse(&uri.to_string()).map_err(|e| TransportError::Network(format!("{e}")))?;
        let host = url.host_str().unwrap_or_default();
        // What hyper would have written from the URL (the port only when not the default).
        let host_header = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_string(),
        };
        let ip = current
            .guard
            .checked_addr(host)
            .await
            .map_err(|e| match e.downcast::<EgressDenied>() {
                Ok(denied) => TransportError::EgressDenied(denied.to_string()),
                Err(e) => TransportError::Network(e.to_string()),
            })?;
        url.set_ip_host(ip)
            .map_err(|()| TransportError::Network("cannot address the target by IP".to_string()))?;
        // The connector decides again on the address this URL now names: when `no_proxy`
        // lists it (a network, or the IP itself), the request goes direct to the receiver,
        // and the proxy's credentials must not go with it.
        let uri: Uri = url
            .as_str()
            .parse()
            .map_err(|e| TransportError::Network(format!("{e}")))?;
        let through = proxy.intercepts(&uri);
        Ok(Some(ProxiedHttp {
            uri,
            host: host_header,
            proxy: through.then_some(&**proxy),
        }))
    }

    async fn attempt(&self, req: OutboundRequest) -> Result<InboundResponse, TransportError> {
        let current = self.current.load_full();
        if let Some(ip) = uri_literal_ip(&req.url) {
            current
                .guard
                .check(ip)
                .map_err(|d| TransportError::EgressDenied(d.to_string()))?;
        }
        let proxied = self.through_proxy(&current, &req.url).await?;
        let uri = match &proxied {
            Some(p) => p.uri.clone(),
            None => req.url,
        };
        let mut builder = http::Request::builder().method(req.method).uri(uri);
        if let Some(headers) = builder.headers_mut() {
            headers.reserve(req.headers.len() + 2);
            for (name, value) in req.headers {
                headers.append(header_name(name)?, header_value(value)?);
            }
        }
        if let Some(p) = &proxied {
            builder = builder.header(http::header::HOST, p.host.as_str());
            if let Some(auth) = p.proxy.and_then(|proxy| proxy.authorization.as_ref()) {
                builder = builder.header(http::header::PROXY_AUTHORIZATION, auth.clone());
            }
        }
        let request = builder
            .body(Full::new(req.body))
            .map_err(|e| TransportError::Network(e.to_string()))?;
        // Held until the body is read: while any request to a host runs, the cap leaves the
        // host's connections alone; its end is when an idle one may be closed.
        let _busy = self.parts.cap.begin(request.uri());
        let response = current.client.request(request).await.map_err(classify_error)?;
        let status = response.status().as_u16();
        if let Some(proxy) = proxied.as_ref().and_then(|p| p.proxy).filter(|_| status == 407) {
            // The proxy's answer, not the receiver's: retried like a connect error.
            return Err(TransportError::Network(format!(
                "proxy {} answered 407 Proxy Authentication Required: egress.proxy's credentials are missing or refused",
                proxy.origin
            )));
        }
        let header = |name| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let retry_after = header(http::header::RETRY_AFTER.as_str());
        let receipt = header(crate::signing::receipt::HEADER);
        let mut body = response.into_body();
        let mut kept = BytesMut::new();
        // Read only what we keep; the rest is dropped with the connection.
        let max = self.parts.delivery.max_response_body as usize;
        while kept.len() < max {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        let room = max - kept.len();
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
            receipt,
        })
    }
}

/// An http target's request rewritten for the proxy (see [`HttpTransport::through_proxy`]).
struct ProxiedHttp<'a> {
    uri: Uri,
    host: String,
    /// The proxy, when the request goes through it at all (not when `no_proxy` lists the
    /// checked address).
    proxy: Option<&'a ProxyRoute>,
}

impl Transport for HttpTransport {
    /// Takes the reloaded TLS material and egress policy with a new client: no connection
    /// opened before the reload is reused, so a tightened allow list, a distrusted CA or a
    /// renewed client certificate (same paths, new files) applies to every attempt from now
    /// on, including to hosts whose pooled connections never went idle. The old client's
    /// connections close as their attempts end. Everything that can fail (reading the PEM
    /// files) is done before anything is swapped.
    fn reconfigure(&self, config: &Config) -> Result<(), String> {
        let material = TlsMaterial::from_config(config).map_err(|e| e.to_string())?;
        let client = self.parts.client(EgressPolicy::from_config(config), material);
        self.current.store(Arc::new(client));
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

/// A header name of an attempt. A static one is courier's own constant (lowercase, valid:
/// `static_header_names_are_valid` checks each), taken without an allocation.
fn header_name(name: Cow<'static, str>) -> Result<http::HeaderName, TransportError> {
    match name {
        Cow::Borrowed(name) => Ok(http::HeaderName::from_static(name)),
        Cow::Owned(name) => {
            http::HeaderName::from_bytes(name.as_bytes()).map_err(|e| TransportError::Network(e.to_string()))
        }
    }
}

/// A header value of an attempt, moved into the request rather than copied.
fn header_value(value: Vec<u8>) -> Result<http::HeaderValue, TransportError> {
    http::HeaderValue::from_maybe_shared(Bytes::from(value)).map_err(|e| TransportError::Network(e.to_string()))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SignatureScheme;

    /// Every static name an attempt or a drain sends: `HeaderName::from_static` panics on
    /// an invalid one, so each is taken here once.
    #[test]
    fn static_header_names_are_valid() {
        let schemes = [
            SignatureScheme::Standard,
            SignatureScheme::Stripe,
            SignatureScheme::Github,
            SignatureScheme::None,
        ];
        let signing = schemes.into_iter().flat_map(crate::signing::signature_headers).copied();
        let control = crate::headers::KNOWN
            .into_iter()
            .chain([crate::outbound::trace::TRACEPARENT]);
        for name in signing.chain(control) {
            let got = header_name(Cow::Borrowed(name)).unwrap();
            assert_eq!(got.as_str(), name);
        }
    }
}
