//! Delivery's share of the CPU: ingress runs at a lower OS priority than delivery.
//!
//! Ingest and delivery compete for the same cores. Left to themselves, ingest wins under
//! overload: hundreds of connections' worth of ready tasks against a few dozen attempts, so
//! the harder an app pushes the less courier delivers, and the backlog and the latency
//! grow without bound while the receiver is fast and idle. Delivery therefore runs on a
//! runtime of its own (see `app`), and the threads that serve ingest (the main runtime)
//! lower their own priority by [`INGRESS_NICE`] (the store writer, which writes both
//! accepts and results, keeps delivery's: a result must not wait behind ingest for CPU).
//! When the CPU is free this changes nothing; when it is contended, the kernel gives
//! delivery threads about five times the share of ingest threads, so delivery keeps pace
//! and the app's 202s slow instead (backpressure), which is the only stable answer to sustained overload. A slow or
//! failing receiver costs delivery little CPU, so it never slows ingest this way.
//!
//! Raising one's own nice value needs no privilege; a failure is logged and ignored.

/// How much lower ingress threads run (the Linux nice scale: each step is about 1.25×
/// less weight, so 7 steps is about 5×). The share delivery needs to keep pace grows as an
/// accept gets cheaper next to an attempt: 5 steps (3×) kept pace until ingest's cost per
/// message fell by a fifth, then let acknowledgements run 7–19% ahead of deliveries at 256
/// connections; 7 keeps them within 3% (docs/benchmarks.md, "Issue 43, step 7").
pub const INGRESS_NICE: i32 = 7;

/// Lowers the calling thread's priority to [`INGRESS_NICE`] steps below the process's own
/// (the main thread's: a unit started with `Nice=` keeps the same gap between ingress and
/// delivery). A thread already that low (one started by an ingress thread inherits its
/// value) is left alone. Linux applies the nice value per thread (to the calling thread's
/// id), not to the whole process.
pub fn lower_current_thread() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpid, gettid, getpriority and setpriority take no pointers and only
        // read nice values or change this thread's.
        let failed = unsafe {
            let base = libc::getpriority(libc::PRIO_PROCESS, libc::getpid() as libc::id_t);
            let tid = libc::gettid() as libc::id_t;
            let now = libc::getpriority(libc::PRIO_PROCESS, tid);
            let lower = (base + INGRESS_NICE).min(19);
            lower > now && libc::setpriority(libc::PRIO_PROCESS, tid, lower) != 0
        };
        if failed {
            tracing::debug!(error = %std::io::Error::last_os_error(), "could not lower an ingress thread's priority");
        }
    }
}

/// The runtime delivery runs on (the scheduler, every attempt and its HTTP connections), at
/// normal priority. Dropping it shuts it down without waiting (allowed inside an async
/// context, where courier drops it after the drain).
pub struct DeliveryRuntime(Option<tokio::runtime::Runtime>);

impl DeliveryRuntime {
    /// One worker thread per core, named `courier-delivery`.
    pub fn start() -> std::io::Result<DeliveryRuntime> {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("courier-delivery")
            .enable_all()
            .build()?;
        Ok(DeliveryRuntime(Some(rt)))
    }

    /// A handle to spawn on it.
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.0.as_ref().expect("running until dropped").handle().clone()
    }
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
    #[test]
    fn lowering_twice_or_from_a_lowered_thread_stays_at_ingress_nice() {
        let (once, twice, child) = std::thread::scope(|s| {
            s.spawn(|| {
                let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
                super::lower_current_thread();
                let once = nice();
                super::lower_current_thread();
                let twice = nice();
                // A thread started by a lowered one inherits its value and asks again.
                let child = std::thread::spawn(move || {
                    super::lower_current_thread();
                    nice()
                })
                .join()
                .unwrap();
                (once, twice, child)
            })
            .join()
            .unwrap()
        });
        assert_eq!((twice, child), (once, once), "not lowered again");
    }

    #[test]
    fn an_ingress_thread_runs_at_ingress_nice_and_others_do_not() {
        let (lowered, other) = std::thread::scope(|s| {
            let lowered = s.spawn(|| {
                super::lower_current_thread();
                unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
            });
            let other = s.spawn(|| unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) });
            (lowered.join().unwrap(), other.join().unwrap())
        });
        assert!(
            lowered >= (other + super::INGRESS_NICE).min(19),
            "lowered to {lowered} from {other}"
        );
        assert!(
            other < lowered,
            "a thread that did not ask keeps its priority ({other})"
        );
    }
}
