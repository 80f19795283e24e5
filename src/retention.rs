//! Retention: removes delivered messages after `retention` and dead ones after
//! `dead_retention`, walking the store's expiry index (never a full scan). It runs on a
//! blocking thread in small batches so ingest and delivery never wait for it, and
//! compacts afterwards when it removed a lot, so the disk space actually comes back.

use std::sync::atomic::{AtomicBool, Ordering};
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
#[cfg(test)]
pub fn sweep(store: &Store, now_ms: u64) -> Result<usize, crate::store::StoreError> {
    sweep_batched(store, now_ms, BATCH, COMPACT_AFTER, &AtomicBool::new(false))
}

/// Runs one sweep to completion, with its batch size and compaction threshold as
/// parameters (tests use small ones); returns how many messages were removed. It stops between batches, and between the column families it compacts, once
/// `halt` is set: shutdown never waits for a whole sweep (what is left is swept next time).
fn sweep_batched(
    store: &Store,
    now_ms: u64,
    batch: usize,
    compact_after: usize,
    halt: &AtomicBool,
) -> Result<usize, crate::store::StoreError> {
    let halted = || halt.load(Ordering::SeqCst);
    let mut total = 0;
    loop {
        if halted() {
            return Ok(total);
        }
        // A batch ends the sweep when it found fewer entries than it could take, not
        // when it removed fewer: an entry it moved later (a record that did not read, a
        // lengthened retention) must not leave the rest for the next sweep.
        let swept = store.sweep_expired(now_ms, batch)?;
        total += swept.removed;
        if swept.looked < batch {
            break;
        }
    }
    if total >= compact_after {
        store.compact_until(&halted);
    }
    Ok(total)
}

/// Work run on the sweep's thread after each sweep (forgetting endpoints not seen within
/// the window, so per-endpoint state is bounded by the same retention).
pub type AfterSweep = Arc<dyn Fn() + Send + Sync>;

/// The retention task: a sweep at start, then every [`SWEEP_EVERY`], until `stop`; `after`
/// runs after each completed sweep.
pub async fn run(store: Arc<Store>, clock: SharedClock, stop: watch::Receiver<bool>, after: AfterSweep) {
    run_reporting(store, clock, stop, after, |_, _| {}).await
}

