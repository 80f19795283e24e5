//! Prometheus metrics. Counters and histograms are plain atomics updated on the hot path
//! (no lock, no allocation); gauges that describe the store are computed at scrape time
//! from the store's counters and the first keys of its indexes, never from a scan.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::model::DeadReason;

/// `courier_accepted_total`: messages durably accepted.
pub const ACCEPTED_TOTAL: &str = "courier_accepted_total";
/// `courier_duplicates_total`: accepts answered as duplicates (nothing stored).
pub const DUPLICATES_TOTAL: &str = "courier_duplicates_total";
/// `courier_attempts_total{outcome}`: delivery attempts by outcome.
pub const ATTEMPTS_TOTAL: &str = "courier_attempts_total";
/// `courier_delivered_total`: messages delivered.
pub const DELIVERED_TOTAL: &str = "courier_delivered_total";
/// `courier_dead_letters_total{reason}`: messages dead-lettered, by reason.
pub const DEAD_LETTERS_TOTAL: &str = "courier_dead_letters_total";
/// `courier_handed_off_total`: messages handed off to another courier by `courier drain`.
pub const HANDED_OFF_TOTAL: &str = "courier_handed_off_total";
/// `courier_rate_limited_total`: times a due message waited for its endpoint's rate limit.
pub const RATE_LIMITED_TOTAL: &str = "courier_rate_limited_total";
/// `courier_circuit_opened_total`: times a host's circuit breaker opened (or opened again
/// after a failed probe).
pub const CIRCUIT_OPENED_TOTAL: &str = "courier_circuit_opened_total";
/// `courier_host_circuit_open{host}`: 1 for each host whose breaker is open or probing.
pub const HOST_CIRCUIT_OPEN: &str = "courier_host_circuit_open";
/// `courier_endpoint_capped_total`: times a due message waited for its endpoint's
/// `max_in_flight` cap.
pub const ENDPOINT_CAPPED_TOTAL: &str = "courier_endpoint_capped_total";
/// `courier_scheduler_passes_total`: walks of the due queue (each after a wake-up or a due time).
pub const SCHEDULER_PASSES_TOTAL: &str = "courier_scheduler_passes_total";
/// `courier_ingress_rejected_total{code}`: ingress requests refused, by error code.
pub const INGRESS_REJECTED_TOTAL: &str = "courier_ingress_rejected_total";
/// `courier_pending`: messages waiting for an attempt.
pub const PENDING: &str = "courier_pending";
/// `courier_in_flight`: attempts in progress.
pub const IN_FLIGHT: &str = "courier_in_flight";
/// `courier_oldest_pending_seconds`: age of the oldest undelivered message.
pub const OLDEST_PENDING_SECONDS: &str = "courier_oldest_pending_seconds";
/// `courier_dead_letters`: dead messages currently stored.
pub const DEAD_STORED: &str = "courier_dead_letters";
/// `courier_endpoints_paused`: endpoints currently paused.
pub const ENDPOINTS_PAUSED: &str = "courier_endpoints_paused";
/// `courier_line_waiting`: ordered messages waiting behind the head of their endpoint's line.
pub const LINE_WAITING: &str = "courier_line_waiting";
/// `courier_delivery_latency_seconds`: acceptance to delivery.
pub const DELIVERY_LATENCY_SECONDS: &str = "courier_delivery_latency_seconds";
/// `courier_attempt_duration_seconds`: one attempt, start to answer.
pub const ATTEMPT_DURATION_SECONDS: &str = "courier_attempt_duration_seconds";

/// The outcome label of one attempt (the decision column of the contract's table).
pub use crate::policy::Outcome as AttemptOutcome;

const LATENCY_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 1800.0, 3600.0, 21600.0,
    86400.0,
];
const ATTEMPT_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A fixed-bucket histogram of seconds, recorded in microseconds.
#[derive(Debug)]
pub struct Histogram {
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

