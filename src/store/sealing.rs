//! Which keys a data dir needs, and moving its values to another key (`courier store
//! rekey`). What is sealed and how is `seal`'s; this module keeps the store honest about it.
//!
//! The `meta` record `seal/keys` lists every key a value in the store may be sealed with.
//! It is written (synced) before the first value is sealed with a key that is not in it,
//! and shrunk only by a rekey, after every value has been moved. So at open one point read
//! tells whether the configured keys can open everything: if a listed key is missing,
//! courier refuses to start, naming it, before it writes anything. Without the record a
//! start would have to read every payload to find out.

use rocksdb::{BottommostLevelCompaction, CompactOptions, WriteBatch, WriteOptions, DB};

use super::seal::{sealed_with, KeyId, Keyring, SealError};
use super::{cf_of, keys, CodecError, Payload, Store, StoreError};

use keys::SEALED_BY;

/// A rekey writes its resealed payloads in batches of at most this many, or this many
/// bytes (payloads may be `max_body` each).
const REKEY_BATCH: usize = 512;
const REKEY_BATCH_BYTES: usize = 4 << 20;

/// The keys configured and the keys the data needs, for `/readyz` and operators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeysInUse {
    /// The key new values are sealed with (`None`: stored plain).
    pub sealing: Option<KeyId>,
    /// Every configured key, the sealing one first.
    pub configured: Vec<KeyId>,
    /// Every key a stored value may be sealed with.
    pub in_data: Vec<KeyId>,
}

/// What a rekey did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rekeyed {
    /// Values written again under the sealing key (or plain).
    pub moved: u64,
    /// Values that were already so.
    pub kept: u64,
    /// Values that do not open (altered or corrupt: no delivery could read them either),
    /// left as they are; the first one's id.
    pub unreadable: u64,
    /// The first value that did not open.
    pub first_unreadable: Option<String>,
}

/// The keys the store's values may be sealed with.
pub(super) fn in_data(db: &DB) -> Result<Vec<KeyId>, StoreError> {
    let v = db.get_pinned_cf(cf_of(db, keys::META), SEALED_BY)?;
    let bytes = v.as_deref().unwrap_or_default();
    if bytes.len() % 4 != 0 {
        return Err(StoreError::codec("meta seal/keys")(CodecError::Corrupt(
            "meta",
            "key list is not whole ids",
        )));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| KeyId(c.try_into().expect("4 bytes")))
        .collect())
}

fn write_in_data(db: &DB, ids: &[KeyId]) -> Result<(), StoreError> {
    let bytes: Vec<u8> = ids.iter().flat_map(|id| id.0).collect();
    let mut synced = WriteOptions::default();
    synced.set_sync(true);
    let mut batch = WriteBatch::default();
    batch.put_cf(cf_of(db, keys::META), SEALED_BY, bytes);
    Ok(db.write_opt(batch, &synced)?)
}

/// Refuses `ring` when it lacks a key the data needs (`needed`).
pub fn check_keys(needed: &[KeyId], ring: &Keyring) -> Result<(), StoreError> {
    match needed.iter().find(|id| !ring.has(**id)) {
        Some(&missing) => Err(StoreError::KeyMissing {
            id: missing,
            configured: ring.ids(),
        }),
        None => Ok(()),
    }
}

/// At open, before anything is written: refuses a keyring that lacks a key the data needs,
/// then records the sealing key (when it is new) before any value is sealed with it.
pub(super) fn check_at_open(db: &DB, ring: &Keyring) -> Result<(), StoreError> {
    let mut needed = in_data(db)?;
    check_keys(&needed, ring)?;
    if let Some(sealing) = ring.sealing().filter(|id| !needed.contains(id)) {
        needed.push(sealing);
        write_in_data(db, &needed)?;
    }
    Ok(())
}

