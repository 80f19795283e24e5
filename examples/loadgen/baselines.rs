//! The servers courier is compared with: (a) a bare hyper 202, (b) RocksDB's synced writes,
//! (d) and (e) durable 202s, (f) a non-durable forwarding proxy, and the spawning of (g)
//! (the minimal durable forwarder, in `floor_server`); each server runs in a child process
//! (this binary re-executed with a hidden flag) so its CPU can be read apart.

use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::courier::KillOnDrop;
use crate::receiver::serve_fixed;
use crate::{err, Res};

// ---------------------------------------------------------------- baseline (b): RocksDB

/// Opens a RocksDB with courier's WAL settings.
pub fn rocks_open(dir: &Path) -> Res<rocksdb::DB> {
    let mut o = rocksdb::Options::default();
    o.create_if_missing(true);
    o.set_max_background_jobs(2);
    o.set_max_total_wal_size(64 << 20);
    o.set_write_buffer_size(4 << 20);
    o.set_recycle_log_file_num(4);
    o.set_compression_type(rocksdb::DBCompressionType::Lz4);
    Ok(rocksdb::DB::open(&o, dir)?)
}

/// The writes courier makes to accept one message: the record, the payload (body and
/// headers), the due-index entry, the state-index entry and the event-id entry.
pub fn rocks_record(batch: &mut rocksdb::WriteBatch, id: &str, body: &[u8]) {
    let meta = [b'm'; 300];
    let mut payload = Vec::with_capacity(body.len() + 120);
    payload.extend_from_slice(b"content-type: application/json\r\nuser-agent: app/1.0\r\nwebhook-id: lg-0\r\n");
    payload.extend_from_slice(body);
    batch.put(format!("m{id}"), meta);
    batch.put(format!("p{id}"), &payload);
    batch.put(format!("d00000{id}"), b"127.0.0.1:9000 http://127.0.0.1:9000/hook");
    batch.put(format!("s0{id}"), b"");
    batch.put(format!("elg-{id}http://127.0.0.1:9000/hook"), id.as_bytes());
}

/// `threads` threads each writing one message's records per synced write, for `dur`.
pub fn rocks_threads(dir: &Path, threads: usize, dur: Duration, body: &Bytes) -> Res<f64> {
    let db = Arc::new(rocks_open(dir)?);
    let done = Arc::new(AtomicU64::new(0));
    let t0 = std::time::Instant::now();
    let end = t0 + dur;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (db, done, body) = (db.clone(), done.clone(), body.clone());
            std::thread::spawn(move || {
                let mut wo = rocksdb::WriteOptions::default();
                wo.set_sync(true);
                let mut i = 0u64;
                while std::time::Instant::now() < end {
                    let mut b = rocksdb::WriteBatch::default();
                    rocks_record(&mut b, &format!("{t:05}{i:014}"), &body);
                    db.write_opt(b, &wo).expect("synced write");
                    i += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| err("rocksdb writer panicked"))?;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64())
}

/// One thread committing batches of `batch` messages with one synced write each, for `dur`:
/// the rate and the number of messages written.
pub fn rocks_batches(dir: &Path, batch: usize, dur: Duration, body: &Bytes) -> Res<(f64, u64)> {
    let db = rocks_open(dir)?;
    let mut wo = rocksdb::WriteOptions::default();
    wo.set_sync(true);
    let t0 = std::time::Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < dur {
        let mut b = rocksdb::WriteBatch::default();
        for _ in 0..batch {
            rocks_record(&mut b, &format!("{n:019}"), body);
            n += 1;
        }
        db.write_opt(b, &wo)?;
    }
    Ok((n as f64 / t0.elapsed().as_secs_f64(), n))
}

// ---------------------------------------------------------------- servers (a), (d), (e), (f)

/// Baseline (a): answers every POST with 202 and a body like courier's, storing nothing.
pub async fn serve_baseline() -> Res<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?);
    let answer = Bytes::from_static(br#"{"id":"dlv_01JD0000000000000000000000","event_id":"lg-0","status":"pending"}"#);
    serve_fixed(listener, StatusCode::ACCEPTED, answer, |_| {}).await;
    Ok(())
}

