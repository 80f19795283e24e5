//! The admin API (CONTRACT §5), black-box against the real binary: every route's happy path
//! and its errors, paging, replay (single and bulk), delete, manual pause and resume,
//! auto-pause with its alert, pause across a restart, and admin-token enforcement.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::Value;

use crate::support::*;

const FAST: &str = "[retry]\nbase_delay = \"100ms\"\nmax_delay = \"400ms\"\njitter = \"none\"\n";

/// Sends `body` to `target` through courier; returns the delivery id.
pub async fn send(c: &Courier, target: &str, body: &str) -> String {
    let a = post(&c.prefixed(target), &[], body.to_string()).await;
    assert_eq!(a.status, 202, "{}", a.text());
    a.json()["id"].as_str().unwrap().to_string()
}

/// `GET /endpoints` items, by key.
pub async fn endpoint(c: &Courier, key: &str) -> Option<Value> {
    let a = get(&c.admin_url("/endpoints")).await;
    assert_eq!(a.status, 200, "{}", a.text());
    a.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["key"] == key)
        .cloned()
}

/// Percent-encodes an endpoint key for a path segment.
pub fn enc(key: &str) -> String {
    percent_encoding::utf8_percent_encode(key, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Config making `url` an ordered endpoint, so that a message to it never starts at accept
/// (the fast path a first attempt takes when nothing stands in its way) and is only ever
/// dispatched by a scheduler pass: a canary for [`send_through_a_pass`].
pub fn queued(url: &str) -> String {
    format!("[[endpoint]]\nkey = \"{url}\"\nordering = \"fifo\"\n")
}

/// `courier_scheduler_passes_total`.
pub async fn scheduler_passes(c: &Courier) -> f64 {
    let text = get(&c.admin_url("/metrics")).await.text();
    crate::metrics::parse(&text)
        .unwrap()
        .value("courier_scheduler_passes_total", &[])
        .expect("courier_scheduler_passes_total is exported")
}

/// Sends a canary to `url` (made an ordered endpoint by [`queued`]) and waits for it to
/// reach `state`; returns its id. Only a scheduler pass dispatches it, and that pass walked
/// every due entry from the floor up to its own (its due time, its accept time, is no
/// earlier than theirs): once it is dispatched, every message accepted before it has been
/// looked at by a pass, and one of a paused endpoint parked, not sent. (A canary taking
/// the fast path proves nothing: it starts at accept, before any pass has run.)
pub async fn send_through_a_pass(c: &Courier, url: &str, body: &str, state: &str) -> String {
    let passes = scheduler_passes(c).await;
    let id = send(c, url, body).await;
    assert_eq!(delivery(c, &id).await["ordering"], "fifo", "the canary is ordered");
    wait_state(c, &id, state).await;
    let after = scheduler_passes(c).await;
    assert!(
        after > passes,
        "the canary went through a scheduler pass ({passes} -> {after})"
    );
    id
}

fn assert_error(a: &Answer, status: u16, code: &str) {
    assert_eq!(a.status, status, "{}", a.text());
    assert_eq!(
        a.headers.get("content-type").map(String::as_str),
        Some("application/json"),
        "{:?}",
        a.headers
    );
    let v = a.json();
    assert_eq!(v["error"], code, "{v}");
    assert!(
        v["message"].as_str().is_some_and(|m| !m.is_empty()),
        "a human sentence: {v}"
    );
    assert_eq!(v.as_object().unwrap().len(), 2, "only error and message: {v}");
}

fn is_rfc3339(v: &Value) -> bool {
    v.as_str().and_then(courier::timefmt::parse_rfc3339).is_some()
}

#[tokio::test]
async fn a_delivery_shows_every_field_and_one_history_entry_per_attempt() {
    let rx = Receiver::scripted(|n, _| Reply::status(if n < 2 { 503 } else { 200 })).await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), FAST);
    let a = post(
        &c.prefixed(&rx.url("/hist?q=1")),
        &[("webhook-id", "evt_hist_1")],
        "payload",
    )
    .await;
    let id = a.json()["id"].as_str().unwrap().to_string();
    let v = wait_state(&c, &id, "delivered").await;
    for key in [
        "id",
        "event_id",
        "target",
        "endpoint",
        "state",
        "attempts",
        "next_attempt_at",
        "give_up_at",
        "dead_reason",
        "last_status",
        "last_error",
        "history",
    ] {
        assert!(v.get(key).is_some(), "{key} missing in {v}");
    }
    assert_eq!(v["id"], id.as_str());
    assert_eq!(v["event_id"], "evt_hist_1");
    assert_eq!(v["target"], rx.url("/hist?q=1"));
    assert_eq!(
        v["endpoint"],
        rx.url("/hist"),
        "default key: the target without its query"
    );
    assert_eq!(v["attempts"], 3);
    assert_eq!(v["next_attempt_at"], Value::Null, "nothing is next once delivered");
    assert!(is_rfc3339(&v["give_up_at"]), "{v}");
    assert_eq!(v["dead_reason"], Value::Null);
    assert_eq!(v["last_status"], 200);
    let history = v["history"].as_array().unwrap();
    assert_eq!(history.len(), 3, "{v}");
    let statuses: Vec<&Value> = history.iter().map(|h| &h["status"]).collect();
    assert_eq!(statuses, [&Value::from(503), &Value::from(503), &Value::from(200)]);
    let mut last_at = 0;
    for h in history {
        let at = h["at"]
            .as_str()
            .and_then(courier::timefmt::parse_rfc3339)
            .expect("at is RFC 3339");
        assert!(at >= last_at, "history is in attempt order: {v}");
        last_at = at;
        assert!(h["duration_ms"].is_u64(), "{h}");
        assert!(h.get("error").is_some(), "{h}");
    }
    assert!(history[0]["error"].as_str().unwrap().contains("503"), "{v}");
    assert_eq!(history[2]["error"], Value::Null);

    // A pending message shows when it is next due.
    rx.set_script(|_, _| Reply::status(503));
    let id2 = send(&c, &rx.url("/later"), "x").await;
    let p = eventually("a failed attempt", || async {
        let v = delivery(&c, &id2).await;
        (v["attempts"] == 1 && v["state"] == "pending").then_some(v)
    })
    .await;
    assert!(is_rfc3339(&p["next_attempt_at"]), "{p}");
    assert_eq!(p["last_status"], 503);
    assert!(p["last_error"].as_str().unwrap().contains("503"), "{p}");
}

