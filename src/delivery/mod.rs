//! Delivery: everything that happens to a claimed message. [`Deliverer`] holds what an
//! attempt needs (store, transport, clock, policy, limits, endpoint state, metrics);
//! [`Deliverer::dispatch`] runs one attempt on its own task, isolated so that a panic in
//! it is courier's failure (the message goes back to the queue with no attempt counted),
//! and tracked so shutdown can wait for it, then cut it off. Results are recorded by one
//! result-writer thread that puts every result finished meanwhile into one write.

mod accept;
mod admit;
pub mod alert;
pub mod endpoint_caps;
pub mod endpoints;
pub mod host_limiter;
mod requeue;
mod resizable;
mod results;
mod settings;
mod worker;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::clock::SharedClock;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::outbound::transport::Transport;
use crate::store::{Claimed, Store};

pub use settings::Settings;
use settings::{endpoint_rates, host_caps};

pub use admit::{AttemptPermit, PermitRefused, Refusal};
pub use endpoint_caps::EndpointCaps;
pub use endpoints::{EndpointChange, EndpointTable, EndpointView, StreakEvent};
pub use host_limiter::{HostLimiter, HostPermit, HostRefusal, HostView};

/// How long a message waits after courier itself failed on it (a panic, a signing key
/// missing from the config, a result that could not be written) before it is tried again.
pub const SELF_FAILURE_DELAY: Duration = Duration::from_secs(5);

/// How many times an attempt writes its result, and a requeue its release, before giving
/// up: the waits between double from `Deliverer::result_retry` (1 s: 15 s in all), long
/// enough to ride out a short store fault, short enough that a message whose record went
/// bad does not hold a `max_in_flight` permit for ever.
const STORE_TRIES: u32 = 5;

/// Shared context of every attempt.
pub struct Deliverer {
    /// The store.
    pub store: Arc<Store>,
    /// The transport attempts go through.
    pub transport: Arc<dyn Transport>,
    /// The clock.
    pub clock: SharedClock,
    /// What a reload may change, swapped whole (see [`Settings`]): read at each attempt.
    settings: arc_swap::ArcSwap<Settings>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Per-endpoint state.
    pub endpoints: Arc<EndpointTable>,
    /// Per-host caps.
    pub hosts: HostLimiter,
    /// Per-endpoint caps (`[[endpoint]] max_in_flight`).
    pub endpoint_caps: EndpointCaps,
    /// Fleet-wide limits on Redis (`[fleet]`), when configured.
    pub fleet: Option<crate::fleet::Fleet>,
    /// Wakes the scheduler (new work, a freed permit, a resumed endpoint).
    pub wake: Arc<Notify>,
    rng: Mutex<StdRng>,
    /// Held by a pause or resume across its whole change, and by the scheduler from its
    /// last look at the pause flag to its park write: a resume can then never land between
    /// the scheduler's decision to park and the park, which would strand messages in the
    /// parked set of an active endpoint.
    pause_gate: Arc<Mutex<()>>,
    /// `delivery.max_in_flight` permits: every attempt holds one with its host's.
    all_attempts: Arc<tokio::sync::Semaphore>,
    /// Serialises endpoint-state writes, each of which writes the state current when it
    /// runs: the last write is always the latest state, whatever order the changes'
    /// writers reached the store in.
    persist_lock: Arc<Mutex<()>>,
    /// How long an attempt waits before writing its result again after the write failed
    /// (the disk may be full for a while); the simulator shortens it.
    result_retry_ms: std::sync::atomic::AtomicU64,
    /// Releases waiting for their message to read again (see `requeue`).
    waiting_to_read: Arc<std::sync::atomic::AtomicUsize>,
    in_flight: Mutex<HashMap<String, AbortHandle>>,
    /// Where attempts are spawned, whichever runtime their message was accepted on.
    runtime: tokio::runtime::Handle,
    /// Set while due messages wait in the queue (the scheduler left some, or an accept
    /// could not start at once): new messages then queue behind them rather than start at
    /// accept, and a freed permit wakes the scheduler. See `accept`.
    queue_first: std::sync::atomic::AtomicBool,
    idle: Notify,
    results: results::ResultWriter,
    trimmer: crate::sys::trim::Trimmer,
}

impl std::fmt::Debug for Deliverer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliverer").finish_non_exhaustive()
    }
}

