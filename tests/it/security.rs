//! The trust boundaries, black-box: web pages cannot use ingress or admin (cross-site
//! requests, DNS rebinding), named keys sign only for their targets, a listener off loopback
//! needs its token, probes and metrics have a listener of their own that changes nothing,
//! and no secret shows in an admin answer, CLI output or log line.

use std::process::Command;

use serde_json::Value;

use crate::support::*;

const FAST: &str = "[retry]\nbase_delay = \"100ms\"\nmax_delay = \"400ms\"\njitter = \"none\"\n";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const PARTNER_SECRET: &str = "whsec_cGFydG5lci1zZWNyZXQtb2YtYS1wYXJ0bmVy";

/// Sends raw HTTP/1.1 and returns (status, JSON body).
async fn raw_json(addr: std::net::SocketAddr, req: String) -> (u16, Value) {
    let answer = tokio::task::spawn_blocking(move || raw(addr, req.as_bytes()))
        .await
        .unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"));
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

async fn stored(c: &Courier) -> usize {
    get(&c.admin_url("/deliveries?limit=1000")).await.json()["items"]
        .as_array()
        .unwrap()
        .len()
}

#[tokio::test]
async fn web_pages_cannot_use_ingress_or_admin_and_nothing_is_stored() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let cfg = format!(
        "{FAST}[signing]\nsecrets = [\"{SECRET}\"]\n[ingress]\nallowed_origins = [\"https://app.example\"]\nhosts = [\"courier.internal\"]\n"
    );
    let c = Courier::start(d.path(), &cfg);
    let (ing, adm) = (c.ingress, c.admin);
    let target = rx.url("/c");
    let ip = ing.ip();

    // The three requests of the report: all refused.
    let cross_site = format!(
        "POST /{target} HTTP/1.1\r\nHost: {ing}\r\nOrigin: https://evil.example\r\nSec-Fetch-Site: cross-site\r\n\
         Content-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    let (status, body) = raw_json(ing, cross_site).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("cross_site_refused")),
        "{body}"
    );
    let (status, body) = raw_json(
        adm,
        format!(
            "POST /deliveries/retry HTTP/1.1\r\nHost: {adm}\r\nOrigin: https://evil.example\r\n\
             Sec-Fetch-Site: cross-site\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("cross_site_refused")),
        "{body}"
    );
    let (status, body) = raw_json(
        adm,
        format!(
            "GET /deliveries?limit=1 HTTP/1.1\r\nHost: evil.example:{}\r\nConnection: close\r\n\r\n",
            adm.port()
        ),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (421, Some("misdirected_request")),
        "{body}"
    );

    // More browser shapes on ingress, each in every target form that is origin-form.
    for extra in [
        "Sec-Fetch-Site: same-site\r\n",
        // A link clicked in a mail or chat app: still a browser.
        "Sec-Fetch-Site: none\r\n",
        "Origin: null\r\n",
        "Origin: https://evil.example\r\n",
    ] {
        for head in [
            format!("POST /{target} HTTP/1.1\r\n"),
            format!("POST / HTTP/1.1\r\nCourier-Target: {target}\r\n"),
        ] {
            let req = format!("{head}Host: {ing}\r\n{extra}Content-Length: 2\r\nConnection: close\r\n\r\n{{}}");
            let (status, body) = raw_json(ing, req).await;
            assert_eq!(
                (status, body["error"].as_str()),
                (403, Some("cross_site_refused")),
                "{extra}"
            );
        }
    }
    for host in [
        format!("evil.example:{}", ing.port()),
        "rebind.attacker.example".to_string(),
    ] {
        let req =
            format!("POST /{target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}");
        let (status, body) = raw_json(ing, req).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (421, Some("misdirected_request")),
            "{host}: {body}"
        );
    }
    assert_eq!(stored(&c).await, 0, "nothing refused was stored");
    let m = get(&c.admin_url("/metrics")).await.text();
    assert!(m.contains("\ncourier_accepted_total 0\n"), "{m}");

    // What server-side clients send is unaffected: no browser headers, loopback names,
    // a listed host, a listed origin, and HTTP_PROXY's absolute form whose Host is the target.
    let rx_host = rx.addr.to_string();
    let fine = [
        format!("POST /{target} HTTP/1.1\r\nHost: {ing}\r\n"),
        format!("POST /{target} HTTP/1.1\r\nHost: localhost:{}\r\n", ing.port()),
        format!("POST /{target} HTTP/1.1\r\nHost: {ip}\r\n"),
        format!("POST /{target} HTTP/1.1\r\nHost: courier.internal:{}\r\n", ing.port()),
        format!(
            "POST /{target} HTTP/1.1\r\nHost: {ing}\r\nOrigin: https://app.example\r\nSec-Fetch-Site: cross-site\r\n"
        ),
        format!("POST {target} HTTP/1.1\r\nHost: {rx_host}\r\n"),
    ];
    for (i, head) in fine.iter().enumerate() {
        let req = format!("{head}Content-Length: 2\r\nConnection: close\r\n\r\n{{}}");
        let (status, body) = raw_json(ing, req).await;
        assert_eq!(status, 202, "{head:?}: {body}");
        rx.wait_for(i + 1).await;
    }
    assert_eq!(stored(&c).await, fine.len());
}

