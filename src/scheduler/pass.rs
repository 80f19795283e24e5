//! One pass: a walk over what is due now, deciding for each entry (see the module doc of
//! `scheduler`), with `[fleet]` on the fleet's leases for every entry the local limits let
//! through (one call per pass, or per `claim_batch` of them), then the pass's writes: parks
//! for paused endpoints, leases and dispatches for the entries admitted, and the due floor
//! raised past what was seen.

use std::collections::HashSet;
use std::sync::Arc;

use super::{earliest, Limits};
use crate::delivery::{AttemptPermit, Deliverer, Refusal};
use crate::store::{DueEntry, FloorMark, ScanEnd, ScanStep, StoreError};

/// A position in the due index: (due time, id).
type Key = (u64, String);

/// What one pass found.
#[derive(Debug, Default)]
pub(crate) struct Pass {
    pub(super) dispatched: usize,
    /// Messages moved aside for paused endpoints.
    pub(super) parked: usize,
    /// Entries looked at.
    pub(super) scanned: usize,
    /// Stopped on a long blocked run (a resume point is set).
    pub(super) stopped_on_run: bool,
    /// Walked to the end of what is due.
    pub(super) exhausted: bool,
    pub(super) wake_at: Option<u64>,
    pub(super) cut: bool,
    pub(super) store_error: bool,
    /// Stopped because `delivery.max_in_flight` attempts were running.
    pub(super) global_full: bool,
}

impl Pass {
    fn wake_no_later_than(&mut self, at: u64) {
        self.wake_at = earliest(self.wake_at, Some(at));
    }
}

/// One walk over what is due now (from the due floor, or from where the last pass
/// stopped); returns what it found and where the next pass should resume.
pub(super) fn pass(d: &Arc<Deliverer>, limits: &Limits, resumed: Option<Key>) -> (Pass, Option<Key>) {
    pass_with(d, limits, resumed, &mut || {})
}

/// [`pass`] with `between` run after the scan decided and before its writes: the simulator
/// puts operator actions there, the interleaving a real resume or delete can hit.
pub(crate) fn pass_with(
    d: &Arc<Deliverer>,
    limits: &Limits,
    resumed: Option<Key>,
    between: &mut dyn FnMut(),
) -> (Pass, Option<Key>) {
    let now = d.context().clock().now_ms();
    // From here to the end of the pass a freed permit wakes the loop (see `set_queue_waiting`).
    d.pass_started();
    let mut walk = Walk::default();
    let after = resumed.as_ref().map(|(due, id)| (*due, id.as_str()));
    let scanned = d.context().store().scan_due(now, limits.scan_budget, after, |entry| {
        let step = walk.visit(d, limits, now, entry);
        walk.stopped |= step == ScanStep::Stop;
        step
    });
    walk.lease(d, now);
    between();
    walk.park(d, now);
    walk.dispatch(d, now);
    // Whether due messages were left waiting: until a pass leaves none, new messages
    // queue behind them instead of starting at accept.
    let exhausted = matches!(scanned, Ok((ScanEnd::Exhausted { .. }, _)));
    let p = &walk.pass;
    d.set_queue_waiting(!exhausted || resumed.is_some() || walk.first_left.is_some() || p.global_full || p.store_error);
    walk.end(d, now, scanned, resumed.is_some())
}

/// What a pass carries through its walk and its writes.
#[derive(Default)]
struct Walk {
    pass: Pass,
    /// Hosts at their cap (or breaker open), endpoints out of tokens, and endpoints at
    /// their max_in_flight cap this pass (bounded by the entries one pass reads).
    full_hosts: HashSet<String>,
    limited: HashSet<String>,
    capped: HashSet<String>,
    /// Admitted entries and their permits, index for index.
    ready: Vec<DueEntry>,
    permits: Vec<AttemptPermit>,
    /// With `[fleet]` on, the entries the local limits let through and their permits, index
    /// for index, waiting for the fleet's leases (asked for together, see [`Walk::lease`]).
    wanting: Vec<DueEntry>,
    wanting_permits: Vec<AttemptPermit>,
    to_park: Vec<DueEntry>,
    /// Entries held back by their host's cap alone, leased to wait in its line in memory
    /// (`delivery::waiting`): the next permits the host gives back start them, with no pass.
    to_line: Vec<DueEntry>,
    /// Hosts refused for their cap alone this pass (a local permit coming back starts their
    /// lines' waiters): not an open breaker, which no returning permit would follow.
    capped_hosts: HashSet<String>,
    /// The earliest entry this pass leaves in the queue, and the last one it looked at:
    /// together they say how far the due floor may rise. Keys (due time, id): the floor
    /// can rise within a millisecond, which matters when a resume made a whole backlog due
    /// in one.
    first_left: Option<Key>,
    /// The last entry looked at, in a buffer reused for every entry (the walk's hot path
    /// allocates nothing per entry it only looks at).
    last_seen: Option<u64>,
    last_id: String,
    skipped_in_a_row: usize,
    stopped_at: Option<Key>,
    /// The walk told the scan to stop (a run, every permit taken, a full claim batch): a
    /// scan cut without it was cut by the scan budget.
    stopped: bool,
}

