//! `[fleet]`: the Redis that makes the per-host in-flight caps and the per-endpoint rate
//! limits fleet-wide (see `crate::fleet`), as the file writes it (deserialized straight into
//! [`FleetConfig`]), its environment variables, its checks and its `check-config` line.
//!
//! The Redis URL may carry a password, so it is never shown whole: `Debug` and the summary
//! show its origin only (`rediss://redis.internal:6380`), and where the password came from.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use url::Url;

use super::de::{self, text};
use super::parse::parse_duration_text;
use super::summary::dur;
use super::validate::rule;
use super::ConfigError;
use crate::signing::Secret;

text!(/// A `redis://` or `rediss://` URL (never quoted: it may carry a password).
    RedisUrl: Url = parse_redis_url);
text!(/// A duration of `[fleet]` (whose bad durations have no code).
    Ttl: Duration = parse_duration_text);

section! {
    /// `[fleet]`. Without `redis_url` every limit is this courier's own, as before.
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct FleetConfig {
        /// `redis://[user:password@]host:port[/db]`, or `rediss://` for TLS (rustls, the
        /// system's web PKI roots). Unset: fleet limits off.
        pub redis_url: Option<Url> ["de::opt::<RedisUrl, _>"] = None => |url: &Option<Url>| url.as_ref().map(redis_origin),
        /// A file holding the Redis password (a mounted Kubernetes secret); its trailing
        /// newline is dropped. Over the URL's password, under `COURIER_FLEET_REDIS_PASSWORD`.
        pub password_file: Option<PathBuf> = None,
        /// `COURIER_FLEET_REDIS_PASSWORD`: set from the environment only (never the file,
        /// which is often checked in).
        #[serde(skip)]
        pub password: Option<Secret> = None,
        /// How many couriers share the limits. Used only while Redis is unreachable: each
        /// courier then keeps to its local limits divided by this (rounded up, at least 1).
        /// Default 1: an outage of Redis then behaves as courier did before it had a fleet
        /// (each courier at its own limits), never slower; set it to the replica count to keep
        /// the receivers' protection through an outage.
        pub expected_replicas: u32 = 1,
        /// Prefix of every Redis key and channel, so several fleets can share one Redis.
        pub key_prefix: String = "courier".to_string(),
        /// How long a lease outlives a courier that stopped renewing it (killed, cut off from
        /// Redis): renewed every third of it while the attempt runs.
        pub lease_ttl: Duration ["de::one::<Ttl, _>"] = Duration::from_secs(10),
        /// The longest one Redis call may take before Redis counts as unavailable and the
        /// fallback limits apply; short, so a stalled Redis does not stall delivery.
        pub timeout: Duration ["de::one::<Ttl, _>"] = Duration::from_millis(250),
    }
}

/// Where the Redis password comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PasswordSource {
    /// `COURIER_FLEET_REDIS_PASSWORD`.
    Env,
    /// `fleet.password_file`.
    File,
    /// The URL's `user:password@`.
    Url,
    /// No password.
    None,
}

impl FleetConfig {
    /// Whether fleet limits are on.
    #[cfg(test)]
    pub fn enabled(&self) -> bool {
        self.redis_url.is_some()
    }

    /// Where the password comes from: the variable, else the file, else the URL.
    pub fn password_source(&self) -> PasswordSource {
        if self.password.is_some() {
            PasswordSource::Env
        } else if self.password_file.is_some() {
            PasswordSource::File
        } else if self.redis_url.as_ref().is_some_and(|u| u.password().is_some()) {
            PasswordSource::Url
        } else {
            PasswordSource::None
        }
    }

