//! Payloads sealed at rest (`[store] encryption_key_files`), black-box: what the data dir's
//! files hold after a clean stop (every file, WAL and SST, read byte for byte), a start with
//! a wrong or bad key refused with one line, rotation and `courier store rekey`, and a drain
//! to a peer that seals with its own key.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::support::*;
use crate::support_drain::{drain, printed};

/// The receiver is down while messages are accepted; courier retries it quickly, so it
/// delivers soon after the receiver comes back.
const RETRY: &str = "allow_private_targets = true\n\
                     [retry]\nbase_delay = \"100ms\"\nmax_delay = \"500ms\"\njitter = \"none\"\nmax_attempts = 1000\n\
                     [circuit]\nprobe_delay = \"100ms\"\nprobe_max_delay = \"500ms\"\n";
const MARKER: &str = "BODY-MARKER-q7Zr4";
const TOKEN: &str = "Bearer APP-TOKEN-k9Xw2";
const SECRET_BYTES: &[u8] = b"per-message-secret-J3v8";

fn secret() -> String {
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(SECRET_BYTES)
    )
}

/// `courier keys generate --store > dir/name`, as the docs say to make one.
pub(crate) fn generate_key(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "umask 022; '{}' keys generate --store > '{}'",
            bin(),
            path.display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    path
}

/// The config of a courier that retries quickly and seals with `keys`.
pub(crate) fn sealed_with(keys: &[&Path]) -> String {
    let files: Vec<String> = keys.iter().map(|k| format!("\"{}\"", k.display())).collect();
    format!("{RETRY}[store]\nencryption_key_files = [{}]\n", files.join(", "))
}

/// Posts `n` messages to `target`, each with the body marker, the app's `Authorization`
/// for the receiver and a per-message signing secret: their event ids.
async fn post_marked(c: &Courier, target: &str, n: usize, prefix: &str) -> Vec<String> {
    let mut events = Vec::new();
    for i in 0..n {
        let event = format!("{prefix}{i}");
        let body = format!("{{\"i\":{i},\"marker\":\"{MARKER}\"}}");
        let secret = secret();
        let headers = [
            ("webhook-id", event.as_str()),
            ("authorization", TOKEN),
            ("courier-signing-secret", secret.as_str()),
        ];
        let a = post(&c.prefixed(target), &headers, body).await;
        assert_eq!(a.status, 202, "{}", a.text());
        events.push(event);
    }
    events
}

/// Which of the marker, the token and the secret some file under `dir` holds.
fn found_in_files(dir: &Path) -> Vec<String> {
    let secret = secret();
    files_holding(dir, &[MARKER, TOKEN.trim_start_matches("Bearer "), secret.as_str()])
}

/// `needle in path` for each of `needles` some file under `dir` holds (read byte for byte).
pub(crate) fn files_holding(dir: &Path, needles: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            for needle in needles {
                if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    found.push(format!("{needle} in {}", path.display()));
                }
            }
        }
    }
    found
}

/// The receiver saw each of `events` once, with the body, the token and a signature made
/// with the per-message secret.
fn assert_intact(rx: &Receiver, events: &[String]) {
    let seen = rx.seen();
    assert_eq!(seen.len(), events.len(), "each message once");
    for s in &seen {
        let event = s.header("webhook-id").unwrap();
        assert!(events.contains(&event), "{event}");
        let body = String::from_utf8_lossy(&s.body).to_string();
        assert!(body.contains(MARKER), "{body}");
        assert_eq!(s.header("authorization").as_deref(), Some(TOKEN));
        let ts = s.header("webhook-timestamp").unwrap();
        let mut mac = Hmac::<Sha256>::new_from_slice(SECRET_BYTES).unwrap();
        mac.update(format!("{event}.{ts}.{body}").as_bytes());
        let expected = format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
        );
        assert_eq!(
            s.header("webhook-signature").unwrap(),
            expected,
            "signed with the message's secret"
        );
    }
}

/// The receiver comes up on `down`; once `c` counts every one of `events` delivered (after
/// that it sends nothing more for them), each arrived once, whole.
async fn delivered_intact(c: &Courier, down: std::net::SocketAddr, events: &[String]) {
    let rx = Receiver::start_on(down).await;
    rx.wait_for(events.len()).await;
    eventually("every message delivered", || async {
        let page = get(&c.admin_url("/deliveries?state=delivered&limit=100")).await.json();
        (page["items"].as_array().unwrap().len() == events.len()).then_some(())
    })
    .await;
    assert_intact(&rx, events);
}

async fn ready_keys(c: &Courier) -> serde_json::Value {
    let ready = get(&c.admin_url("/readyz")).await;
    assert_eq!(ready.status, 200, "{}", ready.text());
    ready.json()["store_keys"].clone()
}

