//! `courier store …`, the offline store commands: they open the data dir themselves, so
//! courier must be stopped (a running courier holds the data dir's lock, and they say so).
//!
//! `store rekey` moves every stored payload to the first key of `[store]
//! encryption_key_files` (or, with `--to-plain`, stores every one plain), so an old key file
//! can be dropped, or sealing turned off. New writes need no rekey: a new first key seals
//! them from the next start on.
//!
//! `store check` audits the store as the next start would find it (after a power loss, a
//! disk scare), changing nothing: see [`Store::check`].

use std::process::ExitCode;

use clap::Subcommand;

use super::load_checked;
use crate::args::{store_options, GlobalArgs};
use crate::config::Config;
use crate::store::{Store, StoreError, StoreOptions};

/// `courier store …`
#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Seal every stored payload with the first store key (courier stopped), so the data
    /// dir needs no other key.
    Rekey {
        /// Store every payload plain instead, so sealing can be turned off.
        #[arg(long)]
        to_plain: bool,
    },
    /// Check the store's consistency (courier stopped), e.g. after a power loss: prints
    /// each problem on a line of its own and a summary; exit 0 when consistent, 1 otherwise.
    Check,
}

/// Runs a `store` command; exit 0, 2 for settings that do not load, or 1 with one line on
/// stderr (or, for `check`, with the problems found).
pub fn run(global: &GlobalArgs, cmd: StoreCommand) -> ExitCode {
    let (config, options) = match load_checked(global).and_then(|c| store_options(&c).map(|o| (c, o))) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("courier: {e}");
            return ExitCode::from(2);
        }
    };
    match cmd {
        StoreCommand::Rekey { to_plain } => rekey(&config, options, to_plain),
        StoreCommand::Check => check(&config, &options),
    }
}

/// Whether `config`'s data dir holds a store; says so when not. Only a store: opening one
/// would make one in any directory a typo names.
fn store_here(config: &Config) -> bool {
    let here = config.data_dir.join("CURRENT").is_file();
    if !here {
        eprintln!(
            "courier: no store in {} (give the data dir courier runs on: --data-dir)",
            config.data_dir.display()
        );
    }
    here
}

/// `store rekey`.
fn rekey(config: &Config, options: StoreOptions, to_plain: bool) -> ExitCode {
    let Some(sealing) = options.keyring.sealing() else {
        eprintln!(
            "courier: store.encryption_key_files lists no key: list the key to seal with first (and, with --to-plain, the keys the data is sealed with)"
        );
        return ExitCode::from(2);
    };
    if !store_here(config) {
        return ExitCode::FAILURE;
    }
    let store = match Store::open(&config.data_dir, options) {
        Ok(store) => store,
        Err(StoreError::Locked(dir)) => {
            eprintln!(
                "courier: {} is in use by a running courier: stop it, then rekey (new writes are already sealed with the first key)",
                dir.display()
            );
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("courier: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = store.rekey(to_plain);
    store.close();
    if let Ok(done) = &result {
        if let Some(first) = &done.first_unreadable {
            eprintln!(
                "courier: {} payloads do not open (altered or corrupt, first {first}): left as they are; no delivery can read them either",
                done.unreadable
            );
        }
    }
    match result {
        Ok(done) if to_plain => {
            println!(
                "rekey: {} payloads now plain, {} were already; the data dir needs no store key: remove [store] encryption_key_files before the next start (else new payloads are sealed again)",
                done.moved, done.kept
            );
            ExitCode::SUCCESS
        }
        Ok(done) => {
            println!(
                "rekey: {} payloads sealed again with store key {sealing}, {} were already; the data dir needs only that key now",
                done.moved, done.kept
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("courier: rekey stopped: {e} (what was moved before stays readable with the keys listed)");
            ExitCode::FAILURE
        }
    }
}

/// `store check`: the problems, one per line, then a summary on stdout.
fn check(config: &Config, options: &StoreOptions) -> ExitCode {
    if !store_here(config) {
        return ExitCode::FAILURE;
    }
    let dir = config.data_dir.display();
    let checked = match Store::check(&config.data_dir, options) {
        Ok(checked) => checked,
        Err(StoreError::Locked(_)) => {
            eprintln!(
                "courier: {dir} is in use by a running courier: stop it, then check (a store in use changes under the check)"
            );
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("courier: checking the store in {dir} stopped: {e}");
            return ExitCode::FAILURE;
        }
    };
    for problem in &checked.problems {
        println!("problem: {}", crate::redact::escape(problem));
    }
    let c = checked.counts;
    let held = format!(
        "{} messages: {} open ({} in flight, which the next start queues again), {} delivered, {} dead, {} handed off",
        c.open + c.delivered + c.dead + c.handed_off,
        c.open,
        checked.in_flight,
        c.delivered,
        c.dead,
        c.handed_off
    );
    if checked.problems.is_empty() {
        println!("store check: {dir} is consistent; {held}");
        ExitCode::SUCCESS
    } else {
        let n = checked.problems.len();
        let problems = if n == 1 { "problem" } else { "problems" };
        println!("store check: {n} {problems} in {dir}; {held}");
        ExitCode::FAILURE
    }
}
