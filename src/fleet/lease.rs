//! Fleet-wide semaphores: the leases of attempts in flight, in Redis, and the [`Lease`]
//! guard an attempt holds.
//!
//! One sorted set per host (and one per endpoint with a `max_in_flight` cap) holds a member
//! per attempt in flight anywhere in the fleet, scored by the time (Redis's clock) at which
//! it expires. Acquiring first drops the expired members, so a courier that died (SIGKILL,
//! a lost node) frees its slots within `fleet.lease_ttl` without anyone cleaning up after
//! it; a running attempt's lease is renewed every third of the TTL (see `schedule`), and
//! released when the receiver has answered (queued at once, removed by the next release
//! call: until then Redis counts it, so a queued release can only hold a slot a moment
//! longer, never free one early). The set itself expires with its last lease.
//!
//! Each operation is one Lua script, so it is atomic (`EVALSHA`; the scripts are loaded when
//! courier connects), and each call serves many leases:
//! - acquire: the leases a scheduler pass wants, in order, each one host cap, endpoint cap,
//!   then the endpoint's GCRA rate (`GCRA_LUA`), all or nothing, and counted before the next
//!   is checked; a refusal by a cap leaves a short-lived *wait marker* and says when the
//!   first lease in the way expires, a refusal by the rate when its next slot is;
//! - renew: every due lease of this courier in one call;
//! - release: the leases released since the last call (group commit, see `Inner::release`),
//!   and, only if someone was refused meanwhile (a wait marker exists), one PUBLISH on the
//!   fleet's channel, which wakes the couriers with messages waiting (see `tasks`).
//!   Uncontended hosts cost no publish at all.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use redis::Script;

use super::Inner;

/// What one attempt asks of the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRequest<'a> {
    /// `host:port`.
    pub host: &'a str,
    /// The endpoint key.
    pub endpoint: &'a str,
    /// The host's in-flight cap (`max_in_flight_per_host` or its `[[host]]`).
    pub host_cap: u32,
    /// The endpoint's `max_in_flight`, when it has one.
    pub endpoint_cap: Option<u32>,
    /// The endpoint's attempts per second (0: no limit).
    pub rate: u32,
}

/// The fleet-wide rate limit of one endpoint: GCRA (the generic cell rate algorithm, as in
/// redis-cell and Envoy's rate limit service) in Lua, run inside the acquire script.
///
/// One key per endpoint holds its theoretical arrival time (TAT), in microseconds of
/// Redis's own clock (`TIME`), so couriers whose clocks disagree still share one timeline.
/// Each granted attempt moves the TAT one emission interval (`1 s / rate`) on; an attempt is
/// refused while the TAT is more than one second ahead of now, which gives the same burst
/// as the local token bucket (`policy::rate`: one second's worth) and the same long-run
/// rate. A refusal says exactly how long until the next slot, so the waiting message sleeps
/// on a timer until then; nothing polls. The key expires when the TAT is in the past, so an
/// idle endpoint leaves nothing in Redis.
///
/// `gcra(tat, rate, now_us)`: `0` and the TAT moved on (a slot granted), or the
/// microseconds until a slot is free and the TAT unchanged. Pure: the acquire script reads
/// each TAT once per call, keeps it through the call's grants, and writes it once.
const GCRA_LUA: &str = r#"
local function gcra(tat, rate, now_us)
  if tat < now_us then tat = now_us end
  local new_tat = tat + 1000000 / rate
  -- A burst of one second's worth: refused while the TAT runs more than 1 s ahead.
  local allow_at = new_tat - 1000000
  if allow_at > now_us then return allow_at - now_us, tat end
  return 0, new_tat
end
"#;

