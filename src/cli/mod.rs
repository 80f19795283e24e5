//! The command line: `courier [serve]`, `courier check-config`, the operator commands
//! (`deliveries`, `endpoints`) that talk to a running courier's admin API, `drain`, which
//! hands a courier's open messages to another courier, `keys`, which makes Ed25519
//! signing keys offline (and store keys), `store rekey`, which moves stored payloads to
//! another store key, `store check`, which audits a stopped courier's store, and
//! `intercept ca`, which prints the interception CA.

pub mod intercept;
pub mod keys;
pub mod store;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::args::{load_config, GlobalArgs};
use crate::config::{Config, ConfigError, LogFormat, StoreConfig};

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
    /// Make the running courier read its config again (as SIGHUP does), through the admin
    /// API; prints what changed only at restart.
    Reload,
    /// Create Ed25519 signing keys (whsk_) and print their public keys (whpk_).
    #[command(subcommand)]
    Keys(crate::cli::keys::KeysCommand),
    /// The store, courier stopped: move every payload to the first store key (`rekey`), or
    /// check its consistency (`check`).
    #[command(subcommand)]
    Store(crate::cli::store::StoreCommand),
    /// The HTTPS interception CA (`[intercept]`).
    #[command(subcommand)]
    Intercept(crate::cli::intercept::InterceptCommand),
    /// Hand every open message of this courier's data dir to another courier's ingress
    /// (the data dir's courier drains itself when it is running).
    Drain(crate::drain::DrainArgs),
}

/// Parses the command line and runs the command; returns the process exit code.
pub fn main() -> ExitCode {
    use crate::operator::Operation;
    let cli = Cli::parse();
    let op = match cli.command {
        None | Some(Command::Serve) => return serve(&cli.global),
        Some(Command::CheckConfig) => return check_config(&cli.global),
        Some(Command::Keys(cmd)) => return keys::run(cmd),
        Some(Command::Intercept(cmd)) => return intercept::run(&cli.global, cmd),
        Some(Command::Store(cmd)) => return store::run(&cli.global, cmd),
        Some(Command::Drain(args)) => return crate::drain::run(&cli.global, args),
        Some(Command::Deliveries(cmd)) => Operation::Deliveries(cmd),
        Some(Command::Endpoints(cmd)) => Operation::Endpoints(cmd),
        Some(Command::Hosts(cmd)) => Operation::Hosts(cmd),
        Some(Command::Reload) => Operation::Reload,
    };
    crate::operator::run(&cli.global, op)
}

/// `check-config`: the summary, the store keys' ids, and whether the data dir's sealed
/// payloads open with them (read without taking the data dir from a running courier), so
/// a key rotation is checked before the restart that would refuse it.
fn check_config(global: &GlobalArgs) -> ExitCode {
    let cfg = match load_checked(global).and_then(|cfg| cfg.store.keyring().map(|keys| (cfg, keys))) {
        Ok(loaded) => loaded,
        Err(e) => return bad_config(e),
    };
    let (cfg, (ring, named)) = cfg;
    let in_data = match crate::store::keys_in_data_dir(&cfg.data_dir) {
        Ok(in_data) => in_data,
        Err(e) => {
            eprintln!("courier: reading the data dir's store keys: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = in_data
        .as_deref()
        .map_or(Ok(()), |ids| crate::store::check_keys(ids, &ring))
    {
        eprintln!("courier: {e}");
        return ExitCode::from(2);
    }
    println!("config ok\n{}", cfg.summary());
    if let Some(line) = StoreConfig::keys_line(&named) {
        println!("{line}");
    }
    if let Some(ids) = in_data {
        let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
        let ids = if ids.is_empty() {
            "none".to_string()
        } else {
            ids.join(", ")
        };
        println!(
            "store data: {} holds payloads sealed with: {ids}",
            cfg.data_dir.display()
        );
    }
    ExitCode::SUCCESS
}

/// Settings that do not load or do not check: one line, exit code 2.
fn bad_config(e: crate::config::ConfigError) -> ExitCode {
    eprintln!("courier: {e}");
    ExitCode::from(2)
}

fn serve(global: &GlobalArgs) -> ExitCode {
    let config = match load_checked(global) {
        Ok(c) => c,
        Err(e) => return bad_config(e),
    };
    let format = config.log.format;
    crate::args::init_logging(format, "info");
    // The main runtime serves ingress (and admin); delivery runs on a runtime of its own
    // (see `delivery_runtime`), and ingest is slowed when delivery is short of CPU (see `pace`).
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            fatal(format, &format!("cannot start the runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let global = global.clone();
    let source: crate::reload::ConfigSource = Box::new(move || load_config(&global));
    match runtime.block_on(crate::app::run(config, source)) {
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

/// [`load_config`], then builds the TLS material from it: every PEM file is read and
/// checked, so a bad one is refused here (one line naming the key and the file) rather than
/// at the first delivery; an existing intercept CA is checked against `[intercept] hosts`.
/// For the commands that deliver or check; the operator commands only need the admin
/// address. Here rather than in `args`: it reaches into `inbound` and `intercept`, which
/// sit above `args`.
pub fn load_checked(global: &GlobalArgs) -> Result<Config, ConfigError> {
    let config = load_config(global)?;
    crate::outbound::tls::TlsMaterial::from_config(&config)?;
    config.store.keyring()?;
    // A socket someone else could replace is refused before anything is opened.
    if let crate::config::ListenAddr::Unix(path) = &config.listen {
        crate::inbound::uds::check_directory(path).map_err(|e| ConfigError::invalid("listen", e))?;
    }
    // The intercept CA, when it exists: one made for other hosts is refused here, before
    // anything is bound or opened.
    if !config.intercept.hosts.is_empty() {
        let (cert, key) = config.intercept.ca_files(&config.data_dir);
        let now = crate::intercept::wall(&crate::clock::SystemClock);
        crate::intercept::ca::Ca::check_existing(&cert, &key, &config.intercept.hosts, now)
            .map_err(|e| ConfigError::invalid("[intercept]", e))?;
    }
    Ok(config)
}
