#!/usr/bin/env bash
# The main job: build, generate the smoke tier's golden fixtures with the certified reference,
# verify them, run every bundled candidate over them (the correct kernels must conform, every
# mutant must be rejected) and print the verdict tables; the results files (normcheck-results v1)
# go to $out/results/. It ends by writing the report of every candidate (HTML, Markdown, JUnit)
# to $out/report/ and printing its path.
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
echo
echo "=== correct candidates (each must conform: no FAILED, CRASHED, TIMEOUT or MISSING)"
"$normcheck" run --builtins correct --fixtures "$out/smoke.h5" --json-dir "$out/results" --force
echo
echo "=== mutants (each must be rejected: the suite's own mutation test)"
"$normcheck" run --builtins mutants --expect-reject --fixtures "$out/smoke.h5" --json-dir "$out/results" --force
echo
echo "=== real libraries held to their recorded findings: each failure must be one (conformance/candidates/ggml/)"
# --allow-empty: where ggml is not installed, there is no Vulkan device or (ggml-cuda) no NVIDIA
# GPU, every case is UNSUPPORTED with the reason; a failure that is no recorded finding still
# fails the job.
"$normcheck" run --candidate builtin:ggml-cpu --candidate builtin:ggml-vulkan --candidate builtin:ggml-cuda \
  --fixtures "$out/smoke.h5" \
  --known-findings "$root/conformance/candidates/ggml/known_findings.json" --allow-empty \
  --json-dir "$out/results" --force
echo
echo "=== oneDNN without its flush-to-zero declaration, held to its recorded finding (conformance/candidates/onednn/)"
# Under its declaration oneDNN conforms (the correct candidates above); judged without it, its
# flushed bfloat16 subnormals FAIL: a known finding. Where oneDNN is not built, builtin:onednn
# does not exist and the step says so. (The list is read whole first: under pipefail,
# `candidates | grep -q` fails when grep stops at the match and normcheck gets SIGPIPE.)
candidates=$("$normcheck" candidates)
if grep -q "builtin:onednn" <<<"$candidates"; then
  "$normcheck" fixtures generate --cases "$root/docs/findings/onednn-bf16-flush.json" -o "$out/onednn-bf16-flush.h5" --force
  "$normcheck" run --candidate builtin:onednn --fixtures "$out/onednn-bf16-flush.h5" --ignore-flush-declaration \
    --known-findings "$root/conformance/candidates/onednn/known_findings.json" \
    --json "$out/results/builtin_onednn_without_flush_declaration.json" --force
else
  echo "builtin:onednn is not built (no oneDNN): nothing to run"
fi
echo
echo "golden fixtures: $out/smoke.h5  (normcheck fixtures list $out/smoke.h5)"
echo "results files:   $out/results/  (reports/RESULTS.md)"
echo
echo "=== report (reports/README.md): every bundled candidate, correct ones, mutants and real libraries"
"$normcheck" report "$out"/results/*.json --html "$out/report" --markdown "$out/report/summary.md" \
  --junit "$out/report/junit.xml" --force
echo "report:          $out/report/index.html  (summary.md, junit.xml beside it)"
