//! Key layout of every column family. Integers are big-endian so that RocksDB's byte
//! order is numeric order: iterating `due` yields messages in due-time order, and
//! iterating `expiry` yields them in expiry order.

/// Column family names, in the order they are opened.
pub const CF_NAMES: [&str; 11] = [
    MESSAGES, PAYLOADS, DUE, STATES, PARKED, EVENTS, HISTORY, ENDPOINTS, EXPIRY, META, LINES,
];
/// id → [`MessageRecord`](super::MessageRecord): small, rewritten on every transition.
pub const MESSAGES: &str = "messages";
/// id → [`Payload`](super::Payload): written once, so retries never rewrite the body.
pub const PAYLOADS: &str = "payloads";
/// be64(due millis) ‖ id → [`Routing`](super::Routing): the scheduler's queue, in due order;
/// the routing lets it gate on host and endpoint without a point read.
pub const DUE: &str = "due";
/// state byte ‖ id → empty: listing by state in id (= acceptance) order, finding in-flight
/// messages at start, and the oldest open message.
pub const STATES: &str = "states";
/// endpoint ‖ 0 ‖ id → be64(due millis) ‖ routing of the due entry it replaced (empty in
/// older keys): messages that came due while their endpoint was paused (`store::parking`).
pub const PARKED: &str = "parked";
/// event id ‖ 0 ‖ target → id: ingest dedupe, for event ids the app chose (one courier
/// made, `msg_` and the delivery id's ULID, is found by that id: `store::accept`).
pub const EVENTS: &str = "events";
/// id ‖ be32(attempt number) → [`AttemptRecord`](super::AttemptRecord).
pub const HISTORY: &str = "history";
/// endpoint → [`EndpointRecord`](super::EndpointRecord) and when it was written (see
/// `store::endpoints`).
pub const ENDPOINTS: &str = "endpoints";
/// counter name → i64 (little-endian), see `store::counters`; and [`SEALED_BY`].
pub const META: &str = "meta";
/// The `meta` key of the ids (4 bytes each) of every key a stored payload may be sealed
/// with (see `store::sealing`).
pub const SEALED_BY: &[u8] = b"seal/keys";
/// `meta`: the store's format (see `format`).
pub const FORMAT: &[u8] = b"format";
/// Ordered endpoints' lines: endpoint ‖ 0 → [`LineRecord`](super::LineRecord), endpoint ‖ 0 ‖
/// be64(position) → id of each message waiting behind the head (see `store::lines`).
pub const LINES: &str = "lines";
/// be64(remove-at millis) ‖ id → empty: the retention sweep's order.
pub const EXPIRY: &str = "expiry";

/// A key as made: inline up to 40 bytes (an id and a time, state or attempt number), so
/// the several keys each message's writes make need no allocation; longer ones (endpoint
/// keys) spill to the heap.
pub type Key = smallvec::SmallVec<[u8; 40]>;

/// The concatenation of `parts`.
fn key(parts: &[&[u8]]) -> Key {
    let mut k = Key::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        k.extend_from_slice(p);
    }
    k
}

/// `be64(ms) ‖ id`, the layout of `due` and `expiry` keys.
pub fn time_key(ms: u64, id: &str) -> Key {
    key(&[&ms.to_be_bytes(), id.as_bytes()])
}

/// Splits a `time_key` back into its time and id.
pub fn split_time_key(key: &[u8]) -> Option<(u64, &str)> {
    if key.len() < 8 {
        return None;
    }
    let (ms, id) = key.split_at(8);
    let ms = u64::from_be_bytes(ms.try_into().ok()?);
    Some((ms, std::str::from_utf8(id).ok()?))
}

/// `state byte ‖ id`.
pub fn state_key(state: u8, id: &str) -> Key {
    key(&[&[state], id.as_bytes()])
}

/// `a ‖ 0 ‖ b`, for `parked` (endpoint, id) and `events` (event id, target). Neither
/// endpoints nor event ids may contain a NUL byte (ingress rejects control characters).
pub fn pair_key(a: &str, b: &str) -> Key {
    key(&[a.as_bytes(), &[0], b.as_bytes()])
}

/// The prefix of every `pair_key(a, _)`.
pub fn pair_prefix(a: &str) -> Key {
    pair_key(a, "")
}

/// `endpoint ‖ 0`: the key of an ordered endpoint's line record. It sorts before every
/// waiting member of that line, so one seek finds the record and then the first member.
pub fn line_key(endpoint: &str) -> Key {
    pair_prefix(endpoint)
}

