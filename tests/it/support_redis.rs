//! A real `redis-server` on loopback for the fleet tests: started on a free port in a temp
//! dir (`--save '' --appendonly no`: nothing on disk), killed and started again on the same
//! port, and asked for its `INFO commandstats`. The binary is `COURIER_TEST_REDIS_SERVER`
//! (scripts/verifiers.sh installs Debian's and exports it), else `redis-server` on PATH.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{skip, WAIT};

/// A running `redis-server`.
pub struct RedisServer {
    bin: PathBuf,
    dir: tempfile::TempDir,
    /// Where it listens.
    pub addr: SocketAddr,
    child: Option<Child>,
}

/// The redis-server binary, or `None` (after [`skip`], which fails the test under
/// `COURIER_TEST_REQUIRE_VERIFIERS=1`) when there is none.
pub fn redis_server_bin() -> Option<PathBuf> {
    let from_env = std::env::var_os("COURIER_TEST_REDIS_SERVER").map(PathBuf::from);
    let found = from_env.or_else(|| {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("redis-server"))
                .find(|p| p.is_file())
        })
    });
    match found {
        Some(bin) if bin.is_file() => Some(bin),
        _ => {
            skip("no redis-server (set COURIER_TEST_REDIS_SERVER, or run scripts/test.sh)");
            None
        }
    }
}

impl RedisServer {
    /// Starts a server on a free loopback port; `None` when there is no redis-server.
    pub fn start() -> Option<RedisServer> {
        let bin = redis_server_bin()?;
        let addr = crate::support::dead_addr();
        let mut server = RedisServer {
            bin,
            dir: tempfile::tempdir().unwrap(),
            addr,
            child: None,
        };
        server.launch();
        Some(server)
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    fn launch(&mut self) {
        let child = Command::new(&self.bin)
            .args(["--port", &self.addr.port().to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + WAIT;
        while self.ping().is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer on {}",
                self.addr
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn connection(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(2))
    }

    fn ping(&self) -> redis::RedisResult<String> {
        redis::cmd("PING").query(&mut self.connection()?)
    }

    /// SIGKILL: gone at once, with everything it held.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (empty).
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// Runs one command and returns its reply.
    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.connection().unwrap()).unwrap()
    }

    /// Runs one command as the default user with `password` (a server with `requirepass`).
    pub fn query_as<T: redis::FromRedisValue>(&self, password: &str, args: &[&str]) -> T {
        let url = format!("redis://:{password}@{}", self.addr);
        let mut conn = redis::Client::open(url)
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap();
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut conn).unwrap()
    }

    /// `INFO commandstats` as (command, calls, usec_per_call).
    pub fn command_stats(&self) -> Vec<(String, u64, f64)> {
        let info: String = self.query(&["INFO", "commandstats"]);
        info.lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                let field = |key: &str| {
                    rest.split(',')
                        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
                        .and_then(|v| v.parse::<f64>().ok())
                };
                Some((name.to_string(), field("calls")? as u64, field("usec_per_call")?))
            })
            .collect()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
