//! The scheduler: one task that hands due messages to delivery workers.
//!
//! It walks the store's due index from the due floor (never the whole queue: the walk stops
//! at the first entry that is not yet due, or after a budget), and for each due message
//! checks, in order: is it leased (its attempt is running: pass over it), is its endpoint
//! paused (then park it), is its endpoint at its `max_in_flight` cap (skip the endpoint for
//! this pass: a freed permit wakes the next), is its host at its in-flight cap or its circuit
//! breaker open (skip the host for this pass; an open breaker's probe time is a wake-up), is
//! there a rate-limit token for its endpoint (else skip the endpoint until the next token; no
//! attempt is counted), and with `[fleet]` on, does the fleet grant a lease (the same caps
//! and rate fleet-wide, asked for every entry that passed the local limits at once: one
//! round trip to Redis per pass, or per `claim_batch` of them; a refusal skips the host or
//! endpoint like a local one, with the time the fleet gave as a wake-up). See
//! `delivery::admit`. Messages that pass all of them are leased together (reads only, no
//! write: see `store::lease`), each with its host permit already in hand, and dispatched.
//!
//! A pass that meets a long run of entries it cannot dispatch (their host is at its cap or
//! their endpoint out of tokens) stops after 256 of them and remembers where: the
//! next pass continues from there, so other hosts' messages behind a blocked backlog are
//! reached, and no wake-up pays for re-reading the whole blocked run. What lies before the
//! resume point is not forgotten: a walk that started there and reaches the end goes on
//! from the floor, once per wake-up (what woke it, an accept or a freed permit, may sort
//! before it), and the wake times asked for before it stay owed until a walk from the floor
//! asks for them again. A wake-up whose scan budget (4,096 entries) runs out on blocked runs leaves what
//! lies past the resume point to the next wake-up: the blocked attempts give one as they
//! end, and of the wake-ups a timer gives (a token, a due time), every other one goes on
//! from the resume point rather than the floor, so what lies past a blocked run that only
//! timers drain (a rate-limited backlog) is reached too. A walk the scan budget cuts
//! before any such run (every entry it read held, none of them a run as long as
//! `skip_run`) leaves a resume point just past the last entry it read, in the same way.
//!
//! A pass runs on a blocking thread: it reads the store, and its park writes wait behind the
//! accepts' fsync, neither of which may hold up the async workers that serve ingress.
//!
//! Between passes it sleeps until the earliest of: the next due time, the next rate-limit
//! token it waited for, or a wake-up (an accept, a finished attempt freeing a permit, a
//! resumed endpoint). There is no fixed polling interval: an idle courier does nothing.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

pub(crate) mod pass;

use crate::delivery::Deliverer;
use pass::{pass, Pass};

/// How long to wait before trying again after the store failed to read or claim.
const STORE_ERROR_BACKOFF: Duration = Duration::from_secs(1);

/// How much one pass and one wake-up may do: [`Limits::DEFAULT`] in courier; tests make
/// them small so a few dozen messages reach the long-backlog paths.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Most due entries one pass looks at, and one wake-up pays for.
    pub scan_budget: usize,
    /// Most messages one pass leases (or parks).
    pub claim_batch: usize,
    /// Consecutive undispatchable entries after which a pass stops and leaves a resume point.
    pub skip_run: usize,
}

impl Limits {
    /// courier's limits.
    pub(crate) const DEFAULT: Limits = Limits {
        scan_budget: 4096,
        claim_batch: 256,
        skip_run: 256,
    };
}

/// The scheduler task.
pub struct Scheduler {
    d: Arc<Deliverer>,
    limits: Limits,
    /// Where the last pass stopped: on a long blocked run, or where the scan budget ran out.
    resume: Option<(u64, String)>,
    /// Whether the next wake-up by a timer goes on from `far` (see [`Scheduler::wait`]).
    timer_keeps_resume: bool,
    /// The resume point a timer wake-up set aside to walk from the floor.
    far: Option<(u64, String)>,
    /// Tests: whether the loop is asleep, and until when.
    #[cfg(test)]
    nap: Option<Nap>,
    /// Tests: run inside each pass, after its scan decided and before its writes (the
    /// simulator runs the store writer's batches there: what a
    /// pass on its blocking thread meets).
    #[cfg(test)]
    between: Option<Between>,
    /// Tests: where the loop reports its walks and sleeps.
    #[cfg(test)]
    walks: Option<Walks>,
}

