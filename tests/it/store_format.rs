//! The store's format marker, from outside: a data dir that a newer courier marked with a
//! newer format (written here with RocksDB itself, as that courier would) is refused at
//! start with one line naming both formats, and the refused start changes no file.

use crate::support::*;

/// Marks the stopped courier's data dir in `dir` as a newer courier's.
fn mark_newer(dir: &std::path::Path, format: &str) {
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(false);
    let mut names: Vec<&str> = courier::store::keys::CF_NAMES.to_vec();
    names.push(rocksdb::DEFAULT_COLUMN_FAMILY_NAME);
    let db = rocksdb::DB::open_cf(&opts, dir, names).unwrap();
    let meta = db.cf_handle(courier::store::keys::META).unwrap();
    db.put_cf(meta, courier::store::keys::FORMAT, format).unwrap();
    db.flush_cf(meta).unwrap();
}

#[tokio::test]
async fn a_data_dir_a_newer_courier_wrote_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Courier::start(dir.path(), "");
    assert!(c.signal_and_wait("TERM").success());
    mark_newer(&c.data_dir, "7");

    let before = snapshot(&c.data_dir);
    let line = refused_start(&c.config_path, &c.data_dir).await;
    assert!(
        line.contains("written by a newer courier (store format 7; this courier reads format 3")
            && line.contains("nothing was changed"),
        "{line}"
    );
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        before == snapshot(&c.data_dir),
        "the refused start changed a file of the data dir"
    );

    // `check-config` reads the data dir the same way, and says the same.
    let (config, data) = (c.config_path.display().to_string(), c.data_dir.display().to_string());
    let out = courier_cli(&["check-config", "--config", &config, "--data-dir", &data], &[], "").await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("store format 7"));
}
