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
# The sanitizer build runs the smoke tests only: no benchmarks, its libraries and plugins at -O1
# (what the sanitizers' documentation recommends) and its executables (the CLI, the test
# programs: argument parsing and test bodies, not the numerical code) at -O0, set by
# cmake/NormcheckWarnings.cmake: an instrumented unit at -O1 takes 2.7x the time of a plain -O2
# one to compile, at -O0 about as long as the plain one (scripts/README.md, "CI time").
# Both builds keep line tables only (-g1): backtraces and sanitizer reports still name file:line,
# and full debug info costs a third of a heavy unit's compile (scripts/README.md, "CI time");
# configure by hand for a debugger's full -g.
extra=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
if [[ "$sanitize" == 1 ]]; then
  extra=(-DNORMCHECK_BUILD_BENCHMARKS=OFF "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
         "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
fi
# ccache, when installed (install-deps.sh installs it; NORMCHECK_CCACHE=0 turns it off): a build
# of the same sources with the same flags in another clone or folder (CI's fresh clone after a
# developer's build, a worktree) takes its objects from the cache. base_dir makes the paths
# inside the checkout relative, so the clone's location does not change what is hashed;
# hash_dir=false leaves the build folder out of the hash too (the line tables of a reused
# object name the folder it was first compiled in). A flag or a -D that names an absolute path
# (NORMCHECK_CASES_DIR) still differs between clones, so those units are compiled anew: a hit
# needs the same preprocessed source and the same command line.
launcher=()
if [[ "${NORMCHECK_CCACHE:-1}" == 1 ]] && command -v ccache >/dev/null; then
  cc="/usr/bin/env;CCACHE_BASEDIR=$root;CCACHE_NOHASHDIR=true;ccache"
  launcher=("-DCMAKE_C_COMPILER_LAUNCHER=$cc" "-DCMAKE_CXX_COMPILER_LAUNCHER=$cc")
else
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER= -DCMAKE_CXX_COMPILER_LAUNCHER=)
fi
cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
  -DNORMCHECK_WERROR="$werror" -DNORMCHECK_SANITIZE="$([[ $sanitize == 1 ]] && echo ON || echo OFF)" \
  "${extra[@]}" >/dev/null
cmake --build "$build_dir" --parallel "$(nproc)"
echo "build: $build_dir"
