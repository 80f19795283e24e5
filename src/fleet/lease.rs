//! Fleet-wide semaphores: the leases of attempts in flight, in Redis, and the [`Lease`]
//! guard an attempt holds.
//!
//! One sorted set per host (and one per endpoint with a `max_in_flight` cap) holds a member
//! per attempt in flight anywhere in the fleet, scored by the time (Redis's clock) at which
//! it expires. Acquiring first drops the expired members, so a courier that died (SIGKILL,
//! a lost node) frees its slots within `fleet.lease_ttl` without anyone cleaning up after
//! it; a running attempt's lease is renewed every third of the TTL (see `schedule`), and
//! released when the receiver has answered. The set itself expires with its last lease.
//!
//! Each operation is one Lua script, so it is atomic and one round trip (`EVALSHA`; the
//! scripts are loaded when courier connects):
//! - acquire: host cap, endpoint cap, then the endpoint's GCRA rate (`GCRA_LUA`), all or
//!   nothing; a refusal by a cap leaves a short-lived *wait marker* and says when the first
//!   lease in the way expires, a refusal by the rate when its next slot is;
//! - renew: every due lease of this courier in one call;
//! - release: removes the lease and, only if someone was refused meanwhile (a wait marker
//!   exists), PUBLISHes on the fleet's channel, which wakes the couriers with messages
//!   waiting (see `tasks`). Uncontended hosts cost no publish at all.

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
/// `gcra(key, rate, now_us)`: grants a slot (returns 0 and moves the TAT on) or returns
/// the microseconds until one is free. Defined in front of the acquire script's body.
const GCRA_LUA: &str = r#"
local function gcra(key, rate, now_us)
  local interval = 1000000 / rate
  local tat = tonumber(redis.call('GET', key)) or now_us
  if tat < now_us then tat = now_us end
  local new_tat = tat + interval
  -- A burst of one second's worth: refused while the TAT runs more than 1 s ahead.
  local allow_at = new_tat - 1000000
  if allow_at > now_us then return allow_at - now_us end
  -- Numbers past 14 digits must be formatted by hand (Lua's default loses precision).
  local ttl_ms = math.ceil((new_tat - now_us) / 1000) + 1
  redis.call('SET', key, string.format('%.0f', new_tat), 'PX', ttl_ms)
  return 0
end
"#;

/// The acquire script. KEYS: host set, host wait marker, endpoint set, endpoint wait
/// marker, endpoint rate (TAT). ARGV: member, ttl ms, host cap, endpoint cap (0: none),
/// rate (0: none). Returns `{0, 0}` granted, `{1, ms}` host busy, `{2, ms}` endpoint busy,
/// `{3, ms}` rate limited; `ms` is when to look again.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{GCRA_LUA}{}",
        r#"
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local member, ttl = ARGV[1], tonumber(ARGV[2])
local host_cap, ep_cap, rate = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
-- nil when the set has room; else how long until its first lease expires (ms).
local function full(set, cap, marker)
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
  if redis.call('ZCARD', set) < cap then return nil end
  redis.call('SET', marker, '1', 'PX', ttl)
  local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  return math.max(1, tonumber(first[2]) - now)
end
local wait = full(KEYS[1], host_cap, KEYS[2])
if wait then return {1, wait} end
if ep_cap > 0 then
  wait = full(KEYS[3], ep_cap, KEYS[4])
  if wait then return {2, wait} end
end
if rate > 0 then
  wait = gcra(KEYS[5], rate, now_us)
  if wait > 0 then return {3, math.ceil(wait / 1000)} end
end
redis.call('ZADD', KEYS[1], now + ttl, member)
redis.call('PEXPIRE', KEYS[1], ttl)
if ep_cap > 0 then
  redis.call('ZADD', KEYS[3], now + ttl, member)
  redis.call('PEXPIRE', KEYS[3], ttl)
end
return {0, 0}
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

/// The release script. KEYS: host set, host wait marker, endpoint set, endpoint wait
/// marker. ARGV: member, channel, `1` when the lease holds an endpoint slot too.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[3] == '1' then redis.call('ZREM', KEYS[3], ARGV[1]) end
if redis.call('EXISTS', KEYS[2], KEYS[4]) > 0 then
  redis.call('DEL', KEYS[2], KEYS[4])
  redis.call('PUBLISH', ARGV[2], KEYS[1])
end
return 1
"#,
    )
});

/// The three scripts, for loading at connect.
pub(super) fn scripts() -> [&'static Script; 3] {
    [&ACQUIRE, &RENEW, &RELEASE]
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

    /// A call of `script` with the lease's four keys first, in the scripts' order.
    fn invoke(&self, script: &'static Script) -> redis::ScriptInvocation<'static> {
        let mut call = script.prepare_invoke();
        call.key(&self.host)
            .key(&self.host_wait)
            .key(&self.endpoint)
            .key(&self.endpoint_wait);
        call
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

/// The acquire call for `req`, as `member` of the sets.
pub(super) fn acquire_call(
    keys: &Keys,
    lease: &LeaseKeys,
    req: &LeaseRequest<'_>,
    member: &str,
    ttl_ms: u64,
) -> redis::ScriptInvocation<'static> {
    let mut call = lease.invoke(&ACQUIRE);
    call.key(keys.rate(req.endpoint))
        .arg(member)
        .arg(ttl_ms)
        .arg(req.host_cap)
        .arg(req.endpoint_cap.unwrap_or(0))
        .arg(req.rate);
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

/// The release call of a lease.
pub(super) fn release_call(keys: &Keys, lease: &LeaseKeys, member: &str) -> redis::ScriptInvocation<'static> {
    let mut call = lease.invoke(&RELEASE);
    call.arg(member)
        .arg(keys.channel())
        .arg(if lease.capped { "1" } else { "0" });
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
/// the local host permit), it is released in Redis at once; a courier that dies leaves it
/// to expire.
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
