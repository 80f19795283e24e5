//! What a store operation can fail with.

use std::path::PathBuf;

use super::seal::KeyId;
use super::CodecError;

/// A store operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// RocksDB reported an error (I/O, no space, corruption).
    #[error("storage error: {0}")]
    Rocks(#[from] rocksdb::Error),
    /// Another process holds the data directory.
    #[error("data dir {0} is locked by another courier process")]
    Locked(PathBuf),
    /// The data directory cannot be created or used.
    #[error("data dir {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// A stored record could not be decoded.
    #[error("stored record {key}: {source}")]
    Codec {
        /// Which record.
        key: String,
        /// Why.
        source: CodecError,
    },
    /// The store is closing; nothing new is accepted.
    #[error("store is closed")]
    Closed,
    /// A store call on a blocking thread panicked.
    #[error("store call panicked: {0}")]
    Panicked(String),
    /// The data dir holds values sealed with a key no configured key file holds: courier
    /// refuses to start (before it writes anything) rather than fail each delivery.
    #[error("{}", key_missing(*id, configured))]
    KeyMissing {
        /// The key the data needs.
        id: KeyId,
        /// The keys configured.
        configured: Vec<KeyId>,
    },
    /// The data dir was written by a newer courier, in a format this one does not read:
    /// courier refuses to start (before it writes anything) rather than misread it.
    #[error(
        "the data dir was written by a newer courier (store format {found}; this courier reads format {} and older): \
         run that courier again, or a newer one; nothing was changed",
        super::format::FORMAT
    )]
    NewerFormat {
        /// The format the data dir's marker names.
        found: u32,
    },
    /// A write a test made fail (as on a full disk); see [`Faults`].
    #[error("storage error: injected write failure")]
    Injected,
}

/// Fault injection is for tests and the simulator: test builds have the real switches
/// (`store::tests::faults`); in production every hook is a no-op.
#[cfg(not(test))]
#[derive(Debug, Default)]
pub struct Faults(());

#[cfg(not(test))]
impl Faults {
    pub(crate) fn fail_accept(&self) -> bool {
        false
    }
    pub(crate) fn fail_result(&self) -> bool {
        false
    }
    pub(crate) fn before_write(&self) -> Result<(), StoreError> {
        Ok(())
    }
    pub(crate) fn read_of(&self, _id: &str) -> Result<(), StoreError> {
        Ok(())
    }
    pub(crate) fn payload_missing(&self, _id: &str) -> bool {
        false
    }
}

/// Called at the end of every iterator walk; tests can make it fail (`store::tests::faults`).
#[cfg(not(test))]
pub(crate) fn walk_step() -> Result<(), StoreError> {
    Ok(())
}

impl StoreError {
    /// Makes a record under `key` that does not decode a store error.
    pub(crate) fn codec(key: impl Into<String>) -> impl FnOnce(CodecError) -> StoreError {
        let key = key.into();
        move |source| StoreError::Codec { key, source }
    }

    /// The same error again, for answering several callers with one failure.
    pub(crate) fn again(&self) -> StoreError {
        match self {
            StoreError::Rocks(e) => StoreError::Rocks(e.clone()),
            StoreError::Closed => StoreError::Closed,
            StoreError::Injected => StoreError::Injected,
            other => StoreError::Panicked(other.to_string()),
        }
    }

    /// A short machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            StoreError::Locked(_) => "data_dir_locked",
            StoreError::KeyMissing { .. } => "store_key_missing",
            StoreError::NewerFormat { .. } => "store_format_newer",
            StoreError::Codec { .. } => "corrupt_record",
            StoreError::Closed => "shutting_down",
            StoreError::Rocks(_) | StoreError::Dir { .. } | StoreError::Panicked(_) | StoreError::Injected => {
                "storage_error"
            }
        }
    }
}

/// The one line a start refused for a missing store key says.
fn key_missing(id: KeyId, configured: &[KeyId]) -> String {
    if configured.is_empty() {
        return format!(
            "the data dir holds values sealed with store key {id}, and store.encryption_key_files lists none: \
             list that key's file (to store plain again, run `courier store rekey --to-plain` with it listed); nothing was changed"
        );
    }
    let have: Vec<String> = configured.iter().map(KeyId::to_string).collect();
    format!(
        "the data dir holds values sealed with store key {id}, which none of store.encryption_key_files holds \
         (they hold {}): list that key's file too; nothing was changed",
        have.join(", ")
    )
}
