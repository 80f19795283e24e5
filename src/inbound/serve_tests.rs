//! The accept loop's own limits, in process: the first-bytes timeout, and HTTP/2 with prior
//! knowledge over a Unix socket (the handler sees [`UNIX_PEER`]).

use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

use super::*;

fn echo_peer() -> Handler {
    Arc::new(|peer, _req| Box::pin(async move { text(StatusCode::OK, "text/plain", peer.to_string()) }))
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_header_read_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = ServeLimits {
        header_read_timeout: Duration::from_millis(200),
        ..ServeLimits::default()
    };
    let (_stop, rx) = watch::channel(false);
    tokio::spawn(serve(listener, echo_peer(), limits, rx));
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("closed by courier")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn http2_prior_knowledge_is_served_over_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let (_stop, rx) = watch::channel(false);
    tokio::spawn(serve(Listener::Unix(listener), echo_peer(), ServeLimits::default(), rx));
    let stream = tokio::net::UnixStream::connect(&path).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::get("http://localhost/")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!((resp.version(), resp.status()), (http::Version::HTTP_2, StatusCode::OK));
    use http_body_util::BodyExt;
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, UNIX_PEER.to_string());
}

#[test]
fn an_http2_request_is_handed_on_in_origin_form_with_its_authority_as_host() {
    let mut req = Request::post("http://courier.internal:8787/https://r.example/h?x=1")
        .body(())
        .unwrap();
    *req.version_mut() = http::Version::HTTP_2;
    let req = as_origin_form(req);
    assert_eq!(req.uri(), "/https://r.example/h?x=1");
    assert_eq!(req.headers()[http::header::HOST], "courier.internal:8787");
    // HTTP/1.1 absolute-form (proxy) requests are left alone.
    let req = as_origin_form(Request::post("http://r.example/h").body(()).unwrap());
    assert_eq!(
        (req.uri().host(), req.headers().get(http::header::HOST)),
        (Some("r.example"), None)
    );
}

#[tokio::test]
async fn http2_streams_past_the_request_cap_are_answered_overloaded_at_once() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let arrived = Arc::new(Semaphore::new(0));
    let (g, a) = (gate.clone(), arrived.clone());
    // Holds every request it gets until the gate opens, so they are in progress together.
    let handler: Handler = Arc::new(move |_peer, _req| {
        let (g, a) = (g.clone(), a.clone());
        Box::pin(async move {
            a.add_permits(1);
            g.acquire().await.unwrap().forget();
            empty(StatusCode::OK)
        })
    });
    let limits = ServeLimits {
        max_requests: 3,
        ..ServeLimits::default()
    };
    let (_stop, rx) = watch::channel(false);
    tokio::spawn(serve(listener, handler, limits, rx));
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let get = || {
        Request::get("http://localhost/")
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap()
    };
    let held: Vec<_> = (0..3)
        .map(|_| {
            let (mut s, req) = (send.clone(), get());
            tokio::spawn(async move { s.send_request(req).await.unwrap().status() })
        })
        .collect();
    arrived.acquire_many(3).await.unwrap().forget();
    // One connection, three streams in progress: more are refused at once, not queued.
    for _ in 0..2 {
        let resp = tokio::time::timeout(Duration::from_secs(5), send.clone().send_request(get()))
            .await
            .expect("answered at once")
            .unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[http::header::RETRY_AFTER], "1");
    }
    gate.add_permits(3);
    for h in held {
        assert_eq!(h.await.unwrap(), StatusCode::OK);
    }
    // The slots are back.
    let resp = send.clone().send_request(get());
    gate.add_permits(1);
    assert_eq!(resp.await.unwrap().status(), StatusCode::OK);
}

#[tokio::test]
async fn a_late_first_byte_does_not_buy_a_second_header_timeout() {
    use tokio::io::AsyncWriteExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = ServeLimits {
        header_read_timeout: Duration::from_secs(3),
        ..ServeLimits::default()
    };
    let (_stop, rx) = watch::channel(false);
    tokio::spawn(serve(listener, echo_peer(), limits, rx));
    let started = Instant::now();
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The first byte just inside the timeout, then a head that never ends.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    slow.write_all(b"P").await.unwrap();
    let trickle = async {
        for b in b"OST / HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
            if slow.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), trickle).await.unwrap();
    let mut buf = [0u8; 256];
    let _ = tokio::time::timeout(Duration::from_secs(5), slow.read(&mut buf)).await;
    // Cut at the one timeout (3 s from connect), not 3 s after the first byte (5 s):
    // the trickle above would run 6 s if nobody cut it. Margins of a second and more: a
    // loaded machine must not make the fix look broken or the bug look fixed.
    assert!(
        started.elapsed() < Duration::from_millis(4000),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_connection_whose_first_request_came_late_keeps_the_full_timeout_for_the_next() {
    use tokio::io::AsyncWriteExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = ServeLimits {
        header_read_timeout: Duration::from_secs(3),
        ..ServeLimits::default()
    };
    let (_stop, rx) = watch::channel(false);
    tokio::spawn(serve(listener, echo_peer(), limits, rx));
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let answer = async |conn: &mut tokio::net::TcpStream| {
        conn.write_all(request).await.unwrap();
        let mut buf = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf))
            .await
            .expect("answered")
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    // The first request just inside the timeout, then an idle keep-alive wait longer than
    // what was left of it: the connection still serves the second request.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(answer(&mut conn).await.starts_with("HTTP/1.1 200"));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(answer(&mut conn).await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn a_connection_idle_for_the_idle_timeout_is_closed_but_not_while_a_request_runs() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = ServeLimits {
        idle_timeout: Duration::from_millis(300),
        ..ServeLimits::default()
    };
    // Each request takes 900 ms: three idle timeouts.
    let slow: Handler = Arc::new(|_peer, _req| {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(900)).await;
            text(StatusCode::OK, "text/plain", "done".into())
        })
    });
    let (_stop, rx) = watch::channel(false);
    tokio::spawn(serve(listener, slow, limits, rx));
    let h2 = |stream| async move {
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap()
    };
    // Idle from the start: closed (GOAWAY) after the idle timeout, which ends the client's
    // connection future.
    let started = Instant::now();
    let (_idle_send, idle_conn) = h2(tokio::net::TcpStream::connect(addr).await.unwrap()).await;
    let idle = tokio::spawn(idle_conn);
    // Busy: its request outlives three idle timeouts and is still answered.
    let (mut send, busy_conn) = h2(tokio::net::TcpStream::connect(addr).await.unwrap()).await;
    let busy = tokio::spawn(busy_conn);
    let req = Request::get("http://localhost/")
        .body(http_body_util::Empty::<Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(idle.is_finished(), "the idle connection was closed meanwhile");
    let idle_for = started.elapsed();
    assert!(idle_for >= Duration::from_millis(250), "{idle_for:?}");
    // Then idle itself: closed one idle timeout after its request.
    tokio::time::timeout(Duration::from_secs(5), busy)
        .await
        .expect("closed once idle")
        .unwrap()
        .unwrap();
}
