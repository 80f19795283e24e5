//! The fleet's metrics, rendered after courier's own on `/metrics` (only when `[fleet]` is
//! on): whether Redis is usable, and what each acquire decided.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// `courier_fleet_redis_up`: 1 while fleet-wide limits are in force, 0 while Redis is
/// unavailable and the fallback limits apply.
pub const REDIS_UP: &str = "courier_fleet_redis_up";
/// `courier_fleet_acquires_total{outcome}`: fleet lease and rate acquires, by outcome.
pub const ACQUIRES_TOTAL: &str = "courier_fleet_acquires_total";
/// `courier_fleet_leases_restored_total`: leases of running attempts written back to Redis
/// after it lost them (a Redis restart, or a lease that expired while Redis was unreachable).
pub const LEASES_RESTORED_TOTAL: &str = "courier_fleet_leases_restored_total";

/// What one acquire decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
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

impl Outcome {
    const ALL: [Outcome; 6] = [
        Outcome::Granted,
        Outcome::HostBusy,
        Outcome::EndpointBusy,
        Outcome::RateLimited,
        Outcome::Fallback,
        Outcome::Error,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Granted => "granted",
            Outcome::HostBusy => "host_busy",
            Outcome::EndpointBusy => "endpoint_busy",
            Outcome::RateLimited => "rate_limited",
            Outcome::Fallback => "fallback",
            Outcome::Error => "error",
        }
    }
}

/// The fleet's counters.
#[derive(Debug, Default)]
pub struct FleetMetrics {
    acquires: [AtomicU64; 6],
    restored: AtomicU64,
}

impl FleetMetrics {
    /// Counts one acquire.
    pub fn acquired(&self, outcome: Outcome) {
        let i = Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        self.acquires[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts leases written back after Redis lost them.
    pub fn restored(&self, n: u64) {
        self.restored.fetch_add(n, Ordering::Relaxed);
    }

    /// Acquires with `outcome` so far.
    pub fn count(&self, outcome: Outcome) -> u64 {
        let i = Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        self.acquires[i].load(Ordering::Relaxed)
    }

    /// Appends the families to a Prometheus text exposition.
    pub fn render(&self, out: &mut String, up: bool) {
        let _ = writeln!(
            out,
            "# HELP {REDIS_UP} 1 while fleet-wide limits are in force, 0 while Redis is unavailable (fallback limits).\n# TYPE {REDIS_UP} gauge\n{REDIS_UP} {}",
            u8::from(up)
        );
        let _ = writeln!(
            out,
            "# HELP {ACQUIRES_TOTAL} Fleet lease and rate acquires by outcome.\n# TYPE {ACQUIRES_TOTAL} counter"
        );
        for (outcome, n) in Outcome::ALL.iter().zip(&self.acquires) {
            let _ = writeln!(
                out,
                "{ACQUIRES_TOTAL}{{outcome=\"{}\"}} {}",
                outcome.as_str(),
                n.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP {LEASES_RESTORED_TOTAL} Leases of running attempts written back after Redis lost them.\n# TYPE {LEASES_RESTORED_TOTAL} counter\n{LEASES_RESTORED_TOTAL} {}",
            self.restored.load(Ordering::Relaxed)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_renders_with_help_and_type() {
        let m = FleetMetrics::default();
        m.acquired(Outcome::Granted);
        m.acquired(Outcome::Granted);
        m.acquired(Outcome::Error);
        m.restored(3);
        let mut out = String::new();
        m.render(&mut out, false);
        for name in [REDIS_UP, ACQUIRES_TOTAL, LEASES_RESTORED_TOTAL] {
            assert!(out.contains(&format!("# TYPE {name} ")), "{name}: {out}");
        }
        assert!(out.contains("courier_fleet_redis_up 0\n"));
        assert!(out.contains("courier_fleet_acquires_total{outcome=\"granted\"} 2\n"));
        assert!(out.contains("courier_fleet_acquires_total{outcome=\"error\"} 1\n"));
        assert!(out.contains("courier_fleet_acquires_total{outcome=\"host_busy\"} 0\n"));
        assert!(out.contains("courier_fleet_leases_restored_total 3\n"));
        assert_eq!(m.count(Outcome::Granted), 2);
    }
}
