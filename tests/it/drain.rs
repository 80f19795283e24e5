//! `courier drain --to <URL>`: a courier's open messages handed to another courier (B, the
//! "tier"), on a stopped courier's data dir and through a running courier's admin API.
//! Real couriers, a real receiver that is down while the messages move and comes back on
//! its old port; what it sees then is what counts: every event id exactly once.

use std::collections::BTreeSet;
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::support::*;
use crate::support_drain::*;

/// The drained courier: its receiver is down, so every message waits (an hour) after its
/// first attempt; a budget of attempts large enough to survive the peer's probes. It ends
/// in `[drain]` with the peer's token: a test appends `to = ...` for a running one.
const A: &str = "[retry]\nbase_delay = \"1h\"\nmax_delay = \"1h\"\nmax_attempts = 1000\n\
                 [delivery]\nmax_in_flight_per_host = 64\nrate_per_second = 100000\n\
                 [drain]\ntoken = \"tier-token\"\n";
/// The peer: retries and probes a down receiver quickly and delivers a backlog at once
/// when it is back; its ingress token is A's `[drain] token` (so its 202s carry receipts).
const B: &str = "ingress_token = \"tier-token\"\n\
                 [retry]\nbase_delay = \"100ms\"\nmax_delay = \"500ms\"\njitter = \"none\"\n\
                 [delivery]\nmax_in_flight_per_host = 64\nrate_per_second = 100000\n\
                 [circuit]\nprobe_delay = \"100ms\"\nprobe_max_delay = \"500ms\"\n";

/// [`A`] running, with `peer` as its `[drain] to`.
fn a_draining_to(peer: &str) -> String {
    format!("{A}to = \"{peer}\"\n")
}
/// Long enough for the peer to deliver 10,000 messages in a debug build on a busy machine.
const BACKLOG_WAIT: Duration = Duration::from_secs(180);

