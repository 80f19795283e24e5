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
//! Below the cap, only the [`KEEP_IDLE`] idle connections of the hosts used most recently
//! wait out `idle_connection_timeout`; those beyond them are closed once their host has gone
//! [`LINGER`] without a request. Each idle connection holds tens of KiB (hyper's read and
//! write buffers, its dispatch channel, TLS state): after a sweep over a thousand receivers
//! they were most of courier's memory, for connections that a sweep reuses within
//! milliseconds or not at all. A timer runs while there are more idle connections than
//! that, set for the moment the least recently used host's linger ends; it stops when the
//! excess is gone (or held by hosts with requests in progress, whose end sets it again).
//! When it stops after closing some, the pools sweep their idle lists (see `sweep`: they
//! would keep each closed connection's entry and request channel until their own sweep, up
//! to `idle_connection_timeout` later), and then the allocator is asked to give the freed
//! memory back to the operating system (see `sys::trim`; at most once per 30 s): glibc
//! keeps it in its arenas otherwise. On the benchmark's sweep over 1,000 hosts the settled
//! RSS was 1.63x one receiver's run with neither, 1.26–1.41x with the trim alone and
//! 1.01–1.05x with both (10k to 1M endpoints).
//!
//! Closing is a flag on the connection: its reads then see end-of-file and its writes fail,
//! so hyper's connection task ends and drops the socket. A request that the pool hands a
//! connection closed this way a moment earlier never had a byte written, so hyper-util
//! retries it on a new connection (`retry_canceled_requests`, on by default).

use std::collections::BTreeSet;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::sweep::{Sweep, SweepTimer};

/// Idle connections kept for `idle_connection_timeout`, all hosts together (at most
/// `max_idle_connections`): those of the hosts used most recently. As many as a host may
/// have in flight by default and more, so one busy receiver keeps all of its own.
pub const KEEP_IDLE: usize = 64;

/// How long a host's connections beyond [`KEEP_IDLE`] stay open after its last request: a
/// sweep over many receivers comes back to each within this, or is over.
pub const LINGER: Duration = Duration::from_secs(2);

/// The least time between two trims after linger timers (see [`Registry::trim_due`]).
pub const TRIM_GAP: Duration = Duration::from_millis(crate::sys::trim::MIN_GAP_MS);

/// How long after its last close the linger timer waits to trim: the closed connections'
/// tasks see end-of-file and free their buffers within it (they run on the same runtime).
/// A delay, not an event: a task that has not run by then only means this trim returns
/// less (the next one, or the allocator itself, gets the rest); counting each closed
/// connection's drop would make it exact for more state than that is worth.
const TRIM_AFTER: Duration = Duration::from_millis(100);

/// The host a URI's connections are counted under: `host:port`, the host lowercased and
/// the port the scheme's default when absent. `None` for a URI without a host.
pub fn host_key(uri: &Uri) -> Option<Arc<str>> {
    host_key_text(uri).map(Into::into)
}

