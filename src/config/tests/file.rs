//! The TOML layer: unknown keys, bad values, and what its errors may show.

use super::*;
use crate::config::file::redact_quoted_string;

#[test]
fn unknown_keys_are_rejected_at_every_level() {
    let cases: &[(&str, &str)] = &[
        ("lissten = \"x\"\n", "unknown key \"lissten\" (line 1)"),
        (
            "[retry]\nmax_atempts = 3\n",
            "unknown key \"retry.max_atempts\" (line 2)",
        ),
        ("[delivery]\nrate = 3\n", "unknown key \"delivery.rate\" (line 2)"),
        ("[signing]\nsecret = []\n", "unknown key \"signing.secret\" (line 2)"),
        (
            "[egress]\nallow_private = true\n",
            "unknown key \"egress.allow_private\" (line 2)",
        ),
        (
            "[[route]]\nname = \"a\"\nurl = \"https://a.example\"\nkey = \"k\"\n",
            "unknown key \"route[0].key\" (line 4)",
        ),
        (
            "[[host]]\nhost = \"a:1\"\nmax_in_flight = 1\nrate = 1\n",
            "unknown key \"host[0].rate\" (line 4)",
        ),
        (
            "[[endpoint]]\nkey = \"k\"\nrate = 1\n",
            "unknown key \"endpoint[0].rate\" (line 3)",
        ),
        ("[metrics]\nport = 1\n", "unknown key \"metrics\" (line 1)"),
        ("[[routes]]\nname = \"a\"\n", "unknown key \"routes\" (line 1)"),
    ];
    for (text, want) in cases {
        let msg = Config::from_toml_str(text, "/etc/courier.toml")
            .unwrap_err()
            .to_string();
        assert_eq!(msg, format!("config /etc/courier.toml: {want}"), "{text:?}");
    }
}

#[test]
fn bad_file_values_name_the_key() {
    let cases: &[(&str, &str)] = &[
        (
            "[retry]\nmax_attempts = \"x\"\n",
            "retry.max_attempts: invalid type: a string, expected u32 (line 2)",
        ),
        (
            "[retry]\nmax_attempts = -1\n",
            "retry.max_attempts: invalid value: integer `-1`, expected u32 (line 2)",
        ),
        (
            "max_body = 1048576\n",
            "max_body: invalid type: integer `1048576`, expected a string (line 1)",
        ),
        (
            "[retry]\nbase_delay = 60\n",
            "retry.base_delay: invalid type: integer `60`",
        ),
        (
            "[retry]\nbase_delay = \"5sec\"\n",
            "retry.base_delay: invalid duration \"5sec\"",
        ),
        ("[retry]\njitter = \"half\"\n", "retry.jitter: unknown jitter \"half\""),
        (
            "[delivery]\nmax_response_body = \"1TB\"\n",
            "delivery.max_response_body: invalid size",
        ),
        ("listen = \"localhost\"\n", "listen: expected ip:port"),
        ("admin_listen = \"x:1\"\n", "admin_listen: expected ip:port"),
        ("alert_url = \"::\"\n", "alert_url: not a valid URL"),
        (
            "[signing]\nscheme = \"hmac\"\n",
            "signing.scheme: unknown signature scheme \"hmac\"",
        ),
        (
            "[signing.keys]\nbilling = \"x\"\n",
            "signing.keys.billing: invalid type: a string, expected a list of secrets or a table with secrets and targets (line 2)",
        ),
        (
            "[egress]\nallow = [\"10.0.0.300\"]\n",
            "egress.allow[0]: \"10.0.0.300\" is not",
        ),
        (
            "[egress]\nallow_private_targets = \"yes\"\n",
            "egress.allow_private_targets: invalid type: a string, expected a boolean",
        ),
        ("[[route]]\nname = \"a\"\n", "route[0]: missing key \"url\""),
        (
            "[[route]]\nurl = \"https://a.example\"\n",
            "route[0]: missing key \"name\"",
        ),
        (
            "[[route]]\nname = \"a\"\nurl = \"nope\"\n",
            "route[0].url: not a valid URL",
        ),
        (
            "[[route]]\nname = \"a\"\nurl = \"http:///\"\n",
            "route[0].url: not a valid URL (empty host)",
        ),
        (
            "[[route]]\nname = \"a\"\nurl = \"https://a.example\"\nscheme = \"x\"\n",
            "route[0].scheme: unknown signature scheme",
        ),
        ("[[host]]\nmax_in_flight = 1\n", "host[0]: missing key \"host\""),
        (
            "[[endpoint]]\nkey = \"k\"\n",
            "endpoint[0]: sets nothing (give rate_per_second, ordering or a retry setting)",
        ),
        (
            "[[endpoint]]\nkey = \"k\"\nordering = \"lifo\"\n",
            "endpoint[0].ordering: unknown ordering \"lifo\"",
        ),
        (
            "[[endpoint]]\nkey = \"k\"\nrate_per_second = 1\non_dead = \"block\"\n",
            "endpoint[0].on_dead: applies only with ordering = \"fifo\"",
        ),
        (
            "[[route]]\nname = \"a\"\nurl = \"https://a.example\"\nordering = \"fifo\"\non_dead = \"stop\"\n",
            "route[0].on_dead: unknown on_dead \"stop\"",
        ),
        (
            "[[endpoint]]\nrate_per_second = 1\n",
            "endpoint[0]: missing key \"key\"",
        ),
        ("retry = 3\n", "retry: invalid type: integer `3`"),
        ("listen = \"x\nport = 1\n", "invalid basic string (line 1)"),
        ("listen = \"a\"\nlisten = \"b\"\n", "duplicate key `listen`"),
    ];
    assert_file_errors(cases);
}

