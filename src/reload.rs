//! Live reload: `SIGHUP`, or `POST /reload` on the admin API (`courier reload`), reads the
//! config again from the same layers as at start (the file, the environment, the flags) and
//! applies what can change while courier runs.
//!
//! - **Applied at once:** signing secrets and keys (so a rotation needs no restart), routes,
//!   `[[host]]` and `[[endpoint]]` overrides (caps, rates, ordering, retry policy), `[retry]`,
//!   `delivery.max_in_flight_per_host`, `delivery.rate_per_second`,
//!   `delivery.request_timeout`, the egress allow list, TLS material (`[tls]`, the PEM
//!   files of `[[host]]`, read again), `ingress_token`,
//!   `admin_token`, `max_body` and `alert_url`. An attempt or accept reads one settings value
//!   from start to end, so it never mixes the old config with the new one. What outlives
//!   one decision watches [`crate::context::Context::reloads`]: an open `CONNECT` tunnel is
//!   checked again, and closed when the new token or egress policy revokes it.
//! - **Only at restart** ([`RESTART_ONLY`]): the listeners and the data dir (their sockets and
//!   the store are open), and the settings the running components were sized with at start.
//!   A reload that changes one of them still applies the rest, keeps the running value, and
//!   says which on one `warn` line and in the answer of `POST /reload`.
//! - **Refused:** a new config that does not load (a syntax error, a bad value, an unreadable
//!   PEM file) changes nothing: one `error` line says why, and the running config is kept.

use std::sync::{Arc, Mutex};

use crate::config::{Config, ConfigError, SigningKey};
use crate::delivery::Deliverer;

/// Reads the config again from the layers courier started with.
pub type ConfigSource = Box<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

/// Declares the restart-only settings once, by their path in [`Config`]: the list
/// ([`RESTART_ONLY`]) and the copying ([`keep_restart_only`]) both come from it.
macro_rules! restart_only {
    ($($($field:ident).+),* $(,)?) => {
        /// The settings a reload does not change, by their config key.
        pub const RESTART_ONLY: &[&str] = &[$(stringify!($($field).+)),*];

        /// Copies every [`RESTART_ONLY`] setting of `running` into `new`; returns the keys
        /// whose value `loaded` (the config as last read, before start adjusted it) and `new`
        /// disagree on.
        pub fn keep_restart_only(loaded: &Config, running: &Config, new: &mut Config) -> Vec<&'static str> {
            let mut changed = Vec::new();
            $(
                if loaded.$($field).+ != new.$($field).+ {
                    changed.push(stringify!($($field).+));
                }
                new.$($field).+ = running.$($field).+.clone();
            )*
            changed
        }
    };
}

restart_only!(
    listen,
    listen_mode,
    admin_listen,
    ops_listen,
    data_dir,
    retention,
    dead_retention,
    shutdown_grace,
    allow_unauthenticated_network,
    ingress,
    admin,
    log,
    circuit,
    delivery.connect_timeout,
    delivery.max_in_flight,
    delivery.max_response_body,
    delivery.idle_connection_timeout,
    delivery.max_idle_connections,
    delivery.pause_after_permanent_failures,
    egress.proxy,
    egress.no_proxy,
    fleet,
    intercept,
    store,
);

/// The config a reload applies: `fresh` (as read) with the running value of every
/// restart-only setting, and the keys the file changed of those. The result is checked again
/// as a whole: a file that passed on its own may not with the running listeners (a token
/// removed while the listener it guards still faces the network, because the file's new
/// loopback address applies only at restart).
pub fn merge(loaded: &Config, running: &Config, fresh: Config) -> Result<(Config, Vec<&'static str>), ConfigError> {
    let mut new = fresh;
    let changed = keep_restart_only(loaded, running, &mut new);
    new.validate()?;
    Ok((new, changed))
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// courier was started without a config source (an in-process test).
    #[error("reload is not available: courier was started without a config source")]
    Unavailable,
    /// The new config does not load.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// A component refused the new config (e.g. TLS material that does not load).
    #[error("{0}")]
    Refused(String),
}

