//! The admin API (CONTRACT §5): health, readiness, metrics, deliveries and endpoints, the
//! public keys of the Ed25519 signing keys (never a secret), `/reload` (see [`crate::reload`]),
//! `/drain` (see `drain`), and the web view ([`crate::ui`]). All but `/healthz` and the
//! view's static files need `Authorization: Bearer <admin_token>` if set.

// A route's refusal is the response it answers with, built at most once per request: a
// Result carrying it whole lets each route stop at its first refusal with `?`.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use subtle::ConstantTimeEq;

use crate::context::Context;
use crate::drain::DrainControl;
use crate::endpoint_page::EndpointQuery;
use crate::inbound::access::AccessPolicy;
use crate::inbound::serve::{self, Body};
use crate::limits::HostLimiter;
use crate::model::State;
use crate::ops::Probes;
use crate::outbound::trace::TraceParent;
use crate::reload::{ReloadError, Reloader};
use crate::store::{ListFilter, MessageRecord, StoreError};
use crate::timefmt::parse_rfc3339;

mod views;

pub use views::{delivery_json, policy_json, shown_target};

/// Default page size of `GET /deliveries`.
pub const DEFAULT_PAGE: usize = 100;

/// The admin component.
pub struct Admin {
    ctx: Arc<Context>,
    /// The per-host limiter, for its view.
    hosts: Arc<HostLimiter>,
    probes: Arc<Probes>,
    drain: Arc<DrainControl>,
    access: AccessPolicy,
    reloader: Arc<Reloader>,
}

fn not_found(what: &str) -> Response<Body> {
    serve::error(StatusCode::NOT_FOUND, "not_found", format!("{what} not found"))
}

fn bad_request(message: impl Into<String>) -> Response<Body> {
    serve::error(StatusCode::BAD_REQUEST, "invalid_request", message)
}

fn store_failed(e: StoreError) -> Response<Body> {
    serve::error(StatusCode::SERVICE_UNAVAILABLE, e.code(), e.to_string())
}

/// A route's answer: `Err` is the refusal it stopped at (a 400, a 404, a store failure).
type Answer = Result<Response<Body>, Response<Body>>;

