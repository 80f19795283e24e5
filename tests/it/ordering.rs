//! Ordered endpoints (`ordering = "fifo"`) against the real binary: acceptance order at the
//! receiver behind a failing head, never two attempts at once, unordered traffic on the
//! same host not held up, `on_dead = "block"` and `"skip"`, replay, delete, a fifo route,
//! and kill -9 in the middle of a line.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

const FAST: &str = "[retry]\nbase_delay = \"100ms\"\nmax_delay = \"400ms\"\njitter = \"none\"\n";

fn body(s: &Seen) -> String {
    String::from_utf8_lossy(&s.body).into_owned()
}

/// The bodies the receiver saw on `path`, in arrival order (retries included).
fn bodies_on(rx: &Receiver, path: &str) -> Vec<String> {
    rx.seen().iter().filter(|s| s.path == path).map(body).collect()
}

/// Posts `bodies` to `target` one after another, each after the previous 202 (so their
/// acceptance order is the list's); returns the delivery ids.
async fn send_in_order(c: &Courier, target: &str, bodies: &[String]) -> Vec<String> {
    let mut ids = Vec::new();
    for b in bodies {
        let a = post(&c.prefixed(target), &[], b.clone()).await;
        assert_eq!(a.status, 202, "{}", a.text());
        ids.push(a.json()["id"].as_str().unwrap().to_string());
    }
    ids
}

/// Checks that the sequence of (body index) seen is in order: retries repeat the current
/// one, nothing comes back to an earlier one, and every index arrives.
fn assert_in_order(path: &str, seen: &[String], prefix: &str, n: usize) {
    let idx: Vec<usize> = seen
        .iter()
        .map(|b| {
            b.strip_prefix(prefix)
                .and_then(|i| i.parse().ok())
                .unwrap_or_else(|| panic!("{b}"))
        })
        .collect();
    assert!(idx.windows(2).all(|w| w[0] <= w[1]), "{path}: out of order: {idx:?}");
    let mut distinct = idx.clone();
    distinct.dedup();
    assert_eq!(distinct, (0..n).collect::<Vec<_>>(), "{path}: {idx:?}");
}

async fn endpoint(c: &Courier, key: &str) -> Value {
    crate::admin::endpoint(c, key)
        .await
        .unwrap_or_else(|| panic!("{key} not listed"))
}

#[tokio::test]
async fn many_ordered_endpoints_on_one_host_deliver_in_order_behind_a_failing_head_and_unordered_traffic_is_not_slowed()
{
    // /o0's first message fails three times (503, Retry-After 1 s); every ordered answer takes
    // 15 ms, so overlapping attempts would show; everything else answers at once.
    let rx = Receiver::start().await;
    let failures = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = failures.clone();
    rx.set_script(move |_, s| {
        if body(s) == "o0-0" && count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 3 {
            return Reply::status(503).header("retry-after", "1");
        }
        if s.path.starts_with("/o") {
            return Reply::status(200).after(Duration::from_millis(15));
        }
        Reply::status(200)
    });
    let endpoints = 8;
    let per_endpoint = 10;
    let mut config = FAST.to_string();
    for e in 0..endpoints {
        config.push_str(&format!(
            "[[endpoint]]\nkey = \"{}\"\nordering = \"fifo\"\n",
            rx.url(&format!("/o{e}"))
        ));
    }
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), &config);

    // Each endpoint's messages are sent one after another; the endpoints concurrently.
    let senders: Vec<_> = (0..endpoints)
        .map(|e| {
            let target = rx.url(&format!("/o{e}"));
            let url = c.prefixed(&target);
            tokio::spawn(async move {
                for i in 0..per_endpoint {
                    let a = post(&url, &[], format!("o{e}-{i}")).await;
                    assert_eq!(a.status, 202);
                }
            })
        })
        .collect();
    for s in senders {
        s.await.unwrap();
    }
    // Unordered messages to the same host while /o0's head is still failing: they go at once.
    let started = Instant::now();
    let unordered: Vec<_> = (0..30)
        .map(|i| {
            let url = c.prefixed(&rx.url("/u"));
            tokio::spawn(async move { post(&url, &[], format!("u-{i}")).await.status })
        })
        .collect();
    for u in unordered {
        assert_eq!(u.await.unwrap(), 202);
    }
    eventually("the unordered messages to be delivered", || async {
        (bodies_on(&rx, "/u").len() >= 30).then_some(())
    })
    .await;
    let unordered_took = started.elapsed();
    let o0_done = bodies_on(&rx, "/o0").iter().filter(|b| *b == "o0-9").count();
    // Measured in the head's own cycles (each attempt waits out a 1 s Retry-After), which a
    // loaded machine stretches as it stretches the unordered traffic: the 30 did not wait
    // through two of them.
    let seen = rx.seen();
    let last_unordered = seen.iter().filter(|s| s.path == "/u").map(|s| s.at).max().unwrap();
    let head_attempts_meanwhile = seen
        .iter()
        .filter(|s| body(s) == "o0-0" && s.at > started && s.at < last_unordered)
        .count();
    assert!(
        head_attempts_meanwhile <= 2,
        "30 unordered messages took {unordered_took:?} next to a failing ordered head, \
         through {head_attempts_meanwhile} of its attempts"
    );
    assert_eq!(o0_done, 0, "/o0 is still behind its failing head");

    // Every ordered endpoint gets all its messages, in order, one at a time.
    eventually("every ordered message to be delivered", || async {
        let all = (0..endpoints).all(|e| bodies_on(&rx, &format!("/o{e}")).contains(&format!("o{e}-9")));
        all.then_some(())
    })
    .await;
    for e in 0..endpoints {
        let path = format!("/o{e}");
        let seen = bodies_on(&rx, &path);
        assert_in_order(&path, &seen, &format!("o{e}-"), per_endpoint);
        assert_eq!(rx.max_in_flight_on(&path), 1, "{path}: two attempts at once");
    }
    let o0 = bodies_on(&rx, "/o0");
    assert_eq!(
        &o0[..4],
        ["o0-0", "o0-0", "o0-0", "o0-0"],
        "three 503s then delivered: {o0:?}"
    );
    // The receiver's log of the endpoint behind the failing head, for the record.
    let t0 = rx.seen()[0].at;
    for s in rx.seen().iter().filter(|s| s.path == "/o0") {
        eprintln!("receiver /o0 +{:>5} ms {}", (s.at - t0).as_millis(), body(s));
    }
    let metrics = get(&c.admin_url("/metrics")).await.text();
    assert!(metrics.contains("courier_line_waiting 0\n"), "{metrics}");
}

