//! The egress route of each connection: direct, or through `egress.proxy` (an HTTP proxy
//! such as Smokescreen, Squid or tinyproxy).
//!
//! - An `https` target goes through an HTTP CONNECT tunnel (hyper-util's [`Tunnel`]); TLS
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

use std::error::Error as StdError;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{HeaderValue, Uri};
use hyper::rt::Write;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::config::EgressProxy;
use crate::outbound::resolver::GuardedResolver;

mod sniff;

use sniff::{Sniffing, StatusLine};

type BoxError = Box<dyn StdError + Send + Sync>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

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
}

/// The bottom of the outbound connector: a TCP connection to the target (through the
/// guarded resolver), a CONNECT tunnel to its checked address, or a connection to the proxy
/// for an absolute-form request.
#[derive(Clone)]
pub struct EgressConnector {
    direct: HttpConnector<GuardedResolver>,
    guard: GuardedResolver,
    proxy: Option<Proxied>,
}

#[derive(Clone)]
struct Proxied {
    route: std::sync::Arc<ProxyRoute>,
    /// To the proxy itself, through [`GuardedResolver::unguarded`].
    plain: HttpConnector<GuardedResolver>,
}

impl Proxied {
    /// A tunnel whose proxy connection records the proxy's status line in `line`.
    fn tunnel(&self, line: StatusLine) -> Tunnel<Sniffing> {
        let sniffing = Sniffing {
            inner: self.plain.clone(),
            line,
        };
        let tunnel = Tunnel::new(self.route.uri.clone(), sniffing);
        match &self.route.authorization {
            Some(auth) => tunnel.with_auth(auth.clone()),
            None => tunnel,
        }
    }
}

impl EgressConnector {
    /// Direct connections with `direct` (whose resolver is `guard`), and through `route`'s
    /// proxy with `to_proxy` when a proxy is set.
    pub fn new(
        direct: HttpConnector<GuardedResolver>,
        guard: GuardedResolver,
        proxy: Option<(std::sync::Arc<ProxyRoute>, HttpConnector<GuardedResolver>)>,
    ) -> Self {
        let proxy = proxy.map(|(route, plain)| Proxied { route, plain });
        EgressConnector { direct, guard, proxy }
    }
}

impl tower_service::Service<Uri> for EgressConnector {
    type Response = EgressIo;
    type Error = BoxError;
    type Future = BoxFuture<EgressIo>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // HttpConnector and Tunnel are always ready (their resolvers are).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let Some(proxy) = self.proxy.clone().filter(|p| p.route.intercepts(&uri)) else {
            let connecting = self.direct.call(uri);
            return Box::pin(async move { Ok(EgressIo::plain(connecting.await?, false)) });
        };
        let origin = proxy.route.origin.clone();
        if uri.scheme_str() == Some("https") {
            let guard = self.guard.clone();
            let line = StatusLine::default();
            let mut tunnel = proxy.tunnel(line.clone());
            Box::pin(async move {
                let host = uri.host().ok_or("the target has no host")?;
                let ip = guard.checked_addr(host).await?;
                let to = SocketAddr::new(ip, uri.port_u16().unwrap_or(443));
                let dst: Uri = format!("https://{to}/").parse()?;
                tunnel
                    .call(dst)
                    .await
                    .map_err(|e| ProxyError::tunnel(e.into(), &line.text(), &origin, to).into())
            })
        } else {
            let connecting = proxy.plain.clone().call(proxy.route.uri.clone());
            Box::pin(async move {
                let io = connecting
                    .await
                    .map_err(|e| ProxyError::new(format!("cannot connect to the proxy {origin}"), Some(Box::new(e))))?;
                Ok(EgressIo::plain(io, true))
            })
        }
    }
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

    /// hyper-util's tunnel error (its type is private; its text is not): a refusal gets a
    /// sentence of its own with the proxy's status line (`status`, as [`EgressIo`] read
    /// it), anything else keeps the tunnel's error (and its causes, such as a connect
    /// timeout) as the source.
    fn tunnel(e: BoxError, status: &str, origin: &str, to: SocketAddr) -> ProxyError {
        let text = e.to_string();
        if text.ends_with("proxy authorization required") {
            return ProxyError::new(
                format!(
                    "proxy {origin} answered 407 Proxy Authentication Required to CONNECT {to}: \
                     egress.proxy's credentials are missing or refused"
                ),
                None,
            );
        }
        if text.ends_with("unsuccessful") {
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
            return ProxyError::new(format!("proxy {origin} {answered} to CONNECT {to}{hint}"), None);
        }
        ProxyError::new(format!("proxy {origin}, CONNECT {to}"), Some(e))
    }
}

/// A connection made by [`EgressConnector`]: a TCP connection (to the target, or to the
/// proxy, tunnelled or not), marked proxied when hyper must write absolute-form requests.
/// While `line` is set (a CONNECT in progress), the bytes read are also given to it.
pub struct EgressIo {
    io: TokioIo<TcpStream>,
    line: Option<StatusLine>,
    proxied: bool,
}

impl EgressIo {
    fn plain(io: TokioIo<TcpStream>, proxied: bool) -> Self {
        EgressIo {
            io,
            line: None,
            proxied,
        }
    }
}

impl Connection for EgressIo {
    fn connected(&self) -> Connected {
        self.io.connected().proxy(self.proxied)
    }
}

write_through!([] EgressIo, |_: &EgressIo| None);

#[cfg(test)]
mod tests {
    use hyper_util::rt::TokioIo;
    use tower_service::Service;

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

    /// A connector whose every connection is one end of a pipe; the other end answers
    /// CONNECT with `answer`.
    #[derive(Clone)]
    struct FakeProxy(&'static str);

    impl tower_service::Service<Uri> for FakeProxy {
        type Response = TokioIo<tokio::io::DuplexStream>;
        type Error = io::Error;
        type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _uri: Uri) -> Self::Future {
            let answer = self.0;
            Box::pin(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let (ours, mut theirs) = tokio::io::duplex(4096);
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let _ = theirs.read(&mut buf).await;
                    let _ = theirs.write_all(answer.as_bytes()).await;
                });
                Ok(TokioIo::new(ours))
            })
        }
    }

    async fn through(answer: &'static str) -> Result<(), String> {
        let to: SocketAddr = "203.0.113.7:443".parse().unwrap();
        let mut tunnel = Tunnel::new(Uri::from_static("http://p:3128/"), FakeProxy(answer));
        match tunnel.call(format!("https://{to}/").parse().unwrap()).await {
            Ok(_) => Ok(()),
            Err(e) => {
                let line = StatusLine::default();
                line.record(answer.as_bytes());
                Err(ProxyError::tunnel(e.into(), &line.text(), "http://p:3128", to).to_string())
            }
        }
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
        assert!(e.starts_with("proxy http://p:3128, CONNECT 203.0.113.7:443"), "{e}");
    }
}
