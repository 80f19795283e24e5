//! `[ingress]` ([`IngressConfig`]) and `[admin]` ([`ListenerAccess`]): who may reach a
//! listener besides server-side clients on loopback names, and the limits that keep one
//! caller from holding a listener (idle connections, bodies held by accepts in progress).

use std::time::Duration;

use serde::Deserialize;

use super::de::{self, Dur, HostEntry, Origin, Size};

/// Default `idle_timeout`: a connection with no request in progress this long is closed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

section! {
    /// Who may reach the admin listener besides server-side clients on loopback names
    /// (`[admin]`), and how long an idle connection is kept.
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct ListenerAccess {
        /// Origins whose web pages may send requests, as ASCII origin serializations
        /// (`https://app.example`, `http://localhost:3000`): lowercase, no path, default port
        /// omitted.
        #[serde(deserialize_with = "de::list::<Origin, _>")]
        pub allowed_origins: Vec<String> = Vec::new(),
        /// Extra names the `Host` header may carry (`name` or `name:port`, `[v6]:port`),
        /// lowercase, without a trailing dot.
        #[serde(deserialize_with = "de::list::<HostEntry, _>")]
        pub hosts: Vec<String> = Vec::new(),
        /// A connection (HTTP/1.1 or HTTP/2) with no request in progress this long is closed
        /// (HTTP/2: GOAWAY), so idle clients cannot hold every connection slot.
        #[serde(deserialize_with = "de::one::<Dur, _>")]
        pub idle_timeout: Duration = DEFAULT_IDLE_TIMEOUT,
    }
}

section! {
    /// `[ingress]`: the keys of [`ListenerAccess`] plus ingress's own.
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct IngressConfig {
        /// As [`ListenerAccess::allowed_origins`].
        #[serde(deserialize_with = "de::list::<Origin, _>")]
        pub allowed_origins: Vec<String> = Vec::new(),
        /// As [`ListenerAccess::hosts`] (TCP only: a Unix socket serves any `Host`).
        #[serde(deserialize_with = "de::list::<HostEntry, _>")]
        pub hosts: Vec<String> = Vec::new(),
        /// As [`ListenerAccess::idle_timeout`].
        #[serde(deserialize_with = "de::one::<Dur, _>")]
        pub idle_timeout: Duration = DEFAULT_IDLE_TIMEOUT,
        /// Bytes of request bodies that accepts in progress may hold at once, detached ones
        /// (whose sender left before the 202) included: taken before a body is read (its
        /// `Content-Length`, else `max_body`) and given back when its commit is answered.
        #[serde(deserialize_with = "de::one::<Size, _>")]
        pub max_pending_bytes: u64 = 64 << 20,
        /// Accept origin-form `GET`/`HEAD` requests that carry no `Courier-*` header and no
        /// token: a web page can send those without any browser marking them (an `<img>`).
        pub allow_get: bool = false,
    }
}
