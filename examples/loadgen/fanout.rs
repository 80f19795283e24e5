//! The sending side of the many-endpoints scenario: where message i goes, and N messages
//! sent closed-loop to courier's ingress as fast as it accepts them.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST};
use http::{Method, Request};
use http_body_util::Full;
use tokio::time::Instant;

use crate::hosts::Hosts;
use crate::load::Conn;
use crate::run::Ctx;
use crate::{err, joined, Error, Res};

/// Closed-loop senders: each takes the next message index as soon as its previous message
/// was answered.
pub const SENDERS: usize = 32;

/// Where message i goes.
#[derive(Clone, Copy)]
pub enum Layout {
    /// Every message to `/e/0` on host 0 (answered 200).
    One,
    /// Message i to its own endpoint on host `i % hosts`: `/gone/<i>` (answered 410, so
    /// dead-lettered at once) for one in `gone_every` (10 by default; 1: every one),
    /// `/e/<i>` (answered 200) for the rest.
    Many { hosts: usize, gone_every: u64 },
}

impl Layout {
    /// The path-form path of message `i`.
    pub fn path(self, rx: &Hosts, i: u64) -> String {
        match self {
            Layout::One => format!("/http://{}/e/0", rx.addr(0)),
            Layout::Many { hosts, gone_every } => {
                let kind = if i % gone_every == gone_every - 1 { "gone" } else { "e" };
                format!("/http://{}/{kind}/{i}", rx.addr((i % hosts as u64) as usize))
            }
        }
    }
}

/// Sends message 0..n (`layout` decides where each goes) over [`SENDERS`] keep-alive
/// connections to courier's ingress; a message refused or lost to a connection error is
/// tried again up to five times with the same `webhook-id` (so a retry of a message that
/// was in fact stored is a duplicate, not a second message). Returns (accepted, failed).
pub async fn send_all(
    cx: &Ctx,
    ingress: SocketAddr,
    rx: Arc<Hosts>,
    layout: Layout,
    n: u64,
    deadline: Instant,
) -> Res<(u64, u64)> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..SENDERS {
        let (next, rx, body, seq) = (next.clone(), rx.clone(), cx.body.clone(), cx.seq.clone());
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut failed) = (0u64, 0u64);
            let mut conn: Option<Conn> = None;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let (path, id) = (
                    layout.path(&rx, i),
                    format!("lg-{}", seq.fetch_add(1, Ordering::Relaxed)),
                );
                let mut tries = 0u32;
                loop {
                    if Instant::now() > deadline {
                        return Err(err("many endpoints: sending did not finish in time"));
                    }
                    tries += 1;
                    if conn.is_none() {
                        conn = Conn::open(ingress).await.ok();
                    }
                    let answer = match conn.as_mut() {
                        Some(c) => c.send(post(ingress, &path, &id, &body)?).await,
                        None => Err(err("connect failed")),
                    };
                    match answer {
                        Ok((s, _)) if s.is_success() => {
                            ok += 1;
                            break;
                        }
                        Ok(_) => {}
                        Err(_) => conn = None,
                    }
                    if tries >= 5 {
                        failed += 1;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20 * u64::from(tries))).await;
                }
            }
            Ok::<_, Error>((ok, failed))
        }));
    }
    let (mut ok, mut failed) = (0, 0);
    for t in tasks {
        let (o, f) = joined(t).await??;
        ok += o;
        failed += f;
    }
    Ok((ok, failed))
}

/// A path-form POST of the run's body with event id `id`.
fn post(ingress: SocketAddr, path: &str, id: &str, body: &Bytes) -> Res<Request<Full<Bytes>>> {
    Ok(Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(HOST, ingress.to_string())
        .header(CONTENT_TYPE, "application/json")
        .header("webhook-id", id)
        .body(Full::new(body.clone()))?)
}
