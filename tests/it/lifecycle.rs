//! Lifecycle: start-up errors, check-config, health, SIGKILL with a backlog, SIGTERM drain.

use std::process::Command;
use std::time::Duration;

use crate::support::*;

#[tokio::test]
async fn health_and_readiness_answer_once_listening() {
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), "");
    assert_eq!(get(&c.admin_url("/healthz")).await.status, 200);
    assert_eq!(get(&c.admin_url("/readyz")).await.status, 200);
    let line = c.log.wait_for("listening", WAIT).unwrap();
    assert!(
        line.contains(&c.ingress.to_string()) && line.contains(&c.admin.to_string()),
        "{line}"
    );
}

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(bin());
    cmd.args(args).env_remove("COURIER_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn invalid_config_exits_at_once_with_one_clear_line() {
    let d = tempfile::tempdir().unwrap();
    let bad = d.path().join("bad.toml");
    std::fs::write(&bad, "[retry]\nmax_atempts = 3\n").unwrap();
    let (code, _, err) = run(&["serve", "--config", bad.to_str().unwrap()], &[]);
    assert_ne!(code, 0);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("max_atempts"), "{err}");

    let (code, _, err) = run(
        &[
            "check-config",
            "--config",
            d.path().join("missing.toml").to_str().unwrap(),
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("missing.toml"), "{err}");

    std::fs::write(&bad, "[retry]\nbase_delay = \"soon\"\n").unwrap();
    let (code, _, err) = run(&["check-config"], &[("COURIER_CONFIG", bad.to_str().unwrap())]);
    assert_ne!(code, 0);
    assert!(err.contains("base_delay"), "{err}");

    let good = d.path().join("good.toml");
    std::fs::write(&good, "[retry]\nmax_attempts = 3\n").unwrap();
    let (code, out, _) = run(&["check-config", "--config", good.to_str().unwrap()], &[]);
    assert_eq!(code, 0);
    assert!(out.contains("ok"), "{out}");
}