/// Tests: what runs inside a pass (see `Scheduler::between`).
#[cfg(test)]
pub(crate) type Between = Arc<dyn Fn() + Send + Sync>;

/// Tests: while the loop waits, until when (`None`: for a wake-up only), its resume point
/// and the wake-ups asked for when it began; `None` while it works. Set when the wait is
/// first polled and cleared when it ends. A wake-up asked for since leaves it set until the
/// runtime next polls the loop, which may come after other tasks: the loop is settled only
/// while no wake-up is newer than its wait ([`Asleep::wakes`]).
#[cfg(test)]
pub(crate) type Nap = Arc<std::sync::Mutex<Option<Asleep>>>;

/// Tests: what the loop waits for (see [`Nap`]).
#[cfg(test)]
#[derive(Debug, Clone)]
pub(crate) struct Asleep {
    /// Its wake time, if any.
    pub until: Option<u64>,
    /// Where its next walk starts, if not at the floor.
    pub resume: Option<(u64, String)>,
    /// The wake-up's rings when it began (`Wake::rung`): a higher count now is a ring
    /// still pending.
    pub wakes: u64,
}

/// Tests: what the loop did, in order (see [`LoopEvent`]).
#[cfg(test)]
pub(crate) type Walks = Arc<std::sync::Mutex<Vec<LoopEvent>>>;

/// Tests: one thing the loop did. From these the simulator holds the loop to its rule that
/// a wake time asked for by a walk since the last walk from the floor is owed: no sleep is
/// longer.
#[cfg(test)]
#[derive(Debug, Clone, Copy)]
pub(crate) enum LoopEvent {
    /// A walk, from the floor or from a resume point, and the wake time it asked for.
    Walked { from_floor: bool, wake_at: Option<u64> },
    /// A sleep, until when (`None`: for a wake-up only).
    Slept { until: Option<u64> },
}

/// Marks the loop asleep until dropped (see [`Nap`]).
#[cfg(test)]
struct Napping<'a>(&'a Nap);

#[cfg(test)]
impl<'a> Napping<'a> {
    fn start(nap: &'a Nap, until: Option<u64>, resume: Option<(u64, String)>, wakes: u64) -> Self {
        *nap.lock().unwrap() = Some(Asleep { until, resume, wakes });
        Napping(nap)
    }
}

#[cfg(test)]
impl Drop for Napping<'_> {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = None;
    }
}

impl Scheduler {
    /// A scheduler over a delivery context.
    pub fn new(d: Arc<Deliverer>) -> Self {
        Scheduler {
            d,
            limits: Limits::DEFAULT,
            resume: None,
            timer_keeps_resume: false,
            far: None,
            #[cfg(test)]
            nap: None,
            #[cfg(test)]
            between: None,
            #[cfg(test)]
            walks: None,
        }
    }

    /// Tests: reports every walk and sleep to `walks`.
    #[cfg(test)]
    pub(crate) fn with_walks(self, walks: Walks) -> Self {
        Scheduler {
            walks: Some(walks),
            ..self
        }
    }

    #[cfg(test)]
    fn report(&self, event: LoopEvent) {
        if let Some(walks) = &self.walks {
            walks.lock().unwrap_or_else(|p| p.into_inner()).push(event);
        }
    }

    /// Tests: runs `between` inside every pass, after its scan and before its writes.
    #[cfg(test)]
    pub(crate) fn with_between(self, between: Between) -> Self {
        Scheduler {
            between: Some(between),
            ..self
        }
    }

    /// Tests: a scheduler with other limits, reporting its sleeps to `nap`.
    #[cfg(test)]
    pub(crate) fn observed(d: Arc<Deliverer>, limits: Limits, nap: Nap) -> Self {
        Scheduler {
            limits,
            nap: Some(nap),
            ..Scheduler::new(d)
        }
    }