#[tokio::test]
async fn on_dead_block_pauses_the_endpoint_and_a_replayed_head_goes_first_after_resume() {
    // b-0 and b-3 are refused the first time they come, accepted after.
    let rx = Receiver::start().await;
    let seen_once = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let first = seen_once.clone();
    rx.set_script(move |_, s| {
        let b = body(s);
        let refused = s.path == "/b" && matches!(b.as_str(), "b-0" | "b-3") && first.lock().unwrap().insert(b);
        Reply::status(if refused { 410 } else { 200 })
    });
    let key = rx.url("/b");
    let config = format!(
        "alert_url = \"{}\"\n{FAST}[[endpoint]]\nkey = \"{key}\"\nordering = \"fifo\"\non_dead = \"block\"\n",
        rx.url("/alerts")
    );
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), &config);
    let bodies: Vec<String> = (0..3).map(|i| format!("b-{i}")).collect();
    let ids = send_in_order(&c, &key, &bodies).await;

    wait_state(&c, &ids[0], "dead").await;
    let e = eventually("the endpoint to pause", || async {
        let e = endpoint(&c, &key).await;
        (e["state"] == "paused").then_some(e)
    })
    .await;
    assert_eq!(e["ordering"], "fifo");
    assert_eq!(e["line_blocked"], true, "{e}");
    assert_eq!(e["line_head"], ids[0].as_str());
    assert_eq!(e["line_waiting"], 2);
    let waiting = delivery(&c, &ids[2]).await;
    assert_eq!(waiting["ordering"], "fifo");
    assert_eq!(waiting["on_dead"], "block");
    assert_eq!(waiting["line_position"], 2, "{waiting}");
    assert_eq!(waiting["line_head"], ids[0].as_str());
    let alert = eventually("the pause alert", || async {
        rx.seen().into_iter().find(|s| s.path == "/alerts")
    })
    .await;
    let alert: Value = serde_json::from_slice(&alert.body).unwrap();
    assert_eq!(alert["type"], "endpoint.paused", "{alert}");
    assert_eq!(alert["endpoint"], key.as_str());
    assert_eq!(alert["last_status"], 410);
    assert!(c.log.wait_for("head of its ordered line is dead", WAIT).is_some());

    // The fix: replay the dead head (first in line again), then resume.
    let r = post(&c.admin_url(&format!("/deliveries/{}/retry", ids[0])), &[], "").await;
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(delivery(&c, &ids[0]).await["line_position"], 0);
    let enc = key.replace(':', "%3A").replace('/', "%2F");
    let r = post(&c.admin_url(&format!("/endpoints/{enc}/resume")), &[], "").await;
    assert_eq!(r.status, 204, "{}", r.text());
    wait_state(&c, &ids[2], "delivered").await;
    assert_eq!(bodies_on(&rx, "/b"), ["b-0", "b-0", "b-1", "b-2"]);

    // Blocked again; this time a resume without a replay lets the next go.
    let more: Vec<String> = (3..5).map(|i| format!("b-{i}")).collect();
    let ids = send_in_order(&c, &key, &more).await;
    wait_state(&c, &ids[0], "dead").await;
    eventually("the endpoint to pause again", || async {
        (endpoint(&c, &key).await["state"] == "paused").then_some(())
    })
    .await;
    let r = post(&c.admin_url(&format!("/endpoints/{enc}/resume")), &[], "").await;
    assert_eq!(r.status, 204);
    wait_state(&c, &ids[1], "delivered").await;
    assert_eq!(bodies_on(&rx, "/b"), ["b-0", "b-0", "b-1", "b-2", "b-3", "b-4"]);
    assert_eq!(
        delivery(&c, &ids[0]).await["state"],
        "dead",
        "skipped by the resume, still dead"
    );
    assert_eq!(rx.max_in_flight_on("/b"), 1);
}

