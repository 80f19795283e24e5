//! The TOML layer ([`Config::from_toml_str`]): the file is parsed keeping each value's place
//! in the text, settled by `shape`, then read by serde straight into the typed tree, with
//! `serde_path_to_error` tracking the key; every error becomes one line that names the key
//! and the line. serde's own messages lose the string they quote (it may be a secret under
//! the wrong key); the parsers' messages show a value only where it cannot be one.

use serde_path_to_error::{Path, Segment};
use toml_edit::{DocumentMut, ImDocument, Table};

use super::error::Problem;
use super::shape::{is_group, shape};
use super::{Config, ConfigError};

/// What serde says of a document it could not read, with the path of the key.
pub(super) type ReadError = serde_path_to_error::Error<toml_edit::de::Error>;

impl Config {
    /// The defaults overlaid with the TOML `text`; `origin` (usually the file path) names it
    /// in errors. Does not validate: call [`Config::validate`].
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
        Config::from_document(document(text, origin)?, text, origin)
    }

    /// The settled document `root` of the file `text`, read into the tree.
    pub(super) fn from_document(root: Table, text: &str, origin: &str) -> Result<Config, ConfigError> {
        let config = read(root).map_err(|e| {
            let mut problem = serde_problem(e.path(), e.inner().message());
            problem.text.push_str(&line_suffix(text, e.inner().span()));
            ConfigError::file(origin, problem)
        })?;
        config.check_sections().map_err(|p| ConfigError::file(origin, p))?;
        Ok(config)
    }
}

/// The file `text` parsed, keeping each value's place in the text, and settled by `shape`.
pub(super) fn document(text: &str, origin: &str) -> Result<Table, ConfigError> {
    let document = ImDocument::parse(text)
        .map_err(|e| ConfigError::file(origin, format!("{}{}", e.message(), line_suffix(text, e.span()))))?;
    let mut root = document.into_table();
    shape(&mut root).map_err(|problem| ConfigError::file(origin, problem))?;
    Ok(root)
}

/// A settled document read by serde into the tree, tracking the key it is at.
pub(super) fn read(root: Table) -> Result<Config, ReadError> {
    serde_path_to_error::deserialize(toml_edit::de::Deserializer::from(DocumentMut::from(root)))
}

/// ` (line N)` for a place in `text`, or nothing.
fn line_suffix(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    span.map(|s| format!(" (line {})", text[..s.start.min(text.len())].matches('\n').count() + 1))
        .unwrap_or_default()
}

/// The problem serde's `message` says at `path`: a [`Problem`] of ours keeps its code; an
/// unknown field is an unknown key, a missing one a missing key; anything else has its
/// quoted string removed.
fn serde_problem(path: &Path, message: &str) -> Problem {
    let key = dotted(path);
    let field = |prefix: &str| message.strip_prefix(prefix).and_then(|rest| rest.split('`').next());
    if let Some(field) = field("unknown field `") {
        // The path already ends with the key when serde's wrapper saw it before the struct
        // refused it.
        let full = match key.as_str() {
            "" => field.to_string(),
            k if k == field || k.ends_with(&format!(".{field}")) => key.clone(),
            k => format!("{k}.{field}"),
        };
        return Problem::from(format!("unknown key {full:?}"));
    }
    if let Some(field) = field("missing field `") {
        return Problem::from(format!("missing key {field:?}")).at(&key);
    }
    serde_message(message).at(&key)
}

/// The problem of serde's `message`, not yet placed: a [`Problem`] of ours keeps its code;
/// serde's own messages lose the string they quote.
pub(super) fn serde_message(message: &str) -> Problem {
    Problem::from_serde(message).unwrap_or_else(|| Problem::from(redact_quoted_string(message)))
}

/// The path as the file writes it: `route[0].url`, without `shape`'s groups.
pub(super) fn dotted(path: &Path) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } if is_group(key) => {}
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => out.push_str(if out.is_empty() { "?" } else { ".?" }),
        }
    }
    out
}

/// serde reports a mistyped string by quoting it (`invalid type: string "whsec_..", expected
/// a sequence`); the value may be a secret under the wrong key, so it is dropped.
pub(super) fn redact_quoted_string(message: &str) -> String {
    let Some(start) = message.find("string \"") else {
        return message.to_string();
    };
    let body = &message[start + "string \"".len()..];
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            '"' if !escaped => return format!("{}a string{}", &message[..start], &body[i + 1..]),
            _ => escaped = false,
        }
    }
    format!("{}a string", &message[..start])
}