/// Everything [`Deliverer::new`] takes.
pub struct DelivererParts {
    /// The store.
    pub store: Arc<Store>,
    /// The transport.
    pub transport: Arc<dyn Transport>,
    /// The clock.
    pub clock: SharedClock,
    /// The settings.
    pub config: Arc<Config>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// The scheduler's wake-up.
    pub wake: Arc<Notify>,
    /// Randomness for jitter (seeded in tests).
    pub rng: StdRng,
    /// Where attempts run: courier gives delivery a runtime of its own (see `priority`);
    /// tests pass the one they run on.
    pub runtime: tokio::runtime::Handle,
    /// Fleet-wide limits (`[fleet]`), started by the caller on `runtime`; `None`: local only.
    pub fleet: Option<crate::fleet::Fleet>,
}

impl Deliverer {
    /// Builds the context; loads persisted endpoint state from the store.
    pub fn new(parts: DelivererParts) -> Result<Arc<Self>, crate::store::StoreError> {
        let cfg = &parts.config;
        let now = parts.clock.now_ms();
        let endpoints = EndpointTable::new(
            cfg.delivery.rate_per_second,
            endpoint_rates(cfg),
            cfg.delivery.pause_after_permanent_failures,
            // Listed as long as the messages delivered to them are kept.
            cfg.retention.as_millis() as u64,
            parts.store.paused_endpoints()?,
            now,
        );
        let endpoints = Arc::new(endpoints);
        let settings = Settings::new(parts.config.clone());
        let persist_lock = Arc::new(Mutex::new(()));
        let pause_gate = Arc::new(Mutex::new(()));
        let all_attempts = Arc::new(tokio::sync::Semaphore::new(cfg.delivery.max_in_flight as usize));
        // A probe is taken for lost after twice the longest an attempt may take, which a
        // route or endpoint may set above delivery.request_timeout.
        let hosts = HostLimiter::new(
            cfg.delivery.max_in_flight_per_host,
            host_caps(cfg),
            cfg.circuit.settings(settings.policies.longest_request_timeout()),
        );
        let endpoint_caps = EndpointCaps::new(settings.policies.endpoint_caps());
        Ok(Arc::new(Deliverer {
            results: results::ResultWriter::start(
                parts.store.clone(),
                endpoints.clone(),
                persist_lock.clone(),
                pause_gate.clone(),
            ),
            store: parts.store,
            transport: parts.transport,
            clock: parts.clock,
            settings: arc_swap::ArcSwap::from_pointee(settings),
            metrics: parts.metrics,
            endpoints,
            hosts,
            endpoint_caps,
            fleet: parts.fleet,
            wake: parts.wake,
            rng: Mutex::new(parts.rng),
            pause_gate,
            all_attempts,
            persist_lock,
            result_retry_ms: std::sync::atomic::AtomicU64::new(1000),
            waiting_to_read: Default::default(),
            in_flight: Mutex::new(HashMap::new()),
            runtime: parts.runtime,
            queue_first: std::sync::atomic::AtomicBool::new(true),
            idle: Notify::new(),
            trimmer: Default::default(),
        }))
    }

