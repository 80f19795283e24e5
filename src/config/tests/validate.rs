//! Every rule of `Config::validate`, and the formats it checks.

use super::*;
use crate::config::validate::{is_host_port, is_standard_secret};

/// Each validation rule: a TOML snippet breaking it, and the text the error must contain.
const INVALID: &[(&str, &str)] = &[
    ("listen = \"127.0.0.1:9000\"\nadmin_listen = \"127.0.0.1:9000\"", "admin_listen (127.0.0.1:9000) must differ from listen"),
    ("listen = \"0.0.0.0:9000\"\nadmin_listen = \"127.0.0.1:9000\"", "admin_listen (127.0.0.1:9000) must differ from listen"),
    ("data_dir = \"\"", "data_dir must not be empty"),
    ("max_body = \"0\"", "max_body must be at least 1 byte"),
    ("[retry]\nbase_delay = \"0s\"", "retry.base_delay must be greater than 0"),
    ("[retry]\nbase_delay = \"2h\"", "retry.max_delay (1h) must be at least retry.base_delay (2h)"),
    ("[retry]\nmax_attempts = 0", "retry.max_attempts must be at least 1"),
    ("[retry]\nmax_attempts_404 = 0", "retry.max_attempts_404 must be at least 1"),
    ("[retry]\ngive_up_after = \"0\"", "retry.give_up_after must be greater than 0"),
    ("[delivery]\nrequest_timeout = \"0ms\"", "delivery.request_timeout must be greater than 0"),
    (
        "[delivery]\nidle_connection_timeout = \"0s\"",
        "delivery.idle_connection_timeout must be greater than 0",
    ),
    ("[delivery]\nconnect_timeout = \"0s\"", "delivery.connect_timeout must be greater than 0"),
    ("[delivery]\nmax_in_flight = 0", "delivery.max_in_flight must be at least 1"),
    ("[delivery]\nmax_in_flight_per_host = 0", "delivery.max_in_flight_per_host must be at least 1"),
    ("[delivery]\nmax_idle_connections = 0", "delivery.max_idle_connections must be at least 1"),
    ("[delivery]\nrate_per_second = 0", "delivery.rate_per_second must be at least 1"),
    ("[delivery]\npause_after_permanent_failures = 0", "delivery.pause_after_permanent_failures must be at least 1"),
    ("ingress_token = \"\"", "ingress_token must not be empty"),
    ("admin_token = \"  \"", "admin_token must not be empty"),
    ("alert_url = \"ftp://ops.example/a\"", "alert_url must be an http or https URL"),
    ("alert_url = \"mailto:ops@example.com\"", "alert_url must be an http or https URL"),
    ("[[route]]\nname = \"\"\nurl = \"https://a.example\"", "route[0].name must not be empty"),
    ("[[route]]\nname = \"a/b\"\nurl = \"https://a.example\"", "route[0].name \"a/b\" may contain only"),
    ("[[route]]\nname = \"b c\"\nurl = \"https://a.example\"", "route[0].name \"b c\" may contain only"),
    ("[[route]]\nname = \"a\"\nurl = \"https://a.example\"\n[[route]]\nname = \"a\"\nurl = \"https://b.example\"", "route[1].name \"a\" is used by an earlier route"),
    ("[[route]]\nname = \"a\"\nurl = \"ftp://a.example\"", "route[0].url must be an http or https URL"),
    ("[[route]]\nname = \"a\"\nurl = \"https://a.example\"\nsigning_key = \"k\"", "route[0].signing_key \"k\" is not a name in signing.keys"),
    ("[[host]]\nhost = \"api.example\"\nmax_in_flight = 1", "host[0].host \"api.example\" must be name:port"),
    ("[[host]]\nhost = \"api.example:0\"\nmax_in_flight = 1", "host[0].host"),
    ("[[host]]\nhost = \"::1:443\"\nmax_in_flight = 1", "host[0].host"),
    ("[[host]]\nhost = \"https://a:443\"\nmax_in_flight = 1", "host[0].host"),
    ("[[host]]\nhost = \"a:443\"\nmax_in_flight = 0", "host[0].max_in_flight must be at least 1"),
    ("[[host]]\nhost = \"a:443\"\nmax_in_flight = 1\n[[host]]\nhost = \"A:443\"\nmax_in_flight = 2", "host[1].host \"a:443\" is listed twice"),
    ("[[endpoint]]\nkey = \"\"\nrate_per_second = 1", "endpoint[0].key must not be empty"),
    ("[[endpoint]]\nkey = \"k\"\nrate_per_second = 0", "endpoint[0].rate_per_second must be at least 1"),
    ("[[endpoint]]\nkey = \"k\"\nrate_per_second = 1\n[[endpoint]]\nkey = \"k\"\nrate_per_second = 2", "endpoint[1].key \"k\" is listed twice"),
    ("[signing]\nsecrets = [\"\"]\nscheme = \"stripe\"", "signing.secrets[0] must not be empty"),
    ("[signing]\nsecrets = [\"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\", \"hunter2!\"]", "signing.secrets[1] is used with the standard scheme"),
    ("[signing]\nscheme = \"github\"\nsecrets = [\"hunter2!\"]\n[[route]]\nname = \"r\"\nurl = \"https://a.example\"\nscheme = \"standard\"", "signing.secrets[0] is used with the standard scheme"),
    ("[signing.keys]\nk = [\"hunter2!\"]\n[[route]]\nname = \"r\"\nurl = \"https://a.example\"\nsigning_key = \"k\"", "signing.keys.k[0] is used with the standard scheme"),
    ("[signing.keys]\nk = [\"\"]", "signing.keys.k[0] must not be empty"),
    ("[signing.keys]\nk = []", "signing.keys.k must list at least one secret"),
    ("[signing.keys]\n\"\" = [\"x\"]", "signing.keys has an entry with an empty name"),
    ("[signing]\nsecrets = [\"whsk_c2hvcnQ=\"]", "signing.secrets[0] is not an Ed25519 secret key"),
    ("[signing]\nscheme = \"none\"\nsecrets = [\"whsk_\"]", "signing.secrets[0] is not an Ed25519 secret key"),
    ("[signing.keys]\nunused = [\"whsk_not*base64\"]", "signing.keys.unused[0] is not an Ed25519 secret key"),
    ("[signing]\nscheme = \"stripe\"\nsecrets = [\"whsk_Y291cmllciBlZDI1NTE5IGtub3duLWFuc3dlciBrZXk=\"]", "signing.secrets[0] is an Ed25519 key (whsk_), which signs only with the standard scheme, but signing.scheme signs with it using the stripe scheme"),
    ("[signing]\nsecrets = [\"whsk_Y291cmllciBlZDI1NTE5IGtub3duLWFuc3dlciBrZXk=\"]\n[[route]]\nname = \"gh\"\nurl = \"https://a.example\"\nscheme = \"github\"", "signing.secrets[0] is an Ed25519 key (whsk_), which signs only with the standard scheme, but route[0] (\"gh\") signs with it using the github scheme"),
    ("[signing.keys]\nk = [\"whsec_c2VjcmV0\", \"whsk_Y291cmllciBlZDI1NTE5IGtub3duLWFuc3dlciBrZXk=\"]\n[[route]]\nname = \"r\"\nurl = \"https://a.example\"\nsigning_key = \"k\"\nscheme = \"stripe\"", "signing.keys.k[1] is an Ed25519 key (whsk_)"),
];

