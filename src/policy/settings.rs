//! The retry settings: a full set ([`RetryPolicy`]) and what one config section overrides
//! of it ([`Overrides`]), and [`resolve`], the one rule that lays a message's route's and
//! endpoint's sections over the global set.
//!
//! Two kinds of value, read at different times (docs/configuration.md says why):
//! - the give-up limits, `max_attempts` and `give_up_after`, are resolved when a message is
//!   accepted and stored with it;
//! - everything else is resolved at each attempt, so a changed config applies to the next
//!   attempt of every pending message. [`RetryPolicy::revision`] is a short hash of those
//!   values: stored with each attempt, it tells later which settings it was made under.

use std::time::Duration;

use super::backoff::{millis, Backoff};
use super::classify::{StatusRules, Statuses};
use crate::model::Jitter;

/// A full set of retry settings. The global one (`[retry]`, with `[delivery]`'s
/// `request_timeout`) owns its status rules; the one an attempt is made under ([`resolve`])
/// borrows its sections' rules, most specific first, so looking it up allocates nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy<S = StatusRules> {
    /// The shape of the wait before the next attempt.
    pub backoff: Backoff,
    /// How that wait is randomised.
    pub jitter: Jitter,
    /// Attempts before giving up (for a message being accepted).
    pub max_attempts: u32,
    /// Time from acceptance before giving up (for a message being accepted or replayed).
    pub give_up_after: Duration,
    /// Attempt cap for messages whose receiver keeps answering a `retry_limited` status (404).
    pub max_attempts_404: u32,
    /// The longest wait a `Retry-After` header can impose.
    pub max_retry_after: Duration,
    /// Whole-attempt timeout.
    pub request_timeout: Duration,
    /// The endpoint's cap on attempts in flight, if it has one (the host's cap applies
    /// either way); only an `[[endpoint]]` sets it.
    pub max_in_flight: Option<u32>,
    /// What each status means.
    pub statuses: S,
}

/// What one `[[route]]` or `[[endpoint]]` section overrides; `None` (or no rules) inherits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// The backoff shape (a schedule, or exponential with this section's delays).
    pub backoff: Option<Backoff>,
    /// The jitter mode.
    pub jitter: Option<Jitter>,
    /// Attempts before giving up.
    pub max_attempts: Option<u32>,
    /// Time from acceptance before giving up.
    pub give_up_after: Option<Duration>,
    /// Attempts while the receiver answers a `retry_limited` status.
    pub max_attempts_404: Option<u32>,
    /// Cap of a receiver's `Retry-After`.
    pub max_retry_after: Option<Duration>,
    /// Whole-attempt timeout.
    pub request_timeout: Option<Duration>,
    /// Attempts in flight to the endpoint at once.
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

/// The settings of a message sent through `route`'s section to `endpoint`'s (either may be
/// absent): each value from the most specific section that sets it, else `base`'s; the
/// status rules of all three, most specific first. Only the endpoint's section caps
/// attempts in flight (one endpoint has one cap, whichever route a message came through).
pub fn resolve<'a>(
    base: &'a RetryPolicy,
    route: Option<&'a Overrides>,
    endpoint: Option<&'a Overrides>,
) -> RetryPolicy<Statuses<'a>> {
    let s = [endpoint, route];
    RetryPolicy {
        backoff: first(s, |o| o.backoff.clone()).unwrap_or_else(|| base.backoff.clone()),
        jitter: first(s, |o| o.jitter).unwrap_or(base.jitter),
        max_attempts: first(s, |o| o.max_attempts).unwrap_or(base.max_attempts),
        give_up_after: first(s, |o| o.give_up_after).unwrap_or(base.give_up_after),
        max_attempts_404: first(s, |o| o.max_attempts_404).unwrap_or(base.max_attempts_404),
        max_retry_after: first(s, |o| o.max_retry_after).unwrap_or(base.max_retry_after),
        request_timeout: first(s, |o| o.request_timeout).unwrap_or(base.request_timeout),
        max_in_flight: endpoint.and_then(|o| o.max_in_flight),
        statuses: Statuses::layered([
            endpoint.map(|o| &o.statuses),
            route.map(|o| &o.statuses),
            Some(&base.statuses),
        ]),
    }
}

/// The first value the sections set, most specific first.
fn first<T>(sections: [Option<&Overrides>; 2], field: impl Fn(&Overrides) -> Option<T>) -> Option<T> {
    sections.into_iter().flatten().find_map(field)
}

impl RetryPolicy<Statuses<'_>> {
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
        match &self.backoff {
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
        feed(&[match self.jitter {
            Jitter::Equal => 1,
            Jitter::Full => 2,
            Jitter::None => 3,
        }]);
        feed(&self.max_attempts_404.to_le_bytes());
        feed(&millis(self.max_retry_after).to_le_bytes());
        feed(&millis(self.request_timeout).to_le_bytes());
        feed(&self.max_in_flight.unwrap_or(0).to_le_bytes());
        for rules in self.statuses.layers() {
            rules.hash_into(&mut feed);
        }
        hash
    }
}

