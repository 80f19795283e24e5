//! Endpoint records: read back one at a time, expired on their own stamp, paged.

use super::*;

fn failing(streak: u32) -> EndpointRecord {
    EndpointRecord {
        paused: false,
        streak,
        last_status: Some(410),
    }
}

#[test]
fn records_are_read_back_one_at_a_time_and_only_paused_ones_load_at_start() {
    let (_d, store) = open();
    let paused = EndpointRecord {
        paused: true,
        ..failing(5)
    };
    store
        .put_endpoints(&[("a".into(), failing(2)), ("p".into(), paused.clone())], 10, false)
        .unwrap();
    assert_eq!(store.endpoint("a").unwrap(), Some(failing(2)));
    assert_eq!(store.endpoint("nobody").unwrap(), None);
    assert_eq!(store.paused_endpoints().unwrap(), vec![("p".to_string(), paused)]);
}

/// Finding: records were deleted only when memory forgot their endpoint, so a record
/// whose endpoint memory had already let go of stayed for ever.
#[test]
fn records_expire_on_their_own_stamp_a_chunk_at_a_time_and_paused_ones_stay() {
    let (_d, store) = open();
    let n = 10_000; // more than two chunks
    let old: Vec<_> = (0..n).map(|i| (format!("old/{i:05}"), failing(1))).collect();
    store.put_endpoints(&old, 100, false).unwrap();
    store.put_endpoint("young", &failing(1), 500).unwrap();
    let paused = EndpointRecord {
        paused: true,
        ..failing(3)
    };
    store.put_endpoint("old/paused", &paused, 100).unwrap();
    let (mut removed, mut from, mut chunks) = (0, None, 0);
    loop {
        let (r, next) = store.expire_endpoints_chunk(from.as_deref(), 400).unwrap();
        removed += r;
        chunks += 1;
        match next {
            Some(k) => from = Some(k),
            None => break,
        }
    }
    assert_eq!(removed, n);
    assert!(chunks >= 3, "{chunks} chunks");
    let left: Vec<String> = store.endpoints().unwrap().into_iter().map(|(k, _)| k).collect();
    assert_eq!(left, ["old/paused", "young"]);
}

#[test]
fn a_page_of_records_starts_after_the_cursor_and_keeps_to_the_prefix() {
    let (_d, store) = open();
    let recs: Vec<_> = ["a/1", "a/2", "a/3", "b/1", "c/1"]
        .iter()
        .map(|k| (k.to_string(), failing(1)))
        .collect();
    store.put_endpoints(&recs, 1, false).unwrap();
    let keys = |(v, more): (Vec<(String, EndpointRecord)>, Option<String>)| {
        (v.into_iter().map(|e| e.0).collect::<Vec<_>>(), more.is_some())
    };
    assert_eq!(
        keys(store.endpoint_records_page(None, "", 2).unwrap()),
        (vec!["a/1".into(), "a/2".into()], true)
    );
    assert_eq!(
        keys(store.endpoint_records_page(Some("a/2"), "a/", 5).unwrap()),
        (vec!["a/3".into()], false)
    );
    assert_eq!(
        keys(store.endpoint_records_page(Some("a/9"), "", 5).unwrap()),
        (vec!["b/1".into(), "c/1".into()], false)
    );
    assert_eq!(
        keys(store.endpoint_records_page(None, "b/", 5).unwrap()),
        (vec!["b/1".into()], false)
    );
}
