//! A total cap on idle pooled outbound connections (`delivery.max_idle_connections`).
//!
//! hyper-util's pool bounds idle connections per host only, and closes them when
//! `idle_connection_timeout` runs out: a sweep over 10,000 receivers would leave 10,000
//! sockets open for that long. [`ConnCap`] counts, per `host:port`, the live connections
//! (registered by [`ConnCap::count`] when made, removed when their [`CappedIo`] is dropped)
//! and the requests in progress (a [`Busy`] guard held by each attempt until its body is
//! read). A host's idle connections are its live ones beyond its requests in progress.
//! Whenever a connection is made or a request ends and the idle total is over the cap,
//! connections of the hosts used least recently that have no request in progress are
//! closed until it is back under: nothing polls, and a host being used keeps every
//! connection, so the hot path keeps reusing its own.
//!
//! Closing is a flag on the connection: its reads then see end-of-file and its writes fail,
//! so hyper's connection task ends and drops the socket. A request that the pool hands a
//! connection closed this way a moment earlier never had a byte written, so hyper-util
//! retries it on a new connection (`retry_canceled_requests`, on by default).

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The host a URI's connections are counted under: `host:port`, the host lowercased and
/// the port the scheme's default when absent. `None` for a URI without a host.
pub fn host_key(uri: &Uri) -> Option<Arc<str>> {
    let host = uri.host()?;
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
    Some(format!("{}:{port}", host.to_ascii_lowercase()).into())
}

/// The close switch of one connection, shared by the registry and the connection's IO.
#[derive(Debug, Default)]
pub struct ConnState {
    closed: AtomicBool,
    /// The task last parked on a read of this connection: woken on close, so an idle
    /// connection (whose task waits only for the peer) notices at once.
    reader: Mutex<Option<Waker>>,
}

impl ConnState {
    /// Closes the connection: from now on its reads see EOF and its writes fail.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Some(w) = lock(&self.reader).take() {
            w.wake();
        }
    }

    /// Whether [`ConnState::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn park(&self, waker: &Waker) {
        let mut slot = lock(&self.reader);
        if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *slot = Some(waker.clone());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; a poisoned one still holds valid state.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One host's live connections and requests in progress.
#[derive(Default)]
struct Host {
    conns: Vec<(u64, Arc<ConnState>)>,
    busy: usize,
    /// [`Registry::tick`] at its last use: a request begun or ended, a connection made.
    last_use: u64,
}

impl Host {
    fn idle(&self) -> usize {
        self.conns.len().saturating_sub(self.busy)
    }

    /// Only a host with no request in progress may lose connections to the cap.
    fn closable(&self) -> bool {
        self.busy == 0 && !self.conns.is_empty()
    }
}

/// The cap's policy, without locks or I/O. Memory is bounded by the live connections and
/// requests: a host with neither has no entry.
pub struct Registry {
    cap: usize,
    /// A logical clock for least-recently-used order (no wall clock: ties cannot happen).
    tick: u64,
    next_id: u64,
    hosts: HashMap<Arc<str>, Host>,
    /// The closable hosts, least recently used first.
    lru: BTreeSet<(u64, Arc<str>)>,
    /// Sum of every host's idle connections.
    idle: usize,
}

impl Registry {
    /// A registry keeping at most `cap` idle connections open.
    pub fn new(cap: usize) -> Registry {
        Registry {
            cap,
            tick: 0,
            next_id: 0,
            hosts: HashMap::new(),
            lru: BTreeSet::new(),
            idle: 0,
        }
    }

