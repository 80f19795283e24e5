//! [`Config::summary`] (for `courier check-config`) and the redacting formatters it shares
//! with the `Debug` impls: URLs without passwords, alert URLs as their origin only. Also
//! [`Config::ed25519_public_keys`], the public half of every `whsk_` key, which is not a
//! secret and is shown by `check-config` and the admin API.

use std::fmt;
use std::time::Duration;

use url::Url;

use super::units::format_duration;
use super::Config;
use crate::model::Jitter;
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
        let named = self.signing.keys.iter().map(|(name, key)| (Some(name), &key.secrets));
        let mut out = Vec::new();
        for (key, secrets) in std::iter::once((None, &self.signing.secrets)).chain(named) {
            for (i, secret) in secrets.iter().enumerate() {
                if let Some(public_key) = crate::signing::ed25519::public_key(secret.expose()) {
                    let source = match key {
                        Some(name) => format!("signing.keys.{name}[{i}]"),
                        None => format!("signing.secrets[{i}]"),
                    };
                    out.push(PublicKeyEntry {
                        source,
                        key: key.cloned(),
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
        let (r, d, c) = (&self.retry, &self.delivery, &self.circuit);
        let mode = match self.listen {
            super::ListenAddr::Unix(_) => format!(", mode {:04o}", self.listen_mode),
            super::ListenAddr::Tcp(_) => String::new(),
        };
        let ops = self.ops_listen.map(|ops| format!(", {ops} (ops)")).unwrap_or_default();
        let (listen, admin, data_dir) = (&self.listen, self.admin_listen, self.data_dir.display());
        let mut lines = vec![
            format!("listen {listen} (ingress{mode}), {admin} (admin){ops}; data_dir {data_dir}"),
            format!(
                "max_body {}; ingress_token {}; admin_token {}; alert_url {}",
                size(&self.max_body),
                set(&self.ingress_token),
                set(&self.admin_token),
                self.alert_url.as_ref().map_or_else(|| "unset".to_string(), origin_only)
            ),
            format!(
                "shutdown_grace {}; retention {} (delivered), {} (dead)",
                dur(&self.shutdown_grace),
                dur(&self.retention),
                dur(&self.dead_retention)
            ),
            format!(
                "ingress: {}; admin: {}; allow_unauthenticated_network {}",
                pairs!(self.ingress; allowed_origins: list, hosts: list, idle_timeout: dur, max_pending_bytes, allow_get),
                pairs!(self.admin; allowed_origins: list, hosts: list, idle_timeout: dur),
                self.allow_unauthenticated_network
            ),
            format!(
                "retry: {}{}",
                pairs!(r; base_delay: dur, max_delay: dur, jitter: |j: &Jitter| j.as_str(), max_attempts,
                    max_attempts_404, give_up_after: dur, max_retry_after: dur),
                r.schedule.as_ref().map_or(String::new(), |steps| format!(
                    ", schedule [{}]",
                    list(steps.iter().map(dur))
                ))
            ),
            format!(
                "delivery: {}",
                pairs!(d; connect_timeout: dur, request_timeout: dur, max_in_flight, max_in_flight_per_host,
                    rate_per_second, pause_after_permanent_failures, max_response_body: size,
                    idle_connection_timeout: dur, max_idle_connections)
            ),
            match c.failures {
                0 => "circuit: off (failures 0)".to_string(),
                _ => format!(
                    "circuit: {}",
                    pairs!(c; failures, probe_delay: dur, probe_max_delay: dur, statuses: |s: &Vec<u16>| format!("{s:?}"))
                ),
            },
            format!("log: format {}", self.log.format.as_str()),
            self.fleet.summary(),
            self.drain.summary(),
        ];
        lines.extend(self.signing_lines());
        lines.extend(self.egress_lines());
        lines.extend(self.section_lines());
        // The policy each section ends up with, every inherited value filled in.
        lines.extend(self.policy_lines());
        lines.join("\n")
    }

    /// The signing scheme, secrets and named keys (counted, never shown), and the public
    /// half of each Ed25519 key (not a secret: the whsk_ values themselves are never shown).
    fn signing_lines(&self) -> Vec<String> {
        let keys = self.signing.keys.iter().map(|(name, key)| {
            format!(
                "{name} ({}{})",
                count(key.secrets.len(), "secret"),
                targets(&key.targets)
            )
        });
        let mut lines = vec![format!(
            "signing: scheme {}, {} by default, keys: {}",
            self.signing.scheme.as_str(),
            count(self.signing.secrets.len(), "secret"),
            list(keys)
        )];
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
        let egress = &self.egress;
        let private = if egress.allow_private_targets {
            "allowed"
        } else {
            "refused"
        };
        let mut lines = vec![format!(
            "egress: private targets {private}, allow: {}",
            list(&egress.allow)
        )];
        if let Some(proxy) = &egress.proxy {
            lines.push(format!(
                "egress: proxy {}, no_proxy: {}",
                proxy.describe(),
                list(&egress.no_proxy)
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

pub(super) fn dur(d: &Duration) -> String {
    format_duration(*d)
}

fn size(bytes: &u64) -> String {
    for (unit, factor) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if *bytes >= factor && bytes.is_multiple_of(factor) {
            return format!("{}{unit}", bytes / factor);
        }
    }
    format!("{bytes}B")
}

/// `set` or `unset`: a secret is never shown.
pub(super) fn set(secret: &Option<Secret>) -> &'static str {
    secret.as_ref().map_or("unset", |_| "set")
}

/// The items, comma-separated, or `none`.
pub(super) fn list<T: fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let items: Vec<String> = items.into_iter().map(|item| item.to_string()).collect();
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

fn paths(paths: &[std::path::PathBuf]) -> String {
    list(paths.iter().map(|p| p.display()))
}

fn count(n: usize, what: &str) -> String {
    let plural = if n == 1 { "" } else { "s" };
    format!("{n} {what}{plural}")
}

/// Target patterns as written, for `Debug` and the summary.
pub(super) fn patterns(targets: &[TargetPattern]) -> Vec<&str> {
    targets.iter().map(TargetPattern::as_str).collect()
}

/// `, targets [a, b]`, or nothing when unscoped.
fn targets(targets: &[TargetPattern]) -> String {
    let shown = (!targets.is_empty()).then(|| format!(", targets [{}]", patterns(targets).join(", ")));
    shown.unwrap_or_default()
}

/// `, ordering fifo (on_dead skip)` for an ordered endpoint or route, else nothing.
fn fifo(on_dead: Option<crate::model::OnDead>) -> String {
    on_dead.map_or(String::new(), |d| format!(", ordering fifo (on_dead {})", d.as_str()))
}
