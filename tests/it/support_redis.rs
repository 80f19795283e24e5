//! A real `redis-server` on loopback for the fleet tests: started on a port reserved for the
//! whole run (see [`crate::support::reserve_port`]: no other listener or connection of a
//! parallel test can take it, before the start or between a kill and the restart) in a temp
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
    /// `--tls-*` arguments: the server speaks only TLS on `addr`.
    tls: Vec<String>,
}

/// The redis-server binary, or `None` (after [`skip`], which fails the test unless
/// `COURIER_TEST_ALLOW_SKIP=1`) when there is none.
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
    /// Starts a server on a reserved loopback port; `None` when there is no redis-server.
    pub fn start() -> Option<RedisServer> {
        let bin = redis_server_bin()?;
        let addr = crate::support::reserve_port();
        let mut server = RedisServer {
            bin,
            dir: tempfile::tempdir().unwrap(),
            addr,
            child: None,
            tls: Vec::new(),
        };
        server.launch();
        Some(server)
    }

    /// Starts a server that speaks only TLS on a free loopback port, presenting a
    /// certificate for 127.0.0.1 from `pki` (no client certificate asked); `None` when there
    /// is no redis-server.
    pub fn start_tls(pki: &crate::support_tls::Pki) -> Option<RedisServer> {
        let bin = redis_server_bin()?;
        let leaf = pki.leaf("redis", &["127.0.0.1"]);
        let addr = crate::support::reserve_port();
        let path = |p: &std::path::Path| p.display().to_string();
        let tls = vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            addr.port().to_string(),
            "--tls-cert-file".into(),
            path(&leaf.cert_file),
            "--tls-key-file".into(),
            path(&leaf.key_file),
            "--tls-ca-cert-file".into(),
            path(&pki.ca_file),
            "--tls-auth-clients".into(),
            "no".into(),
        ];
        let mut server = RedisServer {
            bin,
            dir: tempfile::tempdir().unwrap(),
            addr,
            child: None,
            tls,
        };
        server.launch();
        Some(server)
    }

    /// `rediss://127.0.0.1:<port>`, for a server from [`RedisServer::start_tls`].
    pub fn tls_url(&self) -> String {
        format!("rediss://{}", self.addr)
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    fn launch(&mut self) {
        let port = self.addr.port().to_string();
        let plain = ["--port", port.as_str()];
        let listen: Vec<&str> = if self.tls.is_empty() {
            plain.to_vec()
        } else {
            self.tls.iter().map(String::as_str).collect()
        };
        let child = Command::new(&self.bin)
            .args(listen)
            .args(["--bind", "127.0.0.1"])
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
        // Up once the server started here answers on the port: a plain one says so by its
        // pid (nothing else can be on a reserved port, and this checks it); a TLS one once
        // its port takes connections (the test client has no TLS).
        let pid = self.child.as_ref().unwrap().id();
        let up = |s: &Self| match s.tls.is_empty() {
            true => s.server_pid().is_ok_and(|p| p == pid),
            false => std::net::TcpStream::connect(s.addr).is_ok(),
        };
        while !up(self) {
            if let Ok(Some(status)) = self.child.as_mut().unwrap().try_wait() {
                panic!("redis-server on {} exited ({status}) instead of starting", self.addr);
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer on {}",
                self.addr
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The `process_id` of the server answering on the port.
    fn server_pid(&self) -> redis::RedisResult<u32> {
        let info: String = redis::cmd("INFO").arg("server").query(&mut self.connection()?)?;
        Ok(info
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(0))
    }

    fn connection(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(2))
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
