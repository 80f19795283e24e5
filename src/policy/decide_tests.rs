//! Tests of [`super::decide`]: the outcome table, Retry-After, give-up by attempts and
//! time, the 404 cap, schedules, status rules and jitter, with exact times.

use super::*;
use crate::model::{Jitter, Transition};
use crate::policy::backoff::Backoff;
use crate::policy::classify::{StatusMatch, StatusRules};
use rand::rngs::StdRng;
use rand::SeedableRng;

const NOW: u64 = 1_700_000_000_000;
const SEC: u64 = 1_000;
const MIN: u64 = 60 * SEC;
const HOUR: u64 = 60 * MIN;
/// `NOW` as an HTTP-date (2023-11-14T22:13:20Z).
const NOW_DATE: &str = "Tue, 14 Nov 2023 22:13:20 GMT";

/// The settings of an attempt; its give-up values are not read (the message's [`Limits`] are).
fn policy(jitter: Jitter) -> RetryPolicy<Statuses<'static>> {
    RetryPolicy {
        backoff: Backoff::Exponential {
            base_ms: MIN,
            max_ms: HOUR,
        },
        jitter,
        max_attempts: 1,
        give_up_after: Duration::ZERO,
        max_attempts_404: 5,
        max_retry_after: Duration::from_millis(24 * HOUR),
        request_timeout: Duration::from_secs(30),
        max_in_flight: None,
        statuses: Statuses::seed(),
    }
}

fn limits() -> Limits {
    Limits {
        max_attempts: 16,
        give_up_at_ms: NOW + 72 * HOUR,
    }
}

fn status(code: u16) -> AttemptResult {
    AttemptResult::Status {
        code,
        retry_after: None,
    }
}

fn status_ra(code: u16, retry_after: &str) -> AttemptResult {
    AttemptResult::Status {
        code,
        retry_after: Some(retry_after.to_string()),
    }
}

fn retry_in(ms: u64) -> Transition {
    Transition::RetryAt(NOW + ms)
}

const DEAD_MAX: Transition = Transition::Dead(DeadReason::MaxAttempts);
const DEAD_EXPIRED: Transition = Transition::Dead(DeadReason::Expired);
const DEAD_PERMANENT: Transition = Transition::Dead(DeadReason::PermanentStatus);

fn run(result: &AttemptResult, attempts: u32, limits: &Limits, policy: &RetryPolicy<Statuses>) -> Transition {
    decide(
        result,
        attempts,
        limits,
        policy,
        NOW,
        NOW,
        &mut StdRng::seed_from_u64(1),
    )
}

#[test]
fn outcome_table_with_default_limits() {
    let p = policy(Jitter::None);
    let l = limits();
    let table: Vec<(AttemptResult, u32, Transition)> = vec![
        (status(200), 1, Transition::Delivered),
        (status(204), 16, Transition::Delivered),
        (status(299), 99, Transition::Delivered),
        (status(400), 1, DEAD_PERMANENT),
        (status(401), 1, DEAD_PERMANENT),
        (status(403), 1, DEAD_PERMANENT),
        (status(410), 1, DEAD_PERMANENT),
        (status(422), 1, DEAD_PERMANENT),
        (
            AttemptResult::EgressDenied,
            1,
            Transition::Dead(DeadReason::EgressDenied),
        ),
        (AttemptResult::NetworkError, 1, retry_in(MIN)),
        (AttemptResult::NetworkError, 2, retry_in(2 * MIN)),
        (status(500), 3, retry_in(4 * MIN)),
        (status(502), 4, retry_in(8 * MIN)),
        (status(408), 5, retry_in(16 * MIN)),
        (status(429), 6, retry_in(32 * MIN)),
        (status(503), 7, retry_in(HOUR)),
        (status(302), 8, retry_in(HOUR)),
        (status(418), 15, retry_in(HOUR)),
        (status(100), 1, retry_in(MIN)),
        (status(500), 16, DEAD_MAX),
        (AttemptResult::NetworkError, 16, DEAD_MAX),
        (status(500), 17, DEAD_MAX),
        (status(404), 1, retry_in(MIN)),
        (status(404), 4, retry_in(8 * MIN)),
        (status(404), 5, DEAD_MAX),
        (status(404), 6, DEAD_MAX),
        // A permanent status wins even past the attempt cap.
        (status(410), 16, DEAD_PERMANENT),
    ];
    for (result, attempts, want) in table {
        assert_eq!(
            run(&result, attempts, &l, &p),
            want,
            "{result:?} after {attempts} attempts"
        );
    }
}