/// Baseline (d): the least a durable 202 can cost here. The bare hyper server of (a), but
/// each request's body is handed to one thread that appends every body queued meanwhile
/// to a plain file and `fdatasync`s it once, then answers them all (group commit, the
/// shape of courier's accept path, without RocksDB, dedupe or scheduling).
///
/// Baseline (e), with `rocksdb`: the same, but the thread writes baseline (b)'s record set
/// for each body into one RocksDB `WriteBatch` with `sync = true`: courier's accept path
/// with nothing but its durable write.
pub async fn serve_durable_baseline(dir: PathBuf, rocksdb: bool) -> Res<()> {
    use std::io::Write;
    type Job = (Bytes, tokio::sync::oneshot::Sender<()>);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Job>(8192);
    let (mut file, db) = if rocksdb {
        (None, Some(rocks_open(&dir.join("baseline-e"))?))
    } else {
        (Some(std::fs::File::create(dir.join("baseline-d.log"))?), None)
    };
    std::thread::spawn(move || {
        let mut synced = rocksdb::WriteOptions::default();
        synced.set_sync(true);
        let mut n = 0u64;
        while let Some(first) = rx.blocking_recv() {
            let mut jobs = vec![first];
            while let Ok(job) = rx.try_recv() {
                jobs.push(job);
            }
            if let Some(db) = &db {
                let mut b = rocksdb::WriteBatch::default();
                for (body, _) in &jobs {
                    rocks_record(&mut b, &format!("{n:019}"), body);
                    n += 1;
                }
                db.write_opt(b, &synced).expect("baseline (e) write");
            } else if let Some(file) = file.as_mut() {
                for (body, _) in &jobs {
                    file.write_all(body).expect("baseline (d) write");
                }
                file.sync_data().expect("baseline (d) fdatasync");
            }
            for (_, reply) in jobs {
                let _ = reply.send(());
            }
        }
    });
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let tx = tx.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let tx = tx.clone();
            async move {
                let body = req
                    .into_body()
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let (reply, done) = tokio::sync::oneshot::channel();
                let ok = tx.send((body, reply)).await.is_ok() && done.await.is_ok();
                let mut resp = Response::new(Full::new(Bytes::from_static(b"{}")));
                *resp.status_mut() = if ok {
                    StatusCode::ACCEPTED
                } else {
                    StatusCode::INTERNAL_SERVER_ERROR
                };
                Ok::<_, Infallible>(resp)
            }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Baseline (f): a non-durable forwarding proxy, the least a "deliver, then answer" relay
/// costs here. Each POST (path form `/http://host:port/hook`, as courier gets it, or a
/// plain path) is sent on to `receiver` with its `content-type` and `webhook-id` over a
/// pooled keep-alive client (hyper-util's legacy `Client`), and answered 202 only after
/// the receiver answered 2xx (502 otherwise). Nothing is stored and nothing is retried.
pub async fn serve_forward_baseline(receiver: SocketAddr) -> Res<()> {
    use hyper_util::client::legacy::{connect::HttpConnector, Client};
    use hyper_util::rt::TokioExecutor;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    // One pooled connection per concurrent forward, kept alive between them (the load
    // generator has at most 64 connections open to this server, so at most 64 forwards).
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(300))
        .pool_max_idle_per_host(1024)
        .build(connector);
    let answer =
        Bytes::from_static(br#"{"id":"dlv_01JD0000000000000000000000","event_id":"lg-0","status":"delivered"}"#);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("{}", listener.local_addr()?);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (client, answer) = (client.clone(), answer.clone());
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let (client, answer) = (client.clone(), answer.clone());
            async move {
                let (parts, body) = req.into_parts();
                let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                // The path after the embedded target's authority, or the path as it is.
                let path = parts.uri.path();
                let rest = path
                    .strip_prefix("/http://")
                    .and_then(|r| r.find('/').map(|i| &r[i..]))
                    .unwrap_or(path);
                let mut out = Request::builder()
                    .method(Method::POST)
                    .uri(format!("http://{receiver}{rest}"));
                for name in [CONTENT_TYPE.as_str(), "webhook-id"] {
                    if let Some(v) = parts.headers.get(name) {
                        out = out.header(name, v);
                    }
                }
                let delivered = match out.body(Full::new(body)) {
                    Ok(out) => match client.request(out).await {
                        Ok(resp) => {
                            let ok = resp.status().is_success();
                            let _ = resp.into_body().collect().await;
                            ok
                        }
                        Err(_) => false,
                    },
                    Err(_) => false,
                };
                let mut resp = Response::new(Full::new(answer));
                *resp.status_mut() = if delivered {
                    StatusCode::ACCEPTED
                } else {
                    StatusCode::BAD_GATEWAY
                };
                Ok::<_, Infallible>(resp)
            }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// A baseline server run in a child process.
#[derive(Clone, Copy)]
pub enum Baseline<'a> {
    /// (a): answers 202, stores nothing.
    Bare,
    /// (d): answers after a group-committed `fdatasync` of a file in this dir.
    File(&'a Path),
    /// (e): answers after a synced RocksDB group commit in this dir.
    Rocks(&'a Path),
    /// (f): forwards each POST to this receiver, answers 202 once it answered.
    Forward(SocketAddr),
    /// (g): the minimal durable forwarder (`floor_server`) to this receiver, storing in
    /// this dir.
    Floor(SocketAddr, &'a Path),
}

/// Starts a baseline server (this binary re-executed with the flag that serves it),
/// returning the child and the address it printed.
pub fn spawn_baseline(which: Baseline) -> Res<(KillOnDrop, SocketAddr)> {
    let mut cmd = Command::new(std::env::current_exe()?);
    match which {
        Baseline::Bare => cmd.arg("--serve-baseline"),
        Baseline::File(dir) => cmd.arg("--serve-durable-baseline").arg(dir),
        Baseline::Rocks(dir) => cmd.arg("--serve-durable-baseline").arg(dir).arg("--rocksdb"),
        Baseline::Forward(to) => cmd.arg("--serve-forward-baseline").arg(to.to_string()),
        Baseline::Floor(to, dir) => cmd.arg("--serve-floor-baseline").arg(to.to_string()).arg(dir),
    };
    let mut child = KillOnDrop(cmd.stdout(Stdio::piped()).stdin(Stdio::null()).spawn()?);
    let mut first = String::new();
    BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut first)?;
    let addr = first
        .trim()
        .parse()
        .map_err(|_| err(format!("baseline server said {first:?}")))?;
    Ok((child, addr))
}
