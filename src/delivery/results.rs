//! Attempt results, written in batches. Attempts that end while the store writer (see
//! `writer`) is busy are recorded together in one `WriteBatch` in its next turn, beside
//! that turn's accepts: under load, one write serves many attempts, and no async worker
//! ever waits on it. Idle, a lone result is written at once.
//!
//! The same thread applies each written result to its endpoint's permanent-failure streak
//! and writes the endpoints that changed in one more write per batch, so a permanent
//! failure costs about what a success does: no write of its own, no task of its own, and
//! the store read that brings back a forgotten endpoint's streak happens here, off the
//! async workers.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::lifecycle::{End, Recorded, StreakNote};
use crate::context::endpoints::EndpointChange;
use crate::context::Context;
use crate::store::{EndpointRecord, FinishedAttempt, MessageRecord, StoreError};

pub(super) type Answer = Result<Recorded, StoreError>;

/// A result to record, or (`None`) a barrier answered once everything queued before it is
/// written.
pub(super) struct Job {
    pub(super) item: Option<(FinishedAttempt, StreakNote)>,
    pub(super) reply: Reply,
}

/// Who hears how a result went.
pub(super) enum Reply {
    /// A task waiting for it (a barrier, a result tried again).
    Waiting(oneshot::Sender<Answer>),
    /// An attempt's end, which the writer thread runs: it has no task of its own to wake.
    /// Boxed: it is large, and the job queue holds thousands.
    End(Box<End>),
}

impl Reply {
    fn send(self, answer: Answer) {
        match self {
            Reply::Waiting(tx) => {
                let _ = tx.send(answer);
            }
            // A panic in an attempt's end must not end the thread (every later result
            // would wait for ever); what it held is dropped as after a panicking attempt.
            Reply::End(end) => {
                if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| end.recorded(answer))) {
                    tracing::error!(panic = %panic_text(panic.as_ref()), "ending an attempt panicked");
                }
            }
        }
    }
}

