//! Store tests on a temporary RocksDB: accept and dedupe, due order, claim and every
//! transition, recovery, parking, replay, listing, counters and retention.

use super::*;
use crate::model::SignatureScheme;

fn open() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        &dir.path().join("data"),
        StoreOptions {
            retention_ms: 1_000,
            dead_retention_ms: 5_000,
            ..Default::default()
        },
    )
    .unwrap();
    (dir, store)
}

/// A pending message due at `due` (shared with other modules' store-backed tests).
pub(crate) fn message(id: &str, event: &str, due: u64) -> NewMessage {
    NewMessage {
        record: MessageRecord {
            id: id.into(),
            event_id: event.into(),
            target: "https://r.example/h".into(),
            endpoint: "https://r.example/h".into(),
            host: "r.example:443".into(),
            state: State::Pending,
            attempts: 0,
            history_len: 0,
            max_attempts: 16,
            accepted_at_ms: due,
            next_attempt_at_ms: due,
            give_up_at_ms: due + 100_000,
            finished_at_ms: 0,
            dead_reason: None,
            last_status: None,
            last_error: None,
        },
        payload: Payload {
            method: "POST".into(),
            headers: vec![("content-type".into(), b"application/json".to_vec())],
            body: b"{}".to_vec(),
            scheme: Some(SignatureScheme::Standard),
            signing: SigningChoice::Default,
        },
    }
}

fn due_ids(store: &Store, now: u64) -> Vec<String> {
    let mut ids = Vec::new();
    store
        .scan_due(now, 1000, None, |e| {
            ids.push(e.id);
            ScanStep::Continue
        })
        .unwrap();
    ids
}

/// Claims a pending message as the scheduler would (shared with other modules' tests).
pub(crate) fn claim(store: &Store, id: &str) -> Claimed {
    let rec = store.message(id).unwrap().unwrap();
    let entry = DueEntry {
        due_ms: rec.next_attempt_at_ms,
        id: id.into(),
        routing: Routing {
            host: rec.host.clone(),
            endpoint: rec.endpoint.clone(),
        },
    };
    store.claim(&entry).unwrap().expect("claimable")
}

fn attempt(status: u16) -> AttemptRecord {
    AttemptRecord {
        at_ms: 1,
        status: Some(status),
        error: None,
        duration_ms: 3,
    }
}

#[tokio::test]
async fn accept_stores_and_dedupes_on_event_and_target() {
    let (_d, store) = open();
    assert_eq!(
        store.accept(message("dlv_a", "evt_1", 10)).await.unwrap(),
        Accepted::New
    );
    assert_eq!(
        store.accept(message("dlv_b", "evt_1", 11)).await.unwrap(),
        Accepted::Duplicate { id: "dlv_a".into() }
    );
    let mut other_target = message("dlv_c", "evt_1", 12);
    other_target.record.target = "https://other.example/h".into();
    assert_eq!(store.accept(other_target).await.unwrap(), Accepted::New);
    assert!(store.message("dlv_b").unwrap().is_none());
    assert_eq!(store.payload("dlv_a").unwrap().unwrap().body, b"{}");
    assert_eq!(store.counts().unwrap().open, 2);
}

#[tokio::test]
async fn concurrent_duplicates_store_exactly_one() {
    let (_d, store) = open();
    let store = Arc::new(store);
    let mut tasks = Vec::new();
    for i in 0..50 {
        let s = store.clone();
        tasks.push(tokio::spawn(async move {
            s.accept(message(&format!("dlv_{i:03}"), "evt_same", 5)).await.unwrap()
        }));
    }
    let mut new = 0;
    for t in tasks {
        if t.await.unwrap() == Accepted::New {
            new += 1;
        }
    }
    assert_eq!(new, 1);
    assert_eq!(store.counts().unwrap().open, 1);
}

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
        ScanEnd::Cut
    );
    assert_eq!(store.next_due_ms().unwrap(), Some(100));
}

#[tokio::test]
async fn claim_then_retry_reschedules_and_keeps_history() {
    let (_d, store) = open();
    store.accept(message("dlv_a", "e", 100)).await.unwrap();
    let c = claim(&store, "dlv_a");
    assert_eq!(c.record.state, State::InFlight);
    assert!(due_ids(&store, 1_000).is_empty(), "a claimed message leaves the queue");
    let rec = store
        .finish_attempt("dlv_a", &attempt(503), Transition::RetryAt(700), 150)
        .unwrap()
        .unwrap();
    assert_eq!(
        (rec.state, rec.attempts, rec.next_attempt_at_ms, rec.last_status),
        (State::Pending, 1, 700, Some(503))
    );
    assert_eq!(due_ids(&store, 699), Vec::<String>::new());
    assert_eq!(due_ids(&store, 700), vec!["dlv_a"]);
    claim(&store, "dlv_a");
    let rec = store
        .finish_attempt("dlv_a", &attempt(200), Transition::Delivered, 800)
        .unwrap()
        .unwrap();
    assert_eq!(
        (rec.state, rec.attempts, rec.finished_at_ms),
        (State::Delivered, 2, 800)
    );
    let h = store.history("dlv_a").unwrap();
    assert_eq!(
        h.iter().map(|a| a.status).collect::<Vec<_>>(),
        vec![Some(503), Some(200)]
    );
    assert_eq!(
        store.counts().unwrap(),
        Counts {
            open: 0,
            delivered: 1,
            dead: 0
        }
    );
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
    assert!(store.claim(&entry).unwrap().is_none());
    let gone = DueEntry {
        due_ms: 100,
        id: "dlv_missing".into(),
        routing: Routing {
            host: "h".into(),
            endpoint: "e".into(),
        },
    };
    assert!(store.claim(&gone).unwrap().is_none());
}

