//! The read-only surface: `/healthz`, `/readyz` and `/metrics`.
//!
//! Served on the admin listener (as always) and, when `ops_listen` is set, on a listener of
//! its own that serves nothing else. That one is safe to bind to the pod IP for kubelet's
//! probes and Prometheus: none of its routes changes anything or shows a message, so it
//! needs no token, while the admin API stays on loopback (or behind `admin_token`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;

use crate::delivery::Deliverer;
use crate::inbound::serve::{self, Body};
use crate::metrics::Gauges;
use crate::policy::circuit::CircuitState;

/// Health, readiness and metrics.
pub struct Probes {
    d: Arc<Deliverer>,
    draining: Arc<AtomicBool>,
}

impl Probes {
    /// Builds the component. `draining` turns true when shutdown starts.
    pub fn new(d: Arc<Deliverer>, draining: Arc<AtomicBool>) -> Self {
        Probes { d, draining }
    }

    /// `GET /healthz`: 200 while the process runs.
    pub fn healthz(&self) -> Response<Body> {
        serve::json(StatusCode::OK, &json!({ "status": "ok" }))
    }

    /// `GET /readyz`: 200 when storage is writable and ingress accepts, with the store keys
    /// in use; 503 while draining.
    pub fn readyz(&self) -> Response<Body> {
        if self.draining.load(Ordering::SeqCst) {
            return serve::error(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", "courier is draining");
        }
        if !self.d.context().store().writable() {
            return serve::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "storage_unavailable",
                "the store cannot write",
            );
        }
        // Which store keys are in use: the one sealing, every one configured, and every
        // one the data may still need (an old key can go once a rekey leaves it out).
        let keys = match self.d.context().store().keys_in_use() {
            Ok(k) => {
                let ids = |ids: &[crate::store::KeyId]| ids.iter().map(|id| id.to_string()).collect::<Vec<_>>();
                json!({
                    "sealing": k.sealing.map(|id| id.to_string()),
                    "configured": ids(&k.configured),
                    "in_data": ids(&k.in_data),
                })
            }
            Err(e) => return serve::error(StatusCode::SERVICE_UNAVAILABLE, e.code(), e.to_string()),
        };
        serve::json(StatusCode::OK, &json!({ "status": "ready", "store_keys": keys }))
    }

    /// `GET /metrics`: the Prometheus text.
    pub fn metrics(&self) -> Response<Body> {
        let d = &self.d;
        let counts = d.context().store().counts().unwrap_or_default();
        let in_flight = d.in_flight_count() as u64;
        let now = d.context().clock().now_ms();
        let oldest = d
            .context()
            .store()
            .oldest_open_ms()
            .ok()
            .flatten()
            .map_or(0.0, |ms| now.saturating_sub(ms) as f64 / 1000.0);
        let gauges = Gauges {
            pending: counts.open.saturating_sub(in_flight),
            in_flight,
            oldest_pending_seconds: oldest,
            dead_stored: counts.dead,
            endpoints_paused: d.context().endpoints().paused_count(),
            circuit_open_hosts: d
                .hosts()
                .snapshot(true)
                .into_iter()
                .filter(|h| matches!(h.state, CircuitState::Open | CircuitState::Probing))
                .map(|h| h.host)
                .collect(),
            line_waiting: d.context().store().lined().unwrap_or_default(),
            fleet_up: d.fleet().map(|fleet| fleet.is_up()),
        };
        let text = d.context().metrics().render(&gauges);
        serve::text(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", text)
    }

    /// Handles one request on the ops listener: the three read-only routes, nothing else.
    pub async fn handle(self: Arc<Self>, _peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path();
        match (req.method(), path) {
            (&Method::GET | &Method::HEAD, "/healthz") => self.healthz(),
            // Both read the store (readiness writes a probe key): on a blocking thread.
            (&Method::GET | &Method::HEAD, "/readyz" | "/metrics") => {
                let readyz = path == "/readyz";
                tokio::task::spawn_blocking(move || if readyz { self.readyz() } else { self.metrics() })
                    .await
                    .unwrap_or_else(|_| {
                        serve::error(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "internal_error",
                            "the probe failed inside courier",
                        )
                    })
            }
            (_, "/healthz" | "/readyz" | "/metrics") => serve::error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{} is not allowed on {path}", req.method()),
            ),
            _ => serve::error(
                StatusCode::NOT_FOUND,
                "not_found",
                "the ops listener serves only /healthz, /readyz and /metrics; the admin API is on admin_listen",
            ),
        }
    }
}
