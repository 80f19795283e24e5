//! Ingress: the four target forms, control headers, event ids, dedupe, every error status.

use std::time::Duration;

use crate::support::*;

fn dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[tokio::test]
async fn path_form_is_delivered_with_method_body_and_query() {
    let rx = Receiver::start().await;
    let d = dir();
    let c = Courier::start(d.path(), "");
    let a = post(
        &c.prefixed(&rx.url("/hooks?x=1&y=2")),
        &[("content-type", "application/json")],
        "{\"a\":1}",
    )
    .await;
    assert_eq!(a.status, 202, "{}", a.text());
    let j = a.json();
    assert!(j["id"].as_str().unwrap().starts_with("dlv_"));
    assert!(j["event_id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(j["status"], "pending");
    assert_eq!(
        a.headers.get("courier-delivery-id").map(String::as_str),
        j["id"].as_str()
    );
    let seen = rx.wait_for(1).await;
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].path, "/hooks?x=1&y=2");
    assert_eq!(seen[0].body, b"{\"a\":1}");
    assert_eq!(seen[0].header("content-type").as_deref(), Some("application/json"));
    assert_eq!(seen[0].header("webhook-id"), j["event_id"].as_str().map(str::to_string));
}

#[tokio::test]
async fn courier_target_header_wins_and_other_methods_are_kept() {
    let rx = Receiver::start().await;
    let d = dir();
    let c = Courier::start(d.path(), "");
    let a = request(
        "PUT",
        &format!("http://{}/ignored", c.ingress),
        &[("courier-target", &rx.url("/t"))],
        "x",
    )
    .await;
    assert_eq!(a.status, 202, "{}", a.text());
    let seen = rx.wait_for(1).await;
    assert_eq!((seen[0].method.as_str(), seen[0].path.as_str()), ("PUT", "/t"));
}

