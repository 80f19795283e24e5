//! The operator commands (`courier deliveries …`, `courier endpoints …`) against a running
//! courier: tables with headers and ids, `--json` equal to the admin API's JSON, the admin
//! address from the flag or `COURIER_ADMIN_LISTEN`, the token from the config file, and one
//! clear error line with a non-zero exit when the API is unreachable or answers an error.

use serde_json::Value;

use crate::admin::{enc, send};
use crate::support::*;

const FAST: &str = "[retry]\nbase_delay = \"100ms\"\nmax_delay = \"400ms\"\njitter = \"none\"\n";

/// What one CLI run printed.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "stderr: {}\nstdout: {}", self.stderr, self.stdout);
        &self.stdout
    }

    fn json(&self) -> Value {
        serde_json::from_str(self.ok()).unwrap_or_else(|e| panic!("--json printed no JSON ({e}): {}", self.stdout))
    }

    /// Asserts a failure with exactly one line on stderr containing every `needle`.
    fn failed_with(&self, needles: &[&str]) {
        assert_ne!(self.code, 0, "expected a failure: {self:?}");
        assert_eq!(self.stdout, "", "nothing on stdout: {self:?}");
        assert_eq!(self.stderr.trim_end().lines().count(), 1, "one line: {:?}", self.stderr);
        for n in needles {
            assert!(self.stderr.contains(n), "{n:?} missing from {:?}", self.stderr);
        }
    }
}

/// Runs `courier <args>` off the async runtime (the receiver keeps answering meanwhile),
/// with no inherited `COURIER_*` settings but `env`.
async fn cli(args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = courier_cli(args, env, "").await;
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn header_row(out: &str) -> Vec<&str> {
    out.lines().next().unwrap_or("").split_whitespace().collect()
}

#[tokio::test]
async fn deliveries_commands_print_tables_and_the_apis_json() {
    let rx = Receiver::scripted(|_, s| Reply::status(if s.path == "/gone" { 410 } else { 200 })).await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), FAST);
    let admin = c.admin.to_string();
    let ok1 = send(&c, &rx.url("/ok"), "1").await;
    let ok2 = send(&c, &rx.url("/ok"), "2").await;
    let dead = send(&c, &rx.url("/gone"), "3").await;
    wait_state(&c, &ok1, "delivered").await;
    wait_state(&c, &ok2, "delivered").await;
    wait_state(&c, &dead, "dead").await;

    // list: a table with a header row and every id; --json is the API's page.
    let out = cli(&["deliveries", "list", "--admin-listen", &admin], &[]).await;
    let table = out.ok();
    assert_eq!(
        header_row(table),
        ["ID", "STATE", "ATTEMPTS", "LAST", "NEXT/REASON", "ENDPOINT"],
        "{table}"
    );
    assert_eq!(table.lines().count(), 4, "{table}");
    for id in [&ok1, &ok2, &dead] {
        assert!(table.lines().any(|l| l.starts_with(id.as_str())), "{id} in {table}");
    }
    let dead_row = table.lines().find(|l| l.starts_with(dead.as_str())).unwrap();
    assert!(dead_row.contains("dead") && dead_row.contains("permanent_status") && dead_row.contains("410"));
    let json = cli(&["deliveries", "list", "--json", "--admin-listen", &admin], &[])
        .await
        .json();
    let api = get(&c.admin_url("/deliveries?limit=50")).await.json();
    assert_eq!(json, api);

    // Filters and the address from COURIER_ADMIN_LISTEN.
    let out = cli(
        &["deliveries", "list", "--state", "dead"],
        &[("COURIER_ADMIN_LISTEN", &admin)],
    )
    .await;
    let lines: Vec<&str> = out.ok().lines().collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[1].starts_with(dead.as_str()));
    let json = cli(
        &[
            "deliveries",
            "list",
            "--json",
            "--endpoint",
            &rx.url("/ok"),
            "--limit",
            "1",
        ],
        &[("COURIER_ADMIN_LISTEN", &admin)],
    )
    .await
    .json();
    assert_eq!(
        json,
        get(&c.admin_url(&format!("/deliveries?endpoint={}&limit=1", enc(&rx.url("/ok")))))
            .await
            .json()
    );
    assert_eq!(json["items"].as_array().unwrap().len(), 1);
    // A short page tells how to get the next one.
    let out = cli(&["deliveries", "list", "--limit", "1", "--admin-listen", &admin], &[]).await;
    assert!(out.ok().contains(&format!("--cursor {}", ok1)), "{}", out.stdout);

    // show: every field and the history table; --json is the API's object.
    let out = cli(&["deliveries", "show", &dead, "--admin-listen", &admin], &[]).await;
    let text = out.ok();
    for needle in [
        dead.as_str(),
        "permanent_status",
        "state           dead",
        "#  AT",
        "STATUS",
        "410",
    ] {
        assert!(text.contains(needle), "{needle:?} in {text}");
    }
    let json = cli(&["deliveries", "show", &dead, "--json", "--admin-listen", &admin], &[])
        .await
        .json();
    assert_eq!(json, get(&c.admin_url(&format!("/deliveries/{dead}"))).await.json());

    // retry: the dead one is requeued (and now delivered). What the CLI prints is built
    // from its own argument, so the API is asked what happened.
    rx.set_script(|_, _| Reply::status(200));
    let out = cli(&["deliveries", "retry", &dead, "--admin-listen", &admin], &[]).await;
    assert_eq!(out.ok().trim_end(), format!("{dead} requeued (pending)"));
    let v = wait_state(&c, &dead, "delivered").await;
    assert_eq!(v["attempts"], 1, "replayed with attempts reset: {v}");
    assert_eq!(rx.seen().iter().filter(|s| s.path == "/gone").count(), 2);
    // Not dead any more: the API's 409 becomes one error line.
    cli(&["deliveries", "retry", &dead, "--admin-listen", &admin], &[])
        .await
        .failed_with(&["409", "not_dead"]);
    let json = cli(
        &[
            "deliveries",
            "retry",
            "--all",
            "--endpoint",
            &rx.url("/gone"),
            "--json",
            "--admin-listen",
            &admin,
        ],
        &[],
    )
    .await
    .json();
    assert_eq!(json, serde_json::json!({ "requeued": 0 }));

    // Errors from the API: one line, non-zero exit.
    cli(&["deliveries", "show", "dlv_nope", "--admin-listen", &admin], &[])
        .await
        .failed_with(&["404", "not_found", "dlv_nope"]);
    cli(
        &["deliveries", "list", "--state", "bogus", "--admin-listen", &admin],
        &[],
    )
    .await
    .failed_with(&["400"]);
}

