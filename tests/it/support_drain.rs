//! Test support for `courier drain`: many messages posted through one pooled client at a
//! bounded concurrency (10,000 in seconds), the verb run as its own process, a counter
//! read from `/metrics`, and a listener that counts who connects to it.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinSet;

use crate::support::{bin, Courier, WAIT};

/// Requests in flight at once from [`post_many`].
const SENDERS: usize = 32;

/// Posts `n` messages to `target` through `c` (the path form), [`SENDERS`] at a time over
/// one connection pool, each with `webhook-id: <prefix><i>`, body `{"i":<i>}` and the extra
/// `headers`; every one must be accepted (202). Returns the event ids in order.
pub async fn post_many(c: &Courier, target: &str, n: usize, prefix: &str, headers: &[(&str, &str)]) -> Vec<String> {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(SENDERS)
        .build_http();
    let url = c.prefixed(target);
    let headers: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let events: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    let mut sends = JoinSet::new();
    for (i, event) in events.iter().enumerate() {
        if sends.len() >= SENDERS {
            sends.join_next().await.expect("a send").expect("send task");
        }
        let mut req = hyper::Request::post(&url).header("webhook-id", event);
        for (k, v) in &headers {
            req = req.header(k, v);
        }
        let req = req.body(Full::new(Bytes::from(format!("{{\"i\":{i}}}")))).unwrap();
        let client = client.clone();
        sends.spawn(async move {
            let resp = tokio::time::timeout(WAIT, client.request(req))
                .await
                .expect("an answer in time")
                .expect("sent");
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));
        });
    }
    while let Some(done) = sends.join_next().await {
        done.expect("send task");
    }
    events
}

/// `courier drain --to <to>` for the courier of `config` and `data_dir`, with `extra`
/// arguments and none of this process's `COURIER_*` settings.
pub fn drain_command(config: &Path, data_dir: &Path, to: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg("drain")
        .arg("--config")
        .arg(config)
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--to")
        .arg(to)
        .args(extra)
        .stdin(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("COURIER_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Runs [`drain_command`] to its end, off the async runtime; returns what it printed.
pub async fn drain(config: &Path, data_dir: &Path, to: &str, extra: &[&str]) -> Output {
    let mut cmd = drain_command(config, data_dir, to, extra);
    tokio::task::spawn_blocking(move || cmd.output().expect("run courier drain"))
        .await
        .unwrap()
}

/// stdout and stderr of a finished run, for assertion messages.
pub fn printed(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A counter or gauge of `c`'s `/metrics` (0 when courier exports no such sample).
pub async fn metric(c: &Courier, name: &str) -> u64 {
    crate::metrics::scrape(c).await.value(name, &[]).unwrap_or(0.0) as u64
}

/// A TCP listener on loopback that counts the connections made to it and answers none: a
/// peer a drain must not reach.
pub struct Untouched {
    /// Where it listens.
    pub addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl Untouched {
    /// Starts listening.
    pub async fn start() -> Untouched {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let count = connections.clone();
        tokio::spawn(async move {
            while let Ok((_socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
            }
        });
        Untouched { addr, connections }
    }

    /// Connections made to it so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}
