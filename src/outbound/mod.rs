//! Outbound HTTP: everything between a delivery worker's request and the receiver's answer.
//!
//! - [`transport`]: the seam a worker sends through; [`client`] is the real one, a pooled
//!   hyper-util client.
//! - [`resolver`]: the DNS seam, and [`egress`]: which addresses courier may connect to (pure).
//! - [`proxy`]: each connection's route, direct or through `egress.proxy`; [`tls`]: TLS toward
//!   receivers; [`conn_cap`]: the cap on idle pooled connections, and [`sweep`]: the pool timer it
//!   fires when it has closed some.
//! - [`trace`]: W3C Trace Context carried through to the receiver.

/// The error of a connector or resolver step: whatever it is, kept as the cause an attempt's
/// error names.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub mod client;
pub mod conn_cap;
pub mod egress;
pub mod proxy;
pub mod resolver;
pub mod sweep;
pub mod tls;
pub mod trace;
pub mod transport;
