//! `courier store check`, the offline audit of a stopped courier's store (the power-loss
//! tests run it after every cut): a consistent store passes with a summary; a store that
//! lost an index entry fails, naming the message; a data dir a courier runs on, or one with
//! no store, is refused with one line.

use courier::store::keys;

use crate::support::*;

/// Retries an hour away: a refused message stays pending for the whole test.
const HELD: &str = "[retry]\nbase_delay = \"1h\"\nmax_attempts = 1000\ngive_up_after = \"2h\"\n";

/// Posts one message for `target`; its delivery id.
async fn accept(c: &Courier, target: &str, event: &str) -> String {
    let a = post(&c.prefixed(target), &[("webhook-id", event)], "{}").await;
    assert_eq!(a.status, 202, "{}", a.text());
    a.json()["id"].as_str().unwrap().to_string()
}

/// Deletes `id`'s entry in the state index of the stopped store at `data_dir`, as a write
/// lost apart from its record would leave it.
fn drop_state_index(data_dir: &std::path::Path, id: &str) {
    let cfs = keys::CF_NAMES.iter().chain(std::iter::once(&"default"));
    let db = rocksdb::DB::open_cf(&rocksdb::Options::default(), data_dir, cfs).unwrap();
    let cf = db.cf_handle(keys::STATES).unwrap();
    db.delete_cf(cf, keys::state_key(b'p', id)).unwrap();
}

fn out_text(out: &std::process::Output) -> (String, String) {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (text(&out.stdout), text(&out.stderr))
}

#[tokio::test]
async fn store_check_passes_a_consistent_store_names_each_problem_and_refuses_a_running_courier() {
    let rx = Receiver::scripted(|_, seen| Reply::status(if seen.path == "/ok" { 200 } else { 503 })).await;
    let dir = tempfile::tempdir().unwrap();
    let mut c = Courier::start(dir.path(), HELD);
    for n in 0..3 {
        let id = accept(&c, &rx.url("/ok"), &format!("ok-{n}")).await;
        wait_state(&c, &id, "delivered").await;
    }
    let mut held = Vec::new();
    for n in 0..2 {
        held.push(accept(&c, &rx.url("/held"), &format!("held-{n}")).await);
    }
    rx.wait_for(5).await;
    let (config, data) = (c.config_path.display().to_string(), c.data_dir.display().to_string());
    let check = [
        "store",
        "check",
        "--config",
        config.as_str(),
        "--data-dir",
        data.as_str(),
    ];

    // A store in use changes under the check: refused, with one line.
    let out = courier_cli(&check, &[], "").await;
    let (stdout, stderr) = out_text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_eq!((stdout.as_str(), stderr.lines().count()), ("", 1), "{stderr}");
    assert!(stderr.contains("in use by a running courier: stop it"), "{stderr}");

    // Stopped: consistent, with what it holds.
    assert!(c.signal_and_wait("TERM").success());
    let out = courier_cli(&check, &[], "").await;
    let (stdout, stderr) = out_text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert_eq!(
        stdout,
        format!(
            "store check: {data} is consistent; 5 messages: 2 open (0 in flight, which the next start \
             queues again), 3 delivered, 0 dead, 0 handed off\n"
        )
    );

    // An index entry lost: the message is named, exit 1.
    drop_state_index(&c.data_dir, &held[0]);
    let out = courier_cli(&check, &[], "").await;
    let (stdout, stderr) = out_text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(
        lines[0],
        format!("problem: {}: state Pending but state index []", held[0])
    );
    assert!(
        lines[1].starts_with(&format!("store check: 1 problem in {data}; 5 messages")),
        "{stdout}"
    );

    // No store there: refused, nothing made.
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let empty = empty.display().to_string();
    let out = courier_cli(&["store", "check", "--config", &config, "--data-dir", &empty], &[], "").await;
    let (stdout, stderr) = out_text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stderr.contains(&format!("no store in {empty}")), "{stderr}");
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0, "the check made files");
}
