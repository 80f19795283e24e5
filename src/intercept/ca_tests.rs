//! The CA: made once with its constraints, loaded after, refused for hosts it cannot serve.

use super::*;
use rcgen::{BasicConstraints, IsCa};

/// The wall clock, as courier reads it.
fn now() -> SystemTime {
    crate::intercept::wall(&crate::clock::SystemClock)
}

/// Writes a key file with the owner-only mode a key file must have.
fn write_key(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn pat(list: &[&str]) -> Vec<HostPattern> {
    list.iter().map(|h| HostPattern::parse(h).unwrap()).collect()
}

/// Whether a leaf the CA mints for `name` verifies as a client would verify it.
fn verifies(ca: &Ca, name: &str) -> Result<(), String> {
    verifies_sent_with(ca, name, ca.chain())
}

/// Whether a leaf the CA mints for `name`, sent with `chain`, verifies.
fn verifies_sent_with(ca: &Ca, name: &str, chain: &[CertificateDer<'static>]) -> Result<(), String> {
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
            chain,
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
    write_key(&key, "not a key");
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
    write_key(&key_file, &key.serialize_pem());
    let ca = Ca::load_or_create(&cert_file, &key_file, &pat(&["anything.example"]), now()).unwrap();
    verifies(&ca, "other.example").unwrap();
    assert!(ca.signs_with_anchor_key(), "no intermediate: the anchor's key signs");
    // Another key than the certificate's: its leaves would not verify, so the start is refused.
    write_key(&key_file, &KeyPair::generate().unwrap().serialize_pem());
    let e = Ca::load_or_create(&cert_file, &key_file, &pat(&["anything.example"]), now())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("corp.key is not the key of the certificate at"), "{e}");
}

#[test]
fn a_made_ca_is_a_root_without_its_key_and_an_intermediate_that_signs() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("ca.pem"), dir.path().join("ca.key"));
    let ca = Ca::load_or_create(&cert, &key, &pat(&["hooks.example"]), now()).unwrap();
    assert!(!ca.signs_with_anchor_key());
    assert_eq!(ca.chain().len(), 1, "leaves are sent with the intermediate");
    let text = std::fs::read_to_string(&key).unwrap();
    assert_eq!(
        text.matches("PRIVATE KEY-----\n").count(),
        2,
        "one key (begin and end lines)"
    );
    assert_eq!(text.matches("-----BEGIN CERTIFICATE-----").count(), 1);
    // The one key on disk is the intermediate's, not the root's.
    let (on_disk, _) = files::read_key(&key).unwrap();
    let root = rustls::server::ParsedCertificate::try_from(&ca.cert_der).unwrap();
    let intermediate = rustls::server::ParsedCertificate::try_from(&ca.chain()[0]).unwrap();
    let spki = on_disk.subject_public_key_info();
    assert_eq!(intermediate.subject_public_key_info().as_ref(), spki.as_slice());
    assert_ne!(root.subject_public_key_info().as_ref(), spki.as_slice());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "no other file");
    verifies(&ca, "hooks.example").unwrap();
    assert!(verifies(&ca, "evil.example").is_err());
    // Without the intermediate, a leaf does not chain to the root.
    assert!(verifies_sent_with(&ca, "hooks.example", &[]).is_err());
}

#[test]
fn a_key_file_others_can_read_is_refused_with_one_line() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("ca.pem"), dir.path().join("ca.key"));
    let hosts = pat(&["hooks.example"]);
    Ca::load_or_create(&cert, &key, &hosts, now()).unwrap();
    for mode in [0o644, 0o640, 0o604] {
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
        let e = Ca::load_or_create(&cert, &key, &hosts, now())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(&format!(
                "{}: the intercept CA key is readable by group or others (mode {mode:04o})",
                key.display()
            )),
            "{e}"
        );
        assert!(e.contains("chmod 600") && !e.contains('\n'), "{e}");
        assert!(Ca::check_existing(&cert, &key, &hosts, now()).is_err());
    }
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
    Ca::load_or_create(&cert, &key, &hosts, now()).unwrap();
}

#[test]
fn an_intermediate_another_root_signed_or_another_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = pat(&["hooks.example"]);
    let file = |n: &str| dir.path().join(n);
    Ca::load_or_create(&file("a.pem"), &file("a.key"), &hosts, now()).unwrap();
    Ca::load_or_create(&file("b.pem"), &file("b.key"), &hosts, now()).unwrap();
    // b's intermediate under a's root.
    let e = Ca::load_or_create(&file("a.pem"), &file("b.key"), &hosts, now())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("b.key is not one the certificate at") && e.contains("a.pem signed"),
        "{e}"
    );
    // a's intermediate certificate after another key.
    let a = std::fs::read_to_string(file("a.key")).unwrap();
    let cert_at = a.find("-----BEGIN CERTIFICATE-----").unwrap();
    write_key(
        &file("c.key"),
        &format!("{}{}", KeyPair::generate().unwrap().serialize_pem(), &a[cert_at..]),
    );
    let e = Ca::load_or_create(&file("a.pem"), &file("c.key"), &hosts, now())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("c.key is not the key of the certificate after it"), "{e}");
}
