//! The TLS server configs of intercepted hosts: a leaf certificate per host, minted on
//! demand by the [`Ca`] and cached, short-lived and minted again before it expires.
//!
//! The cache is bounded ([`MAX_HOSTS`]): `*.suffix` patterns can name any number of hosts,
//! and a full cache drops its stalest entry. One key pair serves every leaf of the process
//! (a new one at each start): the certificates are what rotate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rcgen::KeyPair;
use rustls::pki_types::PrivateKeyDer;
use rustls::ServerConfig;

use super::ca::{Ca, CaError};

/// How long a leaf is valid.
pub const LEAF_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// How long a leaf is served before a new one is minted: well before it expires, so a
/// client that connects at the end of the window still gets hours of validity.
pub const LEAF_REFRESH: Duration = Duration::from_secs(12 * 3600);
/// Hosts whose config is kept at once.
pub const MAX_HOSTS: usize = 1024;

/// The per-host server configs.
pub struct Leaves {
    ca: Ca,
    key: KeyPair,
    cache: Mutex<HashMap<String, (Arc<ServerConfig>, SystemTime)>>,
}

impl Leaves {
    /// Leaves signed by `ca`, with a fresh key. A CA whose trust anchor signs leaves itself
    /// is served as before, with a warning: its constraints do not bind every client.
    pub fn new(ca: Ca) -> Result<Leaves, CaError> {
        if ca.signs_with_anchor_key() {
            let (cert, key) = ca.files();
            tracing::warn!(cert = %cert.display(), key = %key.display(),
                "the intercept CA's trusted certificate signs leaves with its own key, which can then sign for any name \
                 as far as clients that skip a trust anchor's name constraints (Java's) are concerned; to have courier \
                 make a root and a name-constrained intermediate instead, delete both files and restart \
                 (the apps must then trust the new certificate)");
        }
        let key = KeyPair::generate().map_err(|e| CaError::Invalid(format!("making a key: {e}")))?;
        Ok(Leaves {
            ca,
            key,
            cache: Mutex::default(),
        })
    }

    /// The server config for `host` at `now`: cached while its leaf is younger than
    /// [`LEAF_REFRESH`], else minted (ALPN h2 and http/1.1).
    pub fn config(&self, host: &str, now: SystemTime) -> Result<Arc<ServerConfig>, CaError> {
        let fresh = |minted: &SystemTime| now.duration_since(*minted).is_ok_and(|age| age < LEAF_REFRESH);
        if let Some((config, _)) = self.lock().get(host).filter(|(_, minted)| fresh(minted)) {
            return Ok(config.clone());
        }
        let config = self.server_config(host, now)?;
        let mut cache = self.lock();
        if cache.len() >= MAX_HOSTS && !cache.contains_key(host) {
            let stalest = cache
                .iter()
                .min_by_key(|(_, (_, minted))| *minted)
                .map(|(h, _)| h.clone());
            if let Some(stalest) = stalest {
                cache.remove(&stalest);
            }
        }
        cache.insert(host.to_string(), (config.clone(), now));
        Ok(config)
    }

    /// Hosts cached now.
    #[cfg(test)]
    pub fn cached(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Arc<ServerConfig>, SystemTime)>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn server_config(&self, host: &str, now: SystemTime) -> Result<Arc<ServerConfig>, CaError> {
        let mut chain = vec![self.ca.mint(host, &self.key, now, LEAF_LIFETIME)?];
        chain.extend_from_slice(self.ca.chain());
        let key = PrivateKeyDer::try_from(self.key.serialize_der()).map_err(|e| CaError::Invalid(e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
            .map_err(|e| CaError::Invalid(format!("the TLS config for {host:?}: {e}")))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HostPattern;

    fn leaves() -> (tempfile::TempDir, Leaves) {
        let dir = tempfile::tempdir().unwrap();
        let hosts = [HostPattern::parse("*.r.example").unwrap()];
        let now = crate::intercept::wall(&crate::clock::SystemClock);
        let ca = Ca::load_or_create(&dir.path().join("ca.pem"), &dir.path().join("ca.key"), &hosts, now).unwrap();
        (dir, Leaves::new(ca).unwrap())
    }

    #[test]
    fn a_leaf_is_reused_until_its_refresh_time_then_minted_again() {
        let (_dir, l) = leaves();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000);
        let first = l.config("a.r.example", t0).unwrap();
        assert!(Arc::ptr_eq(
            &first,
            &l.config("a.r.example", t0 + LEAF_REFRESH - Duration::from_secs(1))
                .unwrap()
        ));
        let later = l.config("a.r.example", t0 + LEAF_REFRESH).unwrap();
        assert!(!Arc::ptr_eq(&first, &later), "minted again before it expires");
        assert_eq!(later.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
        assert!(LEAF_REFRESH < LEAF_LIFETIME);
    }

    #[test]
    fn the_cache_is_bounded() {
        let (_dir, l) = leaves();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000);
        for i in 0..MAX_HOSTS + 10 {
            l.config(&format!("h{i}.r.example"), t0 + Duration::from_secs(i as u64))
                .unwrap();
        }
        assert_eq!(l.cached(), MAX_HOSTS);
    }
}
