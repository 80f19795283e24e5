//! The flags every command shares (`--config`, `--listen`, ...) and the config they load:
//! used by `serve` and by the operator commands alike, so it sits below both.

use std::path::PathBuf;

use clap::Args;

use crate::config::{Config, ConfigError, Overrides};

/// Flags that override the config file and environment.
#[derive(Debug, Args, Clone, Default)]
pub struct GlobalArgs {
    /// TOML config file (also COURIER_CONFIG).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Ingress address, ip:port or unix:/path (also COURIER_LISTEN; the socket mode is listen_mode).
    #[arg(long, global = true, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Admin address, ip:port (also COURIER_ADMIN_LISTEN).
    #[arg(long, global = true, value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// Read-only probes and metrics address, ip:port (also COURIER_OPS_LISTEN; off by default).
    #[arg(long, global = true, value_name = "ADDR")]
    pub ops_listen: Option<String>,
    /// Data directory (also COURIER_DATA_DIR).
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

impl GlobalArgs {
    fn overrides(&self) -> Overrides {
        Overrides {
            config: self.config.clone(),
            listen: self.listen.clone(),
            admin_listen: self.admin_listen.clone(),
            ops_listen: self.ops_listen.clone(),
            data_dir: self.data_dir.clone(),
        }
    }
}

/// Loads the layered config for these flags and the process environment.
pub fn load_config(global: &GlobalArgs) -> Result<Config, ConfigError> {
    Config::load(&global.overrides(), &|name| std::env::var(name).ok())
}

/// [`load_config`], then builds the TLS material from it: every PEM file is read and
/// checked, so a bad one is refused here (one line naming the key and the file) rather than
/// at the first delivery. For the commands that deliver or check; the operator commands only
/// need the admin address.
pub fn load_checked(global: &GlobalArgs) -> Result<Config, ConfigError> {
    let config = load_config(global)?;
    crate::tls::TlsMaterial::from_config(&config)?;
    Ok(config)
}
