//! Black-box tests: the real `courier` binary on ephemeral ports, real local receivers.
//! One test binary (modules below) so the suite links once.

// Tests measure real time and draw fresh randomness freely; `clippy.toml` guards courier's own code.
#![allow(clippy::disallowed_methods)]

mod support;
mod support_drain;
mod support_redis;
mod support_tls;

mod admin;
mod adoption;
mod chaos;
mod circuit;
mod cli;
mod client_limits;
mod dashboard;
mod delivery;
mod docs;
mod drain;
mod fleet;
mod h2c;
mod hardening;
mod ingress;
mod ingress_limits;
mod intercept;
mod lifecycle;
mod lockout;
mod logging;
mod metrics;
mod ordering;
mod policy;
mod power_loss;
mod proxy;
mod quickstart;
mod reload;
mod responsive;
mod sealing;
mod security;
mod setup_script;
mod signing_ed25519;
mod store_check;
mod store_format;
mod stored_secrets;
mod tls;
mod trace_context;
mod uds;
mod ui;
