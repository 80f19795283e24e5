//! The DNS seam. The HTTP client resolves through a [`Resolve`] implementation, and the
//! egress policy is applied to the addresses it returns, inside the connector, so the
//! connection goes to exactly the addresses that were checked. Tests give a resolver that
//! maps any name to any address (including one that changes between attempts) without
//! touching real DNS.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

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

/// A resolver with a fixed table, changeable while running: for tests.
#[derive(Debug, Default, Clone)]
pub struct StaticResolver {
    table: Arc<Mutex<HashMap<String, Vec<IpAddr>>>>,
}

impl StaticResolver {
    /// An empty table: every name fails to resolve.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes `host` resolve to `addrs` from now on.
    pub fn set(&self, host: &str, addrs: Vec<IpAddr>) {
        self.table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(host.to_ascii_lowercase(), addrs);
    }
}

impl Resolve for StaticResolver {
    fn resolve(&self, host: &str) -> ResolveFuture {
        let found = self
            .table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&host.to_ascii_lowercase())
            .cloned();
        let host = host.to_string();
        Box::pin(async move {
            found.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("no such host {host}")))
        })
    }
}
