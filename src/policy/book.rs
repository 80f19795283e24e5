//! Which policy a message gets: the global settings (`[retry]`, `[delivery]`) overridden,
//! field by field, by its route's `[[route]]` and then its endpoint's `[[endpoint]]`.
//!
//! [`PolicyBook`] holds the sections as the config gave them, each reduced to what it
//! overrides ([`Overrides`]); [`PolicyBook::resolve`] looks up a message's two sections (one
//! map lookup each, nothing allocated) and answers with a borrowed [`Resolved`] whose
//! accessors take each value from the most specific section that sets it. Pure data, built
//! once from the config: nothing is added at run time, so the book's maps stay the size of
//! the config.
//!
//! Two kinds of value, read at different times (docs/configuration.md says why):
//! - the give-up limits, `max_attempts` and `give_up_after`, are resolved when a message is
//!   accepted and stored with it;
//! - everything else (backoff or schedule, jitter, `max_attempts_404`, `max_retry_after`,
//!   `request_timeout`, `max_in_flight`, the status rules) is resolved at each attempt, so
//!   a changed config applies to the next attempt of every pending message.
//!
//! [`Resolved::revision`] is a short hash of the attempt-time values: stored with each
//! attempt, it tells later which settings the attempt was made under.

use std::collections::HashMap;
use std::time::Duration;

use super::backoff::Backoff;
use super::classify::{StatusRules, Statuses};
use super::decide::RetryPolicy;
use crate::model::Jitter;

/// What one `[[route]]` or `[[endpoint]]` section overrides; `None` (or no rules) inherits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// The backoff shape (a schedule, or exponential with this section's delays).
    pub backoff: Option<Backoff>,
    /// The jitter mode.
    pub jitter: Option<Jitter>,
    /// Attempts before giving up (resolved at accept).
    pub max_attempts: Option<u32>,
    /// Time from acceptance before giving up (resolved at accept).
    pub give_up_after: Option<Duration>,
    /// Attempts while the receiver answers a `retry_limited` status.
    pub max_attempts_404: Option<u32>,
    /// Cap of a receiver's `Retry-After`.
    pub max_retry_after: Option<Duration>,
    /// Whole-attempt timeout.
    pub request_timeout: Option<Duration>,
    /// Attempts in flight to the endpoint at once (only `[[endpoint]]` sets it).
    pub max_in_flight: Option<u32>,
    /// Status rules in front of the less specific sections' and the seed's table.
    pub statuses: StatusRules,
}

impl Overrides {
    /// Whether the section overrides nothing.
    pub fn is_empty(&self) -> bool {
        *self == Overrides::default()
    }
}

/// The global policy: every value set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BasePolicy {
    /// The backoff shape.
    pub backoff: Backoff,
    /// The jitter mode.
    pub jitter: Jitter,
    /// Attempts before giving up.
    pub max_attempts: u32,
    /// Time from acceptance before giving up.
    pub give_up_after: Duration,
    /// Attempts while the receiver answers a `retry_limited` status.
    pub max_attempts_404: u32,
    /// Cap of a receiver's `Retry-After`.
    pub max_retry_after: Duration,
    /// Whole-attempt timeout.
    pub request_timeout: Duration,
    /// Status rules in front of the seed's table.
    pub statuses: StatusRules,
}

/// Every section's policy, looked up by route name and endpoint key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyBook {
    base: BasePolicy,
    routes: HashMap<String, Overrides>,
    endpoints: HashMap<String, Overrides>,
}

impl PolicyBook {
    /// A book over the global policy and the sections' overrides (sections that override
    /// nothing are left out: they change no message's policy).
    pub fn new(
        base: BasePolicy,
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

    /// The global policy.
    pub fn base(&self) -> &BasePolicy {
        &self.base
    }

    /// The policy of a message accepted through `route` (if any) for `endpoint`.
    pub fn resolve<'a>(&'a self, route: Option<&str>, endpoint: &str) -> Resolved<'a> {
        Resolved {
            endpoint: self.endpoints.get_key_value(endpoint).map(|(k, o)| (k.as_str(), o)),
            route: route
                .and_then(|r| self.routes.get_key_value(r))
                .map(|(k, o)| (k.as_str(), o)),
            base: &self.base,
        }
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

/// The policy one message gets, borrowed from its [`PolicyBook`].
#[derive(Debug, Clone, Copy)]
pub struct Resolved<'a> {
    endpoint: Option<(&'a str, &'a Overrides)>,
    route: Option<(&'a str, &'a Overrides)>,
    base: &'a BasePolicy,
}

