//! The hand-off transition (`courier drain`): from every place a pending message can wait
//! (the due queue, a paused endpoint's parked set, an ordered line, as its head or behind
//! it) to `handed_off`; never a message in flight or finished; retention and dedupe after.

use super::lines::{clean, ordered, EP};
use super::*;
use crate::model::{DeadReason, OnDead};

fn done(store: &Store, id: &str, now: u64) -> MessageRecord {
    assert_eq!(store.hand_off(id, now).unwrap(), HandOff::Done, "{id}");
    store.message(id).unwrap().expect("kept")
}

#[tokio::test]
async fn a_queued_message_is_handed_off_kept_for_retention_and_still_dedupes() {
    let (_d, store) = open();
    store.accept(message("dlv_a", "evt_a", 100)).await.unwrap();
    store.accept(message("dlv_b", "evt_b", 100)).await.unwrap();
    let rec = done(&store, "dlv_a", 200);
    assert_eq!(
        (rec.state, rec.finished_at_ms, rec.next_attempt_at_ms),
        (State::HandedOff, 200, 0)
    );
    assert_eq!(due_ids(&store, 1_000), vec!["dlv_b"], "out of the queue");
    let counts = store.counts().unwrap();
    assert_eq!((counts.open, counts.handed_off), (1, 1));
    assert_eq!(store.open_of_endpoint("https://r.example/h").unwrap(), 1);
    clean(&store);
    assert_eq!(
        store.hand_off("dlv_a", 300).unwrap(),
        HandOff::NotPending(State::HandedOff),
        "twice is once"
    );
    // The event stays known while the message is kept: the same event again is a duplicate.
    assert_eq!(
        store.accept(message("dlv_c", "evt_a", 300)).await.unwrap(),
        Accepted::Duplicate { id: "dlv_a".into() }
    );
    // Kept for `retention` (1 s in these tests), like a delivered message; then gone.
    assert_eq!(store.sweep_expired(1_199, 100).unwrap().removed, 0);
    assert_eq!(store.sweep_expired(1_200, 100).unwrap().removed, 1);
    assert!(store.message("dlv_a").unwrap().is_none());
    assert_eq!(store.counts().unwrap().handed_off, 0);
    clean(&store);
}

#[tokio::test]
async fn a_parked_message_is_handed_off_out_of_its_parked_set() {
    let (_d, store) = open();
    store.accept(message("dlv_a", "evt_a", 100)).await.unwrap();
    store.park(&entry(&store, "dlv_a")).unwrap();
    done(&store, "dlv_a", 200);
    clean(&store);
    assert_eq!(
        store.unpark_endpoint("https://r.example/h", 300).unwrap(),
        0,
        "nothing left parked"
    );
    assert!(due_ids(&store, 1_000).is_empty());
}

#[tokio::test]
async fn messages_in_flight_finished_or_dead_are_left_as_they_are() {
    let (_d, store) = open();
    for (id, event) in [("dlv_a", "e1"), ("dlv_b", "e2"), ("dlv_c", "e3"), ("dlv_d", "e4")] {
        store.accept(message(id, event, 100)).await.unwrap();
    }
    claim(&store, "dlv_a");
    assert_eq!(
        store.hand_off("dlv_a", 200).unwrap(),
        HandOff::NotPending(State::InFlight)
    );
    store.lease_many(&[entry(&store, "dlv_b")], 0);
    assert_eq!(store.hand_off("dlv_b", 200).unwrap(), HandOff::Leased);
    claim(&store, "dlv_c");
    let dead = Transition::Dead(DeadReason::PermanentStatus);
    store.finish_attempt("dlv_c", &attempt(410), dead, 150).unwrap();
    assert_eq!(store.hand_off("dlv_c", 200).unwrap(), HandOff::NotPending(State::Dead));
    assert_eq!(store.hand_off("dlv_zz", 200).unwrap(), HandOff::Gone);
    assert_eq!(store.counts().unwrap().handed_off, 0);
    done(&store, "dlv_d", 200);
    assert_eq!(store.counts().unwrap().handed_off, 1);
}

#[tokio::test]
async fn an_ordered_head_hands_its_line_to_the_next_and_a_waiting_member_leaves_it() {
    let (_d, store) = open();
    for id in ["dlv_1", "dlv_2", "dlv_3", "dlv_4"] {
        store.accept(ordered(id, OnDead::Skip)).await.unwrap();
    }
    // A member behind the head leaves the line; the head stays.
    done(&store, "dlv_3", 200);
    let line = store.line(EP).unwrap().unwrap();
    assert_eq!((line.head.as_str(), line.waiting), ("dlv_1", 2));
    clean(&store);
    // The head hands over to the next, due at the hand-off.
    let rec = done(&store, "dlv_1", 300);
    assert_eq!(rec.fifo.map(|f| f.pos), Some(0));
    assert_eq!(store.line(EP).unwrap().unwrap().head, "dlv_2");
    assert_eq!(due_ids(&store, 1_000), vec!["dlv_2"]);
    assert_eq!(store.message("dlv_2").unwrap().unwrap().next_attempt_at_ms, 300);
    clean(&store);
    done(&store, "dlv_2", 400);
    done(&store, "dlv_4", 500);
    assert_eq!(store.line(EP).unwrap(), None, "an emptied line leaves no record");
    assert_eq!(store.lined().unwrap(), 0);
    clean(&store);
}

#[tokio::test]
async fn pending_ids_come_a_page_at_a_time_in_acceptance_order() {
    let (_d, store) = open();
    for i in 0..7 {
        store
            .accept(message(&format!("dlv_{i}"), &format!("e{i}"), 100))
            .await
            .unwrap();
    }
    claim(&store, "dlv_2");
    let first = store.ids_after(State::Pending, None, 3).unwrap();
    assert_eq!(first, vec!["dlv_0", "dlv_1", "dlv_3"]);
    // Handed off behind the cursor does not move it.
    for id in &first {
        done(&store, id, 200);
    }
    let next = store.ids_after(State::Pending, Some("dlv_3"), 3).unwrap();
    assert_eq!(next, vec!["dlv_4", "dlv_5", "dlv_6"]);
    assert!(store.ids_after(State::Pending, Some("dlv_6"), 3).unwrap().is_empty());
}
