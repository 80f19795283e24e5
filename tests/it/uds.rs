//! Ingress on a Unix domain socket (`listen = "unix:/path"`): delivery through the socket,
//! the file's mode, a stale socket replaced, anything else at the path refused, the file
//! removed at shutdown, and a directory others could replace the socket in refused.

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

#[tokio::test]
async fn a_socket_directory_others_may_write_without_the_sticky_bit_is_refused() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    // What an emptyDir on disk is: 0777, no sticky bit. Anyone could unlink the socket and
    // listen in its place.
    let shared = d.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    let mode = |m: u32| std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(m)).unwrap();
    mode(0o777);
    let socket = shared.join("ingress.sock");
    let (cmd, config_path, data_dir) = command(d.path(), &socket, "");
    let out = exits(cmd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "as other config errors: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    let why = format!(
        "{} is in {}, which is writable by every user without the sticky bit (mode 0777)",
        socket.display(),
        shared.display()
    );
    assert!(stderr.contains(&why), "{stderr}");
    assert!(!socket.exists(), "nothing bound");
    let mut check = Command::new(bin());
    check
        .args(["check-config", "--config"])
        .arg(&config_path)
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()));
    let check = exits(check);
    assert_eq!(check.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&check.stderr).contains(&why));

    // With the sticky bit (a tmpfs, /tmp), or not shared at all: served.
    for m in [0o1777, 0o755] {
        mode(m);
        let (cmd, _, _) = command(d.path(), &socket, "");
        let mut c = Courier::launch(cmd, config_path.clone(), data_dir.clone());
        let (status, body) = post_unix(&socket, &format!("/{}", rx.url("/ok")), "{}").await;
        assert_eq!(status, 202, "{m:o}: {body}");
        assert!(c.signal_and_wait("TERM").success(), "{}", c.log.all());
    }
}

/// Runs `cmd`, which must end by itself (a refused start) within [`WAIT`]: one that serves
/// instead is killed, and the test fails.
fn exits(mut cmd: Command) -> std::process::Output {
    use std::process::Stdio;
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{cmd:?} ran on instead of refusing: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}
