//! HTTPS interception with no URL change (CONTRACT §9, `[intercept]`).
//!
//! An app that sets `HTTPS_PROXY=http://<courier>` sends `CONNECT host:443` to ingress.
//! The `CONNECT` is admitted as any ingress request is (draining, the browser rules, the
//! token as `Proxy-Authorization`), then by its host:
//!
//! - **listed in `hosts`**: courier answers `200`, completes TLS with a leaf certificate
//!   its CA ([`ca`]) signs for that host ([`leaves`]), and serves the requests inside as
//!   ingress serves absolute-form requests to `https://host:port/path` (same limits,
//!   dedupe, signing, 202), delivering them to the real receiver with its own TLS client.
//!   The tunnel's `CONNECT` carried the token, so the requests inside need none.
//! - **listed in `passthrough`**: the host is resolved and checked by the egress policy,
//!   connected to (through `egress.proxy` when it applies) before the `200`, and the bytes
//!   are copied untouched ([`tunnel`]).
//! - **otherwise**: 403 `not_intercepted`, nothing stored.
//!
//! Tunnels are bounded (`max_tunnels`, then 503 `overloaded`), closed when idle
//! (`idle_timeout`, passthrough; the listener's idle timeout inside intercepted ones), at
//! stop, and at a reload that revokes them (`admitted`: `ingress_token` no longer the
//! one the `CONNECT` carried, or `[egress]` no longer allowing a passthrough's address),
//! and counted in `courier_tunnels_open` / `courier_tunnels_total`.

mod admitted;
pub mod ca;
pub mod leaves;
mod tunnel;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use tokio::sync::{watch, Semaphore};

use crate::config::{Config, HostPattern};
use crate::context::Context;
use crate::inbound::ingress::Ingress;
use crate::inbound::serve::{Body, Refusal, ServeLimits};
use crate::metrics::TunnelKind;
use crate::outbound::proxy::ProxyRoute;
use crate::outbound::resolver::Resolve;
use admitted::Admitted;
use leaves::Leaves;

/// The wall-clock time of `clock`, as certificates need it.
pub fn wall(clock: &dyn crate::clock::Clock) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(clock.wall_ms())
}

/// Client addresses whose failed handshake was logged (once each), at most.
const MAX_WARNED: usize = 1024;

/// What a tunnel needs of the rest of courier.
pub struct InterceptParts {
    /// Admits the `CONNECT`, and serves the requests inside intercepted tunnels.
    pub ingress: Arc<Ingress>,
    /// The settings (egress policy), clock and metrics.
    pub ctx: Arc<Context>,
    /// DNS for passthrough tunnels.
    pub resolver: Arc<dyn Resolve>,
    /// The ingress listener's limits, applied inside intercepted tunnels.
    pub limits: ServeLimits,
    /// Turns true at stop.
    pub stop: watch::Receiver<bool>,
}

/// The `CONNECT` handler.
pub struct Intercept {
    hosts: Vec<HostPattern>,
    passthrough: Vec<HostPattern>,
    /// `None` when no host is intercepted (no CA is needed).
    leaves: Option<Leaves>,
    tunnels: Arc<Semaphore>,
    max_tunnels: u32,
    idle_timeout: Duration,
    proxy: Option<Arc<ProxyRoute>>,
    connect_timeout: Duration,
    /// Requests in progress inside intercepted tunnels, all together.
    requests: Arc<Semaphore>,
    warned: Mutex<std::collections::HashSet<IpAddr>>,
    parts: InterceptParts,
}

/// A `CONNECT`'s target.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// Lowercase, no brackets, no trailing dot.
    host: String,
    port: u16,
    /// `host:port` as a URL writes it (IPv6 in brackets).
    authority: String,
}

