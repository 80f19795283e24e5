# Sourced by scripts/test.sh: installs the third-party signature verifiers that
# tests/it/adoption.rs and tests/it/signing_ed25519.rs check courier's outgoing signatures
# with, and exports where they are:
#   COURIER_TEST_PYTHON          a python with standardwebhooks, svix and stripe
#   NODE_PATH                    a node_modules folder with @octokit/webhooks-methods
#   COURIER_TEST_ED25519_PYTHON  a python with Debian's python3-cryptography, which
#                                tests/it/signing_ed25519.rs verifies v1a signatures with
#   COURIER_TEST_CHROMIUM        Debian's chromium, which tests/it/ui.rs opens the web view
#                                in, driven by playwright-core (also under NODE_PATH)
#   COURIER_TEST_TINYPROXY       Debian's tinyproxy, the real egress proxy tests/it/proxy.rs
#                                starts on loopback (in the foreground, its own config)
#   COURIER_TEST_REDIS_SERVER    Debian's redis-server, which tests/it/fleet.rs starts on
#                                loopback ports for the fleet-wide limits
#   COURIER_TEST_POWERCUT        powercut (tests/powercut, built here), the FUSE filesystem
#                                that tests/it/power_loss.rs cuts the power under
#   COURIER_TEST_GO              Debian's go (golang-go), whose net/http sends through
#                                courier's interception in tests/it/intercept.rs (as do
#                                requests in COURIER_TEST_PYTHON and undici under NODE_PATH)
#   COURIER_TEST_JAVA            Debian's java (default-jdk-headless: javac and keytool too),
#                                whose default trust manager tests/it/intercept_ca.rs checks
#                                the intercept CA's name constraints with
#   COURIER_TEST_REQUIRE_VERIFIERS=1   so the tests fail instead of skipping when a tool (or,
#                                for the full-disk test, the right to mount a tmpfs) is missing
# They live in the cargo target folder, never in the repository, and are installed only when
# missing, so a second run costs a few import checks.
# shellcheck shell=bash

verifiers_dir="${CARGO_TARGET_DIR:-$PWD/target}/verifiers"
mkdir -p "$verifiers_dir"

pyenv="$verifiers_dir/pyenv"
if ! "$pyenv/bin/python" -c 'import standardwebhooks, stripe, svix, requests' 2>/dev/null; then
  echo "verifiers: installing standardwebhooks, svix and stripe into $pyenv" >&2
  # Debian's python3 needs python3-venv for `-m venv` (ensurepip).
  if ! python3 -m venv --clear "$pyenv" >/dev/null 2>&1; then
    apt-get install -y -qq python3-venv >/dev/null 2>&1 ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; }
    python3 -m venv --clear "$pyenv"
  fi
  # svix is the second Standard Webhooks verifier: required like the others (a failed
  # install stops the run here, and the test fails without it under CI).
  "$pyenv/bin/pip" install --quiet --disable-pip-version-check 'standardwebhooks>=1,<2' 'svix>=1' 'stripe>=7' 'requests>=2'
fi

# Ed25519 (v1a): `cryptography` from Debian's package, run by Debian's own interpreter (a
# python3 earlier on PATH, such as pyenv's, does not see Debian's packages).
ed25519_python=/usr/bin/python3
ed25519_import='from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey'
if ! "$ed25519_python" -c "$ed25519_import" 2>/dev/null; then
  echo "verifiers: installing python3-cryptography" >&2
  apt-get install -y -qq python3-cryptography >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-cryptography >/dev/null; }
  "$ed25519_python" -c "$ed25519_import"
fi

# The egress proxy for tests/it/proxy.rs. Only the binary is used: the package's service
# is not started here (no init system), and the tests run their own instance on loopback.
if ! command -v tinyproxy >/dev/null; then
  echo "verifiers: installing tinyproxy" >&2
  apt-get install -y -qq tinyproxy >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tinyproxy >/dev/null; }
fi

# A slow disk for tests/it/ingress_limits.rs: strace delays courier's fsync calls.
if ! command -v strace >/dev/null; then
  echo "verifiers: installing strace" >&2
  apt-get install -y -qq strace >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace >/dev/null; }
fi

