//! Adoption, checked the way a user would: the copy-paste snippets in `examples/` (curl,
//! Python, Node) run against the real courier and a local receiver by each of the three
//! zero-code forms; the receiver example (`examples/receiver.py`) verifies what courier signs with each scheme;
//! and third-party libraries (Python `standardwebhooks`, `svix`, `stripe`; npm
//! `@octokit/webhooks-methods`) verify courier's real outgoing signatures.
//!
//! A test whose tool is missing fails and says what is missing (with
//! `COURIER_TEST_ALLOW_SKIP=1` it prints `skipped: …` and passes instead).
//! `scripts/test.sh` installs the verifiers (svix included) under the target folder and
//! sets `COURIER_TEST_REQUIRE_VERIFIERS=1`, which allows no skip, so CI always runs them. Locations: `COURIER_TEST_PYTHON` (default
//! `python3`) and `NODE_PATH` (a `node_modules` folder).

use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use base64::Engine;

use crate::support::*;

/// How long one external tool (an interpreter importing a library, a script) may run.
const TOOL_WAIT: Duration = Duration::from_secs(60);

/// Loopback receivers are refused by default; this is the setting the examples document.
const ALLOW_LOOPBACK: &str = "[egress]\nallow = [\"127.0.0.1/32\"]\n";

/// A Standard Webhooks secret (`whsec_` + base64 of 32 bytes).
const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// The secret being rotated out; courier signs with both while both are configured.
const STANDARD_OLD_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
/// Stripe's signing secrets look like this; the HMAC key is the string as it is.
const STRIPE_SECRET: &str = "whsec_adoption_test_stripe_endpoint_secret";
/// GitHub's documentation example secret.
const GITHUB_SECRET: &str = "It's a Secret to Everybody";

/// A body with a non-ASCII character, so a verifier that re-encodes the body would fail.
const BODY: &str = "{\"type\":\"invoice.paid\",\"id\":\"evt_1\",\"object\":\"event\",\"data\":{\"customer\":\"Zoë\"}}";

// --- helpers -------------------------------------------------------------------------

/// Whether `program args` can be started and exits 0.
fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs a command to completion (with `stdin` written to it), killing it after [`TOOL_WAIT`].
/// Runs on the blocking pool: the test's receivers live on the test's own runtime thread.
async fn run(mut cmd: Command, stdin: String) -> Output {
    tokio::task::spawn_blocking(move || {
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {what}: {e}"));
        let pid = child.id();
        let mut input = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || input.write_all(stdin.as_bytes()));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let output = match rx.recv_timeout(TOOL_WAIT) {
            Ok(output) => output.unwrap_or_else(|e| panic!("{what}: {e}")),
            Err(_) => {
                let _ = Command::new("kill").arg("-KILL").arg(pid.to_string()).status();
                panic!("{what} did not finish within {TOOL_WAIT:?}");
            }
        };
        let _ = writer.join();
        output
    })
    .await
    .unwrap()
}

fn example_path(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(file)
}

/// Posts `BODY` by the URL-prefix form with extra control headers; returns (delivery id, event id).
async fn accept(c: &Courier, target: &str, headers: &[(&str, &str)]) -> (String, String) {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let a = post(&c.prefixed(target), &all, BODY).await;
    assert_eq!(a.status, 202, "{}", a.text());
    let j = a.json();
    (j["id"].as_str().unwrap().into(), j["event_id"].as_str().unwrap().into())
}

// --- 1. the send snippets ----------------------------------------------------------------

