//! The interception CA against real clients (curl, Python `requests`, Node's `https`, Go's
//! `net/http`, and Java's `HttpsURLConnection` with its default trust manager, from
//! Debian's OpenJDK): what its leaked key file can sign, that the key file must be its
//! owner's only, and that a CA made by an older courier (the root's own key signing leaves)
//! keeps working, with a warning.
//!
//! Java matters here: RFC 5280 lets a validator skip the name constraints of a trust anchor,
//! and Java's does. With the old design (a root with constraints and no intermediate, its
//! key in the key file) Java accepts a leaf the leaked key signs for any name, where curl,
//! Python, Node and Go refuse it; with an intermediate, every one of them refuses it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{CertificateParams, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::*;

/// The Java client: a GET (or, with `BODY`, a POST) of `URL` through `HttpsURLConnection`,
/// trusting what `javax.net.ssl.trustStore` holds; with `TOKEN`, the proxy's password.
/// Prints the status and the body, or `refused <why>` and exits 2 for a TLS handshake
/// that failed (any other error: exit 1).
const JAVA_CLIENT: &str = r#"
import java.io.*;
import java.net.*;
import javax.net.ssl.*;

public class Client {
    public static void main(String[] args) throws Exception {
        String token = System.getenv("TOKEN");
        if (token != null) {
            Authenticator.setDefault(new Authenticator() {
                protected PasswordAuthentication getPasswordAuthentication() {
                    if (getRequestorType() != RequestorType.PROXY) return null;
                    return new PasswordAuthentication("courier", token.toCharArray());
                }
            });
        }
        HttpsURLConnection c = (HttpsURLConnection) new URL(System.getenv("URL")).openConnection();
        String body = System.getenv("BODY");
        try {
            if (body != null) {
                c.setRequestMethod("POST");
                c.setDoOutput(true);
                c.setRequestProperty("content-type", "application/json");
                c.setRequestProperty("webhook-id", System.getenv("EVENT_ID"));
                try (OutputStream out = c.getOutputStream()) { out.write(body.getBytes("UTF-8")); }
            }
            int status = c.getResponseCode();
            InputStream in = status < 400 ? c.getInputStream() : c.getErrorStream();
            System.out.println(status);
            System.out.println(in == null ? "" : new String(in.readAllBytes(), "UTF-8"));
        } catch (SSLHandshakeException e) {
            System.out.println("refused " + e.getMessage());
            System.exit(2);
        }
    }
}
"#;

/// Java, and a `-Djavax.net.ssl.trustStore` holding `root` (made with keytool, as the docs
/// say, once), in `work`; `None` after [`skip`] when there is no Java.
fn java_trusting(root: &Path, work: &Path) -> Option<Command> {
    let java = std::env::var("COURIER_TEST_JAVA").unwrap_or_else(|_| "java".into());
    let java = tool(&java, &["-version"], "Java (Debian default-jdk-headless)")?;
    let keytool = Path::new(&java).with_file_name("keytool");
    let keytool = if keytool.exists() { keytool } else { "keytool".into() };
    let store = work.join("trust.p12");
    if !store.exists() {
        let made = Command::new(keytool)
            .args(["-importcert", "-noprompt", "-alias", "courier", "-storetype", "PKCS12"])
            .args(["-storepass", "changeit", "-file"])
            .arg(root)
            .arg("-keystore")
            .arg(&store)
            .output()
            .expect("keytool runs");
        assert!(made.status.success(), "keytool: {made:?}");
    }
    std::fs::write(work.join("Client.java"), JAVA_CLIENT).unwrap();
    let mut cmd = Command::new(java);
    cmd.arg(format!("-Djavax.net.ssl.trustStore={}", store.display()))
        .arg("-Djavax.net.ssl.trustStorePassword=changeit")
        .arg("-Djavax.net.ssl.trustStoreType=PKCS12");
    Some(cmd)
}

/// The clients, each given the trust of `root` and pointed at `https://<name>:<port>/`
/// with `<name>` resolved to 127.0.0.1 its own way. Each exits 0 with the status on its
/// first line, or 2 when the server's certificate was refused (curl: 60).
enum Client {
    Curl,
    Python(String),
    Node(String),
    Go(PathBuf),
    Java,
}

