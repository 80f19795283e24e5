//! The per-host in-flight cap: one semaphore per `host:port`, shared by every endpoint on
//! that host. The scheduler takes a permit *before* claiming a message, so a message is
//! never marked in flight while it waits for its host.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Hosts held before idle ones are forgotten.
const PRUNE_ABOVE: usize = 10_000;

/// Semaphores per host.
#[derive(Debug)]
pub struct HostLimiter {
    default_cap: u32,
    overrides: HashMap<String, u32>,
    hosts: Mutex<Hosts>,
}

#[derive(Debug)]
struct Hosts {
    map: HashMap<String, Arc<Semaphore>>,
    /// The size at which idle hosts are next forgotten: at least twice what the last prune
    /// kept, so a prune that frees little (every host busy) is not paid again per attempt.
    prune_at: usize,
}

impl HostLimiter {
    /// A limiter with `default_cap` permits per host and per-host overrides.
    pub fn new(default_cap: u32, overrides: HashMap<String, u32>) -> Self {
        HostLimiter {
            default_cap,
            overrides,
            hosts: Mutex::new(Hosts {
                map: HashMap::new(),
                prune_at: PRUNE_ABOVE,
            }),
        }
    }

    /// The cap for `host`.
    pub fn cap(&self, host: &str) -> u32 {
        self.overrides.get(host).copied().unwrap_or(self.default_cap)
    }

    /// A permit for one attempt to `host`, if one is free now.
    pub fn try_acquire(&self, host: &str) -> Option<OwnedSemaphorePermit> {
        let sem = {
            let mut hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
            if hosts.map.len() >= hosts.prune_at && !hosts.map.contains_key(host) {
                // Forget idle hosts so the map does not grow with every host ever seen (a
                // host with nothing in flight has nothing to remember).
                hosts.map.retain(|h, s| s.available_permits() < self.cap(h) as usize);
                hosts.prune_at = PRUNE_ABOVE.max(2 * hosts.map.len());
            }
            hosts
                .map
                .entry(host.to_string())
                .or_insert_with(|| Arc::new(Semaphore::new(self.cap(host) as usize)))
                .clone()
        };
        sem.try_acquire_owned().ok()
    }

    /// Hosts held now.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.hosts.lock().unwrap_or_else(|p| p.into_inner()).map.len()
    }

    /// Attempts in flight to `host` now.
    pub fn in_flight(&self, host: &str) -> u32 {
        let hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        hosts
            .map
            .get(host)
            .map_or(0, |s| self.cap(host) - s.available_permits() as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_are_capped_per_host_and_come_back_when_dropped() {
        let limiter = HostLimiter::new(2, HashMap::from([("big:443".to_string(), 3)]));
        let a = limiter.try_acquire("h:443").unwrap();
        let _b = limiter.try_acquire("h:443").unwrap();
        assert!(limiter.try_acquire("h:443").is_none());
        assert_eq!(limiter.in_flight("h:443"), 2);
        assert!(limiter.try_acquire("other:443").is_some(), "hosts are independent");
        drop(a);
        assert!(limiter.try_acquire("h:443").is_some());
        let held: Vec<_> = (0..3).map(|_| limiter.try_acquire("big:443").unwrap()).collect();
        assert!(limiter.try_acquire("big:443").is_none());
        assert_eq!(held.len(), 3);
    }

    #[test]
    fn idle_hosts_are_forgotten_and_busy_ones_kept() {
        let limiter = HostLimiter::new(1, HashMap::new());
        let busy = limiter.try_acquire("busy:443").unwrap();
        for i in 0..(3 * PRUNE_ABOVE) {
            drop(limiter.try_acquire(&format!("h{i}:443")));
            let held = limiter.hosts.lock().unwrap().map.len();
            assert!(held <= PRUNE_ABOVE, "bounded: {held}");
        }
        assert_eq!(limiter.in_flight("busy:443"), 1, "a busy host is remembered");
        assert!(limiter.try_acquire("busy:443").is_none());
        drop(busy);
        assert!(limiter.try_acquire("busy:443").is_some());
    }
}
