#!/usr/bin/env bash
# Host tools used by the local provider's tests and bench (Debian/Ubuntu).
# The tests use the host's /usr (sh, coreutils, perl, bash) bound read-only
# inside the sandbox; the bench compares against bubblewrap.
set -euo pipefail
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v perl >/dev/null || need+=(perl-base)
command -v bash >/dev/null || need+=(bash)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
