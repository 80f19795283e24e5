//! Unit tests of the config layers, one file per concern: `load` (defaults and layering),
//! `file` (the TOML layer and its errors), `env` (variables and flags), `validate` (the
//! rules), `summary` (summary and redaction), `access` (listeners, `[ingress]`/`[admin]`
//! and the non-loopback rule), `scopes` (signing key and route targets). The fixtures they
//! share live here.

mod access;
mod env;
mod file;
mod listen;
mod load;
mod policy;
mod scopes;
mod summary;
mod validate;

use std::collections::HashMap;

use ipnet::IpNet;

use super::*;
use crate::model::{Jitter, SignatureScheme};

/// CONTRACT §7, verbatim.
const CONTRACT_EXAMPLE: &str = r#"
listen = "127.0.0.1:8787"
admin_listen = "127.0.0.1:8788"
data_dir = "./courier-data"
max_body = "1MiB"
shutdown_grace = "30s"
retention = "3d"
dead_retention = "30d"
# ingress_token = "..."            # unset: no auth on ingress
# admin_token = "..."              # unset: no auth on admin
# alert_url = "https://ops.example/alerts"

[retry]
base_delay = "1m"
max_delay = "1h"
jitter = "equal"                  # equal | full | none
max_attempts = 16
give_up_after = "3d"
max_attempts_404 = 5
max_retry_after = "24h"

[delivery]
connect_timeout = "10s"
request_timeout = "30s"
max_in_flight_per_host = 10
rate_per_second = 100
pause_after_permanent_failures = 100
max_response_body = "64KiB"

[signing]
scheme = "standard"               # standard | stripe | github | none
# secrets = ["whsec_..."]         # default secrets; all of them sign (rotation)

# [signing.keys]
# billing = ["whsec_new...", "whsec_old..."]

[egress]
allow_private_targets = false
# allow = ["127.0.0.1/32", "10.1.0.0/16"]

# [[route]]                       # POST /r/billing
# name = "billing"
# url = "https://billing.example/hooks"
# signing_key = "billing"
# scheme = "stripe"

# [[host]]                        # per-host override of the in-flight cap
# host = "api.bigcustomer.example:443"
# max_in_flight = 50

# [[endpoint]]                    # per-endpoint override of the rate limit
# key = "https://slow.example/hook"
# rate_per_second = 5
"#;

const STD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const STD_SECRET_2: &str = "whsec_c2VjcmV0LW51bWJlci10d28=";

/// Every key of §7 set to a non-default value (secrets are valid and recognisable).
fn full_toml() -> String {
    format!(
        r#"
listen = "0.0.0.0:9001"
admin_listen = "[::1]:9002"
data_dir = "/var/lib/courier"
max_body = "2MiB"
shutdown_grace = "0"
retention = "1d"
dead_retention = "7d"
ingress_token = "tok-INGRESS-5ecret"
admin_token = "tok-ADMIN-5ecret"
alert_url = "https://ops.example/alerts/T000/B000/xyzSECRETPATH"

[retry]
base_delay = "250ms"
max_delay = "10m"
jitter = "full"
max_attempts = 8
give_up_after = "2h"
max_attempts_404 = 2
max_retry_after = "1h"

[delivery]
connect_timeout = "2s"
request_timeout = "5s"
max_in_flight_per_host = 4
rate_per_second = 20
pause_after_permanent_failures = 7
max_response_body = "1KiB"
idle_connection_timeout = "45s"
max_idle_connections = 32

[log]
format = "json"

[signing]
scheme = "standard"
secrets = ["{STD_SECRET}", "{STD_SECRET_2}"]

[signing.keys]
billing = ["sk-BILLING-5ecret-new", "sk-BILLING-5ecret-old"]
partner = ["{STD_SECRET}"]

[egress]
allow_private_targets = true
allow = ["127.0.0.1/32", "10.1.0.0/16", "::1", "192.168.1.7"]

[[route]]
name = "billing"
url = "https://billing.example/hooks"
signing_key = "billing"
scheme = "stripe"

[[route]]
name = "partner-2_x"
url = "http://partner.example:8080/in?a=1"
signing_key = "partner"

[[host]]
host = "api.bigcustomer.example:443"
max_in_flight = 50

[[endpoint]]
key = "https://slow.example/hook"
rate_per_second = 5
"#
    )
}

const SECRET_MARKERS: [&str; 6] = [
    "5ecret",
    "SECRETPATH",
    "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "c2VjcmV0LW51bWJlci10d28",
    "hunter2",
    "s3kr1t",
];

fn assert_no_secret(text: &str) {
    for marker in SECRET_MARKERS {
        assert!(!text.contains(marker), "secret {marker:?} leaked in: {text}");
    }
}

/// Each file fails `from_toml_str` with one line starting with its message, showing no
/// secret and none of `shape`'s group names.
fn assert_file_errors(cases: &[(&str, &str)]) {
    for (text, want) in cases {
        let msg = Config::from_toml_str(text, "c.toml").unwrap_err().to_string();
        let want = format!("config c.toml: {want}");
        assert!(msg.starts_with(&want), "{text:?}: got {msg:?}, want {want:?}");
        assert!(!msg.contains('\n'), "{msg}");
        assert!(!msg.contains("(policy)") && !msg.contains("(ordering)"), "{msg}");
        assert_no_secret(&msg);
    }
}

fn parse(text: &str) -> Config {
    match Config::from_toml_str(text, "test.toml") {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    }
}

fn no_env(_: &str) -> Option<String> {
    None
}

pub(super) fn env_from(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |name| map.get(name).cloned()
}

/// A file under the system temp dir, unique per test, removed on drop.
struct TempFile(PathBuf);
impl TempFile {
    fn new(name: &str, text: &str) -> TempFile {
        let path = std::env::temp_dir().join(format!("courier-config-test-{}-{name}.toml", std::process::id()));
        std::fs::write(&path, text).expect("write temp file");
        TempFile(path)
    }
}
impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}
