//! `[log] format`: the JSON lines' documented shape, read from the real binary's stderr.

use crate::support::*;

/// Every line parsed as a JSON object; fails on the first that is not one.
fn json_lines(c: &Courier) -> Vec<serde_json::Map<String, serde_json::Value>> {
    c.log
        .all()
        .lines()
        .map(|line| match serde_json::from_str(line) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => panic!("not a JSON object: {line:?}"),
        })
        .collect()
}

async fn json_lines_for_one_delivery(c: Courier) {
    let rx = Receiver::start().await;
    let a = post(&c.prefixed(&rx.url("/hook")), &[], "x").await;
    assert_eq!(a.status, 202);
    let id = a.json()["id"].as_str().unwrap().to_string();
    wait_state(&c, &id, "delivered").await;
    assert!(
        c.log.wait_for("\"delivered\"", WAIT).is_some(),
        "no delivery line in:\n{}",
        c.log.all()
    );
    let lines = json_lines(&c);
    for line in &lines {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(line.get(key).is_some_and(|v| v.is_string()), "no {key} in {line:?}");
        }
        assert!(!line.contains_key("fields"), "event fields are flattened: {line:?}");
    }
    let listening = lines
        .iter()
        .find(|l| l["message"] == "listening")
        .expect("a listening line");
    assert_eq!(listening["level"], "INFO");
    assert_eq!(listening["ingress"], c.ingress.to_string());
    assert_eq!(listening["admin"], c.admin.to_string());
    let delivered = lines
        .iter()
        .find(|l| l["message"] == "delivered")
        .expect("a delivery line");
    assert_eq!(delivered["delivery_id"], id.as_str());
    assert_eq!(delivered["status"], 200);
    assert_eq!(delivered["attempt"], 1);
    assert!(delivered["event_id"].as_str().is_some_and(|e| e.starts_with("msg_")));
    assert_eq!(delivered["endpoint"], rx.url("/hook"));
    assert!(delivered["target"].as_str().is_some_and(|t| t.starts_with("courier")));
}

#[tokio::test]
async fn json_log_lines_are_objects_with_the_documented_fields() {
    let d = tempfile::tempdir().unwrap();
    // Delivery lines are debug: let courier's own through, not every library's.
    let c = Courier::start_with(
        d.path(),
        "[log]\nformat = \"json\"\n",
        &[],
        &[("COURIER_LOG", "info,courier=debug")],
    );
    json_lines_for_one_delivery(c).await;
}

#[tokio::test]
async fn the_env_var_selects_json_lines() {
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start_with(
        d.path(),
        "",
        &[],
        &[("COURIER_LOG", "info,courier=debug"), ("COURIER_LOG_FORMAT", "json")],
    );
    json_lines_for_one_delivery(c).await;
}

#[tokio::test]
async fn text_stays_the_default() {
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), "");
    let line = c.log.wait_for("listening", WAIT).unwrap();
    assert!(!line.starts_with('{') && line.contains("ingress="), "{line}");
}

#[tokio::test]
async fn a_failed_start_is_a_json_line_too() {
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), "");
    let out = std::process::Command::new(bin())
        .args(["serve", "--data-dir"])
        .arg(d.path().join("other"))
        .args(["--listen", &c.ingress.to_string(), "--admin-listen", "127.0.0.1:0"])
        .env("COURIER_LOG_FORMAT", "json")
        .env_remove("COURIER_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // Every line must parse, not only the last.
    let lines: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l:?}")))
        .collect();
    let last = lines.last().expect("a line");
    assert_eq!(last["level"], "ERROR");
    assert_eq!(last["message"], "exiting");
    assert!(
        last["error"].as_str().unwrap().contains(&c.ingress.to_string()),
        "{last}"
    );
}
