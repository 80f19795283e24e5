//! No client can lock others out by not reading its answers or by declaring bodies it
//! never sends: HTTP/2 clients that leave their stream window at zero, HTTP/1.1 clients
//! that pipeline requests against a full receive window (`send_timeout`), and uploads
//! that declare 1 MiB and stall (`max_pending_bytes` is charged as bytes arrive).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::ingress_limits::raise_nofile;
use crate::support::*;

const TOKEN: &str = "lockout-token";
/// The `send_timeout` the tests give courier, through the environment (so that the same
/// test runs against a courier that predates the setting and ignores the variable).
const SEND: Duration = Duration::from_secs(2);
const SEND_TEXT: &str = "2s";

/// What a zero-window client holds: its request handle, the answer whose body cannot
/// come, and the connection's task.
type Held = (
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<Bytes>>,
    hyper::Response<hyper::body::Incoming>,
    tokio::task::JoinHandle<()>,
);

/// One HTTP/2 connection whose stream window is zero: it sends one request and gets the
/// head of its answer (the body cannot come); its task answers pings until courier ends
/// the connection, then counts it in `closed`.
async fn zero_window_client(addr: std::net::SocketAddr, closed: Arc<AtomicUsize>) -> Option<Held> {
    let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
    builder.initial_stream_window_size(0);
    let (mut send, conn) = builder
        .handshake::<_, http_body_util::Empty<Bytes>>(TokioIo::new(tcp))
        .await
        .ok()?;
    let conn = tokio::spawn(async move {
        let _ = conn.await;
        closed.fetch_add(1, Ordering::Relaxed);
    });
    // No token: the 401 has a body, which the zero window keeps in courier.
    let req = hyper::Request::post("/http://127.0.0.1:9/x")
        .header("host", "127.0.0.1")
        .body(http_body_util::Empty::new())
        .unwrap();
    let answer = send.send_request(req).await.ok()?;
    Some((send, answer, conn))
}