impl Intercept {
    /// The handler of `config`'s `[intercept]`; loads or makes the CA when a host is
    /// intercepted (a CA that cannot serve a listed host stops the start).
    pub fn new(config: &Config, parts: InterceptParts) -> Result<Intercept, ca::CaError> {
        let section = &config.intercept;
        let leaves = match section.hosts.is_empty() {
            true => None,
            false => {
                let (cert, key) = section.ca_files(&config.data_dir);
                let now = wall(parts.ctx.clock().as_ref());
                Some(Leaves::new(ca::Ca::load_or_create(&cert, &key, &section.hosts, now)?)?)
            }
        };
        let proxy = config.egress.proxy.as_ref();
        Ok(Intercept {
            hosts: section.hosts.clone(),
            passthrough: section.passthrough.clone(),
            leaves,
            tunnels: Arc::new(Semaphore::new(section.max_tunnels as usize)),
            max_tunnels: section.max_tunnels,
            idle_timeout: section.idle_timeout,
            proxy: proxy.map(|p| Arc::new(ProxyRoute::new(p, &config.egress.no_proxy))),
            connect_timeout: config.delivery.connect_timeout,
            requests: Arc::new(Semaphore::new(parts.limits.max_requests)),
            warned: Mutex::default(),
            parts,
        })
    }

    /// Answers one `CONNECT`: 200 and a tunnel, or the refusal (counted as ingress's are).
    pub async fn connect(self: Arc<Self>, peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
        let ingress = &self.parts.ingress;
        if let Err(refused) = ingress.admit_connect(&req) {
            let mut resp = ingress.refuse(refused.clone());
            // A proxy asks for its credentials with 407; some clients (Java's) send them
            // only when asked.
            if refused.code() == "unauthorized" {
                *resp.status_mut() = StatusCode::PROXY_AUTHENTICATION_REQUIRED;
                let challenge = http::HeaderValue::from_static("Basic realm=\"courier\"");
                resp.headers_mut().insert(http::header::PROXY_AUTHENTICATE, challenge);
            }
            return resp;
        }
        match self.clone().open(peer, req).await {
            Ok(resp) => resp,
            Err(refused) => ingress.refuse(refused),
        }
    }

    /// Waits until every tunnel has closed (at stop; the caller bounds the wait).
    pub async fn closed(&self) {
        let _ = self.tunnels.acquire_many(self.max_tunnels).await;
    }

    async fn open(self: Arc<Self>, peer: SocketAddr, req: Request<Incoming>) -> Result<Response<Body>, Refusal> {
        let ctx = self.parts.ctx.clone();
        // Before the last check below: a reload after it reaches the tunnel.
        let reloads = ctx.reloads();
        let admitted = Admitted::new(crate::headers::proxy_token(req.headers()).as_deref());
        let target = Target::of(req.uri())?;
        let kind = self.kind(&target.host).ok_or_else(|| not_intercepted(&target.host))?;
        let permit = self.tunnels.clone().try_acquire_owned().map_err(|_| {
            let message = format!(
                "{} tunnels are open (intercept.max_tunnels); retry shortly",
                self.max_tunnels
            );
            Refusal::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", message)
        })?;
        match kind {
            TunnelKind::Intercept => {
                let leaves = self.leaves.as_ref().expect("a CA when hosts are listed");
                let tls = leaves
                    .config(&target.host, wall(self.parts.ctx.clock().as_ref()))
                    .map_err(|e| Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, "intercept_failed", e.to_string()))?;
                // A reload since `admit_connect` read the token is caught here.
                let standing = tunnel::Standing::checked(admitted, reloads, &ctx)?;
                let this = self.clone();
                tokio::spawn(tunnel::intercepted(this, req, tls, target, peer, permit, standing));
            }
            TunnelKind::Passthrough => {
                let (upstream, admitted) = tunnel::dial(&self, &target, admitted).await?;
                let standing = tunnel::Standing::checked(admitted, reloads, &ctx)?;
                let this = self.clone();
                tokio::spawn(tunnel::passthrough(this, req, upstream, permit, target, standing));
            }
        }
        Ok(crate::inbound::serve::empty(StatusCode::OK))
    }

    /// Which kind of tunnel `host` gets: intercepted first, then passthrough.
    fn kind(&self, host: &str) -> Option<TunnelKind> {
        if self.hosts.iter().any(|p| p.matches(host)) {
            Some(TunnelKind::Intercept)
        } else if self.passthrough.iter().any(|p| p.matches(host)) {
            Some(TunnelKind::Passthrough)
        } else {
            None
        }
    }

    /// Logs a client's failed handshake: at `warn` the first time for its address, then
    /// at `debug` (a client that does not trust the CA fails every connection).
    fn tls_failed(&self, peer: IpAddr, target: &Target, error: &std::io::Error) {
        self.parts.ctx.metrics().tunnel_tls_failed();
        let first = {
            let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
            if warned.len() >= MAX_WARNED {
                warned.clear();
            }
            warned.insert(peer)
        };
        if first {
            tracing::warn!(client = %peer, host = %target.host, error = %error,
                "a client failed the TLS handshake of an intercepted tunnel: does it trust courier's CA? (`courier intercept ca` prints it); said once per client");
        } else {
            tracing::debug!(client = %peer, host = %target.host, error = %error, "intercepted tunnel: TLS handshake failed");
        }
    }
}

