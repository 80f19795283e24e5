//! Prometheus metrics: the process's one registry, courier's families and the fleet's
//! (these only when `[fleet]` is on). Counters and histograms are plain atomics updated on
//! the hot path (no lock, no allocation); gauges that describe the store are computed at
//! scrape time from the store's counters and the first keys of its indexes, never from a scan.
//!
//! The text format (0.0.4) is written here rather than by `prometheus-client`: that crate
//! writes OpenMetrics, where a counter's HELP and TYPE name the family without `_total`
//! and the exposition ends in `# EOF`, so every counter's family would change its name for
//! a scraper of the 0.0.4 format, and the scrape-time gauges would need a collector of
//! their own; the format is a handful of `writeln!` lines. The tikv `prometheus` crate
//! writes 0.0.4 but leaves out a family without samples (the dashboard and alerts read
//! `courier_host_circuit_open` and `courier_ingress_rejected_total` by name on an idle
//! courier), sorts families and samples, and sums histograms in `f64`; a port to it saved
//! about 50 lines.

use std::collections::BTreeMap;
use std::fmt::{Display, Write as _};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use crate::model::{DeadReason, Transition};

/// The outcome labels of `courier_attempts_total`, by [`outcome`].
const OUTCOMES: [&str; 4] = ["delivered", "retry", "permanent", "egress_denied"];

/// How an attempt that left its message at `t` counts (the decision column of the
/// contract's table): by the class its status was ruled, so a 409 ruled success counts
/// delivered, and a retry given up on by the limits still counts as a retry.
fn outcome(t: Transition) -> usize {
    match t {
        Transition::Delivered => 0,
        Transition::Dead(DeadReason::PermanentStatus) => 2,
        Transition::Dead(DeadReason::EgressDenied) => 3,
        Transition::RetryAt(_) | Transition::Dead(_) => 1,
    }
}

/// What one fleet acquire decided (`courier_fleet_acquires_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetOutcome {
    /// A lease (and a rate slot) from Redis.
    Granted,
    /// The host is at its fleet-wide cap.
    HostBusy,
    /// The endpoint is at its fleet-wide `max_in_flight` cap.
    EndpointBusy,
    /// The endpoint's fleet-wide rate limit says wait.
    RateLimited,
    /// Redis unavailable: decided by the fallback limits.
    Fallback,
    /// The call to Redis failed (timed out, refused, an error reply); the fallback decided.
    Error,
}

impl FleetOutcome {
    /// The label values, in declaration order.
    const LABELS: [&'static str; 6] = [
        "granted",
        "host_busy",
        "endpoint_busy",
        "rate_limited",
        "fallback",
        "error",
    ];
}

// Each family as `"<name> <HELP>"`: the names are what dashboards, alert rules and the
// contract know; never rename one.

/// The counters without labels, by [`Count`]; the fleet's last (rendered with the fleet).
const COUNTS: [&str; 9] = [
    "courier_accepted_total Messages durably accepted.",
    "courier_duplicates_total Accepts answered as duplicates.",
    "courier_delivered_total Messages delivered.",
    "courier_handed_off_total Messages handed off to another courier (courier drain).",
    "courier_rate_limited_total Due messages held by an endpoint rate limit.",
    "courier_circuit_opened_total Times a host's circuit breaker opened.",
    "courier_endpoint_capped_total Due messages held by an endpoint's max_in_flight cap.",
    "courier_scheduler_passes_total Walks of the due queue (no walks while nothing is due: no polling).",
    "courier_fleet_leases_restored_total Leases of running attempts written back after Redis lost them.",
];
const ATTEMPTS: &str = "courier_attempts_total Delivery attempts by outcome.";
const DEAD: &str = "courier_dead_letters_total Messages dead-lettered by reason.";
const REJECTED: &str = "courier_ingress_rejected_total Ingress requests refused by error code.";
/// The gauges without labels, in the order `Metrics::render` reads them from [`Gauges`].
const GAUGES: [&str; 6] = [
    "courier_pending Messages waiting for an attempt.",
    "courier_in_flight Attempts in progress.",
    "courier_oldest_pending_seconds Age of the oldest undelivered message.",
    "courier_dead_letters Dead messages in the dead-letter store.",
    "courier_endpoints_paused Endpoints currently paused.",
    "courier_line_waiting Ordered messages waiting behind the head of their endpoint's line.",
];
const HOST_CIRCUIT_OPEN: &str = "courier_host_circuit_open Hosts whose circuit breaker is open or probing (1 each).";
const INGEST_SLOWED: &str =
    "courier_ingest_slowed 1 while accepts are slowed so that a delivery short of CPU keeps pace, else 0.";
