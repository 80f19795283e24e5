//! The ingress Unix domain socket file: bound with its mode set, a stale file from a
//! crash replaced, and the file removed again at shutdown; never in a directory where
//! someone else could replace it ([`check_directory`]).

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
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
        check_directory(path).map_err(|m| io::Error::new(io::ErrorKind::PermissionDenied, m))?;
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

/// Refuses a socket at `path` when its directory, or one above it, lets a user other than
/// courier's own and root remove or rename entries: that user could unlink the socket (or
/// move its directory aside) and listen in its place, receiving the app's requests with
/// their tokens and secrets. A Kubernetes `emptyDir` on disk is such a directory (0777, no
/// sticky bit). The sticky bit makes a shared directory fine: only an entry's owner may
/// remove it then. The directories are checked both as written and as resolved: the
/// kernel resolves the path at each connect, so a link in a directory others may write
/// could be pointed elsewhere; a directory that does not exist yet is left to the bind.
pub fn check_directory(path: &Path) -> Result<(), String> {
    let parent = parent_of(path);
    let real = match std::fs::canonicalize(parent) {
        Ok(real) => real,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(format!(
                "cannot inspect the socket's directory {}: {e}",
                parent.display()
            ))
        }
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    for dir in parent.ancestors().chain(real.ancestors()) {
        if dir.as_os_str().is_empty() {
            continue;
        }
        let meta = std::fs::metadata(dir).map_err(|e| format!("cannot inspect {}: {e}", dir.display()))?;
        if let Some(why) = exposed(meta.uid(), meta.mode(), me) {
            return Err(format!(
                "{} is in {}, which {why}: another user could replace the socket and receive the \
                 app's requests; use a directory only courier's user or root can write (chmod \
                 0755), or set its sticky bit (chmod +t)",
                path.display(),
                dir.display()
            ));
        }
    }
    Ok(())
}

/// Why a directory of `owner` with `mode` lets a user other than `me` and root replace an
/// entry in it, or `None`.
fn exposed(owner: u32, mode: u32, me: u32) -> Option<String> {
    if owner != me && owner != 0 {
        return Some(format!("is owned by another user (uid {owner})"));
    }
    let writers = match mode & 0o022 {
        0 => return None,
        0o020 => "its group",
        _ => "every user",
    };
    (mode & 0o1000 == 0).then(|| {
        format!(
            "is writable by {writers} without the sticky bit (mode {:04o})",
            mode & 0o7777
        )
    })
}

/// The directory `path` is in (`.` for a bare name).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Creates a new directory with mode 0700 and a random name beside `path` (same parent, so
/// a rename from it into `path` stays on one filesystem). `create` fails if the name exists,
/// so a directory or link someone else made is never used.
fn private_dir_beside(path: &Path) -> io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = parent_of(path).join(format!(
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

    #[test]
    fn a_directory_others_may_write_without_the_sticky_bit_is_exposed() {
        let (me, other) = (1000, 1001);
        for (owner, mode) in [(me, 0o40755), (0, 0o40755), (0, 0o41777), (me, 0o41770), (me, 0o40700)] {
            assert_eq!(exposed(owner, mode, me), None, "{owner} {mode:o}");
        }
        let why = |owner, mode| exposed(owner, mode, me).unwrap();
        assert!(why(0, 0o40777).contains("every user without the sticky bit (mode 0777)"));
        // An emptyDir with fsGroup: setgid, still no sticky bit.
        assert!(why(0, 0o42777).contains("(mode 2777)"));
        assert!(why(me, 0o40775).contains("its group"));
        assert!(why(other, 0o40755).contains("uid 1001"));
        assert!(
            why(other, 0o41777).contains("another user"),
            "its owner may still remove"
        );
    }

    #[test]
    fn the_socket_directory_and_those_above_it_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let nested = shared.join("mine");
        std::fs::create_dir(&nested).unwrap();
        for path in [shared.join("s.sock"), nested.join("s.sock")] {
            let refused = check_directory(&path).unwrap_err();
            assert!(refused.contains("which is writable by every user"), "{refused}");
            assert!(SocketFile::bind(&path, 0o600).is_err());
        }
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(check_directory(&nested.join("s.sock")), Ok(()));
        assert_eq!(
            check_directory(&shared.join("missing/s.sock")),
            Ok(()),
            "left to the bind"
        );
    }

    #[test]
    fn a_link_in_a_directory_others_may_write_is_refused_though_its_target_is_safe() {
        let dir = tempfile::tempdir().unwrap();
        let (shared, safe) = (dir.path().join("shared"), dir.path().join("safe"));
        std::fs::create_dir(&shared).unwrap();
        std::fs::create_dir(&safe).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(&safe, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&safe, shared.join("link")).unwrap();
        assert_eq!(check_directory(&safe.join("s.sock")), Ok(()));
        // Anyone could point `link` elsewhere between two connects.
        let refused = check_directory(&shared.join("link/s.sock")).unwrap_err();
        assert!(refused.contains("which is writable by every user"), "{refused}");
    }
}