#[test]
fn retry_after_seconds_on_429_and_503_stretches_the_backoff() {
    let p = policy(Jitter::None);
    let l = limits();
    let table = [
        (status_ra(429, "120"), 1, retry_in(120 * SEC)),
        (status_ra(503, "120"), 1, retry_in(120 * SEC)),
        (status_ra(503, " 7200 "), 3, retry_in(2 * HOUR)),
        // Shorter than the backoff: the backoff wins.
        (status_ra(429, "5"), 1, retry_in(MIN)),
        (status_ra(429, "0"), 2, retry_in(2 * MIN)),
        // Unparsable: the backoff alone.
        (status_ra(429, "soon"), 1, retry_in(MIN)),
        (status_ra(503, "-5"), 1, retry_in(MIN)),
        (status_ra(503, "1.5"), 1, retry_in(MIN)),
        (status_ra(503, ""), 1, retry_in(MIN)),
    ];
    for (result, attempts, want) in table {
        assert_eq!(run(&result, attempts, &l, &p), want, "{result:?}");
    }
}

#[test]
fn retry_after_http_date_on_429_and_503() {
    let p = policy(Jitter::None);
    let l = limits();
    let in_3h = "Wed, 15 Nov 2023 01:13:20 GMT";
    assert_eq!(run(&status_ra(429, in_3h), 1, &l, &p), retry_in(3 * HOUR));
    assert_eq!(run(&status_ra(503, in_3h), 1, &l, &p), retry_in(3 * HOUR));
    assert_eq!(
        run(&status_ra(503, "Wednesday, 15-Nov-23 01:13:20 GMT"), 1, &l, &p),
        retry_in(3 * HOUR)
    );
    assert_eq!(
        run(&status_ra(503, "Wed Nov 15 01:13:20 2023"), 1, &l, &p),
        retry_in(3 * HOUR)
    );
    // Now or in the past: no extra wait, the backoff applies.
    assert_eq!(run(&status_ra(429, NOW_DATE), 2, &l, &p), retry_in(2 * MIN));
    assert_eq!(
        run(&status_ra(429, "Mon, 01 Jan 2001 00:00:00 GMT"), 1, &l, &p),
        retry_in(MIN)
    );
}

/// A date is read against the wall clock, a delay counted on courier's: with courier's time
/// an hour ahead (a wall clock stepped back), a date three hours away on the wall clock
/// is still three hours away.
#[test]
fn a_retry_after_date_counts_from_the_wall_clock() {
    let (p, l) = (policy(Jitter::None), limits());
    let in_3h = "Wed, 15 Nov 2023 01:13:20 GMT";
    let courier_ahead = NOW + HOUR;
    let got = decide(
        &status_ra(503, in_3h),
        1,
        &l,
        &p,
        courier_ahead,
        NOW,
        &mut StdRng::seed_from_u64(1),
    );
    assert_eq!(got, Transition::RetryAt(courier_ahead + 3 * HOUR));
}

#[test]
fn retry_after_is_ignored_on_other_statuses() {
    let p = policy(Jitter::None);
    let l = limits();
    for code in [500, 502, 504, 408, 404, 302, 418] {
        assert_eq!(run(&status_ra(code, "7200"), 1, &l, &p), retry_in(MIN), "status {code}");
    }
    // And it never rescues a permanent status or a success.
    assert_eq!(run(&status_ra(410, "60"), 1, &l, &p), DEAD_PERMANENT);
    assert_eq!(run(&status_ra(200, "60"), 1, &l, &p), Transition::Delivered);
}

