//! nginx as a peer: a well-known non-durable reverse proxy in front of the same receiver,
//! started from the `nginx` binary already installed on the machine (never installed here).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::courier::KillOnDrop;

/// A running nginx (one process: `master_process off`), killed on drop.
pub struct Nginx {
    child: KillOnDrop,
    pub addr: SocketAddr,
    /// `nginx/1.22.1`, from `nginx -V`.
    pub version: String,
}

impl Nginx {
    /// The process id (the only nginx process: no master).
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// Starts nginx with a generated config in `dir`: one worker, listening on a free
    /// loopback port, proxying every request to `receiver` over an upstream pool of up to
    /// 64 idle keep-alive connections. The error is a reason to print in place of the row
    /// (nginx not installed, or it would not start).
    pub async fn start(dir: &Path, receiver: SocketAddr) -> Result<Nginx, String> {
        let bin = find().ok_or("no nginx on PATH or in /usr/sbin")?;
        let v = Command::new(&bin)
            .arg("-V")
            .output()
            .map_err(|e| format!("{} -V: {e}", bin.display()))?;
        // nginx prints its version and build options on stderr.
        let info = String::from_utf8_lossy(&v.stderr).into_owned();
        let version = info
            .lines()
            .find_map(|l| l.strip_prefix("nginx version: "))
            .unwrap_or("nginx")
            .trim()
            .to_string();
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, config(dir, addr, receiver, &info)).map_err(|e| e.to_string())?;
        let log = std::fs::File::create(dir.join("stderr.log")).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&bin);
        cmd.arg("-p").arg(dir).arg("-c").arg(&conf);
        // `-e` (1.19.5+) keeps even the log written before the config is read in `dir`,
        // instead of the system's /var/log/nginx.
        if newer_than(&version, (1, 19, 5)) {
            cmd.arg("-e").arg(dir.join("error.log"));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", bin.display()))?;
        let mut child = KillOnDrop(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if TcpStream::connect(addr).await.is_ok() {
                return Ok(Nginx { child, addr, version });
            }
            let exited = matches!(child.0.try_wait(), Ok(Some(_)));
            if exited || Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default()
                    + &std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
                return Err(format!("nginx did not start: {}", log.trim()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The nginx binary: the first `nginx` on PATH, else the usual system locations.
fn find() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("nginx")).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(
            [
                "/usr/sbin/nginx",
                "/usr/local/sbin/nginx",
                "/usr/local/nginx/sbin/nginx",
            ]
            .map(PathBuf::from),
        )
        .find(|p| p.is_file())
}

/// Whether `nginx/X.Y.Z` is at least `min`.
fn newer_than(version: &str, min: (u32, u32, u32)) -> bool {
    let v: Vec<u32> = version
        .trim_start_matches("nginx/")
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse().ok())
        .collect();
    match v.as_slice() {
        [a, b, c, ..] => (*a, *b, *c) >= min,
        _ => false,
    }
}

/// The config: everything nginx writes goes under `dir`; keep-alive is kept for the whole
/// run on both sides (the default of 1,000 requests per connection would close the load
/// generator's connections mid-run, and a send on a closing connection counts as failed).
/// `build` is `nginx -V`'s output: the temp paths of the FastCGI, uWSGI and SCGI modules
/// are set only when those modules are built in (the directives are unknown otherwise, and
/// nginx creates their default dirs under /var/lib/nginx at start if they are not set).
fn config(dir: &Path, addr: SocketAddr, receiver: SocketAddr, build: &str) -> String {
    let d = dir.display();
    let mut temp = format!("    client_body_temp_path {d}/body;\n    proxy_temp_path {d}/proxy;\n");
    for module in ["fastcgi", "uwsgi", "scgi"] {
        if !build.contains(&format!("--without-http_{module}_module")) {
            temp.push_str(&format!("    {module}_temp_path {d}/{module};\n"));
        }
    }
    format!(
        "daemon off;
master_process off;
worker_processes 1;
error_log {d}/error.log warn;
pid {d}/nginx.pid;

events {{
    worker_connections 4096;
}}

http {{
    access_log off;
{temp}    keepalive_requests 1000000;
    keepalive_timeout 300s;

    upstream receiver_upstream {{
        server {receiver};
        keepalive 64;
        keepalive_requests 1000000;
    }}

    server {{
        listen {addr};
        location / {{
            proxy_pass http://receiver_upstream;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }}
    }}
}}
"
    )
}