impl Walk {
    /// Decides one due entry.
    fn visit(&mut self, d: &Arc<Deliverer>, limits: &Limits, now: u64, entry: DueEntry) -> ScanStep {
        let due_ms = entry.due_ms;
        self.last_seen = Some(due_ms);
        self.last_id.clear();
        self.last_id.push_str(&entry.id);
        self.pass.scanned += 1;
        if self.skipped_in_a_row >= limits.skip_run {
            self.first_left.get_or_insert_with(|| (due_ms, entry.id.clone()));
            self.stopped_at = Some((due_ms, entry.id));
            return ScanStep::Stop;
        }
        let (host, endpoint) = (&entry.routing.host, &entry.routing.endpoint);
        let ctx = d.context();
        let dispatchable = if ctx.store().is_leased(&entry.id) {
            true // its attempt is running: consumed, and nothing to do
        } else if ctx.endpoints().is_paused(endpoint) {
            self.to_park.push(entry);
            true // consumed: parked below
        } else if self.capped_hosts.contains(host.as_str()) && self.line(d, &entry) {
            self.to_line.push(entry);
            true // consumed: leased below, to wait for its host
        } else if self.blocked(host, endpoint) {
            false
        } else {
            // Every local limit (see `delivery::admit`); the fleet's lease comes after the walk.
            let admitted = match d.admit(host, endpoint, now) {
                // The fleet may refuse some of the entries waiting for it, which gives their
                // permits back: ask it now rather than stop for permits that may come free.
                Err(Refusal::AllBusy) if !self.wanting.is_empty() => {
                    self.lease(d, now);
                    (!self.blocked(host, endpoint)).then(|| d.admit(host, endpoint, now))
                }
                admitted => Some(admitted),
            };
            match admitted {
                // Its host or endpoint was refused by the fleet just now.
                None => false,
                Some(Ok(permit)) if d.fleet().is_some() => {
                    self.wanting.push(entry);
                    self.wanting_permits.push(permit);
                    true
                }
                Some(Ok(permit)) => {
                    self.ready.push(entry);
                    self.permits.push(permit);
                    true
                }
                Some(Err(Refusal::AllBusy)) => {
                    // Nothing more can start this pass; a finishing attempt wakes us.
                    self.pass.global_full = true;
                    let id = &self.last_id;
                    self.first_left.get_or_insert_with(|| (due_ms, id.clone()));
                    return ScanStep::Stop;
                }
                Some(Err(refusal)) => {
                    self.refused(d, refusal, host, endpoint);
                    let waits = refusal == Refusal::HostBusy(None) && self.line(d, &entry);
                    if waits {
                        self.capped_hosts.insert(host.to_string());
                        self.to_line.push(entry);
                    }
                    waits
                }
            }
        };
        if dispatchable {
            self.skipped_in_a_row = 0;
        } else {
            self.skipped_in_a_row += 1;
            let id = &self.last_id;
            self.first_left.get_or_insert_with(|| (due_ms, id.clone()));
        }
        if self.ready.len() + self.wanting.len() + self.to_park.len() >= limits.claim_batch {
            // As many as one pass may lease wait for the fleet: it decides now, and the walk
            // goes on past the ones it refuses, as past those a local limit refused.
            self.lease(d, now);
        }
        if self.ready.len() + self.to_park.len() + self.to_line.len() >= limits.claim_batch {
            // What it lines up ends no attempt, which would wake the next pass: it goes on.
            if !self.to_line.is_empty() {
                self.pass.wake_no_later_than(now);
            }
            ScanStep::Stop
        } else {
            ScanStep::Continue
        }
    }

