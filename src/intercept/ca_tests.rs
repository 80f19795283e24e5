//! The CA: made once with its constraints, loaded after, refused for hosts it cannot serve.

use super::*;

/// The wall clock, as courier reads it.
fn now() -> SystemTime {
    crate::intercept::wall(&crate::clock::SystemClock)
}

fn pat(list: &[&str]) -> Vec<HostPattern> {
    list.iter().map(|h| HostPattern::parse(h).unwrap()).collect()
}

/// Whether a leaf the CA mints for `name` verifies as a client would verify it.
fn verifies(ca: &Ca, name: &str) -> Result<(), String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der.clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = ca.mint(name, &key, now(), Duration::from_secs(600)).unwrap();
    let server = ServerName::try_from(name.to_string()).unwrap();
    verifier
        .verify_server_cert(
            &leaf,
            &[],
            &server,
            &[],
            UnixTime::since_unix_epoch(now().duration_since(SystemTime::UNIX_EPOCH).unwrap()),
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[test]
fn a_made_ca_signs_for_its_hosts_only_and_is_loaded_again() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("d/ca.pem"), dir.path().join("d/ca.key"));
    let hosts = pat(&["hooks.example", "*.r.example", "203.0.113.7"]);
    let ca = Ca::load_or_create(&cert, &key, &hosts, now()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(ca.pem().starts_with("-----BEGIN CERTIFICATE-----"));
    for yes in ["hooks.example", "a.r.example", "a.b.r.example", "203.0.113.7"] {
        verifies(&ca, yes).unwrap_or_else(|e| panic!("{yes}: {e}"));
    }
    for no in ["evil.example", "example", "203.0.113.8", "::1", "hooks.example.evil"] {
        assert!(verifies(&ca, no).is_err(), "{no}");
    }
    let again = Ca::load_or_create(&cert, &key, &hosts, now()).unwrap();
    assert_eq!(again.pem(), ca.pem(), "the CA is made once");
    verifies(&again, "hooks.example").unwrap();
    let e = Ca::load_or_create(&cert, &key, &pat(&["new.example"]), now())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("intercept.hosts new.example is not covered by the CA at"),
        "{e}"
    );
    assert!(e.contains("remove its certificate and key"), "{e}");
}

#[test]
fn with_no_address_listed_no_address_is_permitted_and_with_no_name_no_name() {
    let dir = tempfile::tempdir().unwrap();
    let names = Ca::load_or_create(
        &dir.path().join("a.pem"),
        &dir.path().join("a.key"),
        &pat(&["h.example"]),
        now(),
    )
    .unwrap();
    for ip in ["127.0.0.1", "::1", "10.0.0.1"] {
        assert!(verifies(&names, ip).is_err(), "{ip}");
    }
    let ips = Ca::load_or_create(
        &dir.path().join("b.pem"),
        &dir.path().join("b.key"),
        &pat(&["127.0.0.1"]),
        now(),
    )
    .unwrap();
    verifies(&ips, "127.0.0.1").unwrap();
    for other in ["h.example", "localhost", "::1", "127.0.0.2"] {
        assert!(verifies(&ips, other).is_err(), "{other}");
    }
}

#[test]
fn a_half_present_or_unreadable_ca_is_refused_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("ca.pem"), dir.path().join("ca.key"));
    std::fs::write(&cert, "x").unwrap();
    let e = Ca::load_or_create(&cert, &key, &[], now()).err().unwrap().to_string();
    assert!(e.contains("exists but") && e.contains("ca.key does not"), "{e}");
    std::fs::write(&key, "not a key").unwrap();
    let e = Ca::load_or_create(&cert, &key, &[], now()).err().unwrap().to_string();
    assert!(e.contains("not a PEM private key"), "{e}");
    assert!(!e.contains('\n'));
}

#[test]
fn an_operators_ca_without_constraints_serves_any_host() {
    let dir = tempfile::tempdir().unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, "corp CA");
    let cert = params.self_signed(&key).unwrap();
    let (cert_file, key_file) = (dir.path().join("corp.pem"), dir.path().join("corp.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let ca = Ca::load_or_create(&cert_file, &key_file, &pat(&["anything.example"]), now()).unwrap();
    verifies(&ca, "other.example").unwrap();
    // Another key than the certificate's: its leaves do not verify, so the start is refused.
    std::fs::write(&key_file, KeyPair::generate().unwrap().serialize_pem()).unwrap();
    let e = Ca::load_or_create(&cert_file, &key_file, &pat(&["anything.example"]), now())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("corp.key is not the key of the certificate at"), "{e}");
}