#[tokio::test]
async fn endpoints_commands_list_pause_and_resume() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), FAST);
    let admin = c.admin.to_string();
    let key = rx.url("/e");
    let id = send(&c, &key, "x").await;
    wait_state(&c, &id, "delivered").await;

    let out = cli(&["endpoints", "pause", &key, "--admin-listen", &admin], &[]).await;
    assert_eq!(out.ok().trim_end(), format!("{key} paused"));
    // The CLI's word is built from its argument: the API must say the same.
    let e = crate::admin::endpoint(&c, &key).await.unwrap();
    assert_eq!(e["state"], "paused", "{e}");
    let held = send(&c, &key, "held").await;

    let out = cli(&["endpoints", "list", "--admin-listen", &admin], &[]).await;
    let table = out.ok();
    assert_eq!(
        header_row(table),
        ["ENDPOINT", "STATE", "STREAK", "IN_FLIGHT", "PENDING"],
        "{table}"
    );
    let row: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with(&key))
        .unwrap_or_else(|| panic!("{key} in {table}"))
        .split_whitespace()
        .collect();
    assert_eq!(row, [key.as_str(), "paused", "0", "0", "1"]);
    let json = cli(&["endpoints", "list", "--json"], &[("COURIER_ADMIN_LISTEN", &admin)])
        .await
        .json();
    assert_eq!(json, get(&c.admin_url("/endpoints")).await.json());

    let out = cli(&["endpoints", "resume", &key], &[("COURIER_ADMIN_LISTEN", &admin)]).await;
    assert_eq!(out.ok().trim_end(), format!("{key} resumed"));
    let e = crate::admin::endpoint(&c, &key).await.unwrap();
    assert_eq!(e["state"], "active", "{e}");
    wait_state(&c, &held, "delivered").await;

    cli(
        &[
            "endpoints",
            "pause",
            "http://127.0.0.1:9/unknown",
            "--admin-listen",
            &admin,
        ],
        &[],
    )
    .await
    .failed_with(&["404", "not_found"]);
}

#[tokio::test]
async fn an_unreachable_admin_api_is_one_clear_error() {
    let dead = dead_addr().to_string();
    for args in [
        vec!["deliveries", "list"],
        vec!["deliveries", "show", "dlv_x"],
        vec!["deliveries", "retry", "dlv_x"],
        vec!["endpoints", "list"],
        vec!["endpoints", "pause", "k"],
        vec!["endpoints", "resume", "k"],
    ] {
        let mut with_flag = args.clone();
        with_flag.extend(["--admin-listen", &dead]);
        cli(&with_flag, &[])
            .await
            .failed_with(&["cannot reach the admin API", &dead]);
        cli(&args, &[("COURIER_ADMIN_LISTEN", &dead)])
            .await
            .failed_with(&["cannot reach the admin API", &dead]);
    }
}

