//! Per-endpoint state in memory: pause flag and permanent-failure streak (persisted in
//! the store whenever they change), the rate-limit token bucket, the in-flight count, and
//! when courier last saw the endpoint.
//!
//! "Seen" means any attempt, rate check, result, pause or resume. Memory holds what is
//! active, not every endpoint ever seen:
//! - a paused endpoint always stays (the scheduler asks about every due message);
//! - so does one with attempts in flight;
//! - any other entry can be forgotten, because what it has worth keeping (a streak) is in
//!   the store already: an entry made by a rate check or an attempt is *not loaded*, and
//!   the first result that needs its streak reads the record back (on the result
//!   writer's thread, never an async worker's).
//!
//! Once the table holds more than [`PRUNE_ABOVE`] entries, the forgettable ones not seen
//! within the listing window go first, then the longest-unseen, down to half the bound.
//! An entry seen within the last second is never forgotten: its token bucket may be short
//! of tokens, and a new one would start full. So the table holds at most the bound, or the
//! endpoints seen in the last second plus the paused and busy ones if that is more; and a
//! prune that cannot get below the bound waits until the table has doubled, so a table
//! full of paused endpoints does not pay a prune per new endpoint.
//!
//! The `[[endpoint]] max_in_flight` caps live here too, beside the rates
//! ([`EndpointTable::try_cap`]): one semaphore a capped endpoint (as many as the config has),
//! whose permit goes back with the host's and so wakes the scheduler just as that one does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tokio::sync::OwnedSemaphorePermit;

use crate::limits::{Refusal, Resizable};
use crate::model::{DeadReason, Transition};
use crate::policy::rate::TokenBucket;
use crate::store::EndpointRecord;

/// What an attempt's result did to its endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointChange {
    /// Nothing to persist.
    None,
    /// The streak changed: persist the record.
    Changed(EndpointRecord),
    /// The streak reached the threshold and the endpoint is now paused.
    Paused(EndpointRecord),
}

/// Where a permanent status leaves its message: what grows an endpoint's streak.
pub const PERMANENT: Transition = Transition::Dead(DeadReason::PermanentStatus);

/// Entries above which the table forgets endpoints with nothing to remember.
pub const PRUNE_ABOVE: usize = 10_000;

/// A token bucket holds one second of tokens: an entry unseen this long has a full one.
const BUCKET_FULL_MS: u64 = 1_000;

#[derive(Debug)]
struct Entry {
    rec: EndpointRecord,
    /// Whether `rec` is the endpoint's whole state (else the store may hold a streak).
    loaded: bool,
    bucket: TokenBucket,
    in_flight: u32,
    last_seen_ms: u64,
    /// Changes made to `rec`, and how many of them the store has: an entry with a change
    /// not yet written must stay (forgotten, its next reader would read the old record back
    /// from the store, and a resume could be undone that way).
    changes: u64,
    saved: u64,
}

impl Entry {
    fn new(rec: EndpointRecord, loaded: bool, bucket: TokenBucket, now_ms: u64) -> Self {
        Entry {
            rec,
            loaded,
            bucket,
            in_flight: 0,
            last_seen_ms: now_ms,
            changes: 0,
            saved: 0,
        }
    }

    /// Paused, busy, or with a change not yet written: memory is the only place that
    /// knows it.
    fn must_stay(&self) -> bool {
        self.rec.paused || self.in_flight > 0 || self.changes != self.saved
    }

    fn worth_listing(&self) -> bool {
        self.rec.paused || self.in_flight > 0 || self.rec != EndpointRecord::default()
    }
}

/// A snapshot of one endpoint, for the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointView {
    /// Endpoint key.
    pub key: String,
    /// Persistent state (the default when not `loaded`).
    pub rec: EndpointRecord,
    /// Whether `rec` is known to match the store (else read the store's record).
    pub loaded: bool,
    /// Attempts in flight now.
    pub in_flight: u32,
    /// When courier last saw the endpoint (unix millis).
    pub last_seen_ms: u64,
}

