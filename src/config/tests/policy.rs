//! The retry-policy keys: `[retry] schedule` and `statuses`, the overrides of `[[route]]`
//! and `[[endpoint]]`, their coded errors, the policy book built from them, and the lines
//! `check-config` prints.

use super::*;
use crate::policy::{Backoff, Class};

const POLICIES: &str = r#"
[retry]
schedule = ["5s", "5m", "30m", "2h", "5h", "10h", "10h"]
statuses = { success = [409] }

[delivery]
request_timeout = "20s"

[[route]]
name = "billing"
url = "https://billing.example/hooks"
schedule = ["1s", "10s"]
jitter = "none"
give_up_after = "6h"
statuses = { permanent = [404, "5xx"], retry = [503] }

[[route]]
name = "bulk"
url = "https://bulk.example/in"
base_delay = "10s"
max_attempts = 30

[[endpoint]]
key = "https://Billing.example/hooks"
max_in_flight = 2
request_timeout = "5s"
max_attempts_404 = 1
statuses.retry_limited = [409]

[[endpoint]]
key = "https://slow.example/hook"
rate_per_second = 5
"#;

#[test]
fn the_keys_parse_with_a_schedule_standing_for_its_attempts() {
    let c = parse(POLICIES);
    c.validate().unwrap();
    let r = &c.retry;
    assert_eq!(
        r.schedule,
        Some(vec![
            secs(5),
            secs(300),
            secs(1800),
            secs(7200),
            secs(18_000),
            secs(36_000),
            secs(36_000)
        ])
    );
    assert_eq!(r.max_attempts, 8, "a schedule of 7 delays means 8 attempts");
    assert_eq!(r.statuses.lookup(409), Some(Class::Delivered));
    let billing = &c.routes[0].policy;
    assert_eq!(billing.schedule, Some(vec![secs(1), secs(10)]));
    assert_eq!(billing.max_attempts, Some(3));
    assert_eq!(billing.jitter, Some(Jitter::None));
    assert_eq!(billing.give_up_after, Some(secs(6 * 3600)));
    assert_eq!(billing.statuses.lookup(503), Some(Class::Retry), "exact beats 5xx");
    assert_eq!(billing.statuses.lookup(502), Some(Class::Permanent));
    let bulk = &c.routes[1].policy;
    assert_eq!(
        (bulk.base_delay, bulk.max_delay, bulk.max_attempts),
        (Some(secs(10)), None, Some(30))
    );
    let e = &c.endpoints[0];
    assert_eq!(e.key, "https://billing.example/hooks", "normalised like a live target");
    assert_eq!(e.rate_per_second, None);
    assert_eq!(e.policy.max_in_flight, Some(2));
    assert_eq!(e.policy.statuses.lookup(409), Some(Class::RetryLimited));
    assert!(c.endpoints[1].policy.is_empty());
    assert_eq!(c.endpoints[1].rate_per_second, Some(5));

    // max_attempts given alongside a schedule wins.
    let explicit = parse("[retry]\nschedule = [\"1s\"]\nmax_attempts = 5\n");
    assert_eq!(explicit.retry.max_attempts, 5);
    let route = parse("[[route]]\nname = \"r\"\nurl = \"https://r.example\"\nschedule = [\"1s\"]\nmax_attempts = 9\n");
    assert_eq!(route.routes[0].policy.max_attempts, Some(9));
}

#[test]
fn the_book_resolves_endpoint_then_route_then_global() {
    let c = parse(POLICIES);
    let book = c.policy_book();
    let both = book.resolve(Some("billing"), "https://billing.example/hooks");
    assert_eq!(both.backoff.steps(), Some(&[1_000, 10_000][..]), "route's schedule");
    assert_eq!(both.jitter, Jitter::None, "route");
    assert_eq!(both.max_attempts, 3, "route's schedule length + 1");
    assert_eq!(both.give_up_after, secs(6 * 3600), "route");
    assert_eq!(both.request_timeout, secs(5), "endpoint");
    assert_eq!(both.max_attempts_404, 1, "endpoint");
    assert_eq!(both.max_in_flight, Some(2), "endpoint");
    let s = both.statuses;
    assert_eq!(s.classify(409), Class::RetryLimited, "endpoint over [retry]");
    assert_eq!(s.classify(404), Class::Permanent, "route");
    assert_eq!(s.classify(503), Class::Retry, "route");
    assert_eq!(s.classify(410), Class::Permanent, "seed");

    // The route's exponential keys fill in from [retry]'s, not from its schedule.
    let bulk = book.resolve(Some("bulk"), "https://bulk.example/in");
    assert_eq!(
        bulk.backoff,
        Backoff::Exponential {
            base_ms: 10_000,
            max_ms: 3_600_000
        }
    );
    assert_eq!(bulk.max_attempts, 30);
    assert_eq!(bulk.request_timeout, secs(20), "[delivery]'s");
    assert_eq!(bulk.statuses.classify(409), Class::Delivered, "[retry]'s rule");

    let plain = book.resolve(None, "https://slow.example/hook");
    let sections = book.sections(None, "https://slow.example/hook");
    assert_eq!(sections, (None, None), "a rate alone changes no policy");
    assert_eq!(plain.max_attempts, 8);
    assert_eq!(plain.backoff.steps().map(<[u64]>::len), Some(7));
    assert_eq!(
        book.endpoint_caps().collect::<Vec<_>>(),
        [("https://billing.example/hooks", 2)]
    );
}

