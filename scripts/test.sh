#!/usr/bin/env bash
# Runs every test: unit, component and black-box integration tests (one debug build),
# the examples' build, the deployment files' validators and a smoke run of the benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# Third-party signature verifiers for tests/it/adoption.rs (kept under the target folder).
. ./scripts/verifiers.sh
cargo test --locked --all-targets
# The debug binary just built, so check-config and the run checks use this tree's courier.
COURIER_BIN="${CARGO_TARGET_DIR:-target}/debug/courier" bash deploy/validate.sh
# The benchmark at tiny scale (debug binaries, a few seconds): it still runs every scenario
# end to end and fails if one breaks; it asserts nothing about speed.
cargo run --locked --example loadgen -- --smoke --json "${CARGO_TARGET_DIR:-target}/bench-smoke.json"
# The sealing scenario, which the full run leaves out (about 15 s).
cargo run --locked --example loadgen -- --smoke --seal-only --json "${CARGO_TARGET_DIR:-target}/bench-smoke-seal.json"
# Courier against baseline (g), one pair at tiny scale, which the full run leaves out.
cargo run --locked --example loadgen -- --smoke --floor-only --json "${CARGO_TARGET_DIR:-target}/bench-smoke-floor.json"