    /// Records one observation.
    pub fn observe_micros(&self, micros: u64) {
        let secs = micros as f64 / 1e6;
        if let Some(i) = self.bounds.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str) {
        let mut cumulative = 0;
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// Writes one counter family with a single label.
fn labelled_counter<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    label: &str,
    samples: impl IntoIterator<Item = (&'a str, u64)>,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for (value, n) in samples {
        let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {n}");
    }
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
}

/// Every counter and histogram of the process.
#[derive(Debug)]
pub struct Metrics {
    accepted: AtomicU64,
    duplicates: AtomicU64,
    attempts: [AtomicU64; 4],
    delivered: AtomicU64,
    dead: [AtomicU64; 4],
    handed_off: AtomicU64,
    rate_limited: AtomicU64,
    circuit_opened: AtomicU64,
    endpoint_capped: AtomicU64,
    scheduler_passes: AtomicU64,
    rejected: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    in_flight: AtomicI64,
    latency: Histogram,
    attempt_duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            accepted: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            attempts: Default::default(),
            delivered: AtomicU64::new(0),
            dead: Default::default(),
            handed_off: AtomicU64::new(0),
            rate_limited: AtomicU64::new(0),
            circuit_opened: AtomicU64::new(0),
            endpoint_capped: AtomicU64::new(0),
            scheduler_passes: AtomicU64::new(0),
            rejected: Default::default(),
            in_flight: AtomicI64::new(0),
            latency: Histogram::new(LATENCY_BOUNDS),
            attempt_duration: Histogram::new(ATTEMPT_BOUNDS),
        }
    }
}

fn reason_index(r: DeadReason) -> usize {
    DeadReason::ALL.iter().position(|x| *x == r).unwrap_or(0)
}

impl Metrics {
    /// A message was accepted.
    pub fn accepted(&self) {
        self.accepted.fetch_add(1, Ordering::Relaxed);
    }

    /// An accept was a duplicate.
    pub fn duplicate(&self) {
        self.duplicates.fetch_add(1, Ordering::Relaxed);
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
        self.rate_limited.fetch_add(1, Ordering::Relaxed);
    }

    /// A host's circuit breaker opened.
    pub fn circuit_opened(&self) {
        self.circuit_opened.fetch_add(1, Ordering::Relaxed);
    }

    /// A due message waited for its endpoint's `max_in_flight` cap.
    pub fn endpoint_capped(&self) {
        self.endpoint_capped.fetch_add(1, Ordering::Relaxed);
    }

    /// Times a due message waited for its endpoint's `max_in_flight` cap so far.
    #[cfg(test)]
    pub fn endpoint_capped_count(&self) -> u64 {
        self.endpoint_capped.load(Ordering::Relaxed)
    }

    /// The scheduler finished a walk of the due queue.
    pub fn scheduler_pass(&self) {
        self.scheduler_passes.fetch_add(1, Ordering::Relaxed);
    }

    /// Walks of the due queue so far.
    pub fn scheduler_passes(&self) -> u64 {
        self.scheduler_passes.load(Ordering::Relaxed)
    }

