//! One page of `GET /endpoints`: every endpoint courier knows, in key order, after a
//! cursor, filtered by state and key prefix.
//!
//! Endpoints are known from four places, each read in key order and only as far as one
//! page needs, so a page costs the same with ten endpoints known or a million:
//! - the in-memory table (paused, busy, or seen lately; it is bounded, and every paused
//!   endpoint is in it);
//! - the store's endpoint records (every endpoint with a permanent-failure streak that was
//!   written within the retention window, whether memory still holds it or not);
//! - the store's per-endpoint open counters (every endpoint with pending or in-flight
//!   messages), walked from the cursor;
//! - the endpoints configured under `[[endpoint]]`.
//!
//! Each source gives its first `limit` keys past the cursor; the first `limit` keys of
//! their union are the page.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::context::endpoints::EndpointView;
use crate::context::Context;
use crate::store::{EndpointRecord, StoreError};

/// What a page asks for.
#[derive(Debug, Clone, Default)]
pub struct EndpointQuery {
    /// Keys strictly after this one.
    pub cursor: Option<String>,
    /// Keys that start with this.
    pub prefix: String,
    /// `Some(true)`: paused only; `Some(false)`: active only.
    pub paused: Option<bool>,
    /// Most items.
    pub limit: usize,
}

/// What one source knows of an endpoint.
#[derive(Default)]
struct Known {
    view: Option<EndpointView>,
    stored: Option<EndpointRecord>,
    open: Option<u64>,
}

/// Reads one page (blocking: it reads the store), as the admin API answers it: `items`
/// (each with `key`, `state`, `permanent_failure_streak`, `in_flight`, `pending`; for an
/// ordered endpoint also `ordering`, `line_head`, `line_blocked`, `line_waiting`) and
/// `next_cursor`, the last key of this page when more may follow.
pub fn page(d: &Context, q: &EndpointQuery) -> Result<Value, StoreError> {
    let (known, stop) = gather(d, q)?;
    let mut items = Vec::new();
    let mut last = None;
    let mut cut = stop.is_some();
    for (key, k) in known {
        if stop.as_ref().is_some_and(|s| key > *s) {
            break;
        }
        if items.len() >= q.limit {
            cut = true;
            break;
        }
        // The cursor may pass a key the filter leaves out.
        last = Some(key.clone());
        items.extend(item(d, q.paused, key, k)?);
    }
    let next_cursor = if cut { last.or(stop) } else { None };
    Ok(json!({ "items": items, "next_cursor": next_cursor }))
}

/// Every source's first keys past the cursor, and the smallest key at which a source
/// stopped: every key up to it is known from every source, so the page may go that far and
/// no further (a filtered-out run of one source must not let the page skip past keys
/// another source has not reached yet).
fn gather(d: &Context, q: &EndpointQuery) -> Result<(BTreeMap<String, Known>, Option<String>), StoreError> {
    let after = q.cursor.as_deref();
    let want = q.limit + 1;
    let mut known: BTreeMap<String, Known> = BTreeMap::new();
    let mut stop: Option<String> = None;
    let views = d.endpoints().page(d.clock().now_ms(), after, &q.prefix, q.paused, want);
    if views.len() >= want {
        lower(&mut stop, views.last().map(|v| v.key.clone()));
    }
    for v in views {
        let key = v.key.clone();
        known.entry(key).or_default().view = Some(v);
    }
    // A paused endpoint is always in the table: only the active ones need the others.
    if q.paused != Some(true) {
        let (stored, stopped_at) = d.store().endpoint_records_page(after, &q.prefix, want)?;
        lower(&mut stop, stopped_at);
        for (key, rec) in stored {
            known.entry(key).or_default().stored = Some(rec);
        }
        let (open, stopped_at) = d.store().open_endpoints_page(after, &q.prefix, want)?;
        lower(&mut stop, stopped_at);
        for (key, n) in open {
            known.entry(key).or_default().open = Some(n);
        }
        for e in &d.config().endpoints {
            if after.is_none_or(|a| e.key.as_str() > a) && e.key.starts_with(&q.prefix) {
                known.entry(e.key.clone()).or_default();
            }
        }
    }
    Ok((known, stop))
}