/// Runs one send snippet against a courier with an ingress token and a loopback receiver,
/// and checks the receiver got one signed message per form, exactly as the app sent it.
async fn snippet_reaches_receiver_by_each_form(tool: &str, program: &str, args: &[PathBuf]) {
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let config =
        format!("ingress_token = \"adoption-token\"\n{ALLOW_LOOPBACK}[signing]\nsecrets = [\"{STANDARD_SECRET}\"]\n");
    let c = Courier::start(d.path(), &config);
    let target = rx.url(&format!("/hooks/{tool}?x=1"));

    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("COURIER", format!("http://{}", c.ingress))
        .env("TARGET", &target)
        .env("COURIER_INGRESS_TOKEN", "adoption-token");
    let out = run(cmd, String::new()).await;
    let stdout = success(&format!("{tool} snippet"), &out);
    assert_eq!(
        stdout.matches("\"status\":\"pending\"").count(),
        3,
        "three messages accepted:\n{stdout}"
    );

    let Some(seen) = rx.wait_for_within(3, WAIT).await else {
        let deliveries = get(&c.admin_url("/deliveries")).await.text();
        panic!(
            "the receiver saw {} of 3 messages; courier's deliveries: {deliveries}",
            rx.seen().len()
        );
    };
    let mut forms = BTreeSet::new();
    for s in &seen {
        assert_eq!(
            (s.method.as_str(), s.path.as_str()),
            ("POST", format!("/hooks/{tool}?x=1").as_str())
        );
        assert_eq!(s.header("content-type").as_deref(), Some("application/json"));
        assert!(s.header("webhook-signature").is_some_and(|v| v.starts_with("v1,")));
        for (name, _) in &s.headers {
            assert!(
                !name.starts_with("courier-") && !name.starts_with("proxy-"),
                "control header {name} was forwarded"
            );
        }
        let body: serde_json::Value = serde_json::from_slice(&s.body).expect("the body arrives as sent");
        forms.insert(body["form"].as_str().unwrap().to_string());
    }
    let expected: BTreeSet<String> = ["url-prefix", "proxy", "courier-target"].map(String::from).into();
    assert_eq!(forms, expected, "one delivery per adoption form");
}

#[tokio::test]
async fn curl_snippet_sends_by_url_prefix_proxy_and_header() {
    if !runs("curl", &["--version"]) || !runs("bash", &["--version"]) {
        return skip("curl or bash not found");
    }
    snippet_reaches_receiver_by_each_form("curl", "bash", &[example_path("curl.sh")]).await;
}

#[tokio::test]
async fn python_snippet_sends_by_url_prefix_proxy_and_header() {
    if !runs("python3", &["--version"]) {
        return skip("python3 not found");
    }
    snippet_reaches_receiver_by_each_form("python", "python3", &[example_path("python_send.py")]).await;
}

#[tokio::test]
async fn node_snippet_sends_by_url_prefix_proxy_and_header() {
    if !runs("node", &["--version"]) {
        return skip("node not found");
    }
    snippet_reaches_receiver_by_each_form("node", "node", &[example_path("node_send.mjs")]).await;
}

// --- 2. the receiver example ---------------------------------------------------------------

/// Starts the receiver example with `secret` on a free port, points a courier signing with
/// `scheme` and `secret` at it, and checks the receiver verifies the real message — and
/// that it refuses one signed with another secret (so its "verified" means something).
async fn receiver_example_verifies(scheme: &str, secret: &str, wrong_secret: &str) {
    receiver_example_verifies_with(scheme, secret, secret, wrong_secret).await;
}

/// The same, with the receiver given `receiver_secret` (a `whpk_` public key for courier's
/// `whsk_` secret).
async fn receiver_example_verifies_with(scheme: &str, secret: &str, receiver_secret: &str, wrong_secret: &str) {
    // An Ed25519 public key needs Debian's `cryptography`; the HMAC schemes, Python alone.
    let python = if receiver_secret.starts_with("whpk_") {
        // `verifier` has said why when there is none.
        let Some(python) = crate::signing_ed25519::verifier() else {
            return;
        };
        python
    } else if runs("python3", &["--version"]) {
        "python3".to_string()
    } else {
        return skip("python3 not found, for examples/receiver.py");
    };
    let mut cmd = Command::new(python);
    cmd.arg(example_path("receiver.py"));
    cmd.args([
        "--listen",
        "127.0.0.1:0",
        "--secret",
        receiver_secret,
        "--reject-unverified",
    ])
    .env_remove("RECEIVER_SECRETS");
    let receiver = Spawned::start(cmd);
    let line = receiver.wait_for("receiver listening on http://").await;
    let addr: SocketAddr = line.rsplit("http://").next().unwrap().trim().parse().unwrap();

    let d = tempfile::tempdir().unwrap();
    let config = format!("{ALLOW_LOOPBACK}[signing]\nscheme = \"{scheme}\"\nsecrets = [\"{secret}\"]\n");
    let c = Courier::start(d.path(), &config);
    let target = format!("http://{addr}/hooks");

    let (id, event_id) = accept(&c, &target, &[]).await;
    let line = receiver.wait_for(&format!("id={event_id} ")).await;
    assert!(
        line.contains(&format!("scheme={scheme} verified=yes -> 204")),
        "the receiver example did not verify courier's {scheme} signature: {line}"
    );
    wait_state(&c, &id, "delivered").await;

    let (id, event_id) = accept(&c, &target, &[("courier-signing-secret", wrong_secret)]).await;
    let line = receiver.wait_for(&format!("id={event_id} ")).await;
    assert!(
        line.contains(&format!("scheme={scheme} verified=no")) && line.ends_with("-> 401"),
        "a {scheme} signature made with another secret was not refused: {line}"
    );
    let dead = wait_state(&c, &id, "dead").await;
    assert_eq!(dead["dead_reason"], "permanent_status");
}