#[test]
fn retry_after_is_capped_by_max_retry_after() {
    let mut p = policy(Jitter::None);
    let l = Limits {
        max_attempts: 16,
        give_up_at_ms: u64::MAX,
    };
    assert_eq!(run(&status_ra(429, "999999999"), 1, &l, &p), retry_in(24 * HOUR));
    assert_eq!(run(&status_ra(503, &"9".repeat(40)), 1, &l, &p), retry_in(24 * HOUR));
    assert_eq!(
        run(&status_ra(429, "Fri, 31 Dec 9999 23:59:59 GMT"), 1, &l, &p),
        retry_in(24 * HOUR)
    );
    p.max_retry_after = Duration::from_millis(10 * MIN);
    assert_eq!(run(&status_ra(429, "3600"), 1, &l, &p), retry_in(10 * MIN));
    // The cap limits Retry-After, never the backoff itself.
    assert_eq!(run(&status_ra(429, "3600"), 7, &l, &p), retry_in(HOUR));
    p.max_retry_after = Duration::ZERO;
    assert_eq!(run(&status_ra(503, "3600"), 1, &l, &p), retry_in(MIN));
}

#[test]
fn a_retry_past_the_give_up_time_expires() {
    let p = policy(Jitter::None);
    let l = Limits {
        max_attempts: 16,
        give_up_at_ms: NOW + 30 * MIN,
    };
    assert_eq!(run(&status(500), 5, &l, &p), retry_in(16 * MIN));
    assert_eq!(run(&status(500), 6, &l, &p), DEAD_EXPIRED);
    // Exactly at the give-up time is still allowed.
    let edge = Limits {
        max_attempts: 16,
        give_up_at_ms: NOW + 32 * MIN,
    };
    assert_eq!(run(&status(500), 6, &edge, &p), retry_in(32 * MIN));
    // Retry-After pushing past it expires.
    assert_eq!(run(&status_ra(429, "1800"), 1, &l, &p), retry_in(30 * MIN));
    assert_eq!(run(&status_ra(429, "1801"), 1, &l, &p), DEAD_EXPIRED);
    assert_eq!(
        run(&status_ra(503, "Wed, 15 Nov 2023 01:13:20 GMT"), 1, &l, &p),
        DEAD_EXPIRED
    );
    // Already past the give-up time.
    let past = Limits {
        max_attempts: 16,
        give_up_at_ms: NOW - 1,
    };
    assert_eq!(run(&AttemptResult::NetworkError, 1, &past, &p), DEAD_EXPIRED);
    // The attempt cap is checked first.
    assert_eq!(run(&status(500), 16, &past, &p), DEAD_MAX);
}

#[test]
fn the_404_cap_is_the_smaller_of_both_limits() {
    let mut p = policy(Jitter::None);
    let l3 = Limits {
        max_attempts: 3,
        give_up_at_ms: u64::MAX,
    };
    assert_eq!(run(&status(404), 2, &l3, &p), retry_in(2 * MIN));
    assert_eq!(run(&status(404), 3, &l3, &p), DEAD_MAX);
    p.max_attempts_404 = 1;
    assert_eq!(run(&status(404), 1, &limits(), &p), DEAD_MAX);
    assert_eq!(run(&status(500), 1, &limits(), &p), retry_in(MIN));
    p.max_attempts_404 = 100;
    assert_eq!(run(&status(404), 15, &limits(), &p), retry_in(HOUR));
    assert_eq!(run(&status(404), 16, &limits(), &p), DEAD_MAX);
}

#[test]
fn per_message_max_attempts_override() {
    let p = policy(Jitter::None);
    let one = Limits {
        max_attempts: 1,
        give_up_at_ms: u64::MAX,
    };
    assert_eq!(run(&status(500), 1, &one, &p), DEAD_MAX);
    assert_eq!(run(&status(200), 1, &one, &p), Transition::Delivered);
    let many = Limits {
        max_attempts: 100,
        give_up_at_ms: u64::MAX,
    };
    assert_eq!(run(&status(500), 50, &many, &p), retry_in(HOUR));
    assert_eq!(run(&status(500), 100, &many, &p), DEAD_MAX);
    let zero = Limits {
        max_attempts: 0,
        give_up_at_ms: u64::MAX,
    };
    assert_eq!(run(&status(500), 1, &zero, &p), DEAD_MAX);
}

