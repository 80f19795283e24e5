//! The listeners: the ingress address, TCP (`ip:port`) or a Unix domain socket
//! (`unix:/path`), and the socket file's permission bits (`listen_mode`); `[ingress]`
//! ([`IngressConfig`]) and `[admin]` ([`ListenerAccess`]): who may reach a listener besides
//! server-side clients on loopback names, and the limits that keep one caller from holding a
//! listener (idle connections, bodies held by accepts in progress).
//!
//! Only ingress takes `unix:`: pods that share an `emptyDir` reach courier through the
//! socket file and no port is exposed at all. Admin and ops stay TCP (their clients, the
//! CLI and the kubelet's probes, speak TCP).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;

use super::de::{self, text, Dur, HostEntry, Origin, Size};

text!(/// `ip:port` or `localhost:port` (admin and ops listeners).
    Tcp: SocketAddr = parse_listen);
text!(/// What [`Tcp`] takes, or `unix:/path` (ingress).
    Ingress: ListenAddr = parse_ingress_listen);
text!(/// An octal permission string (`0660`).
    Mode: u32 = parse_mode);

/// Where ingress listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// A TCP address.
    Tcp(SocketAddr),
    /// The path of a Unix domain socket.
    Unix(PathBuf),
}

impl ListenAddr {
    /// The TCP address, or `None` for a Unix socket.
    pub fn tcp(&self) -> Option<SocketAddr> {
        match self {
            ListenAddr::Tcp(addr) => Some(*addr),
            ListenAddr::Unix(_) => None,
        }
    }

    /// The TCP port, or `None` for a Unix socket.
    #[cfg(test)]
    pub fn port(&self) -> Option<u16> {
        self.tcp().map(|a| a.port())
    }
}

impl From<SocketAddr> for ListenAddr {
    fn from(addr: SocketAddr) -> Self {
        ListenAddr::Tcp(addr)
    }
}

/// So `config.listen == "127.0.0.1:8787".parse::<SocketAddr>()?` keeps reading naturally.
impl PartialEq<SocketAddr> for ListenAddr {
    fn eq(&self, other: &SocketAddr) -> bool {
        self.tcp() == Some(*other)
    }
}

/// TCP prints as before (`127.0.0.1:8787`: the `listening` log line is parsed by tools);
/// a socket prints as it is written in the config, `unix:/path`.
impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Tcp(addr) => addr.fmt(f),
            ListenAddr::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        parse_ingress_listen(text)
    }
}

/// The default `listen_mode`: owner and group read/write, so a sidecar's peers sharing a
/// group (`fsGroup` in Kubernetes) can connect and nobody else can.
pub const DEFAULT_LISTEN_MODE: u32 = 0o660;

/// An octal permission string like `0660` or `660` (at most `0777`: no setuid/sticky bits).
pub(super) fn parse_mode(text: &str) -> Result<u32, String> {
    let t = text.trim();
    let digits = t.strip_prefix("0o").unwrap_or(t);
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if !digits.is_empty() && mode <= 0o777 => Ok(mode),
        _ => Err("expected an octal mode from 0000 to 0777, like \"0660\"".to_string()),
    }
}

/// `ip:port`, `[v6]:port`, or `localhost:port` (meaning 127.0.0.1).
pub(super) fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    if let Some(port) = text.strip_prefix("localhost:") {
        if let Ok(port) = port.parse::<u16>() {
            return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
        }
    }
    text.parse()
        .map_err(|_| "expected ip:port, like 127.0.0.1:8787".to_string())
}

/// What [`parse_listen`] takes, or `unix:/absolute/path` (ingress only). The path must be
/// absolute: a relative one would depend on the working directory of whoever starts courier.
pub(super) fn parse_ingress_listen(text: &str) -> Result<ListenAddr, String> {
    match text.trim().strip_prefix("unix:") {
        Some(path) if path.starts_with('/') && path.len() > 1 => Ok(ListenAddr::Unix(PathBuf::from(path))),
        Some(_) => Err("expected unix:/absolute/path, like unix:/run/courier/ingress.sock".to_string()),
        None => parse_listen(text)
            .map(ListenAddr::Tcp)
            .map_err(|_| "expected ip:port, like 127.0.0.1:8787, or unix:/path".to_string()),
    }
}

/// Default `idle_timeout`: a connection with no request in progress this long is closed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Default `send_timeout`: an answer the client takes none of this long closes its connection.
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(10);

section! {
    /// Who may reach the admin listener besides server-side clients on loopback names
    /// (`[admin]`), and how long an idle connection is kept.
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct ListenerAccess {
        /// Origins whose web pages may send requests, as ASCII origin serializations
        /// (`https://app.example`, `http://localhost:3000`): lowercase, no path, default port
        /// omitted.
        pub allowed_origins: Vec<String> ["de::list::<Origin, _>"] = Vec::new(),
        /// Extra names the `Host` header may carry (`name` or `name:port`, `[v6]:port`),
        /// lowercase, without a trailing dot.
        pub hosts: Vec<String> ["de::list::<HostEntry, _>"] = Vec::new(),
        /// A connection (HTTP/1.1 or HTTP/2) with no request in progress this long is closed
        /// (HTTP/2: GOAWAY), so idle clients cannot hold every connection slot.
        pub idle_timeout: Duration ["de::one::<Dur, _>"] = DEFAULT_IDLE_TIMEOUT,
        /// A connection whose client takes no byte of an answer this long (a full TCP
        /// window, an HTTP/2 flow-control window left at zero), or that is still open this
        /// long after it was told to close, is closed: a client that never reads must not
        /// hold its connection slot.
        pub send_timeout: Duration ["de::one::<Dur, _>"] = DEFAULT_SEND_TIMEOUT,
    }
}

section! {
    /// `[ingress]`: the keys of [`ListenerAccess`] plus ingress's own.
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct IngressConfig {
        /// As [`ListenerAccess::allowed_origins`].
        pub allowed_origins: Vec<String> ["de::list::<Origin, _>"] = Vec::new(),
        /// As [`ListenerAccess::hosts`] (TCP only: a Unix socket serves any `Host`).
        pub hosts: Vec<String> ["de::list::<HostEntry, _>"] = Vec::new(),
        /// As [`ListenerAccess::idle_timeout`].
        pub idle_timeout: Duration ["de::one::<Dur, _>"] = DEFAULT_IDLE_TIMEOUT,
        /// As [`ListenerAccess::send_timeout`].
        pub send_timeout: Duration ["de::one::<Dur, _>"] = DEFAULT_SEND_TIMEOUT,
        /// Bytes of request bodies that accepts in progress may hold at once, those whose
        /// sender left before the 202 included: taken before a body is read (its
        /// `Content-Length`, else `max_body`) and given back once its commit is settled.
        pub max_pending_bytes: u64 ["de::one::<Size, _>"] = 64 << 20,
        /// Accept origin-form `GET`/`HEAD` requests that carry no `Courier-*` header and no
        /// token: a web page can send those without any browser marking them (an `<img>`).
        pub allow_get: bool = false,
    }
}
