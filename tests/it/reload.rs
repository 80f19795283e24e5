//! Live reload against the real binary: SIGHUP and `courier reload` re-read the config; a
//! signing rotation under traffic loses nothing and signs every later message with the new
//! list; a bad config is refused and the running one kept; a restart-only change is named.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::support::*;

const KEY_A: &[u8] = b"reload-key-A-0123456789";
const KEY_B: &[u8] = b"reload-key-B-abcdefghij";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The config with `keys` as the signing rotation list (first signs first).
fn signing(keys: &[&[u8]], extra: &str) -> String {
    let list: Vec<String> = keys.iter().map(|k| format!("\"whsec_{}\"", b64(k))).collect();
    format!(
        "allow_private_targets = true\n{extra}\n[signing]\nsecrets = [{}]\n",
        list.join(", ")
    )
}

/// The Standard Webhooks signature header `keys` give for what `seen` carries.
fn expected_signature(seen: &Seen, keys: &[&[u8]]) -> String {
    let id = seen.header("webhook-id").unwrap();
    let ts = seen.header("webhook-timestamp").unwrap();
    let mut signed = format!("{id}.{ts}.").into_bytes();
    signed.extend_from_slice(&seen.body);
    keys.iter()
        .map(|k| {
            let mut m = Hmac::<Sha256>::new_from_slice(k).unwrap();
            m.update(&signed);
            format!("v1,{}", b64(&m.finalize().into_bytes()))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Posts messages with ids `{prefix}-{i}`, one after another; each must be accepted.
async fn post_batch(target: &str, prefix: &str, n: usize) -> Vec<String> {
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    for id in &ids {
        let a = post(target, &[("webhook-id", id.as_str())], format!("{{\"id\":\"{id}\"}}")).await;
        assert_eq!(a.status, 202, "{id}: {}", a.text());
    }
    ids
}

/// Waits (on the receiver's own notifications, up to its deadline) until every one of `ids`
/// has been seen.
async fn wait_delivered(rx: &Receiver, ids: &[String]) {
    let want: HashSet<&String> = ids.iter().collect();
    let mut n = 1;
    loop {
        let seen = rx.wait_for(n).await;
        let got: HashSet<String> = seen.iter().filter_map(|s| s.header("webhook-id")).collect();
        if want.iter().all(|id| got.contains(*id)) {
            return;
        }
        n = seen.len() + 1;
    }
}

fn reload_cli(c: &Courier) -> std::process::Output {
    std::process::Command::new(bin())
        .args(["reload", "--admin-listen", &c.admin.to_string()])
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_signing_rotation_under_traffic_loses_nothing_and_signs_every_later_message_with_the_new_list() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), &signing(&[KEY_A], ""));
    let target = c.prefixed(&rx.url("/hook"));
    let mut expected: HashMap<String, Vec<Vec<&[u8]>>> = HashMap::new();
    let any_list = vec![vec![KEY_A], vec![KEY_B, KEY_A], vec![KEY_B]];

    // Each batch is delivered before the next reload: courier signs when it attempts, so a
    // first attempt delayed past a reload would rightly carry the newer list.
    let before = post_batch(&target, "before", 20).await;
    wait_delivered(&rx, &before).await;
    for id in before {
        expected.insert(id, vec![vec![KEY_A]]);
    }
    // Traffic that does not stop for the reloads: one sender, message after message.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let traffic = {
        let (stop, sent, target) = (stop.clone(), sent.clone(), target.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let id = format!("during-{i}");
                let a = post(&target, &[("webhook-id", id.as_str())], format!("{{\"n\":{i}}}")).await;
                assert_eq!(a.status, 202, "{id}: {}", a.text());
                sent.lock().unwrap().push(id);
                i += 1;
            }
        })
    };

    // Rotation step 1 (SIGHUP): the new key first, the old one still signing.
    std::fs::write(&c.config_path, signing(&[KEY_B, KEY_A], "")).unwrap();
    c.signal("HUP");
    assert!(c.log.wait_for_count("config reloaded", 1, WAIT), "{}", c.log.all());
    // Accepted after the reload was applied: every attempt signs with the new list.
    let after_hup = post_batch(&target, "after-hup", 20).await;
    wait_delivered(&rx, &after_hup).await;
    for id in after_hup {
        expected.insert(id, vec![vec![KEY_B, KEY_A]]);
    }

    // Rotation step 2 (`courier reload`): the old key retired.
    std::fs::write(&c.config_path, signing(&[KEY_B], "")).unwrap();
    let out = reload_cli(&c);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "config reloaded");
    for id in post_batch(&target, "after-cli", 20).await {
        expected.insert(id, vec![vec![KEY_B]]);
    }
    stop.store(true, Ordering::SeqCst);
    traffic.await.unwrap();
    let during = sent.lock().unwrap().clone();
    assert!(!during.is_empty());
    for id in during {
        // Signed before, between or after the reloads, by one of the lists in force.
        expected.insert(id, any_list.clone());
    }

    // Nothing lost, and every attempt carries the signature of an allowed list.
    let seen = rx.wait_for(expected.len()).await;
    let mut delivered = HashMap::new();
    for s in &seen {
        let id = s.header("webhook-id").unwrap();
        let lists = expected.get(&id).unwrap_or_else(|| panic!("unexpected delivery {id}"));
        let got = s.header("webhook-signature").unwrap();
        assert!(
            lists.iter().any(|keys| expected_signature(s, keys) == got),
            "{id}: signature {got} is from none of the lists allowed for it"
        );
        delivered.insert(id, ());
    }
    assert_eq!(delivered.len(), expected.len(), "every accepted message delivered");
}

