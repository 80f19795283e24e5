//! Endpoint state changes: pause and resume (with the unblocking of an ordered line and
//! the release of parked messages), the scheduler's parking of a paused endpoint's due
//! messages, the writes of endpoint records, and their expiry. Pause, resume and park
//! serialise on the pause gate; every endpoint write on the persist lock.

use super::Context;
use crate::store::StoreError;

impl Context {
    /// Pauses or resumes an endpoint, persisting the change; a resume puts its parked
    /// messages back in the queue at once and wakes the scheduler. A resume of an ordered
    /// endpoint blocked behind a dead head lets the next message go. A pause or a resume
    /// that fails (the store) leaves the endpoint as it was, to be asked again.
    pub fn set_paused(&self, endpoint: &str, paused: bool) -> Result<(), StoreError> {
        let _gate = self.pause_gate();
        let now = self.clock.now_ms();
        if !paused {
            // Before the endpoint is active again (and durably so): a crash in between
            // leaves it paused with its line moved on, never active with its line blocked,
            // which startup would take for a block whose pause was lost.
            let (store, key) = (self.store.clone(), endpoint.to_string());
            if self.on_delivery_threads(move || store.unblock_line(&key, now))? {
                tracing::info!(endpoint = %crate::redact::url_for_log(endpoint), "ordered line unblocked: the next message goes");
            }
        }
        let was_paused = self.endpoints.is_paused(endpoint);
        self.endpoints.set_paused(endpoint, paused, now);
        if paused {
            if let Err(e) = self.persist_endpoint(endpoint, true) {
                // A pause that is not stored is not made: the next start would not know of
                // it, so the endpoint stays as it was, as the error says.
                if !was_paused {
                    self.endpoints.set_paused(endpoint, false, now);
                }
                return Err(e);
            }
            tracing::info!(endpoint = %crate::redact::url_for_log(endpoint), "endpoint paused");
            return Ok(());
        }
        // A resume can release a whole outage's backlog: that is delivery's work, so it runs
        // on delivery's threads (see `sys::delivery_runtime`), not on the admin request's.
        let (store, key) = (self.store.clone(), endpoint.to_string());
        let released = self
            .persist_endpoint(endpoint, true)
            .and_then(|()| self.on_delivery_threads(move || store.unpark_endpoint(&key, now)));
        match released {
            Ok(n) => {
                tracing::info!(endpoint = %crate::redact::url_for_log(endpoint), released = n, "endpoint resumed");
                self.wake();
                Ok(())
            }
            Err(e) if was_paused => {
                // A resume that failed leaves the endpoint paused, as its error says: active,
                // what is still parked would wait for the next start (nothing else puts a
                // parked message back). What it released already is parked again.
                self.endpoints.set_paused(endpoint, true, now);
                let _ = self.persist_endpoint(endpoint, true);
                self.wake();
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Runs a blocking store call on delivery's runtime's blocking threads and waits for
    /// it (from a blocking thread).
    fn on_delivery_threads<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        crate::sys::blocking::spawn_on(&self.runtime, move || {
            let _ = tx.send(f());
        });
        rx.recv().unwrap_or(Err(StoreError::Closed))
    }

    /// Parks the due entries of paused endpoints. Under the pause gate, each entry's
    /// endpoint is checked again: an entry whose endpoint was resumed since the scheduler
    /// looked stays in the queue for the next pass. Returns (parked, the due time of the
    /// earliest entry left in the queue).
    pub fn park_paused(&self, entries: Vec<crate::store::DueEntry>) -> Result<(usize, Option<u64>), StoreError> {
        let _gate = self.pause_gate();
        let (still, resumed): (Vec<_>, Vec<_>) = entries
            .into_iter()
            .partition(|e| self.endpoints.is_paused(&e.routing.endpoint));
        if !still.is_empty() {
            self.store.park_many(&still, self.clock.now_ms())?;
        }
        Ok((still.len(), resumed.iter().map(|e| e.due_ms).min()))
    }

    /// Writes the endpoint's current in-memory state to the store (synced when an operator
    /// or an alert was told about it). A blocking call.
    pub fn persist_endpoint(&self, endpoint: &str, synced: bool) -> Result<(), StoreError> {
        let _order = self.persist_order();
        // Held until written (see `EndpointTable::saved`), so it is still here.
        let Some((rec, changes)) = self.endpoints.loaded_record(endpoint) else {
            return Ok(());
        };
        let now = self.clock.now_ms();
        self.store.put_endpoints(&[(endpoint.to_string(), rec)], now, synced)?;
        self.endpoints.saved(endpoint, changes);
        Ok(())
    }

    /// Bounds per-endpoint state by the retention window: endpoints not seen within it (and
    /// not paused) are forgotten in memory, records not written within it (and not paused)
    /// are deleted from the store, and zero per-endpoint counters are removed. A blocking
    /// call, run after each retention sweep. Returns (forgotten in memory, deleted).
    pub fn expire_endpoints(&self) -> Result<(usize, usize), StoreError> {
        let now = self.clock.now_ms();
        let forgotten = self.endpoints.expire(now);
        let before = now.saturating_sub(self.endpoints.listed_for_ms());
        let (mut deleted, mut from) = (0, None);
        loop {
            // No endpoint write may land between a record's read and its delete; a chunk at
            // a time, so the store writer's endpoint writes wait for one chunk at most.
            let _order = self.persist_order();
            let (n, next) = self.store.expire_endpoints_chunk(from.as_deref(), before)?;
            deleted += n;
            match next {
                Some(k) => from = Some(k),
                None => break,
            }
        }
        self.store.drop_zero_counters()?;
        Ok((forgotten, deleted))
    }

    /// At startup: requeues the parked messages of every endpoint that is not paused (a
    /// crash in the middle of a resume leaves some behind). Returns how many went back.
    pub fn recover_parked(&self) -> Result<usize, StoreError> {
        let _gate = self.pause_gate();
        let now = self.clock.now_ms();
        let mut moved = 0;
        for endpoint in self.store.parked_endpoints()? {
            if !self.endpoints.is_paused(&endpoint) {
                moved += self.store.unpark_endpoint(&endpoint, now)?;
            }
        }
        Ok(moved)
    }
}