#[test]
fn jittered_delays_with_a_fixed_seed() {
    let l = limits();
    let equal = policy(Jitter::Equal);
    let full = policy(Jitter::Full);
    let mut rng = StdRng::seed_from_u64(7);
    let got: Vec<Transition> = (1..=4)
        .map(|n| decide(&status(500), n, &l, &equal, NOW, NOW, &mut rng))
        .collect();
    assert_eq!(got, EQUAL_SEED_7.map(retry_in).to_vec());
    for (n, d) in (1..=4).zip(&got) {
        let Transition::RetryAt(at_ms) = d else { panic!("{d:?}") };
        let base = MIN << (n - 1);
        assert!(*at_ms >= NOW + base / 2 && *at_ms <= NOW + base, "n = {n}");
    }
    let mut rng = StdRng::seed_from_u64(7);
    let got: Vec<Transition> = (1..=4)
        .map(|n| decide(&status(500), n, &l, &full, NOW, NOW, &mut rng))
        .collect();
    assert_eq!(got, FULL_SEED_7.map(retry_in).to_vec());
    // Retry-After still wins over a jittered (shorter) backoff.
    let mut rng = StdRng::seed_from_u64(7);
    assert_eq!(
        decide(&status_ra(503, "600"), 1, &l, &full, NOW, NOW, &mut rng),
        retry_in(10 * MIN)
    );
}

const EQUAL_SEED_7: [u64; 4] = [30_909, 78_425, 137_117, 370_204];
const FULL_SEED_7: [u64; 4] = [1_819, 36_850, 34_234, 260_408];

#[test]
fn no_overflow_at_the_end_of_time() {
    let p = policy(Jitter::None);
    let l = Limits {
        max_attempts: 16,
        give_up_at_ms: u64::MAX,
    };
    assert_eq!(
        decide(
            &status(500),
            1,
            &l,
            &p,
            u64::MAX - 1,
            u64::MAX - 1,
            &mut StdRng::seed_from_u64(0)
        ),
        Transition::RetryAt(u64::MAX)
    );
}

/// Svix's default schedule, in millis: 5s, 5m, 30m, 2h, 5h, 10h, 10h.
fn svix() -> Backoff {
    Backoff::schedule(&[5, 300, 1800, 7200, 18_000, 36_000, 36_000].map(Duration::from_secs)).unwrap()
}

#[test]
fn a_schedule_gives_each_retry_its_listed_delay() {
    let schedule = svix();
    let p = RetryPolicy {
        backoff: schedule.clone(),
        ..policy(Jitter::None)
    };
    let l = Limits {
        max_attempts: 8,
        give_up_at_ms: u64::MAX,
    };
    let want = [5 * SEC, 5 * MIN, 30 * MIN, 2 * HOUR, 5 * HOUR, 10 * HOUR, 10 * HOUR];
    for (n, ms) in (1..=7).zip(want) {
        assert_eq!(run(&status(503), n, &l, &p), retry_in(ms), "after {n} attempts");
    }
    assert_eq!(run(&status(503), 8, &l, &p), DEAD_MAX, "8 attempts: the list is spent");
    // With more attempts allowed, the last delay repeats.
    let more = Limits {
        max_attempts: 12,
        give_up_at_ms: u64::MAX,
    };
    assert_eq!(run(&status(500), 8, &more, &p), retry_in(10 * HOUR));
    assert_eq!(run(&status(500), 11, &more, &p), retry_in(10 * HOUR));
    assert_eq!(run(&status(500), 12, &more, &p), DEAD_MAX);
    // And the give-up time still ends it first when it comes first.
    let short = Limits {
        max_attempts: 8,
        give_up_at_ms: NOW + 3 * HOUR,
    };
    assert_eq!(run(&status(500), 4, &short, &p), retry_in(2 * HOUR));
    assert_eq!(run(&status(500), 5, &short, &p), DEAD_EXPIRED);
}

#[test]
fn retry_after_still_wins_over_a_schedule_capped_by_max_retry_after() {
    let schedule = svix();
    let mut p = RetryPolicy {
        backoff: schedule.clone(),
        ..policy(Jitter::None)
    };
    let l = Limits {
        max_attempts: 8,
        give_up_at_ms: u64::MAX,
    };
    assert_eq!(run(&status_ra(429, "60"), 1, &l, &p), retry_in(MIN), "60s over 5s");
    assert_eq!(run(&status_ra(503, "60"), 2, &l, &p), retry_in(5 * MIN), "5m over 60s");
    p.max_retry_after = Duration::from_millis(20 * MIN);
    assert_eq!(run(&status_ra(503, "7200"), 1, &l, &p), retry_in(20 * MIN), "capped");
    assert_eq!(
        run(&status_ra(500, "7200"), 1, &l, &p),
        retry_in(5 * SEC),
        "only 429 and 503"
    );
}