#[tokio::test]
async fn unknown_ids_and_endpoints_answer_404_and_bad_queries_400() {
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), FAST);
    let nope = "dlv_01JZZZZZZZZZZZZZZZZZZZZZZZ";
    assert_error(
        &get(&c.admin_url(&format!("/deliveries/{nope}"))).await,
        404,
        "not_found",
    );
    assert_error(
        &request("DELETE", &c.admin_url(&format!("/deliveries/{nope}")), &[], "").await,
        404,
        "not_found",
    );
    assert_error(
        &post(&c.admin_url(&format!("/deliveries/{nope}/retry")), &[], "").await,
        404,
        "not_found",
    );
    let unknown = enc("http://127.0.0.1:9/never-seen");
    for action in ["pause", "resume"] {
        assert_error(
            &post(&c.admin_url(&format!("/endpoints/{unknown}/{action}")), &[], "").await,
            404,
            "not_found",
        );
    }
    for q in [
        "state=bogus",
        "state=DEAD",
        "limit=0",
        "limit=1001",
        "limit=ten",
        "limit=-1",
        "since=yesterday",
        "until=2026-13-01T00:00:00Z",
    ] {
        assert_error(
            &get(&c.admin_url(&format!("/deliveries?{q}"))).await,
            400,
            "invalid_request",
        );
    }
    for q in [
        "state=dead&since=yesterday",
        "state=pending",
        "state=bogus",
        "until=noon",
    ] {
        assert_error(
            &post(&c.admin_url(&format!("/deliveries/retry?{q}")), &[], "").await,
            400,
            "invalid_request",
        );
    }
    // Valid filters on an empty store: an empty page, no cursor.
    let v = get(&c.admin_url("/deliveries?state=dead&since=2020-01-01T00:00:00Z&limit=1000"))
        .await
        .json();
    assert_eq!(v["items"], serde_json::json!([]));
    assert_eq!(v["next_cursor"], Value::Null);
    // An unknown route is a 404 in the same shape; a wrong method a 405.
    assert_error(&get(&c.admin_url("/nope")).await, 404, "not_found");
    assert_error(
        &request("PUT", &c.admin_url("/deliveries"), &[], "").await,
        405,
        "method_not_allowed",
    );
}

