//! `[ingress]` and `[admin]` ([`ListenerAccess`]): who may reach a listener besides
//! server-side clients on loopback names.

use serde::Deserialize;

use super::de::{self, HostEntry, Origin};

/// Who may reach a listener besides server-side clients on loopback names (`[ingress]`,
/// `[admin]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListenerAccess {
    /// Origins whose web pages may send requests, as ASCII origin serializations
    /// (`https://app.example`, `http://localhost:3000`): lowercase, no path, default port
    /// omitted.
    #[serde(deserialize_with = "de::list::<Origin, _>")]
    pub allowed_origins: Vec<String>,
    /// Extra names the `Host` header may carry (`name` or `name:port`, `[v6]:port`),
    /// lowercase, without a trailing dot.
    #[serde(deserialize_with = "de::list::<HostEntry, _>")]
    pub hosts: Vec<String>,
}
