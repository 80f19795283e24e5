//! Defaults, the full example, and the layering done by `Config::load`.

use super::*;

#[test]
fn defaults_are_exactly_the_contract() {
    let d = Config::default();
    assert_eq!(d.listen, "127.0.0.1:8787".parse::<SocketAddr>().unwrap());
    assert_eq!(d.admin_listen, "127.0.0.1:8788".parse::<SocketAddr>().unwrap());
    assert_eq!(d.data_dir, PathBuf::from("./courier-data"));
    assert_eq!(d.max_body, 1_048_576);
    assert_eq!(d.shutdown_grace, secs(30));
    assert_eq!(d.retention, secs(3 * 86_400));
    assert_eq!(d.dead_retention, secs(30 * 86_400));
    assert_eq!(
        (
            d.ingress_token.is_none(),
            d.admin_token.is_none(),
            d.alert_url.is_none()
        ),
        (true, true, true)
    );
    let r = &d.retry;
    assert_eq!(
        (r.base_delay, r.max_delay, r.jitter),
        (secs(60), secs(3600), Jitter::Equal)
    );
    assert_eq!(
        (r.max_attempts, r.give_up_after, r.max_attempts_404),
        (16, secs(72 * 3600), 5)
    );
    assert_eq!(r.max_retry_after, secs(24 * 3600));
    let dl = &d.delivery;
    assert_eq!((dl.connect_timeout, dl.request_timeout), (secs(10), secs(30)));
    assert_eq!(
        (
            dl.max_in_flight_per_host,
            dl.rate_per_second,
            dl.pause_after_permanent_failures
        ),
        (10, 100, 100)
    );
    assert_eq!(dl.max_response_body, 65_536);
    assert_eq!(dl.max_idle_connections, 1024);
    assert_eq!(d.signing.scheme, SignatureScheme::Standard);
    assert!(d.signing.secrets.is_empty() && d.signing.keys.is_empty());
    assert!(!d.egress.allow_private_targets && d.egress.allow.is_empty());
    assert!(d.routes.is_empty() && d.hosts.is_empty() && d.endpoints.is_empty());
    assert_eq!((d.ops_listen, d.allow_unauthenticated_network), (None, false));
    assert_eq!(d.admin, ListenerAccess::default());
    assert!(d.ingress.allowed_origins.is_empty() && d.ingress.hosts.is_empty());
    assert_eq!(
        (d.ingress.idle_timeout, d.admin.idle_timeout, d.ingress.allow_get),
        (Duration::from_secs(60), Duration::from_secs(60), false)
    );
    assert_eq!(d.ingress.max_pending_bytes, 64 << 20);
    assert!(d.unauthenticated_network_listeners().is_empty());
    d.validate().unwrap();
}

#[test]
fn the_contract_example_file_is_the_defaults() {
    assert_eq!(parse(CONTRACT_EXAMPLE), Config::default());
    assert_eq!(parse(""), Config::default());
}

#[test]
fn the_full_example_parses_every_key() {
    let c = parse(&full_toml());
    c.validate().unwrap();
    assert_eq!(c.listen, "0.0.0.0:9001".parse::<SocketAddr>().unwrap());
    assert_eq!(c.admin_listen, "[::1]:9002".parse::<SocketAddr>().unwrap());
    assert_eq!(c.data_dir, PathBuf::from("/var/lib/courier"));
    assert_eq!(
        (c.max_body, c.shutdown_grace, c.retention, c.dead_retention),
        (2 << 20, secs(0), secs(86_400), secs(7 * 86_400))
    );
    assert_eq!(c.ingress_token.as_ref().map(Secret::expose), Some("tok-INGRESS-5ecret"));
    assert_eq!(c.admin_token.as_ref().map(Secret::expose), Some("tok-ADMIN-5ecret"));
    assert_eq!(
        c.alert_url.as_ref().map(Url::as_str),
        Some("https://ops.example/alerts/T000/B000/xyzSECRETPATH")
    );
    let r = &c.retry;
    assert_eq!(
        (r.base_delay, r.max_delay, r.jitter),
        (Duration::from_millis(250), secs(600), Jitter::Full)
    );
    assert_eq!(
        (r.max_attempts, r.give_up_after, r.max_attempts_404, r.max_retry_after),
        (8, secs(7200), 2, secs(3600))
    );
    let d = &c.delivery;
    assert_eq!((d.connect_timeout, d.request_timeout), (secs(2), secs(5)));
    assert_eq!(
        (
            d.max_in_flight_per_host,
            d.rate_per_second,
            d.pause_after_permanent_failures
        ),
        (4, 20, 7)
    );
    assert_eq!(d.max_response_body, 1024);
    assert_eq!((d.idle_connection_timeout, d.max_idle_connections), (secs(45), 32));
    let secrets: Vec<&str> = c.signing.secrets.iter().map(Secret::expose).collect();
    assert_eq!(secrets, [STD_SECRET, STD_SECRET_2]);
    assert_eq!(c.signing_key("billing").map(|s| s.len()), Some(2));
    assert_eq!(
        c.signing_key("billing").map(|s| s[1].expose()),
        Some("sk-BILLING-5ecret-old")
    );
    assert!(c.signing_key("nope").is_none());
    assert!(c.egress.allow_private_targets);
    let allow: Vec<String> = c.egress.allow.iter().map(IpNet::to_string).collect();
    assert_eq!(allow, ["127.0.0.1/32", "10.1.0.0/16", "::1/128", "192.168.1.7/32"]);
    assert_eq!(c.routes.len(), 2);
    assert_eq!(c.routes[0].signing_key.as_deref(), Some("billing"));
    assert_eq!(c.routes[0].scheme, Some(SignatureScheme::Stripe));
    assert_eq!(c.routes[1].scheme, None);
    assert_eq!(
        c.route_url("billing").map(String::from),
        Some("https://billing.example/hooks".to_string())
    );
    assert_eq!(
        c.route_url("partner-2_x").map(String::from),
        Some("http://partner.example:8080/in?a=1".to_string())
    );
    assert_eq!(c.route_url("missing"), None);
    assert_eq!(c.hosts[0].host, "api.bigcustomer.example:443");
    assert_eq!(c.endpoints[0].key, "https://slow.example/hook");
}