#[tokio::test]
async fn in_flight_messages_are_recovered_with_their_attempt_count() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    {
        let store = Store::open(&path, StoreOptions::default()).unwrap();
        store.accept(message("dlv_a", "e", 100)).await.unwrap();
        claim(&store, "dlv_a");
        store
            .finish_attempt("dlv_a", &attempt(500), Transition::RetryAt(200), 150)
            .unwrap();
        claim(&store, "dlv_a");
        // No close: as if killed mid-attempt.
    }
    let store = Store::open(&path, StoreOptions::default()).unwrap();
    assert_eq!(store.message("dlv_a").unwrap().unwrap().state, State::InFlight);
    assert_eq!(store.recover_in_flight(5_000).unwrap(), 1);
    let rec = store.message("dlv_a").unwrap().unwrap();
    assert_eq!(
        (rec.state, rec.attempts, rec.next_attempt_at_ms),
        (State::Pending, 1, 5_000)
    );
    assert_eq!(due_ids(&store, 5_000), vec!["dlv_a"]);
}

#[tokio::test]
async fn a_second_open_of_the_same_dir_is_refused_as_locked() {
    let (dir, _store) = open();
    let err = Store::open(&dir.path().join("data"), StoreOptions::default()).unwrap_err();
    assert!(matches!(err, StoreError::Locked(_)), "{err}");
    assert_eq!(err.code(), "data_dir_locked");
}

#[tokio::test]
async fn the_data_dir_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, _store) = open();
    let mode = std::fs::metadata(dir.path().join("data")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
}

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
            dead: 1
        }
    );
    assert_eq!(store.replay("dlv_a", 1_000, 9_000).unwrap(), Some(true));
    let rec = store.message("dlv_a").unwrap().unwrap();
    assert_eq!(
        (rec.state, rec.attempts, rec.give_up_at_ms, rec.dead_reason),
        (State::Pending, 0, 9_000, None)
    );
    assert_eq!(
        store.replay("dlv_a", 1_000, 9_000).unwrap(),
        Some(false),
        "not dead any more"
    );
    assert_eq!(store.replay("dlv_nope", 1_000, 9_000).unwrap(), None);
    claim(&store, "dlv_a");
    store
        .finish_attempt("dlv_a", &attempt(200), Transition::Delivered, 1_100)
        .unwrap();
    assert_eq!(store.history("dlv_a").unwrap().len(), 2, "history survives the replay");
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
    assert!(store.delete("dlv_a").unwrap());
    assert!(!store.delete("dlv_a").unwrap());
    assert!(store.message("dlv_a").unwrap().is_none());
    assert!(due_ids(&store, 1_000).is_empty());
    assert_eq!(store.counts().unwrap().open, 0);
    assert_eq!(store.accept(message("dlv_b", "e", 100)).await.unwrap(), Accepted::New);
}

#[tokio::test]
async fn retention_removes_finished_messages_when_their_time_comes() {
    let (_d, store) = open();
    store.accept(message("dlv_ok", "e1", 100)).await.unwrap();
    store.accept(message("dlv_dead", "e2", 100)).await.unwrap();
    store.accept(message("dlv_open", "e3", 100)).await.unwrap();
    claim(&store, "dlv_ok");
    store
        .finish_attempt("dlv_ok", &attempt(200), Transition::Delivered, 1_000)
        .unwrap();
    claim(&store, "dlv_dead");
    store
        .finish_attempt(
            "dlv_dead",
            &attempt(410),
            Transition::Dead(DeadReason::PermanentStatus),
            1_000,
        )
        .unwrap();
    // retention 1s, dead retention 5s (see open()).
    assert_eq!(store.sweep_expired(1_999, 100).unwrap(), 0);
    assert_eq!(store.sweep_expired(2_000, 100).unwrap(), 1);
    assert!(store.message("dlv_ok").unwrap().is_none());
    assert!(store.history("dlv_ok").unwrap().is_empty());
    assert!(store.message("dlv_dead").unwrap().is_some());
    assert_eq!(store.sweep_expired(6_000, 100).unwrap(), 1);
    assert!(store.message("dlv_dead").unwrap().is_none());
    assert!(
        store.message("dlv_open").unwrap().is_some(),
        "open messages never expire"
    );
    assert_eq!(
        store.counts().unwrap(),
        Counts {
            open: 1,
            delivered: 0,
            dead: 0
        }
    );
    // The event ids are free again once their messages are gone.
    assert_eq!(
        store.accept(message("dlv_again", "e1", 100)).await.unwrap(),
        Accepted::New
    );
}

