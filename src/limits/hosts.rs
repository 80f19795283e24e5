//! The per-host in-flight cap and circuit breaker: one semaphore and one
//! [`Circuit`] per `host:port`, shared by every endpoint on that host. The scheduler takes
//! a permit *before* leasing a message from the queue. (A new message held back by its
//! host's cap alone is written in flight at its accept and waits in memory for a permit:
//! `delivery::waiting`.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedSemaphorePermit;

use super::resizable::Resizable;
use super::Refusal;
use crate::policy::circuit::{Admit, Circuit, CircuitChange, CircuitSettings, CircuitState, HostOutcome};

/// Hosts held before idle ones are forgotten.
const PRUNE_ABOVE: usize = 10_000;

/// Semaphores and breakers per host.
#[derive(Debug)]
pub struct HostLimiter {
    hosts: Arc<Mutex<Hosts>>,
}

/// A permit for one attempt to a host. Dropped while it is still its host's probe (no
/// outcome moved the breaker on: the attempt never ran, or said nothing about the host),
/// it lets the next probe go at once.
#[derive(Debug)]
pub struct HostPermit {
    _permit: OwnedSemaphorePermit,
    probe: Option<(Arc<Mutex<Hosts>>, String, u64)>,
    epoch: u64,
}

impl HostPermit {
    /// The breaker's epoch when this attempt was admitted (for [`HostLimiter::record`]).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl Drop for HostPermit {
    fn drop(&mut self) {
        if let Some((hosts, host, probe)) = self.probe.take() {
            if let Some(h) = hosts.lock().unwrap_or_else(|p| p.into_inner()).map.get_mut(&host) {
                h.circuit.probe_lost(probe);
            }
        }
    }
}

#[derive(Debug)]
struct Host {
    sem: Resizable,
    circuit: Circuit,
}

#[derive(Debug)]
struct Hosts {
    /// `delivery.max_in_flight_per_host` and the `[[host]]` overrides: under the same lock
    /// as the hosts, so a reload resizes every held host's semaphore in one step.
    caps: Caps,
    /// The breaker's settings: a reload may change the probe timeout (it follows the
    /// longest `request_timeout`).
    circuit: CircuitSettings,
    map: foldhash::HashMap<String, Host>,
    /// The size at which idle hosts are next forgotten: at least twice what the last prune
    /// kept, so a prune that frees little (every host busy) is not paid again per attempt.
    prune_at: usize,
}

/// The per-host caps.
#[derive(Debug)]
struct Caps {
    default_cap: u32,
    overrides: HashMap<String, u32>,
}

impl Caps {
    fn of(&self, host: &str) -> u32 {
        self.overrides.get(host).copied().unwrap_or(self.default_cap)
    }
}

/// One host as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostView {
    /// `host:port`.
    pub host: String,
    /// The breaker's state.
    pub state: CircuitState,
    /// Attempts in flight.
    pub in_flight: u32,
    /// The in-flight cap.
    pub cap: u32,
    /// Consecutive counted failures (while closed).
    pub failures: u32,
    /// When the next probe may go (open or probing).
    pub next_probe_ms: Option<u64>,
}