    /// Whether `entry`, held back by its host's cap alone (no fleet, its endpoint neither
    /// capped nor out of tokens this pass), takes a place in its host's line. Those this
    /// pass lines up already count: a place taken past the room would be turned away on
    /// arrival and written back to the queue, where the next pass would lease it again.
    fn line(&self, d: &Arc<Deliverer>, entry: &DueEntry) -> bool {
        let endpoint = entry.routing.endpoint.as_str();
        d.fleet().is_none()
            && !self.limited.contains(endpoint)
            && !self.capped.contains(endpoint)
            && d.line_room() > self.to_line.len()
    }

    /// Whether a limit refused `host` or `endpoint` earlier in this pass.
    fn blocked(&self, host: &str, endpoint: &str) -> bool {
        self.full_hosts.contains(host) || self.limited.contains(endpoint) || self.capped.contains(endpoint)
    }

    /// Asks the fleet for the leases of the entries waiting for one, in one call (see
    /// `Deliverer::lease_all`): the granted are admitted; a refused one stays in the queue
    /// exactly as if refused during the walk (its host or endpoint skipped for the rest of
    /// the pass, with the wake-up the refusal gave).
    fn lease(&mut self, d: &Arc<Deliverer>, now: u64) {
        if self.wanting.is_empty() {
            return;
        }
        let entries = std::mem::take(&mut self.wanting);
        let permits = std::mem::take(&mut self.wanting_permits);
        let routes: Vec<(&str, &str)> = entries
            .iter()
            .map(|e| (e.routing.host.as_str(), e.routing.endpoint.as_str()))
            .collect();
        let answers = d.lease_all(&routes, permits, now);
        for (entry, answer) in entries.into_iter().zip(answers) {
            match answer {
                Ok(permit) => {
                    self.ready.push(entry);
                    self.permits.push(permit);
                }
                Err(refusal) => {
                    self.refused(d, refusal, &entry.routing.host, &entry.routing.endpoint);
                    // Left in the queue: the due floor must not rise past it.
                    let key = (entry.due_ms, entry.id);
                    self.first_left = Some(self.first_left.take().map_or(key.clone(), |f| f.min(key)));
                }
            }
        }
    }

    /// Skips the host or endpoint a limit refused for the rest of the pass, with the wake-up
    /// the refusal gave.
    fn refused(&mut self, d: &Arc<Deliverer>, refusal: Refusal, host: &str, endpoint: &str) {
        match refusal {
            Refusal::RateLimited(at) => {
                d.context().metrics().rate_limited();
                self.limited.insert(endpoint.to_string());
                self.pass.wake_no_later_than(at);
                // Its host's permit was taken and given back: that host's line may move.
                d.start_waiting(host);
            }
            Refusal::HostBusy(retry_at) => {
                // A local permit coming back wakes us; a fleet-wide cap gives a time (the
                // first lease in the way expires), and a release may wake us sooner.
                self.full_hosts.insert(host.to_string());
                if let Some(at) = retry_at {
                    self.pass.wake_no_later_than(at);
                }
            }
            Refusal::CircuitOpen(probe_at) => {
                // Its messages wait, no attempt counted, until the probe may go.
                self.full_hosts.insert(host.to_string());
                self.pass.wake_no_later_than(probe_at);
            }
            Refusal::EndpointBusy(retry_at) => {
                // Waits without a timer for a local cap: its endpoint's permit comes back
                // when an answer arrives, and that wakes the scheduler (the queue is
                // waiting). A fleet-wide cap gives a time, as for a host.
                d.context().metrics().endpoint_capped();
                self.capped.insert(endpoint.to_string());
                if let Some(at) = retry_at {
                    self.pass.wake_no_later_than(at);
                }
            }
            Refusal::AllBusy => unreachable!("the walk stops on AllBusy"),
        }
    }

    /// Parks the entries of paused endpoints.
    fn park(&mut self, d: &Arc<Deliverer>, now: u64) {
        if self.to_park.is_empty() {
            return;
        }
        let count = self.to_park.len();
        match d.context().park_paused(std::mem::take(&mut self.to_park)) {
            Ok((n, left)) => {
                self.pass.parked = n;
                // Resumed meanwhile: left in the queue, so the floor must not pass it.
                if let Some(due) = left {
                    let key = (due, String::new());
                    self.first_left = Some(self.first_left.take().map_or(key.clone(), |f| f.min(key)));
                    self.pass.wake_no_later_than(now);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, count, "parking messages of a paused endpoint failed");
                self.pass.store_error = true;
            }
        }
    }

