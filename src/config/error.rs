//! [`ConfigError`]: the one error type of the config layers, and its constructors for each
//! place a problem can come from (file, environment variable, flag, validation rule).

use std::fmt;

/// A configuration problem: one line naming what is wrong and where (file and key,
/// environment variable, flag, or setting), ending in `[code]` when the rule broken has a
/// machine-readable code (see [`ConfigError::code`]). Never contains a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    place: String,
    problem: String,
    code: Option<&'static str>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.place, self.problem)?;
        if let Some(code) = self.code {
            write!(f, " [{code}]")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// A problem found by a layer before it knows its place (which file, which variable): the
/// sentence, and the rule's code if it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Problem {
    pub(super) code: Option<&'static str>,
    pub(super) text: String,
}

/// Every machine-readable code a problem may carry (see [`ConfigError::code`]).
const CODES: [&str; 10] = [
    "empty_schedule",
    "invalid_duration",
    "schedule_too_long",
    "conflicting_backoff",
    "invalid_status",
    "status_class_conflict",
    "per_endpoint_setting",
    "empty_section",
    "invalid_policy_value",
    "invalid_value",
];

/// Marks a serde error message as a [`Problem`] (`MARK code MARK text`): serde errors are
/// plain messages, so the code travels inside the message and `file` takes it out again.
const MARK: char = '\u{1f}';

impl Problem {
    /// A problem with a machine-readable code (one of [`CODES`]).
    pub(super) fn coded(code: &'static str, text: impl Into<String>) -> Self {
        debug_assert!(CODES.contains(&code), "unlisted code {code}");
        Problem {
            code: Some(code),
            text: text.into(),
        }
    }

    /// This problem under `key`: `key: text`, or `key` followed by the text when the text
    /// continues the key (` must list ...`, `[1] must ...`, `.on_dead: ...`).
    pub(super) fn at(self, key: &str) -> Problem {
        let text = if key.is_empty() {
            self.text
        } else if self.text.starts_with([' ', '[', '.']) {
            format!("{key}{}", self.text)
        } else {
            format!("{key}: {}", self.text)
        };
        Problem { text, ..self }
    }

    /// This problem as a serde error, raised while the file is read; the path serde is at
    /// names the place (see [`Problem::from_serde`]).
    pub(super) fn into_serde<E: serde::de::Error>(self) -> E {
        E::custom(format_args!("{MARK}{}{MARK}{}", self.code.unwrap_or(""), self.text))
    }

    /// The problem a message made by [`Problem::into_serde`] carries; `None` for serde's
    /// and toml's own messages.
    pub(super) fn from_serde(message: &str) -> Option<Problem> {
        let (code, text) = message.strip_prefix(MARK)?.split_once(MARK)?;
        Some(Problem {
            code: CODES.iter().find(|c| **c == code).copied(),
            text: text.to_string(),
        })
    }
}

impl From<String> for Problem {
    fn from(text: String) -> Self {
        Problem { code: None, text }
    }
}

impl From<&str> for Problem {
    fn from(text: &str) -> Self {
        Problem::from(text.to_string())
    }
}

impl ConfigError {
    /// `problem` at `place`, keeping its code.
    pub(super) fn new(place: impl Into<String>, problem: impl Into<Problem>) -> Self {
        // One line, always: the CLI prints this as the single line before exiting.
        let one_line = |s: String| {
            s.split(['\n', '\r'])
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let Problem { code, text } = problem.into();
        ConfigError {
            place: one_line(place.into()),
            problem: one_line(text),
            code,
        }
    }

    pub(super) fn file(origin: &str, problem: impl Into<Problem>) -> Self {
        ConfigError::new(format!("config {origin}"), problem)
    }

    /// A bad value of the variable `name`; a `secret` one's value is not echoed.
    pub(super) fn env(name: &str, value: &str, secret: bool, problem: Problem) -> Self {
        let place = if secret {
            name.to_string()
        } else {
            format!("{name}={value:?}")
        };
        ConfigError::new(place, problem)
    }

    pub(crate) fn invalid(key: &str, problem: impl fmt::Display) -> Self {
        ConfigError::new("invalid config", format!("{key} {problem}"))
    }

    /// A broken validation rule, already worded (key first) by the code that found it.
    pub(super) fn invalid_problem(problem: Problem) -> Self {
        ConfigError::new("invalid config", problem)
    }

    /// The machine-readable code of the rule broken, for the rules that have one (one of
    /// `CODES`: the retry-policy rules, any bad duration, a bad jitter), printed at the end
    /// of the line as `[code]`.
    pub fn code(&self) -> Option<&'static str> {
        self.code
    }

    /// Where the problem is: `config <file>`, `<VARIABLE>="<value>"`, `--flag "<value>"` or
    /// `invalid config` (a rule of [`Config::validate`](super::Config::validate)).
    pub fn place(&self) -> &str {
        &self.place
    }

    /// What is wrong (starts with the key for file and validation problems).
    pub fn problem(&self) -> &str {
        &self.problem
    }
}
