//! Sends one JSON webhook through courier by each of its three zero-code forms, the
//! way an existing application would after changing only a URL or a proxy setting:
//!
//! 1. URL prefix: `POST http://127.0.0.1:8787/<target URL>`
//! 2. HTTP proxy: `POST <target URL> HTTP/1.1` sent to courier (absolute-form), what a
//!    client does for `http://` URLs when `HTTP_PROXY=http://127.0.0.1:8787` is set
//! 3. header: `POST http://127.0.0.1:8787/` with `Courier-Target: <target URL>`
//!
//! ```text
//! python3 examples/receiver.py --secret whsec_vdZJW4oIWKVzs3WHZOD0X4LX0tJMBVyo &
//! cargo run --example send -- http://127.0.0.1:9000/hooks 127.0.0.1:8787 \
//!     --secret whsec_vdZJW4oIWKVzs3WHZOD0X4LX0tJMBVyo
//! ```
//!
//! Each prints courier's answer (`202` and the delivery id); the receiver then prints
//! one line per delivery. Exits non-zero unless all three were accepted.
#![allow(clippy::disallowed_methods)] // A tool: real time and fresh randomness are what it wants.

use bytes::Bytes;
use clap::Parser;
use http::header::{CONTENT_TYPE, HOST};
use http::{Method, Request, Response, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

/// Command-line flags.
#[derive(Parser, Debug)]
#[command(about = "Send one webhook through courier by each zero-code form")]
struct Args {
    /// The receiver's URL, e.g. https://receiver.example/hooks?x=1
    target: String,
    /// courier's ingress address, `host:port` or `http://host:port`.
    #[arg(default_value = "127.0.0.1:8787", env = "COURIER")]
    courier: String,
    /// A signing secret for these messages (`Courier-Signing-Secret`), e.g. whsec_...
    #[arg(long)]
    secret: Option<String>,
    /// The signature scheme (`Courier-Signature-Scheme`): standard, stripe, github or none.
    #[arg(long)]
    scheme: Option<String>,
    /// courier's ingress token, when it has one.
    #[arg(long, env = "COURIER_INGRESS_TOKEN")]
    token: Option<String>,
}

/// The three ways to hand a webhook to courier.
#[derive(Debug, Clone, Copy)]
enum Form {
    Prefix,
    Proxy,
    Header,
}

impl Form {
    fn name(self) -> &'static str {
        match self {
            Form::Prefix => "url-prefix",
            Form::Proxy => "proxy",
            Form::Header => "courier-target",
        }
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The request for `form`, before the control headers common to all forms.
fn request(form: Form, courier: &str, target: &str, body: Bytes) -> Result<Request<Full<Bytes>>, Error> {
    let builder = Request::builder()
        .method(Method::POST)
        .header(CONTENT_TYPE, "application/json");
    let builder = match form {
        // The whole target URL, scheme and query included, becomes courier's path.
        Form::Prefix => builder.uri(format!("http://{courier}/{target}")),
        // Absolute-form: the request line carries the full target URL, and Host names the
        // target, as in any proxied request.
        Form::Proxy => {
            let uri: Uri = target.parse()?;
            let host = uri.authority().ok_or("the target URL has no host")?.to_string();
            builder.uri(uri).header(HOST, host)
        }
        Form::Header => builder
            .uri(format!("http://{courier}/"))
            .header("courier-target", target),
    };
    Ok(builder.body(Full::new(body))?)
}

/// Sends a proxy-form request over a connection we open to courier ourselves: hyper's
/// pooled client rewrites the request line to origin-form unless its connector says it
/// talks to a proxy, while a bare HTTP/1 connection writes the URI exactly as given.
async fn send_via_proxy(courier: &str, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, Error> {
    let stream = TcpStream::connect(courier).await?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            eprintln!("proxy connection: {err}");
        }
    });
    Ok(sender.send_request(req).await?)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = Args::parse();
    let courier = args
        .courier
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();

    let mut all_accepted = true;
    for form in [Form::Prefix, Form::Proxy, Form::Header] {
        let body = serde_json::json!({
            "type": "example.sent",
            "form": form.name(),
            "data": {"hello": "world"},
        });
        let mut req = request(form, &courier, &args.target, Bytes::from(body.to_string()))?;
        let headers = req.headers_mut();
        if let Some(secret) = &args.secret {
            headers.insert("courier-signing-secret", secret.parse()?);
        }
        if let Some(scheme) = &args.scheme {
            headers.insert("courier-signature-scheme", scheme.parse()?);
        }
        if let Some(token) = &args.token {
            // A proxy-aware client carries proxy credentials in Proxy-Authorization;
            // courier accepts either header.
            match form {
                Form::Proxy => headers.insert("proxy-authorization", format!("Bearer {token}").parse()?),
                Form::Prefix | Form::Header => headers.insert("courier-token", token.parse()?),
            };
        }

        let response = match form {
            Form::Proxy => send_via_proxy(&courier, req).await?,
            Form::Prefix | Form::Header => client.request(req).await?,
        };
        let status = response.status();
        let delivery_id = response
            .headers()
            .get("courier-delivery-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned();
        let answer = response.into_body().collect().await?.to_bytes();
        println!(
            "{:<15} {} delivery_id={delivery_id} {}",
            form.name(),
            status.as_u16(),
            String::from_utf8_lossy(&answer).trim()
        );
        all_accepted &= status == http::StatusCode::ACCEPTED;
    }
    if all_accepted {
        Ok(())
    } else {
        Err("courier did not accept every message".into())
    }
}
