//! Ed25519 (`v1a`) signatures, black box: keys made with `courier keys generate`, the
//! public key printed by `courier keys public`, courier signing real deliveries with a
//! `whsk_` key, and every received signature verified by a third-party implementation
//! (Python `cryptography`, `Ed25519PublicKey.verify`) over the Standard Webhooks signed
//! content `<webhook-id>.<webhook-timestamp>.<body>`. Also: mixed `whsec_`/`whsk_`
//! rotation lists, replay re-signing with the current keys, and the refusals at config load
//! and ingress.
//!
//! The verifier is Debian's `python3-cryptography`, which `scripts/verifiers.sh` installs
//! and points to with `COURIER_TEST_ED25519_PYTHON`; without it a test fails and says so
//! (with `COURIER_TEST_ALLOW_SKIP=1` it prints `skipped: …` and passes, unless CI's
//! `COURIER_TEST_REQUIRE_VERIFIERS=1` is set).

use std::process::{Command, Output, Stdio};

use base64::Engine as _;
use serde_json::json;

use crate::support::*;

const HMAC_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// A body with a non-ASCII character, so a verifier that re-encodes the body would fail.
const BODY: &str = "{\"type\":\"invoice.paid\",\"customer\":\"Zoë\"}";
const FAST_RETRY: &str = "[retry]\nbase_delay = \"1s\"\njitter = \"none\"\n";

