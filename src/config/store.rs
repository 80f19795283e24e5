//! `[store]`: how the store keeps what it holds. Today one key: `encryption_key_files`,
//! the store keys payloads are sealed with at rest (see `crate::store::seal`). The files
//! are read and checked by `crate::store::keyfiles`, at start and by `check-config`.

use std::path::PathBuf;

use serde::Deserialize;

use super::summary::list;
use super::ConfigError;
use crate::store::{KeyId, Keyring};

section! {
    /// `[store]`.
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct StoreConfig {
        /// Files each holding a store key (base64 of 32 bytes, mode 0600): the first seals
        /// new values, every one opens. Empty: values are stored plain.
        pub encryption_key_files: Vec<PathBuf> = Vec::new(),
    }
}

impl StoreConfig {
    /// The keyring of the key files, and each file with its key's id; a bad file is one
    /// line naming it.
    pub fn keyring(&self) -> Result<(Keyring, Vec<(PathBuf, KeyId)>), ConfigError> {
        crate::store::keyfiles::load(&self.encryption_key_files).map_err(|e| ConfigError::new("invalid config", e))
    }

    /// What `check-config` says of the keys: which seals, which only open.
    pub fn keys_line(named: &[(PathBuf, KeyId)]) -> Option<String> {
        let ((first, id), rest) = named.split_first()?;
        let mut line = format!("store keys: seals with {id} ({})", first.display());
        if !rest.is_empty() {
            let others = list(rest.iter().map(|(path, id)| format!("{id} ({})", path.display())));
            line.push_str(&format!("; also opens {others}"));
        }
        Some(line)
    }

    /// The summary line (the files; `check-config` adds their key ids).
    pub(super) fn summary(&self) -> String {
        if self.encryption_key_files.is_empty() {
            return "store: payloads stored plain (no encryption_key_files)".to_string();
        }
        let files = list(self.encryption_key_files.iter().map(|p| p.display()));
        format!("store: payloads sealed at rest, encryption_key_files [{files}] (the first seals)")
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn key_files_are_read_and_summarised() {
        assert!(Config::default().summary().contains("store: payloads stored plain"));
        let c = Config::from_toml_str(
            "[store]\nencryption_key_files = [\"/k/new.key\", \"/k/old.key\"]\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.store.encryption_key_files.len(), 2);
        assert!(c.summary().contains(
            "store: payloads sealed at rest, encryption_key_files [/k/new.key, /k/old.key] (the first seals)"
        ));
    }
}