/// A revision as the admin API, the CLI and `check-config` print it: 8 hex digits.
pub fn revision_text(revision: u32) -> String {
    format!("{revision:08x}")
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::policy::classify::{Class, StatusMatch};

    pub(crate) const SEC: Duration = Duration::from_secs(1);

    /// `[retry]`'s defaults with a 30s `request_timeout`.
    pub(crate) fn base() -> RetryPolicy {
        RetryPolicy {
            backoff: Backoff::exponential(60 * SEC, 3600 * SEC).unwrap(),
            jitter: Jitter::Equal,
            max_attempts: 16,
            give_up_after: 3 * 86_400 * SEC,
            max_attempts_404: 5,
            max_retry_after: 86_400 * SEC,
            request_timeout: 30 * SEC,
            max_in_flight: None,
            statuses: StatusRules::default(),
        }
    }

    fn rules(list: &[(u16, Class)]) -> StatusRules {
        StatusRules::new(list.iter().map(|(s, c)| (StatusMatch::Code(*s), *c))).unwrap()
    }

    pub(crate) fn route() -> Overrides {
        Overrides {
            backoff: Some(Backoff::schedule(&[5 * SEC, 300 * SEC]).unwrap()),
            max_attempts: Some(3),
            jitter: Some(Jitter::None),
            request_timeout: Some(5 * SEC),
            statuses: rules(&[(404, Class::Permanent), (409, Class::Permanent)]),
            ..Overrides::default()
        }
    }

    pub(crate) fn endpoint() -> Overrides {
        Overrides {
            jitter: Some(Jitter::Full),
            give_up_after: Some(3600 * SEC),
            max_in_flight: Some(2),
            statuses: rules(&[(409, Class::Delivered)]),
            ..Overrides::default()
        }
    }

    #[test]
    fn with_no_section_every_value_is_the_global_one() {
        let b = base();
        let r = resolve(&b, None, None);
        assert_eq!(r.backoff, b.backoff);
        assert_eq!(r.jitter, Jitter::Equal);
        assert_eq!(r.max_attempts, 16);
        assert_eq!(r.give_up_after, 3 * 86_400 * SEC);
        assert_eq!(r.max_attempts_404, 5);
        assert_eq!(r.max_retry_after, 86_400 * SEC);
        assert_eq!(r.request_timeout, 30 * SEC);
        assert_eq!(r.max_in_flight, None);
        assert_eq!(r.statuses.classify(404), Class::RetryLimited);
        let empty = Overrides::default();
        assert!(empty.is_empty() && !route().is_empty());
        assert_eq!(resolve(&b, Some(&empty), Some(&empty)).revision(), r.revision());
    }

    #[test]
    fn each_value_comes_from_the_most_specific_section_that_sets_it() {
        let (b, route, endpoint) = (base(), route(), endpoint());
        let r = resolve(&b, Some(&route), Some(&endpoint));
        assert_eq!(r.backoff.steps(), Some(&[5_000, 300_000][..]), "route");
        assert_eq!(r.jitter, Jitter::Full, "endpoint over route");
        assert_eq!(r.max_attempts, 3, "route");
        assert_eq!(r.give_up_after, 3600 * SEC, "endpoint");
        assert_eq!(r.max_attempts_404, 5, "global");
        assert_eq!(r.request_timeout, 5 * SEC, "route");
        assert_eq!(r.max_in_flight, Some(2), "endpoint");
        assert_eq!(r.statuses.classify(409), Class::Delivered, "endpoint over route");
        assert_eq!(r.statuses.classify(404), Class::Permanent, "route");
        assert_eq!(r.statuses.classify(503), Class::Retry, "seed");

        let route_only = resolve(&b, Some(&route), None);
        assert_eq!(route_only.jitter, Jitter::None);
        assert_eq!(route_only.statuses.classify(409), Class::Permanent);
        let endpoint_only = resolve(&b, None, Some(&endpoint));
        assert_eq!(endpoint_only.backoff, b.backoff);
        assert_eq!(endpoint_only.max_attempts, 16);
        // The in-flight cap is the endpoint's alone.
        let capped = Overrides {
            max_in_flight: Some(4),
            ..Overrides::default()
        };
        assert_eq!(resolve(&b, Some(&capped), None).max_in_flight, None);
    }

    #[test]
    fn the_revision_follows_the_attempt_time_values_only() {
        let (b, route, endpoint) = (base(), route(), endpoint());
        let plain = resolve(&b, None, None).revision();
        let all = [
            plain,
            resolve(&b, Some(&route), Some(&endpoint)).revision(),
            resolve(&b, Some(&route), None).revision(),
            resolve(&b, None, Some(&endpoint)).revision(),
        ];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b, "{all:?}");
            }
        }
        // A change to each attempt-time value changes it; the give-up limits do not.
        let with = |f: &dyn Fn(&mut RetryPolicy)| {
            let mut base = base();
            f(&mut base);
            resolve(&base, None, None).revision()
        };
        assert_eq!(with(&|_| {}), plain);
        assert_eq!(with(&|b| b.max_attempts = 3), plain);
        assert_eq!(with(&|b| b.give_up_after = SEC), plain);
        let changes: [&dyn Fn(&mut RetryPolicy); 7] = [
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
