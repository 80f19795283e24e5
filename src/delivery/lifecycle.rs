//! One message's life after its accept, top to bottom. The states are values:
//!
//! 1. **Accepted** (`accept`): stored durably in the store writer's synced batch; when its
//!    first attempt can start at once it is written already leased; when only its host's
//!    cap is in the way it is written so too and waits in memory for its host (`waiting`);
//!    else it waits in the due queue for the scheduler, which leases it (`scheduler`).
//! 2. **Leased** ([`Leased`]): record and payload in memory, with an [`AttemptPermit`];
//!    [`attempt`] runs on a task of its own.
//! 3. **Sent** ([`Sent`]): the request built and signed afresh (`request`), sent within the
//!    policy's timeout; the host permit goes back as soon as the receiver answered.
//! 4. **Decided**: `policy::decide` turns the answer into a [`Transition`] (delivered, retry
//!    at, dead) and a [`FinishedAttempt`] to record, with its [`StreakNote`].
//! 5. **Recorded** ([`Recorded`]): the store writer writes the result in its next turn and
//!    hands the attempt's [`End`] back with the answer, a value ([`Handback`]); [`settle`],
//!    on delivery's runtime, ends it: the global permit goes back, the scheduler is told,
//!    the outcome counted and logged, the attempt leaves the registry. A failed write is
//!    tried again on a task of its own ([`End::again`]).
//!
//! The writer starts and ends no attempt: what its turns give back (first attempts its
//! accepts claimed, attempts whose results it wrote) comes back to [`settle`] as values.
//!
//! Courier's own failures (a request that cannot be built, a panic, a result that cannot be
//! written) count no attempt: the message goes back to the queue (`requeue`, `running`).

use std::sync::Arc;

use super::request::{build, response_error, Echo};
use super::running::Running;
use super::{AttemptPermit, Deliverer, SELF_FAILURE_DELAY};
use crate::config::Config;
use crate::context::endpoints::EndpointChange;
use crate::outbound::trace::{new_span_id, TraceParent};
use crate::outbound::transport::{OutboundRequest, TransportError};
use crate::policy::circuit::{CircuitChange, HostOutcome};
use crate::policy::{decide, AttemptResult, Limits};
use crate::redact::url_for_log;
use crate::store::{
    AttemptRecord, Claim, Finish, FinishedAttempt, Leased, MessageRecord, ResultWrite, StoreError, Transition,
};

/// Runs one attempt of a claimed message: build the request, send it, judge the answer,
/// and hand the result to the store writer, which ends the attempt once it is written
/// ([`End`]): this task does not wait for the write, so nothing wakes it after.
///
/// The host part of `permit` is given back the moment the receiver has answered (or the
/// send failed): the host's cap limits requests at the receiver, and the result write that
/// follows may wait behind other writes' fsync without holding a receiver slot. The global
/// part is held until the result is written.
pub(super) async fn attempt(d: Arc<Deliverer>, claimed: Leased, permit: AttemptPermit, running: Running) {
    let Leased {
        record: rec,
        mut payload,
        claim,
    } = claimed;
    let started_ms = d.ctx.clock().now_ms();
    // What the config says now for this endpoint and route: a lookup, nothing allocated.
    // One settings value for the whole attempt, whatever a reload does meanwhile.
    let settings = d.ctx.settings();
    let policy = settings.policies.resolve(rec.route.as_deref(), &rec.endpoint);
    // A span of its own per attempt, so retries show as siblings under the app's span.
    let trace = TraceParent::from_headers(&payload.headers);
    let span_id = trace.as_ref().map(|_| d.with_rng(new_span_id));
    let traceparent = trace.as_ref().zip(span_id.as_deref()).map(|(t, s)| t.child(s));
    let trace_id = trace.map(|t| t.trace_id);
    let timeout = policy.request_timeout;
    // The receiver checks the signature's timestamp against its own wall clock.
    let wall_ms = d.ctx.clock().wall_ms();
    let req = match build(&settings.config, &rec, &mut payload, wall_ms, timeout, traceparent) {
        Ok(req) => req,
        Err(e) => {
            drop(permit);
            d.start_waiting(&rec.host);
            tracing::error!(delivery_id = %rec.id, event_id = %rec.event_id, error = %e,
                "cannot build the attempt; message stays pending until the config is fixed");
            // Boxed: a rare path whose future would otherwise size every attempt's.
            Box::pin(d.requeue(&rec.id, started_ms + SELF_FAILURE_DELAY.as_millis() as u64)).await;
            running.settle();
            return;
        }
    };
    let echo = Echo::of(&payload, req.body.clone());
    let (sent, global) = send(&d, &settings.config, &rec, req, permit, started_ms, &echo).await;
    let limits = Limits {
        max_attempts: rec.max_attempts,
        give_up_at_ms: rec.give_up_at_ms,
    };
    let transition = d.with_rng(|rng| {
        decide(
            &sent.result,
            rec.attempts + 1,
            &limits,
            &policy,
            sent.now,
            sent.wall,
            rng,
        )
    });
    let attempt = AttemptRecord {
        at_ms: started_ms,
        status: sent.status,
        error: sent.error.clone(),
        duration_ms: sent.duration.as_millis().min(u32::MAX as u128) as u32,
        policy_revision: Some(policy.revision()),
        span_id: span_id.clone(),
    };
    // Boxed now, as the writer's job holds it: moved as a pointer from here on.
    let end = Box::new(End {
        d: d.clone(),
        number: rec.attempts + 1,
        rec,
        ids: (trace_id, span_id),
        sent,
        transition,
        global,
        running,
        attempt,
        claim,
    });
    d.record_ending(end).await;
}

