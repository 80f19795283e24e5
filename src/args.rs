//! The flags every command shares (`--config`, `--listen`, ...), the config they load, and
//! the log subscriber: used by `serve`, the operator commands and `drain` alike, so it sits
//! below all of them.

use crate::config::{Config, ConfigError, LogFormat, Overrides};

/// Flags that override the config file and environment: the config's [`Overrides`].
pub type GlobalArgs = Overrides;

/// Loads the layered config for these flags and the process environment.
pub fn load_config(global: &GlobalArgs) -> Result<Config, ConfigError> {
    Config::load(global, &|name| std::env::var(name).ok())
}

/// The store's options from the config: how long finished messages are kept, and the
/// keys payloads are sealed with (the key files read again: a bad one is one line).
pub fn store_options(config: &Config) -> Result<crate::store::StoreOptions, ConfigError> {
    Ok(crate::store::StoreOptions {
        retention_ms: config.retention.as_millis() as u64,
        dead_retention_ms: config.dead_retention.as_millis() as u64,
        keyring: config.store.keyring()?.0,
        ..Default::default()
    })
}

/// Installs the stderr subscriber in the configured line format, writing `default_filter`
/// (`info` for `serve`) and above. `COURIER_LOG` (then `RUST_LOG`) sets the filter in either
/// format, so switching to JSON never changes which lines are written.
pub fn init_logging(format: LogFormat, default_filter: &str) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("COURIER_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .with_target(false)
            .try_init(),
        // The documented JSON shape: timestamp, level, target, message and the event's
        // fields all at the top level (flattened), one object a line, no span lists (their
        // fields would duplicate the event's and their shape is not part of the contract).
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_target(true)
            .try_init(),
    };
}