/// Runs `courier <args>` with `stdin`, outside any courier settings of the environment.
async fn courier_cmd(args: &[&str], stdin: &str) -> Output {
    courier_cli(args, &[], stdin).await
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A fresh key pair from the real CLI: `courier keys generate` for the secret, and
/// `courier keys public` (secret on stdin) for the public key, which must equal the one
/// `generate` printed on stderr.
async fn generate() -> (String, String) {
    let out = courier_cmd(&["keys", "generate"], "").await;
    assert!(out.status.success(), "keys generate: {out:?}");
    let (secret, shown) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(secret.lines().count(), 1, "one line on stdout: {secret:?}");
    assert_eq!(shown.lines().count(), 1, "one line on stderr: {shown:?}");
    let secret = secret.trim().to_string();
    assert!(secret.starts_with("whsk_"), "{secret}");
    let seed = base64::engine::general_purpose::STANDARD
        .decode(&secret["whsk_".len()..])
        .unwrap();
    assert_eq!(seed.len(), 32, "whsk_ holds the 32-byte seed");
    let out = courier_cmd(&["keys", "public"], &format!("{secret}\n")).await;
    assert!(out.status.success(), "keys public: {out:?}");
    let public = text(&out.stdout).trim().to_string();
    assert!(public.starts_with("whpk_"), "{public}");
    assert_eq!(public, shown.trim(), "generate and public disagree");
    (secret, public)
}

/// The python that has Debian's `cryptography`: `COURIER_TEST_ED25519_PYTHON`, else
/// Debian's interpreter, else whatever `python3` is on PATH.
fn ed25519_python() -> Option<String> {
    let candidates = std::env::var("COURIER_TEST_ED25519_PYTHON")
        .into_iter()
        .chain(["/usr/bin/python3".to_string(), "python3".to_string()]);
    candidates.into_iter().find(|py| {
        Command::new(py)
            .args([
                "-c",
                "from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Verifies one received request with Python: every `whpk_` in `public` must verify a
/// `v1a` entry (and not once the body changes), no `whpk_` in `wrong` may verify any, and
/// every `whsec_` in `hmac` must match a `v1` entry (stdlib `hmac`). Prints what it checked.
const PY_VERIFY: &str = r#"
import base64, hashlib, hmac, json, sys
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

d = json.load(sys.stdin)
h = d["headers"]
body = base64.b64decode(d["body_b64"])
tampered = body + b" "
entries = [e.split(",", 1) for e in h["webhook-signature"].split(" ")]

def content(b):
    return f'{h["webhook-id"]}.{h["webhook-timestamp"]}.'.encode() + b

def ed25519_ok(whpk, b):
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(whpk[len("whpk_"):]))
    for version, sig in entries:
        if version != "v1a":
            continue
        raw = base64.b64decode(sig)
        assert len(raw) == 64, f"a v1a signature of {len(raw)} bytes"
        try:
            key.verify(raw, content(b))
            return True
        except InvalidSignature:
            pass
    return False

def hmac_ok(whsec, b):
    key = base64.b64decode(whsec[len("whsec_"):])
    want = base64.b64encode(hmac.new(key, content(b), hashlib.sha256).digest()).decode()
    return any(v == "v1" and hmac.compare_digest(s, want) for v, s in entries)

for whpk in d["public"]:
    assert ed25519_ok(whpk, body), f"no v1a entry verifies with {whpk}"
    assert not ed25519_ok(whpk, tampered), "a changed body verified"
    print("verified v1a", whpk)
for whpk in d["wrong"]:
    assert not ed25519_ok(whpk, body), f"{whpk} verified a signature it never made"
for whsec in d["hmac"]:
    assert hmac_ok(whsec, body) and not hmac_ok(whsec, tampered), "a v1 entry does not verify"
    print("verified v1")
print("entries", " ".join(v for v, _ in entries))
"#;

/// Runs [`PY_VERIFY`] on `seen`; returns its stdout (panics with its output on failure).
async fn python_verifies(py: &str, seen: &Seen, public: &[&str], wrong: &[&str], hmac: &[&str]) -> String {
    let headers: serde_json::Map<String, serde_json::Value> =
        seen.headers.iter().map(|(n, v)| (n.clone(), text(v).into())).collect();
    let input = json!({
        "headers": headers,
        "body_b64": base64::engine::general_purpose::STANDARD.encode(&seen.body),
        "public": public, "wrong": wrong, "hmac": hmac,
    })
    .to_string();
    let py = py.to_string();
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(py);
        cmd.args(["-c", PY_VERIFY]);
        run_with_stdin(cmd, &input)
    })
    .await
    .unwrap();
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "python cryptography refused courier's signature:\n{stdout}\n{}",
        text(&out.stderr)
    );
    stdout
}

/// The verifier, or `None` after [`skip`] (which fails under CI); also the python that
/// runs `examples/receiver.py` with a `whpk_` key (`adoption`).
pub(crate) fn verifier() -> Option<String> {
    let py = ed25519_python();
    if py.is_none() {
        skip("no python with the `cryptography` package (Debian: python3-cryptography)");
    }
    py
}

#[tokio::test]
async fn keys_generate_and_public_print_matching_keys_and_refuse_bad_input() {
    let (secret, public) = generate().await;
    let (other, _) = generate().await;
    assert_ne!(secret, other, "two keys generated alike");
    // The secret as an argument gives the same answer as on stdin.
    let out = courier_cmd(&["keys", "public", &secret], "").await;
    assert_eq!(
        (out.status.code(), text(&out.stdout).trim()),
        (Some(0), public.as_str())
    );
    for bad in [HMAC_SECRET, "whsk_c2hvcnQ=", "not a key at all"] {
        let out = courier_cmd(&["keys", "public"], bad).await;
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{bad}: {out:?}");
        assert_eq!(text(&out.stdout), "", "{bad}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr:?}");
        assert!(stderr.contains("not an Ed25519 secret key"), "{stderr}");
        assert!(!stderr.contains(&bad[6..]), "the input was echoed: {stderr}");
    }
}

#[tokio::test]
async fn whsk_signatures_verify_with_python_cryptography_on_every_attempt() {
    let Some(py) = verifier() else { return };
    let (secret, public) = generate().await;
    let (_, wrong) = generate().await;
    // The first attempt fails, so the retry's fresh timestamp and signature are checked too.
    let rx = Receiver::scripted(|n, _| Reply::status(if n == 0 { 503 } else { 204 })).await;
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), &format!("{FAST_RETRY}[signing]\nsecrets = [\"{secret}\"]\n"));
    let a = post(
        &c.prefixed(&rx.url("/hooks")),
        &[("content-type", "application/json")],
        BODY,
    )
    .await;
    assert_eq!(a.status, 202, "{}", a.text());
    let seen = rx.wait_for(2).await;
    assert_ne!(seen[0].header("webhook-timestamp"), seen[1].header("webhook-timestamp"));
    for attempt in &seen[..2] {
        let signature = attempt.header("webhook-signature").unwrap();
        assert!(signature.starts_with("v1a,") && !signature.contains(' '), "{signature}");
        let out = python_verifies(&py, attempt, &[&public], &[&wrong], &[]).await;
        assert!(out.contains(&format!("verified v1a {public}")), "{out}");
    }
    wait_state(&c, a.json()["id"].as_str().unwrap(), "delivered").await;

    // check-config shows the public key to publish, never the secret.
    let out = courier_cmd(&["check-config", "--config", c.config_path.to_str().unwrap()], "").await;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.contains(&format!("signing.secrets[0] is Ed25519, public key {public}")),
        "{stdout}"
    );
    assert!(!stdout.contains(&secret["whsk_".len()..]), "{stdout}");
}

