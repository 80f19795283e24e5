//! The process's share of the machine: file descriptors ([`fds`]), delivery's CPU priority
//! over ingress ([`priority`]), and freed heap given back when delivery goes idle ([`trim`]).

pub mod fds;
pub mod priority;
pub mod trim;
