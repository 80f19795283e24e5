//! Versioned binary encoding of stored records. Every record starts with a kind byte
//! and a version byte; a record of an unknown version is an error ([`CodecError`]),
//! never skipped, so an old binary cannot silently drop what a newer one wrote.

pub use super::wire::CodecError;
pub(super) use super::wire::{Reader, Writer};
use crate::model::{DeadReason, OnDead, SignatureScheme, State};

const MESSAGE_V1: [u8; 2] = [b'M', 1];
/// A message of an ordered endpoint: version 1 plus its [`Fifo`] place. Unordered messages
/// are still written as version 1, so a courier from before ordering reads them.
const MESSAGE_V2: [u8; 2] = [b'M', 2];
/// Version 1 plus an optional [`Fifo`] place and the route the message was accepted
/// through; written only for messages that came through a route.
const MESSAGE_V3: [u8; 2] = [b'M', 3];
/// Version 3's fields (a flags byte says which of the fifo place and route follow) plus the
/// last attempt's [`LastAttempt`]: written once a message has had an attempt (store format 2).
const MESSAGE_V4: [u8; 2] = [b'M', 4];
const PAYLOAD_V1: [u8; 2] = [b'P', 1];
/// Version 1 with the body LZ4-compressed on its own when that makes it smaller: written
/// where payloads are sealed (RocksDB cannot compress those, and compressing the whole
/// record would let a body's chosen text probe the headers and secret by size).
const PAYLOAD_V2: [u8; 2] = [b'P', 2];
const ATTEMPT_V1: [u8; 2] = [b'A', 1];
/// Version 2 adds the revision of the policy the attempt was made under.
const ATTEMPT_V2: [u8; 2] = [b'A', 2];
/// Version 2 plus the attempt's trace span id (when the message carries a trace context).
const ATTEMPT_V3: [u8; 2] = [b'A', 3];
const ENDPOINT_V1: [u8; 2] = [b'E', 1];
const ENDPOINT_V2: [u8; 2] = [b'E', 2];
const ROUTING_V1: [u8; 2] = [b'R', 1];

/// The mutable part of a message: what the scheduler, the worker and the admin API read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageRecord {
    /// Delivery id (`dlv_…`).
    pub id: String,
    /// Event id, the same on every attempt.
    pub event_id: String,
    /// Target URL.
    pub target: String,
    /// Endpoint key (rate limit, pause, stats).
    pub endpoint: String,
    /// `host:port` the per-host cap applies to.
    pub host: String,
    /// The `[[route]]` it was accepted through (`None` for other forms, and for messages
    /// stored before routes were recorded): its retry settings apply at each attempt.
    pub route: Option<String>,
    /// Current state.
    pub state: State,
    /// Attempts made so far in the current round (reset by a replay).
    pub attempts: u32,
    /// Entries in the attempt history (kept across replays).
    pub history_len: u32,
    /// Give-up by attempts, for this message.
    pub max_attempts: u32,
    /// Acceptance time (unix millis).
    pub accepted_at_ms: u64,
    /// When the next attempt is due (0 when none is).
    pub next_attempt_at_ms: u64,
    /// Give-up by time (unix millis).
    pub give_up_at_ms: u64,
    /// When it was delivered or dead-lettered (0 while open).
    pub finished_at_ms: u64,
    /// Why it is dead.
    pub dead_reason: Option<DeadReason>,
    /// The status of the last attempt, if the receiver answered.
    pub last_status: Option<u16>,
    /// The error of the last attempt, if any.
    pub last_error: Option<String>,
    /// Set when the message is ordered (`ordering = "fifo"` on its endpoint or route at
    /// acceptance): it is attempted only as the head of its endpoint's line.
    pub fifo: Option<Fifo>,
    /// The rest of the last attempt, kept in the record rather than as a `history` entry
    /// (one write fewer per attempt: a message delivered at its first has none), number
    /// `history_len`; it moves to `history` when the next attempt is recorded. `None` before
    /// the first attempt, and in records of store format 1, whose attempts are all in
    /// `history`.
    pub last_attempt: Option<LastAttempt>,
}

/// The last attempt of a message as its record keeps it: its status and error are the
/// record's `last_status` and `last_error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastAttempt {
    /// When it started (unix millis).
    pub at_ms: u64,
    /// How long it took.
    pub duration_ms: u32,
    /// The revision of the policy it was made under.
    pub policy_revision: Option<u32>,
    /// The span id of the `traceparent` it sent.
    pub span_id: Option<String>,
}