#[tokio::test]
async fn a_mixed_signing_rotation_list_yields_v1_and_v1a_and_both_verify() {
    let Some(py) = verifier() else { return };
    let (route_key, route_public) = generate().await;
    let (default_key, default_public) = generate().await;
    let rx = Receiver::start().await;
    let d = tempfile::tempdir().unwrap();
    // A named key used by a route (new whsk_ first, old whsec_ second), and default secrets
    // in the other order: each signs, in its configured order, in one header.
    let config = format!(
        "[signing]\nsecrets = [\"{HMAC_SECRET}\", \"{default_key}\"]\n\
         [signing.keys]\nbilling = [\"{route_key}\", \"{HMAC_SECRET}\"]\n\
         [[route]]\nname = \"billing\"\nurl = \"{}\"\nsigning_key = \"billing\"\n",
        rx.url("/billing")
    );
    let c = Courier::start(d.path(), &config);
    let json = [("content-type", "application/json")];
    assert_eq!(
        post(&format!("http://{}/r/billing", c.ingress), &json, BODY)
            .await
            .status,
        202
    );
    assert_eq!(post(&c.prefixed(&rx.url("/default")), &json, BODY).await.status, 202);
    let seen = rx.wait_for(2).await;
    let by_path = |p: &str| seen.iter().find(|s| s.path == p).unwrap().clone();

    let routed = by_path("/billing");
    let out = python_verifies(&py, &routed, &[&route_public], &[&default_public], &[HMAC_SECRET]).await;
    assert!(out.contains("entries v1a v1\n"), "{out}");
    assert!(out.contains("verified v1a") && out.contains("verified v1\n"), "{out}");

    let default = by_path("/default");
    let out = python_verifies(&py, &default, &[&default_public], &[&route_public], &[HMAC_SECRET]).await;
    assert!(out.contains("entries v1 v1a\n"), "{out}");

    // The admin API lists the public keys to publish, never a secret.
    let keys = get(&c.admin_url("/signing/public-keys")).await;
    assert_eq!(keys.status, 200);
    assert_eq!(
        keys.json(),
        json!({"items": [
            {"source": "signing.secrets[1]", "key": null, "public_key": default_public},
            {"source": "signing.keys.billing[0]", "key": "billing", "public_key": route_public},
        ]})
    );
    assert!(!keys.text().contains(&route_key[5..]) && !keys.text().contains("whsec_"));

    // A receiver that knows only HMAC keeps working during the migration: the
    // `standardwebhooks` library skips the v1a entry and verifies the v1 one.
    let hmac_py = std::env::var("COURIER_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let headers: serde_json::Map<String, serde_json::Value> = routed
        .headers
        .iter()
        .map(|(n, v)| (n.clone(), text(v).into()))
        .collect();
    let script = "import json,sys\nfrom standardwebhooks.webhooks import Webhook\nd=json.load(sys.stdin)\n\
                  Webhook(sys.argv[1]).verify(d['body'].encode(), d['headers'])\nprint('verified standardwebhooks')";
    let input = json!({"headers": headers, "body": BODY}).to_string();
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = Command::new(&hmac_py);
        cmd.args(["-c", script, HMAC_SECRET]);
        (hmac_py.clone(), run_with_stdin(cmd, &input))
    })
    .await
    .unwrap();
    match out {
        (_, o) if o.status.success() => assert!(text(&o.stdout).contains("verified standardwebhooks")),
        (py, o) if text(&o.stderr).contains("No module named") => skip(&format!("{py} cannot import standardwebhooks")),
        (_, o) => panic!("standardwebhooks refused a mixed header: {}", text(&o.stderr)),
    }
}

