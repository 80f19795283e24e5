//! The per-endpoint in-flight cap (`[[endpoint]] max_in_flight`), under the per-host one:
//! one semaphore per endpoint that has a cap. The caps come from the config and the map is
//! made once at start, so it is as large as the config and never grows. Endpoints without
//! a cap (nearly all) cost one lookup in an empty or small map.
//!
//! The permit is taken with the host's, before a message is claimed, and goes back with the
//! host's when the receiver has answered: a message refused by its endpoint's cap stays
//! pending, and the freed permit wakes the scheduler just as a freed host permit does.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The endpoint has `max_in_flight` attempts running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtCap;

/// The capped endpoints' semaphores.
#[derive(Debug, Default)]
pub struct EndpointCaps {
    caps: HashMap<String, (u32, Arc<Semaphore>)>,
}

impl EndpointCaps {
    /// Caps for these endpoints (key, max in flight).
    pub fn new<'a>(caps: impl IntoIterator<Item = (&'a str, u32)>) -> Self {
        EndpointCaps {
            caps: caps
                .into_iter()
                .map(|(key, cap)| (key.to_string(), (cap, Arc::new(Semaphore::new(cap as usize)))))
                .collect(),
        }
    }

    /// A permit for one attempt to `endpoint`: `None` when it has no cap.
    pub fn try_acquire(&self, endpoint: &str) -> Result<Option<OwnedSemaphorePermit>, AtCap> {
        match self.caps.get(endpoint) {
            None => Ok(None),
            Some((_, sem)) => sem.clone().try_acquire_owned().map(Some).map_err(|_| AtCap),
        }
    }

    /// Attempts holding a permit of `endpoint` now, and its cap; `None` when it has none.
    pub fn usage(&self, endpoint: &str) -> Option<(u32, u32)> {
        self.caps
            .get(endpoint)
            .map(|(cap, sem)| (cap - sem.available_permits() as u32, *cap))
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
