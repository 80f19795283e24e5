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
        let (body, ingress_token, admin_token) =
            (size(&self.max_body), set(&self.ingress_token), set(&self.admin_token));
        let alert = self.alert_url.as_ref().map_or_else(|| "unset".to_string(), origin_only);
        let [grace, retention, dead] = [&self.shutdown_grace, &self.retention, &self.dead_retention].map(dur);
        let ingress = pairs!(self.ingress; allowed_origins: list, hosts: list, idle_timeout: dur, send_timeout: dur, max_pending_bytes, allow_get);
        let admin_access = pairs!(self.admin; allowed_origins: list, hosts: list, idle_timeout: dur, send_timeout: dur);
        let unauthenticated = self.allow_unauthenticated_network;
        let retry = pairs!(r; base_delay: dur, max_delay: dur, jitter: |j: &Jitter| j.as_str(), max_attempts,
            max_attempts_404, give_up_after: dur, max_retry_after: dur);
        let steps = r.schedule.as_ref().map(|steps| list(steps.iter().map(dur)));
        let schedule = steps.map(|s| format!(", schedule [{s}]")).unwrap_or_default();
        let delivery = pairs!(d; connect_timeout: dur, request_timeout: dur, max_in_flight, max_in_flight_per_host,
            rate_per_second, pause_after_permanent_failures, max_response_body: size, idle_connection_timeout: dur,
            max_idle_connections);
        let circuit =
            pairs!(c; failures, probe_delay: dur, probe_max_delay: dur, statuses: |s: &Vec<u16>| format!("{s:?}"));
        let mut lines = vec![
            format!("listen {listen} (ingress{mode}), {admin} (admin){ops}; data_dir {data_dir}"),
            format!("max_body {body}; ingress_token {ingress_token}; admin_token {admin_token}; alert_url {alert}"),
            format!("shutdown_grace {grace}; retention {retention} (delivered), {dead} (dead)"),
            format!("ingress: {ingress}; admin: {admin_access}; allow_unauthenticated_network {unauthenticated}"),
            format!("retry: {retry}{schedule}"),
            format!("delivery: {delivery}"),
            match c.failures {
                0 => "circuit: off (failures 0)".to_string(),
                _ => format!("circuit: {circuit}"),
            },
            format!("log: format {}", self.log.format.as_str()),
            self.fleet.summary(),
            self.drain.summary(),
            self.intercept.summary(),
            self.store.summary(),
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
        let key = |name: &String, key: &super::SigningKey| {
            let (secrets, targets) = (count(key.secrets.len(), "secret"), targets(&key.targets));
            format!("{name} ({secrets}{targets})")
        };
        let keys = list(self.signing.keys.iter().map(|(name, k)| key(name, k)));
        let (scheme, secrets) = (self.signing.scheme.as_str(), self.signing.secrets.len());
        let secrets = count(secrets, "secret");
        let mut lines = vec![format!("signing: scheme {scheme}, {secrets} by default, keys: {keys}")];
        let public = self.ed25519_public_keys().into_iter();
        lines.extend(public.map(|e| format!("signing: {} is Ed25519, public key {}", e.source, e.public_key)));
        lines
    }

    /// The egress policy, the proxy and the TLS settings.
    fn egress_lines(&self) -> Vec<String> {
        let (e, tls) = (&self.egress, &self.tls);
        let private = if e.allow_private_targets { "allowed" } else { "refused" };
        let allow = list(&e.allow);
        let mut lines = vec![format!("egress: private targets {private}, allow: {allow}")];
        if let Some(proxy) = &e.proxy {
            let (proxy, no_proxy) = (proxy.describe(), list(&e.no_proxy));
            lines.push(format!("egress: proxy {proxy}, no_proxy: {no_proxy}"));
        }
        let (roots, min, cas) = (tls.roots.as_str(), tls.min_version.as_str(), paths(&tls.ca_file));
        lines.push(format!("tls: roots {roots}, min_version {min}, ca_file: {cas}"));
        lines
    }

    /// The `[[route]]`, `[[host]]` and `[[endpoint]]` sections, a line each.
    fn section_lines(&self) -> Vec<String> {
        let routes = self.routes.iter().map(|route| {
            let (name, url) = (&route.name, without_password(&route.url));
            let key = route.signing_key.as_deref().unwrap_or("default");
            let scheme = route.scheme.unwrap_or(self.signing.scheme).as_str();
            let (targets, fifo) = (targets(&route.targets), fifo(route.fifo));
            format!("route {name} -> {url} (signing key {key}, scheme {scheme}{targets}{fifo})")
        });
        let hosts = self.hosts.iter().map(|host| {
            let cap = host.max_in_flight.unwrap_or(self.delivery.max_in_flight_per_host);
            let mut line = format!("host {}: max_in_flight {cap}", host.host);
            if !host.tls.ca_file.is_empty() {
                line.push_str(&format!(", ca_file: {}", paths(&host.tls.ca_file)));
            }
            if let Some(cert) = &host.tls.client_cert {
                line.push_str(&format!(", client_cert {}", cert.display()));
            }
            line
        });
        let endpoints = self.endpoints.iter().map(|endpoint| {
            let rate = endpoint.rate_per_second.unwrap_or(self.delivery.rate_per_second);
            let (key, fifo) = (&endpoint.key, fifo(endpoint.fifo));
            format!("endpoint {key}: rate_per_second {rate}{fifo}")
        });
        routes.chain(hosts).chain(endpoints).collect()
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