/// The acquire script: the leases of a whole scheduler pass in one call. KEYS: each host's
/// set and wait marker, and each endpoint's set, wait marker and rate (TAT), every key once.
/// ARGV: ttl ms, then six per request, in the pass's order: its member, the index in KEYS
/// of its host's set (the marker follows it), of its endpoint's set (marker and rate
/// follow), the host cap, the endpoint cap (0: none) and the rate (0: none). Returns
/// `code, ms` per request: `0, 0` granted, `1, ms` host busy, `2, ms` endpoint busy, `3, ms`
/// rate limited, `ms` being when to look again.
///
/// Requests are decided one after the other, each as the single-request script decided it
/// (host cap, endpoint cap, rate, all or nothing), and a grant is counted before the next
/// request is checked: `held` keeps each set's count (read once per call, then raised by
/// each grant) and `tat` each rate's time, so five requests for a host with three free
/// slots get three grants and two refusals. The counts are written once at the end (the
/// sets' lease members as granted; each TAT and each set's expiry once).
static ACQUIRE_MANY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{GCRA_LUA}{}",
        r#"
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local ttl = tonumber(ARGV[1])
local held, first, granted, sets, tat, moved, rates = {}, {}, {}, {}, {}, {}, {}
-- nil when `set` has room for one more lease under `cap`; else how long until its first
-- lease expires (ms), leaving a wait marker so that a release publishes.
local function full(set, cap, marker)
  if not held[set] then
    redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
    held[set] = redis.call('ZCARD', set)
  end
  if held[set] < cap then return nil end
  if not first[set] then
    redis.call('SET', marker, '1', 'PX', ttl)
    local lease = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
    first[set] = lease[2] and math.max(1, tonumber(lease[2]) - now) or ttl
  end
  return first[set]
end
local function take(set, member)
  if not granted[set] then
    granted[set] = {}
    sets[#sets + 1] = set
  end
  local g = granted[set]
  g[#g + 1] = member
  held[set] = held[set] + 1
end
local out = {}
for a = 2, #ARGV, 6 do
  local member, h, e = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local host_cap, ep_cap, rate = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  local code, wait = 0, full(KEYS[h], host_cap, KEYS[h + 1])
  if wait then
    code = 1
  elseif ep_cap > 0 then
    wait = full(KEYS[e], ep_cap, KEYS[e + 1])
    if wait then code = 2 end
  end
  if code == 0 and rate > 0 then
    local key = KEYS[e + 2]
    if not tat[key] then
      tat[key] = tonumber(redis.call('GET', key)) or now_us
      rates[#rates + 1] = key
    end
    local next_tat
    wait, next_tat = gcra(tat[key], rate, now_us)
    if wait > 0 then
      code, wait = 3, math.ceil(wait / 1000)
    else
      tat[key] = next_tat
      moved[key] = true
    end
  end
  if code == 0 then
    take(KEYS[h], member)
    if ep_cap > 0 then take(KEYS[e], member) end
    wait = 0
  end
  out[#out + 1] = code
  out[#out + 1] = wait
end
for _, set in ipairs(sets) do
  local args = {}
  for i, member in ipairs(granted[set]) do
    args[2 * i - 1] = now + ttl
    args[2 * i] = member
  end
  redis.call('ZADD', set, unpack(args))
  redis.call('PEXPIRE', set, ttl)
end
for _, key in ipairs(rates) do
  if moved[key] then
    -- Numbers past 14 digits must be formatted by hand (Lua's default loses precision).
    redis.call('SET', key, string.format('%.0f', tat[key]), 'PX', math.ceil((tat[key] - now_us) / 1000) + 1)
  end
end
return out
"#
    ))
});

/// The renew script. KEYS: sets; ARGV[1]: ttl ms; ARGV[1 + i]: the member in KEYS[i],
/// prefixed `=` (renew only if still there: it may have been released meanwhile) or `+`
/// (write it back even if missing: Redis lost it, and the attempt still runs). Returns the
/// indexes of the members that were missing.
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local missing = {}
for i, set in ipairs(KEYS) do
  local arg = ARGV[i + 1]
  local member = string.sub(arg, 2)
  local present = redis.call('ZSCORE', set, member)
  if not present then missing[#missing + 1] = i end
  if present or string.sub(arg, 1, 1) == '+' then
    redis.call('ZADD', set, now + ttl, member)
    redis.call('PEXPIRE', set, ttl)
  end
end
return missing
"#,
    )
});

/// The release script: every release queued since the last call (see `Inner::release`).
/// KEYS: the wait markers of the leases' hosts and endpoints, then the sets. ARGV: the
/// channel, the number of markers, then for each set in KEYS' order the number of its
/// members to remove and those members. Publishes once, and only if one of the markers
/// exists (someone was refused meanwhile).
static RELEASE_MANY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local markers = tonumber(ARGV[2])
local a = 3
for k = markers + 1, #KEYS do
  local n = tonumber(ARGV[a])
  redis.call('ZREM', KEYS[k], unpack(ARGV, a + 1, a + n))
  a = a + n + 1
