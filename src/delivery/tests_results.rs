//! The result writing's tests: batching, stale results, barriers, streaks, and a resume
//! landing between a line's block and its pause.

use super::*;
use crate::store::tests::{claim, message};
use crate::store::Store;
use crate::store::{AttemptRecord, Counts, ResultWrite, StoreOptions, Transition};

async fn claimed_store(n: usize) -> (tempfile::TempDir, Arc<Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("data"), StoreOptions::default()).unwrap());
    for i in 0..n {
        let id = format!("dlv_{i:03}");
        store.accept(message(&id, &format!("e{i}"), 100)).await.unwrap();
        claim(&store, &id);
    }
    (dir, store)
}

/// A context over `store` whose endpoints pause after 3 permanent failures.
fn context(store: &Arc<Store>) -> Arc<Context> {
    let mut config = crate::config::Config::default();
    config.delivery.pause_after_permanent_failures = 3;
    config.retention = std::time::Duration::from_secs(86_400);
    let clock: crate::clock::SharedClock = crate::clock::ManualClock::new(0);
    Context::new(
        store.clone(),
        clock,
        Arc::new(config),
        Default::default(),
        Default::default(),
        tokio::runtime::Handle::current(),
    )
    .unwrap()
}

fn writer(ctx: &Arc<Context>) -> Writer {
    Writer { ctx: ctx.clone() }
}

/// Results written on a thread of their own, as the store writer's turns write them.
struct ResultWriter(crate::batcher::Batcher<Job>);

impl ResultWriter {
    async fn record(&self, item: FinishedAttempt, note: StreakNote) -> Answer {
        let (reply, answer) = oneshot::channel();
        let job = Job::Waiting(Some((item, note)), reply);
        assert!(self.0.send(job).await);
        answer.await.unwrap()
    }
}

fn start(store: &Arc<Store>) -> ResultWriter {
    let w = writer(&context(store));
    ResultWriter(crate::batcher::Batcher::start("results", 64, 1024, move |jobs| {
        w.write_batch(jobs, &mut || {});
    }))
}

fn note(endpoint: &str) -> StreakNote {
    StreakNote {
        endpoint: endpoint.into(),
        blocks_line: false,
    }
}

fn success() -> StreakNote {
    note("e")
}

