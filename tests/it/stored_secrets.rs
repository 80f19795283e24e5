//! Secrets that must not reach the data dir or the admin API by a side door, black-box: a
//! pause alert's `alert_url` (a credential in its path) in no file of the data dir, a sealed
//! payload's size the same whether or not its body repeats its `Authorization`, and a
//! receiver that echoes its input leaving none of it in `last_error` or the history.

use std::path::Path;

use crate::sealing::{generate_key, sealed_with};
use crate::support::*;

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