#[derive(Debug)]
struct Entries {
    /// `delivery.rate_per_second` and the `[[endpoint]]` overrides: under the same lock as
    /// the entries, so a reload changes every held bucket's rate in one step.
    rates: Rates,
    /// The capped endpoints' semaphores, each with whether it limits now: one a reload left
    /// uncapped while attempts held its permits stays (not limiting) until those end, so a
    /// cap put back meanwhile counts them.
    caps: foldhash::HashMap<String, (bool, Resizable)>,
    map: foldhash::HashMap<String, Entry>,
    /// The size at which the next prune runs.
    prune_at: usize,
}

/// The per-endpoint rates.
#[derive(Debug)]
struct Rates {
    default_rate: u32,
    rates: HashMap<String, u32>,
}

impl Rates {
    fn of(&self, key: &str) -> u32 {
        self.rates.get(key).copied().unwrap_or(self.default_rate)
    }
}

/// The endpoints courier is working with now (see the module doc for what stays).
#[derive(Debug)]
pub struct EndpointTable {
    pause_after: u32,
    listed_for_ms: u64,
    entries: Mutex<Entries>,
    /// Whether any endpoint is capped: when none is (nearly always), an attempt's cap
    /// permit costs no lock.
    any_cap: AtomicBool,
}

impl EndpointTable {
    /// A table with the default rate, per-endpoint rate overrides, the auto-pause
    /// threshold, how long an endpoint stays listed after it was last seen, and the
    /// persisted records of the paused endpoints (seen, as far as the table knows, at
    /// `now_ms`). Other persisted records are read when their endpoint is next seen.
    pub fn new(
        default_rate: u32,
        rates: HashMap<String, u32>,
        pause_after: u32,
        listed_for_ms: u64,
        persisted: Vec<(String, EndpointRecord)>,
        now_ms: u64,
    ) -> Self {
        let t = EndpointTable {
            pause_after,
            listed_for_ms,
            entries: Mutex::new(Entries {
                rates: Rates { default_rate, rates },
                caps: Default::default(),
                map: Default::default(),
                prune_at: PRUNE_ABOVE,
            }),
            any_cap: AtomicBool::new(false),
        };
        {
            let mut entries = t.lock();
            for (key, rec) in persisted {
                let bucket = TokenBucket::new(entries.rates.of(&key), now_ms);
                entries.map.insert(key, Entry::new(rec, true, bucket, now_ms));
            }
        }
        t
    }

    /// How long an endpoint stays listed after it was last seen (the retention window).
    pub fn listed_for_ms(&self) -> u64 {
        self.listed_for_ms
    }

    fn recently_seen(&self, e: &Entry, now_ms: u64) -> bool {
        e.last_seen_ms.saturating_add(self.listed_for_ms) >= now_ms
    }

    fn listable(&self, e: &Entry, now_ms: u64) -> bool {
        e.worth_listing() || self.recently_seen(e, now_ms)
    }

