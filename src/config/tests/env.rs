//! The environment and flag layers, and the value parsers they use.

use std::cell::RefCell;
use std::path::Path;

use super::*;
use crate::config::listen::parse_listen;
use crate::config::parse::parse_net;

type Check = fn(&Config) -> bool;

/// One row per variable of ENV_VARS: a non-default value and how to see it took effect.
const ENV_CASES: &[(&str, &str, Check)] = &[
    ("COURIER_LISTEN", "127.0.0.1:7001", |c| c.listen.port() == Some(7001)),
    ("COURIER_LISTEN_MODE", "0600", |c| c.listen_mode == 0o600),
    ("COURIER_ADMIN_LISTEN", "localhost:7002", |c| {
        c.admin_listen == SocketAddr::from(([127, 0, 0, 1], 7002))
    }),
    ("COURIER_OPS_LISTEN", "127.0.0.1:7003", |c| {
        c.ops_listen == Some(SocketAddr::from(([127, 0, 0, 1], 7003)))
    }),
    ("COURIER_DATA_DIR", "/data", |c| c.data_dir == Path::new("/data")),
    ("COURIER_MAX_BODY", "5MiB", |c| c.max_body == 5 << 20),
    ("COURIER_SHUTDOWN_GRACE", "0", |c| c.shutdown_grace.is_zero()),
    ("COURIER_RETENTION", "1h", |c| c.retention == Duration::from_secs(3600)),
    ("COURIER_DEAD_RETENTION", "2d", |c| {
        c.dead_retention == Duration::from_secs(172_800)
    }),
    ("COURIER_INGRESS_TOKEN", "hunter2", |c| {
        c.ingress_token.as_ref().is_some_and(|t| t.expose() == "hunter2")
    }),
    ("COURIER_ADMIN_TOKEN", "s3kr1t", |c| {
        c.admin_token.as_ref().is_some_and(|t| t.expose() == "s3kr1t")
    }),
    ("COURIER_ALLOW_UNAUTHENTICATED_NETWORK", "true", |c| {
        c.allow_unauthenticated_network
    }),
    ("COURIER_ALERT_URL", "https://ops.example/a", |c| {
        c.alert_url
            .as_ref()
            .is_some_and(|u| u.as_str() == "https://ops.example/a")
    }),
    (
        "COURIER_INGRESS_ALLOWED_ORIGINS",
        "https://App.example:443, http://localhost:3000",
        |c| c.ingress.allowed_origins == ["https://app.example", "http://localhost:3000"],
    ),
    ("COURIER_INGRESS_HOSTS", "Courier.Internal., 10.0.0.5:8787", |c| {
        c.ingress.hosts == ["courier.internal", "10.0.0.5:8787"]
    }),
    ("COURIER_INGRESS_IDLE_TIMEOUT", "5s", |c| {
        c.ingress.idle_timeout == Duration::from_secs(5)
    }),
    ("COURIER_INGRESS_SEND_TIMEOUT", "3s", |c| {
        c.ingress.send_timeout == Duration::from_secs(3)
    }),
    ("COURIER_INGRESS_MAX_PENDING_BYTES", "16MiB", |c| {
        c.ingress.max_pending_bytes == 16 << 20
    }),
    ("COURIER_INGRESS_ALLOW_GET", "true", |c| c.ingress.allow_get),
    ("COURIER_ADMIN_ALLOWED_ORIGINS", "https://ops.example", |c| {
        c.admin.allowed_origins == ["https://ops.example"]
    }),
    ("COURIER_ADMIN_HOSTS", "[::1]:8788,admin.example", |c| {
        c.admin.hosts == ["[::1]:8788", "admin.example"]
    }),
    ("COURIER_ADMIN_IDLE_TIMEOUT", "2m", |c| {
        c.admin.idle_timeout == Duration::from_secs(120)
    }),
    ("COURIER_ADMIN_SEND_TIMEOUT", "30s", |c| {
        c.admin.send_timeout == Duration::from_secs(30)
    }),
    ("COURIER_RETRY_BASE_DELAY", "2s", |c| {
        c.retry.base_delay == Duration::from_secs(2)
    }),
    ("COURIER_RETRY_MAX_DELAY", "2h", |c| {
        c.retry.max_delay == Duration::from_secs(7200)
    }),
    ("COURIER_RETRY_JITTER", "none", |c| c.retry.jitter == Jitter::None),
    ("COURIER_RETRY_SCHEDULE", "5s, 5m", |c| {
        c.retry.schedule == Some(vec![Duration::from_secs(5), Duration::from_secs(300)]) && c.retry.max_attempts == 3
    }),
    ("COURIER_RETRY_MAX_ATTEMPTS", "3", |c| c.retry.max_attempts == 3),
    ("COURIER_RETRY_GIVE_UP_AFTER", "1h", |c| {
        c.retry.give_up_after == Duration::from_secs(3600)
    }),
    ("COURIER_RETRY_MAX_ATTEMPTS_404", "1", |c| c.retry.max_attempts_404 == 1),
    ("COURIER_RETRY_MAX_RETRY_AFTER", "5m", |c| {
        c.retry.max_retry_after == Duration::from_secs(300)
    }),
    ("COURIER_DELIVERY_CONNECT_TIMEOUT", "1s", |c| {
        c.delivery.connect_timeout == Duration::from_secs(1)
    }),
    ("COURIER_DELIVERY_REQUEST_TIMEOUT", "500ms", |c| {
        c.delivery.request_timeout == Duration::from_millis(500)
    }),
    ("COURIER_DELIVERY_MAX_IN_FLIGHT", "77", |c| {
        c.delivery.max_in_flight == 77
    }),
    ("COURIER_DELIVERY_MAX_IN_FLIGHT_PER_HOST", "2", |c| {
        c.delivery.max_in_flight_per_host == 2
    }),
    ("COURIER_DELIVERY_RATE_PER_SECOND", "9", |c| {
        c.delivery.rate_per_second == 9
    }),
    ("COURIER_DELIVERY_PAUSE_AFTER_PERMANENT_FAILURES", "3", |c| {
        c.delivery.pause_after_permanent_failures == 3
    }),
    ("COURIER_DELIVERY_MAX_RESPONSE_BODY", "1KiB", |c| {
        c.delivery.max_response_body == 1024
    }),
    ("COURIER_DELIVERY_IDLE_CONNECTION_TIMEOUT", "15s", |c| {
        c.delivery.idle_connection_timeout == Duration::from_secs(15)
    }),
    ("COURIER_DELIVERY_MAX_IDLE_CONNECTIONS", "8", |c| {
        c.delivery.max_idle_connections == 8
    }),
    ("COURIER_CIRCUIT_FAILURES", "9", |c| c.circuit.failures == 9),
    ("COURIER_CIRCUIT_PROBE_DELAY", "2s", |c| {
        c.circuit.probe_delay == Duration::from_secs(2)
    }),
    ("COURIER_CIRCUIT_PROBE_MAX_DELAY", "10m", |c| {
        c.circuit.probe_max_delay == Duration::from_secs(600)
    }),
    ("COURIER_LOG_FORMAT", "JSON", |c| c.log.format == LogFormat::Json),
    ("COURIER_FLEET_REDIS_URL", "rediss://r.internal:6380", |c| {
        c.fleet
            .redis_url
            .as_ref()
            .is_some_and(|u| u.as_str() == "rediss://r.internal:6380")
    }),
    ("COURIER_FLEET_REDIS_PASSWORD", "pw", |c| {
        c.fleet.password.as_ref().is_some_and(|p| p.expose() == "pw")
    }),
    ("COURIER_FLEET_EXPECTED_REPLICAS", "5", |c| {
        c.fleet.expected_replicas == 5
    }),
    ("COURIER_FLEET_KEY_PREFIX", "prod", |c| c.fleet.key_prefix == "prod"),
    ("COURIER_DRAIN_TO", "http://courier-tier:8787", |c| {
        c.drain.to.as_deref() == Some("http://courier-tier:8787")
    }),
    ("COURIER_DRAIN_PEERS", "http://a:1, https://b", |c| {
        c.drain.peers == ["http://a:1", "https://b"]
    }),
    ("COURIER_DRAIN_TOKEN", "tier-t0k", |c| {
        c.drain.token.as_ref().is_some_and(|t| t.expose() == "tier-t0k")
    }),
    ("COURIER_DRAIN_CONCURRENCY", "4", |c| c.drain.concurrency == 4),
    ("COURIER_SIGNING_SCHEME", "github", |c| {
        c.signing.scheme == SignatureScheme::Github
    }),
    ("COURIER_SIGNING_SECRETS", "ghs-1, ghs-2", |c| {
        c.signing.secrets.iter().map(Secret::expose).eq(["ghs-1", "ghs-2"])
    }),
    ("COURIER_EGRESS_ALLOW_PRIVATE_TARGETS", "1", |c| {
        c.egress.allow_private_targets
    }),
    ("COURIER_EGRESS_ALLOW", "10.0.0.0/8, ::1", |c| {
        c.egress
            .allow
            .iter()
            .map(IpNet::to_string)
            .eq(["10.0.0.0/8", "::1/128"])
    }),
    ("COURIER_EGRESS_PROXY", "http://u:p@proxy.internal:3128", |c| {
        c.egress
            .proxy
            .as_ref()
            .is_some_and(|p| p.origin() == "http://proxy.internal:3128")
    }),
    ("COURIER_EGRESS_NO_PROXY", ".internal, 10.0.0.0/8", |c| {
        c.egress.no_proxy == [".internal", "10.0.0.0/8"]
    }),
    ("COURIER_STORE_ENCRYPTION_KEY_FILES", "/k/new.key, /k/old.key", |c| {
        c.store.encryption_key_files == [std::path::Path::new("/k/new.key"), std::path::Path::new("/k/old.key")]
    }),
];