impl Client {
    fn name(&self) -> &'static str {
        match self {
            Client::Curl => "curl",
            Client::Python(_) => "Python requests",
            Client::Node(_) => "Node https",
            Client::Go(_) => "Go net/http",
            Client::Java => "Java HttpsURLConnection",
        }
    }

    /// What the client says when a name is outside the constraints: the refusal is for
    /// that, not for some other fault of the certificate.
    fn constraint_refusal(&self) -> &'static str {
        match self {
            Client::Curl | Client::Python(_) | Client::Node(_) => "permitted subtree violation",
            Client::Go(_) => "is not permitted by any constraint",
            Client::Java => "name constraints check failed",
        }
    }

    /// Exit code of a refused certificate.
    fn refused(&self) -> i32 {
        match self {
            Client::Curl => 60,
            _ => 2,
        }
    }

    fn command(&self, name: &str, port: u16, root: &Path, work: &Path) -> Command {
        let url = format!("https://{name}:{port}/");
        let mut cmd = match self {
            Client::Curl => {
                let mut cmd = curl(&["--resolve", &format!("{name}:{port}:127.0.0.1"), "--cacert"]);
                cmd.arg(root);
                cmd
            }
            Client::Python(python) => {
                let script = "import os, socket, sys, requests\n\
                    real = socket.getaddrinfo\n\
                    socket.getaddrinfo = lambda host, *a, **k: real('127.0.0.1', *a, **k)\n\
                    try:\n    r = requests.get(os.environ['URL'], timeout=30)\n    print(r.status_code)\n\
                    except requests.exceptions.SSLError as e:\n    print('refused', e)\n    sys.exit(2)\n";
                let mut cmd = Command::new(python);
                cmd.args(["-c", script]).env("REQUESTS_CA_BUNDLE", root);
                cmd
            }
            Client::Node(node) => {
                // Errors of the certificate chain or name, as Node codes them (from OpenSSL's).
                let script = "const https = require('https');\n\
                    const lookup = (h, o, cb) => (o && o.all) ? cb(null, [{ address: '127.0.0.1', family: 4 }]) : cb(null, '127.0.0.1', 4);\n\
                    https.get(process.env.URL, { lookup }, (r) => { console.log(r.statusCode); r.resume(); })\n\
                      .on('error', (e) => {\n\
                        const network = ['ECONNREFUSED', 'ECONNRESET', 'ENOTFOUND', 'ETIMEDOUT', 'EPIPE'];\n\
                        console.log('refused', e.code, e.message);\n\
                        process.exit(network.includes(e.code) ? 1 : 2);\n\
                      });\n";
                let mut cmd = Command::new(node);
                cmd.args(["-e", script]).env("NODE_EXTRA_CA_CERTS", root);
                cmd
            }
            Client::Go(binary) => {
                let mut cmd = Command::new(binary);
                cmd.env("SSL_CERT_FILE", root);
                cmd
            }
            Client::Java => {
                let mut cmd = java_trusting(root, work).expect("checked before");
                let hosts = work.join("hosts");
                std::fs::write(&hosts, format!("127.0.0.1 {name}\n")).unwrap();
                cmd.arg(format!("-Djdk.net.hosts.file={}", hosts.display()))
                    .arg(work.join("Client.java"));
                cmd
            }
        };
        cmd.env("URL", &url);
        if let Client::Curl = self {
            cmd.arg(&url);
        }
        cmd
    }
}

/// The Go client, built in `work` (`go run` would say 1 for any exit code of the program).
fn go_client(go: &str, work: &Path) -> PathBuf {
    let main = work.join("leak.go");
    std::fs::write(
        &main,
        "package main\n\nimport (\n\t\"context\"\n\t\"crypto/x509\"\n\t\"errors\"\n\t\"fmt\"\n\t\"net\"\n\t\"net/http\"\n\t\"os\"\n)\n\n\
         func main() {\n\td := &net.Dialer{}\n\ttr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {\n\
         \t\t_, port, _ := net.SplitHostPort(addr)\n\t\treturn d.DialContext(ctx, network, net.JoinHostPort(\"127.0.0.1\", port))\n\t}}\n\
         \tr, err := (&http.Client{Transport: tr}).Get(os.Getenv(\"URL\"))\n\tif err != nil {\n\
         \t\tvar invalid x509.CertificateInvalidError\n\t\tvar unknown x509.UnknownAuthorityError\n\t\tvar host x509.HostnameError\n\
         \t\tif errors.As(err, &invalid) || errors.As(err, &unknown) || errors.As(err, &host) {\n\
         \t\t\tfmt.Println(\"refused\", err)\n\t\t\tos.Exit(2)\n\t\t}\n\t\tfmt.Fprintln(os.Stderr, err)\n\t\tos.Exit(1)\n\t}\n\
         \tfmt.Println(r.StatusCode)\n}\n",
    )
    .unwrap();
    let binary = work.join("leak");
    let built = Command::new(go)
        .arg("build")
        .arg("-o")
        .arg(&binary)
        .arg(&main)
        .output()
        .unwrap();
    assert!(built.status.success(), "go build: {built:?}");
    binary
}

