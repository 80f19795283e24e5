//! What a reload changes in delivery ([`Settings`], swapped whole) and how it is applied
//! ([`Deliverer::reconfigure`]): the transport first, which may refuse the new config; then
//! the per-endpoint rates and caps and the per-host caps, resized in place so that attempts
//! in flight stay counted.

use std::collections::HashMap;
use std::sync::Arc;

use super::Deliverer;
use crate::config::Config;
use crate::policy::PolicyBook;

/// The settings a reload replaces, as one value: an attempt reads one [`Settings`] and so
/// never mixes the secrets of one config with the policy of another.
#[derive(Debug)]
pub struct Settings {
    /// The config (signing secrets and keys, routes, alert URL... are read here).
    pub config: Arc<Config>,
    /// Every section's retry policy: the give-up limits are read from it at accept, the
    /// rest at each attempt.
    pub policies: PolicyBook,
    /// `[[endpoint]]` keys with `ordering = "fifo"`, and what their dead heads do: looked up
    /// once per accept (a route's ordering comes with the message from ingress).
    pub(super) fifo: HashMap<String, crate::model::OnDead>,
    /// Which targets ingress refuses without DNS (the transport applies its own copy).
    pub egress: crate::outbound::egress::EgressPolicy,
}

impl Settings {
    pub(super) fn new(config: Arc<Config>) -> Settings {
        let fifo = config
            .endpoints
            .iter()
            .filter_map(|e| Some((e.key.clone(), e.fifo?)))
            .collect();
        Settings {
            egress: crate::outbound::egress::EgressPolicy::new(
                config.egress.allow_private_targets,
                config.egress.allow.clone(),
            ),
            policies: config.policy_book(),
            config,
            fifo,
        }
    }
}

impl Deliverer {
    /// The settings now: hold the returned value for as long as one decision needs them
    /// consistent (an attempt, an accept).
    pub fn settings(&self) -> Arc<Settings> {
        self.settings.load_full()
    }

    /// The config now (a shorthand of [`Deliverer::settings`]).
    pub fn config(&self) -> Arc<Config> {
        self.settings.load().config.clone()
    }

    /// Applies a reloaded config: the transport's material first (TLS files, egress
    /// policy), which may refuse it; then the policies, the per-endpoint rates and caps and
    /// the per-host caps. Attempts already running finish under the settings they started
    /// with; a cap lowered below what is in flight takes effect as those attempts end.
    pub fn reconfigure(&self, config: Arc<Config>) -> Result<(), String> {
        self.transport.reconfigure(&config)?;
        let settings = Settings::new(config.clone());
        self.endpoints.set_rates(
            config.delivery.rate_per_second,
            endpoint_rates(&config),
            self.clock.now_ms(),
        );
        // The breaker's probe timeout follows the longest request_timeout, which a reload
        // may raise: a probe still running within it must not be taken for lost.
        self.hosts.set_caps(
            config.delivery.max_in_flight_per_host,
            host_caps(&config),
            config.circuit.settings(settings.policies.longest_request_timeout()),
        );
        self.endpoint_caps.set(settings.policies.endpoint_caps());
        self.settings.store(Arc::new(settings));
        // A raised cap or rate may let waiting messages go now.
        self.wake.notify_one();
        Ok(())
    }
}

/// `[[endpoint]] rate_per_second` overrides.
pub(super) fn endpoint_rates(config: &Config) -> HashMap<String, u32> {
    config
        .endpoints
        .iter()
        .filter_map(|e| Some((e.key.clone(), e.rate_per_second?)))
        .collect()
}

/// `[[host]] max_in_flight` overrides.
pub(super) fn host_caps(config: &Config) -> HashMap<String, u32> {
    config
        .hosts
        .iter()
        .filter_map(|h| Some((h.host.clone(), h.max_in_flight?)))
        .collect()
}