/// Each coded rule: a TOML snippet breaking it, its code, and text the line must contain.
const CODED: &[(&str, &str, &str)] = &[
    ("[retry]\nschedule = []", "empty_schedule", "retry.schedule must list at least one delay"),
    ("[retry]\nschedule = [\"5s\", \"soon\"]", "invalid_duration", "retry.schedule[1]: invalid duration \"soon\""),
    ("[retry]\nschedule = [\"5s\", \"0s\"]", "invalid_duration", "retry.schedule[1] must be at least 1ms"),
    ("[retry]\nschedule = [\"5s\"]\nmax_delay = \"1h\"", "conflicting_backoff", "retry: schedule and base_delay/max_delay"),
    (
        "[[route]]\nname = \"r\"\nurl = \"https://r.example\"\nschedule = [\"1s\"]\nbase_delay = \"1s\"",
        "conflicting_backoff",
        "route[0]: schedule and base_delay/max_delay are both set",
    ),
    (
        "[[endpoint]]\nkey = \"k\"\nschedule = []",
        "empty_schedule",
        "endpoint[0].schedule must list at least one delay",
    ),
    ("[[endpoint]]\nkey = \"k\"\ngive_up_after = \"6 hours\"", "invalid_duration", "endpoint[0].give_up_after: invalid duration"),
    ("[[endpoint]]\nkey = \"k\"\njitter = \"half\"", "invalid_value", "endpoint[0].jitter: unknown jitter"),
    (
        "[[endpoint]]\nkey = \"k\"\nstatuses = { success = [409], permanent = [409] }",
        "status_class_conflict",
        "endpoint[0].statuses: 409 is listed as both success and permanent",
    ),
    (
        "[retry]\nstatuses = { retry = [\"5xx\"], retry_limited = [\"5XX\"] }",
        "status_class_conflict",
        "retry.statuses: 5xx is listed as both retry and retry_limited",
    ),
    (
        "[[endpoint]]\nkey = \"k\"\nstatuses = { success = [700] }",
        "invalid_status",
        "endpoint[0].statuses.success[0]: 700 is not an HTTP status",
    ),
    (
        "[[endpoint]]\nkey = \"k\"\nstatuses = { permanent = [404, \"6xx\"] }",
        "invalid_status",
        "endpoint[0].statuses.permanent[1]: \"6xx\" is not an HTTP status",
    ),
    (
        "[[route]]\nname = \"r\"\nurl = \"https://R.example/in\"\nmax_in_flight = 2",
        "per_endpoint_setting",
        "route[0].max_in_flight: the in-flight cap is per endpoint; set it in an [[endpoint]] with key = \"https://r.example/in\"",
    ),
    ("[[endpoint]]\nkey = \"k\"", "empty_section", "endpoint[0]: sets nothing (give rate_per_second, ordering or a retry setting)"),
    ("[[endpoint]]\nkey = \"k\"\nmax_attempts = 0", "invalid_policy_value", "endpoint[0].max_attempts must be at least 1"),
    ("[[endpoint]]\nkey = \"k\"\nmax_in_flight = 0", "invalid_policy_value", "endpoint[0].max_in_flight must be at least 1"),
    (
        "[[route]]\nname = \"r\"\nurl = \"https://r.example\"\nmax_attempts_404 = 0",
        "invalid_policy_value",
        "route[0].max_attempts_404 must be at least 1",
    ),
    ("[[endpoint]]\nkey = \"k\"\nrequest_timeout = \"0s\"", "invalid_policy_value", "endpoint[0].request_timeout must be greater than 0"),
    ("[[endpoint]]\nkey = \"k\"\ngive_up_after = \"0\"", "invalid_policy_value", "endpoint[0].give_up_after must be greater than 0"),
    (
        "[[endpoint]]\nkey = \"k\"\nbase_delay = \"2h\"",
        "invalid_policy_value",
        "endpoint[0].max_delay (1h) must be at least the section's base_delay (2h)",
    ),
    ("[[endpoint]]\nkey = \"k\"\nbase_delay = \"0s\"", "invalid_policy_value", "endpoint[0].base_delay must be at least 1ms"),
];

fn load_error(text: &str) -> ConfigError {
    match Config::from_toml_str(text, "p.toml") {
        Ok(c) => c.validate().expect_err(text),
        Err(e) => e,
    }
}

