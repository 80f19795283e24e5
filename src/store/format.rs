//! The store's format: which layout of keys and records a data dir holds, written in `meta`
//! when a courier first opens it (`format` → the number, in decimal).
//!
//! A courier opens a data dir of its own format or an older one (it reads every older
//! layout, and writes its own from then on); it refuses one written by a newer courier,
//! before RocksDB opens it for writing (so the refused start changes no file), rather than
//! misread records it does not know or leave them unswept. That makes a downgrade safe to
//! try: the older courier says so and stops. Couriers from before the marker (format 1,
//! the layout with no marker) do not look for it.

use rocksdb::{WriteBatch, WriteOptions, DB};

use super::{cf_of, keys, StoreError};

/// The format this courier writes, and the newest it reads. 2: a message's record keeps its
/// last attempt (record version 4), which `history` held in format 1. 3: a message whose
/// event id courier made (its delivery id's ULID) has no `events` entry; it is found by its
/// delivery id, which a format-2 courier would not look for.
pub const FORMAT: u32 = 3;

/// The data dir's format as its marker says (`None`: no marker yet, a store first opened
/// by a courier from before it, or by none).
pub(super) fn in_data(db: &DB) -> Result<Option<u32>, StoreError> {
    let Some(v) = db.get_pinned_cf(cf_of(db, keys::META), keys::FORMAT)? else {
        return Ok(None);
    };
    let text = std::str::from_utf8(&v).ok();
    match text.and_then(|t| t.parse().ok()) {
        Some(n) => Ok(Some(n)),
        None => Err(StoreError::codec("meta format")(super::CodecError::Corrupt(
            "meta",
            "store format is not a number",
        ))),
    }
}

/// Refuses a format newer than [`FORMAT`].
pub(super) fn check(found: Option<u32>) -> Result<(), StoreError> {
    match found {
        Some(found) if found > FORMAT => Err(StoreError::NewerFormat { found }),
        _ => Ok(()),
    }
}

/// Marks a store that has no marker, or an older format's, with [`FORMAT`] (synced), once
/// the start's checks passed and before anything else is written.
pub(super) fn mark(db: &DB) -> Result<(), StoreError> {
    let mut synced = WriteOptions::default();
    synced.set_sync(true);
    let mut batch = WriteBatch::default();
    batch.put_cf(cf_of(db, keys::META), keys::FORMAT, FORMAT.to_string());
    Ok(db.write_opt(batch, &synced)?)
}
