//! The README's quick start, run as written: its receiver command, its config, its send,
//! its look at the delivery and its `deliveries list`, taken from the README's text each
//! run, so an edit that breaks one of them (a flag renamed, a verb moved, a default port
//! changed) fails here. One substitution: `./scripts/run.sh` (the set-up script, then
//! `cargo run --release ... serve`) is the courier under test, started with `serve` and the
//! same arguments; the test checks the script still ends in that command, and that the
//! README's `cargo run --release --bin courier --` is the same binary.
//!
//! The quick start names fixed loopback ports (9000, 8787, 8788); the rest of the suite
//! uses ports the kernel picks (above 32767), so they do not collide. A port in use fails
//! the test and says which.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;

/// The commands of the quick start's shell block, in order, and the file it writes.
#[derive(Debug)]
struct QuickStart {
    commands: Vec<String>,
    /// `cat > PATH <<'TAG'` … `TAG`: the path and what is written there.
    file: (String, String),
}

/// The first `sh` block after `## Quick start`: comments and blank lines dropped,
/// continued lines joined, the one here-document kept apart.
fn quick_start(readme: &str) -> QuickStart {
    let section = &readme[readme.find("## Quick start").expect("README has a Quick start")..];
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("the Quick start has a ```sh block");
    let (mut commands, mut file, mut joined) = (Vec::new(), None, String::new());
    let mut lines = block.lines();
    while let Some(line) = lines.next() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some((path, tag)) = line.strip_prefix("cat > ").and_then(|l| l.split_once(" <<")) {
            let tag = tag.trim_matches('\'');
            let body: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != tag).collect();
            file = Some((path.to_string(), body.join("\n") + "\n"));
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => joined.push_str(part),
            None => {
                joined.push_str(line);
                commands.push(std::mem::take(&mut joined));
            }
        }
    }
    QuickStart {
        commands,
        file: file.expect("the Quick start writes its config with a here-document"),
    }
}

fn sh(command: &str, cwd: &Path) -> String {
    let out = Command::new("sh")
        .args(["-c", command])
        .current_dir(cwd)
        // curl as written, but never through a proxy the environment names.
        .env("NO_PROXY", "127.0.0.1")
        .env("no_proxy", "127.0.0.1")
        .output()
        .unwrap_or_else(|e| panic!("sh -c {command:?}: {e}"));
    success(command, &out)
}

/// Fails, naming the port, when something else listens on one of the quick start's.
fn ports_free(ports: &[u16]) {
    for port in ports {
        if let Err(e) = TcpListener::bind(("127.0.0.1", *port)) {
            panic!("the quick start needs 127.0.0.1:{port}, which is taken here ({e}): stop what listens there");
        }
    }
}

#[test]
fn the_readme_quick_start_delivers_with_a_valid_signature() {
    for tool in ["python3", "curl"] {
        if !Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return skip(&format!("{tool} not found: the quick start uses it"));
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let qs = quick_start(&std::fs::read_to_string(root.join("README.md")).unwrap());
    let [receiver, run, send, show, list] = &qs.commands[..] else {
        panic!("the quick start's commands changed; update this test with them: {qs:#?}")
    };
    assert!(receiver.starts_with("python3 examples/receiver.py "), "{receiver}");
    let (config_path, config) = &qs.file;
    assert_eq!(run, &format!("./scripts/run.sh --config {config_path}"));
    let script = std::fs::read_to_string(root.join("scripts/run.sh")).unwrap();
    assert!(
        script
            .trim_end()
            .ends_with(r#"exec cargo run --release --locked --bin courier -- serve "$@""#),
        "scripts/run.sh no longer ends by running `courier serve` with its arguments; update this test"
    );
    let list_args = list
        .strip_prefix("cargo run --release --bin courier -- ")
        .unwrap_or_else(|| panic!("the quick start's last command is not courier's release build: {list}"));
    ports_free(&[9000, 8787, 8788]);

    let receiver = Spawned::start({
        let mut cmd = Command::new("sh");
        cmd.args(["-c", &format!("exec {receiver}")]).current_dir(root);
        cmd
    });
    receiver.wait_line("receiver listening on http://127.0.0.1:9000", WAIT);
    // Its own folder: the config where the README puts it is another run's to use, and
    // the embedded defaults keep data in ./courier-data.
    let d = tempfile::tempdir().unwrap();
    let config_file = d.path().join("courier.toml");
    std::fs::write(&config_file, config).unwrap();
    let courier = Spawned::start({
        let mut cmd = Command::new(bin());
        cmd.args(["serve", "--config"]).arg(&config_file).current_dir(d.path());
        cmd
    });
    // Its own line, not just something answering on the port.
    courier.wait_line("listening ingress=127.0.0.1:8787", WAIT);

    let answer = sh(send, d.path());
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    let id = answer
        .lines()
        .find_map(|l| l.strip_prefix("courier-delivery-id: "))
        .expect("a courier-delivery-id header")
        .trim()
        .to_string();
    assert!(show.contains("dlv_01JD..."), "{show}");
    let show = show.replace("dlv_01JD...", &id);
    // Two 503s, then the retry's backoff (`base_delay = "2s"`, jittered) twice.
    let line = receiver.wait_line("verified=yes -> 204", Duration::from_secs(60));
    assert!(line.contains("scheme=standard"), "{line}");
    let failed = receiver.lines().iter().filter(|l| l.ends_with("-> 503")).count();
    assert_eq!(failed, 2, "{:#?}", receiver.lines());
    let delivered = Instant::now() + WAIT;
    loop {
        let shown: serde_json::Value = serde_json::from_str(&sh(&show, d.path())).unwrap();
        if shown["state"] == "delivered" {
            assert_eq!(shown["attempts"], 3, "{shown:#}");
            break;
        }
        assert!(Instant::now() < delivered, "not delivered: {shown:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = Command::new(bin())
        .args(list_args.split_whitespace())
        .current_dir(d.path())
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{listed}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        listed.lines().any(|l| l.contains(&id) && l.contains("delivered")),
        "{listed}"
    );
}