fn out_text(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The receiver, back on the port it was down on, once it has seen `n` requests and the
/// peer counts them all delivered: the event ids it saw, each asserted to be seen once.
async fn receiver_sees_each_once(addr: std::net::SocketAddr, peer: &Courier, n: usize) -> (Receiver, BTreeSet<String>) {
    let rx = Receiver::start_on(addr).await;
    let seen = rx
        .wait_for_within(n, BACKLOG_WAIT)
        .await
        .unwrap_or_else(|| panic!("the receiver saw {} of {n}", rx.seen().len()));
    let delivered = std::time::Instant::now() + BACKLOG_WAIT;
    while metric(peer, "courier_delivered_total").await < n as u64 {
        assert!(
            std::time::Instant::now() < delivered,
            "the peer did not deliver all {n}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = if rx.seen().len() > seen.len() { rx.seen() } else { seen };
    let ids: BTreeSet<String> = seen.iter().map(|s| s.header("webhook-id").unwrap()).collect();
    assert_eq!(seen.len(), n, "{} requests for {} event ids", seen.len(), ids.len());
    assert_eq!(ids.len(), n, "each event id once");
    (rx, ids)
}

/// Copies a stopped courier's data dir (RocksDB's files), for draining the same messages twice.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[tokio::test]
async fn ten_thousand_pending_messages_move_to_another_courier_and_arrive_once() {
    const N: usize = 10_000;
    let down = dead_addr();
    let target = format!("http://{down}/hooks");
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = Courier::start(dir_a.path(), A);
    let events = post_many(&a, &target, N, "evt-", &[]).await;
    assert!(a.signal_and_wait("TERM").success());
    // The same data dir twice: a copy taken now is drained again after the first hand-off.
    let again = dir_a.path().join("data-copy");
    copy_dir(&a.data_dir, &again);

    let b = Courier::start(dir_b.path(), B);
    let to = format!("http://{}", b.ingress);
    let started = std::time::Instant::now();
    let out = drain(&a.config_path, &a.data_dir, &to, &["--concurrency", "16"]).await;
    let took = started.elapsed();
    assert!(out.status.success(), "{}", printed(&out));
    assert!(
        out_text(&out).contains(&format!("drain: done: {N} of {N} handed off, 0 remaining")),
        "{}",
        printed(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not in use"),
        "{}",
        printed(&out)
    );
    eprintln!(
        "drained {N} messages in {took:?} ({:.0}/s)",
        N as f64 / took.as_secs_f64()
    );
    assert_eq!(metric(&b, "courier_accepted_total").await, N as u64);

    // Again, from the copy: the peer has every one of them, so nothing new is stored.
    let out = drain(&a.config_path, &again, &to, &[]).await;
    assert!(out.status.success(), "{}", printed(&out));
    assert!(
        out_text(&out).contains(&format!("{N} of {N} handed off ({N} already at the peer)")),
        "{}",
        printed(&out)
    );
    assert_eq!(metric(&b, "courier_accepted_total").await, N as u64, "stored once");
    assert_eq!(metric(&b, "courier_duplicates_total").await, N as u64);

    let (_rx, seen) = receiver_sees_each_once(down, &b, N).await;
    assert_eq!(seen, events.into_iter().collect(), "the app's event ids");

    // A's data dir holds nothing open: every message is handed off.
    a.restart();
    let pending = get(&a.admin_url("/deliveries?state=pending&limit=10")).await.json();
    assert_eq!(pending["items"].as_array().unwrap().len(), 0, "{pending}");
    let handed = get(&a.admin_url("/deliveries?state=handed_off&limit=1")).await.json();
    assert_eq!(handed["items"][0]["state"], "handed_off");
    assert_eq!(metric(&a, "courier_pending").await, 0);
}

#[tokio::test]
async fn a_drain_killed_midway_and_run_again_hands_each_message_over_once() {
    const N: usize = 3_000;
    let down = dead_addr();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = Courier::start(dir_a.path(), A);
    post_many(&a, &format!("http://{down}/hooks"), N, "evt-", &[]).await;
    assert!(a.signal_and_wait("TERM").success());
    let mut b = Courier::start(dir_b.path(), B);

    let to = format!("http://{}", b.ingress);
    let mut first = drain_command(&a.config_path, &a.data_dir, &to, &["--concurrency", "2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually("the peer to take some of them", || async {
        (metric(&b, "courier_accepted_total").await >= 200).then_some(())
    })
    .await;
    // Freeze the peer: the drain's requests in flight stay unanswered (some stored there,
    // some not even read). Kill the drain, then the frozen peer, and start the peer again
    // on its data: what it stored is there, what it had not read is gone.
    b.signal("STOP");
    first.kill().unwrap();
    assert!(!first.wait().unwrap().success(), "the first drain was cut short");
    b.restart();

    let out = drain(&a.config_path, &a.data_dir, &format!("http://{}", b.ingress), &[]).await;
    assert!(out.status.success(), "{}", printed(&out));
    // The rerun saw only what the first run had not marked: it did part of the work.
    let text = out_text(&out);
    let total: usize = text
        .split(" of ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{}", printed(&out)));
    assert!(
        total > 0 && total < N,
        "the rerun forwarded {total} of {N}: {}",
        printed(&out)
    );
    receiver_sees_each_once(down, &b, N).await;
}

#[tokio::test]
async fn a_running_courier_drains_itself_after_its_attempts_in_flight() {
    const N: usize = 200;
    let down = dead_addr();
    let gate = Gate::new();
    let g = gate.clone();
    let held = Receiver::scripted(move |_, _| Reply::status(200).until(&g)).await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let b = Courier::start(dir_b.path(), B);
    let a = Courier::start(dir_a.path(), &a_draining_to(&format!("http://{}", b.ingress)));
    post_many(&a, &format!("http://{down}/hooks"), N, "evt-", &[]).await;
    let in_flight = post(&a.prefixed(&held.url("/slow")), &[], "slow").await.json();
    held.wait_for(1).await;

    let admin = a.admin.to_string();
    let mut cmd = drain_command(
        &a.config_path,
        &a.data_dir,
        &format!("http://{}", b.ingress),
        &["--admin-listen", &admin, "--concurrency", "8"],
    );
    let verb = tokio::task::spawn_blocking(move || cmd.output().unwrap());
    // It waits for the attempt in flight, with ingress already refusing new messages.
    eventually("the drain to wait for the attempt in flight", || async {
        let s = get(&a.admin_url("/drain")).await.json();
        (s["state"] == "stopping").then_some(())
    })
    .await;
    let refused = post(&a.prefixed(&held.url("/late")), &[], "late").await;
    assert_eq!(
        (refused.status, refused.json()["error"].clone()),
        (503, "shutting_down".into())
    );
    assert_eq!(get(&a.admin_url("/readyz")).await.status, 503);
    assert_eq!(metric(&b, "courier_accepted_total").await, 0, "nothing forwarded yet");
    gate.open();

    let out = verb.await.unwrap();
    assert!(out.status.success(), "{}", printed(&out));
    assert!(
        out_text(&out).contains(&format!("{N} of {N} handed off")),
        "{}",
        printed(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a courier runs on"),
        "{}",
        printed(&out)
    );
    // The attempt that was in flight finished here; the rest went to the peer.
    let id = in_flight["id"].as_str().unwrap();
    assert_eq!(delivery(&a, id).await["state"], "delivered");
    assert_eq!(held.seen().len(), 1);
    assert_eq!(metric(&a, "courier_handed_off_total").await, N as u64);
    let status = get(&a.admin_url("/drain")).await.json();
    assert_eq!(
        (status["state"].clone(), status["handed_off"].clone()),
        ("done".into(), N.into())
    );
    assert_eq!(metric(&b, "courier_accepted_total").await, N as u64);
    receiver_sees_each_once(down, &b, N).await;
}

fn hmac256(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = Hmac::<Sha256>::new_from_slice(key).unwrap();
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

fn standard_key(secret: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap()
}

#[tokio::test]
async fn the_signing_choice_travels_with_a_handed_off_message() {
    const DEFAULT: &str = "whsec_ZGVmYXVsdC1zZWNyZXQtb2YtYm90aA==";
    const KEY_K: &str = "whsec_a2V5LWstc2VjcmV0LWZvci10ZXN0cw==";
    const INLINE: &str = "whsec_aW5saW5lLXNlY3JldC1mb3ItdGVzdHM=";
    // Both couriers sign with the same keys, as a tier must.
    let signing = format!("[signing]\nsecrets = [\"{DEFAULT}\"]\n[signing.keys]\nk = [\"{KEY_K}\"]\n");
    let down = dead_addr();
    let target = format!("http://{down}/signed");
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = Courier::start(dir_a.path(), &format!("{A}{signing}"));
    post_many(&a, &target, 1, "by-key-", &[("Courier-Signing-Key", "k")]).await;
    post_many(&a, &target, 1, "inline-", &[("Courier-Signing-Secret", INLINE)]).await;
    let stripe = [("Courier-Signing-Key", "k"), ("Courier-Signature-Scheme", "stripe")];
    post_many(&a, &target, 1, "stripe-", &stripe).await;
    assert!(a.signal_and_wait("TERM").success());
    let b = Courier::start(dir_b.path(), &format!("{B}{signing}"));
    let out = drain(&a.config_path, &a.data_dir, &format!("http://{}", b.ingress), &[]).await;
    assert!(out.status.success(), "{}", printed(&out));

    let (rx, _) = receiver_sees_each_once(down, &b, 3).await;
    for seen in rx.seen() {
        let id = seen.header("webhook-id").unwrap();
        let ts = seen.header("webhook-timestamp").unwrap();
        let body = String::from_utf8(seen.body.clone()).unwrap();
        if id.starts_with("stripe-") {
            let header = seen.header("stripe-signature").expect("a Stripe signature");
            let want = hex::encode(hmac256(KEY_K.as_bytes(), format!("{ts}.{body}").as_bytes()));
            assert_eq!(
                header,
                format!("t={ts},v1={want}"),
                "signed with k's secret, Stripe style"
            );
            continue;
        }
        let secret = if id.starts_with("by-key-") { KEY_K } else { INLINE };
        let signed = format!("{id}.{ts}.{body}");
        let want = base64::engine::general_purpose::STANDARD.encode(hmac256(&standard_key(secret), signed.as_bytes()));
        let not = base64::engine::general_purpose::STANDARD.encode(hmac256(&standard_key(DEFAULT), signed.as_bytes()));
        let header = seen.header("webhook-signature").expect("a Standard Webhooks signature");
        assert_eq!(header, format!("v1,{want}"), "{id}: signed with its own choice");
        assert_ne!(want, not);
    }
}

#[tokio::test]
async fn a_message_the_peer_refuses_stays_pending_and_the_rest_go() {
    let down = dead_addr();
    let target = format!("http://{down}/hooks");
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = Courier::start(dir_a.path(), A);
    post_many(&a, &target, 3, "small-", &[]).await;
    let big = post(&a.prefixed(&target), &[("webhook-id", "big-1")], vec![b'x'; 4096])
        .await
        .json();
    assert!(a.signal_and_wait("TERM").success());
    // The peer takes at most 1 KiB.
    let b = Courier::start(dir_b.path(), &format!("max_body = \"1KiB\"\n{B}"));
    let to = format!("http://{}", b.ingress);

    // With a wrong token nothing goes, and the drain says why.
    let mut cmd = drain_command(&a.config_path, &a.data_dir, &to, &[]);
    cmd.env("COURIER_DRAIN_TOKEN", "wrong-token");
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", printed(&out));
    assert!(out_text(&out).contains("refused the token"), "{}", printed(&out));
    assert_eq!(metric(&b, "courier_accepted_total").await, 0);

    let out = drain(&a.config_path, &a.data_dir, &to, &[]).await;
    assert_eq!(out.status.code(), Some(1), "not everything went: {}", printed(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("413") && stderr.contains("body_too_large"),
        "{}",
        printed(&out)
    );
    assert!(out_text(&out).contains("3 of 4 handed off"), "{}", printed(&out));
    assert!(out_text(&out).contains("1 refused by the peer"), "{}", printed(&out));
    assert_eq!(metric(&b, "courier_accepted_total").await, 3);
    a.restart();
    let id = big["id"].as_str().unwrap();
    assert_eq!(
        delivery(&a, id).await["state"],
        "pending",
        "still here, to be delivered later"
    );
}

#[tokio::test]
async fn an_ordered_line_is_handed_over_in_its_order() {
    let down = dead_addr();
    let target = format!("http://{down}/ordered");
    let fifo = format!("[[endpoint]]\nkey = \"{target}\"\nordering = \"fifo\"\n");
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = Courier::start(dir_a.path(), &format!("{A}{fifo}"));
    // One at a time, so acceptance order is the order of the ids.
    for i in 0..30 {
        post_many(&a, &target, 1, &format!("line-{i:02}-"), &[]).await;
    }
    assert!(a.signal_and_wait("TERM").success());
    let b = Courier::start(dir_b.path(), &format!("{B}{fifo}"));
    let out = drain(
        &a.config_path,
        &a.data_dir,
        &format!("http://{}", b.ingress),
        &["--concurrency", "16"],
    )
    .await;
    assert!(out.status.success(), "{}", printed(&out));
    let (rx, _) = receiver_sees_each_once(down, &b, 30).await;
    let order: Vec<String> = rx.seen().iter().map(|s| s.header("webhook-id").unwrap()).collect();
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted, "the peer delivers the line in its order");
}

#[tokio::test]
async fn with_deliver_for_a_running_courier_delivers_what_it_can_and_forwards_only_the_rest() {
    // The receiver fails each message's first attempt (500: not a breaker failure) and takes
    // the retry 2 s later, while the drain is already waiting.
    let first_seen = std::sync::Mutex::new(BTreeSet::new());
    let rx = Receiver::scripted(move |_, seen| {
        let fresh = first_seen.lock().unwrap().insert(seen.header("webhook-id").unwrap());
        Reply::status(if fresh { 500 } else { 200 })
    })
    .await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let b = Courier::start(dir_b.path(), B);
    let a = Courier::start(
        dir_a.path(),
        &format!(
            "[retry]\nbase_delay = \"2s\"\njitter = \"none\"\n[drain]\nto = \"http://{}\"\ntoken = \"tier-token\"\n",
            b.ingress
        ),
    );
    post_many(&a, &rx.url("/retried"), 20, "evt-", &[]).await;
    rx.wait_for(20).await;
    let admin = a.admin.to_string();
    let started = std::time::Instant::now();
    let out = drain(
        &a.config_path,
        &a.data_dir,
        &format!("http://{}", b.ingress),
        &["--admin-listen", &admin, "--deliver-for", "2m"],
    )
    .await;
    assert!(out.status.success(), "{}", printed(&out));
    // Everything was delivered while it waited, so nothing was left to forward, and it did
    // not wait out its two minutes once nothing was open.
    assert!(out_text(&out).contains("0 of 0 handed off"), "{}", printed(&out));
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "it stopped waiting when nothing was open"
    );
    assert_eq!(metric(&a, "courier_delivered_total").await, 20);
    assert_eq!(metric(&b, "courier_accepted_total").await, 0);
}

/// Reads from `s` until `what` has arrived (within [`WAIT`]); returns all read.
async fn read_until(s: &mut tokio::net::TcpStream, what: &str) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    tokio::time::timeout(WAIT, async {
        while !String::from_utf8_lossy(&got).contains(what) {
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before {what:?}: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {what:?} in time: {}", String::from_utf8_lossy(&got)));
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn a_drain_waits_for_an_ingress_request_under_way_and_forwards_its_message() {
    use tokio::io::AsyncWriteExt;
    let down = dead_addr();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let b = Courier::start(dir_b.path(), B);
    let a = Courier::start(dir_a.path(), &a_draining_to(&format!("http://{}", b.ingress)));
    // A request past ingress's checks: courier asked for its body (100 Continue), which the
    // client holds back until the drain has begun.
    let mut held = tokio::net::TcpStream::connect(a.ingress).await.unwrap();
    let body = r#"{"i":"held"}"#;
    let head = format!(
        "POST /http://{down}/hooks HTTP/1.1\r\nhost: {}\r\nwebhook-id: evt-held\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nexpect: 100-continue\r\n\r\n",
        a.ingress,
        body.len()
    );
    held.write_all(head.as_bytes()).await.unwrap();
    read_until(&mut held, "100 Continue").await;

    let to = format!("{{\"to\": \"http://{}\"}}", b.ingress);
    let started = post(&a.admin_url("/drain"), &[("content-type", "application/json")], to).await;
    assert_eq!(started.status, 202, "{:?}", started.json());
    // The drain waits for the request (up to the body timeout) rather than walking the
    // store without its message.
    let waiting = get(&a.admin_url("/drain?wait=2s")).await.json();
    assert_eq!(waiting["state"], "stopping", "{waiting}");
    held.write_all(body.as_bytes()).await.unwrap();
    let answer = read_until(&mut held, "\r\n\r\n").await;
    assert!(answer.contains(" 202 "), "{answer}");

    let done = eventually("the drain to end", || async {
        let s = get(&a.admin_url("/drain?wait=1s")).await.json();
        (s["state"] == "done" || s["state"] == "failed").then_some(s)
    })
    .await;
    assert_eq!(
        (
            done["state"].clone(),
            done["handed_off"].clone(),
            done["remaining"].clone()
        ),
        ("done".into(), 1.into(), 0.into()),
        "{done}"
    );
    assert_eq!(metric(&b, "courier_accepted_total").await, 1);
    assert_eq!(metric(&a, "courier_pending").await, 0);
}

#[tokio::test]
async fn a_failed_drain_says_that_delivery_stays_stopped() {
    let down = dead_addr();
    let dir = tempfile::tempdir().unwrap();
    // Not a courier: its 200 stops the drain.
    let proxy = Receiver::scripted(|_, _| Reply::status(200)).await;
    let a = Courier::start(dir.path(), &a_draining_to(&proxy.url("/")));
    post_many(&a, &format!("http://{down}/hooks"), 1, "evt-", &[]).await;
    let to = format!("{{\"to\": \"{}\"}}", proxy.url("/"));
    let started = post(&a.admin_url("/drain"), &[("content-type", "application/json")], to).await;
    assert_eq!(started.status, 202, "{:?}", started.json());
    let failed = eventually("the drain to end", || async {
        let s = get(&a.admin_url("/drain?wait=1s")).await.json();
        (s["state"] == "done" || s["state"] == "failed").then_some(s)
    })
    .await;
    assert_eq!(
        (failed["state"].clone(), failed["delivery_stopped"].clone()),
        ("failed".into(), true.into()),
        "{failed}"
    );
    // And it is so: ingress still refuses.
    let refused = post(&a.prefixed(&format!("http://{down}/late")), &[], "late").await;
    assert_eq!(refused.status, 503);
}

#[tokio::test]
async fn a_drain_is_refused_once_courier_is_shutting_down() {
    let gate = Gate::new();
    let g = gate.clone();
    let held = Receiver::scripted(move |_, _| Reply::status(200).until(&g)).await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let b = Courier::start(dir_b.path(), B);
    let mut a = Courier::start(dir_a.path(), &a_draining_to(&format!("http://{}", b.ingress)));
    // An attempt in flight keeps the shutdown (and the admin API) going until the gate opens.
    post(&a.prefixed(&held.url("/slow")), &[], "slow").await;
    held.wait_for(1).await;
    a.signal("TERM");
    let to = format!("{{\"to\": \"http://{}\"}}", b.ingress);
    let refused = eventually("POST /drain to be refused during shutdown", || {
        let (url, to) = (a.admin_url("/drain"), to.clone());
        async move {
            let r = try_request("POST", &url, &[("content-type", "application/json")], to)
                .await
                .ok()?;
            (r.status == 503).then_some(r)
        }
    })
    .await;
    assert_eq!(refused.json()["error"], "shutting_down", "{}", refused.text());
    gate.open();
    assert!(a.wait_exit().success());
    assert_eq!(metric(&b, "courier_accepted_total").await, 0, "nothing forwarded");
}

/// `POST /drain` with `body`, as JSON.
async fn post_drain(a: &Courier, body: serde_json::Value) -> Answer {
    post(
        &a.admin_url("/drain"),
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await
}

/// After a refused drain: nothing reached `peer`, no drain ran, ingress takes a message and
/// delivery delivers it.
async fn still_serving(a: &Courier, peer: &Untouched) {
    let rx = Receiver::start().await;
    let after = post(&a.prefixed(&rx.url("/after")), &[], "after").await;
    assert_eq!(after.status, 202, "ingress still takes messages: {}", after.text());
    wait_state(a, after.json()["id"].as_str().unwrap(), "delivered").await;
    assert_eq!(get(&a.admin_url("/drain")).await.json()["state"], "idle");
    assert_eq!(peer.connections(), 0, "nothing was sent to the peer");
}

#[tokio::test]
async fn a_drain_to_a_peer_not_in_the_config_is_refused_and_courier_goes_on_serving() {
    let down = dead_addr();
    let attacker = Untouched::start().await;
    let dir = tempfile::tempdir().unwrap();
    let a = Courier::start(dir.path(), &a_draining_to(&format!("http://{down}")));
    post_many(&a, &format!("http://{down}/hooks"), 3, "evt-", &[]).await;

    let to = format!("http://{}", attacker.addr);
    let refused = post_drain(&a, serde_json::json!({ "to": to })).await;
    assert_eq!(refused.status, 403, "{}", refused.text());
    assert_eq!(refused.json()["error"], "drain_peer_not_allowed", "{}", refused.text());
    assert!(refused.json()["message"].is_string());
    // The verb against the running courier goes through the same door, and says so.
    let admin = a.admin.to_string();
    let out = drain(&a.config_path, &a.data_dir, &to, &["--admin-listen", &admin]).await;
    assert_eq!(out.status.code(), Some(1), "{}", printed(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("did not start the drain") && stderr.contains("drain_peer_not_allowed"),
        "{}",
        printed(&out)
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    still_serving(&a, &attacker).await;
    assert_eq!(metric(&a, "courier_handed_off_total").await, 0);
}

#[tokio::test]
async fn an_http_peer_without_a_token_is_refused_before_anything_is_sent() {
    let down = dead_addr();
    let peer = Untouched::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = format!("[retry]\nbase_delay = \"1h\"\n[drain]\nto = \"http://{}\"\n", peer.addr);
    let mut a = Courier::start(dir.path(), &config);
    post_many(&a, &format!("http://{down}/hooks"), 2, "evt-", &[]).await;

    let refused = post_drain(&a, serde_json::json!({})).await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert_eq!(
        refused.json()["error"],
        "drain_peer_unauthenticated",
        "{}",
        refused.text()
    );
    still_serving(&a, &peer).await;

    // The offline verb on the stopped data dir: the same rule, one line, nothing sent.
    assert!(a.signal_and_wait("TERM").success());
    let out = drain(&a.config_path, &a.data_dir, &format!("http://{}", peer.addr), &[]).await;
    assert!(!out.status.success(), "{}", printed(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[drain] token") && stderr.contains("https"),
        "{}",
        printed(&out)
    );
    assert_eq!(peer.connections(), 0, "nothing was sent to the peer");
}

#[tokio::test]
async fn a_202_without_the_peers_receipt_hands_nothing_off() {
    let down = dead_addr();
    // Looks like a courier's ingress: 202, its own delivery id, our event id echoed.
    let fake = Receiver::scripted(|_, seen| {
        let event = seen.header("webhook-id").unwrap_or_default();
        let body = serde_json::json!({"id": "dlv_x", "event_id": event, "status": "pending"});
        Reply::status(202)
            .header("content-type", "application/json")
            .body(body.to_string())
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let a = Courier::start(dir.path(), &a_draining_to(&fake.url("/")));
    let id = post(&a.prefixed(&format!("http://{down}/hooks")), &[], "x")
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    wait_state(&a, &id, "pending").await;

    let started = post_drain(&a, serde_json::json!({})).await;
    assert_eq!(started.status, 202, "{}", started.text());
    let failed = eventually("the drain to end", || async {
        let s = get(&a.admin_url("/drain?wait=1s")).await.json();
        (s["state"] == "done" || s["state"] == "failed").then_some(s)
    })
    .await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert!(
        failed["error"]
            .as_str()
            .unwrap_or_default()
            .contains("no valid Courier-Receipt"),
        "{failed}"
    );
    assert_eq!(failed["handed_off"], 0, "{failed}");
    assert!(!fake.seen().is_empty(), "the message went to the fake peer");
    assert_eq!(delivery(&a, &id).await["state"], "pending", "not marked handed off");
    assert_eq!(metric(&a, "courier_handed_off_total").await, 0);
}

#[tokio::test]
async fn the_offline_verb_reaches_an_unlisted_peer_only_under_the_egress_policy() {
    let down = dead_addr();
    let peer = Untouched::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut a = Courier::start(dir.path(), A);
    let id = post(&a.prefixed(&format!("http://{down}/hooks")), &[], "x")
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(a.signal_and_wait("TERM").success());
    // The data dir's config closes private addresses to delivery: an unlisted --to on
    // loopback is refused like a delivery to it would be.
    let open = std::fs::read_to_string(&a.config_path).unwrap();
    std::fs::write(
        &a.config_path,
        open.replace("allow_private_targets = true", "allow_private_targets = false"),
    )
    .unwrap();
    let out = drain(&a.config_path, &a.data_dir, &format!("http://{}", peer.addr), &[]).await;
    assert_eq!(out.status.code(), Some(1), "{}", printed(&out));
    assert!(
        out_text(&out).contains("egress") && out_text(&out).contains("[drain] peers"),
        "{}",
        printed(&out)
    );
    assert_eq!(peer.connections(), 0, "nothing was sent to the peer");

    std::fs::write(&a.config_path, open).unwrap();
    a.restart();
    assert_eq!(delivery(&a, &id).await["state"], "pending");
}
