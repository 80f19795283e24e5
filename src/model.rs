//! The vocabulary shared by every layer: ids, message states, dead-letter reasons,
//! signature schemes and jitter modes. Pure data, no I/O.

use std::fmt;
use std::str::FromStr;

/// `ALL`, `as_str` and `FromStr` for an enum of unit variants, each with its one spelling
/// (after `normalise`, when given); an unknown name is an [`UnknownName`] listing them all.
macro_rules! names {
    ($ty:ident, $what:literal, { $($variant:ident => $name:literal),+ $(,)? }) => {
        names!($ty, $what, |s| s.to_string(), { $($variant => $name),+ });
    };
    ($ty:ident, $what:literal, $normalise:expr, { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: [$ty; [$($name),+].len()] = [$($ty::$variant),+];

            /// Its name, as the config, the headers, the admin API, the CLI and the metrics
            /// spell it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl FromStr for $ty {
            type Err = UnknownName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let normalise: fn(&str) -> String = $normalise;
                let name = normalise(s);
                $ty::ALL.into_iter().find(|v| v.as_str() == name).ok_or_else(|| UnknownName {
                    what: $what,
                    given: s.to_string(),
                    expected: [$($name),+].join(", "),
                })
            }
        }
    };
}

/// Prefix of delivery ids (courier's own id for one accepted message).
pub const DELIVERY_ID_PREFIX: &str = "dlv_";
/// Prefix of generated event ids (used when the app sends neither `webhook-id` nor `Idempotency-Key`).
pub const EVENT_ID_PREFIX: &str = "msg_";

/// A new delivery id: `dlv_<ULID>`. ULIDs sort by creation time, which the store's
/// listing order and the oldest-pending gauge rely on.
#[cfg(test)]
pub fn new_delivery_id(now_ms: u64, rng: &mut impl rand::RngCore) -> String {
    format!("{DELIVERY_ID_PREFIX}{}", ulid_at(now_ms, rng))
}

/// Hands out delivery ids that strictly increase for the life of one store, so messages
/// accepted one after another list (and, for ordered endpoints, deliver) in that order
/// even when they share a millisecond: two random ULIDs in one millisecond sort by their
/// random bits, not by when they were made. Within a millisecond (or if the wall clock
/// steps back) the next id is the last one plus a random step, as in the ULID spec's
/// monotonic mode but with a random step instead of one.
/// A store's sequence starts after the newest id it holds, so a restart while the wall
/// clock is behind does not give new messages ids that list before older ones.
#[derive(Debug, Default)]
pub struct IdSeq {
    last: std::sync::Mutex<u128>,
}

impl IdSeq {
    /// A sequence whose ids come after `newest`, the newest id a store holds.
    pub fn after(newest: Option<&str>) -> IdSeq {
        let last = newest
            .and_then(|id| id.strip_prefix(DELIVERY_ID_PREFIX))
            .and_then(|raw| ulid::Ulid::from_string(raw).ok())
            .map_or(0, u128::from);
        IdSeq { last: last.into() }
    }

    /// The time of the newest id given out (or that the sequence started after).
    pub fn newest_ms(&self) -> u64 {
        ulid::Ulid::from(*self.last.lock().unwrap_or_else(|e| e.into_inner())).timestamp_ms()
    }

    /// The next delivery id: `dlv_<ULID>`, greater than every id this sequence gave before.
    pub fn next_delivery_id(&self, now_ms: u64, rng: &mut impl rand::RngCore) -> String {
        let fresh = u128::from(ulid_at(now_ms, rng));
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        // Not the last plus one: a sequence that starts after the newest stored id would
        // give a deleted newer one's id again. A random step keeps the order and makes that
        // as unlikely as a random id's collision (2^40 ids a millisecond still fit).
        let step = 1 + (fresh & 0xFF_FFFF_FFFF);
        let id = if fresh > *last {
            fresh
        } else {
            last.saturating_add(step)
        };
        *last = id;
        prefixed(DELIVERY_ID_PREFIX, ulid::Ulid::from(id))
    }
}

/// The event id made for a message whose app sent none: `msg_` and its delivery id's
/// ULID. The pair needs no index of its own to be found again: the message whose event id
/// is [`own_event_id`] of its delivery id is looked up by that id (see `store::accept`).
pub fn event_id_for(delivery_id: &str) -> String {
    let ulid = delivery_id.strip_prefix(DELIVERY_ID_PREFIX).unwrap_or(delivery_id);
    let mut id = String::with_capacity(EVENT_ID_PREFIX.len() + ulid.len());
    id.push_str(EVENT_ID_PREFIX);
    id.push_str(ulid);
    id
}

