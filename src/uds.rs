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
            if meta.file_type().is_socket() {
                std::fs::remove_file(path)?;
            }
        }
        let listener = UnixListener::bind(path)?;
        let file = SocketFile {
            path: path.to_path_buf(),
        };
        // Set after the bind (not via umask): umask is process-wide and other threads may
        // create files meanwhile. Until this returns nothing is accepted, so a client
        // connecting in between only waits in the backlog.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        Ok((listener, file))
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
