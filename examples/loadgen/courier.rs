//! The courier process (started from the release binary with a generated config), the
//! admin API, and readings of a process's memory and CPU from `/proc`.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::HOST;
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use tokio::net::TcpListener;
use tokio::time::Instant;

use crate::args::Args;
use crate::load::Conn;
use crate::{err, Res};

/// A one-shot request to an admin API.
pub async fn admin(addr: SocketAddr, method: Method, path: &str) -> Res<(StatusCode, String)> {
    let mut c = Conn::open(addr).await?;
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(HOST, addr.to_string())
        .body(Full::new(Bytes::new()))?;
    let (s, b) = c.send(req).await?;
    Ok((s, String::from_utf8_lossy(&b).into_owned()))
}

/// Reads one un-labelled value from courier's Prometheus text.
pub async fn metric(addr: SocketAddr, name: &str) -> Res<f64> {
    let (_, text) = admin(addr, Method::GET, "/metrics").await?;
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| err(format!("metric {name} not found")))
}

/// Resident memory of a process in bytes.
pub fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// utime + stime of a process, in seconds.
pub fn cpu_secs(pid: u32) -> f64 {
    static TICK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let tick = *TICK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    });
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at `state`, field 3.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / tick // utime is field 14, stime 15
}

/// Bytes under a directory.
pub fn dir_size(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else { return 0 };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Samples a process's RSS every 100 ms until `end`; returns the peak.
pub fn rss_sampler(pid: u32, end: Instant) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut peak = rss(pid);
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(100)).await;
            peak = peak.max(rss(pid));
        }
        peak
    })
}

/// A running courier.
pub struct Courier {
    child: Child,
    pub ingress: SocketAddr,
    pub admin: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Courier {
    /// Starts the binary and waits for its `listening` line; returns it and the time it took.
    pub fn start(bin: &Path, config: &Path, data: &Path) -> Res<(Courier, Duration)> {
        let t0 = std::time::Instant::now();
        let mut child = Command::new(bin)
            .arg("serve")
            .arg("--config")
            .arg(config)
            .arg("--data-dir")
            .arg(data)
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .env("COURIER_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| err(format!("starting {}: {e}", bin.display())))?;
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let l = log.clone();
        std::thread::spawn(move || {
            // Keep reading to the end so courier never blocks on a full pipe.
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening") {
                    let _ = tx.send(line.clone());
                }
                let mut l = l.lock().unwrap();
                if l.len() < 200 {
                    l.push(line);
                }
            }
        });
        let line = rx.recv_timeout(Duration::from_secs(60)).map_err(|_| {
            let _ = child.kill();
            err(format!("courier did not start: {}", log.lock().unwrap().join("\n")))
        })?;
        let took = t0.elapsed();
        let addr = |key: &str| -> Res<SocketAddr> {
            let at = line
                .find(&format!("{key}="))
                .ok_or_else(|| err(format!("no {key}= in {line}")))?;
            let rest = &line[at + key.len() + 1..];
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '\x1b')
                .unwrap_or(rest.len());
            rest[..end].parse().map_err(|_| err(format!("bad {key} in {line}")))
        };
        let c = Courier {
            ingress: addr("ingress")?,
            admin: addr("admin")?,
            child,
            log,
        };
        Ok((c, took))
    }

    /// The process id (for `/proc` readings).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Polls `/readyz` until 200.
    pub async fn wait_ready(&self) -> Res<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok((s, _)) = admin(self.admin, Method::GET, "/readyz").await {
                if s == StatusCode::OK {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(err("courier never became ready"));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Kills it with SIGKILL (as `kill -9`) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The first few WARN or ERROR lines of its log.
    pub fn warnings(&self) -> Vec<String> {
        let l = self.log.lock().unwrap();
        l.iter()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .take(5)
            .cloned()
            .collect()
    }
}

impl Drop for Courier {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A child process killed when this goes out of scope (also on an early error return).
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// CPU seconds a process uses between `start` and `end`, read at those two instants.
pub fn cpu_in_window(pid: u32, start: Instant, end: Instant) -> tokio::task::JoinHandle<f64> {
    tokio::spawn(async move {
        tokio::time::sleep_until(start).await;
        let c0 = cpu_secs(pid);
        tokio::time::sleep_until(end).await;
        cpu_secs(pid) - c0
    })
}

/// CPU time per request in microseconds.
pub fn us_per(cpu_s: f64, requests: u64) -> f64 {
    cpu_s * 1e6 / requests.max(1) as f64
}

/// CPU used by a process over `window`, as a fraction of one core.
pub async fn cpu_over(pid: u32, window: Duration) -> f64 {
    let c0 = cpu_secs(pid);
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    (cpu_secs(pid) - c0) / (Instant::now() - t0).as_secs_f64()
}

/// The courier binary: `--courier`, or `courier` next to this executable (or above it).
pub fn courier_bin(args: &Args) -> Res<PathBuf> {
    if let Some(p) = &args.courier {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe()?;
    exe.ancestors()
        .skip(1)
        .map(|d| d.join("courier"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            err("no courier binary next to this one: run `cargo build --release --bin courier` or pass --courier")
        })
}

/// Writes courier's benchmark config as `<dir>/<name>.toml`.
pub fn write_config(dir: &Path, name: &str, max_in_flight: u32) -> Res<PathBuf> {
    // Loopback allowed; a failed first attempt waits an hour (so a dead receiver is tried
    // once per message, not in a loop); the per-endpoint rate limit is lifted so the
    // in-flight cap per host is the only delivery limit.
    let text = format!(
        "[egress]\nallow_private_targets = true\n\n[retry]\nbase_delay = \"1h\"\njitter = \"none\"\n\n\
         [delivery]\nmax_in_flight_per_host = {max_in_flight}\nrate_per_second = 1000000\n"
    );
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text)?;
    Ok(p)
}

/// A port with nothing listening on it (bound, then released).
pub async fn dead_port() -> Res<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    Ok(l.local_addr()?)
}
