//! `listen = "unix:/path"` and `listen_mode`: parsing in every layer, validation, summary.

use super::*;

#[test]
fn a_unix_listen_path_and_its_mode_parse_from_file_env_and_flag() {
    let c = parse("listen = \"unix:/run/courier/ingress.sock\"\nlisten_mode = \"0600\"\n");
    assert_eq!(c.listen, ListenAddr::Unix(PathBuf::from("/run/courier/ingress.sock")));
    assert_eq!((c.listen.tcp(), c.listen_mode), (None, 0o600));
    assert_eq!(Config::default().listen_mode, 0o660);

    let env = env_from(&[("COURIER_LISTEN", "unix:/a.sock"), ("COURIER_LISTEN_MODE", "666")]);
    let c = Config::load(&Overrides::default(), &env).unwrap();
    assert_eq!(
        (c.listen.to_string(), c.listen_mode),
        ("unix:/a.sock".to_string(), 0o666)
    );
    let flags = Overrides {
        listen: Some("unix:/b.sock".into()),
        ..Overrides::default()
    };
    assert_eq!(Config::load(&flags, &env).unwrap().listen.to_string(), "unix:/b.sock");
}

#[test]
fn bad_unix_paths_and_modes_name_the_key() {
    for (text, want) in [
        (
            "listen = \"unix:relative.sock\"\n",
            "listen: expected unix:/absolute/path",
        ),
        ("listen = \"unix:\"\n", "listen: expected unix:/absolute/path"),
        ("listen_mode = \"0800\"\n", "listen_mode: expected an octal mode"),
        ("listen_mode = \"1777\"\n", "listen_mode: expected an octal mode"),
        ("listen_mode = \"\"\n", "listen_mode: expected an octal mode"),
    ] {
        let err = Config::from_toml_str(text, "c.toml").unwrap_err().to_string();
        assert!(err.contains(want), "{text:?}: {err}");
    }
    // admin and ops stay TCP.
    let err = Config::from_toml_str("admin_listen = \"unix:/x.sock\"\n", "c.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("admin_listen: expected ip:port"), "{err}");
}

#[test]
fn a_socket_needs_no_token_and_never_collides_with_a_port() {
    // A socket is local like loopback: no ingress_token needed; admin on any port is fine.
    let c = parse("listen = \"unix:/run/courier/ingress.sock\"\nadmin_listen = \"127.0.0.1:8787\"\n");
    c.validate().unwrap();
    assert!(c.unauthenticated_network_listeners().is_empty());
    assert!(
        c.summary()
            .contains("listen unix:/run/courier/ingress.sock (ingress, mode 0660), 127.0.0.1:8787 (admin)"),
        "{}",
        c.summary()
    );
    // The TCP summary line is unchanged.
    assert!(parse("")
        .summary()
        .contains("listen 127.0.0.1:8787 (ingress), 127.0.0.1:8788 (admin)"));
}
