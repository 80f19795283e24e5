//! Retention: removes delivered messages after `retention` and dead ones after
//! `dead_retention`, walking the store's expiry index (never a full scan). It runs on a
//! blocking thread in small batches so ingest and delivery never wait for it, and
//! compacts afterwards when it removed a lot, so the disk space actually comes back.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::SharedClock;
use crate::store::Store;

/// How often the sweep runs (the contract asks for at least hourly).
pub const SWEEP_EVERY: Duration = Duration::from_secs(10 * 60);
/// Messages removed per batch.
const BATCH: usize = 1000;
/// Removals after which a sweep compacts.
const COMPACT_AFTER: usize = 10_000;

/// Runs one sweep to completion; returns how many messages were removed.
pub fn sweep(store: &Store, now_ms: u64) -> Result<usize, crate::store::StoreError> {
    let mut total = 0;
    loop {
        let n = store.sweep_expired(now_ms, BATCH)?;
        total += n;
        if n < BATCH {
            break;
        }
    }
    if total >= COMPACT_AFTER {
        store.compact();
    }
    Ok(total)
}

/// The retention task: a sweep at start, then every [`SWEEP_EVERY`], until `stop`.
pub async fn run(store: Arc<Store>, clock: SharedClock, mut stop: watch::Receiver<bool>) {
    loop {
        let now = clock.now_ms();
        let s = store.clone();
        match tokio::task::spawn_blocking(move || sweep(&s, now)).await {
            Ok(Ok(n)) if n > 0 => tracing::info!(removed = n, "retention sweep"),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "retention sweep failed; will try again"),
            Err(e) => tracing::error!(error = %e, "retention sweep panicked"),
        }
        let next = clock.now_ms() + SWEEP_EVERY.as_millis() as u64;
        tokio::select! {
            _ = clock.sleep_until(next) => {}
            _ = stop.changed() => return,
        }
    }
}