#[tokio::test]
async fn absolute_form_works_as_an_http_proxy() {
    let rx = Receiver::start().await;
    let d = dir();
    let c = Courier::start(d.path(), "");
    let req = format!(
        "POST http://{}/proxied?q=1 HTTP/1.1\r\nHost: {}\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        rx.addr, rx.addr
    );
    let answer = raw(c.ingress, req.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    let seen = rx.wait_for(1).await;
    assert_eq!(seen[0].path, "/proxied?q=1");
    assert_eq!(seen[0].body, b"hello");
}

#[tokio::test]
async fn named_routes_join_paths_with_one_slash() {
    let rx = Receiver::start().await;
    let d = dir();
    let cfg = format!("[[route]]\nname = \"billing\"\nurl = \"{}\"\n", rx.url("/hooks/"));
    let c = Courier::start(d.path(), &cfg);
    assert_eq!(
        post(&format!("http://{}/r/billing/x?y=1", c.ingress), &[], "a")
            .await
            .status,
        202
    );
    assert_eq!(
        post(&format!("http://{}/r/billing", c.ingress), &[], "b").await.status,
        202
    );
    let seen = rx.wait_for(2).await;
    let mut paths: Vec<_> = seen.iter().map(|s| s.path.clone()).collect();
    paths.sort();
    assert_eq!(paths, vec!["/hooks/", "/hooks/x?y=1"]);
    let a = post(&format!("http://{}/r/nope", c.ingress), &[], "c").await;
    assert_eq!(a.status, 400);
    assert_eq!(a.json()["error"], "unknown_route");
}

#[tokio::test]
async fn body_is_byte_identical_and_headers_are_filtered() {
    let rx = Receiver::start().await;
    let d = dir();
    let c = Courier::start(d.path(), "");
    let body: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    let a = post(
        &c.prefixed(&rx.url("/bin")),
        &[
            ("authorization", "Bearer app-secret-for-receiver"),
            ("x-custom", "kept"),
            ("courier-endpoint", "ep-1"),
            ("proxy-authorization", "Bearer nope"),
            ("connection", "keep-alive, x-hop"),
            ("x-hop", "dropped"),
            ("webhook-signature", "v1,stale"),
            ("content-type", "application/octet-stream"),
        ],
        body.clone(),
    )
    .await;
    assert_eq!(a.status, 202, "{}", a.text());
    let s = &rx.wait_for(1).await[0];
    assert_eq!(s.body, body);
    assert_eq!(
        s.header("authorization").as_deref(),
        Some("Bearer app-secret-for-receiver")
    );
    assert_eq!(s.header("x-custom").as_deref(), Some("kept"));
    assert_eq!(s.header("content-length").as_deref(), Some("4096"));
    assert_eq!(s.header("host"), Some(rx.addr.to_string()));
    for gone in ["courier-endpoint", "proxy-authorization", "x-hop", "webhook-signature"] {
        assert!(s.header(gone).is_none(), "{gone} must not be forwarded");
    }
    assert!(s.header("webhook-timestamp").is_some());
}

#[tokio::test]
async fn event_ids_come_from_webhook_id_then_idempotency_key_and_dedupe() {
    let rx = Receiver::start().await;
    let d = dir();
    let c = Courier::start(d.path(), "");
    let url = c.prefixed(&rx.url("/e"));
    let first = post(&url, &[("webhook-id", "evt_1")], "a").await;
    assert_eq!(first.status, 202);
    assert_eq!(first.json()["event_id"], "evt_1");
    let dup = post(&url, &[("webhook-id", "evt_1")], "a").await;
    assert_eq!(dup.status, 202);
    assert_eq!(dup.json()["duplicate"], true);
    assert_eq!(dup.json()["id"], first.json()["id"]);
    let other_target = post(&c.prefixed(&rx.url("/other")), &[("webhook-id", "evt_1")], "a").await;
    assert!(
        other_target.json().get("duplicate").is_none(),
        "same event id to another target is a new message"
    );
    let k = post(&url, &[("idempotency-key", "key-7")], "b").await;
    assert_eq!(k.json()["event_id"], "key-7");

    // Nothing was stored for the duplicate: three messages, three accepts, one duplicate.
    let listed = get(&c.admin_url("/deliveries?limit=1000")).await.json();
    let items = listed["items"].as_array().unwrap();
    let mut stored: Vec<(String, String)> = items
        .iter()
        .map(|i| {
            (
                i["event_id"].as_str().unwrap().to_string(),
                i["target"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    stored.sort();
    assert_eq!(
        stored,
        [
            ("evt_1".to_string(), rx.url("/e")),
            ("evt_1".to_string(), rx.url("/other")),
            ("key-7".to_string(), rx.url("/e")),
        ],
        "{listed}"
    );
    let m = get(&c.admin_url("/metrics")).await.text();
    for line in ["courier_accepted_total 3", "courier_duplicates_total 1"] {
        assert!(m.lines().any(|l| l == line), "{line} in\n{m}");
    }
    // Every stored message delivered; then a wrongly stored copy would have arrived too
    // (first attempts go out within milliseconds): give it a moment more to show up.
    for i in items {
        wait_state(&c, i["id"].as_str().unwrap(), "delivered").await;
    }
    assert!(
        rx.wait_for_within(4, std::time::Duration::from_millis(500))
            .await
            .is_none(),
        "a fourth request arrived: {:?}",
        rx.seen().iter().map(|s| s.header("webhook-id")).collect::<Vec<_>>()
    );
    assert_eq!(
        rx.seen()
            .iter()
            .filter(|s| s.header("webhook-id").as_deref() == Some("evt_1"))
            .count(),
        2
    );
}

/// `Courier-Endpoint` is the key for pausing, the rate limit and the stats: messages to
/// different targets under one key are paused together, listed together and share one
/// rate, while a message to one of those targets without the header is not held.
#[tokio::test]
async fn courier_endpoint_keys_pause_rate_limit_and_stats() {
    let rx = Receiver::start().await;
    let d = dir();
    // Configured, so it can be paused before any traffic; 4 per second, burst 4. /t0 on its
    // own is ordered, so the free message below goes through a scheduler pass.
    let c = Courier::start(
        d.path(),
        &format!(
            "[retry]\nbase_delay = \"100ms\"\njitter = \"none\"\n[[endpoint]]\nkey = \"tenant-42\"\nrate_per_second = 4\n{}",
            crate::admin::queued(&rx.url("/t0"))
        ),
    );
    let p = post(&c.admin_url("/endpoints/tenant-42/pause"), &[], "").await;
    assert_eq!(p.status, 204, "{}", p.text());
    let mut held = Vec::new();
    for n in 0..8 {
        let a = post(
            &c.prefixed(&rx.url(&format!("/t{n}"))),
            &[("courier-endpoint", "tenant-42")],
            format!("held{n}"),
        )
        .await;
        assert_eq!(a.status, 202, "{}", a.text());
        held.push(a.json()["id"].as_str().unwrap().to_string());
    }
    // The same target as the first held message, without the header: its own endpoint,
    // dispatched by a scheduler pass that has walked (and parked) the held ones.
    crate::admin::send_through_a_pass(&c, &rx.url("/t0"), "free", "delivered").await;
    assert_eq!(rx.seen().len(), 1, "only the message outside tenant-42 was sent");
    for id in &held {
        let v = delivery(&c, id).await;
        assert_eq!(
            (&v["endpoint"], &v["state"]),
            (&"tenant-42".into(), &"pending".into()),
            "{v}"
        );
    }

    // Stats: the endpoint list and the listing filter count them under the key.
    let e = crate::admin::endpoint(&c, "tenant-42").await.expect("tenant-42 listed");
    assert_eq!((&e["state"], &e["pending"]), (&"paused".into(), &8.into()), "{e}");
    let t0 = crate::admin::endpoint(&c, &rx.url("/t0")).await.expect("/t0 listed");
    assert_eq!(t0["pending"], 0, "{t0}");
    let listed = get(&c.admin_url("/deliveries?endpoint=tenant-42&limit=100"))
        .await
        .json();
    let mut ids: Vec<String> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    let mut want = held.clone();
    want.sort();
    assert_eq!(ids, want);

    // Resumed: the eight go out at tenant-42's rate, as one endpoint (eight targets
    // keyed by URL would each have a bucket of their own and go out at once).
    let r = post(&c.admin_url("/endpoints/tenant-42/resume"), &[], "").await;
    assert_eq!(r.status, 204, "{}", r.text());
    let seen = rx.wait_for(9).await;
    // Eight attempts need the burst of 4 and 4 more tokens, 1 s: no sooner. The upper bound
    // only catches a gross slow-down (a rate of under 1/s); a scheduler late by a second on
    // a loaded machine is not one, as tokens keep coming while it is late.
    let span = seen[8].at - seen[1].at;
    assert!(
        span >= Duration::from_millis(900) && span < Duration::from_secs(5),
        "8 attempts of one 4/s endpoint (burst 4) took {span:?}, want ~1s"
    );
    for id in &held {
        wait_state(&c, id, "delivered").await;
    }
    let e = crate::admin::endpoint(&c, "tenant-42").await.unwrap();
    assert_eq!((&e["state"], &e["pending"]), (&"active".into(), &0.into()), "{e}");
}

/// A route's `signing_key` and `scheme` sign what is sent through it; a route without
/// them signs with the defaults. (The key is valid for every scheme, so a route whose
/// scheme were ignored would still send, visibly signed the wrong way.)
#[tokio::test]
async fn a_routes_signing_key_and_scheme_are_applied() {
    use hmac::{Hmac, Mac};
    let hmac = |key: &[u8], data: &[u8]| {
        let mut m = Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
        m.update(data);
        m.finalize().into_bytes().to_vec()
    };
    let rx = Receiver::start().await;
    let d = dir();
    let cfg = format!(
        "[signing]\nsecrets = [\"whsec_ZGVmYXVsdC1rZXk=\"]\n[signing.keys]\nbilling = [\"whsec_YmlsbGluZw==\"]\n\
         [[route]]\nname = \"gh\"\nurl = \"{}\"\nsigning_key = \"billing\"\nscheme = \"github\"\n\
         [[route]]\nname = \"st\"\nurl = \"{}\"\nsigning_key = \"billing\"\nscheme = \"stripe\"\n\
         [[route]]\nname = \"plain\"\nurl = \"{}\"\n",
        rx.url("/gh"),
        rx.url("/st"),
        rx.url("/plain")
    );
    let c = Courier::start(d.path(), &cfg);
    for route in ["gh", "st", "plain"] {
        let a = post(&format!("http://{}/r/{route}", c.ingress), &[], format!("{route}-body")).await;
        assert_eq!(a.status, 202, "{route}: {}", a.text());
    }
    let seen = rx.wait_for(3).await;
    let by = |p: &str| seen.iter().find(|s| s.path == p).unwrap().clone();

    let gh = by("/gh");
    assert_eq!(
        gh.header("x-hub-signature-256"),
        Some(format!(
            "sha256={}",
            hex::encode(hmac(b"whsec_YmlsbGluZw==", b"gh-body"))
        ))
    );
    assert!(gh.header("webhook-signature").is_none() && gh.header("stripe-signature").is_none());

    let st = by("/st");
    let header = st.header("stripe-signature").expect("stripe scheme from the route");
    let ts = header
        .split(',')
        .next()
        .unwrap()
        .strip_prefix("t=")
        .unwrap()
        .to_string();
    assert_eq!(
        header,
        format!(
            "t={ts},v1={}",
            hex::encode(hmac(b"whsec_YmlsbGluZw==", format!("{ts}.st-body").as_bytes()))
        )
    );

    let plain = by("/plain");
    let id = plain.header("webhook-id").unwrap();
    let ts = plain.header("webhook-timestamp").unwrap();
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    assert_eq!(
        plain.header("webhook-signature"),
        Some(format!(
            "v1,{}",
            b64.encode(hmac(b"default-key", format!("{id}.{ts}.plain-body").as_bytes()))
        ))
    );
}

#[tokio::test]
async fn every_error_status_has_the_json_shape() {
    let d = dir();
    let c = Courier::start(d.path(), "max_body = \"1KiB\"\n");
    let base = format!("http://{}", c.ingress);
    let cases: Vec<(Answer, u16, &str)> = vec![
        (post(&format!("{base}/"), &[], "x").await, 400, "missing_target"),
        (
            post(&format!("{base}/ftp://x.example/a"), &[], "x").await,
            400,
            "unsupported_scheme",
        ),
        (post(&format!("{base}/http://"), &[], "x").await, 400, "invalid_target"),
        (
            post(
                &format!("{base}/http://127.0.0.1:9/x"),
                &[("courier-max-attempts", "zero")],
                "x",
            )
            .await,
            400,
            "invalid_control_header",
        ),
        (
            post(
                &format!("{base}/http://127.0.0.1:9/x"),
                &[("courier-signature-scheme", "rot13")],
                "x",
            )
            .await,
            400,
            "invalid_control_header",
        ),
        (
            post(
                &format!("{base}/http://127.0.0.1:9/x"),
                &[("courier-signing-key", "nope")],
                "x",
            )
            .await,
            400,
            "unknown_signing_key",
        ),
        (
            post(&format!("{base}/http://127.0.0.1:9/x"), &[], vec![b'a'; 2048]).await,
            413,
            "body_too_large",
        ),
    ];
    for (a, status, code) in cases {
        assert_eq!(a.status, status, "{code}: {}", a.text());
        let j = a.json();
        assert_eq!(j["error"], code);
        assert!(j["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let connect = raw(
        c.ingress,
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    );
    // No [intercept]: every CONNECT is one to a host not listed.
    assert!(connect.starts_with("HTTP/1.1 403"), "{connect}");
    assert!(connect.contains("not_intercepted"));
}

#[tokio::test]
async fn ingress_token_is_required_when_set_and_authorization_is_not_it() {
    let rx = Receiver::start().await;
    let d = dir();
    let c = Courier::start(d.path(), "ingress_token = \"tok-123\"\n");
    let url = c.prefixed(&rx.url("/t"));
    let no = post(&url, &[], "x").await;
    assert_eq!(no.status, 401);
    assert_eq!(no.json()["error"], "unauthorized");
    assert_eq!(
        post(&url, &[("authorization", "Bearer tok-123")], "x").await.status,
        401,
        "Authorization belongs to the receiver"
    );
    assert_eq!(post(&url, &[("courier-token", "wrong")], "x").await.status, 401);
    assert_eq!(post(&url, &[("courier-token", "tok-123")], "x").await.status, 202);
    assert_eq!(
        post(&url, &[("proxy-authorization", "Bearer tok-123")], "y")
            .await
            .status,
        202
    );
    let seen = rx.wait_for(2).await;
    assert!(seen
        .iter()
        .all(|s| s.header("courier-token").is_none() && s.header("proxy-authorization").is_none()));
}

#[tokio::test]
async fn ip_literal_targets_refused_by_egress_get_403() {
    let d = dir();
    let c = Courier::start(d.path(), "[egress]\nallow_private_targets = false\n");
    for target in [
        "http://127.0.0.1:9/x",
        "http://169.254.169.254/latest",
        "http://[::1]/x",
        "http://10.0.0.1/x",
        "http://2130706433/x",
    ] {
        let a = post(&c.prefixed(target), &[], "x").await;
        assert_eq!(a.status, 403, "{target}: {}", a.text());
        assert_eq!(a.json()["error"], "egress_denied");
    }
}
