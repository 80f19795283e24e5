//! Delivery's runtime, and how much CPU its workers got and waited for.
//!
//! Delivery runs on a runtime of its own (see `app`), so ingest's tasks never queue in
//! front of it. The ids of its worker threads are kept here, so that `delivery::pace` can
//! read from the kernel how long they ran and how long they waited, runnable, for a CPU:
//! the measure of delivery short of CPU that slows ingest (`policy::pace` says why both).

use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The runtime delivery runs on (the scheduler, every attempt and its HTTP connections),
/// with the ids of its worker threads (see [`DeliveryThreads`]).
/// Dropping it shuts it down without waiting (allowed inside an async context, where
/// courier drops it after the drain).
pub struct DeliveryRuntime(Option<tokio::runtime::Runtime>, Arc<DeliveryThreads>);

/// The Linux thread ids of delivery's worker threads (not its blocking pool's, whose store
/// calls are not what more CPU would speed up): each is listed the first time it parks,
/// which a worker does as soon as it starts, idle, and dropped when it stops.
#[derive(Debug, Default)]
pub struct DeliveryThreads(Mutex<Vec<i32>>);

thread_local! {
    /// Whether this thread is listed in its runtime's [`DeliveryThreads`].
    static LISTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl DeliveryRuntime {
    /// One worker thread per core, named `courier-delivery`.
    pub fn start() -> std::io::Result<DeliveryRuntime> {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let ids = Arc::new(DeliveryThreads::default());
        let (started, stopped) = (ids.clone(), ids.clone());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("courier-delivery")
            .on_thread_park(move || {
                if !LISTED.replace(true) {
                    started.list().push(thread_id());
                }
            })
            .on_thread_stop(move || {
                if LISTED.replace(false) {
                    let id = thread_id();
                    stopped.list().retain(|t| *t != id);
                }
            })
            .enable_all()
            .build()?;
        Ok(DeliveryRuntime(Some(rt), ids))
    }

    /// A handle to spawn on it.
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.0.as_ref().expect("running until dropped").handle().clone()
    }

    /// Its threads.
    pub fn threads(&self) -> Arc<DeliveryThreads> {
        self.1.clone()
    }
}

impl DeliveryThreads {
    fn list(&self) -> std::sync::MutexGuard<'_, Vec<i32>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long each of these threads has run, and waited, runnable, for a CPU (the
    /// kernel's scheduler statistics, `/proc/self/task/<id>/schedstat`); `None` when not
    /// one of them could be read (a kernel that keeps none). A thread that stopped is left
    /// out.
    pub fn sample(&self) -> Option<Sample> {
        let ids = self.list().clone();
        let read: Vec<(i32, CpuTimes)> = ids
            .iter()
            .filter_map(|id| {
                let text = std::fs::read_to_string(format!("/proc/self/task/{id}/schedstat")).ok()?;
                let (ran, waited) = schedstat(&text)?;
                let times = CpuTimes {
                    ran: Duration::from_nanos(ran),
                    waited: Duration::from_nanos(waited),
                };
                Some((*id, times))
            })
            .collect();
        (ids.is_empty() || !read.is_empty()).then_some(Sample(read))
    }
}

/// Each listed thread's [`CpuTimes`] at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample(pub Vec<(i32, CpuTimes)>);

impl Sample {
    /// What the threads in both samples spent between `earlier` and this one, summed: a
    /// thread listed or stopped in between counts for nothing (its whole life is not one
    /// tick's).
    pub fn since(&self, earlier: &Sample) -> CpuTimes {
        let mut spent = CpuTimes::default();
        for (id, now) in &self.0 {
            if let Some((_, then)) = earlier.0.iter().find(|(e, _)| e == id) {
                spent.ran += now.ran.saturating_sub(then.ran);
                spent.waited += now.waited.saturating_sub(then.waited);
            }
        }
        spent
    }
}

/// Time on a CPU and time waiting for one.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// On a CPU.
    pub ran: Duration,
    /// Runnable, on a run queue.
    pub waited: Duration,
}

/// The first two fields of a `schedstat` line: nanoseconds on a CPU, and runnable on a run
/// queue.
fn schedstat(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_whitespace().map(str::parse::<u64>);
    Some((fields.next()?.ok()?, fields.next()?.ok()?))
}

fn thread_id() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::gettid() }
}

impl Drop for DeliveryRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_gives_time_on_a_cpu_then_time_waiting_for_one() {
        assert_eq!(schedstat("2104957 88103 38\n"), Some((2104957, 88103)));
        assert_eq!(schedstat("garbage"), None);
    }

    #[test]
    fn a_tick_counts_only_threads_in_both_samples() {
        let t = |ran: u64, waited: u64| CpuTimes {
            ran: Duration::from_millis(ran),
            waited: Duration::from_millis(waited),
        };
        let before = Sample(vec![(1, t(100, 50)), (2, t(10, 10))]);
        // 2 stopped, 3 was listed since: only 1's tick counts.
        let after = Sample(vec![(1, t(130, 90)), (3, t(5_000, 5_000))]);
        assert_eq!(after.since(&before), t(30, 40));
    }

    #[test]
    fn a_runtime_knows_its_threads_and_their_wait_for_a_cpu() {
        let rt = DeliveryRuntime::start().unwrap();
        let threads = rt.threads();
        rt.handle().block_on(async { tokio::task::yield_now().await });
        // A blocking thread has run (and gone idle) before the list is read: it is not listed.
        let blocking = rt.handle().spawn_blocking(|| ());
        rt.handle().block_on(blocking).unwrap();
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while threads.list().len() < workers {
            assert!(
                std::time::Instant::now() < deadline,
                "workers not listed: {:?}",
                threads.list()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // Every Linux kernel courier supports keeps scheduler statistics per thread.
        assert_eq!(threads.sample().map(|s| s.0.len()), Some(workers));
        assert_eq!(threads.list().len(), workers, "only the workers are listed");
    }
}
