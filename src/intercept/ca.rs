//! The interception CA: loaded from `[intercept] ca_cert` / `ca_key`, or made at first
//! start beside the store (`intercept-ca.pem`, and `intercept-ca.key` with mode 0600).
//!
//! A CA courier makes is two certificates (`ca_make.rs`): a root, which the apps trust and
//! whose key is dropped once it has signed the second, a name-constrained intermediate
//! whose key (in the key file, with its certificate) signs the leaves. Constraints in an
//! intermediate bind every RFC 5280 validator, so that key, if it leaked, could not mint a
//! certificate any client accepts for a host not listed when the CA was made. A key file
//! with no certificate after the key (an operator's own CA, or one an older courier made)
//! signs leaves with the trust anchor's own key: served, with a warning at each start.
//!
//! At every start the CA is checked against the configured hosts by verifying a leaf for
//! each with webpki (which applies the constraints, as clients do): a host added to the
//! config after the CA was made is refused with one line saying how to make a new one,
//! rather than served with certificates every client rejects.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData as _};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use crate::config::HostPattern;

/// Back-dating of every certificate, for clients whose clock is behind.
const SKEW: Duration = Duration::from_secs(3600);

/// The CA that signs the leaf certificates of intercepted hosts.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The certificates a leaf is sent with, between it and the trust anchor: the
    /// intermediate; none when the anchor's own key signs leaves.
    chain: Vec<CertificateDer<'static>>,
    /// The trust anchor (`ca_cert`).
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

    /// Reads the CA certificate (PEM), and the key file: the signing key, and the
    /// intermediate's certificate after it when there is one.
    fn load(cert: &Path, key: &Path) -> Result<Ca, CaError> {
        let cert_pem = std::fs::read_to_string(cert).map_err(io(cert))?;
        let (signing_key, chain) = files::read_key(key)?;
        let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| CaError::Invalid(format!("{}: not a PEM certificate ({e})", cert.display())))?;
        let (signing_cert, whose) = match chain.first() {
            Some(intermediate) => (intermediate, "the certificate after it".to_string()),
            None => (&cert_der, format!("the certificate at {}", cert.display())),
        };
        let unusable = |e: &dyn std::fmt::Display| {
            CaError::Invalid(format!(
                "the key at {}: {whose} is not a CA certificate ({e})",
                key.display()
            ))
        };
        let parsed = rustls::server::ParsedCertificate::try_from(signing_cert).map_err(|e| unusable(&e))?;
        if parsed.subject_public_key_info().as_ref() != signing_key.subject_public_key_info().as_slice() {
            return Err(CaError::Invalid(format!(
                "the key at {} is not the key of {whose}",
                key.display()
            )));
        }
        let issuer = Issuer::from_ca_cert_der(signing_cert, signing_key).map_err(|e| unusable(&e))?;
        Ok(Ca {
            issuer,
            chain,
            cert_der,
            cert_pem,
            cert_file: cert.to_path_buf(),
            key_file: key.to_path_buf(),
        })
    }

    /// Makes a root and an intermediate constrained to `hosts` and writes them: the
    /// intermediate's key and certificate to the key file (mode 0600), the root's
    /// certificate to `cert`; each under a temporary name first, so a crash leaves no
    /// half-written file. The root's key is never written.
    fn create(cert: &Path, key: &Path, hosts: &[HostPattern], now: SystemTime) -> Result<Ca, CaError> {
        let made = make::make(hosts, now)?;
        let key_text = files::key_file_text(&made.key, &[&made.intermediate]);
        files::write_new(key, key_text.as_bytes(), 0o600)?;
        files::write_new(cert, made.root.pem().as_bytes(), 0o644)?;
        tracing::info!(cert = %cert.display(), key = %key.display(),
            "made the intercept CA (a root, whose key is not kept, and a name-constrained intermediate); \
             the apps must trust its certificate (`courier intercept ca` prints it)");
        Ok(Ca {
            chain: vec![made.intermediate.der().clone()],
            cert_der: made.root.der().clone(),
            cert_pem: made.root.pem(),
            issuer: Issuer::new(made.intermediate_params, made.key),
            cert_file: cert.to_path_buf(),
            key_file: key.to_path_buf(),
        })
    }

    /// Whether the trust anchor's own key signs leaves (no intermediate in the key file):
    /// its name constraints, if any, then bind only the clients that read an anchor's.
    pub fn signs_with_anchor_key(&self) -> bool {
        self.chain.is_empty()
    }

    /// The certificates to send after a leaf (the intermediate).
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    /// The files: the certificate the apps trust, and the key file.
    pub fn files(&self) -> (&Path, &Path) {
        (&self.cert_file, &self.key_file)
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
        use rustls::CertificateError::{BadSignature, UnknownIssuer};
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
            let verified = verifier.verify_server_cert(&leaf, &self.chain, &server, &[], at);
            if let Err(rustls::Error::InvalidCertificate(BadSignature | UnknownIssuer)) = verified {
                return Err(CaError::Invalid(format!(
                    "the certificate in {} is not one the certificate at {} signed",
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

#[path = "ca_make.rs"]
mod make;

#[path = "ca_files.rs"]
mod files;

#[cfg(test)]
#[path = "ca_tests.rs"]
mod tests;
