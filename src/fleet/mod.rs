//! Fleet-wide limits on Redis (`[fleet]`): the per-host in-flight cap, the per-endpoint
//! `max_in_flight` cap and the per-endpoint rate limit, enforced across every courier that
//! shares the Redis (and the `key_prefix`), so fifty replicas of an app send a receiver
//! what one courier would, not fifty times that.
//!
//! How it fits delivery: the scheduler admits an attempt with its local permits first (the
//! global `max_in_flight`, the endpoint's cap, the host's cap and breaker, the local rate),
//! then asks the fleet ([`Fleet::acquire`]): one Lua script, one round trip, grants a
//! [`Lease`] or says how long to wait (see `lease`). A refused message stays
//! pending exactly as one refused by a local cap: it is skipped for the pass and the
//! scheduler sleeps until the earliest of its timers, which here is when the first lease in
//! the way expires, or the rate's next slot. It is woken earlier when a lease is released:
//! the release script PUBLISHes (only when someone was refused meanwhile) and every
//! courier's subscriber wakes its scheduler if it has such messages (see `tasks`). Nothing
//! polls.
//!
//! When Redis is unavailable (refused, reset, a call over `fleet.timeout`), delivery goes
//! on: each courier keeps to its local limits divided by `fleet.expected_replicas` (see
//! [`share`]), one log line says so, `courier_fleet_redis_up` reads 0, and a prober
//! reconnects on a backoff timer (see `health`). When it is back, the leases of the attempts
//! running meanwhile are written to Redis first, then fleet limits resume, with one log line.
//! Ingress never talks to Redis: an outage never refuses an accept.
//!
//! Calls: [`Fleet::acquire`] blocks (the scheduler's pass runs on a blocking thread and
//! waits for the reply there); everything else runs on delivery's runtime.

mod health;
mod lease;
mod schedule;
mod tasks;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::sync::{watch, Notify};

use crate::config::FleetConfig;
use crate::metrics::{FleetOutcome as Outcome, Metrics};

pub use lease::{Lease, LeaseRequest};

use health::{Change, Health};
use lease::{Keys, LeaseEntry};

/// Leases held before new ones are refused locally: one per attempt in flight, which
/// `delivery.max_in_flight` bounds far below this; a safety bound only.
const MAX_LEASES: usize = 1 << 20;

/// What [`Fleet::acquire`] decided.
#[derive(Debug)]
pub enum Acquired {
    /// Granted: the attempt may start, holding the lease.
    Granted(Lease),
    /// The host is at its fleet-wide cap; look again in `retry_ms` at the latest (a release
    /// may wake the scheduler sooner).
    HostBusy {
        /// Until the first lease in the way expires.
        retry_ms: u64,
    },
    /// The endpoint is at its fleet-wide `max_in_flight` cap.
    EndpointBusy {
        /// Until the first lease in the way expires.
        retry_ms: u64,
    },
    /// The endpoint's fleet-wide rate says wait.
    RateLimited {
        /// Until its next slot.
        retry_ms: u64,
    },
    /// Redis is unavailable: the caller applies the fallback limits (its local limits
    /// divided by `replicas`). The lease is local only, and written to Redis once it is back.
    Fallback {
        /// `fleet.expected_replicas`.
        replicas: u32,
        /// Keeps account of the attempt.
        lease: Lease,
    },
}

/// Why the fleet could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The URL or the password cannot make a Redis client.
    #[error("fleet.redis_url: {0}")]
    Client(String),
    /// The password file cannot be read.
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
}

/// What [`Fleet::start`] needs besides the config.
pub struct FleetParts {
    /// Delivery's runtime: the fleet's tasks and connections run there.
    pub runtime: tokio::runtime::Handle,
    /// The scheduler's wake-up, rung when a lease is released somewhere in the fleet while
    /// messages here wait for one.
    pub wake: Arc<Notify>,
    /// The PEM text of `[tls] ca_file` (the files joined), if set: a `rediss://` connection
    /// then trusts these CAs (a Redis behind a private CA) instead of the public roots.
    pub ca_pem: Option<Vec<u8>>,
    /// The process's metrics: the fleet counts its acquires and restored leases there.
    pub metrics: Arc<Metrics>,
}

/// The fleet-wide limiter (see the module doc).
#[derive(Clone)]
pub struct Fleet {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("up", &self.is_up())
            .finish_non_exhaustive()
    }
}