/// A POST with the token through ingress, timed.
async fn timed_post(c: &Courier, rx: &Receiver, path: &str, limit: Duration) -> (Option<u16>, Duration) {
    let started = Instant::now();
    let sent = tokio::time::timeout(
        limit,
        post(&c.prefixed(&rx.url(path)), &[("courier-token", TOKEN)], "{}"),
    )
    .await;
    (sent.ok().map(|a| a.status), started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_that_never_open_their_window_are_dropped_and_a_new_client_gets_in() {
    const CONNS: usize = 4096;
    if !raise_nofile(CONNS as u64 + 512) {
        return skip("the descriptor hard limit is below 4,608");
    }
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let config =
        format!("ingress_token = \"{TOKEN}\"\nops_listen = \"127.0.0.1:0\"\n[ingress]\nidle_timeout = \"2s\"\n");
    let c = Courier::start_with(d.path(), &config, &[], &[("COURIER_INGRESS_SEND_TIMEOUT", SEND_TEXT)]);
    let ops = c.ops.expect("ops listener");
    // The ops port's probe answers throughout.
    let probing = tokio::spawn(async move {
        loop {
            let probe = tokio::time::timeout(Duration::from_secs(1), get(&format!("http://{ops}/healthz"))).await;
            assert_eq!(probe.expect("/healthz within 1 s").status, 200);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let closed = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    // One after another, each answered: courier drops a connection without a request
    // within idle_timeout, which thousands opened at once would not all make.
    let mut held = Vec::new();
    for _ in 0..CONNS {
        held.extend(zero_window_client(c.ingress, closed.clone()).await);
    }
    let opened = started.elapsed();
    let (status, took) = timed_post(&c, &rx, "/after", SEND + Duration::from_secs(1)).await;
    eprintln!(
        "{CONNS} zero-window HTTP/2 connections ({} answered, opened in {opened:?}, {} dropped by courier so far); \
         the next client's POST: {status:?} in {took:?}",
        held.len(),
        closed.load(Ordering::Relaxed)
    );
    assert_eq!(held.len(), CONNS, "every connection got the head of its answer");
    assert_eq!(status, Some(202), "a new client gets its 202 within send_timeout + 1 s");
    // Every one of them is dropped, not only enough to let one client in.
    eventually("courier to drop every zero-window connection", || async {
        (closed.load(Ordering::Relaxed) == CONNS).then_some(())
    })
    .await;
    probing.abort();
    if let Err(e) = probing.await {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    drop(held);
}

/// Admin connections courier serves at once under a 1,024-descriptor limit (an eighth of
/// what the store's reserve leaves, `crate::sys::fds::budget`): the test opens more.
const ADMIN_SLOTS_AT_1024: usize = 88;

/// One HTTP/1.1 connection with a small receive buffer that pipelines `n` requests for a
/// 17 KB file and reads nothing; counts itself in `served` once its receive buffer holds
/// answers (courier took its slot, and its writes are about to wait), and in `closed` once
/// courier closes it.
async fn pipelining_client(addr: std::net::SocketAddr, n: usize, [served, closed]: [Arc<AtomicUsize>; 2]) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let Ok(mut tcp) = socket.connect(addr).await else {
        return;
    };
    let requests = "GET /ui/app.js HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n".repeat(n);
    let _ = tcp.write_all(requests.as_bytes()).await;
    // Waits for courier to close it, reading nothing (a read would open the window): the
    // socket's own state says when courier's side is gone.
    use std::os::fd::AsRawFd;
    let fd = tcp.as_raw_fd();
    let mut counted = false;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD into a c_int we own.
        if !counted && unsafe { libc::ioctl(fd, libc::FIONREAD, &mut queued) } == 0 && queued >= 2048 {
            counted = true;
            served.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: getsockopt into a struct we own, of the size we pass.
        let (rc, state) = unsafe {
            let mut info: libc::tcp_info = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
            let rc = libc::getsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                (&mut info as *mut libc::tcp_info).cast(),
                &mut len,
            );
            (rc, info.tcpi_state)
        };
        // TCP_CLOSE (7: reset, the requests it never read) or TCP_CLOSE_WAIT (8: a FIN).
        if rc != 0 || state == 7 || state == 8 {
            closed.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_clients_that_pipeline_and_never_read_are_dropped_and_admin_answers_again() {
    const CONNS: usize = ADMIN_SLOTS_AT_1024 + 60;
    let d = tempfile::tempdir().unwrap();
    let config_path = d.path().join("courier.toml");
    std::fs::write(
        &config_path,
        "allow_private_targets = true\n[admin]\nidle_timeout = \"2s\"\n",
    )
    .unwrap();
    let data_dir = d.path().join("data");
    let mut cmd = serve_command(&config_path, &data_dir, "127.0.0.1:0");
    cmd.env("COURIER_ADMIN_SEND_TIMEOUT", SEND_TEXT);
    // 1,024 descriptors: 88 admin connections take every slot.
    // SAFETY: setrlimit in the child before exec, nothing else.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 1024,
                rlim_max: 1024,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let c = Courier::launch(cmd, config_path, data_dir);
    let (served, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let started = Instant::now();
    let clients: Vec<_> = (0..CONNS)
        .map(|_| tokio::spawn(pipelining_client(c.admin, 400, [served.clone(), closed.clone()])))
        .collect();
    // Every slot taken by a client whose answers fill its receive buffer.
    eventually("every admin slot to hold a client that reads nothing", || async {
        (served.load(Ordering::Relaxed) >= ADMIN_SLOTS_AT_1024).then_some(())
    })
    .await;
    let begun = Instant::now();
    let probe = tokio::time::timeout(2 * SEND + Duration::from_secs(1), get(&c.admin_url("/healthz"))).await;
    let took = begun.elapsed();
    eprintln!(
        "{CONNS} pipelining HTTP/1.1 connections on admin ({} closed by courier after {:?}); \
         /healthz: {:?} in {took:?}",
        closed.load(Ordering::Relaxed),
        started.elapsed(),
        probe.as_ref().map(|a| a.status)
    );
    assert_eq!(probe.expect("admin answers within 2 × send_timeout + 1 s").status, 200);
    eventually("courier to close every pipelining connection", || async {
        (closed.load(Ordering::Relaxed) == CONNS).then_some(())
    })
    .await;
    for client in clients {
        let _ = client.await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_that_declare_a_mebibyte_and_send_nothing_hold_no_budget() {
    const STALLED: usize = 64;
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    // The defaults: max_pending_bytes 64 MiB, max_body 1 MiB.
    let c = Courier::start(d.path(), &format!("ingress_token = \"{TOKEN}\"\n"));
    let target = rx.url("/stalled");
    // `Expect: 100-continue`: courier answers `100 Continue` once its handler reads the
    // body, so the test knows every upload is being read (and, before bytes were charged as
    // they arrive, held its declared 1 MiB).
    let head = format!(
        "POST /{target} HTTP/1.1\r\nhost: 127.0.0.1\r\ncourier-token: {TOKEN}\r\ncontent-type: application/json\r\n\
         content-length: 1048576\r\nexpect: 100-continue\r\n\r\n"
    );
    let mut stalled = Vec::new();
    for _ in 0..STALLED {
        let mut s = tokio::net::TcpStream::connect(c.ingress).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        let mut line = [0u8; 25];
        tokio::time::timeout(WAIT, s.read_exact(&mut line))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&line, b"HTTP/1.1 100 Continue\r\n\r\n");
        stalled.push(s);
    }
    let (status, took) = timed_post(&c, &rx, "/second", Duration::from_secs(1)).await;
    eprintln!("{STALLED} stalled uploads declaring 1 MiB each; the next client's POST: {status:?} in {took:?}");
    assert_eq!(status, Some(202), "a second client gets its 202 within 1 s");
    drop(stalled);
    rx.wait_for(1).await;
}