const LATENCY: &str = "courier_delivery_latency_seconds Time from acceptance to delivery.";
const ATTEMPT_DURATION: &str = "courier_attempt_duration_seconds Duration of one delivery attempt.";
const REDIS_UP: &str =
    "courier_fleet_redis_up 1 while fleet-wide limits are in force, 0 while Redis is unavailable (fallback limits).";
const FLEET_ACQUIRES: &str = "courier_fleet_acquires_total Fleet lease and rate acquires by outcome.";
const TUNNELS_OPEN: &str = "courier_tunnels_open CONNECT tunnels open now, by kind ([intercept]).";
const TUNNELS: &str = "courier_tunnels_total CONNECT tunnels opened, by kind ([intercept]).";
const TUNNEL_TLS_FAILURES: &str =
    "courier_tunnel_tls_failures_total Intercepted tunnels whose client failed the TLS handshake (it does not trust the CA).";

/// The kinds of `CONNECT` tunnel, the `kind` label of the tunnel families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelKind {
    /// Terminated by courier: the requests inside are accepted.
    Intercept,
    /// Tunnelled byte for byte.
    Passthrough,
}

impl TunnelKind {
    const LABELS: [&'static str; 2] = ["intercept", "passthrough"];
}

/// The counters without labels: each one's index in [`COUNTS`] and `Metrics::counts`.
#[derive(Debug, Clone, Copy)]
enum Count {
    Accepted,
    Duplicates,
    Delivered,
    HandedOff,
    RateLimited,
    CircuitOpened,
    EndpointCapped,
    SchedulerPasses,
    FleetLeasesRestored,
}

const LATENCY_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 1800.0, 3600.0, 21600.0,
    86400.0,
];
const ATTEMPT_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A fixed-bucket histogram of seconds, recorded in microseconds.
#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    fn observe_micros(&self, micros: u64) {
        let secs = micros as f64 / 1e6;
        if let Some(i) = self.bounds.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_micros.fetch_add(micros, Relaxed);
    }

    fn render(&self, out: &mut String, spec: &str) {
        let name = head(out, "histogram", spec);
        let mut cumulative = 0;
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            cumulative += bucket.load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Relaxed);
        let sum = self.sum_micros.load(Relaxed) as f64 / 1e6;
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"+Inf\"}} {count}\n{name}_sum {sum}\n{name}_count {count}"
        );
    }
}

/// Writes the HELP and TYPE lines of the family `spec` (`"<name> <HELP>"`); returns its name.
fn head<'a>(out: &mut String, kind: &str, spec: &'a str) -> &'a str {
    let (name, help) = spec.split_once(' ').unwrap_or((spec, ""));
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    name
}

/// Writes the family `spec`, whose samples all carry `label` (none when it is empty).
fn family<'a, V: Display>(
    out: &mut String,
    kind: &str,
    spec: &str,
    label: &str,
    samples: impl IntoIterator<Item = (&'a str, V)>,
) {
    let name = head(out, kind, spec);
    for (value, n) in samples {
        let _ = match label {
            "" => writeln!(out, "{name} {n}"),
            _ => writeln!(out, "{name}{{{label}=\"{}\"}} {n}", label_value(value)),
        };
    }
}

/// A label value in the text format: backslash, double quote and newline escaped.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Values read at scrape time.
#[derive(Debug, Clone, Default)]
pub struct Gauges {
    /// Open messages not in flight.
    pub pending: u64,
    /// Attempts in progress.
    pub in_flight: u64,
    /// Age of the oldest open message, in seconds.
    pub oldest_pending_seconds: f64,
    /// Dead messages stored.
    pub dead_stored: u64,
    /// Paused endpoints.
    pub endpoints_paused: u64,
    /// Hosts whose circuit breaker is open or probing (`host:port`).
    pub circuit_open_hosts: Vec<String>,
    /// Ordered messages waiting behind their line's head.
    pub line_waiting: u64,
    /// Whether fleet-wide limits are in force (Redis usable); `None` without `[fleet]`,
    /// and then no fleet family is rendered.
    pub fleet_up: Option<bool>,
}

