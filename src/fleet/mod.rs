//! Fleet-wide limits on Redis (`[fleet]`): the per-host in-flight cap, the per-endpoint
//! `max_in_flight` cap and the per-endpoint rate limit, enforced across every courier that
//! shares the Redis (and the `key_prefix`), so fifty replicas of an app send a receiver
//! what one courier would, not fifty times that.
//!
//! How it fits delivery: the scheduler admits an attempt with its local permits first (the
//! global `max_in_flight`, the endpoint's cap, the host's cap and breaker, the local rate),
//! then the pass asks the fleet for the leases of every attempt that passed them
//! ([`Fleet::acquire_many`]): one Lua script, one round trip per pass, grants each a
//! [`Lease`] or says how long it must wait (see `lease`). A refused message stays
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
//! Releases cost the attempt nothing: a dropped [`Lease`] is queued, and one task sends
//! every release queued meanwhile in one call as soon as the previous call has answered
//! (group commit: no added delay when idle, no timer), so a busy courier releases in
//! batches. A queued lease is still in Redis, and counts there, until its call ran.
//!
//! Calls: [`Fleet::acquire_many`] blocks (the scheduler's pass runs on a blocking thread and
//! waits for the reply there); everything else runs on delivery's runtime.

mod health;
mod lease;
mod registry;
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
use lease::{Keys, LeaseEntry, LeaseKeys};

/// Leases held before new ones are refused locally: one per attempt in flight, which
/// `delivery.max_in_flight` bounds far below this; a safety bound only.
const MAX_LEASES: usize = 1 << 20;

/// Releases queued at most: one per lease, so bounded like them; past it a release is
/// dropped and its lease expires after `lease_ttl` (a slot idle a while, the cap kept).
const MAX_QUEUED_RELEASES: usize = 1 << 16;

/// Most leases one acquire or release call carries, so that no script holds Redis (single
/// threaded) for long; a scheduler pass asks for at most `claim_batch` (256).
const MAX_PER_CALL: usize = 512;

/// What [`Fleet::acquire_many`] decided for one request.
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
    pub wake: Arc<crate::sys::wake::Wake>,
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
    /// Released leases not yet removed from Redis (`(id, keys)`), for the releaser's next
    /// call; at most [`MAX_QUEUED_RELEASES`].
    releases: Mutex<Vec<(u64, LeaseKeys)>>,
    /// Rung when a release is queued into an empty queue.
    release_queued: Notify,
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
            releases: Mutex::new(Vec::new()),
            release_queued: Notify::new(),
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

    /// Asks Redis for a lease (and a rate slot) for each of `reqs`, in order: one script and
    /// one round trip for all of them (up to [`MAX_PER_CALL`]), each at most
    /// `fleet.timeout`. The answers are in the order of `reqs`, each decided as if the ones
    /// before it had been asked alone (their grants count against it). Blocks: call it
    /// from a blocking thread (the scheduler's pass), never from an async task.
    pub fn acquire_many(&self, reqs: &[LeaseRequest<'_>]) -> Vec<Acquired> {
        reqs.chunks(MAX_PER_CALL)
            .flat_map(|reqs| self.inner.acquire_some(reqs))
            .collect()
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
            self.parts.wake.ring();
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
            self.parts.wake.ring();
        }
    }

    /// A lease was released somewhere in the fleet: wake the scheduler if messages here
    /// wait for one.
    fn released(&self) {
        if self.waiting.swap(false, Ordering::AcqRel) {
            self.parts.wake.ring();
        }
    }
}

#[cfg(test)]
mod tests_redis;

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