fn host_key_text(uri: &Uri) -> Option<String> {
    let host = uri.host()?;
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
    Some(crate::target::host_port(host, Some(port)))
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

/// Tokio's clock (paused in tests that drive the linger timer), not the wall clock.
fn now() -> Instant {
    tokio::time::Instant::now()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; a poisoned one still holds valid state.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One host's live connections and requests in progress.
struct Host {
    conns: Vec<(u64, Arc<ConnState>)>,
    busy: usize,
    /// [`Registry::tick`] at its last use: a request begun or ended, a connection made.
    last_use: u64,
    /// The time of that use.
    used_at: Instant,
}

impl Host {
    fn new(now: Instant) -> Host {
        Host {
            conns: Vec::new(),
            busy: 0,
            last_use: 0,
            used_at: now,
        }
    }

    fn idle(&self) -> usize {
        self.conns.len().saturating_sub(self.busy)
    }

    fn used(&mut self, tick: u64, now: Instant) {
        self.last_use = tick;
        self.used_at = self.used_at.max(now);
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
    /// Idle connections that may outlive [`LINGER`] (at most `cap`).
    keep: usize,
    linger: Duration,
    /// Whether the linger timer is set (see [`Registry::arm`]).
    armed: bool,
    /// A logical clock for least-recently-used order (no wall clock: ties cannot happen).
    tick: u64,
    next_id: u64,
    hosts: foldhash::HashMap<Arc<str>, Host>,
    /// The closable hosts, least recently used first.
    lru: BTreeSet<(u64, Arc<str>)>,
    /// Sum of every host's idle connections.
    idle: usize,
    /// When the linger timer last had the freed heap given back.
    last_trim: Option<Instant>,
}

impl Registry {
    /// A registry keeping at most `cap` idle connections open, and at most `keep` of them
    /// for longer than `linger` after their host's last use.
    pub fn new(cap: usize, keep: usize, linger: Duration) -> Registry {
        Registry {
            cap,
            keep: keep.min(cap),
            linger,
            armed: false,
            tick: 0,
            next_id: 0,
            hosts: Default::default(),
            lru: BTreeSet::new(),
            idle: 0,
            last_trim: None,
        }
    }

    /// Applies `f` to `key`'s entry (created, used at `create`, when that is given),
    /// keeping the idle total, the LRU index and the empty-entry removal in step.
    fn update(&mut self, key: &Arc<str>, create: Option<Instant>, f: impl FnOnce(&mut Host, u64)) {
        let host = match (self.hosts.get_mut(key), create) {
            (Some(host), _) => host,
            (None, Some(now)) => self.hosts.entry(key.clone()).or_insert(Host::new(now)),
            (None, None) => return,
        };
        self.tick += 1;
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

    /// A connection to `key` was made at `now`: returns its id and the connections to close
    /// now.
    pub fn register(&mut self, key: &Arc<str>, state: Arc<ConnState>, now: Instant) -> (u64, Vec<Arc<ConnState>>) {
        self.next_id += 1;
        let id = self.next_id;
        self.update(key, Some(now), |h, tick| {
            h.conns.push((id, state));
            h.used(tick, now);
        });
        (id, self.enforce())
    }

    /// Connection `id` to `key` is gone (closed by anyone).
    pub fn deregister(&mut self, key: &Arc<str>, id: u64) {
        self.update(key, None, |h, _| h.conns.retain(|(i, _)| *i != id));
    }

    /// A request to `key` begins at `now`: the host's connections are not closed until it
    /// ends.
    pub fn begin(&mut self, key: &Arc<str>, now: Instant) {
        self.update(key, Some(now), |h, tick| {
            h.busy += 1;
            h.used(tick, now);
        });
    }

    /// A request to `key` ended at `now`: returns the connections to close now.
    pub fn end(&mut self, key: &Arc<str>, now: Instant) -> Vec<Arc<ConnState>> {
        self.update(key, None, |h, tick| {
            h.busy = h.busy.saturating_sub(1);
            h.used(tick, now);
        });
        self.enforce()
    }

    /// When the least recently used closable host's linger ends, if there are idle
    /// connections beyond `keep` (else `None`).
    fn next_linger_end(&self) -> Option<Instant> {
        if self.idle <= self.keep {
            return None;
        }
        let (_, key) = self.lru.first()?;
        Some(self.hosts.get(key)?.used_at + self.linger)
    }

    /// Sets the linger timer if it is needed and not set: returns when it should fire.
    pub fn arm(&mut self) -> Option<Instant> {
        if self.armed {
            return None;
        }
        let at = self.next_linger_end()?;
        self.armed = true;
        Some(at)
    }

    /// The linger timer fired at `now`: takes the connections beyond `keep` of the hosts
    /// unused for `linger` out of the registry, least recently used first, and returns
    /// them (for the caller to close) with when to fire next (`None`: the timer is unset).
    pub fn linger_ended(&mut self, now: Instant) -> (Vec<Arc<ConnState>>, Option<Instant>) {
        let mut closing = Vec::new();
        while self.next_linger_end().is_some_and(|at| at <= now) {
            let (_, key) = self.lru.first().cloned().expect("next_linger_end found one");
            // The oldest first, as in `enforce`.
            self.update(&key, None, |h, _| closing.push(h.conns.remove(0).1));
        }
        let next = self.next_linger_end();
        self.armed = next.is_some();
        (closing, next)
    }

    /// Whether a linger timer that closed connections may give the freed heap back at
    /// `now` (claimed if so): at most once per [`TRIM_GAP`], as a trim walks every arena
    /// holding its lock.
    pub fn trim_due(&mut self, now: Instant) -> bool {
        let due = self.last_trim.is_none_or(|t| now >= t + TRIM_GAP);
        if due {
            self.last_trim = Some(now);
        }
        due
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
            self.update(&key, None, |h, _| closing.push(h.conns.remove(0).1));
        }
        closing
    }
}

/// The shared [`Registry`], closing connections outside its lock and running its linger
/// timer; and the pools' [`Sweep`], fired once the timer's closes are done.
pub struct ConnCap(Mutex<Registry>, Sweep);

impl ConnCap {
    /// A cap of `max_idle` idle connections, all hosts together, of which [`KEEP_IDLE`]
    /// outlive [`LINGER`].
    pub fn new(max_idle: usize) -> Arc<ConnCap> {
        Arc::new(ConnCap(
            Mutex::new(Registry::new(max_idle, KEEP_IDLE, LINGER)),
            Sweep::default(),
        ))
    }

    /// The timer to give each pool whose connections this cap counts: its idle sweep runs
    /// as soon as a linger timer's closes are done, not only every `idle_connection_timeout`.
    pub fn pool_timer(&self) -> SweepTimer {
        self.1.timer()
    }

    /// Marks a request to `uri`'s host in progress until the guard is dropped.
    pub fn begin(self: &Arc<Self>, uri: &Uri) -> Busy {
        let key = host_key_text(uri).map(|text| {
            let mut registry = lock(&self.0);
            // The key the registry holds, when it has one: no second copy per request.
            let key = registry.hosts.get_key_value(text.as_str()).map(|(k, _)| k.clone());
            let key = key.unwrap_or_else(|| text.into());
            registry.begin(&key, now());
            key
        });
        Busy { cap: self.clone(), key }
    }

    /// Closes `closing` and sets the linger timer if the registry wants it (on the current
    /// tokio runtime; outside one, as at shutdown, it is left for the next request's end).
    fn settle(self: &Arc<Self>, mut registry: MutexGuard<'_, Registry>, closing: Vec<Arc<ConnState>>) {
        let timer = registry.arm().and_then(|at| {
            let handle = tokio::runtime::Handle::try_current().ok();
            registry.armed = handle.is_some();
            handle.map(|h| (h, at))
        });
        drop(registry);
        ConnCap::close(closing);
        if let Some((handle, at)) = timer {
            handle.spawn(linger(Arc::downgrade(self), at));
        }
    }

    /// Counts `io`, a connection just made to `key` (`None`: not counted), until it is
    /// dropped; `proxied` when hyper must write absolute-form requests on it.
    pub fn count(self: &Arc<Self>, key: Option<Arc<str>>, io: TokioIo<TcpStream>, proxied: bool) -> CappedIo {
        let state = Arc::new(ConnState::default());
        let registered = key.map(|key| {
            let mut registry = lock(&self.0);
            let (id, closing) = registry.register(&key, state.clone(), now());
            self.settle(registry, closing);
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
                "idle pooled connections closed (over delivery.max_idle_connections, or lingering)"
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
            let mut registry = lock(&self.cap.0);
            let closing = registry.end(k, now());
            self.cap.settle(registry, closing);
        }
    }
}

/// The linger timer: sleeps until the next host's linger ends, closes what is due, and
/// ends when nothing is left to wait for (or the cap is gone), giving the freed heap back
/// if it closed any.
async fn linger(cap: std::sync::Weak<ConnCap>, mut at: Instant) {
    let mut closed = 0;
    loop {
        tokio::time::sleep_until(at).await;
        let Some(strong) = cap.upgrade() else {
            return;
        };
        let (closing, next) = lock(&strong.0).linger_ended(now());
        closed += closing.len();
        ConnCap::close(closing);
        match next {
            Some(next) => at = next,
            None => break,
        }
    }
    if closed == 0 {
        return;
    }
    // The closed connections' tasks end within `TRIM_AFTER`; then the pools drop their
    // entries (each with hyper's request channel), and only then is the heap trimmed.
    tokio::time::sleep(TRIM_AFTER).await;
    match cap.upgrade() {
        Some(c) => c.1.now(),
        None => return,
    }
    tokio::time::sleep(TRIM_AFTER).await;
    let due = cap.upgrade().is_some_and(|c| lock(&c.0).trim_due(now()));
    if due {
        // On the blocking pool: a trim can take milliseconds on a large heap.
        let _ = tokio::task::spawn_blocking(crate::sys::trim::trim).await;
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
    /// What the pool needs of a TCP connection: whether it is proxied. Not the socket
    /// addresses the TCP stream adds as an extra, which hyper-util would copy into every
    /// response's extensions (two allocations an attempt, read by nothing).
    fn connected(&self) -> Connected {
        Connected::new().proxy(self.proxied)
    }
}

#[cfg(test)]
#[path = "conn_cap_tests.rs"]
mod tests;
