//! Operator changes: replay, listing, delete, endpoint state, and that they are synced.

use std::collections::HashMap;

use super::*;

#[tokio::test]
async fn dead_messages_replay_with_attempts_reset() {
    let (_d, store) = open();
    store.accept(message("dlv_a", "e", 100)).await.unwrap();
    claim(&store, "dlv_a");
    store
        .finish_attempt(
            "dlv_a",
            &attempt(410),
            Transition::Dead(DeadReason::PermanentStatus),
            150,
        )
        .unwrap();
    assert_eq!(
        store.counts().unwrap(),
        Counts {
            open: 0,
            delivered: 0,
            dead: 1,
            handed_off: 0
        }
    );
    assert_eq!(store.replay("dlv_a", 1_000, |_| 9_000).unwrap(), Some(true));
    let rec = store.message("dlv_a").unwrap().unwrap();
    assert_eq!(
        (rec.state, rec.attempts, rec.give_up_at_ms, rec.dead_reason),
        (State::Pending, 0, 9_000, None)
    );
    assert_eq!(
        store.replay("dlv_a", 1_000, |_| 9_000).unwrap(),
        Some(false),
        "not dead any more"
    );
    assert_eq!(store.replay("dlv_nope", 1_000, |_| 9_000).unwrap(), None);
    claim(&store, "dlv_a");
    store
        .finish_attempt("dlv_a", &attempt(200), Transition::Delivered, 1_100)
        .unwrap();
    assert_eq!(
        store.history_of("dlv_a").unwrap().len(),
        2,
        "history survives the replay"
    );
}

#[tokio::test]
async fn listing_pages_by_state_and_endpoint() {
    let (_d, store) = open();
    for i in 0..25 {
        let mut m = message(&format!("dlv_{i:02}"), &format!("e{i}"), 100);
        if i % 2 == 0 {
            m.record.endpoint = "even".into();
        }
        store.accept(m).await.unwrap();
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store
            .list(
                &ListFilter {
                    state: Some(State::Pending),
                    ..Default::default()
                },
                10,
                cursor.as_deref(),
            )
            .unwrap();
        seen.extend(page.items.iter().map(|r| r.id.clone()));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen.len(), 25);
    assert!(seen.windows(2).all(|w| w[0] < w[1]));
    let even = store
        .list(
            &ListFilter {
                endpoint: Some("even".into()),
                ..Default::default()
            },
            100,
            None,
        )
        .unwrap();
    assert_eq!(even.items.len(), 13);
    assert!(even.next_cursor.is_none());
    let dead = store
        .list(
            &ListFilter {
                state: Some(State::Dead),
                ..Default::default()
            },
            10,
            None,
        )
        .unwrap();
    assert!(dead.items.is_empty());
    let per_ep: HashMap<_, _> = store.open_per_endpoint().unwrap().into_iter().collect();
    assert_eq!(per_ep.get("even"), Some(&13));
}

#[tokio::test]
async fn delete_removes_everything_and_frees_the_event_id() {
    let (_d, store) = open();
    store.accept(message("dlv_a", "e", 100)).await.unwrap();
    assert!(store.delete("dlv_a", 100).unwrap());
    assert!(!store.delete("dlv_a", 100).unwrap());
    assert!(store.message("dlv_a").unwrap().is_none());
    assert!(due_ids(&store, 1_000).is_empty());
    assert_eq!(store.counts().unwrap().open, 0);
    assert_eq!(store.accept(message("dlv_b", "e", 100)).await.unwrap(), Accepted::New);
}

#[tokio::test]
async fn endpoint_state_persists() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    {
        let store = Store::open(&path, StoreOptions::default()).unwrap();
        store
            .put_endpoint(
                "https://r.example/h",
                &EndpointRecord {
                    paused: true,
                    streak: 3,
                    last_status: Some(410),
                },
                5,
            )
            .unwrap();
        store.close();
    }
    let store = Store::open(&path, StoreOptions::default()).unwrap();
    assert_eq!(
        store.endpoints().unwrap(),
        vec![(
            "https://r.example/h".to_string(),
            EndpointRecord {
                paused: true,
                streak: 3,
                last_status: Some(410)
            }
        )]
    );
}

