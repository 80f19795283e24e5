//! A consistency audit of the whole store: every record in exactly one state with the
//! index entries that state needs, no index entry without its record, counters equal to
//! what they count, and every ordered endpoint's line whole (one head, the rest waiting with
//! no due entry). It reads everything, so it never runs on the delivery path: the simulator
//! runs it after every step ([`Store::audit`]), and `courier store check` runs it offline on
//! a stopped courier's data dir ([`Store::check`]), e.g. after a power loss.
//!
//! What a crash may leave and the next start repairs is not a problem here: messages in
//! flight (startup queues them again), and a line whose head was deleted while its attempt
//! was in flight (startup moves the line on). Everything else holds after any crash: every
//! change of state is one `WriteBatch` with its indexes, counters and line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use rocksdb::{ColumnFamily, IteratorMode, DB};

use crate::store::{cf_of, decode_message, keys, Counts, MessageRecord, State, Store, StoreError, StoreOptions};

/// What [`Store::check`] found in a data dir.
#[derive(Debug, Clone, Default)]
pub struct Checked {
    /// Every inconsistency, one line each (empty: consistent).
    pub problems: Vec<String>,
    /// The messages by state, as the records say.
    pub counts: Counts,
    /// Of the open messages, those a crash left in flight (the next start queues them).
    pub in_flight: u64,
}

/// Every family's keys read from one snapshot, by message id.
struct Indexes {
    records: BTreeMap<String, MessageRecord>,
    payloads: BTreeSet<Vec<u8>>,
    states: BTreeMap<String, Vec<u8>>,
    due: BTreeMap<String, Vec<u64>>,
    parked: BTreeMap<String, String>,
}

/// What the records count, to hold the counters against.
#[derive(Default)]
struct Tally {
    open: u64,
    in_flight: u64,
    delivered: u64,
    dead: u64,
    handed_off: u64,
    open_per_endpoint: BTreeMap<String, u64>,
}

/// An ordered endpoint's line records and waiting members, as stored.
struct Lines {
    heads: BTreeMap<String, crate::store::LineRecord>,
    members: BTreeMap<(String, u64), String>,
}

impl Store {
    /// Every inconsistency found (empty when the store is consistent). `quiescent` adds the
    /// rules that hold only when nothing is running: no message in flight.
    pub fn audit(&self, quiescent: bool) -> Result<Vec<String>, StoreError> {
        let ghost = |id: &str| self.is_ghost_head(id);
        let audit = Audit {
            db: &self.db,
            ghost: &ghost,
        };
        Ok(audit.run(quiescent)?.0)
    }

    /// The audit of the store in `dir` as the next start would find it, courier stopped:
    /// opened read-only (RocksDB replays its log in memory, as a start does, and writes
    /// nothing), with the data dir's lock held meanwhile, so no courier starts on it.
    /// [`StoreError::Locked`] when a courier runs on it.
    pub fn check(dir: &Path, options: &StoreOptions) -> Result<Checked, StoreError> {
        let (db, _lock) = super::lifecycle::open_read_only(dir, options)?;
        // In memory only, lost in a crash: any head that is gone may have been deleted in
        // flight, and the next start moves its line on.
        let audit = Audit {
            db: &db,
            ghost: &|_| true,
        };
        let (problems, tally) = audit.run(false)?;
        let counts = Counts {
            open: tally.open,
            delivered: tally.delivered,
            dead: tally.dead,
            handed_off: tally.handed_off,
        };
        Ok(Checked {
            problems,
            counts,
            in_flight: tally.in_flight,
        })
    }
}

/// One audit: the database, and which line heads may be gone (deleted in flight).
struct Audit<'a> {
    db: &'a DB,
    ghost: &'a dyn Fn(&str) -> bool,
}

