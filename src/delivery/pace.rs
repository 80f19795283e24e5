//! The gate every accept passes, and the task that sets how many may be in progress while
//! delivery is short of CPU (the rule is `policy::pace`'s).
//!
//! Open (the usual case), a pass costs one uncontended semaphore permit. The task sleeps
//! until messages start to wait in the queue ([`Pace::messages_wait`], called where the
//! scheduler or an accept finds so), then looks every [`TICK`] at how long delivery's
//! workers ran and waited for a CPU and at the queue, until the gate is open again and
//! nothing waits. The first slowing says so in a warning (at most one a minute); every
//! change of the limit is a debug line.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, SemaphorePermit};

use crate::policy::pace::{next, Limit, Tick};
#[cfg(doc)]
use crate::sys::delivery_runtime::DeliveryThreads;
use crate::sys::delivery_runtime::Sample;

/// How often the limit is set while it is (or may have to be) in force.
pub const TICK: Duration = Duration::from_millis(100);

/// At most one warning per this long that ingest is slowed: a long overload may open and
/// close the gate many times.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The permits of an open gate: more accepts than ingest's byte budget lets be in progress.
const OPEN: usize = 1 << 20;

/// The gate and what its task needs.
#[derive(Debug)]
pub struct Pace {
    permits: Semaphore,
    /// Permits to forget as they come back, when a lowered limit is below what is in use.
    debt: AtomicUsize,
    /// Wakes the task when messages start to wait.
    waiting: Notify,
}

impl Default for Pace {
    fn default() -> Self {
        Pace {
            permits: Semaphore::new(OPEN),
            debt: AtomicUsize::new(0),
            waiting: Notify::new(),
        }
    }
}

/// One accept's place at the gate, given back when dropped (borrowed from the gate: no
/// reference count moves per accept).
#[derive(Debug)]
pub struct Pass<'a> {
    permit: Option<SemaphorePermit<'a>>,
    debt: &'a AtomicUsize,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let owed = self
            .debt
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| d.checked_sub(1))
            .is_ok();
        if let (true, Some(permit)) = (owed, self.permit.take()) {
            permit.forget();
        }
    }
}

impl Pace {
    /// Waits for a place when the gate is limited; at once when it is open.
    pub async fn pass(&self) -> Pass<'_> {
        let permit = match self.permits.try_acquire() {
            Ok(p) => p,
            Err(_) => self.permits.acquire().await.expect("the gate is never closed"),
        };
        Pass {
            permit: Some(permit),
            debt: &self.debt,
        }
    }

    /// Messages wait in the queue now: the task looks whether it is for lack of CPU.
    pub fn messages_wait(&self) {
        self.waiting.notify_one();
    }

    /// Sets the limit every [`TICK`] while one is in force or messages wait (`behind`:
    /// `None` once delivery is gone), from how long delivery's workers ran and waited for a
    /// CPU (`sample`: [`DeliveryThreads::sample`]), and tells `slowed` whenever ingest starts
    /// or stops being slowed. Returns, the gate open, once delivery is gone or when the
    /// kernel keeps no such figures.
    pub async fn run(
        self: Arc<Self>,
        sample: impl Fn() -> Option<Sample>,
        behind: impl Fn() -> Option<bool>,
        slowed: impl Fn(bool),
    ) {
        let mut limit = Limit::Open;
        let mut warned: Option<crate::clock::Stopwatch> = None;
        while let Some(waiting) = behind() {
            if limit == Limit::Open && !waiting {
                self.waiting.notified().await;
                continue;
            }
            let Some(before) = sample() else {
                tracing::info!(
                    "no scheduler statistics from the kernel: ingest is not slowed when delivery is short of CPU"
                );
                break;
            };
            // tokio's clock: the tick as the runtime's timer saw it (paused in tests).
            let started = tokio::time::Instant::now();
            tokio::time::sleep(TICK).await;
            let (Some(after), Some(waiting)) = (sample(), behind()) else {
                break;
            };
            let elapsed = started.elapsed().as_secs_f64();
            let spent = after.since(&before);
            let tick = Tick {
                behind: waiting,
                cpu_run: spent.ran.as_secs_f64() / elapsed,
                cpu_wait: spent.waited.as_secs_f64() / elapsed,
                in_use: self.in_use(limit),
            };
            let decided = next(limit, tick);
            if decided != limit {
                self.set(total(limit), total(decided));
                if (limit == Limit::Open) != (decided == Limit::Open) {
                    slowed(decided != Limit::Open);
                }
                let quiet = warned.as_ref().is_some_and(|w| w.elapsed() < WARN_EVERY);
                match decided {
                    Limit::At(n) if limit == Limit::Open && !quiet => {
                        warned = Some(crate::clock::Stopwatch::start());
                        tracing::warn!(
                            accepts = n,
                            "delivery is short of CPU: ingest slowed to keep pace (202s wait)"
                        )
                    }
                    _ => tracing::debug!(limit = ?decided, ?tick, "ingest pace"),
                }
                limit = decided;
            }
        }
        // Never left narrowed with no one to open it.
        self.set(total(limit), OPEN);
        slowed(false);
    }

    /// Accepts holding a pass.
    fn in_use(&self, limit: Limit) -> usize {
        (total(limit) + self.debt.load(Ordering::Acquire)).saturating_sub(self.permits.available_permits())
    }

    /// Moves the gate's permits from `from` to `to`.
    fn set(&self, from: usize, to: usize) {
        if to < from {
            let cut = from - to;
            let forgotten = self.permits.forget_permits(cut);
            self.debt.fetch_add(cut - forgotten, Ordering::AcqRel);
        } else {
            let mut add = to - from;
            let paid = self
                .debt
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| Some(d - d.min(add)))
                .expect("always Some");
            add -= paid.min(add);
            self.permits.add_permits(add);
        }
    }
}

