//! Leases (the scheduler's claim, in memory) and messages claimed at accept: what the
//! result write, a release and a listing make of each.

use super::*;

fn in_flight_ids(store: &Store) -> Vec<String> {
    let filter = ListFilter {
        state: Some(State::InFlight),
        ..ListFilter::default()
    };
    store
        .list(&filter, 100, None)
        .unwrap()
        .items
        .into_iter()
        .map(|r| r.id)
        .collect()
}

#[tokio::test]
async fn a_lease_writes_nothing_and_is_taken_once() {
    let (_d, store) = open();
    store.accept(message("dlv_a", "e", 100)).await.unwrap();
    let e = entry(&store, "dlv_a");
    let leased = store
        .lease_many(std::slice::from_ref(&e))
        .unwrap()
        .pop()
        .flatten()
        .expect("leased");
    assert_eq!(leased.record.state, State::InFlight, "handed over as in flight");
    assert_eq!(
        store.message("dlv_a").unwrap().unwrap().state,
        State::Pending,
        "nothing written"
    );
    assert_eq!(
        due_ids(&store, 1_000),
        vec!["dlv_a"],
        "the due entry stays until the result"
    );
    assert!(store.is_leased("dlv_a"));
    assert!(
        store.lease_many(&[e]).unwrap()[0].is_none(),
        "a leased message is not leased again"
    );
    let shown = store.shown(store.message("dlv_a").unwrap().unwrap());
    assert_eq!(shown.state, State::InFlight, "readers see it in flight");
    assert_eq!(in_flight_ids(&store), vec!["dlv_a"]);
    let pending = ListFilter {
        state: Some(State::Pending),
        ..ListFilter::default()
    };
    assert!(
        store.list(&pending, 100, None).unwrap().items.is_empty(),
        "and not pending"
    );
}

#[tokio::test]
async fn the_result_write_ends_the_lease_and_moves_the_due_entry() {
    let (_d, store) = open();
    store.accept(message("dlv_a", "e", 100)).await.unwrap();
    store.lease_many(&[entry(&store, "dlv_a")]).unwrap();
    let rec = store
        .finish_attempt("dlv_a", &attempt(503), Transition::RetryAt(700), 150)
        .unwrap()
        .expect("a leased pending message takes its result");
    assert_eq!(
        (rec.state, rec.attempts, rec.next_attempt_at_ms),
        (State::Pending, 1, 700)
    );
    assert!(!store.is_leased("dlv_a"));
    assert_eq!(due_ids(&store, 699), Vec::<String>::new(), "the old due entry is gone");
    assert_eq!(due_ids(&store, 700), vec!["dlv_a"]);
    store.lease_many(&[entry(&store, "dlv_a")]).unwrap();
    let rec = store
        .finish_attempt("dlv_a", &attempt(200), Transition::Delivered, 800)
        .unwrap()
        .unwrap();
    assert_eq!((rec.state, rec.attempts), (State::Delivered, 2));
    assert!(due_ids(&store, u64::MAX - 1).is_empty());
    assert_eq!(store.counts().unwrap().open, 0);
    assert!(
        store
            .finish_attempt("dlv_a", &attempt(200), Transition::Delivered, 900)
            .unwrap()
            .is_none(),
        "a second result without a lease is stale"
    );
}

#[tokio::test]
async fn a_failed_result_write_keeps_the_lease_for_the_retry() {
    let (_d, store) = open();
    store.accept(message("dlv_a", "e", 100)).await.unwrap();
    store.lease_many(&[entry(&store, "dlv_a")]).unwrap();
    store
        .faults()
        .fail_results
        .store(1, std::sync::atomic::Ordering::SeqCst);
    assert!(store
        .finish_attempt("dlv_a", &attempt(200), Transition::Delivered, 150)
        .is_err());
    assert!(
        store.is_leased("dlv_a"),
        "still leased: the scheduler must not start it again"
    );
    let rec = store
        .finish_attempt("dlv_a", &attempt(200), Transition::Delivered, 160)
        .unwrap()
        .unwrap();
    assert_eq!((rec.state, rec.attempts), (State::Delivered, 1));
}

#[tokio::test]
async fn a_release_puts_a_leased_message_back_where_the_scheduler_looks() {
    let (_d, store) = open();
    store.accept(message("dlv_a", "e", 100)).await.unwrap();
    store.accept(message("dlv_b", "f", 100)).await.unwrap();
    store
        .lease_many(&[entry(&store, "dlv_a"), entry(&store, "dlv_b")])
        .unwrap();
    // A pass saw both leased and raised the floor past them.
    let mark = store.due_floor.mark();
    store.raise_due_floor(mark, 500);
    assert!(
        store.release("dlv_a", 100).unwrap(),
        "same due time: the lease just ends"
    );
    assert!(
        store.due_floor() <= 100,
        "the floor comes back down to the released entry"
    );
    assert!(
        store.release("dlv_b", 5_000).unwrap(),
        "a later due time moves the entry"
    );
    assert!(!store.is_leased("dlv_a") && !store.is_leased("dlv_b"));
    assert_eq!(due_ids(&store, 4_999), vec!["dlv_a"]);
    assert_eq!(due_ids(&store, 5_000), vec!["dlv_a", "dlv_b"]);
    let b = store.message("dlv_b").unwrap().unwrap();
    assert_eq!((b.state, b.attempts, b.next_attempt_at_ms), (State::Pending, 0, 5_000));
}

#[tokio::test]
async fn a_message_claimed_at_accept_is_in_flight_with_no_due_entry_until_its_result() {
    let (_d, store) = open();
    let (accepted, claimed) = store.accept_claimed(message("dlv_a", "e", 100)).await.unwrap();
    assert_eq!(accepted, Accepted::New);
    let claimed = claimed.expect("new, so claimed");
    assert_eq!(claimed.payload.body, b"{}");
    assert_eq!(store.message("dlv_a").unwrap().unwrap().state, State::InFlight);
    assert!(due_ids(&store, u64::MAX - 1).is_empty(), "no scan will see it");
    assert_eq!(in_flight_ids(&store), vec!["dlv_a"]);
    let (dup, none) = store.accept_claimed(message("dlv_b", "e", 100)).await.unwrap();
    assert_eq!(dup, Accepted::Duplicate { id: "dlv_a".into() });
    assert!(none.is_none(), "a duplicate claims nothing");
    // A crash before the result: startup puts it in the queue.
    assert_eq!(store.recover_in_flight(300).unwrap(), 1);
    assert_eq!(due_ids(&store, 300), vec!["dlv_a"]);
    assert_eq!(store.counts().unwrap().open, 1);
}
