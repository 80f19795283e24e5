//! Delivery: everything that happens to a claimed message. [`Deliverer`] holds what an
//! attempt needs (store, transport, clock, policy, limits, endpoint state, metrics);
//! [`Deliverer::dispatch`] runs one attempt on its own task, isolated so that a panic in
//! it is courier's failure (the message goes back to the queue with no attempt counted),
//! and tracked so shutdown can wait for it, then cut it off. Accepts and results are
//! written by one store-writer thread that puts every one queued meanwhile into its next
//! turn. A message's life after its accept reads top to bottom in `lifecycle`.

mod accept;
mod admit;
pub mod alert;
mod lifecycle;
pub mod pace;
mod request;
mod requeue;
mod results;
mod running;
mod settings;
mod waiting;
mod writer;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::context::Context;
use crate::outbound::transport::Transport;
use crate::store::Leased;

use running::Running;
use settings::host_caps;

use crate::limits::HostLimiter;
pub use crate::limits::Refusal;
pub use admit::AttemptPermit;

/// How long a message waits after courier itself failed on it (a panic, a signing key
/// missing from the config, a result that could not be written) before it is tried again.
pub const SELF_FAILURE_DELAY: Duration = Duration::from_secs(5);

/// How many times an attempt writes its result, and a requeue its release, before giving
/// up: the waits between double from `Deliverer::result_retry` (1 s: 15 s in all), long
/// enough to ride out a short store fault, short enough that a message whose record went
/// bad does not hold a `max_in_flight` permit for ever.
const STORE_TRIES: u32 = 5;

/// The attempt machinery: permits, limits, the in-flight registry and the store writer,
/// over the shared [`Context`].
pub struct Deliverer {
    ctx: Arc<Context>,
    transport: Arc<dyn Transport>,
    /// Per-host caps and breakers.
    hosts: Arc<HostLimiter>,
    /// Fleet-wide limits on Redis (`[fleet]`), when configured.
    fleet: Option<crate::fleet::Fleet>,
    rng: Mutex<StdRng>,
    /// `delivery.max_in_flight` permits: every attempt holds one with its host's.
    all_attempts: Arc<tokio::sync::Semaphore>,
    /// How long an attempt waits before writing its result again after the write failed
    /// (the disk may be full for a while); the simulator shortens it.
    result_retry_ms: std::sync::atomic::AtomicU64,
    /// Releases waiting for their message to read again (see `requeue`).
    waiting_to_read: Arc<std::sync::atomic::AtomicUsize>,
    /// Attempts counted as running, with their task once it is spawned (see `dispatch`).
    /// Ordered by id, so a drain cuts attempts in one order (a simulated run replays).
    /// Keyed by a shared id and the attempt's dispatch number: one allocation per attempt
    /// for the entry and its guard, and a message's next attempt, leased again once the
    /// last one's result is written, has an entry of its own while that one's end is
    /// still on its way to `lifecycle::settle`.
    in_flight: Mutex<BTreeMap<running::Key, Option<AbortHandle>>>,
    /// Attempts dispatched so far: each one's number in the registry.
    dispatched: std::sync::atomic::AtomicU64,
    /// Set while due messages wait in the queue (the scheduler left some, or an accept
    /// could not start at once): new messages then queue behind them rather than start at
    /// accept, and a freed permit wakes the scheduler. See `accept`.
    queue_first: std::sync::atomic::AtomicBool,
    /// First attempts that wait in memory for their host's permit (see `waiting`).
    waiting: waiting::Waiting,
    /// Itself, for an accept dropped unwritten to move the hosts' lines (`accept::Unsent`).
    me: std::sync::Weak<Deliverer>,
    /// Set while a pass runs, too: a permit freed then (after the pass found none) wakes
    /// the scheduler, which would otherwise learn that messages wait only at the pass's end.
    passing: std::sync::atomic::AtomicBool,
    idle: Notify,
    /// The gate ingest's accepts pass: limited while delivery is short of CPU (see `pace`).
    pace: Arc<pace::Pace>,
    /// Writes accepts (in synced batches, starting what they claimed: see `accept`) and
    /// results (see `results`) on one thread.
    writer: writer::StoreWriter,
    trimmer: crate::sys::trim::Trimmer,
}

impl std::fmt::Debug for Deliverer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliverer").finish_non_exhaustive()
    }
}

impl Deliverer {
    /// The attempt machinery over `ctx`: attempts go through `transport`, draw their
    /// jitter from `rng` (seeded in tests), and respect `fleet`'s limits when configured
    /// (started by the caller on delivery's runtime).
    pub fn new(
        ctx: Arc<Context>,
        transport: Arc<dyn Transport>,
        rng: StdRng,
        fleet: Option<crate::fleet::Fleet>,
    ) -> Arc<Self> {
        let settings = ctx.settings();
        let cfg = &settings.config;
        // A probe is taken for lost after twice the longest an attempt may take, which a
        // route or endpoint may set above delivery.request_timeout.
        let hosts = Arc::new(HostLimiter::new(
            cfg.delivery.max_in_flight_per_host,
            host_caps(cfg),
            cfg.circuit.settings(settings.policies.longest_request_timeout()),
        ));
        Arc::new_cyclic(|d| Deliverer {
            writer: writer::StoreWriter::start(d.clone(), results::Writer { ctx: ctx.clone() }, ctx.runtime()),
            all_attempts: Arc::new(tokio::sync::Semaphore::new(cfg.delivery.max_in_flight as usize)),
            hosts,
            ctx,
            transport,
            fleet,
            rng: Mutex::new(rng),
            result_retry_ms: std::sync::atomic::AtomicU64::new(1000),
            waiting_to_read: Default::default(),
            in_flight: Mutex::new(BTreeMap::new()),
            dispatched: Default::default(),
            queue_first: std::sync::atomic::AtomicBool::new(true),
            passing: std::sync::atomic::AtomicBool::new(false),
            waiting: Default::default(),
            me: d.clone(),
            idle: Notify::new(),
            pace: Arc::default(),
            trimmer: Default::default(),
        })
    }

