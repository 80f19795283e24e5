//! Reading a file that holds a secret (a store key, the intercept CA's key): only a regular
//! file its owner alone may read, checked on the file opened (a Kubernetes Secret's file is
//! a symlink: followed), and never more than a cap, since whoever reads it holds the secret.

use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// Why a secret file was not read.
#[derive(Debug, thiserror::Error)]
pub enum OwnerOnlyError {
    /// Opening or reading it failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A directory, a device, a pipe…
    #[error("is not a regular file")]
    NotRegular,
    /// Group or others may read it (the permission bits shown).
    #[error("is readable by group or others (mode {0:04o}); make it the owner's only (chmod 600)")]
    Exposed(u32),
}

/// The first `max` bytes of `path`, when it is a regular file only its owner may read.
pub fn read(path: &Path, max: u64) -> Result<Vec<u8>, OwnerOnlyError> {
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(OwnerOnlyError::NotRegular);
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(OwnerOnlyError::Exposed(mode));
    }
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes)?;
    Ok(bytes)
}