#[tokio::test]
async fn oldest_open_comes_from_the_first_id() {
    let (_d, store) = open();
    assert_eq!(store.oldest_open_ms().unwrap(), None);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let old = crate::model::new_delivery_id(1_000, &mut rng);
    let new = crate::model::new_delivery_id(2_000, &mut rng);
    store.accept(message(&new, "e1", 2_000)).await.unwrap();
    store.accept(message(&old, "e2", 1_000)).await.unwrap();
    assert_eq!(store.oldest_open_ms().unwrap(), Some(1_000));
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

use rand::SeedableRng;
use std::collections::HashMap;

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
async fn attempts_finished_together_are_recorded_in_one_batch() {
    let (_d, store) = open();
    for (id, ev) in [
        ("dlv_a", "e1"),
        ("dlv_b", "e2"),
        ("dlv_c", "e3"),
        ("dlv_d", "e4"),
        ("dlv_e", "e5"),
    ] {
        let mut msg = message(id, ev, 100);
        if id == "dlv_e" {
            msg.record.endpoint = "https://other.example/h".into();
        }
        store.accept(msg).await.unwrap();
    }
    for id in ["dlv_a", "dlv_b", "dlv_c", "dlv_e"] {
        claim(&store, id);
    }
    // The scheduler has walked up to 100 (dlv_d, never claimed, is due there): a retry
    // earlier than that must lower the floor again or the scheduler would never see it.
    let (_, mark) = store.scan_due(100, 1000, None, |_| ScanStep::Continue).unwrap();
    store.raise_due_floor(mark, 100);
    let item = |id: &str, status, transition| FinishedAttempt {
        id: id.into(),
        attempt: attempt(status),
        transition,
        now_ms: 500,
    };
    let answers = store.finish_attempts(&[
        item("dlv_a", 200, Transition::Delivered),
        item("dlv_b", 410, Transition::Dead(DeadReason::PermanentStatus)),
        item("dlv_c", 503, Transition::RetryAt(60)),
        // Never claimed: a stale result, answered None and written nowhere.
        item("dlv_d", 200, Transition::Delivered),
        item("dlv_e", 200, Transition::Delivered),
        // A second result for a message already in this call: stale, not counted twice.
        item("dlv_a", 200, Transition::Delivered),
    ]);
    let states: Vec<Option<State>> = answers.into_iter().map(|a| a.unwrap().map(|r| r.state)).collect();
    assert_eq!(
        states,
        vec![
            Some(State::Delivered),
            Some(State::Dead),
            Some(State::Pending),
            None,
            Some(State::Delivered),
            None
        ]
    );
    // Counters summed over the batch, per counter and per endpoint.
    assert_eq!(
        store.counts().unwrap(),
        Counts {
            open: 2,
            delivered: 2,
            dead: 1
        }
    );
    let per_ep: HashMap<_, _> = store.open_per_endpoint().unwrap().into_iter().collect();
    assert_eq!(per_ep.get("https://r.example/h"), Some(&2));
    assert_eq!(per_ep.get("https://other.example/h").copied().unwrap_or(0), 0);
    assert_eq!(store.history("dlv_a").unwrap().len(), 1);
    assert_eq!(store.history("dlv_c").unwrap().len(), 1);
    assert!(store.history("dlv_d").unwrap().is_empty());
    assert_eq!(store.message("dlv_d").unwrap().unwrap().state, State::Pending);
    assert_eq!(due_ids(&store, 100), vec!["dlv_c".to_string(), "dlv_d".to_string()]);
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
    assert_eq!(store.replay_dead(&ListFilter::default(), 1_000, 9_000).unwrap(), 600);
    assert_eq!(store.operator_syncs() - before, 2, "one synced write per page of 500");
    let counts = store.counts().unwrap();
    assert_eq!((counts.open, counts.dead), (600, 0));
    assert_eq!(due_ids(&store, 1_000).len(), 600);

    let before = store.operator_syncs();
    assert_eq!(store.replay("dlv_0000", 1_000, 9_000).unwrap(), Some(false));
    assert!(store.delete("dlv_0001").unwrap());
    store
        .put_endpoint_synced("https://r.example/h", &EndpointRecord::default())
        .unwrap();
    assert_eq!(
        store.operator_syncs() - before,
        2,
        "the delete and the pause are synced"
    );
}