/// Findings: operator changes (delete, replay, pause) were acknowledged after unsynced
/// writes, so a power loss could bring back a message deleted with a 204; and a bulk
/// replay wrote one message at a time.
#[tokio::test]
async fn operator_changes_are_synced_and_bulk_replay_writes_a_page_at_a_time() {
    let (_d, store) = open();
    for i in 0..600 {
        let id = format!("dlv_{i:04}");
        store.accept(message(&id, &format!("e{i}"), 100)).await.unwrap();
        claim(&store, &id);
        store
            .finish_attempt(&id, &attempt(410), Transition::Dead(DeadReason::PermanentStatus), 150)
            .unwrap();
    }
    let before = store.operator_syncs();
    assert_eq!(
        store.replay_dead(&ListFilter::default(), 1_000, |_| 9_000).unwrap(),
        600
    );
    assert_eq!(store.operator_syncs() - before, 2, "one synced write per page of 500");
    let counts = store.counts().unwrap();
    assert_eq!((counts.open, counts.dead), (600, 0));
    assert_eq!(due_ids(&store, 1_000).len(), 600);

    let before = store.operator_syncs();
    assert_eq!(store.replay("dlv_0000", 1_000, |_| 9_000).unwrap(), Some(false));
    assert!(store.delete("dlv_0001", 1_000).unwrap());
    store
        .put_endpoint_synced("https://r.example/h", &EndpointRecord::default(), 5)
        .unwrap();
    assert_eq!(
        store.operator_syncs() - before,
        2,
        "the delete and the pause are synced"
    );
}

/// Finding: per-endpoint state grew with every endpoint ever seen: the `endpoints` family
/// was never deleted from, and a zero `open/<endpoint>` counter stayed forever.
#[tokio::test]
async fn endpoint_state_and_counters_shrink_back_to_nothing() {
    let (_d, store) = open();
    let failing = EndpointRecord {
        paused: false,
        streak: 2,
        last_status: Some(410),
    };
    store.put_endpoint("https://a.example/h", &failing, 5).unwrap();
    store.put_endpoint_synced("https://b.example/h", &failing, 5).unwrap();
    assert_eq!(store.endpoints().unwrap().len(), 2);
    // Back to nothing to remember: no record at all.
    store
        .put_endpoint("https://a.example/h", &EndpointRecord::default(), 5)
        .unwrap();
    store
        .put_endpoint_synced("https://b.example/h", &EndpointRecord::default(), 5)
        .unwrap();
    assert!(store.endpoints().unwrap().is_empty());
    store.put_endpoint("https://c.example/h", &failing, 5).unwrap();
    store
        .put_endpoint("https://c.example/h", &EndpointRecord::default(), 5)
        .unwrap();
    assert!(store.endpoints().unwrap().is_empty());

    // A message's endpoint counter: 1 while open, 0 once finished, then removed.
    store.accept(message("dlv_a", "e1", 100)).await.unwrap();
    store.accept(message("dlv_b", "e2", 100)).await.unwrap();
    claim(&store, "dlv_a");
    store
        .finish_attempt("dlv_a", &attempt(200), Transition::Delivered, 200)
        .unwrap();
    assert_eq!(store.drop_zero_counters().unwrap(), 0, "still one open");
    claim(&store, "dlv_b");
    store
        .finish_attempt("dlv_b", &attempt(200), Transition::Delivered, 200)
        .unwrap();
    let meta_keys = |store: &Store| {
        store
            .db
            .iterator_cf(store.cf(keys::META), rocksdb::IteratorMode::Start)
            .filter(|kv| kv.as_ref().unwrap().0.starts_with(keys::COUNT_OPEN_ENDPOINT))
            .count()
    };
    assert_eq!(meta_keys(&store), 1);
    assert_eq!(store.drop_zero_counters().unwrap(), 1);
    assert_eq!(meta_keys(&store), 0, "no key left for an endpoint with nothing open");
    // The next message to it counts from nothing.
    store.accept(message("dlv_c", "e3", 300)).await.unwrap();
    let open: Vec<(String, u64)> = store.open_per_endpoint().unwrap();
    assert_eq!(open, vec![("https://r.example/h".to_string(), 1)]);
}

#[tokio::test]
async fn open_endpoints_page_after_a_cursor_with_a_prefix() {
    let (_d, store) = open();
    for (i, ep) in [
        "https://a.example/1",
        "https://b.example/1",
        "https://b.example/2",
        "https://c.example/1",
    ]
    .iter()
    .enumerate()
    {
        let mut m = message(&format!("dlv_{i}"), &format!("e{i}"), 100);
        m.record.endpoint = ep.to_string();
        store.accept(m).await.unwrap();
    }
    let keys = |v: Vec<(String, u64)>| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    let (page, more) = store.open_endpoints_page(None, "", 2).unwrap();
    assert_eq!(keys(page), ["https://a.example/1", "https://b.example/1"]);
    assert_eq!(
        more.as_deref(),
        Some("https://b.example/1"),
        "stopped after the last returned"
    );
    let (page, more) = store.open_endpoints_page(Some("https://b.example/1"), "", 10).unwrap();
    assert_eq!(keys(page), ["https://b.example/2", "https://c.example/1"]);
    assert!(more.is_none());
    let (page, _) = store.open_endpoints_page(None, "https://b.", 10).unwrap();
    assert_eq!(keys(page), ["https://b.example/1", "https://b.example/2"]);
    assert_eq!(store.open_of_endpoint("https://c.example/1").unwrap(), 1);
    assert_eq!(store.open_of_endpoint("https://nowhere.example/").unwrap(), 0);
}
