//! The way in: who may talk to courier ([`access`]), the one HTTP accept loop ingress and
//! admin share ([`serve`]) and the deadlines that end its connections ([`progress`]), ingress's Unix socket file ([`uds`]), and [`ingress`] itself,
//! where the app's webhooks are checked and made durable.

pub mod access;
pub mod ingress;
mod progress;
pub mod serve;
mod signing_choice;
pub mod uds;