/// What the store writer hands back after a write, in its order: first attempts to start,
/// or attempts whose results it wrote (or failed to), to end. Values, so that no attempt
/// starts or ends on the writer's thread. The queue of them ([`Handbacks`]) has no bound of
/// its own and needs none: every attempt in it holds a `delivery.max_in_flight` permit. An
/// end may come after its message was leased again (its result ended the lease): the
/// registry tells the two attempts apart (see `running::Key`).
pub(super) enum Handback {
    /// First attempts an accept batch claimed (those without a permit wait for their
    /// host), and whether permits went back unused (hosts' lines may move).
    Start(Vec<super::accept::Start>, bool),
    /// Attempts whose results a batch wrote, with the writer's answer for each.
    Ended(Vec<(Box<End>, Answer)>),
}

/// What the store writer handed back and delivery has not started or ended yet, in the
/// writer's order. A queue rather than a channel so that the simulator can settle it in the
/// middle of a scheduler pass, as delivery's runtime does beside one.
#[derive(Default)]
pub(super) struct Handbacks {
    queue: std::sync::Mutex<std::collections::VecDeque<Handback>>,
    ready: tokio::sync::Notify,
}

impl Handbacks {
    /// Queues `back` and wakes [`settle`].
    pub(super) fn push(&self, back: Handback) {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).push_back(back);
        self.ready.notify_one();
    }

    /// Starts and ends everything queued, in order.
    pub(super) fn settle_now(&self, d: &Arc<Deliverer>) {
        loop {
            let next = self.queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
            match next {
                Some(back) => settle_one(d, back),
                None => return,
            }
        }
    }
}

/// Delivery's side of the store writer, on delivery's runtime: starts the first attempts
/// the accepts claimed and ends the attempts whose results were written, in the order the
/// writer handed them back. One task for all: a turn wakes one thread, not one per attempt.
pub(super) async fn settle(d: std::sync::Weak<Deliverer>, back: Arc<Handbacks>) {
    loop {
        back.ready.notified().await;
        let Some(d) = d.upgrade() else { return };
        back.settle_now(&d);
    }
}

/// Starts or ends what one writer turn handed back.
fn settle_one(d: &Arc<Deliverer>, back: Handback) {
    match back {
        // A panic in one start or end must not end this task (every later one would
        // wait for ever): what it held is dropped as after a panicking attempt.
        Handback::Start(start, freed) => {
            for (claimed, permit, keep) in start {
                or_log("starting an attempt", || match permit {
                    Some(permit) => {
                        d.dispatch(claimed, permit);
                        drop(keep);
                    }
                    None => d.wait_for_host(claimed, keep),
                });
            }
            if freed {
                or_log("starting the hosts' lines", || d.start_all_waiting());
            }
        }
        Handback::Ended(ended) => {
            for (end, answer) in ended {
                or_log("ending an attempt", || end.recorded(answer));
            }
        }
    }
}