#[test]
fn egress_accepts_the_top_level_spellings_of_section_6() {
    let c = parse("allow_private_targets = true\negress_allow = [\"127.0.0.1/32\", \"10.1.0.0/16\"]\n");
    assert!(c.egress.allow_private_targets);
    assert_eq!(c.egress.allow.len(), 2);
    let msg = Config::from_toml_str("egress_allow = []\n[egress]\nallow = []\n", "c.toml")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("egress.allow") && msg.contains("egress_allow"), "{msg}");
    let msg = Config::from_toml_str(
        "allow_private_targets = true\n[egress]\nallow_private_targets = true\n",
        "c.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        msg.contains("egress.allow_private_targets and the top-level allow_private_targets"),
        "{msg}"
    );
}

#[test]
fn quoted_strings_are_removed_from_serde_messages() {
    let cases: &[(&str, &str)] = &[
        (
            "invalid type: string \"whsec_x\", expected u32",
            "invalid type: a string, expected u32",
        ),
        (
            "invalid type: string \"a\\\"b\", expected a sequence",
            "invalid type: a string, expected a sequence",
        ),
        ("invalid type: string \"unterminated", "invalid type: a string"),
        (
            "invalid value: integer `-1`, expected u32",
            "invalid value: integer `-1`, expected u32",
        ),
    ];
    for (message, want) in cases {
        assert_eq!(redact_quoted_string(message), *want);
    }
}

#[test]
fn log_format_is_text_or_json() {
    assert_eq!(Config::default().log.format, LogFormat::Text);
    assert_eq!(parse("[log]\nformat = \"json\"\n").log.format, LogFormat::Json);
    assert_eq!(parse("[log]\nformat = \"text\"\n").log.format, LogFormat::Text);
    let msg = Config::from_toml_str("[log]\nformat = \"xml\"\n", "c.toml")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("log.format: expected \"text\" or \"json\""), "{msg}");
    let msg = Config::from_toml_str("[log]\nlevel = \"debug\"\n", "c.toml")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("unknown key \"log.level\""), "{msg}");
}

/// The retry keys and `ordering`/`on_dead` of a route or an endpoint are read by their own
/// structs (`shape` groups them); an error in one still names the key the file wrote and
/// its line, in both spellings of an array of tables.
#[test]
fn errors_in_grouped_keys_name_the_key_and_the_line() {
    let route = "[[route]]\nname = \"a\"\nurl = \"https://a.example\"\n";
    let cases: &[(&str, &str)] = &[
        (
            "[[endpoint]]\nkey = \"k\"\n\ngive_up_after = \"6 hours\"\n",
            "endpoint[0].give_up_after: invalid duration \"6 hours\": expected a whole number and a unit, \
             like 250ms, 30s, 1m, 1h, 3d (line 4) [invalid_duration]",
        ),
        (
            &format!("{route}statuses = {{ success = [200, 700] }}\n"),
            "route[0].statuses.success[1]: 700 is not an HTTP status from 100 to 599 or a class like \"4xx\" \
             (line 4) [invalid_status]",
        ),
        (
            &format!("{route}[[route]]\nname = \"b\"\nurl = \"https://b.example\"\nordering = \"lifo\"\n"),
            "route[1].ordering: unknown ordering \"lifo\"",
        ),
        (
            &format!("{route}max_attempts = \"8\"\n"),
            "route[0].max_attempts: invalid type: a string, expected u32 (line 4)",
        ),
        (
            "route = [{ name = \"a\", url = \"https://a.example\", jitter = \"half\" }]\n",
            "route[0].jitter: unknown jitter \"half\"",
        ),
        (
            "endpoint = [{ key = \"k\", rate = 1 }]\n",
            "unknown key \"endpoint[0].rate\" (line 1)",
        ),
        (
            "[[host]]\nhost = \"a.example:443\"\nclient_cert = 3\n",
            "host[0].client_cert: invalid type: integer `3`, expected path string (line 3)",
        ),
        ("x = 1\negress_allow = [\"10.0.0.300\"]\n", "unknown key \"x\" (line 1)"),
        (
            "egress_allow = [\"::1\", \"10.0.0.300\"]\n",
            "egress.allow[1]: \"10.0.0.300\" is not an address or CIDR network",
        ),
    ];
    assert_file_errors(cases);
}

#[test]
fn a_schedule_stands_for_its_attempts_in_every_policy_section() {
    let c = parse(concat!(
        "route = [{ name = \"r\", url = \"https://r.example\", schedule = [\"1s\", \"2s\"] }]\n",
        "[retry]\nschedule = [\"1s\"]\n",
        "[[endpoint]]\nkey = \"k\"\nschedule = [\"1s\", \"2s\", \"3s\"]\nmax_attempts = 9\n",
    ));
    assert_eq!(c.retry.max_attempts, 2);
    assert_eq!(c.routes[0].policy.max_attempts, Some(3));
    assert_eq!(c.endpoints[0].policy.max_attempts, Some(9), "written beside it: kept");
    // Only a section that writes nothing else is empty; `ordering = "none"` changes nothing.
    let e = Config::from_toml_str("[[endpoint]]\nkey = \"k\"\nordering = \"none\"\n", "c.toml").unwrap_err();
    assert_eq!(e.code(), Some("empty_section"), "{e}");
}