impl Audit<'_> {
    /// Every inconsistency found, and what the records count.
    fn run(&self, quiescent: bool) -> Result<(Vec<String>, Tally), StoreError> {
        let mut problems = Vec::new();
        // One snapshot for every family: a write landing between two reads (a background
        // release, a result) must not look like a record and its index disagreeing.
        let snap = self.db.snapshot();
        let ix = self.read_indexes(&snap, &mut problems)?;
        let lines = self.audit_lines(&snap, &ix.records, quiescent, &mut problems)?;
        let tally = audit_records(&ix, quiescent, &mut problems);
        for id in ix.states.keys().chain(ix.due.keys()).chain(ix.parked.keys()) {
            if !ix.records.contains_key(id) {
                problems.push(format!("{id}: an index entry without its record"));
            }
        }
        self.audit_counters(&snap, &tally, lines, &mut problems)?;
        Ok((problems, tally))
    }

    fn cf(&self, name: &str) -> &ColumnFamily {
        cf_of(self.db, name)
    }

    /// The records and the payload, state, due and parked keys, from `snap` (a key that
    /// does not parse is a problem, not a panic: an operator runs this on a damaged disk).
    fn read_indexes(&self, snap: &rocksdb::Snapshot<'_>, problems: &mut Vec<String>) -> Result<Indexes, StoreError> {
        let mut records: BTreeMap<String, MessageRecord> = BTreeMap::new();
        for item in snap.iterator_cf(self.cf(keys::MESSAGES), IteratorMode::Start) {
            let (k, v) = item?;
            let id = String::from_utf8_lossy(&k).into_owned();
            records.insert(id.clone(), decode_message(&id, &v)?);
        }
        let keys_of = |cf: &str| -> Result<Vec<Vec<u8>>, StoreError> {
            let mut out = Vec::new();
            for item in snap.iterator_cf(self.cf(cf), IteratorMode::Start) {
                out.push(item?.0.to_vec());
            }
            Ok(out)
        };
        let payloads: BTreeSet<Vec<u8>> = keys_of(keys::PAYLOADS)?.into_iter().collect();
        let mut states: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for k in keys_of(keys::STATES)? {
            let Some((state, id)) = k.split_first() else {
                problems.push("states: an empty key".into());
                continue;
            };
            states
                .entry(String::from_utf8_lossy(id).into_owned())
                .or_default()
                .push(*state);
        }
        let mut due: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for k in keys_of(keys::DUE)? {
            let Some((ms, id)) = keys::split_time_key(&k) else {
                problems.push(format!("due: a key that is not a time key: {k:?}"));
                continue;
            };
            due.entry(id.to_string()).or_default().push(ms);
        }
        let mut parked: BTreeMap<String, String> = BTreeMap::new();
        for k in keys_of(keys::PARKED)? {
            let end = k.iter().position(|b| *b == 0).unwrap_or(k.len());
            let endpoint = String::from_utf8_lossy(&k[..end]).into_owned();
            let id = String::from_utf8_lossy(&k[(end + 1).min(k.len())..]).into_owned();
            parked.insert(id, endpoint);
        }
        Ok(Indexes {
            records,
            payloads,
            states,
            due,
            parked,
        })
    }

    /// The counters against what the records count (`tally`) and the members in lines.
    fn audit_counters(
        &self,
        snap: &rocksdb::Snapshot<'_>,
        tally: &Tally,
        lines: u64,
        problems: &mut Vec<String>,
    ) -> Result<(), StoreError> {
        // Raw values, from the snapshot: a counter gone negative is a bug the clamped gauges
        // would hide.
        let mut meta: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
        for item in snap.iterator_cf(self.cf(keys::META), IteratorMode::Start) {
            let (k, v) = item?;
            meta.insert(k.to_vec(), crate::store::counters::decode_counter(&v));
        }
        let count = |k: &[u8]| meta.get(k).copied().unwrap_or(0).max(0) as u64;
        if count(keys::COUNT_LINED) != lines {
            problems.push(format!(
                "lined counter {} but {lines} members in lines",
                count(keys::COUNT_LINED)
            ));
        }
        let counted = (
            count(keys::COUNT_OPEN),
            count(keys::COUNT_DELIVERED),
            count(keys::COUNT_DEAD),
            count(keys::COUNT_HANDED_OFF),
        );
        let records = (tally.open, tally.delivered, tally.dead, tally.handed_off);
        if counted != records {
            problems.push(format!(
                "counters open/delivered/dead/handed off {counted:?} but records {records:?}"
            ));
        }
        let mut stored: BTreeMap<String, u64> = BTreeMap::new();
        for (k, &value) in &meta {
            if value < 0 {
                problems.push(format!("counter {} is {value}", String::from_utf8_lossy(k)));
            }
            if let Some(endpoint) = k.strip_prefix(keys::COUNT_OPEN_ENDPOINT) {
                if value > 0 {
                    stored.insert(String::from_utf8_lossy(endpoint).into_owned(), value as u64);
                }
            }
        }
        if stored != tally.open_per_endpoint {
            problems.push(format!(
                "open per endpoint {stored:?} but records {:?}",
                tally.open_per_endpoint
            ));
        }
        Ok(())
    }

    /// The `lines` family against the records: every line record's head is its endpoint's
    /// open head (or the dead head it is blocked behind, or a head deleted in flight), every
    /// member is a pending ordered message waiting at its place, and every open ordered
    /// message is in its line. Returns the number of members.
    fn audit_lines(
        &self,
        snap: &rocksdb::Snapshot<'_>,
        records: &BTreeMap<String, MessageRecord>,
        quiescent: bool,
        problems: &mut Vec<String>,
    ) -> Result<u64, StoreError> {
        let lines = self.read_lines(snap, problems)?;
        for (endpoint, line) in &lines.heads {
            self.audit_line_record(endpoint, line, &lines, records, quiescent, problems);
        }
        for ((endpoint, pos), id) in &lines.members {
            if !lines.heads.contains_key(endpoint) {
                problems.push(format!("line {endpoint}: member {id} without a line record"));
            }
            match records.get(id) {
                Some(r)
                    if r.state == State::Pending
                        && r.endpoint == *endpoint
                        && r.fifo.is_some_and(|f| f.pos == *pos) => {}
                Some(r) => problems.push(format!(
                    "line {endpoint}: member {id} at {pos} is {:?} {:?}",
                    r.state, r.fifo
                )),
                None => problems.push(format!("line {endpoint}: member {id} does not exist")),
            }
        }
        for (id, rec) in records {
            problems.extend(ordered_problem(id, rec, &lines));
        }
        Ok(lines.members.len() as u64)
    }

    /// The line records and members in `snap`.
    fn read_lines(&self, snap: &rocksdb::Snapshot<'_>, problems: &mut Vec<String>) -> Result<Lines, StoreError> {
        let mut lines = Lines {
            heads: BTreeMap::new(),
            members: BTreeMap::new(),
        };
        for item in snap.iterator_cf(self.cf(keys::LINES), IteratorMode::Start) {
            let (k, v) = item?;
            match keys::split_line_key(&k) {
                Some((endpoint, None)) => {
                    let line = crate::store::lines::decode_line(endpoint, &v)?;
                    lines.heads.insert(endpoint.to_string(), line);
                }
                Some((endpoint, Some(pos))) => {
                    let id = String::from_utf8_lossy(&v).into_owned();
                    lines.members.insert((endpoint.to_string(), pos), id);
                }
                None => problems.push(format!("lines: a key without an endpoint: {k:?}")),
            }
        }
        Ok(lines)
    }

    /// One line record against its members and its head's record.
    fn audit_line_record(
        &self,
        endpoint: &str,
        line: &crate::store::LineRecord,
        lines: &Lines,
        records: &BTreeMap<String, MessageRecord>,
        quiescent: bool,
        problems: &mut Vec<String>,
    ) {
        let waiting: Vec<u64> = lines
            .members
            .keys()
            .filter(|(e, _)| e == endpoint)
            .map(|(_, p)| *p)
            .collect();
        if line.waiting != waiting.len() as u64 {
            problems.push(format!(
                "line {endpoint}: waiting {} but {} members",
                line.waiting,
                waiting.len()
            ));
        }
        if waiting.iter().any(|p| *p > line.tail) {
            problems.push(format!("line {endpoint}: a member past the tail {}", line.tail));
        }
        match records.get(&line.head) {
            None if !quiescent && (self.ghost)(&line.head) => {}
            None => problems.push(format!("line {endpoint}: head {} does not exist", line.head)),
            Some(h) if h.endpoint != *endpoint || h.fifo.is_none_or(|f| f.pos != 0) => {
                problems.push(format!("line {endpoint}: head {} is not this line's head", line.head))
            }
            Some(h) if line.blocked && h.state != State::Dead => problems.push(format!(
                "line {endpoint}: blocked behind {} which is {:?}",
                line.head, h.state
            )),
            Some(h) if !line.blocked && !matches!(h.state, State::Pending | State::InFlight) => problems.push(format!(
                "line {endpoint}: head {} is {:?} and the line goes on",
                line.head, h.state
            )),
            Some(_) => {}
        }
    }
}

