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
//! Layers, from the ground up (a module uses only modules of the layers below its own):
//! 1. The vocabulary, no I/O of its own: [`model`], [`target`], [`clock`] (the clock and
//!    randomness seams), [`timefmt`], [`redact`], [`scrub`] (what a message sent, taken out
//!    of the error text kept about it), [`batcher`] (a thread that handles queued
//!    jobs in batches), [`sys`] (file descriptors, delivery's runtime, the heap allocator
//!    and its trimming, the scheduler's wake-up).
//! 2. [`policy`] (everything decided after an attempt, pure), [`signing`] (outbound
//!    signatures and the drain receipt, pure), [`store`] (RocksDB).
//! 3. [`config`] (the typed settings), [`metrics`], [`limits`] (per-host and per-endpoint
//!    caps), [`envelope`] (a request made into the first stored record), [`retention`].
//! 4. [`headers`] (the `Courier-*` control headers), [`outbound`] (the HTTP client, egress
//!    policy, TLS, proxies), [`fleet`] (fleet-wide limits on Redis).
//! 5. [`context`] (what the components share: store, clock, metrics, the reloadable
//!    settings, endpoint state, the scheduler's wake-up), [`args`] (the flags and config
//!    every command loads).
//! 6. [`delivery`] (attempts), [`endpoint_page`], [`operator`] (the operator commands).
//! 7. [`scheduler`], [`inbound`] (listeners, access rules, ingress), [`reload`].
//! 8. [`drain`] (the hand-off to another courier at scale-down), [`ops`] (probes and
//!    metrics), [`ui`], [`intercept`] (HTTPS interception: the CA and the tunnels).
//! 9. [`admin`]; 10. [`app`] (the wiring); 11. [`cli`].

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
pub mod intercept;
#[cfg(test)]
mod layers_tests;
pub mod limits;
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
pub mod scrub;
pub mod signing;
#[cfg(test)]
mod sim;
pub mod store;
pub mod sys;
pub mod target;
pub mod timefmt;
pub mod ui;
