//! HTTPS interception (`[intercept]`, CONTRACT §9) with real clients no one here wrote:
//! curl, Python `requests`, Node's undici (`ProxyAgent`) and Go's `net/http`, each through
//! `HTTPS_PROXY`-style settings and trusting courier's CA, against a TLS receiver with its
//! own test CA (which courier trusts through `[tls] ca_file`). Each gets a 202; courier is
//! killed and restarted before the receiver comes up, and the receiver then sees one
//! signed request that verifies. Plus: a passthrough host reached untouched (the receiver
//! sees the client's own TLS), an unlisted host refused with nothing stored, a client that
//! does not trust the CA failing its handshake with nothing stored, and the hostile callers
//! (no token, a browser, a passthrough to an address the egress policy refuses). The CA
//! itself (Java, and what a leaked key file can sign) is in `intercept_ca.rs`.
//!
//! The tools are installed by `scripts/verifiers.sh`: Debian's `golang-go` and
//! `default-jdk-headless`, `undici` from npm under `NODE_PATH`, `requests` in
//! `COURIER_TEST_PYTHON`. A missing one fails the test (or, with `COURIER_TEST_ALLOW_SKIP=1`,
//! says "skipped").

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use base64::Engine;
use hmac::{Hmac, Mac};
use rustls::version::{TLS12, TLS13};
use sha2::Sha256;

use crate::support::*;
use crate::support_tls::*;

/// The ingress token; clients send it in their proxy URL (Basic) or as a Bearer token.
const TOKEN: &str = "intercept-tok";
/// The HMAC key courier signs with (`whsec_` + base64 of it).
const KEY: &[u8] = b"intercept-signing-key-0123456789";
const BODY: &str = "{\"type\":\"invoice.paid\",\"customer\":\"Zoë\"}";

fn config(pki: &Pki, intercept: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    format!(
        "ingress_token = \"{TOKEN}\"\nmax_body = \"16KiB\"\n[signing]\nsecrets = [\"whsec_{}\"]\n[retry]\nbase_delay = \"100ms\"\n\
         max_delay = \"300ms\"\njitter = \"none\"\n[tls]\nca_file = {}\n[intercept]\n{intercept}\n",
        b64.encode(KEY),
        toml_path(&pki.ca_file)
    )
}

/// What every client test shares: a receiver (down until [`Setup::receiver_up`]) behind a
/// TLS front for `hooks.localhost` and `127.0.0.1`, and courier intercepting both.
struct Setup {
    _dir: tempfile::TempDir,
    pki: Pki,
    rx: Receiver,
    front_addr: SocketAddr,
    c: Courier,
}

impl Setup {
    async fn start() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::new("receiver");
        let rx = Receiver::start().await;
        let c = Courier::start(
            dir.path(),
            &config(&pki, "hosts = [\"127.0.0.1\", \"hooks.localhost\"]"),
        );
        Setup {
            _dir: dir,
            pki,
            rx,
            front_addr: reserve_port(),
            c,
        }
    }

    /// `http://courier:<token>@<ingress>`, as `HTTPS_PROXY` names courier.
    fn proxy(&self) -> String {
        format!("http://courier:{TOKEN}@{}", self.c.ingress)
    }

    fn ca(&self) -> PathBuf {
        self.c.data_dir.join("intercept-ca.pem")
    }

    async fn receiver_up(&self) -> TlsFront {
        let names = ["127.0.0.1", "hooks.localhost", "localhost"];
        TlsFront::start_on(
            self.pki.server_for(&names, &[&TLS13, &TLS12]),
            &self.rx,
            self.front_addr,
        )
        .await
    }

    /// The client said 202 (its output: the status line, then the body); courier is killed
    /// and restarted, the receiver comes up, and it sees exactly one request, signed.
    async fn delivered_once_after_a_restart(&mut self, out: Output, event_id: &str) {
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success() && text.starts_with("202"),
            "the client got {text:?}; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let id = text.split("\"id\":\"").nth(1).and_then(|rest| rest.split('"').next());
        let id = id.unwrap_or_else(|| panic!("no delivery id in {text}")).to_string();
        self.c.restart();
        let _front = self.receiver_up().await;
        // Once courier has recorded the delivery it sends nothing more for it: whatever
        // the receiver has seen by then is all it will see.
        wait_state(&self.c, &id, "delivered").await;
        let seen = self.rx.seen();
        assert_eq!(seen.len(), 1, "delivered once");
        let s = &seen[0];
        assert_eq!((s.method.as_str(), s.path.as_str()), ("POST", "/hook?client=1"));
        assert_eq!(String::from_utf8_lossy(&s.body), BODY);
        assert_eq!(s.header("webhook-id").as_deref(), Some(event_id));
        let ts = s.header("webhook-timestamp").unwrap();
        let mut mac = Hmac::<Sha256>::new_from_slice(KEY).unwrap();
        mac.update(format!("{event_id}.{ts}.{BODY}").as_bytes());
        let b64 = base64::engine::general_purpose::STANDARD;
        let expected = format!("v1,{}", b64.encode(mac.finalize().into_bytes()));
        assert_eq!(
            s.header("webhook-signature").unwrap(),
            expected,
            "the signature verifies"
        );
        assert!(s.header("proxy-authorization").is_none());
    }
}