    /// An attempt started.
    pub fn attempt_started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// An attempt ended with `outcome` after `micros`.
    pub fn attempt_finished(&self, outcome: AttemptOutcome, micros: u64) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        let i = AttemptOutcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        self.attempts[i].fetch_add(1, Ordering::Relaxed);
        self.attempt_duration.observe_micros(micros);
    }

    /// An attempt was abandoned without an outcome (courier's own failure or shutdown).
    pub fn attempt_abandoned(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// A message was delivered `latency_micros` after acceptance.
    pub fn delivered(&self, latency_micros: u64) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
        self.latency.observe_micros(latency_micros);
    }

    /// A message was dead-lettered.
    pub fn dead(&self, reason: DeadReason) {
        self.dead[reason_index(reason)].fetch_add(1, Ordering::Relaxed);
    }

    /// A message was handed off to another courier (the peer answered 202).
    pub fn handed_off(&self) {
        self.handed_off.fetch_add(1, Ordering::Relaxed);
    }

    /// Attempts in progress now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed).max(0) as u64
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self, g: &Gauges) -> String {
        let mut out = String::with_capacity(4096);
        let mut counter = |name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        };
        counter(
            ACCEPTED_TOTAL,
            "Messages durably accepted.",
            self.accepted.load(Ordering::Relaxed),
        );
        counter(
            DUPLICATES_TOTAL,
            "Accepts answered as duplicates.",
            self.duplicates.load(Ordering::Relaxed),
        );
        counter(
            DELIVERED_TOTAL,
            "Messages delivered.",
            self.delivered.load(Ordering::Relaxed),
        );
        counter(
            HANDED_OFF_TOTAL,
            "Messages handed off to another courier (courier drain).",
            self.handed_off.load(Ordering::Relaxed),
        );
        counter(
            RATE_LIMITED_TOTAL,
            "Due messages held by an endpoint rate limit.",
            self.rate_limited.load(Ordering::Relaxed),
        );
        counter(
            CIRCUIT_OPENED_TOTAL,
            "Times a host's circuit breaker opened.",
            self.circuit_opened.load(Ordering::Relaxed),
        );
        counter(
            ENDPOINT_CAPPED_TOTAL,
            "Due messages held by an endpoint's max_in_flight cap.",
            self.endpoint_capped.load(Ordering::Relaxed),
        );
        counter(
            SCHEDULER_PASSES_TOTAL,
            "Walks of the due queue (no walks while nothing is due: no polling).",
            self.scheduler_passes.load(Ordering::Relaxed),
        );

        let attempts = AttemptOutcome::ALL
            .iter()
            .zip(&self.attempts)
            .map(|(o, v)| (o.as_str(), v.load(Ordering::Relaxed)));
        labelled_counter(
            &mut out,
            ATTEMPTS_TOTAL,
            "Delivery attempts by outcome.",
            "outcome",
            attempts,
        );
        let dead = DeadReason::ALL
            .iter()
            .zip(&self.dead)
            .map(|(r, v)| (r.as_str(), v.load(Ordering::Relaxed)));
        labelled_counter(
            &mut out,
            DEAD_LETTERS_TOTAL,
            "Messages dead-lettered by reason.",
            "reason",
            dead,
        );
        let rejected: Vec<(&str, u64)> = self
            .rejected
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(c, n)| (*c, *n))
            .collect();
        labelled_counter(
            &mut out,
            INGRESS_REJECTED_TOTAL,
            "Ingress requests refused by error code.",
            "code",
            rejected,
        );

        let mut gauge = |name: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
        };
        gauge(PENDING, "Messages waiting for an attempt.", g.pending.to_string());
        gauge(IN_FLIGHT, "Attempts in progress.", g.in_flight.to_string());
        gauge(
            OLDEST_PENDING_SECONDS,
            "Age of the oldest undelivered message.",
            format!("{:.3}", g.oldest_pending_seconds),
        );
        gauge(
            DEAD_STORED,
            "Dead messages in the dead-letter store.",
            g.dead_stored.to_string(),
        );
        gauge(
            ENDPOINTS_PAUSED,
            "Endpoints currently paused.",
            g.endpoints_paused.to_string(),
        );
        gauge(
            LINE_WAITING,
            "Ordered messages waiting behind the head of their endpoint's line.",
            g.line_waiting.to_string(),
        );
        let _ = writeln!(
            out,
            "# HELP {HOST_CIRCUIT_OPEN} Hosts whose circuit breaker is open or probing (1 each).\n# TYPE {HOST_CIRCUIT_OPEN} gauge"
        );
        for host in &g.circuit_open_hosts {
            let _ = writeln!(out, "{HOST_CIRCUIT_OPEN}{{host=\"{}\"}} 1", label_value(host));
        }

        let _ = writeln!(
            out,
            "# HELP {DELIVERY_LATENCY_SECONDS} Time from acceptance to delivery.\n# TYPE {DELIVERY_LATENCY_SECONDS} histogram"
        );
        self.latency.render(&mut out, DELIVERY_LATENCY_SECONDS);
        let _ = writeln!(
            out,
            "# HELP {ATTEMPT_DURATION_SECONDS} Duration of one delivery attempt.\n# TYPE {ATTEMPT_DURATION_SECONDS} histogram"
        );
        self.attempt_duration.render(&mut out, ATTEMPT_DURATION_SECONDS);
        out
    }
}

/// A label value in the text format: backslash, double quote and newline escaped.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_every_family_with_help_and_type() {
        let m = Metrics::default();
        m.accepted();
        m.attempt_started();
        m.attempt_finished(AttemptOutcome::Retry, 1500);
        m.dead(DeadReason::Expired);
        m.delivered(2_000_000);
        m.rejected("invalid_target");
        let text = m.render(&Gauges {
            pending: 3,
            circuit_open_hosts: vec!["down.example:443".into()],
            ..Default::default()
        });
        for name in [
            ACCEPTED_TOTAL,
            ATTEMPTS_TOTAL,
            ENDPOINT_CAPPED_TOTAL,
            DELIVERED_TOTAL,
            DEAD_LETTERS_TOTAL,
            PENDING,
            IN_FLIGHT,
            OLDEST_PENDING_SECONDS,
            ENDPOINTS_PAUSED,
            HOST_CIRCUIT_OPEN,
            CIRCUIT_OPENED_TOTAL,
            LINE_WAITING,
            DELIVERY_LATENCY_SECONDS,
            ATTEMPT_DURATION_SECONDS,
        ] {
            assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
        }
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
    }
}
