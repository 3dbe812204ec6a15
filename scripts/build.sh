#!/usr/bin/env bash
# Configures and builds normcheck into build/ (or $NORMCHECK_BUILD_DIR). Installs missing
# Debian packages first. CI=true turns warnings into errors; NORMCHECK_SANITIZE=1 builds with
# AddressSanitizer and UndefinedBehaviorSanitizer (default directory build-sanitize/).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/install-deps.sh"

sanitize="${NORMCHECK_SANITIZE:-0}"
default_dir="$root/build"
[[ "$sanitize" == 1 ]] && default_dir="$root/build-sanitize"
build_dir="${NORMCHECK_BUILD_DIR:-$default_dir}"
werror=OFF
[[ "${CI:-}" == "true" ]] && werror=ON

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [[ -f "$build_dir/CMakeCache.txt" ]]; then generator=(); fi  # keep the generator it has
# The sanitizer build runs the smoke tests only: no benchmarks, and -O1 (what the sanitizers'
# documentation recommends): an instrumented translation unit takes 2.7x the time of a plain
# -O2 one to compile, and -O1 cuts that by 29 % (scripts/README.md, "CI time").
extra=()
if [[ "$sanitize" == 1 ]]; then
  extra=(-DNORMCHECK_BUILD_BENCHMARKS=OFF "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG"
         "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG")
fi
cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DNORMCHECK_WERROR="$werror" -DNORMCHECK_SANITIZE="$([[ $sanitize == 1 ]] && echo ON || echo OFF)" \
  "${extra[@]}" >/dev/null
cmake --build "$build_dir" --parallel "$(nproc)"
echo "build: $build_dir"