/// Runs `f`; a panic in it is logged as `what` panicking, and the settling task goes on.
fn or_log(what: &str, f: impl FnOnce()) {
    if let Err(why) = crate::sys::blocking::catch(f) {
        tracing::error!(panic = %why, "{what} panicked");
    }
}

/// Sends the request, counted in its endpoint's in-flight number exactly while it is out;
/// gives the host permit back once answered and returns the global one.
async fn send(
    d: &Arc<Deliverer>,
    config: &Config,
    rec: &MessageRecord,
    req: OutboundRequest,
    permit: AttemptPermit,
    started_ms: u64,
    echo: &Echo<'_>,
) -> (Sent, tokio::sync::OwnedSemaphorePermit) {
    d.ctx.metrics().attempt_started();
    // The guard's drop ends the count once, whether the send returns, panics or is cut off.
    let counted = InFlight::start(d, &rec.endpoint, started_ms);
    let timer = crate::clock::Stopwatch::start();
    let answer = d.transport.send(req).await;
    let duration = timer.elapsed();
    let (now, wall) = (d.ctx.clock().now_ms(), d.ctx.clock().wall_ms());
    drop(counted);
    host_outcome(d, config, &rec.host, permit.host_epoch(), &answer, now);
    let global = d.host_permit_returned(permit);
    d.start_waiting(&rec.host);
    let (result, status, error) = match &answer {
        Ok(resp) => (
            AttemptResult::Status {
                code: resp.status,
                retry_after: resp.retry_after.clone(),
            },
            Some(resp.status),
            (!(200..300).contains(&resp.status)).then(|| response_error(resp.status, &resp.body, echo)),
        ),
        Err(TransportError::EgressDenied(msg)) => (AttemptResult::EgressDenied, None, Some(msg.clone())),
        Err(e) => (AttemptResult::NetworkError, None, Some(e.to_string())),
    };
    // Shown to operators (admin API, CLI): nothing that can disguise itself on a terminal.
    let error = error.map(|e| crate::redact::clean(&e));
    let sent = Sent {
        result,
        status,
        error,
        duration,
        now,
        wall,
    };
    (sent, global)
}

/// One attempt counted as in flight to its endpoint until dropped.
struct InFlight<'a> {
    d: &'a Deliverer,
    endpoint: &'a str,
}

impl<'a> InFlight<'a> {
    fn start(d: &'a Deliverer, endpoint: &'a str, now_ms: u64) -> Self {
        d.ctx.endpoints().started(endpoint, now_ms);
        InFlight { d, endpoint }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.d
            .ctx
            .endpoints()
            .finished(self.endpoint, self.d.ctx.clock().now_ms());
    }
}

/// Tells the host's circuit breaker how the attempt went; logs and counts a change.
fn host_outcome(
    d: &Deliverer,
    config: &Config,
    host: &str,
    epoch: u64,
    sent: &Result<crate::outbound::transport::InboundResponse, TransportError>,
    now: u64,
) {
    let outcome = match sent {
        Ok(resp) if resp.retry_after.is_none() && config.circuit.counts(resp.status) => HostOutcome::Failed,
        Ok(_) => HostOutcome::Answered,
        Err(TransportError::EgressDenied(_)) => HostOutcome::Neutral,
        Err(_) => HostOutcome::Failed,
    };
    match d.hosts.record(host, outcome, epoch, now) {
        None => {}
        Some(CircuitChange::Opened { probe_at_ms }) => {
            d.ctx.metrics().circuit_opened();
            tracing::warn!(
                host,
                probe_in_ms = probe_at_ms.saturating_sub(now),
                "host circuit open: its messages wait (no attempts counted) until a probe gets an answer"
            );
        }
        Some(CircuitChange::Recovering) => {
            tracing::info!(host, "host answered the probe; circuit ramping up to its cap");
            d.ctx.wake();
        }
        Some(CircuitChange::Closed) => {
            tracing::info!(host, "host circuit closed");
            d.ctx.wake();
        }
    }
}