#[test]
fn every_env_var_sets_its_key() {
    let covered: Vec<&str> = ENV_CASES.iter().map(|(n, _, _)| *n).collect();
    assert_eq!(covered, ENV_VARS, "the table covers every variable");
    for (name, value, check) in ENV_CASES {
        // The github scheme lets COURIER_SIGNING_SECRETS hold non-standard secrets.
        let env = env_from(&[(name, value), ("COURIER_SIGNING_SCHEME", "github")]);
        let c = Config::load(&Overrides::default(), &env).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(check(&c), "{name}={value:?} did not take effect");
        assert!(
            !check(&Config::default()) || *name == "COURIER_SIGNING_SCHEME",
            "{name}: the value is the default"
        );
    }
}

#[test]
fn env_values_override_the_file() {
    let file = full_toml();
    for (name, value, check) in ENV_CASES {
        let c = Config::layered(Some((&file, "t")), &env_from(&[(name, value)]), &Overrides::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(check(&c), "{name}={value:?} did not override the file");
    }
}

#[test]
fn env_booleans_and_lists() {
    let cases: &[(&str, bool)] = &[
        ("true", true),
        ("TRUE", true),
        ("1", true),
        ("false", false),
        ("0", false),
        (" False ", false),
    ];
    for (text, want) in cases {
        let file = format!("[egress]\nallow_private_targets = {}\n", !want);
        let env = env_from(&[("COURIER_EGRESS_ALLOW_PRIVATE_TARGETS", text)]);
        let c = Config::layered(Some((&file, "t")), &env, &Overrides::default()).unwrap();
        assert_eq!(c.egress.allow_private_targets, *want, "{text}");
    }
    // A blank list clears what the file set.
    let env = env_from(&[("COURIER_EGRESS_ALLOW", ""), ("COURIER_SIGNING_SECRETS", " ")]);
    let c = Config::layered(Some((&full_toml(), "t")), &env, &Overrides::default()).unwrap();
    assert!(c.egress.allow.is_empty() && c.signing.secrets.is_empty());
    // A blank peer or proxy unsets what the file set; a blank schedule too.
    let file = "[drain]\nto = \"http://t:1\"\n[egress]\nproxy = \"http://p:3128\"\n[retry]\nschedule = [\"1s\"]\n";
    let env = env_from(&[
        ("COURIER_DRAIN_TO", " "),
        ("COURIER_EGRESS_PROXY", ""),
        ("COURIER_RETRY_SCHEDULE", ""),
    ]);
    let c = Config::layered(Some((file, "t")), &env, &Overrides::default()).unwrap();
    assert_eq!((c.drain.to, c.egress.proxy, c.retry.schedule), (None, None, None));
    assert_eq!(
        c.retry.max_attempts, 2,
        "the file's schedule still stood for its attempts"
    );
}

#[test]
fn a_variable_over_a_bad_file_value_still_reports_the_file() {
    let env = env_from(&[("COURIER_MAX_BODY", "1KiB")]);
    let e = Config::layered(Some(("max_body = \"huge\"\n", "c.toml")), &env, &Overrides::default()).unwrap_err();
    assert!(
        e.to_string().starts_with("config c.toml: max_body: invalid size"),
        "{e}"
    );
    // The first bad variable in the order of the table is the one reported.
    let env = env_from(&[("COURIER_EGRESS_ALLOW", "x"), ("COURIER_LISTEN", "y")]);
    let e = Config::load(&Overrides::default(), &env).unwrap_err().to_string();
    assert!(e.starts_with("COURIER_LISTEN=\"y\""), "{e}");
}

#[test]
fn bad_env_values_name_the_variable_and_value() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "COURIER_RETRY_MAX_ATTEMPTS",
            "x",
            "COURIER_RETRY_MAX_ATTEMPTS=\"x\": expected a whole number",
        ),
        (
            "COURIER_RETRY_MAX_ATTEMPTS",
            "-1",
            "COURIER_RETRY_MAX_ATTEMPTS=\"-1\": ",
        ),
        ("COURIER_LISTEN", "8787", "COURIER_LISTEN=\"8787\": expected ip:port"),
        (
            "COURIER_ADMIN_LISTEN",
            "example.com:1",
            "COURIER_ADMIN_LISTEN=\"example.com:1\": ",
        ),
        ("COURIER_MAX_BODY", "1TB", "COURIER_MAX_BODY=\"1TB\": invalid size"),
        (
            "COURIER_SHUTDOWN_GRACE",
            "30",
            "COURIER_SHUTDOWN_GRACE=\"30\": invalid duration",
        ),
        (
            "COURIER_RETRY_JITTER",
            "half",
            "COURIER_RETRY_JITTER=\"half\": unknown jitter",
        ),
        (
            "COURIER_SIGNING_SCHEME",
            "hmac",
            "COURIER_SIGNING_SCHEME=\"hmac\": unknown signature scheme",
        ),
        (
            "COURIER_EGRESS_ALLOW_PRIVATE_TARGETS",
            "yes",
            "COURIER_EGRESS_ALLOW_PRIVATE_TARGETS=\"yes\": expected true",
        ),
        (
            "COURIER_EGRESS_ALLOW",
            "10.0.0.0/8,,::1",
            "COURIER_EGRESS_ALLOW=\"10.0.0.0/8,,::1\": item 2",
        ),
        (
            "COURIER_EGRESS_ALLOW",
            "10.0.0.0/33",
            "COURIER_EGRESS_ALLOW=\"10.0.0.0/33\": \"10.0.0.0/33\" is not",
        ),
        (
            "COURIER_DELIVERY_RATE_PER_SECOND",
            "99999999999",
            "COURIER_DELIVERY_RATE_PER_SECOND=\"99999999999\"",
        ),
        (
            "COURIER_ALERT_URL",
            "not a url s3kr1t",
            "COURIER_ALERT_URL: not a valid URL",
        ),
        (
            "COURIER_FLEET_REDIS_URL",
            "http://:s3kr1t@r.internal",
            "COURIER_FLEET_REDIS_URL: must be a redis:// or rediss:// URL",
        ),
        (
            "COURIER_FLEET_EXPECTED_REPLICAS",
            "many",
            "COURIER_FLEET_EXPECTED_REPLICAS=\"many\": expected a whole number",
        ),
        (
            "COURIER_SIGNING_SECRETS",
            "hunter2,,x",
            "COURIER_SIGNING_SECRETS: item 2 of the comma-separated list is empty",
        ),
    ];
    for (name, value, want) in cases {
        let msg = Config::load(&Overrides::default(), &env_from(&[(name, value)]))
            .unwrap_err()
            .to_string();
        assert!(msg.starts_with(want), "{name}={value:?}: got {msg:?}, want {want:?}");
        assert!(!msg.contains('\n'), "{msg}");
        assert_no_secret(&msg);
    }
}

