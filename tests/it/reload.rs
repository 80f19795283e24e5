//! Live reload against the real binary: SIGHUP and `courier reload` re-read the config; a
//! signing rotation under traffic loses nothing and signs every later message with the new
//! list; a bad config is refused and the running one kept; a restart-only change is named;
//! a token rotation or a narrower `[egress]` reaches `CONNECT` tunnels already open.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::support::*;

const KEY_A: &[u8] = b"reload-key-A-0123456789";
const KEY_B: &[u8] = b"reload-key-B-abcdefghij";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The config with `keys` as the signing rotation list (first signs first).
fn signing(keys: &[&[u8]], extra: &str) -> String {
    let list: Vec<String> = keys.iter().map(|k| format!("\"whsec_{}\"", b64(k))).collect();
    format!(
        "allow_private_targets = true\n{extra}\n[signing]\nsecrets = [{}]\n",
        list.join(", ")
    )
}

/// The Standard Webhooks signature header `keys` give for what `seen` carries.
fn expected_signature(seen: &Seen, keys: &[&[u8]]) -> String {
    let id = seen.header("webhook-id").unwrap();
    let ts = seen.header("webhook-timestamp").unwrap();
    let mut signed = format!("{id}.{ts}.").into_bytes();
    signed.extend_from_slice(&seen.body);
    keys.iter()
        .map(|k| {
            let mut m = Hmac::<Sha256>::new_from_slice(k).unwrap();
            m.update(&signed);
            format!("v1,{}", b64(&m.finalize().into_bytes()))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Posts messages with ids `{prefix}-{i}`, one after another; each must be accepted.
async fn post_batch(target: &str, prefix: &str, n: usize) -> Vec<String> {
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    for id in &ids {
        let a = post(target, &[("webhook-id", id.as_str())], format!("{{\"id\":\"{id}\"}}")).await;
        assert_eq!(a.status, 202, "{id}: {}", a.text());
    }
    ids
}

/// Waits (on the receiver's own notifications, up to its deadline) until every one of `ids`
/// has been seen.
async fn wait_delivered(rx: &Receiver, ids: &[String]) {
    let want: HashSet<&String> = ids.iter().collect();
    let mut n = 1;
    loop {
        let seen = rx.wait_for(n).await;
        let got: HashSet<String> = seen.iter().filter_map(|s| s.header("webhook-id")).collect();
        if want.iter().all(|id| got.contains(*id)) {
            return;
        }
        n = seen.len() + 1;
    }
}

fn reload_cli(c: &Courier) -> std::process::Output {
    std::process::Command::new(bin())
        .args(["reload", "--admin-listen", &c.admin.to_string()])
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_signing_rotation_under_traffic_loses_nothing_and_signs_every_later_message_with_the_new_list() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), &signing(&[KEY_A], ""));
    let target = c.prefixed(&rx.url("/hook"));
    let mut expected: HashMap<String, Vec<Vec<&[u8]>>> = HashMap::new();
    let any_list = vec![vec![KEY_A], vec![KEY_B, KEY_A], vec![KEY_B]];

    // Each batch is delivered before the next reload: courier signs when it attempts, so a
    // first attempt delayed past a reload would rightly carry the newer list.
    let before = post_batch(&target, "before", 20).await;
    wait_delivered(&rx, &before).await;
    for id in before {
        expected.insert(id, vec![vec![KEY_A]]);
    }
    // Traffic that does not stop for the reloads: one sender, message after message.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let traffic = {
        let (stop, sent, target) = (stop.clone(), sent.clone(), target.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let id = format!("during-{i}");
                let a = post(&target, &[("webhook-id", id.as_str())], format!("{{\"n\":{i}}}")).await;
                assert_eq!(a.status, 202, "{id}: {}", a.text());
                sent.lock().unwrap().push(id);
                i += 1;
            }
        })
    };

    // Rotation step 1 (SIGHUP): the new key first, the old one still signing.
    std::fs::write(&c.config_path, signing(&[KEY_B, KEY_A], "")).unwrap();
    c.signal("HUP");
    assert!(c.log.wait_for_count("config reloaded", 1, WAIT), "{}", c.log.all());
    // Accepted after the reload was applied: every attempt signs with the new list.
    let after_hup = post_batch(&target, "after-hup", 20).await;
    wait_delivered(&rx, &after_hup).await;
    for id in after_hup {
        expected.insert(id, vec![vec![KEY_B, KEY_A]]);
    }

    // Rotation step 2 (`courier reload`): the old key retired.
    std::fs::write(&c.config_path, signing(&[KEY_B], "")).unwrap();
    let out = reload_cli(&c);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "config reloaded");
    for id in post_batch(&target, "after-cli", 20).await {
        expected.insert(id, vec![vec![KEY_B]]);
    }
    stop.store(true, Ordering::SeqCst);
    traffic.await.unwrap();
    let during = sent.lock().unwrap().clone();
    assert!(!during.is_empty());
    for id in during {
        // Signed before, between or after the reloads, by one of the lists in force.
        expected.insert(id, any_list.clone());
    }

    // Nothing lost, and every attempt carries the signature of an allowed list.
    let seen = rx.wait_for(expected.len()).await;
    let mut delivered = HashMap::new();
    for s in &seen {
        let id = s.header("webhook-id").unwrap();
        let lists = expected.get(&id).unwrap_or_else(|| panic!("unexpected delivery {id}"));
        let got = s.header("webhook-signature").unwrap();
        assert!(
            lists.iter().any(|keys| expected_signature(s, keys) == got),
            "{id}: signature {got} is from none of the lists allowed for it"
        );
        delivered.insert(id, ());
    }
    assert_eq!(delivered.len(), expected.len(), "every accepted message delivered");
}

