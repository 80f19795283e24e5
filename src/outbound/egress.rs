//! Which addresses courier may connect to (CONTRACT §6). Pure: the client calls
//! [`EgressPolicy::check`] on every address DNS gave it, right before connecting, and ingress
//! calls it on IP-literal targets so those are refused with a 403 before they are stored.
//!
//! The rule is "globally routable unicast only, unless the operator opens more". IPv6 forms
//! that carry an IPv4 address (IPv4-mapped, IPv4-compatible, NAT64, 6to4) are judged by the
//! IPv4 address inside them, because that is where the packets end up: `::ffff:127.0.0.1`
//! and `64:ff9b::a9fe:a9fe` are loopback and the cloud metadata service in disguise.
//! Everything in IPv6 outside 2000::/3 (global unicast) is refused, which also covers
//! prefixes assigned after this was written.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// The decision of the egress policy for one process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    allow_private_targets: bool,
    allow: Vec<IpNet>,
}

/// An address the policy refuses, with why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the target address {ip} is not allowed ({reason} address); an operator can open it with \
     egress.allow or egress.allow_private_targets"
)]
pub struct EgressDenied {
    /// The refused address.
    pub ip: IpAddr,
    /// Why it is not globally routable (`loopback`, `private`, `link_local`, `metadata`, ...).
    pub reason: &'static str,
}

impl EgressPolicy {
    /// A policy that allows globally routable addresses, plus everything when
    /// `allow_private_targets`, plus every address inside one of the `allow` networks.
    pub fn new(allow_private_targets: bool, allow: Vec<IpNet>) -> Self {
        EgressPolicy {
            allow_private_targets,
            allow,
        }
    }

    /// The policy `[egress]` sets.
    pub fn from_config(config: &crate::config::Config) -> Self {
        EgressPolicy::new(config.egress.allow_private_targets, config.egress.allow.clone())
    }

    /// Whether courier may connect to `ip`.
    pub fn check(&self, ip: IpAddr) -> Result<(), EgressDenied> {
        if self.allow_private_targets {
            return Ok(());
        }
        let Some(reason) = non_global_reason(ip) else {
            return Ok(());
        };
        if self.allow.iter().any(|net| allow_contains(net, ip)) {
            return Ok(());
        }
        Err(EgressDenied { ip, reason })
    }

    /// Checks `url`'s address when it is known without a DNS lookup: an IP literal, or a
    /// loopback name (allowed when either loopback address it stands for is). Any other name
    /// passes here and is checked after resolution, at delivery. The error is the message.
    pub fn check_without_dns(&self, url: &url::Url) -> Result<(), String> {
        match url.host() {
            Some(url::Host::Domain(d)) if is_loopback_name(d) => {
                if LOOPBACK_NAME_ADDRS.iter().any(|ip| self.check(*ip).is_ok()) {
                    return Ok(());
                }
                Err(format!(
                    "the target host {d} is a loopback name; an operator can open it with egress.allow \
                     (127.0.0.1/32 or ::1/128) or egress.allow_private_targets"
                ))
            }
            _ => literal_ip(url).map_or(Ok(()), |ip| self.check(ip).map_err(|e| e.to_string())),
        }
    }
}

/// An operator who writes `127.0.0.1/32` means the IPv4-mapped spelling too (a dual-stack
/// resolver may hand back either), and `::ffff:10.0.0.0/104` means the plain IPv4 one.
fn allow_contains(net: &IpNet, ip: IpAddr) -> bool {
    if net.contains(&ip) {
        return true;
    }
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some_and(|v4| net.contains(&IpAddr::V4(v4))),
        IpAddr::V4(v4) => net.contains(&IpAddr::V6(v4.to_ipv6_mapped())),
    }
}

/// Why `ip` is not a globally routable unicast address, or `None` if it is.
pub fn non_global_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_reason(v4),
        IpAddr::V6(v6) => v6_reason(v6),
    }
}

/// The target's host when it is an IP literal (after `url`'s normalisation, so `127.1`
/// and `2130706433` are literals too); `None` for a DNS name.
pub fn literal_ip(url: &url::Url) -> Option<IpAddr> {
    match url.host()? {
        url::Host::Ipv4(v4) => Some(IpAddr::V4(v4)),
        url::Host::Ipv6(v6) => Some(IpAddr::V6(v6)),
        url::Host::Domain(_) => None,
    }
}