/// The item for one endpoint, as the admin API shows it; `None` when the state filter
/// `paused` leaves it out.
fn item(d: &Context, paused_only: Option<bool>, key: String, k: Known) -> Result<Option<Value>, StoreError> {
    let view = k.view.or_else(|| d.endpoints().get(&key));
    let paused = view.as_ref().is_some_and(|v| v.rec.paused);
    if paused_only.is_some_and(|p| p != paused) {
        return Ok(None);
    }
    let open = match k.open {
        Some(n) => n,
        None => d.store().open_of_endpoint(&key)?,
    };
    // Memory's record is the whole state once loaded; before that, the store's is.
    let streak = match (&view, k.stored) {
        (Some(v), _) if v.loaded => v.rec.streak,
        (_, Some(rec)) => rec.streak,
        _ => d.store().endpoint(&key)?.map_or(0, |r| r.streak),
    };
    let in_flight = view.as_ref().map_or(0, |v| v.in_flight);
    // An ordered endpoint (configured so, or with a line: a route's ordered messages,
    // or ones from before the config changed) adds its line; an unordered one's item is
    // exactly as before. One point read per item.
    let line = d.store().line(&key)?;
    let ordered = line.is_some() || d.config().endpoints.iter().any(|e| e.key == key && e.fifo.is_some());
    let mut item = json!({
        "key": key,
        "state": if paused { "paused" } else { "active" },
        "permanent_failure_streak": streak,
        "in_flight": in_flight,
        "pending": open.saturating_sub(u64::from(in_flight)),
    });
    if ordered {
        item["ordering"] = json!("fifo");
        item["line_head"] = json!(line.as_ref().map(|l| l.head.clone()));
        item["line_blocked"] = json!(line.as_ref().is_some_and(|l| l.blocked));
        item["line_waiting"] = json!(line.as_ref().map_or(0, |l| l.waiting));
    }
    Ok(Some(item))
}

/// Lowers `stop` to `key` when `key` is smaller.
fn lower(stop: &mut Option<String>, key: Option<String>) {
    if let Some(k) = key {
        if stop.as_ref().is_none_or(|s| k < *s) {
            *stop = Some(k);
        }
    }
}

/// Whether courier knows the endpoint (for pause and resume): in the table, with open
/// messages, with a stored record, or configured.
pub fn is_known(d: &Context, key: &str) -> Result<bool, StoreError> {
    Ok(d.endpoints().get(key).is_some()
        || d.config().endpoints.iter().any(|e| e.key == key)
        || d.store().open_of_endpoint(key)? > 0
        || d.store().endpoint(key)?.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::delivery::tests::{config, Harness, Scripted, T0};
    use crate::model::Jitter;

    /// Finding (review): a page of active endpoints skipped a failing endpoint only the
    /// store knew, when the store's page was cut short by paused ones the filter left out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn active_pages_never_skip_an_endpoint_only_the_store_knows() {
        let clock = ManualClock::new(T0);
        let h = Harness::start(
            config(Jitter::None),
            Scripted::new(clock.clone(), vec![]),
            clock.clone(),
        );
        for k in ["a", "b", "c"] {
            h.d.context().set_paused(k, true).unwrap();
        }
        let failing = crate::store::EndpointRecord {
            paused: false,
            streak: 2,
            last_status: Some(410),
        };
        h.d.context().store().put_endpoint("d", &failing, T0).unwrap();
        for k in ["e", "f", "g"] {
            h.d.context().endpoints().try_rate(k, T0).unwrap();
        }
        let mut seen = Vec::new();
        let mut cursor = None;
        for _ in 0..20 {
            let q = EndpointQuery {
                cursor: cursor.clone(),
                prefix: String::new(),
                paused: Some(false),
                limit: 2,
            };
            let page = page(h.d.context(), &q).unwrap();
            let items = page["items"].as_array().unwrap();
            seen.extend(items.iter().map(|i| i["key"].as_str().unwrap().to_string()));
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_string()),
                None => break,
            }
        }
        assert_eq!(seen, ["d", "e", "f", "g"]);
    }
}