/// `endpoint ‖ 0 ‖ be64(pos)`: a message waiting in an ordered endpoint's line.
pub fn line_member_key(endpoint: &str, pos: u64) -> Key {
    key(&[endpoint.as_bytes(), &[0], &pos.to_be_bytes()])
}

/// Splits a `lines` key into its endpoint and, for a member, its position.
pub fn split_line_key(key: &[u8]) -> Option<(&str, Option<u64>)> {
    let end = key.iter().position(|b| *b == 0)?;
    let endpoint = std::str::from_utf8(&key[..end]).ok()?;
    match &key[end + 1..] {
        [] => Some((endpoint, None)),
        pos => Some((endpoint, Some(u64::from_be_bytes(pos.try_into().ok()?)))),
    }
}

/// `id ‖ be32(attempt)`.
pub fn history_key(id: &str, attempt: u32) -> Key {
    key(&[id.as_bytes(), &attempt.to_be_bytes()])
}

/// Where a walk of the keys `prefix ‖ …` resumes strictly after `prefix ‖ after` (at the
/// prefix itself without a cursor).
pub fn after(prefix: &[u8], after: Option<&str>) -> Vec<u8> {
    match after {
        Some(a) => [prefix, a.as_bytes(), &[0]].concat(),
        None => prefix.to_vec(),
    }
}

/// The smallest key strictly greater than every key that starts with `prefix`
/// (an exclusive upper bound for a prefix scan).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xff; prefix.len() + 1]
}

/// Counter of open (pending or in-flight) messages.
pub const COUNT_OPEN: &[u8] = b"count/open";
/// Counter of delivered messages still retained.
pub const COUNT_DELIVERED: &[u8] = b"count/delivered";
/// Counter of dead messages still retained.
pub const COUNT_DEAD: &[u8] = b"count/dead";
/// Counter of handed-off messages still retained.
pub const COUNT_HANDED_OFF: &[u8] = b"count/handed_off";
/// Counter of messages waiting in ordered endpoints' lines (behind their head).
pub const COUNT_LINED: &[u8] = b"count/lined";
/// Prefix of the per-endpoint open counters.
pub const COUNT_OPEN_ENDPOINT: &[u8] = b"open/";

/// The per-endpoint open counter key.
pub fn endpoint_open_key(endpoint: &str) -> Key {
    key(&[COUNT_OPEN_ENDPOINT, endpoint.as_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_keys_sort_by_time_then_id() {
        let mut keys = [
            time_key(300, "a"),
            time_key(2, "z"),
            time_key(256, "b"),
            time_key(2, "a"),
        ];
        keys.sort();
        let decoded: Vec<_> = keys.iter().map(|k| split_time_key(k).unwrap()).collect();
        assert_eq!(decoded, vec![(2, "a"), (2, "z"), (256, "b"), (300, "a")]);
        assert_eq!(split_time_key(b"short"), None);
    }

    #[test]
    fn pair_keys_of_one_prefix_stay_together() {
        let p = pair_prefix("https://a.example/x");
        assert!(pair_key("https://a.example/x", "dlv_1").starts_with(&p));
        assert!(!pair_key("https://a.example/xy", "dlv_1").starts_with(&p));
        assert!(prefix_end(&p)[..] > pair_key("https://a.example/x", "\u{7f}\u{7f}")[..]);
    }

    #[test]
    fn prefix_end_carries_over_ff() {
        assert_eq!(prefix_end(b"ab"), b"ac".to_vec());
        assert_eq!(prefix_end(&[1, 0xff]), vec![2]);
        assert_eq!(prefix_end(&[0xff, 0xff]), vec![0xff, 0xff, 0xff]);
    }

    #[test]
    fn a_line_record_sorts_before_its_members_and_members_by_position() {
        let e = "https://a.example/x";
        assert!(line_key(e) < line_member_key(e, 0));
        assert!(line_member_key(e, 255) < line_member_key(e, 256));
        assert!(line_member_key(e, u64::MAX)[..] < prefix_end(&line_key(e))[..]);
        assert_eq!(split_line_key(&line_key(e)), Some((e, None)));
        assert_eq!(split_line_key(&line_member_key(e, 300)), Some((e, Some(300))));
        assert_eq!(split_line_key(b"no-separator"), None);
    }

    #[test]
    fn history_keys_sort_by_attempt() {
        assert!(history_key("dlv_1", 2) < history_key("dlv_1", 10));
        assert!(history_key("dlv_1", 255) < history_key("dlv_1", 256));
    }
}
