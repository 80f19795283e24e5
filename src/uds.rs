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
        // Bound under a temporary name, given its mode, then renamed into place: a client
        // connecting to `path` never finds a socket with the umask's wider mode (a
        // connection made then would be served). The mode is not set through the umask,
        // which is process-wide while other threads create files.
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let staging = path.with_file_name(format!(".{name}.{}.binding", std::process::id()));
        let _ = std::fs::remove_file(&staging);
        let listener = UnixListener::bind(&staging)?;
        let placed = std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(mode))
            .and_then(|()| std::fs::rename(&staging, path));
        if let Err(e) = placed {
            let _ = std::fs::remove_file(&staging);
            return Err(e);
        }
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
