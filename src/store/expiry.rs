//! Retention: removing finished (delivered, dead, handed-off) messages once their retention has passed, and
//! compacting so the removed records give their disk space back.
//!
//! Named `expiry` (after the column family it walks) to keep it apart from
//! `crate::retention`, the background task that calls it.

use super::tx::Tx;
use super::{keys, Store, StoreError};

/// How long before a retention entry whose record did not read is looked at again.
const UNREADABLE_AGAIN_MS: u64 = 3_600_000;

/// What one call of [`Store::sweep_expired`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    /// Due entries looked at: each left the due range (removed, or moved later). Fewer
    /// than the limit means none is left.
    pub looked: usize,
    /// Messages removed.
    pub removed: usize,
}

impl Store {
    /// Removes finished (delivered, dead, handed-off) messages whose retention ended at or
    /// before `now_ms`, looking at most `limit` due entries.
    pub fn sweep_expired(&self, now_ms: u64, limit: usize) -> Result<Swept, StoreError> {
        let range = (&[][..], Some(keys::time_key(now_ms.saturating_add(1), "").to_vec()));
        let (entries, _) = super::page(&self.db, keys::EXPIRY, range, limit, |k, _| {
            Ok(keys::split_time_key(k).map(|(ms, id)| (ms, id.to_string())))
        })?;
        let looked = entries.len();
        let mut removed = 0;
        for (ms, id) in entries {
            let _g = self.lock(&id);
            let mut tx = Tx::reading(&self.db, &self.faults);
            tx.delete(keys::EXPIRY, keys::time_key(ms, &id));
            // Looked at again later, after the others: one record that does not read (or a
            // line member its removal must read) must not hold every sweep at its entry.
            let later = |tx: Tx<'_>, e: StoreError| {
                tracing::error!(delivery_id = %id, error = %e, "retention: a record does not read; looked at again in an hour");
                let mut tx = tx;
                tx.put(
                    keys::EXPIRY,
                    keys::time_key(now_ms.saturating_add(UNREADABLE_AGAIN_MS), &id),
                    [],
                );
                self.commit(tx, false)
            };
            let rec = match self.message(&id) {
                Ok(rec) => rec,
                Err(e) => {
                    later(tx, e)?;
                    continue;
                }
            };
            // A dead head its line is blocked behind hands over to the next when it goes.
            let ordered = rec.as_ref().filter(|r| r.fifo.is_some()).map(|r| r.endpoint.as_str());
            let _line = self.lines.lock(ordered.into_iter());
            if let Some(rec) = rec.as_ref().filter(|r| r.state.is_finished()) {
                let due = self.expires_at(rec);
                if due <= now_ms {
                    if let Err(e) = self.remove(&mut tx, rec, now_ms) {
                        // Nothing of what it staged is written: the entry alone moves.
                        let mut fresh = Tx::reading(&self.db, &self.faults);
                        fresh.delete(keys::EXPIRY, keys::time_key(ms, &id));
                        later(fresh, e)?;
                        continue;
                    }
                    removed += 1;
                } else if due != ms {
                    // Retention was lengthened since this entry was written.
                    tx.put(keys::EXPIRY, keys::time_key(due, &id), []);
                }
            }
            self.commit(tx, false)?;
        }
        Ok(Swept { looked, removed })
    }

    /// Compacts every column family, so removed records give their disk space back, one at
    /// a time, stopping before the next one once `stopped()` says so (shutdown must not wait for every family to compact).
    pub fn compact_until(&self, stopped: &dyn Fn() -> bool) {
        for name in keys::CF_NAMES {
            if stopped() {
                return;
            }
            self.db.compact_range_cf(self.cf(name), None::<&[u8]>, None::<&[u8]>);
        }
    }
}
