//! An attempt after its send: the store writer ends it once its result is written (see
//! [`End`]), or a task of its own tries the write again; then its permits go back, the
//! scheduler is told, and the outcome is counted and logged in one place.

use std::sync::Arc;

use super::running::Running;
use super::{Deliverer, SELF_FAILURE_DELAY};
use crate::context::endpoints::EndpointChange;
use crate::policy::AttemptResult;
use crate::redact::url_for_log;
use crate::store::{FinishedAttempt, MessageRecord, StoreError, Transition};

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

/// A written result.
#[derive(Debug)]
pub(super) struct Recorded {
    /// As [`Store::finish_attempts`] answers: the record, or `None` if the result was stale.
    pub message: Option<MessageRecord>,
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
/// be). Dropped unrun (the writer stopped at shutdown), its [`Running`] puts the message
/// back in the queue.
pub(super) struct End {
    pub(super) d: Arc<Deliverer>,
    pub(super) rec: MessageRecord,
    /// Trace and span ids, for its log lines.
    pub(super) ids: (Option<String>, Option<String>),
    pub(super) sent: Sent,
    pub(super) transition: Transition,
    /// The `max_in_flight` permit, held until the result is written.
    pub(super) global: tokio::sync::OwnedSemaphorePermit,
    pub(super) running: Running,
    /// The result again, for another try if the write failed.
    pub(super) retry: (FinishedAttempt, StreakNote),
}

impl End {
    /// On the store writer's thread, once the batch holding the result was written or
    /// failed: ends the attempt, or tries again on a task of its own (see [`record_again`]).
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
        let (item, note) = self.retry.clone();
        match record_again(&self.d, item, note, e).await {
            Written::Now(recorded) => self.written(*recorded),
            Written::Later => self.later(),
            Written::Not => self.not_written().await,
        }
    }

    /// The result is written: permits back, the scheduler told, metrics and logs.
    fn written(self, recorded: Recorded) {
        if recorded.message.is_none() {
            // Someone else moved the message on first (a delete, or a replay of a message
            // this attempt had already finished): this result is not kept.
            tracing::debug!(delivery_id = %self.rec.id, "attempt result was stale; not recorded");
        }
        let End {
            d,
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
            &rec,
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
    rec: &MessageRecord,
    ids: (Option<&str>, Option<&str>),
    sent: &Sent,
    transition: Transition,
    endpoint_change: EndpointChange,
) {
    let (now, status, attempts_made) = (sent.now, sent.status, rec.attempts + 1);
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
        // Off the writer's thread: the alert is a message accepted like any other.
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
