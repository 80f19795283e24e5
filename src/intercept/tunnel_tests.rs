//! The tunnel's copy loop and addressing, in process: bytes both ways, half-close, and
//! the idle and send deadlines.

use super::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

/// A tunnel between an app's end and a receiver's end (both `duplex(64)` pipes), copied
/// with `(idle, send)` deadlines on a task of its own: `(app, receiver, copying)`.
fn tunnel(limits: (Duration, Duration)) -> (DuplexStream, DuplexStream, tokio::task::JoinHandle<()>) {
    let (client, app) = tokio::io::duplex(64);
    let (server, receiver) = tokio::io::duplex(64);
    (
        app,
        receiver,
        tokio::spawn(copy_until_idle(client, None, server, limits)),
    )
}

#[test]
fn a_request_inside_a_tunnel_is_addressed_to_its_target() {
    let req = Request::builder().uri("/hook?x=1").body(()).unwrap();
    let req = addressed(req, "hooks.example:8443");
    assert_eq!(req.uri(), "https://hooks.example:8443/hook?x=1");
    assert!(req.extensions().get::<Tunnelled>().is_some());
    let bare = addressed(Request::builder().uri("*").body(()).unwrap(), "[::1]:443");
    assert_eq!(bare.uri().host(), Some("[::1]"));
}

#[tokio::test]
async fn bytes_go_both_ways_and_an_idle_tunnel_closes() {
    let (mut app, mut receiver, copying) = tunnel((Duration::from_millis(300), Duration::from_secs(30)));
    app.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    receiver.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    receiver.write_all(b"pong").await.unwrap();
    app.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"pong");
    // Nothing more either way: the tunnel closes after the idle timeout.
    tokio::time::timeout(Duration::from_secs(5), copying)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(app.read(&mut buf).await.unwrap(), 0, "closed");
}

#[tokio::test]
async fn a_peer_that_stops_reading_is_cut_when_idle() {
    // The receiver's end is kept but never read: its direction stalls.
    let (mut app, _receiver, copying) = tunnel((Duration::from_millis(300), Duration::from_secs(30)));
    let _ = tokio::time::timeout(Duration::from_millis(500), app.write_all(&[0u8; 4096])).await;
    tokio::time::timeout(Duration::from_secs(5), copying)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_peer_that_stops_reading_is_cut_while_the_other_way_flows() {
    let (mut app, mut receiver, copying) = tunnel((Duration::from_secs(30), Duration::from_millis(300)));
    let started = std::time::Instant::now();
    let flowing = tokio::spawn(async move {
        while receiver.write_all(b"tick").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let reading = tokio::spawn(async move {
        let mut buf = [0u8; 64];
        let _ = tokio::time::timeout(Duration::from_millis(500), app.write_all(&[0u8; 4096])).await;
        while app.read(&mut buf).await.is_ok_and(|n| n > 0) {}
    });
    tokio::time::timeout(Duration::from_secs(5), copying)
        .await
        .expect("cut by the send timeout, not the 30 s idle one")
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    flowing.abort();
    reading.abort();
}

#[tokio::test]
async fn a_half_closed_side_still_gets_the_answer() {
    let (mut app, mut receiver, copying) = tunnel((Duration::from_secs(30), Duration::from_secs(30)));
    app.write_all(b"req").await.unwrap();
    app.shutdown().await.unwrap();
    let mut got = Vec::new();
    receiver.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"req");
    receiver.write_all(b"answer").await.unwrap();
    receiver.shutdown().await.unwrap();
    let mut answer = Vec::new();
    app.read_to_end(&mut answer).await.unwrap();
    assert_eq!(answer, b"answer");
    tokio::time::timeout(Duration::from_secs(5), copying)
        .await
        .unwrap()
        .unwrap();
}
