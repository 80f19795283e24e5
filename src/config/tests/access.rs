//! The listener settings: `ops_listen`, `allow_unauthenticated_network`, the `[ingress]`
//! and `[admin]` access lists, and the rule that a non-loopback listener needs its token.

use super::*;
use crate::config::parse::{parse_host_entry, parse_origin};

const ACCESS_TOML: &str = r#"
ops_listen = "0.0.0.0:8789"
allow_unauthenticated_network = true

[ingress]
allowed_origins = ["https://App.Example", "http://localhost:3000/", "https://app.example:8443"]
hosts = ["Courier.Internal.", "10.0.0.5:8787", "[::1]:8787"]

[admin]
allowed_origins = ["https://ops.example:443"]
hosts = ["admin.example:8788"]
"#;

fn invalid(text: &str) -> String {
    let msg = parse(text).validate().unwrap_err().to_string();
    assert!(!msg.contains('\n'), "{msg}");
    assert_no_secret(&msg);
    msg
}

#[test]
fn the_listener_settings_parse_from_toml() {
    let c = parse(ACCESS_TOML);
    c.validate().unwrap();
    assert_eq!(c.ops_listen, Some("0.0.0.0:8789".parse::<SocketAddr>().unwrap()));
    assert!(c.allow_unauthenticated_network);
    assert_eq!(
        c.ingress.allowed_origins,
        [
            "https://app.example",
            "http://localhost:3000",
            "https://app.example:8443"
        ]
    );
    assert_eq!(c.ingress.hosts, ["courier.internal", "10.0.0.5:8787", "[::1]:8787"]);
    assert_eq!(c.admin.allowed_origins, ["https://ops.example"]);
    assert_eq!(c.admin.hosts, ["admin.example:8788"]);
    // An empty list is the default, written out.
    let c = parse("[ingress]\nallowed_origins = []\nhosts = []\n[admin]\n");
    assert_eq!(c, Config::default());
}

#[test]
fn the_ingress_limits_parse_and_are_checked() {
    let c = parse("max_body = \"2MiB\"\n[ingress]\nidle_timeout = \"5s\"\nmax_pending_bytes = \"16MiB\"\nallow_get = true\n[admin]\nidle_timeout = \"2m\"\n");
    c.validate().unwrap();
    assert_eq!(
        (c.ingress.idle_timeout, c.ingress.max_pending_bytes, c.ingress.allow_get),
        (Duration::from_secs(5), 16 << 20, true)
    );
    assert_eq!(c.admin.idle_timeout, Duration::from_secs(120));
    let msg = invalid("max_body = \"2MiB\"\n[ingress]\nmax_pending_bytes = \"1MiB\"\n");
    assert!(
        msg.contains("ingress.max_pending_bytes") && msg.contains("max_body"),
        "{msg}"
    );
    let msg = invalid("[admin]\nidle_timeout = \"500ms\"\n");
    assert!(msg.contains("admin.idle_timeout must be at least 1s"), "{msg}");
    let msg = invalid("[ingress]\nsend_timeout = \"0s\"\n");
    assert!(msg.contains("ingress.send_timeout must be at least 1s"), "{msg}");
    let c = parse("[ingress]\nsend_timeout = \"3s\"\n[admin]\nsend_timeout = \"1m\"\n");
    assert_eq!(
        (c.ingress.send_timeout, c.admin.send_timeout),
        (Duration::from_secs(3), Duration::from_secs(60))
    );
    // Ingress's own keys are not admin's.
    assert!(Config::from_toml_str("[admin]\nallow_get = true\n", "t").is_err());
}

#[test]
fn origins_are_stored_as_their_ascii_serialization() {
    let good: &[(&str, &str)] = &[
        ("https://app.example", "https://app.example"),
        ("HTTPS://App.Example/", "https://app.example"),
        ("https://app.example:443", "https://app.example"),
        ("http://app.example:80/", "http://app.example"),
        ("http://localhost:3000", "http://localhost:3000"),
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("http://[::1]:3000", "http://[::1]:3000"),
        ("https://bücher.example", "https://xn--bcher-kva.example"),
        (" https://app.example ", "https://app.example"),
    ];
    for (text, want) in good {
        assert_eq!(parse_origin(text).as_deref(), Ok(*want), "{text:?}");
    }
    for text in [
        "https://app.example/path",
        "https://app.example/?x=1",
        "https://app.example/#top",
        "https://user:pw@app.example",
        "https://user@app.example",
        "ftp://app.example",
        "file:///tmp",
        "app.example",
        "null",
        "*",
        "https://*.app.example",
        "",
    ] {
        let e = parse_origin(text).unwrap_err();
        assert!(e.contains("origin"), "{text:?}: {e}");
    }
}

