//! A webhook receiver to try courier against: it checks Standard Webhooks, Stripe and
//! GitHub signatures on its own (plain `hmac`/`sha2`, and `ed25519-dalek` for the Standard
//! Webhooks `v1a` entries that a `whpk_` public key verifies; no courier code, so it is an
//! independent check of what courier sends), rejects signed timestamps more than five
//! minutes off, prints one line per request, and can fail the first N requests to show
//! courier's retries.
//!
//! ```text
//! cargo run --example receiver -- --listen 127.0.0.1:9000 --secret whsec_vdZJW4oIWKVzs3WHZOD0X4LX0tJMBVyo
//! cargo run --example receiver -- --fail-first 2 --fail-status 503 --retry-after 5
//! cargo run --example receiver -- --secret "$(courier keys public < key.txt)"   # Ed25519
//! ```
//!
//! courier refuses loopback targets by default: to deliver here, give courier
//! `[egress] allow = ["127.0.0.1/32"]` (or `allow_private_targets = true`).
//!
//! Output, one line per request:
//! `POST /hooks id=msg_01J... scheme=standard verified=yes -> 204`
//! (`verified=-` when the request carries no signature or no `--secret` was given).
//!
//! Checking the verification without courier: sign with Python, send with curl.
//!
//! ```text
//! S=whsec_vdZJW4oIWKVzs3WHZOD0X4LX0tJMBVyo; B='{"type":"test"}'; T=$(date +%s)
//! # standard: HMAC-SHA256(base64-decoded key, "<id>.<ts>.<body>"), base64
//! SIG=$(python3 -c 'import sys,hmac,hashlib,base64;k=base64.b64decode(sys.argv[1][6:]);print(base64.b64encode(hmac.new(k,f"{sys.argv[2]}.{sys.argv[3]}.{sys.argv[4]}".encode(),hashlib.sha256).digest()).decode())' "$S" msg_1 "$T" "$B")
//! curl -s -o /dev/null -w '%{http_code}\n' localhost:9000/hooks -d "$B" \
//!   -H 'webhook-id: msg_1' -H "webhook-timestamp: $T" -H "webhook-signature: v1,$SIG"
//! # stripe: HMAC-SHA256(secret string, "<ts>.<body>"), hex
//! SIG=$(python3 -c 'import sys,hmac,hashlib;print(hmac.new(sys.argv[1].encode(),f"{sys.argv[2]}.{sys.argv[3]}".encode(),hashlib.sha256).hexdigest())' "$S" "$T" "$B")
//! curl -s localhost:9000/hooks -d "$B" -H 'webhook-id: msg_2' -H "Stripe-Signature: t=$T,v1=$SIG"
//! # github: HMAC-SHA256(secret string, body), hex
//! SIG=$(python3 -c 'import sys,hmac,hashlib;print(hmac.new(sys.argv[1].encode(),sys.argv[2].encode(),hashlib.sha256).hexdigest())' "$S" "$B")
//! curl -s localhost:9000/hooks -d "$B" -H 'webhook-id: msg_3' -H "X-Hub-Signature-256: sha256=$SIG"
//! ```
//!
//! Each prints `verified=yes`; change a byte of the body, the secret or (for standard
//! and stripe) move the timestamp more than 300 s away and it prints `verified=no`.
#![allow(clippy::disallowed_methods)] // A tool: real time and fresh randomness are what it wants.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use clap::Parser;
use hmac::{Hmac, Mac};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use sha2::Sha256;
use tokio::net::TcpListener;

type HmacSha256 = Hmac<Sha256>;

/// Larger than courier's default `max_body` (1 MiB), small enough that a stray client
/// cannot exhaust memory.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// Command-line flags.
#[derive(Parser, Debug)]
#[command(about = "A webhook receiver that verifies courier's signatures")]
struct Args {
    /// Address to listen on (port 0 picks a free one; the address is printed on stderr).
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// Secret to verify with, exactly as configured in courier (`whsec_...` for the
    /// standard scheme; for stripe and github the string itself is the key), or for
    /// courier's `whsk_` keys the `whpk_...` public key that `courier keys public` prints.
    /// Repeat it, or separate with commas, to accept several during a rotation.
    #[arg(long = "secret", env = "RECEIVER_SECRETS", value_delimiter = ',')]
    secrets: Vec<String>,
    /// Answer the first N requests with --fail-status, to watch courier retry.
    #[arg(long, default_value_t = 0)]
    fail_first: u64,
    /// The status for those failures (503 and 429 are retried with backoff; 410 dead-letters).
    #[arg(long, default_value_t = 503)]
    fail_status: u16,
    /// Send `Retry-After: <seconds>` with those failures.
    #[arg(long)]
    retry_after: Option<u64>,
    /// Answer 401 when a signature is missing or wrong (courier then dead-letters the
    /// message as a permanent failure), instead of logging it and answering 204.
    #[arg(long)]
    reject_unverified: bool,
    /// How far a signed timestamp may be from this machine's clock, in seconds.
    #[arg(long, default_value_t = 300)]
    tolerance: u64,
}

