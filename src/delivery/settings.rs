//! How a reload is applied ([`Deliverer::reconfigure`]): the transport first, which may
//! refuse the new config; then the per-endpoint rates and caps and the per-host caps,
//! resized in place so that attempts in flight stay counted.

use std::collections::HashMap;
use std::sync::Arc;

use super::Deliverer;
use crate::config::Config;
use crate::context::settings::Settings;

impl Deliverer {
    /// Applies a reloaded config: the transport's material first (TLS files, egress
    /// policy), which may refuse it; then the policies, the per-endpoint rates and caps and
    /// the per-host caps. Attempts already running finish under the settings they started
    /// with; a cap lowered below what is in flight takes effect as those attempts end.
    pub fn reconfigure(&self, config: Arc<Config>) -> Result<(), String> {
        self.transport.reconfigure(&config)?;
        let settings = Settings::new(config.clone());
        // The breaker's probe timeout follows the longest request_timeout, which a reload
        // may raise: a probe still running within it must not be taken for lost.
        self.hosts.set_caps(
            config.delivery.max_in_flight_per_host,
            host_caps(&config),
            config.circuit.settings(settings.policies.longest_request_timeout()),
        );
        self.ctx.set_settings(settings);
        // A raised cap or rate may let waiting messages go now.
        self.ctx.wake();
        Ok(())
    }
}

/// `[[host]] max_in_flight` overrides.
pub(super) fn host_caps(config: &Config) -> HashMap<String, u32> {
    config
        .hosts
        .iter()
        .filter_map(|h| Some((h.host.clone(), h.max_in_flight?)))
        .collect()
}