    /// The password to send, read now (the file is read at each call: at validation and
    /// when courier connects). `None` leaves the URL's own, if any.
    pub fn password_override(&self) -> Result<Option<Secret>, ConfigError> {
        if let Some(p) = &self.password {
            return Ok(Some(p.clone()));
        }
        let Some(path) = &self.password_file else {
            return Ok(None);
        };
        let (key, shown) = ("fleet.password_file", path.display());
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::invalid(key, format_args!("{shown}: cannot read it: {e}")))?;
        let password = text.strip_suffix('\n').unwrap_or(&text);
        let password = password.strip_suffix('\r').unwrap_or(password);
        rule(password.is_empty(), key, format_args!("{shown} is empty"))?;
        Ok(Some(Secret::new(password.to_string())))
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let (replicas, prefix, ttl, timeout) = (self.expected_replicas, &self.key_prefix, self.lease_ttl, self.timeout);
        rule(replicas == 0, "fleet.expected_replicas", "must be at least 1")?;
        let prefix_ok = !prefix.is_empty() && prefix.len() <= 64 && prefix.bytes().all(|b| b.is_ascii_graphic());
        let problem = "must be 1 to 64 printable ASCII characters without spaces";
        rule(!prefix_ok, "fleet.key_prefix", problem)?;
        rule(ttl < Duration::from_secs(1), "fleet.lease_ttl", "must be at least 1s")?;
        // Renewed every third of the TTL: a renewal must fit in one third, so one that
        // times out still leaves a second chance before the lease expires.
        let shown = dur(&ttl);
        let problem = format_args!("must be more than 0 and at most a third of fleet.lease_ttl ({shown})");
        rule(timeout.is_zero() || timeout * 3 > ttl, "fleet.timeout", problem)?;
        if let Some(url) = &self.redis_url {
            check_redis_url(url).map_err(|e| ConfigError::invalid("fleet.redis_url", e))?;
            self.password_override()?;
        }
        Ok(())
    }

    /// The `check-config` line: the Redis origin (never the password), the password's
    /// source, and the settings.
    pub(super) fn summary(&self) -> String {
        let Some(url) = &self.redis_url else {
            return "fleet: off (no redis_url: every limit is this courier's own)".to_string();
        };
        let password = match self.password_source() {
            PasswordSource::Env => "from COURIER_FLEET_REDIS_PASSWORD",
            PasswordSource::File => "from fleet.password_file",
            PasswordSource::Url => "from the URL",
            PasswordSource::None => "none",
        };
        let settings = pairs!(self; expected_replicas, key_prefix, lease_ttl: dur, timeout: dur);
        let origin = redis_origin(url);
        format!("fleet: redis {origin} (password {password}), {settings}")
    }
}

/// `redis[s]://host[:port][/db]`: the URL without its user and password (`Url::origin` is
/// opaque for these schemes).
pub fn redis_origin(url: &Url) -> String {
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    let db = if url.path().len() > 1 { url.path() } else { "" };
    format!("{}://{}{port}{db}", url.scheme(), url.host_str().unwrap_or_default())
}

/// A `redis://` or `rediss://` URL with a host; the message never quotes the URL.
fn parse_redis_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text.trim()).map_err(|e| format!("not a valid URL ({e})"))?;
    check_redis_url(&url)?;
    Ok(url)
}