#[tokio::test]
async fn a_bad_config_is_refused_and_the_running_one_kept_and_restart_only_changes_are_named() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), &signing(&[KEY_A], ""));
    let target = c.prefixed(&rx.url("/hook"));

    // A syntax error: refused, one line, the old secret still signs.
    std::fs::write(&c.config_path, "[signing\nsecrets = 1\n").unwrap();
    c.signal("HUP");
    let line = c.log.wait_for("config reload refused", WAIT).expect("refusal logged");
    assert!(line.contains("running config is kept"), "{line}");
    post_batch(&target, "kept", 1).await;
    let s = &rx.wait_for(1).await[0];
    assert_eq!(s.header("webhook-signature").unwrap(), expected_signature(s, &[KEY_A]));

    // Through the admin API: a bad value gets a code and the reason.
    std::fs::write(&c.config_path, signing(&[KEY_A], "[retry]\nbase_delay = \"soon\"\n")).unwrap();
    let a = request("POST", &c.admin_url("/reload"), &[], "").await;
    assert_eq!(a.status, 400, "{}", a.text());
    assert_eq!(a.json()["error"], "invalid_config");
    assert!(a.text().contains("retry.base_delay"), "{}", a.text());

    // A restart-only setting changed with a reloadable one: the one applied, the other named.
    std::fs::write(
        &c.config_path,
        signing(
            &[KEY_B],
            "retention = \"1d\"\n[[route]]\nname = \"late\"\nurl = \"http://127.0.0.1:9/x\"\n",
        ),
    )
    .unwrap();
    let a = request("POST", &c.admin_url("/reload"), &[], "").await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["restart_required"], serde_json::json!(["retention"]));
    assert!(c.log.wait_for("take effect only at restart", WAIT).is_some());
    // The route added by the reload accepts now.
    let a = post(&format!("http://{}/r/late", c.ingress), &[], "{}").await;
    assert_eq!(a.status, 202, "{}", a.text());
    post_batch(&target, "new", 1).await;
    let seen = rx.wait_for(2).await;
    let s = seen
        .iter()
        .find(|s| s.header("webhook-id").unwrap() == "new-0")
        .unwrap();
    assert_eq!(s.header("webhook-signature").unwrap(), expected_signature(s, &[KEY_B]));
}

/// The config of the tunnel tests: ingress needs `token`; `hooks.localhost` is
/// intercepted, `localhost` passed through; `egress` is the `[egress]` section's body.
fn tunnels(token: &str, egress: &str) -> String {
    format!(
        "ingress_token = \"{token}\"\n[egress]\n{egress}\n[intercept]\nhosts = [\"hooks.localhost\"]\n\
         passthrough = [\"localhost\"]\n"
    )
}

/// Reloads `c` with `config` (SIGHUP) and waits until the `n`th reload is applied.
fn reload_with(c: &Courier, config: &str, n: usize) {
    std::fs::write(&c.config_path, config).unwrap();
    c.signal("HUP");
    assert!(c.log.wait_for_count("config reloaded", n, WAIT), "{}", c.log.all());
}

/// Sends `CONNECT <authority>` with `token` on a new connection to ingress; the stream once
/// answered 200.
async fn connect(c: &Courier, authority: &str, token: &str) -> TcpStream {
    let mut tcp = TcpStream::connect(c.ingress).await.unwrap();
    let head =
        format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\nProxy-Authorization: Bearer {token}\r\n\r\n");
    tcp.write_all(head.as_bytes()).await.unwrap();
    // The answer's head, byte by byte: the tunnel's bytes follow it at once.
    let mut answer = Vec::new();
    while !answer.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        assert_eq!(
            tcp.read(&mut byte).await.unwrap(),
            1,
            "{}",
            String::from_utf8_lossy(&answer)
        );
        answer.push(byte[0]);
    }
    let answer = String::from_utf8_lossy(&answer).to_string();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    tcp
}

type Inside = hyper::client::conn::http1::SendRequest<String>;

