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
cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DNORMCHECK_WERROR="$werror" -DNORMCHECK_SANITIZE="$([[ $sanitize == 1 ]] && echo ON || echo OFF)" >/dev/null
cmake --build "$build_dir" --parallel "$(nproc)"
echo "build: $build_dir"