impl LastAttempt {
    /// The part of `attempt` the record keeps.
    pub fn of(attempt: &AttemptRecord) -> Self {
        LastAttempt {
            at_ms: attempt.at_ms,
            duration_ms: attempt.duration_ms,
            policy_revision: attempt.policy_revision,
            span_id: attempt.span_id.clone(),
        }
    }

    /// The whole attempt, with the record's status and error.
    pub fn with(self, status: Option<u16>, error: Option<String>) -> AttemptRecord {
        AttemptRecord {
            at_ms: self.at_ms,
            status,
            error,
            duration_ms: self.duration_ms,
            policy_revision: self.policy_revision,
            span_id: self.span_id,
        }
    }
}

/// An ordered message's part in its endpoint's line (see `store::lines`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fifo {
    /// What its death does to the line, fixed at acceptance.
    pub on_dead: OnDead,
    /// Its place in the line while it waits behind the head (1, 2, ...: the line's own
    /// counter); 0 while it is the head, and once it has left the line.
    pub pos: u64,
}

/// How a message's attempts are signed, fixed at acceptance. Secrets named by key are
/// looked up in the config at each attempt, so a rotation applies to retries too.
#[derive(Clone, PartialEq, Eq)]
pub enum SigningChoice {
    /// The configured default secrets.
    Default,
    /// A named key from `[signing.keys]`.
    Key(String),
    /// A per-message secret from `Courier-Signing-Secret` (stored with the message).
    Inline(String),
}

impl std::fmt::Debug for SigningChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SigningChoice::Default => f.write_str("Default"),
            SigningChoice::Key(name) => write!(f, "Key({name:?})"),
            SigningChoice::Inline(_) => f.write_str("Inline(***)"),
        }
    }
}

/// The immutable part of a message: what is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    /// HTTP method.
    pub method: String,
    /// Headers to forward, in order, lowercase names.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body, byte for byte as received.
    pub body: Vec<u8>,
    /// The scheme chosen at acceptance (`None`: the configured default at attempt time).
    pub scheme: Option<SignatureScheme>,
    /// Where the signing secrets come from.
    pub signing: SigningChoice,
}

/// One attempt, for the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRecord {
    /// When it started (unix millis).
    pub at_ms: u64,
    /// The receiver's status, if it answered.
    pub status: Option<u16>,
    /// What went wrong, if anything.
    pub error: Option<String>,
    /// How long it took.
    pub duration_ms: u32,
    /// The revision of the policy it was made under (`policy::RetryPolicy::revision`); `None`
    /// for attempts recorded before revisions were.
    pub policy_revision: Option<u32>,
    /// The span id (16 hex digits) of the `traceparent` this attempt sent; `None` when the
    /// message has no trace context, and for attempts recorded before version 3.
    pub span_id: Option<String>,
}

/// Persistent state of an endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointRecord {
    /// Paused by an operator or by the permanent-failure streak.
    pub paused: bool,
    /// Consecutive permanent failures.
    pub streak: u32,
    /// Last status seen (for the alert).
    pub last_status: Option<u16>,
}

/// What the scheduler needs to gate a due message without reading the message record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    /// `host:port`.
    pub host: String,
    /// Endpoint key.
    pub endpoint: String,
}

/// Dead reasons and signature schemes are stored as their place in these tables, plus one
/// (0: none). Append only: a place, once written, is on disk.
const REASONS: [DeadReason; 4] = [
    DeadReason::MaxAttempts,
    DeadReason::Expired,
    DeadReason::PermanentStatus,
    DeadReason::EgressDenied,
];
const SCHEMES: [SignatureScheme; 4] = [
    SignatureScheme::Standard,
    SignatureScheme::Stripe,
    SignatureScheme::Github,
    SignatureScheme::None,
];

fn place_byte<T: PartialEq>(table: &[T], v: Option<T>) -> u8 {
    v.map_or(0, |v| {
        1 + table.iter().position(|t| *t == v).expect("every value is in its table") as u8
    })
}

fn from_place<T: Copy>(table: &[T], b: u8, kind: &'static str, what: &'static str) -> Result<Option<T>, CodecError> {
    match b {
        0 => Ok(None),
        b => table
            .get(usize::from(b) - 1)
            .map(|v| Some(*v))
            .ok_or(CodecError::Corrupt(kind, what)),
    }
}