#[tokio::test]
async fn a_port_in_use_or_a_locked_data_dir_is_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), "");
    let data = c.data_dir.to_str().unwrap().to_string();
    let port_taken = c.ingress.to_string();
    let other = tempfile::tempdir().unwrap();
    let (code, _, err) = run(
        &[
            "serve",
            "--data-dir",
            other.path().join("x").to_str().unwrap(),
            "--listen",
            &port_taken,
            "--admin-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains(&port_taken), "{err}");
    let (code, _, err) = run(
        &[
            "serve",
            "--data-dir",
            &data,
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("locked"), "{err}");
}

#[tokio::test]
async fn sigkill_with_300_acked_messages_loses_none() {
    let down = dead_addr();
    let d = tempfile::tempdir().unwrap();
    let mut c = Courier::start(
        d.path(),
        "[retry]\nbase_delay = \"200ms\"\nmax_delay = \"500ms\"\njitter = \"none\"\n",
    );
    let mut acked = Vec::new();
    let mut sends = Vec::new();
    for i in 0..300 {
        let url = c.prefixed(&format!("http://{down}/k"));
        sends.push(tokio::spawn(async move {
            let id = format!("evt_{i}");
            let a = post(&url, &[("webhook-id", &id)], format!("body-{i}")).await;
            (a.status, id)
        }));
    }
    for s in sends {
        let (status, id) = s.await.unwrap();
        assert_eq!(status, 202);
        acked.push(id);
    }
    c.kill();
    let rx = Receiver::start_on(down).await;
    c.restart();
    rx.wait_for(300).await;
    let mut got: Vec<String> = rx.seen().iter().map(|s| s.header("webhook-id").unwrap()).collect();
    got.sort();
    got.dedup();
    acked.sort();
    assert_eq!(got, acked, "every acknowledged message arrives after the crash");
}

#[tokio::test]
async fn sigterm_drains_in_flight_attempts_and_refuses_new_ones() {
    let rx = Receiver::scripted(|_, _| Reply::status(200).after(Duration::from_millis(1500))).await;
    let d = tempfile::tempdir().unwrap();
    let mut c = Courier::start(d.path(), "shutdown_grace = \"10s\"\n");
    let id = post(&c.prefixed(&rx.url("/slow")), &[], "x").await.json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    rx.wait_for(1).await;
    let ingress = c.ingress;
    c.signal("TERM");
    // While draining, new messages are refused with 503 and Retry-After.
    let refused = eventually("ingress to refuse while draining", || async {
        let a = post(&format!("http://{ingress}/{}", rx.url("/late")), &[], "late").await;
        (a.status == 503).then_some(a)
    })
    .await;
    assert_eq!(refused.json()["error"], "shutting_down");
    assert!(refused.headers.contains_key("retry-after"));
    let (status, mut c) = tokio::task::spawn_blocking(move || (c.wait_exit(), c)).await.unwrap();
    assert!(status.success(), "exit status after SIGTERM: {status}");
    c.log.wait_for("stopped", WAIT).expect("clean stop logged");
    // The in-flight attempt finished during the grace period: delivered, not redelivered.
    c.restart();
    let rec = get(&c.admin_url(&format!("/deliveries/{id}"))).await.json();
    assert_eq!(rec["state"], "delivered");
    assert_eq!(rx.seen().iter().filter(|s| s.path == "/slow").count(), 1);
}

/// Finding: the ingress body read had no timeout and the listeners' drain no bound, so one
/// client that stopped mid-body kept courier from exiting on SIGTERM, forever.
#[tokio::test]
async fn a_stalled_upload_does_not_hold_up_shutdown() {
    use std::io::Write;
    let d = tempfile::tempdir().unwrap();
    let mut c = Courier::start(d.path(), "shutdown_grace = \"1s\"\n");
    let mut stalled = std::net::TcpStream::connect(c.ingress).unwrap();
    stalled
        .write_all(b"POST /http://127.0.0.1:9/x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\nhalf")
        .unwrap();
    // Let courier read the head and start waiting for the rest of the body.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    let status = tokio::task::spawn_blocking(move || c.signal_and_wait("TERM"))
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    // Bounded by shutdown_grace (1 s) plus the listeners' last second and the store's
    // close; without the bound this never returns.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    drop(stalled);
}

/// SIGINT drains like SIGTERM; `/readyz` says 503 while draining; an attempt still running
/// at the end of `shutdown_grace` is cut off and put back without counting an attempt, and
/// delivered after the restart.
#[tokio::test]
async fn sigint_drains_and_an_attempt_cut_off_at_the_grace_is_delivered_after_restart_uncounted() {
    let gate = Gate::new();
    let g = gate.clone();
    // The first request is held until the test opens the gate (after the shutdown): the
    // attempt is still running when the grace ends.
    let rx = Receiver::scripted(move |n, _| {
        let reply = Reply::status(200);
        if n == 0 {
            reply.until(&g)
        } else {
            reply
        }
    })
    .await;
    let d = tempfile::tempdir().unwrap();
    let mut c = Courier::start(
        d.path(),
        "shutdown_grace = \"1500ms\"\n[delivery]\nrequest_timeout = \"30s\"\n",
    );
    let id = post(&c.prefixed(&rx.url("/held")), &[("webhook-id", "evt_cut")], "x")
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    rx.wait_for(1).await;
    assert_eq!(delivery(&c, &id).await["state"], "in_flight");
    let signalled = std::time::Instant::now();
    c.signal("INT");

    // Draining: readiness says so (so a load balancer stops sending), ingress refuses.
    let ready = eventually("/readyz to answer 503 while draining", || async {
        match try_request("GET", &c.admin_url("/readyz"), &[], "").await {
            Ok(a) => (a.status != 200).then_some(a),
            Err(e) => panic!("/readyz answered 200 until the admin listener closed ({e})"),
        }
    })
    .await;
    assert_eq!(ready.status, 503, "{}", ready.text());
    assert_eq!(ready.json()["error"], "shutting_down");
    let refused = post(&c.prefixed(&rx.url("/late")), &[], "late").await;
    assert_eq!(refused.status, 503, "{}", refused.text());

    let (status, mut c) = tokio::task::spawn_blocking(move || (c.wait_exit(), c)).await.unwrap();
    let took = signalled.elapsed();
    assert_eq!(status.code(), Some(0), "exit after SIGINT: {status}");
    // The attempt had its whole grace, and no more (a 30s request_timeout was pending).
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(10),
        "stopped {took:?} after SIGINT with a 1.5s grace"
    );
    c.log.wait_for("cut off", WAIT).expect("the cut-off is logged");
    c.log.wait_for("stopped", WAIT).expect("clean stop logged");
    gate.open();

    c.restart();
    let v = wait_state(&c, &id, "delivered").await;
    assert_eq!(v["attempts"], 1, "the cut-off attempt is not counted: {v}");
    assert_eq!(v["history"].as_array().unwrap().len(), 1, "{v}");
    // It was put back at shutdown, not left in flight for crash recovery to find.
    assert!(
        !c.log.all().contains("requeued messages that were in flight"),
        "{}",
        c.log.all()
    );
    let seen = rx.seen();
    let held: Vec<&Seen> = seen.iter().filter(|s| s.path == "/held").collect();
    assert_eq!(held.len(), 2, "sent again after the restart");
    assert_eq!(held[1].header("webhook-id").as_deref(), Some("evt_cut"));
    assert!(
        seen.iter().all(|s| s.path != "/late"),
        "nothing was accepted while draining"
    );
}

/// `courier` with no arguments is `courier serve` on the embedded defaults (only the
/// addresses are moved to ephemeral ports, through the environment): it serves, delivers,
/// keeps its data in `./courier-data` and stops cleanly on SIGTERM.
#[tokio::test]
async fn courier_with_no_arguments_serves() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("COURIER_") {
            cmd.env_remove(k);
        }
    }
    cmd.current_dir(d.path())
        .env("COURIER_LISTEN", "127.0.0.1:0")
        .env("COURIER_ADMIN_LISTEN", "127.0.0.1:0")
        .env("COURIER_EGRESS_ALLOW_PRIVATE_TARGETS", "true")
        .env("COURIER_LOG", "info");
    let data = d.path().join("courier-data");
    let mut c = Courier::launch(cmd, d.path().join("unused.toml"), data.clone());
    assert_eq!(get(&c.admin_url("/readyz")).await.status, 200);
    let a = post(&c.prefixed(&rx.url("/default")), &[], "x").await;
    assert_eq!(a.status, 202, "{}", a.text());
    wait_state(&c, a.json()["id"].as_str().unwrap(), "delivered").await;
    assert!(data.join("CURRENT").exists(), "the store is in ./courier-data");
    let status = tokio::task::spawn_blocking(move || c.signal_and_wait("TERM"))
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "{status}");
}

/// The container image and Kubernetes volumes hand courier an existing 0755 data dir:
/// it is made private before anything is stored in it (per-message secrets live there).
#[tokio::test]
async fn an_existing_world_readable_data_dir_is_made_private() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("volume");
    for mode in [0o755, 0o770, 0o701] {
        std::fs::create_dir_all(&data).unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(mode)).unwrap();
        let mut c = Courier::start_with_data_dir(d.path(), &data, "", &[]);
        let now = std::fs::metadata(&data).unwrap().permissions().mode() & 0o777;
        assert_eq!(format!("{now:o}"), "700", "a {mode:o} data dir must be made private");
        c.kill();
    }
}
