//! `Config::summary`, and that neither it, `Debug` nor an error shows a secret.

use super::*;

#[test]
fn secrets_never_leak() {
    let config = parse(&full_toml());
    assert_no_secret(&format!("{config:?}"));
    assert_no_secret(&config.summary());
    let from_env = Config::load(
        &Overrides::default(),
        &env_from(&[("COURIER_INGRESS_TOKEN", "hunter2"), ("COURIER_ADMIN_TOKEN", "s3kr1t")]),
    )
    .unwrap();
    assert_no_secret(&format!("{from_env:?}"));
    assert_no_secret(&from_env.summary());
    // Secret values put in the wrong place, or on a line with a syntax error.
    let bad_files = [
        "[signing]\nsecrets = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n",
        "ingress_token = [\"tok-INGRESS-5ecret\"]\n",
        "ingress_token = \"tok-INGRESS-5ecret\n",
        "ingress_token = tok-INGRESS-5ecret\n",
        "[signing.keys]\nbilling = \"sk-BILLING-5ecret\"\n",
        "[signing.keys]\nbilling = [\"sk-BILLING-5ecret\", 3]\n",
        "alert_url = \"https://ops.example/alerts/SECRETPATH\"\nalert_url = \"x\"\n",
        "alert_url = \"https//ops.example/SECRETPATH\"\n",
    ];
    for text in bad_files {
        let msg = Config::from_toml_str(text, "c.toml").unwrap_err().to_string();
        assert_no_secret(&msg);
    }
    let url_with_password = parse("[[route]]\nname = \"a\"\nurl = \"https://user:s3kr1t@a.example/h\"\n");
    assert_no_secret(&format!("{url_with_password:?}"));
    assert_no_secret(&url_with_password.summary());
}

#[test]
fn summary_describes_the_settings() {
    let summary = parse(&full_toml()).summary();
    for want in [
        "listen 0.0.0.0:9001 (ingress), [::1]:9002 (admin); data_dir /var/lib/courier",
        "max_body 2MiB; ingress_token set; admin_token set; alert_url https://ops.example/…",
        "shutdown_grace 0s; retention 1d (delivered), 7d (dead)",
        "retry: base_delay 250ms, max_delay 10m, jitter full, max_attempts 8",
        "max_response_body 1KiB, idle_connection_timeout 45s, max_idle_connections 32",
        "log: format json",
        "signing: scheme standard, 2 secrets by default, keys: billing (2 secrets), partner (1 secret)",
        "egress: private targets allowed, allow: 127.0.0.1/32, 10.1.0.0/16, ::1/128, 192.168.1.7/32",
        "route billing -> https://billing.example/hooks (signing key billing, scheme stripe)",
        "route partner-2_x -> http://partner.example:8080/in?a=1 (signing key partner, scheme standard)",
        "host api.bigcustomer.example:443: max_in_flight 50",
        "endpoint https://slow.example/hook: rate_per_second 5",
    ] {
        assert!(summary.contains(want), "missing {want:?} in:\n{summary}");
    }
    let default = Config::default().summary();
    assert!(
        default.contains("ingress_token unset; admin_token unset; alert_url unset"),
        "{default}"
    );
    assert!(
        default.contains("max_response_body 64KiB") && default.contains("max_body 1MiB"),
        "{default}"
    );
}

#[test]
fn error_accessors() {
    let e = Config::from_toml_str("x = 1", "f.toml").unwrap_err();
    assert_eq!(e.place(), "config f.toml");
    assert_eq!(e.problem(), "unknown key \"x\" (line 1)");
    assert_eq!(ConfigError::new("a\nb", "c\r\nd").to_string(), "a b: c d");
}

#[test]
fn summary_lists_ed25519_public_keys_never_their_secrets() {
    let secret = "whsk_Y291cmllciBlZDI1NTE5IGtub3duLWFuc3dlciBrZXk=";
    let text =
        format!("[signing]\nsecrets = [\"whsec_c2VjcmV0\", \"{secret}\"]\n[signing.keys]\nbilling = [\"{secret}\"]\n");
    let summary = parse(&text).summary();
    let public = "whpk_SgxHe1+cbw9OFG7edwgundcRpId0LhJMbVzadLmMNiU=";
    assert!(
        summary.contains(&format!("signing: signing.secrets[1] is Ed25519, public key {public}")),
        "{summary}"
    );
    assert!(
        summary.contains(&format!(
            "signing: signing.keys.billing[0] is Ed25519, public key {public}"
        )),
        "{summary}"
    );
    assert!(!summary.contains("signing.secrets[0] is Ed25519"), "{summary}");
    assert!(!summary.contains(&secret[5..]), "{summary}");
}