/// What came back from one attempt's send.
pub(super) struct Sent {
    pub(super) result: AttemptResult,
    pub(super) status: Option<u16>,
    /// What went wrong, cleaned for operators' terminals.
    pub(super) error: Option<String>,
    pub(super) duration: std::time::Duration,
    /// When the answer came.
    pub(super) now: u64,
    /// The wall clock then: what a `Retry-After` date is counted from.
    pub(super) wall: u64,
}

/// What a result means for its endpoint besides its transition and status: whose streak
/// it counts in, and whether it blocks the endpoint's ordered line (known before the write,
/// so the writer can take the pause gate first).
#[derive(Debug, Clone)]
pub(super) struct StreakNote {
    /// Endpoint key.
    pub endpoint: String,
    /// The result kills the head of an ordered line with `on_dead = "block"` (see
    /// `blocks_its_line`): written, it blocks the line and pauses the endpoint.
    pub blocks_line: bool,
}

/// What a written result means for its endpoint's streak, as its job says it: the
/// borrowed form of a [`StreakNote`] with the result's transition, status and time.
pub(super) struct Streak<'a> {
    pub(super) endpoint: &'a str,
    /// See [`StreakNote::blocks_line`].
    pub(super) blocks_line: bool,
    pub(super) transition: Transition,
    pub(super) status: Option<u16>,
    pub(super) now_ms: u64,
}

/// How the store writer answers a result: written (or stale), or why not.
pub(super) type Answer = Result<Recorded, StoreError>;

/// A written result.
#[derive(Debug)]
pub(super) struct Recorded {
    /// As [`Store::finish_attempts`] answers: written, or stale.
    pub write: ResultWrite,
    /// What it did to the endpoint (already written).
    pub endpoint: EndpointChange,
}

/// Whether this attempt's result blocks its ordered line (and so pauses the endpoint).
pub(super) fn blocks_its_line(rec: &MessageRecord, transition: Transition) -> bool {
    matches!(transition, Transition::Dead(_)) && rec.fifo.is_some_and(|f| f.on_dead == crate::model::OnDead::Block)
}

/// Logs an attempt's outcome with the fields that identify it; `trace_id` and `span_id`
/// only when the message carries a trace context, so its log lines can be found from the app's trace.
macro_rules! attempt_event {
    ($level:ident, $rec:expr, $trace:expr, $attempt:expr, $($rest:tt)*) => {{
        let (trace_id, span_id): (Option<&str>, Option<&str>) = $trace;
        tracing::$level!(
            delivery_id = %$rec.id,
            event_id = %$rec.event_id,
            endpoint = %url_for_log(&$rec.endpoint),
            attempt = $attempt,
            trace_id,
            span_id,
            $($rest)*
        )
    }};
}

/// An attempt after its send: what it must do once its result is written (or could not
/// be). Dropped unrun (the writer or delivery's runtime stopped at shutdown), its
/// [`Running`] puts the message back in the queue.
pub(super) struct End {
    pub(super) d: Arc<Deliverer>,
    /// The attempt's number (`attempts + 1` of the record it started from).
    pub(super) number: u32,
    /// The record it started from; one written in flight at accept is the one its result
    /// is staged on, and is left as staged (see [`End::finish`]).
    pub(super) rec: MessageRecord,
    /// Trace and span ids, for its log lines.
    pub(super) ids: (Option<String>, Option<String>),
    pub(super) sent: Sent,
    pub(super) transition: Transition,
    /// The `max_in_flight` permit, held until the result is written.
    pub(super) global: tokio::sync::OwnedSemaphorePermit,
    pub(super) running: Running,
    /// The attempt as recorded: what [`End::result`] makes the result to write from, again
    /// if a write failed.
    pub(super) attempt: AttemptRecord,
    /// How the message was taken: a result of one written in flight at accept carries its
    /// record to the store.
    pub(super) claim: Claim,
}

