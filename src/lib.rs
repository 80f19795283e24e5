//! courier: a durable webhook delivery sidecar.
//!
//! The data path:
//!
//! ```text
//!  app ─POST─▶ ingress ─accept (WAL synced)─▶ store ◀─due/claim─ scheduler ─▶ delivery workers
//!                │ 202                          ▲                  ▲ sleep until next due      │
//!                └──────────── wake ────────────┼──────────────────┘                           │
//!                                               │  record attempt / reschedule / dead-letter   ▼
//!                                               └────────── policy::decide ◀─ outcome ◀─ transport
//!                                                           (classify, backoff,          (client, egress
//!                                                            retry-after, give-up)        check, TLS)
//!                                                                                 ▲
//!                                                             signing::sign ──────┘ fresh timestamp each attempt
//!  admin ─reads─▶ store stats, metrics         retention ─sweeps─▶ store
//! ```
//!
//! Layers (a module uses only modules above it in this list):
//! 1. Pure, no I/O: [`inbound::access`], [`model`], [`target`], [`headers`], [`outbound::egress`],
//!    [`policy`], [`signing`], [`timefmt`], [`redact`], `store::keys`,
//!    `store::codec`, [`config::units`].
//! 2. Seams: [`clock`], [`outbound::transport`], [`outbound::resolver`], [`config`].
//! 3. I/O: [`batcher`], [`store`], [`outbound`] (TLS, proxies, the pooled client), [`inbound::serve`],
//!    [`inbound::uds`], [`fleet`] (Redis), [`sys`] (file descriptors, CPU priority, heap trimming).
//! 4. Components: [`context`] (what they all share: store, clock, metrics, the reloadable
//!    settings, endpoint state, the scheduler's wake-up), [`envelope`] (a request made into
//!    the first stored record), [`inbound::ingress`],
//!    [`scheduler`], [`delivery`], [`ops`], [`admin`], [`ui`], [`retention`], [`metrics`],
//!    [`endpoint_page`].
//! 5. Wiring: [`app`], [`args`] (the flags and config every command loads), [`cli`] (with
//!    `cli::keys`), [`operator`], [`reload`], [`drain`] (the hand-off to another
//!    courier at scale-down: its pure parts are `drain::{plan, request, answer}`).

#![warn(missing_docs)]
// Test code measures real time and draws fresh randomness freely (see `clock`).
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod admin;
pub mod app;
pub mod args;
pub mod batcher;
pub mod cli;
pub mod clock;
pub mod config;
pub mod context;
pub mod delivery;
pub mod drain;
pub mod endpoint_page;
pub mod envelope;
pub mod fleet;
pub mod headers;
pub mod inbound;
pub mod metrics;
pub mod model;
pub mod operator;
pub mod ops;
pub mod outbound;
pub mod policy;
pub mod redact;
pub mod reload;
pub mod retention;
pub mod scheduler;
pub mod signing;
#[cfg(test)]
mod sim;
pub mod store;
pub mod sys;
pub mod target;
pub mod timefmt;
pub mod ui;