#[tokio::test]
async fn dead_letters_page_through_with_every_id_exactly_once() {
    let rx = Receiver::scripted(|_, _| Reply::status(410)).await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), FAST);
    let mut sent = Vec::new();
    for i in 0..25 {
        sent.push(send(&c, &rx.url("/gone"), &format!("m{i}")).await);
    }
    // Another endpoint's dead letter, which the endpoint filter must leave out.
    let other = send(&c, &rx.url("/other"), "o").await;
    wait_state(&c, &other, "dead").await;
    eventually("25 dead letters", || async {
        let v = get(&c.admin_url("/deliveries?state=dead&limit=1000")).await.json();
        let n = v["items"].as_array().unwrap().len();
        (n == 26).then_some(())
    })
    .await;

    let endpoint = enc(&rx.url("/gone"));
    let (items, pages) = page_through(&c, &format!("/deliveries?state=dead&endpoint={endpoint}&limit=10"), 10).await;
    let mut seen = Vec::new();
    for it in items {
        assert_eq!(it["state"], "dead");
        assert_eq!(it["endpoint"], rx.url("/gone"));
        assert_eq!(it["dead_reason"], "permanent_status");
        assert!(it.get("history").is_none(), "a listing carries no history");
        seen.push(it["id"].as_str().unwrap().to_string());
    }
    assert_eq!(pages, 3, "25 items in pages of 10");
    assert_eq!(seen, sent, "every id once, in acceptance order");

    // Without a state filter, every message shows up too.
    let all = get(&c.admin_url("/deliveries?limit=1000")).await.json();
    assert_eq!(all["items"].as_array().unwrap().len(), 26);
}

#[tokio::test]
async fn a_dead_message_is_replayed_and_delivered_with_the_same_event_id() {
    let fixed = Arc::new(AtomicBool::new(false));
    let f = fixed.clone();
    let rx = Receiver::scripted(move |_, _| Reply::status(if f.load(Ordering::SeqCst) { 200 } else { 410 })).await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), FAST);
    let id = send(&c, &rx.url("/replay"), "the body").await;
    let dead = wait_state(&c, &id, "dead").await;
    assert_eq!(dead["dead_reason"], "permanent_status");
    assert_eq!(dead["last_status"], 410);

    // Only dead messages can be replayed: a delivered one is a conflict.
    fixed.store(true, Ordering::SeqCst);
    let ok = send(&c, &rx.url("/fine"), "fine").await;
    wait_state(&c, &ok, "delivered").await;
    assert_error(
        &post(&c.admin_url(&format!("/deliveries/{ok}/retry")), &[], "").await,
        409,
        "not_dead",
    );

    let a = post(&c.admin_url(&format!("/deliveries/{id}/retry")), &[], "").await;
    assert_eq!(a.status, 202, "{}", a.text());
    assert_eq!(a.json()["id"], id.as_str());
    let v = wait_state(&c, &id, "delivered").await;
    assert_eq!(v["event_id"], dead["event_id"]);
    assert_eq!(v["attempts"], 1, "attempts were reset");
    assert_eq!(v["dead_reason"], Value::Null);
    let give_up_before = courier::timefmt::parse_rfc3339(dead["give_up_at"].as_str().unwrap()).unwrap();
    let give_up_after = courier::timefmt::parse_rfc3339(v["give_up_at"].as_str().unwrap()).unwrap();
    assert!(give_up_after > give_up_before, "a new give-up window");
    let at_receiver: Vec<Seen> = rx.seen().into_iter().filter(|s| s.path == "/replay").collect();
    assert_eq!(at_receiver.len(), 2);
    assert_eq!(at_receiver[0].header("webhook-id"), at_receiver[1].header("webhook-id"));
    assert_eq!(
        at_receiver[1].header("webhook-id").as_deref(),
        dead["event_id"].as_str()
    );
    assert_eq!(at_receiver[1].body, b"the body");
}

