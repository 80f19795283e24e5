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

use super::lifecycle::{Answer, End, Recorded, Streak, StreakNote};
use crate::context::endpoints::EndpointChange;
use crate::context::Context;
use crate::store::{EndpointRecord, Finish, FinishedAttempt, ResultWrite, StoreError};
use crate::sys::blocking::catch;

/// A result to record, with who hears how it went.
pub(super) enum Job {
    /// An attempt's end: the result is read from it, and it goes back to delivery with its
    /// answer once the result is written (its task has ended: nothing waits for it). Boxed:
    /// it is large, and the job queue holds thousands.
    End(Box<End>),
    /// A result for a task waiting for it (one written again), or (`None`) a barrier,
    /// answered once everything queued before it is written.
    Waiting(Option<(FinishedAttempt, StreakNote)>, oneshot::Sender<Answer>),
}

impl Job {
    /// The result to write, borrowed from the job (`None`: a barrier).
    fn finish(&mut self) -> Option<Finish<'_>> {
        match self {
            Job::End(end) => Some(end.finish()),
            Job::Waiting(item, _) => item.as_ref().map(|(item, _)| item.as_finish()),
        }
    }

    /// The result's streak (`None`: a barrier).
    fn streak(&self) -> Option<Streak<'_>> {
        match self {
            Job::End(end) => Some(end.streak()),
            Job::Waiting(item, _) => item.as_ref().map(|(item, note)| Streak {
                endpoint: &note.endpoint,
                blocks_line: note.blocks_line,
                transition: item.transition,
                status: item.attempt.status,
                now_ms: item.now_ms,
            }),
        }
    }

    /// Answers a waiting task; an attempt's end comes back with its answer, for delivery
    /// to run.
    fn answer(self, answer: Answer) -> Option<(Box<End>, Answer)> {
        match self {
            Job::Waiting(_, tx) => {
                let _ = tx.send(answer);
                None
            }
            Job::End(end) => Some((end, answer)),
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

impl Writer {
    /// Writes one batch and answers its waiting tasks; gives back the attempts' ends with
    /// their answers. `between` runs after the results are written and before their
    /// endpoint changes: tests put an operator's resume there.
    pub(super) fn write_batch(&self, mut jobs: Vec<Job>, between: &mut dyn FnMut()) -> Vec<(Box<End>, Answer)> {
        // Taken before the write that blocks a line, held until its pause is written.
        let _gate = jobs
            .iter()
            .any(|j| j.streak().is_some_and(|s| s.blocks_line))
            .then(|| self.ctx.pause_gate());
        // Two results for one message in a batch cannot both apply: the store answers the
        // second as stale, as it would after the first was written.
        // A panic here must not end the thread (every later result would then wait for
        // ever): it fails this batch, whose attempts retry their results as after a failed
        // write, as they did when each result had a blocking task of its own.
        let answers = {
            let mut items: Vec<Finish<'_>> = jobs.iter_mut().filter_map(Job::finish).collect();
            catch(|| self.ctx.store().finish_attempts(&mut items)).unwrap_or_else(|why| {
                tracing::error!(batch = items.len(), panic = %why, "recording attempt results panicked");
                items.iter().map(|_| Err(StoreError::Panicked(why.clone()))).collect()
            })
        };
        between();
        let changes = {
            let streaks: Vec<Streak<'_>> = jobs.iter().filter_map(Job::streak).collect();
            let now_ms = streaks.iter().map(|s| s.now_ms).max().unwrap_or(0);
            catch(|| self.apply_streaks(&streaks, &answers, now_ms)).unwrap_or_else(|why| {
                tracing::error!(panic = %why, "recording endpoint streaks panicked");
                vec![EndpointChange::None; streaks.len()]
            })
        };
        // Answered once the whole batch is written: everything queued before a barrier was
        // in this batch or an earlier one.
        debug_assert_eq!(
            answers.len(),
            jobs.iter().filter(|j| !matches!(j, Job::Waiting(None, _))).count(),
            "one answer per result"
        );
        let mut results = answers.into_iter().zip(changes);
        let mut ended = Vec::with_capacity(jobs.len());
        for job in jobs {
            let written = match job {
                Job::Waiting(None, _) => None,
                _ => results.next(),
            };
            let answer = match written {
                Some((answer, endpoint)) => answer.map(|write| Recorded { write, endpoint }),
                // A barrier.
                None => Ok(Recorded {
                    write: ResultWrite::Stale,
                    endpoint: EndpointChange::None,
                }),
            };
            ended.extend(job.answer(answer));
        }
        ended
    }

    /// Applies the written results to their endpoints' streaks and writes the endpoints that
    /// changed (synced if one was paused: an alert is about to tell someone). A stale result
    /// is not this attempt's to count. A failed write is logged, as a failed streak write
    /// always was: it only shortens a streak. The caller holds the pause gate when a note
    /// blocks a line.
    fn apply_streaks(
        &self,
        streaks: &[Streak<'_>],
        answers: &[Result<ResultWrite, StoreError>],
        now_ms: u64,
    ) -> Vec<EndpointChange> {
        let mut changes = Vec::with_capacity(streaks.len());
        // Endpoint → the record its last change in this batch left.
        let mut dirty: foldhash::HashMap<&str, EndpointRecord> = Default::default();
        let mut synced = false;
        for (note, answer) in streaks.iter().zip(answers) {
            let change = match answer {
                Ok(ResultWrite::Written) => {
                    let change = self
                        .ctx
                        .endpoints()
                        .record(note.endpoint, note.transition, note.status, now_ms, || {
                            self.ctx.store().endpoint(note.endpoint)
                        })
                        .unwrap_or_else(|e| {
                            tracing::error!(endpoint = %crate::redact::url_for_log(note.endpoint), error = %e,
                                "reading endpoint state failed; its streak starts again");
                            EndpointChange::None
                        });
                    // The head of an ordered line died with `on_dead = "block"`: the line was
                    // blocked in the result's own batch; the endpoint pauses, as after a
                    // streak (written with this batch's endpoint writes, and alerted).
                    let paused =
                        matches!(change, EndpointChange::Paused(_)) || self.ctx.endpoints().is_paused(note.endpoint);
                    if note.blocks_line && !paused {
                        EndpointChange::Paused(self.ctx.endpoints().set_paused(note.endpoint, true, now_ms))
                    } else {
                        change
                    }
                }
                _ => EndpointChange::None,
            };
            if let EndpointChange::Changed(rec) | EndpointChange::Paused(rec) = &change {
                synced |= matches!(change, EndpointChange::Paused(_));
                dirty.insert(note.endpoint, rec.clone());
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