    /// Runs until `stop` turns true.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        // Entries looked at since the last wait: one wake-up pays for at most the scan budget.
        let mut scanned_since_wait = 0;
        // The earliest wake-up asked for by the passes since the last walk from the floor. A
        // pass that starts at a resume point does not see the entries before it, so what
        // they asked for (a token, a breaker's probe) stays owed, whether the loop went
        // straight on or slept and was woken early; a walk from the floor sees them again
        // and asks anew.
        let mut owed: Option<u64> = None;
        // Whether a walk since the last wait started at the floor.
        let mut from_floor = false;
        let limits = self.limits;
        while !*stop.borrow() {
            let d = self.d.clone();
            let resume = self.resume.take();
            let resumed = resume.is_some();
            if !resumed {
                owed = None;
                from_floor = true;
            }
            #[cfg(test)]
            let between = self.between.clone();
            let walk = move || {
                #[cfg(test)]
                if let Some(between) = between {
                    return pass::pass_with(&d, &limits, resume, &mut || between());
                }
                pass(&d, &limits, resume)
            };
            let (pass, resume) = match crate::sys::blocking::run(walk).await {
                Ok(done) => done,
                Err(e) => {
                    tracing::error!(error = %e, "a scheduler pass panicked");
                    (
                        Pass {
                            store_error: true,
                            ..Pass::default()
                        },
                        None,
                    )
                }
            };
            self.resume = resume;
            #[cfg(test)]
            self.report(LoopEvent::Walked {
                from_floor: !resumed,
                wake_at: pass.wake_at,
            });
            self.d.context().metrics().scheduler_pass();
            scanned_since_wait += pass.scanned;
            owed = earliest(owed, pass.wake_at);
            let more_now = pass.cut && pass.dispatched + pass.parked > 0;
            let budget_left = scanned_since_wait < limits.scan_budget;
            let go_deeper = pass.stopped_on_run && budget_left;
            // A walk that began at a resume point and reached the end has not seen what lies
            // before that point, where what woke it may be (an accept that sorts before it,
            // a freed permit of a host there): it goes on from the floor, once per wake-up.
            let wrap = resumed && pass.exhausted && !from_floor && budget_left;
            if more_now || go_deeper || wrap {
                continue;
            }
            scanned_since_wait = 0;
            from_floor = false;
            let mut wake_at = owed;
            if pass.store_error {
                let backoff = self.d.context().clock().now_ms() + STORE_ERROR_BACKOFF.as_millis() as u64;
                wake_at = earliest(wake_at, Some(backoff));
            }
            #[cfg(test)]
            self.report(LoopEvent::Slept { until: wake_at });
            self.wait(wake_at, &mut stop).await;
        }
    }

    /// Sleeps until `wake_at`, a wake-up, or `stop`.
    async fn wait(&mut self, wake_at: Option<u64>, stop: &mut watch::Receiver<bool>) {
        let sleep = async {
            #[cfg(test)]
            let _asleep = self
                .nap
                .as_ref()
                .map(|nap| Napping::start(nap, wake_at, self.resume.clone(), self.d.context().wake_signal().rung()));
            match wake_at {
                Some(at) => self.d.context().clock().sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        // In a fixed order (not tokio's random one), so a simulated run replays: a stop
        // first; then a due time, whose walk from the floor also covers a wake-up that came
        // with it.
        tokio::select! {
            biased;
            _ = stop.changed() => {}
            // A due time (or a breaker's probe time, or a token) came: what it was for may
            // lie before the last resume point, so the walk starts at the floor, and the
            // point is set aside. The next such wake-up goes on from the furthest point set
            // aside instead (what its timer was for stays owed, and is reached when that
            // walk wraps): else, with only timers waking it, every wake-up would spend its
            // budget on the same blocked run from the floor, and what lies past the run
            // would wait until it drains.
            _ = sleep => {
                if self.timer_keeps_resume {
                    self.resume = self.resume.take().max(self.far.take());
                } else {
                    self.far = self.resume.take().max(self.far.take());
                }
                self.timer_keeps_resume = !self.timer_keeps_resume;
            }
            _ = self.d.context().wake_signal().notified() => {}
        }
    }
}

/// The earlier of two optional times (either alone if the other is absent).
pub(crate) fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests;