impl HostLimiter {
    /// A limiter with `default_cap` permits per host, per-host overrides, and the breaker's
    /// settings.
    pub fn new(default_cap: u32, overrides: HashMap<String, u32>, circuit: CircuitSettings) -> Self {
        HostLimiter {
            hosts: Arc::new(Mutex::new(Hosts {
                caps: Caps { default_cap, overrides },
                circuit,
                map: Default::default(),
                prune_at: PRUNE_ABOVE,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Hosts> {
        self.hosts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cap for `host`.
    pub fn cap(&self, host: &str) -> u32 {
        self.lock().caps.of(host)
    }

    /// Replaces the caps (a reload): every held host's semaphore is resized, so a lowered
    /// cap holds new attempts back until fewer than it are in flight.
    pub fn set_caps(&self, default_cap: u32, overrides: HashMap<String, u32>, circuit: CircuitSettings) {
        let mut hosts = self.lock();
        hosts.caps = Caps { default_cap, overrides };
        hosts.circuit = circuit;
        let Hosts { caps, map, .. } = &mut *hosts;
        for (name, h) in map.iter_mut() {
            h.sem.resize(caps.of(name));
        }
    }

    /// A permit for one attempt to `host`, if its cap and its breaker allow one now: else
    /// [`Refusal::HostBusy`] (at its cap or its ramp's limit: a finishing attempt frees one)
    /// or [`Refusal::CircuitOpen`] (a probe may go then).
    pub fn try_acquire(&self, host: &str, now_ms: u64) -> Result<HostPermit, Refusal> {
        let mut hosts = self.lock();
        if hosts.map.len() >= hosts.prune_at && !hosts.map.contains_key(host) {
            // Forget idle hosts so the map does not grow with every host ever seen: a host
            // with nothing in flight and no breaker worth keeping has nothing to remember.
            hosts
                .map
                .retain(|_, h| h.sem.in_use() > 0 || h.circuit.worth_keeping(now_ms));
            hosts.prune_at = PRUNE_ABOVE.max(2 * hosts.map.len());
        }
        let (cap, circuit) = (hosts.caps.of(host), hosts.circuit);
        // Looked up before it is copied: the host is nearly always there already.
        if !hosts.map.contains_key(host) {
            let new = Host {
                sem: Resizable::new(cap),
                circuit: Circuit::default(),
            };
            hosts.map.insert(host.to_string(), new);
        }
        let h = hosts.map.get_mut(host).expect("inserted above");
        let permit = h.sem.try_acquire().ok_or(Refusal::HostBusy(None))?;
        // Attempts running besides this one: the breaker's ramp counts them.
        let running = h.sem.in_use() - 1;
        let before = h.circuit.probe();
        match h.circuit.admit(&circuit, running, now_ms) {
            Admit::Yes => Ok(HostPermit {
                _permit: permit,
                epoch: h.circuit.epoch(),
                probe: h
                    .circuit
                    .probe()
                    .filter(|p| before != Some(*p))
                    .map(|p| (self.hosts.clone(), host.to_string(), p)),
            }),
            Admit::Wait(Some(at)) => Err(Refusal::CircuitOpen(at)),
            Admit::Wait(None) => Err(Refusal::HostBusy(None)),
        }
    }

    /// Applies the outcome of an attempt admitted in `epoch` ([`HostPermit::epoch`]) to its
    /// host's breaker; returns the change, if any.
    pub fn record(&self, host: &str, outcome: HostOutcome, epoch: u64, now_ms: u64) -> Option<CircuitChange> {
        let mut hosts = self.lock();
        let (cap, circuit) = (hosts.caps.of(host), hosts.circuit);
        let h = hosts.map.get_mut(host)?;
        h.circuit.record(&circuit, outcome, epoch, cap, now_ms)
    }

    /// Hosts held now.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.lock().map.len()
    }

    /// Attempts in flight to `host` now.
    pub fn in_flight(&self, host: &str) -> u32 {
        self.lock().map.get(host).map_or(0, |h| h.sem.in_use())
    }

    /// Every host held (busy, with a breaker not closed, or seen lately), in name order,
    /// `open_only` for those whose breaker is not closed.
    pub fn snapshot(&self, open_only: bool) -> Vec<HostView> {
        let hosts = self.lock();
        let mut out: Vec<HostView> = hosts
            .map
            .iter()
            .filter(|(_, h)| !open_only || h.circuit.state() != CircuitState::Closed)
            .map(|(name, h)| HostView {
                host: name.clone(),
                state: h.circuit.state(),
                in_flight: h.sem.in_use(),
                cap: h.sem.cap(),
                failures: h.circuit.failures(),
                next_probe_ms: h.circuit.next_probe_ms(),
            })
            .collect();
        out.sort_by(|a, b| a.host.cmp(&b.host));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OFF: CircuitSettings = CircuitSettings {
        failures: 0,
        probe_delay_ms: 1_000,
        probe_max_delay_ms: 10_000,
        probe_timeout_ms: 30_000,
    };

    #[test]
    fn a_reload_resizes_held_hosts_and_sets_the_caps_of_new_ones() {
        let l = HostLimiter::new(3, HashMap::new(), OFF);
        let held: Vec<_> = (0..3).map(|_| l.try_acquire("a:443", 0).unwrap()).collect();
        l.set_caps(1, HashMap::from([("b:443".to_string(), 5)]), OFF);
        assert_eq!((l.cap("a:443"), l.in_flight("a:443")), (1, 3));
        let mut held = held.into_iter();
        drop(held.next());
        drop(held.next());
        assert_eq!(
            l.try_acquire("a:443", 0).unwrap_err(),
            Refusal::HostBusy(None),
            "1 in flight, cap 1"
        );
        drop(held);
        let p = l.try_acquire("a:443", 0).unwrap();
        assert_eq!(l.try_acquire("a:443", 0).unwrap_err(), Refusal::HostBusy(None));
        drop(p);
        let b: Vec<_> = std::iter::from_fn(|| l.try_acquire("b:443", 0).ok()).collect();
        assert_eq!(b.len(), 5, "a host first seen after the reload gets its new cap");
        assert_eq!(l.snapshot(false).iter().map(|h| h.cap).collect::<Vec<_>>(), vec![1, 5]);
    }

    #[test]
    fn permits_are_capped_per_host_and_come_back_when_dropped() {
        let limiter = HostLimiter::new(2, HashMap::from([("big:443".to_string(), 3)]), OFF);
        let a = limiter.try_acquire("h:443", 0).unwrap();
        let _b = limiter.try_acquire("h:443", 0).unwrap();
        assert!(limiter.try_acquire("h:443", 0).is_err());
        assert_eq!(limiter.in_flight("h:443"), 2);
        assert!(limiter.try_acquire("other:443", 0).is_ok(), "hosts are independent");
        drop(a);
        assert!(limiter.try_acquire("h:443", 0).is_ok());
        let held: Vec<_> = (0..3).map(|_| limiter.try_acquire("big:443", 0).unwrap()).collect();
        assert!(limiter.try_acquire("big:443", 0).is_err());
        assert_eq!(held.len(), 3);
    }

    #[test]
    fn idle_hosts_are_forgotten_and_busy_ones_kept() {
        let limiter = HostLimiter::new(1, HashMap::new(), OFF);
        let busy = limiter.try_acquire("busy:443", 0).unwrap();
        for i in 0..(3 * PRUNE_ABOVE) {
            drop(limiter.try_acquire(&format!("h{i}:443"), 0));
            let held = limiter.hosts.lock().unwrap().map.len();
            assert!(held <= PRUNE_ABOVE, "bounded: {held}");
        }
        assert_eq!(limiter.in_flight("busy:443"), 1, "a busy host is remembered");
        assert!(limiter.try_acquire("busy:443", 0).is_err());
        drop(busy);
        assert!(limiter.try_acquire("busy:443", 0).is_ok());
    }

    #[test]
    fn an_open_breaker_refuses_until_its_probe_and_keeps_the_host_remembered() {
        let s = CircuitSettings { failures: 2, ..OFF };
        let limiter = HostLimiter::new(4, HashMap::new(), s);
        for _ in 0..2 {
            let permit = limiter.try_acquire("down:443", 0).unwrap();
            limiter.record("down:443", HostOutcome::Failed, permit.epoch(), 0);
        }
        assert_eq!(
            limiter.try_acquire("down:443", 500).unwrap_err(),
            Refusal::CircuitOpen(1_000)
        );
        let probe = limiter.try_acquire("down:443", 1_000).unwrap();
        assert_eq!(
            limiter.try_acquire("down:443", 1_000).unwrap_err(),
            Refusal::CircuitOpen(31_000)
        );
        let views = limiter.snapshot(true);
        assert_eq!(views.len(), 1);
        assert_eq!((views[0].state, views[0].in_flight), (CircuitState::Probing, 1));
        // Many other hosts come and go: the open one is not forgotten.
        for i in 0..(2 * PRUNE_ABOVE) {
            drop(limiter.try_acquire(&format!("h{i}:443"), 0));
        }
        drop(probe);
        assert_eq!(
            limiter.record("down:443", HostOutcome::Answered, 1, 1_100),
            Some(CircuitChange::Recovering)
        );
        let a = limiter.try_acquire("down:443", 1_100).unwrap();
        let _b = limiter.try_acquire("down:443", 1_100).unwrap();
        assert_eq!(
            limiter.try_acquire("down:443", 1_100).unwrap_err(),
            Refusal::HostBusy(None),
            "ramping: two at first"
        );
        drop(a);
        assert!(limiter.try_acquire("down:443", 1_100).is_ok());
    }
}