#[tokio::test]
async fn sealed_messages_leave_no_secret_in_any_file_and_deliver_after_a_restart() {
    let down = dead_addr();
    let target = format!("http://{down}/hook");
    let dir = tempfile::tempdir().unwrap();

    // The control: stored plain, the same search finds all three in the files (through
    // RocksDB's compression), so finding none below means they are sealed.
    std::fs::create_dir_all(dir.path().join("plain")).unwrap();
    let plain = Courier::start(&dir.path().join("plain"), RETRY);
    post_marked(&plain, &target, 20, "plain-").await;
    let mut plain = plain;
    assert!(plain.signal_and_wait("TERM").success());
    let found = found_in_files(&plain.data_dir);
    for needle in [MARKER, "APP-TOKEN", "whsec_"] {
        assert!(
            found.iter().any(|f| f.starts_with(needle)),
            "{needle} not found plain: {found:?}"
        );
    }

    let key = generate_key(dir.path(), "store.key");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the generated key file is the owner's only");
    let sealed_dir = dir.path().join("sealed");
    std::fs::create_dir_all(&sealed_dir).unwrap();
    let mut c = Courier::start(&sealed_dir, &sealed_with(&[&key]));
    let keys = ready_keys(&c).await;
    let id = keys["sealing"].as_str().unwrap().to_string();
    assert_eq!(keys["in_data"], serde_json::json!([id]));
    let events = post_marked(&c, &target, 20, "evt-").await;
    assert!(c.signal_and_wait("TERM").success());
    assert_eq!(found_in_files(&c.data_dir), Vec::<String>::new());

    // A wrong key: one line naming the key the data needs; nothing changes.
    let wrong = generate_key(dir.path(), "wrong.key");
    std::fs::write(&c.config_path, sealed_with(&[&wrong])).unwrap();
    let before = snapshot(&c.data_dir);
    let line = refused_start(&c.config_path, &c.data_dir).await;
    assert!(line.contains(&format!("sealed with store key {id}")), "{line}");
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        before == snapshot(&c.data_dir),
        "the refused start changed a file of the data dir"
    );

    // The right key: every message arrives whole, signed with its own secret.
    std::fs::write(&c.config_path, sealed_with(&[&key])).unwrap();
    c.restart();
    delivered_intact(&c, down, &events).await;
}

#[tokio::test]
async fn bad_key_files_stop_the_start_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let good = generate_key(d, "good.key");
    let open = d.join("open.key");
    std::fs::copy(&good, &open).unwrap();
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let short = d.join("short.key");
    std::fs::write(&short, "c2hvcnQ=\n").unwrap();
    std::fs::set_permissions(&short, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let config = d.join("courier.toml");
    let data = d.join("data");
    for (file, why) in [
        (d.join("absent.key"), "no such file"),
        (open, "is readable by group or others (mode 0644)"),
        (short, "holds 5 bytes, not 32"),
    ] {
        std::fs::write(&config, sealed_with(&[&good, &file])).unwrap();
        let line = refused_start(&config, &data).await;
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(
            line.contains(&format!("store.encryption_key_files: {}: {why}", file.display())),
            "{line}"
        );
        let checked = courier_cli(&["check-config", "--config", &config.display().to_string()], &[], "").await;
        assert_eq!(checked.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&checked.stderr).contains(why));
    }
    assert!(!data.exists(), "nothing was made");

    // A good pair: check-config names each file's key id, the first sealing.
    let other = generate_key(d, "other.key");
    std::fs::write(&config, sealed_with(&[&good, &other])).unwrap();
    let checked = courier_cli(&["check-config", "--config", &config.display().to_string()], &[], "").await;
    let text = String::from_utf8_lossy(&checked.stdout).to_string();
    assert!(checked.status.success(), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("store keys: "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("seals with ") && line.contains(&format!("({})", good.display())),
        "{line}"
    );
    assert!(
        line.contains("also opens ") && line.contains(&format!("({})", other.display())),
        "{line}"
    );

    // The same files named by the environment variable instead of the file.
    std::fs::write(&config, RETRY).unwrap();
    let files = format!("{},{}", good.display(), other.display());
    let env = [("COURIER_STORE_ENCRYPTION_KEY_FILES", files.as_str())];
    let checked = courier_cli(&["check-config", "--config", &config.display().to_string()], &env, "").await;
    let text = String::from_utf8_lossy(&checked.stdout).to_string();
    assert!(checked.status.success(), "{text}");
    assert!(text.lines().any(|l| l == line), "{text}");
}

