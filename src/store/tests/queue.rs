//! The due queue: scan order and bounds, stale claims, the due floor, and parking.

use super::*;

#[tokio::test]
async fn scan_sees_only_what_is_due_in_due_order() {
    let (_d, store) = open();
    store.accept(message("dlv_late", "e1", 300)).await.unwrap();
    store.accept(message("dlv_early", "e2", 100)).await.unwrap();
    store.accept(message("dlv_mid", "e3", 200)).await.unwrap();
    assert_eq!(due_ids(&store, 250), vec!["dlv_early", "dlv_mid"]);
    assert_eq!(
        store.scan_due(250, 100, None, |_| ScanStep::Continue).unwrap().0,
        ScanEnd::Exhausted { next_due_ms: Some(300) }
    );
    assert_eq!(
        store.scan_due(250, 1, None, |_| ScanStep::Continue).unwrap().0,
        ScanEnd::Cut { held_until: None }
    );
    assert_eq!(store.next_due_ms().unwrap(), Some(100));
}

#[tokio::test]
async fn stale_due_entries_are_dropped_not_claimed() {
    let (_d, store) = open();
    store.accept(message("dlv_a", "e", 100)).await.unwrap();
    let entry = DueEntry {
        due_ms: 99,
        id: "dlv_a".into(),
        routing: Routing {
            host: "h".into(),
            endpoint: "e".into(),
        },
    };
    assert!(matches!(store.lease_many(&[entry], 0)[0], Ok(None)));
    let gone = DueEntry {
        due_ms: 100,
        id: "dlv_missing".into(),
        routing: Routing {
            host: "h".into(),
            endpoint: "e".into(),
        },
    };
    assert!(matches!(store.lease_many(&[gone], 0)[0], Ok(None)));
}

#[tokio::test]
async fn the_due_floor_skips_consumed_history_but_never_hides_a_new_entry() {
    let (_d, store) = open();
    store.accept(message("dlv_a", "e1", 100)).await.unwrap();
    claim(&store, "dlv_a");
    let (_, mark) = store.scan_due(1_000, 10, None, |_| ScanStep::Continue).unwrap();
    store.raise_due_floor(mark, 1_000);
    assert_eq!(store.due_floor(), 1_000);
    // A write with an earlier due time lowers the floor once it is visible.
    store.accept(message("dlv_b", "e2", 500)).await.unwrap();
    assert_eq!(store.due_floor(), 500);
    assert_eq!(due_ids(&store, 600), vec!["dlv_b"]);
    // A pass that started before a write cannot raise the floor over it.
    claim(&store, "dlv_b");
    let (_, stale) = store.scan_due(600, 10, None, |_| ScanStep::Continue).unwrap();
    store.accept(message("dlv_c", "e3", 550)).await.unwrap();
    store.raise_due_floor(stale, 2_000);
    assert_eq!(store.due_floor(), 550);
    assert_eq!(due_ids(&store, 600), vec!["dlv_c"]);
    // A retry scheduled below the floor lowers it too.
    claim(&store, "dlv_c");
    let (_, mark) = store.scan_due(800, 10, None, |_| ScanStep::Continue).unwrap();
    store.raise_due_floor(mark, 900);
    store
        .finish_attempt("dlv_b", &attempt(503), Transition::RetryAt(700), 800)
        .unwrap();
    assert_eq!(due_ids(&store, 800), vec!["dlv_b"]);
}

#[tokio::test]
async fn a_scan_can_continue_after_an_entry() {
    let (_d, store) = open();
    for (i, due) in [100u64, 200, 300].iter().enumerate() {
        store
            .accept(message(&format!("dlv_{i}"), &format!("e{i}"), *due))
            .await
            .unwrap();
    }
    let mut ids = Vec::new();
    store
        .scan_due(1_000, 10, Some((200, "dlv_1")), |e| {
            ids.push(e.id);
            ScanStep::Continue
        })
        .unwrap();
    assert_eq!(ids, vec!["dlv_2"]);
}

#[tokio::test]
async fn paused_endpoint_messages_park_and_come_back() {
    let (_d, store) = open();
    store.accept(message("dlv_a", "e1", 100)).await.unwrap();
    store.accept(message("dlv_b", "e2", 100)).await.unwrap();
    store
        .scan_due(100, 10, None, |e| {
            store.park(&e).unwrap();
            ScanStep::Continue
        })
        .unwrap();
    assert!(due_ids(&store, 1_000).is_empty());
    assert_eq!(store.unpark_endpoint("https://r.example/h", 500).unwrap(), 2);
    assert_eq!(due_ids(&store, 500), vec!["dlv_a", "dlv_b"]);
}

/// A resume moves parked messages in batches, each continuing after the previous one: every
/// message comes back exactly once. (Why batches continue rather than seek from the start,
/// which was quadratic, is a matter for the benchmark's backlog drain, not a test.)
#[tokio::test]
async fn a_resume_moves_every_parked_message_over_several_batches() {
    let (_d, store) = open();
    let n = 2_500;
    for i in 0..n {
        store
            .accept(message(&format!("dlv_{i:05}"), &format!("e{i}"), 100))
            .await
            .unwrap();
    }
    let mut entries = Vec::new();
    store
        .scan_due(100, n, None, |e| {
            entries.push(e);
            ScanStep::Continue
        })
        .unwrap();
    store.park_many(&entries, 0).unwrap();
    assert!(due_ids(&store, 1_000).is_empty());
    assert_eq!(store.unpark_endpoint("https://r.example/h", 500).unwrap(), n);
    let mut due = 0;
    store
        .scan_due(500, n + 1, None, |_| {
            due += 1;
            ScanStep::Continue
        })
        .unwrap();
    assert_eq!(due, n);
    assert!(store.parked_endpoints().unwrap().is_empty(), "nothing left parked");
}

/// The floor can rise within one millisecond (a resume makes a whole backlog due in one),
/// and a message re-queued there with an older id brings it back down.
#[tokio::test]
async fn the_floor_rises_within_a_millisecond_and_a_requeue_there_lowers_it() {
    let (_d, store) = open();
    for i in 0..3 {
        store
            .accept(message(&format!("dlv_{i}"), &format!("e{i}"), 100))
            .await
            .unwrap();
    }
    let mark = store.due_floor.mark();
    store.raise_due_floor_to_key(mark, 100, "dlv_2");
    assert_eq!(
        due_ids(&store, 1_000),
        vec!["dlv_2"],
        "the walk starts at the key floor"
    );
    store.due_floor.wrote(100);
    assert_eq!(due_ids(&store, 1_000), vec!["dlv_0", "dlv_1", "dlv_2"]);
}
