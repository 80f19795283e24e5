//! The counters in the `meta` column family: their merge operator, how a batch sums its
//! changes, and the gauges read from them.
//!
//! Counters are merged in the same batch as the transition they count, so a gauge is a
//! point read, never a scan.

use rocksdb::{ColumnFamily, MergeOperands, WriteBatch};

use super::{keys, Counts, State, Store, StoreError};

/// Counter changes of one batch, summed per counter: a batch of many transitions then
/// merges each counter once instead of once per message.
#[derive(Debug, Default)]
pub(crate) struct CounterDeltas(foldhash::HashMap<keys::Key, i64>);

impl CounterDeltas {
    pub(crate) fn add(&mut self, key: &[u8], delta: i64) {
        match self.0.get_mut(key) {
            Some(v) => *v += delta,
            None => {
                self.0.insert(keys::Key::from_slice(key), delta);
            }
        }
    }

    /// [`CounterDeltas::add`] for a key made for the call (an endpoint's), kept as it is.
    pub(crate) fn add_owned(&mut self, key: keys::Key, delta: i64) {
        *self.0.entry(key).or_default() += delta;
    }

    /// Appends the merges to `b` (counters that summed to zero are left out).
    pub(crate) fn write_into(self, b: &mut WriteBatch, meta: &ColumnFamily) {
        for (key, delta) in self.0 {
            if delta != 0 {
                b.merge_cf(meta, key, delta.to_le_bytes());
            }
        }
    }
}

/// The `meta` merge operator: counters are little-endian i64 sums.
pub(super) fn add_counter(_key: &[u8], existing: Option<&[u8]>, operands: &MergeOperands) -> Option<Vec<u8>> {
    let mut total = existing.map(decode_counter).unwrap_or(0);
    for op in operands {
        total = total.wrapping_add(decode_counter(op));
    }
    Some(total.to_le_bytes().to_vec())
}

pub(super) fn decode_counter(v: &[u8]) -> i64 {
    v.try_into().map(i64::from_le_bytes).unwrap_or(0)
}

/// Endpoints with their open counts, and (when the walk stopped early) the last key it
/// looked at: every key up to it was seen, none after it.
pub type OpenPage = (Vec<(String, u64)>, Option<String>);

impl Store {
    /// Removes per-endpoint open counters that are zero (an endpoint with nothing open),
    /// so the `meta` family does not keep a key for every endpoint ever seen. Works in
    /// chunks, each under the counter gate, so accepts wait for one chunk at most.
    /// Returns how many were removed.
    pub fn drop_zero_counters(&self) -> Result<usize, StoreError> {
        const CHUNK: usize = 4096;
        let prefix = keys::COUNT_OPEN_ENDPOINT;
        let mut from = Some(prefix.to_vec());
        let mut removed = 0;
        while let Some(start) = from {
            let _counters = self.counter_gate.write().unwrap_or_else(|p| p.into_inner());
            let mut it = self.range(keys::META, &start, Some(keys::prefix_end(prefix)));
            let mut b = WriteBatch::default();
            let mut looked = 0;
            while let (Some(k), Some(v)) = (it.key(), it.value()) {
                if decode_counter(v) == 0 {
                    b.delete_cf(self.cf(keys::META), k);
                }
                looked += 1;
                if looked >= CHUNK {
                    break;
                }
                it.next();
            }
            it.status()?;
            // A full chunk stopped on its last key: the next one starts strictly after it.
            from = it.key().filter(|_| looked >= CHUNK).map(|k| [k, &[0]].concat());
            drop(it);
            if !b.is_empty() {
                removed += b.len();
                self.write(b, false)?;
            }
        }
        Ok(removed)
    }

    /// Open messages of one endpoint.
    pub fn open_of_endpoint(&self, endpoint: &str) -> Result<u64, StoreError> {
        self.counter(&keys::endpoint_open_key(endpoint))
    }

    /// Endpoints with open messages, keys after `after` starting with `prefix`, in key
    /// order: at most `limit`, looking at no more than a bounded number of counters (zero
    /// ones are skipped until the next sweep removes them). The flag says whether the walk
    /// stopped before the end (more may follow).
    pub fn open_endpoints_page(&self, after: Option<&str>, prefix: &str, limit: usize) -> Result<OpenPage, StoreError> {
        let base = keys::COUNT_OPEN_ENDPOINT;
        // Strictly after `after`, but not before the first key of `prefix`.
        let start = keys::after(base, after).max(keys::endpoint_open_key(prefix).to_vec());
        let until = keys::prefix_end(&keys::endpoint_open_key(prefix));
        let mut it = self.range(keys::META, &start, Some(until));
        let (mut out, mut looked) = (Vec::new(), 0);
        let mut last_looked = None;
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            looked += 1;
            let key = String::from_utf8_lossy(&k[base.len()..]).into_owned();
            let n = decode_counter(v);
            if n > 0 {
                out.push((key.clone(), n as u64));
            }
            last_looked = Some(key);
            it.next();
            if out.len() >= limit || looked >= limit * 20 + 1000 {
                break;
            }
        }
        it.status()?;
        // Stopped early: every key up to the last one looked at is known, none after it.
        let stopped_at = if it.key().is_some() { last_looked } else { None };
        Ok((out, stopped_at))
    }

    pub(super) fn counter(&self, key: &[u8]) -> Result<u64, StoreError> {
        Ok(self
            .db
            .get_pinned_cf(self.cf(keys::META), key)?
            .map(|v| decode_counter(&v).max(0) as u64)
            .unwrap_or(0))
    }

    /// Message counts by state.
    pub fn counts(&self) -> Result<Counts, StoreError> {
        Ok(Counts {
            open: self.counter(keys::COUNT_OPEN)?,
            delivered: self.counter(keys::COUNT_DELIVERED)?,
            dead: self.counter(keys::COUNT_DEAD)?,
            handed_off: self.counter(keys::COUNT_HANDED_OFF)?,
        })
    }

    /// Acceptance time of the oldest open message (from the first key of the pending and
    /// in-flight indexes: ids sort by acceptance time).
    pub fn oldest_open_ms(&self) -> Result<Option<u64>, StoreError> {
        let mut oldest: Option<u64> = None;
        for state in [State::Pending, State::InFlight] {
            if let Some(id) = self.ids_after(state, None, 1)?.into_iter().next() {
                if let Some(ms) = crate::model::delivery_id_millis(&id) {
                    oldest = Some(oldest.map_or(ms, |o| o.min(ms)));
                }
            }
        }
        Ok(oldest)
    }
}
