//! Classification of a receiver's HTTP status into what courier does next (CONTRACT §3).

/// What one HTTP status means for the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Any 2xx: the receiver has the message.
    Delivered,
    /// Try again later (408, 429, 5xx, 3xx and anything not listed elsewhere).
    Retry,
    /// The receiver will never accept it (400, 401, 403, 410, 422): dead-letter at once.
    Permanent,
    /// 404: retried, but only up to `max_attempts_404` attempts, since a missing route
    /// is often a deploy in progress but rarely stays fixable for days.
    NotFound,
}

/// Classifies a response status. Statuses outside 100..=599 are retried, like any
/// status the contract does not name.
pub fn classify(status: u16) -> Class {
    match status {
        200..=299 => Class::Delivered,
        400 | 401 | 403 | 410 | 422 => Class::Permanent,
        404 => Class::NotFound,
        // 408, 429, 5xx, redirects (never followed) and everything else.
        _ => Class::Retry,
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
            Class::NotFound
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
            (404, Class::NotFound),
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
}
