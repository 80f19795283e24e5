//! The idle cap's policy and its close switch.

use super::*;

impl Registry {
    fn idle(&self) -> usize {
        self.idle
    }

    fn hosts(&self) -> usize {
        self.hosts.len()
    }
}

/// Now, for tests where only the order of uses matters (no linger: `keep` is the cap).
fn t() -> Instant {
    Instant::now()
}

fn key(s: &str) -> Arc<str> {
    s.into()
}

/// Registers `n` connections to `k` the way an attempt makes them: a request begins,
/// connects, ends.
fn use_host(r: &mut Registry, k: &Arc<str>, n: usize) -> Vec<Arc<ConnState>> {
    use_host_at(r, k, n, t())
}

/// [`use_host`] at `at`.
fn use_host_at(r: &mut Registry, k: &Arc<str>, n: usize, at: Instant) -> Vec<Arc<ConnState>> {
    let conns: Vec<_> = (0..n).map(|_| Arc::new(ConnState::default())).collect();
    for c in &conns {
        r.begin(k, at);
        let (_, closing) = r.register(k, c.clone(), at);
        assert!(closing.is_empty(), "nothing closed while the request runs");
    }
    for _ in 0..n {
        for c in r.end(k, at) {
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
    let mut r = Registry::new(2, 2, LINGER);
    let (a, b, c) = (key("a:80"), key("b:80"), key("c:80"));
    let ca = use_host(&mut r, &a, 1);
    let cb = use_host(&mut r, &b, 1);
    assert_eq!((r.idle(), closed(&ca), closed(&cb)), (2, 0, 0), "within the cap");
    // a is used again, so b is now the least recently used.
    r.begin(&a, t());
    for s in r.end(&a, t()) {
        s.close();
    }
    let cc = use_host(&mut r, &c, 1);
    assert_eq!((closed(&ca), closed(&cb), closed(&cc)), (0, 1, 0));
    assert_eq!((r.idle(), r.hosts()), (2, 2), "b's entry went with its connection");
}

#[test]
fn a_host_with_a_request_in_progress_keeps_its_connections() {
    let mut r = Registry::new(1, 1, LINGER);
    let (a, b, c) = (key("a:80"), key("b:80"), key("c:80"));
    let ca = use_host(&mut r, &a, 3);
    assert_eq!((closed(&ca), r.idle()), (2, 1), "one host alone is cut to the cap");
    // a's request runs on its one connection; then b and c are used. a is the least
    // recently used, but busy: b goes instead.
    r.begin(&a, t());
    let cb = use_host(&mut r, &b, 1);
    let cc = use_host(&mut r, &c, 1);
    assert_eq!((closed(&ca), closed(&cb), closed(&cc)), (2, 1, 0));
    // Two more connections to a while it is busy: c goes, then nothing else can, and a
    // keeps its idle ones over the cap.
    let (_, closing) = r.register(&a, Arc::new(ConnState::default()), t());
    assert_eq!(
        (closing.len(), closed(&cc)),
        (1, 0),
        "returned, for the caller to close"
    );
    let (_, closing) = r.register(&a, Arc::new(ConnState::default()), t());
    assert!(closing.is_empty());
    assert_eq!(r.idle(), 2, "over the cap while a is busy");
    // When its request ends, the excess goes.
    let closing = r.end(&a, t());
    assert_eq!((closing.len(), r.idle()), (2, 1));
}

#[test]
fn the_hot_host_keeps_reusing_its_connections() {
    let mut r = Registry::new(4, 4, LINGER);
    let hot = key("hot:443");
    let conn = Arc::new(ConnState::default());
    r.begin(&hot, t());
    r.register(&hot, conn.clone(), t());
    assert!(r.end(&hot, t()).is_empty());
    for i in 0..20 {
        // The pooled connection serves every request; cold hosts come and go.
        r.begin(&hot, t());
        assert!(r.end(&hot, t()).is_empty());
        let cold = use_host(&mut r, &key(&format!("cold{i}:80")), 1);
        assert!(!cold[0].is_closed(), "a host just used keeps its connection");
    }
    assert!(!conn.is_closed(), "the host used last is never the one closed");
    assert_eq!(r.idle(), 4);
}

#[test]
fn entries_go_when_a_host_has_no_connection_and_no_request() {
    let mut r = Registry::new(8, 8, LINGER);
    let a = key("a:80");
    r.begin(&a, t());
    assert_eq!(r.hosts(), 1);
    r.end(&a, t());
    assert_eq!(r.hosts(), 0, "a failed connect leaves nothing behind");
    r.begin(&a, t());
    let (id, _) = r.register(&a, Arc::new(ConnState::default()), t());
    r.end(&a, t());
    assert_eq!((r.hosts(), r.idle()), (1, 1));
    r.deregister(&a, id);
    assert_eq!((r.hosts(), r.idle(), r.lru.len()), (0, 0, 0));
    // Events for a host without an entry create none.
    r.deregister(&a, id);
    assert!(r.end(&a, t()).is_empty());
    assert_eq!(r.hosts(), 0);
}

#[test]
fn a_connection_closed_by_the_cap_is_not_counted_twice() {
    let mut r = Registry::new(1, 1, LINGER);
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

/// Closes what the registry handed back, and returns when its timer fires next.
fn fire(r: &mut Registry, at: Instant) -> Option<Instant> {
    let (closing, next) = r.linger_ended(at);
    closing.iter().for_each(|c| c.close());
    next
}

#[test]
fn connections_beyond_the_kept_ones_close_once_their_host_has_lingered() {
    let linger = Duration::from_secs(2);
    let mut r = Registry::new(10, 2, linger);
    let t0 = t();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let hosts: Vec<_> = ["a:80", "b:80", "c:80", "d:80"].map(key).into();
    let conns: Vec<_> = hosts
        .iter()
        .zip(0..)
        .map(|(h, s)| use_host_at(&mut r, h, 1, at(s)))
        .collect();
    let open = |conns: &[Vec<Arc<ConnState>>]| conns.iter().map(|c| 1 - closed(c)).collect::<Vec<_>>();
    assert_eq!(open(&conns), [1, 1, 1, 1], "under the cap: nothing closed at once");
    assert_eq!(r.arm(), Some(at(2)), "set for the end of a's linger");
    assert_eq!(r.arm(), None, "set once");
    assert_eq!(fire(&mut r, at(2)), Some(at(3)), "b's linger ends next");
    assert_eq!(open(&conns), [0, 1, 1, 1]);
    assert_eq!(fire(&mut r, at(3)), None, "down to the kept ones: the timer stops");
    assert_eq!((open(&conns), r.idle()), (vec![0, 0, 1, 1], 2));
    assert_eq!(fire(&mut r, at(100)), None, "the kept ones wait for the idle timeout");
    assert_eq!(open(&conns), [0, 0, 1, 1]);
    assert_eq!(r.arm(), None);
}

#[test]
fn a_host_used_again_or_busy_keeps_its_connections_through_the_linger() {
    let linger = Duration::from_secs(2);
    let mut r = Registry::new(10, 0, linger);
    let t0 = t();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let (a, b, c) = (key("a:80"), key("b:80"), key("c:80"));
    let ca = use_host_at(&mut r, &a, 1, at(0));
    let cb = use_host_at(&mut r, &b, 2, at(0));
    let cc = use_host_at(&mut r, &c, 1, at(0));
    assert_eq!(r.arm(), Some(at(2)));
    // a is used again; a request to b is in progress (on one of its connections).
    r.begin(&a, at(1));
    assert!(r.end(&a, at(1)).is_empty());
    r.begin(&b, at(1));
    assert_eq!(fire(&mut r, at(2)), Some(at(3)), "then a's linger, from its last use");
    assert_eq!((closed(&ca), closed(&cb), closed(&cc)), (0, 0, 1));
    assert_eq!(fire(&mut r, at(3)), None, "b's idle one waits for its request to end");
    assert_eq!((closed(&ca), closed(&cb), r.idle()), (1, 0, 1));
    // Its end sets the timer again.
    assert!(r.end(&b, at(4)).is_empty());
    assert_eq!(r.arm(), Some(at(6)));
    assert_eq!(fire(&mut r, at(6)), None);
    assert_eq!((closed(&cb), r.idle(), r.hosts()), (2, 0, 0));
}

#[test]
fn the_freed_heap_is_given_back_at_most_once_per_gap() {
    let mut r = Registry::new(10, 0, Duration::from_secs(2));
    let t0 = t();
    assert!(r.trim_due(t0), "the first sweep trims");
    assert!(!r.trim_due(t0), "claimed");
    assert!(!r.trim_due(t0 + TRIM_GAP - Duration::from_millis(1)));
    assert!(r.trim_due(t0 + TRIM_GAP));
}

#[tokio::test]
async fn the_pools_sweep_once_the_linger_timer_has_closed_connections() {
    use hyper::rt::Timer;
    let cap = ConnCap::new(1000);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // One idle connection to each of more hosts than are kept: the excess lingers.
    let mut conns = Vec::new();
    let start = Instant::now();
    for i in 0..=KEEP_IDLE {
        let uri: Uri = format!("http://h{i}.example/").parse().unwrap();
        let stream = TcpStream::connect(addr).await.unwrap();
        conns.push(cap.count(host_key(&uri), TokioIo::new(stream), false));
        drop(cap.begin(&uri));
    }
    // What hyper-util's pool waits on between two sweeps of its idle list: without the
    // linger timer's call, an hour here.
    let swept = tokio::time::timeout(
        Duration::from_secs(30),
        cap.pool_timer().sleep(Duration::from_secs(3600)),
    );
    assert!(swept.await.is_ok(), "the pools were told to sweep");
    let waited = Instant::now() - start;
    assert_eq!(
        conns.iter().filter(|c| c.state.is_closed()).count(),
        1,
        "the linger closed one"
    );
    assert!(
        waited >= LINGER + TRIM_AFTER,
        "after the closes, not before: {waited:?}"
    );
}

#[tokio::test]
async fn a_counted_connection_says_whether_it_is_proxied_and_carries_no_extras() {
    let cap = ConnCap::new(10);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    for proxied in [false, true] {
        let stream = TcpStream::connect(addr).await.unwrap();
        let io = cap.count(None, TokioIo::new(stream), proxied);
        let connected = io.connected();
        assert_eq!(connected.is_proxied(), proxied);
        let mut extensions = http::Extensions::new();
        connected.get_extras(&mut extensions);
        assert!(extensions.is_empty(), "nothing copied into each response");
    }
}

#[tokio::test]
async fn a_request_to_a_known_host_shares_the_registry_s_key() {
    let cap = ConnCap::new(10);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri: Uri = "http://H.example/x".parse().unwrap();
    let stream = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let io = cap.count(host_key(&uri), TokioIo::new(stream), false);
    let busy = cap.begin(&uri);
    let (held, _) = io.registered.as_ref().unwrap();
    assert_eq!(&**held, "h.example:80");
    assert!(Arc::ptr_eq(busy.key.as_ref().unwrap(), held), "no copy per request");
    let other = cap.begin(&"https://other.example/".parse().unwrap());
    assert_eq!(other.key.as_deref(), Some("other.example:443"));
}
