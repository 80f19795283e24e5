//! The fleet's three tasks on delivery's runtime, each asleep until it has something to do:
//! - the prober connects while Redis is down (at start, then on a backoff timer), writes
//!   back the leases of the attempts that ran meanwhile, and turns fleet limits on;
//! - the renewer renews this courier's leases in batches, sleeping until the next one is
//!   due (see `schedule`), or until a first lease exists;
//! - the subscriber listens on the fleet's channel and wakes the scheduler when a lease is
//!   released while messages here wait for one. Pub/sub is at-most-once (a message sent
//!   while it reconnects is lost), so the waiting messages also have a timer: the expiry
//!   of the first lease in their way, which the acquire reported.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::AsyncConnectionConfig;

use super::health::PROBE_MAX_MS;
use super::lease::LeaseEntry;
use super::{lease, Inner};

pub(super) fn spawn(inner: &Arc<Inner>) {
    inner.runtime.spawn(probe(inner.clone()));
    inner.runtime.spawn(renew(inner.clone()));
    inner.runtime.spawn(subscribe(inner.clone()));
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
    let client = super::client_with(&inner.info, password, inner.ca_pem.as_deref()).map_err(|e| e.to_string())?;
    *inner.client.lock().unwrap_or_else(|p| p.into_inner()) = client.clone();
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(inner.timeout))
        .set_response_timeout(Some(inner.timeout));
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
        let connected = tokio::time::timeout(inner.timeout * 8, connect(&inner)).await;
        let result = match connected {
            Ok(Ok(conn)) => {
                // The attempts that ran while Redis was away hold leases Redis does not
                // have (taken under the fallback, or lost with a restarted Redis): written
                // back before the fleet's limits count on them.
                write_back(&inner, conn.clone(), true).await.map(|()| conn)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!("no connection within {}ms", (inner.timeout * 8).as_millis())),
        };
        match result {
            Ok(conn) => inner.recovered(conn),
            Err(e) => inner.failed(None, &e),
        }
    }
}

/// Renews leases in one call: `all` (after a reconnect) writes back every lease of a
/// running attempt; otherwise the due ones (see `schedule`) and those Redis does not have.
async fn write_back(inner: &Inner, mut conn: MultiplexedConnection, all: bool) -> Result<(), String> {
    let now = inner.now_ms();
    // (id, keys, restore) of the leases to send, and when the renewer should look again.
    let (batch, _) = plan_in(&inner.schedule, &inner.lock_leases(), now, all);
    if batch.is_empty() {
        return Ok(());
    }
    let members: Vec<String> = batch.iter().map(|(id, _, _)| inner.member(*id)).collect();
    let call = lease::renew_call(
        batch
            .iter()
            .zip(&members)
            .map(|((_, keys, restore), member)| (keys, member.as_str(), *restore)),
        inner.ttl_ms,
    );
    let missing = match tokio::time::timeout(inner.timeout, call.invoke_async::<Vec<usize>>(&mut conn)).await {
        Ok(Ok(missing)) => missing,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("renewal: no answer within {}ms", inner.timeout.as_millis())),
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
    let mut leases = inner.lock_leases();
    let mut restored = 0;
    let mut lost_now = 0;
    for (id, _, restore) in &batch {
        let Some(entry) = leases.get_mut(id) else { continue };
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
            // (see `plan_in`), and counted now as restored.
            entry.registered = false;
            lost_now += 1;
        }
    }
    drop(leases);
    if lost_now > 0 {
        tracing::warn!(
            leases = lost_now,
            "fleet: Redis no longer had leases of running attempts; writing them back"
        );
    }
    inner.metrics.fleet_restored(restored + lost_now);
    Ok(())
}

type Batch = Vec<(u64, lease::LeaseKeys, bool)>;

/// The leases to renew now: every one when `all`; else the due ones and those Redis does
/// not have yet. Also when to look again (pure, time passed in). A lease Redis does not
/// have (lost while Redis was reachable, found missing by a renewal) is due now: without
/// that, a registry of only such leases would give the renewer no timer, and nothing would
/// write them back (or renew the leases taken after them) before they expire under running
/// attempts.
fn plan_in(
    schedule: &super::RenewSchedule,
    leases: &HashMap<u64, LeaseEntry>,
    now: u64,
    all: bool,
) -> (Batch, Option<u64>) {
    let plan = schedule.plan(
        leases
            .iter()
            .filter(|(_, e)| e.registered)
            .map(|(id, e)| (*id, e.renewed_at_ms)),
        now,
    );
    let due: HashSet<u64> = plan.due.into_iter().collect();
    let batch = leases
        .iter()
        .filter(|(id, e)| all || !e.registered || due.contains(id))
        .map(|(id, e)| (*id, e.keys.clone(), all || !e.registered))
        .collect();
    let unregistered = leases.values().any(|e| !e.registered).then_some(now);
    let next = plan.next_ms.into_iter().chain(unregistered).min().filter(|_| !all);
    (batch, next)
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
            if let Err(e) = write_back(&inner, conn, false).await {
                inner.failed(Some(generation), &e);
                continue;
            }
        }
        let next = {
            let leases = inner.lock_leases();
            let (_, next) = plan_in(&inner.schedule, &leases, inner.now_ms(), false);
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

async fn subscribe(inner: Arc<Inner>) {
    let mut up = inner.up_tx.subscribe();
    let channel = inner.keys.channel();
    loop {
        let _ = up.wait_for(|up| *up).await;
        let subscribed = tokio::time::timeout(inner.timeout * 8, async {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::RenewSchedule;

    fn entry(renewed_at_ms: u64, registered: bool) -> LeaseEntry {
        LeaseEntry {
            keys: lease::LeaseKeys {
                host: "h".into(),
                host_wait: "hw".into(),
                endpoint: "e".into(),
                endpoint_wait: "ew".into(),
                capped: false,
            },
            renewed_at_ms,
            registered,
        }
    }

    #[test]
    fn leases_redis_lost_are_due_at_once_so_the_renewer_keeps_a_timer() {
        let s = RenewSchedule::new(9_000);
        // Every lease found missing by the last renewal: still a timer, and it is now.
        let leases = HashMap::from([(1, entry(1_000, false)), (2, entry(1_000, false))]);
        let (batch, next) = plan_in(&s, &leases, 1_500, false);
        assert_eq!(next, Some(1_500));
        let mut ids: Vec<(u64, bool)> = batch.iter().map(|(id, _, restore)| (*id, *restore)).collect();
        ids.sort();
        assert_eq!(ids, vec![(1, true), (2, true)], "written back, not merely renewed");
        // With registered leases too: the earlier of the two.
        let mut leases = leases;
        leases.insert(3, entry(1_400, true));
        assert_eq!(plan_in(&s, &leases, 1_500, false).1, Some(1_500));
        // Only registered leases: their schedule.
        let leases = HashMap::from([(3, entry(1_400, true))]);
        let (batch, next) = plan_in(&s, &leases, 1_500, false);
        assert!(batch.is_empty());
        assert_eq!(next, Some(4_400));
        // None at all: no timer (the renewer waits for `lease_added`).
        assert_eq!(plan_in(&s, &HashMap::new(), 1_500, false).1, None);
    }
}