#[tokio::test]
async fn receiver_example_verifies_standard_signatures() {
    receiver_example_verifies("standard", STANDARD_SECRET, STANDARD_OLD_SECRET).await;
}

#[tokio::test]
async fn receiver_example_verifies_ed25519_signatures_with_a_public_key() {
    // courier's known-answer key pair (src/signing/ed25519.rs); the wrong key is another one.
    receiver_example_verifies_with(
        "standard",
        "whsk_Y291cmllciBlZDI1NTE5IGtub3duLWFuc3dlciBrZXk=",
        "whpk_SgxHe1+cbw9OFG7edwgundcRpId0LhJMbVzadLmMNiU=",
        "whsk_VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk=",
    )
    .await;
}

#[tokio::test]
async fn receiver_example_verifies_stripe_signatures() {
    receiver_example_verifies("stripe", STRIPE_SECRET, "whsec_some_other_endpoint").await;
}

#[tokio::test]
async fn receiver_example_verifies_github_signatures() {
    receiver_example_verifies("github", GITHUB_SECRET, "not-the-configured-secret").await;
}

// --- 3. third-party verifiers ----------------------------------------------------------------

/// The python with the verifier libraries: `COURIER_TEST_PYTHON`, else `python3`.
fn python() -> String {
    std::env::var("COURIER_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// What a verifier script reads on stdin: the captured request and the secret.
fn captured(seen: &Seen, secret: &str) -> String {
    let headers: serde_json::Map<String, serde_json::Value> = seen
        .headers
        .iter()
        .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned().into()))
        .collect();
    serde_json::json!({
        "secret": secret,
        "headers": headers,
        "body_b64": base64::engine::general_purpose::STANDARD.encode(&seen.body),
    })
    .to_string()
}

/// Verifies with the libraries a receiver would use; every check also makes sure a body
/// changed by one byte is refused. Prints one `verified <library>` line per library.
const PY_VERIFY: &str = r#"
import base64, json, sys
d = json.load(sys.stdin)
body, headers, secret, scheme = base64.b64decode(d["body_b64"]), d["headers"], d["secret"], sys.argv[1]
tampered = body.replace(b"invoice", b"Invoice")
assert tampered != body

def refused(f):
    try:
        f()
    except Exception:
        return True
    return False

if scheme == "standard":
    from standardwebhooks.webhooks import Webhook
    Webhook(secret).verify(body, dict(headers))
    assert refused(lambda: Webhook(secret).verify(tampered, dict(headers))), "standardwebhooks accepted a changed body"
    print("verified standardwebhooks")
    try:
        from svix.webhooks import Webhook as SvixWebhook
    except ImportError:
        print("svix not installed")
    else:
        SvixWebhook(secret).verify(body, dict(headers))
        assert refused(lambda: SvixWebhook(secret).verify(tampered, dict(headers))), "svix accepted a changed body"
        print("verified svix")
elif scheme == "stripe":
    import stripe
    event = stripe.Webhook.construct_event(body, headers["stripe-signature"], secret)
    assert event["type"] == "invoice.paid", event
    assert refused(lambda: stripe.Webhook.construct_event(tampered, headers["stripe-signature"], secret)), "stripe accepted a changed body"
    print("verified stripe")
"#;

/// The same for GitHub with `@octokit/webhooks-methods` (run as an ES module whose bare
/// imports resolve from the working directory, which holds `node_modules`).
const NODE_VERIFY: &str = r#"
import { verify } from "@octokit/webhooks-methods";
const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const d = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const body = Buffer.from(d.body_b64, "base64").toString("utf8");
const signature = d.headers["x-hub-signature-256"];
if (!(await verify(d.secret, body, signature))) throw new Error("@octokit/webhooks-methods refused " + signature);
if (await verify(d.secret, body.replace("invoice", "Invoice"), signature)) throw new Error("accepted a changed body");
console.log("verified @octokit/webhooks-methods");
"#;