/// What the writer thread works with. A batch that blocks a line holds the pause gate from
/// before the block is written to the pause it makes, so a resume lands before both (the
/// line blocks and pauses after it) or after both (it unblocks and resumes), never between
/// them, where the pause would undo it; endpoint writes hold the persist lock as every
/// endpoint write does (see `context`).
pub(super) struct Writer {
    pub(super) ctx: Arc<Context>,
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

impl Writer {
    /// Writes one batch, then ends its attempts. `between` runs after the results are written and before their
    /// endpoint changes: tests put an operator's resume there.
    pub(super) fn write_batch(&self, jobs: Vec<Job>, between: &mut dyn FnMut()) {
        let (mut items, mut notes, mut replies, mut barriers) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for Job { item, reply } in jobs {
            match item {
                Some((item, note)) => {
                    items.push(item);
                    notes.push(note);
                    replies.push(reply);
                }
                None => barriers.push(reply),
            }
        }
        // Taken before the write that blocks a line, held until its pause is written.
        let _gate = notes.iter().any(|n| n.blocks_line).then(|| self.ctx.pause_gate());
        // Two results for one message in a batch cannot both apply: the store answers the
        // second as stale, as it would after the first was written.
        // A panic here must not end the thread (every later result would then wait for
        // ever): it fails this batch, whose attempts retry their results as after a failed
        // write, as they did when each result had a blocking task of its own.
        let answers = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.ctx.store().finish_attempts(&mut items)
        }))
        .unwrap_or_else(|panic| {
            let why = panic_text(panic.as_ref());
            tracing::error!(batch = items.len(), panic = %why, "recording attempt results panicked");
            items.iter().map(|_| Err(StoreError::Panicked(why.clone()))).collect()
        });
        between();
        let now_ms = items.iter().map(|i| i.now_ms).max().unwrap_or(0);
        let changes = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.apply_streaks(&items, &notes, &answers, now_ms)
        }))
        .unwrap_or_else(|panic| {
            tracing::error!(panic = %panic_text(panic.as_ref()), "recording endpoint streaks panicked");
            vec![EndpointChange::None; notes.len()]
        });
        for ((reply, answer), endpoint) in replies.into_iter().zip(answers).zip(changes) {
            reply.send(answer.map(|message| Recorded { message, endpoint }));
        }
        // Everything queued before a barrier was in this batch or an earlier one.
        for barrier in barriers {
            barrier.send(Ok(Recorded {
                message: None,
                endpoint: EndpointChange::None,
            }));
        }
    }

    /// Applies the written results to their endpoints' streaks and writes the endpoints that
    /// changed (synced if one was paused: an alert is about to tell someone). A stale result
    /// is not this attempt's to count. A failed write is logged, as a failed streak write
    /// always was: it only shortens a streak. The caller holds the pause gate when a note
    /// blocks a line.
    fn apply_streaks(
        &self,
        items: &[FinishedAttempt],
        notes: &[StreakNote],
        answers: &[Result<Option<MessageRecord>, StoreError>],
        now_ms: u64,
    ) -> Vec<EndpointChange> {
        let mut changes = Vec::with_capacity(notes.len());
        // Endpoint → the record its last change in this batch left.
        let mut dirty: foldhash::HashMap<&str, EndpointRecord> = Default::default();
        let mut synced = false;
        for ((item, note), answer) in items.iter().zip(notes).zip(answers) {
            let change = match answer {
                Ok(Some(_)) => {
                    let (transition, status) = (item.transition, item.attempt.status);
                    let change = self
                        .ctx
                        .endpoints()
                        .record(&note.endpoint, transition, status, now_ms, || {
                            self.ctx.store().endpoint(&note.endpoint)
                        })
                        .unwrap_or_else(|e| {
                            tracing::error!(endpoint = %crate::redact::url_for_log(&note.endpoint), error = %e,
                                "reading endpoint state failed; its streak starts again");
                            EndpointChange::None
                        });
                    // The head of an ordered line died with `on_dead = "block"`: the line was
                    // blocked in the result's own batch; the endpoint pauses, as after a
                    // streak (written with this batch's endpoint writes, and alerted).
                    let paused =
                        matches!(change, EndpointChange::Paused(_)) || self.ctx.endpoints().is_paused(&note.endpoint);
                    if note.blocks_line && !paused {
                        EndpointChange::Paused(self.ctx.endpoints().set_paused(&note.endpoint, true, now_ms))
                    } else {
                        change
                    }
                }
                _ => EndpointChange::None,
            };
            if let EndpointChange::Changed(rec) | EndpointChange::Paused(rec) = &change {
                synced |= matches!(change, EndpointChange::Paused(_));
                dirty.insert(&note.endpoint, rec.clone());
            }
            changes.push(change);
        }
        if !dirty.is_empty() {
            let _order = self.ctx.persist_order();
            // The state as it is now, not as each result left it: a resume may have
            // overtaken it, and the last write must be the latest state. (An entry with an
            // unwritten change is never forgotten, so the fallback is for safety only.)
            let (recs, changes): (Vec<_>, Vec<_>) = dirty
                .into_iter()
                .map(|(k, last)| {
                    let (rec, n) = self
                        .ctx
                        .endpoints()
                        .loaded_record(k)
                        .map_or((last, None), |(r, n)| (r, Some(n)));
                    ((k.to_string(), rec), n)
                })
                .unzip();
            match self.ctx.store().put_endpoints(&recs, now_ms, synced) {
                Ok(()) => {
                    for ((key, _), n) in recs.iter().zip(changes) {
                        if let Some(n) = n {
                            self.ctx.endpoints().saved(key, n);
                        }
                    }
                }
                Err(e) => tracing::error!(endpoints = recs.len(), error = %e, "saving endpoint state failed"),
            }
        }
        changes
    }
}

#[cfg(test)]
#[path = "tests_results.rs"]
mod tests;