/// Every client (Go's built in `work`), or `None` after [`skip`] when one is missing.
fn clients(work: &Path) -> Option<Vec<Client>> {
    let python = std::env::var("COURIER_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let go = std::env::var("COURIER_TEST_GO").unwrap_or_else(|_| "go".into());
    let java = std::env::var("COURIER_TEST_JAVA").unwrap_or_else(|_| "java".into());
    tool("curl", &["--version"], "curl")?;
    tool(&java, &["-version"], "Java (Debian default-jdk-headless)")?;
    Some(vec![
        Client::Curl,
        Client::Python(tool(&python, &["-c", "import requests"], "Python requests")?),
        Client::Node(tool("node", &["--version"], "Node.js")?),
        Client::Go(go_client(&tool(&go, &["version"], "Go (Debian golang-go)")?, work)),
        Client::Java,
    ])
}

/// What a thief who copied courier's CA key file can sign with: its key, and the
/// certificate after it (or, with none, the trust anchor itself), plus that chain.
fn leaked(key_file: &Path, root: &Path) -> (Issuer<'static, KeyPair>, Vec<CertificateDer<'static>>) {
    let pem = std::fs::read(key_file).unwrap();
    let key = KeyPair::try_from(&PrivateKeyDer::from_pem_slice(&pem).unwrap()).unwrap();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem).collect::<Result<_, _>>().unwrap();
    let signer = match chain.first() {
        Some(intermediate) => intermediate.clone(),
        None => CertificateDer::from_pem_file(root).unwrap(),
    };
    (Issuer::from_ca_cert_der(&signer, key).unwrap(), chain)
}

/// A TLS server config with a leaf for `name` that `issuer` signs, sent with `chain`.
fn minted(
    name: &str,
    issuer: &Issuer<'static, KeyPair>,
    chain: &[CertificateDer<'static>],
) -> Arc<rustls::ServerConfig> {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
    params.use_authority_key_identifier_extension = true;
    let leaf = params.signed_by(&key, issuer).unwrap();
    let mut certs = vec![leaf.der().clone()];
    certs.extend_from_slice(chain);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, PrivateKeyDer::try_from(key.serialize_der()).unwrap())
        .unwrap();
    Arc::new(config)
}