/// Runs `cmd` to the end off the runtime, killed after a minute.
async fn run(mut cmd: Command) -> Output {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // Only the proxy settings the test gives: none inherited from this environment.
    let given: Vec<String> = cmd.get_envs().map(|(k, _)| k.to_string_lossy().into_owned()).collect();
    for var in [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "NO_PROXY",
        "no_proxy",
        "ALL_PROXY",
    ] {
        if !given.iter().any(|g| g == var) {
            cmd.env_remove(var);
        }
    }
    tokio::task::spawn_blocking(move || {
        let child = cmd.spawn().unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            if rx.recv_timeout(Duration::from_secs(60)).is_err() {
                let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            }
        });
        let out = child.wait_with_output().unwrap();
        let _ = tx.send(());
        out
    })
    .await
    .unwrap()
}

/// `program` when it runs, else `None` after [`skip`].
fn tool(program: &str, args: &[&str], what: &str) -> Option<String> {
    let ok = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        skip(&format!("{what} is not available (scripts/verifiers.sh installs it)"));
        return None;
    }
    Some(program.to_string())
}

fn curl(args: &[&str]) -> Command {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "30", "-w", "\\n%{http_code} %{http_version}\\n"])
        .args(args);
    cmd
}

/// curl's last line: `<status> <HTTP version>`.
fn status_line(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim_end().rsplit('\n').next().unwrap_or_default().to_string()
}

#[tokio::test]
async fn curl_through_the_proxy_gets_202_and_the_receiver_one_signed_request() {
    let Some(_) = tool("curl", &["--version"], "curl") else {
        return;
    };
    let mut s = Setup::start().await;
    let url = format!("https://127.0.0.1:{}/hook?client=1", s.front_addr.port());
    let ca = s.ca();
    let (proxy, ca) = (s.proxy(), ca.to_str().unwrap().to_string());
    let send = |id: &str, extra: &[&str]| {
        let mut args = vec![
            "--proxy",
            &proxy,
            "--cacert",
            &ca,
            "-H",
            "content-type: application/json",
        ];
        args.extend_from_slice(extra);
        let header = format!("webhook-id: {id}");
        let mut cmd = curl(&args);
        cmd.args(["-H", &header, "--data-binary", BODY, &url]);
        cmd
    };
    // h2 inside the tunnel (ALPN), then HTTP/1.1 with the same event id: one message.
    let h2 = run(send("evt_curl", &["--http2"])).await;
    let text = String::from_utf8_lossy(&h2.stdout).to_string();
    assert!(
        text.trim_end().ends_with("202 2"),
        "{text}; {}",
        String::from_utf8_lossy(&h2.stderr)
    );
    // The limits apply inside the tunnel as outside: a body over max_body is refused. (Over
    // HTTP/2, and small enough to be sent whole within its first flow-control window, so
    // the refusal cannot cut the upload short.)
    let big = "x".repeat(20 << 10);
    let mut too_large = curl(&[
        "--http2",
        "--proxy",
        &proxy,
        "--cacert",
        &ca,
        "--data-binary",
        &big,
        &url,
    ]);
    too_large.args(["-H", "webhook-id: evt_big"]);
    let refused = run(too_large).await;
    assert!(status_line(&refused).starts_with("413 "), "{refused:?}");
    let out = run(send("evt_curl", &["--http1.1"])).await;
    let body = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(body.contains("\"duplicate\":true"), "{body}");
    // The answer's body comes first in curl's output: put the status line first.
    let (answer, status) = body.trim_end().rsplit_once('\n').unwrap_or(("", body.trim_end()));
    let out = Output {
        stdout: format!("{status}\n{answer}").into_bytes(),
        ..out
    };
    s.delivered_once_after_a_restart(out, "evt_curl").await;
}