#[tokio::test]
async fn a_named_key_signs_only_for_its_targets() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let partner = format!("http://{}/partner/*", rx.addr);
    let cfg = format!(
        "{FAST}[signing]\nsecrets = [\"{SECRET}\"]\n\
         [signing.keys]\npartner = {{ secrets = [\"{PARTNER_SECRET}\"], targets = [\"{partner}\"] }}\n\
         [[route]]\nname = \"p\"\nurl = \"{}\"\nsigning_key = \"partner\"\n\
         [[route]]\nname = \"bound\"\nurl = \"{}\"\ntargets = [\"{}\"]\n",
        rx.url("/partner/in"),
        rx.url("/bound"),
        rx.url("/bound"),
    );
    let c = Courier::start(d.path(), &cfg);
    let key = [("courier-signing-key", "partner")];

    // Inside its targets: accepted and signed.
    let a = post(&c.prefixed(&rx.url("/partner/orders")), &key, "ok").await;
    assert_eq!(a.status, 202, "{}", a.text());
    let seen = rx.wait_for(1).await;
    assert!(seen[0].header("webhook-signature").is_some());

    // Anywhere else: 400, nothing stored, nothing sent.
    for target in [
        rx.url("/evil"),
        rx.url("/partnerX"),
        "https://evil.example/partner/x".to_string(),
    ] {
        let a = post(&c.prefixed(&target), &key, "forged").await;
        assert_eq!(a.status, 400, "{target}: {}", a.text());
        assert_eq!(a.json()["error"], "signing_key_not_allowed", "{target}");
    }
    // Through a route: its key's targets hold; a route's own targets hold for extra paths.
    let ing = c.ingress;
    assert_eq!(post(&format!("http://{ing}/r/p/x"), &[], "ok").await.status, 202);
    let a = post(&format!("http://{ing}/r/bound/extra"), &[], "x").await;
    assert_eq!(a.status, 400, "{}", a.text());
    assert_eq!(a.json()["error"], "signing_key_not_allowed");
    let a = post(&format!("http://{ing}/r/bound"), &[], "ok").await;
    assert_eq!(a.status, 202, "{}", a.text());
    rx.wait_for(3).await;
    let paths: Vec<String> = rx.seen().iter().map(|s| s.path.clone()).collect();
    assert!(
        paths.iter().all(|p| p.starts_with("/partner/") || p == "/bound"),
        "{paths:?}"
    );
    assert!(!paths.iter().any(|p| p.contains("evil")), "{paths:?}");
}

