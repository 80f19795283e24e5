//! The egress route of each connection: direct, or through `egress.proxy` (an HTTP proxy
//! such as Smokescreen, Squid or tinyproxy).
//!
//! - An `https` target goes through an HTTP CONNECT tunnel (`ProxyRoute::tunnel`); TLS
//!   then runs end to end inside it (`crate::outbound::tls`), with the target's name as SNI.
//! - An `http` target is sent to the proxy in absolute form (`POST http://…/ HTTP/1.1`):
//!   the connection is marked proxied so hyper writes the absolute URI, and
//!   `crate::outbound::client` rewrites the URI and adds `Proxy-Authorization` (see there).
//! - `egress.no_proxy` targets go direct. Which targets the proxy intercepts is hyper-util's
//!   [`Matcher`] (curl's `NO_PROXY` rules: a host also covers its subdomains, `.suffix`,
//!   IP addresses and CIDR networks, `*`).
//!
//! The SSRF guard still applies to the target: courier resolves it through the same
//! resolver seam, checks every address with the egress policy ([`GuardedResolver`]), and
//! asks the proxy for the checked IP (`CONNECT 203.0.113.7:443`), never the name, so a DNS
//! answer that changes between the check and the proxy's own lookup cannot redirect the
//! connection. The proxy's own address is not checked: the operator named it, and it is
//! usually a private address.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tower_service::Service;

use crate::config::EgressProxy;
use crate::outbound::resolver::{GuardedResolver, Resolve};
use crate::outbound::BoxError;

/// Which targets go through the proxy, and how to reach and authenticate to it.
pub struct ProxyRoute {
    matcher: Matcher,
    /// The proxy, `http://host:port/`, without credentials.
    uri: Uri,
    /// `http://host:port` of the proxy (no credentials), for messages.
    pub(crate) origin: String,
    /// `Proxy-Authorization: Basic …` when the URL carries credentials (marked sensitive).
    pub(crate) authorization: Option<HeaderValue>,
}

impl ProxyRoute {
    /// The route of `proxy` with the `no_proxy` exceptions (entries as `Config` holds them).
    pub fn new(proxy: &EgressProxy, no_proxy: &[String]) -> ProxyRoute {
        let matcher = Matcher::builder()
            .all(proxy.expose().to_string())
            .no(no_proxy.join(","))
            .build();
        // The config parser built the same matcher and refused a URL it does not take.
        let intercept = matcher.intercept(&Uri::from_static("http://courier.invalid/"));
        ProxyRoute {
            uri: intercept
                .as_ref()
                .map(|i| i.uri().clone())
                .unwrap_or_else(|| Uri::from_static("http://proxy.invalid/")),
            authorization: intercept.as_ref().and_then(|i| i.basic_auth().cloned()),
            origin: proxy.origin().to_string(),
            matcher,
        }
    }

    /// Whether a connection to `uri` goes through the proxy.
    pub fn intercepts(&self, uri: &Uri) -> bool {
        self.matcher.intercept(uri).is_some()
    }

