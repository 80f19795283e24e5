//! Baseline (g): the minimal durable forwarder, the least a webhook forwarder that never
//! answers before the message is on disk must do, written plainly (the behaviour of
//! `perf/durable`'s `durable-forwarder`, with no tuning courier lacks):
//!
//! - hyper HTTP/1.1 takes a POST on any path and reads its body;
//! - one committer thread, fed over a std mpsc channel, drains what is queued (up to 256
//!   puts) into one RocksDB `WriteBatch` (key: a `u64` counter, big-endian; value: the
//!   body) and writes it with `sync = true` if it holds a put (unsynced if only deletes),
//!   then answers each waiter;
//! - the POST is answered 202 `{"status":"pending"}`;
//! - the body is then sent to the receiver's `/hook` over a pooled hyper-util legacy
//!   `Client`, at most 64 at a time (a semaphore); on a 2xx the record is deleted through
//!   the committer (unsynced, batched with the next commit). Nothing is retried.
//!
//! RocksDB has its default options (`create_if_missing` only); the runtime has two
//! workers. One addition: the request's `webhook-id` goes along with the body, so the
//! receiver can match a delivery to its send (courier forwards it too; (f) does the same).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Semaphore};

use crate::{err, Res};

/// Most puts in one commit.
const MAX_BATCH: usize = 256;

/// Most forwards in flight.
const MAX_IN_FLIGHT: usize = 64;

/// What the committer is asked to do.
enum Op {
    /// Store a body under a key, then signal the waiter.
    Put(u64, Bytes, oneshot::Sender<()>),
    /// Forget a delivered record.
    Delete(u64),
}

/// What every request task shares.
struct Shared {
    /// `std::sync::mpsc::Sender` is `Sync`, so the tasks share it without a lock.
    ops: mpsc::Sender<Op>,
    next: AtomicU64,
    client: Client<HttpConnector, Full<Bytes>>,
    target: Uri,
    slots: Semaphore,
}

/// The committer thread: one RocksDB write per round of queued ops.
fn committer(db: rocksdb::DB, rx: mpsc::Receiver<Op>) {
    let mut sync = rocksdb::WriteOptions::default();
    sync.set_sync(true);
    let lazy = rocksdb::WriteOptions::default();
    while let Ok(first) = rx.recv() {
        let mut batch = rocksdb::WriteBatch::default();
        let mut waiters = Vec::new();
        let mut op = Some(first);
        while let Some(o) = op.take().or_else(|| rx.try_recv().ok()) {
            match o {
                Op::Put(k, body, done) => {
                    batch.put(k.to_be_bytes(), &body);
                    waiters.push(done);
                }
                Op::Delete(k) => batch.delete(k.to_be_bytes()),
            }
            if waiters.len() >= MAX_BATCH {
                break;
            }
        }
        // Only an accept needs to be durable before it is answered; a lost delete
        // means one more delivery after a crash, which a webhook receiver tolerates.
        let opts = if waiters.is_empty() { &lazy } else { &sync };
        db.write_opt(batch, opts).expect("(g) RocksDB write");
        for w in waiters {
            let _ = w.send(());
        }
    }
}

/// Sends one stored body to the receiver; deletes its record on a 2xx.
async fn forward(s: Arc<Shared>, key: u64, body: Bytes, id: Option<HeaderValue>) {
    let Ok(_slot) = s.slots.acquire().await else { return };
    let mut req = Request::post(s.target.clone()).header(CONTENT_TYPE, "application/json");
    if let Some(id) = id {
        req = req.header("webhook-id", id);
    }
    let Ok(req) = req.body(Full::new(body)) else { return };
    if let Ok(resp) = s.client.request(req).await {
        let ok = resp.status().is_success();
        let _ = resp.into_body().collect().await;
        if ok {
            let _ = s.ops.send(Op::Delete(key));
        }
    }
}

/// One POST: stored durably, answered 202, then forwarded in the background.
async fn accept(s: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let id = req.headers().get("webhook-id").cloned();
    let body = req.into_body().collect().await?.to_bytes();
    let key = s.next.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    let stored = s.ops.send(Op::Put(key, body.clone(), tx)).is_ok() && rx.await.is_ok();
    if !stored {
        // The committer is gone (its write failed): nothing is on disk, so no 202.
        let mut resp = Response::new(Full::new(Bytes::new()));
        *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        return Ok(resp);
    }
    tokio::spawn(forward(s.clone(), key, body, id));
    let mut resp = Response::new(Full::new(Bytes::from_static(br#"{"status":"pending"}"#)));
    *resp.status_mut() = StatusCode::ACCEPTED;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(resp)
}

/// `--serve-floor-baseline RECEIVER DIR`: serves (g) on a free loopback port, printing its
/// address on the first line of stdout, forwarding to `http://RECEIVER/hook`, storing in
/// `DIR`. Builds its own two-worker runtime (the forwarder's), so it is called without one.
pub fn serve(flag: &[String]) -> Res<()> {
    let [receiver, dir] = flag else {
        return Err(err("--serve-floor-baseline takes RECEIVER_ADDR DIR"));
    };
    let receiver: SocketAddr = receiver
        .parse()
        .map_err(|_| err(format!("bad receiver address {receiver:?}")))?;
    let target: Uri = format!("http://{receiver}/hook")
        .parse()
        .map_err(|_| err("bad target URL"))?;
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    let db = rocksdb::DB::open(&opts, PathBuf::from(dir))?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || committer(db, rx));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let s = Arc::new(Shared {
            ops: tx,
            next: AtomicU64::new(0),
            client: Client::builder(TokioExecutor::new()).build_http(),
            target,
            slots: Semaphore::new(MAX_IN_FLIGHT),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        println!("{}", listener.local_addr()?);
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let s = s.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |r| accept(s.clone(), r));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}
