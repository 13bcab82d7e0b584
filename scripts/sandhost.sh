#!/usr/bin/env bash
# Set up (idempotent), build sandhost and its built-in providers, and run
# `sandhost` with the given arguments. The one command a newcomer needs:
#   scripts/sandhost.sh run -- python3 -c 'print("hello from a sandbox")'
# Needs root on Linux (namespaces and cgroups of the local provider).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/scripts/setup.sh" >/dev/null
cargo build --quiet --release --manifest-path "$here/Cargo.toml" \
  -p sandhost-cli -p sandhost-provider-local --bins
exec "$here/target/release/sandhost" "$@"
