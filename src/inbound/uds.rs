//! The ingress Unix domain socket file: bound with its mode set, a stale file from a
//! crash replaced, and the file removed again at shutdown.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

/// A bound socket file; [`SocketFile::remove`] deletes it at shutdown.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
}

impl SocketFile {
    /// Binds `path` and sets its permission bits to `mode`.
    ///
    /// A socket file left by a process that died without cleaning up would make the bind
    /// fail with "address in use", so an existing *socket* at `path` is removed first.
    /// Anything else there (a regular file, a directory) is an operator's mistake and is
    /// left alone: the bind then fails and says so. Two courier processes on one path are
    /// not detected (the second replaces the first's file); the data directory lock refuses
    /// a second process on the same store anyway.
    pub fn bind(path: &Path, mode: u32) -> io::Result<(UnixListener, SocketFile)> {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                // The rename below would replace it: refuse, as a bind on it would.
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} exists and is not a socket", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        // Bound inside a fresh directory of our own (0700, a random name, created by this
        // call so nothing can be planted in it), given its mode there, then renamed into
        // place: a client connecting to `path` never finds a socket with the umask's wider
        // mode, no other user can guess or swap the staging name, and the chmod cannot be
        // sent through a symlink. The mode is not set through the umask, which is
        // process-wide while other threads create files.
        let staging_dir = private_dir_beside(path)?;
        let staging = staging_dir.join("s");
        let placed = UnixListener::bind(&staging).and_then(|listener| {
            std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(mode))?;
            std::fs::rename(&staging, path)?;
            Ok(listener)
        });
        let _ = std::fs::remove_file(&staging);
        let _ = std::fs::remove_dir(&staging_dir);
        let listener = placed?;
        Ok((
            listener,
            SocketFile {
                path: path.to_path_buf(),
            },
        ))
    }

    /// Deletes the socket file (clients then get "no such file" instead of "connection
    /// refused"); an already missing file is fine.
    pub fn remove(&self) {
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the ingress socket file"),
        }
    }
}

/// Creates a new directory with mode 0700 and a random name beside `path` (same parent, so
/// a rename from it into `path` stays on one filesystem). `create` fails if the name exists,
/// so a directory or link someone else made is never used.
fn private_dir_beside(path: &Path) -> io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let dir = parent.join(format!(
        ".courier-bind-{:016x}",
        rand::Rng::random::<u64>(&mut crate::clock::rng())
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_socket_gets_its_mode_and_no_staging_entry_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ingress.sock");
        let (_listener, file) = SocketFile::bind(&path, 0o660).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o660);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["ingress.sock"], "the private staging directory is gone");
        // A stale socket is replaced; anything else is refused and left alone.
        drop(_listener);
        let (_again, _) = SocketFile::bind(&path, 0o600).unwrap();
        file.remove();
        std::fs::write(&path, b"not a socket").unwrap();
        assert!(SocketFile::bind(&path, 0o600).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");
    }
}