#[tokio::test]
async fn bulk_replay_requeues_only_the_chosen_endpoints_dead_letters() {
    let fixed = Arc::new(AtomicBool::new(false));
    let f = fixed.clone();
    let rx = Receiver::scripted(move |_, _| Reply::status(if f.load(Ordering::SeqCst) { 200 } else { 410 })).await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), FAST);
    let mut a_ids = Vec::new();
    for i in 0..3 {
        a_ids.push(send(&c, &rx.url("/a"), &format!("a{i}")).await);
    }
    let b_ids = [send(&c, &rx.url("/b"), "b0").await, send(&c, &rx.url("/b"), "b1").await];
    for id in a_ids.iter().chain(&b_ids) {
        wait_state(&c, id, "dead").await;
    }
    fixed.store(true, Ordering::SeqCst);

    // A window that ends before they died matches nothing.
    let none = post(
        &c.admin_url(&format!(
            "/deliveries/retry?state=dead&endpoint={}&until=2020-01-01T00:00:00Z",
            enc(&rx.url("/a"))
        )),
        &[],
        "",
    )
    .await;
    assert_eq!(none.status, 200, "{}", none.text());
    assert_eq!(none.json(), serde_json::json!({ "requeued": 0 }));

    let a = post(
        &c.admin_url(&format!(
            "/deliveries/retry?state=dead&endpoint={}&since=2020-01-01T00:00:00Z",
            enc(&rx.url("/a"))
        )),
        &[],
        "",
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json(), serde_json::json!({ "requeued": 3 }));
    for id in &a_ids {
        wait_state(&c, id, "delivered").await;
    }
    for id in &b_ids {
        assert_eq!(delivery(&c, id).await["state"], "dead", "other endpoints stay dead");
    }
    // Replaying again finds nothing left for /a.
    let again = post(
        &c.admin_url(&format!("/deliveries/retry?state=dead&endpoint={}", enc(&rx.url("/a")))),
        &[],
        "",
    )
    .await;
    assert_eq!(again.json()["requeued"], 0);
}

#[tokio::test]
async fn delete_removes_a_delivery() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), FAST);
    let id = send(&c, &rx.url("/del"), "x").await;
    let keep = send(&c, &rx.url("/del"), "y").await;
    wait_state(&c, &id, "delivered").await;
    wait_state(&c, &keep, "delivered").await;
    let a = request("DELETE", &c.admin_url(&format!("/deliveries/{id}")), &[], "").await;
    assert_eq!(a.status, 204, "{}", a.text());
    assert!(a.body.is_empty());
    assert_error(&get(&c.admin_url(&format!("/deliveries/{id}"))).await, 404, "not_found");
    let all = get(&c.admin_url("/deliveries")).await.json();
    let ids: Vec<&str> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [keep.as_str()]);
    assert_error(
        &request("DELETE", &c.admin_url(&format!("/deliveries/{id}")), &[], "").await,
        404,
        "not_found",
    );
}

