//! [`TlsMaterial::from_config`]: which config each host gets, and the
//! one-line errors for bad files. Certificates are made here with rcgen.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

use super::*;

/// A CA and a leaf it signed for `name`, written as PEM files in `dir`:
/// `ca.pem`, `leaf.pem`, `leaf.key`.
fn write_pki(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let paths = (dir.join("ca.pem"), dir.join("leaf.pem"), dir.join("leaf.key"));
    std::fs::write(&paths.0, ca.pem()).unwrap();
    std::fs::write(&paths.1, leaf.pem()).unwrap();
    std::fs::write(&paths.2, leaf_key.serialize_pem()).unwrap();
    paths
}

fn config(toml: &str) -> Config {
    let c = Config::from_toml_str(toml, "t").unwrap();
    c.validate().unwrap();
    c
}

/// The versions a config offers, as rustls's `Debug` lists them (rustls has no public
/// accessor).
fn versions(config: &ClientConfig) -> Vec<&'static str> {
    let text = format!("{config:?}");
    ["TLSv1_2", "TLSv1_3"]
        .into_iter()
        .filter(|v| text.contains(v))
        .collect()
}

fn q(p: &Path) -> String {
    format!("{:?}", p.display().to_string())
}

#[test]
fn each_host_gets_its_own_config_and_the_rest_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = write_pki(dir.path(), "client.test");
    let c = config(&format!(
        "[tls]\nca_file = {}\n[[host]]\nhost = \"Mtls.Example:443\"\nclient_cert = {}\nclient_key = {}\n\
         [[host]]\nhost = \"private.example:8443\"\nca_file = [{}]\n[[host]]\nhost = \"busy.example:443\"\nmax_in_flight = 2\n",
        q(&ca),
        q(&cert),
        q(&key),
        q(&ca)
    ));
    let m = TlsMaterial::from_config(&c).unwrap();
    let (default, mtls, private) = (
        m.for_host("other.example:443"),
        m.for_host("mtls.example:443"),
        m.for_host("private.example:8443"),
    );
    assert!(
        Arc::ptr_eq(&default, &m.for_host("busy.example:443")),
        "no TLS keys: the default"
    );
    assert!(!Arc::ptr_eq(&default, &mtls) && !Arc::ptr_eq(&default, &private));
    assert!(mtls.client_auth_cert_resolver.has_certs());
    assert!(!default.client_auth_cert_resolver.has_certs() && !private.client_auth_cert_resolver.has_certs());
    for config in [&default, &mtls, &private] {
        assert_eq!(config.alpn_protocols, [b"h2".to_vec(), b"http/1.1".to_vec()]);
        assert_eq!(versions(config), ["TLSv1_2", "TLSv1_3"]);
    }
}

#[test]
fn min_version_1_3_offers_tls_1_3_only() {
    let c = config("[tls]\nmin_version = \"1.3\"\n");
    let m = TlsMaterial::from_config(&c).unwrap();
    let d = m.for_host("a.example:443");
    assert_eq!(versions(&d), ["TLSv1_3"]);
}

#[test]
fn bad_files_are_one_line_naming_the_key_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = write_pki(dir.path(), "client.test");
    let other = tempfile::tempdir().unwrap();
    let (_, _, other_key) = write_pki(other.path(), "other.test");
    let missing = dir.path().join("missing.pem");
    let cases = [
        (
            format!("[tls]\nca_file = [{}, {}]\n", q(&ca), q(&missing)),
            "tls.ca_file[1] (",
            "cannot be read",
        ),
        (
            format!("[tls]\nca_file = {}\n", q(&key)),
            "tls.ca_file[0] (",
            "holds no PEM certificate",
        ),
        (
            format!("[[host]]\nhost = \"a:1\"\nca_file = {}\n", q(&missing)),
            "host[0].ca_file[0] (",
            "cannot be read",
        ),
        (
            format!(
                "[[host]]\nhost = \"a:1\"\nclient_cert = {}\nclient_key = {}\n",
                q(&cert),
                q(&other_key)
            ),
            "host[0].client_key (",
            "does not match host[0].client_cert",
        ),
        (
            format!(
                "[[host]]\nhost = \"a:1\"\nclient_cert = {}\nclient_key = {}\n",
                q(&key),
                q(&key)
            ),
            "host[0].client_cert (",
            "holds no PEM certificate",
        ),
        (
            format!(
                "[[host]]\nhost = \"a:1\"\nclient_cert = {}\nclient_key = {}\n",
                q(&cert),
                q(&cert)
            ),
            "host[0].client_key (",
            "no readable PEM private key",
        ),
    ];
    let key_text = std::fs::read_to_string(&other_key).unwrap();
    let key_body = key_text.lines().nth(1).unwrap();
    for (toml, key, problem) in cases {
        let e = TlsMaterial::from_config(&config(&toml)).err().unwrap().to_string();
        assert!(e.contains(key) && e.contains(problem), "{toml}: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(!e.contains(key_body), "no key material: {e}");
    }
}

/// `tls.roots = "both"` against a system store the test sets: `SSL_CERT_FILE` (read before
/// the platform's store) names a bundle of one CA, then an empty file. Each case runs in a
/// child process of this test binary: the store is read from the environment, and setting
/// it in this process would race the other tests.
#[test]
fn native_roots_come_from_the_system_store_or_say_why_not() {
    // The test's own name, as the harness knows it (the crate's name left out): it moves
    // with the module.
    let name = format!(
        "{}::native_roots_come_from_the_system_store_or_say_why_not",
        module_path!().trim_start_matches("courier::")
    );
    const CASE: &str = "COURIER_TEST_NATIVE_ROOTS_CASE";
    if let Ok(case) = std::env::var(CASE) {
        let c = config("[tls]\nroots = \"both\"\n");
        match (case.as_str(), TlsMaterial::from_config(&c)) {
            ("one CA", Ok(m)) => assert_eq!(m.for_host("a.example:443").alpn_protocols.len(), 2),
            ("empty", Err(e)) => assert!(
                e.to_string()
                    .contains("tls.roots asks for the system store, and it has no usable certificate"),
                "{e}"
            ),
            (case, Ok(_)) => panic!("{case}: the system store was taken as usable"),
            (case, Err(e)) => panic!("{case}: {e}"),
        }
        eprintln!("native roots case {case:?} checked");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (ca, _, _) = write_pki(dir.path(), "roots.test");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let no_certs = dir.path().join("no-certs");
    std::fs::create_dir(&no_certs).unwrap();
    for (case, file) in [("one CA", &ca), ("empty", &empty)] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
            .env(CASE, case)
            .env("SSL_CERT_FILE", file)
            .env("SSL_CERT_DIR", &no_certs)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{case}: {text}");
        assert!(
            text.contains(&format!("native roots case {case:?} checked")),
            "{case} ran: {text}"
        );
    }
}