#[test]
fn each_layer_overrides_the_one_below() {
    let text = concat!(
        "listen = \"127.0.0.1:1001\"\nadmin_listen = \"127.0.0.1:1002\"\nops_listen = \"127.0.0.1:1003\"\n",
        "data_dir = \"/from/file\"\n",
        "[retry]\nmax_attempts = 3\nbase_delay = \"5s\"\n"
    );
    let file = TempFile::new("layers", text);
    let flags_file = Overrides {
        config: Some(file.0.clone()),
        ..Overrides::default()
    };
    // defaults < file
    let c = Config::load(&flags_file, &no_env).unwrap();
    assert_eq!((c.listen.port(), c.admin_listen.port()), (Some(1001), 1002));
    assert_eq!(c.ops_listen.map(|a| a.port()), Some(1003));
    assert_eq!(c.data_dir, PathBuf::from("/from/file"));
    assert_eq!(
        (c.retry.max_attempts, c.retry.base_delay, c.retry.max_delay),
        (3, secs(5), secs(3600))
    );
    // file < env
    let env = env_from(&[
        ("COURIER_LISTEN", "127.0.0.1:2001"),
        ("COURIER_OPS_LISTEN", "127.0.0.1:2003"),
        ("COURIER_DATA_DIR", "/from/env"),
        ("COURIER_RETRY_MAX_ATTEMPTS", "4"),
    ]);
    let c = Config::load(&flags_file, &env).unwrap();
    assert_eq!((c.listen.port(), c.admin_listen.port()), (Some(2001), 1002));
    assert_eq!(c.ops_listen.map(|a| a.port()), Some(2003));
    assert_eq!(c.data_dir, PathBuf::from("/from/env"));
    assert_eq!((c.retry.max_attempts, c.retry.base_delay), (4, secs(5)));
    // env < flags
    let flags = Overrides {
        config: Some(file.0.clone()),
        listen: Some("localhost:3001".into()),
        admin_listen: Some("127.0.0.1:3002".into()),
        ops_listen: Some("localhost:3003".into()),
        data_dir: Some(PathBuf::from("/from/flag")),
    };
    let c = Config::load(&flags, &env).unwrap();
    assert_eq!(c.listen, "127.0.0.1:3001".parse::<SocketAddr>().unwrap());
    assert_eq!(c.admin_listen.port(), 3002);
    assert_eq!(c.ops_listen, Some("127.0.0.1:3003".parse::<SocketAddr>().unwrap()));
    assert_eq!(c.data_dir, PathBuf::from("/from/flag"));
    assert_eq!(c.retry.max_attempts, 4);
}

#[test]
fn the_file_comes_from_the_flag_else_courier_config() {
    let a = TempFile::new("from-env", "listen = \"127.0.0.1:4001\"\n");
    let b = TempFile::new("from-flag", "listen = \"127.0.0.1:4002\"\n");
    let a_path = a.0.display().to_string();
    let env = env_from(&[("COURIER_CONFIG", &a_path)]);
    assert_eq!(
        Config::load(&Overrides::default(), &env).unwrap().listen.port(),
        Some(4001)
    );
    let flags = Overrides {
        config: Some(b.0.clone()),
        ..Overrides::default()
    };
    assert_eq!(Config::load(&flags, &env).unwrap().listen.port(), Some(4002));
    // An empty COURIER_CONFIG means no file.
    let env = env_from(&[("COURIER_CONFIG", "")]);
    assert_eq!(Config::load(&Overrides::default(), &env).unwrap(), Config::default());
}

