//! Ordered endpoints' lines: only the head is queued, the next is promoted in the head's
//! own batch, `skip` and `block`, replays, deletes (of a head in flight too), retention,
//! and what startup repairs.

use super::*;
use crate::model::{DeadReason, OnDead};

pub(super) const EP: &str = "https://o.example/x";

pub(super) fn ordered(id: &str, on_dead: OnDead) -> NewMessage {
    let mut m = message(id, &format!("evt-{id}"), 100);
    m.record.endpoint = EP.into();
    m.record.target = EP.into();
    m.record.fifo = Some(Fifo { on_dead, pos: 0 });
    m
}

pub(super) fn clean(store: &Store) {
    let problems = store.audit(false).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}

fn head(store: &Store) -> Option<(String, bool, u64)> {
    store.line(EP).unwrap().map(|l| (l.head, l.blocked, l.waiting))
}

fn finish(store: &Store, id: &str, transition: Transition, now: u64) {
    claim(store, id);
    store
        .finish_attempt(id, &attempt(200), transition, now)
        .unwrap()
        .expect("applied");
}

#[tokio::test]
async fn only_the_head_is_queued_and_the_next_goes_when_it_is_delivered() {
    let (_d, store) = open();
    for id in ["dlv_1", "dlv_2", "dlv_3"] {
        store.accept(ordered(id, OnDead::Skip)).await.unwrap();
    }
    // An unordered message to the same endpoint is not held by the line.
    let mut free = message("dlv_9", "evt-free", 100);
    free.record.endpoint = EP.into();
    store.accept(free).await.unwrap();
    assert_eq!(due_ids(&store, 1_000), vec!["dlv_1", "dlv_9"]);
    assert_eq!(head(&store), Some(("dlv_1".into(), false, 2)));
    assert_eq!(store.lined().unwrap(), 2);
    clean(&store);
    let rec = store.message("dlv_3").unwrap().unwrap();
    assert_eq!(store.line_position(&rec).unwrap(), Some(2));

    finish(&store, "dlv_1", Transition::Delivered, 500);
    assert_eq!(due_ids(&store, 1_000), vec!["dlv_9", "dlv_2"], "in due order");
    let promoted = store.message("dlv_2").unwrap().unwrap();
    assert_eq!(promoted.next_attempt_at_ms, 500, "due when its head finished");
    assert_eq!(store.line_position(&promoted).unwrap(), Some(0));
    clean(&store);

    // A retry keeps the line behind its head.
    claim(&store, "dlv_2");
    store
        .finish_attempt("dlv_2", &attempt(503), Transition::RetryAt(900), 600)
        .unwrap();
    assert_eq!(due_ids(&store, 1_000), vec!["dlv_9", "dlv_2"]);
    finish(&store, "dlv_2", Transition::Dead(DeadReason::MaxAttempts), 950);
    assert_eq!(due_ids(&store, 1_000), vec!["dlv_9", "dlv_3"], "skip: the next goes");
    finish(&store, "dlv_3", Transition::Delivered, 990);
    assert_eq!(head(&store), None, "an empty line leaves no record");
    assert_eq!(store.lined().unwrap(), 0);
    clean(&store);
}

#[test]
fn batched_accepts_line_up_in_commit_order() {
    // Forty accepts in batches of uneven sizes (as the store writer takes them): each gets
    // the next place as its batch commits, several members of one line in one batch too.
    let (_d, store) = open();
    let mut ids = (0..40).map(|i| format!("dlv_{i:03}"));
    for size in [1, 3, 8, 2, 5, 1, 7, 4, 6, 3] {
        let batch: Vec<_> = ids
            .by_ref()
            .take(size)
            .map(|id| store.accepting(ordered(&id, OnDead::Skip), false))
            .collect();
        for settled in store.accept_batch(batch) {
            assert_eq!(settled.answer().unwrap(), Accepted::New);
        }
    }
    assert_eq!(ids.next(), None, "the batches take all forty");
    assert_eq!(due_ids(&store, 1_000).len(), 1, "one head, whatever the batches");
    assert_eq!(head(&store).unwrap().2, 39);
    clean(&store);
    // Every member has its own place (the head 0, which it takes as head, the others 1 to
    // 39: no gap, no repeat), and the line goes in place order: draining delivers each
    // exactly once, in the order they were committed.
    let place: std::collections::HashMap<String, u64> = (0..40)
        .map(|i| {
            let id = format!("dlv_{i:03}");
            let pos = store.message(&id).unwrap().unwrap().fifo.unwrap().pos;
            (id, pos)
        })
        .collect();
    let mut places: Vec<u64> = place.values().copied().collect();
    places.sort_unstable();
    assert_eq!(places, (0..40).collect::<Vec<u64>>());
    let mut seen = std::collections::BTreeSet::new();
    for n in 0..40 {
        let ids = due_ids(&store, 10_000);
        assert_eq!(ids.len(), 1, "step {n}: {ids:?}");
        assert!(seen.insert(ids[0].clone()));
        assert_eq!(place[&ids[0]], n, "step {n}: {} out of its place", ids[0]);
        finish(&store, &ids[0], Transition::Delivered, 1_000 + n);
    }
    assert_eq!(head(&store), None);
    clean(&store);
}

