//! The egress proxy (`egress.proxy`, `egress.no_proxy`) through a real tinyproxy started
//! by the test on 127.0.0.1 (Debian's `tinyproxy`, installed by `scripts/verifiers.sh`,
//! found through `COURIER_TEST_TINYPROXY`): http targets in absolute form, https targets
//! through CONNECT with TLS end to end, `no_proxy` targets direct, bad credentials a 407
//! attempt error that is retried, and the egress policy applied to the target even when
//! proxied (through the resolver seam: no private address is ever contacted).

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustls::version::{TLS12, TLS13};

use crate::hardening::InProc;
use crate::support::*;
use crate::support_tls::*;

const FAST: &str = "[retry]\nbase_delay = \"100ms\"\nmax_delay = \"400ms\"\njitter = \"none\"\n";

/// tinyproxy in the foreground on a free loopback port, its log (stdout) followed.
struct Tinyproxy {
    child: Child,
    addr: SocketAddr,
    log: Lines,
    _dir: tempfile::TempDir,
}

impl Tinyproxy {
    /// Starts tinyproxy requiring `user:pass` when given and allowing CONNECT to `ports`
    /// only; `None` (after [`skip`]) when tinyproxy is not installed.
    fn start(auth: Option<&str>, ports: &[u16]) -> Option<Tinyproxy> {
        let Some(bin) = tinyproxy_bin() else {
            skip("tinyproxy is not installed (Debian: tinyproxy; scripts/verifiers.sh installs it)");
            return None;
        };
        // tinyproxy needs a fixed port: a free one is picked, and picked again if another
        // process takes it before tinyproxy binds it.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let dir = tempfile::tempdir().unwrap();
            let mut conf = format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 30\nLogLevel Connect\nMaxClients 20\nAllow 127.0.0.1\n"
            );
            if let Some((user, pass)) = auth.and_then(|a| a.split_once(':')) {
                conf.push_str(&format!("BasicAuth {user} {pass}\n"));
            }
            for p in ports {
                conf.push_str(&format!("ConnectPort {p}\n"));
            }
            let path = dir.path().join("tinyproxy.conf");
            std::fs::write(&path, conf).unwrap();
            let mut child = Command::new(&bin)
                .arg("-d")
                .arg("-c")
                .arg(&path)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("start tinyproxy");
            let log = Lines::default();
            let (out, l) = (child.stdout.take().unwrap(), log.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    l.push(line);
                }
            });
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let deadline = Instant::now() + WAIT;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // the port was taken: try another
                }
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    return Some(Tinyproxy {
                        child,
                        addr,
                        log,
                        _dir: dir,
                    });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("tinyproxy did not start");
    }

    /// `http://[creds@]127.0.0.1:<port>`.
    fn url(&self, creds: Option<&str>) -> String {
        match creds {
            Some(c) => format!("http://{c}@{}", self.addr),
            None => format!("http://{}", self.addr),
        }
    }

    /// Waits for a log line containing `needle`.
    fn logged(&self, needle: &str) -> String {
        self.log
            .wait_for(needle, WAIT)
            .unwrap_or_else(|| panic!("tinyproxy never logged {needle:?}; its log:\n{}", self.log.all()))
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `COURIER_TEST_TINYPROXY`, else `tinyproxy` on PATH, if it runs.
fn tinyproxy_bin() -> Option<String> {
    let candidates = std::env::var("COURIER_TEST_TINYPROXY")
        .into_iter()
        .chain(["tinyproxy".to_string()]);
    candidates.into_iter().find(|bin| {
        Command::new(bin)
            .arg("-v")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

async fn send(ingress: SocketAddr, target: &str) -> String {
    let a = post(&format!("http://{ingress}/"), &[("courier-target", target)], "{}").await;
    assert_eq!(a.status, 202, "{target}: {}", a.text());
    a.json()["id"].as_str().unwrap().to_string()
}

/// Through the resolver seam: `hooks.test` is 127.0.0.1 (allowed), `evil.test` 10.0.0.1
/// (refused). The proxy is asked for the checked address, never the name: CONNECT to
/// 127.0.0.1 with TLS verified against `hooks.test`, and the http request line addressed
/// to 127.0.0.1; `evil.test` is refused before the proxy hears of it; `localhost` is in
/// `no_proxy` and goes direct.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_go_through_the_proxy_to_checked_addresses_and_no_proxy_goes_direct() {
    let pki = Pki::new("proxied");
    let rx = Receiver::start().await;
    let front = TlsFront::start(pki.server_for(&["hooks.test"], &[&TLS13, &TLS12]), &rx).await;
    let (rp, fp) = (rx.addr.port(), front.addr.port());
    let Some(proxy) = Tinyproxy::start(None, &[fp]) else {
        return;
    };
    let resolver = crate::support::resolver::StaticResolver::new();
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    resolver.set("hooks.test", vec![ip("127.0.0.1")]);
    resolver.set("evil.test", vec![ip("10.0.0.1")]);
    let c = InProc::start(
        &format!(
            "{FAST}[egress]\nallow = [\"127.0.0.1/32\"]\nproxy = {:?}\nno_proxy = [\"localhost\"]\n[tls]\nca_file = {}\n",
            proxy.url(None),
            toml_path(&pki.ca_file)
        ),
        &resolver,
    )
    .await;

    let id = send(c.ingress(), &format!("https://hooks.test:{fp}/tunnel")).await;
    c.wait_state(&id, "delivered").await;
    proxy.logged(&format!("CONNECT 127.0.0.1:{fp} "));
    assert!(front.handshakes()[0].error.is_none());

    let id = send(c.ingress(), &format!("http://hooks.test:{rp}/plain")).await;
    c.wait_state(&id, "delivered").await;
    proxy.logged(&format!("POST http://127.0.0.1:{rp}/plain "));

    let id = send(c.ingress(), &format!("http://localhost:{rp}/direct")).await;
    c.wait_state(&id, "delivered").await;

    for target in [format!("https://evil.test:{fp}/x"), format!("http://evil.test:{rp}/x")] {
        let id = send(c.ingress(), &target).await;
        let d = c.wait_state(&id, "dead").await;
        assert_eq!(d["dead_reason"], "egress_denied", "{target}: {d}");
        assert!(d["last_error"].as_str().unwrap().contains("10.0.0.1"), "{d}");
    }
    assert!(!proxy.log.all().contains("10.0.0.1"), "{}", proxy.log.all());

    let seen = rx.seen();
    let by_path = |p: &str| {
        seen.iter()
            .find(|s| s.path == p)
            .unwrap_or_else(|| panic!("{p}: {seen:?}"))
    };
    // Through the proxy: it says so in Via. The TLS tunnel is opaque to it.
    assert!(by_path("/plain").header("via").is_some_and(|v| v.contains("tinyproxy")));
    assert_eq!(by_path("/tunnel").header("via"), None);
    assert_eq!(
        by_path("/tunnel").header("host").as_deref(),
        Some(&*format!("hooks.test:{fp}"))
    );
    assert_eq!(by_path("/direct").header("via"), None);
    // The request line named the checked address, and a proxy must take the Host from it
    // (RFC 9112 §3.2.2): tinyproxy does.
    assert_eq!(
        by_path("/plain").header("host").as_deref(),
        Some(&*format!("127.0.0.1:{rp}"))
    );
    assert_eq!(seen.len(), 3, "{seen:?}");
    c.stop().await;
}

/// The proxy wants credentials: courier sends those of `egress.proxy` as
/// `Proxy-Authorization: Basic`. Without them the proxy answers 407, an attempt error that
/// is retried, for both kinds of target; wrong ones (which tinyproxy answers with 401) name
/// the proxy's answer. The password shows nowhere.
#[tokio::test]
async fn proxy_credentials_are_sent_and_a_407_is_an_attempt_error_that_is_retried() {
    let pki = Pki::new("auth");
    let rx = Receiver::start().await;
    let front = TlsFront::start(pki.server(&[&TLS13, &TLS12], None), &rx).await;
    let (rp, fp) = (rx.addr.port(), front.addr.port());
    let Some(proxy) = Tinyproxy::start(Some("courier:s3cr3t-pw"), &[fp]) else {
        return;
    };
    let config = |creds: Option<&str>| {
        format!(
            "{FAST}[egress]\nallow_private_targets = true\nproxy = {:?}\n[tls]\nca_file = {}\n",
            proxy.url(creds),
            toml_path(&pki.ca_file)
        )
    };
    let d = tempfile::tempdir().unwrap();
    let good = Courier::start(d.path(), &config(Some("courier:s3cr3t-pw")));
    for target in [
        format!("https://127.0.0.1:{fp}/ok-tls"),
        format!("http://127.0.0.1:{rp}/ok"),
    ] {
        let id = send(good.ingress, &target).await;
        wait_state(&good, &id, "delivered").await;
    }

    let d2 = tempfile::tempdir().unwrap();
    let none = Courier::start(d2.path(), &config(None));
    for target in [
        format!("https://127.0.0.1:{fp}/no-tls"),
        format!("http://127.0.0.1:{rp}/no"),
    ] {
        let errors = failed_attempts(&none, &send(none.ingress, &target).await, 2).await;
        for e in &errors {
            assert!(
                e.contains("answered 407 Proxy Authentication Required"),
                "{target}: {errors:?}"
            );
        }
    }

    let d3 = tempfile::tempdir().unwrap();
    let wrong = Courier::start(d3.path(), &config(Some("courier:wr0ng-pw")));
    let id = send(wrong.ingress, &format!("https://127.0.0.1:{fp}/wrong")).await;
    let errors = failed_attempts(&wrong, &id, 2).await;
    assert!(
        errors[0].contains("answered 401 Unauthorized to CONNECT") && errors[0].contains("credentials are refused"),
        "{errors:?}"
    );
    let d = delivery(&wrong, &id).await;
    assert_eq!(d["state"], "pending", "retried: {d}");

    let paths: Vec<String> = rx.seen().iter().map(|s| s.path.clone()).collect();
    assert_eq!(paths, ["/ok-tls", "/ok"]);
    assert!(!d.to_string().contains("wr0ng-pw"), "{d}");
    for c in [&good, &none, &wrong] {
        let log = c.log.all();
        assert!(!log.contains("s3cr3t-pw") && !log.contains("wr0ng-pw"), "{log}");
    }
    let out = Command::new(bin())
        .args(["check-config", "--config"])
        .arg(d3.path().join("courier.toml"))
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(
        summary.contains(&format!("egress: proxy http://{} (credentials set)", proxy.addr)),
        "{summary}"
    );
    assert!(!summary.contains("wr0ng-pw"), "{summary}");
}

/// Waits until the delivery has at least `n` attempts, all failed; returns their errors.
async fn failed_attempts(c: &Courier, id: &str, n: usize) -> Vec<String> {
    eventually(&format!("{n} failed attempts of {id}"), || async {
        let d = delivery(c, id).await;
        let history = d["history"].as_array().cloned().unwrap_or_default();
        let errors: Vec<String> = history
            .iter()
            .map(|a| a["error"].as_str().unwrap_or("no error").to_string())
            .collect();
        (errors.len() >= n).then_some(errors)
    })
    .await
}

/// `no_proxy` naming a network: a target whose *name* the proxy would take but whose
/// checked address `no_proxy` lists goes direct, and the proxy's credentials stay with the
/// proxy (they are never sent to a receiver).
#[tokio::test]
async fn a_target_whose_address_no_proxy_lists_goes_direct_without_the_proxy_credentials() {
    let rx = Receiver::start().await;
    let Some(proxy) = Tinyproxy::start(Some("courier:s3cret"), &[]) else {
        return;
    };
    let resolver = crate::support::resolver::StaticResolver::new();
    resolver.set("inside.test", vec!["127.0.0.1".parse().unwrap()]);
    let c = InProc::start(
        &format!(
            "{FAST}[egress]\nallow = [\"127.0.0.1/32\"]\nproxy = {:?}\nno_proxy = [\"127.0.0.0/8\"]\n",
            proxy.url(Some("courier:s3cret"))
        ),
        &resolver,
    )
    .await;
    let id = send(c.ingress(), &format!("http://inside.test:{}/hook", rx.addr.port())).await;
    c.wait_state(&id, "delivered").await;
    let seen = rx.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen[0].header("proxy-authorization"),
        None,
        "credentials sent to the receiver"
    );
    assert_eq!(seen[0].header("via"), None, "went through the proxy");
    assert_eq!(
        seen[0].header("host").as_deref(),
        Some(&*format!("inside.test:{}", rx.addr.port()))
    );
    c.stop().await;
}
