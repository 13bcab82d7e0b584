#!/usr/bin/env bash
# The whole test suite, as CI runs it: set-up (packages, a started dockerd
# and its test image), format check, clippy with warnings denied, every test
# target (the local provider's need root, the Docker provider's the engine),
# then a short run of every fuzz target.
# Usage: scripts/test.sh            (SANDHOST_FUZZ_SECONDS=N to change the fuzz budget; 0 skips running them but still builds them)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
echo "== docker engine and test image (the Docker provider's tests use them)"
scripts/docker.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo build (binaries the CLI tests run)"
cargo build --workspace --bins --locked
echo "== cargo test"
cargo test --workspace --locked --no-fail-fast 2>&1 | tee target/test-output.txt
echo "== fuzz targets"
scripts/fuzz.sh "${SANDHOST_FUZZ_SECONDS:-15}"
echo "== summary"
passed=$(grep -Eo '^test result: ok\. [0-9]+ passed' target/test-output.txt | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' target/test-output.txt | awk '{s+=$1} END {print s+0}')
echo "sandhost: ${passed} passed, ${failed} failed"