/// The host of `uri` when it is an IP literal (an IPv6 one without its brackets). For a
/// target as courier stores it, normalised by `url` at ingest, this is the address
/// [`literal_ip`] finds: each attempt checks it without parsing the URL again.
pub fn uri_literal_ip(uri: &http::Uri) -> Option<IpAddr> {
    let host = uri.host()?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    host.parse().ok()
}

/// Whether `host` is a loopback name by definition (RFC 6761 §6.3): `localhost`, and every
/// name under `.localhost`, with or without the trailing dot, in any case. Such a name never
/// needs DNS: it is loopback wherever it is resolved.
pub fn is_loopback_name(host: &str) -> bool {
    // Bytes, not chars: a Host header may carry non-ASCII bytes, and slicing a str inside a
    // multi-byte character would panic.
    let h = host.strip_suffix('.').unwrap_or(host).as_bytes();
    const SUFFIX: &[u8] = b".localhost";
    h.eq_ignore_ascii_case(b"localhost")
        || (h.len() > SUFFIX.len() && h[h.len() - SUFFIX.len()..].eq_ignore_ascii_case(SUFFIX))
}

/// The addresses a loopback name stands for.
pub const LOOPBACK_NAME_ADDRS: [IpAddr; 2] = [IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V6(Ipv6Addr::LOCALHOST)];

/// IPv4 special-purpose blocks (IANA registry), most specific first.
const V4_BLOCKS: &[([u8; 4], u8, &str)] = &[
    ([255, 255, 255, 255], 32, "broadcast"),
    ([169, 254, 169, 254], 32, "metadata"),
    ([100, 100, 100, 200], 32, "metadata"),
    ([0, 0, 0, 0], 8, "unspecified"),
    ([10, 0, 0, 0], 8, "private"),
    ([172, 16, 0, 0], 12, "private"),
    ([192, 168, 0, 0], 16, "private"),
    ([100, 64, 0, 0], 10, "cgnat"),
    ([127, 0, 0, 0], 8, "loopback"),
    ([169, 254, 0, 0], 16, "link_local"),
    ([192, 0, 0, 0], 24, "ietf_protocol"),
    ([192, 0, 2, 0], 24, "documentation"),
    ([198, 51, 100, 0], 24, "documentation"),
    ([203, 0, 113, 0], 24, "documentation"),
    ([192, 88, 99, 0], 24, "6to4_relay"),
    ([198, 18, 0, 0], 15, "benchmarking"),
    ([224, 0, 0, 0], 4, "multicast"),
    ([240, 0, 0, 0], 4, "reserved"),
];

fn v4_reason(ip: Ipv4Addr) -> Option<&'static str> {
    let n = u32::from(ip);
    V4_BLOCKS
        .iter()
        .find(|(net, len, _)| in_v4(n, u32::from_be_bytes(*net), *len))
        .map(|(_, _, reason)| *reason)
}

fn in_v4(n: u32, net: u32, len: u8) -> bool {
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    n & mask == net
}

fn in_v6(n: u128, net: [u16; 8], len: u8) -> bool {
    let net = u128::from(Ipv6Addr::from(net));
    let mask = if len == 0 { 0 } else { u128::MAX << (128 - len) };
    n & mask == net
}

/// Inside the IETF protocol block 2001::/23, the few assignments IANA lists as globally reachable.
const V6_GLOBAL_EXCEPTIONS: &[([u16; 8], u8)] = &[
    ([0x2001, 0x1, 0, 0, 0, 0, 0, 0x1], 128),  // port control protocol anycast
    ([0x2001, 0x1, 0, 0, 0, 0, 0, 0x2], 128),  // TURN anycast
    ([0x2001, 0x1, 0, 0, 0, 0, 0, 0x3], 128),  // DNS-SD service registration anycast
    ([0x2001, 0x3, 0, 0, 0, 0, 0, 0], 32),     // AMT
    ([0x2001, 0x4, 0x112, 0, 0, 0, 0, 0], 48), // AS112-v6
];

/// IPv6 blocks refused outright, most specific first.
const V6_BLOCKS: &[([u16; 8], u8, &str)] = &[
    ([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], 128, "metadata"),
    ([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, "teredo"),
    ([0x2001, 0x2, 0, 0, 0, 0, 0, 0], 48, "benchmarking"),
    ([0x2001, 0x10, 0, 0, 0, 0, 0, 0], 28, "orchid"),
    ([0x2001, 0x20, 0, 0, 0, 0, 0, 0], 28, "orchid"),
    ([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, "ietf_protocol"),
    ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, "documentation"),
    ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, "documentation"),
    ([0x0100, 0, 0, 0, 0, 0, 0, 0], 64, "discard"),
    ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "unique_local"),
    ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link_local"),
    ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "site_local"),
    ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast"),
];

