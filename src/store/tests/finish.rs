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
    let h = store.history_of("dlv_a").unwrap();
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

/// The `history` entries of `id`, by number (what is stored there, not the whole history).
fn history_entries(store: &Store, id: &str) -> Vec<(u32, Option<u16>)> {
    let prefix = id.as_bytes();
    let range = (prefix, Some(keys::prefix_end(prefix)));
    page(&store.db, keys::HISTORY, range, usize::MAX, |k, v| {
        let n = u32::from_be_bytes(k[prefix.len()..].try_into().unwrap());
        Ok(Some((n, AttemptRecord::decode(v).unwrap().status)))
    })
    .unwrap()
    .0
}

/// Store format 2: the record keeps the last attempt, so a message delivered at its first
/// writes no history entry; each later attempt moves the one before into `history`; a record
/// of format 1 (every attempt in `history`, none kept) goes on from there; and a history
/// read with a record read before a later attempt lists what that record knew, once each.
#[tokio::test]
async fn the_record_keeps_the_last_attempt_and_the_history_gets_the_ones_before() {
    let (_d, store) = open();
    store.accept(message("dlv_a", "e", 100)).await.unwrap();
    claim(&store, "dlv_a");
    let rec = store
        .finish_attempt("dlv_a", &attempt(200), Transition::Delivered, 150)
        .unwrap()
        .unwrap();
    assert!(
        history_entries(&store, "dlv_a").is_empty(),
        "a first attempt writes no history entry"
    );
    assert_eq!(rec.last_attempt.as_ref().map(|a| a.duration_ms), Some(3));
    assert_eq!(store.history_of("dlv_a").unwrap(), vec![attempt(200)]);

    store.accept(message("dlv_b", "e2", 100)).await.unwrap();
    let mut read_after = Vec::new();
    for (n, status) in [503, 502, 200].into_iter().enumerate() {
        claim(&store, "dlv_b");
        let transition = if status == 200 {
            Transition::Delivered
        } else {
            Transition::RetryAt(200)
        };
        let at = store
            .finish_attempt("dlv_b", &attempt(status), transition, 150)
            .unwrap()
            .unwrap();
        read_after.push(at);
        assert_eq!(history_entries(&store, "dlv_b").len(), n, "attempt {}", n + 1);
    }
    assert_eq!(history_entries(&store, "dlv_b"), vec![(1, Some(503)), (2, Some(502))]);
    let statuses = |h: Vec<AttemptRecord>| h.iter().map(|a| a.status).collect::<Vec<_>>();
    assert_eq!(
        statuses(store.history_of("dlv_b").unwrap()),
        [Some(503), Some(502), Some(200)]
    );
    // The record as read after the second attempt: the third has moved the second into
    // `history` since; it is listed once, from the record.
    assert_eq!(statuses(store.history(&read_after[1]).unwrap()), [Some(503), Some(502)]);

    // A format-1 record: its two attempts in `history`, none kept.
    store.accept(message("dlv_c", "e3", 100)).await.unwrap();
    let mut old = store.message("dlv_c").unwrap().unwrap();
    (old.attempts, old.history_len, old.next_attempt_at_ms) = (2, 2, 100);
    let mut tx = crate::store::tx::Tx::new(&store.db);
    for n in [1, 2] {
        tx.put(
            keys::HISTORY,
            keys::history_key("dlv_c", n),
            attempt(500 + n as u16).encode(),
        );
    }
    tx.put_record(&old);
    store.commit(tx, false).unwrap();
    assert_eq!(statuses(store.history_of("dlv_c").unwrap()), [Some(501), Some(502)]);
    claim(&store, "dlv_c");
    store
        .finish_attempt("dlv_c", &attempt(200), Transition::Delivered, 150)
        .unwrap();
    assert_eq!(
        statuses(store.history_of("dlv_c").unwrap()),
        [Some(501), Some(502), Some(200)]
    );
    assert_eq!(history_entries(&store, "dlv_c").len(), 2);
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
    let answers = store.finish_owned(&[
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
    assert_eq!(store.history_of("dlv_a").unwrap().len(), 1);
    assert_eq!(store.history_of("dlv_c").unwrap().len(), 1);
    assert!(store.history_of("dlv_d").unwrap().is_empty());
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