fn check_redis_url(url: &Url) -> Result<(), String> {
    if !matches!(url.scheme(), "redis" | "rediss") {
        return Err(format!("must be a redis:// or rediss:// URL, not {}://", url.scheme()));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("has no host".to_string());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_section_deserializes_onto_the_defaults() {
        let c = Config::from_toml_str(
            "[fleet]\nredis_url = \"rediss://u:pw@redis.internal:6380/2\"\nexpected_replicas = 3\nlease_ttl = \"2s\"\n",
            "t",
        )
        .unwrap();
        c.validate().unwrap();
        let f = &c.fleet;
        assert!(f.enabled());
        assert_eq!(f.expected_replicas, 3);
        assert_eq!(f.key_prefix, "courier");
        assert_eq!(f.lease_ttl, Duration::from_secs(2));
        assert_eq!(f.timeout, Duration::from_millis(250));
        assert_eq!(f.password_source(), PasswordSource::Url);
        assert_eq!(Config::default().fleet, FleetConfig::default());
        assert!(!Config::default().fleet.enabled());
    }

    #[test]
    fn the_password_never_shows() {
        let mut c = Config::from_toml_str(
            "[fleet]\nredis_url = \"redis://:hunter2@10.0.0.7:6379/0\"\nkey_prefix = \"prod\"\n",
            "t",
        )
        .unwrap();
        let summary = c.summary();
        assert!(
            summary.contains("fleet: redis redis://10.0.0.7:6379/0 (password from the URL)"),
            "{summary}"
        );
        assert!(summary.contains("key_prefix prod"), "{summary}");
        c.fleet.password = Some(Secret::new("s3kr1t".into()));
        for shown in [c.summary(), format!("{c:?}"), format!("{:?}", c.fleet)] {
            assert!(!shown.contains("hunter2") && !shown.contains("s3kr1t"), "{shown}");
        }
        assert!(c.summary().contains("password from COURIER_FLEET_REDIS_PASSWORD"));
        assert!(Config::default().summary().contains("fleet: off"));
    }

    #[test]
    fn the_password_file_is_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "from-file\n").unwrap();
        let mut f = FleetConfig {
            redis_url: Some(Url::parse("redis://:in-url@r:6379").unwrap()),
            password_file: Some(path.clone()),
            ..FleetConfig::default()
        };
        assert_eq!(f.password_source(), PasswordSource::File);
        assert_eq!(f.password_override().unwrap().unwrap().expose(), "from-file");
        f.password = Some(Secret::new("from-env".into()));
        assert_eq!(f.password_source(), PasswordSource::Env);
        assert_eq!(f.password_override().unwrap().unwrap().expose(), "from-env");
        f.password = None;
        std::fs::write(&path, "\n").unwrap();
        let e = f.validate().unwrap_err().to_string();
        assert!(e.contains("fleet.password_file") && e.contains("is empty"), "{e}");
        f.password_file = Some(dir.path().join("missing"));
        let e = f.validate().unwrap_err().to_string();
        assert!(e.contains("cannot read it"), "{e}");
    }

    #[test]
    fn bad_values_are_refused_with_their_key() {
        for (toml, problem) in [
            (
                "redis_url = \"http://r:6379\"",
                "fleet.redis_url: must be a redis:// or rediss:// URL",
            ),
            ("redis_url = \"redis://:pw@\"", "fleet.redis_url"),
            ("lease_ttl = \"10\"", "fleet.lease_ttl"),
            ("expectd_replicas = 2", "unknown key \"fleet.expectd_replicas\""),
        ] {
            let e = Config::from_toml_str(&format!("[fleet]\n{toml}\n"), "t")
                .unwrap_err()
                .to_string();
            assert!(e.contains(problem), "{toml}: {e}");
            assert!(!e.contains("pw@"), "{e}");
        }
        for (toml, problem) in [
            ("expected_replicas = 0", "fleet.expected_replicas must be at least 1"),
            ("key_prefix = \"a b\"", "fleet.key_prefix must be"),
            ("key_prefix = \"\"", "fleet.key_prefix must be"),
            ("lease_ttl = \"500ms\"", "fleet.lease_ttl must be at least 1s"),
            ("timeout = \"0s\"", "fleet.timeout must be more than 0"),
            (
                "lease_ttl = \"1s\"\ntimeout = \"400ms\"",
                "at most a third of fleet.lease_ttl (1s)",
            ),
        ] {
            let c = Config::from_toml_str(&format!("[fleet]\n{toml}\n"), "t").unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(problem), "{toml}: {e}");
        }
    }

    #[test]
    fn environment_variables_set_the_section() {
        let env = crate::config::tests::env_from(&[
            ("COURIER_FLEET_REDIS_URL", " rediss://r.example:6380 "),
            ("COURIER_FLEET_EXPECTED_REPLICAS", "4"),
            ("COURIER_FLEET_KEY_PREFIX", " staging "),
            ("COURIER_FLEET_REDIS_PASSWORD", "pw"),
        ]);
        let f = Config::layered(None, &env, &Default::default()).unwrap().fleet;
        assert_eq!(f.redis_url.as_ref().map(Url::as_str), Some("rediss://r.example:6380"));
        assert_eq!((f.expected_replicas, f.key_prefix.as_str()), (4, "staging"));
        assert_eq!(f.password_source(), PasswordSource::Env);
        let env = crate::config::tests::env_from(&[("COURIER_FLEET_REDIS_URL", "https://:pw@r.example")]);
        let e = Config::layered(None, &env, &Default::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("COURIER_FLEET_REDIS_URL: must be") && !e.contains("pw@"),
            "{e}"
        );
    }
}
