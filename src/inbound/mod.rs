//! The way in: who may talk to courier ([`access`]), the one HTTP accept loop ingress and
//! admin share ([`serve`]), ingress's Unix socket file ([`uds`]), and [`ingress`] itself,
//! where the app's webhooks are checked and made durable.

pub mod access;
pub mod ingress;
pub mod serve;
mod signing_choice;
pub mod uds;