fn v6_reason(ip: Ipv6Addr) -> Option<&'static str> {
    let n = u128::from(ip);
    let low32 = Ipv4Addr::from(n as u32);
    match n {
        0 => return Some("unspecified"),
        1 => return Some("loopback"),
        _ => {}
    }
    // IPv4-mapped, the deprecated IPv4-compatible form, and NAT64's well-known prefix.
    let v4_inside = [[0, 0, 0, 0, 0, 0xffff, 0, 0], [0; 8], [0x64, 0xff9b, 0, 0, 0, 0, 0, 0]];
    if v4_inside.iter().any(|net| in_v6(n, *net, 96)) {
        return v4_reason(low32);
    }
    if in_v6(n, [0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48) {
        // Local-use NAT64: the operator picks the prefix length. Only the common /96 layout
        // (zeros between the prefix and the IPv4) is decodable with confidence.
        let middle_zero = (n >> 32) & ((1u128 << 48) - 1) == 0;
        return if middle_zero {
            v4_reason(low32)
        } else {
            Some("nat64_local")
        };
    }
    if in_v6(n, [0x2002, 0, 0, 0, 0, 0, 0, 0], 16) {
        return v4_reason(Ipv4Addr::from((n >> 80) as u32));
    }
    if V6_GLOBAL_EXCEPTIONS.iter().any(|(net, len)| in_v6(n, *net, *len)) {
        return None;
    }
    if let Some((_, _, reason)) = V6_BLOCKS.iter().find(|(net, len, _)| in_v6(n, *net, *len)) {
        return Some(reason);
    }
    if !in_v6(n, [0x2000, 0, 0, 0, 0, 0, 0, 0], 3) {
        return Some("reserved");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// (address, expected reason; None = globally routable)
    const TABLE: &[(&str, Option<&str>)] = &[
        // IPv4 global
        ("8.8.8.8", None),
        ("1.1.1.1", None),
        ("93.184.216.34", None),
        ("9.255.255.255", None),
        ("11.0.0.0", None),
        ("100.63.255.255", None),
        ("100.128.0.0", None),
        ("126.255.255.255", None),
        ("128.0.0.0", None),
        ("169.253.255.255", None),
        ("169.255.0.0", None),
        ("172.15.255.255", None),
        ("172.32.0.0", None),
        ("192.0.1.0", None),
        ("192.0.3.0", None),
        ("192.167.255.255", None),
        ("192.169.0.0", None),
        ("198.17.255.255", None),
        ("198.20.0.0", None),
        ("223.255.255.255", None),
        // IPv4 refused
        ("0.0.0.0", Some("unspecified")),
        ("0.1.2.3", Some("unspecified")),
        ("127.0.0.1", Some("loopback")),
        ("127.255.255.254", Some("loopback")),
        ("10.0.0.1", Some("private")),
        ("10.255.255.255", Some("private")),
        ("172.16.0.1", Some("private")),
        ("172.31.255.255", Some("private")),
        ("192.168.1.1", Some("private")),
        ("100.64.0.1", Some("cgnat")),
        ("100.127.255.255", Some("cgnat")),
        ("100.100.100.200", Some("metadata")),
        ("169.254.169.254", Some("metadata")),
        ("169.254.0.1", Some("link_local")),
        ("169.254.169.253", Some("link_local")),
        ("192.0.0.1", Some("ietf_protocol")),
        ("192.0.0.170", Some("ietf_protocol")),
        ("192.0.2.1", Some("documentation")),
        ("198.51.100.7", Some("documentation")),
        ("203.0.113.255", Some("documentation")),
        ("192.88.99.1", Some("6to4_relay")),
        ("198.18.0.1", Some("benchmarking")),
        ("198.19.255.255", Some("benchmarking")),
        ("224.0.0.1", Some("multicast")),
        ("239.255.255.250", Some("multicast")),
        ("240.0.0.1", Some("reserved")),
        ("254.255.255.255", Some("reserved")),
        ("255.255.255.255", Some("broadcast")),
        // IPv6 global
        ("2001:4860:4860::8888", None),
        ("2606:4700:4700::1111", None),
        ("2a00:1450:4001:81c::200e", None),
        ("2001:200::1", None),
        ("3ffe::1", None),
        ("2001:1::1", None),
        ("2001:3::1", None),
        ("2001:4:112::1", None),
        // IPv6 refused
        ("::", Some("unspecified")),
        ("::1", Some("loopback")),
        ("fe80::1", Some("link_local")),
        ("febf:ffff::1", Some("link_local")),
        ("fec0::1", Some("site_local")),
        ("fc00::1", Some("unique_local")),
        ("fd12:3456:789a::1", Some("unique_local")),
        ("fd00:ec2::254", Some("metadata")),
        ("ff02::1", Some("multicast")),
        ("ff0e::1", Some("multicast")),
        ("2001:db8::1", Some("documentation")),
        ("3fff::1", Some("documentation")),
        ("100::1", Some("discard")),
        ("100::ffff:ffff:ffff:ffff", Some("discard")),
        ("100:0:0:1::1", Some("reserved")),
        ("2001::1", Some("teredo")),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", Some("teredo")),
        ("2001:2::1", Some("benchmarking")),
        ("2001:10::1", Some("orchid")),
        ("2001:20::1", Some("orchid")),
        ("2001:1::4", Some("ietf_protocol")),
        ("2001:5::1", Some("ietf_protocol")),
        ("5f00::1", Some("reserved")),
        ("4000::1", Some("reserved")),
        ("::2", Some("unspecified")),
        ("::ffff:0:0:1", Some("reserved")),
        // IPv4-mapped: judged by the IPv4 inside
        ("::ffff:8.8.8.8", None),
        ("::ffff:127.0.0.1", Some("loopback")),
        ("::ffff:10.1.2.3", Some("private")),
        ("::ffff:169.254.169.254", Some("metadata")),
        ("::ffff:0.0.0.0", Some("unspecified")),
        // IPv4-compatible
        ("::8.8.8.8", None),
        ("::127.0.0.1", Some("loopback")),
        ("::192.168.0.1", Some("private")),
        // NAT64 well-known prefix
        ("64:ff9b::808:808", None),
        ("64:ff9b::7f00:1", Some("loopback")),
        ("64:ff9b::a9fe:a9fe", Some("metadata")),
        ("64:ff9b::a00:1", Some("private")),
        // NAT64 local-use
        ("64:ff9b:1::808:808", None),
        ("64:ff9b:1::a00:1", Some("private")),
        ("64:ff9b:1:7f00:1::", Some("nat64_local")),
        // 6to4
        ("2002:808:808::1", None),
        ("2002:7f00:1::1", Some("loopback")),
        ("2002:a9fe:a9fe::", Some("metadata")),
        ("2002:c0a8:101::1", Some("private")),
    ];

    #[test]
    fn every_address_gets_its_verdict() {
        assert!(TABLE.len() >= 60);
        let policy = EgressPolicy::new(false, vec![]);
        for (addr, want) in TABLE {
            let got = non_global_reason(ip(addr));
            assert_eq!(got, *want, "{addr}");
            match want {
                None => assert_eq!(policy.check(ip(addr)), Ok(()), "{addr}"),
                Some(reason) => assert_eq!(
                    policy.check(ip(addr)),
                    Err(EgressDenied { ip: ip(addr), reason }),
                    "{addr}"
                ),
            }
        }
    }

    #[test]
    fn allow_private_targets_allows_everything() {
        let policy = EgressPolicy::new(true, vec![]);
        for (addr, _) in TABLE {
            assert_eq!(policy.check(ip(addr)), Ok(()), "{addr}");
        }
    }

    #[test]
    fn allow_list_opens_exactly_what_it_lists() {
        let nets = ["127.0.0.1/32", "10.1.0.0/16", "fd00:1::/64", "::ffff:192.168.7.0/120"];
        let policy = EgressPolicy::new(false, nets.iter().map(|n| n.parse().unwrap()).collect());
        let cases: &[(&str, bool)] = &[
            ("127.0.0.1", true),
            ("::ffff:127.0.0.1", true),
            ("127.0.0.2", false),
            ("127.0.0.0", false),
            ("::1", false),
            ("::127.0.0.1", false),
            ("64:ff9b::7f00:1", false),
            ("10.1.0.0", true),
            ("10.1.255.255", true),
            ("::ffff:10.1.2.3", true),
            ("10.0.255.255", false),
            ("10.2.0.0", false),
            ("fd00:1::1", true),
            ("fd00:1::ffff:ffff:ffff:ffff", true),
            ("fd00:1:0:1::1", false),
            ("fd00::1", false),
            ("192.168.7.9", true),
            ("::ffff:192.168.7.9", true),
            ("192.168.8.9", false),
            ("169.254.169.254", false),
            ("8.8.8.8", true),
        ];
        for (addr, allowed) in cases {
            assert_eq!(policy.check(ip(addr)).is_ok(), *allowed, "{addr}");
        }
    }

    #[test]
    fn denial_names_address_reason_and_remedy() {
        let err = EgressPolicy::default().check(ip("169.254.169.254")).unwrap_err();
        assert_eq!(err.reason, "metadata");
        let msg = err.to_string();
        assert!(
            msg.contains("169.254.169.254") && msg.contains("metadata") && msg.contains("egress.allow"),
            "{msg}"
        );
    }

    #[test]
    fn loopback_names_are_known_without_dns() {
        let closed = EgressPolicy::default();
        let check = |u: &str| closed.check_without_dns(&url::Url::parse(u).unwrap());
        for name in [
            "http://localhost/",
            "http://localhost./",
            "http://LOCALHOST:8080/",
            "http://api.localhost/",
            "http://a.b.localhost./x",
            "http://Foo.LocalHost/",
        ] {
            let e = check(name).unwrap_err();
            assert!(e.contains("is a loopback name"), "{name}: {e}");
        }
        assert!(
            !is_loopback_name("a\u{e9}localhost"),
            "no panic inside a multi-byte character"
        );
        assert!(!is_loopback_name("\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}"));
        assert!(is_loopback_name("\u{e9}.localhost"));
        for name in [
            "http://localhost.example/",
            "http://notlocalhost/",
            "http://localhostx/",
            "http://example.com/",
        ] {
            assert_eq!(check(name), Ok(()), "{name}: checked at delivery");
        }
        let e = check("http://127.0.0.1/").unwrap_err();
        assert!(e.contains("127.0.0.1") && e.contains("loopback address"), "{e}");
    }

    #[test]
    fn loopback_names_open_with_either_loopback_address() {
        let url = |u: &str| url::Url::parse(u).unwrap();
        let e = EgressPolicy::default()
            .check_without_dns(&url("http://localhost./"))
            .unwrap_err();
        assert_eq!(e.matches("egress.allow").count(), 2, "the hint is said once: {e}");
        let open = EgressPolicy::new(true, vec![]);
        assert!(open.check_without_dns(&url("http://localhost/")).is_ok());
        for net in ["127.0.0.0/8", "127.0.0.1/32", "::1/128"] {
            let p = EgressPolicy::new(false, vec![net.parse().unwrap()]);
            assert!(p.check_without_dns(&url("http://x.localhost/")).is_ok(), "{net}");
        }
        let other = EgressPolicy::new(false, vec!["10.0.0.0/8".parse().unwrap()]);
        assert!(other.check_without_dns(&url("http://localhost/")).is_err());
    }

    #[test]
    fn an_egress_refusal_says_its_hint_once() {
        let e = EgressPolicy::default().check(ip("127.0.0.1")).unwrap_err().to_string();
        assert_eq!(e.matches("egress.allow_private_targets").count(), 1, "{e}");
    }

    #[test]
    fn literal_ips_come_from_normalised_hosts() {
        let cases: &[(&str, Option<&str>)] = &[
            ("http://127.0.0.1/", Some("127.0.0.1")),
            ("http://2130706433/", Some("127.0.0.1")),
            ("http://0x7f.1/", Some("127.0.0.1")),
            ("http://0177.0.0.1/", Some("127.0.0.1")),
            ("http://127.1/", Some("127.0.0.1")),
            ("http://[::1]:8080/", Some("::1")),
            ("http://[::ffff:7f00:1]/", Some("::ffff:127.0.0.1")),
            ("https://receiver.example/", None),
            ("https://localhost/", None),
        ];
        for (url, want) in cases {
            let parsed = url::Url::parse(url).unwrap();
            assert_eq!(literal_ip(&parsed), want.map(ip), "{url}");
            // As an attempt sees it: the stored (normalised) text, parsed as a URI.
            let stored: http::Uri = parsed.as_str().parse().unwrap();
            assert_eq!(uri_literal_ip(&stored), want.map(ip), "{url} as stored");
        }
    }
}
