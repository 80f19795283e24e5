//! HTTP/2 with prior knowledge (h2c) on the ingress port, next to HTTP/1.1.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::support::*;

/// Sends `req` on `client`; `(version, status, body)`.
async fn send(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    req: hyper::Request<Full<Bytes>>,
) -> (http::Version, u16, serde_json::Value) {
    let resp = tokio::time::timeout(WAIT, client.request(req)).await.unwrap().unwrap();
    let (version, status) = (resp.version(), resp.status().as_u16());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (version, status, serde_json::from_slice(&body).unwrap())
}

#[tokio::test]
async fn an_h2_prior_knowledge_client_posts_on_the_ingress_port_next_to_http1() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), "");
    // One pooled h2 connection carries both requests, at once.
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).http2_only(true).build_http();
    let post_h2 = |n: u32| {
        hyper::Request::post(c.prefixed(&rx.url(&format!("/h2/{n}"))))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(format!("{{\"n\":{n}}}"))))
            .unwrap()
    };
    let (a, b) = tokio::join!(send(&h2, post_h2(1)), send(&h2, post_h2(2)));
    // HTTP/1.1 on the same port, meanwhile.
    let h1 = post(&c.prefixed(&rx.url("/h1")), &[], "{\"n\":3}").await;
    assert_eq!(h1.status, 202, "{}", h1.text());

    let mut want = vec![(
        "/h1".to_string(),
        "{\"n\":3}".to_string(),
        h1.json()["event_id"].clone(),
    )];
    for (n, (version, status, body)) in [(1, a), (2, b)] {
        assert_eq!((version, status), (http::Version::HTTP_2, 202), "{body}");
        want.push((format!("/h2/{n}"), format!("{{\"n\":{n}}}"), body["event_id"].clone()));
    }
    // Delivered straight to the receiver: the webhook-id is the one ingress answered with
    // (a request read as absolute-form would have gone to courier itself first).
    let mut seen: Vec<_> = rx
        .wait_for(3)
        .await
        .into_iter()
        .map(|s| {
            let id = serde_json::Value::from(s.header("webhook-id").unwrap());
            (s.path, String::from_utf8(s.body).unwrap(), id)
        })
        .collect();
    seen.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(seen, want);
    // Exactly three messages: an HTTP/2 request read as absolute-form would have been
    // addressed to courier itself, accepted again, and made a fourth and a fifth.
    let all = get(&c.admin_url("/deliveries?limit=100")).await.json();
    assert_eq!(all["items"].as_array().unwrap().len(), 3, "{all}");
}

#[tokio::test]
async fn over_h2_the_authority_is_checked_like_a_host_header() {
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), "");
    let stream = tokio::net::TcpStream::connect(c.ingress).await.unwrap();
    let (mut h2, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    // What a DNS-rebinding page's request would carry: a name that is not courier's.
    let req = hyper::Request::post("http://rebind.example/http://127.0.0.1:1/x")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let resp = tokio::time::timeout(WAIT, h2.send_request(req)).await.unwrap().unwrap();
    assert_eq!(resp.status().as_u16(), 421);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("misdirected_request"));
}
