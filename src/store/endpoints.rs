//! Endpoint state on disk: the `endpoints` column family holds a record for each paused or
//! failing endpoint (an endpoint with nothing to remember has none), stamped with when it
//! was written.
//!
//! The store, not memory, is what outlives a quiet endpoint: delivery keeps only active
//! endpoints in memory and reads a record back when one returns. Records expire on their
//! own stamp, so the family does not keep every endpoint that ever failed: a record not
//! written within the retention window is deleted unless its endpoint is paused (a pause
//! lasts until an operator resumes it).

use rocksdb::WriteBatch;

use super::{keys, EndpointRecord, Store, StoreError};

/// Records looked at per expiry batch: each batch is one short write.
const EXPIRE_CHUNK: usize = 4096;

impl Store {
    /// The paused endpoints (what delivery must know from the start: every other record is
    /// read back when its endpoint is next seen).
    pub fn paused_endpoints(&self) -> Result<Vec<(String, EndpointRecord)>, StoreError> {
        let (paused, _) = super::page(&self.db, keys::ENDPOINTS, (&[], None), usize::MAX, |k, v| {
            decode_entry(k, v).map(|entry| entry.1.paused.then_some(entry))
        })?;
        Ok(paused)
    }

    /// One endpoint's persisted state, if it has one.
    pub fn endpoint(&self, key: &str) -> Result<Option<EndpointRecord>, StoreError> {
        let v = super::get(&self.db, keys::ENDPOINTS, key.as_bytes())?;
        Ok(v.map(|v| decode_entry(key.as_bytes(), &v)).transpose()?.map(|(_, r)| r))
    }

    /// Saves endpoint states in one write. Streak changes need no sync (losing one to a
    /// power loss only shortens a streak); a pause about to be alerted does.
    pub fn put_endpoints(
        &self,
        recs: &[(String, EndpointRecord)],
        now_ms: u64,
        synced: bool,
    ) -> Result<(), StoreError> {
        let mut b = WriteBatch::default();
        for (key, rec) in recs {
            if *rec == EndpointRecord::default() {
                b.delete_cf(self.cf(keys::ENDPOINTS), key.as_bytes());
            } else {
                b.put_cf(self.cf(keys::ENDPOINTS), key.as_bytes(), rec.encode_at(now_ms));
            }
        }
        self.write(b, synced)
    }

    /// Deletes the records of endpoints that are not paused and were not written since
    /// `before_ms`, looking at one chunk of records from `from` (the start when `None`).
    /// The caller keeps endpoint writes out meanwhile (a record written between this read
    /// and its delete would be lost), a chunk at a time so they never wait long. Returns
    /// how many it deleted and where the next chunk starts, if there is one.
    pub fn expire_endpoints_chunk(
        &self,
        from: Option<&[u8]>,
        before_ms: u64,
    ) -> Result<(usize, Option<Vec<u8>>), StoreError> {
        let cf = self.cf(keys::ENDPOINTS);
        let mut b = WriteBatch::default();
        let chunk = (from.unwrap_or_default(), None);
        let (_, next) = super::page(&self.db, keys::ENDPOINTS, chunk, EXPIRE_CHUNK, |k, v| {
            match decode_stamped(k, v) {
                Ok((rec, written_ms)) if !rec.paused && written_ms < before_ms => b.delete_cf(cf, k),
                Ok(_) => {}
                // A record that cannot be read must not stop every later sweep: it is logged
                // and left for an operator (it may be paused).
                Err(e) => tracing::error!(error = %e, "an endpoint record cannot be read; the expiry sweep skips it"),
            }
            Ok(Some(()))
        })?;
        let removed = b.len();
        if !b.is_empty() {
            self.write(b, false)?;
        }
        Ok((removed, next))
    }

    /// Up to `limit` persisted endpoint records with keys after `after` that start with
    /// `prefix`, in key order, and (when more may follow) the last key returned.
    #[allow(clippy::type_complexity)]
    pub fn endpoint_records_page(
        &self,
        after: Option<&str>,
        prefix: &str,
        limit: usize,
    ) -> Result<(Vec<(String, EndpointRecord)>, Option<String>), StoreError> {
        // Strictly after `after`, but not before the first key of `prefix`.
        let start = keys::after(b"", after).max(prefix.as_bytes().to_vec());
        let until = (!prefix.is_empty()).then(|| keys::prefix_end(prefix.as_bytes()));
        let (out, more) = super::page(&self.db, keys::ENDPOINTS, (&start, until), limit, |k, v| {
            decode_entry(k, v).map(Some)
        })?;
        let stopped_at = out.last().filter(|_| more.is_some()).map(|(k, _)| k.clone());
        Ok((out, stopped_at))
    }
}

fn decode_stamped(k: &[u8], v: &[u8]) -> Result<(EndpointRecord, u64), StoreError> {
    EndpointRecord::decode_stamped(v).map_err(StoreError::codec(String::from_utf8_lossy(k)))
}

pub(super) fn decode_entry(k: &[u8], v: &[u8]) -> Result<(String, EndpointRecord), StoreError> {
    Ok((String::from_utf8_lossy(k).into_owned(), decode_stamped(k, v)?.0))
}
