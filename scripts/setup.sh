#!/usr/bin/env bash
# Idempotent set-up of everything sandhost's build and tests need on a fresh
# Debian 12 machine (run as root). Safe to run again: it only installs what is
# missing. Usage: scripts/setup.sh
set -euo pipefail

need_pkgs=()
want() { # want CMD PACKAGE: queue PACKAGE when CMD is missing
  command -v "$1" >/dev/null 2>&1 || need_pkgs+=("$2")
}
want python3 python3
want bwrap bubblewrap            # the local provider's benchmark baseline
want busybox busybox-static      # tools inside test rootfs images
want cc gcc                      # crates that build C (rusqlite bundled)

if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "setup: installing ${need_pkgs[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

command -v cargo >/dev/null || { echo "setup: cargo not found (install the Rust toolchain with rustup)" >&2; exit 1; }
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt >/dev/null 2>&1 || true
echo "setup: ok" >&2