impl ReloadError {
    /// A machine-readable code for the admin API.
    pub fn code(&self) -> &'static str {
        match self {
            ReloadError::Unavailable => "reload_unavailable",
            ReloadError::Config(_) | ReloadError::Refused(_) => "invalid_config",
        }
    }
}

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// Settings that changed in the file but take effect only at restart.
    pub restart_required: Vec<&'static str>,
    /// `[signing.keys]` entries the reload removed or bound to other targets: messages
    /// already accepted with such a key cannot be signed (they wait, retried every few
    /// seconds, until the key is back or they are deleted).
    pub signing_keys_dropped: Vec<String>,
}

/// The `[signing.keys]` names of `old` that `new` lacks or binds to other targets.
pub fn signing_keys_dropped(old: &Config, new: &Config) -> Vec<String> {
    let kept = |name: &String, key: &SigningKey| new.signing.keys.get(name).is_some_and(|k| k.targets == key.targets);
    let dropped = old.signing.keys.iter().filter(|(name, key)| !kept(name, key));
    dropped.map(|(name, _)| name.clone()).collect()
}

/// Re-reads and applies the config; one reload at a time.
pub struct Reloader {
    source: Option<ConfigSource>,
    deliverer: Arc<Deliverer>,
    /// The config as last read (before start fitted it to the descriptor limit), to tell
    /// which restart-only settings the file changed.
    loaded: Mutex<Config>,
}

impl Reloader {
    /// A reloader over `source`, for the running `deliverer` started from `loaded`.
    pub fn new(source: Option<ConfigSource>, deliverer: Arc<Deliverer>, loaded: Config) -> Self {
        Reloader {
            source,
            deliverer,
            loaded: Mutex::new(loaded),
        }
    }

    /// Reads the config again and applies it, logging the outcome (one line). Blocking: it
    /// reads files; call it off the async workers.
    pub fn reload(&self) -> Result<Reloaded, ReloadError> {
        let result = self.try_reload();
        match &result {
            Ok(r) if r.restart_required.is_empty() => tracing::info!("config reloaded"),
            Ok(r) => tracing::warn!(
                restart_required = %r.restart_required.join(","),
                "config reloaded; these settings changed but take effect only at restart"
            ),
            Err(e) => tracing::error!(error = %e, "config reload refused; the running config is kept"),
        }
        if let Ok(r) = &result {
            if !r.signing_keys_dropped.is_empty() {
                tracing::warn!(
                    keys = %r.signing_keys_dropped.join(","),
                    "signing keys removed or bound to other targets: messages accepted with them wait until the key is back (or are deleted)"
                );
            }
        }
        result
    }