    /// Asks the proxy on `io` for a tunnel to `to`, as hyper-util's `Tunnel` did (the same
    /// request, the answer parsed the same way), keeping the proxy's status line for the
    /// error: hyper-util's said only "unsuccessful", and an operator needs to know whether
    /// the proxy answered 401, 403 or 502.
    async fn tunnel<S: AsyncRead + AsyncWrite + Unpin>(&self, io: &mut S, to: SocketAddr) -> Result<(), ProxyError> {
        let mut head = format!("CONNECT {to} HTTP/1.1\r\nHost: {to}\r\n").into_bytes();
        if let Some(auth) = &self.authorization {
            head.extend_from_slice(b"Proxy-Authorization: ");
            head.extend_from_slice(auth.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(b"\r\n");
        let io_error = |e: std::io::Error| self.failed(to, "io error establishing tunnel", Some(Box::new(e)));
        io.write_all(&head).await.map_err(io_error)?;
        let mut buf = [0; 8192];
        let mut pos = 0;
        let code = loop {
            let n = io.read(&mut buf[pos..]).await.map_err(io_error)?;
            if n == 0 {
                return Err(self.failed(to, "unexpected end of file", None));
            }
            pos += n;
            let mut headers = [httparse::EMPTY_HEADER; 100];
            let mut answer = httparse::Response::new(&mut headers);
            match answer.parse(&buf[..pos]) {
                Ok(httparse::Status::Complete(_)) => break answer.code,
                Ok(httparse::Status::Partial) if pos < buf.len() => {}
                Ok(httparse::Status::Partial) => return Err(self.failed(to, "proxy response headers too long", None)),
                Err(_) => break None,
            }
        };
        let origin = &self.origin;
        match code {
            Some(200) => Ok(()),
            Some(407) => Err(ProxyError::new(
                format!(
                    "proxy {origin} answered 407 Proxy Authentication Required to CONNECT {to}: \
                     egress.proxy's credentials are missing or refused"
                ),
                None,
            )),
            _ => {
                let status = status_text(&buf[..pos.min(STATUS_LINE_MAX)]);
                // Some proxies (tinyproxy) answer wrong credentials with 401, not 407.
                let hint = if status.starts_with("401") {
                    ": egress.proxy's credentials are refused"
                } else {
                    ""
                };
                let answered = if status.is_empty() {
                    "refused".to_string()
                } else {
                    format!("answered {status}")
                };
                Err(ProxyError::new(
                    format!("proxy {origin} {answered} to CONNECT {to}{hint}"),
                    None,
                ))
            }
        }
    }

    /// A tunnel that failed before the proxy answered: the cause (a connect timeout, a
    /// reset) kept as the source, in the words hyper-util's tunnel error used.
    fn failed(&self, to: SocketAddr, what: &str, source: Option<BoxError>) -> ProxyError {
        let cause = ProxyError::new(format!("tunnel error: {what}"), source);
        ProxyError::new(format!("proxy {}, CONNECT {to}", self.origin), Some(Box::new(cause)))
    }
}

/// The longest status line kept: `HTTP/1.1 407 Proxy Authentication Required` fits.
const STATUS_LINE_MAX: usize = 96;

/// `407 Proxy Authentication Required` of the proxy's answer, or empty when it had none.
fn status_text(answer: &[u8]) -> String {
    let line = String::from_utf8_lossy(answer);
    let line = line.split("\r\n").next().unwrap_or_default();
    let status = line.split_once(' ').map_or("", |(_, rest)| rest);
    status.chars().filter(|c| !c.is_control()).collect()
}

/// The bottom of the outbound connector: a TCP connection to the target (through the
/// guarded resolver), a CONNECT tunnel to its checked address, or a connection to the proxy
/// for an absolute-form request.
#[derive(Clone)]
pub struct Egress {
    direct: HttpConnector<GuardedResolver>,
    guard: GuardedResolver,
    /// The route, and the connector to the proxy itself (through
    /// [`GuardedResolver::unguarded`]).
    proxy: Option<(Arc<ProxyRoute>, HttpConnector<GuardedResolver>)>,
}

impl Egress {
    /// Direct connections through `guard`, and through `proxy` (its own name resolved by
    /// `resolver`, unguarded) when one is set.
    pub fn new(
        guard: GuardedResolver,
        resolver: Arc<dyn Resolve>,
        proxy: Option<Arc<ProxyRoute>>,
        connect_timeout: Duration,
    ) -> Self {
        let proxy = proxy.map(|route| (route, tcp(GuardedResolver::unguarded(resolver), connect_timeout)));
        Egress {
            direct: tcp(guard.clone(), connect_timeout),
            guard,
            proxy,
        }
    }

    /// A connection for `uri`, and whether hyper must write absolute-form requests on it
    /// (an `http` target through the proxy).
    pub async fn connect(mut self, uri: Uri) -> Result<(TokioIo<TcpStream>, bool), BoxError> {
        let Some((route, mut to_proxy)) = self.proxy.filter(|(route, _)| route.intercepts(&uri)) else {
            return Ok((self.direct.call(uri).await?, false));
        };
        if uri.scheme_str() != Some("https") {
            let io = to_proxy.call(route.uri.clone()).await.map_err(|e| {
                ProxyError::new(
                    format!("cannot connect to the proxy {}", route.origin),
                    Some(Box::new(e)),
                )
            })?;
            return Ok((io, true));
        }
        let host = uri.host().ok_or("the target has no host")?;
        let ip = self.guard.checked_addr(host).await?;
        let to = SocketAddr::new(ip, uri.port_u16().unwrap_or(443));
        let connecting = to_proxy.call(route.uri.clone()).await;
        let mut io = connecting
            .map_err(|e| route.failed(to, "failed to create underlying connection", Some(Box::new(e))))?
            .into_inner();
        route.tunnel(&mut io, to).await?;
        Ok((TokioIo::new(io), false))
    }
}

/// A TCP connector through `resolver`, as every outbound connection is made.
fn tcp(resolver: GuardedResolver, connect_timeout: Duration) -> HttpConnector<GuardedResolver> {
    let mut http = HttpConnector::new_with_resolver(resolver);
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    http
}

/// Why the proxy did not give a connection; the text an attempt's error shows.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ProxyError {
    message: String,
    #[source]
    source: Option<BoxError>,
}

impl ProxyError {
    fn new(message: String, source: Option<BoxError>) -> ProxyError {
        ProxyError { message, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(proxy: &str, no_proxy: &[&str]) -> ProxyRoute {
        let c = crate::config::Config::from_toml_str(
            &format!("[egress]\nproxy = {proxy:?}\nno_proxy = {no_proxy:?}\n"),
            "t",
        )
        .unwrap();
        ProxyRoute::new(c.egress.proxy.as_ref().unwrap(), &c.egress.no_proxy)
    }

    #[test]
    fn no_proxy_targets_go_direct_and_the_rest_through_the_proxy() {
        let r = route(
            "http://u:p%40ss@proxy.internal:3128",
            &[".internal", "direct.example", "10.0.0.0/8", "::1"],
        );
        assert_eq!(r.uri, "http://proxy.internal:3128/");
        assert_eq!(r.origin, "http://proxy.internal:3128");
        // base64("u:p@ss")
        assert_eq!(r.authorization.as_ref().unwrap(), "Basic dTpwQHNz");
        assert!(r.authorization.as_ref().unwrap().is_sensitive());
        for (target, proxied) in [
            ("https://hooks.example/x", true),
            ("http://hooks.example/x", true),
            ("https://svc.internal/x", false),
            ("https://direct.example:8443/x", false),
            ("https://a.direct.example/x", false),
            ("https://notdirect.example/x", true),
            ("http://10.1.2.3/x", false),
            ("http://11.1.2.3/x", true),
            ("http://[::1]:8080/x", false),
        ] {
            assert_eq!(r.intercepts(&target.parse().unwrap()), proxied, "{target}");
        }
        let open = route("http://proxy.internal:3128", &[]);
        assert!(open.authorization.is_none());
        assert!(open.intercepts(&"http://localhost/x".parse().unwrap()));
    }

    /// Asks a proxy that answers CONNECT with `answer` for a tunnel.
    async fn through(answer: &'static str) -> Result<(), String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut ours, mut theirs) = tokio::io::duplex(4096);
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let _ = theirs.read(&mut buf).await;
            let _ = theirs.write_all(answer.as_bytes()).await;
        });
        let route = route("http://p:3128", &[]);
        let to: SocketAddr = "203.0.113.7:443".parse().unwrap();
        route.tunnel(&mut ours, to).await.map_err(|e| {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                text = format!("{text}: {s}");
                source = s.source();
            }
            text
        })
    }