#[tokio::test]
async fn block_holds_the_line_and_a_replay_of_its_head_goes_first() {
    let (_d, store) = open();
    for id in ["dlv_1", "dlv_2"] {
        store.accept(ordered(id, OnDead::Block)).await.unwrap();
    }
    finish(&store, "dlv_1", Transition::Dead(DeadReason::PermanentStatus), 200);
    assert!(due_ids(&store, 10_000).is_empty(), "blocked: nothing goes");
    assert_eq!(head(&store), Some(("dlv_1".into(), true, 1)));
    clean(&store);
    // A message accepted meanwhile waits too.
    store.accept(ordered("dlv_3", OnDead::Block)).await.unwrap();
    assert!(due_ids(&store, 10_000).is_empty());
    assert_eq!(
        store.recover_lines(300).unwrap(),
        vec![EP.to_string()],
        "startup pauses it"
    );

    assert_eq!(store.replay("dlv_1", 400, |_| 90_000).unwrap(), Some(true));
    assert_eq!(
        due_ids(&store, 10_000),
        vec!["dlv_1"],
        "the replayed head is first again"
    );
    assert_eq!(head(&store), Some(("dlv_1".into(), false, 2)));
    clean(&store);

    finish(&store, "dlv_1", Transition::Dead(DeadReason::PermanentStatus), 500);
    assert!(store.unblock_line(EP, 600).unwrap(), "a resume unblocks");
    assert_eq!(due_ids(&store, 10_000), vec!["dlv_2"]);
    assert!(!store.unblock_line(EP, 700).unwrap(), "nothing blocked any more");
    clean(&store);
}

#[tokio::test]
async fn a_replay_of_a_skipped_message_goes_to_the_end() {
    let (_d, store) = open();
    for id in ["dlv_1", "dlv_2", "dlv_3"] {
        store.accept(ordered(id, OnDead::Skip)).await.unwrap();
    }
    finish(&store, "dlv_1", Transition::Dead(DeadReason::Expired), 200);
    assert_eq!(store.replay("dlv_1", 300, |_| 90_000).unwrap(), Some(true));
    let order: Vec<String> = (0..3)
        .map(|n| {
            let id = due_ids(&store, 10_000).pop().expect("a head");
            finish(&store, &id, Transition::Delivered, 400 + n);
            id
        })
        .collect();
    assert_eq!(order, vec!["dlv_2", "dlv_3", "dlv_1"]);
    // Bulk replay of dead messages of an idle line: the first becomes the head.
    for id in ["dlv_4", "dlv_5"] {
        store.accept(ordered(id, OnDead::Skip)).await.unwrap();
    }
    finish(&store, "dlv_4", Transition::Dead(DeadReason::Expired), 500);
    finish(&store, "dlv_5", Transition::Dead(DeadReason::Expired), 510);
    assert_eq!(store.replay_dead(&ListFilter::default(), 600, |_| 90_000).unwrap(), 2);
    assert_eq!(due_ids(&store, 10_000), vec!["dlv_4"]);
    assert_eq!(head(&store), Some(("dlv_4".into(), false, 1)));
    clean(&store);
}

#[tokio::test]
async fn delete_takes_a_member_out_and_a_head_hands_over() {
    let (_d, store) = open();
    for id in ["dlv_1", "dlv_2", "dlv_3", "dlv_4"] {
        store.accept(ordered(id, OnDead::Skip)).await.unwrap();
    }
    assert!(store.delete("dlv_3", 150).unwrap());
    assert_eq!(head(&store), Some(("dlv_1".into(), false, 2)));
    clean(&store);
    assert!(store.delete("dlv_1", 200).unwrap());
    assert_eq!(due_ids(&store, 10_000), vec!["dlv_2"]);
    assert_eq!(store.message("dlv_2").unwrap().unwrap().next_attempt_at_ms, 200);
    clean(&store);

    // A head deleted while its attempt is in flight stays the head until the attempt ends,
    // so the next one's attempt cannot overlap it.
    let rec = store.message("dlv_2").unwrap().unwrap();
    let entry = DueEntry {
        due_ms: rec.next_attempt_at_ms,
        id: rec.id.clone(),
        routing: Routing {
            host: rec.host.clone(),
            endpoint: rec.endpoint.clone(),
        },
    };
    assert!(matches!(store.lease_many(&[entry], 0)[0], Ok(Some(_))));
    assert!(store.delete("dlv_2", 300).unwrap());
    assert!(due_ids(&store, 10_000).is_empty(), "the next waits for the attempt");
    assert_eq!(head(&store).unwrap().0, "dlv_2");
    clean(&store);
    let stale = store
        .finish_attempt("dlv_2", &attempt(200), Transition::Delivered, 400)
        .unwrap();
    assert!(stale.is_none(), "the result of a deleted message is not kept");
    assert_eq!(due_ids(&store, 10_000), vec!["dlv_4"]);
    assert!(store.audit(true).unwrap().is_empty());
}

