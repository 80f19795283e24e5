//! `courier keys generate` and `courier keys public`: make an Ed25519 signing key for the
//! standard scheme's `v1a` signatures, and print the `whpk_` public key receivers verify with.
//!
//! Output is shaped for scripts and for keeping the secret out of places it should not be:
//! - `generate` prints the `whsk_` secret alone on stdout (so `courier keys generate >
//!   key.txt` or `$(courier keys generate)` captures only it) and its `whpk_` public key on
//!   stderr (so the terminal shows it, and `2> public.txt` keeps it apart).
//! - `public` reads the secret from stdin when it is not given as an argument, since an
//!   argument lands in shell history and in `ps` output.
//!
//! The encoding (`whsk_` = base64 of the 32-byte seed) is documented in
//! [`crate::signing::ed25519`]. Nothing here talks to a running courier.
//!
//! `generate --store` makes a store key instead (see `crate::store::keyfiles`).

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;

use clap::Subcommand;
use rand::TryRngCore;

use crate::signing::ed25519;

/// `courier keys …`
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create an Ed25519 signing key: prints the whsk_ secret on stdout and its whpk_
    /// public key on stderr. With --store, a store key instead (`[store]
    /// encryption_key_files`): base64 of 32 random bytes; when stdout is a file, it is made
    /// the owner's only (0600).
    Generate {
        /// Make a store key (for sealing payloads at rest), not a signing key.
        #[arg(long)]
        store: bool,
    },
    /// Print the whpk_ public key of a whsk_ secret key.
    Public {
        /// The whsk_ secret; read from stdin when omitted or `-` (keeps it out of shell
        /// history and `ps`).
        secret: Option<String>,
    },
}

/// Runs a `keys` command; exit 0, or 1 with one line on stderr.
pub fn run(cmd: KeysCommand) -> ExitCode {
    let result = match cmd {
        KeysCommand::Generate { store: false } => generate(),
        KeysCommand::Generate { store: true } => generate_store(),
        KeysCommand::Public { secret } => public(secret),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("courier: {message}");
            ExitCode::FAILURE
        }
    }
}

fn generate() -> Result<(), String> {
    // Straight from the operating system: a signing key is the one place courier needs
    // randomness that must never be reproducible.
    let mut seed = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut seed)
        .map_err(|e| format!("cannot read random bytes from the operating system: {e}"))?;
    let secret = ed25519::encode_secret(&seed);
    let public = ed25519::public_key(&secret).ok_or("generated key does not decode")?;
    write_line(&mut std::io::stdout(), &secret)?;
    write_line(&mut std::io::stderr(), &public)
}

/// A store key on stdout. `courier keys generate --store > store.key` makes the file with
/// the shell's umask (often 0644), which courier would refuse: so when stdout is a regular
/// file, it is made 0600 before the key is written into it.
fn generate_store() -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let text = crate::store::keyfiles::generate()?;
    let stdout = std::io::stdout();
    let fd = std::os::fd::AsFd::as_fd(&stdout)
        .try_clone_to_owned()
        .map_err(|e| format!("cannot use stdout: {e}"))?;
    let file = std::fs::File::from(fd);
    if file.metadata().is_ok_and(|m| m.is_file()) {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("cannot make the key file the owner's only (chmod 600): {e}"))?;
    }
    let mut out = stdout.lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write the key: {e}"))
}

fn public(secret: Option<String>) -> Result<(), String> {
    let secret = match secret.filter(|s| s != "-") {
        Some(secret) => secret,
        None => {
            // Someone typing `courier keys public` alone would otherwise face a silent wait.
            if std::io::stdin().is_terminal() {
                eprintln!("courier: reading the whsk_ secret key from stdin (end with Ctrl-D)");
            }
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| format!("cannot read the secret key from stdin: {e}"))?;
            text
        }
    };
    let public = public_of(&secret)?;
    write_line(&mut std::io::stdout(), &public)
}

/// The `whpk_` key of `text` (surrounding whitespace ignored). The error never repeats the
/// input: it is meant to be a secret.
fn public_of(text: &str) -> Result<String, String> {
    let secret = text.trim();
    if !ed25519::is_secret(secret) {
        return Err(
            "not an Ed25519 secret key: expected whsk_ followed by base64 (as `courier keys generate` prints; \
                    whsec_ secrets are HMAC and have no public key)"
                .into(),
        );
    }
    ed25519::public_key(secret).ok_or_else(|| {
        "not an Ed25519 secret key: the part after whsk_ must be the base64 of a 32-byte seed (value not shown)".into()
    })
}

fn write_line(out: &mut impl Write, line: &str) -> Result<(), String> {
    writeln!(out, "{line}").map_err(|e| format!("cannot write the key: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_of_trims_and_refuses_without_echoing() {
        let secret = "whsk_Y291cmllciBlZDI1NTE5IGtub3duLWFuc3dlciBrZXk=";
        let public = "whpk_SgxHe1+cbw9OFG7edwgundcRpId0LhJMbVzadLmMNiU=";
        assert_eq!(public_of(secret).as_deref(), Ok(public));
        assert_eq!(public_of(&format!("  {secret}\n")).as_deref(), Ok(public));
        for bad in ["whsec_c2VjcmV0", "", "whsk_c2hvcnQ=", "whsk_???"] {
            let err = public_of(bad).unwrap_err();
            assert!(err.starts_with("not an Ed25519 secret key"), "{err}");
            assert!(bad.len() <= 5 || !err.contains(bad), "{err}");
        }
    }
}