#[test]
fn host_entries_are_lowercased_without_a_trailing_dot() {
    let good: &[(&str, &str)] = &[
        ("App.Example", "app.example"),
        ("app.example.", "app.example"),
        ("App.Example.:8443", "app.example:8443"),
        ("courier", "courier"),
        ("courier_svc.ns.svc.cluster.local", "courier_svc.ns.svc.cluster.local"),
        ("10.0.0.5", "10.0.0.5"),
        ("10.0.0.5:8787", "10.0.0.5:8787"),
        ("[::1]", "[::1]"),
        ("[FD00::1]:8787", "[fd00::1]:8787"),
        ("fd00::1", "fd00::1"),
    ];
    for (text, want) in good {
        assert_eq!(parse_host_entry(text).as_deref(), Ok(*want), "{text:?}");
    }
    for text in [
        "",
        "app.example/x",
        "https://app.example",
        "user@app.example",
        "app example",
        " app.example",
        "*.app.example",
        "*",
        "app.example:0",
        "app.example:99999",
        "app.example:x",
        "app.example:",
        "a..example",
        ".example",
        "[::1",
        "[nope]:80",
        "[::1]x",
    ] {
        let e = parse_host_entry(text).unwrap_err();
        assert!(e.contains("not a host"), "{text:?}: {e}");
    }
}

#[test]
fn bad_listener_settings_name_the_key() {
    let cases: &[(&str, &str)] = &[
        (
            "[ingress]\nallowed_origins = [\"https://app.example/app\"]\n",
            "ingress.allowed_origins[0]: \"https://app.example/app\" is not an origin: it has a path",
        ),
        (
            "[admin]\nallowed_origins = [\"https://ops.example\", \"https://ops.example?a=1\"]\n",
            "admin.allowed_origins[1]: \"https://ops.example?a=1\" is not an origin: it has a query",
        ),
        (
            "[admin]\nallowed_origins = [\"https://user:hunter2@ops.example\"]\n",
            "admin.allowed_origins[0]: is not an origin: it has a user or password (value not shown)",
        ),
        (
            "[admin]\nhosts = [\"ok.example\", \"a.example/b\"]\n",
            "admin.hosts[1]: \"a.example/b\" is not a host: no scheme, path or user",
        ),
        (
            "[ingress]\nhosts = [\"\"]\n",
            "ingress.hosts[0]: an empty entry is not a host",
        ),
        (
            "[ingress]\nhosts = [\"*.example\"]\n",
            "ingress.hosts[0]: \"*.example\" is not a host: wildcards are not supported",
        ),
        (
            "[ingress]\nhosts = [\"a b\"]\n",
            "ingress.hosts[0]: \"a b\" is not a host: no spaces",
        ),
        ("[ingress]\norigins = []\n", "unknown key \"ingress.origins\" (line 2)"),
        ("[admin]\nhost = []\n", "unknown key \"admin.host\" (line 2)"),
        (
            "[ingress]\nhosts = \"a.example\"\n",
            "ingress.hosts: invalid type: a string, expected a sequence (line 2)",
        ),
        ("ops_listen = \"8789\"\n", "ops_listen: expected ip:port"),
        (
            "allow_unauthenticated_network = \"yes\"\n",
            "allow_unauthenticated_network: invalid type: a string, expected a boolean",
        ),
    ];
    assert_file_errors(cases);
    let env_cases: &[(&str, &str, &str)] = &[
        (
            "COURIER_INGRESS_ALLOWED_ORIGINS",
            "https://a.example/x",
            "COURIER_INGRESS_ALLOWED_ORIGINS=\"https://a.example/x\": \"https://a.example/x\" is not an origin: it has a path",
        ),
        (
            "COURIER_ADMIN_ALLOWED_ORIGINS",
            "https://a.example,,https://b.example",
            "COURIER_ADMIN_ALLOWED_ORIGINS=\"https://a.example,,https://b.example\": item 2 of the comma-separated list is empty",
        ),
        (
            "COURIER_INGRESS_HOSTS",
            "a.example/b",
            "COURIER_INGRESS_HOSTS=\"a.example/b\": \"a.example/b\" is not a host",
        ),
        (
            "COURIER_ADMIN_HOSTS",
            "admin@a.example",
            "COURIER_ADMIN_HOSTS=\"admin@a.example\": \"admin@a.example\" is not a host",
        ),
        ("COURIER_OPS_LISTEN", "8789", "COURIER_OPS_LISTEN=\"8789\": expected ip:port"),
        (
            "COURIER_ALLOW_UNAUTHENTICATED_NETWORK",
            "yes",
            "COURIER_ALLOW_UNAUTHENTICATED_NETWORK=\"yes\": expected true, false, 1 or 0",
        ),
    ];
    for (name, value, want) in env_cases {
        let msg = Config::load(&Overrides::default(), &env_from(&[(name, value)]))
            .unwrap_err()
            .to_string();
        assert!(msg.starts_with(want), "{name}={value:?}: got {msg:?}, want {want:?}");
    }
    let flags = Overrides {
        ops_listen: Some("nope".into()),
        ..Overrides::default()
    };
    let msg = Config::load(&flags, &no_env).unwrap_err().to_string();
    assert!(msg.starts_with("--ops-listen \"nope\": expected ip:port"), "{msg}");
}