#[tokio::test]
async fn python_requests_with_https_proxy_and_requests_ca_bundle_gets_202() {
    let python = std::env::var("COURIER_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let Some(python) = tool(&python, &["-c", "import requests"], "Python requests") else {
        return;
    };
    let mut s = Setup::start().await;
    let script = "import os, requests\n\
        r = requests.post(os.environ['URL'], data=os.environ['BODY'].encode(), \
        headers={'webhook-id': 'evt_py', 'content-type': 'application/json'}, timeout=30)\n\
        print(r.status_code)\nprint(r.text)\n";
    let mut cmd = Command::new(python);
    cmd.args(["-c", script])
        .env(
            "URL",
            format!("https://127.0.0.1:{}/hook?client=1", s.front_addr.port()),
        )
        .env("BODY", BODY)
        .env("HTTPS_PROXY", s.proxy())
        .env("REQUESTS_CA_BUNDLE", s.ca());
    let out = run(cmd).await;
    s.delivered_once_after_a_restart(out, "evt_py").await;
}

#[tokio::test]
async fn node_undici_proxy_agent_with_node_extra_ca_certs_gets_202() {
    let Some(node) = tool("node", &["-e", "require('undici').ProxyAgent"], "Node.js with undici") else {
        return;
    };
    let mut s = Setup::start().await;
    // The token as a Bearer proxy credential (the URL form is Basic, as the others use).
    let script = "const { ProxyAgent, fetch } = require('undici');\n\
        (async () => {\n\
          const dispatcher = new ProxyAgent({ uri: process.env.PROXY, token: 'Bearer ' + process.env.TOKEN });\n\
          const r = await fetch(process.env.URL, { method: 'POST', body: process.env.BODY, dispatcher,\n\
            headers: { 'webhook-id': 'evt_node', 'content-type': 'application/json' } });\n\
          console.log(r.status); console.log(await r.text());\n\
        })().catch((e) => { console.error(e); process.exit(1); });\n";
    let mut cmd = Command::new(node);
    cmd.args(["-e", script])
        .env(
            "URL",
            format!("https://hooks.localhost:{}/hook?client=1", s.front_addr.port()),
        )
        .env("BODY", BODY)
        .env("PROXY", format!("http://{}", s.c.ingress))
        .env("TOKEN", TOKEN)
        .env("NODE_EXTRA_CA_CERTS", s.ca());
    let out = run(cmd).await;
    s.delivered_once_after_a_restart(out, "evt_node").await;
}

#[tokio::test]
async fn go_net_http_with_https_proxy_and_ssl_cert_file_gets_202() {
    let go = std::env::var("COURIER_TEST_GO").unwrap_or_else(|_| "go".into());
    let Some(go) = tool(&go, &["version"], "Go (Debian golang-go)") else {
        return;
    };
    let mut s = Setup::start().await;
    let src = tempfile::tempdir().unwrap();
    // Go never proxies a loopback address or `localhost`, so the receiver is named
    // `hooks.localhost` (courier resolves it to loopback without DNS).
    std::fs::write(
        src.path().join("main.go"),
        "package main\n\nimport (\n\t\"fmt\"\n\t\"io\"\n\t\"net/http\"\n\t\"os\"\n\t\"strings\"\n)\n\n\
         func main() {\n\treq, _ := http.NewRequest(\"POST\", os.Getenv(\"URL\"), strings.NewReader(os.Getenv(\"BODY\")))\n\
         \treq.Header.Set(\"webhook-id\", \"evt_go\")\n\treq.Header.Set(\"content-type\", \"application/json\")\n\
         \tr, err := http.DefaultClient.Do(req)\n\tif err != nil {\n\t\tfmt.Fprintln(os.Stderr, err)\n\t\tos.Exit(1)\n\t}\n\
         \tb, _ := io.ReadAll(r.Body)\n\tfmt.Println(r.StatusCode)\n\tfmt.Println(string(b))\n}\n",
    )
    .unwrap();
    let mut cmd = Command::new(go);
    cmd.arg("run")
        .arg(src.path().join("main.go"))
        .env(
            "URL",
            format!("https://hooks.localhost:{}/hook?client=1", s.front_addr.port()),
        )
        .env("BODY", BODY)
        .env("HTTPS_PROXY", s.proxy())
        .env("SSL_CERT_FILE", s.ca());
    let out = run(cmd).await;
    s.delivered_once_after_a_restart(out, "evt_go").await;
}