/// `courier <args>` with only `env` as COURIER_* settings; (exit code, stderr).
fn courier(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("COURIER_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_listener_off_loopback_needs_its_token() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    let data = data.to_str().unwrap();
    for (flag, token) in [("--listen", "ingress_token"), ("--admin-listen", "admin_token")] {
        for verb in ["serve", "check-config"] {
            let (code, err) = courier(&[verb, "--data-dir", data, flag, "0.0.0.0:0"], &[]);
            assert_ne!(code, 0, "{verb} {flag}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
            assert!(
                err.contains(token) && err.contains("allow_unauthenticated_network"),
                "{err}"
            );
        }
    }
    assert!(
        !std::path::Path::new(data).exists(),
        "refused before the store was created"
    );
    // With its token, or on purpose: valid.
    let (code, err) = courier(
        &["check-config", "--data-dir", data, "--admin-listen", "0.0.0.0:0"],
        &[("COURIER_ADMIN_TOKEN", "t0k3n-for-the-admin")],
    );
    assert_eq!(code, 0, "{err}");
    let (code, err) = courier(
        &["check-config", "--data-dir", data, "--listen", "0.0.0.0:0"],
        &[("COURIER_ALLOW_UNAUTHENTICATED_NETWORK", "true")],
    );
    assert_eq!(code, 0, "{err}");
}

#[tokio::test]
async fn probes_and_metrics_have_a_listener_that_changes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let cfg = "admin_token = \"adm1n-token-value\"\n";
    let c = Courier::start_with(d.path(), cfg, &["--ops-listen", "127.0.0.1:0"], &[]);
    let ops = c.ops.expect("the listening line names the ops listener");
    assert_eq!(get(&format!("http://{ops}/healthz")).await.status, 200);
    assert_eq!(get(&format!("http://{ops}/readyz")).await.status, 200);
    let m = get(&format!("http://{ops}/metrics")).await;
    assert_eq!(m.status, 200);
    assert!(m.text().contains("courier_accepted_total"), "{}", m.text());
    for (method, path) in [
        ("GET", "/deliveries"),
        ("GET", "/endpoints"),
        ("POST", "/deliveries/retry"),
        ("DELETE", "/deliveries/dlv_x"),
        ("POST", "/endpoints/x/pause"),
        ("GET", "/ui"),
    ] {
        let a = request(
            method,
            &format!("http://{ops}{path}"),
            &[("authorization", "Bearer adm1n-token-value")],
            "",
        )
        .await;
        assert_eq!(a.status, 404, "{method} {path} on ops: {}", a.text());
    }
    // The admin API is where it was, behind its token.
    assert_eq!(get(&c.admin_url("/deliveries")).await.status, 401);
    assert_eq!(get(&c.admin_url("/readyz")).await.status, 401);
}

#[tokio::test]
async fn no_secret_shows_in_admin_answers_cli_output_or_logs() {
    const ALERT_PATH: &str = "/services/T0SECRET/B0SECRET/x0xSECRETx0x";
    const ALERT_QUERY: &str = "token=alertQUERYsecret";
    const INGRESS_TOKEN: &str = "ingress-TOKEN-value-123";
    const ADMIN_TOKEN: &str = "admin-TOKEN-value-456";
    let alerts = Receiver::start().await;
    // A receiver whose answer tries to disguise itself on a terminal.
    let rx = Receiver::scripted(|_, _| Reply::status(410).body("gone\u{202E}txt.exe\u{200B}\x1b[2J")).await;
    let d = tempfile::tempdir().unwrap();
    let cfg = format!(
        "alert_url = \"{}{ALERT_PATH}?{ALERT_QUERY}\"\ningress_token = \"{INGRESS_TOKEN}\"\nadmin_token = \"{ADMIN_TOKEN}\"\n\
         {FAST}[delivery]\npause_after_permanent_failures = 1\n[signing]\nsecrets = [\"{SECRET}\"]\n",
        format_args!("http://{}", alerts.addr)
    );
    let c = Courier::start(d.path(), &cfg);
    let a = post(
        &c.prefixed(&rx.url("/gone?api_key=qUeRyVaLuE")),
        &[("courier-token", INGRESS_TOKEN)],
        "x",
    )
    .await;
    assert_eq!(a.status, 202, "{}", a.text());
    alerts.wait_for(1).await;
    let auth = [("authorization", format!("Bearer {ADMIN_TOKEN}"))];
    let auth: Vec<(&str, &str)> = auth.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut shown = String::new();
    let alert_id = eventually("the alert to be delivered", || async {
        let list = request("GET", &c.admin_url("/deliveries?limit=100"), &auth, "")
            .await
            .json();
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["state"] == "delivered")
            .map(|d| d["id"].as_str().unwrap().to_string())
    })
    .await;
    for path in [
        "/deliveries?limit=100",
        "/endpoints",
        "/metrics",
        &format!("/deliveries/{alert_id}"),
    ] {
        shown.push_str(&request("GET", &c.admin_url(path), &auth, "").await.text());
    }
    let env = [
        ("COURIER_ADMIN_LISTEN", c.admin.to_string()),
        ("COURIER_CONFIG", c.config_path.display().to_string()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut cli_out = String::new();
    for args in [
        vec!["deliveries", "list"],
        vec!["deliveries", "list", "--json"],
        vec!["endpoints", "list"],
        vec!["endpoints", "list", "--json"],
        vec!["deliveries", "show", &alert_id],
    ] {
        let (code, out, err) = tokio::task::spawn_blocking({
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            move || {
                let mut cmd = Command::new(bin());
                cmd.args(&args).envs(env);
                let o = cmd.output().unwrap();
                (
                    o.status.code().unwrap_or(-1),
                    String::from_utf8_lossy(&o.stdout).into_owned(),
                    String::from_utf8_lossy(&o.stderr).into_owned(),
                )
            }
        })
        .await
        .unwrap();
        assert_eq!(code, 0, "{args:?}: {err}");
        cli_out.push_str(&out);
        cli_out.push_str(&err);
    }
    // The dead message's last_error keeps the text but none of its disguises.
    assert!(shown.contains("HTTP 410: gonetxt.exe"), "{shown}");
    assert!(
        cli_out.contains("\\u{202E}") || cli_out.contains("gonetxt.exe"),
        "{cli_out}"
    );
    let log = c.log.all();
    for secret in [
        "T0SECRET",
        "alertQUERYsecret",
        INGRESS_TOKEN,
        ADMIN_TOKEN,
        &SECRET["whsec_".len()..],
        "qUeRyVaLuE",
    ] {
        for (place, text) in [("admin API", &shown), ("CLI", &cli_out), ("log", &log)] {
            // The receiver's own target query is the app's business in the admin API (it is
            // where the app sends); only logs must mask it.
            if secret == "qUeRyVaLuE" && place != "log" {
                continue;
            }
            assert!(!text.contains(secret), "{secret:?} shown in the {place}:\n{text}");
        }
    }
    for hidden in ['\u{202E}', '\u{200B}', '\x1b'] {
        assert!(!shown.contains(hidden), "{hidden:?} in the admin API");
        assert!(!cli_out.contains(hidden), "{hidden:?} printed by the CLI");
    }
    assert!(
        shown.contains("[alert_url]"),
        "the alert's target is shown redacted: {shown}"
    );
}