/// The loop of [`run`]. `swept(at_ms, removed)` is called after each sweep, once the next
/// one is scheduled, so a test on a manual clock knows when advancing it counts.
async fn run_reporting(
    store: Arc<Store>,
    clock: SharedClock,
    mut stop: watch::Receiver<bool>,
    after: AfterSweep,
    swept: impl Fn(u64, usize) + Send,
) {
    loop {
        let now = clock.now_ms();
        let s = store.clone();
        let halt = Arc::new(AtomicBool::new(false));
        let h = halt.clone();
        let then = after.clone();
        let mut sweeping = tokio::task::spawn_blocking(move || {
            let swept = sweep_batched(&s, now, BATCH, COMPACT_AFTER, &h);
            if !h.load(Ordering::SeqCst) {
                then();
            }
            swept
        });
        let done = tokio::select! {
            done = &mut sweeping => done,
            _ = stop.changed() => {
                // Shutdown: the sweep stops at its next batch; wait only for that.
                halt.store(true, Ordering::SeqCst);
                let _ = sweeping.await;
                return;
            }
        };
        let removed = match done {
            Ok(Ok(n)) => {
                if n > 0 {
                    tracing::info!(removed = n, "retention sweep");
                }
                n
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "retention sweep failed; will try again");
                0
            }
            Err(e) => {
                tracing::error!(error = %e, "retention sweep panicked");
                0
            }
        };
        let next = clock.now_ms() + SWEEP_EVERY.as_millis() as u64;
        swept(now, removed);
        tokio::select! {
            _ = clock.sleep_until(next) => {}
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::model::DeadReason;
    use crate::store::{AttemptRecord, NewMessage};
    use crate::store::{StoreOptions, Transition};
    use rand::{RngCore, SeedableRng};

    const RETENTION_MS: u64 = 1_000;
    const DEAD_RETENTION_MS: u64 = 5_000;

    fn open(dir: &std::path::Path) -> Store {
        Store::open(
            &dir.join("data"),
            StoreOptions {
                retention_ms: RETENTION_MS,
                dead_retention_ms: DEAD_RETENTION_MS,
                ..Default::default()
            },
        )
        .unwrap()
    }

    fn message(id: &str, at: u64, body: Vec<u8>) -> NewMessage {
        let mut m = crate::store::tests::message(id, &format!("evt_{id}"), at);
        m.payload.body = body;
        m
    }

    /// Accepts a message at `at` and, unless `end` is `None`, finishes it at `at` that way.
    async fn add(store: &Store, id: &str, at: u64, end: Option<Transition>, body: Vec<u8>) {
        store.accept(message(id, at, body)).await.unwrap();
        let Some(end) = end else { return };
        // In flight on disk, as a crash mid-attempt leaves it.
        crate::store::tests::claim(store, id);
        let status = if end == Transition::Delivered { 200 } else { 410 };
        let attempt = AttemptRecord {
            at_ms: at,
            status: Some(status),
            error: None,
            duration_ms: 1,
            policy_revision: None,
            span_id: None,
        };
        store.finish_attempt(id, &attempt, end, at).unwrap();
    }

    const DEAD: Option<Transition> = Some(Transition::Dead(DeadReason::PermanentStatus));

    fn present(store: &Store, id: &str) -> bool {
        store.message(id).unwrap().is_some()
    }

    #[tokio::test]
    async fn finished_messages_go_after_their_retention_and_open_ones_never() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        // More of each than one batch, so the sweep loops over batches.
        for i in 0..5 {
            add(
                &store,
                &format!("dlv_ok{i}"),
                10_000,
                Some(Transition::Delivered),
                vec![],
            )
            .await;
            add(&store, &format!("dlv_dead{i}"), 10_000, DEAD, vec![]).await;
        }
        add(&store, "dlv_pending", 10_000, None, vec![]).await;
        add(&store, "dlv_in_flight", 10_000, None, vec![]).await;
        // In flight on disk, as a crash mid-attempt leaves it.
        crate::store::tests::claim(&store, "dlv_in_flight");

        // One millisecond before the delivered ones' retention ends: nothing goes.
        assert_eq!(
            sweep_batched(
                &store,
                10_000 + RETENTION_MS - 1,
                2,
                usize::MAX,
                &AtomicBool::new(false)
            )
            .unwrap(),
            0
        );
        assert!(present(&store, "dlv_ok0"));
        // At the end of the retention: exactly the delivered ones go.
        assert_eq!(
            sweep_batched(&store, 10_000 + RETENTION_MS, 2, usize::MAX, &AtomicBool::new(false)).unwrap(),
            5
        );
        assert!((0..5).all(|i| !present(&store, &format!("dlv_ok{i}"))));
        assert!((0..5).all(|i| present(&store, &format!("dlv_dead{i}"))));
        assert_eq!(sweep(&store, 10_000 + DEAD_RETENTION_MS - 1).unwrap(), 0);
        assert_eq!(sweep(&store, 10_000 + DEAD_RETENTION_MS).unwrap(), 5);
        assert!((0..5).all(|i| !present(&store, &format!("dlv_dead{i}"))));
        // Open messages are never removed, however late it is.
        assert_eq!(sweep(&store, u64::MAX / 2).unwrap(), 0);
        assert!(present(&store, "dlv_pending") && present(&store, "dlv_in_flight"));
        let counts = store.counts().unwrap();
        assert_eq!((counts.open, counts.delivered, counts.dead), (2, 0, 0));
    }

    #[tokio::test]
    async fn a_batch_with_an_entry_it_could_not_remove_does_not_end_the_sweep() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        for i in 0..5 {
            add(&store, &format!("dlv_dead{i}"), 10_000, DEAD, vec![]).await;
        }
        // First in line: looked at again in an hour, so the first batch removes one of two.
        store.faults().make_unreadable("dlv_dead0");
        let removed = sweep_batched(
            &store,
            10_000 + DEAD_RETENTION_MS,
            2,
            usize::MAX,
            &AtomicBool::new(false),
        );
        assert_eq!(removed.unwrap(), 4, "every readable one goes in the same sweep");
        assert!((1..5).all(|i| !present(&store, &format!("dlv_dead{i}"))));
        store.faults().heal("dlv_dead0");
        assert!(present(&store, "dlv_dead0"));
    }

    /// Bytes in the store's SST files.
    fn sst_bytes(dir: &std::path::Path) -> u64 {
        std::fs::read_dir(dir.join("data"))
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "sst"))
            .map(|e| e.metadata().unwrap().len())
            .sum()
    }

    /// A store holding `n` delivered messages with incompressible 16 KiB bodies, on disk.
    async fn filled(n: usize) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for i in 0..n {
            let mut body = vec![0u8; 16 << 10];
            rng.fill_bytes(&mut body);
            add(&store, &format!("dlv_{i:03}"), 1_000, Some(Transition::Delivered), body).await;
        }
        store.compact(); // flushes the memtables: the bodies are now in SST files
        (dir, store)
    }

    #[tokio::test]
    async fn a_halted_sweep_stops_before_its_next_batch() {
        let (_dir, store) = filled(40).await;
        let halt = AtomicBool::new(true);
        assert_eq!(sweep_batched(&store, 1_000 + RETENTION_MS, 7, 1, &halt).unwrap(), 0);
        assert!(present(&store, "dlv_000"), "nothing removed once halted");
    }

    #[tokio::test]
    async fn a_large_sweep_compacts_so_the_disk_space_comes_back() {
        const N: usize = 40;
        let volume = (N * (16 << 10)) as u64;

        // Below the threshold: the records are gone but their bytes are still on disk.
        let (dir, store) = filled(N).await;
        assert!(sst_bytes(dir.path()) >= volume, "{} < {volume}", sst_bytes(dir.path()));
        assert_eq!(
            sweep_batched(&store, 1_000 + RETENTION_MS, 7, N + 1, &AtomicBool::new(false)).unwrap(),
            N
        );
        assert!(!present(&store, "dlv_000"));
        assert!(sst_bytes(dir.path()) >= volume, "nothing compacted yet");

        // At the threshold: the sweep compacts and the space is given back.
        let (dir, store) = filled(N).await;
        assert_eq!(
            sweep_batched(&store, 1_000 + RETENTION_MS, 7, N, &AtomicBool::new(false)).unwrap(),
            N
        );
        let left = sst_bytes(dir.path());
        assert!(left < volume / 10, "{left} bytes left of {volume}");
    }

    #[tokio::test]
    async fn the_task_sweeps_at_start_and_again_every_sweep_interval_on_the_clock() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open(dir.path()));
        // Delivered at 1_000: expired from 2_000. Dead at 1_000: expired from 6_000.
        add(&store, "dlv_ok", 1_000, Some(Transition::Delivered), vec![]).await;
        add(&store, "dlv_dead", 1_000, DEAD, vec![]).await;
        let start = 1_000 + RETENTION_MS;
        let clock = ManualClock::new(start);
        let (tx, mut swept) = tokio::sync::mpsc::unbounded_channel();
        let (stop_tx, stop) = watch::channel(false);
        let task = tokio::spawn(run_reporting(
            store.clone(),
            clock.clone(),
            stop,
            Arc::new(|| {}),
            move |at, n| {
                let _ = tx.send((at, n));
            },
        ));
        let wait = Duration::from_secs(10);

        // The sweep at start removes the expired delivered message only.
        let first = tokio::time::timeout(wait, swept.recv()).await.unwrap().unwrap();
        assert_eq!(first, (start, 1));
        assert!(!present(&store, "dlv_ok") && present(&store, "dlv_dead"));

        // The dead one expires long before the next sweep is due; nothing sweeps early.
        let every = SWEEP_EVERY.as_millis() as u64;
        clock.advance(Duration::from_millis(every - 1));
        assert!(
            tokio::time::timeout(Duration::from_millis(300), swept.recv())
                .await
                .is_err(),
            "swept before SWEEP_EVERY passed"
        );
        assert!(present(&store, "dlv_dead"));

        // One more millisecond: the second sweep runs, on the clock's time.
        clock.advance(Duration::from_millis(1));
        let second = tokio::time::timeout(wait, swept.recv()).await.unwrap().unwrap();
        assert_eq!(second, (start + every, 1));
        assert!(!present(&store, "dlv_dead"));

        stop_tx.send(true).unwrap();
        tokio::time::timeout(wait, task).await.unwrap().unwrap();
    }
}
