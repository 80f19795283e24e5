//! Ingress on a Unix domain socket (`listen = "unix:/path"`): delivery through the socket,
//! the file's mode, a stale socket replaced, anything else at the path refused, the file
//! removed at shutdown.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use crate::support::*;

/// The `courier serve` command line with ingress on `socket` (config in `dir`).
fn command(dir: &Path, socket: &Path, config: &str) -> (Command, PathBuf, PathBuf) {
    let config_path = dir.join("courier.toml");
    std::fs::write(&config_path, format!("allow_private_targets = true\n{config}")).unwrap();
    let data_dir = dir.join("data");
    let cmd = serve_command(&config_path, &data_dir, &format!("unix:{}", socket.display()));
    (cmd, config_path, data_dir)
}

/// One HTTP/1.1 POST over the socket with `Host: localhost`; `(status, body)`.
async fn post_unix(socket: &Path, uri: &str, body: &'static str) -> (u16, String) {
    post_unix_as(socket, "localhost", uri, body).await
}

/// One HTTP/1.1 POST over the socket naming `host`; `(status, body)`.
async fn post_unix_as(socket: &Path, host: &str, uri: &str, body: &'static str) -> (u16, String) {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .expect("connect to the socket");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    // What `curl --unix-socket … http://<host>/…` sends.
    let req = hyper::Request::post(uri)
        .header("host", host)
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let resp = tokio::time::timeout(WAIT, send.send_request(req))
        .await
        .unwrap()
        .unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn unix_socket_ingress_delivers_with_the_configured_mode_and_is_removed_at_stop() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let socket = d.path().join("ingress.sock");
    let (cmd, config_path, data_dir) = command(d.path(), &socket, "listen_mode = \"0640\"\n");
    let mut c = Courier::launch(cmd, config_path, data_dir);
    assert_eq!(c.ingress_socket.as_deref(), Some(socket.as_path()), "{}", c.log.all());

    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o640);

    let (status, body) = post_unix(&socket, &format!("/{}", rx.url("/uds?x=1")), "{\"via\":\"uds\"}").await;
    assert_eq!(status, 202, "{body}");
    let seen = rx.wait_for(1).await;
    assert_eq!(
        (seen[0].path.as_str(), seen[0].body.as_slice()),
        ("/uds?x=1", &b"{\"via\":\"uds\"}"[..])
    );

    assert!(c.signal_and_wait("TERM").success(), "{}", c.log.all());
    assert!(!socket.exists(), "the socket file is removed at shutdown");
}

#[tokio::test]
async fn a_unix_socket_serves_any_host_name_clients_give_it() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let socket = d.path().join("ingress.sock");
    let (cmd, config_path, data_dir) = command(d.path(), &socket, "");
    let _c = Courier::launch(cmd, config_path, data_dir);
    // `curl --unix-socket ingress.sock http://courier/…`, Docker's and requests-unixsocket's
    // habits: no browser reaches a socket file, so no name is a rebinding.
    for host in ["courier", "docker", "unix", "evil.example:80"] {
        let (status, body) = post_unix_as(&socket, host, &format!("/{}", rx.url("/any-host")), "{}").await;
        assert_eq!(status, 202, "Host {host}: {body}");
    }
    assert_eq!(rx.wait_for(4).await.len(), 4);
}

#[tokio::test]
async fn a_stale_socket_file_is_replaced_but_a_regular_file_is_not() {
    let d = tempfile::tempdir().unwrap();
    let socket = d.path().join("ingress.sock");
    // What a process killed with SIGKILL leaves behind: the file, nobody listening.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let (cmd, config_path, data_dir) = command(d.path(), &socket, "");
    let mut c = Courier::launch(cmd, config_path, data_dir);
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "the default listen_mode");
    c.kill();

    let other = tempfile::tempdir().unwrap();
    let path = other.path().join("ingress.sock");
    std::fs::write(&path, "not a socket").unwrap();
    let (mut cmd, _, _) = command(other.path(), &path, "");
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("cannot listen on unix:"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
}
