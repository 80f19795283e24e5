//! A thread that handles queued jobs in batches: every job queued while the previous batch
//! was being handled becomes the next batch, so under load one expensive step (an fsync, a
//! RocksDB write) serves many jobs, and idle a lone job is handled at once. The store's
//! group commit of accepts and delivery's result writer are both one of these.

use std::sync::Mutex;
use std::thread::JoinHandle;

use tokio::sync::mpsc;

/// Handle to a batching thread. Dropping it stops the thread once the queued jobs are
/// handled.
pub struct Batcher<J> {
    tx: Mutex<Option<mpsc::Sender<J>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl<J> Batcher<J> {
    /// Stops taking jobs and waits until every queued one is handled.
    pub fn stop(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            // A job may hold the last handle to what owns this batcher, and so stop it from
            // the thread itself: that thread ends by itself once its queue is empty.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

impl<J: Send + 'static> Batcher<J> {
    /// Starts a thread named `name` that hands `handle` up to `max_batch` jobs at a time.
    /// Past `queue` waiting jobs, [`Batcher::send`] waits (backpressure).
    pub fn start(name: &str, queue: usize, max_batch: usize, handle: impl FnMut(Vec<J>) + Send + 'static) -> Self {
        Self::start_with(name, queue, max_batch, || {}, handle)
    }

    /// [`Batcher::start`], running `on_start` first on the new thread (e.g. to set its
    /// priority).
    pub fn start_with(
        name: &str,
        queue: usize,
        max_batch: usize,
        on_start: fn(),
        mut handle: impl FnMut(Vec<J>) + Send + 'static,
    ) -> Self {
        let (tx, mut rx) = mpsc::channel::<J>(queue);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                on_start();
                while let Some(first) = rx.blocking_recv() {
                    let mut jobs = Vec::with_capacity(64.min(max_batch));
                    jobs.push(first);
                    while jobs.len() < max_batch {
                        match rx.try_recv() {
                            Ok(job) => jobs.push(job),
                            Err(_) => break,
                        }
                    }
                    handle(jobs);
                }
            })
            .unwrap_or_else(|e| panic!("spawning the {name} thread: {e}"));
        Batcher {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Queues a job. `false` once the batcher is stopped (the job was not queued).
    pub async fn send(&self, job: J) -> bool {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match tx {
            Some(tx) => tx.send(job).await.is_ok(),
            None => false,
        }
    }
}

impl<J> Drop for Batcher<J> {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_queued_together_are_handled_together_and_stop_waits_for_them() {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let seen = batches.clone();
        let (entered_tx, entered_rx) = std::sync::mpsc::channel::<()>();
        let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
        let b = Batcher::start("test-batcher", 64, 4, move |jobs: Vec<u32>| {
            // The first batch holds the thread until the gate opens, so the rest queue up.
            if seen.lock().unwrap().is_empty() {
                entered_tx.send(()).unwrap();
                gate_rx.recv().unwrap();
            }
            seen.lock().unwrap().push(jobs);
        });
        assert!(b.send(0).await);
        tokio::task::spawn_blocking(move || entered_rx.recv().unwrap())
            .await
            .unwrap();
        for i in 1..=6 {
            assert!(b.send(i).await);
        }
        gate_tx.send(()).unwrap();
        b.stop();
        assert!(!b.send(7).await, "a stopped batcher takes nothing");
        assert_eq!(
            *batches.lock().unwrap(),
            vec![vec![0], vec![1, 2, 3, 4], vec![5, 6]],
            "batches are capped at max_batch and keep the queue's order"
        );
    }
}