#[tokio::test]
async fn the_admin_token_comes_from_the_config_file() {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), &format!("admin_token = \"cli-t0ken\"\n{FAST}"));
    let admin = c.admin.to_string();
    let config = c.config_path.to_str().unwrap().to_string();
    let id = send(&c, &rx.url("/t"), "x").await;
    // The test's own reads carry the token.
    let api = request(
        "GET",
        &c.admin_url("/deliveries?limit=50"),
        &[("authorization", "Bearer cli-t0ken")],
        "",
    )
    .await;
    assert_eq!(api.status, 200);

    // Without the config: no token, and the 401 is one line.
    cli(&["deliveries", "list", "--admin-listen", &admin], &[])
        .await
        .failed_with(&["401", "unauthorized"]);
    // With --config (or COURIER_CONFIG) the token is used.
    let out = cli(
        &["deliveries", "list", "--config", &config, "--admin-listen", &admin],
        &[],
    )
    .await;
    assert!(out.ok().contains(&id), "{}", out.stdout);
    let out = cli(
        &["endpoints", "list", "--admin-listen", &admin],
        &[("COURIER_CONFIG", &config)],
    )
    .await;
    assert_eq!(header_row(out.ok())[0], "ENDPOINT");
    // The token never shows in an error.
    let out = cli(
        &[
            "deliveries",
            "show",
            "dlv_nope",
            "--config",
            &config,
            "--admin-listen",
            &admin,
        ],
        &[],
    )
    .await;
    out.failed_with(&["404"]);
    assert!(!out.stderr.contains("cli-t0ken"));
}

/// `deliveries delete` removes a message (a pending one is never sent), and
/// `deliveries retry --all` requeues exactly the dead deliveries inside `--since`/`--until`.
#[tokio::test]
async fn delete_and_retry_all_within_a_time_window() {
    let rx = Receiver::scripted(|_, s| Reply::status(if s.path == "/held" { 200 } else { 410 })).await;
    let d = tempfile::tempdir().unwrap();
    let held_key = rx.url("/held");
    let c = Courier::start(
        d.path(),
        &format!("{FAST}[[endpoint]]\nkey = \"{held_key}\"\nrate_per_second = 100\n"),
    );
    let admin = c.admin.to_string();

    // delete: a message held by a paused endpoint is removed, and not sent on resume.
    let p = post(&c.admin_url(&format!("/endpoints/{}/pause", enc(&held_key))), &[], "").await;
    assert_eq!(p.status, 204, "{}", p.text());
    let doomed = send(&c, &held_key, "doomed").await;
    let out = cli(&["deliveries", "delete", &doomed, "--admin-listen", &admin], &[]).await;
    assert_eq!(out.ok().trim_end(), format!("{doomed} deleted"));
    let gone = get(&c.admin_url(&format!("/deliveries/{doomed}"))).await;
    assert_eq!(gone.status, 404, "deleted: {}", gone.text());
    cli(&["deliveries", "delete", &doomed, "--admin-listen", &admin], &[])
        .await
        .failed_with(&["404", "not_found"]);
    let r = post(&c.admin_url(&format!("/endpoints/{}/resume", enc(&held_key))), &[], "").await;
    assert_eq!(r.status, 204, "{}", r.text());
    let after = send(&c, &held_key, "after").await;
    wait_state(&c, &after, "delivered").await;
    let bodies: Vec<Vec<u8>> = rx.seen().iter().map(|s| s.body.clone()).collect();
    assert_eq!(bodies, [b"after".to_vec()], "the deleted message was never sent");

    // Three dead letters, all finished inside [since, until).
    let since = courier::timefmt::rfc3339(now_ms() - 1_000);
    let mut dead = Vec::new();
    for i in 0..3 {
        dead.push(send(&c, &rx.url(&format!("/d{i}")), "d").await);
    }
    for id in &dead {
        wait_state(&c, id, "dead").await;
    }
    let until = courier::timefmt::rfc3339(now_ms() + 1_000);
    let retry_all = |window: &[&str]| {
        let mut args = vec!["deliveries", "retry", "--all", "--json", "--admin-listen", &admin];
        args.extend_from_slice(window);
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            cli(&args, &[]).await.json()["requeued"].as_u64().unwrap()
        }
    };
    // A window that ends before they died, or starts after: nothing.
    assert_eq!(retry_all(&["--until", &since]).await, 0, "--until {since}");
    assert_eq!(retry_all(&["--since", &until]).await, 0, "--since {until}");
    for id in &dead {
        assert_eq!(delivery(&c, id).await["state"], "dead");
    }
    // The window around them: all three are replayed (and delivered now).
    rx.set_script(|_, _| Reply::status(200));
    assert_eq!(retry_all(&["--since", &since, "--until", &until]).await, 3);
    for id in &dead {
        let v = wait_state(&c, id, "delivered").await;
        assert_eq!(v["attempts"], 1, "{v}");
    }
    let out = cli(&["deliveries", "retry", "--all", "--admin-listen", &admin], &[]).await;
    assert_eq!(out.ok().trim_end(), "requeued 0 dead deliveries");
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}