/// Every counter and histogram of the process, the fleet's included.
#[derive(Debug)]
pub struct Metrics {
    counts: [AtomicU64; 9],
    attempts: [AtomicU64; 4],
    dead: [AtomicU64; 4],
    fleet_acquires: [AtomicU64; 6],
    rejected: Mutex<BTreeMap<&'static str, u64>>,
    in_flight: AtomicI64,
    latency: Histogram,
    attempt_duration: Histogram,
    tunnels_open: [AtomicI64; 2],
    tunnels: [AtomicU64; 2],
    tunnel_tls_failures: AtomicU64,
    ingest_slowed: std::sync::atomic::AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            counts: Default::default(),
            attempts: Default::default(),
            dead: Default::default(),
            fleet_acquires: Default::default(),
            rejected: Default::default(),
            in_flight: AtomicI64::new(0),
            latency: Histogram::new(LATENCY_BOUNDS),
            attempt_duration: Histogram::new(ATTEMPT_BOUNDS),
            tunnels_open: Default::default(),
            tunnels: Default::default(),
            tunnel_tls_failures: AtomicU64::new(0),
            ingest_slowed: Default::default(),
        }
    }
}

impl Metrics {
    fn add(&self, c: Count, n: u64) {
        self.counts[c as usize].fetch_add(n, Relaxed);
    }

    fn get(&self, c: Count) -> u64 {
        self.counts[c as usize].load(Relaxed)
    }

    /// A message was accepted.
    pub fn accepted(&self) {
        self.add(Count::Accepted, 1);
    }

    /// An accept was a duplicate.
    pub fn duplicate(&self) {
        self.add(Count::Duplicates, 1);
    }

    /// An ingress request was refused with `code`.
    pub fn rejected(&self, code: &'static str) {
        *self
            .rejected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(code)
            .or_default() += 1;
    }

    /// A due message waited for its endpoint's rate limit.
    pub fn rate_limited(&self) {
        self.add(Count::RateLimited, 1);
    }

    /// A host's circuit breaker opened (or opened again after a failed probe).
    pub fn circuit_opened(&self) {
        self.add(Count::CircuitOpened, 1);
    }

    /// A due message waited for its endpoint's `max_in_flight` cap.
    pub fn endpoint_capped(&self) {
        self.add(Count::EndpointCapped, 1);
    }

    /// Times a due message waited for its endpoint's `max_in_flight` cap so far.
    #[cfg(test)]
    pub fn endpoint_capped_count(&self) -> u64 {
        self.get(Count::EndpointCapped)
    }

    /// The scheduler finished a walk of the due queue.
    pub fn scheduler_pass(&self) {
        self.add(Count::SchedulerPasses, 1);
    }

    /// Walks of the due queue so far.
    #[cfg(test)]
    pub fn scheduler_passes(&self) -> u64 {
        self.get(Count::SchedulerPasses)
    }

    /// An attempt started.
    pub fn attempt_started(&self) {
        self.in_flight.fetch_add(1, Relaxed);
    }

    /// An attempt ended after `micros`, leaving its message at `t`.
    pub fn attempt_finished(&self, t: Transition, micros: u64) {
        self.in_flight.fetch_sub(1, Relaxed);
        self.attempts[outcome(t)].fetch_add(1, Relaxed);
        self.attempt_duration.observe_micros(micros);
    }

    /// An attempt was abandoned without an outcome (courier's own failure or shutdown).
    pub fn attempt_abandoned(&self) {
        self.in_flight.fetch_sub(1, Relaxed);
    }

    /// A message was delivered `latency_micros` after acceptance.
    pub fn delivered(&self, latency_micros: u64) {
        self.add(Count::Delivered, 1);
        self.latency.observe_micros(latency_micros);
    }

    /// A message was dead-lettered.
    pub fn dead(&self, reason: DeadReason) {
        let i = DeadReason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        self.dead[i].fetch_add(1, Relaxed);
    }

    /// A message was handed off to another courier (the peer answered 202).
    pub fn handed_off(&self) {
        self.add(Count::HandedOff, 1);
    }