/// Deliveries courier holds, through the admin API.
async fn stored(c: &Courier) -> usize {
    let list = get(&c.admin_url("/deliveries?limit=100")).await.json();
    list["deliveries"].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn a_passthrough_host_is_tunnelled_untouched_and_an_unlisted_one_refused() {
    let Some(_) = tool("curl", &["--version"], "curl") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("receiver");
    let rx = Receiver::start().await;
    let front = TlsFront::start(pki.server(&[&TLS13, &TLS12], None), &rx).await;
    let c = Courier::start(
        dir.path(),
        &config(
            &pki,
            "hosts = [\"hooks.localhost\"]\npassthrough = [\"localhost\"]\nmax_tunnels = 1",
        ),
    );
    let proxy = format!("http://courier:{TOKEN}@{}", c.ingress);
    // The client's own TLS to the receiver, verified with the receiver's CA.
    let ca = pki.ca_file.to_str().unwrap();
    let out = run(curl(&[
        "--proxy",
        &proxy,
        "--cacert",
        ca,
        "-d",
        "plain",
        &front.url("/direct"),
    ]))
    .await;
    assert!(status_line(&out).starts_with("200 "), "{out:?}");
    let seen = rx.wait_for(1).await;
    assert_eq!(seen[0].path, "/direct");
    assert!(seen[0].header("webhook-signature").is_none(), "not courier's request");
    assert!(front.handshakes().iter().all(|h| h.error.is_none()));
    assert_eq!(stored(&c).await, 0, "nothing stored for a passthrough");
    let metrics = get(&c.admin_url("/metrics")).await.text();
    assert!(
        metrics.contains("courier_tunnels_total{kind=\"passthrough\"} 1\n"),
        "{metrics}"
    );

    // Not listed: refused before any tunnel, nothing stored.
    let other = format!("https://other.localhost:{}/hook", front.addr.port());
    let out = run(curl(&["--proxy", &proxy, "--cacert", ca, "-d", "x", &other])).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("403"), "{out:?}");
    let answer = raw(c.ingress, b"CONNECT other.localhost:443 HTTP/1.1\r\nHost: other.localhost:443\r\nProxy-Authorization: Bearer intercept-tok\r\n\r\n");
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(answer.contains("\"error\":\"not_intercepted\""), "{answer}");
    assert_eq!(stored(&c).await, 0);
    assert_eq!(rx.seen().len(), 1);

    // Bounded: with one tunnel held open (max_tunnels = 1), the next CONNECT is refused.
    eventually("the first tunnel closed", || async {
        let m = get(&c.admin_url("/metrics")).await.text();
        m.contains("courier_tunnels_open{kind=\"passthrough\"} 0\n")
            .then_some(())
    })
    .await;
    let connect = format!(
        "CONNECT localhost:{} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Bearer {TOKEN}\r\n\r\n",
        front.addr.port()
    );
    let mut held = std::net::TcpStream::connect(c.ingress).unwrap();
    std::io::Write::write_all(&mut held, connect.as_bytes()).unwrap();
    let mut head = [0u8; 12];
    std::io::Read::read_exact(&mut held, &mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let answer = raw(c.ingress, connect.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("intercept.max_tunnels"), "{answer}");
    drop(held);
}

#[tokio::test]
async fn hostile_connects_are_refused_before_any_tunnel() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("receiver");
    // The default egress policy (no private targets): passthrough "*" still reaches no
    // loopback or private address, by IP literal or by name.
    let cfg = config(&pki, "hosts = [\"hooks.localhost\"]\npassthrough = [\"*\"]")
        .replace("[tls]", "[egress]\nallow_private_targets = false\n[tls]");
    let c = Courier::start(dir.path(), &cfg);
    let admin = c.admin.to_string();
    let bearer = "Proxy-Authorization: Bearer intercept-tok\r\n";
    for (request, status, code) in [
        ("CONNECT hooks.localhost:443 HTTP/1.1\r\nHost: x\r\n\r\n".to_string(), "407", "unauthorized"),
        (
            "CONNECT hooks.localhost:443 HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic Y291cmllcjp3cm9uZw==\r\n\r\n"
                .to_string(),
            "407",
            "unauthorized",
        ),
        (
            format!("CONNECT hooks.localhost:443 HTTP/1.1\r\nHost: x\r\nOrigin: https://evil.example\r\n{bearer}\r\n"),
            "403",
            "cross_site_refused",
        ),
        (format!("CONNECT {admin} HTTP/1.1\r\nHost: x\r\n{bearer}\r\n"), "403", "egress_denied"),
        (format!("CONNECT localhost:22 HTTP/1.1\r\nHost: x\r\n{bearer}\r\n"), "403", "egress_denied"),
        (format!("CONNECT [::1]:22 HTTP/1.1\r\nHost: x\r\n{bearer}\r\n"), "403", "egress_denied"),
    ] {
        let answer = raw(c.ingress, request.as_bytes());
        assert!(answer.starts_with(&format!("HTTP/1.1 {status}")), "{request:?}: {answer}");
        assert!(answer.contains(&format!("\"error\":\"{code}\"")), "{request:?}: {answer}");
        if status == "407" {
            let challenge = "proxy-authenticate: Basic realm=\"courier\"";
            assert!(answer.to_ascii_lowercase().contains(&challenge.to_ascii_lowercase()), "{answer}");
        }
    }
    let metrics = get(&c.admin_url("/metrics")).await.text();
    assert!(
        metrics.contains("courier_tunnels_total{kind=\"passthrough\"} 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("courier_tunnels_total{kind=\"intercept\"} 0\n"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_ca_fails_its_handshake_and_nothing_is_stored() {
    let Some(_) = tool("curl", &["--version"], "curl") else {
        return;
    };
    let s = Setup::start().await;
    let url = format!("https://hooks.localhost:{}/hook", s.front_addr.port());
    // The receiver's CA, not courier's: the minted certificate is not trusted.
    let wrong_ca = s.pki.ca_file.to_str().unwrap().to_string();
    for _ in 0..3 {
        let out = run(curl(&["--proxy", &s.proxy(), "--cacert", &wrong_ca, "-d", "x", &url])).await;
        assert_eq!(out.status.code(), Some(60), "a certificate problem: {out:?}");
    }
    assert_eq!(stored(&s.c).await, 0);
    let metrics = get(&s.c.admin_url("/metrics")).await.text();
    assert!(metrics.contains("courier_tunnel_tls_failures_total 3\n"), "{metrics}");
    let warned =
        s.c.log
            .all()
            .matches("failed the TLS handshake of an intercepted tunnel")
            .count();
    assert_eq!(warned, 1, "said once per client: {}", s.c.log.all());
}

#[tokio::test]
async fn intercept_ca_prints_the_certificate_and_a_host_outside_it_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[intercept]\nhosts = [\"hooks.example\"]\n").unwrap();
    let args = |verb: &[&'static str]| -> Vec<String> {
        let mut a = vec![
            "--config".into(),
            cfg.display().to_string(),
            "--data-dir".into(),
            data.display().to_string(),
        ];
        a.extend(verb.iter().map(|s| s.to_string()));
        a
    };
    let cli = |a: Vec<String>| async move {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        courier_cli(&a, &[], "").await
    };
    // Made on first use, by the verb as by the first start; the same after.
    let first = cli(args(&["intercept", "ca"])).await;
    assert!(first.status.success(), "{first:?}");
    let pem = String::from_utf8(first.stdout).unwrap();
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
    assert_eq!(std::fs::read_to_string(data.join("intercept-ca.pem")).unwrap(), pem);
    let again = cli(args(&["intercept", "ca"])).await;
    assert_eq!(String::from_utf8(again.stdout).unwrap(), pem);
    // A host added later is outside the CA's constraints: one line, exit 1.
    std::fs::write(&cfg, "[intercept]\nhosts = [\"hooks.example\", \"new.example\"]\n").unwrap();
    let serve: &[&'static str] = &["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "serve"];
    for verb in [&["check-config"][..], serve] {
        let refused = cli(args(verb)).await;
        let err = String::from_utf8_lossy(&refused.stderr).to_string();
        assert!(!refused.status.success(), "{verb:?}");
        assert!(
            err.contains("intercept.hosts new.example is not covered by the CA at"),
            "{verb:?}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    // No hosts and no CA: nothing to print.
    std::fs::write(&cfg, "").unwrap();
    let none = cli(vec![
        "--config".into(),
        cfg.display().to_string(),
        "--data-dir".into(),
        dir.path().join("other").display().to_string(),
        "intercept".into(),
        "ca".into(),
    ])
    .await;
    assert!(!none.status.success());
    assert!(String::from_utf8_lossy(&none.stderr).contains("no [intercept] hosts are listed"));
}

#[path = "intercept_ca.rs"]
mod ca;
