#!/usr/bin/env bash
# The whole test suite: Rust unit and integration tests, then the Python tests that check
# Quarry's results against DuckDB through the `quarry` binary. One build profile (`ci`) serves
# both, so dependencies compile once.
set -euo pipefail
cd "$(dirname "$0")/.."

# The `ci` profile (see Cargo.toml) trades run-time speed for a much shorter clean build.
cargo build --profile ci --locked --bin quarry
# Each fuzz target (crates/quarry-flight/tests/flight.rs, `mod fuzz`) runs 60 s in CI, and the
# fault simulation (crates/quarry-flight/tests/fault_sim) 10,000 seeds (about 90 s). The Python
# package (python/) is built and tested by pip in tests/python/test_python_package.py.
QUARRY_FUZZ_SECONDS="${QUARRY_FUZZ_SECONDS:-60}" QUARRY_SIM_SEEDS="${QUARRY_SIM_SEEDS:-10000}" \
    cargo test --profile ci --locked --workspace --exclude quarry-python

python3 -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
export QUARRY_BIN="${CARGO_TARGET_DIR:-$PWD/target}/ci/quarry"
python3 -m pytest tests/python -q -p no:cacheprovider