/// Whether `event_id` is the one [`event_id_for`] makes for `delivery_id` (made for it,
/// or, by chance, sent so by the app).
pub fn own_event_id(delivery_id: &str, event_id: &str) -> bool {
    match (
        delivery_id.strip_prefix(DELIVERY_ID_PREFIX),
        event_id.strip_prefix(EVENT_ID_PREFIX),
    ) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// The delivery id whose own event id `event_id` would be, if it has that form (the ULID
/// as courier writes it: a lowercase one names no delivery id).
pub fn delivery_id_of_event(event_id: &str) -> Option<String> {
    let text = event_id.strip_prefix(EVENT_ID_PREFIX)?;
    let mut canonical = [0u8; ulid::ULID_LEN];
    let ulid = ulid::Ulid::from_string(text).ok()?;
    (ulid.array_to_str(&mut canonical) == text).then(|| format!("{DELIVERY_ID_PREFIX}{text}"))
}

/// `prefix` and the ULID's text, in one allocation (one or two per accept: no formatter).
fn prefixed(prefix: &str, ulid: ulid::Ulid) -> String {
    let mut text = [0u8; ulid::ULID_LEN];
    let mut id = String::with_capacity(prefix.len() + ulid::ULID_LEN);
    id.push_str(prefix);
    id.push_str(ulid.array_to_str(&mut text));
    id
}

fn ulid_at(now_ms: u64, rng: &mut impl rand::RngCore) -> ulid::Ulid {
    let random = (u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64())) & ((1u128 << 80) - 1);
    ulid::Ulid::from_parts(now_ms, random)
}

/// The acceptance time (unix millis) encoded in a delivery id, if it is one of ours.
pub fn delivery_id_millis(id: &str) -> Option<u64> {
    let raw = id.strip_prefix(DELIVERY_ID_PREFIX)?;
    ulid::Ulid::from_string(raw).ok().map(|u| u.timestamp_ms())
}

/// Where a message is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Waiting for its next attempt (or held by a paused endpoint).
    Pending,
    /// An attempt is being made right now.
    InFlight,
    /// A receiver answered 2xx.
    Delivered,
    /// Given up; kept in the dead-letter store for replay.
    Dead,
    /// Forwarded to another courier by `courier drain`, which answered 202: that courier
    /// delivers it now (see `drain`).
    HandedOff,
}

impl State {
    /// Whether the message is finished here (delivered, dead or handed off): nothing more
    /// happens to it but a replay (dead only) and retention.
    pub fn is_finished(self) -> bool {
        matches!(self, State::Delivered | State::Dead | State::HandedOff)
    }

    /// One byte for the store's indexes and records.
    pub fn to_byte(self) -> u8 {
        match self {
            State::Pending => b'p',
            State::InFlight => b'f',
            State::Delivered => b'd',
            State::Dead => b'x',
            State::HandedOff => b'h',
        }
    }

    /// The inverse of [`State::to_byte`].
    pub fn from_byte(b: u8) -> Option<State> {
        State::ALL.into_iter().find(|s| s.to_byte() == b)
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

names!(State, "state", {
    Pending => "pending",
    InFlight => "in_flight",
    Delivered => "delivered",
    Dead => "dead",
    HandedOff => "handed_off",
});

/// Where an attempt leaves its message: the policy's verdict, as the store records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Try again at this time.
    RetryAt(u64),
    /// Delivered.
    Delivered,
    /// Dead-lettered.
    Dead(DeadReason),
}

/// Why a message was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadReason {
    /// `max_attempts` (or `max_attempts_404`) reached.
    MaxAttempts,
    /// The next attempt would fall after the give-up time.
    Expired,
    /// The receiver answered a permanent status (400, 401, 403, 410, 422).
    PermanentStatus,
    /// The egress policy refused every address of the target.
    EgressDenied,
}

names!(DeadReason, "dead reason", {
    MaxAttempts => "max_attempts",
    Expired => "expired",
    PermanentStatus => "permanent_status",
    EgressDenied => "egress_denied",
});

/// How attempts are signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SignatureScheme {
    /// Standard Webhooks: `webhook-signature: v1,<base64>`.
    #[default]
    Standard,
    /// Stripe: `Stripe-Signature: t=..,v1=<hex>`.
    Stripe,
    /// GitHub: `X-Hub-Signature-256: sha256=<hex>`.
    Github,
    /// No signature header (the `webhook-id`/`webhook-timestamp` headers are still sent).
    None,
}

// Read case-insensitively, around spaces too: it comes from a header as well as the config.
names!(SignatureScheme, "signature scheme", |s| s.trim().to_ascii_lowercase(), {
    Standard => "standard",
    Stripe => "stripe",
    Github => "github",
    None => "none",
});

/// How backoff delays are randomised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Jitter {
    /// `[base/2, base]`.
    #[default]
    Equal,
    /// `[0, base]`.
    Full,
    /// Exactly `base`.
    None,
}