    /// Applies `f` to `key`'s entry (created when `create`), keeping the idle total, the
    /// LRU index and the empty-entry removal in step.
    fn update(&mut self, key: &Arc<str>, create: bool, f: impl FnOnce(&mut Host, u64)) {
        if !create && !self.hosts.contains_key(key) {
            return;
        }
        self.tick += 1;
        let host = self.hosts.entry(key.clone()).or_default();
        let (idle_before, was_closable) = (host.idle(), host.closable());
        if was_closable {
            self.lru.remove(&(host.last_use, key.clone()));
        }
        f(host, self.tick);
        self.idle = self.idle - idle_before + host.idle();
        if host.closable() {
            self.lru.insert((host.last_use, key.clone()));
        } else if host.conns.is_empty() && host.busy == 0 {
            self.hosts.remove(key);
        }
    }

    /// A connection to `key` was made: returns its id and the connections to close now.
    pub fn register(&mut self, key: &Arc<str>, state: Arc<ConnState>) -> (u64, Vec<Arc<ConnState>>) {
        self.next_id += 1;
        let id = self.next_id;
        self.update(key, true, |h, now| {
            h.conns.push((id, state));
            h.last_use = now;
        });
        (id, self.enforce())
    }

    /// Connection `id` to `key` is gone (closed by anyone).
    pub fn deregister(&mut self, key: &Arc<str>, id: u64) {
        self.update(key, false, |h, _| h.conns.retain(|(i, _)| *i != id));
    }

    /// A request to `key` begins: the host's connections are not closed until it ends.
    pub fn begin(&mut self, key: &Arc<str>) {
        self.update(key, true, |h, now| {
            h.busy += 1;
            h.last_use = now;
        });
    }

    /// A request to `key` ended: returns the connections to close now.
    pub fn end(&mut self, key: &Arc<str>) -> Vec<Arc<ConnState>> {
        self.update(key, false, |h, now| {
            h.busy = h.busy.saturating_sub(1);
            h.last_use = now;
        });
        self.enforce()
    }

    /// Takes connections of the least recently used closable hosts out of the registry
    /// until the idle total is within the cap; returns them, for the caller to close.
    fn enforce(&mut self) -> Vec<Arc<ConnState>> {
        let mut closing = Vec::new();
        while self.idle > self.cap {
            let Some((_, key)) = self.lru.first().cloned() else {
                // The excess is held by hosts with requests in progress: it is looked at
                // again when those end.
                break;
            };
            // The oldest first: hyper reuses the connection returned last.
            self.update(&key, false, |h, _| closing.push(h.conns.remove(0).1));
        }
        closing
    }
}

/// The shared [`Registry`], closing connections outside its lock.
pub struct ConnCap(Mutex<Registry>);

impl ConnCap {
    /// A cap of `max_idle` idle connections, all hosts together.
    pub fn new(max_idle: usize) -> Arc<ConnCap> {
        Arc::new(ConnCap(Mutex::new(Registry::new(max_idle))))
    }

    /// Marks a request to `uri`'s host in progress until the guard is dropped.
    pub fn begin(self: &Arc<Self>, uri: &Uri) -> Busy {
        let key = host_key(uri);
        if let Some(k) = &key {
            lock(&self.0).begin(k);
        }
        Busy { cap: self.clone(), key }
    }

    /// Counts `io`, a connection just made to `key` (`None`: not counted), until it is
    /// dropped; `proxied` when hyper must write absolute-form requests on it.
    pub fn count(self: &Arc<Self>, key: Option<Arc<str>>, io: TokioIo<TcpStream>, proxied: bool) -> CappedIo {
        let state = Arc::new(ConnState::default());
        let registered = key.map(|key| {
            let (id, closing) = lock(&self.0).register(&key, state.clone());
            ConnCap::close(closing);
            (key, id)
        });
        CappedIo {
            io,
            proxied,
            state,
            cap: self.clone(),
            registered,
        }
    }

    fn close(closing: Vec<Arc<ConnState>>) {
        if !closing.is_empty() {
            tracing::debug!(
                closed = closing.len(),
                "idle connections over delivery.max_idle_connections closed"
            );
        }
        for c in closing {
            c.close();
        }
    }
}

