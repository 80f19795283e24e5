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