/// Every record against its state, payload, due and parked entries; answers what they count.
fn audit_records(ix: &Indexes, quiescent: bool, problems: &mut Vec<String>) -> Tally {
    let mut tally = Tally::default();
    for (id, rec) in &ix.records {
        let st = ix.states.get(id).cloned().unwrap_or_default();
        if st != vec![rec.state.to_byte()] {
            problems.push(format!("{id}: state {:?} but state index {st:?}", rec.state));
        }
        if !ix.payloads.contains(id.as_bytes()) {
            problems.push(format!("{id}: no payload"));
        }
        let due_times = ix.due.get(id).cloned().unwrap_or_default();
        let is_parked = ix.parked.get(id).is_some_and(|e| *e == rec.endpoint);
        if matches!(rec.state, State::Pending | State::InFlight) {
            tally.open += 1;
            tally.in_flight += u64::from(rec.state == State::InFlight);
            *tally.open_per_endpoint.entry(rec.endpoint.clone()).or_default() += 1;
        }
        match rec.state {
            State::Pending if rec.fifo.is_some_and(|f| f.pos > 0) => {
                // Waiting in its line: no due entry, not parked (`audit_lines` checks the
                // line holds it).
                if !due_times.is_empty() || is_parked {
                    problems.push(format!("{id}: waiting in its line but queued or parked"));
                }
            }
            State::Pending => {
                let queued = due_times.contains(&rec.next_attempt_at_ms);
                if queued == is_parked {
                    problems.push(format!(
                        "{id}: pending but queued={queued} parked={is_parked} (due at {}, entries {due_times:?})",
                        rec.next_attempt_at_ms
                    ));
                }
            }
            State::InFlight => {
                if quiescent {
                    problems.push(format!("{id}: in flight with nothing running"));
                }
            }
            State::Delivered | State::Dead | State::HandedOff => {
                match rec.state {
                    State::Dead => {
                        tally.dead += 1;
                        if rec.dead_reason.is_none() {
                            problems.push(format!("{id}: dead without a reason"));
                        }
                    }
                    State::HandedOff => tally.handed_off += 1,
                    _ => tally.delivered += 1,
                }
                if is_parked || !due_times.is_empty() {
                    problems.push(format!("{id}: finished but still queued or parked"));
                }
            }
        }
    }
    tally
}

/// An open ordered message its line does not hold as it says (head, or member at its place).
fn ordered_problem(id: &str, rec: &MessageRecord, lines: &Lines) -> Option<String> {
    let fifo = rec.fifo?;
    if !matches!(rec.state, State::Pending | State::InFlight) {
        None
    } else if fifo.pos == 0 {
        let head = lines
            .heads
            .get(&rec.endpoint)
            .is_some_and(|l| l.head == id && !l.blocked);
        (!head).then(|| format!("{id}: ordered and queued but not its line's head"))
    } else if rec.state == State::InFlight
        || lines.members.get(&(rec.endpoint.clone(), fifo.pos)).map(String::as_str) != Some(id)
    {
        Some(format!(
            "{id}: {:?} at {} but its line does not hold it",
            rec.state, fifo.pos
        ))
    } else {
        None
    }
}