/// Shared by the fleet's handle, its leases and its tasks.
pub(crate) struct Inner {
    /// The URL's connection settings; the password is set at each connection (see `tasks`).
    info: redis::ConnectionInfo,
    /// Delivery's runtime, the scheduler's wake-up, the CAs and the metrics.
    parts: FleetParts,
    /// Where the password comes from (`password_override`): `password_file` is read again
    /// at each connection, so a rotated secret is used from the next reconnect.
    config: FleetConfig,
    /// The client of the last connection that was set up (the subscriber uses it too).
    client: Mutex<redis::Client>,
    /// Redis's health and the connection in use: one lock, so that the two and `up_tx`
    /// (all three written under it) never disagree, as they could when a late failure of
    /// an old connection and a recovery interleaved.
    link: Mutex<Link>,
    /// `link.health.is_up()`, readable without that lock on the hot path, and for the
    /// tasks to wait on.
    up_tx: watch::Sender<bool>,
    leases: Mutex<HashMap<u64, LeaseEntry>>,
    next_lease: AtomicU64,
    /// Rung when the renewer has something new to look at.
    lease_added: Notify,
    /// Whether the renewer's last plan found nothing to renew, so it sleeps with no timer
    /// until `lease_added` rings (written and read under the registry's lock).
    renewer_idle: AtomicBool,
    /// Set when an acquire is sent (it may be refused by a cap): a release then wakes the
    /// scheduler.
    waiting: AtomicBool,
    /// Origin of the fleet's own times (lease ages, probe delays), in ms since it: the
    /// monotonic clock, not courier's wall clock, so that a wall clock stepped back cannot
    /// hold renewals past the lease TTL (or a probe past its delay), nor one stepped
    /// forward make every lease due at once. Redis's clock decides expiry; these times
    /// only say when to act.
    epoch: tokio::time::Instant,
    keys: Keys,
    /// Names this courier's leases (`<courier>:<n>`), random per process.
    courier: String,
    ttl_ms: u64,
}

/// Redis's health and the connection of its current generation.
struct Link {
    health: Health,
    /// The connection while Redis is up (multiplexed: every call shares it).
    conn: Option<MultiplexedConnection>,
}

impl Fleet {
    /// Builds the fleet from `[fleet]` and starts its tasks (connect, renew, subscribe);
    /// `None` when `redis_url` is unset. Returns at once: the first connection is made in
    /// the background, and until it works the fallback limits apply.
    pub fn start(cfg: &FleetConfig, parts: FleetParts) -> Result<Option<Fleet>, FleetError> {
        let Some(url) = &cfg.redis_url else {
            return Ok(None);
        };
        let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
            .map_err(|e| FleetError::Client(crate::redact::clean(&e.to_string())))?;
        // Checked now (an unreadable password file is a config error at start); read again
        // at each connection.
        let client = client_with(&info, cfg.password_override()?, parts.ca_pem.as_deref())?;
        let (up_tx, _) = watch::channel(false);
        let inner = Arc::new(Inner {
            info,
            config: cfg.clone(),
            client: Mutex::new(client),
            link: Mutex::new(Link {
                health: Health::default(),
                conn: None,
            }),
            up_tx,
            leases: Mutex::new(HashMap::new()),
            next_lease: AtomicU64::new(0),
            lease_added: Notify::new(),
            renewer_idle: AtomicBool::new(true),
            waiting: AtomicBool::new(false),
            epoch: tokio::time::Instant::now(),
            keys: Keys(cfg.key_prefix.clone()),
            courier: format!("{:016x}", rand::Rng::random::<u64>(&mut crate::clock::rng())),
            ttl_ms: cfg.lease_ttl.as_millis() as u64,
            parts,
        });
        tasks::spawn(&inner);
        Ok(Some(Fleet { inner }))
    }

    /// Whether fleet-wide limits are in force (Redis usable).
    pub fn is_up(&self) -> bool {
        self.inner.is_up()
    }

    /// `fleet.expected_replicas`: the divisor of the local limits while Redis is down.
    pub fn replicas(&self) -> u32 {
        self.inner.config.expected_replicas
    }

