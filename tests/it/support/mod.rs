//! Test support: the real `courier` binary on ephemeral ports, a scripted receiver on
//! 127.0.0.1:0 that records what it saw, and a small HTTP client. Everything waits on
//! events with a deadline; nothing sleeps and hopes.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub mod load;
pub mod powercut;
mod receiver;
pub mod resolver;

pub use receiver::{Gate, Receiver, Reply, Seen};

/// How long any wait in a test may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// Shared, waitable log lines of a child process.
#[derive(Clone, Default)]
pub struct Lines(Arc<(Mutex<Vec<String>>, Condvar)>);

impl Lines {
    /// Adds a line (from a reader thread of the child's output).
    pub fn push(&self, line: String) {
        let (m, c) = &*self.0;
        m.lock().unwrap().push(line);
        c.notify_all();
    }

    /// Waits for a line containing `needle`; returns it.
    pub fn wait_for(&self, needle: &str, timeout: Duration) -> Option<String> {
        let (m, c) = &*self.0;
        let deadline = Instant::now() + timeout;
        let mut lines = m.lock().unwrap();
        loop {
            if let Some(l) = lines.iter().find(|l| l.contains(needle)) {
                return Some(l.clone());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            lines = c.wait_timeout(lines, left).unwrap().0;
        }
    }

    /// Waits until `n` lines contain `needle`.
    pub fn wait_for_count(&self, needle: &str, n: usize, timeout: Duration) -> bool {
        let (m, c) = &*self.0;
        let deadline = Instant::now() + timeout;
        let mut lines = m.lock().unwrap();
        loop {
            if lines.iter().filter(|l| l.contains(needle)).count() >= n {
                return true;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            lines = c.wait_timeout(lines, left).unwrap().0;
        }
    }

    /// Everything seen so far.
    pub fn all(&self) -> String {
        self.0 .0.lock().unwrap().join("\n")
    }
}

/// A running courier binary.
pub struct Courier {
    child: Option<Child>,
    /// Ingress address (`0.0.0.0:0` when ingress is a Unix socket: see `ingress_socket`).
    pub ingress: SocketAddr,
    /// The ingress socket file, when `listen = "unix:/path"`.
    pub ingress_socket: Option<PathBuf>,
    /// Admin address.
    pub admin: SocketAddr,
    /// The read-only ops listener, when started with `ops_listen`.
    pub ops: Option<SocketAddr>,
    /// Data dir.
    pub data_dir: PathBuf,
    /// Config file.
    pub config_path: PathBuf,
    /// stderr lines.
    pub log: Lines,
}

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_courier")
}

/// Whether this run must not skip: `COURIER_TEST_REQUIRE_VERIFIERS=1`, which
/// scripts/test.sh (and so CI) sets. A test whose tool or capability is missing then fails
/// even when `COURIER_TEST_ALLOW_SKIP=1` is set too.
pub fn required() -> bool {
    std::env::var("COURIER_TEST_REQUIRE_VERIFIERS").is_ok_and(|v| v == "1")
}

/// Whether the developer allowed tests whose tool is missing to pass without running:
/// `COURIER_TEST_ALLOW_SKIP=1`.
pub fn skip_allowed() -> bool {
    std::env::var("COURIER_TEST_ALLOW_SKIP").is_ok_and(|v| v == "1") && !required()
}

/// A test whose tool or capability is missing: it fails, saying what is missing, unless
/// `COURIER_TEST_ALLOW_SKIP=1` lets it pass after printing `skipped: <test> (<why>)` past
/// the output capture (libtest cannot count a test as ignored once it runs, so a plain
/// `cargo test` never counts a test that did not run as passed).
/// `COURIER_TEST_REQUIRE_VERIFIERS=1` (CI) never allows it.
pub fn skip(reason: &str) {
    if required() {
        panic!("{reason}, and COURIER_TEST_REQUIRE_VERIFIERS=1 (CI) does not allow skipping it");
    }
    assert!(
        skip_allowed(),
        "{reason}: this test cannot run here. Install what it needs (scripts/verifiers.sh), \
         or set COURIER_TEST_ALLOW_SKIP=1 to let it pass without running"
    );
    // Straight to the process's stderr, past libtest's capture: seen without --nocapture.
    let _ = writeln!(
        std::io::stderr().lock(),
        "skipped: {} ({reason}; COURIER_TEST_ALLOW_SKIP=1)",
        std::thread::current().name().unwrap_or("a test")
    );
}

/// A loopback address nothing listens on (connections are refused). Its port stays
/// reserved for the rest of the run (see [`reserve_port`]), so no listener of this or a
/// parallel test is given it; [`Receiver::start_on`] can still bind it to bring a "down"
/// receiver back.
pub fn dead_addr() -> SocketAddr {
    reserve_port()
}

/// A loopback port held for the rest of the test run by a socket that is bound, with
/// `SO_REUSEADDR`, and never listens. While it is held, the kernel gives the port to no
/// other socket binding port 0 and uses it as no connection's local port, and connections
/// to it are refused; a server told to listen on it (`SO_REUSEADDR`, as tokio, std and
/// redis-server set) still can, and again after a restart. (Binding port 0 and closing the
/// socket, as this once did, left the port free for anyone until it was used.)
pub fn reserve_port() -> SocketAddr {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    static HELD: Mutex<Vec<OwnedFd>> = Mutex::new(Vec::new());
    // SAFETY: plain socket calls on a descriptor this function owns, with structs of the
    // sizes passed.
    unsafe {
        let raw = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(raw >= 0, "socket: {}", std::io::Error::last_os_error());
        let fd = OwnedFd::from_raw_fd(raw);
        let one: libc::c_int = 1;
        let set = libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        assert_eq!(set, 0, "SO_REUSEADDR: {}", std::io::Error::last_os_error());
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let bound = libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_in).cast(), len);
        assert_eq!(bound, 0, "bind 127.0.0.1:0: {}", std::io::Error::last_os_error());
        let named = libc::getsockname(fd.as_raw_fd(), (&mut addr as *mut libc::sockaddr_in).cast(), &mut len);
        assert_eq!(named, 0, "getsockname: {}", std::io::Error::last_os_error());
        let port = u16::from_be(addr.sin_port);
        HELD.lock().unwrap_or_else(|e| e.into_inner()).push(fd);
        SocketAddr::from(([127, 0, 0, 1], port))
    }
}

