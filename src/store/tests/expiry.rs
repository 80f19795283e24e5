//! Retention: finished messages are removed when their time comes, open ones never.

use super::*;

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
    assert_eq!(store.sweep_expired(1_999, 100).unwrap().removed, 0);
    assert_eq!(store.sweep_expired(2_000, 100).unwrap().removed, 1);
    assert!(store.message("dlv_ok").unwrap().is_none());
    assert!(store.history_of("dlv_ok").unwrap().is_empty());
    assert!(store.message("dlv_dead").unwrap().is_some());
    assert_eq!(store.sweep_expired(6_000, 100).unwrap().removed, 1);
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
            dead: 0,
            handed_off: 0
        }
    );
    // The event ids are free again once their messages are gone.
    assert_eq!(
        store.accept(message("dlv_again", "e1", 100)).await.unwrap(),
        Accepted::New
    );
}
