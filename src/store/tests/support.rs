//! Store calls only tests and the simulator make (production makes them another way): the
//! fault switches, one endpoint record saved alone, one result at a time, a floor raise to
//! a whole millisecond, the first due time, one park, every endpoint record, the open
//! counts per endpoint.

use rocksdb::{IteratorMode, ReadOptions};

use crate::store::counters::decode_counter;
use crate::store::endpoints::decode_entry;
use crate::store::*;

impl Store {
    /// The fault switches of this store (tests only set them).
    pub(crate) fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Runs `f` (the simulator's own reads) with broken items reading as healthy and no
    /// walk failing.
    pub(crate) fn quietly<T>(&self, f: impl FnOnce() -> T) -> T {
        let (before, walks) = (self.faults.suspend(true), fail_walks(0));
        let out = f();
        self.faults.suspend(before);
        fail_walks(walks);
        out
    }

    /// Saves one endpoint's state, not synced.
    pub(crate) fn put_endpoint(&self, key: &str, rec: &EndpointRecord, now_ms: u64) -> Result<(), StoreError> {
        self.put_endpoints(&[(key.to_string(), rec.clone())], now_ms, false)
    }

    /// Saves a pause or resume, synced: it was acknowledged to an operator (or alerted).
    pub(crate) fn put_endpoint_synced(&self, key: &str, rec: &EndpointRecord, now_ms: u64) -> Result<(), StoreError> {
        self.put_endpoints(&[(key.to_string(), rec.clone())], now_ms, true)
    }

    /// How many synced operator writes (delete, replay, pause, resume) were made.
    pub(crate) fn operator_syncs(&self) -> u64 {
        self.operator_syncs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records a finished attempt (attempt number `rec.attempts + 1`) and the transition it
    /// led to. Returns the updated record, or `None` if the message was deleted meanwhile.
    pub(crate) fn finish_attempt(
        &self,
        id: &str,
        attempt: &AttemptRecord,
        transition: Transition,
        now_ms: u64,
    ) -> Result<Option<MessageRecord>, StoreError> {
        let item = FinishedAttempt {
            id: id.to_string(),
            attempt: attempt.clone(),
            transition,
            now_ms,
        };
        self.finish_owned(&[item]).pop().unwrap_or(Ok(None))
    }

    /// [`Store::finish_attempts`] of owned results, each answered with its record as
    /// written (read back), or `None` when stale.
    pub(crate) fn finish_owned(&self, items: &[FinishedAttempt]) -> Vec<Result<Option<MessageRecord>, StoreError>> {
        let mut finishes: Vec<_> = items.iter().map(FinishedAttempt::as_finish).collect();
        let answers = self.finish_attempts(&mut finishes);
        items
            .iter()
            .zip(answers)
            .map(|(item, answer)| match answer? {
                ResultWrite::Written => self.message(&item.id),
                ResultWrite::Stale => Ok(None),
            })
            .collect()
    }

    /// The earliest due time in the queue, if any.
    pub(crate) fn next_due_ms(&self) -> Result<Option<u64>, StoreError> {
        let mut it = self.db.raw_iterator_cf(self.cf(keys::DUE));
        it.seek_to_first();
        match it.key() {
            Some(k) => Ok(keys::split_time_key(k).map(|(ms, _)| ms)),
            None => {
                it.status()?;
                Ok(None)
            }
        }
    }

    /// The current due floor (see [`Store::scan_due`]).
    pub(crate) fn due_floor(&self) -> u64 {
        self.due_floor.peek()
    }

    /// Raises the due floor towards `to` after a pass that started at `mark`, but not above
    /// a due entry written since (the pass may have missed it).
    pub(crate) fn raise_due_floor(&self, mark: FloorMark, to: u64) {
        self.due_floor.raise(mark, to);
    }

    /// Moves a due message of a paused endpoint out of the queue into the endpoint's
    /// parked set, so the scheduler does not see it again until the endpoint resumes.
    pub(crate) fn park(&self, entry: &DueEntry) -> Result<(), StoreError> {
        self.park_many(std::slice::from_ref(entry), entry.due_ms)
    }

    /// The persisted state of every endpoint that has one.
    pub(crate) fn endpoints(&self) -> Result<Vec<(String, EndpointRecord)>, StoreError> {
        let mut out = Vec::new();
        for item in self.db.iterator_cf(self.cf(keys::ENDPOINTS), IteratorMode::Start) {
            let (k, v) = item?;
            out.push(decode_entry(&k, &v)?);
        }
        Ok(out)
    }

    /// Open (pending or in-flight) messages per endpoint, for endpoints that have any.
    pub(crate) fn open_per_endpoint(&self) -> Result<Vec<(String, u64)>, StoreError> {
        let mut out = Vec::new();
        let prefix = keys::COUNT_OPEN_ENDPOINT;
        let mut ro = ReadOptions::default();
        ro.set_iterate_upper_bound(keys::prefix_end(prefix));
        let mut it = self.db.raw_iterator_cf_opt(self.cf(keys::META), ro);
        it.seek(prefix);
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            let n = decode_counter(v);
            if n > 0 {
                out.push((String::from_utf8_lossy(&k[prefix.len()..]).into_owned(), n as u64));
            }
            it.next();
        }
        it.status()?;
        Ok(out)
    }

    /// Compacts every column family, so removed records give their disk space back.
    pub(crate) fn compact(&self) {
        self.compact_until(&|| false);
    }
}