    #[tokio::test]
    async fn tunnel_failures_say_what_the_proxy_answered() {
        assert_eq!(through("HTTP/1.1 200 Connection established\r\n\r\n").await, Ok(()));
        let e = through("HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
            .await
            .unwrap_err();
        assert!(
            e.contains("407") && e.contains("203.0.113.7:443") && e.contains("egress.proxy"),
            "{e}"
        );
        let e = through("HTTP/1.1 403 Forbidden\r\n\r\n").await.unwrap_err();
        assert_eq!(
            e,
            "proxy http://p:3128 answered 403 Forbidden to CONNECT 203.0.113.7:443"
        );
        let e = through("HTTP/1.0 401 Unauthorized\r\n\r\n").await.unwrap_err();
        assert!(
            e.ends_with("answered 401 Unauthorized to CONNECT 203.0.113.7:443: egress.proxy's credentials are refused"),
            "{e}"
        );
        let e = through("").await.unwrap_err();
        assert_eq!(
            e,
            "proxy http://p:3128, CONNECT 203.0.113.7:443: tunnel error: unexpected end of file"
        );
        let e = through("HTTP/1.1 200 OK\r\nPartial").await.unwrap_err();
        assert!(e.ends_with("tunnel error: unexpected end of file"), "{e}");
        let e = through("garbage\r\n\r\n").await.unwrap_err();
        assert_eq!(e, "proxy http://p:3128 refused to CONNECT 203.0.113.7:443");
    }
}
