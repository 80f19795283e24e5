//! Attempt results: retries and history, batched results, and recovery after a crash.

use std::collections::HashMap;

use super::*;

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
            dead: 0,
            handed_off: 0
        }
    );
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
        claimed: None,
    };
    let answers = store.finish_attempts(&mut [
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
            dead: 1,
            handed_off: 0
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
    assert_eq!(store.recover_in_flight(5_000).unwrap().0, 1);
    let rec = store.message("dlv_a").unwrap().unwrap();
    assert_eq!(
        (rec.state, rec.attempts, rec.next_attempt_at_ms),
        (State::Pending, 1, 5_000)
    );
    assert_eq!(due_ids(&store, 5_000), vec!["dlv_a"]);
}
