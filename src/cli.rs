//! The command line: `courier [serve]`, `courier check-config`, the operator commands
//! (`deliveries`, `endpoints`) that talk to a running courier's admin API, `drain`, which
//! hands a courier's open messages to another courier, and `keys`, which makes Ed25519
//! signing keys offline.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::config::{Config, LogFormat, Overrides};

/// courier: durable webhook delivery sidecar.
#[derive(Debug, Parser)]
#[command(name = "courier", version, about, long_about = None)]
pub struct Cli {
    /// Settings shared by every command.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// What to do (default: serve).
    #[command(subcommand)]
    pub command: Option<Command>,
}

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

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run courier (the default).
    Serve,
    /// Validate the configuration and print a summary, without serving.
    CheckConfig,
    /// Inspect and replay deliveries through the admin API.
    #[command(subcommand)]
    Deliveries(crate::operator::DeliveriesCommand),
    /// Inspect, pause and resume endpoints through the admin API.
    #[command(subcommand)]
    Endpoints(crate::operator::EndpointsCommand),
    /// Inspect hosts: circuit breakers, attempts in flight, caps.
    #[command(subcommand)]
    Hosts(crate::operator::HostsCommand),
    /// Create Ed25519 signing keys (whsk_) and print their public keys (whpk_).
    #[command(subcommand)]
    Keys(crate::keys::KeysCommand),
    /// Hand every open message of this courier's data dir to another courier's ingress
    /// (the data dir's courier drains itself when it is running).
    Drain(crate::drain::DrainArgs),
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
pub fn load_config(global: &GlobalArgs) -> Result<Config, crate::config::ConfigError> {
    Config::load(&global.overrides(), &|name| std::env::var(name).ok())
}

/// Installs the stderr subscriber in the configured line format, writing `default_filter`
/// (`info` for `serve`) and above. `COURIER_LOG` (then `RUST_LOG`) sets the filter in either
/// format, so switching to JSON never changes which lines are written.
pub(crate) fn init_logging(format: LogFormat, default_filter: &str) {
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

/// Parses the command line and runs the command; returns the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        None | Some(Command::Serve) => serve(&cli.global),
        Some(Command::CheckConfig) => match load_config(&cli.global) {
            Ok(cfg) => {
                println!("config ok\n{}", cfg.summary());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("courier: {e}");
                ExitCode::from(2)
            }
        },
        Some(Command::Deliveries(cmd)) => {
            crate::operator::run(&cli.global, crate::operator::Operation::Deliveries(cmd))
        }
        Some(Command::Endpoints(cmd)) => crate::operator::run(&cli.global, crate::operator::Operation::Endpoints(cmd)),
        Some(Command::Hosts(cmd)) => crate::operator::run(&cli.global, crate::operator::Operation::Hosts(cmd)),
        Some(Command::Keys(cmd)) => crate::keys::run(cmd),
        Some(Command::Drain(args)) => crate::drain::verb::run(&cli.global, args),
    }
}

fn serve(global: &GlobalArgs) -> ExitCode {
    let config = match load_config(global) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("courier: {e}");
            return ExitCode::from(2);
        }
    };
    let format = config.log.format;
    init_logging(format, "info");
    // The main runtime serves ingress (and admin): below delivery's priority, which runs
    // on a runtime of its own (see `priority`).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(crate::priority::lower_current_thread)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            fatal(format, &format!("cannot start the runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(crate::app::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            fatal(format, &e.to_string());
            ExitCode::FAILURE
        }
    }
}

/// Reports why `serve` stops. With JSON lines it is one more object (a pipeline that
/// parses every line must not choke on the one that matters most); as text it stays the
/// plain `courier: …` line people and scripts already grep for.
fn fatal(format: LogFormat, message: &str) {
    match format {
        LogFormat::Text => eprintln!("courier: {message}"),
        LogFormat::Json => tracing::error!(error = message, "exiting"),
    }
}