    /// The shared context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Fleet-wide limits, when configured.
    pub fn fleet(&self) -> Option<&crate::fleet::Fleet> {
        self.fleet.as_ref()
    }

    /// The per-host limiter: what it shows (admin, metrics) and a handle to it.
    pub fn hosts(&self) -> &Arc<HostLimiter> {
        &self.hosts
    }

    fn with_rng<T>(&self, f: impl FnOnce(&mut StdRng) -> T) -> T {
        f(&mut self.rng.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Runs one attempt for a claimed message on its own task, holding its permits as
    /// [`AttemptPermit`] says; it counts as running (see [`Running`]) until its result is
    /// settled, which may be after the task ended (see `lifecycle`).
    pub fn dispatch(self: &Arc<Self>, claimed: Leased, permit: AttemptPermit) {
        let key = running::Key {
            id: claimed.record.id.as_str().into(),
            n: self.dispatched.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        };
        // In before the task exists (it may end, and leave, before `spawn` returns); no lock
        // is held across the spawn, as a runtime already shut down drops the attempt (and
        // its entry, which takes the lock) inside it.
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), None);
        let running = Running::new(self.clone(), key.clone());
        let task = self
            .ctx
            .runtime()
            .spawn(lifecycle::attempt(self.clone(), claimed, permit, running));
        let mut registry = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = registry.get_mut(&key) {
            *entry = Some(task.abort_handle());
        }
    }

    /// An attempt's entry leaves the registry; when it was the last, waiters for idle are
    /// told and a burst's freed heap is given back (see `trim`).
    fn left(&self, key: &running::Key) {
        let mut registry = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        registry.remove(key);
        if registry.is_empty() {
            drop(registry);
            self.idle.notify_waiters();
            if self.trimmer.due(self.ctx.clock().now_ms()) {
                crate::sys::blocking::spawn_on(self.ctx.runtime(), crate::sys::trim::trim);
            }
        }
    }

    /// Tests: `delivery.max_in_flight` permits free now (an attempt holds one until its
    /// result is written, and a first attempt from its accept).
    #[cfg(test)]
    pub(crate) fn free_attempt_permits(&self) -> usize {
        self.all_attempts.available_permits()
    }

    /// Tests: starts and ends at once what the store writer handed back so far.
    #[cfg(test)]
    pub(crate) fn settle_handed_back(self: &Arc<Self>) {
        self.writer.settle_now(self);
    }

    /// Tests: the messages whose attempts are running now.
    #[cfg(test)]
    pub(crate) fn in_flight_ids(&self) -> Vec<String> {
        self.in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .map(|key| key.id.to_string())
            .collect()
    }

    /// Attempts running now.
    pub fn in_flight_count(&self) -> usize {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Closes the hosts' lines (see `waiting`), waits up to `grace` for running attempts to
    /// finish, then cuts off the rest (their messages go back to the queue with no attempt
    /// counted). Returns how many were cut.
    pub async fn drain(&self, grace: Duration) -> usize {
        // What waits for its host goes back to the queue first: it is not running.
        self.close_lines().await;
        let waited = tokio::time::timeout(grace, self.wait_idle()).await;
        if waited.is_ok() {
            return 0;
        }
        let handles: Vec<AbortHandle> = self
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .flatten()
            // An attempt whose task ended waits only for its result's write, which lands.
            .filter(|h| !h.is_finished())
            .cloned()
            .collect();
        for h in &handles {
            h.abort();
        }
        // The cut-off tasks requeue their messages; give that a moment to happen.
        let _ = tokio::time::timeout(Duration::from_secs(5), self.wait_idle()).await;
        handles.len()
    }

    /// Completes the next time no attempt is running (registered when called, so an
    /// attempt that ends between this call and the first poll is not missed).
    pub(crate) fn next_idle(&self) -> tokio::sync::futures::Notified<'_> {
        self.idle.notified()
    }

    async fn wait_idle(&self) {
        loop {
            let idle = self.idle.notified();
            if self.in_flight_count() == 0 {
                return;
            }
            idle.await;
        }
    }
}

impl Deliverer {
    /// The wait before writing a result again after a failed write.
    pub(crate) fn result_retry(&self) -> Duration {
        Duration::from_millis(self.result_retry_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The wait before the try after failed try `n` (from 0) of a store write.
    fn store_backoff(&self, n: u32) -> Duration {
        self.result_retry().saturating_mul(1 << n.min(16))
    }

    /// Shortens [`Deliverer::result_retry`] (the simulator does not wait real seconds).
    #[cfg(test)]
    pub(crate) fn set_result_retry(&self, wait: Duration) {
        self.result_retry_ms
            .store(wait.as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Marks an accepted message ordered when its endpoint is configured `fifo` (that wins
    /// over the route's ordering, which ingress set).
    fn order(&self, rec: &mut crate::store::MessageRecord) {
        if let Some(on_dead) = self.ctx.settings().fifo.get(&rec.endpoint) {
            rec.fifo = Some(crate::store::Fifo {
                on_dead: *on_dead,
                pos: 0,
            });
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod tests_faults;
#[cfg(test)]
mod tests_many;
#[cfg(test)]
mod tests_policy;
#[cfg(test)]
mod tests_waiting;