/// The key file leaked: a leaf it signs for a listed name verifies in every client, one for
/// a name not listed is refused by every one of them (Java included, which skips a trust
/// anchor's constraints: only the intermediate's stop it).
#[tokio::test]
async fn a_leaked_ca_key_signs_for_no_unlisted_name_in_any_client() {
    let work = tempfile::tempdir().unwrap();
    let Some(clients) = clients(work.path()) else {
        return;
    };
    let s = Setup::start().await;
    let key_file = s.c.data_dir.join("intercept-ca.key");
    let (issuer, chain) = leaked(&key_file, &s.ca());
    let rx = Receiver::start().await;
    let mut wrong = Vec::new();
    for (name, listed) in [
        ("hooks.localhost", true),
        ("evil.localhost", false),
        ("hooks.localhost.evil", false),
    ] {
        let front = TlsFront::start(minted(name, &issuer, &chain), &rx).await;
        for client in &clients {
            let out = run(client.command(name, front.addr.port(), &s.ca(), work.path())).await;
            let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let said = format!("{text} {}", String::from_utf8_lossy(&out.stderr));
            let ok = match listed {
                true => out.status.code() == Some(0) && (text.starts_with("200") || text.ends_with("200 1.1")),
                false => out.status.code() == Some(client.refused()) && said.contains(client.constraint_refusal()),
            };
            if !ok {
                wrong.push(format!(
                    "{} {} {name}: exit {:?}, {text:?}, {}",
                    client.name(),
                    if listed {
                        "did not verify listed"
                    } else {
                        "did not refuse unlisted"
                    },
                    out.status.code(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Java through courier, as docs/delivery.md says to set it up (the proxy properties, an
/// `Authenticator`, Basic allowed for tunnels), trusting the root: courier's leaf, sent
/// with its intermediate, verifies, and the message is delivered once, signed.
#[tokio::test]
async fn java_https_url_connection_with_a_trust_store_gets_202() {
    let work = tempfile::tempdir().unwrap();
    let mut s = Setup::start().await;
    let Some(mut cmd) = java_trusting(&s.ca(), work.path()) else {
        return;
    };
    cmd.arg("-Dhttps.proxyHost=127.0.0.1")
        .arg(format!("-Dhttps.proxyPort={}", s.c.ingress.port()))
        .arg("-Djdk.http.auth.tunneling.disabledSchemes=")
        .arg(work.path().join("Client.java"))
        .env(
            "URL",
            format!("https://hooks.localhost:{}/hook?client=1", s.front_addr.port()),
        )
        .env("BODY", BODY)
        .env("EVENT_ID", "evt_java")
        .env("TOKEN", TOKEN);
    let out = run(cmd).await;
    s.delivered_once_after_a_restart(out, "evt_java").await;
}

/// A key file group or others can read stops `serve` and `check-config` with one line
/// (exit 2, as other settings that do not check); the owner's only (0400) is fine.
#[tokio::test]
async fn a_ca_key_others_can_read_stops_the_start_with_one_line() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (data, cfg) = (dir.path().join("data"), dir.path().join("c.toml"));
    std::fs::write(&cfg, "[intercept]\nhosts = [\"hooks.example\"]\n").unwrap();
    let (cfg, data) = (cfg.display().to_string(), data.display().to_string());
    let global = ["--config", cfg.as_str(), "--data-dir", data.as_str()];
    let made = courier_cli(&[&global[..], &["intercept", "ca"]].concat(), &[], "").await;
    assert!(made.status.success(), "{made:?}");
    let key = Path::new(&data).join("intercept-ca.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let serve = ["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "serve"];
    for verb in [&["check-config"][..], &["intercept", "ca"][..], &serve[..]] {
        // Killed after a minute: a `serve` that starts anyway does not hang the test.
        let mut cmd = Command::new(bin());
        cmd.args([&global[..], verb].concat());
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("COURIER_")) {
            cmd.env_remove(k);
        }
        let out = run(cmd).await;
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        // `intercept ca` says 1 for a CA it cannot use, as before.
        let want = if verb[0] == "intercept" { 1 } else { 2 };
        assert_eq!(out.status.code(), Some(want), "{verb:?}: {err}");
        assert!(
            err.contains(&format!(
                "{}: the intercept CA key is readable by group or others (mode 0644)",
                key.display()
            )),
            "{verb:?}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
    let checked = courier_cli(&[&global[..], &["check-config"]].concat(), &[], "").await;
    assert!(checked.status.success(), "{checked:?}");
}

/// A CA made by an older courier (a constrained root whose own key, in the key file, signs
/// leaves) is kept: the apps that trust it keep working, and each start says at `warn` what
/// it lacks and how to replace it.
#[tokio::test]
async fn a_ca_an_older_courier_made_is_kept_with_a_warning() {
    let Some(_) = tool("curl", &["--version"], "curl") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    // As 0e6dfe2 made it: one self-signed certificate with the constraints, its key alone.
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "courier intercept CA");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    params.name_constraints = Some(rcgen::NameConstraints {
        permitted_subtrees: vec![rcgen::GeneralSubtree::DnsName("hooks.localhost".into())],
        excluded_subtrees: Vec::new(),
    });
    let root = params.self_signed(&key).unwrap();
    let (cert_file, key_file) = (data.join("intercept-ca.pem"), data.join("intercept-ca.key"));
    std::fs::write(&cert_file, root.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    std::fs::set_permissions(&key_file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let pki = Pki::new("receiver");
    let rx = Receiver::start().await;
    let front = TlsFront::start(pki.server_for(&["hooks.localhost"], &[&TLS13]), &rx).await;
    let c = Courier::start_with_data_dir(dir.path(), &data, &config(&pki, "hosts = [\"hooks.localhost\"]"), &[]);
    let warned = c.log.wait_for("signs leaves with its own key", Duration::from_secs(10));
    assert!(
        warned.is_some_and(|l| l.contains("delete both files")),
        "{}",
        c.log.all()
    );
    let proxy = format!("http://courier:{TOKEN}@{}", c.ingress);
    let url = format!("https://hooks.localhost:{}/hook", front.addr.port());
    let ca = cert_file.to_str().unwrap();
    let json = "content-type: application/json";
    let out = run(curl(&["--proxy", &proxy, "--cacert", ca, "-H", json, "-d", BODY, &url])).await;
    assert!(status_line(&out).starts_with("202 "), "{out:?}");
    assert_eq!(std::fs::read_to_string(&cert_file).unwrap(), root.pem(), "the same CA");
}