    /// Asks Redis for a lease (and a rate slot) for one attempt: one script, one round
    /// trip, at most `fleet.timeout`. Blocks: call it from a blocking thread (the
    /// scheduler's pass), never from an async task.
    pub fn acquire(&self, req: &LeaseRequest<'_>) -> Acquired {
        let inner = &self.inner;
        let Some((generation, conn)) = inner.connection() else {
            return inner.fallback(req, Outcome::Fallback);
        };
        let id = inner.next_lease.fetch_add(1, Ordering::Relaxed);
        let keys = inner.keys.lease(req);
        let member = inner.member(id);
        let call = lease::acquire_call(&inner.keys, &keys, req, &member, inner.ttl_ms);
        // Set before the call, not after a refusal: the release that frees the slot may be
        // published (and reach the subscriber) before the refused reply reaches us, and a
        // flag set after it would miss that wake-up (leaving the message to its timer, up
        // to a whole `lease_ttl`). A grant leaves the flag set: at worst the next release
        // costs the scheduler one pass for nothing.
        inner.waiting.store(true, Ordering::Release);
        match inner
            .parts
            .runtime
            .block_on(inner.call::<(i64, i64)>(Some(generation), conn, call, ""))
        {
            Some((code, wait)) => {
                let retry_ms = u64::try_from(wait).unwrap_or(1).max(1);
                let (outcome, acquired) = match code {
                    0 => (Outcome::Granted, Acquired::Granted(inner.hold(id, keys, true))),
                    1 => (Outcome::HostBusy, Acquired::HostBusy { retry_ms }),
                    2 => (Outcome::EndpointBusy, Acquired::EndpointBusy { retry_ms }),
                    _ => (Outcome::RateLimited, Acquired::RateLimited { retry_ms }),
                };
                inner.parts.metrics.fleet_acquired(outcome);
                acquired
            }
            // A timed-out call may still have granted a lease in Redis: never renewed, it
            // expires within the TTL.
            None => inner.fallback(req, Outcome::Error),
        }
    }
}

/// The limits each courier keeps to while Redis is unavailable: its local limit divided by
/// `fleet.expected_replicas`, rounded up and at least 1, so the fleet together stays near
/// the limit (a little over it when the division is not exact, never at zero).
///
/// This courier's share of `limit` among `replicas` couriers. A `limit` of 0 means "no
/// limit" (a rate of 0) and stays 0.
pub fn share(limit: u32, replicas: u32) -> u32 {
    if limit == 0 {
        return 0;
    }
    limit.div_ceil(replicas.max(1)).max(1)
}

/// A client for `info` with `password` over the URL's own; a `rediss://` one trusts
/// `ca_pem` when given.
fn client_with(
    info: &redis::ConnectionInfo,
    password: Option<crate::signing::Secret>,
    ca_pem: Option<&[u8]>,
) -> Result<redis::Client, FleetError> {
    let mut info = info.clone();
    if let Some(password) = password {
        let settings = info.redis_settings().clone().set_password(password.expose());
        info = info.set_redis_settings(settings);
    }
    let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
    let client = match ca_pem {
        Some(pem) if tls => redis::Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.to_vec()),
            },
        ),
        _ => redis::Client::open(info),
    };
    client.map_err(|e| FleetError::Client(crate::redact::clean(&e.to_string())))
}

impl Inner {
    fn is_up(&self) -> bool {
        *self.up_tx.borrow()
    }

    /// Monotonic ms since `epoch`.
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Completes once [`Inner::now_ms`] reaches `at_ms`.
    async fn sleep_until(&self, at_ms: u64) {
        tokio::time::sleep_until(self.epoch + Duration::from_millis(at_ms)).await;
    }

    fn lock_link(&self) -> std::sync::MutexGuard<'_, Link> {
        self.link.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection in use and its generation, while Redis is up.
    fn connection(&self) -> Option<(u64, MultiplexedConnection)> {
        let link = self.lock_link();
        let conn = link.conn.clone()?;
        link.health.is_up().then(|| (link.health.generation(), conn))
    }