/// A request in progress to one host (see [`ConnCap::begin`]).
pub struct Busy {
    cap: Arc<ConnCap>,
    key: Option<Arc<str>>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(k) = &self.key {
            let closing = lock(&self.cap.0).end(k);
            ConnCap::close(closing);
        }
    }
}

/// A connection counted by [`ConnCap::count`] while it lives, and ended (EOF on read, an
/// error on write) once the cap closes it.
pub struct CappedIo {
    io: TokioIo<TcpStream>,
    proxied: bool,
    state: Arc<ConnState>,
    cap: Arc<ConnCap>,
    registered: Option<(Arc<str>, u64)>,
}

impl Drop for CappedIo {
    fn drop(&mut self) {
        if let Some((key, id)) = &self.registered {
            lock(&self.cap.0).deregister(key, *id);
        }
    }
}

impl Read for CappedIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.state.is_closed() {
            return Poll::Ready(Ok(()));
        }
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending => {
                this.state.park(cx.waker());
                // A close between the check above and parking would have found no waker.
                if this.state.is_closed() {
                    return Poll::Ready(Ok(()));
                }
                Poll::Pending
            }
            ready => ready,
        }
    }
}

impl CappedIo {
    fn refused(&self) -> Option<io::Error> {
        let closed = self.state.is_closed();
        closed.then(|| io::Error::new(io::ErrorKind::BrokenPipe, "closed: over delivery.max_idle_connections"))
    }
}

impl Write for CappedIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if let Some(e) = self.refused() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.refused() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