#[test]
fn other_courier_variables_are_ignored_and_never_read() {
    let asked = RefCell::new(Vec::new());
    let env = |name: &str| {
        asked.borrow_mut().push(name.to_string());
        // Kubernetes' service variables, and garbage for anything else.
        match name {
            "COURIER_PORT" => Some("tcp://10.0.0.1:8787".to_string()),
            "COURIER_SERVICE_HOST" => Some("10.0.0.1".to_string()),
            n if ENV_VARS.contains(&n) || n == CONFIG_ENV => None,
            _ => Some("garbage".to_string()),
        }
    };
    assert_eq!(Config::load(&Overrides::default(), &env).unwrap(), Config::default());
    for name in asked.borrow().iter() {
        assert!(ENV_VARS.contains(&name.as_str()) || name == CONFIG_ENV, "read {name}");
    }
}

#[test]
fn flags_accept_ip_port_and_localhost() {
    let cases: &[(&str, &str)] = &[
        ("127.0.0.1:9000", "127.0.0.1:9000"),
        ("localhost:9000", "127.0.0.1:9000"),
        ("0.0.0.0:0", "0.0.0.0:0"),
        ("[::1]:9000", "[::1]:9000"),
        (" 10.0.0.1:80 ", "10.0.0.1:80"),
    ];
    for (text, want) in cases {
        assert_eq!(parse_listen(text), Ok(want.parse::<SocketAddr>().unwrap()), "{text}");
    }
    for text in [
        "",
        "9000",
        "localhost",
        "localhost:",
        "localhost:99999",
        "example.com:80",
        "127.0.0.1",
        "::1:80",
    ] {
        assert!(parse_listen(text).is_err(), "{text:?}");
    }
    let flags = Overrides {
        listen: Some("nope".into()),
        ..Overrides::default()
    };
    let msg = Config::load(&flags, &no_env).unwrap_err().to_string();
    assert!(msg.starts_with("--listen \"nope\": expected ip:port"), "{msg}");
    let flags = Overrides {
        admin_listen: Some(":1".into()),
        ..Overrides::default()
    };
    let msg = Config::load(&flags, &no_env).unwrap_err().to_string();
    assert!(msg.starts_with("--admin-listen \":1\": "), "{msg}");
}

#[test]
fn networks_and_bare_addresses() {
    let cases: &[(&str, Option<&str>)] = &[
        ("10.1.0.0/16", Some("10.1.0.0/16")),
        ("127.0.0.1", Some("127.0.0.1/32")),
        ("::1", Some("::1/128")),
        ("fd00::/8", Some("fd00::/8")),
        (" 192.168.0.1/32 ", Some("192.168.0.1/32")),
        ("10.0.0.0/33", None),
        ("localhost", None),
        ("", None),
    ];
    for (text, want) in cases {
        assert_eq!(
            parse_net(text).ok().map(|n| n.to_string()).as_deref(),
            *want,
            "{text:?}"
        );
    }
}
