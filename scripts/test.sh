#!/usr/bin/env bash
# Runs every test: unit, component and black-box integration tests (one debug build),
# the examples' build, and the deployment files' validators.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo test --locked --all-targets
bash deploy/validate.sh
