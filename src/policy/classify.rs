//! Classification of a receiver's HTTP status into what courier does next (CONTRACT §3):
//! the seed's table ([`classify`]), and the rules a section of the config may put in front
//! of it ([`StatusRules`], e.g. "404 is permanent", "409 is success"), looked up most
//! specific section first ([`Statuses`]).

use std::fmt;
use std::str::FromStr;

/// What one HTTP status means for the message. The discriminants are the bytes a policy's
/// revision hashes: never renumber one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// The receiver has the message (any 2xx by default).
    Delivered = 1,
    /// Try again later (408, 429, 5xx, 3xx and anything not listed elsewhere).
    Retry = 2,
    /// The receiver will never accept it (400, 401, 403, 410, 422): dead-letter at once.
    Permanent = 3,
    /// Retried, but only up to `max_attempts_404` attempts (404 by default), since a
    /// missing route is often a deploy in progress but rarely stays fixable for days.
    RetryLimited = 4,
}

impl Class {
    /// Every class, in the order the config lists them.
    pub const ALL: [Class; 4] = [Class::Delivered, Class::Retry, Class::Permanent, Class::RetryLimited];

    /// The name used in the config (`statuses = { success = [409] }`), the summary and the
    /// admin API.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Delivered => "success",
            Class::Retry => "retry",
            Class::Permanent => "permanent",
            Class::RetryLimited => "retry_limited",
        }
    }
}

/// Classifies a response status by the seed's table. Statuses outside 100..=599 are
/// retried, like any status the contract does not name.
pub fn classify(status: u16) -> Class {
    match status {
        200..=299 => Class::Delivered,
        400 | 401 | 403 | 410 | 422 => Class::Permanent,
        404 => Class::RetryLimited,
        // 408, 429, 5xx, redirects (never followed) and everything else.
        _ => Class::Retry,
    }
}

/// Which statuses a rule covers: one code, or a whole hundred (`4xx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StatusMatch {
    /// Exactly this status (100..=599).
    Code(u16),
    /// Every status of this hundred: `4` is `4xx` (1..=5).
    Hundred(u8),
}

/// A status rule that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatusError {
    /// Not an HTTP status from 100 to 599, nor `1xx`..`5xx`.
    #[error("{0:?} is not an HTTP status from 100 to 599 or a class like 4xx")]
    Invalid(String),
    /// One status (or class) given two meanings in one section.
    #[error("{status} is listed as both {first} and {second}")]
    Conflict {
        /// The status or class, as written back (`404`, `4xx`).
        status: StatusMatch,
        /// The class it was given first.
        first: &'static str,
        /// The other class.
        second: &'static str,
    },
}

impl StatusMatch {
    /// A status code as a rule; `None` outside 100..=599.
    pub fn code(code: i64) -> Option<StatusMatch> {
        u16::try_from(code)
            .ok()
            .filter(|c| (100..=599).contains(c))
            .map(StatusMatch::Code)
    }

    /// Whether `status` falls under this rule.
    pub fn matches(self, status: u16) -> bool {
        match self {
            StatusMatch::Code(code) => code == status,
            StatusMatch::Hundred(h) => status / 100 == u16::from(h),
        }
    }
}

impl FromStr for StatusMatch {
    type Err = StatusError;
    /// `404` or `4xx` (`4XX` too).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        let invalid = || StatusError::Invalid(s.to_string());
        if let Some(h) = text
            .strip_suffix("xx")
            .or_else(|| text.strip_suffix("XX"))
            .filter(|h| h.len() == 1)
        {
            return match h.as_bytes()[0] {
                d @ b'1'..=b'5' => Ok(StatusMatch::Hundred(d - b'0')),
                _ => Err(invalid()),
            };
        }
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) || text.len() > 3 {
            return Err(invalid());
        }
        text.parse::<i64>().ok().and_then(StatusMatch::code).ok_or_else(invalid)
    }
}

impl fmt::Display for StatusMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatusMatch::Code(code) => write!(f, "{code}"),
            StatusMatch::Hundred(h) => write!(f, "{h}xx"),
        }
    }
}

/// The status rules of one config section: each status (or hundred) has one class. An
/// exact code wins over its hundred (`permanent = ["4xx"], retry = [429]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusRules {
    /// Sorted: codes before hundreds, each in ascending order.
    rules: Vec<(StatusMatch, Class)>,
}

impl StatusRules {
    /// Builds the rules; the same status (or hundred) under two classes is
    /// [`StatusError::Conflict`] (listed twice under one class is fine).
    pub fn new(rules: impl IntoIterator<Item = (StatusMatch, Class)>) -> Result<StatusRules, StatusError> {
        let mut sorted: Vec<(StatusMatch, Class)> = Vec::new();
        for (status, class) in rules {
            match sorted.iter().find(|(s, _)| *s == status) {
                Some((_, first)) if *first != class => {
                    return Err(StatusError::Conflict {
                        status,
                        first: first.as_str(),
                        second: class.as_str(),
                    })
                }
                Some(_) => {}
                None => sorted.push((status, class)),
            }
        }
        sorted.sort_by_key(|(status, _)| *status);
        Ok(StatusRules { rules: sorted })
    }

