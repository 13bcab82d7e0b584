#!/usr/bin/env bash
# Build every cargo-fuzz target in fuzz/ and run each one briefly.
#
# Usage: scripts/fuzz.sh [SECONDS]
#   SECONDS  time budget per target (default: $SANDHOST_FUZZ_SECONDS, else 20);
#            0 builds the targets without running them.
#   FUZZ_TARGETS="template_parser scenario_parser" limits the run to those targets.
#
# Works with the stable toolchain only: cargo-fuzz passes nightly-only flags
# (-Zsanitizer=address, -Cpasses=sancov-module, ...) that RUSTC_BOOTSTRAP=1
# unlocks on stable. Idempotent: installs cargo-fuzz (from crates.io) and a C++
# compiler for libFuzzer only when they are missing; the corpus in
# fuzz/corpus/<target> grows across runs and is seeded from the repository's
# fixtures and examples. A crash leaves its input in fuzz/artifacts/<target>/
# and makes the script exit 1 after the remaining targets ran.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

secs="${1:-${SANDHOST_FUZZ_SECONDS:-20}}"
case "$secs" in
  '' | *[!0-9]*) echo "fuzz: SECONDS must be a whole number, got '$secs'" >&2; exit 2 ;;
esac

export PATH="$HOME/.cargo/bin:$PATH"
command -v cargo >/dev/null || { echo "fuzz: cargo not found (install the Rust toolchain with rustup)" >&2; exit 1; }

# libfuzzer-sys compiles libFuzzer, which is C++.
if ! command -v c++ >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1 && ! command -v clang++ >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "fuzz: installing g++ (libFuzzer is C++)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq g++ >/dev/null
  else
    echo "fuzz: a C++ compiler is needed (apt-get install g++)" >&2
    exit 1
  fi
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked
fi

# Nightly flags on the stable compiler, for this script's cargo invocations only.
export RUSTC_BOOTSTRAP=1
# The fuzz crate is its own workspace and builds into fuzz/target.
unset CARGO_TARGET_DIR CARGO_BUILD_TARGET_DIR

cd "$root/fuzz"
all_targets="$(cargo fuzz list)"
targets="${FUZZ_TARGETS:-$all_targets}"
for t in $targets; do
  grep -qx "$t" <<<"$all_targets" || { echo "fuzz: no target '$t' (have: $(echo $all_targets))" >&2; exit 2; }
done

echo "== cargo fuzz build ($(echo $targets))" >&2
for t in $targets; do
  cargo fuzz build "$t"
done
[ "$secs" = 0 ] && { echo "fuzz: built; not running (SECONDS=0)" >&2; exit 0; }

# seeds: the fixtures and examples each parser is meant for
seeds_for() {
  case "$1" in
    template_parser)
      ls "$root"/crates/contract/tests/fixtures/templates/*.yaml "$root"/examples/templates/*.yaml ;;
    manifest_parser)
      ls "$root"/crates/contract/tests/fixtures/*plugin*.json "$root"/examples/*/plugin.json \
        "$root"/providers/*/plugin.json ;;
    scenario_parser)
      ls "$root"/crates/contract/tests/fixtures/*scenario*.json "$root"/examples/scenarios/*.json ;;
  esac 2>/dev/null || true
}
dict_for() {
  case "$1" in
    template_parser) echo "$root/fuzz/dict/template.dict" ;;
    manifest_parser | scenario_parser) echo "$root/fuzz/dict/json.dict" ;;
  esac
}

failed=()
for t in $targets; do
  corpus="$root/fuzz/corpus/$t"
  mkdir -p "$corpus"
  for f in $(seeds_for "$t"); do
    [ -e "$corpus/seed-$(basename "$f")" ] || cp "$f" "$corpus/seed-$(basename "$f")"
  done
  args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
  dict="$(dict_for "$t")"
  [ -n "$dict" ] && [ -f "$dict" ] && args+=(-dict="$dict")
  echo "== cargo fuzz run $t (${secs}s)" >&2
  if ! cargo fuzz run "$t" "$corpus" -- "${args[@]}"; then
    failed+=("$t")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (inputs in fuzz/artifacts/<target>/; replay with: cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run <target> <artifact>)" >&2
  exit 1
fi
echo "fuzz: ok ($(echo $targets), ${secs}s each)" >&2