#[tokio::test]
async fn a_paused_endpoint_holds_its_messages_until_resumed() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), &format!("{FAST}{}", queued(&rx.url("/free"))));
    let held_url = rx.url("/held");
    // Courier learns the endpoint from a first delivery; then the operator pauses it.
    let first = send(&c, &held_url, "first").await;
    wait_state(&c, &first, "delivered").await;
    let p = post(&c.admin_url(&format!("/endpoints/{}/pause", enc(&held_url))), &[], "").await;
    assert_eq!(p.status, 204, "{}", p.text());
    assert!(p.body.is_empty());
    assert_eq!(endpoint(&c, &held_url).await.unwrap()["state"], "paused");

    let mut held = Vec::new();
    for i in 0..3 {
        held.push(send(&c, &held_url, &format!("held{i}")).await);
    }
    // Sent after the held ones, to the same receiver, through the scheduler: once it is
    // delivered, a pass has walked the held ones (and parked them) instead of sending them.
    send_through_a_pass(&c, &rx.url("/free"), "free", "delivered").await;
    rx.wait_for(2).await;
    let paths: Vec<String> = rx.seen().iter().map(|s| s.path.clone()).collect();
    assert_eq!(paths, ["/held", "/free"], "nothing of a paused endpoint is sent");
    for id in &held {
        let v = delivery(&c, id).await;
        assert_eq!(v["state"], "pending", "{v}");
        assert_eq!(v["attempts"], 0, "{v}");
    }
    let e = endpoint(&c, &held_url).await.unwrap();
    assert_eq!(e["state"], "paused");
    assert_eq!(e["pending"], 3, "{e}");
    assert_eq!(e["in_flight"], 0, "{e}");
    let m = get(&c.admin_url("/metrics")).await.text();
    assert!(m.contains("\ncourier_endpoints_paused 1\n"), "{m}");

    let r = post(&c.admin_url(&format!("/endpoints/{}/resume", enc(&held_url))), &[], "").await;
    assert_eq!(r.status, 204, "{}", r.text());
    let seen = rx.wait_for(5).await;
    let mut bodies: Vec<String> = seen[2..]
        .iter()
        .map(|s| String::from_utf8_lossy(&s.body).into_owned())
        .collect();
    bodies.sort();
    assert_eq!(bodies, ["held0", "held1", "held2"]);
    for id in &held {
        wait_state(&c, id, "delivered").await;
    }
    // Nothing is open for it any more, yet it stays listed (seen within the retention
    // window), so the operator who resumed it sees it active with its counts.
    let e = endpoint(&c, &held_url)
        .await
        .expect("a resumed endpoint with nothing open is still listed");
    assert_eq!(e["state"], "active", "{e}");
    assert_eq!(e["pending"], 0, "{e}");
    assert_eq!(e["in_flight"], 0, "{e}");
    assert_eq!(e["permanent_failure_streak"], 0, "{e}");
}

#[tokio::test]
async fn an_endpoint_paused_and_resumed_with_nothing_open_stays_listed() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), FAST);
    let url = rx.url("/quiet");
    let first = send(&c, &url, "first").await;
    wait_state(&c, &first, "delivered").await;
    for (action, state) in [
        ("pause", "paused"),
        ("resume", "active"),
        ("pause", "paused"),
        ("resume", "active"),
    ] {
        let r = post(&c.admin_url(&format!("/endpoints/{}/{action}", enc(&url))), &[], "").await;
        assert_eq!(r.status, 204, "{action}: {}", r.text());
        let e = endpoint(&c, &url)
            .await
            .unwrap_or_else(|| panic!("listed after {action}"));
        assert_eq!(e["state"], state, "after {action}: {e}");
        assert_eq!(e["pending"], 0, "{e}");
    }
}

