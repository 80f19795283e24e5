//! `[circuit]`: the per-host circuit breaker's settings (see `policy::circuit`), their
//! defaults and their checks.

use std::time::Duration;

use serde::Deserialize;

use super::de::{self, Dur};
use super::validate::rule;
use super::ConfigError;
use crate::policy::circuit::CircuitSettings;

section! {
    /// `[circuit]`.
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct CircuitConfig {
        /// Consecutive failures to one host that open its breaker; 0 turns the breaker off.
        pub failures: u32 = 5,
        /// Wait before the first probe after the breaker opens; doubles after each failed
        /// probe.
        pub probe_delay: Duration ["de::one::<Dur, _>"] = Duration::from_secs(5),
        /// The longest wait between probes.
        pub probe_max_delay: Duration ["de::one::<Dur, _>"] = Duration::from_secs(300),
        /// Statuses that count as failures when the answer has no `Retry-After` (a receiver
        /// that says when to come back is not down, it is busy).
        pub statuses: Vec<u16> = vec![502, 503, 504],
    }
}

impl CircuitConfig {
    /// The breaker's settings; a probe unanswered for twice the attempt timeout is taken
    /// for lost (cut off) and may be replaced.
    pub fn settings(&self, request_timeout: Duration) -> CircuitSettings {
        CircuitSettings {
            failures: self.failures,
            probe_delay_ms: self.probe_delay.as_millis() as u64,
            probe_max_delay_ms: self.probe_max_delay.as_millis() as u64,
            probe_timeout_ms: request_timeout.as_millis() as u64 * 2,
        }
    }

    /// Whether `status` (answered without `Retry-After`) counts as a failure.
    pub fn counts(&self, status: u16) -> bool {
        self.statuses.contains(&status)
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let (delay, max) = (self.probe_delay, self.probe_max_delay);
        rule(delay.is_zero(), "circuit.probe_delay", "must be more than 0")?;
        let problem = "must be at least circuit.probe_delay";
        rule(max < delay, "circuit.probe_max_delay", problem)?;
        if let Some(s) = self.statuses.iter().find(|s| !(300..=599).contains(*s)) {
            let problem = format_args!("has {s}: only 300–599 can say a host is down");
            return Err(ConfigError::invalid("circuit.statuses", problem));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_section_overlays_the_defaults_and_is_checked() {
        let c = Config::from_toml_str(
            "[circuit]\nfailures = 3\nprobe_delay = \"1s\"\nprobe_max_delay = \"1m\"\nstatuses = [503]\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            c.circuit,
            CircuitConfig {
                failures: 3,
                probe_delay: Duration::from_secs(1),
                probe_max_delay: Duration::from_secs(60),
                statuses: vec![503],
            }
        );
        c.validate().unwrap();
        assert_eq!(c.circuit.settings(Duration::from_secs(30)).probe_timeout_ms, 60_000);
        for (toml, problem) in [
            ("probe_delay = \"0s\"", "circuit.probe_delay must be more than 0"),
            ("probe_max_delay = \"1s\"", "circuit.probe_max_delay must be at least"),
            ("statuses = [200]", "circuit.statuses has 200"),
        ] {
            let c = Config::from_toml_str(&format!("[circuit]\n{toml}\n"), "t").unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(problem), "{toml}: {e}");
        }
        assert!(
            Config::from_toml_str("[circuit]\nfailure = 3\n", "t").is_err(),
            "unknown key"
        );
    }
}