# Fleet-wide limits (tests/it/fleet.rs): a real redis-server, started by the tests themselves
# on free loopback ports (the package's own service is not used).
redis_server=/usr/bin/redis-server
if [[ ! -x "$redis_server" ]]; then
  echo "verifiers: installing redis-server" >&2
  apt-get install -y -qq redis-server >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
  "$redis_server" --version >/dev/null
fi

# Power loss (tests/it/power_loss.rs): powercut, the FUSE filesystem in tests/powercut that
# drops unsynced writes on a cut. Its own small crate and target folder, so fuser never
# enters courier's build. As root it mounts through the mount syscall and /dev/fuse;
# Debian's fuse3 brings fusermount3 for anyone else.
if ! command -v fusermount3 >/dev/null; then
  echo "verifiers: installing fuse3" >&2
  apt-get install -y -qq fuse3 >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 >/dev/null; }
fi
cargo build --quiet --release --locked --manifest-path tests/powercut/Cargo.toml \
  --target-dir "$verifiers_dir/powercut-target"

node_dir="$verifiers_dir/node"
if ! command -v node >/dev/null; then
  apt-get install -y -qq nodejs npm >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; }
fi
if [[ ! -f "$node_dir/node_modules/@octokit/webhooks-methods/package.json" ]]; then
  echo "verifiers: installing @octokit/webhooks-methods into $node_dir" >&2
  npm install --prefix "$node_dir" --no-audit --no-fund --silent '@octokit/webhooks-methods@^6'
fi

# The web view's browser test: Debian's chromium, driven by playwright-core. The version is
# pinned (tests/it/ui_browser.cjs is written against its API); another one is replaced.
chromium=/usr/bin/chromium
if [[ ! -x "$chromium" ]]; then
  echo "verifiers: installing chromium" >&2
  apt-get install -y -qq chromium >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
fi
playwright_version=1.65.1
playwright_json="$node_dir/node_modules/playwright-core/package.json"
if [[ "$(node -p "require('$playwright_json').version" 2>/dev/null)" != "$playwright_version" ]]; then
  echo "verifiers: installing playwright-core@$playwright_version into $node_dir" >&2
  npm install --prefix "$node_dir" --no-audit --no-fund --silent --save-exact "playwright-core@$playwright_version"
fi

# HTTPS interception (tests/it/intercept.rs): Go's net/http from Debian, and undici (its
# ProxyAgent; Node 20's built-in fetch has no proxy support) from npm.
go_bin=/usr/bin/go
if [[ ! -x "$go_bin" ]]; then
  echo "verifiers: installing golang-go" >&2
  apt-get install -y -qq golang-go >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null; }
  "$go_bin" version >/dev/null
fi
# Java's default trust manager skips a trust anchor's name constraints: the one client that
# tells a constrained intermediate from a constrained root. Source-file mode, so no build.
java_bin=/usr/bin/java
if [[ ! -x "$java_bin" || ! -x /usr/bin/javac ]]; then
  echo "verifiers: installing default-jdk-headless" >&2
  apt-get install -y -qq default-jdk-headless >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jdk-headless >/dev/null; }
  "$java_bin" -version 2>/dev/null
fi
if [[ ! -f "$node_dir/node_modules/undici/package.json" ]]; then
  echo "verifiers: installing undici into $node_dir" >&2
  npm install --prefix "$node_dir" --no-audit --no-fund --silent 'undici@^6'
fi

export COURIER_TEST_PYTHON="$pyenv/bin/python"
export COURIER_TEST_GO="$go_bin"
export COURIER_TEST_JAVA="$java_bin"
export COURIER_TEST_ED25519_PYTHON="$ed25519_python"
export COURIER_TEST_CHROMIUM="$chromium"
COURIER_TEST_TINYPROXY="$(command -v tinyproxy)"
export COURIER_TEST_TINYPROXY
export COURIER_TEST_REDIS_SERVER="$redis_server"
export COURIER_TEST_POWERCUT="$verifiers_dir/powercut-target/release/powercut"
export NODE_PATH="$node_dir/node_modules${NODE_PATH:+:$NODE_PATH}"
export COURIER_TEST_REQUIRE_VERIFIERS=1