#[tokio::test]
async fn a_bad_config_is_refused_and_the_running_one_kept_and_restart_only_changes_are_named() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), &signing(&[KEY_A], ""));
    let target = c.prefixed(&rx.url("/hook"));

    // A syntax error: refused, one line, the old secret still signs.
    std::fs::write(&c.config_path, "[signing\nsecrets = 1\n").unwrap();
    c.signal("HUP");
    let line = c.log.wait_for("config reload refused", WAIT).expect("refusal logged");
    assert!(line.contains("running config is kept"), "{line}");
    post_batch(&target, "kept", 1).await;
    let s = &rx.wait_for(1).await[0];
    assert_eq!(s.header("webhook-signature").unwrap(), expected_signature(s, &[KEY_A]));

    // Through the admin API: a bad value gets a code and the reason.
    std::fs::write(&c.config_path, signing(&[KEY_A], "[retry]\nbase_delay = \"soon\"\n")).unwrap();
    let a = request("POST", &c.admin_url("/reload"), &[], "").await;
    assert_eq!(a.status, 400, "{}", a.text());
    assert_eq!(a.json()["error"], "invalid_config");
    assert!(a.text().contains("retry.base_delay"), "{}", a.text());

    // A restart-only setting changed with a reloadable one: the one applied, the other named.
    std::fs::write(
        &c.config_path,
        signing(
            &[KEY_B],
            "retention = \"1d\"\n[[route]]\nname = \"late\"\nurl = \"http://127.0.0.1:9/x\"\n",
        ),
    )
    .unwrap();
    let a = request("POST", &c.admin_url("/reload"), &[], "").await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["restart_required"], serde_json::json!(["retention"]));
    assert!(c.log.wait_for("take effect only at restart", WAIT).is_some());
    // The route added by the reload accepts now.
    let a = post(&format!("http://{}/r/late", c.ingress), &[], "{}").await;
    assert_eq!(a.status, 202, "{}", a.text());
    post_batch(&target, "new", 1).await;
    let seen = rx.wait_for(2).await;
    let s = seen
        .iter()
        .find(|s| s.header("webhook-id").unwrap() == "new-0")
        .unwrap();
    assert_eq!(s.header("webhook-signature").unwrap(), expected_signature(s, &[KEY_B]));
}
