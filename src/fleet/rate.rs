//! The fleet-wide rate limit of one endpoint: GCRA (the generic cell rate algorithm, as in
//! redis-cell and Envoy's rate limit service) in Lua, run inside the acquire script.
//!
//! One key per endpoint holds its theoretical arrival time (TAT), in microseconds of
//! Redis's own clock (`TIME`), so couriers whose clocks disagree still share one timeline.
//! Each granted attempt moves the TAT one emission interval (`1 s / rate`) on; an attempt is
//! refused while the TAT is more than one second ahead of now, which gives the same burst
//! as the local token bucket (`policy::rate`: one second's worth) and the same long-run
//! rate. A refusal says exactly how long until the next slot, so the waiting message sleeps
//! on a timer until then; nothing polls. The key expires when the TAT is in the past, so an
//! idle endpoint leaves nothing in Redis.

/// `gcra(key, rate, now_us)`: grants a slot (returns 0 and moves the TAT on) or returns
/// the microseconds until one is free. Defined in front of the acquire script's body.
pub(super) const GCRA_LUA: &str = r#"
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
