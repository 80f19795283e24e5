//! A consistency audit of the whole store, for tests and the simulator: every record in
//! exactly one state with the index entries that state needs, no index entry without its
//! record, counters equal to what they count, and every ordered endpoint's line whole (one
//! head, the rest waiting with no due entry). It reads everything: never in production.

use std::collections::{BTreeMap, BTreeSet};

use rocksdb::IteratorMode;

use crate::store::{decode_message, keys, MessageRecord, State, Store, StoreError};

impl Store {
    /// Every inconsistency found (empty when the store is consistent). `quiescent` adds the
    /// rules that hold only when nothing is running: no message in flight.
    pub fn audit(&self, quiescent: bool) -> Result<Vec<String>, StoreError> {
        let mut problems = Vec::new();
        // One snapshot for every family: a write landing between two reads (a background
        // release, a result) must not look like a record and its index disagreeing.
        let snap = self.db.snapshot();
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
            states
                .entry(String::from_utf8_lossy(&k[1..]).into_owned())
                .or_default()
                .push(k[0]);
        }
        let mut due: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for k in keys_of(keys::DUE)? {
            let (ms, id) = keys::split_time_key(&k).expect("due keys are time keys");
            due.entry(id.to_string()).or_default().push(ms);
        }
        let mut parked: BTreeMap<String, String> = BTreeMap::new();
        for k in keys_of(keys::PARKED)? {
            let end = k.iter().position(|b| *b == 0).unwrap_or(k.len());
            let endpoint = String::from_utf8_lossy(&k[..end]).into_owned();
            let id = String::from_utf8_lossy(&k[(end + 1).min(k.len())..]).into_owned();
            parked.insert(id, endpoint);
        }

        let lines = self.audit_lines(&snap, &records, quiescent, &mut problems)?;

        let mut open = 0u64;
        let (mut delivered, mut dead, mut handed_off) = (0u64, 0u64, 0u64);
        let mut open_per_endpoint: BTreeMap<String, u64> = BTreeMap::new();
        for (id, rec) in &records {
            let st = states.get(id).cloned().unwrap_or_default();
            if st != vec![rec.state.to_byte()] {
                problems.push(format!("{id}: state {:?} but state index {st:?}", rec.state));
            }
            if !payloads.contains(id.as_bytes()) {
                problems.push(format!("{id}: no payload"));
            }
            let due_times = due.get(id).cloned().unwrap_or_default();
            let is_parked = parked.get(id).is_some_and(|e| *e == rec.endpoint);
            match rec.state {
                State::Pending if rec.fifo.is_some_and(|f| f.pos > 0) => {
                    // Waiting in its line: no due entry, not parked (`audit_lines` checks the
                    // line holds it).
                    open += 1;
                    *open_per_endpoint.entry(rec.endpoint.clone()).or_default() += 1;
                    if !due_times.is_empty() || is_parked {
                        problems.push(format!("{id}: waiting in its line but queued or parked"));
                    }
                }
                State::Pending => {
                    open += 1;
                    *open_per_endpoint.entry(rec.endpoint.clone()).or_default() += 1;
                    let queued = due_times.contains(&rec.next_attempt_at_ms);
                    if queued == is_parked {
                        problems.push(format!(
                            "{id}: pending but queued={queued} parked={is_parked} (due at {}, entries {due_times:?})",
                            rec.next_attempt_at_ms
                        ));
                    }
                }
                State::InFlight => {
                    open += 1;
                    *open_per_endpoint.entry(rec.endpoint.clone()).or_default() += 1;
                    if quiescent {
                        problems.push(format!("{id}: in flight with nothing running"));
                    }
                }
                State::Delivered | State::Dead | State::HandedOff => {
                    match rec.state {
                        State::Dead => {
                            dead += 1;
                            if rec.dead_reason.is_none() {
                                problems.push(format!("{id}: dead without a reason"));
                            }
                        }
                        State::HandedOff => handed_off += 1,
                        _ => delivered += 1,
                    }
                    if is_parked || !due_times.is_empty() {
                        problems.push(format!("{id}: finished but still queued or parked"));
                    }
                }
            }
        }
        for id in states.keys().chain(due.keys()).chain(parked.keys()) {
            if !records.contains_key(id) {
                problems.push(format!("{id}: an index entry without its record"));
            }
        }
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
        if counted != (open, delivered, dead, handed_off) {
            problems.push(format!(
                "counters open/delivered/dead/handed off {counted:?} but records {:?}",
                (open, delivered, dead, handed_off)
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
        if stored != open_per_endpoint {
            problems.push(format!(
                "open per endpoint {stored:?} but records {open_per_endpoint:?}"
            ));
        }
        Ok(problems)
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
        let mut heads: BTreeMap<String, crate::store::LineRecord> = BTreeMap::new();
        let mut members: BTreeMap<(String, u64), String> = BTreeMap::new();
        for item in snap.iterator_cf(self.cf(keys::LINES), IteratorMode::Start) {
            let (k, v) = item?;
            match keys::split_line_key(&k) {
                Some((endpoint, None)) => {
                    heads.insert(endpoint.to_string(), crate::store::lines::decode_line(endpoint, &v)?);
                }
                Some((endpoint, Some(pos))) => {
                    members.insert((endpoint.to_string(), pos), String::from_utf8_lossy(&v).into_owned());
                }
                None => problems.push(format!("lines: a key without an endpoint: {k:?}")),
            }
        }
        for (endpoint, line) in &heads {
            let waiting: Vec<u64> = members.keys().filter(|(e, _)| e == endpoint).map(|(_, p)| *p).collect();
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
                None if !quiescent && self.is_ghost_head(&line.head) => {}
                None => problems.push(format!("line {endpoint}: head {} does not exist", line.head)),
                Some(h) if h.endpoint != *endpoint || h.fifo.is_none_or(|f| f.pos != 0) => {
                    problems.push(format!("line {endpoint}: head {} is not this line's head", line.head))
                }
                Some(h) if line.blocked && h.state != State::Dead => problems.push(format!(
                    "line {endpoint}: blocked behind {} which is {:?}",
                    line.head, h.state
                )),
                Some(h) if !line.blocked && !matches!(h.state, State::Pending | State::InFlight) => {
                    problems.push(format!(
                        "line {endpoint}: head {} is {:?} and the line goes on",
                        line.head, h.state
                    ))
                }
                Some(_) => {}
            }
        }
        for ((endpoint, pos), id) in &members {
            if !heads.contains_key(endpoint) {
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
            let Some(fifo) = rec.fifo else { continue };
            let open = matches!(rec.state, State::Pending | State::InFlight);
            let problem = if !open {
                None
            } else if fifo.pos == 0 {
                let head = heads.get(&rec.endpoint).is_some_and(|l| l.head == *id && !l.blocked);
                (!head).then(|| format!("{id}: ordered and queued but not its line's head"))
            } else if rec.state == State::InFlight || members.get(&(rec.endpoint.clone(), fifo.pos)) != Some(id) {
                Some(format!(
                    "{id}: {:?} at {} but its line does not hold it",
                    rec.state, fifo.pos
                ))
            } else {
                None
            };
            problems.extend(problem);
        }
        Ok(members.len() as u64)
    }
}