impl Connection for CappedIo {
    fn connected(&self) -> Connected {
        self.io.connected().proxy(self.proxied)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Registry {
        fn idle(&self) -> usize {
            self.idle
        }

        fn hosts(&self) -> usize {
            self.hosts.len()
        }
    }

    fn key(s: &str) -> Arc<str> {
        s.into()
    }

    /// Registers `n` connections to `k` the way an attempt makes them: a request begins,
    /// connects, ends.
    fn use_host(r: &mut Registry, k: &Arc<str>, n: usize) -> Vec<Arc<ConnState>> {
        let conns: Vec<_> = (0..n).map(|_| Arc::new(ConnState::default())).collect();
        for c in &conns {
            r.begin(k);
            let (_, closing) = r.register(k, c.clone());
            assert!(closing.is_empty(), "nothing closed while the request runs");
        }
        for _ in 0..n {
            for c in r.end(k) {
                c.close();
            }
        }
        conns
    }

    fn closed(conns: &[Arc<ConnState>]) -> usize {
        conns.iter().filter(|c| c.is_closed()).count()
    }

    #[test]
    fn host_keys_name_host_and_port() {
        let k = |u: &str| host_key(&u.parse().unwrap()).map(|k| k.to_string());
        assert_eq!(k("https://API.example/hook").as_deref(), Some("api.example:443"));
        assert_eq!(k("http://a.example/x").as_deref(), Some("a.example:80"));
        assert_eq!(k("http://u:p@127.0.0.2:9000/").as_deref(), Some("127.0.0.2:9000"));
        assert_eq!(k("http://[::1]:8080").as_deref(), Some("[::1]:8080"));
        assert_eq!(k("/relative"), None);
    }

    #[test]
    fn the_least_recently_used_hosts_lose_their_connections_first() {
        let mut r = Registry::new(2);
        let (a, b, c) = (key("a:80"), key("b:80"), key("c:80"));
        let ca = use_host(&mut r, &a, 1);
        let cb = use_host(&mut r, &b, 1);
        assert_eq!((r.idle(), closed(&ca), closed(&cb)), (2, 0, 0), "within the cap");
        // a is used again, so b is now the least recently used.
        r.begin(&a);
        for s in r.end(&a) {
            s.close();
        }
        let cc = use_host(&mut r, &c, 1);
        assert_eq!((closed(&ca), closed(&cb), closed(&cc)), (0, 1, 0));
        assert_eq!((r.idle(), r.hosts()), (2, 2), "b's entry went with its connection");
    }

    #[test]
    fn a_host_with_a_request_in_progress_keeps_its_connections() {
        let mut r = Registry::new(1);
        let (a, b, c) = (key("a:80"), key("b:80"), key("c:80"));
        let ca = use_host(&mut r, &a, 3);
        assert_eq!((closed(&ca), r.idle()), (2, 1), "one host alone is cut to the cap");
        // a's request runs on its one connection; then b and c are used. a is the least
        // recently used, but busy: b goes instead.
        r.begin(&a);
        let cb = use_host(&mut r, &b, 1);
        let cc = use_host(&mut r, &c, 1);
        assert_eq!((closed(&ca), closed(&cb), closed(&cc)), (2, 1, 0));
        // Two more connections to a while it is busy: c goes, then nothing else can, and a
        // keeps its idle ones over the cap.
        let (_, closing) = r.register(&a, Arc::new(ConnState::default()));
        assert_eq!(
            (closing.len(), closed(&cc)),
            (1, 0),
            "returned, for the caller to close"
        );
        let (_, closing) = r.register(&a, Arc::new(ConnState::default()));
        assert!(closing.is_empty());
        assert_eq!(r.idle(), 2, "over the cap while a is busy");
        // When its request ends, the excess goes.
        let closing = r.end(&a);
        assert_eq!((closing.len(), r.idle()), (2, 1));
    }

    #[test]
    fn the_hot_host_keeps_reusing_its_connections() {
        let mut r = Registry::new(4);
        let hot = key("hot:443");
        let conn = Arc::new(ConnState::default());
        r.begin(&hot);
        r.register(&hot, conn.clone());
        assert!(r.end(&hot).is_empty());
        for i in 0..20 {
            // The pooled connection serves every request; cold hosts come and go.
            r.begin(&hot);
            assert!(r.end(&hot).is_empty());
            let cold = use_host(&mut r, &key(&format!("cold{i}:80")), 1);
            assert!(!cold[0].is_closed(), "a host just used keeps its connection");
        }
        assert!(!conn.is_closed(), "the host used last is never the one closed");
        assert_eq!(r.idle(), 4);
    }

    #[test]
    fn entries_go_when_a_host_has_no_connection_and_no_request() {
        let mut r = Registry::new(8);
        let a = key("a:80");
        r.begin(&a);
        assert_eq!(r.hosts(), 1);
        r.end(&a);
        assert_eq!(r.hosts(), 0, "a failed connect leaves nothing behind");
        r.begin(&a);
        let (id, _) = r.register(&a, Arc::new(ConnState::default()));
        r.end(&a);
        assert_eq!((r.hosts(), r.idle()), (1, 1));
        r.deregister(&a, id);
        assert_eq!((r.hosts(), r.idle(), r.lru.len()), (0, 0, 0));
        // Events for a host without an entry create none.
        r.deregister(&a, id);
        assert!(r.end(&a).is_empty());
        assert_eq!(r.hosts(), 0);
    }

    #[test]
    fn a_connection_closed_by_the_cap_is_not_counted_twice() {
        let mut r = Registry::new(1);
        let (a, b) = (key("a:80"), key("b:80"));
        let ca = use_host(&mut r, &a, 1);
        let cb = use_host(&mut r, &b, 1);
        assert_eq!((closed(&ca), closed(&cb), r.idle()), (1, 0, 1));
        // The closed connection's IO drops later and deregisters an id no longer there.
        r.deregister(&a, 1);
        assert_eq!((r.idle(), r.hosts(), closed(&cb)), (1, 1, 0));
    }

    #[test]
    fn closing_ends_reads_and_wakes_the_parked_reader() {
        struct Flag(AtomicBool);
        impl std::task::Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let state = ConnState::default();
        state.park(&Waker::from(flag.clone()));
        assert!(!state.is_closed());
        state.close();
        assert!(state.is_closed() && flag.0.load(Ordering::SeqCst));
    }
}