impl MessageRecord {
    /// Encodes the record.
    pub fn encode(&self) -> Vec<u8> {
        // The oldest version that carries the record, so older couriers read what they can.
        let tag = match (&self.last_attempt, &self.route, self.fifo) {
            (Some(_), _, _) => MESSAGE_V4,
            (None, Some(_), _) => MESSAGE_V3,
            (None, None, Some(_)) => MESSAGE_V2,
            (None, None, None) => MESSAGE_V1,
        };
        // Room for all it writes (5 strings and 3 optional ones, each after a 4-byte
        // length; at most 60 bytes of numbers and flags, 18 more for the last attempt), so
        // it never grows.
        let strings = [&self.id, &self.event_id, &self.target, &self.endpoint, &self.host];
        let span = self.last_attempt.as_ref().and_then(|a| a.span_id.as_ref());
        let optional = [self.last_error.as_ref(), self.route.as_ref(), span];
        let capacity = 60
            + if self.last_attempt.is_some() { 18 } else { 0 }
            + 4 * 8
            + strings.iter().map(|s| s.len()).sum::<usize>()
            + optional.iter().flatten().map(|s| s.len()).sum::<usize>();
        let mut w = Writer::new(tag, capacity);
        w.str(&self.id);
        w.str(&self.event_id);
        w.str(&self.target);
        w.str(&self.endpoint);
        w.str(&self.host);
        w.u8(self.state.to_byte());
        w.u32(self.attempts);
        w.u32(self.history_len);
        w.u32(self.max_attempts);
        w.u64(self.accepted_at_ms);
        w.u64(self.next_attempt_at_ms);
        w.u64(self.give_up_at_ms);
        w.u64(self.finished_at_ms);
        w.u8(place_byte(&REASONS, self.dead_reason));
        w.opt_u16(self.last_status);
        w.opt_str(self.last_error.as_deref());
        // Version 4: flags, maybe the fifo place and the route, the last attempt; version 3:
        // a flag, maybe the fifo place, then the route; version 2: the fifo place.
        if tag == MESSAGE_V4 {
            w.u8(u8::from(self.fifo.is_some()) | u8::from(self.route.is_some()) << 1);
        } else if tag == MESSAGE_V3 {
            w.u8(u8::from(self.fifo.is_some()));
        }
        if let Some(fifo) = self.fifo {
            w.u8(u8::from(fifo.on_dead == OnDead::Block));
            w.u64(fifo.pos);
        }
        if let Some(route) = &self.route {
            w.str(route);
        }
        if let Some(a) = &self.last_attempt {
            w.u64(a.at_ms);
            w.u32(a.duration_ms);
            w.u8(u8::from(a.policy_revision.is_some()));
            if let Some(rev) = a.policy_revision {
                w.u32(rev);
            }
            w.opt_str(a.span_id.as_deref());
        }
        w.0
    }

    /// Decodes a record of any version [`MessageRecord::encode`] writes: 1 (no fifo place,
    /// no route), 2 (a fifo place), 3 (maybe a fifo place, and a route) or 4 (maybe either,
    /// and the last attempt).
    pub fn decode(buf: &[u8]) -> Result<Self, CodecError> {
        let version = buf.get(..2).filter(|t| t[0] == b'M').map_or(1, |t| t[1]);
        let tag = match version {
            2 => MESSAGE_V2,
            3 => MESSAGE_V3,
            4 => MESSAGE_V4,
            _ => MESSAGE_V1,
        };
        let mut r = Reader::new("message", tag, buf)?;
        let mut rec = MessageRecord {
            id: r.string()?,
            event_id: r.string()?,
            target: r.string()?,
            endpoint: r.string()?,
            host: r.string()?,
            route: None,
            state: State::from_byte(r.u8()?).ok_or(CodecError::Corrupt("message", "unknown state"))?,
            attempts: r.u32()?,
            history_len: r.u32()?,
            max_attempts: r.u32()?,
            accepted_at_ms: r.u64()?,
            next_attempt_at_ms: r.u64()?,
            give_up_at_ms: r.u64()?,
            finished_at_ms: r.u64()?,
            dead_reason: from_place(&REASONS, r.u8()?, "message", "unknown dead reason")?,
            last_status: r.opt_u16()?,
            last_error: r.opt_string()?,
            fifo: None,
            last_attempt: None,
        };
        // Version 2: the fifo place; version 3: a flag and maybe the fifo place, then the
        // route; version 4: flags for both.
        let (has_fifo, has_route) = match version {
            2 => (true, false),
            3 => (r.flag()?, true),
            4 => match r.u8()? {
                flags @ 0..=3 => (flags & 1 == 1, flags & 2 == 2),
                _ => return Err(CodecError::Corrupt("message", "unknown flags")),
            },
            _ => (false, false),
        };
        if has_fifo {
            let on_dead = match r.u8()? {
                0 => OnDead::Skip,
                1 => OnDead::Block,
                _ => return Err(CodecError::Corrupt("message", "unknown on_dead")),
            };
            rec.fifo = Some(Fifo { on_dead, pos: r.u64()? });
        }
        if has_route {
            rec.route = Some(r.string()?);
        }
        if version == 4 {
            rec.last_attempt = Some(LastAttempt {
                at_ms: r.u64()?,
                duration_ms: r.u32()?,
                policy_revision: if r.flag()? { Some(r.u32()?) } else { None },
                span_id: r.opt_string()?,
            });
        }
        r.end()?;
        Ok(rec)
    }
}