impl End {
    /// The result to write, borrowed from the attempt: a message written in flight at
    /// accept has its result staged on the record the attempt carries (nothing but a delete
    /// changes it meanwhile), so nothing is copied or read to record a first attempt.
    pub(super) fn finish(&mut self) -> Finish<'_> {
        let End {
            rec,
            running,
            attempt,
            transition,
            sent,
            claim,
            ..
        } = self;
        Finish {
            id: running.id(),
            attempt,
            transition: *transition,
            now_ms: sent.now,
            carried: (*claim == Claim::AtAccept).then_some(rec),
        }
    }

    /// What the result means for its endpoint's streak.
    pub(super) fn streak(&self) -> Streak<'_> {
        Streak {
            endpoint: &self.rec.endpoint,
            blocks_line: blocks_its_line(&self.rec, self.transition),
            transition: self.transition,
            status: self.attempt.status,
            now_ms: self.sent.now,
        }
    }

    /// The result and its streak, owned: to write it again.
    fn result(&self) -> (FinishedAttempt, StreakNote) {
        let item = FinishedAttempt {
            id: self.rec.id.clone(),
            attempt: self.attempt.clone(),
            transition: self.transition,
            now_ms: self.sent.now,
        };
        let note = StreakNote {
            endpoint: self.rec.endpoint.clone(),
            blocks_line: blocks_its_line(&self.rec, self.transition),
        };
        (item, note)
    }

    /// Once the batch holding the result was written or failed (see [`settle`]): ends the
    /// attempt, or tries again on a task of its own (see [`record_again`]).
    pub(super) fn recorded(self, answer: Result<Recorded, StoreError>) {
        match answer {
            Ok(recorded) => self.written(recorded),
            Err(e) => {
                let rt = self.d.ctx.runtime().clone();
                rt.spawn(self.again(e));
            }
        }
    }

    /// On delivery's runtime, after the store writer failed to write the result (`e`).
    async fn again(self, e: StoreError) {
        // Tried again on the record as stored, not the one carried: what a failed batch
        // left behind (even written, had it failed after its commit) reads as it is, and a
        // result already applied then comes back stale instead of counted twice.
        let (item, note) = self.result();
        match record_again(&self.d, item, note, e).await {
            Written::Now(recorded) => self.written(*recorded),
            Written::Later => self.later(),
            Written::Not => self.not_written().await,
        }
    }

    /// The result is written: permits back, the scheduler told, metrics and logs.
    fn written(self, recorded: Recorded) {
        if recorded.write == ResultWrite::Stale {
            // Someone else moved the message on first (a delete, or a replay of a message
            // this attempt had already finished): this result is not kept.
            tracing::debug!(delivery_id = %self.rec.id, "attempt result was stale; not recorded");
        }
        let End {
            d,
            number,
            rec,
            ids,
            sent,
            transition,
            global,
            running,
            ..
        } = self;
        drop(global);
        if matches!(transition, Transition::RetryAt(_)) || rec.fifo.is_some() {
            // A new due entry, or the next of its line promoted with this result: maybe
            // earlier than the scheduler's next wake-up.
            d.ctx.wake();
        } else {
            d.wake_if_waiting();
        }
        report(
            &d,
            (&rec, number),
            (ids.0.as_deref(), ids.1.as_deref()),
            &sent,
            transition,
            recorded.endpoint,
        );
        running.settle();
    }

    /// Its record does not read: the result is written once it does (the message stays
    /// leased meanwhile, so it is not sent again), and the permits go now.
    fn later(self) {
        drop(self.global);
        self.d.ctx.wake();
        self.running.settle();
    }

    /// Courier's failure, not the receiver's: no attempt counted, and the message goes back
    /// to the queue (sent again, as after a crash).
    async fn not_written(self) {
        drop(self.global);
        self.d.ctx.metrics().attempt_abandoned();
        let due = self.sent.now + SELF_FAILURE_DELAY.as_millis() as u64;
        self.d.requeue(&self.rec.id, due).await;
        self.running.settle();
    }
}

