//! The store's format marker: written at first open, a store from before it marked, and a
//! newer one refused before anything is written.

use super::*;

fn open_at(path: &std::path::Path) -> Result<Store, StoreError> {
    Store::open(path, StoreOptions::default())
}

fn marker(store: &Store) -> Option<Vec<u8>> {
    store.db.get_cf(store.cf(keys::META), keys::FORMAT).unwrap()
}

/// Every file of the data dir with its length and contents.
fn files(path: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut all: Vec<(String, Vec<u8>)> = std::fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().is_file())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    all.sort();
    all
}

#[test]
fn a_store_is_marked_with_its_format_at_first_open_and_one_unmarked_or_older_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open_at(&path).unwrap();
    assert_eq!(
        marker(&store),
        Some(crate::store::format::FORMAT.to_string().into_bytes())
    );
    // As a store from before the marker: opened again, it is marked (and reads as before).
    store.db.delete_cf(store.cf(keys::META), keys::FORMAT).unwrap();
    store.close();
    drop(store);
    let mut store = open_at(&path).unwrap();
    let current = Some(crate::store::format::FORMAT.to_string().into_bytes());
    assert_eq!(marker(&store), current);
    // A store of format 1 (every attempt in `history`): opened, it is this courier's format
    // from then on, as the records it writes are.
    for older in ["1", "2"] {
        store.db.put_cf(store.cf(keys::META), keys::FORMAT, older).unwrap();
        store.close();
        drop(store);
        store = open_at(&path).unwrap();
        assert_eq!(marker(&store), current, "format {older}");
    }
}

#[test]
fn a_store_a_newer_courier_wrote_is_refused_naming_both_formats_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open_at(&path).unwrap();
    let newer = crate::store::format::FORMAT + 1;
    store
        .db
        .put_cf(store.cf(keys::META), keys::FORMAT, newer.to_string())
        .unwrap();
    store.close();
    drop(store);
    let before = files(&path);
    let err = open_at(&path).unwrap_err();
    assert_eq!(err.code(), "store_format_newer");
    let line = err.to_string();
    assert!(
        line.contains(&format!("store format {newer}"))
            && line.contains(&format!("reads format {}", crate::store::format::FORMAT))
            && line.contains("nothing was changed"),
        "{line}"
    );
    let after = files(&path);
    let shown = |f: &[(String, Vec<u8>)]| {
        f.iter()
            .map(|(n, b)| format!("{n} ({} B)", b.len()))
            .collect::<Vec<_>>()
    };
    assert!(
        after == before,
        "a refused start changed the data dir: {:?} -> {:?}",
        shown(&before),
        shown(&after)
    );
    // `check-config` reads it without opening the store for writing, and says the same.
    assert_eq!(keys_in_data_dir(&path).unwrap_err().code(), "store_format_newer");
}

#[test]
fn a_marker_that_is_not_a_number_is_a_corrupt_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open_at(&path).unwrap();
    store.db.put_cf(store.cf(keys::META), keys::FORMAT, "two").unwrap();
    store.close();
    drop(store);
    assert_eq!(open_at(&path).unwrap_err().code(), "corrupt_record");
}
