//! The host circuit breaker, black-box: a dead host gets a few probes instead of an attempt
//! per message, and its whole backlog goes out soon after it returns, never past its cap.

use std::time::Duration;

use crate::support::*;

fn attempts(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("courier_attempts_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_host_gets_probes_not_an_attempt_per_message_and_its_backlog_drains_within_the_cap() {
    let down = dead_addr();
    let d = tempfile::tempdir().unwrap();
    // Without the breaker, 1,000 messages retried every ~100 ms would make thousands of
    // attempts in the window below.
    let c = Courier::start(
        d.path(),
        concat!(
            "[retry]\nbase_delay = \"100ms\"\nmax_delay = \"200ms\"\njitter = \"none\"\nmax_attempts = 1000\n",
            "[delivery]\nmax_in_flight_per_host = 8\nconnect_timeout = \"1s\"\n",
            "[circuit]\nfailures = 3\nprobe_delay = \"500ms\"\nprobe_max_delay = \"1s\"\n",
        ),
    );
    let target = c.prefixed(&format!("http://{down}/hook"));
    let sends: Vec<_> = (0..1000)
        .map(|i| {
            let url = target.clone();
            tokio::spawn(async move { post(&url, &[], format!("m{i}")).await.status })
        })
        .collect();
    for s in sends {
        assert_eq!(s.await.unwrap(), 202);
    }
    let host = down.to_string();
    let hosts = eventually("the breaker open", || async {
        let v = get(&c.admin_url("/hosts?state=open")).await.json();
        (v["items"].as_array().unwrap().len() == 1).then_some(v)
    })
    .await;
    assert_eq!(hosts["items"][0]["host"], host.as_str());
    let before = attempts(&get(&c.admin_url("/metrics")).await.text());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let m = get(&c.admin_url("/metrics")).await.text();
    let during = attempts(&m) - before;
    // Probes at most every 0.5–1 s: a handful in 3 s, not 1,000 messages' retries.
    assert!(during <= 8.0, "{during} attempts in 3 s with the breaker open");
    assert!(
        m.contains(&format!("courier_host_circuit_open{{host=\"{host}\"}} 1")),
        "the gauge names the host"
    );
    assert!(before <= 30.0, "{before} attempts before the breaker opened");
    let cli = std::process::Command::new(bin())
        .args(["hosts", "list", "--open", "--admin-listen", &c.admin.to_string()])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&cli.stdout);
    assert!(cli.status.success(), "{table}");
    assert!(table.starts_with("HOST") && table.contains(&host), "{table}");
    assert!(table.contains("open") || table.contains("probing"), "{table}");

    // The host returns: everything goes out, never more than the cap at once.
    let rx = Receiver::start_on(down).await;
    let seen = rx
        .wait_for_within(1000, Duration::from_secs(60))
        .await
        .unwrap_or_else(|| panic!("only {} delivered after the host returned", rx.seen().len()));
    assert!(seen.len() >= 1000);
    assert!(rx.max_in_flight() <= 8, "{} at once", rx.max_in_flight());
    let v = eventually("the breaker closed", || async {
        let v = get(&c.admin_url("/hosts")).await.json();
        (v["items"][0]["circuit"] == "closed").then_some(v)
    })
    .await;
    assert_eq!(v["items"][0]["host"], host.as_str());
    let m = get(&c.admin_url("/metrics")).await.text();
    assert!(!m.contains("courier_host_circuit_open{"), "no host open any more");
}
