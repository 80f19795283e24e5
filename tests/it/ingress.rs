//! Ingress: the four target forms, control headers, event ids, dedupe, every error status.

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
    rx.wait_for(3).await;
    assert_eq!(
        rx.seen()
            .iter()
            .filter(|s| s.header("webhook-id").as_deref() == Some("evt_1"))
            .count(),
        2
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
    assert!(connect.starts_with("HTTP/1.1 405"), "{connect}");
    assert!(connect.contains("method_not_allowed"));
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
