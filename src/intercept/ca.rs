//! The interception CA: loaded from `[intercept] ca_cert` / `ca_key`, or made at first
//! start beside the store (`intercept-ca.pem`, and `intercept-ca.key` with mode 0600).
//!
//! A CA courier makes carries X.509 name constraints limited to the intercepted hosts, so
//! its key, if it leaked, could not mint a certificate any client accepts for another site.
//! A DNS constraint covers the name and every name under it (RFC 5280 §4.2.1.10); an IP
//! constraint is the one address. Where no name (or no address of a family) is listed, a
//! constraint that matches nothing useful (`invalid`, `0.0.0.0/32`, `::/128`) is put in its
//! place: with no constraint of a type, that type is not constrained at all.
//!
//! At every start the CA is checked against the configured hosts by verifying a leaf for
//! each with webpki (which applies the constraints, as clients do): a host added to the
//! config after the CA was made is refused with one line saying how to make a new one,
//! rather than served with certificates every client rejects.

use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CidrSubnet, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, NameConstraints,
};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use crate::config::HostPattern;

/// How long a CA courier makes is valid.
const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 86_400);
/// Back-dating of every certificate, for clients whose clock is behind.
const SKEW: Duration = Duration::from_secs(3600);

/// The CA that signs the leaf certificates of intercepted hosts.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    cert_file: PathBuf,
    key_file: PathBuf,
}

/// Why the CA cannot be used; one line each.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// A file could not be read or written.
    #[error("intercept CA: {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is not what it should be, or the CA does not cover a host.
    #[error("intercept CA: {0}")]
    Invalid(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CaError + '_ {
    move |source| CaError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Ca {
    /// The CA in `cert` and `key`; when neither file exists, a new one constrained to
    /// `hosts`, written there first. Either way it is checked, at `now`, to cover every host.
    pub fn load_or_create(cert: &Path, key: &Path, hosts: &[HostPattern], now: SystemTime) -> Result<Ca, CaError> {
        let ca = match (cert.exists(), key.exists()) {
            (false, false) => Ca::create(cert, key, hosts, now)?,
            (true, true) => Ca::load(cert, key)?,
            (true, false) | (false, true) => {
                let (there, missing) = if cert.exists() { (cert, key) } else { (key, cert) };
                return Err(CaError::Invalid(format!(
                    "{} exists but {} does not; give both files, or remove the other to make a new CA",
                    there.display(),
                    missing.display()
                )));
            }
        };
        ca.check_covers(hosts, now)?;
        Ok(ca)
    }

    /// For `check-config` (and before `serve` binds anything): the CA at `cert` and `key`,
    /// when there is one, checked against `hosts` at `now`; none yet is fine (the first
    /// start makes it). Whether there is one.
    pub fn check_existing(cert: &Path, key: &Path, hosts: &[HostPattern], now: SystemTime) -> Result<bool, CaError> {
        if !cert.exists() && !key.exists() {
            return Ok(false);
        }
        Ca::load_or_create(cert, key, hosts, now).map(|_| true)
    }

    /// Reads the CA certificate and key (PEM).
    fn load(cert: &Path, key: &Path) -> Result<Ca, CaError> {
        let cert_pem = std::fs::read_to_string(cert).map_err(io(cert))?;
        let key_pem = std::fs::read_to_string(key).map_err(io(key))?;
        warn_if_readable_by_others(key);
        let signing_key = KeyPair::from_pem(&key_pem)
            .map_err(|e| CaError::Invalid(format!("{}: not a PEM private key ({e})", key.display())))?;
        let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| CaError::Invalid(format!("{}: not a PEM certificate ({e})", cert.display())))?;
        let issuer = Issuer::from_ca_cert_der(&cert_der, signing_key)
            .map_err(|e| CaError::Invalid(format!("{}: not a CA certificate ({e})", cert.display())))?;
        Ok(Ca {
            issuer,
            cert_der,
            cert_pem,
            cert_file: cert.to_path_buf(),
            key_file: key.to_path_buf(),
        })
    }

    /// Makes a CA constrained to `hosts` and writes it: the key with mode 0600, each file
    /// under a temporary name first, so a crash leaves no half-written CA.
    fn create(cert: &Path, key: &Path, hosts: &[HostPattern], now: SystemTime) -> Result<Ca, CaError> {
        let signing_key = KeyPair::generate().map_err(|e| CaError::Invalid(format!("making a key: {e}")))?;
        let params = ca_params(hosts, now);
        let made = params
            .self_signed(&signing_key)
            .map_err(|e| CaError::Invalid(format!("making the certificate: {e}")))?;
        write_new(key, signing_key.serialize_pem().as_bytes(), 0o600)?;
        write_new(cert, made.pem().as_bytes(), 0o644)?;
        tracing::info!(cert = %cert.display(), key = %key.display(),
            "made the intercept CA; the apps must trust its certificate (`courier intercept ca` prints it)");
        Ok(Ca {
            cert_der: made.der().clone(),
            cert_pem: made.pem(),
            issuer: Issuer::new(params, signing_key),
            cert_file: cert.to_path_buf(),
            key_file: key.to_path_buf(),
        })
    }

    /// The CA certificate, PEM: what the apps trust.
    pub fn pem(&self) -> &str {
        &self.cert_pem
    }

    /// A leaf certificate for `host` (a name or an IP literal) with `key`, valid from an
    /// hour before `now` for `lifetime`, for TLS servers only.
    pub fn mint(
        &self,
        host: &str,
        key: &KeyPair,
        now: SystemTime,
        lifetime: Duration,
    ) -> Result<CertificateDer<'static>, CaError> {
        let mut params = CertificateParams::new(vec![host.to_string()])
            .map_err(|e| CaError::Invalid(format!("{host:?} is not a certificate name ({e})")))?;
        // The name is in the SAN. A subject CN that looks like a host name is checked
        // against the DNS constraints by OpenSSL when the SAN has no DNS name, so an IP
        // literal's certificate carries a CN that is not one.
        let common_name = match host.parse::<IpAddr>() {
            Ok(_) => "courier intercept",
            Err(_) => host,
        };
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.not_before = (now - SKEW).into();
        params.not_after = (now + lifetime).into();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(key, &self.issuer)
            .map_err(|e| CaError::Invalid(format!("signing a certificate for {host:?}: {e}")))?;
        Ok(cert.der().clone())
    }

    /// Verifies a leaf for a name each host pattern covers, as a client would (webpki,
    /// constraints included): a CA that cannot serve a host is refused at start.
    fn check_covers(&self, hosts: &[HostPattern], now: SystemTime) -> Result<(), CaError> {
        let at = UnixTime::since_unix_epoch(now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.cert_der.clone()).map_err(|e| {
            CaError::Invalid(format!(
                "{}: unusable as a trust anchor ({e})",
                self.cert_file.display()
            ))
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| CaError::Invalid(e.to_string()))?;
        let key = KeyPair::generate().map_err(|e| CaError::Invalid(format!("making a key: {e}")))?;
        for pattern in hosts {
            let name = sample_name(pattern);
            let leaf = self.mint(&name, &key, now, Duration::from_secs(3600))?;
            let server = ServerName::try_from(name.clone()).map_err(|e| CaError::Invalid(e.to_string()))?;
            let verified = verifier.verify_server_cert(&leaf, &[], &server, &[], at);
            if let Err(rustls::Error::InvalidCertificate(rustls::CertificateError::BadSignature)) = verified {
                return Err(CaError::Invalid(format!(
                    "the key at {} is not the key of the certificate at {}",
                    self.key_file.display(),
                    self.cert_file.display()
                )));
            }
            if let Err(e) = verified {
                return Err(CaError::Invalid(format!(
                    "intercept.hosts {pattern} is not covered by the CA at {} ({e}); it was made for other hosts: \
                     remove its certificate and key to make a new one (the apps must then trust the new certificate)",
                    self.cert_file.display()
                )));
            }
        }
        Ok(())
    }
}

