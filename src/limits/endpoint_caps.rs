//! The per-endpoint in-flight cap (`[[endpoint]] max_in_flight`), under the per-host one:
//! one semaphore per endpoint that has a cap. The caps come from the config, so the map is as
//! large as the config and never grows. Endpoints without
//! a cap (nearly all) cost one lookup in an empty or small map. A reload replaces the caps
//! ([`EndpointCaps::set`]).
//!
//! The permit is taken with the host's, before a message is claimed, and goes back with the
//! host's when the receiver has answered: a message refused by its endpoint's cap stays
//! pending, and the freed permit wakes the scheduler just as a freed host permit does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tokio::sync::OwnedSemaphorePermit;

use super::resizable::Resizable;
use super::Refusal;

/// The capped endpoints' semaphores.
#[derive(Debug, Default)]
pub struct EndpointCaps {
    caps: Mutex<Caps>,
    /// Whether any endpoint is capped: when none is (nearly always), an attempt's permit
    /// costs no lock.
    any: AtomicBool,
}

#[derive(Debug, Default)]
struct Caps {
    /// The capped endpoints.
    live: HashMap<String, Resizable>,
    /// Endpoints a reload left uncapped while attempts still held their permits: kept (not
    /// limiting) until those end, so a cap put back meanwhile counts them.
    retired: HashMap<String, Resizable>,
}

impl EndpointCaps {
    /// Caps for these endpoints (key, max in flight).
    pub fn new<'a>(caps: impl IntoIterator<Item = (&'a str, u32)>) -> Self {
        let this = EndpointCaps::default();
        this.set(caps);
        this
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Caps> {
        self.caps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces the caps (a reload): an endpoint whose cap changed keeps its count of
    /// attempts in flight, so a lowered cap holds new attempts back until enough finish;
    /// an endpoint no longer capped is forgotten.
    pub fn set<'a>(&self, caps: impl IntoIterator<Item = (&'a str, u32)>) {
        let mut caps_now = self.lock();
        let Caps { live, retired } = &mut *caps_now;
        let mut next = HashMap::new();
        for (key, cap) in caps {
            let mut sem = live
                .remove(key)
                .or_else(|| retired.remove(key))
                .unwrap_or_else(|| Resizable::new(cap));
            sem.resize(cap);
            next.insert(key.to_string(), sem);
        }
        retired.extend(live.drain());
        retired.retain(|_, sem| sem.in_use() > 0);
        self.any.store(!next.is_empty(), Ordering::Release);
        *live = next;
    }

    /// A permit for one attempt to `endpoint`: `None` when it has no cap,
    /// [`Refusal::EndpointBusy`] when it has `max_in_flight` attempts running.
    pub fn try_acquire(&self, endpoint: &str) -> Result<Option<OwnedSemaphorePermit>, Refusal> {
        if !self.any.load(Ordering::Acquire) {
            return Ok(None);
        }
        match self.lock().live.get_mut(endpoint) {
            None => Ok(None),
            Some(sem) => sem.try_acquire().map(Some).ok_or(Refusal::EndpointBusy(None)),
        }
    }

    /// Attempts holding a permit of `endpoint` now, and its cap; `None` when it has none.
    pub fn usage(&self, endpoint: &str) -> Option<(u32, u32)> {
        self.lock().live.get(endpoint).map(|sem| (sem.in_use(), sem.cap()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_removed_and_put_back_counts_the_attempts_still_running() {
        let caps = EndpointCaps::new([("https://e.example/", 2)]);
        let held: Vec<_> = (0..2)
            .map(|_| caps.try_acquire("https://e.example/").unwrap().unwrap())
            .collect();
        caps.set([]);
        assert!(
            matches!(caps.try_acquire("https://e.example/"), Ok(None)),
            "uncapped now"
        );
        caps.set([("https://e.example/", 2)]);
        assert_eq!(caps.usage("https://e.example/"), Some((2, 2)), "the two still running");
        assert_eq!(
            caps.try_acquire("https://e.example/").unwrap_err(),
            Refusal::EndpointBusy(None)
        );
        drop(held);
        caps.set([]);
        assert!(caps.lock().retired.is_empty(), "forgotten once nothing holds it");
    }

    #[test]
    fn only_capped_endpoints_are_limited_and_permits_come_back() {
        let caps = EndpointCaps::new([("https://slow.example/", 2)]);
        assert!(matches!(caps.try_acquire("https://other.example/"), Ok(None)));
        let a = caps.try_acquire("https://slow.example/").unwrap().unwrap();
        let _b = caps.try_acquire("https://slow.example/").unwrap().unwrap();
        assert_eq!(
            caps.try_acquire("https://slow.example/").unwrap_err(),
            Refusal::EndpointBusy(None)
        );
        assert_eq!(caps.usage("https://slow.example/"), Some((2, 2)));
        drop(a);
        assert_eq!(caps.usage("https://slow.example/"), Some((1, 2)));
        assert!(caps.try_acquire("https://slow.example/").unwrap().is_some());
        assert_eq!(caps.usage("https://other.example/"), None);
        assert!(matches!(EndpointCaps::default().try_acquire("x"), Ok(None)));
    }
}
