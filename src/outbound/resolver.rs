//! The DNS seam. The HTTP client resolves through a [`Resolve`] implementation, and the
//! egress policy is applied to the addresses it returns, inside the connector, so the
//! connection goes to exactly the addresses that were checked. Tests give a resolver that
//! maps any name to any address (including one that changes between attempts) without
//! touching real DNS (the integration tests' `support::resolver`).

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name;

use crate::outbound::egress::{is_loopback_name, EgressDenied, EgressPolicy, LOOPBACK_NAME_ADDRS};
use crate::outbound::BoxError;

/// A boxed resolve future.
pub type ResolveFuture = Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>;

/// Resolves a host name to addresses.
pub trait Resolve: Send + Sync + 'static {
    /// The addresses of `host` (a name, never an IP literal).
    fn resolve(&self, host: &str) -> ResolveFuture;
}

/// The system resolver (getaddrinfo on a blocking thread, via tokio).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str) -> ResolveFuture {
        let host = host.to_string();
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host.as_str(), 0)).await?;
            Ok(addrs.map(|a: SocketAddr| a.ip()).collect())
        })
    }
}

/// A resolver service for hyper-util's connector that applies the egress policy to
/// every resolved address.
#[derive(Clone)]
pub struct GuardedResolver {
    inner: Arc<dyn Resolve>,
    /// `None` for the proxy's own name: the operator named it, and it is usually private.
    policy: Option<Arc<EgressPolicy>>,
}

impl GuardedResolver {
    /// Resolves through `inner`, keeping only the addresses `policy` allows.
    pub fn new(inner: Arc<dyn Resolve>, policy: Arc<EgressPolicy>) -> Self {
        GuardedResolver {
            inner,
            policy: Some(policy),
        }
    }

    /// Resolves `egress.proxy`'s own name through `inner`, without the egress policy.
    pub fn unguarded(inner: Arc<dyn Resolve>) -> Self {
        GuardedResolver { inner, policy: None }
    }

    /// Whether the policy allows `ip` (always, unguarded).
    pub fn check(&self, ip: IpAddr) -> Result<(), EgressDenied> {
        self.policy.as_ref().map_or(Ok(()), |p| p.check(ip))
    }

    /// The first address of `host` (a name, or an IP literal with or without brackets) that
    /// the policy allows: what a proxy is asked to connect to.
    pub async fn checked_addr(&self, host: &str) -> Result<IpAddr, BoxError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            self.check(ip)?;
            return Ok(ip);
        }
        let name: Name = bare.parse()?;
        let mut addrs = tower_service::Service::call(&mut self.clone(), name).await?;
        addrs
            .next()
            .map(|a| a.ip())
            .ok_or_else(|| "the name resolved to no address".into())
    }
}

impl tower_service::Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        // RFC 6761: a loopback name is loopback without asking DNS (which may not even
        // answer for `localhost.`); the policy below still decides whether it may be used.
        let resolving: ResolveFuture = if is_loopback_name(name.as_str()) {
            let addrs = LOOPBACK_NAME_ADDRS.to_vec();
            Box::pin(async move { Ok(addrs) })
        } else {
            self.inner.resolve(name.as_str())
        };
        let guard = self.clone();
        Box::pin(async move {
            let ips = resolving.await?;
            let (mut allowed, mut first_denied) = (Vec::with_capacity(ips.len()), None);
            for ip in ips {
                match guard.check(ip) {
                    Ok(()) => allowed.push(SocketAddr::new(ip, 0)),
                    Err(denied) => {
                        first_denied.get_or_insert(denied);
                    }
                }
            }
            if allowed.is_empty() && guard.policy.is_some() {
                return Err(match first_denied {
                    Some(denied) => Box::new(denied) as BoxError,
                    None => "the name resolved to no address".into(),
                });
            }
            Ok(allowed.into_iter())
        })
    }
}
