//! Making a CA: a root the apps trust, and a name-constrained intermediate it signs, whose
//! key signs the leaves. The root's key signs that one certificate and is dropped: it is
//! never written anywhere.
//!
//! Why two certificates: RFC 5280 makes processing the name constraints of a trust anchor
//! optional (§6.1.1 (d) takes the anchor's name and key only), and some validators skip
//! them (Java's default trust manager does), while every validator must apply those of an
//! intermediate (§6.1.4 (g)). So the constraints that bind are the intermediate's; the
//! root carries the same ones for the validators that read them anyway.
//!
//! A DNS constraint covers the name and every name under it (RFC 5280 §4.2.1.10); an IP
//! constraint is the one address. Where no name (or no address of a family) is listed, a
//! constraint that matches nothing useful (`invalid`, `0.0.0.0/32`, `::/128`) is put in its
//! place: with no constraint of a type, that type is not constrained at all.

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, CidrSubnet, DnType, GeneralSubtree, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, NameConstraints,
};

use super::{CaError, SKEW};
use crate::config::HostPattern;

/// How long a CA courier makes is valid (the root and its intermediate alike).
const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 86_400);

/// A CA just made: the root (its key already gone), and the intermediate with its key.
pub(super) struct Made {
    pub root: Certificate,
    pub intermediate: Certificate,
    pub intermediate_params: CertificateParams,
    pub key: KeyPair,
}

/// Makes a root and an intermediate, both constrained to `hosts`, valid from `now`.
pub(super) fn make(hosts: &[HostPattern], now: SystemTime) -> Result<Made, CaError> {
    fn failed(what: &'static str) -> impl Fn(rcgen::Error) -> CaError {
        move |e| CaError::Invalid(format!("making {what}: {e}"))
    }
    let root_key = KeyPair::generate().map_err(failed("a key"))?;
    // Path length 1: the intermediate, then leaves.
    let root_params = ca_params(hosts, now, "courier intercept CA", 1);
    let root = root_params
        .self_signed(&root_key)
        .map_err(failed("the root certificate"))?;
    let root_issuer = Issuer::new(root_params, root_key);
    let key = KeyPair::generate().map_err(failed("a key"))?;
    let mut intermediate_params = ca_params(hosts, now, "courier intercept issuer", 0);
    intermediate_params.use_authority_key_identifier_extension = true;
    let intermediate = intermediate_params
        .signed_by(&key, &root_issuer)
        .map_err(failed("the intermediate certificate"))?;
    // The root's key signs nothing else: dropped here, never serialized.
    drop(root_issuer);
    Ok(Made {
        root,
        intermediate,
        intermediate_params,
        key,
    })
}

/// A CA named `name` for `hosts` that may have `path_len` CAs below it, constrained to the
/// hosts' names.
fn ca_params(hosts: &[HostPattern], now: SystemTime, name: &str, path_len: u8) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, name);
    params.distinguished_name.push(DnType::OrganizationName, "courier");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(path_len));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = (now - SKEW).into();
    params.not_after = (now + CA_LIFETIME).into();
    params.name_constraints = Some(NameConstraints {
        permitted_subtrees: permitted(hosts),
        excluded_subtrees: Vec::new(),
    });
    params
}

/// The permitted subtrees for `hosts`, with a placeholder for each type none of them has.
fn permitted(hosts: &[HostPattern]) -> Vec<GeneralSubtree> {
    let mut trees = Vec::new();
    let (mut dns, mut v4, mut v6) = (false, false, false);
    for pattern in hosts {
        match pattern {
            HostPattern::Name(name) | HostPattern::Under(name) => {
                dns = true;
                trees.push(GeneralSubtree::DnsName(name.clone()));
            }
            HostPattern::Ip(IpAddr::V4(ip)) => {
                v4 = true;
                trees.push(GeneralSubtree::IpAddress(CidrSubnet::V4(ip.octets(), [255; 4])));
            }
            HostPattern::Ip(IpAddr::V6(ip)) => {
                v6 = true;
                trees.push(GeneralSubtree::IpAddress(CidrSubnet::V6(ip.octets(), [255; 16])));
            }
            HostPattern::Any => {}
        }
    }
    if !dns {
        trees.push(GeneralSubtree::DnsName("invalid".to_string()));
    }
    if !v4 {
        trees.push(GeneralSubtree::IpAddress(CidrSubnet::V4([0; 4], [255; 4])));
    }
    if !v6 {
        trees.push(GeneralSubtree::IpAddress(CidrSubnet::V6([0; 16], [255; 16])));
    }
    trees
}
