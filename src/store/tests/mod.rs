//! Store tests on a temporary RocksDB, one file per concern (as the store itself is split).
//! Here: the shared helpers, accept and dedupe, opening the data dir, and the oldest-open
//! gauge.
//!
//! `message` and `claim` are `pub(crate)`: other modules' store-backed tests use them.

mod endpoints;
mod expiry;
pub(crate) mod faults;
mod finish;
mod format;
mod handoff;
mod lease;
mod lines;
mod operator;
mod queue;
mod sealing;
mod support;
mod unreadable;

use rand::SeedableRng;

use super::*;
use crate::model::{DeadReason, SignatureScheme};

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
            route: None,
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
            fifo: None,
            last_attempt: None,
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

/// The due entry of a pending message, as the scheduler's scan sees it.
fn entry(store: &Store, id: &str) -> DueEntry {
    let rec = store.message(id).unwrap().unwrap();
    DueEntry {
        due_ms: rec.next_attempt_at_ms,
        id: id.into(),
        routing: Routing {
            host: rec.host.clone(),
            endpoint: rec.endpoint.clone(),
        },
    }
}

/// Puts a due message in flight on disk (shared with other modules' tests).
pub(crate) fn claim(store: &Store, id: &str) -> Leased {
    // What an accept that starts its attempt at once, or a crash mid-attempt, leaves on
    // disk: no due entry, the record in flight (courier itself leases in memory).
    let entry = entry(store, id);
    let NewMessage { mut record, payload } = store.due_message(&entry).unwrap().expect("claimable");
    let mut tx = crate::store::tx::Tx::new(&store.db);
    tx.delete(keys::DUE, keys::time_key(entry.due_ms, id));
    tx.move_state(id, State::Pending, State::InFlight);
    record.state = State::InFlight;
    tx.put_record(&record);
    store.commit(tx, false).unwrap();
    Leased {
        record,
        payload,
        claim: crate::store::Claim::AtAccept,
    }
}

fn attempt(status: u16) -> AttemptRecord {
    AttemptRecord {
        at_ms: 1,
        status: Some(status),
        error: None,
        duration_ms: 3,
        policy_revision: None,
        span_id: None,
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

/// Store format 3: a message whose event id courier made from its delivery id writes no
/// `events` entry and looks none up, and is still found as the first of its pair: by a
/// later accept with that event id for its target (in a later batch or its own), not for
/// another target; deleting it leaves the entry of a message the app sent with that event
/// id before it.
#[tokio::test]
async fn a_made_event_id_is_found_by_its_delivery_id_without_an_events_entry() {
    let (_d, store) = open();
    let events = |store: &Store| {
        store
            .db
            .iterator_cf(store.cf(keys::EVENTS), rocksdb::IteratorMode::Start)
            .count()
    };
    let made = crate::model::event_id_for;
    let y = "dlv_01HF7YAT00DB736R3MTTWNYTNE";
    assert_eq!(store.accept(message(y, &made(y), 10)).await.unwrap(), Accepted::New);
    assert_eq!(events(&store), 0, "no events entry");
    assert_eq!(
        store.accept(message("dlv_b", &made(y), 11)).await.unwrap(),
        Accepted::Duplicate { id: y.into() },
        "found by its delivery id"
    );
    let mut other = message("dlv_c", &made(y), 12);
    other.record.target = "https://other.example/h".into();
    assert_eq!(store.accept(other).await.unwrap(), Accepted::New, "another target");
    assert_eq!(events(&store), 1, "the app's event id for another target has its entry");

    // A made id and the app sending it in the same batch: the second is the duplicate.
    let z = "dlv_01HF7YAT00TCD3F96H9ZZB5NZT";
    let both = vec![
        store.accepting(message(z, &made(z), 13), false),
        store.accepting(message("dlv_d", &made(z), 13), false),
    ];
    let answers: Vec<_> = store.accept_batch(both).iter().map(|s| s.answer().unwrap()).collect();
    assert_eq!(answers, [Accepted::New, Accepted::Duplicate { id: z.into() }]);

    // The app sent `x`'s made id before `x` existed: both are kept, and deleting `x`
    // leaves the app's message's entry.
    let x = "dlv_01HF7YAT00QMRV3YBGQ0WA8KXP";
    assert_eq!(
        store.accept(message("dlv_p", &made(x), 14)).await.unwrap(),
        Accepted::New
    );
    assert_eq!(store.accept(message(x, &made(x), 15)).await.unwrap(), Accepted::New);
    assert!(store.delete(x, 16).unwrap());
    assert_eq!(
        store.accept(message("dlv_q", &made(x), 17)).await.unwrap(),
        Accepted::Duplicate { id: "dlv_p".into() }
    );
    assert!(store.delete("dlv_p", 18).unwrap());
    assert_eq!(
        store.accept(message("dlv_r", &made(x), 19)).await.unwrap(),
        Accepted::New
    );

    // The app sent a made id first in the same batch: the made one is stored all the same.
    let w = "dlv_01HF7YAT00Z3ZJ6QX1G9N3W5TQ";
    let both = vec![
        store.accepting(message("dlv_e", &made(w), 20), false),
        store.accepting(message(w, &made(w), 20), false),
    ];
    let answers: Vec<_> = store.accept_batch(both).iter().map(|s| s.answer().unwrap()).collect();
    assert_eq!(answers, [Accepted::New, Accepted::New]);
    // A record that does not read cannot be the first of the pair: the accept is stored.
    let v = "dlv_01HF7YAT00V3ZJ6QX1G9N3W5TQ";
    store.db.put_cf(store.cf(keys::MESSAGES), v, b"not a record").unwrap();
    assert_eq!(
        store.accept(message("dlv_f", &made(v), 21)).await.unwrap(),
        Accepted::New
    );
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