#[tokio::test]
async fn a_rotated_key_seals_new_messages_and_rekey_lets_the_old_one_go() {
    let down = dead_addr();
    let target = format!("http://{down}/hook");
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (generate_key(dir.path(), "old.key"), generate_key(dir.path(), "new.key"));
    let mut c = Courier::start(dir.path(), &sealed_with(&[&old]));
    let old_id = ready_keys(&c).await["sealing"].as_str().unwrap().to_string();
    let mut events = post_marked(&c, &target, 5, "before-").await;
    assert!(c.signal_and_wait("TERM").success());

    // The new key first, the old one still listed: both open, the new one seals.
    std::fs::write(&c.config_path, sealed_with(&[&new, &old])).unwrap();
    c.restart();
    let keys = ready_keys(&c).await;
    let new_id = keys["sealing"].as_str().unwrap().to_string();
    assert_eq!(keys["configured"], serde_json::json!([new_id, old_id]));
    assert_eq!(keys["in_data"], serde_json::json!([old_id, new_id]));
    events.extend(post_marked(&c, &target, 5, "after-").await);

    // check-config reads the running courier's data dir: the old key cannot go yet.
    let (config, data) = (c.config_path.display().to_string(), c.data_dir.display().to_string());
    let only_new = dir.path().join("only-new.toml");
    std::fs::write(&only_new, sealed_with(&[&new])).unwrap();
    let only_new = only_new.display().to_string();
    let check = [
        "check-config",
        "--config",
        only_new.as_str(),
        "--data-dir",
        data.as_str(),
    ];
    let out = courier_cli(&check, &[], "").await;
    assert_eq!(out.status.code(), Some(2), "{}", printed(&out));
    assert!(
        printed(&out).contains(&format!("sealed with store key {old_id}")),
        "{}",
        printed(&out)
    );

    // Rekey is offline: a running courier's data dir is refused.
    let rekey = [
        "store",
        "rekey",
        "--config",
        config.as_str(),
        "--data-dir",
        data.as_str(),
    ];
    let out = courier_cli(&rekey, &[], "").await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by a running courier"));
    assert!(c.signal_and_wait("TERM").success());
    let out = courier_cli(&rekey, &[], "").await;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains(&format!(
            "rekey: 5 payloads sealed again with store key {new_id}, 5 were already"
        )),
        "{text}"
    );

    // The old key file can go: the new one alone opens everything.
    let out = courier_cli(&check, &[], "").await;
    assert!(out.status.success(), "{}", printed(&out));
    let line = format!("store data: {data} holds payloads sealed with: {new_id}");
    assert!(printed(&out).contains(&line), "{}", printed(&out));
    std::fs::write(&c.config_path, sealed_with(&[&new])).unwrap();
    c.restart();
    assert_eq!(ready_keys(&c).await["in_data"], serde_json::json!([new_id]));
    delivered_intact(&c, down, &events).await;

    // Off again: only through `rekey --to-plain`, then without keys.
    assert!(c.signal_and_wait("TERM").success());
    std::fs::write(&c.config_path, RETRY).unwrap();
    let line = refused_start(&c.config_path, &c.data_dir).await;
    assert!(line.contains("rekey --to-plain"), "{line}");
    std::fs::write(&c.config_path, sealed_with(&[&new])).unwrap();
    let to_plain = [&rekey[..], &["--to-plain"]].concat();
    let out = courier_cli(&to_plain, &[], "").await;
    assert!(out.status.success(), "{}", printed(&out));
    std::fs::write(&c.config_path, RETRY).unwrap();
    c.restart();
    assert_eq!(ready_keys(&c).await["in_data"], serde_json::json!([]));
}

#[tokio::test]
async fn a_drained_message_is_sealed_by_the_peer_with_its_own_key() {
    let down = dead_addr();
    let target = format!("http://{down}/hook");
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (key_a, key_b) = (generate_key(dir_a.path(), "a.key"), generate_key(dir_b.path(), "b.key"));
    let a_config = format!(
        "{}[drain]\ntoken = \"tier-token\"\n",
        sealed_with(&[&key_a])
            .replace("base_delay = \"100ms\"", "base_delay = \"1h\"")
            .replace("max_delay = \"500ms\"", "max_delay = \"1h\"")
    );
    let mut a = Courier::start(dir_a.path(), &a_config);
    let events = post_marked(&a, &target, 20, "evt-").await;
    assert!(a.signal_and_wait("TERM").success());

    let mut b = Courier::start(
        dir_b.path(),
        &format!("ingress_token = \"tier-token\"\n{}", sealed_with(&[&key_b])),
    );
    let out = drain(&a.config_path, &a.data_dir, &format!("http://{}", b.ingress), &[]).await;
    assert!(out.status.success(), "{}", printed(&out));
    assert!(printed(&out).contains("20 of 20 handed off"), "{}", printed(&out));
    // The peer's files hold none of it either: it sealed what it took with its own key.
    assert!(b.signal_and_wait("TERM").success());
    assert_eq!(found_in_files(&b.data_dir), Vec::<String>::new());

    b.restart();
    delivered_intact(&b, down, &events).await;
}