/// The stored form of `payload`, the record `key` of `payloads`: sealed with `ring`'s
/// sealing key, its body compressed on its own (payload version 2), when `sealed`.
///
/// Plain, it is packed too (version 2) when that at least halves the body, else written as
/// it is (version 1) and compressed by RocksDB when its memtable is flushed. The
/// write-ahead log is not compressed, so a body that packs well costs its packed size
/// there instead of its whole size; a typical JSON event with ids and numbers shrinks far
/// less on its own, and RocksDB's block compression, which sees many payloads at once,
/// does better with it than a packed body would.
pub(super) fn stored_payload(ring: &Keyring, sealed: bool, key: &[u8], payload: &Payload) -> Vec<u8> {
    match ring.sealing().filter(|_| sealed) {
        Some(_) => ring.seal(keys::PAYLOADS, key, payload.encode_packed()),
        None => payload.encode_plain(),
    }
}

/// The payload `stored` (the record `key`) as a store with `ring` writes it now (`to_plain`:
/// plain): `None` when it is already under that key (or plain). A moved payload is decoded
/// and written again, so it gets the current version's layout (a body compressed alone).
pub(super) fn rewritten(
    ring: &Keyring,
    key: &[u8],
    stored: &[u8],
    to_plain: bool,
) -> Result<Option<Vec<u8>>, CodecError> {
    let want = if to_plain { None } else { ring.sealing() };
    if sealed_with(stored) == want {
        return Ok(None);
    }
    let payload = Payload::decode(&ring.open(keys::PAYLOADS, key, stored)?)?;
    Ok(Some(stored_payload(ring, !to_plain, key, &payload)))
}

impl Store {
    /// The keys configured and the keys the data needs.
    pub fn keys_in_use(&self) -> Result<KeysInUse, StoreError> {
        let ring = &self.options.keyring;
        Ok(KeysInUse {
            sealing: ring.sealing(),
            configured: ring.ids(),
            in_data: in_data(&self.db)?,
        })
    }

    /// Moves every payload to the sealing key (`to_plain`: stores every one plain), in
    /// batches, then records that the data needs only that key (or none), and compacts the
    /// payloads so the old values leave the files on disk too. For a store nothing else
    /// writes to: `courier store rekey` runs it with courier stopped.
    pub fn rekey(&self, to_plain: bool) -> Result<Rekeyed, StoreError> {
        let ring = &self.options.keyring;
        let cf = self.cf(keys::PAYLOADS);
        let mut done = Rekeyed::default();
        let mut batch = WriteBatch::default();
        let mut it = self.range(keys::PAYLOADS, &[], None);
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            match rewritten(ring, k, v, to_plain) {
                Ok(Some(value)) => {
                    batch.put_cf(cf, k, value);
                    done.moved += 1;
                }
                Ok(None) => done.kept += 1,
                // (A key the data needs is missing only if the open check was skipped.)
                Err(CodecError::Sealed(SealError::UnknownKey(id))) => {
                    return Err(StoreError::KeyMissing {
                        id,
                        configured: ring.ids(),
                    })
                }
                Err(_) => {
                    done.unreadable += 1;
                    done.first_unreadable
                        .get_or_insert_with(|| String::from_utf8_lossy(k).into_owned());
                }
            }
            if batch.len() >= REKEY_BATCH || batch.size_in_bytes() >= REKEY_BATCH_BYTES {
                self.write(std::mem::take(&mut batch), false)?;
            }
            it.next();
        }
        it.status()?;
        self.write(batch, false)?;
        // Synced: the moved values before it in the log are on disk with it.
        let now_needed: Vec<KeyId> = if to_plain {
            Vec::new()
        } else {
            ring.sealing().into_iter().collect()
        };
        // A failed (or crashed) write of the record leaves the old keys listed as needed:
        // every payload still opens, and running rekey again finishes.
        self.faults.before_write()?;
        write_in_data(&self.db, &now_needed)?;
        self.db.flush_cf(cf)?;
        let mut compact = CompactOptions::default();
        compact.set_bottommost_level_compaction(BottommostLevelCompaction::Force);
        self.db.compact_range_cf_opt(cf, None::<&[u8]>, None::<&[u8]>, &compact);
        Ok(done)
    }
}