fn delivered(id: &str) -> FinishedAttempt {
    FinishedAttempt {
        id: id.into(),
        attempt: AttemptRecord {
            at_ms: 200,
            status: Some(200),
            error: None,
            duration_ms: 1,
            policy_revision: None,
            span_id: None,
        },
        transition: Transition::Delivered,
        now_ms: 200,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_results_are_all_recorded() {
    let (_d, store) = claimed_store(200).await;
    let writer = Arc::new(start(&store));
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let w = writer.clone();
            tokio::spawn(async move { w.record(delivered(&format!("dlv_{i:03}")), success()).await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().write, ResultWrite::Written);
    }
    assert_eq!(
        store.counts().unwrap(),
        Counts {
            open: 0,
            delivered: 200,
            dead: 0,
            handed_off: 0
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_result_for_one_message_in_the_same_batch_is_stale_not_doubled() {
    let (_d, store) = claimed_store(2).await;
    // Two results for dlv_000 in one batch: the second must be answered stale, not
    // applied twice.
    let mut jobs = Vec::new();
    let mut answers = Vec::new();
    for id in ["dlv_000", "dlv_001", "dlv_000"] {
        let (reply, answer) = oneshot::channel();
        jobs.push(Job::Waiting(Some((delivered(id), success())), reply));
        answers.push(answer);
    }
    writer(&context(&store)).write_batch(jobs, &mut || {});
    let mut applied = Vec::new();
    for a in answers {
        applied.push(a.await.unwrap().unwrap().write == ResultWrite::Written);
    }
    assert_eq!(applied, vec![true, true, false]);
    assert_eq!(store.history_of("dlv_000").unwrap().len(), 1);
    assert_eq!(store.counts().unwrap().delivered, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_returns_after_every_result_queued_before_it_is_written() {
    let (_d, store) = claimed_store(200).await;
    // Results whose callers no longer wait (as an attempt cut off at shutdown), then a
    // barrier, in one batch: the barrier must not be answered before the batch is
    // written (the batch runs on another thread while this one waits for the barrier).
    let mut jobs = Vec::new();
    for i in 0..200 {
        let (reply, _gone) = oneshot::channel();
        let item = Some((delivered(&format!("dlv_{i:03}")), success()));
        jobs.push(Job::Waiting(item, reply));
    }
    let (reply, flushed) = oneshot::channel();
    jobs.push(Job::Waiting(None, reply));
    let w = writer(&context(&store));
    let thread = std::thread::spawn(move || w.write_batch(jobs, &mut || {}));
    flushed.await.unwrap().unwrap();
    assert_eq!(store.counts().unwrap().delivered, 200);
    thread.join().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_writer_ends_its_thread_and_releases_the_store() {
    let (_d, store) = claimed_store(1).await;
    let writer = start(&store);
    assert!(writer.record(delivered("dlv_000"), success()).await.unwrap().write == ResultWrite::Written);
    drop(writer);
    assert_eq!(Arc::strong_count(&store), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaks_count_written_results_once_and_start_from_the_stored_record() {
    let (_d, store) = claimed_store(5).await;
    // "far" failed twice before courier forgot it in memory: its record is on disk only.
    let stored = crate::store::EndpointRecord {
        paused: false,
        streak: 2,
        last_status: Some(410),
    };
    store.put_endpoint("far", &stored, 50).unwrap();
    let ctx = context(&store);
    let endpoints = ctx.endpoints();
    let gone = |id: &str| {
        let mut gone = delivered(id);
        gone.transition = Transition::Dead(crate::model::DeadReason::PermanentStatus);
        gone.attempt.status = Some(410);
        gone
    };
    let mut jobs = Vec::new();
    let mut answers = Vec::new();
    let batch = [
        (gone("dlv_000"), note("near")),
        (gone("dlv_001"), note("far")),
        // Stale: already in this batch, so it must not count again.
        (gone("dlv_001"), note("far")),
        (delivered("dlv_002"), note("healed")),
    ];
    store.put_endpoint("healed", &stored, 50).unwrap();
    for (item, n) in batch {
        let (reply, answer) = oneshot::channel();
        jobs.push(Job::Waiting(Some((item, n)), reply));
        answers.push(answer);
    }
    writer(&ctx).write_batch(jobs, &mut || {});
    let mut changes = Vec::new();
    for a in answers {
        changes.push(a.await.unwrap().unwrap().endpoint);
    }
    let streak = |n| crate::store::EndpointRecord {
        paused: n >= 3,
        streak: n,
        last_status: Some(410),
    };
    assert_eq!(
        changes,
        vec![
            EndpointChange::Changed(streak(1)),
            EndpointChange::Paused(streak(3)),
            EndpointChange::None,
            EndpointChange::Changed(Default::default()),
        ]
    );
    // Written with the batch: the pause (synced), the new streak, the healed one gone.
    assert_eq!(store.endpoint("far").unwrap(), Some(streak(3)));
    assert_eq!(store.endpoint("near").unwrap(), Some(streak(1)));
    assert_eq!(store.endpoint("healed").unwrap(), None);
    assert!(endpoints.is_paused("far"));
}

/// Finding: a result that blocks an ordered line was written before the pause gate was
/// taken; an operator's resume landing between the two unblocked the line, and the pause
/// that followed undid the resume (an endpoint paused with nothing blocking its line).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_between_a_line_s_block_and_its_pause_is_not_undone() {
    const EP: &str = "https://o.example/x";
    let (_d, store) = claimed_store(0).await;
    for id in ["dlv_1", "dlv_2"] {
        let mut m = message(id, &format!("evt-{id}"), 100);
        m.record.endpoint = EP.into();
        m.record.target = EP.into();
        m.record.fifo = Some(crate::store::Fifo {
            on_dead: crate::model::OnDead::Block,
            pos: 0,
        });
        store.accept(m).await.unwrap();
    }
    claim(&store, "dlv_1");
    let ctx = context(&store);
    let endpoints = ctx.endpoints();
    let w = writer(&ctx);
    // The operator's resume, as `Context::set_paused` makes it: under the pause gate,
    // the line goes on with its next message, then the endpoint is active (and written).
    let resume = {
        let ctx = ctx.clone();
        move || {
            let _gate = ctx.pause_gate();
            ctx.store().unblock_line(EP, 300).unwrap();
            let rec = ctx.endpoints().set_paused(EP, false, 300);
            let _order = ctx.persist_order();
            ctx.store().put_endpoint(EP, &rec, 300).unwrap();
        }
    };
    // It arrives once the block is written: it runs at once if the gate is free, else on
    // its own thread as soon as the gate is.
    let mut waiting = None;
    let mut between = || {
        if w.ctx.pause_gate_is_free() {
            resume.clone()();
        } else {
            waiting = Some(std::thread::spawn(resume.clone()));
        }
    };
    let (reply, answer) = oneshot::channel();
    let mut dead = delivered("dlv_1");
    dead.transition = Transition::Dead(crate::model::DeadReason::PermanentStatus);
    dead.attempt.status = Some(410);
    let blocks = StreakNote {
        blocks_line: true,
        ..note(EP)
    };
    let item = Some((dead, blocks));
    w.write_batch(vec![Job::Waiting(item, reply)], &mut between);
    assert_eq!(answer.await.unwrap().unwrap().write, ResultWrite::Written);
    if let Some(t) = waiting {
        t.join().unwrap();
    }
    let line = store.line(EP).unwrap().expect("dlv_2 is left in the line");
    assert_eq!(
        (line.head.as_str(), line.blocked),
        ("dlv_2", false),
        "the resume moved the line on"
    );
    assert!(!endpoints.is_paused(EP), "the operator's resume was undone");
    assert!(!store.endpoint(EP).unwrap().unwrap_or_default().paused);
}