    /// Attempts in progress now.
    #[cfg(test)]
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Relaxed).max(0) as u64
    }

    /// One fleet acquire decided `outcome`.
    pub fn fleet_acquired(&self, outcome: FleetOutcome) {
        self.fleet_acquires[outcome as usize].fetch_add(1, Relaxed);
    }

    /// `n` leases of running attempts were written back after Redis lost them.
    pub fn fleet_restored(&self, n: u64) {
        self.add(Count::FleetLeasesRestored, n);
    }

    /// A tunnel of `kind` opened (`true`) or closed (`false`).
    pub fn tunnel(&self, kind: TunnelKind, opened: bool) {
        let i = kind as usize;
        if opened {
            self.tunnels[i].fetch_add(1, Relaxed);
            self.tunnels_open[i].fetch_add(1, Relaxed);
        } else {
            self.tunnels_open[i].fetch_sub(1, Relaxed);
        }
    }

    /// Accepts are slowed so that delivery keeps pace (`delivery::pace`), or no longer.
    pub fn ingest_slowed(&self, slowed: bool) {
        self.ingest_slowed.store(slowed, Relaxed);
    }

    /// An intercepted tunnel's client failed the TLS handshake.
    pub fn tunnel_tls_failed(&self) {
        self.tunnel_tls_failures.fetch_add(1, Relaxed);
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self, g: &Gauges) -> String {
        let mut text = String::with_capacity(4096);
        let out = &mut text;
        let load = |c: &AtomicU64| c.load(Relaxed);
        for (spec, n) in COUNTS
            .iter()
            .zip(&self.counts)
            .take(Count::FleetLeasesRestored as usize)
        {
            family(out, "counter", spec, "", [("", load(n))]);
        }
        let attempts = OUTCOMES.into_iter().zip(self.attempts.iter().map(load));
        family(out, "counter", ATTEMPTS, "outcome", attempts);
        let reasons = DeadReason::ALL.map(DeadReason::as_str).into_iter();
        family(out, "counter", DEAD, "reason", reasons.zip(self.dead.iter().map(load)));
        let rejected = self.rejected.lock().unwrap_or_else(|p| p.into_inner()).clone();
        family(out, "counter", REJECTED, "code", rejected);
        let gauges = [
            g.pending.to_string(),
            g.in_flight.to_string(),
            format!("{:.3}", g.oldest_pending_seconds),
            g.dead_stored.to_string(),
            g.endpoints_paused.to_string(),
            g.line_waiting.to_string(),
        ];
        for (spec, value) in GAUGES.iter().zip(gauges) {
            family(out, "gauge", spec, "", [("", value)]);
        }
        let hosts = g.circuit_open_hosts.iter().map(|h| (h.as_str(), 1));
        family(out, "gauge", HOST_CIRCUIT_OPEN, "host", hosts);
        let slowed = u8::from(self.ingest_slowed.load(Relaxed));
        family(out, "gauge", INGEST_SLOWED, "", [("", slowed)]);
        self.latency.render(out, LATENCY);
        self.attempt_duration.render(out, ATTEMPT_DURATION);
        let open = self.tunnels_open.iter().map(|n| n.load(Relaxed).max(0));
        family(
            out,
            "gauge",
            TUNNELS_OPEN,
            "kind",
            TunnelKind::LABELS.into_iter().zip(open),
        );
        let opened = self.tunnels.iter().map(load);
        family(
            out,
            "counter",
            TUNNELS,
            "kind",
            TunnelKind::LABELS.into_iter().zip(opened),
        );
        family(
            out,
            "counter",
            TUNNEL_TLS_FAILURES,
            "",
            [("", load(&self.tunnel_tls_failures))],
        );
        if let Some(up) = g.fleet_up {
            family(out, "gauge", REDIS_UP, "", [("", u8::from(up))]);
            let acquires = FleetOutcome::LABELS
                .into_iter()
                .zip(self.fleet_acquires.iter().map(load));
            family(out, "counter", FLEET_ACQUIRES, "outcome", acquires);
            let restored = self.get(Count::FleetLeasesRestored);
            family(
                out,
                "counter",
                COUNTS[Count::FleetLeasesRestored as usize],
                "",
                [("", restored)],
            );
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_every_family_with_help_and_type() {
        let m = Metrics::default();
        m.accepted();
        m.attempt_started();
        m.attempt_finished(Transition::RetryAt(0), 1500);
        m.dead(DeadReason::Expired);
        m.delivered(2_000_000);
        m.rejected("invalid_target");
        let gauges = Gauges {
            pending: 3,
            circuit_open_hosts: vec!["down.example:443".into()],
            ..Default::default()
        };
        let text = m.render(&gauges);
        let specs = COUNTS[..8].iter().chain(&GAUGES);
        let specs = specs.chain(&[ATTEMPTS, DEAD, REJECTED, HOST_CIRCUIT_OPEN, LATENCY, ATTEMPT_DURATION]);
        let specs = specs.chain(&[INGEST_SLOWED]);
        let specs = specs.chain(&[TUNNELS_OPEN, TUNNELS, TUNNEL_TLS_FAILURES]);
        for name in specs.map(|spec| spec.split_once(' ').unwrap().0) {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
        }
        assert!(!text.contains("courier_fleet_"), "no fleet families without [fleet]");
        assert!(text.contains("courier_accepted_total 1\n"));
        assert!(text.contains("courier_attempts_total{outcome=\"retry\"} 1\n"));
        assert!(text.contains("courier_dead_letters_total{reason=\"expired\"} 1\n"));
        assert!(text.contains("courier_pending 3\n"));
        assert!(text.contains("courier_host_circuit_open{host=\"down.example:443\"} 1\n"));
        assert!(text.contains("courier_delivery_latency_seconds_bucket{le=\"5\"} 1\n"));
        assert!(text.contains("courier_delivery_latency_seconds_bucket{le=\"1\"} 0\n"));
        assert!(text.contains("courier_attempt_duration_seconds_count 1\n"));
        assert!(text.contains("courier_ingress_rejected_total{code=\"invalid_target\"} 1\n"));
        assert_eq!(m.in_flight(), 0);
        m.tunnel(TunnelKind::Passthrough, true);
        m.tunnel(TunnelKind::Intercept, true);
        m.tunnel(TunnelKind::Intercept, false);
        m.tunnel_tls_failed();
        let text = m.render(&gauges);
        assert!(text.contains("courier_tunnels_open{kind=\"intercept\"} 0\n"));
        assert!(text.contains("courier_tunnels_open{kind=\"passthrough\"} 1\n"));
        assert!(text.contains("courier_tunnels_total{kind=\"intercept\"} 1\n"));
        assert!(text.contains("courier_tunnel_tls_failures_total 1\n"));
        assert!(text.contains("courier_ingest_slowed 0\n"));
        m.ingest_slowed(true);
        assert!(m.render(&gauges).contains("courier_ingest_slowed 1\n"));
    }

    #[test]
    fn an_attempt_counts_by_where_it_left_its_message() {
        let m = Metrics::default();
        for t in [
            Transition::Delivered,
            Transition::RetryAt(1),
            Transition::Dead(DeadReason::MaxAttempts),
            Transition::Dead(DeadReason::Expired),
            Transition::Dead(DeadReason::PermanentStatus),
            Transition::Dead(DeadReason::EgressDenied),
        ] {
            m.attempt_started();
            m.attempt_finished(t, 1);
        }
        let text = m.render(&Gauges::default());
        for (label, n) in [("delivered", 1), ("retry", 3), ("permanent", 1), ("egress_denied", 1)] {
            assert!(
                text.contains(&format!("courier_attempts_total{{outcome=\"{label}\"}} {n}\n")),
                "{label}"
            );
        }
    }

    #[test]
    fn fleet_families_render_with_help_and_type_when_the_fleet_is_on() {
        let m = Metrics::default();
        m.fleet_acquired(FleetOutcome::Granted);
        m.fleet_acquired(FleetOutcome::Granted);
        m.fleet_acquired(FleetOutcome::Error);
        m.fleet_restored(3);
        let out = m.render(&Gauges {
            fleet_up: Some(false),
            ..Default::default()
        });
        for name in [
            "courier_fleet_redis_up",
            "courier_fleet_acquires_total",
            "courier_fleet_leases_restored_total",
        ] {
            assert!(out.contains(&format!("# TYPE {name} ")), "{name}: {out}");
        }
        assert!(out.contains("courier_fleet_redis_up 0\n"));
        assert!(out.contains("courier_fleet_acquires_total{outcome=\"granted\"} 2\n"));
        assert!(out.contains("courier_fleet_acquires_total{outcome=\"error\"} 1\n"));
        assert!(out.contains("courier_fleet_acquires_total{outcome=\"host_busy\"} 0\n"));
        assert!(out.contains("courier_fleet_leases_restored_total 3\n"));
    }
}