fn total(limit: Limit) -> usize {
    match limit {
        Limit::Open => OPEN,
        Limit::At(n) => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[test]
    fn a_limit_below_what_is_in_use_is_reached_as_passes_come_back() {
        let pace = Pace::default();
        let passes: Vec<Pass> = (0..10).map(|_| pace.pass().now_or_never().unwrap()).collect();
        pace.set(OPEN, 4);
        assert_eq!(pace.in_use(Limit::At(4)), 10);
        assert!(pace.pass().now_or_never().is_none(), "10 in use, limit 4");
        let mut passes = passes.into_iter();
        for _ in 0..7 {
            drop(passes.next());
        }
        assert_eq!(pace.in_use(Limit::At(4)), 3);
        let fourth = pace.pass().now_or_never().expect("3 in use, limit 4");
        assert!(pace.pass().now_or_never().is_none());
        // Up again: the debt is gone, so the new permits are real ones.
        pace.set(4, 6);
        let more: Vec<_> = (0..2).map(|_| pace.pass().now_or_never().expect("6 allowed")).collect();
        assert!(pace.pass().now_or_never().is_none());
        assert_eq!(pace.in_use(Limit::At(6)), 6);
        drop((fourth, more, passes));
        pace.set(6, OPEN);
        assert_eq!(pace.in_use(Limit::Open), 0);
        assert_eq!(pace.permits.available_permits(), OPEN);
    }

    #[tokio::test(start_paused = true)]
    async fn the_gate_narrows_while_delivery_is_starved_and_opens_once_it_keeps_up() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Mutex;
        let pace = Arc::new(Pace::default());
        let held: Vec<Pass> = (0..40).map(|_| pace.pass().now_or_never().unwrap()).collect();
        // Each look at the kernel's figures finds another half tick run and a whole tick
        // waited (starved), until `starved` is cleared.
        let starved = Arc::new(AtomicBool::new(true));
        let clock = Arc::new(Mutex::new(crate::sys::delivery_runtime::CpuTimes::default()));
        let cpu = {
            let (starved, clock) = (starved.clone(), clock.clone());
            move || {
                let mut t = clock.lock().unwrap();
                if starved.load(Ordering::SeqCst) {
                    t.ran += TICK / 2;
                    t.waited += TICK;
                }
                Some(Sample(vec![(1, *t)]))
            }
        };
        let behind = {
            let starved = starved.clone();
            move || Some(starved.load(Ordering::SeqCst))
        };
        let shown = Arc::new(AtomicBool::new(false));
        let gauge = shown.clone();
        tokio::spawn(pace.clone().run(cpu, behind, move |s| gauge.store(s, Ordering::SeqCst)));
        pace.messages_wait();
        tokio::time::sleep(TICK + TICK / 2).await;
        assert_eq!(pace.in_use(Limit::At(30)), 40, "limited to 3/4 of the 40 in use");
        assert!(pace.pass().now_or_never().is_none(), "40 in use, limit 30");
        assert!(shown.load(Ordering::SeqCst), "the gauge says ingest is slowed");
        tokio::time::sleep(TICK).await; // 30 → 23: 17 owed by the 40 held
        let mut held = held.into_iter();
        for _ in 0..15 {
            drop(held.next());
        }
        assert_eq!(pace.in_use(Limit::At(23)), 25);
        assert!(pace.pass().now_or_never().is_none(), "25 in use, limit 23, and starved");

        starved.store(false, Ordering::SeqCst);
        drop(held);
        tokio::time::sleep(TICK * 2).await;
        let all: Vec<Pass> = (0..1000).map(|_| pace.pass().now_or_never().expect("open")).collect();
        assert_eq!(all.len(), 1000);
        assert!(!shown.load(Ordering::SeqCst), "the gauge says it no longer is");
    }

    #[tokio::test(start_paused = true)]
    async fn a_narrowed_gate_opens_when_delivery_is_gone() {
        use std::sync::atomic::AtomicBool;
        let pace = Arc::new(Pace::default());
        let held: Vec<Pass> = (0..40).map(|_| pace.pass().now_or_never().unwrap()).collect();
        let gone = Arc::new(AtomicBool::new(false));
        let ticks = Arc::new(AtomicUsize::new(0));
        let sample = {
            let ticks = ticks.clone();
            move || {
                let n = ticks.fetch_add(1, Ordering::SeqCst) as u32;
                let t = crate::sys::delivery_runtime::CpuTimes {
                    ran: TICK / 2 * n,
                    waited: TICK * n,
                };
                Some(Sample(vec![(1, t)]))
            }
        };
        let behind = {
            let gone = gone.clone();
            move || (!gone.load(Ordering::SeqCst)).then_some(true)
        };
        let task = tokio::spawn(pace.clone().run(sample, behind, |_| ()));
        pace.messages_wait();
        tokio::time::sleep(TICK + TICK / 2).await;
        assert!(pace.pass().now_or_never().is_none(), "narrowed below the 40 in use");
        gone.store(true, Ordering::SeqCst);
        task.await.unwrap();
        drop(held);
        assert_eq!(pace.permits.available_permits(), OPEN, "left open");
    }

    /// Seeded random runs of passes taken and given back between limits set anywhere (the
    /// orders threads can put them in): the gate never admits past its limit once what is
    /// owed is paid, counts exactly the passes held, and opens whole.
    #[test]
    fn passes_and_limits_in_any_order_keep_the_count() {
        use rand::{Rng, SeedableRng};
        for seed in 0..200u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let pace = Pace::default();
            let mut limit = Limit::Open;
            let mut held = Vec::new();
            for _ in 0..300 {
                match rng.random_range(0..4) {
                    0 | 1 => {
                        let got = pace.pass().now_or_never();
                        let room = total(limit) > held.len() && pace.debt.load(Ordering::SeqCst) == 0;
                        assert!(got.is_some() || !room, "seed {seed}: refused with room");
                        held.extend(got);
                    }
                    2 if !held.is_empty() => drop(held.swap_remove(rng.random_range(0..held.len()))),
                    _ => {
                        let to = match rng.random_range(0..5) {
                            0 => Limit::Open,
                            _ => Limit::At(rng.random_range(crate::policy::pace::FLOOR..60)),
                        };
                        pace.set(total(limit), total(to));
                        limit = to;
                    }
                }
                assert_eq!(pace.in_use(limit), held.len(), "seed {seed}");
                let owed = pace.debt.load(Ordering::SeqCst);
                assert_eq!(
                    held.len() + pace.permits.available_permits(),
                    total(limit) + owed,
                    "seed {seed}"
                );
                assert!(owed <= held.len(), "seed {seed}: more owed than held");
            }
            drop(held);
            pace.set(total(limit), OPEN);
            assert_eq!(pace.permits.available_permits(), OPEN, "seed {seed}");
        }
    }

    #[test]
    fn raising_a_limit_pays_the_debt_before_adding_permits() {
        let pace = Pace::default();
        let passes: Vec<Pass> = (0..10).map(|_| pace.pass().now_or_never().unwrap()).collect();
        pace.set(OPEN, 4); // 6 owed
        pace.set(4, 8); // 4 of the 6 forgiven
        assert_eq!(pace.debt.load(Ordering::Acquire), 2);
        drop(passes);
        assert_eq!(pace.permits.available_permits(), 8);
    }
}