    fn with_rng<T>(&self, f: impl FnOnce(&mut StdRng) -> T) -> T {
        f(&mut self.rng.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Runs one attempt for a claimed message on its own task, holding its permits as
    /// [`AttemptPermit`] says.
    pub fn dispatch(self: &Arc<Self>, claimed: Claimed, permit: AttemptPermit) {
        let id = claimed.record.id.clone();
        let d = self.clone();
        let mut registry = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        // The attempt gives its host permit back as soon as the receiver has answered (the
        // result write that follows does not occupy the receiver); cut off, it drops both
        // with its future.
        let inner = self.runtime.spawn(worker::attempt(d.clone(), claimed, permit));
        registry.insert(id.clone(), inner.abort_handle());
        drop(registry);
        self.runtime.spawn(async move {
            let outcome = inner.await;
            if let Err(e) = outcome {
                // The attempt did not finish (panic, or cut off at shutdown): not the
                // receiver's failure, so no attempt is counted.
                d.metrics.attempt_abandoned();
                let now = d.clock.now_ms();
                let due = if e.is_panic() {
                    tracing::error!(delivery_id = %id, "delivery worker panicked; message requeued without counting an attempt");
                    now + SELF_FAILURE_DELAY.as_millis() as u64
                } else {
                    now
                };
                // Cut off while its result waited to be written: let that write land first,
                // so the release below finds the message no longer in flight and leaves it.
                d.results.flush().await;
                d.requeue(&id, due).await;
            }
            let mut registry = d.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            registry.remove(&id);
            if registry.is_empty() {
                d.idle.notify_waiters();
                // A burst is over: give its freed heap back (see `trim`).
                if d.trimmer.due(d.clock.now_ms()) {
                    drop(registry);
                    d.runtime.spawn_blocking(crate::sys::trim::trim);
                }
            }
        });
    }

    /// Attempts running now.
    pub fn in_flight_count(&self) -> usize {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Waits up to `grace` for running attempts to finish, then cuts off the rest (their
    /// messages go back to the queue with no attempt counted). Returns how many were cut.
    pub async fn drain(&self, grace: Duration) -> usize {
        let waited = tokio::time::timeout(grace, self.wait_idle()).await;
        if waited.is_ok() {
            return 0;
        }
        let handles: Vec<AbortHandle> = self
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
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

    /// Pauses or resumes an endpoint, persisting the change; a resume puts its parked
    /// messages back in the queue at once and wakes the scheduler. A resume of an ordered
    /// endpoint blocked behind a dead head lets the next message go.
    pub fn set_paused(&self, endpoint: &str, paused: bool) -> Result<(), crate::store::StoreError> {
        let _gate = self.pause_gate.lock().unwrap_or_else(|p| p.into_inner());
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
        self.endpoints.set_paused(endpoint, paused, now);
        self.persist_endpoint(endpoint, true)?;
        if paused {
            tracing::info!(endpoint = %crate::redact::url_for_log(endpoint), "endpoint paused");
        } else {
            // A resume can release a whole outage's backlog: that is delivery's work, so it
            // runs on delivery's threads, at delivery's priority (see `priority`), not on the
            // admin request's.
            let (store, key) = (self.store.clone(), endpoint.to_string());
            let n = self.on_delivery_threads(move || store.unpark_endpoint(&key, now))?;
            tracing::info!(endpoint = %crate::redact::url_for_log(endpoint), released = n, "endpoint resumed");
            self.wake.notify_one();
        }
        Ok(())
    }
}

impl Deliverer {
    /// Runs a blocking store call on delivery's runtime's blocking threads and waits for
    /// it (from a blocking thread).
    fn on_delivery_threads<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, crate::store::StoreError> + Send + 'static,
    ) -> Result<T, crate::store::StoreError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.runtime.spawn_blocking(move || {
            let _ = tx.send(f());
        });
        rx.recv().unwrap_or(Err(crate::store::StoreError::Closed))
    }

    /// Parks the due entries of paused endpoints. Under the pause gate, each entry's
    /// endpoint is checked again: an entry whose endpoint was resumed since the scheduler
    /// looked stays in the queue for the next pass. Returns (parked, the due time of the
    /// earliest entry left in the queue).
    pub fn park_paused(
        &self,
        entries: Vec<crate::store::DueEntry>,
    ) -> Result<(usize, Option<u64>), crate::store::StoreError> {
        let _gate = self.pause_gate.lock().unwrap_or_else(|p| p.into_inner());
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
    pub fn persist_endpoint(&self, endpoint: &str, synced: bool) -> Result<(), crate::store::StoreError> {
        let _order = self.persist_lock.lock().unwrap_or_else(|p| p.into_inner());
        // Held until written (see `EndpointTable::saved`), so it is still here.
        let Some((rec, changes)) = self.endpoints.loaded_record(endpoint) else {
            return Ok(());
        };
        let now = self.clock.now_ms();
        if synced {
            self.store.put_endpoint_synced(endpoint, &rec, now)?;
        } else {
            self.store.put_endpoint(endpoint, &rec, now)?;
        }
        self.endpoints.saved(endpoint, changes);
        Ok(())
    }

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

    /// Bounds per-endpoint state by the retention window: endpoints not seen within it (and
    /// not paused) are forgotten in memory, records not written within it (and not paused)
    /// are deleted from the store, and zero per-endpoint counters are removed. A blocking
    /// call, run after each retention sweep. Returns (forgotten in memory, deleted).
    pub fn expire_endpoints(&self) -> Result<(usize, usize), crate::store::StoreError> {
        let now = self.clock.now_ms();
        let forgotten = self.endpoints.expire(now);
        let before = now.saturating_sub(self.endpoints.listed_for_ms());
        let (mut deleted, mut from) = (0, None);
        loop {
            // No endpoint write may land between a record's read and its delete; a chunk at
            // a time, so the result writer's endpoint writes wait for one chunk at most.
            let _order = self.persist_lock.lock().unwrap_or_else(|p| p.into_inner());
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

    /// Marks an accepted message ordered when its endpoint is configured `fifo` (that wins
    /// over the route's ordering, which ingress set).
    fn order(&self, rec: &mut crate::store::MessageRecord) {
        if let Some(on_dead) = self.settings.load().fifo.get(&rec.endpoint) {
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
