//! The web view (`GET /ui`), black-box: the shell is static, carries its security headers
//! and holds no data; the admin API behind it stays behind the token, takes the page's own
//! same-origin calls and still refuses other pages; and in a real browser (Debian's
//! chromium, driven by `ui_browser.cjs` through playwright-core) the page asks for the
//! token, shows nothing without it, lists a dead delivery with outside text as text, and
//! replays it to a receiver that now answers 200.
//!
//! `COURIER_UI_SCREENSHOT=/abs/path.png` makes the browser test save the page with data in
//! it (that is how `docs/ui.png` is made).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};

use crate::admin::send;
use crate::support::*;

const TOKEN: &str = "ui-t0ken-5e1f";
/// What a receiver's answer may say about itself: ends up in `last_error`.
const HOSTILE_BODY: &str = "<img src=x onerror=\"window.__pwned='img'\">";
/// An endpoint key an app may choose (visible ASCII, no spaces: a valid key).
const HOSTILE_KEY: &str = "<script>window.__pwned='script'</script>";

/// `GET`s an admin path with the token; the answer must be 200.
async fn admin_json(c: &Courier, path: &str) -> Value {
    let bearer = format!("Bearer {TOKEN}");
    let a = request("GET", &c.admin_url(path), &[("authorization", &bearer)], "").await;
    assert_eq!(a.status, 200, "{path}: {}", a.text());
    a.json()
}

/// Waits until a delivery reaches `state` (read with the token); returns its JSON.
async fn wait_state_with_token(c: &Courier, id: &str, state: &str) -> Value {
    eventually(&format!("{id} to be {state}"), || async {
        let d = admin_json(c, &format!("/deliveries/{id}")).await;
        (d["state"] == state).then_some(d)
    })
    .await
}

/// The headers the brief asks of every UI answer, named here (not read from courier's own
/// list, so dropping one from it fails this test).
fn assert_security_headers(a: &Answer, what: &str) {
    let header = |name: &str| a.headers.get(name).map(String::as_str).unwrap_or("");
    assert_eq!(header("x-frame-options"), "DENY", "{what}");
    assert_eq!(header("referrer-policy"), "no-referrer", "{what}");
    assert_eq!(header("cache-control"), "no-store", "{what}");
    assert_eq!(header("x-content-type-options"), "nosniff", "{what}");
    let csp = header("content-security-policy");
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ] {
        assert!(csp.contains(directive), "{what}: {directive} not in {csp:?}");
    }
    assert!(!csp.contains("unsafe"), "{what}: {csp}");
}

#[tokio::test]
async fn ui_is_a_static_shell_with_strict_headers_and_the_api_stays_behind_the_token() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), &format!("admin_token = \"{TOKEN}\"\n"));
    let target = rx.url("/hooks/shell");
    let id = send(&c, &target, "{}").await;
    wait_state_with_token(&c, &id, "delivered").await;

    for (path, content_type) in [
        ("/ui", "text/html; charset=utf-8"),
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/dom.js", "text/javascript; charset=utf-8"),
        ("/ui/style.css", "text/css; charset=utf-8"),
    ] {
        // A navigation: no token, as a browser sends it.
        let a = request("GET", &c.admin_url(path), &[("sec-fetch-site", "none")], "").await;
        assert_eq!(a.status, 200, "{path}: {}", a.text());
        assert_eq!(a.headers["content-type"], content_type, "{path}");
        assert_security_headers(&a, path);
        let text = a.text();
        assert!(
            !text.contains(&id) && !text.contains("/hooks/shell"),
            "{path} holds data"
        );
    }
    let shell = get(&c.admin_url("/ui")).await.text();
    assert!(
        shell.contains("data-auth=\"token\""),
        "the shell says a token is needed"
    );

    // The data stays behind the token, also for the page's own (same-origin) calls.
    let own_origin = format!("http://{}", c.admin);
    let bearer = format!("Bearer {TOKEN}");
    let same = ("sec-fetch-site", "same-origin");
    let list = c.admin_url("/deliveries");
    assert_eq!(request("GET", &list, &[same], "").await.status, 401);
    assert_eq!(
        request("GET", &list, &[same, ("authorization", &bearer)], "")
            .await
            .status,
        200
    );
    let replay_all = c.admin_url("/deliveries/retry?state=dead");
    let from_page = [same, ("origin", own_origin.as_str()), ("authorization", &bearer)];
    let a = request("POST", &replay_all, &from_page, "").await;
    assert_eq!(
        (a.status, a.json()["requeued"].as_u64()),
        (200, Some(0)),
        "{}",
        a.text()
    );
    // Pages elsewhere still get nothing, not even the shell.
    let other = [
        ("sec-fetch-site", "same-site"),
        ("origin", "http://127.0.0.1:1"),
        ("authorization", &bearer),
    ];
    assert_eq!(request("POST", &replay_all, &other, "").await.status, 403);
    let a = request("GET", &c.admin_url("/ui"), &[("sec-fetch-site", "cross-site")], "").await;
    assert_eq!(
        (a.status, a.json()["error"].as_str()),
        (403, Some("cross_site_refused"))
    );
    assert_eq!(request("POST", &c.admin_url("/ui"), &[], "").await.status, 405);

    // Without an admin_token the shell says so, and the page asks for nothing.
    let d2 = tempfile::tempdir().unwrap();
    let open = Courier::start(d2.path(), "");
    assert!(get(&open.admin_url("/ui")).await.text().contains("data-auth=\"none\""));
}