/// `courier serve` with `config_path`, `data_dir`, ingress on `listen` (`ip:port` or
/// `unix:/path`) and admin on an ephemeral port, logging at `info` (the lines tests wait on).
pub fn serve_command(config_path: &Path, data_dir: &Path, listen: &str) -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg("serve")
        .arg("--config")
        .arg(config_path)
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--listen")
        .arg(listen)
        .arg("--admin-listen")
        .arg("127.0.0.1:0")
        .env("COURIER_LOG", "info");
    cmd
}

/// Runs `courier <args>` to the end off the async runtime (receivers keep answering
/// meanwhile), with no inherited `COURIER_*` setting but `env`, and `stdin` on its input.
pub async fn courier_cli(args: &[&str], env: &[(&str, &str)], stdin: &str) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let stdin = stdin.to_string();
    tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(bin());
        cmd.args(&args);
        for (k, _) in std::env::vars() {
            if k.starts_with("COURIER_") {
                cmd.env_remove(k);
            }
        }
        for (k, v) in &env {
            cmd.env(k, v);
        }
        run_with_stdin(cmd, &stdin)
    })
    .await
    .unwrap()
}

/// Runs `cmd` to the end with `stdin` on its input; stdout and stderr captured.
pub fn run_with_stdin(mut cmd: Command, stdin: &str) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// Appends `[egress] allow_private_targets = true` unless the config has an egress section.
fn with_loopback_allowed(cfg: &str) -> String {
    if cfg.contains("[egress]") || cfg.contains("allow_private_targets") || cfg.contains("egress_allow") {
        cfg.to_string()
    } else {
        format!("allow_private_targets = true\n{cfg}")
    }
}

impl Courier {
    /// Starts courier with `config` (TOML) in a fresh data dir under `dir`.
    pub fn start(dir: &Path, config: &str) -> Courier {
        Self::start_with(dir, config, &[], &[])
    }

    /// Starts courier with extra args and environment.
    pub fn start_with(dir: &Path, config: &str, args: &[&str], env: &[(&str, &str)]) -> Courier {
        let config_path = dir.join("courier.toml");
        std::fs::write(&config_path, with_loopback_allowed(config)).unwrap();
        let data_dir = dir.join("data");
        Self::spawn(config_path, data_dir, args, env)
    }