    /// Leases everything admitted (reads, no write), then dispatches with the permits in
    /// hand; leases those to wait in their hosts' lines and puts them there.
    fn dispatch(&mut self, d: &Arc<Deliverer>, now: u64) {
        if !self.to_line.is_empty() {
            let to_line = std::mem::take(&mut self.to_line);
            let claims = d.context().store().lease_many(&to_line, now);
            for (entry, claimed) in to_line.iter().zip(claims) {
                match claimed {
                    Ok(Some(claimed)) => d.wait_for_host(claimed, Box::new(())),
                    // Gone or changed since the scan (see below).
                    Ok(None) => {}
                    Err(e) => {
                        tracing::error!(delivery_id = %entry.id, error = %e, "reading a due message failed; it stays due and is tried again later");
                    }
                }
            }
        }
        if self.ready.is_empty() {
            return;
        }
        let claims = d.context().store().lease_many(&self.ready, now);
        let permits = std::mem::take(&mut self.permits);
        for ((permit, entry), claimed) in permits.into_iter().zip(&self.ready).zip(claims) {
            match claimed {
                Ok(Some(claimed)) => {
                    d.dispatch(claimed, permit);
                    self.pass.dispatched += 1;
                }
                // Gone or changed since the scan (a delete, a replay): its permits go back
                // unused, and the entries this pass skipped for want of them must not wait
                // for the next accept to be looked at again, nor its host's line.
                Ok(None) => {
                    drop(permit);
                    self.pass.wake_no_later_than(now);
                    d.start_waiting(&entry.routing.host);
                }
                // Unreadable: courier's failure, not the receiver's. Nothing is counted, the
                // others go on, and the store holds this one back until its retry time (see
                // `store::lease`); its permits go back as a stale entry's do.
                Err(e) => {
                    tracing::error!(delivery_id = %entry.id, error = %e, "reading a due message failed; it stays due and is tried again later");
                    drop(permit);
                    self.pass.wake_no_later_than(now);
                    d.start_waiting(&entry.routing.host);
                }
            }
        }
    }

    /// Raises the due floor past what this pass saw (a walk from the floor only) and says
    /// where the next pass resumes.
    fn end(
        mut self,
        d: &Arc<Deliverer>,
        now: u64,
        scanned: Result<(ScanEnd, FloorMark), StoreError>,
        resumed: bool,
    ) -> (Pass, Option<Key>) {
        let store = d.context().store();
        let pass = &mut self.pass;
        let mut resume = None;
        match scanned {
            Ok((ScanEnd::Exhausted { next_due_ms }, floor)) => {
                pass.exhausted = true;
                if let Some(at) = next_due_ms {
                    pass.wake_no_later_than(at);
                }
                // Everything due by `now` was seen; what is left starts at `first_left`.
                if !resumed && !pass.store_error {
                    let end = (now.saturating_add(1), String::new());
                    let (to, id) = self.first_left.unwrap_or(end.clone()).min(end);
                    store.raise_due_floor_to_key(floor, to, &id);
                }
            }
            Ok((ScanEnd::Cut { held_until }, floor)) => {
                pass.cut = !pass.store_error && self.stopped_at.is_none() && !pass.global_full;
                // Held back before the resume point: a later walk from it does not see them.
                if let Some(at) = held_until {
                    pass.wake_no_later_than(at);
                }
                if !pass.store_error && !resumed {
                    if let Some(last) = self.last_seen {
                        let last = (last, self.last_id.clone());
                        let (to, id) = self.first_left.map_or(last.clone(), |f| f.min(last));
                        store.raise_due_floor_to_key(floor, to, &id);
                    }
                }
                pass.stopped_on_run = self.stopped_at.is_some();
                // Resume just before the entry we stopped on, so it is looked at again. A walk
                // the scan budget cut goes on just past the last entry it saw: without a
                // resume point the next wake-up would walk the same entries from the floor
                // and never reach what lies past them.
                resume = match (self.stopped_at, self.last_seen) {
                    (Some((due, id)), _) => Some(resume_before(due, &id)),
                    (None, Some(last)) if !self.stopped => Some((last, std::mem::take(&mut self.last_id))),
                    _ => None,
                };
            }
            Err(e) => {
                tracing::error!(error = %e, "reading the due queue failed");
                pass.store_error = true;
            }
        }
        (self.pass, resume)
    }
}

/// A position just before `(due, id)` in the due index, so a walk that continues "after" it
/// starts with that entry. Ids are ASCII, so dropping the last byte gives a smaller key
/// that no real id sorts between.
fn resume_before(due: u64, id: &str) -> (u64, String) {
    let mut prefix = id.to_string();
    prefix.pop();
    (due, prefix)
}