#[tokio::test]
async fn a_fifo_route_skips_a_dead_head_replays_to_the_end_and_a_deleted_member_is_never_sent() {
    let gate = Gate::new();
    let held = gate.clone();
    let rx = Receiver::scripted(move |_, s| match body(s).as_str() {
        "s-0" => Reply::status(422),
        "s-3" => Reply::status(200).until(&held),
        _ => Reply::status(200),
    })
    .await;
    let config = format!(
        "{FAST}[[route]]\nname = \"orders\"\nurl = \"{}\"\nordering = \"fifo\"\n",
        rx.url("/s")
    );
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), &config);
    let route = format!("http://{}/r/orders", c.ingress);
    let mut ids = Vec::new();
    for i in 0..3 {
        let a = post(&route, &[], format!("s-{i}")).await;
        assert_eq!(a.status, 202);
        ids.push(a.json()["id"].as_str().unwrap().to_string());
    }
    wait_state(&c, &ids[2], "delivered").await;
    assert_eq!(delivery(&c, &ids[0]).await["state"], "dead");
    assert_eq!(bodies_on(&rx, "/s"), ["s-0", "s-1", "s-2"], "skip: the next went");

    // s-3 is held at the receiver; s-4 and s-5 wait behind it; s-0 is replayed behind them.
    for i in 3..6 {
        let a = post(&route, &[], format!("s-{i}")).await;
        ids.push(a.json()["id"].as_str().unwrap().to_string());
    }
    rx.wait_for(4).await;
    // From now on every answer is 200 (the held s-3 still waits for its gate).
    rx.set_script(|_, _| Reply::status(200));
    let r = post(&c.admin_url(&format!("/deliveries/{}/retry", ids[0])), &[], "").await;
    assert_eq!(r.status, 202);
    assert_eq!(delivery(&c, &ids[0]).await["line_position"], 3, "replayed to the end");
    let a = request("DELETE", &c.admin_url(&format!("/deliveries/{}", ids[4])), &[], "").await;
    assert_eq!(a.status, 204);
    assert_eq!(delivery(&c, &ids[5]).await["line_position"], 1);
    gate.open();
    wait_state(&c, &ids[0], "delivered").await;
    assert_eq!(
        bodies_on(&rx, "/s"),
        ["s-0", "s-1", "s-2", "s-3", "s-5", "s-0"],
        "in acceptance order, the replay last, the deleted one never"
    );
    assert_eq!(rx.max_in_flight_on("/s"), 1);
}

#[tokio::test]
async fn kill_9_in_the_middle_of_a_line_keeps_its_order() {
    // The receiver fails everything until the crash; then it answers slowly, and holds k-9
    // open until the test lets it go, so the second kill lands with that attempt in flight.
    let rx = Receiver::scripted(|_, _| Reply::status(503)).await;
    let key = rx.url("/k");
    let config = format!("{FAST}[[endpoint]]\nkey = \"{key}\"\nordering = \"fifo\"\n");
    let d = tempfile::tempdir().unwrap();
    let mut c = Courier::start(d.path(), &config);
    let bodies: Vec<String> = (0..20).map(|i| format!("k-{i}")).collect();
    let ids = send_in_order(&c, &key, &bodies).await;
    rx.wait_for(2).await;
    c.kill();
    let held = Gate::new();
    let gate = held.clone();
    rx.set_script(move |_, s| match body(s).as_str() {
        "k-9" => Reply::status(200).until(&gate),
        _ => Reply::status(200).after(Duration::from_millis(30)),
    });
    c.restart();
    eventually("k-9's attempt to be in flight at the receiver", || async {
        (rx.in_flight_on("/k") == 1 && bodies_on(&rx, "/k").last().map(String::as_str) == Some("k-9")).then_some(())
    })
    .await;
    assert_eq!(delivery(&c, &ids[9]).await["state"], "in_flight");
    c.kill();
    // The receiver answers k-9 now, to a courier that is gone: it was never recorded.
    held.open();
    eventually("the cut attempt to end at the receiver", || async {
        (rx.in_flight_on("/k") == 0).then_some(())
    })
    .await;
    let before_restart = bodies_on(&rx, "/k").len();
    assert_eq!(bodies_on(&rx, "/k").iter().filter(|b| *b == "k-9").count(), 1);
    c.restart();
    wait_state(&c, &ids[19], "delivered").await;
    let seen = bodies_on(&rx, "/k");
    // At-least-once: the attempt in flight at the kill is made again, first of all, and
    // the line goes on in order from there, one at a time.
    assert_eq!(seen[before_restart], "k-9", "{seen:?}");
    assert_eq!(seen.iter().filter(|b| *b == "k-9").count(), 2, "{seen:?}");
    assert_in_order("/k", &seen, "k-", 20);
    assert_eq!(rx.max_in_flight_on("/k"), 1);
    for id in &ids {
        assert_eq!(delivery(&c, id).await["state"], "delivered");
    }
}