#[tokio::test]
async fn permanent_failures_auto_pause_the_endpoint_and_alert() {
    let alerts = Receiver::start().await;
    let rx = Receiver::scripted(|_, _| Reply::status(410)).await;
    let d = tempfile::tempdir().unwrap();
    let cfg = format!(
        "alert_url = \"{}\"\n{FAST}[delivery]\npause_after_permanent_failures = 3\n{}",
        alerts.url("/alerts"),
        queued(&rx.url("/other"))
    );
    let c = Courier::start(d.path(), &cfg);
    let gone = rx.url("/gone");
    let mut ids = Vec::new();
    for i in 0..3 {
        let id = send(&c, &gone, &format!("g{i}")).await;
        wait_state(&c, &id, "dead").await;
        ids.push(id);
    }
    let alert = alerts.wait_for(1).await;
    let body: Value = serde_json::from_slice(&alert[0].body).unwrap();
    assert_eq!(alert[0].method, "POST");
    assert_eq!(alert[0].path, "/alerts");
    assert_eq!(alert[0].header("content-type").as_deref(), Some("application/json"));
    assert!(
        alert[0].header("webhook-id").is_some(),
        "the alert goes through courier's pipeline"
    );
    assert_eq!(body["type"], "endpoint.paused", "{body}");
    assert_eq!(body["endpoint"], gone.as_str(), "{body}");
    assert_eq!(body["streak"], 3, "{body}");
    assert_eq!(body["last_status"], 410, "{body}");
    let at = body["at"]
        .as_str()
        .and_then(courier::timefmt::parse_rfc3339)
        .expect("at is RFC 3339");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(now.abs_diff(at) < 60_000, "at is now: {body}");
    assert_eq!(body.as_object().unwrap().len(), 5, "{body}");
    assert!(
        c.log
            .wait_for("endpoint paused", WAIT)
            .is_some_and(|l| l.contains("WARN")),
        "a warn line: {}",
        c.log.all()
    );

    let e = endpoint(&c, &gone).await.unwrap();
    assert_eq!(e["state"], "paused", "{e}");
    assert_eq!(e["permanent_failure_streak"], 3, "{e}");

    // The next message is held: the fourth request never reaches the receiver, even
    // after a message to another endpoint sent later has gone through a scheduler pass.
    let held = send(&c, &gone, "held").await;
    send_through_a_pass(&c, &rx.url("/other"), "other", "dead").await;
    assert_eq!(rx.seen().iter().filter(|s| s.path == "/gone").count(), 3);
    assert_eq!(delivery(&c, &held).await["state"], "pending");
    assert_eq!(alerts.seen().len(), 1, "one alert per pause");

    // Resume with the receiver healed: the resume clears the streak, the held message is
    // delivered, and the endpoint stays listed as active.
    rx.set_script(|_, _| Reply::status(200));
    let r = post(&c.admin_url(&format!("/endpoints/{}/resume", enc(&gone))), &[], "").await;
    assert_eq!(r.status, 204);
    wait_state(&c, &held, "delivered").await;
    let e = endpoint(&c, &gone).await.expect("a resumed endpoint stays listed");
    assert_eq!(e["state"], "active", "{e}");
    assert_eq!(e["permanent_failure_streak"], 0, "{e}");
}

#[tokio::test]
async fn a_pause_survives_a_restart() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let mut c = Courier::start(d.path(), &format!("{FAST}{}", queued(&rx.url("/free"))));
    let url = rx.url("/p");
    let first = send(&c, &url, "first").await;
    wait_state(&c, &first, "delivered").await;
    assert_eq!(
        post(&c.admin_url(&format!("/endpoints/{}/pause", enc(&url))), &[], "")
            .await
            .status,
        204
    );
    let held = send(&c, &url, "held").await;
    c.restart();
    let e = endpoint(&c, &url)
        .await
        .expect("a paused endpoint is listed after a restart");
    assert_eq!(e["state"], "paused", "{e}");
    assert_eq!(e["pending"], 1, "{e}");
    let after = send(&c, &url, "after").await;
    send_through_a_pass(&c, &rx.url("/free"), "free", "delivered").await;
    assert_eq!(rx.seen().iter().filter(|s| s.path == "/p").count(), 1);
    assert_eq!(delivery(&c, &held).await["state"], "pending");
    assert_eq!(delivery(&c, &after).await["state"], "pending");

    assert_eq!(
        post(&c.admin_url(&format!("/endpoints/{}/resume", enc(&url))), &[], "")
            .await
            .status,
        204
    );
    wait_state(&c, &held, "delivered").await;
    wait_state(&c, &after, "delivered").await;
}