#[test]
fn a_missing_or_unreadable_file_names_the_path_and_the_os_error() {
    let missing = std::env::temp_dir().join("courier-config-test-does-not-exist.toml");
    let flags = Overrides {
        config: Some(missing.clone()),
        ..Overrides::default()
    };
    let msg = Config::load(&flags, &no_env).unwrap_err().to_string();
    assert!(
        msg.contains(&missing.display().to_string()) && msg.contains("os error"),
        "{msg}"
    );
    let dir = std::env::temp_dir();
    let flags = Overrides {
        config: Some(dir.clone()),
        ..Overrides::default()
    };
    let msg = Config::load(&flags, &no_env).unwrap_err().to_string();
    assert!(msg.starts_with(&format!("config {}", dir.display())), "{msg}");
}

#[test]
fn the_file_is_validated_by_load() {
    let file = TempFile::new("invalid", "[retry]\nmax_attempts = 0\n");
    let flags = Overrides {
        config: Some(file.0.clone()),
        ..Overrides::default()
    };
    let msg = Config::load(&flags, &no_env).unwrap_err().to_string();
    assert!(msg.contains("retry.max_attempts"), "{msg}");
}

/// Finding: `[[host]]` and `[[endpoint]]` keys were compared with live targets as written,
/// so `API.Big.example`, an internationalised host or `https://x.example` (no slash) never
/// matched and the override was silently ignored. Keys are normalised once, at load.
#[test]
fn host_and_endpoint_keys_are_normalised_like_live_targets() {
    let text = concat!(
        "[[host]]\nhost = \"API.Big.example:443\"\nmax_in_flight = 2\n",
        "[[host]]\nhost = \"bücher.example:8443\"\nmax_in_flight = 3\n",
        "[[host]]\nhost = \"[::1]:8080\"\nmax_in_flight = 4\n",
        "[[endpoint]]\nkey = \"https://X.example\"\nrate_per_second = 1\n",
        "[[endpoint]]\nkey = \"https://x.example:443/hook?q=1\"\nrate_per_second = 2\n",
        "[[endpoint]]\nkey = \"tenant-7\"\nrate_per_second = 3\n",
    );
    let c = Config::from_toml_str(text, "c.toml").unwrap();
    c.validate().unwrap();
    let live = |u: &str| crate::target::host_key(&url::Url::parse(u).unwrap());
    let hosts: Vec<&str> = c.hosts.iter().map(|h| h.host.as_str()).collect();
    assert_eq!(
        hosts,
        [
            live("https://api.big.example/x"),
            live("https://bücher.example:8443/"),
            live("http://[::1]:8080/")
        ]
    );
    let endpoint = |u: &str| crate::target::default_endpoint_key(&url::Url::parse(u).unwrap());
    let keys: Vec<&str> = c.endpoints.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            endpoint("https://x.example/"),
            endpoint("https://x.example/hook"),
            "tenant-7".to_string()
        ]
    );
    // Two spellings of one host are one key: listed twice.
    let twice = "[[host]]\nhost = \"a.example:443\"\nmax_in_flight = 1\n[[host]]\nhost = \"A.EXAMPLE:443\"\nmax_in_flight = 2\n";
    let e = Config::from_toml_str(twice, "c.toml").unwrap().validate().unwrap_err();
    assert!(e.to_string().contains("listed twice"), "{e}");
}

#[test]
fn ordering_and_on_dead_are_read_from_endpoints_and_routes() {
    use crate::model::OnDead;
    let text = concat!(
        "[[endpoint]]\nkey = \"https://shop.example/hooks\"\nordering = \"fifo\"\non_dead = \"block\"\n",
        "[[endpoint]]\nkey = \"tenant-7\"\nrate_per_second = 3\n",
        "[[route]]\nname = \"orders\"\nurl = \"https://erp.example/in\"\nordering = \"fifo\"\n",
        "[[route]]\nname = \"plain\"\nurl = \"https://erp.example/other\"\nordering = \"none\"\n",
    );
    let c = Config::from_toml_str(text, "c.toml").unwrap();
    c.validate().unwrap();
    assert_eq!(c.endpoints[0].fifo, Some(OnDead::Block));
    assert_eq!(c.endpoints[0].rate_per_second, None, "the default rate applies");
    assert_eq!(c.endpoints[1].fifo, None);
    assert_eq!(c.routes[0].fifo, Some(OnDead::Skip), "skip is the default");
    assert_eq!(c.routes[1].fifo, None);
    assert!(c
        .summary()
        .contains("endpoint https://shop.example/hooks: rate_per_second 100, ordering fifo (on_dead block)"));
}
