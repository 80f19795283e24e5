#!/usr/bin/env bash
# Builds courier (release) and runs it on its embedded defaults:
# ingress 127.0.0.1:8787, admin 127.0.0.1:8788, data in ./courier-data.
# Extra arguments go to `courier serve` (e.g. --config courier.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec cargo run --release --locked --bin courier -- serve "$@"