/// An intercepted tunnel to `hooks.localhost`: TLS to courier (trusting its CA), HTTP/1.1
/// inside.
async fn intercepted(c: &Courier, token: &str) -> Inside {
    use rustls::pki_types::pem::PemObject;
    let tcp = connect(c, "hooks.localhost:443", token).await;
    let ca = rustls::pki_types::CertificateDer::from_pem_file(c.data_dir.join("intercept-ca.pem")).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("hooks.localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    let io = hyper_util::rt::TokioIo::new(tls);
    let (send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    send
}

/// One POST inside the tunnel: `(status, body)`, or `None` when the tunnel is closed.
async fn post_inside(send: &mut Inside, id: &str) -> Option<(u16, String)> {
    use http_body_util::BodyExt;
    let req = hyper::Request::post("/hook")
        .header("host", "hooks.localhost")
        .header("webhook-id", id)
        .body("{}".to_string())
        .unwrap();
    send.ready().await.ok()?;
    let resp = send.send_request(req).await.ok()?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Keeps an intercepted tunnel busy: one request accepted now, then one after another
/// until one is not; that one's answer, or `None` when the tunnel closed.
async fn busy_intercepted(c: &Courier, token: &str) -> JoinHandle<Option<(u16, String)>> {
    let mut send = intercepted(c, token).await;
    assert_eq!(post_inside(&mut send, "busy-0").await.map(|a| a.0), Some(202));
    tokio::spawn(async move {
        for i in 1.. {
            match post_inside(&mut send, &format!("busy-{i}")).await {
                Some((202, _)) => tokio::time::sleep(PACE).await,
                other => return other,
            }
        }
        unreachable!()
    })
}

/// Between two rounds in a busy tunnel: busy, not flooding.
const PACE: std::time::Duration = std::time::Duration::from_millis(20);

/// A TCP echo server on 127.0.0.1: the passthrough's far end.
async fn echo_server() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = tcp.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// One round through a passthrough tunnel to [`echo_server`]; whether it came back.
async fn echo_round(tcp: &mut TcpStream, round: usize) -> bool {
    let ping = format!("ping-{round:06}");
    let mut back = vec![0u8; ping.len()];
    let went = tcp.write_all(ping.as_bytes()).await.is_ok() && tcp.read_exact(&mut back).await.is_ok();
    went && back == ping.as_bytes()
}

/// Keeps a passthrough tunnel to `far` busy: one round now, then round after round until
/// the tunnel closes.
async fn busy_passthrough(c: &Courier, far: std::net::SocketAddr, token: &str) -> JoinHandle<()> {
    let mut tcp = connect(c, &format!("localhost:{}", far.port()), token).await;
    assert!(echo_round(&mut tcp, 0).await);
    tokio::spawn(async move {
        for round in 1.. {
            if !echo_round(&mut tcp, round).await {
                return;
            }
            tokio::time::sleep(PACE).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_rotation_reaches_busy_tunnels_opened_with_the_old_token() {
    let far = echo_server().await;
    let d = tempfile::tempdir().unwrap();
    let open = "allow_private_targets = true";
    let c = Courier::start(d.path(), &tunnels("old-token", open));
    let inside = busy_intercepted(&c, "old-token").await;
    let bytes = busy_passthrough(&c, far, "old-token").await;
    reload_with(&c, &tunnels("new-token", open), 1);

    // The intercepted tunnel refuses its next request, or is closed.
    let last = tokio::time::timeout(WAIT, inside).await;
    if let Some((status, body)) = last.expect("still served after the rotation").unwrap() {
        assert_eq!(status, 401, "{body}");
        assert!(body.contains("\"error\":\"unauthorized\""), "{body}");
    }
    // The passthrough tunnel is closed.
    let closed = tokio::time::timeout(WAIT, bytes).await;
    closed.expect("still open after the rotation").unwrap();
    let line = c.log.wait_for("a reload revoked an open tunnel", WAIT).expect("logged");
    assert!(line.contains("ingress_token"), "{line}");

    // New tunnels: the old token is refused, the new one works.
    let connect_old =
        b"CONNECT hooks.localhost:443 HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Bearer old-token\r\n\r\n";
    let answer = raw(c.ingress, connect_old);
    assert!(answer.starts_with("HTTP/1.1 407"), "{answer}");
    let mut send = intercepted(&c, "new-token").await;
    assert_eq!(post_inside(&mut send, "new").await.map(|a| a.0), Some(202));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn narrowing_egress_closes_a_busy_passthrough_and_refuses_inside_an_intercepted_tunnel() {
    let far = echo_server().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), &tunnels("tok", "allow_private_targets = true"));
    let mut inside = intercepted(&c, "tok").await;
    assert_eq!(post_inside(&mut inside, "before").await.map(|a| a.0), Some(202));
    let bytes = busy_passthrough(&c, far, "tok").await;
    // Loopback no longer allowed.
    reload_with(&c, &tunnels("tok", "allow_private_targets = false"), 1);

    let closed = tokio::time::timeout(WAIT, bytes).await;
    closed.expect("still open after the narrowing").unwrap();
    let line = c.log.wait_for("a reload revoked an open tunnel", WAIT).expect("logged");
    assert!(line.contains("is not allowed (loopback address)"), "{line}");
    // Inside an intercepted tunnel each request is checked as any accept is.
    let (status, body) = post_inside(&mut inside, "after").await.expect("an answer");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("\"error\":\"egress_denied\""), "{body}");
}