end
if markers > 0 and redis.call('EXISTS', unpack(KEYS, 1, markers)) > 0 then
  redis.call('DEL', unpack(KEYS, 1, markers))
  redis.call('PUBLISH', ARGV[1], 'released')
end
return 1
"#,
    )
});

/// The three scripts, for loading at connect.
pub(super) fn scripts() -> [&'static Script; 3] {
    [&ACQUIRE_MANY, &RENEW, &RELEASE_MANY]
}

/// The Redis keys of one fleet: its `key_prefix`.
#[derive(Debug, Clone)]
pub(super) struct Keys(pub(super) String);

/// The keys a lease lives under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LeaseKeys {
    pub(super) host: String,
    pub(super) host_wait: String,
    pub(super) endpoint: String,
    pub(super) endpoint_wait: String,
    /// Whether the lease holds an endpoint slot (the endpoint has a cap).
    pub(super) capped: bool,
}

impl LeaseKeys {
    /// The sets this lease is a member of.
    pub(super) fn sets(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.host.as_str()).chain(self.capped.then_some(self.endpoint.as_str()))
    }
}

impl Keys {
    /// The channel releases are published on.
    pub(super) fn channel(&self) -> String {
        format!("{}:released", self.0)
    }

    pub(super) fn lease(&self, req: &LeaseRequest<'_>) -> LeaseKeys {
        let p = &self.0;
        let host = key_id(req.host);
        let endpoint = key_id(req.endpoint);
        LeaseKeys {
            host: format!("{p}:host:{host}"),
            host_wait: format!("{p}:host-wait:{host}"),
            endpoint: format!("{p}:endpoint:{endpoint}"),
            endpoint_wait: format!("{p}:endpoint-wait:{endpoint}"),
            capped: req.endpoint_cap.is_some(),
        }
    }

    pub(super) fn rate(&self, endpoint: &str) -> String {
        format!("{}:rate:{}", self.0, key_id(endpoint))
    }
}

/// How a host or an endpoint key is named in Redis: the hex of the first 16 bytes of its
/// SHA-256, never the key itself. An endpoint key is often a URL, and chat-style webhook
/// URLs carry their credential in the path; key names show in `MONITOR`, `SLOWLOG`,
/// `KEYS` and every tool reading them. The host is hashed too, so all keys look alike.
/// 128 bits: a collision (two hosts sharing a cap) is not a practical concern.
pub(super) fn key_id(key: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(&Sha256::digest(key.as_bytes())[..16])
}

/// Each distinct key of a call once, in first-use order: a pass asks for many leases of the
/// same host, and Redis then reads each key once (and courier hashes each name once).
#[derive(Default)]
struct KeyList {
    keys: Vec<String>,
    index: HashMap<String, usize>,
}

impl KeyList {
    /// The 1-based index (Lua's) of `first`, added with `rest()` after it when new.
    fn add(&mut self, first: &str, rest: impl FnOnce() -> Vec<String>) -> usize {
        if let Some(&i) = self.index.get(first) {
            return i;
        }
        let i = self.keys.len() + 1;
        self.keys.push(first.to_string());
        self.keys.extend(rest());
        self.index.insert(first.to_string(), i);
        i
    }
}

/// The acquire call for `reqs`, each with its lease's keys and member, in order.
pub(super) fn acquire_call<'a>(
    keys: &Keys,
    reqs: impl IntoIterator<Item = (&'a LeaseRequest<'a>, &'a LeaseKeys, &'a str)>,
    ttl_ms: u64,
) -> redis::ScriptInvocation<'static> {
    let mut list = KeyList::default();
    let mut call = ACQUIRE_MANY.prepare_invoke();
    call.arg(ttl_ms);
    for (req, lease, member) in reqs {
        let host = list.add(&lease.host, || vec![lease.host_wait.clone()]);
        let endpoint = list.add(&lease.endpoint, || {
            vec![lease.endpoint_wait.clone(), keys.rate(req.endpoint)]
        });
        call.arg(member)
            .arg(host)
            .arg(endpoint)
            .arg(req.host_cap)
            .arg(req.endpoint_cap.unwrap_or(0))
            .arg(req.rate);
    }
    for key in list.keys {
        call.key(key);
    }
    call
}