/// The signature scheme a request carries, recognised by its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Standard,
    Stripe,
    Github,
    None,
}

impl Scheme {
    fn detect(headers: &HeaderMap) -> Scheme {
        if headers.contains_key("webhook-signature") {
            Scheme::Standard
        } else if headers.contains_key("stripe-signature") {
            Scheme::Stripe
        } else if headers.contains_key("x-hub-signature-256") {
            Scheme::Github
        } else {
            Scheme::None
        }
    }

    fn name(self) -> &'static str {
        match self {
            Scheme::Standard => "standard",
            Scheme::Stripe => "stripe",
            Scheme::Github => "github",
            Scheme::None => "none",
        }
    }
}

/// Why a signature was not accepted; printed after `verified=no`.
type Reason = &'static str;

/// Checks the request's signature with any of `secrets`, given the current unix time.
fn verify(
    scheme: Scheme,
    headers: &HeaderMap,
    body: &[u8],
    secrets: &[String],
    now: i64,
    tolerance: u64,
) -> Result<(), Reason> {
    match scheme {
        Scheme::Standard => verify_standard(headers, body, secrets, now, tolerance),
        Scheme::Stripe => verify_stripe(headers, body, secrets, now, tolerance),
        Scheme::Github => verify_github(headers, body, secrets),
        Scheme::None => Err("unsigned"),
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, Reason> {
    headers
        .get(name)
        .ok_or("missing header")?
        .to_str()
        .map_err(|_| "non-ASCII header")
}

/// A timestamp outside the window makes a captured request useless for replay.
fn check_timestamp(ts: &str, now: i64, tolerance: u64) -> Result<i64, Reason> {
    let ts: i64 = ts.trim().parse().map_err(|_| "bad timestamp")?;
    if ts.abs_diff(now) > tolerance {
        return Err("timestamp outside tolerance");
    }
    Ok(ts)
}

/// Whether HMAC-SHA256(key, parts...) equals `expected`, compared in constant time.
fn hmac_matches(key: &[u8], parts: &[&[u8]], expected: &[u8]) -> bool {
    let Ok(mut mac) = HmacSha256::new_from_slice(key) else {
        return false;
    };
    for part in parts {
        mac.update(part);
    }
    mac.verify_slice(expected).is_ok()
}

/// Standard Webhooks: `webhook-signature: v1,<base64> [v1a,<base64> ...]` over
/// `<webhook-id>.<webhook-timestamp>.<body>`: `v1` entries are HMAC-SHA256 keyed with the
/// base64 part of `whsec_...`, `v1a` entries Ed25519 signatures checked with a `whpk_...`
/// public key. Any one entry matching any one key is enough (rotation).
fn verify_standard(
    headers: &HeaderMap,
    body: &[u8],
    secrets: &[String],
    now: i64,
    tolerance: u64,
) -> Result<(), Reason> {
    let id = header(headers, "webhook-id")?;
    let ts = header(headers, "webhook-timestamp")?;
    check_timestamp(ts, now, tolerance)?;
    let value = header(headers, "webhook-signature")?;
    let entries = |version: &str| -> Vec<Vec<u8>> {
        value
            .split_whitespace()
            .filter_map(|entry| entry.split_once(','))
            .filter(|(v, _)| *v == version)
            .filter_map(|(_, sig)| BASE64.decode(sig).ok())
            .collect()
    };
    let (public, hmac): (Vec<&String>, Vec<&String>) = secrets.iter().partition(|s| s.starts_with("whpk_"));
    let keys: Vec<Vec<u8>> = hmac
        .iter()
        .filter_map(|s| BASE64.decode(s.strip_prefix("whsec_").unwrap_or(s)).ok())
        .collect();
    let public_keys: Vec<ed25519_dalek::VerifyingKey> = public
        .iter()
        .filter_map(|s| <[u8; 32]>::try_from(BASE64.decode(&s["whpk_".len()..]).ok()?).ok())
        .filter_map(|bytes| ed25519_dalek::VerifyingKey::from_bytes(&bytes).ok())
        .collect();
    let parts: [&[u8]; 5] = [id.as_bytes(), b".", ts.as_bytes(), b".", body];
    let signatures = entries("v1");
    let hmac_ok = keys
        .iter()
        .any(|key| signatures.iter().any(|sig| hmac_matches(key, &parts, sig)));
    let content = parts.concat();
    let ed25519_ok = entries("v1a").iter().any(|sig| {
        ed25519_dalek::Signature::from_slice(sig)
            .is_ok_and(|sig| public_keys.iter().any(|key| key.verify_strict(&content, &sig).is_ok()))
    });
    let ok = hmac_ok || ed25519_ok;
    if ok {
        Ok(())
    } else {
        Err("no signature matches")
    }
}

/// Stripe: `Stripe-Signature: t=<ts>,v1=<hex>[,v1=<hex>...]` over `<ts>.<body>`, keyed
/// with the secret string as is.
fn verify_stripe(headers: &HeaderMap, body: &[u8], secrets: &[String], now: i64, tolerance: u64) -> Result<(), Reason> {
    let value = header(headers, "stripe-signature")?;
    let mut ts = None;
    let mut signatures = Vec::new();
    for item in value.split(',') {
        match item.trim().split_once('=') {
            Some(("t", t)) => ts = Some(t),
            Some(("v1", sig)) => signatures.extend(hex::decode(sig).ok()),
            _ => {}
        }
    }
    let ts = ts.ok_or("no t= in Stripe-Signature")?;
    check_timestamp(ts, now, tolerance)?;
    let parts: [&[u8]; 3] = [ts.as_bytes(), b".", body];
    let ok = secrets
        .iter()
        .any(|key| signatures.iter().any(|sig| hmac_matches(key.as_bytes(), &parts, sig)));
    if ok {
        Ok(())
    } else {
        Err("no signature matches")
    }
}

/// GitHub: `X-Hub-Signature-256: sha256=<hex>` over the body alone, keyed with the
/// secret string as is. It signs no timestamp, so there is nothing to check for age.
fn verify_github(headers: &HeaderMap, body: &[u8], secrets: &[String]) -> Result<(), Reason> {
    let value = header(headers, "x-hub-signature-256")?;
    let sig = value
        .strip_prefix("sha256=")
        .and_then(|h| hex::decode(h).ok())
        .ok_or("malformed X-Hub-Signature-256")?;
    let ok = secrets.iter().any(|key| hmac_matches(key.as_bytes(), &[body], &sig));
    if ok {
        Ok(())
    } else {
        Err("no signature matches")
    }
}

/// What every connection shares.
struct State {
    args: Args,
    seen: AtomicU64,
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn reply(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) => {
            println!("{} {} body error: {err} -> 400", parts.method, parts.uri);
            return Ok(reply(StatusCode::BAD_REQUEST));
        }
    };
    let args = &state.args;
    let id = parts
        .headers
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    let scheme = Scheme::detect(&parts.headers);
    let verdict = if scheme == Scheme::None || args.secrets.is_empty() {
        None
    } else {
        Some(verify(
            scheme,
            &parts.headers,
            &body,
            &args.secrets,
            unix_now(),
            args.tolerance,
        ))
    };
    let verified = match verdict {
        None => "-".to_owned(),
        Some(Ok(())) => "yes".to_owned(),
        Some(Err(reason)) => format!("no ({reason})"),
    };

    let n = state.seen.fetch_add(1, Ordering::Relaxed);
    let status = if n < args.fail_first {
        StatusCode::from_u16(args.fail_status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
    } else if args.reject_unverified && !matches!(verdict, Some(Ok(()))) {
        StatusCode::UNAUTHORIZED
    } else {
        StatusCode::NO_CONTENT
    };
    println!(
        "{} {} id={id} scheme={} verified={verified} -> {}",
        parts.method,
        parts.uri.path(),
        scheme.name(),
        status.as_u16()
    );

    let mut response = reply(status);
    if n < args.fail_first {
        if let Some(secs) = args.retry_after {
            response.headers_mut().insert(http::header::RETRY_AFTER, secs.into());
        }
    }
    Ok(response)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let listener = TcpListener::bind(args.listen).await?;
    eprintln!("receiver listening on http://{}", listener.local_addr()?);
    let state = Arc::new(State {
        args,
        seen: AtomicU64::new(0),
    });
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Running out of file descriptors is transient; keep serving.
                Err(err) => {
                    eprintln!("accept: {err}");
                    continue;
                }
            },
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(state.clone(), req));
            if let Err(err) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                eprintln!("connection: {err}");
            }
        });
    }
}
