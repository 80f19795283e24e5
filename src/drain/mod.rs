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
//! # One engine, one front
//!
//! The front ([`front`]) takes one request ([`plan`]: the `POST /drain` body and the verb's
//! flags are the same struct, checked the same way, with the guard on where a drain may
//! send) through the admin API or the CLI. The engine is one forwarding pass ([`engine`]),
//! run either by the verb on the data dir of a stopped courier, or by the running courier
//! that owns the data dir once it has stopped attempting ([`DrainControl`]). The peer proves
//! what it stored ([`answer`], with the peer's [`crate::signing::receipt`]); [`progress`] is what either run shows.

pub mod answer;
pub mod engine;
pub mod front;
pub mod plan;
pub mod progress;
pub mod request;

pub use front::{run, DrainControl};
/// `courier drain`'s flags: the `POST /drain` body.
pub use plan::DrainRequest as DrainArgs;
