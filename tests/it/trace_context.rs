//! W3C trace context: the app's `traceparent` continues through courier, one child span
//! per attempt, recorded in the history and the log lines.

use crate::support::*;

const FAST: &str = "[retry]\nbase_delay = \"100ms\"\nmax_delay = \"100ms\"\njitter = \"none\"\n";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const APP_SPAN: &str = "00f067aa0ba902b7";

/// The trace id, span id and flags of a `traceparent` a receiver saw.
fn parts(seen: &Seen) -> (String, String, String) {
    let v = seen.header("traceparent").expect("a traceparent on every attempt");
    assert_eq!(seen.headers_named("traceparent").len(), 1, "exactly one traceparent");
    let p: Vec<&str> = v.split('-').collect();
    assert_eq!(p.len(), 4, "{v}");
    assert_eq!(p[0], "00", "{v}");
    (p[1].to_string(), p[2].to_string(), p[3].to_string())
}

#[tokio::test]
async fn every_attempt_is_a_child_span_of_the_apps_trace() {
    let rx = Receiver::scripted(|n, _| Reply::status(if n == 0 { 503 } else { 200 })).await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start_with(d.path(), FAST, &[], &[("COURIER_LOG", "info,courier=debug")]);
    let traceparent = format!("00-{TRACE_ID}-{APP_SPAN}-01");
    let a = post(
        &c.prefixed(&rx.url("/t")),
        &[("traceparent", &traceparent), ("tracestate", "vendor=opaque,x=1")],
        "x",
    )
    .await;
    assert_eq!(a.status, 202);
    let id = a.json()["id"].as_str().unwrap().to_string();
    let seen = rx.wait_for(2).await;
    let (t0, s0, f0) = parts(&seen[0]);
    let (t1, s1, f1) = parts(&seen[1]);
    assert_eq!((t0.as_str(), t1.as_str()), (TRACE_ID, TRACE_ID), "same trace");
    assert_eq!((f0.as_str(), f1.as_str()), ("01", "01"), "flags kept");
    assert_ne!(s0, s1, "a new span per attempt");
    for s in [&s0, &s1] {
        assert_ne!(s, APP_SPAN, "the attempt is a child, not the app's span");
        assert!(s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()) && s != "0000000000000000");
    }
    for s in &seen {
        assert_eq!(s.header("tracestate").as_deref(), Some("vendor=opaque,x=1"));
    }

    let v = wait_state(&c, &id, "delivered").await;
    assert_eq!(v["trace_id"], TRACE_ID);
    let history = v["history"].as_array().unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(history[0]["span_id"], s0.as_str());
    assert_eq!(history[1]["span_id"], s1.as_str());

    // So does the CLI.
    let out = std::process::Command::new(bin())
        .args(["deliveries", "show", &id, "--admin-listen", &c.admin.to_string()])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains(&format!("trace_id        {TRACE_ID}")), "{shown}");
    assert!(
        shown.contains("SPAN") && shown.contains(&s0) && shown.contains(&s1),
        "{shown}"
    );

    // The text log lines name the trace and each attempt's span.
    let retry = c.log.wait_for("retry scheduled", WAIT).expect("a retry line");
    assert!(retry.contains(TRACE_ID) && retry.contains(&s0), "{retry}");
    let delivered = c.log.wait_for("delivered", WAIT).expect("a delivery line");
    assert!(delivered.contains(TRACE_ID) && delivered.contains(&s1), "{delivered}");
}

#[tokio::test]
async fn an_invalid_traceparent_is_dropped_not_refused() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), FAST);
    let a = post(
        &c.prefixed(&rx.url("/t")),
        &[
            ("traceparent", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            ("tracestate", "vendor=opaque"),
        ],
        "x",
    )
    .await;
    assert_eq!(a.status, 202);
    let id = a.json()["id"].as_str().unwrap().to_string();
    let seen = rx.wait_for(1).await;
    assert_eq!(seen[0].header("traceparent"), None);
    assert_eq!(
        seen[0].header("tracestate"),
        None,
        "no tracestate without a valid parent"
    );
    let v = wait_state(&c, &id, "delivered").await;
    assert!(v["trace_id"].is_null(), "{v}");
    assert!(v["history"][0]["span_id"].is_null(), "{v}");
}
