//! `[delivery]` ([`DeliveryConfig`]): the limits of every attempt and of the connection pool.

use std::time::Duration;

use serde::Deserialize;

use super::de::{self, Dur, Size};

section! {
    /// Attempt limits (`[delivery]`).
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct DeliveryConfig {
        /// Per-attempt TCP + TLS connect timeout.
        pub connect_timeout: Duration ["de::one::<Dur, _>"] = Duration::from_secs(10),
        /// Whole-attempt timeout.
        pub request_timeout: Duration ["de::one::<Dur, _>"] = Duration::from_secs(30),
        /// Attempts in flight at once, all hosts together: bounds memory and sockets after an
        /// outage, when every host's backlog comes due at once.
        pub max_in_flight: u32 = 1024,
        /// Attempts in flight to one `host:port`, unless a `[[host]]` overrides it.
        pub max_in_flight_per_host: u32 = 10,
        /// Attempts per second per endpoint, unless an `[[endpoint]]` overrides it.
        pub rate_per_second: u32 = 100,
        /// Consecutive permanent failures that pause an endpoint.
        pub pause_after_permanent_failures: u32 = 100,
        /// Bytes of a response body kept.
        pub max_response_body: u64 ["de::one::<Size, _>"] = 64 << 10,
        /// How long a pooled connection may sit idle before it is closed.
        pub idle_connection_timeout: Duration ["de::one::<Dur, _>"] = Duration::from_secs(90),
        /// Idle pooled connections kept open, all hosts together: past it, those of the hosts
        /// used least recently are closed, so a sweep over many receivers does not leave a
        /// socket open to each of them until `idle_connection_timeout`.
        // Default as many as may be in flight: a sweep over a thousand receivers (a SaaS
        // sending each customer's webhooks to its own URL) reuses its connections instead of
        // connecting (and, over TLS, handshaking) for every message; measured on the
        // 1,000-host benchmark, 256 made delivery 0.50x of one host's rate, 1,024 0.79x. The
        // cost is a descriptor (lowered at start to fit the descriptor limit) and tens of KiB
        // of buffers per connection.
        pub max_idle_connections: u32 = 1024,
    }
}