#[test]
fn every_validation_rule_has_a_failing_case() {
    for (text, want) in INVALID {
        let config = parse(text);
        let msg = config.validate().unwrap_err().to_string();
        assert!(
            msg.starts_with("invalid config: ") && msg.contains(want),
            "{text:?}: got {msg:?}, want {want:?}"
        );
        assert!(!msg.contains('\n'), "{msg}");
        assert_no_secret(&msg);
    }
}

#[test]
fn valid_edge_cases_pass_validation() {
    let cases = [
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"",
        "listen = \"127.0.0.1:9000\"\nadmin_listen = \"127.0.0.2:9000\"",
        "shutdown_grace = \"0\"\nretention = \"0\"",
        "[retry]\nbase_delay = \"1h\"\nmax_delay = \"1h\"",
        // Non-standard secrets are fine where they never sign with the standard scheme.
        "[signing]\nscheme = \"stripe\"\nsecrets = [\"sk_test_hunter2\"]",
        "[signing.keys]\ngh = [\"plain text\"]\n[[route]]\nname = \"gh\"\nurl = \"https://gh.example\"\nsigning_key = \"gh\"\nscheme = \"github\"",
        "[signing.keys]\nunused = [\"plain text\"]",
        // Ed25519 keys, alone or mixed with HMAC secrets in one rotation list (also as the
        // 64-byte seed-and-public-key form, and unpadded), wherever the standard scheme signs.
        "[signing]\nsecrets = [\"whsk_Y291cmllciBlZDI1NTE5IGtub3duLWFuc3dlciBrZXk=\", \"whsec_c2VjcmV0\"]",
        "[signing]\nsecrets = [\"whsk_Y291cmllciBlZDI1NTE5IGtub3duLWFuc3dlciBrZXlKDEd7X5xvD04Ubt53CC6d1xGkh3QuEkxtXNp0uYw2JQ==\"]",
        "[signing]\nscheme = \"none\"\nsecrets = [\"whsk_Y291cmllciBlZDI1NTE5IGtub3duLWFuc3dlciBrZXk=\"]",
        "[signing]\nscheme = \"stripe\"\nsecrets = [\"sk_x\"]\n[signing.keys]\ned = [\"whsk_Y291cmllciBlZDI1NTE5IGtub3duLWFuc3dlciBrZXk\"]\n[[route]]\nname = \"r\"\nurl = \"https://a.example\"\nsigning_key = \"ed\"\nscheme = \"standard\"",
        // svix also accepts bare base64, and padding is optional.
        "[signing]\nsecrets = [\"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\", \"whsec_c2VjcmV0\", \"whsec_YQ\", \"whsec_YQ==\"]",
        "[[host]]\nhost = \"[::1]:8080\"\nmax_in_flight = 1\n[[host]]\nhost = \"10.0.0.1:80\"\nmax_in_flight = 1",
        "alert_url = \"http://127.0.0.1:9/alerts\"",
    ];
    for text in cases {
        if let Err(e) = parse(text).validate() {
            panic!("{text:?}: {e}");
        }
    }
}

#[test]
fn standard_secret_format() {
    let cases: &[(&str, bool)] = &[
        ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", true),
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", true),
        ("whsec_YQ==", true),
        ("whsec_YQ", true),
        ("whsec_", false),
        ("whsec_YQ=", true),
        ("whsec_YR", true),
        ("whsec_Y", false),
        ("whsec_a-b_", false),
        ("whsec_ YQ", false),
        ("hunter2!", false),
        ("", false),
    ];
    for (secret, ok) in cases {
        assert_eq!(is_standard_secret(secret), *ok, "{secret:?}");
    }
}

#[test]
fn host_port_form() {
    let cases: &[(&str, bool)] = &[
        ("api.example:443", true),
        ("10.0.0.1:80", true),
        ("[::1]:8080", true),
        ("localhost:1", true),
        ("api.example", false),
        ("api.example:", false),
        (":443", false),
        ("api.example:0", false),
        ("api.example:65536", false),
        ("::1:443", false),
        ("[::1]", false),
        ("[nope]:80", false),
        ("a b:80", false),
        ("user@a:80", false),
    ];
    for (text, ok) in cases {
        assert_eq!(is_host_port(text), *ok, "{text:?}");
    }
}