names!(Jitter, "jitter", {
    Equal => "equal",
    Full => "full",
    None => "none",
});

/// Whether an endpoint's (or a route's) messages keep their order (`ordering`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Ordering {
    /// Attempts run in parallel, each message on its own schedule (the default).
    #[default]
    None,
    /// One message at a time, in acceptance order (see `store::lines`).
    Fifo,
}

names!(Ordering, "ordering", {
    None => "none",
    Fifo => "fifo",
});

/// What an ordered endpoint does when the message at the head of its line dies
/// (`on_dead`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OnDead {
    /// The next message goes (the default): a dead letter does not hold the line.
    #[default]
    Skip,
    /// The line stays behind the dead head and the endpoint pauses (with an alert), until
    /// an operator resumes it (the next goes) or replays the head (it is tried again first).
    Block,
}

names!(OnDead, "on_dead", {
    Skip => "skip",
    Block => "block",
});

/// A name that is not one of an enum's spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?} (expected one of: {expected})")]
pub struct UnknownName {
    what: &'static str,
    given: String,
    expected: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn ids_from_one_sequence_increase_within_a_millisecond_and_across_a_clock_step_back() {
        let seq = IdSeq::default();
        let mut rng = rand::rng();
        let mut prev = String::new();
        for now in [5_000, 5_000, 5_000, 5_001, 4_000, 4_000, 6_000] {
            let id = seq.next_delivery_id(now, &mut rng);
            assert!(id > prev, "{id} after {prev}");
            assert!(delivery_id_millis(&id).unwrap() >= 5_000.min(now));
            prev = id;
        }
        assert_eq!(delivery_id_millis(&prev), Some(6_000));
    }

    #[test]
    fn a_sequence_after_a_stored_id_gives_later_ids_even_on_an_earlier_clock() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let stored = new_delivery_id(9_000, &mut rng);
        let seq = IdSeq::after(Some(&stored));
        assert_eq!(seq.newest_ms(), 9_000);
        let next = seq.next_delivery_id(1_000, &mut rng);
        assert!(next > stored, "{next} after {stored}");
        assert_eq!(IdSeq::after(None).newest_ms(), 0);
        assert_eq!(IdSeq::after(Some("not an id")).newest_ms(), 0);
    }

    #[test]
    fn generated_ids_are_prefixed_ulids_carrying_their_time() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let d = new_delivery_id(1_700_000_000_123, &mut rng);
        let id = event_id_for(&d);
        assert!(id.starts_with("msg_"));
        assert_eq!(id.len(), 4 + 26);
        assert!(id[4..].chars().all(|c| "0123456789ABCDEFGHJKMNPQRSTVWXYZ".contains(c)));
        assert_eq!(delivery_id_millis(&d), Some(1_700_000_000_123));
        assert_eq!(delivery_id_millis("nope"), None);
        // The pair finds each other, and nothing else claims to be one.
        assert!(own_event_id(&d, &id));
        assert_eq!(delivery_id_of_event(&id).as_deref(), Some(d.as_str()));
        let other = new_delivery_id(1_700_000_000_123, &mut rng);
        assert!(!own_event_id(&other, &id));
        let lowercase = id.to_ascii_lowercase();
        for not_own in ["msg_", "msg_not-a-ulid", "evt_1", &d, &lowercase] {
            assert_eq!(delivery_id_of_event(not_own), None, "{not_own}");
            assert!(!own_event_id(&d, not_own), "{not_own}");
        }
    }

    #[test]
    fn ids_made_later_sort_later() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let a = new_delivery_id(1000, &mut rng);
        let b = new_delivery_id(1001, &mut rng);
        assert!(a < b);
    }

    #[test]
    fn names_round_trip() {
        for s in State::ALL {
            assert_eq!(s.as_str().parse::<State>().unwrap(), s);
            assert_eq!(State::from_byte(s.to_byte()), Some(s));
        }
        for r in DeadReason::ALL {
            assert_eq!(r.as_str().parse::<DeadReason>().unwrap(), r);
        }
        for sc in [
            SignatureScheme::Standard,
            SignatureScheme::Stripe,
            SignatureScheme::Github,
            SignatureScheme::None,
        ] {
            assert_eq!(sc.as_str().parse::<SignatureScheme>().unwrap(), sc);
        }
        assert!("hmac".parse::<SignatureScheme>().is_err());
        assert_eq!("full".parse::<Jitter>().unwrap(), Jitter::Full);
        for j in [Jitter::Equal, Jitter::Full, Jitter::None] {
            assert_eq!(j.as_str().parse::<Jitter>().unwrap(), j);
        }
        assert!("half".parse::<Jitter>().is_err());
    }
}