impl<'a> Resolved<'a> {
    /// The first value the sections set, most specific first.
    fn pick<T>(&self, field: impl Fn(&'a Overrides) -> Option<T>) -> Option<T> {
        [self.endpoint, self.route]
            .into_iter()
            .flatten()
            .find_map(|(_, o)| field(o))
    }

    /// The `[[endpoint]]` section that applies (its key), if any.
    pub fn endpoint_section(&self) -> Option<&'a str> {
        self.endpoint.map(|(k, _)| k)
    }

    /// The `[[route]]` section that applies (its name), if any.
    pub fn route_section(&self) -> Option<&'a str> {
        self.route.map(|(k, _)| k)
    }

    /// The backoff shape.
    pub fn backoff(&self) -> &'a Backoff {
        self.pick(|o| o.backoff.as_ref()).unwrap_or(&self.base.backoff)
    }

    /// The jitter mode.
    pub fn jitter(&self) -> Jitter {
        self.pick(|o| o.jitter).unwrap_or(self.base.jitter)
    }

    /// Attempts before giving up (for a message being accepted).
    pub fn max_attempts(&self) -> u32 {
        self.pick(|o| o.max_attempts).unwrap_or(self.base.max_attempts)
    }

    /// Time from acceptance before giving up (for a message being accepted or replayed).
    pub fn give_up_after(&self) -> Duration {
        self.pick(|o| o.give_up_after).unwrap_or(self.base.give_up_after)
    }

    /// Attempts while the receiver answers a `retry_limited` status.
    pub fn max_attempts_404(&self) -> u32 {
        self.pick(|o| o.max_attempts_404).unwrap_or(self.base.max_attempts_404)
    }

    /// Cap of a receiver's `Retry-After`.
    pub fn max_retry_after(&self) -> Duration {
        self.pick(|o| o.max_retry_after).unwrap_or(self.base.max_retry_after)
    }

    /// Whole-attempt timeout.
    pub fn request_timeout(&self) -> Duration {
        self.pick(|o| o.request_timeout).unwrap_or(self.base.request_timeout)
    }

    /// The endpoint's cap on attempts in flight, if it has one (the host's cap applies
    /// either way).
    pub fn max_in_flight(&self) -> Option<u32> {
        self.endpoint.and_then(|(_, o)| o.max_in_flight)
    }

    /// The status rules, most specific section first.
    pub fn statuses(&self) -> Statuses<'a> {
        Statuses::layered([
            self.endpoint.map(|(_, o)| &o.statuses),
            self.route.map(|(_, o)| &o.statuses),
            Some(&self.base.statuses),
        ])
    }

    /// What [`super::decide`] needs.
    pub fn retry_policy(&self) -> RetryPolicy<'a> {
        RetryPolicy {
            backoff: self.backoff(),
            jitter: self.jitter(),
            max_attempts_404: self.max_attempts_404(),
            max_retry_after: self.max_retry_after(),
            statuses: self.statuses(),
        }
    }

    /// A hash (32-bit FNV-1a) of the values resolved at attempt time: equal revisions mean
    /// the same backoff, jitter, caps, timeout and status rules. The give-up limits are
    /// left out: they are the message's own, fixed when it is accepted.
    pub fn revision(&self) -> u32 {
        let mut hash: u32 = 0x811c_9dc5;
        let mut feed = |bytes: &[u8]| {
            for b in bytes {
                hash ^= u32::from(*b);
                hash = hash.wrapping_mul(0x0100_0193);
            }
        };
        match self.backoff() {
            Backoff::Exponential { base_ms, max_ms } => {
                feed(&[1]);
                feed(&base_ms.to_le_bytes());
                feed(&max_ms.to_le_bytes());
            }
            Backoff::Schedule(steps) => {
                feed(&[2]);
                feed(&(steps.len() as u64).to_le_bytes());
                for step in steps.iter() {
                    feed(&step.to_le_bytes());
                }
            }
        }
        feed(&[match self.jitter() {
            Jitter::Equal => 1,
            Jitter::Full => 2,
            Jitter::None => 3,
        }]);
        feed(&self.max_attempts_404().to_le_bytes());
        feed(&millis(self.max_retry_after()).to_le_bytes());
        feed(&millis(self.request_timeout()).to_le_bytes());
        feed(&self.max_in_flight().unwrap_or(0).to_le_bytes());
        for rules in self.statuses().layers() {
            rules.hash_into(&mut feed);
        }
        hash
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A revision as the admin API, the CLI and `check-config` print it: 8 hex digits.
pub fn revision_text(revision: u32) -> String {
    format!("{revision:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::classify::{Class, StatusMatch};

    const SEC: Duration = Duration::from_secs(1);

    fn base() -> BasePolicy {
        BasePolicy {
            backoff: Backoff::exponential(60 * SEC, 3600 * SEC).unwrap(),
            jitter: Jitter::Equal,
            max_attempts: 16,
            give_up_after: 3 * 86_400 * SEC,
            max_attempts_404: 5,
            max_retry_after: 86_400 * SEC,
            request_timeout: 30 * SEC,
            statuses: StatusRules::default(),
        }
    }

    fn rules(list: &[(u16, Class)]) -> StatusRules {
        StatusRules::new(list.iter().map(|(s, c)| (StatusMatch::Code(*s), *c))).unwrap()
    }

    fn book() -> PolicyBook {
        let route = Overrides {
            backoff: Some(Backoff::schedule(&[5 * SEC, 300 * SEC]).unwrap()),
            max_attempts: Some(3),
            jitter: Some(Jitter::None),
            request_timeout: Some(5 * SEC),
            statuses: rules(&[(404, Class::Permanent), (409, Class::Permanent)]),
            ..Overrides::default()
        };
        let endpoint = Overrides {
            jitter: Some(Jitter::Full),
            give_up_after: Some(3600 * SEC),
            max_in_flight: Some(2),
            statuses: rules(&[(409, Class::Delivered)]),
            ..Overrides::default()
        };
        PolicyBook::new(
            base(),
            [
                ("billing".to_string(), route),
                ("plain".to_string(), Overrides::default()),
            ],
            [
                ("https://e.example/hook".to_string(), endpoint),
                ("https://rate-only.example/".to_string(), Overrides::default()),
            ],
        )
    }

    #[test]
    fn with_no_section_every_value_is_the_global_one() {
        let b = book();
        let r = b.resolve(None, "https://other.example/");
        assert_eq!((r.endpoint_section(), r.route_section()), (None, None));
        assert_eq!(r.backoff(), &b.base().backoff);
        assert_eq!(r.jitter(), Jitter::Equal);
        assert_eq!(r.max_attempts(), 16);
        assert_eq!(r.give_up_after(), 3 * 86_400 * SEC);
        assert_eq!(r.max_attempts_404(), 5);
        assert_eq!(r.max_retry_after(), 86_400 * SEC);
        assert_eq!(r.request_timeout(), 30 * SEC);
        assert_eq!(r.max_in_flight(), None);
        assert_eq!(r.statuses().classify(404), Class::RetryLimited);
        // An unknown route name, or a section that overrides nothing, is the same.
        let none = b.resolve(Some("gone"), "https://rate-only.example/");
        assert_eq!((none.endpoint_section(), none.route_section()), (None, None));
        assert_eq!(none.revision(), r.revision());
        assert_eq!(b.resolve(Some("plain"), "x").route_section(), None);
    }

    #[test]
    fn each_value_comes_from_the_most_specific_section_that_sets_it() {
        let b = book();
        let r = b.resolve(Some("billing"), "https://e.example/hook");
        assert_eq!(r.endpoint_section(), Some("https://e.example/hook"));
        assert_eq!(r.route_section(), Some("billing"));
        assert_eq!(r.backoff().steps(), Some(&[5_000, 300_000][..]), "route");
        assert_eq!(r.jitter(), Jitter::Full, "endpoint over route");
        assert_eq!(r.max_attempts(), 3, "route");
        assert_eq!(r.give_up_after(), 3600 * SEC, "endpoint");
        assert_eq!(r.max_attempts_404(), 5, "global");
        assert_eq!(r.request_timeout(), 5 * SEC, "route");
        assert_eq!(r.max_in_flight(), Some(2), "endpoint");
        let s = r.statuses();
        assert_eq!(s.classify(409), Class::Delivered, "endpoint over route");
        assert_eq!(s.classify(404), Class::Permanent, "route");
        assert_eq!(s.classify(503), Class::Retry, "seed");
        let p = r.retry_policy();
        assert_eq!((p.jitter, p.max_attempts_404), (Jitter::Full, 5));
        assert_eq!(p.statuses.classify(409), Class::Delivered);

        let route_only = b.resolve(Some("billing"), "https://billing.example/");
        assert_eq!(route_only.jitter(), Jitter::None);
        assert_eq!(route_only.statuses().classify(409), Class::Permanent);
        assert_eq!(route_only.max_in_flight(), None);
        let endpoint_only = b.resolve(None, "https://e.example/hook");
        assert_eq!(endpoint_only.backoff(), &b.base().backoff);
        assert_eq!(endpoint_only.max_attempts(), 16);
        assert_eq!(b.endpoint_caps().collect::<Vec<_>>(), [("https://e.example/hook", 2)]);
        assert_eq!(b.longest_request_timeout(), 30 * SEC, "the route's 5s is shorter");
        let long = Overrides {
            request_timeout: Some(90 * SEC),
            ..Overrides::default()
        };
        let b = PolicyBook::new(base(), [], [("k".to_string(), long)]);
        assert_eq!(b.longest_request_timeout(), 90 * SEC);
    }

    #[test]
    fn the_revision_follows_the_attempt_time_values_only() {
        let b = book();
        let plain = b.resolve(None, "x").revision();
        assert_eq!(plain, b.resolve(None, "y").revision(), "stable");
        let both = b.resolve(Some("billing"), "https://e.example/hook").revision();
        let route = b.resolve(Some("billing"), "x").revision();
        let endpoint = b.resolve(None, "https://e.example/hook").revision();
        let all = [plain, both, route, endpoint];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b, "{all:?}");
            }
        }
        // A change to each attempt-time value changes it; the give-up limits do not.
        let with = |f: &dyn Fn(&mut BasePolicy)| {
            let mut base = base();
            f(&mut base);
            PolicyBook::new(base, [], []).resolve(None, "x").revision()
        };
        let unchanged = with(&|_| {});
        assert_eq!(unchanged, plain);
        assert_eq!(with(&|b| b.max_attempts = 3), plain);
        assert_eq!(with(&|b| b.give_up_after = SEC), plain);
        let changes: [&dyn Fn(&mut BasePolicy); 7] = [
            &|b| b.backoff = Backoff::exponential(61 * SEC, 3600 * SEC).unwrap(),
            &|b| b.backoff = Backoff::schedule(&[60 * SEC, 3600 * SEC]).unwrap(),
            &|b| b.jitter = Jitter::None,
            &|b| b.max_attempts_404 = 6,
            &|b| b.max_retry_after = SEC,
            &|b| b.request_timeout = SEC,
            &|b| b.statuses = rules(&[(409, Class::Delivered)]),
        ];
        for (i, change) in changes.iter().enumerate() {
            assert_ne!(with(change), plain, "change {i}");
        }
        assert_eq!(revision_text(0xab), "000000ab");
        assert_eq!(revision_text(plain).len(), 8);
    }
}