    fn try_reload(&self) -> Result<Reloaded, ReloadError> {
        let source = self.source.as_ref().ok_or(ReloadError::Unavailable)?;
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = source()?;
        let running = self.deliverer.context().config();
        let (new, restart_required) = merge(&loaded, &running, fresh.clone())?;
        let signing_keys_dropped = signing_keys_dropped(&running, &new);
        self.deliverer
            .reconfigure(Arc::new(new))
            .map_err(ReloadError::Refused)?;
        *loaded = fresh;
        Ok(Reloaded {
            restart_required,
            signing_keys_dropped,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(text: &str) -> Config {
        Config::from_toml_str(text, "t").unwrap()
    }

    #[test]
    fn restart_only_settings_keep_their_running_value_and_are_named() {
        let loaded = with("max_body = \"1MB\"\n[delivery]\nmax_in_flight = 100\n");
        // Start lowered max_in_flight to fit the descriptor limit.
        let mut running = loaded.clone();
        running.delivery.max_in_flight = 50;
        let mut new = with(
            "max_body = \"2MB\"\nretention = \"1d\"\n[delivery]\nmax_in_flight = 100\nmax_in_flight_per_host = 3\n",
        );
        let changed = keep_restart_only(&loaded, &running, &mut new);
        assert_eq!(changed, vec!["retention"]);
        assert_eq!(new.retention, running.retention, "kept");
        assert_eq!(
            new.delivery.max_in_flight, 50,
            "the running (fitted) value, not reported"
        );
        assert_eq!(new.max_body, 2_000_000, "reloadable: taken");
        assert_eq!(new.delivery.max_in_flight_per_host, 3, "reloadable: taken");
    }

    #[test]
    fn a_token_cannot_be_removed_from_a_listener_that_still_faces_the_network() {
        let running = with("admin_listen = \"0.0.0.0:8788\"\nadmin_token = \"t0ken\"\n");
        running.validate().unwrap();
        // Ready for the next start: loopback, no token. Valid alone; not with 0.0.0.0 kept.
        let fresh = with("admin_listen = \"127.0.0.1:8788\"\n");
        fresh.validate().unwrap();
        let refused = merge(&running, &running, fresh).unwrap_err();
        assert!(refused.to_string().contains("admin_token"), "{refused}");
        // Rotating the token is fine.
        let rotated = with("admin_listen = \"0.0.0.0:8788\"\nadmin_token = \"n3w\"\n");
        let (new, changed) = merge(&running, &running, rotated).unwrap();
        assert_eq!(new.admin_token.unwrap().expose(), "n3w");
        assert!(changed.is_empty());
    }

    #[test]
    fn removed_and_rebound_signing_keys_are_named() {
        let old = with(
            "[signing.keys]\na = [\"whsec_MDEyMzQ1Njc4OWFiY2RlZg==\"]\nb = [\"whsec_MDEyMzQ1Njc4OWFiY2RlZg==\"]\n\
             c = { secrets = [\"whsec_MDEyMzQ1Njc4OWFiY2RlZg==\"], targets = [\"https://a.example/*\"] }\n",
        );
        let new = with(
            "[signing.keys]\nb = [\"whsec_ZmVkY2JhOTg3NjU0MzIxMA==\"]\n\
             c = { secrets = [\"whsec_MDEyMzQ1Njc4OWFiY2RlZg==\"], targets = [\"https://b.example/*\"] }\n",
        );
        // a removed, c rebound; b only rotated its secret (signs on).
        assert_eq!(signing_keys_dropped(&old, &new), vec!["a", "c"]);
        assert!(signing_keys_dropped(&old, &old).is_empty());
    }

    #[test]
    fn every_restart_only_key_is_compared() {
        let loaded = Config::default();
        let mut new = with(
            "listen = \"127.0.0.1:1\"\nlisten_mode = \"0600\"\nadmin_listen = \"127.0.0.1:2\"\n\
             ops_listen = \"127.0.0.1:3\"\ndata_dir = \"/x\"\nretention = \"1d\"\ndead_retention = \"1d\"\n\
             shutdown_grace = \"1s\"\nallow_unauthenticated_network = true\n\
             [ingress]\nhosts = [\"a.example\"]\n[admin]\nhosts = [\"b.example\"]\n[log]\nformat = \"json\"\n\
             [circuit]\nfailures = 2\n\
             [delivery]\nconnect_timeout = \"1s\"\nmax_in_flight = 1\nmax_response_body = \"1KB\"\n\
             idle_connection_timeout = \"1s\"\nmax_idle_connections = 1\npause_after_permanent_failures = 1\n\
             [egress]\nproxy = \"http://127.0.0.1:3128\"\nno_proxy = [\"a.example\"]\n\
             [fleet]\nredis_url = \"redis://127.0.0.1:6379\"\n[intercept]\nhosts = [\"h.example\"]\n\
             [store]\nencryption_key_files = [\"/k\"]\n",
        );
        let changed = keep_restart_only(&loaded, &loaded, &mut new);
        assert_eq!(changed, RESTART_ONLY, "each key, in order");
        assert_eq!(new, loaded, "every one kept");
    }
}