impl Payload {
    /// Encodes the payload as version 1, every field as it is: what [`Payload::encode_plain`]
    /// writes when the body does not pack to half (tests write it directly).
    #[cfg(test)]
    pub fn encode(&self) -> Vec<u8> {
        self.encode_as(None)
    }

    /// Encodes the payload to be sealed (version 2): the body compressed on its own, so no
    /// compression context spans it and the headers or secret, and a sealed payload's size
    /// depends on the body and on the other fields' lengths only.
    pub fn encode_packed(&self) -> Vec<u8> {
        self.encode_as(Some(&super::seal::pack(&self.body)))
    }

    /// Encodes the payload to be stored plain: version 2 when its body packs to half its
    /// size or less, else version 1 (see `sealing::stored_payload`). The body is compressed
    /// once, whichever is written.
    pub fn encode_plain(&self) -> Vec<u8> {
        let packed = super::seal::pack(&self.body);
        self.encode_as((packed.len() * 2 <= self.body.len()).then_some(&packed[..]))
    }

    /// Version 2 with the body already packed (`packed`), or version 1 (`None`).
    fn encode_as(&self, packed: Option<&[u8]>) -> Vec<u8> {
        let headers_len: usize = self.headers.iter().map(|(n, v)| n.len() + v.len() + 8).sum();
        let tag = if packed.is_some() { PAYLOAD_V2 } else { PAYLOAD_V1 };
        let mut w = Writer::new(tag, 32 + self.method.len() + headers_len + self.body.len());
        w.str(&self.method);
        w.u32(self.headers.len() as u32);
        for (name, value) in &self.headers {
            w.str(name);
            w.bytes(value);
        }
        match packed {
            Some(packed) => w.packed(&self.body, packed),
            None => w.bytes(&self.body),
        }
        w.u8(place_byte(&SCHEMES, self.scheme));
        let (tag, text) = match &self.signing {
            SigningChoice::Default => (0, None),
            SigningChoice::Key(name) => (1, Some(name)),
            SigningChoice::Inline(secret) => (2, Some(secret)),
        };
        w.u8(tag);
        if let Some(text) = text {
            w.str(text);
        }
        w.0
    }

    /// Decodes a payload written by [`Payload::encode_plain`] or [`Payload::encode_packed`]
    /// (version 1 or 2).
    pub fn decode(buf: &[u8]) -> Result<Self, CodecError> {
        let packed = buf.get(..2) == Some(&PAYLOAD_V2[..]);
        let mut r = Reader::new("payload", if packed { PAYLOAD_V2 } else { PAYLOAD_V1 }, buf)?;
        let method = r.string()?;
        let count = r.u32()? as usize;
        // A corrupt count must not make us allocate gigabytes up front.
        let mut headers = Vec::with_capacity(count.min(256));
        for _ in 0..count {
            let name = r.string()?;
            let value = r.bytes()?.to_vec();
            headers.push((name, value));
        }
        let body = if packed { r.packed()? } else { r.bytes()?.to_vec() };
        let scheme = from_place(&SCHEMES, r.u8()?, "payload", "unknown signature scheme")?;
        let signing = match r.u8()? {
            0 => SigningChoice::Default,
            1 => SigningChoice::Key(r.string()?),
            2 => SigningChoice::Inline(r.string()?),
            _ => return Err(CodecError::Corrupt("payload", "unknown signing choice")),
        };
        r.end()?;
        Ok(Payload {
            method,
            headers,
            body,
            scheme,
            signing,
        })
    }
}