    /// Starts courier with `config` (TOML) written under `dir` and its data in `data_dir`
    /// (e.g. on a small filesystem); [`Courier::restart`] keeps both.
    pub fn start_with_data_dir(dir: &Path, data_dir: &Path, config: &str, env: &[(&str, &str)]) -> Courier {
        let config_path = dir.join("courier.toml");
        std::fs::write(&config_path, with_loopback_allowed(config)).unwrap();
        Self::spawn(config_path, data_dir.to_path_buf(), &[], env)
    }

    fn spawn(config_path: PathBuf, data_dir: PathBuf, args: &[&str], env: &[(&str, &str)]) -> Courier {
        let mut cmd = serve_command(&config_path, &data_dir, "127.0.0.1:0");
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self::launch(cmd, config_path, data_dir)
    }

    /// Starts `cmd` (a courier command line built by the test, e.g. with no arguments),
    /// captures its stderr and waits for its `listening` line. `config_path` and `data_dir`
    /// are what [`Courier::restart`] reuses.
    pub fn launch(mut cmd: Command, config_path: PathBuf, data_dir: PathBuf) -> Courier {
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start courier");
        let log = Lines::default();
        let stderr = child.stderr.take().unwrap();
        let l = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                match line {
                    Ok(line) => l.push(line),
                    Err(_) => break,
                }
            }
        });
        // Waits for the line, failing at once if the process exits first.
        let deadline = Instant::now() + WAIT;
        let line = loop {
            if let Some(line) = log.wait_for("listening", Duration::from_millis(50)) {
                break line;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("courier exited ({status}) instead of starting; its log:\n{}", log.all());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("courier did not start; its log:\n{}", log.all());
            }
        };
        // `log.format = "json"` writes the addresses as fields of a JSON object.
        let json: Option<serde_json::Value> = serde_json::from_str(&line).ok();
        let value = |key: &str| -> String {
            if let Some(json) = &json {
                let text = json[key].as_str().unwrap_or_else(|| panic!("no {key} in {line}"));
                return text.to_string();
            }
            let start = line
                .find(&format!("{key}="))
                .unwrap_or_else(|| panic!("no {key} in {line}"))
                + key.len()
                + 1;
            let rest = &line[start..];
            let end = rest.find(' ').unwrap_or(rest.len());
            rest[..end].to_string()
        };
        let addr = |key: &str| -> SocketAddr { value(key).parse().unwrap() };
        let ingress_socket = value("ingress").strip_prefix("unix:").map(PathBuf::from);
        let ingress = match ingress_socket {
            Some(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
            None => addr("ingress"),
        };
        let admin = addr("admin");
        let ops = match &json {
            Some(json) => json.get("ops").is_some().then(|| addr("ops")),
            None => line.contains(" ops=").then(|| addr("ops")),
        };
        Courier {
            child: Some(child),
            ingress,
            ingress_socket,
            admin,
            ops,
            data_dir,
            config_path,
            log,
        }
    }

    /// Starts a new process on the same config and data dir (after a stop or kill).
    pub fn restart(&mut self) {
        self.kill();
        let next = Self::spawn(self.config_path.clone(), self.data_dir.clone(), &[], &[]);
        *self = next;
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends a signal (e.g. "TERM") and returns the exit status once the process ends.
    pub fn signal_and_wait(&mut self, sig: &str) -> std::process::ExitStatus {
        self.signal(sig);
        self.wait_exit()
    }

    /// Sends a signal (e.g. "TERM").
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id();
        Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .unwrap();
    }

    /// Waits (up to a minute) for the process to exit; returns its status.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("courier did not exit; log:\n{}", self.log.all());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// `http://<ingress>/<target>` (the path form).
    pub fn prefixed(&self, target: &str) -> String {
        format!("http://{}/{}", self.ingress, target)
    }

    /// An admin URL.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }
}

