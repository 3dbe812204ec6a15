#!/usr/bin/env bash
# --isolate: a crash or a hang in a plugin becomes CRASHED / TIMEOUT for that case, with a repro
# line, and the run goes on; in process, the crash kills normcheck but the journal keeps the
# cases checked before it and no results file is left half-written.
set -uo pipefail
# $5: the smoke tier ctest shares among the tests (read only); generated here without it.
normcheck="$1" segv="$2" hang="$3" python="$4"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failed=0
bad() { failed=$((failed + 1)); echo "FAIL $*"; }
smoke="${5:-$tmp/smoke.h5}"
if [[ -z "${5:-}" ]]; then
  "$normcheck" fixtures generate --tier smoke -o "$smoke" >/dev/null || exit 1
fi
cases=(--cases 'ln_f32_*')  # the bad plugins take float32 LayerNorm forward

count() {  # count FILE VERDICT
  "$python" -c "import json,sys; print(json.load(open(sys.argv[1]))['summary'][sys.argv[2]])" "$1" "$2"
}

"$normcheck" run --candidate "plugin:$segv" --isolate --fixtures "$smoke" "${cases[@]}" \
  --json "$tmp/segv.json" >"$tmp/out" 2>&1
code=$?
[[ $code -eq 1 ]] || bad "isolated segfault: exit $code (want 1)"
# Each fresh worker crashes on its own second case: crashes alternate with checked cases.
[[ "$(count "$tmp/segv.json" CRASHED)" -ge 1 && "$(count "$tmp/segv.json" FAILED)" -ge 2 ]] ||
  bad "isolated segfault: want CRASHED cases and checked cases after them"
# Under AddressSanitizer the child reports the SEGV itself and exits 1; the message quotes it.
grep -Eq "SIGSEGV|SEGV on unknown address" "$tmp/out" || bad "isolated segfault: signal not named"
grep -q "repro: normcheck run" "$tmp/out" || bad "isolated segfault: no repro line"
total=$("$python" -c "import json,sys; print(len(json.load(open(sys.argv[1]))['cases']))" "$tmp/segv.json")
[[ $total -ge 3 ]] || bad "isolated segfault: the run did not go on ($total cases)"

"$normcheck" run --candidate "plugin:$hang" --isolate --timeout 2 --fixtures "$smoke" "${cases[@]}" \
  --json "$tmp/hang.json" >"$tmp/out" 2>&1
code=$?
[[ $code -eq 1 ]] || bad "isolated hang: exit $code (want 1)"
[[ "$(count "$tmp/hang.json" TIMEOUT)" -ge 1 && "$(count "$tmp/hang.json" FAILED)" -ge 2 ]] ||
  bad "isolated hang: want TIMEOUT cases and checked cases after them"

# A host killed without a chance to stop its worker (SIGKILL, a cancelled CI job) leaves the
# worker inside a kernel that never returns: the worker notices it was orphaned and exits.
children_of() {  # the pids whose parent is $1 (from /proc: no procps needed)
  local stat pid ppid
  for stat in /proc/[0-9]*/stat; do
    read -r pid _ _ ppid _ <"$stat" 2>/dev/null || continue
    [[ "$ppid" == "$1" ]] && echo "$pid"
  done
}
"$normcheck" run --candidate "plugin:$hang" --isolate --timeout 300 --fixtures "$smoke" "${cases[@]}" \
  >"$tmp/orphan.out" 2>&1 &
host=$!
worker=""
for _ in $(seq 100); do
  worker=$(children_of "$host" | head -1)
  [[ -n "$worker" ]] && break
  sleep 0.1
done
if [[ -z "$worker" ]]; then
  bad "orphaned worker: the host started none"
else
  sleep 3  # the first case is checked; the worker hangs in the second
  kill -9 "$host"
  wait "$host" 2>/dev/null
  for _ in $(seq 50); do
    kill -0 "$worker" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$worker" 2>/dev/null; then
    bad "orphaned worker: still running 5 s after its host was killed"
    kill -9 "$worker" 2>/dev/null
  fi
fi

"$normcheck" run --candidate "plugin:$segv" --fixtures "$smoke" "${cases[@]}" \
  --json "$tmp/inproc.json" >"$tmp/out" 2>&1
code=$?
[[ $code -ge 128 ]] || { [[ $code -ne 0 ]] && grep -q "AddressSanitizer: SEGV" "$tmp/out"; } ||
  bad "in-process segfault: exit $code (want death by signal)"
[[ ! -e "$tmp/inproc.json" ]] || bad "in-process segfault: a results file was written"
[[ -s "$tmp/inproc.json.partial.jsonl" ]] || bad "in-process segfault: no journal"
lines=$(wc -l <"$tmp/inproc.json.partial.jsonl")
[[ $lines -eq 1 ]] || bad "in-process segfault: journal has $lines lines (want the 1 case before the crash)"
# The plugin sees the fixture case id (nc_case.case_id), in process and through the worker.
for iso in "" --isolate; do
  "$normcheck" run --candidate "plugin:$(dirname "$segv")/libbad_plugin_run_error.so" $iso --fixtures "$smoke" \
    --cases ln_f32_normal >"$tmp/out" 2>&1
  grep -q "in case 'ln_f32_normal'" "$tmp/out" || bad "case id not passed to the plugin ${iso:-in process}"
done
# A plugin that declares itself an intended mutant (NC_CAP_INTENDED_MUTANT) is reported as a
# mutant, in process and through the worker: --expect-reject passes when it is rejected.
for iso in "" --isolate; do
  "$normcheck" run --candidate "plugin:$(dirname "$segv")/libbad_plugin_intended_mutant.so" $iso --expect-reject \
    --fixtures "$smoke" "${cases[@]}" >"$tmp/out" 2>&1
  code=$?
  [[ $code -eq 0 ]] && grep -q "mutant .*rejected (as it must be)" "$tmp/out" ||
    bad "intended mutant ${iso:-in process}: exit $code, $(tail -2 "$tmp/out")"
done
echo "isolate: $failed failures"
[[ $failed -eq 0 ]]