/// Whether `python` can import every module in `modules`.
fn python_has(python: &str, modules: &str) -> bool {
    runs(python, &["-c", &format!("import {modules}")])
}

/// A folder whose `node_modules` holds `@octokit/webhooks-methods`, from `NODE_PATH`.
fn octokit_dir() -> Option<PathBuf> {
    let node_path = std::env::var_os("NODE_PATH")?;
    std::env::split_paths(&node_path)
        .find(|p| p.join("@octokit/webhooks-methods/package.json").exists())
        .and_then(|p| p.parent().map(Path::to_path_buf))
}

async fn python_verifies(scheme: &str, seen: &Seen, secret: &str) -> String {
    let mut cmd = Command::new(python());
    cmd.args(["-c", PY_VERIFY, scheme]);
    let out = run(cmd, captured(seen, secret)).await;
    success(&format!("python {scheme} verifier"), &out)
}

#[tokio::test]
async fn standard_signatures_verify_with_standardwebhooks_and_svix_on_every_attempt() {
    let py = python();
    if !python_has(&py, "standardwebhooks") {
        return skip(&format!("{py} cannot import standardwebhooks"));
    }
    // The first attempt fails, so the retry's fresh timestamp and signature are checked too.
    let rx = Receiver::scripted(|n, _| Reply::status(if n == 0 { 503 } else { 204 })).await;
    let d = tempfile::tempdir().unwrap();
    // Two secrets mid-rotation: each signs, and a receiver holding either one accepts.
    let config = format!(
        "{ALLOW_LOOPBACK}[retry]\nbase_delay = \"1s\"\njitter = \"none\"\n[signing]\nsecrets = [\"{STANDARD_SECRET}\", \"{STANDARD_OLD_SECRET}\"]\n"
    );
    let c = Courier::start(d.path(), &config);
    let (id, _) = accept(&c, &rx.url("/hooks"), &[]).await;
    let seen = rx.wait_for(2).await;
    assert_ne!(seen[0].header("webhook-timestamp"), seen[1].header("webhook-timestamp"));
    for attempt in &seen[..2] {
        for secret in [STANDARD_SECRET, STANDARD_OLD_SECRET] {
            let out = python_verifies("standard", attempt, secret).await;
            assert!(out.contains("verified standardwebhooks"), "{out}");
            // svix is the second verifier: required in CI (scripts/verifiers.sh installs it
            // or fails), optional on a developer's machine.
            if !out.contains("verified svix") {
                skip(&format!(
                    "{py} cannot import svix, so only standardwebhooks checked ({out:?})"
                ));
            }
        }
    }
    wait_state(&c, &id, "delivered").await;
}

#[tokio::test]
async fn stripe_signatures_verify_with_the_stripe_library() {
    let py = python();
    if !python_has(&py, "stripe") {
        return skip(&format!("{py} cannot import stripe"));
    }
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), ALLOW_LOOPBACK);
    // Per-message scheme and secret, as an app with several Stripe-style endpoints sends them.
    accept(
        &c,
        &rx.url("/stripe"),
        &[
            ("courier-signature-scheme", "stripe"),
            ("courier-signing-secret", STRIPE_SECRET),
        ],
    )
    .await;
    let seen = rx.wait_for(1).await;
    let out = python_verifies("stripe", &seen[0], STRIPE_SECRET).await;
    assert!(out.contains("verified stripe"), "{out}");
}

#[tokio::test]
async fn github_signatures_verify_with_octokit_webhooks_methods() {
    if !runs("node", &["--version"]) {
        return skip("node not found");
    }
    let Some(dir) = octokit_dir() else {
        return skip("no @octokit/webhooks-methods under NODE_PATH");
    };
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    let config = format!("{ALLOW_LOOPBACK}[signing]\nscheme = \"github\"\nsecrets = [\"{GITHUB_SECRET}\"]\n");
    let c = Courier::start(d.path(), &config);
    accept(&c, &rx.url("/github"), &[]).await;
    let seen = rx.wait_for(1).await;
    let mut cmd = Command::new("node");
    cmd.args(["--input-type=module", "-e", NODE_VERIFY]).current_dir(dir);
    let out = run(cmd, captured(&seen[0], GITHUB_SECRET)).await;
    let stdout = success("node github verifier", &out);
    assert!(stdout.contains("verified @octokit/webhooks-methods"), "{stdout}");
}
