//! `courier intercept ca`: prints the certificate of the CA that signs intercepted hosts'
//! certificates, for the apps to trust (`SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE`,
//! `NODE_EXTRA_CA_CERTS`, a Java trust store). It reads the same files `serve` does, and
//! makes them as the first start would when they are not there yet (so an init container
//! can publish the certificate before courier first starts).

use std::process::ExitCode;

use clap::Subcommand;

use crate::args::{load_config, GlobalArgs};
use crate::intercept::ca::Ca;

/// `courier intercept …`
#[derive(Debug, Subcommand)]
pub enum InterceptCommand {
    /// Print the intercept CA's certificate (PEM) on stdout; made first if missing.
    Ca,
}

/// Runs an `intercept` command; exit 0, 2 for settings that do not load, or 1 with one line
/// on stderr.
pub fn run(global: &GlobalArgs, cmd: InterceptCommand) -> ExitCode {
    let InterceptCommand::Ca = cmd;
    let config = match load_config(global) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("courier: {e}");
            return ExitCode::from(2);
        }
    };
    let (cert, key) = config.intercept.ca_files(&config.data_dir);
    if config.intercept.hosts.is_empty() && !cert.exists() {
        eprintln!("courier: no [intercept] hosts are listed, so there is no intercept CA (list the webhook receivers in [intercept] hosts)");
        return ExitCode::FAILURE;
    }
    let now = crate::intercept::wall(&crate::clock::SystemClock);
    match Ca::load_or_create(&cert, &key, &config.intercept.hosts, now) {
        Ok(ca) => {
            print!("{}", ca.pem());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("courier: {e}");
            ExitCode::FAILURE
        }
    }
}