#[tokio::test]
async fn endpoints_list_their_state_streak_and_counts() {
    let rx = Receiver::scripted(|_, s| Reply::status(if s.path == "/bad" { 410 } else { 503 })).await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(
        d.path(),
        "[retry]\nbase_delay = \"1h\"\n[[endpoint]]\nkey = \"configured-key\"\nrate_per_second = 5\n",
    );
    let bad = rx.url("/bad");
    let slow = rx.url("/slow");
    let b = send(&c, &bad, "b").await;
    wait_state(&c, &b, "dead").await;
    let s1 = send(&c, &slow, "s1").await;
    let s2 = send(&c, &slow, "s2").await;
    for id in [&s1, &s2] {
        eventually("a failed attempt", || async {
            (delivery(&c, id).await["attempts"] == 1).then_some(())
        })
        .await;
    }
    let v = get(&c.admin_url("/endpoints")).await.json();
    let items = v["items"].as_array().unwrap();
    for e in items {
        let mut keys: Vec<&String> = e.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(
            keys,
            ["in_flight", "key", "pending", "permanent_failure_streak", "state"],
            "{e}"
        );
    }
    let by_key = |k: &str| {
        items
            .iter()
            .find(|e| e["key"] == k)
            .cloned()
            .unwrap_or_else(|| panic!("{k} in {v}"))
    };
    let e = by_key(&bad);
    assert_eq!(
        (&e["state"], &e["permanent_failure_streak"], &e["pending"]),
        (&"active".into(), &1.into(), &0.into())
    );
    let e = by_key(&slow);
    assert_eq!(
        (
            &e["state"],
            &e["permanent_failure_streak"],
            &e["pending"],
            &e["in_flight"]
        ),
        (&"active".into(), &0.into(), &2.into(), &0.into())
    );
    let e = by_key("configured-key");
    assert_eq!((&e["state"], &e["pending"]), (&"active".into(), &0.into()));
    // A configured endpoint can be paused before any traffic.
    assert_eq!(
        post(&c.admin_url("/endpoints/configured-key/pause"), &[], "")
            .await
            .status,
        204
    );
    assert_eq!(endpoint(&c, "configured-key").await.unwrap()["state"], "paused");
}

#[tokio::test]
async fn the_admin_token_guards_every_route_but_healthz() {
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), "admin_token = \"adm-s3cret\"\n");
    let routes = [
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/deliveries"),
        ("GET", "/deliveries/dlv_x"),
        ("POST", "/deliveries/dlv_x/retry"),
        ("DELETE", "/deliveries/dlv_x"),
        ("POST", "/deliveries/retry?state=dead"),
        ("GET", "/endpoints"),
        ("POST", "/endpoints/k/pause"),
        ("POST", "/endpoints/k/resume"),
    ];
    for (method, path) in routes {
        for headers in [
            vec![],
            vec![("authorization", "Bearer wrong")],
            vec![("authorization", "Bearer adm-s3cre")],
            vec![("authorization", "adm-s3cret")],
            vec![("authorization", "Basic YWRtOmFkbS1zM2NyZXQ=")],
        ] {
            let a = request(method, &c.admin_url(path), &headers, "").await;
            assert_error(&a, 401, "unauthorized");
            assert!(!a.text().contains("adm-s3cret"), "the token is never echoed");
        }
        let a = request(
            method,
            &c.admin_url(path),
            &[("authorization", "Bearer adm-s3cret")],
            "",
        )
        .await;
        assert_ne!(a.status, 401, "{method} {path} with the token: {}", a.text());
    }
    assert_eq!(get(&c.admin_url("/healthz")).await.status, 200);
    assert_eq!(
        request(
            "GET",
            &c.admin_url("/readyz"),
            &[("authorization", "Bearer adm-s3cret")],
            ""
        )
        .await
        .status,
        200
    );
}

