//! What the components share: the store, the clock, the metrics, the reloadable settings,
//! the per-endpoint state and the scheduler's wake-up ([`Context`]). Ingress, admin, ops,
//! endpoint pages, drain and delivery each take this, not each other: delivery keeps only
//! its attempt machinery (permits, the in-flight registry, the store writer).
//!
//! Endpoint state changes (pause, resume, park, persist, expire) live here too, because
//! admin, the scheduler and the store writer all make them and must serialise on the
//! same two locks (see `pause`).

pub mod endpoints;
mod pause;
pub mod settings;

use std::sync::{Arc, Mutex};

use crate::clock::SharedClock;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::store::{Store, StoreError};
use crate::sys::wake::Wake;
use endpoints::EndpointTable;
use settings::{endpoint_rates, Settings};

/// The shared context (see the module doc).
pub struct Context {
    store: Arc<Store>,
    clock: SharedClock,
    metrics: Arc<Metrics>,
    wake: Arc<Wake>,
    /// What a reload may change, swapped whole: read at each attempt and accept.
    settings: arc_swap::ArcSwap<Settings>,
    /// Counts the settings put in place by reloads: what lives longer than one decision (an
    /// open tunnel) watches it to check itself against the new settings.
    reloads: tokio::sync::watch::Sender<u64>,
    endpoints: EndpointTable,
    /// Held by a pause or resume across its whole change, and by the scheduler from its
    /// last look at the pause flag to its park write: a resume can then never land between
    /// the scheduler's decision to park and the park, which would strand messages in the
    /// parked set of an active endpoint.
    pause_gate: Mutex<()>,
    /// Serialises endpoint-state writes, each of which writes the state current when it
    /// runs: the last write is always the latest state, whatever order the changes'
    /// writers reached the store in.
    persist_lock: Mutex<()>,
    /// Delivery's runtime: a resume's backlog is delivery's work and runs on its threads.
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl Context {
    /// The context over `store`; loads the persisted paused endpoints. `runtime` is
    /// delivery's (see `sys::delivery_runtime`).
    pub fn new(
        store: Arc<Store>,
        clock: SharedClock,
        config: Arc<Config>,
        metrics: Arc<Metrics>,
        wake: Arc<Wake>,
        runtime: tokio::runtime::Handle,
    ) -> Result<Arc<Context>, StoreError> {
        // A wall clock stepped back before a restart does not set courier's time behind
        // what it already stored.
        clock.hold_at_least(store.ids().newest_ms());
        let now = clock.now_ms();
        let endpoints = EndpointTable::new(
            config.delivery.rate_per_second,
            endpoint_rates(&config),
            config.delivery.pause_after_permanent_failures,
            // Listed as long as the messages delivered to them are kept.
            config.retention.as_millis() as u64,
            store.paused_endpoints()?,
            now,
        );
        let settings = Settings::new(config);
        endpoints.set_caps(settings.policies.endpoint_caps());
        Ok(Arc::new(Context {
            store,
            clock,
            metrics,
            wake,
            settings: arc_swap::ArcSwap::from_pointee(settings),
            reloads: tokio::sync::watch::Sender::new(0),
            endpoints,
            pause_gate: Mutex::new(()),
            persist_lock: Mutex::new(()),
            runtime,
        }))
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The clock.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// The counters.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Wakes the scheduler (new work, a freed permit, a resumed endpoint).
    pub fn wake(&self) {
        self.wake.ring();
    }

    /// The scheduler's wake-up itself, to wait on.
    pub fn wake_signal(&self) -> &Wake {
        &self.wake
    }

    /// Per-endpoint state.
    pub fn endpoints(&self) -> &EndpointTable {
        &self.endpoints
    }

    /// The settings now: hold the returned value for as long as one decision needs them
    /// consistent (an attempt, an accept).
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.load_full()
    }

    /// The config now (a shorthand of [`Context::settings`]).
    pub fn config(&self) -> Arc<Config> {
        self.settings.load().config.clone()
    }

    /// Puts reloaded settings in place, with the endpoints' rates and caps (delivery's
    /// `reconfigure` resizes its host limits first).
    pub(crate) fn set_settings(&self, settings: Settings) {
        self.endpoints.set_rates(
            settings.config.delivery.rate_per_second,
            endpoint_rates(&settings.config),
            self.clock.now_ms(),
        );
        self.endpoints.set_caps(settings.policies.endpoint_caps());
        self.settings.store(Arc::new(settings));
        // After the store: a watcher woken by this reads the new settings.
        self.reloads.send_modify(|n| *n += 1);
    }

    /// Changes once per reload applied (after its settings are in place). Subscribe before
    /// reading the settings a long-lived decision rests on, so no reload falls between.
    pub fn reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    /// The pause gate (see the field), held while the guard lives.
    pub(crate) fn pause_gate(&self) -> std::sync::MutexGuard<'_, ()> {
        self.pause_gate.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The persist lock (see the field), held while the guard lives.
    pub(crate) fn persist_order(&self) -> std::sync::MutexGuard<'_, ()> {
        self.persist_lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the pause gate is free now (tests race a resume against a batch with it).
    #[cfg(test)]
    pub(crate) fn pause_gate_is_free(&self) -> bool {
        self.pause_gate.try_lock().is_ok()
    }

    /// Delivery's runtime.
    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }
}
