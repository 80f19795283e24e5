//! Store key files (`[store] encryption_key_files`): each holds the base64 of 32 random
//! bytes, readable by its owner only. A file that is missing, unreadable, readable by group
//! or others, or not exactly a key stops courier with one line naming the file; the line
//! never shows the file's content.

use std::path::{Path, PathBuf};

use base64::Engine;

use super::seal::{KeyId, Keyring, KEY_LEN};

/// Reads the key files (`[store] encryption_key_files`), the first sealing: the keyring, and each file with its key's id.
pub fn load(paths: &[PathBuf]) -> Result<(Keyring, Vec<(PathBuf, KeyId)>), String> {
    let mut keys = Vec::with_capacity(paths.len());
    let mut named = Vec::with_capacity(paths.len());
    for path in paths {
        let key = read(path).map_err(|why| format!("store.encryption_key_files: {}: {why}", path.display()))?;
        let id = KeyId::of(&key);
        if let Some((first, _)) = named.iter().find(|(_, seen)| *seen == id) {
            let first: &PathBuf = first;
            return Err(format!(
                "store.encryption_key_files: {} holds the same key as {} (list each key once)",
                path.display(),
                first.display()
            ));
        }
        keys.push(key);
        named.push((path.clone(), id));
    }
    Ok((Keyring::new(&keys), named))
}

/// One key file's key, or why it cannot be used (see [`crate::sys::owner_only`]).
fn read(path: &Path) -> Result<[u8; KEY_LEN], String> {
    use crate::sys::owner_only::{self, OwnerOnlyError};
    // A key file is 45 bytes; anything much longer is not one.
    let bytes = owner_only::read(path, 1024).map_err(|e| match e {
        OwnerOnlyError::Io(e) if e.kind() == std::io::ErrorKind::NotFound => "no such file".to_string(),
        OwnerOnlyError::Io(e) => format!("cannot read it: {e}"),
        other => other.to_string(),
    })?;
    let text = String::from_utf8(bytes).map_err(|_| "is not a key file (not text)".to_string())?;
    decode(&text)
}

/// The key in a key file's text (surrounding whitespace ignored).
fn decode(text: &str) -> Result<[u8; KEY_LEN], String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|_| "is not base64 (value not shown); make one with `courier keys generate --store`".to_string())?;
    bytes.try_into().map_err(|b: Vec<u8>| {
        format!(
            "holds {} bytes, not {KEY_LEN}; make one with `courier keys generate --store`",
            b.len()
        )
    })
}

/// A new key file's text: the base64 of 32 bytes from the operating system, and a newline.
pub fn generate() -> Result<String, String> {
    use rand::TryRngCore;
    let mut key = [0u8; KEY_LEN];
    rand::rngs::OsRng
        .try_fill_bytes(&mut key)
        .map_err(|e| format!("cannot read random bytes from the operating system: {e}"))?;
    Ok(format!("{}\n", base64::engine::general_purpose::STANDARD.encode(key)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn generated_keys_load_in_order_with_their_ids() {
        let dir = tempfile::tempdir().unwrap();
        let one = write(dir.path(), "one.key", &generate().unwrap(), 0o600);
        let two = write(dir.path(), "two.key", &generate().unwrap(), 0o400);
        let (ring, named) = load(&[one.clone(), two.clone()]).unwrap();
        assert_eq!(named.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(), vec![one, two]);
        assert_eq!(ring.ids(), named.iter().map(|(_, id)| *id).collect::<Vec<_>>());
        assert_eq!(ring.sealing(), Some(named[0].1));
        assert_eq!(load(&[]).unwrap().0.sealing(), None);
    }

    #[test]
    fn bad_key_files_are_refused_with_one_line_that_never_shows_the_content() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let good = generate().unwrap();
        let cases = [
            (d.join("absent.key"), "no such file"),
            (
                write(d, "open.key", &good, 0o644),
                "readable by group or others (mode 0644)",
            ),
            (write(d, "group.key", &good, 0o640), "(mode 0640)"),
            (
                write(d, "short.key", "c2VjcmV0LXNob3J0", 0o600),
                "holds 12 bytes, not 32",
            ),
            (
                write(d, "text.key", "not base64 secret!", 0o600),
                "is not base64 (value not shown)",
            ),
            (d.to_path_buf(), "is not a regular file"),
        ];
        for (path, want) in cases {
            let err = load(std::slice::from_ref(&path)).unwrap_err();
            assert!(
                err.starts_with(&format!("store.encryption_key_files: {}: ", path.display())),
                "{err}"
            );
            assert!(err.contains(want), "{err}");
            assert!(!err.contains('\n') && !err.contains("secret"), "{err}");
        }
        let a = write(d, "a.key", &good, 0o600);
        let b = write(d, "b.key", &good, 0o600);
        let err = load(&[a, b]).unwrap_err();
        assert!(err.contains("holds the same key as"), "{err}");
    }
}
