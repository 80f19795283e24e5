//! TLS toward receivers (`[tls]`, `[[host]]` ca_file / client_cert / client_key), against
//! real TLS receivers on 127.0.0.1 with certificates made by the test: trust through a CA
//! file, globally and per host; an untrusted receiver's error in the attempt history,
//! retried, then delivered once trusted material is swapped in; mTLS presented and
//! verified; `min_version = "1.3"` against a TLS-1.2-only receiver; bad PEM files refused
//! by `check-config`.

use std::process::Command;

use rustls::version::{TLS12, TLS13};
use serde_json::Value;

use crate::hardening::InProc;
use crate::support::*;
use crate::support_tls::*;

/// Fast retries, so a retry shows within a second.
const FAST: &str = "[retry]\nbase_delay = \"100ms\"\nmax_delay = \"400ms\"\njitter = \"none\"\n";

/// Posts `target` through courier's ingress; returns the delivery id.
async fn send(ingress: std::net::SocketAddr, target: &str) -> String {
    let a = post(&format!("http://{ingress}/"), &[("courier-target", target)], "{}").await;
    assert_eq!(a.status, 202, "{}", a.text());
    a.json()["id"].as_str().unwrap().to_string()
}

/// The attempt errors of a delivery's history.
fn errors(d: &Value) -> Vec<String> {
    d["history"]
        .as_array()
        .map(|h| {
            h.iter()
                .filter_map(|a| a["error"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until the delivery has at least `n` failed attempts; returns their errors.
async fn failed_attempts(c: &Courier, id: &str, n: usize) -> Vec<String> {
    eventually(&format!("{n} failed attempts of {id}"), || async {
        let e = errors(&delivery(c, id).await);
        (e.len() >= n).then_some(e)
    })
    .await
}

#[tokio::test]
async fn a_receiver_trusted_through_tls_ca_file_is_delivered() {
    let pki = Pki::new("private");
    let rx = Receiver::start().await;
    let front = TlsFront::start(pki.server(&[&TLS13, &TLS12], None), &rx).await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), &format!("[tls]\nca_file = {}\n", toml_path(&pki.ca_file)));
    let id = send(c.ingress, &front.url("/hook")).await;
    wait_state(&c, &id, "delivered").await;
    assert_eq!(rx.seen()[0].path, "/hook");
    assert!(front.handshakes()[0].error.is_none());
}

/// Without the CA the receiver is untrusted: the attempt error names rustls's reason and
/// the message is retried like any connect error. The trusted material a reload then applies
/// delivers it, on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_receiver_is_retried_with_the_reason_then_delivered_once_trusted() {
    let pki = Pki::new("corp");
    let rx = Receiver::start().await;
    let front = TlsFront::start(pki.server(&[&TLS13, &TLS12], None), &rx).await;
    let resolver = crate::support::resolver::StaticResolver::new();
    let base = format!("{FAST}[egress]\nallow_private_targets = true\n");
    let c = InProc::start(&base, &resolver).await;
    let id = send(c.ingress(), &front.url("/hook")).await;
    let errs = eventually("two failed attempts", || async {
        let e = errors(&c.delivery(&id).await);
        (e.len() >= 2).then_some(e)
    })
    .await;
    for e in &errs {
        assert!(e.contains("tls: invalid peer certificate: UnknownIssuer"), "{errs:?}");
    }
    assert_eq!(c.delivery(&id).await["state"], "pending", "retried, not dead");
    assert!(rx.seen().is_empty());

    let trusted = courier::config::Config::from_toml_str(
        &format!("{base}[tls]\nca_file = {}\n", toml_path(&pki.ca_file)),
        "reload",
    )
    .unwrap();
    // What a reload (SIGHUP) applies once the file is read again.
    c.running().deliverer.reconfigure(std::sync::Arc::new(trusted)).unwrap();
    c.wait_state(&id, "delivered").await;
    assert_eq!(rx.seen().len(), 1);
    c.stop().await;
}

#[tokio::test]
async fn a_host_ca_file_trusts_that_host_only() {
    let pki = Pki::new("host");
    let rx = Receiver::start().await;
    let config = pki.server(&[&TLS13, &TLS12], None);
    let (trusted, other) = (
        TlsFront::start(config.clone(), &rx).await,
        TlsFront::start(config, &rx).await,
    );
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(
        d.path(),
        &format!(
            "{FAST}[[host]]\nhost = {:?}\nca_file = [{}]\n",
            trusted.host(),
            toml_path(&pki.ca_file)
        ),
    );
    let id = send(c.ingress, &trusted.url("/trusted")).await;
    wait_state(&c, &id, "delivered").await;
    let id = send(c.ingress, &other.url("/other")).await;
    let errs = failed_attempts(&c, &id, 1).await;
    assert!(errs[0].contains("UnknownIssuer"), "{errs:?}");
    let paths: Vec<String> = rx.seen().iter().map(|s| s.path.clone()).collect();
    assert_eq!(paths, ["/trusted"]);
}

/// A receiver that requires a client certificate from its own CA: courier presents the one
/// its `[[host]]` names (the receiver verifies the chain), and a host without one is
/// refused by the receiver, an attempt error that is retried.
#[tokio::test]
async fn mtls_is_presented_where_configured_and_refused_without() {
    let (server_pki, client_pki) = (Pki::new("server"), Pki::new("clients"));
    let client = client_pki.leaf("courier-client", &["courier.test"]);
    let rx = Receiver::start().await;
    let config = server_pki.server(&[&TLS13, &TLS12], Some(&client_pki));
    let (with, without) = (
        TlsFront::start(config.clone(), &rx).await,
        TlsFront::start(config, &rx).await,
    );
    let d = tempfile::tempdir().unwrap();
    let ca = toml_path(&server_pki.ca_file);
    let c = Courier::start(
        d.path(),
        &format!(
            "{FAST}[tls]\nca_file = {ca}\n[[host]]\nhost = {:?}\nclient_cert = {}\nclient_key = {}\n",
            with.host(),
            toml_path(&client.cert_file),
            toml_path(&client.key_file)
        ),
    );
    let id = send(c.ingress, &with.url("/mtls")).await;
    wait_state(&c, &id, "delivered").await;
    assert_eq!(with.handshakes()[0].client_cert.as_ref(), Some(&client.der));

    let id = send(c.ingress, &without.url("/anonymous")).await;
    let errs = failed_attempts(&c, &id, 2).await;
    let refused = without.failed_handshake().await;
    assert!(refused.contains("no certificates"), "{refused}");
    // TLS 1.3: the receiver refuses after courier's side of the handshake is done, so the
    // attempt sees the receiver's alert.
    assert!(errs[0].contains("CertificateRequired"), "{errs:?}");
    let paths: Vec<String> = rx.seen().iter().map(|s| s.path.clone()).collect();
    assert_eq!(paths, ["/mtls"]);
}

#[tokio::test]
async fn min_version_1_3_refuses_a_tls_1_2_only_receiver() {
    let pki = Pki::new("old");
    let rx = Receiver::start().await;
    let front = TlsFront::start(pki.server(&[&TLS12], None), &rx).await;
    let ca = toml_path(&pki.ca_file);
    let d = tempfile::tempdir().unwrap();
    let strict = Courier::start(
        d.path(),
        &format!("{FAST}[tls]\nca_file = {ca}\nmin_version = \"1.3\"\n"),
    );
    let id = send(strict.ingress, &front.url("/strict")).await;
    let errs = failed_attempts(&strict, &id, 1).await;
    assert!(
        errs[0].contains("tls: received fatal alert: ProtocolVersion"),
        "{errs:?}"
    );
    assert!(rx.seen().is_empty());
    // The same receiver with the default minimum (1.2): delivered, so 1.3 was the reason.
    let d2 = tempfile::tempdir().unwrap();
    let default = Courier::start(d2.path(), &format!("{FAST}[tls]\nca_file = {ca}\n"));
    let id = send(default.ingress, &front.url("/default")).await;
    wait_state(&default, &id, "delivered").await;
}

/// `courier check-config` reads every PEM file: a bad one is one line naming the key and
/// the file, exit code 2, and never the key's content.
#[test]
fn check_config_refuses_bad_pem_files() {
    let pki = Pki::new("check");
    let (a, b) = (pki.leaf("a", &["a.test"]), pki.leaf("b", &["b.test"]));
    let missing = pki.dir.path().join("missing.pem");
    let key_text = std::fs::read_to_string(&b.key_file).unwrap();
    let cases = [
        (
            format!("[tls]\nca_file = {}\n", toml_path(&missing)),
            format!(
                "invalid config: tls.ca_file[0] ({}) cannot be read: No such file or directory (os error 2)",
                missing.display()
            ),
        ),
        (
            format!(
                "[[host]]\nhost = \"a.test:443\"\nclient_cert = {}\nclient_key = {}\n",
                toml_path(&a.cert_file),
                toml_path(&b.key_file)
            ),
            format!(
                "invalid config: host[0].client_key ({}) does not match host[0].client_cert ({})",
                b.key_file.display(),
                a.cert_file.display()
            ),
        ),
    ];
    for (toml, want) in cases {
        let path = pki.dir.path().join("courier.toml");
        std::fs::write(&path, &toml).unwrap();
        let out = Command::new(bin())
            .args(["check-config", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{toml}: {stderr}");
        assert_eq!(stderr.trim(), format!("courier: {want}"), "{toml}");
        assert!(!stderr.contains(key_text.lines().nth(1).unwrap()));
    }
    let path = pki.dir.path().join("good.toml");
    std::fs::write(
        &path,
        format!(
            "[tls]\nroots = \"webpki\"\nca_file = {}\n[[host]]\nhost = \"a.test:443\"\nclient_cert = {}\nclient_key = {}\n",
            toml_path(&pki.ca_file),
            toml_path(&a.cert_file),
            toml_path(&a.key_file)
        ),
    )
    .unwrap();
    let out = Command::new(bin())
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("tls: roots webpki, min_version 1.2, ca_file: "),
        "{stdout}"
    );
    assert!(
        stdout.contains("host a.test:443: max_in_flight 10, client_cert "),
        "{stdout}"
    );
}
