//! `[egress]` ([`EgressConfig`]): the openings in the egress policy. CONTRACT §6 also
//! spells both settings at the top level (`allow_private_targets`, `egress_allow`); `shape`
//! moves those into this section before it is read.

use ipnet::IpNet;
use serde::Deserialize;

use super::de::{self, Net};
use super::proxy::{EgressProxy, NoProxy, Proxy};

/// Egress policy openings (`[egress]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EgressConfig {
    /// Allow every non-global address (loopback, private, link-local, ...).
    pub allow_private_targets: bool,
    /// Networks allowed even though they are not global.
    #[serde(deserialize_with = "de::list::<Net, _>")]
    pub allow: Vec<IpNet>,
    /// `egress.proxy`: the HTTP proxy every attempt goes through (credentials hidden).
    #[serde(deserialize_with = "de::opt::<Proxy, _>")]
    pub proxy: Option<EgressProxy>,
    /// `egress.no_proxy`: hosts, domain suffixes and networks reached directly.
    #[serde(deserialize_with = "de::list::<NoProxy, _>")]
    pub no_proxy: Vec<String>,
}