#[tokio::test]
async fn startup_moves_a_line_on_past_a_head_deleted_in_flight_before_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    {
        let store = Store::open(&path, StoreOptions::default()).unwrap();
        for id in ["dlv_1", "dlv_2"] {
            store.accept(ordered(id, OnDead::Skip)).await.unwrap();
        }
        claim(&store, "dlv_1");
        assert!(store.delete("dlv_1", 200).unwrap());
        assert!(due_ids(&store, 10_000).is_empty());
        // The crash: the attempt never reports.
    }
    let store = Store::open(&path, StoreOptions::default()).unwrap();
    assert!(
        !store.audit(true).unwrap().is_empty(),
        "a gone head with nothing running"
    );
    store.recover_in_flight(500).unwrap();
    assert!(store.recover_lines(500).unwrap().is_empty());
    assert_eq!(due_ids(&store, 10_000), vec!["dlv_2"]);
    assert!(store.audit(true).unwrap().is_empty());
}

#[tokio::test]
async fn retention_of_a_blocked_head_lets_the_line_go_on() {
    let (_d, store) = open();
    for id in ["dlv_1", "dlv_2"] {
        store.accept(ordered(id, OnDead::Block)).await.unwrap();
    }
    finish(&store, "dlv_1", Transition::Dead(DeadReason::PermanentStatus), 200);
    // dead_retention is 5 s in these tests.
    assert_eq!(store.sweep_expired(10_000, 100).unwrap().removed, 1);
    assert_eq!(due_ids(&store, 20_000), vec!["dlv_2"]);
    assert_eq!(head(&store), Some(("dlv_2".into(), false, 0)));
    clean(&store);
}

/// Issue 24, finding 3: a head's result that failed while its line moved on (the next
/// member's record could not be read) was committed half-written with the batch's other
/// results: its due entry gone, its attempt in the history and the counters, its record
/// still pending and the line still naming it, so every member behind it waited for ever.
#[tokio::test]
async fn a_head_s_failed_result_writes_nothing_and_its_line_stays_whole() {
    let (_d, store) = open();
    for id in ["dlv_1", "dlv_2"] {
        store.accept(ordered(id, OnDead::Skip)).await.unwrap();
    }
    store.accept(message("dlv_9", "evt-free", 100)).await.unwrap();
    store.lease_many(&[entry(&store, "dlv_1"), entry(&store, "dlv_9")], 0);
    let cf = store.cf(keys::MESSAGES);
    let member = store.db.get_cf(cf, b"dlv_2").unwrap().unwrap();
    store.db.put_cf(cf, b"dlv_2", b"not a record").unwrap();
    let item = |id: &str| FinishedAttempt {
        id: id.into(),
        attempt: attempt(200),
        transition: Transition::Delivered,
        now_ms: 500,
    };
    let answers = store.finish_owned(&[item("dlv_1"), item("dlv_9")]);
    assert!(answers[0].is_err(), "{:?}", answers[0]);
    assert!(matches!(answers[1], Ok(Some(_))), "{:?}", answers[1]);
    assert!(store.history_of("dlv_1").unwrap().is_empty(), "no attempt recorded");
    assert_eq!(due_ids(&store, 1_000), vec!["dlv_1"], "its due entry is where it was");
    assert_eq!(store.counts().unwrap().open, 2, "the head and its member are open");
    assert_eq!(head(&store), Some(("dlv_1".into(), false, 1)));
    assert_eq!(store.lined().unwrap(), 1);
    store.db.put_cf(cf, b"dlv_2", &member).unwrap();
    clean(&store);
    let rec = store
        .finish_attempt("dlv_1", &attempt(200), Transition::Delivered, 600)
        .unwrap()
        .expect("the retry applies");
    assert_eq!((rec.state, rec.attempts), (State::Delivered, 1));
    assert_eq!(due_ids(&store, 1_000), vec!["dlv_2"], "the next goes");
    assert_eq!(head(&store), Some(("dlv_2".into(), false, 0)));
    clean(&store);
}
