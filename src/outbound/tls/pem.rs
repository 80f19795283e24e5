//! Reading the PEM files named by `[tls]` and `[[host]]`. Every error is one line naming the
//! setting and the file, and never quotes the file's content (a key file's bytes are a
//! secret, and a parse error could echo them).

use std::io::Read;
use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::ConfigError;

/// Larger than any CA bundle (the whole Mozilla set is ~250 KiB): a path pointing at
/// something else (a log, a device) is refused rather than read whole.
const MAX_PEM_FILE: u64 = 8 << 20;

/// The error for the setting `key` naming `path`.
pub(super) fn error(key: &str, path: &Path, problem: impl std::fmt::Display) -> ConfigError {
    ConfigError::invalid(key, format_args!("({}) {problem}", path.display()))
}

pub(super) fn read(key: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    let file = std::fs::File::open(path).map_err(|e| error(key, path, format_args!("cannot be read: {e}")))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| error(key, path, format_args!("cannot be read: {e}")))?;
    if bytes.len() as u64 > MAX_PEM_FILE {
        return Err(error(key, path, "is over 8 MiB: not a PEM file"));
    }
    Ok(bytes)
}

/// The certificates of a PEM file (other sections, such as a key, are skipped); at least one.
pub(super) fn certificates(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let bytes = read(key, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| error(key, path, "is not valid PEM (a CERTIFICATE section is cut or mangled)"))?;
    if certs.is_empty() {
        return Err(error(
            key,
            path,
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(certs)
}

/// The first private key of a PEM file: PKCS#8, PKCS#1 (RSA) or SEC1 (EC).
pub(super) fn private_key(key: &str, path: &Path) -> Result<PrivateKeyDer<'static>, ConfigError> {
    let bytes = read(key, path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|_| {
        error(
            key,
            path,
            "holds no readable PEM private key (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_read_with_errors_naming_key_and_file_only() {
        let dir = tempfile::tempdir().unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["ca.test".to_string()]).unwrap();
        let both = dir.path().join("both.pem");
        // A certificate and its key in one file: each reader takes its own section.
        std::fs::write(&both, format!("{}{}", ca.cert.pem(), ca.signing_key.serialize_pem())).unwrap();
        assert_eq!(certificates("tls.ca_file[0]", &both).unwrap().len(), 1);
        assert!(private_key("host[0].client_key", &both).is_ok());

        let missing = dir.path().join("missing.pem");
        let e = certificates("tls.ca_file[0]", &missing).unwrap_err().to_string();
        assert!(
            e.starts_with("invalid config: tls.ca_file[0] (") && e.contains("cannot be read"),
            "{e}"
        );

        // A key file whose body is mangled: the error says so without echoing any of it.
        let secret_body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7SECRETSECRET";
        let bad_key = dir.path().join("bad.key");
        std::fs::write(
            &bad_key,
            format!("-----BEGIN PRIVATE KEY-----\n{secret_body}!!\n-----END PRIVATE KEY-----\n"),
        )
        .unwrap();
        let e = private_key("host[2].client_key", &bad_key).unwrap_err().to_string();
        assert!(e.contains("host[2].client_key") && e.contains("bad.key"), "{e}");
        assert!(!e.contains("SECRET") && !e.contains("MIIE"), "{e}");
        // Every section is decoded, so a mangled one refuses the file.
        let e = certificates("tls.ca_file[1]", &bad_key).unwrap_err().to_string();
        assert!(e.contains("is not valid PEM") && !e.contains("SECRET"), "{e}");
        let key_only = dir.path().join("key-only.pem");
        std::fs::write(&key_only, ca.signing_key.serialize_pem()).unwrap();
        let e = certificates("tls.ca_file[1]", &key_only).unwrap_err().to_string();
        assert!(e.contains("holds no PEM certificate"), "{e}");

        let cut = dir.path().join("cut.pem");
        let pem = ca.cert.pem();
        std::fs::write(&cut, &pem[..pem.len() / 2]).unwrap();
        let e = certificates("tls.ca_file[0]", &cut).unwrap_err().to_string();
        assert!(e.contains("not valid PEM"), "{e}");
        let e = private_key("host[0].client_key", &cut).unwrap_err().to_string();
        assert!(e.contains("no readable PEM private key"), "{e}");
    }
}