    /// Forgets entries that need not stay: first those not seen within the window, then,
    /// if the table is still over its bound, the longest-unseen, down to half the bound.
    fn prune(&self, entries: &mut Entries, now_ms: u64) {
        let map = &mut entries.map;
        map.retain(|_, e| e.must_stay() || self.recently_seen(e, now_ms));
        if map.len() >= PRUNE_ABOVE {
            let full_since = now_ms.saturating_sub(BUCKET_FULL_MS);
            let mut idle: Vec<(u64, String)> = map
                .iter()
                .filter(|(_, e)| !e.must_stay() && e.last_seen_ms <= full_since)
                .map(|(k, e)| (e.last_seen_ms, k.clone()))
                .collect();
            idle.sort_unstable();
            let excess = map.len() - PRUNE_ABOVE / 2;
            for (_, key) in idle.into_iter().take(excess) {
                map.remove(&key);
            }
        }
        // Down to half the bound as planned: the next prune at the bound. Stuck above it
        // (too many must stay): not before the excess has doubled.
        entries.prune_at = PRUNE_ABOVE.max(2 * map.len().saturating_sub(PRUNE_ABOVE / 2));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces the rates (a reload); held buckets keep the tokens they have, up to their
    /// new burst.
    pub fn set_rates(&self, default_rate: u32, rates: HashMap<String, u32>, now_ms: u64) {
        let mut entries = self.lock();
        entries.rates = Rates { default_rate, rates };
        let Entries { rates, map, .. } = &mut *entries;
        for (key, e) in map.iter_mut() {
            e.bucket.set_rate(rates.of(key), now_ms);
        }
    }

    /// Replaces the `max_in_flight` caps (at start, on a reload): an endpoint keeps its count
    /// of attempts in flight, so a lowered cap holds new ones back until enough finish.
    pub fn set_caps<'a>(&self, caps: impl IntoIterator<Item = (&'a str, u32)>) {
        let mut entries = self.lock();
        let held = &mut entries.caps;
        held.values_mut().for_each(|(live, _)| *live = false);
        for (key, cap) in caps {
            let (live, sem) = held
                .entry(key.to_string())
                .or_insert_with(|| (true, Resizable::new(cap)));
            *live = true;
            sem.resize(cap);
        }
        held.retain(|_, (live, sem)| *live || sem.in_use() > 0);
        self.any_cap
            .store(held.values().any(|(live, _)| *live), Ordering::Release);
    }

    /// A permit for one attempt to the endpoint under its cap: `None` when it has none,
    /// [`Refusal::EndpointBusy`] when it has `max_in_flight` attempts running.
    pub fn try_cap(&self, key: &str) -> Result<Option<OwnedSemaphorePermit>, Refusal> {
        if !self.any_cap.load(Ordering::Acquire) {
            return Ok(None);
        }
        match self.lock().caps.get_mut(key) {
            Some((true, sem)) => sem.try_acquire().map(Some).ok_or(Refusal::EndpointBusy(None)),
            _ => Ok(None),
        }
    }

    /// Attempts holding the endpoint's cap permits now, and the cap (`None`: it has none).
    pub fn cap_usage(&self, key: &str) -> Option<(u32, u32)> {
        match self.lock().caps.get(key) {
            Some((true, sem)) => Some((sem.in_use(), sem.cap())),
            _ => None,
        }
    }

    fn with_entry<T>(&self, key: &str, now_ms: u64, f: impl FnOnce(&mut Entry) -> T) -> T {
        self.with_entry_rated(key, now_ms, |e, _| f(e))
    }

    /// [`EndpointTable::with_entry`], also handing `f` the endpoint's configured rate, read
    /// under the same lock.
    fn with_entry_rated<T>(&self, key: &str, now_ms: u64, f: impl FnOnce(&mut Entry, u32) -> T) -> T {
        let mut entries = self.lock();
        if !entries.map.contains_key(key) {
            if entries.map.len() >= entries.prune_at {
                self.prune(&mut entries, now_ms);
            }
            let bucket = TokenBucket::new(entries.rates.of(key), now_ms);
            let e = Entry::new(EndpointRecord::default(), false, bucket, now_ms);
            entries.map.insert(key.to_string(), e);
        }
        let rate = entries.rates.of(key);
        let e = entries.map.get_mut(key).expect("inserted above");
        e.last_seen_ms = e.last_seen_ms.max(now_ms);
        f(e, rate)
    }

    /// Whether the endpoint is paused.
    pub fn is_paused(&self, key: &str) -> bool {
        self.lock().map.get(key).is_some_and(|e| e.rec.paused)
    }

    /// Takes a rate-limit token (a test's shorthand for one courier).
    #[cfg(test)]
    pub fn try_rate(&self, key: &str, now_ms: u64) -> Result<(), u64> {
        self.try_rate_shared(key, now_ms, 1)
    }

    /// Takes a rate-limit token at this courier's share of the rate among `replicas`
    /// (`fleet::share`; more than 1 only as the fleet's fallback while Redis is
    /// unavailable), or says how many millis until one is free. The bucket keeps the tokens
    /// it has (up to the lower burst) when its rate changes either way.
    pub fn try_rate_shared(&self, key: &str, now_ms: u64, replicas: u32) -> Result<(), u64> {
        self.with_entry_rated(key, now_ms, |e, configured| {
            let rate = crate::fleet::share(configured, replicas);
            if e.bucket.rate() != rate {
                e.bucket.set_rate(rate, now_ms);
            }
            e.bucket.try_take(now_ms)
        })
    }

    /// The endpoint's configured attempts per second (0: no limit).
    pub fn rate_of(&self, key: &str) -> u32 {
        self.lock().rates.of(key)
    }

    /// An attempt to the endpoint started.
    pub fn started(&self, key: &str, now_ms: u64) {
        self.with_entry(key, now_ms, |e| e.in_flight += 1);
    }

    /// An attempt to the endpoint ended (with or without a result).
    pub fn finished(&self, key: &str, now_ms: u64) {
        self.with_entry(key, now_ms, |e| e.in_flight = e.in_flight.saturating_sub(1));
    }

    /// Applies an attempt's result (where it left its message) to the streak: a delivery
    /// ends it, a permanent status grows it, and the endpoint pauses when it reaches the
    /// threshold. When the entry is not loaded, `stored` reads the endpoint's
    /// persisted record first (a blocking store read, made without the table's lock).
    pub fn record<E>(
        &self,
        key: &str,
        transition: Transition,
        status: Option<u16>,
        now_ms: u64,
        stored: impl FnOnce() -> Result<Option<EndpointRecord>, E>,
    ) -> Result<EndpointChange, E> {
        if !matches!(transition, Transition::Delivered | PERMANENT) {
            self.with_entry(key, now_ms, |_| ());
            return Ok(EndpointChange::None);
        }
        if !self.with_entry(key, now_ms, |e| e.loaded) {
            let rec = stored()?.unwrap_or_default();
            self.with_entry(key, now_ms, |e| {
                // A pause or resume meanwhile set the whole state; it wins.
                if !e.loaded {
                    e.rec = rec;
                    e.loaded = true;
                }
            });
        }
        let pause_after = self.pause_after;
        Ok(self.with_entry(key, now_ms, |e| match transition {
            Transition::Delivered if e.rec.streak > 0 || e.rec.last_status.is_some() => {
                // Nothing left to remember of the failures: the record is the default again
                // (the store deletes it).
                e.rec.streak = 0;
                e.rec.last_status = None;
                e.changes += 1;
                EndpointChange::Changed(e.rec.clone())
            }
            PERMANENT => {
                e.rec.streak = e.rec.streak.saturating_add(1);
                e.rec.last_status = status;
                e.changes += 1;
                if !e.rec.paused && e.rec.streak >= pause_after {
                    e.rec.paused = true;
                    EndpointChange::Paused(e.rec.clone())
                } else {
                    EndpointChange::Changed(e.rec.clone())
                }
            }
            _ => EndpointChange::None,
        }))
    }

    /// Pauses or resumes an endpoint; a resume also clears the streak. Returns the new record.
    pub fn set_paused(&self, key: &str, paused: bool, now_ms: u64) -> EndpointRecord {
        self.with_entry(key, now_ms, |e| {
            e.rec.paused = paused;
            if !paused {
                e.rec.streak = 0;
            }
            e.loaded = true;
            e.changes += 1;
            e.rec.clone()
        })
    }

    /// The state of one endpoint, if the table holds it.
    pub fn get(&self, key: &str) -> Option<EndpointView> {
        self.lock().map.get(key).map(|e| view(key, e))
    }

    /// The loaded record of an endpoint the table holds (what the store should have), and
    /// the change count it includes: pass that to [`EndpointTable::saved`] once written.
    pub fn loaded_record(&self, key: &str) -> Option<(EndpointRecord, u64)> {
        self.lock()
            .map
            .get(key)
            .filter(|e| e.loaded)
            .map(|e| (e.rec.clone(), e.changes))
    }

    /// The store has the endpoint's record as of change `changes`: once no later change is
    /// pending, the entry may be forgotten again.
    pub fn saved(&self, key: &str, changes: u64) {
        if let Some(e) = self.lock().map.get_mut(key) {
            e.saved = e.saved.max(changes);
        }
    }

    /// Every endpoint worth listing at `now_ms`: paused, with a streak or attempts in
    /// flight, or seen within the listing window.
    #[cfg(test)]
    pub fn snapshot(&self, now_ms: u64) -> Vec<EndpointView> {
        self.page(now_ms, None, "", None, usize::MAX)
    }

    /// Forgets endpoints that are not paused, have nothing in flight and were not seen
    /// within the listing window (a streak they had expires in the store on its own).
    /// Returns how many were forgotten.
    pub fn expire(&self, now_ms: u64) -> usize {
        let mut entries = self.lock();
        let before = entries.map.len();
        entries
            .map
            .retain(|_, e| e.must_stay() || self.recently_seen(e, now_ms));
        before - entries.map.len()
    }

    /// Entries held now (for tests and the bound's checks).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether the table holds nothing.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One page of the listable endpoints: keys after `after` that start with `prefix`
    /// (and are paused, or not, when `paused` says), the first `limit` of them in key
    /// order. Linear in the table (which is bounded), not sorted whole.
    pub fn page(
        &self,
        now_ms: u64,
        after: Option<&str>,
        prefix: &str,
        paused: Option<bool>,
        limit: usize,
    ) -> Vec<EndpointView> {
        let mut out: Vec<EndpointView> = self
            .lock()
            .map
            .iter()
            .filter(|(k, e)| {
                after.is_none_or(|a| k.as_str() > a)
                    && k.starts_with(prefix)
                    && paused.is_none_or(|p| e.rec.paused == p)
                    && self.listable(e, now_ms)
            })
            .map(|(k, e)| view(k, e))
            .collect();
        if out.len() > limit {
            out.select_nth_unstable_by(limit, |a, b| a.key.cmp(&b.key));
            out.truncate(limit);
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// How many endpoints are paused.
    pub fn paused_count(&self) -> u64 {
        self.lock().map.values().filter(|e| e.rec.paused).count() as u64
    }
}

fn view(key: &str, e: &Entry) -> EndpointView {
    EndpointView {
        key: key.to_string(),
        rec: e.rec.clone(),
        loaded: e.loaded,
        in_flight: e.in_flight,
        last_seen_ms: e.last_seen_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 86_400_000;

    /// A result for an endpoint whose store holds nothing.
    fn record(t: &EndpointTable, key: &str, event: Transition, status: Option<u16>, now: u64) -> EndpointChange {
        t.record(key, event, status, now, || Ok::<_, ()>(None)).unwrap()
    }

    #[test]
    fn a_page_is_the_first_keys_after_the_cursor_with_the_prefix_and_state() {
        let t = EndpointTable::new(100, HashMap::new(), 3, DAY, vec![], 0);
        for k in ["b/2", "a/1", "b/1", "c/1", "b/3", "a/2"] {
            t.try_rate(k, 10).unwrap();
        }
        t.set_paused("b/3", true, 10);
        let keys = |v: Vec<EndpointView>| v.into_iter().map(|e| e.key).collect::<Vec<_>>();
        assert_eq!(keys(t.page(20, None, "", None, 4)), ["a/1", "a/2", "b/1", "b/2"]);
        assert_eq!(keys(t.page(20, Some("b/1"), "", None, 10)), ["b/2", "b/3", "c/1"]);
        assert_eq!(keys(t.page(20, None, "b/", None, 10)), ["b/1", "b/2", "b/3"]);
        assert_eq!(keys(t.page(20, None, "", Some(true), 10)), ["b/3"]);
        assert_eq!(keys(t.page(20, Some("a/1"), "b/", Some(false), 1)), ["b/1"]);
        assert!(
            t.page(DAY + 20, None, "", Some(false), 10).is_empty(),
            "not seen within the window"
        );
    }

    #[test]
    fn a_resumed_endpoint_stays_listed_for_the_window_then_drops_off() {
        let t = EndpointTable::new(100, HashMap::new(), 3, DAY, vec![], 0);
        t.set_paused("e", true, 1_000);
        assert_eq!(t.snapshot(1_000).len(), 1);
        t.set_paused("e", false, 2_000);
        let listed = t.snapshot(2_000 + DAY);
        assert_eq!(listed.len(), 1, "seen within the window: still listed");
        assert!(!listed[0].rec.paused);
        assert_eq!(listed[0].last_seen_ms, 2_000);
        assert!(t.snapshot(2_001 + DAY).is_empty(), "past the window it drops off");
        // A paused endpoint stays listed however long ago it was seen.
        t.set_paused("p", true, 0);
        assert_eq!(t.snapshot(10 * DAY).len(), 1);
    }

    #[test]
    fn the_table_stays_bounded_and_keeps_what_matters() {
        let t = EndpointTable::new(100, HashMap::new(), 3, DAY, vec![], 0);
        t.set_paused("paused", true, 0);
        t.started("busy", 0);
        for i in 0..(3 * PRUNE_ABOVE) {
            // All seen recently: only the longest-unseen are forgotten.
            t.try_rate(&format!("e{i}"), 1 + i as u64).ok();
        }
        let n = t.len();
        assert!(n <= PRUNE_ABOVE + 1, "bounded: {n}");
        assert!(t.is_paused("paused"));
        assert_eq!(t.get("busy").unwrap().in_flight, 1);
        assert!(
            t.get(&format!("e{}", 3 * PRUNE_ABOVE - 1)).is_some(),
            "the newest stays"
        );
        assert!(t.get("e0").is_none(), "the oldest went first");
    }

    #[test]
    fn a_streak_of_permanent_failures_pauses_and_a_success_resets_it() {
        let t = EndpointTable::new(100, HashMap::new(), 3, DAY, vec![], 0);
        assert_eq!(
            record(&t, "e", PERMANENT, Some(410), 0),
            EndpointChange::Changed(EndpointRecord {
                paused: false,
                streak: 1,
                last_status: Some(410)
            })
        );
        assert_eq!(
            record(&t, "e", Transition::RetryAt(0), Some(500), 0),
            EndpointChange::None
        );
        assert!(
            matches!(record(&t, "e", Transition::Delivered, Some(200), 0), EndpointChange::Changed(r) if r == EndpointRecord::default()),
            "a success clears the streak and its last status"
        );
        for _ in 0..2 {
            assert!(matches!(
                record(&t, "e", PERMANENT, Some(410), 0),
                EndpointChange::Changed(_)
            ));
        }
        assert!(!t.is_paused("e"));
        assert!(matches!(record(&t, "e", PERMANENT, Some(410), 0), EndpointChange::Paused(r) if r.streak == 3));
        assert!(t.is_paused("e"));
        assert_eq!(t.paused_count(), 1);
        // Already paused: later failures do not pause (or alert) again.
        assert!(matches!(
            record(&t, "e", PERMANENT, Some(410), 0),
            EndpointChange::Changed(_)
        ));
        let r = t.set_paused("e", false, 0);
        assert_eq!((r.paused, r.streak), (false, 0));
    }

    #[test]
    fn persisted_state_is_loaded_and_rates_are_per_endpoint() {
        let rec = EndpointRecord {
            paused: true,
            streak: 7,
            last_status: None,
        };
        let t = EndpointTable::new(
            2,
            HashMap::from([("slow".to_string(), 1)]),
            100,
            DAY,
            vec![("p".into(), rec)],
            0,
        );
        assert!(t.is_paused("p"));
        assert!(t.try_rate("slow", 0).is_ok());
        assert!(t.try_rate("slow", 0).is_err());
        assert!(t.try_rate("fast", 0).is_ok());
        assert!(t.try_rate("fast", 0).is_ok());
        assert!(t.try_rate("fast", 0).is_err());
        t.started("fast", 0);
        assert_eq!(t.get("fast").unwrap().in_flight, 1);
        t.finished("fast", 0);
        assert_eq!(t.get("fast").unwrap().in_flight, 0);
    }

    #[test]
    fn a_forgotten_streak_is_read_back_once_and_a_recent_bucket_is_never_forgotten() {
        let t = EndpointTable::new(1, HashMap::new(), 3, DAY, vec![], 0);
        // The store has a streak of two for "far"; memory does not know it yet.
        let stored = EndpointRecord {
            paused: false,
            streak: 2,
            last_status: Some(410),
        };
        let reads = std::cell::Cell::new(0);
        let read = || {
            reads.set(reads.get() + 1);
            Ok::<_, ()>(Some(stored.clone()))
        };
        t.try_rate("far", 0).unwrap();
        assert_eq!(t.get("far").map(|v| v.loaded), Some(false));
        let change = t.record("far", PERMANENT, Some(410), 0, read).unwrap();
        assert!(
            matches!(change, EndpointChange::Paused(r) if r.streak == 3),
            "counted on from the store"
        );
        assert_eq!(reads.get(), 1);
        // Loaded now: no more reads, and the pause keeps it in memory.
        t.record("far", PERMANENT, Some(410), 0, || -> Result<_, ()> {
            panic!("no read once loaded")
        })
        .unwrap();
        // "recent" used its one token just now: a flood of new endpoints must not make the
        // table forget it (a new entry would start with a full bucket).
        assert!(t.try_rate("recent", 5_000).is_ok());
        for i in 0..(2 * PRUNE_ABOVE) {
            t.try_rate(&format!("e{i}"), 5_000 + (i / 100) as u64).ok();
        }
        assert!(t.len() > 2 * PRUNE_ABOVE, "all seen within the second: all kept");
        assert!(t.try_rate("recent", 5_500).is_err(), "still rate limited");
        assert!(t.is_paused("far"));
    }

    #[test]
    fn a_cap_removed_and_put_back_counts_the_attempts_still_running() {
        let t = EndpointTable::new(100, HashMap::new(), 3, DAY, vec![], 0);
        t.set_caps([("https://e.example/", 2)]);
        let held: Vec<_> = (0..2)
            .map(|_| t.try_cap("https://e.example/").unwrap().unwrap())
            .collect();
        t.set_caps([]);
        assert!(matches!(t.try_cap("https://e.example/"), Ok(None)), "uncapped now");
        t.set_caps([("https://e.example/", 2)]);
        assert_eq!(t.cap_usage("https://e.example/"), Some((2, 2)), "the two still running");
        assert_eq!(
            t.try_cap("https://e.example/").unwrap_err(),
            Refusal::EndpointBusy(None)
        );
        drop(held);
        t.set_caps([]);
        assert!(t.lock().caps.is_empty(), "forgotten once nothing holds it");
    }

    #[test]
    fn only_capped_endpoints_are_limited_and_permits_come_back() {
        let t = EndpointTable::new(100, HashMap::new(), 3, DAY, vec![], 0);
        assert!(matches!(t.try_cap("x"), Ok(None)), "no caps at all");
        t.set_caps([("https://slow.example/", 2)]);
        assert!(matches!(t.try_cap("https://other.example/"), Ok(None)));
        let a = t.try_cap("https://slow.example/").unwrap().unwrap();
        let _b = t.try_cap("https://slow.example/").unwrap().unwrap();
        assert_eq!(
            t.try_cap("https://slow.example/").unwrap_err(),
            Refusal::EndpointBusy(None)
        );
        assert_eq!(t.cap_usage("https://slow.example/"), Some((2, 2)));
        drop(a);
        assert_eq!(t.cap_usage("https://slow.example/"), Some((1, 2)));
        assert!(t.try_cap("https://slow.example/").unwrap().is_some());
        assert_eq!(t.cap_usage("https://other.example/"), None);
    }

    /// Finding (review): a resume's entry could be forgotten before its write, and the
    /// write then found nothing to write (the store stayed paused), or a result read the
    /// old paused record back.
    #[test]
    fn an_entry_with_an_unwritten_change_is_never_forgotten() {
        let t = EndpointTable::new(100, HashMap::new(), 3, DAY, vec![], 0);
        t.set_paused("r", true, 0);
        t.set_paused("r", false, 0);
        let flood = |from: u64| {
            for i in 0..(2 * PRUNE_ABOVE) {
                t.try_rate(&format!("e{from}-{i}"), from).ok();
            }
        };
        flood(10_000);
        let (rec, changes) = t.loaded_record("r").expect("kept until written");
        assert!(!rec.paused);
        t.saved("r", changes);
        flood(20_000);
        assert!(t.get("r").is_none(), "written: it may go");
    }
}
