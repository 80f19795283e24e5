//! Retry policies per route and per endpoint, against the real binary: a route's explicit
//! schedule, an endpoint's status rules and in-flight cap, what the admin API shows of the
//! policy each attempt ran under, `check-config`'s effective policies and coded errors, and
//! what a config change and restart does to a message already accepted.

use std::process::Command;
use std::time::Duration;

use crate::support::*;

fn id_of(a: &Answer) -> String {
    assert_eq!(a.status, 202, "{}", a.text());
    a.json()["id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_route_schedule_times_the_retries_and_ends_them_with_its_last_delay() {
    let rx = Receiver::scripted(|_, _| Reply::status(503)).await;
    let d = tempfile::tempdir().unwrap();
    let cfg = format!(
        "[[route]]\nname = \"billing\"\nurl = \"{}\"\nschedule = [\"300ms\", \"900ms\"]\njitter = \"none\"\n",
        rx.url("/billing")
    );
    let c = Courier::start(d.path(), &cfg);
    let id = id_of(&post(&format!("http://{}/r/billing", c.ingress), &[], "x").await);
    let seen = rx.wait_for(3).await;
    let (g1, g2) = (seen[1].at - seen[0].at, seen[2].at - seen[1].at);
    assert!(
        g1 >= Duration::from_millis(300) && g1 < Duration::from_millis(800),
        "first retry after {g1:?}, want the schedule's 300ms"
    );
    assert!(
        g2 >= Duration::from_millis(900) && g2 < Duration::from_millis(1400),
        "second retry after {g2:?}, want 900ms"
    );
    let v = wait_state(&c, &id, "dead").await;
    assert_eq!(v["dead_reason"], "max_attempts");
    assert_eq!(v["attempts"], 3, "two delays: three attempts");
    assert_eq!(v["max_attempts"], 3);
    assert_eq!(v["route"], "billing");
    let policy = &v["policy"];
    assert_eq!(policy["route_section"], "billing");
    assert_eq!(policy["backoff"]["kind"], "schedule");
    assert_eq!(policy["backoff"]["schedule"], serde_json::json!(["300ms", "900ms"]));
    assert_eq!(policy["jitter"], "none");
    let revision = policy["revision"].as_str().unwrap();
    assert_eq!(revision.len(), 8);
    for a in v["history"].as_array().unwrap() {
        assert_eq!(a["policy_revision"], revision, "{a}");
    }
    assert_eq!(rx.seen().len(), 3, "nothing after the schedule's attempts");
    // The CLI shows the same: the policy line and each attempt's revision.
    let out = Command::new(bin())
        .args(["deliveries", "show", &id, "--admin-listen", &c.admin.to_string()])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(
        shown.contains("policy          schedule [300ms, 900ms], jitter none, max_attempts 3,"),
        "{shown}"
    );
    assert!(shown.contains(&format!("revision {revision}")), "{shown}");
    assert!(shown.contains("POLICY"), "{shown}");
    assert_eq!(
        shown.matches(revision).count(),
        4,
        "the policy line and 3 attempts: {shown}"
    );
    // The same receiver outside the route: the global policy.
    let plain = id_of(&post(&c.prefixed(&rx.url("/billing")), &[], "y").await);
    let v = delivery(&c, &plain).await;
    assert_eq!(
        (v["max_attempts"].as_u64(), &v["route"]),
        (Some(16), &serde_json::Value::Null)
    );
    assert_ne!(v["policy"]["revision"], revision);
}

#[tokio::test]
async fn an_endpoint_s_status_rules_make_409_success_and_404_permanent() {
    let rx = Receiver::scripted(|_, seen| {
        Reply::status(match seen.path.as_str() {
            "/conflict" => 409,
            _ => 404,
        })
    })
    .await;
    let d = tempfile::tempdir().unwrap();
    let cfg = format!(
        "[retry]\nbase_delay = \"100ms\"\njitter = \"none\"\n\
         [[endpoint]]\nkey = \"{}\"\nstatuses = {{ success = [409] }}\n\
         [[endpoint]]\nkey = \"{}\"\nstatuses = {{ permanent = [404] }}\n",
        rx.url("/conflict"),
        rx.url("/gone")
    );
    let c = Courier::start(d.path(), &cfg);
    let ok = id_of(&post(&c.prefixed(&rx.url("/conflict")), &[], "a").await);
    let gone = id_of(&post(&c.prefixed(&rx.url("/gone")), &[], "b").await);
    let v = wait_state(&c, &ok, "delivered").await;
    assert_eq!(
        (v["attempts"].as_u64(), v["last_status"].as_u64()),
        (Some(1), Some(409))
    );
    assert_eq!(
        v["policy"]["statuses"],
        serde_json::json!([{ "status": "409", "class": "success" }])
    );
    let v = wait_state(&c, &gone, "dead").await;
    assert_eq!(v["dead_reason"], "permanent_status");
    assert_eq!(v["attempts"], 1, "404 ruled permanent: not retried");
    // Counted just after the result is written: wait for the counts.
    eventually("the outcomes counted", || async {
        let metrics = get(&c.admin_url("/metrics")).await.text();
        [
            "courier_attempts_total{outcome=\"delivered\"} 1\n",
            "courier_attempts_total{outcome=\"permanent\"} 1\n",
            "courier_dead_letters_total{reason=\"permanent_status\"} 1\n",
        ]
        .iter()
        .all(|w| metrics.contains(w))
        .then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_endpoint_max_in_flight_caps_its_attempts_below_the_host_cap() {
    let rx = Receiver::scripted(|_, _| Reply::status(200).after(Duration::from_millis(300))).await;
    let d = tempfile::tempdir().unwrap();
    let cfg = format!(
        "[delivery]\nmax_in_flight_per_host = 10\n[[endpoint]]\nkey = \"{}\"\nmax_in_flight = 2\n",
        rx.url("/slow")
    );
    let c = Courier::start(d.path(), &cfg);
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(id_of(&post(&c.prefixed(&rx.url("/slow")), &[], format!("m{i}")).await));
    }
    for id in &ids {
        let v = wait_state(&c, id, "delivered").await;
        assert_eq!(v["attempts"], 1, "waiting for the cap is not an attempt");
    }
    assert_eq!(rx.max_in_flight(), 2, "never more than the endpoint's max_in_flight");
    let v = delivery(&c, &ids[0]).await;
    assert_eq!(v["policy"]["max_in_flight"], 2);
    let metrics = get(&c.admin_url("/metrics")).await.text();
    let capped: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("courier_endpoint_capped_total "))
        .expect("the counter is exported")
        .parse()
        .unwrap();
    assert!(capped > 0, "{metrics}");
}

fn check_config(dir: &std::path::Path, toml: &str) -> (i32, String, String) {
    let path = dir.join("check.toml");
    std::fs::write(&path, toml).unwrap();
    let out = Command::new(bin())
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_prints_each_effective_policy_and_refuses_bad_ones_with_a_code() {
    let d = tempfile::tempdir().unwrap();
    let (code, stdout, stderr) = check_config(
        d.path(),
        r#"
[retry]
schedule = ["5s", "5m", "30m", "2h", "5h", "10h", "10h"]

[[route]]
name = "billing"
url = "https://billing.example/hooks"
max_attempts = 4
jitter = "full"

[[endpoint]]
key = "https://billing.example/hooks"
max_in_flight = 2
statuses = { success = [409], permanent = [404] }
"#,
    );
    assert_eq!(code, 0, "{stderr}");
    for want in [
        "policy [retry]: schedule [5s, 5m, 30m, 2h, 5h, 10h, 10h], jitter equal, max_attempts 8, give_up_after 3d",
        "policy route billing with endpoint https://billing.example/hooks: schedule [5s, 5m, 30m, 2h, 5h, 10h, 10h], \
         jitter full, max_attempts 4,",
        "max_in_flight 2, statuses 404 permanent, 409 success, seed table; revision ",
        "policy endpoint https://billing.example/hooks: schedule [5s, 5m, 30m, 2h, 5h, 10h, 10h], jitter equal, \
         max_attempts 8,",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in:\n{stdout}");
    }

    for (toml, code_want, text) in [
        (
            "[retry]\nschedule = []\n",
            "empty_schedule",
            "retry.schedule must list at least one delay",
        ),
        (
            "[[endpoint]]\nkey = \"k\"\nschedule = [\"5s\", \"10 minutes\"]\n",
            "invalid_duration",
            "endpoint[0].schedule[1]: invalid duration",
        ),
        (
            "[[endpoint]]\nkey = \"k\"\nstatuses = { success = [409], retry = [409] }\n",
            "status_class_conflict",
            "409 is listed as both success and retry",
        ),
    ] {
        let (code, stdout, stderr) = check_config(d.path(), toml);
        assert_eq!(code, 2, "{toml}: {stdout}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(stderr.contains(text), "{toml}: {stderr}");
        assert!(stderr.trim_end().ends_with(&format!("[{code_want}]")), "{stderr}");
    }
}

/// Give-up limits are fixed at accept; how to attempt follows the config of the moment.
#[tokio::test]
async fn after_a_config_change_and_restart_a_message_keeps_its_limits_and_takes_the_new_schedule() {
    let rx = Receiver::scripted(|_, _| Reply::status(500)).await;
    let d = tempfile::tempdir().unwrap();
    let endpoint = rx.url("/orders");
    let before =
        format!("[[endpoint]]\nkey = \"{endpoint}\"\nmax_attempts = 4\nschedule = [\"3s\"]\njitter = \"none\"\n");
    let mut c = Courier::start(d.path(), &before);
    let id = id_of(&post(&c.prefixed(&endpoint), &[], "x").await);
    rx.wait_for(1).await;
    let v = eventually("the first retry scheduled", || async {
        let v = delivery(&c, &id).await;
        (v["attempts"] == 1 && v["state"] == "pending").then_some(v)
    })
    .await;
    let old_revision = v["policy"]["revision"].as_str().unwrap().to_string();
    assert_eq!(v["max_attempts"], 4);

    // New config: fewer attempts, a longer schedule.
    let after = format!(
        "allow_private_targets = true\n[[endpoint]]\nkey = \"{endpoint}\"\nmax_attempts = 1\nschedule = [\"400ms\", \"2s\"]\njitter = \"none\"\n"
    );
    std::fs::write(&c.config_path, after).unwrap();
    c.restart();

    // The accepted message keeps max_attempts = 4: attempts 2, 3 and 4 happen, each after
    // the new schedule's delays (the retry due before the restart is already scheduled).
    let seen = rx.wait_for(4).await;
    let gap = seen[3].at - seen[2].at;
    assert!(
        gap >= Duration::from_secs(2) && gap < Duration::from_millis(2600),
        "after attempt 3 the new schedule's second delay (2s), got {gap:?}"
    );
    let v = wait_state(&c, &id, "dead").await;
    assert_eq!((v["attempts"].as_u64(), v["max_attempts"].as_u64()), (Some(4), Some(4)));
    let new_revision = v["policy"]["revision"].as_str().unwrap();
    assert_ne!(new_revision, old_revision);
    let revisions: Vec<&str> = v["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["policy_revision"].as_str().unwrap())
        .collect();
    assert_eq!(
        revisions,
        [old_revision.as_str(), new_revision, new_revision, new_revision]
    );

    // A message accepted now gets the new limit.
    let fresh = id_of(&post(&c.prefixed(&endpoint), &[], "y").await);
    let v = wait_state(&c, &fresh, "dead").await;
    assert_eq!((v["attempts"].as_u64(), v["max_attempts"].as_u64()), (Some(1), Some(1)));

    // A replay keeps the message's max_attempts and gets the policy's give-up window now.
    let replayed = request("POST", &c.admin_url(&format!("/deliveries/{id}/retry")), &[], "").await;
    assert_eq!(replayed.status, 202, "{}", replayed.text());
    let v = delivery(&c, &id).await;
    assert_eq!(v["max_attempts"], 4);
}