impl AttemptRecord {
    /// Encodes the attempt.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(ATTEMPT_V3, 64);
        w.u64(self.at_ms);
        w.opt_u16(self.status);
        w.opt_str(self.error.as_deref());
        w.u32(self.duration_ms);
        w.u8(u8::from(self.policy_revision.is_some()));
        if let Some(rev) = self.policy_revision {
            w.u32(rev);
        }
        w.opt_str(self.span_id.as_deref());
        w.0
    }

    /// Decodes an attempt written by [`AttemptRecord::encode`], or by a courier that wrote
    /// version 1 (no policy revision) or 2 (no span id).
    pub fn decode(buf: &[u8]) -> Result<Self, CodecError> {
        let version = match buf.get(..2) {
            Some(v) if v == ATTEMPT_V1 => 1,
            Some(v) if v == ATTEMPT_V2 => 2,
            _ => 3,
        };
        let tag = [ATTEMPT_V1, ATTEMPT_V2, ATTEMPT_V3][version - 1];
        let mut r = Reader::new("attempt", tag, buf)?;
        let rec = AttemptRecord {
            at_ms: r.u64()?,
            status: r.opt_u16()?,
            error: r.opt_string()?,
            duration_ms: r.u32()?,
            policy_revision: if version >= 2 && r.flag()? {
                Some(r.u32()?)
            } else {
                None
            },
            span_id: if version >= 3 { r.opt_string()? } else { None },
        };
        r.end()?;
        Ok(rec)
    }
}

impl EndpointRecord {
    /// Encodes the endpoint state with when it was written (unix millis): the store
    /// forgets a record not written within the retention window unless it is paused.
    pub fn encode_at(&self, written_ms: u64) -> Vec<u8> {
        let mut w = Writer::new(ENDPOINT_V2, 24);
        w.u8(u8::from(self.paused));
        w.u32(self.streak);
        w.opt_u16(self.last_status);
        w.u64(written_ms);
        w.0
    }

    /// Decodes an endpoint state written by [`EndpointRecord::encode_at`] and when it was
    /// written. A version-1 record (written
    /// before records carried the time) reads as written at 0: the next retention sweep
    /// forgets it unless it is paused, which only forgets a streak.
    pub fn decode_stamped(buf: &[u8]) -> Result<(Self, u64), CodecError> {
        let v1 = buf.get(..2) == Some(&ENDPOINT_V1[..]);
        let mut r = Reader::new("endpoint", if v1 { ENDPOINT_V1 } else { ENDPOINT_V2 }, buf)?;
        let rec = EndpointRecord {
            paused: r.flag()?,
            streak: r.u32()?,
            last_status: r.opt_u16()?,
        };
        let written_ms = if v1 { 0 } else { r.u64()? };
        r.end()?;
        Ok((rec, written_ms))
    }
}

impl Routing {
    /// Encodes the routing value of a `due` entry.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(ROUTING_V1, self.host.len() + self.endpoint.len() + 8);
        w.str(&self.host);
        w.str(&self.endpoint);
        w.0
    }

    /// Decodes a routing value written by [`Routing::encode`].
    pub fn decode(buf: &[u8]) -> Result<Self, CodecError> {
        let mut r = Reader::new("routing", ROUTING_V1, buf)?;
        let rec = Routing {
            host: r.string()?,
            endpoint: r.string()?,
        };
        r.end()?;
        Ok(rec)
    }
}

// The tests live with the other store tests; as a child of this module they reach the
// writer and the version tags, to build records older couriers wrote.
const LINE_V1: [u8; 2] = [b'L', 1];

/// An ordered endpoint's line, as stored under `endpoint ‖ 0`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LineRecord {
    /// The head: the message attempted now (open), the dead one the line is blocked behind,
    /// or one deleted while its attempt was in flight (until that attempt ends).
    pub head: String,
    /// Blocked behind a dead head (`on_dead = "block"`) until a resume or a replay.
    pub blocked: bool,
    /// The last position given to a waiting member.
    pub tail: u64,
    /// Members waiting behind the head.
    pub waiting: u64,
}

impl LineRecord {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(LINE_V1, 32 + self.head.len());
        w.str(&self.head);
        w.u8(u8::from(self.blocked));
        w.u64(self.tail);
        w.u64(self.waiting);
        w.0
    }

    pub(super) fn decode(buf: &[u8]) -> Result<Self, CodecError> {
        let mut r = Reader::new("line", LINE_V1, buf)?;
        let rec = LineRecord {
            head: r.string()?,
            blocked: r.flag()?,
            tail: r.u64()?,
            waiting: r.u64()?,
        };
        r.end()?;
        Ok(rec)
    }
}

#[cfg(test)]
#[path = "tests/codec.rs"]
mod tests;
