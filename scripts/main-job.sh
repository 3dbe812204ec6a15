#!/usr/bin/env bash
# The main job: build, then evaluate the bundled example cases with the certified reference and
# print their golden outputs. (Fixture generation, the bundled candidates and the report join
# this job as the fixtures and conformance issues land.)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh"
build_dir="${NORMCHECK_BUILD_DIR:-$root/build}"
normcheck="$build_dir/bin/normcheck"
"$normcheck" version
for case in "$root"/reference/examples/*.json; do
  echo
  echo "=== $(basename "$case"): $(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("description",""))' "$case" 2>/dev/null || true)"
  "$normcheck" reference --case "$case"
done