impl Drop for Courier {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// Status.
    pub status: u16,
    /// Headers.
    pub headers: HashMap<String, String>,
    /// Body.
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends a request with the given headers and body.
pub async fn request(method: &str, url: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Answer {
    try_request(method, url, headers, body)
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

/// Like [`request`], but a connection that fails (e.g. to a listener that has closed) is an
/// `Err` instead of a panic.
pub async fn try_request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Result<Answer, String> {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut req = hyper::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = tokio::time::timeout(WAIT, client.request(req.body(Full::new(body.into())).unwrap()))
        .await
        .map_err(|_| format!("no answer within {WAIT:?}"))?
        .map_err(|e| format!("request not sent: {e:?}"))?;
    let status = resp.status().as_u16();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("answer cut short: {e}"))?
        .to_bytes()
        .to_vec();
    Ok(Answer { status, headers, body })
}

/// POSTs a body.
pub async fn post(url: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Answer {
    request("POST", url, headers, body).await
}

/// GETs a URL.
pub async fn get(url: &str) -> Answer {
    request("GET", url, &[], Bytes::new()).await
}

/// Writes raw bytes to `addr` and reads the answer until the server closes or `WAIT`.
pub fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                // One answer is enough: stop once headers and a declared body are in.
                let text = String::from_utf8_lossy(&out);
                if let Some(head_end) = text.find("\r\n\r\n") {
                    let len = text[..head_end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if out.len() >= head_end + 4 + len {
                        break;
                    }
                }
            }
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `GET /deliveries/<id>` from courier's admin API (which must answer 200).
pub async fn delivery(c: &Courier, id: &str) -> serde_json::Value {
    let a = get(&c.admin_url(&format!("/deliveries/{id}"))).await;
    assert_eq!(a.status, 200, "{}", a.text());
    a.json()
}

/// Waits until a delivery reaches `state`; returns its JSON.
pub async fn wait_state(c: &Courier, id: &str, state: &str) -> serde_json::Value {
    eventually(&format!("{id} to be {state}"), || async {
        let d = delivery(c, id).await;
        (d["state"] == state).then_some(d)
    })
    .await
}

/// Polls `f` until it returns `Some`, up to [`WAIT`] (for state that has no event to wait
/// on, like an admin API field; each check is a real request, not a sleep-and-hope).
pub async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A process whose stdout and stderr lines are collected as they come.
pub struct Spawned {
    child: Child,
    lines: Collected,
}

impl Spawned {
    /// Starts `cmd` with its stdin closed, collecting its stdout and stderr lines.
    pub fn start(mut cmd: Command) -> Spawned {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
        let lines = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let stdout: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let stderr: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        for stream in [stdout, stderr] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    lines.0.lock().unwrap().push(line);
                    lines.1.notify_all();
                }
            });
        }
        Spawned { child, lines }
    }

    /// Waits (on the blocking pool) for a line containing `needle`, up to [`WAIT`].
    pub async fn wait_for(&self, needle: &str) -> String {
        let lines = self.lines.clone();
        let needle = needle.to_string();
        tokio::task::spawn_blocking(move || wait_line(&lines, &needle, WAIT))
            .await
            .unwrap()
    }

    /// Waits on this thread for a line containing `needle`, up to `wait`.
    pub fn wait_line(&self, needle: &str, wait: Duration) -> String {
        wait_line(&self.lines, needle, wait)
    }

    /// The lines so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.0.lock().unwrap().clone()
    }
}

type Collected = Arc<(Mutex<Vec<String>>, Condvar)>;

fn wait_line(lines: &Collected, needle: &str, wait: Duration) -> String {
    let deadline = Instant::now() + wait;
    let mut all = lines.0.lock().unwrap();
    loop {
        if let Some(l) = all.iter().find(|l| l.contains(needle)) {
            return l.clone();
        }
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            panic!("no line with {needle:?}; output so far:\n{}", all.join("\n"));
        };
        all = lines.1.wait_timeout(all, left).unwrap().0;
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every file of `dir` with its bytes, by name.
pub fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let bytes = std::fs::read(&path).unwrap_or_default();
            (path, bytes)
        })
        .collect();
    files.sort();
    files
}

/// `courier serve` on `config`, expected to refuse to start: its stderr.
pub async fn refused_start(config: &Path, data_dir: &Path) -> String {
    let (config, data) = (config.display().to_string(), data_dir.display().to_string());
    let out = courier_cli(&["serve", "--config", &config, "--data-dir", &data], &[], "").await;
    assert!(!out.status.success(), "courier started");
    String::from_utf8_lossy(&out.stderr).trim().to_string()
}

/// Panics with the tool's output unless it exited 0; returns its stdout.
pub fn success(what: &str, output: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}
