//! The ordering invariant, checked at the receivers: for an ordered endpoint, attempts
//! start in acceptance order and never overlap.
//!
//! The model knows, independently of the store's lines, which ordered messages exist and
//! in what order they entered: every message acknowledged by one `accept` step shares a
//! *generation* (they were sent concurrently, so no order between them is promised), later
//! steps get later ones, and a replay is a new entry at the end, except the replay of the
//! dead head a blocked line waits behind, which keeps its place (it is tried first again).
//! Whether a message ahead is still open is read from the store when an attempt starts
//! (the scheduler's loop starts attempts whenever it runs; the accept fast path must never
//! start an ordered one): a message only closes by a result written before its line moves
//! on, and opens again only by a replay, which the model is told of.
//!
//! When a receiver sees an attempt to an ordered endpoint, it asks [`OrderBook::started`]:
//! another attempt to that endpoint still unanswered is an overlap; an open message of the
//! endpoint from an earlier generation is an overtaking. Violations are collected and
//! reported by the step's checks.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use crate::model::State;

#[derive(Debug, Clone)]
struct Entry {
    id: String,
    endpoint: String,
    generation: u64,
    open: bool,
}

#[derive(Debug, Default)]
struct Inner {
    ordered: BTreeSet<String>,
    generation: u64,
    /// By event id (what the receiver sees); unique per stored message in a run.
    entries: BTreeMap<String, Entry>,
    in_flight: BTreeMap<String, usize>,
    violations: Vec<String>,
}

/// What the simulator knows of ordered messages, shared with the receivers.
#[derive(Debug, Default)]
pub struct OrderBook {
    inner: Mutex<Inner>,
}

impl OrderBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Declares the ordered endpoints (their keys are their targets in the simulation).
    pub fn set_ordered(&self, endpoints: impl IntoIterator<Item = String>) {
        self.lock().ordered = endpoints.into_iter().collect();
    }

    /// Whether `endpoint` is ordered.
    pub fn is_ordered(&self, endpoint: &str) -> bool {
        self.lock().ordered.contains(endpoint)
    }

    /// A new generation: what is acknowledged (or replayed) together from now on.
    pub fn next_generation(&self) -> u64 {
        let mut g = self.lock();
        g.generation += 1;
        g.generation
    }

    /// A new ordered message was acknowledged.
    pub fn accepted(&self, event: &str, id: &str, endpoint: &str, generation: u64) {
        let entry = Entry {
            id: id.to_string(),
            endpoint: endpoint.to_string(),
            generation,
            open: true,
        };
        self.lock().entries.insert(event.to_string(), entry);
    }

    /// A dead ordered message was replayed: at the end (`generation`), or in its old place
    /// when it was the head its line was blocked behind.
    pub fn replayed(&self, event: &str, keeps_place: bool, generation: u64) {
        if let Some(e) = self.lock().entries.get_mut(event) {
            e.open = true;
            if !keeps_place {
                e.generation = generation;
            }
        }
    }

    /// An operator deleted the message.
    pub fn deleted(&self, event: &str) {
        self.lock().entries.remove(event);
    }

    /// Whether `id` is open in `store` (read past any broken item).
    fn open_in(store: &crate::store::Store, id: &str) -> bool {
        store.quietly(|| {
            store
                .message(id)
                .ok()
                .flatten()
                .is_some_and(|r| matches!(r.state, State::Pending | State::InFlight))
        })
    }

    /// Before replaying `ids`: the ordered ones, by event id, each with whether it keeps its
    /// place (it is the dead head its line is blocked behind).
    pub fn before_replay(&self, store: &crate::store::Store, ids: &[String]) -> Vec<(String, bool)> {
        let mut out = Vec::new();
        for id in ids {
            let Some(rec) = store.message(id).ok().flatten() else {
                continue;
            };
            if rec.state != State::Dead || !self.is_ordered(&rec.endpoint) {
                continue;
            }
            let line = store.line(&rec.endpoint).ok().flatten();
            let keeps = line.is_some_and(|l| l.blocked && l.head == rec.id);
            out.push((rec.event_id, keeps));
        }
        out
    }

    /// After the replay of what [`OrderBook::before_replay`] listed.
    pub fn after_replay(&self, replayed: Vec<(String, bool)>) {
        let generation = self.next_generation();
        for (event, keeps) in replayed {
            self.replayed(&event, keeps, generation);
        }
    }

    /// An attempt to `endpoint` for `event` reached its receiver; `store` is the running
    /// node's, where whether the messages ahead are still open is read.
    pub fn started(&self, endpoint: &str, event: &str, at_ms: u64, store: Option<&crate::store::Store>) {
        let mut g = self.lock();
        if !g.ordered.contains(endpoint) {
            return;
        }
        let busy = g.in_flight.get(endpoint).copied().unwrap_or(0);
        *g.in_flight.entry(endpoint.to_string()).or_default() += 1;
        if busy > 0 {
            let v = format!("{event}: attempt to ordered {endpoint} at {at_ms} ms while {busy} other is in flight");
            g.violations.push(v);
        }
        let Some(me) = g.entries.get(event).cloned() else {
            return;
        };
        let mut ahead = Vec::new();
        for (ev, e) in g.entries.iter_mut() {
            if *ev == event || !e.open || e.endpoint != me.endpoint || e.generation >= me.generation {
                continue;
            }
            e.open = store.is_none_or(|s| Self::open_in(s, &e.id));
            if e.open {
                ahead.push(format!("{ev} ({})", e.id));
            }
        }
        if !ahead.is_empty() {
            let v = format!(
                "{event} ({}) attempted at {at_ms} ms on ordered {endpoint} before {ahead:?}, accepted earlier and still open",
                me.id
            );
            g.violations.push(v);
        }
    }

    /// An attempt to `endpoint` was answered.
    pub fn ended(&self, endpoint: &str) {
        if let Some(n) = self.lock().in_flight.get_mut(endpoint) {
            *n = n.saturating_sub(1);
        }
    }

    /// A crash: nothing is in flight any more.
    pub fn reset_in_flight(&self) {
        self.lock().in_flight.clear();
    }

    /// Every violation seen so far.
    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }
}