    fn lock_leases(&self) -> std::sync::MutexGuard<'_, HashMap<u64, LeaseEntry>> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn member(&self, id: u64) -> String {
        format!("{}:{id}", self.courier)
    }

    /// A lease decided without Redis (it is unavailable: `outcome` says how it was found).
    fn fallback(self: &Arc<Self>, req: &LeaseRequest<'_>, outcome: Outcome) -> Acquired {
        self.parts.metrics.fleet_acquired(outcome);
        let id = self.next_lease.fetch_add(1, Ordering::Relaxed);
        Acquired::Fallback {
            replicas: self.config.expected_replicas,
            lease: self.hold(id, self.keys.lease(req), false),
        }
    }

    /// Registers a lease this courier now holds (for renewal and release).
    fn hold(self: &Arc<Self>, id: u64, keys: lease::LeaseKeys, registered: bool) -> Lease {
        let mut leases = self.lock_leases();
        // Read under the lock the renewer plans under: a renewer without a timer never
        // misses this lease (a `Notify` keeps the ring if it is not waiting yet).
        let idle = self.renewer_idle.load(Ordering::Acquire);
        if leases.len() < MAX_LEASES {
            leases.insert(
                id,
                LeaseEntry {
                    keys,
                    renewed_at_ms: self.now_ms(),
                    registered,
                },
            );
        }
        drop(leases);
        // The renewer sleeps with no timer while there is nothing to renew; a lease Redis
        // does not have yet is written at once when Redis is up.
        if idle || (!registered && self.is_up()) {
            self.lease_added.notify_one();
        }
        Lease {
            inner: self.clone(),
            id,
        }
    }

    /// Ends a lease: out of the registry, and out of Redis if Redis has it.
    fn release(self: &Arc<Self>, id: u64) {
        let Some(entry) = self.lock_leases().remove(&id) else {
            return;
        };
        // Not in Redis (taken while it was down), or Redis unreachable: nothing to remove
        // now; a lease Redis has expires by itself.
        if !entry.registered || !self.is_up() {
            return;
        }
        let inner = self.clone();
        self.parts.runtime.spawn(async move {
            if let Some((generation, conn)) = inner.connection() {
                let call = lease::release_call(&inner.keys, &entry.keys, &inner.member(id));
                inner.call::<i64>(Some(generation), conn, call, "release: ").await;
            }
        });
    }

    /// `call` on `conn` (of `generation`, as for [`Inner::failed`]) within `fleet.timeout`;
    /// `None` when it failed, and Redis is then unavailable. `what` names the call in the
    /// error logged.
    async fn call<T: redis::FromRedisValue>(
        &self,
        generation: Option<u64>,
        mut conn: MultiplexedConnection,
        call: redis::ScriptInvocation<'static>,
        what: &str,
    ) -> Option<T> {
        let timeout = self.config.timeout;
        let error = match tokio::time::timeout(timeout, call.invoke_async::<T>(&mut conn)).await {
            Ok(Ok(reply)) => return Some(reply),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("{what}no answer within {}ms", timeout.as_millis()),
        };
        self.failed(generation, &error);
        None
    }

    /// A call on the connection of `generation` failed (`None`: a connection attempt):
    /// Redis is unavailable until the prober reconnects. A failure of an older connection
    /// than the one in use changes nothing (see `health`).
    fn failed(&self, generation: Option<u64>, error: &str) {
        let mut link = self.lock_link();
        // Stale, or already down: the state stands as it is.
        let Some(change) = link.health.failed(generation, self.now_ms()) else {
            return;
        };
        link.conn = None;
        self.up_tx.send_replace(false);
        drop(link);
        if let Change::Down { at_start } = change {
            let error = crate::redact::clean(error);
            let (when, until) = if at_start {
                (" at start", "reachable")
            } else {
                ("", "back")
            };
            tracing::warn!(error = %error, expected_replicas = self.config.expected_replicas,
                "fleet: Redis unavailable{when}; each courier keeps to its local limits divided by fleet.expected_replicas until it is {until}");
            // Messages the fleet refused sleep until the lease in their way expires (up to
            // `lease_ttl`) or a release is published, which a dead Redis never does: they may
            // go now under the fallback limits.
            self.parts.wake.notify_one();
        }
    }

    /// `conn` works and the running attempts' leases are in Redis: fleet limits on, with
    /// `conn` as the new generation.
    fn recovered(&self, conn: MultiplexedConnection) {
        let mut link = self.lock_link();
        let change = link.health.succeeded(self.now_ms());
        link.conn = Some(conn);
        self.up_tx.send_replace(true);
        drop(link);
        if let Some(Change::Up { down_ms }) = change {
            match down_ms {
                Some(down_ms) => {
                    tracing::info!(down_ms, "fleet: Redis is back; fleet-wide limits in force again")
                }
                None => tracing::info!("fleet: Redis reachable; fleet-wide limits in force"),
            }
            // Waiting messages may go now under the fleet's limits instead of the fallback's.
            self.parts.wake.notify_one();
        }
    }

    /// A lease was released somewhere in the fleet: wake the scheduler if messages here
    /// wait for one.
    fn released(&self) {
        if self.waiting.swap(false, Ordering::AcqRel) {
            self.parts.wake.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_round_up_and_never_reach_zero() {
        let table = [
            // (limit, replicas, share)
            (10, 1, 10),
            (10, 2, 5),
            (10, 3, 4),
            (10, 4, 3),
            (10, 10, 1),
            (10, 50, 1),
            (5, 3, 2),
            (1, 3, 1),
            (100, 3, 34),
            (u32::MAX, 2, u32::MAX / 2 + 1),
            (0, 3, 0),
            (7, 0, 7),
        ];
        for (limit, replicas, want) in table {
            assert_eq!(share(limit, replicas), want, "{limit} / {replicas}");
        }
    }

    #[test]
    fn the_fleet_together_stays_within_one_share_of_the_limit() {
        for limit in 1..=200u32 {
            for replicas in 1..=60u32 {
                let s = share(limit, replicas);
                assert!(s >= 1);
                let total = u64::from(s) * u64::from(replicas);
                assert!(
                    total >= u64::from(limit),
                    "{limit}/{replicas}: the fleet keeps its limit"
                );
                if s > 1 {
                    assert!(
                        total < u64::from(limit) + u64::from(replicas),
                        "{limit}/{replicas}: {total}"
                    );
                }
            }
        }
    }
}