impl Target {
    /// The authority-form target of a `CONNECT` (`host:port`; the port defaults to 443).
    fn of(uri: &http::Uri) -> Result<Target, Refusal> {
        let bad = || Refusal::bad("invalid_target", "CONNECT needs a host:port target");
        let authority = uri.authority().ok_or_else(bad)?;
        let port = authority.port_u16().unwrap_or(443);
        // A host name or an address, read as the config's patterns are (so `*`, `,` and
        // the like never reach the matching or a certificate), in one normal form.
        let (host, authority) = match HostPattern::parse(authority.host()) {
            Ok(HostPattern::Name(name)) => (name.clone(), format!("{name}:{port}")),
            Ok(HostPattern::Ip(ip @ IpAddr::V4(_))) => (ip.to_string(), format!("{ip}:{port}")),
            Ok(HostPattern::Ip(ip @ IpAddr::V6(_))) => (ip.to_string(), format!("[{ip}]:{port}")),
            _ => return Err(bad()),
        };
        Ok(Target { host, port, authority })
    }
}

/// The refusal of a `CONNECT` to a host not listed.
fn not_intercepted(host: &str) -> Refusal {
    let message = format!(
        "CONNECT to {} is refused: the host is in neither [intercept] hosts nor passthrough",
        crate::redact::escape(host)
    );
    Refusal::new(StatusCode::FORBIDDEN, "not_intercepted", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connect_target_is_read_from_its_authority() {
        let t = |s: &str| match s.parse::<http::Uri>() {
            Ok(uri) => Target::of(&uri),
            Err(_) => Err(Refusal::bad("invalid_target", "unparsable")),
        };
        assert_eq!(
            t("Hooks.Example.:8443").unwrap(),
            Target {
                host: "hooks.example".into(),
                port: 8443,
                authority: "hooks.example:8443".into()
            }
        );
        let v6 = t("[::1]:443").unwrap();
        assert_eq!((v6.host.as_str(), v6.authority.as_str()), ("::1", "[::1]:443"));
        assert_eq!(t("h.example").unwrap().port, 443);
        assert_eq!(t("[0:0::1]:8443").unwrap().authority, "[::1]:8443");
        for bad in ["/path", "*.r.example:443", "a,b.example:443", "a$b:443", "*:443"] {
            assert_eq!(t(bad).map_err(|e| e.code()).unwrap_err(), "invalid_target", "{bad}");
        }
    }

    #[test]
    fn a_refused_connect_names_the_host_and_the_keys() {
        let r = not_intercepted("evil.example");
        assert_eq!(r.code(), "not_intercepted");
        assert!(r.to_string().contains("evil.example"));
        assert!(r.to_string().contains("[intercept] hosts nor passthrough"));
    }
}
