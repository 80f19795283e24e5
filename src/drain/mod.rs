//! Hand-off at scale-down: `courier drain --to <URL>` forwards every open message of a
//! courier's data dir to another courier's ingress, so a replica that goes away (its
//! `emptyDir` with it, or its volume left behind by a StatefulSet that scaled down) does
//! not take undelivered messages with it.
//!
//! # The idea
//!
//! A hand-off is an ordinary accept at the peer: the message goes to the peer's ingress as
//! the app sent it, with its event id in `webhook-id` and what this courier's ingress
//! decided in control headers ([`request`]). The peer stores it durably, answers 202, and
//! delivers it with its own retries. Only then is the message marked `handed_off` here
//! ([`crate::store::Store::hand_off`]), a terminal state kept for `retention` and counted by
//! `courier_handed_off_total`. So at every moment each message is pending here, or held by
//! the peer, or both — never neither:
//! - a drain killed at any point leaves every message pending or handed off; running it
//!   again forwards what is still pending;
//! - "both" happens when the peer's 202 was lost (or the hand-off write was): the next drain
//!   forwards the message again, and the peer's dedupe on event id and target (kept as long
//!   as the peer keeps the message: until `retention` after delivery) answers it as a
//!   duplicate, which counts as handed off. The receiver sees the message once.
//!
//! # Two ways to run
//!
//! The same pass ([`engine`]) runs either in the verb's own process, on the data dir of a
//! stopped courier, or inside the running courier that owns the data dir, which the verb
//! asks through the admin API ([`control`], `POST /drain`); RocksDB's lock on the data dir
//! tells which ([`verb`]). A running courier first stops attempting and lets the attempts
//! in flight finish, so no message is forwarded while an attempt holds it.
//!
//! # Where to, and what counts
//!
//! A running courier drains only to a peer of its config (`[drain] to`, `[drain] peers`):
//! `POST /drain` refuses any other before anything changes ([`control`]). A peer proves it
//! stored each message with a `Courier-Receipt` made from its `ingress_token`, which a drain
//! with `[drain] token` checks ([`receipt`], [`answer`]); without a token only an https peer
//! is believed on its 202. The offline verb may name any `--to`; an unlisted one is under
//! the `[egress]` policy ([`peer_transport`]).
//!
//! # What goes, and what stays
//!
//! [`eligible`] decides: pending messages (waiting for a retry, held by a paused endpoint,
//! waiting in an ordered line, walked head first so the peer accepts the line in its order)
//! go; in-flight ones wait for their result; dead letters stay (replay them first). A
//! message the peer refuses (a 4xx, e.g. `413 body_too_large`) stays pending here and is
//! reported; a busy or unreachable peer is retried with backoff ([`answer`]); a peer that
//! is not a courier, a wrong token, or a peer that stays down stops the drain.
//!
//! [`progress`] is the count, rate and remaining shown on stderr and by `GET /drain`.

pub mod answer;
pub mod control;
pub mod eligible;
pub mod engine;
pub mod progress;
pub mod receipt;
pub mod request;
pub mod verb;

use std::sync::Arc;

pub use control::DrainControl;
pub use verb::DrainArgs;

use crate::config::Config;
use crate::outbound::client::{ClientSettings, HttpTransport};
use crate::outbound::egress::EgressPolicy;
use crate::outbound::resolver::SystemResolver;
use crate::outbound::tls::{TlsHandle, TlsMaterial};
use crate::outbound::transport::Transport;

/// Most of a peer's answer kept (its JSON is a few hundred bytes).
const PEER_ANSWER_BYTES: usize = 16 << 10;

/// The HTTP client for the peer: courier's own ([`HttpTransport`]), with a pool as large as
/// the forwards running at once, the TLS trust of `[tls]` (a tier behind https with a
/// private CA), and never the egress proxy (the tier is the operator's own). A peer listed
/// in `[drain] to` / `peers` (`listed`) is the operator's explicit choice, typically on a
/// private address: the egress policy is open for it; any other peer (the offline verb's
/// `--to`) is under `[egress]`, as a delivery is. Fails when a PEM file of the config no
/// longer loads.
///
/// It reads the PEM files: call it off the async workers ([`peer_transport_blocking`]).
pub fn peer_transport(config: &Config, concurrency: u32, listed: bool) -> Result<Arc<dyn Transport>, String> {
    let tls = TlsHandle::new(TlsMaterial::from_config(config).map_err(|e| e.to_string())?);
    let policy = if listed {
        EgressPolicy::new(true, Vec::new())
    } else {
        EgressPolicy::new(config.egress.allow_private_targets, config.egress.allow.clone())
    };
    Ok(Arc::new(HttpTransport::new(
        ClientSettings {
            connect_timeout: config.delivery.connect_timeout,
            max_response_body: PEER_ANSWER_BYTES,
            pool_max_idle_per_host: concurrency as usize,
            idle_timeout: config.delivery.idle_connection_timeout,
            max_idle_connections: concurrency as usize,
        },
        policy,
        Arc::new(SystemResolver),
        tls,
        None,
    )))
}

/// [`peer_transport`] on a blocking thread: it reads PEM files, which must not stall an
/// async worker (the running courier's ingress and admin API share them).
pub async fn peer_transport_blocking(
    config: Arc<Config>,
    concurrency: u32,
    listed: bool,
) -> Result<Arc<dyn Transport>, String> {
    tokio::task::spawn_blocking(move || peer_transport(&config, concurrency, listed))
        .await
        .unwrap_or_else(|e| Err(format!("making the peer client failed: {e}")))
}
