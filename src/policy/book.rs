//! Which policy a message gets: [`PolicyBook`] holds the global settings and the
//! `[[route]]` and `[[endpoint]]` sections that override any, and looks up a message's two
//! sections (one map lookup each, nothing allocated) to [`resolve`] its settings. Pure
//! data, built once from the config: nothing is added at run time, so the book's maps stay
//! the size of the config.

use std::collections::HashMap;
use std::time::Duration;

use super::classify::Statuses;
use super::settings::{resolve, Overrides, RetryPolicy};

/// Every section's policy, looked up by route name and endpoint key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyBook {
    base: RetryPolicy,
    routes: HashMap<String, Overrides>,
    endpoints: HashMap<String, Overrides>,
}

impl PolicyBook {
    /// A book over the global policy and the sections' overrides (sections that override
    /// nothing are left out: they change no message's policy).
    pub fn new(
        base: RetryPolicy,
        routes: impl IntoIterator<Item = (String, Overrides)>,
        endpoints: impl IntoIterator<Item = (String, Overrides)>,
    ) -> PolicyBook {
        let keep = |(_, o): &(String, Overrides)| !o.is_empty();
        PolicyBook {
            base,
            routes: routes.into_iter().filter(keep).collect(),
            endpoints: endpoints.into_iter().filter(keep).collect(),
        }
    }

    /// The policy of a message accepted through `route` (if any) for `endpoint`.
    pub fn resolve(&self, route: Option<&str>, endpoint: &str) -> RetryPolicy<Statuses<'_>> {
        resolve(
            &self.base,
            route.and_then(|r| self.routes.get(r)),
            self.endpoints.get(endpoint),
        )
    }

    /// The sections a message's policy comes from: its endpoint's key and its route's
    /// name, each if that section overrides something.
    pub fn sections<'k>(&self, route: Option<&'k str>, endpoint: &'k str) -> (Option<&'k str>, Option<&'k str>) {
        (
            Some(endpoint).filter(|e| self.endpoints.contains_key(*e)),
            route.filter(|r| self.routes.contains_key(*r)),
        )
    }

    /// The longest `request_timeout` any message can get: what an attempt may take at most
    /// (the circuit breaker's probe timeout is derived from it).
    pub fn longest_request_timeout(&self) -> Duration {
        self.routes
            .values()
            .chain(self.endpoints.values())
            .filter_map(|o| o.request_timeout)
            .fold(self.base.request_timeout, Duration::max)
    }

    /// Endpoints with a `max_in_flight` cap, and the cap.
    pub fn endpoint_caps(&self) -> impl Iterator<Item = (&str, u32)> + '_ {
        self.endpoints
            .iter()
            .filter_map(|(k, o)| o.max_in_flight.map(|cap| (k.as_str(), cap)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::settings::tests::{base, endpoint, route, SEC};

    fn book() -> PolicyBook {
        PolicyBook::new(
            base(),
            [
                ("billing".to_string(), route()),
                ("plain".to_string(), Overrides::default()),
            ],
            [
                ("https://e.example/hook".to_string(), endpoint()),
                ("https://rate-only.example/".to_string(), Overrides::default()),
            ],
        )
    }

    #[test]
    fn a_message_gets_its_own_route_s_and_endpoint_s_sections() {
        let b = book();
        let both = b.resolve(Some("billing"), "https://e.example/hook");
        assert_eq!(
            b.sections(Some("billing"), "https://e.example/hook"),
            (Some("https://e.example/hook"), Some("billing"))
        );
        assert_eq!(
            (both.max_attempts, both.give_up_after),
            (3, 3600 * SEC),
            "route, endpoint"
        );
        assert_eq!(b.resolve(Some("billing"), "x").max_in_flight, None);
        // An unknown route name, or a section that overrides nothing, is no section.
        for (route, endpoint) in [
            (Some("gone"), "https://rate-only.example/"),
            (Some("plain"), "x"),
            (None, "y"),
        ] {
            assert_eq!(b.sections(route, endpoint), (None, None));
            let r = b.resolve(route, endpoint);
            assert_eq!(r.revision(), b.resolve(None, "x").revision());
            assert_eq!((r.backoff, r.max_attempts), (base().backoff, 16));
        }
    }

    #[test]
    fn the_caps_and_the_longest_timeout_come_from_the_sections() {
        let b = book();
        assert_eq!(b.endpoint_caps().collect::<Vec<_>>(), [("https://e.example/hook", 2)]);
        assert_eq!(b.longest_request_timeout(), 30 * SEC, "the route's 5s is shorter");
        let long = Overrides {
            request_timeout: Some(90 * SEC),
            ..Overrides::default()
        };
        let b = PolicyBook::new(base(), [], [("k".to_string(), long)]);
        assert_eq!(b.longest_request_timeout(), 90 * SEC);
    }
}
