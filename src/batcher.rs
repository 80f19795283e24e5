//! A thread that handles queued jobs in batches: every job queued while the previous batch
//! was being handled becomes the next batch, so under load one expensive step (an fsync, a
//! RocksDB write) serves many jobs, and idle a lone job is handled at once. The store's
//! store writer (accepts group-committed, results beside them) is one of these.

use std::future::Future;
use std::sync::Mutex;
use std::thread::JoinHandle;

use futures_util::future::Either;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

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
        let (tx, rx) = mpsc::channel::<J>(queue);
        #[cfg(test)]
        let (rx, handle) = match stepped::adopt(rx, handle, max_batch) {
            Ok(()) => {
                return Batcher {
                    tx: Mutex::new(Some(tx)),
                    thread: Mutex::new(None),
                }
            }
            Err(both) => both,
        };
        let (mut rx, mut handle) = (rx, handle);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
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

    /// Queues a job, at once when there is room (as nearly always): the future answers
    /// `false` when the batcher was stopped before the job was queued. Only a full queue
    /// makes it wait, in a send of its own, boxed (it is several times the job's size, and
    /// would make every caller's future, an accept's or an attempt's, that much larger to
    /// allocate and move); that send queues the job when first polled (a job sent later
    /// may go first), and dropping the future unpolled drops the job.
    pub fn send(&self, job: J) -> impl Future<Output = bool> + Send + 'static {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match tx.map(|tx| (tx.try_send(job), tx)) {
            Some((Ok(()), _)) => Either::Left(std::future::ready(true)),
            None | Some((Err(TrySendError::Closed(_)), _)) => Either::Left(std::future::ready(false)),
            Some((Err(TrySendError::Full(job)), tx)) => {
                Either::Right(Box::pin(async move { tx.send(job).await.is_ok() }))
            }
        }
    }
}

impl<J> Drop for Batcher<J> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Tests: batchers without a thread, for the simulator. A batcher started on a thread that
/// called [`stepped::begin`] handles its jobs only when [`stepped::Step::step`] is called,
/// on the caller's thread, so a seed decides every batch's members and the order of
/// everything the batches do.
#[cfg(test)]
pub(crate) mod stepped {
    use std::cell::RefCell;
    use std::sync::{Arc, Mutex};

    use tokio::sync::mpsc;

    /// A stepped batcher, as the simulator holds it.
    pub(crate) trait Step: Send + Sync {
        /// Handles up to `max` of the queued jobs as one batch; how many it handled.
        fn step(&self, max: usize) -> usize;
        /// Jobs queued now.
        fn queued(&self) -> usize;
    }

    thread_local! {
        /// The batchers started on this thread since [`begin`], while it is on.
        static ADOPTED: RefCell<Option<Vec<Arc<dyn Step>>>> = const { RefCell::new(None) };
    }

    /// Batchers started on this thread from now on are stepped (see [`take`]).
    pub(crate) fn begin() {
        ADOPTED.with(|a| *a.borrow_mut() = Some(Vec::new()));
    }

    /// The stepped batchers started on this thread since [`begin`], in start order; later
    /// ones get threads again.
    pub(crate) fn take() -> Vec<Arc<dyn Step>> {
        ADOPTED.with(|a| a.borrow_mut().take()).unwrap_or_default()
    }

    type Handler<J> = Box<dyn FnMut(Vec<J>) + Send>;

    struct Queue<J> {
        inner: Mutex<(mpsc::Receiver<J>, Handler<J>)>,
        max_batch: usize,
    }

    impl<J: Send + 'static> Step for Queue<J> {
        fn step(&self, max: usize) -> usize {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let (rx, handle) = &mut *inner;
            let mut jobs = Vec::new();
            while jobs.len() < max.min(self.max_batch) {
                match rx.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            let n = jobs.len();
            if n > 0 {
                handle(jobs);
            }
            n
        }

        fn queued(&self) -> usize {
            self.inner.lock().unwrap_or_else(|p| p.into_inner()).0.len()
        }
    }

    /// Keeps `rx` and `handle` as a stepped batcher if this thread asked for them; else
    /// gives them back.
    #[allow(clippy::type_complexity)]
    pub(super) fn adopt<J: Send + 'static, H: FnMut(Vec<J>) + Send + 'static>(
        rx: mpsc::Receiver<J>,
        handle: H,
        max_batch: usize,
    ) -> Result<(), (mpsc::Receiver<J>, H)> {
        ADOPTED.with(|a| match a.borrow_mut().as_mut() {
            Some(list) => {
                list.push(Arc::new(Queue {
                    inner: Mutex::new((rx, Box::new(handle) as Handler<J>)),
                    max_batch,
                }));
                Ok(())
            }
            None => Err((rx, handle)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A batcher whose first batch (job 0, sent here) holds its thread until the returned
    /// gate opens, so the jobs sent meanwhile queue up; it records each batch it handles.
    async fn held(
        queue: usize,
        max_batch: usize,
    ) -> (Batcher<u32>, Arc<Mutex<Vec<Vec<u32>>>>, std::sync::mpsc::Sender<()>) {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let seen = batches.clone();
        let (entered_tx, entered_rx) = std::sync::mpsc::channel::<()>();
        let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
        let b = Batcher::start("test-batcher", queue, max_batch, move |jobs: Vec<u32>| {
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
        (b, batches, gate_tx)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_queued_together_are_handled_together_and_stop_waits_for_them() {
        let (b, batches, gate) = held(64, 4).await;
        for i in 1..=6 {
            assert!(b.send(i).await);
        }
        gate.send(()).unwrap();
        b.stop();
        assert!(!b.send(7).await, "a stopped batcher takes nothing");
        assert_eq!(
            *batches.lock().unwrap(),
            vec![vec![0], vec![1, 2, 3, 4], vec![5, 6]],
            "batches are capped at max_batch and keep the queue's order"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_is_queued_when_sent_and_a_full_queue_makes_the_sender_wait() {
        let (b, batches, gate) = held(2, 8).await;
        // Room for two: queued by the call itself, before (and without) any poll.
        let (one, two) = (b.send(1), b.send(2));
        // The queue is full: this one waits until the thread takes the others.
        let three = b.send(3);
        tokio::pin!(three);
        assert!(
            futures_util::FutureExt::now_or_never(three.as_mut()).is_none(),
            "a full queue makes the sender wait"
        );
        gate.send(()).unwrap();
        assert!(three.await && one.await && two.await);
        b.stop();
        assert_eq!(batches.lock().unwrap().concat(), vec![0, 1, 2, 3], "in the order sent");
    }
}