/// Where playwright-core is: a `NODE_PATH` folder holding it.
fn playwright_on_node_path() -> Option<PathBuf> {
    let node_path = std::env::var_os("NODE_PATH")?;
    std::env::split_paths(&node_path).find(|p| p.join("playwright-core/package.json").exists())
}

/// The browser: `COURIER_TEST_CHROMIUM`, else Debian's path if it is there.
fn chromium() -> Option<PathBuf> {
    let path =
        std::env::var_os("COURIER_TEST_CHROMIUM").map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    path.exists().then_some(path)
}

/// Runs the browser driver with `input`; returns what it printed (one JSON object).
async fn drive_browser(chromium: &Path, input: Value) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/ui_browser.cjs");
    let mut cmd = Command::new("node");
    cmd.arg(script)
        .arg(input.to_string())
        .env("COURIER_TEST_CHROMIUM", chromium);
    // Blocking, on its own thread: the receiver keeps answering on this runtime meanwhile.
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the browser driver failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("driver output is not JSON ({e}): {stdout}"))
}

#[tokio::test]
async fn in_a_browser_the_page_asks_for_the_token_shows_text_as_text_and_replays_a_dead_delivery() {
    let Some(chromium) = chromium() else {
        return skip("no chromium (COURIER_TEST_CHROMIUM; scripts/verifiers.sh installs it)");
    };
    if playwright_on_node_path().is_none() || Command::new("node").arg("--version").output().is_err() {
        return skip("no node with playwright-core on NODE_PATH (scripts/verifiers.sh installs it)");
    }
    // /orders is gone (410) until the receiver is fixed; the hostile endpoint's receiver
    // answers 400 with markup; /flaky is down (stays pending); /audit is fine.
    let healed = Arc::new(AtomicBool::new(false));
    let h = healed.clone();
    let rx = Receiver::scripted(move |_, seen| match seen.path.as_str() {
        "/hooks/orders" if !h.load(Ordering::SeqCst) => Reply::status(410).body("endpoint retired"),
        "/hooks/orders" | "/hooks/audit" => Reply::status(200),
        "/hooks/flaky" => Reply::status(503),
        _ => Reply::status(400).body(HOSTILE_BODY),
    })
    .await;
    let d = tempfile::tempdir().unwrap();
    let cfg = format!("admin_token = \"{TOKEN}\"\n[retry]\nbase_delay = \"1h\"\n");
    let c = Courier::start(d.path(), &cfg);
    let orders = send(&c, &rx.url("/hooks/orders"), "{\"type\":\"order.paid\"}").await;
    let hostile_key = format!("{}/{HOSTILE_KEY}", rx.url("/hooks"));
    let a = post(
        &format!("http://{}/", c.ingress),
        &[
            ("courier-target", &rx.url("/hooks/<script>")),
            ("courier-endpoint", &hostile_key),
        ],
        "{}",
    )
    .await;
    assert_eq!(a.status, 202, "{}", a.text());
    let hostile = a.json()["id"].as_str().unwrap().to_string();
    send(&c, &rx.url("/hooks/flaky"), "{}").await;
    let audit = send(&c, &rx.url("/hooks/audit"), "{}").await;
    wait_state_with_token(&c, &orders, "dead").await;
    wait_state_with_token(&c, &hostile, "dead").await;
    wait_state_with_token(&c, &audit, "delivered").await;
    healed.store(true, Ordering::SeqCst);

    let screenshot = std::env::var("COURIER_UI_SCREENSHOT").ok();
    let seen = drive_browser(
        &chromium,
        json!({
            "admin": format!("http://{}", c.admin),
            "token": TOKEN,
            "wrong_token": "not-the-token",
            "replay_id": orders,
            "screenshot": screenshot,
        }),
    )
    .await;

    // Without the token: asked for, nothing shown, every call the page made refused.
    let locked = &seen["locked"];
    assert_eq!(locked["before"]["api"], json!([]), "no call before a token: {locked}");
    assert_eq!(locked["probe_status"], 401, "{locked}");
    assert_eq!(locked["login_visible"], true, "{locked}");
    assert!(locked["login_error"].as_str().unwrap().contains("refused"), "{locked}");
    assert_eq!(locked["data_visible"], false, "{locked}");
    assert_eq!(locked["stored_token"], 0, "a refused token is forgotten: {locked}");
    let calls = locked["api"].as_array().unwrap();
    assert!(calls.len() >= 2, "the wrong token was tried: {locked}");
    assert!(calls.iter().all(|c| c["status"] == 401), "{locked}");
    for shown in [&locked["before"]["data_text"], &locked["data_text"]] {
        let shown = shown.as_str().unwrap();
        for data in [orders.as_str(), hostile.as_str(), "/hooks/", "410"] {
            assert!(!shown.contains(data), "{data} shown without the token: {shown}");
        }
    }

    // With it: listed, outside text as text, no console error, replayed and delivered.
    let page = &seen["unlocked"];
    let listed = &page["listed"];
    assert_eq!(page["console"], json!([]), "console errors or warnings: {page}");
    assert_eq!(page["page_errors"], json!([]), "{page}");
    assert_eq!(listed["stored_token"], TOKEN, "{listed}");
    let rows = listed["deliveries_text"].as_str().unwrap();
    for text in [
        orders.as_str(),
        hostile.as_str(),
        "endpoint retired",
        HOSTILE_BODY,
        HOSTILE_KEY,
    ] {
        assert!(rows.contains(text), "dead rows lack {text}: {rows}");
    }
    assert!(
        listed["endpoints_text"].as_str().unwrap().contains(HOSTILE_KEY),
        "{listed}"
    );
    assert_eq!(listed["pwned"], Value::Null, "outside text ran as code: {listed}");
    assert_eq!(listed["img_elements"], 0, "outside text became an element: {listed}");
    assert_eq!(listed["script_elements"], 2, "only the page's own scripts: {listed}");
    let cards = listed["cards_text"].as_str().unwrap();
    assert!(
        cards.contains("Dead letters2stored") && cards.contains("Pending1"),
        "{cards}"
    );
    assert_eq!(page["detail_state"], "delivered", "{page}");
    assert!(
        page["api"].as_array().unwrap().iter().all(|c| c["status"] != 401),
        "{page}"
    );

    // The receiver really got the replay, after the page's click.
    let replayed: Vec<Seen> = rx.seen().into_iter().filter(|s| s.path == "/hooks/orders").collect();
    assert_eq!(replayed.len(), 2, "one 410, then the replay");
    assert_eq!(replayed[1].body, b"{\"type\":\"order.paid\"}");
    let after = admin_json(&c, &format!("/deliveries/{orders}")).await;
    assert_eq!(
        (after["state"].as_str(), after["last_status"].as_u64()),
        (Some("delivered"), Some(200)),
        "{after}"
    );
    if let Some(path) = screenshot {
        assert!(
            std::fs::metadata(&path).is_ok_and(|m| m.len() > 10_000),
            "no screenshot at {path}"
        );
    }
}
