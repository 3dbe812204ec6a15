#!/usr/bin/env bash
# Builds normcheck and runs every test (ctest). Under CI=true it also builds with the address
# and undefined-behaviour sanitizers and runs the smoke tests there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh"
build_dir="${NORMCHECK_BUILD_DIR:-$root/build}"
ctest --test-dir "$build_dir" --output-on-failure --parallel "$(nproc)" \
      --output-junit "$build_dir/ctest-junit.xml"

if [[ "${CI:-}" == "true" || "${NORMCHECK_TEST_SANITIZE:-0}" == 1 ]]; then
  echo "--- sanitizer build (address, undefined): smoke tests"
  NORMCHECK_SANITIZE=1 NORMCHECK_BUILD_DIR="$root/build-sanitize" "$root/scripts/build.sh"
  ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp:print_suppressions=0" \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$root/build-sanitize" --output-on-failure --parallel "$(nproc)" -L smoke
fi