#[test]
fn ops_listen_must_not_collide_with_the_other_listeners() {
    let cases: &[(&str, &str)] = &[
        (
            "ops_listen = \"127.0.0.1:8788\"",
            "invalid config: ops_listen (127.0.0.1:8788) must differ from admin_listen (127.0.0.1:8788)",
        ),
        (
            "ops_listen = \"localhost:8787\"",
            "invalid config: ops_listen (127.0.0.1:8787) must differ from listen (127.0.0.1:8787)",
        ),
        (
            "admin_listen = \"127.0.0.1:9000\"\nops_listen = \"[::]:9000\"",
            "invalid config: ops_listen ([::]:9000) must differ from admin_listen (127.0.0.1:9000)",
        ),
        (
            "ops_listen = \"0.0.0.0:8788\"",
            "invalid config: ops_listen (0.0.0.0:8788) must differ from admin_listen (127.0.0.1:8788)",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(invalid(text), *want, "{text:?}");
    }
    for text in [
        "ops_listen = \"127.0.0.1:8789\"",
        "ops_listen = \"127.0.0.2:8788\"",
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nops_listen = \"127.0.0.1:0\"",
        // No token is needed: it serves only probes and metrics.
        "ops_listen = \"0.0.0.0:8789\"",
    ] {
        if let Err(e) = parse(text).validate() {
            panic!("{text:?}: {e}");
        }
    }
    // Through the env and flag layers too.
    let env = env_from(&[("COURIER_OPS_LISTEN", "127.0.0.1:8787")]);
    let msg = Config::load(&Overrides::default(), &env).unwrap_err().to_string();
    assert!(
        msg.contains("ops_listen (127.0.0.1:8787) must differ from listen"),
        "{msg}"
    );
}

#[test]
fn a_non_loopback_listener_needs_its_token() {
    assert_eq!(
        invalid("listen = \"0.0.0.0:8787\""),
        "invalid config: listen 0.0.0.0:8787 is not a loopback address and ingress_token is unset: \
         set ingress_token, bind 127.0.0.1, or set allow_unauthenticated_network = true to serve \
         the network without a token on purpose"
    );
    assert_eq!(
        invalid("admin_listen = \"[::]:8788\""),
        "invalid config: admin_listen [::]:8788 is not a loopback address and admin_token is unset: \
         set admin_token, bind 127.0.0.1, or set allow_unauthenticated_network = true to serve \
         the network without a token on purpose"
    );
    for (text, want) in [
        ("listen = \"10.0.0.5:8787\"", "listen 10.0.0.5:8787 is not a loopback"),
        ("listen = \"[fd00::1]:8787\"", "listen [fd00::1]:8787 is not a loopback"),
        (
            "listen = \"0.0.0.0:8787\"\ningress_token = \"hunter2\"\nadmin_listen = \"0.0.0.0:8788\"",
            "admin_listen 0.0.0.0:8788 is not a loopback address and admin_token is unset",
        ),
        (
            "admin_listen = \"192.168.1.2:8788\"\nadmin_token = \"s3kr1t\"\nlisten = \"192.168.1.2:8787\"",
            "listen 192.168.1.2:8787 is not a loopback address and ingress_token is unset",
        ),
    ] {
        let msg = invalid(text);
        assert!(msg.contains(want), "{text:?}: got {msg:?}, want {want:?}");
    }
    for text in [
        "listen = \"127.0.0.2:8787\"",
        "listen = \"[::1]:8787\"\nadmin_listen = \"[::1]:8788\"",
        "listen = \"[::ffff:127.0.0.1]:8787\"",
        "listen = \"0.0.0.0:8787\"\ningress_token = \"hunter2\"",
        "admin_listen = \"[::]:8788\"\nadmin_token = \"s3kr1t\"",
    ] {
        let c = parse(text);
        if let Err(e) = c.validate() {
            panic!("{text:?}: {e}");
        }
        assert!(c.unauthenticated_network_listeners().is_empty(), "{text:?}");
    }
}

#[test]
fn allow_unauthenticated_network_lets_it_through_and_lists_the_listeners() {
    let c = parse("listen = \"0.0.0.0:8787\"\nadmin_listen = \"[::]:8788\"\nallow_unauthenticated_network = true");
    c.validate().unwrap();
    assert_eq!(
        c.unauthenticated_network_listeners(),
        [
            ("listen", "0.0.0.0:8787".parse::<SocketAddr>().unwrap()),
            ("admin_listen", "[::]:8788".parse::<SocketAddr>().unwrap()),
        ]
    );
    let c = parse("listen = \"0.0.0.0:8787\"\nadmin_token = \"s3kr1t\"\nallow_unauthenticated_network = true");
    assert_eq!(
        c.unauthenticated_network_listeners(),
        [("listen", "0.0.0.0:8787".parse::<SocketAddr>().unwrap())]
    );
    // The same through the environment.
    let bare = env_from(&[("COURIER_LISTEN", "0.0.0.0:8787")]);
    let msg = Config::load(&Overrides::default(), &bare).unwrap_err().to_string();
    assert!(
        msg.starts_with("invalid config: listen 0.0.0.0:8787 is not a loopback"),
        "{msg}"
    );
    let allowed = env_from(&[
        ("COURIER_LISTEN", "0.0.0.0:8787"),
        ("COURIER_ALLOW_UNAUTHENTICATED_NETWORK", "1"),
    ]);
    let c = Config::load(&Overrides::default(), &allowed).unwrap();
    assert_eq!(c.unauthenticated_network_listeners().len(), 1);
    let with_token = env_from(&[("COURIER_LISTEN", "0.0.0.0:8787"), ("COURIER_INGRESS_TOKEN", "hunter2")]);
    Config::load(&Overrides::default(), &with_token).unwrap();
}

#[test]
fn summary_shows_the_listener_settings() {
    let summary = parse(ACCESS_TOML).summary();
    for want in [
        "listen 127.0.0.1:8787 (ingress), 127.0.0.1:8788 (admin), 0.0.0.0:8789 (ops); data_dir ./courier-data",
        concat!(
            "ingress: allowed_origins https://app.example, http://localhost:3000, https://app.example:8443, ",
            "hosts courier.internal, 10.0.0.5:8787, [::1]:8787, idle_timeout 1m, send_timeout 10s, ",
            "max_pending_bytes 67108864, allow_get false; ",
            "admin: allowed_origins https://ops.example, hosts admin.example:8788, idle_timeout 1m, send_timeout 10s; ",
            "allow_unauthenticated_network true"
        ),
    ] {
        assert!(summary.contains(want), "missing {want:?} in:\n{summary}");
    }
    let default = Config::default().summary();
    assert!(
        default.contains(
            "ingress: allowed_origins none, hosts none, idle_timeout 1m, send_timeout 10s, \
             max_pending_bytes 67108864, allow_get false; admin: allowed_origins none, hosts none, \
             idle_timeout 1m, send_timeout 10s; \
             allow_unauthenticated_network false"
        ),
        "{default}"
    );
    assert!(default.contains("(admin); data_dir"), "{default}");
}
