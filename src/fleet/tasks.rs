//! The fleet's three tasks on delivery's runtime, each asleep until it has something to do:
//! - the prober connects while Redis is down (at start, then on a backoff timer), writes
//!   back the leases of the attempts that ran meanwhile, and turns fleet limits on;
//! - the renewer renews this courier's leases in batches, sleeping until the next one is
//!   due (see `schedule`), or until a first lease exists;
//! - the releaser removes released leases from Redis, every release queued meanwhile in
//!   one call, asleep while the queue is empty;
//! - the subscriber listens on the fleet's channel and wakes the scheduler when a lease is
//!   released while messages here wait for one. Pub/sub is at-most-once (a message sent
//!   while it reconnects is lost), so the waiting messages also have a timer: the expiry
//!   of the first lease in their way, which the acquire reported.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

use super::health::PROBE_MAX_MS;
use super::{lease, schedule, Inner};

pub(super) fn spawn(inner: &Arc<Inner>) {
    inner.parts.runtime.spawn(probe(inner.clone()));
    inner.parts.runtime.spawn(renew(inner.clone()));
    inner.parts.runtime.spawn(release(inner.clone()));
    inner.parts.runtime.spawn(subscribe(inner.clone()));
}

/// Connects, with `fleet.timeout` for the connection and each reply, and loads the scripts
/// so that every later call is one `EVALSHA`. The password is looked up again first (the
/// file is read on the blocking pool): a secret rotated since the last connection is the
/// one sent, as the docs promise.
async fn connect(inner: &Inner) -> Result<MultiplexedConnection, String> {
    let config = inner.config.clone();
    let password = tokio::task::spawn_blocking(move || config.password_override())
        .await
        .map_err(|e| format!("reading the password: {e}"))?
        .map_err(|e| e.to_string())?;
    let client = super::client_with(&inner.info, password, inner.parts.ca_pem.as_deref()).map_err(|e| e.to_string())?;
    *inner.client.lock().unwrap_or_else(|p| p.into_inner()) = client.clone();
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(inner.config.timeout))
        .set_response_timeout(Some(inner.config.timeout));
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| e.to_string())?;
    for script in lease::scripts() {
        script
            .prepare_invoke()
            .load_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(conn)
}

async fn probe(inner: Arc<Inner>) {
    let mut up = inner.up_tx.subscribe();
    loop {
        // Marks the flag's current value seen: a change after this read wakes the wait below.
        up.borrow_and_update();
        let next = inner.lock_link().health.next_probe_ms(inner.now_ms());
        let Some(at) = next else {
            // Up: asleep until the flag changes (a call fails). Not `wait_for(down)`, which
            // returns at once whenever the flag reads down, and would spin if it ever
            // disagreed with the health; `changed` pends until a new value is sent.
            if up.changed().await.is_err() {
                return;
            }
            continue;
        };
        inner.sleep_until(at).await;
        // Connecting is a few round trips (TCP, TLS, AUTH, three SCRIPT LOADs): bounded as a whole.
        let bound = inner.config.timeout * 8;
        let connected = tokio::time::timeout(bound, connect(&inner)).await;
        match connected.unwrap_or_else(|_| Err(format!("no connection within {}ms", bound.as_millis()))) {
            // The attempts that ran while Redis was away hold leases Redis does not have
            // (taken under the fallback, or lost with a restarted Redis): written back
            // before the fleet's limits count on them.
            Ok(conn) => {
                if write_back(&inner, None, conn.clone(), true).await {
                    inner.recovered(conn);
                }
            }
            Err(e) => inner.failed(None, &e),
        }
    }
}