    /// Whether there is no rule.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The rules in lookup order (codes, then hundreds).
    pub fn iter(&self) -> impl Iterator<Item = (StatusMatch, Class)> + '_ {
        self.rules.iter().copied()
    }

    /// The class these rules give `status`, if any covers it.
    pub fn lookup(&self, status: u16) -> Option<Class> {
        // Sorted codes first: the first match is the most specific one.
        self.rules.iter().find(|(s, _)| s.matches(status)).map(|(_, c)| *c)
    }

    /// Feeds the rules to a hasher, for a policy's revision.
    pub(crate) fn hash_into(&self, h: &mut impl FnMut(&[u8])) {
        for (status, class) in &self.rules {
            match status {
                StatusMatch::Code(code) => h(&code.to_le_bytes()),
                StatusMatch::Hundred(d) => h(&[0xff, *d]),
            }
            h(&[*class as u8]);
        }
        h(&[0]);
    }
}

/// The status rules one attempt is classified by: up to three sections' rules, most
/// specific first (endpoint, route, `[retry]`), then the seed's table. Borrowed, `Copy`:
/// looking them up costs no allocation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Statuses<'a> {
    layers: [Option<&'a StatusRules>; 3],
}

impl<'a> Statuses<'a> {
    /// The seed's table alone.
    #[cfg(test)]
    pub fn seed() -> Statuses<'static> {
        Statuses { layers: [None; 3] }
    }

    /// Rules of up to three sections, most specific first.
    pub fn layered(layers: [Option<&'a StatusRules>; 3]) -> Statuses<'a> {
        Statuses { layers }
    }

    /// The class of `status`: the first section with a rule for it decides, else the
    /// seed's table.
    pub fn classify(&self, status: u16) -> Class {
        self.layers
            .iter()
            .flatten()
            .find_map(|rules| rules.lookup(status))
            .unwrap_or_else(|| classify(status))
    }

    /// The sections' rules, most specific first (empty sections left out).
    pub fn layers(&self) -> impl Iterator<Item = &'a StatusRules> + '_ {
        self.layers.iter().flatten().copied().filter(|r| !r.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contract's table, written independently of the match above.
    fn expected(status: u16) -> Class {
        if (200..300).contains(&status) {
            Class::Delivered
        } else if [400, 401, 403, 410, 422].contains(&status) {
            Class::Permanent
        } else if status == 404 {
            Class::RetryLimited
        } else {
            Class::Retry
        }
    }

    #[test]
    fn every_status_from_100_to_599_follows_the_contract_table() {
        for status in 100..=599u16 {
            assert_eq!(classify(status), expected(status), "status {status}");
        }
    }

    #[test]
    fn named_statuses() {
        let table = [
            (200, Class::Delivered),
            (201, Class::Delivered),
            (202, Class::Delivered),
            (204, Class::Delivered),
            (299, Class::Delivered),
            (100, Class::Retry),
            (199, Class::Retry),
            (301, Class::Retry),
            (302, Class::Retry),
            (307, Class::Retry),
            (308, Class::Retry),
            (400, Class::Permanent),
            (401, Class::Permanent),
            (403, Class::Permanent),
            (404, Class::RetryLimited),
            (405, Class::Retry),
            (408, Class::Retry),
            (409, Class::Retry),
            (410, Class::Permanent),
            (413, Class::Retry),
            (422, Class::Permanent),
            (429, Class::Retry),
            (500, Class::Retry),
            (502, Class::Retry),
            (503, Class::Retry),
            (504, Class::Retry),
            (599, Class::Retry),
        ];
        for (status, class) in table {
            assert_eq!(classify(status), class, "status {status}");
        }
    }

    #[test]
    fn out_of_range_statuses_retry() {
        for status in [0, 1, 99, 600, 999, u16::MAX] {
            assert_eq!(classify(status), Class::Retry, "status {status}");
        }
    }

    fn rules(list: &[(&str, Class)]) -> StatusRules {
        StatusRules::new(list.iter().map(|(s, c)| (s.parse().unwrap(), *c))).unwrap()
    }

    #[test]
    fn status_matches_parse_and_print() {
        let table = [
            ("404", StatusMatch::Code(404)),
            (" 100 ", StatusMatch::Code(100)),
            ("599", StatusMatch::Code(599)),
            ("4xx", StatusMatch::Hundred(4)),
            ("5XX", StatusMatch::Hundred(5)),
            ("1xx", StatusMatch::Hundred(1)),
        ];
        for (text, want) in table {
            assert_eq!(text.parse::<StatusMatch>(), Ok(want), "{text:?}");
            assert_eq!(want.to_string().parse::<StatusMatch>(), Ok(want));
        }
        for bad in [
            "", "99", "600", "0404", "4x", "6xx", "0xx", "xx", "-1", "4044", "2 0 0", "abc",
        ] {
            assert_eq!(
                bad.parse::<StatusMatch>(),
                Err(StatusError::Invalid(bad.to_string())),
                "{bad:?}"
            );
        }
        assert_eq!(StatusMatch::code(404), Some(StatusMatch::Code(404)));
        for bad in [-1, 0, 99, 600, 70_000] {
            assert_eq!(StatusMatch::code(bad), None, "{bad}");
        }
        assert!(StatusMatch::Hundred(4).matches(499));
        assert!(!StatusMatch::Hundred(4).matches(500));
        assert!(StatusMatch::Code(409).matches(409));
        assert!(!StatusMatch::Code(409).matches(410));
    }

    #[test]
    fn rules_conflict_only_when_one_status_gets_two_classes() {
        let conflict = StatusRules::new([
            (StatusMatch::Code(409), Class::Delivered),
            (StatusMatch::Code(409), Class::Permanent),
        ]);
        assert_eq!(
            conflict,
            Err(StatusError::Conflict {
                status: StatusMatch::Code(409),
                first: "success",
                second: "permanent"
            })
        );
        assert_eq!(
            conflict.unwrap_err().to_string(),
            "409 is listed as both success and permanent"
        );
        let range = StatusRules::new([
            (StatusMatch::Hundred(5), Class::Retry),
            (StatusMatch::Hundred(5), Class::RetryLimited),
        ]);
        assert!(matches!(range, Err(StatusError::Conflict { .. })));
        // The same class twice, or a code inside a hundred given another class: fine.
        let r = rules(&[
            ("404", Class::Permanent),
            ("404", Class::Permanent),
            ("4xx", Class::Retry),
        ]);
        assert_eq!(r.iter().count(), 2);
        assert_eq!(r.lookup(404), Some(Class::Permanent));
        assert_eq!(r.lookup(400), Some(Class::Retry));
        assert_eq!(r.lookup(500), None);
        assert!(StatusRules::default().is_empty());
    }

    #[test]
    fn an_exact_code_wins_over_its_hundred_whatever_the_order_written() {
        let r = rules(&[("4xx", Class::Permanent), ("429", Class::Retry)]);
        assert_eq!(r.lookup(429), Some(Class::Retry));
        assert_eq!(r.lookup(404), Some(Class::Permanent));
        let order: Vec<String> = r.iter().map(|(s, _)| s.to_string()).collect();
        assert_eq!(order, ["429", "4xx"]);
    }

    #[test]
    fn layers_are_consulted_most_specific_first_then_the_seed_table() {
        let endpoint = rules(&[("409", Class::Delivered), ("4xx", Class::Permanent)]);
        let route = rules(&[
            ("404", Class::Retry),
            ("409", Class::Permanent),
            ("500", Class::Permanent),
        ]);
        let global = rules(&[("503", Class::RetryLimited), ("404", Class::Permanent)]);
        let s = Statuses::layered([Some(&endpoint), Some(&route), Some(&global)]);
        let table = [
            (409, Class::Delivered),    // endpoint beats route
            (404, Class::Permanent),    // endpoint's 4xx beats the route's exact 404
            (429, Class::Permanent),    // endpoint's 4xx
            (500, Class::Permanent),    // route
            (503, Class::RetryLimited), // [retry]
            (502, Class::Retry),        // seed
            (200, Class::Delivered),    // seed
            (302, Class::Retry),        // seed
            (0, Class::Retry),          // outside HTTP: seed
        ];
        for (status, want) in table {
            assert_eq!(s.classify(status), want, "{status}");
        }
        let only_route = Statuses::layered([None, Some(&route), None]);
        assert_eq!(only_route.classify(404), Class::Retry);
        assert_eq!(only_route.classify(410), Class::Permanent, "the seed's");
        assert_eq!(s.layers().count(), 3);
        let empty = StatusRules::default();
        assert_eq!(
            Statuses::layered([Some(&empty), None, Some(&global)]).layers().count(),
            1
        );
    }

    #[test]
    fn with_no_rules_every_status_follows_the_seed_table() {
        let empty = StatusRules::default();
        for s in [
            Statuses::seed(),
            Statuses::layered([Some(&empty), Some(&empty), Some(&empty)]),
        ] {
            for status in 0..=700u16 {
                assert_eq!(s.classify(status), classify(status), "{status}");
            }
        }
    }

    #[test]
    fn class_names() {
        let names: Vec<&str> = Class::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names, ["success", "retry", "permanent", "retry_limited"]);
        let bytes: std::collections::HashSet<u8> = Class::ALL.iter().map(|c| *c as u8).collect();
        assert_eq!(bytes.len(), 4);
    }
}