#[tokio::test]
async fn listing_filters_by_state_and_endpoint() {
    let rx = Receiver::scripted(|_, s| Reply::status(if s.path == "/x" { 410 } else { 200 })).await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), FAST);
    let ok = send(&c, &rx.url("/y"), "1").await;
    let dead = send(&c, &rx.url("/x"), "2").await;
    wait_state(&c, &ok, "delivered").await;
    wait_state(&c, &dead, "dead").await;
    let ids = |v: Value| -> HashSet<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        ids(get(&c.admin_url("/deliveries?state=delivered")).await.json()),
        HashSet::from([ok.clone()])
    );
    assert_eq!(
        ids(get(&c.admin_url("/deliveries?state=dead")).await.json()),
        HashSet::from([dead.clone()])
    );
    assert_eq!(
        ids(
            get(&c.admin_url(&format!("/deliveries?endpoint={}", enc(&rx.url("/x")))))
                .await
                .json()
        ),
        HashSet::from([dead.clone()])
    );
    assert!(ids(get(&c.admin_url("/deliveries?state=pending")).await.json()).is_empty());
}

#[tokio::test]
async fn endpoints_page_in_key_order_and_filter_by_state_and_prefix() {
    // Every attempt fails and waits an hour: each endpoint keeps one open message.
    let rx = Receiver::scripted(|_, _| Reply::status(503)).await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), "[retry]\nbase_delay = \"1h\"\n");
    let mut keys = Vec::new();
    for i in 0..25 {
        let url = rx.url(&format!("/e{i:02}"));
        send(&c, &url, "x").await;
        keys.push(url);
    }
    for key in &keys[..3] {
        let p = post(&c.admin_url(&format!("/endpoints/{}/pause", enc(key))), &[], "").await;
        assert_eq!(p.status, 204, "{}", p.text());
    }

    let (items, pages) = page_through(&c, "/endpoints?limit=10", 10).await;
    let mut seen = Vec::new();
    for e in items {
        assert_eq!(e["pending"], 1, "{e}");
        seen.push(e["key"].as_str().unwrap().to_string());
    }
    assert_eq!(seen, keys, "every endpoint once, in key order");
    assert_eq!(pages, 3, "25 endpoints in pages of 10");

    let keys_of = |v: Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["key"].as_str().unwrap().to_string())
            .collect()
    };
    let paused = get(&c.admin_url("/endpoints?state=paused")).await.json();
    assert!(paused["items"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["state"] == "paused"));
    assert_eq!(keys_of(paused), keys[..3].to_vec());
    let prefix = enc(&rx.url("/e1"));
    let tens = get(&c.admin_url(&format!("/endpoints?state=active&prefix={prefix}")))
        .await
        .json();
    assert_eq!(keys_of(tens), keys[10..20].to_vec(), "a key prefix");
    let active = get(&c.admin_url("/endpoints?state=active&limit=1000")).await.json();
    assert_eq!(keys_of(active), keys[3..].to_vec());

    for bad in ["/endpoints?limit=0", "/endpoints?limit=1001", "/endpoints?state=gone"] {
        let a = get(&c.admin_url(bad)).await;
        assert_eq!(a.status, 400, "{bad}");
        assert_eq!(a.json()["error"], "invalid_request", "{bad}");
    }
}

/// Every item of a paged listing (`path` already carries its query and `limit`), following
/// `next_cursor`; with the number of pages read.
async fn page_through(c: &Courier, path: &str, limit: usize) -> (Vec<Value>, usize) {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut url = path.to_string();
        if let Some(cur) = &cursor {
            url.push_str(&format!("&cursor={}", enc(cur)));
        }
        let v = get(&c.admin_url(&url)).await.json();
        let items = v["items"].as_array().unwrap();
        assert!(items.len() <= limit, "a page holds at most limit items");
        all.extend(items.iter().cloned());
        pages += 1;
        match v["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return (all, pages),
        }
        assert!(pages < 10, "paging does not end");
    }
}
