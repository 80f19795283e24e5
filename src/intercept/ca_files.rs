//! The CA's files on disk: the key file read (refused unless its owner's only, as store
//! key files are) and new files written whole.
//!
//! The key file holds the key that signs leaves, then, when that key is an intermediate's,
//! the intermediate's certificate (and any others up to, not including, the certificate
//! the apps trust): the chain a TLS server sends with its leaf.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use rcgen::KeyPair;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::{io, CaError};

/// A key file is a key and a few certificates: anything much longer is not one.
const MAX_KEY_FILE: u64 = 64 << 10;

/// The signing key in `path`, and the certificates after it (none when the trust anchor's
/// own key signs leaves). The checks are of the file opened (a Kubernetes Secret's file is
/// a symlink: followed); one readable by group or others is refused, since whoever reads it
/// can mint certificates the apps trust.
pub(super) fn read_key(path: &Path) -> Result<(KeyPair, Vec<CertificateDer<'static>>), CaError> {
    use crate::sys::owner_only::{self, OwnerOnlyError};
    let refused = |why: String| CaError::Invalid(format!("{}: {why}", path.display()));
    let pem = owner_only::read(path, MAX_KEY_FILE).map_err(|e| match e {
        OwnerOnlyError::Io(e) => io(path)(e),
        OwnerOnlyError::NotRegular => refused(e.to_string()),
        OwnerOnlyError::Exposed(_) => refused(format!(
            "the intercept CA key {e}: whoever reads it can mint certificates the apps trust"
        )),
    })?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| refused(format!("not a PEM private key ({e})")))?;
    let key = KeyPair::try_from(&key).map_err(|e| refused(format!("not a usable private key ({e})")))?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| refused(format!("a certificate after the key is not PEM ({e})")))?;
    Ok((key, chain))
}

/// The text of a key file: `key`, then the certificates of `chain` (PEM).
pub(super) fn key_file_text(key: &KeyPair, chain: &[&rcgen::Certificate]) -> String {
    let mut text = key.serialize_pem();
    for cert in chain {
        text.push_str(&cert.pem());
    }
    text
}

/// Writes `bytes` to `path` with `mode` through a temporary file of its own (a stale one,
/// left by a crash, is removed first: an existing file would keep its old mode), renamed
/// into place, and the directory synced so the name survives a power loss.
pub(super) fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CaError> {
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
