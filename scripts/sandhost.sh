#!/usr/bin/env bash
# Set up (idempotent), build sandhost and its built-in providers (local,
# docker), and run `sandhost` with the given arguments. The one command a
# newcomer needs:
#   scripts/sandhost.sh run -- python3 -c 'print("hello from a sandbox")'
# Needs root on Linux (namespaces and cgroups of the local provider).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# the set-up speaks only when it fails: stderr belongs to the command
if ! setup_log=$("$here/scripts/setup.sh" 2>&1); then
  printf '%s\n' "$setup_log" >&2
  exit 125
fi
cargo build --quiet --release --manifest-path "$here/Cargo.toml" \
  -p sandhost-cli -p sandhost-provider-local -p sandhost-provider-docker --bins
exec "$here/target/release/sandhost" "$@"
