//! [`Config::summary`] (for `courier check-config`) and the redacting formatters it shares
//! with the `Debug` impls: URLs without passwords, alert URLs as their origin only. Also
//! [`Config::ed25519_public_keys`], the public half of every `whsk_` key, which is not a
//! secret and is shown by `check-config` and the admin API.

use ipnet::IpNet;
use url::Url;

use super::units::format_duration;
use super::Config;
use crate::signing::scope::TargetPattern;
use crate::signing::Secret;

/// The public key of one configured Ed25519 (`whsk_`) key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKeyEntry {
    /// Where the key is listed: `signing.secrets[0]`, `signing.keys.billing[1]`.
    pub source: String,
    /// The `[signing.keys]` name, or `None` for the default secrets.
    pub key: Option<String>,
    /// `whpk_<base64>`.
    pub public_key: String,
}

impl Config {
    /// The public keys of the Ed25519 keys among the default secrets and `[signing.keys]`,
    /// in config order. Lets an operator publish exactly the keys courier signs with.
    pub fn ed25519_public_keys(&self) -> Vec<PublicKeyEntry> {
        let lists = std::iter::once((None, &self.signing.secrets)).chain(
            self.signing
                .keys
                .iter()
                .map(|(name, key)| (Some(name.clone()), &key.secrets)),
        );
        let mut out = Vec::new();
        for (key, secrets) in lists {
            for (i, secret) in secrets.iter().enumerate() {
                if let Some(public_key) = crate::signing::ed25519::public_key(secret.expose()) {
                    let source = match &key {
                        Some(name) => format!("signing.keys.{name}[{i}]"),
                        None => format!("signing.secrets[{i}]"),
                    };
                    out.push(PublicKeyEntry {
                        source,
                        key: key.clone(),
                        public_key,
                    });
                }
            }
        }
        out
    }

    /// A few human lines describing the effective settings, for `courier check-config`.
    /// Tokens and secrets are reported as set or counted, never shown.
    pub fn summary(&self) -> String {
        let mut lines = self.settings_lines();
        lines.push(format!("log: format {}", self.log.format.as_str()));
        lines.push(self.fleet.summary());
        lines.push(self.drain.summary());
        lines.extend(self.signing_lines());
        lines.extend(self.egress_lines());
        lines.extend(self.section_lines());
        // The policy each section ends up with, every inherited value filled in.
        lines.extend(self.policy_lines());
        lines.join("\n")
    }

    /// The top-level settings and the `[ingress]`, `[admin]`, `[retry]`, `[delivery]` and
    /// `[circuit]` sections, a line each.
    fn settings_lines(&self) -> Vec<String> {
        let set = |s: &Option<Secret>| if s.is_some() { "set" } else { "unset" };
        let r = &self.retry;
        let d = &self.delivery;
        vec![
            format!(
                "listen {} (ingress{}), {} (admin){}; data_dir {}",
                self.listen,
                match self.listen {
                    super::ListenAddr::Unix(_) => format!(", mode {:04o}", self.listen_mode),
                    super::ListenAddr::Tcp(_) => String::new(),
                },
                self.admin_listen,
                self.ops_listen.map(|ops| format!(", {ops} (ops)")).unwrap_or_default(),
                self.data_dir.display()
            ),
            format!(
                "max_body {}; ingress_token {}; admin_token {}; alert_url {}",
                format_size(self.max_body),
                set(&self.ingress_token),
                set(&self.admin_token),
                self.alert_url.as_ref().map_or_else(|| "unset".to_string(), origin_only)
            ),
            format!(
                "shutdown_grace {}; retention {} (delivered), {} (dead)",
                format_duration(self.shutdown_grace),
                format_duration(self.retention),
                format_duration(self.dead_retention)
            ),
            format!(
                "ingress: {}, max_pending_bytes {}, allow_get {}; admin: {}; allow_unauthenticated_network {}",
                access(
                    &self.ingress.allowed_origins,
                    &self.ingress.hosts,
                    self.ingress.idle_timeout
                ),
                self.ingress.max_pending_bytes,
                self.ingress.allow_get,
                access(&self.admin.allowed_origins, &self.admin.hosts, self.admin.idle_timeout),
                self.allow_unauthenticated_network
            ),
            format!(
                concat!(
                    "retry: base_delay {}, max_delay {}, jitter {}, max_attempts {}, max_attempts_404 {}, ",
                    "give_up_after {}, max_retry_after {}{}"
                ),
                format_duration(r.base_delay),
                format_duration(r.max_delay),
                r.jitter.as_str(),
                r.max_attempts,
                r.max_attempts_404,
                format_duration(r.give_up_after),
                format_duration(r.max_retry_after),
                match &r.schedule {
                    Some(steps) => format!(
                        ", schedule [{}]",
                        steps.iter().map(|d| format_duration(*d)).collect::<Vec<_>>().join(", ")
                    ),
                    None => String::new(),
                }
            ),
            format!(
                concat!(
                    "delivery: connect_timeout {}, request_timeout {}, max_in_flight {}, max_in_flight_per_host {}, ",
                    "rate_per_second {}, ",
                    "pause_after_permanent_failures {}, max_response_body {}, idle_connection_timeout {}, ",
                    "max_idle_connections {}"
                ),
                format_duration(d.connect_timeout),
                format_duration(d.request_timeout),
                d.max_in_flight,
                d.max_in_flight_per_host,
                d.rate_per_second,
                d.pause_after_permanent_failures,
                format_size(d.max_response_body),
                format_duration(d.idle_connection_timeout),
                d.max_idle_connections
            ),
            if self.circuit.failures == 0 {
                "circuit: off (failures 0)".to_string()
            } else {
                format!(
                    "circuit: failures {}, probe_delay {}, probe_max_delay {}, statuses {:?}",
                    self.circuit.failures,
                    format_duration(self.circuit.probe_delay),
                    format_duration(self.circuit.probe_max_delay),
                    self.circuit.statuses
                )
            },
        ]
    }