#[tokio::test]
async fn a_replayed_dead_message_is_re_signed_with_the_current_signing_keys() {
    let Some(py) = verifier() else { return };
    let (old_key, old_public) = generate().await;
    let (new_key, new_public) = generate().await;
    // 410 dead-letters at once; the replay is answered 204.
    let rx = Receiver::scripted(|n, _| Reply::status(if n == 0 { 410 } else { 204 })).await;
    let d = tempfile::tempdir().unwrap();
    let mut c = Courier::start(d.path(), &format!("[signing]\nsecrets = [\"{old_key}\"]\n"));
    let a = post(&c.prefixed(&rx.url("/hooks")), &[], BODY).await;
    let id = a.json()["id"].as_str().unwrap().to_string();
    wait_state(&c, &id, "dead").await;
    let first = rx.wait_for(1).await.remove(0);
    python_verifies(&py, &first, &[&old_public], &[&new_public], &[]).await;

    // Rotate: the old key is gone from the config, then the dead message is replayed.
    let config = format!("allow_private_targets = true\n[signing]\nsecrets = [\"{new_key}\"]\n");
    std::fs::write(&c.config_path, config).unwrap();
    c.restart();
    let r = post(&c.admin_url(&format!("/deliveries/{id}/retry")), &[], "").await;
    assert_eq!(r.status, 202, "{}", r.text());
    wait_state(&c, &id, "delivered").await;
    let replay = rx.wait_for(2).await.remove(1);
    assert_eq!(replay.header("webhook-id"), first.header("webhook-id"), "same event id");
    let out = python_verifies(&py, &replay, &[&new_public], &[&old_public], &[]).await;
    assert!(out.contains(&format!("verified v1a {new_public}")), "{out}");
}

#[tokio::test]
async fn bad_ed25519_keys_and_hmac_only_schemes_are_refused_at_config_load_and_ingress() {
    let (key, _) = generate().await;
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("bad.toml");
    let cases = [
        (
            "[signing]\nsecrets = [\"whsk_c2hvcnQ=\"]\n".to_string(),
            "signing.secrets[0] is not an Ed25519 secret key",
        ),
        (
            format!("[signing]\nscheme = \"github\"\nsecrets = [\"{key}\"]\n"),
            "signing.secrets[0] is an Ed25519 key (whsk_), which signs only with the standard scheme",
        ),
    ];
    for (config, want) in &cases {
        std::fs::write(&file, config).unwrap();
        for verb in ["check-config", "serve"] {
            let out = courier_cmd(&[verb, "--config", file.to_str().unwrap()], "").await;
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{verb} {config:?}: {stderr}");
            assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr:?}");
            assert!(stderr.contains(want), "{verb}: {stderr}");
            assert!(!stderr.contains("c2hvcnQ") && !stderr.contains(&key[5..]), "{stderr}");
        }
    }

    let rx = Receiver::start().await;
    let c = Courier::start(d.path(), &format!("[signing.keys]\ned = [\"{key}\"]\n"));
    let target = c.prefixed(&rx.url("/hooks"));
    let refused = [
        (
            vec![("courier-signing-secret", "whsk_c2hvcnQ=")],
            "invalid_signing_secret",
        ),
        (
            vec![
                ("courier-signing-secret", key.as_str()),
                ("courier-signature-scheme", "stripe"),
            ],
            "signing_scheme_mismatch",
        ),
        (
            vec![("courier-signing-key", "ed"), ("courier-signature-scheme", "github")],
            "signing_scheme_mismatch",
        ),
    ];
    for (headers, code) in refused {
        let a = post(&target, &headers, BODY).await;
        assert_eq!((a.status, a.json()["error"].as_str()), (400, Some(code)), "{headers:?}");
        assert!(
            !a.text().contains(&key[5..]) && !a.text().contains("c2hvcnQ"),
            "{}",
            a.text()
        );
    }
    // The same key by name, and inline, with the standard scheme: accepted and signed v1a.
    for header in [("courier-signing-key", "ed"), ("courier-signing-secret", key.as_str())] {
        assert_eq!(post(&target, &[header], BODY).await.status, 202);
    }
    let seen = rx.wait_for(2).await;
    for s in &seen {
        assert!(s.header("webhook-signature").unwrap().starts_with("v1a,"), "{s:?}");
    }
    let listed = get(&c.admin_url("/deliveries")).await.json();
    assert_eq!(
        listed["items"].as_array().unwrap().len(),
        2,
        "a refused message was stored"
    );
}
