//! [`ConfigError`]: the one error type of the config layers, and its constructors for each
//! place a problem can come from (file, environment variable, flag, validation rule).

use std::fmt;

use super::env::SENSITIVE_ENV_VARS;

/// A configuration problem: one line naming what is wrong and where (file and key,
/// environment variable, flag, or setting). Never contains a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{place}: {problem}")]
pub struct ConfigError {
    place: String,
    problem: String,
}

impl ConfigError {
    pub(super) fn new(place: impl Into<String>, problem: impl Into<String>) -> Self {
        // One line, always: the CLI prints this as the single line before exiting.
        let one_line = |s: String| {
            s.split(['\n', '\r'])
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        };
        ConfigError {
            place: one_line(place.into()),
            problem: one_line(problem.into()),
        }
    }

    pub(super) fn file(origin: &str, problem: impl Into<String>) -> Self {
        ConfigError::new(format!("config {origin}"), problem)
    }

    pub(super) fn env(name: &str, value: &str, problem: impl Into<String>) -> Self {
        if SENSITIVE_ENV_VARS.contains(&name) {
            ConfigError::new(name, problem)
        } else {
            ConfigError::new(format!("{name}={value:?}"), problem)
        }
    }

    pub(super) fn invalid(key: &str, problem: impl fmt::Display) -> Self {
        ConfigError::new("invalid config", format!("{key} {problem}"))
    }

    /// Where the problem is: `config <file>`, `<VARIABLE>="<value>"`, `--flag "<value>"` or
    /// `invalid config` (a rule of [`Config::validate`]).
    pub fn place(&self) -> &str {
        &self.place
    }

    /// What is wrong (starts with the key for file and validation problems).
    pub fn problem(&self) -> &str {
        &self.problem
    }
}
