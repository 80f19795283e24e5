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
use std::sync::Mutex;

use tokio::sync::OwnedSemaphorePermit;

use super::resizable::Resizable;

/// The endpoint has `max_in_flight` attempts running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtCap;

/// The capped endpoints' semaphores.
#[derive(Debug, Default)]
pub struct EndpointCaps {
    caps: Mutex<HashMap<String, Resizable>>,
}

impl EndpointCaps {
    /// Caps for these endpoints (key, max in flight).
    pub fn new<'a>(caps: impl IntoIterator<Item = (&'a str, u32)>) -> Self {
        let this = EndpointCaps::default();
        this.set(caps);
        this
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Resizable>> {
        self.caps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces the caps (a reload): an endpoint whose cap changed keeps its count of
    /// attempts in flight, so a lowered cap holds new attempts back until enough finish;
    /// an endpoint no longer capped is forgotten.
    pub fn set<'a>(&self, caps: impl IntoIterator<Item = (&'a str, u32)>) {
        let mut map = self.lock();
        let mut next = HashMap::new();
        for (key, cap) in caps {
            let mut sem = map.remove(key).unwrap_or_else(|| Resizable::new(cap));
            sem.resize(cap);
            next.insert(key.to_string(), sem);
        }
        *map = next;
    }

    /// A permit for one attempt to `endpoint`: `None` when it has no cap.
    pub fn try_acquire(&self, endpoint: &str) -> Result<Option<OwnedSemaphorePermit>, AtCap> {
        match self.lock().get_mut(endpoint) {
            None => Ok(None),
            Some(sem) => sem.try_acquire().map(Some).ok_or(AtCap),
        }
    }

    /// Attempts holding a permit of `endpoint` now, and its cap; `None` when it has none.
    pub fn usage(&self, endpoint: &str) -> Option<(u32, u32)> {
        self.lock().get(endpoint).map(|sem| (sem.in_use(), sem.cap()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_capped_endpoints_are_limited_and_permits_come_back() {
        let caps = EndpointCaps::new([("https://slow.example/", 2)]);
        assert!(matches!(caps.try_acquire("https://other.example/"), Ok(None)));
        let a = caps.try_acquire("https://slow.example/").unwrap().unwrap();
        let _b = caps.try_acquire("https://slow.example/").unwrap().unwrap();
        assert_eq!(caps.try_acquire("https://slow.example/").unwrap_err(), AtCap);
        assert_eq!(caps.usage("https://slow.example/"), Some((2, 2)));
        drop(a);
        assert_eq!(caps.usage("https://slow.example/"), Some((1, 2)));
        assert!(caps.try_acquire("https://slow.example/").unwrap().is_some());
        assert_eq!(caps.usage("https://other.example/"), None);
        assert!(matches!(EndpointCaps::default().try_acquire("x"), Ok(None)));
    }
}