#[test]
fn jitter_applies_to_a_schedule() {
    let schedule = svix();
    let l = limits();
    for jitter in [Jitter::Equal, Jitter::Full] {
        let p = RetryPolicy {
            backoff: schedule.clone(),
            ..policy(jitter)
        };
        let mut rng = StdRng::seed_from_u64(11);
        for n in 1..=7 {
            let Transition::RetryAt(at_ms) = decide(&status(500), n, &l, &p, NOW, NOW, &mut rng) else {
                panic!("retry expected")
            };
            let base = schedule.base(n).as_millis() as u64;
            let lower = if jitter == Jitter::Equal { base - base / 2 } else { 0 };
            assert!(
                (NOW + lower..=NOW + base).contains(&at_ms),
                "{jitter:?} n = {n}: {} not in [{lower}, {base}]",
                at_ms - NOW
            );
        }
    }
}

#[test]
fn status_rules_change_the_decision() {
    let endpoint = StatusRules::new([
        (StatusMatch::Code(404), Class::Permanent),
        (StatusMatch::Code(409), Class::Delivered),
        (StatusMatch::Code(410), Class::Retry),
        (StatusMatch::Code(500), Class::RetryLimited),
    ])
    .unwrap();
    let p = RetryPolicy {
        statuses: Statuses::layered([Some(&endpoint), None, None]),
        ..policy(Jitter::None)
    };
    let l = limits();
    let table = [
        (status(404), 1, DEAD_PERMANENT),
        (status(409), 1, Transition::Delivered),
        (status(410), 1, retry_in(MIN)),
        (status(410), 16, DEAD_MAX),
        (status(500), 4, retry_in(8 * MIN)),
        (status(500), 5, DEAD_MAX),
        (status(503), 5, retry_in(16 * MIN)),
        (status(400), 1, DEAD_PERMANENT),
        (status(200), 1, Transition::Delivered),
        // Retry-After still applies to a 429/503 the rules leave retried.
        (status_ra(429, "600"), 1, retry_in(10 * MIN)),
    ];
    for (result, attempts, want) in table {
        assert_eq!(run(&result, attempts, &l, &p), want, "{result:?} after {attempts}");
    }
    // A 429 ruled permanent is dead at once, Retry-After or not.
    let strict = StatusRules::new([(StatusMatch::Hundred(4), Class::Permanent)]).unwrap();
    let p = RetryPolicy {
        statuses: Statuses::layered([None, Some(&strict), None]),
        ..policy(Jitter::None)
    };
    assert_eq!(run(&status_ra(429, "5"), 1, &l, &p), DEAD_PERMANENT);
    assert_eq!(run(&status(404), 1, &l, &p), DEAD_PERMANENT);
    assert_eq!(run(&AttemptResult::NetworkError, 1, &l, &p), retry_in(MIN));
    assert_eq!(
        run(&AttemptResult::EgressDenied, 1, &l, &p),
        Transition::Dead(DeadReason::EgressDenied)
    );
}

#[test]
fn a_status_ruled_success_is_delivered_and_a_retry_given_up_on_stays_one() {
    let rules = StatusRules::new([(StatusMatch::Code(409), Class::Delivered)]).unwrap();
    let p = RetryPolicy {
        statuses: Statuses::layered([Some(&rules), None, None]),
        ..policy(Jitter::None)
    };
    let l = limits();
    let table = [
        (status(409), 1, Transition::Delivered),
        (status(500), 16, Transition::Dead(DeadReason::MaxAttempts)),
        (status(404), 5, Transition::Dead(DeadReason::MaxAttempts)),
    ];
    for (result, attempts, want) in table {
        assert_eq!(run(&result, attempts, &l, &p), want, "{result:?} after {attempts}");
    }
}