/// Renews leases in one call on `conn` (of `generation`, as for `Inner::failed`): `all`
/// (after a reconnect) writes back every lease of a running attempt; otherwise the due ones
/// (see `schedule`) and those Redis does not have. Returns whether it worked.
async fn write_back(inner: &Inner, generation: Option<u64>, conn: MultiplexedConnection, all: bool) -> bool {
    let now = inner.now_ms();
    let (batch, _) = schedule::plan(inner.ttl_ms, &inner.lock_leases(), now, all);
    if batch.is_empty() {
        return true;
    }
    let members: Vec<String> = batch.iter().map(|(id, _, _)| inner.member(*id)).collect();
    let call = lease::renew_call(
        batch
            .iter()
            .zip(&members)
            .map(|((_, keys, restore), member)| (keys, member.as_str(), *restore)),
        inner.ttl_ms,
    );
    let Some(missing) = inner
        .call::<Vec<usize>>(generation, conn.clone(), call, "renewal: ")
        .await
    else {
        return false;
    };
    // The leases Redis did not have: the script names the missing members by their
    // 1-based position among the call's sets, and a lease may be in two sets.
    let owners: Vec<u64> = batch
        .iter()
        .flat_map(|(id, keys, _)| keys.sets().map(move |_| *id))
        .collect();
    let missing: HashSet<u64> = missing
        .into_iter()
        .filter_map(|i| owners.get(i.checked_sub(1)?).copied())
        .collect();
    let mut restored = 0;
    let mut lost_now = 0;
    let mut released = Vec::new();
    // In a block: the registry's guard must be gone before the release call below awaits.
    {
        let mut leases = inner.lock_leases();
        for (id, keys, restore) in &batch {
            let Some(entry) = leases.get_mut(id) else {
                // Released while this call was on its way: a lease written back (`+`) may have
                // been written after its release (or none was sent: Redis was down), so it is
                // released now rather than left holding a slot until it expires. A plain
                // renewal (`=`) never brings a lease back.
                if *restore {
                    released.push((*id, keys.clone()));
                }
                continue;
            };
            entry.renewed_at_ms = now;
            let lost = missing.contains(id);
            if *restore {
                // Counted when Redis had it before and lost it (not a lease taken while it
                // was down, which it never had).
                restored += u64::from(entry.registered && lost);
                entry.registered = true;
            } else if lost {
                // It expired (Redis was unreachable longer than the TTL without a call
                // failing, or Redis lost it): due at once, written back by the next renewal
                // (see `schedule`), and counted now as restored.
                entry.registered = false;
                lost_now += 1;
            }
        }
    }
    if !released.is_empty() {
        // On this connection, now: the releaser has none while the prober writes back.
        let members: Vec<String> = released.iter().map(|(id, _)| inner.member(*id)).collect();
        let leases = released.iter().zip(&members).map(|((_, keys), m)| (keys, m.as_str()));
        let call = lease::release_call(&inner.keys, leases);
        inner.call::<i64>(generation, conn, call, "release: ").await;
    }
    if lost_now > 0 {
        tracing::warn!(
            leases = lost_now,
            "fleet: Redis no longer had leases of running attempts; writing them back"
        );
    }
    inner.parts.metrics.fleet_restored(restored + lost_now);
    true
}

async fn renew(inner: Arc<Inner>) {
    let mut up = inner.up_tx.subscribe();
    loop {
        if !inner.is_up() {
            // The prober writes every lease back when Redis returns.
            let _ = up.wait_for(|up| *up).await;
            continue;
        }
        if let Some((generation, conn)) = inner.connection() {
            if !write_back(&inner, Some(generation), conn, false).await {
                continue;
            }
        }
        let next = {
            let leases = inner.lock_leases();
            let (_, next) = schedule::plan(inner.ttl_ms, &leases, inner.now_ms(), false);
            // Under the registry's lock, so that a lease added after this plan sees it and
            // rings `lease_added` (see `Inner::hold`).
            inner.renewer_idle.store(next.is_none(), Ordering::Release);
            next
        };
        match next {
            Some(at) => {
                tokio::select! {
                    _ = inner.sleep_until(at) => {}
                    _ = inner.lease_added.notified() => {}
                    _ = up.wait_for(|up| !*up) => {}
                }
            }
            None => inner.lease_added.notified().await,
        }
    }
}

/// The releaser: group commit. It sleeps until a release is queued, then sends the whole
/// queue in one call, and again whatever was queued while that call was on its way, until
/// the queue is empty: an idle courier's release goes at once, a busy one's share calls.
async fn release(inner: Arc<Inner>) {
    loop {
        inner.release_queued.notified().await;
        loop {
            let batch = inner.take_releases();
            if batch.is_empty() {
                break;
            }
            // Redis down meanwhile: these leases expire by themselves.
            let Some((generation, conn)) = inner.connection() else {
                continue;
            };
            let members: Vec<String> = batch.iter().map(|(id, _)| inner.member(*id)).collect();
            let call = lease::release_call(
                &inner.keys,
                batch
                    .iter()
                    .zip(&members)
                    .map(|((_, keys), member)| (keys, member.as_str())),
            );
            inner.call::<i64>(Some(generation), conn, call, "release: ").await;
        }
    }
}

async fn subscribe(inner: Arc<Inner>) {
    let mut up = inner.up_tx.subscribe();
    let channel = inner.keys.channel();
    loop {
        let _ = up.wait_for(|up| *up).await;
        let subscribed = tokio::time::timeout(inner.config.timeout * 8, async {
            let client = inner.client.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        })
        .await;
        let Ok(Ok(pubsub)) = subscribed else {
            // Commands work but the subscription does not (yet): the waiting messages'
            // timers still wake them; try again later.
            tracing::debug!("fleet: subscribing to lease releases failed; retrying");
            inner.sleep_until(inner.now_ms() + PROBE_MAX_MS).await;
            continue;
        };
        // Releases published while not subscribed were missed.
        inner.released();
        let mut messages = pubsub.into_on_message();
        loop {
            tokio::select! {
                message = messages.next() => match message {
                    Some(_) => inner.released(),
                    None => break,
                },
                _ = up.wait_for(|up| !*up) => break,
            }
        }
        if inner.is_up() {
            // The subscription ended while commands still work (Redis closed it): not a
            // reason to spin; reconnect after a pause.
            inner.sleep_until(inner.now_ms() + super::health::PROBE_BASE_MS).await;
        }
    }
}