/// Metrics, one log line per outcome, and a pause's warning and alert. Successes and
/// retries log at debug: at thousands of messages a second an info line each would cost
/// more than the delivery (metrics count them); a dead letter is always worth a warning.
fn report(
    d: &Arc<Deliverer>,
    (rec, attempts_made): (&MessageRecord, u32),
    ids: (Option<&str>, Option<&str>),
    sent: &Sent,
    transition: Transition,
    endpoint_change: EndpointChange,
) {
    let (now, status) = (sent.now, sent.status);
    let error = sent.error.as_deref();
    d.ctx
        .metrics()
        .attempt_finished(transition, sent.duration.as_micros() as u64);
    match transition {
        Transition::Delivered => {
            d.ctx.metrics().delivered(now.saturating_sub(rec.accepted_at_ms) * 1000);
            let duration_ms = sent.duration.as_millis() as u64;
            attempt_event!(debug, rec, ids, attempts_made, status, duration_ms, "delivered");
        }
        Transition::RetryAt(at) => {
            let retry_in_ms = at.saturating_sub(now);
            attempt_event!(
                debug,
                rec,
                ids,
                attempts_made,
                status,
                error,
                retry_in_ms,
                "retry scheduled"
            );
        }
        Transition::Dead(reason) => {
            d.ctx.metrics().dead(reason);
            let reason = reason.as_str();
            attempt_event!(warn, rec, ids, attempts_made, status, error, reason, "dead-lettered");
        }
    }
    // The streak was written with the result; a pause is worth a warning and an alert.
    if let EndpointChange::Paused(ep) = endpoint_change {
        if blocks_its_line(rec, transition) {
            tracing::warn!(endpoint = %url_for_log(&rec.endpoint), delivery_id = %rec.id,
                "endpoint paused: the head of its ordered line is dead (on_dead = block); resume it with `courier endpoints resume` or replay the message");
        } else {
            tracing::warn!(endpoint = %url_for_log(&rec.endpoint), streak = ep.streak, last_status = ep.last_status,
                "endpoint paused after consecutive permanent failures; resume it with `courier endpoints resume`");
        }
        // On a task of its own: the alert is a message accepted like any other, which waits
        // for the store writer.
        let (d, endpoint) = (d.clone(), rec.endpoint.clone());
        d.ctx
            .runtime()
            .clone()
            .spawn(async move { super::alert::endpoint_paused(&d, &endpoint, &ep, now).await });
    }
}

/// Writes an attempt's result again after the store writer failed to (`error`). Until it
/// lands the message stays leased and cannot start again, and a failed write wrote nothing.
///
/// What a failure means decides what comes next. A store that refuses writes (a full disk,
/// an I/O error) refuses them for every message: the write is tried again with backoff (up
/// to [`MAX_RESULT_WAITS`] result retry waits: 30 s) for as long as it takes, the lease and the `max_in_flight`
/// permit kept, so that nothing is sent again meanwhile and the permits hold dispatch back
/// (giving up would put the message back in the queue to be sent again every few seconds,
/// none of it recorded: a flood). A failure of this message alone (its record no longer
/// reads) does not heal by waiting here: after `STORE_TRIES` tries the write goes on in
/// the background (`Written::Later`, see `requeue`) so that the attempt's permits are not
/// held for ever and the message is not sent again; past that background's bound, the
/// attempt is given up (`Written::Not`). `Not` too once the store is closed (shutdown: the
/// message is in flight at restart).
async fn record_again(d: &Arc<Deliverer>, item: FinishedAttempt, streak: StreakNote, error: StoreError) -> Written {
    let mut answer = Err(error);
    let mut n = 0u32;
    loop {
        match answer {
            Ok(recorded) => return Written::Now(Box::new(recorded)),
            Err(StoreError::Closed) => return Written::Not,
            Err(e) => {
                tracing::error!(delivery_id = %item.id, error = %e, tries = n + 1, "recording an attempt failed");
                if matches!(e, StoreError::Codec { .. }) && n + 1 >= super::STORE_TRIES {
                    return match d.record_later(item, streak, e) {
                        true => Written::Later,
                        false => Written::Not,
                    };
                }
            }
        }
        tokio::time::sleep(d.store_backoff(n).min(d.result_retry() * MAX_RESULT_WAITS)).await;
        n = n.saturating_add(1);
        answer = d.record(item.clone(), streak.clone()).await;
    }
}

/// What became of an attempt's result.
enum Written {
    /// Written (after a retry: boxed, as it is rare).
    Now(Box<Recorded>),
    /// To be written in the background once its record reads.
    Later,
    /// Not written: the attempt is given up.
    Not,
}

/// The longest wait between two tries of a result write the store refused, in result retry
/// waits (1 s each; the simulator shortens them).
const MAX_RESULT_WAITS: u32 = 30;
