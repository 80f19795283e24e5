//! `courier store rekey`: moves every stored payload to the first key of `[store]
//! encryption_key_files` (or, with `--to-plain`, stores every one plain), so an old key file
//! can be dropped, or sealing turned off. Offline: it opens the data dir itself, so courier
//! must be stopped (a running courier holds the data dir's lock, and the verb says so).
//!
//! New writes need no rekey: a new first key seals them from the next start on.

use std::process::ExitCode;

use clap::Subcommand;

use crate::args::{load_checked, store_options, GlobalArgs};
use crate::store::{Store, StoreError};

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
}

/// Runs a `store` command; exit 0, 2 for settings that do not load, or 1 with one line on
/// stderr.
pub fn run(global: &GlobalArgs, cmd: StoreCommand) -> ExitCode {
    let StoreCommand::Rekey { to_plain } = cmd;
    let (config, options) = match load_checked(global).and_then(|c| store_options(&c).map(|o| (c, o))) {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("courier: {e}");
            return ExitCode::from(2);
        }
    };
    let Some(sealing) = options.keyring.sealing() else {
        eprintln!(
            "courier: store.encryption_key_files lists no key: list the key to seal with first (and, with --to-plain, the keys the data is sealed with)"
        );
        return ExitCode::from(2);
    };
    // Only a store: `Store::open` would make one in any directory a typo names.
    if !config.data_dir.join("CURRENT").is_file() {
        eprintln!(
            "courier: no store in {} (give the data dir courier runs on: --data-dir)",
            config.data_dir.display()
        );
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
