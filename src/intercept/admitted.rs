//! What an open tunnel was admitted under, checked again against the settings a reload puts
//! in place: a tunnel lives longer than the one decision that opened it, and a reload that
//! rotates a leaked `ingress_token` or narrows `[egress]` must reach it.
//!
//! - **The token**: the credential the `CONNECT` presented (kept as a SHA-256 digest) must
//!   still be `ingress_token`. The presented one, not the one configured when it was
//!   checked: a reload between the check and this record cannot then bless an old token.
//! - **The egress policy** (passthrough): the address courier connected to must still be
//!   allowed. Through `egress.proxy` to a name, courier never learns the address the proxy
//!   dialled: such a tunnel is revoked by any change of the policy.
//!
//! Pure: the caller reads the settings and closes the tunnel.

use std::net::IpAddr;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::context::settings::Settings;
use crate::inbound::serve::Refusal;
use crate::outbound::egress::{EgressDenied, EgressPolicy};

/// What a tunnel was admitted under.
#[derive(Debug, Clone)]
pub(super) struct Admitted {
    /// The digest of the token the `CONNECT` carried, if any.
    presented: Option<[u8; 32]>,
    /// For a passthrough tunnel: where it goes, and the policy that allowed it.
    dialled: Option<Dialled>,
}

#[derive(Debug, Clone)]
struct Dialled {
    /// The address checked and connected to; `None` when a proxy resolved it.
    address: Option<IpAddr>,
    policy: EgressPolicy,
}

/// Why a tunnel no longer stands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Revoked {
    /// `ingress_token` is no longer the token the tunnel was opened with.
    #[error("ingress_token is no longer the token this tunnel was opened with")]
    Token,
    /// The egress policy now refuses the tunnel's address.
    #[error("{0}")]
    Address(EgressDenied),
    /// The egress policy changed, and the address behind `egress.proxy` cannot be checked.
    #[error("[egress] changed and the address this tunnel reaches through egress.proxy cannot be checked again")]
    Unknown,
}

impl Admitted {
    /// A tunnel opened with `presented` (the token of its `Proxy-Authorization`, if any).
    pub(super) fn new(presented: Option<&str>) -> Admitted {
        Admitted {
            presented: presented.map(digest),
            dialled: None,
        }
    }

    /// The same, for a passthrough tunnel connected to `address` (`None`: through a proxy)
    /// under `policy`.
    pub(super) fn dialled(self, address: Option<IpAddr>, policy: &EgressPolicy) -> Admitted {
        let dialled = Some(Dialled {
            address,
            policy: policy.clone(),
        });
        Admitted { dialled, ..self }
    }

    /// Whether `settings` still admit the tunnel.
    pub(super) fn check(&self, settings: &Settings) -> Result<(), Revoked> {
        if let Some(token) = &settings.config.ingress_token {
            let matches = self
                .presented
                .is_some_and(|p| bool::from(p.ct_eq(&digest(token.expose()))));
            if !matches {
                return Err(Revoked::Token);
            }
        }
        match &self.dialled {
            Some(d) if d.policy != settings.egress => match d.address {
                Some(ip) => settings.egress.check(ip).map_err(Revoked::Address),
                None => Err(Revoked::Unknown),
            },
            _ => Ok(()),
        }
    }
}

impl Revoked {
    /// The answer to a request inside a revoked tunnel.
    pub(super) fn refusal(&self) -> Refusal {
        let message = format!("{self}: open a new tunnel (CONNECT) with the current settings");
        match self {
            Revoked::Token => Refusal::new(http::StatusCode::UNAUTHORIZED, "unauthorized", message),
            _ => Refusal::new(http::StatusCode::FORBIDDEN, "egress_denied", message),
        }
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn settings(toml: &str) -> Settings {
        Settings::new(Arc::new(crate::config::Config::from_toml_str(toml, "t").unwrap()))
    }

    #[test]
    fn a_tunnel_stands_while_its_token_is_the_one_in_force() {
        let old = settings("ingress_token = \"old\"\n");
        let new = settings("ingress_token = \"new\"\n");
        let none = settings("");
        let tunnel = Admitted::new(Some("old"));
        assert_eq!(tunnel.check(&old), Ok(()));
        assert_eq!(tunnel.check(&new), Err(Revoked::Token));
        assert_eq!(tunnel.check(&none), Ok(()), "no token needed any more");
        // Opened without a token while none was needed: revoked once one is.
        let bare = Admitted::new(None);
        assert_eq!(bare.check(&none), Ok(()));
        assert_eq!(bare.check(&old), Err(Revoked::Token));
        assert_eq!(Revoked::Token.refusal().code(), "unauthorized");
    }

    #[test]
    fn a_passthrough_stands_while_the_policy_allows_its_address() {
        let open = settings("[egress]\nallow_private_targets = true\n");
        let narrowed = settings("");
        let listed = settings("[egress]\nallow = [\"127.0.0.0/8\"]\n");
        let loopback = IpAddr::from([127, 0, 0, 1]);
        let direct = Admitted::new(None).dialled(Some(loopback), &open.egress);
        assert_eq!(direct.check(&open), Ok(()));
        assert!(matches!(direct.check(&narrowed), Err(Revoked::Address(d)) if d.ip == loopback));
        assert_eq!(direct.check(&listed), Ok(()), "changed, but still allowed");
        // Through a proxy: any change revokes, no change keeps it.
        let proxied = Admitted::new(None).dialled(None, &open.egress);
        assert_eq!(proxied.check(&open), Ok(()));
        assert_eq!(proxied.check(&listed), Err(Revoked::Unknown));
        assert_eq!(Revoked::Unknown.refusal().code(), "egress_denied");
    }
}