fn query_map(req: &Request<Incoming>) -> HashMap<String, String> {
    req.uri()
        .query()
        .map(|q| url::form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}

/// A page's `limit` (1 to 1000, [`DEFAULT_PAGE`] when absent).
fn page_limit(q: &HashMap<String, String>) -> Result<usize, Response<Body>> {
    match q.get("limit").map(|l| l.parse::<usize>()) {
        None => Ok(DEFAULT_PAGE),
        Some(Ok(n)) if (1..=1000).contains(&n) => Ok(n),
        Some(_) => Err(bad_request("limit must be a whole number from 1 to 1000")),
    }
}

fn decode_segment(s: &str) -> String {
    percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned()
}

impl Admin {
    /// Builds the component: the probes it also serves, the reloader of `POST /reload`, the
    /// drain it starts and shows (`/drain`), and the browser rules of `[admin]`.
    pub fn new(
        ctx: Arc<Context>,
        hosts: Arc<HostLimiter>,
        probes: Arc<Probes>,
        reloader: Arc<Reloader>,
        drain: Arc<DrainControl>,
    ) -> Self {
        let config = ctx.config();
        let access = AccessPolicy::new(
            "admin",
            config.admin.allowed_origins.clone(),
            config.admin.hosts.clone(),
        );
        Admin {
            ctx,
            hosts,
            probes,
            access,
            reloader,
            drain,
        }
    }

    fn authorized(&self, req: &Request<Incoming>) -> bool {
        // Read at each request: a reload may rotate the token.
        let config = self.ctx.config();
        let Some(token) = &config.admin_token else {
            return true;
        };
        let given = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim);
        given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(token.expose().as_bytes())))
    }

    /// Handles one request.
    pub async fn handle(self: Arc<Self>, _peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_string();
        // Browsers first, even for /healthz: a page must not learn that courier is here.
        if let Err(refused) = self.access.check(req.method(), req.uri(), req.headers()) {
            return refused.response();
        }
        if path == "/healthz" {
            return self.probes.healthz();
        }
        if let Some(page) = crate::ui::respond(req.method(), &path, self.ctx.config().admin_token.is_some()) {
            return page;
        }
        if !self.authorized(&req) {
            return serve::error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "admin API needs Authorization: Bearer <admin_token>",
            );
        }
        if path == "/drain" {
            // Reads a body and answers while a drain runs: async, not a store call here.
            return self.drain.handle(req).await;
        }
        let method = req.method().clone();
        let query = query_map(&req);
        // Every route below reads or writes the store (a bulk replay may write for seconds):
        // on a blocking thread, so ingress and the probes keep answering meanwhile.
        tokio::task::spawn_blocking(move || self.route(method, &path, &query))
            .await
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "an admin request panicked");
                serve::error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    "the request failed inside courier",
                )
            })
    }

    fn route(&self, method: Method, path: &str, query: &HashMap<String, String>) -> Response<Body> {
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let answer = match (&method, segments.as_slice()) {
            (&Method::GET, ["readyz"]) => Ok(self.probes.readyz()),
            (&Method::GET, ["metrics"]) => Ok(self.probes.metrics()),
            (&Method::GET, ["deliveries"]) => self.list(query),
            (&Method::POST, ["deliveries", "retry"]) => self.bulk_retry(query),
            (&Method::GET, ["deliveries", id]) => self.show(&decode_segment(id)),
            (&Method::DELETE, ["deliveries", id]) => self.delete(&decode_segment(id)),
            (&Method::POST, ["deliveries", id, "retry"]) => self.retry(&decode_segment(id)),
            (&Method::GET, ["endpoints"]) => self.endpoints(query),
            (&Method::GET, ["hosts"]) => self.hosts(query),
            (&Method::GET, ["signing", "public-keys"]) => Ok(self.public_keys()),
            (&Method::POST, ["reload"]) => Ok(self.reload()),
            (&Method::POST, ["endpoints", ..]) if path.ends_with("/pause") || path.ends_with("/resume") => {
                let pause = path.ends_with("/pause");
                let raw = path["/endpoints/".len()..path.rfind('/').unwrap_or(path.len())].to_string();
                self.set_paused(&decode_segment(&raw), pause)
            }
            (
                _,
                ["readyz" | "metrics" | "deliveries" | "endpoints" | "hosts", ..]
                | ["signing", "public-keys"]
                | ["reload"],
            ) => Err(serve::error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{method} is not allowed on {path}"),
            )),
            _ => Err(serve::error(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no admin route {path}"),
            )),
        };
        answer.unwrap_or_else(|refused| refused)
    }

    /// `GET /signing/public-keys`: the `whpk_` key of every `whsk_` key this running
    /// courier signs with, for receivers to verify `v1a` signatures (the file on disk may
    /// have changed since start; this is what signs now).
    fn public_keys(&self) -> Response<Body> {
        let items: Vec<Value> = self
            .ctx
            .config()
            .ed25519_public_keys()
            .into_iter()
            .map(|e| json!({ "source": e.source, "key": e.key, "public_key": e.public_key }))
            .collect();
        serve::json(StatusCode::OK, &json!({ "items": items }))
    }

    /// `POST /reload`: reads the config again and applies it (see [`crate::reload`]).
    fn reload(&self) -> Response<Body> {
        match self.reloader.reload() {
            Ok(r) => serve::json(
                StatusCode::OK,
                &json!({
                    "reloaded": true,
                    "restart_required": r.restart_required,
                    "signing_keys_dropped": r.signing_keys_dropped,
                }),
            ),
            Err(e @ ReloadError::Unavailable) => serve::error(StatusCode::NOT_IMPLEMENTED, e.code(), e.to_string()),
            Err(e) => serve::error(StatusCode::BAD_REQUEST, e.code(), e.to_string()),
        }
    }

    fn show(&self, id: &str) -> Answer {
        let store = self.ctx.store();
        let rec = store.message_shown(id).map_err(store_failed)?;
        let rec = rec.ok_or_else(|| not_found(&format!("delivery {id:?}")))?;
        let history = store.history(&rec).map_err(store_failed)?;
        let mut v = delivery_json(&rec, Some(&history), self.ctx.config().alert_url.as_ref());
        // The trace the app's traceparent started, kept with the payload's headers
        // (only this view reads the payload: a list would read every body).
        let payload = store.payload(id).map_err(store_failed)?;
        v["trace_id"] = json!(payload
            .and_then(|p| TraceParent::from_headers(&p.headers))
            .map(|t| t.trace_id));
        self.line_fields(&rec, &mut v).map_err(store_failed)?;
        let settings = self.ctx.settings();
        v["policy"] = policy_json(&settings.policies, rec.route.as_deref(), &rec.endpoint);
        Ok(serve::json(StatusCode::OK, &v))
    }

    /// An ordered message's place: `line_position` (messages ahead of it, 0 for the head)
    /// and `line_head` (the message it waits behind; itself when it is the head); both null
    /// once it is finished. Nothing for an unordered message.
    fn line_fields(&self, rec: &MessageRecord, v: &mut Value) -> Result<(), StoreError> {
        if rec.fifo.is_none() {
            return Ok(());
        }
        let position = self.ctx.store().line_position(rec)?;
        let head = match position {
            Some(_) => self.ctx.store().line(&rec.endpoint)?.map(|l| l.head),
            None => None,
        };
        v["line_position"] = json!(position);
        v["line_head"] = json!(head);
        Ok(())
    }

    /// The filter of a listing or replay query.
    fn filter(q: &HashMap<String, String>) -> Result<ListFilter, Response<Body>> {
        let state = match q.get("state").map(String::as_str) {
            None | Some("") => None,
            Some(s) => Some(s.parse::<State>().map_err(|e| bad_request(e.to_string()))?),
        };
        let time = |key: &str| -> Result<Option<u64>, Response<Body>> {
            match q.get(key).map(String::as_str) {
                None | Some("") => Ok(None),
                Some(t) => parse_rfc3339(t).map(Some).ok_or_else(|| {
                    bad_request(format!("{key}={t:?} is not an RFC 3339 time like 2026-01-31T12:00:00Z"))
                }),
            }
        };
        Ok(ListFilter {
            state,
            endpoint: q.get("endpoint").filter(|e| !e.is_empty()).cloned(),
            finished_since_ms: time("since")?,
            finished_until_ms: time("until")?,
        })
    }

    fn list(&self, q: &HashMap<String, String>) -> Answer {
        let filter = Self::filter(q)?;
        let limit = page_limit(q)?;
        let cursor = q.get("cursor").filter(|c| !c.is_empty()).map(String::as_str);
        let alert_url = self.ctx.config().alert_url.clone();
        let page = self.ctx.store().list(&filter, limit, cursor).map_err(store_failed)?;
        let items: Vec<Value> = page
            .items
            .iter()
            .map(|r| delivery_json(r, None, alert_url.as_ref()))
            .collect();
        Ok(serve::json(
            StatusCode::OK,
            &json!({ "items": items, "next_cursor": page.next_cursor }),
        ))
    }

    /// A replayed message's new give-up time: its policy's `give_up_after` from now, as
    /// the config says now for its endpoint and route.
    fn give_up_at(&self, now: u64) -> impl Fn(&MessageRecord) -> u64 + '_ {
        let settings = self.ctx.settings();
        move |rec| {
            let after = settings
                .policies
                .resolve(rec.route.as_deref(), &rec.endpoint)
                .give_up_after;
            now.saturating_add(u64::try_from(after.as_millis()).unwrap_or(u64::MAX))
        }
    }

    fn retry(&self, id: &str) -> Answer {
        let now = self.ctx.clock().now_ms();
        match self
            .ctx
            .store()
            .replay(id, now, self.give_up_at(now))
            .map_err(store_failed)?
        {
            Some(true) => {
                self.ctx.wake();
                tracing::info!(delivery_id = id, "dead message replayed");
                Ok(serve::json(
                    StatusCode::ACCEPTED,
                    &json!({ "id": id, "status": "pending" }),
                ))
            }
            Some(false) => Err(serve::error(
                StatusCode::CONFLICT,
                "not_dead",
                format!("delivery {id:?} is not dead; only dead messages can be retried"),
            )),
            None => Err(not_found(&format!("delivery {id:?}"))),
        }
    }

    fn bulk_retry(&self, q: &HashMap<String, String>) -> Answer {
        let filter = Self::filter(q)?;
        if filter.state.is_some_and(|s| s != State::Dead) {
            return Err(bad_request("only dead messages can be replayed (state=dead)"));
        }
        let now = self.ctx.clock().now_ms();
        let replayed = self.ctx.store().replay_dead(&filter, now, self.give_up_at(now));
        let n = replayed.map_err(store_failed)?;
        if n > 0 {
            self.ctx.wake();
        }
        tracing::info!(
            requeued = n,
            endpoint = filter.endpoint.as_deref(),
            "dead messages replayed"
        );
        Ok(serve::json(StatusCode::OK, &json!({ "requeued": n })))
    }

    fn delete(&self, id: &str) -> Answer {
        let deleted = self.ctx.store().delete(id, self.ctx.clock().now_ms());
        if !deleted.map_err(store_failed)? {
            return Err(not_found(&format!("delivery {id:?}")));
        }
        // A deleted head of an ordered line hands over to the next, due now.
        self.ctx.wake();
        tracing::info!(delivery_id = id, "delivery deleted");
        Ok(serve::empty(StatusCode::NO_CONTENT))
    }

    /// A page of the endpoints courier knows (see `endpoint_page`): `limit` (1–1000,
    /// default 100), `cursor`, `state` (`active` or `paused`), `prefix`.
    fn endpoints(&self, q: &HashMap<String, String>) -> Answer {
        let limit = page_limit(q)?;
        let paused = match q.get("state").map(String::as_str) {
            None | Some("") => None,
            Some("active") => Some(false),
            Some("paused") => Some(true),
            Some(_) => return Err(bad_request("state must be active or paused")),
        };
        let query = EndpointQuery {
            cursor: q.get("cursor").filter(|c| !c.is_empty()).cloned(),
            prefix: q.get("prefix").cloned().unwrap_or_default(),
            paused,
            limit,
        };
        let page = crate::endpoint_page::page(&self.ctx, &query).map_err(store_failed)?;
        Ok(serve::json(StatusCode::OK, &page))
    }

    /// The hosts courier holds (busy, with a breaker not closed, or seen lately): each
    /// `host`, `circuit` (`closed`, `open`, `probing`, `ramping`), `in_flight`, `cap`,
    /// `consecutive_failures`, `next_probe_at`; `state=open` for breakers not closed.
    fn hosts(&self, q: &HashMap<String, String>) -> Answer {
        let open_only = match q.get("state").map(String::as_str) {
            None | Some("") => false,
            Some("open") => true,
            Some(_) => return Err(bad_request("state must be open")),
        };
        let items: Vec<Value> = self
            .hosts
            .snapshot(open_only)
            .into_iter()
            .map(|h| {
                json!({
                    "host": h.host,
                    "circuit": h.state.as_str(),
                    "in_flight": h.in_flight,
                    "cap": h.cap,
                    "consecutive_failures": h.failures,
                    "next_probe_at": h.next_probe_ms.map(crate::timefmt::rfc3339),
                })
            })
            .collect();
        Ok(serve::json(StatusCode::OK, &json!({ "items": items })))
    }

    fn set_paused(&self, key: &str, paused: bool) -> Answer {
        if !crate::endpoint_page::is_known(&self.ctx, key).map_err(store_failed)? {
            return Err(not_found(&format!("endpoint {key:?}")));
        }
        self.ctx.set_paused(key, paused).map_err(store_failed)?;
        Ok(serve::empty(StatusCode::NO_CONTENT))
    }
}
