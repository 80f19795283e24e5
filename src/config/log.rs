//! `[log]`: how courier writes its log lines to stderr.

use serde::Deserialize;

use super::de::{self, text};

text!(/// `text` or `json`.
    Format: LogFormat = parse_log_format);

spelled! {
    /// The shape of each log line.
    pub enum LogFormat {
        /// Human-readable lines (the default).
        #[default]
        Text = "text",
        /// One JSON object a line, with the stable fields `timestamp`, `level`, `target`,
        /// `message` and the event's own fields (`delivery_id`, `endpoint`, ...) beside them,
        /// so a log pipeline can index them without parsing text.
        Json = "json",
    }
}

section! {
    /// `[log]`.
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct LogConfig {
        /// The line format.
        pub format: LogFormat ["de::one::<Format, _>"] = LogFormat::Text,
    }
}

/// `text` or `json`, case-insensitive (an env var is easy to capitalise).
pub(super) fn parse_log_format(v: &str) -> Result<LogFormat, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err("expected \"text\" or \"json\"".to_string()),
    }
}
