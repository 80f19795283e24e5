//! What a reload changes, as one value ([`Settings`], swapped whole): an attempt or an
//! accept reads one and so never mixes the secrets of one config with the policy of another.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::Config;
use crate::policy::PolicyBook;

/// The settings a reload replaces, as one value.
#[derive(Debug)]
pub struct Settings {
    /// The config (signing secrets and keys, routes, alert URL... are read here).
    pub config: Arc<Config>,
    /// Every section's retry policy: the give-up limits are read from it at accept, the
    /// rest at each attempt.
    pub policies: PolicyBook,
    /// `[[endpoint]]` keys with `ordering = "fifo"`, and what their dead heads do: looked up
    /// once per accept (a route's ordering comes with the message from ingress).
    pub fifo: HashMap<String, crate::model::OnDead>,
    /// Which targets ingress refuses without DNS (the transport applies its own copy).
    pub egress: crate::outbound::egress::EgressPolicy,
}

impl Settings {
    /// The settings of `config`.
    pub fn new(config: Arc<Config>) -> Settings {
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

/// `[[endpoint]] rate_per_second` overrides.
pub(crate) fn endpoint_rates(config: &Config) -> HashMap<String, u32> {
    config
        .endpoints
        .iter()
        .filter_map(|e| Some((e.key.clone(), e.rate_per_second?)))
        .collect()
}