#[test]
fn every_policy_rule_fails_with_its_code() {
    for (text, code, want) in CODED {
        let e = load_error(text);
        let line = e.to_string();
        assert_eq!(e.code(), Some(*code), "{text:?}: {line}");
        assert!(line.contains(want), "{text:?}: got {line:?}, want {want:?}");
        assert!(line.ends_with(&format!(" [{code}]")), "{line}");
        assert!(!line.contains('\n'), "{line}");
    }
    let long = format!("[retry]\nschedule = [{}]", vec!["\"1s\""; 1001].join(", "));
    let e = load_error(&long);
    assert_eq!(e.code(), Some("schedule_too_long"), "{e}");
    assert!(
        e.to_string().contains("retry.schedule lists 1001 delays; at most 1000"),
        "{e}"
    );
    // Rules without a code keep their line as it was.
    let plain = load_error("[retry]\nmax_attempts = 0");
    assert_eq!(plain.code(), None);
    assert!(!plain.to_string().contains('['), "{plain}");
}

#[test]
fn a_wrongly_typed_status_names_its_key() {
    let e = load_error("[[endpoint]]\nkey = \"k\"\nstatuses = { success = [true] }");
    assert!(e.to_string().contains("expected an HTTP status like 404"), "{e}");
    let e = load_error("[[endpoint]]\nkey = \"k\"\nstatuses = { ok = [200] }");
    assert!(e.to_string().contains("unknown key"), "{e}");
}

#[test]
fn the_schedule_variable_sets_the_schedule_and_its_attempts() {
    let load = |pairs: &[(&str, &str)]| Config::load(&Overrides::default(), &env_from(pairs));
    let c = load(&[("COURIER_RETRY_SCHEDULE", "1s,1m")]).unwrap();
    assert_eq!(c.retry.schedule, Some(vec![secs(1), secs(60)]));
    assert_eq!(c.retry.max_attempts, 3);
    let c = load(&[("COURIER_RETRY_SCHEDULE", "1s"), ("COURIER_RETRY_MAX_ATTEMPTS", "7")]).unwrap();
    assert_eq!(c.retry.max_attempts, 7, "set alongside: it wins");
    let c = load(&[("COURIER_RETRY_SCHEDULE", " ")]).unwrap();
    assert_eq!(c.retry.schedule, None, "blank: no schedule");
    let e = load(&[("COURIER_RETRY_SCHEDULE", "1s,soon")]).unwrap_err();
    assert_eq!(e.code(), Some("invalid_duration"));
    assert!(
        e.to_string()
            .starts_with("COURIER_RETRY_SCHEDULE=\"1s,soon\": the schedule[1]: invalid duration"),
        "{e}"
    );
    let long = vec!["1s"; 1001].join(",");
    for (value, want) in [
        ("0s", "the schedule[0] must be at least 1ms [invalid_duration]"),
        (
            long.as_str(),
            "the schedule lists 1001 delays; at most 1000 are allowed [schedule_too_long]",
        ),
    ] {
        let e = load(&[("COURIER_RETRY_SCHEDULE", value)]).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}

#[test]
fn check_config_prints_each_sections_effective_policy() {
    let c = parse(POLICIES);
    let summary = c.summary();
    let book = c.policy_book();
    let rev =
        |route: Option<&str>, endpoint: &str| crate::policy::revision_text(book.resolve(route, endpoint).revision());
    for want in [
        "retry: base_delay 1m, max_delay 1h, jitter equal, max_attempts 8, max_attempts_404 5, give_up_after 3d, \
         max_retry_after 1d, schedule [5s, 5m, 30m, 2h, 5h, 10h, 10h]",
        &format!(
            "policy [retry]: schedule [5s, 5m, 30m, 2h, 5h, 10h, 10h], jitter equal, max_attempts 8, give_up_after 3d, \
             max_attempts_404 5, max_retry_after 1d, request_timeout 20s, statuses 409 success, seed table; revision {}",
            rev(None, "")
        ),
        &format!(
            "policy route billing with endpoint https://billing.example/hooks: schedule [1s, 10s], jitter none, \
             max_attempts 3, give_up_after 6h, max_attempts_404 1, max_retry_after 1d, request_timeout 5s, \
             max_in_flight 2, statuses 409 retry_limited, 404 permanent, 503 retry, 5xx permanent, 409 success, \
             seed table; revision {}",
            rev(Some("billing"), "https://billing.example/hooks")
        ),
        "policy route bulk: exponential 10s..1h, jitter equal, max_attempts 30,",
        "policy endpoint https://slow.example/hook: schedule [5s, 5m, 30m, 2h, 5h, 10h, 10h], jitter equal, max_attempts 8",
        "endpoint https://billing.example/hooks: rate_per_second 100",
        "endpoint https://slow.example/hook: rate_per_second 5",
    ] {
        assert!(summary.contains(want), "missing {want:?} in:\n{summary}");
    }
    let default = Config::default().summary();
    assert!(
        default.contains(
            "policy [retry]: exponential 1m..1h, jitter equal, max_attempts 16, give_up_after 3d, max_attempts_404 5, \
             max_retry_after 1d, request_timeout 30s, statuses seed table; revision "
        ),
        "{default}"
    );
}
