#!/usr/bin/env bash
# The main job: build, generate the smoke tier's golden fixtures with the certified reference,
# verify them, and show the bundled example cases. (Checking the bundled candidates and writing
# the report join this job as the conformance and reports issues land.)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh"
build_dir="${NORMCHECK_BUILD_DIR:-$root/build}"
normcheck="$build_dir/bin/normcheck"
out="${NORMCHECK_OUT:-$root/out}"
mkdir -p "$out"
"$normcheck" version
echo
"$normcheck" fixtures generate --tier smoke -o "$out/smoke.h5" --force
"$normcheck" fixtures verify "$out/smoke.h5"
for case in "$root"/reference/examples/*.json; do
  echo
  echo "=== $(basename "$case")"
  "$normcheck" reference --case "$case"
done
echo
echo "golden fixtures: $out/smoke.h5  (normcheck fixtures list $out/smoke.h5)"
