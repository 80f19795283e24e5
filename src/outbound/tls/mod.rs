//! TLS toward receivers: the material built from the configuration ([`TlsMaterial`]: the
//! trusted roots and one rustls `ClientConfig` per `[[host]]` that has TLS keys, plus the
//! default one), and the handshake step of the outbound connector (in `connect`).
//!
//! Reload: [`TlsMaterial::from_config`] does no network and is the whole recipe, so a
//! reload builds new material from the new configuration, and the transport a new client
//! with it: every connection made for an attempt from then on uses it; a pooled connection
//! keeps the identity and trust it was made with until it is closed (idle past
//! `delivery.idle_connection_timeout`, over `delivery.max_idle_connections`, or by the
//! receiver).
//!
//! Per host, not per route: hyper-util pools connections by scheme and authority, so a
//! pooled connection may carry requests of every route to that host. A client identity per
//! route would let one route's identity be reused for another's.

mod connect;
mod pem;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use crate::config::{Config, ConfigError, TlsRoots, TlsVersion};

pub use connect::{connect, Handshake, Io, MaybeTls, TlsError};

/// The TLS settings in force: trusted roots and client identities, by host.
pub struct TlsMaterial {
    /// For every host without TLS keys of its own.
    default: Arc<ClientConfig>,
    /// By `host:port`, as `[[host]] host` is normalised (and `crate::outbound::conn_cap::host_key`
    /// names a target).
    hosts: HashMap<String, Arc<ClientConfig>>,
}

impl TlsMaterial {
    /// Builds the material from `config`'s `[tls]` and `[[host]]` TLS keys: reads every PEM
    /// file (and the system store when `tls.roots` asks for it), checks each client key
    /// against its certificate, and builds the rustls configs. No network.
    pub fn from_config(config: &Config) -> Result<TlsMaterial, ConfigError> {
        let tls = &config.tls;
        let mut roots = RootCertStore::empty();
        if matches!(tls.roots, TlsRoots::Webpki | TlsRoots::Both) {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        }
        if matches!(tls.roots, TlsRoots::Native | TlsRoots::Both) {
            add_native_roots(&mut roots)?;
        }
        add_ca_files(&mut roots, "tls.ca_file", &tls.ca_file)?;
        let roots = Arc::new(roots);
        let default = client_config(roots.clone(), tls.min_version, None)
            .map_err(|e| ConfigError::invalid("tls", format_args!("cannot be used: {e}")))?;
        let mut hosts = HashMap::new();
        for (i, host) in config.hosts.iter().enumerate() {
            if !host.tls.is_set() {
                continue;
            }
            let host_roots = if host.tls.ca_file.is_empty() {
                roots.clone()
            } else {
                let mut own = (*roots).clone();
                add_ca_files(&mut own, &format!("host[{i}].ca_file"), &host.tls.ca_file)?;
                Arc::new(own)
            };
            // Config::validate refuses one without the other.
            let paths = host.tls.client_cert.as_ref().zip(host.tls.client_key.as_ref());
            let identity = match paths {
                Some((cert, key)) => Some((
                    pem::certificates(&format!("host[{i}].client_cert"), cert)?,
                    pem::private_key(&format!("host[{i}].client_key"), key)?,
                )),
                None => None,
            };
            let built = client_config(host_roots, tls.min_version, identity).map_err(|e| match paths {
                Some((cert, key)) => identity_error(i, cert, key, &e),
                None => ConfigError::invalid(&format!("host[{i}]"), format_args!("cannot be used: {e}")),
            })?;
            hosts.insert(host.host.clone(), Arc::new(built));
        }
        Ok(TlsMaterial {
            default: Arc::new(default),
            hosts,
        })
    }

    /// The rustls config for a connection to `host_key` (`host:port`).
    pub fn for_host(&self, host_key: &str) -> Arc<ClientConfig> {
        self.hosts.get(host_key).unwrap_or(&self.default).clone()
    }
}

/// A client certificate chain and its key.
type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn client_config(
    roots: Arc<RootCertStore>,
    min_version: TlsVersion,
    identity: Option<Identity>,
) -> Result<ClientConfig, rustls::Error> {
    let versions: &[&'static rustls::SupportedProtocolVersion] = match min_version {
        TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::Tls13 => &[&rustls::version::TLS13],
    };
    let builder = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(versions)?
        .with_root_certificates(roots);
    let mut config = match identity {
        // Checks that the key is one ring can sign with and that it matches the chain's
        // first certificate.
        Some((chain, key)) => builder.with_client_auth_cert(chain, key)?,
        None => builder.with_no_client_auth(),
    };
    // As before this module: HTTP/2 when the receiver offers it, else HTTP/1.1.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

fn identity_error(i: usize, cert: &std::path::Path, key: &std::path::Path, e: &rustls::Error) -> ConfigError {
    let key_name = format!("host[{i}].client_key");
    match e {
        rustls::Error::InconsistentKeys(_) => pem::error(
            &key_name,
            key,
            format_args!("does not match host[{i}].client_cert ({})", cert.display()),
        ),
        rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => pem::error(
            &format!("host[{i}].client_cert"),
            cert,
            format_args!("cannot be used: {e}"),
        ),
        // ring cannot sign with it (an unsupported algorithm or curve); rustls's text names
        // the kind of problem, never the key.
        _ => pem::error(&key_name, key, format_args!("cannot be used: {e}")),
    }
}

fn add_ca_files(roots: &mut RootCertStore, key: &str, files: &[PathBuf]) -> Result<(), ConfigError> {
    for (j, path) in files.iter().enumerate() {
        let key = format!("{key}[{j}]");
        for cert in pem::certificates(&key, path)? {
            roots.add(cert).map_err(|e| {
                pem::error(
                    &key,
                    path,
                    format_args!("holds a certificate that cannot be a root: {e}"),
                )
            })?;
        }
    }
    Ok(())
}

fn add_native_roots(roots: &mut RootCertStore) -> Result<(), ConfigError> {
    let found = rustls_native_certs::load_native_certs();
    // A system store commonly holds a few certificates webpki cannot parse; they are
    // skipped, as every rustls user of the store does.
    let (added, _skipped) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map(|e| format!(": {e}"))
            .unwrap_or_else(|| " (install ca-certificates, or set SSL_CERT_FILE)".to_string());
        return Err(ConfigError::invalid(
            "tls.roots",
            format_args!("asks for the system store, and it has no usable certificate{why}"),
        ));
    }
    Ok(())
}

/// The PEM text of the `[tls] ca_file` bundles joined, for clients that take PEM bytes
/// (the fleet's `rediss://` connection); `None` when there are none.
pub fn ca_bundle(files: &[std::path::PathBuf]) -> Result<Option<Vec<u8>>, ConfigError> {
    if files.is_empty() {
        return Ok(None);
    }
    let mut bundle = Vec::new();
    for file in files {
        bundle.extend(pem::read("tls.ca_file", file)?);
        bundle.push(b'\n');
    }
    Ok(Some(bundle))
}

#[cfg(test)]
mod tests;