/// A name `pattern` covers, to check the CA with.
fn sample_name(pattern: &HostPattern) -> String {
    match pattern {
        HostPattern::Name(name) => name.clone(),
        HostPattern::Under(suffix) => format!("courier-check.{suffix}"),
        HostPattern::Ip(ip) => ip.to_string(),
        HostPattern::Any => "courier-check.invalid".to_string(),
    }
}

/// A CA for `hosts`: may sign leaves (path length 0), constrained to their names.
fn ca_params(hosts: &[HostPattern], now: SystemTime) -> CertificateParams {
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "courier intercept CA");
    params.distinguished_name.push(DnType::OrganizationName, "courier");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = (now - SKEW).into();
    params.not_after = (now + CA_LIFETIME).into();
    params.name_constraints = Some(NameConstraints {
        permitted_subtrees: permitted(hosts),
        excluded_subtrees: Vec::new(),
    });
    params
}

/// The permitted subtrees for `hosts`, with a placeholder for each type none of them has.
fn permitted(hosts: &[HostPattern]) -> Vec<GeneralSubtree> {
    let mut trees = Vec::new();
    let (mut dns, mut v4, mut v6) = (false, false, false);
    for pattern in hosts {
        match pattern {
            HostPattern::Name(name) | HostPattern::Under(name) => {
                dns = true;
                trees.push(GeneralSubtree::DnsName(name.clone()));
            }
            HostPattern::Ip(IpAddr::V4(ip)) => {
                v4 = true;
                trees.push(GeneralSubtree::IpAddress(CidrSubnet::V4(ip.octets(), [255; 4])));
            }
            HostPattern::Ip(IpAddr::V6(ip)) => {
                v6 = true;
                trees.push(GeneralSubtree::IpAddress(CidrSubnet::V6(ip.octets(), [255; 16])));
            }
            HostPattern::Any => {}
        }
    }
    if !dns {
        trees.push(GeneralSubtree::DnsName("invalid".to_string()));
    }
    if !v4 {
        trees.push(GeneralSubtree::IpAddress(CidrSubnet::V4([0; 4], [255; 4])));
    }
    if !v6 {
        trees.push(GeneralSubtree::IpAddress(CidrSubnet::V6([0; 16], [255; 16])));
    }
    trees
}

/// Writes `bytes` to `path` with `mode` through a temporary file of its own (a stale one,
/// left by a crash, is removed first: an existing file would keep its old mode), renamed
/// into place, and the directory synced so the name survives a power loss.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CaError> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&tmp)(e)),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io(&tmp))?;
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Says once at start when the CA key can be read by the group or others.
fn warn_if_readable_by_others(key: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(key) {
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(key = %key.display(), mode = format!("{:04o}", meta.permissions().mode() & 0o7777),
                "the intercept CA key is readable by other users; anyone who reads it can mint certificates the apps trust (chmod 600)");
        }
    }
}

#[cfg(test)]
#[path = "ca_tests.rs"]
mod tests;
