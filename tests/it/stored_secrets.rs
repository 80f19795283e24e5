//! Secrets that must not reach the data dir or the admin API by a side door, black-box: a
//! pause alert's `alert_url` (a credential in its path) in no file of the data dir, a sealed
//! payload's size the same whether or not its body repeats its `Authorization`, and a
//! receiver that echoes its input leaving none of it in `last_error` or the history.

use std::path::Path;

use crate::sealing::{files_holding, generate_key, sealed_with};
use crate::support::*;

const ALERT_PATH: &str = "/alerts/ALERT-PATH-m3Qx8";
const ALERT_QUERY: &str = "key=ALERT-QUERY-v5Rt1";

#[tokio::test]
async fn a_queued_pause_alert_leaves_alert_url_in_no_file_and_is_delivered_after_a_restart() {
    // The alert receiver is down until the restart: the alert waits in the store.
    let alerts_at = dead_addr();
    let rx = Receiver::scripted(|_, _| Reply::status(410).body("gone")).await;
    let dir = tempfile::tempdir().unwrap();
    let key = generate_key(dir.path(), "store.key");
    let cfg = format!(
        "alert_url = \"http://{alerts_at}{ALERT_PATH}?{ALERT_QUERY}\"\n{}[delivery]\npause_after_permanent_failures = 1\n",
        sealed_with(&[&key])
    );
    let mut c = Courier::start(dir.path(), &cfg);
    let a = post(&c.prefixed(&rx.url("/gone")), &[], "x").await;
    assert_eq!(a.status, 202, "{}", a.text());
    let alert = eventually("the pause alert to be stored and tried", || async {
        let list = get(&c.admin_url("/deliveries?limit=100")).await.json();
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["endpoint"].as_str().unwrap().ends_with("/[alert_url]") && d["attempts"].as_u64() >= Some(1))
            .cloned()
    })
    .await;
    let shown = alert["target"].as_str().unwrap();
    assert!(!shown.contains("ALERT-"), "{shown}");
    assert!(c.signal_and_wait("TERM").success());
    let needles = ["ALERT-PATH-m3Qx8", "ALERT-QUERY-v5Rt1"];
    assert_eq!(files_holding(&c.data_dir, &needles), Vec::<String>::new());

    // After a restart the stored reference still finds alert_url, path and query.
    c.restart();
    let alerts = Receiver::start_on(alerts_at).await;
    let seen = alerts.wait_for(1).await;
    assert_eq!(seen[0].path, format!("{ALERT_PATH}?{ALERT_QUERY}"));
    let body: serde_json::Value = serde_json::from_slice(&seen[0].body).unwrap();
    assert_eq!(body["type"], "endpoint.paused");
    wait_state(&c, alert["id"].as_str().unwrap(), "delivered").await;
}

/// The length of each of `ids`' stored payloads in the (stopped) store at `data_dir`.
fn stored_payload_lengths(data_dir: &Path, ids: &[String]) -> Vec<usize> {
    let cfs = [courier::store::keys::PAYLOADS];
    let db = rocksdb::DB::open_cf_for_read_only(&rocksdb::Options::default(), data_dir, cfs, false).unwrap();
    let cf = db.cf_handle(courier::store::keys::PAYLOADS).unwrap();
    ids.iter()
        .map(|id| db.get_cf(cf, id.as_bytes()).unwrap().expect("stored").len())
        .collect()
}

#[tokio::test]
async fn a_sealed_payload_is_as_long_whether_or_not_its_body_repeats_its_authorization() {
    let target = format!("http://{}/hook", dead_addr());
    let dir = tempfile::tempdir().unwrap();
    let key = generate_key(dir.path(), "store.key");
    let mut c = Courier::start(dir.path(), &sealed_with(&[&key]));
    // The sender chooses part of the body: a guess at the app's token, next to data that
    // compresses (as JSON does). Only the Authorization header differs between the two.
    let guess = "Bearer GUESS-s3cr3t-t0k3n-q9";
    let body = format!("{{\"probe\":\"{guess}\",\"pad\":\"{}\"}}", "p".repeat(400));
    let mut ids = Vec::new();
    for auth in [guess, "Bearer ZQXJV-KWPYBM-ZQXJV-mm"] {
        assert_eq!(auth.len(), guess.len());
        let a = post(&c.prefixed(&target), &[("authorization", auth)], body.clone()).await;
        assert_eq!(a.status, 202, "{}", a.text());
        ids.push(a.json()["id"].as_str().unwrap().to_string());
    }
    assert!(c.signal_and_wait("TERM").success());
    let lengths = stored_payload_lengths(&c.data_dir, &ids);
    assert_eq!(
        lengths[0], lengths[1],
        "the payload whose Authorization the body guessed seals to another length"
    );
    assert!(lengths[0] < body.len(), "the body still compresses: {lengths:?}");
}

const ECHO_TOKEN: &str = "Bearer ECHO-TOKEN-w4Lp7-z2Nc";
const ECHO_BODY: &str = r#"{"customer":"ada@example.com","card":"4242-4242-4242-4242"}"#;

/// Every piece of `secret` of 8 bytes (the shortest piece courier takes out) found in `text`.
fn pieces_in(text: &str, secret: &str) -> Vec<String> {
    secret
        .as_bytes()
        .windows(8)
        .filter(|w| text.as_bytes().windows(8).any(|t| t == *w))
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect()
}

#[tokio::test]
async fn a_receiver_echoing_the_request_leaves_none_of_it_in_last_error_or_the_history() {
    let rx = Receiver::scripted(|_, seen| {
        let auth = seen.header("authorization").unwrap_or_default();
        let body = String::from_utf8_lossy(&seen.body).into_owned();
        Reply::status(500).body(format!("rejected: authorization={auth} body={body}"))
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = "[retry]\nbase_delay = \"50ms\"\nmax_delay = \"100ms\"\njitter = \"none\"\nmax_attempts = 2\n";
    let c = Courier::start(dir.path(), cfg);
    let a = post(
        &c.prefixed(&rx.url("/hook")),
        &[("authorization", ECHO_TOKEN)],
        ECHO_BODY,
    )
    .await;
    assert_eq!(a.status, 202, "{}", a.text());
    let id = a.json()["id"].as_str().unwrap().to_string();
    let dead = wait_state(&c, &id, "dead").await;
    let echoed = &rx.seen()[0];
    assert_eq!(
        echoed.header("authorization").as_deref(),
        Some(ECHO_TOKEN),
        "the receiver got them"
    );

    let list = get(&c.admin_url("/deliveries?limit=100")).await.json();
    let mut errors = vec![dead["last_error"].clone(), list["items"][0]["last_error"].clone()];
    errors.extend(dead["history"].as_array().unwrap().iter().map(|h| h["error"].clone()));
    assert_eq!(errors.len(), 4, "{dead}");
    for error in &errors {
        let error = error.as_str().unwrap();
        assert!(error.starts_with("HTTP 500: rejected: authorization="), "{error}");
        assert!(error.contains("[sent data]"), "{error}");
        for secret in [ECHO_TOKEN, ECHO_BODY] {
            let found = pieces_in(error, secret);
            assert!(found.is_empty(), "{found:?} of {secret:?} in {error:?}");
        }
    }
}
