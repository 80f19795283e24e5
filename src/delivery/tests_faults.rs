//! Store faults under delivery: a message whose record cannot be read, when the scheduler
//! leases it and when its attempt's result is written. Courier's own failure, so never an
//! attempt counted, never a lease or a permit held for ever, and never another message
//! held up behind it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::tests::{config, status, Harness, Scripted, T0};
use crate::clock::ManualClock;
use crate::model::{Jitter, State};
use crate::outbound::transport::{OutboundRequest, SendFuture, Transport};
use crate::store::Store;

/// Answers 200; on its first call makes the message it was told of unreadable, as if its
/// record went bad while the attempt was out.
#[derive(Default)]
struct BreaksOnSend {
    breaks: Mutex<Option<(Arc<Store>, String)>>,
    calls: Mutex<Vec<String>>,
}

impl Transport for BreaksOnSend {
    fn send(&self, req: OutboundRequest) -> SendFuture<'_> {
        self.calls.lock().unwrap().push(req.url.path().to_string());
        if let Some((store, id)) = self.breaks.lock().unwrap().take() {
            store.faults().make_unreadable(&id);
        }
        Box::pin(async { status(200) })
    }
}

/// Issue 24, finding 1: one unreadable message in a pass's lease batch returned early from
/// it: the messages leased before it stayed `in_flight` with no attempt, and every later
/// pass failed on it, so nothing behind it was sent.
#[tokio::test]
async fn an_unreadable_due_message_strands_no_lease_and_holds_up_no_other() {
    let clock = ManualClock::new(T0);
    let t = Scripted::new(clock.clone(), vec![]);
    let h = Harness::without_scheduler(config(Jitter::None), t.clone(), clock.clone());
    let mut ids = Vec::new();
    for path in ["a", "b", "c"] {
        ids.push(h.accept_url(&format!("https://r.example/{path}"), vec![]).await);
    }
    h.d.context().store().faults().make_unreadable(&ids[1]);
    h.start_scheduler();
    for id in [&ids[0], &ids[2]] {
        h.wait_record(id, "delivery", |r| r.state == State::Delivered).await;
    }
    assert!(!h.d.context().store().is_leased(&ids[1]), "no lease without an attempt");
    h.d.context().store().faults().heal(&ids[1]);
    clock.advance(Duration::from_secs(1));
    h.settle().await;
    let rec = h
        .wait_record(&ids[1], "delivery once readable", |r| r.state == State::Delivered)
        .await;
    assert_eq!(rec.attempts, 1);
}

/// Issue 24, finding 2: a result write that kept failing for one message held its attempt
/// (and its `max_in_flight` permit) in a retry loop for ever; bounding the retries and
/// requeueing then sent the message again once it read, though its attempt had been
/// answered (a duplicate with no crash). Now the permit goes back after a few tries, the
/// message stays leased, and the result is written in the background once the record reads:
/// the receiver sees it once.
#[tokio::test]
async fn a_result_that_cannot_be_written_gives_its_permit_back_and_is_written_once_it_reads() {
    let clock = ManualClock::new(T0);
    let t = Arc::new(BreaksOnSend::default());
    let mut cfg = config(Jitter::None);
    cfg.delivery.max_in_flight = 1;
    let h = Harness::without_scheduler(cfg, t.clone(), clock.clone());
    h.d.set_result_retry(Duration::from_millis(1));
    let a = h.accept_url("https://r.example/a", vec![]).await;
    *t.breaks.lock().unwrap() = Some((h.d.context().store().clone(), a.clone()));
    h.start_scheduler();
    let b = h.accept_url("https://r.example/b", vec![]).await;
    h.wait_record(&b, "delivery with the only permit back", |r| {
        r.state == State::Delivered
    })
    .await;
    assert!(
        h.d.context().store().is_leased(&a),
        "leased until its result is written"
    );
    assert_eq!(h.d.waiting_to_read(), 1, "its result waits in the background");
    h.d.context().store().faults().heal(&a);
    let rec = h
        .wait_record(&a, "its result written once readable", |r| r.state == State::Delivered)
        .await;
    assert_eq!(rec.attempts, 1);
    clock.advance(super::SELF_FAILURE_DELAY * 2);
    h.settle().await;
    assert_eq!(t.calls.lock().unwrap().as_slice(), ["/a", "/b"], "nothing sent twice");
    assert_eq!(h.d.waiting_to_read(), 0);
}

/// A message left in flight by a crash whose record does not read at startup: startup used
/// to fail on it (courier would not start); now the others go, and it goes back to the
/// queue in the background once it reads, with no restart.
#[tokio::test]
async fn an_in_flight_message_unreadable_at_startup_goes_once_it_reads() {
    let clock = ManualClock::new(T0);
    let t = Arc::new(BreaksOnSend::default());
    let h = Harness::without_scheduler(config(Jitter::None), t.clone(), clock.clone());
    h.d.set_result_retry(Duration::from_millis(1));
    let mut ids = Vec::new();
    for (id, event) in [("dlv_a", "e1"), ("dlv_b", "e2")] {
        let mut m = crate::store::tests::message(id, event, T0);
        m.record.state = State::InFlight;
        let store = h.d.context().store();
        store.accept_batch(vec![store.accepting(m, true)])[0].answer().unwrap();
        ids.push(id);
    }
    h.d.context().store().faults().make_unreadable("dlv_a");
    let (requeued, _, _) = h.d.recover_at_start().unwrap();
    assert_eq!((requeued, h.d.waiting_to_read()), (1, 1));
    h.start_scheduler();
    h.wait_record("dlv_b", "delivery", |r| r.state == State::Delivered)
        .await;
    h.d.context().store().faults().heal("dlv_a");
    h.wait_record("dlv_a", "delivery once readable", |r| r.state == State::Delivered)
        .await;
    assert_eq!(h.d.waiting_to_read(), 0);
}

/// A store that refuses every result write for a while (a full disk) must not turn each
/// attempt into a stream of copies: giving up on the result and requeueing would send the
/// message again every few seconds, none of it recorded. The write is retried, the message
/// stays leased, and the receiver sees it once.
#[tokio::test]
async fn a_store_refusing_result_writes_for_a_while_sends_nothing_twice() {
    let clock = ManualClock::new(T0);
    let t = Arc::new(BreaksOnSend::default());
    let h = Harness::without_scheduler(config(Jitter::None), t.clone(), clock.clone());
    h.d.set_result_retry(Duration::from_millis(1));
    // More refusals than the tries a per-message failure gets.
    let refusals = super::STORE_TRIES as usize + 3;
    h.d.context()
        .store()
        .faults()
        .fail_results
        .store(refusals, std::sync::atomic::Ordering::SeqCst);
    let a = h.accept_url("https://r.example/a", vec![]).await;
    h.start_scheduler();
    let rec = h.wait_record(&a, "delivery", |r| r.state == State::Delivered).await;
    assert_eq!(rec.attempts, 1);
    // Past every wait a requeue would have taken, with passes run: still one send.
    clock.advance(super::SELF_FAILURE_DELAY * 2);
    h.settle().await;
    assert_eq!(t.calls.lock().unwrap().as_slice(), ["/a"]);
}
