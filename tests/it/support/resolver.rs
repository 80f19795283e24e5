//! A resolver with a fixed table, changeable while running: courier's DNS seam
//! (`courier::outbound::resolver::Resolve`) answered without touching real DNS.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use courier::outbound::resolver::{Resolve, ResolveFuture};

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
        self.table().insert(host.to_ascii_lowercase(), addrs);
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<IpAddr>>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Resolve for StaticResolver {
    fn resolve(&self, host: &str) -> ResolveFuture {
        let found = self.table().get(&host.to_ascii_lowercase()).cloned();
        let host = host.to_string();
        Box::pin(async move {
            found.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("no such host {host}")))
        })
    }
}