/// The renew call for `(sets, member, restore)` of each lease.
pub(super) fn renew_call<'a>(
    leases: impl IntoIterator<Item = (&'a LeaseKeys, &'a str, bool)>,
    ttl_ms: u64,
) -> redis::ScriptInvocation<'static> {
    let mut call = RENEW.prepare_invoke();
    call.arg(ttl_ms);
    for (keys, member, restore) in leases {
        for set in keys.sets() {
            call.key(set)
                .arg(format!("{}{member}", if restore { '+' } else { '=' }));
        }
    }
    call
}

/// The release call for `(keys, member)` of each lease.
pub(super) fn release_call<'a>(
    keys: &Keys,
    leases: impl IntoIterator<Item = (&'a LeaseKeys, &'a str)>,
) -> redis::ScriptInvocation<'static> {
    let mut markers = KeyList::default();
    let mut sets: Vec<(&str, Vec<&str>)> = Vec::new();
    let mut set_index: HashMap<&str, usize> = HashMap::new();
    for (lease, member) in leases {
        markers.add(&lease.host_wait, Vec::new);
        markers.add(&lease.endpoint_wait, Vec::new);
        for set in lease.sets() {
            let i = *set_index.entry(set).or_insert_with(|| {
                sets.push((set, Vec::new()));
                sets.len() - 1
            });
            sets[i].1.push(member);
        }
    }
    let mut call = RELEASE_MANY.prepare_invoke();
    call.arg(keys.channel()).arg(markers.keys.len());
    for marker in markers.keys {
        call.key(marker);
    }
    for (set, members) in &sets {
        call.key(*set).arg(members.len());
        for member in members {
            call.arg(*member);
        }
    }
    call
}

/// One lease this courier holds, as its registry keeps it.
#[derive(Debug, Clone)]
pub(super) struct LeaseEntry {
    pub(super) keys: LeaseKeys,
    /// When it was granted or last renewed (the fleet's monotonic ms, see `Inner::now_ms`).
    pub(super) renewed_at_ms: u64,
    /// Whether Redis has it: granted by Redis, or written back since. A lease taken while
    /// Redis was unavailable is not, until the first renewal after Redis is back.
    pub(super) registered: bool,
}

/// The fleet's part of one attempt's permit: while it lives, the attempt counts against
/// the host's (and endpoint's) fleet-wide cap. Dropped when the receiver has answered (with
/// the local host permit), its release is queued for the next release call (see
/// `Inner::release`), and it is renewed no more; a courier that dies leaves it to expire.
pub struct Lease {
    pub(super) inner: Arc<Inner>,
    pub(super) id: u64,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease").field("id", &self.id).finish()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.inner.release(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_key_names_never_hold_the_host_or_the_endpoint() {
        let url = "https://chat.example/hooks/T000/B000/s3cr3tt0ken";
        let req = LeaseRequest {
            host: "chat.example:443",
            endpoint: url,
            host_cap: 4,
            endpoint_cap: Some(2),
            rate: 5,
        };
        let keys = Keys("fleet".into());
        let lease = keys.lease(&req);
        let rate = keys.rate(url);
        let names = [
            &lease.host,
            &lease.host_wait,
            &lease.endpoint,
            &lease.endpoint_wait,
            &rate,
        ];
        for name in names {
            assert!(!name.contains("s3cr3t") && !name.contains("chat.example"), "{name}");
        }
        // sha256("chat.example:443"), first 16 bytes: stable across couriers and versions.
        assert_eq!(lease.host, format!("fleet:host:{}", key_id("chat.example:443")));
        assert_eq!(key_id("chat.example:443").len(), 32);
        assert_eq!(
            key_id("abc"),
            "ba7816bf8f01cfea414140de5dae2223",
            "the SHA-256 of \"abc\", truncated"
        );
        assert_eq!(lease.endpoint_wait, format!("fleet:endpoint-wait:{}", key_id(url)));
        assert_eq!(rate, format!("fleet:rate:{}", key_id(url)));
        // Different endpoints, different keys.
        assert_ne!(key_id(url), key_id("https://chat.example/hooks/T000/B000/other"));
    }
}