    /// The signing scheme, secrets and named keys (counted, never shown), and the public
    /// half of each Ed25519 key.
    fn signing_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let keys: Vec<String> = self
            .signing
            .keys
            .iter()
            .map(|(name, key)| {
                format!(
                    "{name} ({}{})",
                    count(key.secrets.len(), "secret"),
                    targets(&key.targets)
                )
            })
            .collect();
        lines.push(format!(
            "signing: scheme {}, {} by default, keys: {}",
            self.signing.scheme.as_str(),
            count(self.signing.secrets.len(), "secret"),
            if keys.is_empty() {
                "none".to_string()
            } else {
                keys.join(", ")
            }
        ));
        // Public keys are not secrets (the whsk_ values themselves are never shown).
        for entry in self.ed25519_public_keys() {
            lines.push(format!(
                "signing: {} is Ed25519, public key {}",
                entry.source, entry.public_key
            ));
        }
        lines
    }

    /// The egress policy, the proxy and the TLS settings.
    fn egress_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let allow: Vec<String> = self.egress.allow.iter().map(IpNet::to_string).collect();
        lines.push(format!(
            "egress: private targets {}, allow: {}",
            if self.egress.allow_private_targets {
                "allowed"
            } else {
                "refused"
            },
            if allow.is_empty() {
                "none".to_string()
            } else {
                allow.join(", ")
            }
        ));
        if let Some(proxy) = &self.egress.proxy {
            lines.push(format!(
                "egress: proxy {}, no_proxy: {}",
                proxy.describe(),
                if self.egress.no_proxy.is_empty() {
                    "none".to_string()
                } else {
                    self.egress.no_proxy.join(", ")
                }
            ));
        }
        lines.push(format!(
            "tls: roots {}, min_version {}, ca_file: {}",
            self.tls.roots.as_str(),
            self.tls.min_version.as_str(),
            paths(&self.tls.ca_file)
        ));
        lines
    }

    /// The `[[route]]`, `[[host]]` and `[[endpoint]]` sections, a line each.
    fn section_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for route in &self.routes {
            lines.push(format!(
                "route {} -> {} (signing key {}, scheme {}{}{})",
                route.name,
                without_password(&route.url),
                route.signing_key.as_deref().unwrap_or("default"),
                route.scheme.unwrap_or(self.signing.scheme).as_str(),
                targets(&route.targets),
                fifo(route.fifo)
            ));
        }
        for host in &self.hosts {
            let cap = host.max_in_flight.unwrap_or(self.delivery.max_in_flight_per_host);
            let mut line = format!("host {}: max_in_flight {cap}", host.host);
            if !host.tls.ca_file.is_empty() {
                line.push_str(&format!(", ca_file: {}", paths(&host.tls.ca_file)));
            }
            if let Some(cert) = &host.tls.client_cert {
                line.push_str(&format!(", client_cert {}", cert.display()));
            }
            lines.push(line);
        }
        for endpoint in &self.endpoints {
            let rate = endpoint.rate_per_second.unwrap_or(self.delivery.rate_per_second);
            lines.push(format!(
                "endpoint {}: rate_per_second {rate}{}",
                endpoint.key,
                fifo(endpoint.fifo)
            ));
        }
        lines
    }
}

pub(super) fn without_password(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        // Cannot fail: the URL already has a password, so it can have one.
        let _ = shown.set_password(Some("***"));
    }
    shown.to_string()
}

/// `scheme://host[:port]`, plus `/…` when there is more: alert URLs often carry their
/// credential in the path.
pub(super) fn origin_only(url: &Url) -> String {
    let origin = url.origin().ascii_serialization();
    if url.as_str().trim_end_matches('/').len() > origin.len() {
        format!("{origin}/…")
    } else {
        origin
    }
}

fn format_size(bytes: u64) -> String {
    for (unit, factor) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= factor && bytes.is_multiple_of(factor) {
            return format!("{}{unit}", bytes / factor);
        }
    }
    format!("{bytes}B")
}

fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// Target patterns as written, for `Debug` and the summary.
pub(super) fn patterns(targets: &[TargetPattern]) -> Vec<&str> {
    targets.iter().map(TargetPattern::as_str).collect()
}

/// `, targets [a, b]`, or nothing when unscoped.
fn targets(targets: &[TargetPattern]) -> String {
    if targets.is_empty() {
        return String::new();
    }
    format!(", targets [{}]", patterns(targets).join(", "))
}

/// `allowed_origins [..], hosts [..], idle_timeout ..` with `none` for an empty list.
fn access(origins: &[String], hosts: &[String], idle_timeout: std::time::Duration) -> String {
    let list = |items: &[String]| {
        if items.is_empty() {
            "none".to_string()
        } else {
            items.join(", ")
        }
    };
    format!(
        "allowed_origins {}, hosts {}, idle_timeout {}",
        list(origins),
        list(hosts),
        format_duration(idle_timeout)
    )
}

/// `, ordering fifo (on_dead skip)` for an ordered endpoint or route, else nothing.
fn fifo(on_dead: Option<crate::model::OnDead>) -> String {
    on_dead.map_or(String::new(), |d| format!(", ordering fifo (on_dead {})", d.as_str()))
}

/// Paths for the summary: `none`, or comma-separated.
fn paths(list: &[std::path::PathBuf]) -> String {
    if list.is_empty() {
        return "none".to_string();
    }
    list.iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
