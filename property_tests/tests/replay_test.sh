#!/bin/sh
# End to end: a mutant fails a property; its shrunk counterexample is a valid fixture file with
# certified expected values that `normcheck run` rejects for the mutant and passes for a correct
# kernel; the reproduce string replays the failure; the results file says mode prop; bad input
# exits 2. Usage: replay_test.sh NORMCHECK WORKDIR
set -u
nc=$1
dir=$2
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }

mut=builtin:mut_residual_out_missing_bias
"$nc" prop --candidate $mut --properties fused_residual --tests 1000 --seed 1 \
  --save-failures "$dir/cx" --json "$dir/r.json" > "$dir/prop.log" 2>&1
rc=$?
cat "$dir/prop.log"
[ $rc -eq 1 ] || fail "normcheck prop on $mut exited $rc, expected 1"
grep -q '^FAILED *fused_residual' "$dir/prop.log" || fail "no FAILED line for fused_residual"
grep -q '(0x' "$dir/prop.log" || fail "the counterexample is not printed with hex floats"
f=$(ls "$dir"/cx/*.h5)
[ -f "$f" ] || fail "no counterexample file in $dir/cx"
"$nc" fixtures verify "$f" || fail "the counterexample's expected values do not verify"
"$nc" run --candidate $mut --fixtures "$f" > "$dir/run_mut.log" 2>&1
rc=$?
cat "$dir/run_mut.log"
[ $rc -eq 1 ] || fail "normcheck run of the mutant on its counterexample exited $rc, expected 1"
"$nc" run --candidate builtin:cpu_two_pass --fixtures "$f" > "$dir/run_ok.log" 2>&1 ||
  { cat "$dir/run_ok.log"; fail "a correct kernel does not pass the counterexample"; }
/usr/bin/python3 - "$dir/r.json" <<'PY' || fail "results file"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["format"] == "normcheck-results" and j["format_version"] == 1 and j["mode"] == "prop", j
p = j["properties"][0]
assert p["name"] == "fused_residual" and p["verdict"] == "FAILED", p
assert p["counterexample"]["fixture"].endswith(".h5"), p
# The reference rejects this counterexample, so it is diagnosed: the planted fault ranks first.
assert p["diagnosis"] and p["diagnosis"][0]["dialect"] == "residual_out_missing_bias" and p["diagnosis"][0]["explains"], p["diagnosis"]
assert j["summary"]["FAILED"] == 1 and j["summary"]["PASSED"] == 0, j["summary"]
open(sys.argv[1] + ".reproduce", "w").write(p["reproduce"])
PY
repro=$(cat "$dir/r.json.reproduce")
case "$repro" in *--reproduce*) ;; *) fail "no reproduce string: $repro" ;; esac
# The reproduce command replays the shrunk counterexample at once (same failure, exit 1).
eval "\"$nc\" ${repro#normcheck }" > "$dir/repro.log" 2>&1
rc=$?
cat "$dir/repro.log"
[ $rc -eq 1 ] || fail "the reproduce command exited $rc, expected 1"
grep -q '^FAILED *fused_residual' "$dir/repro.log" || fail "the reproduce command did not fail the property"
# The same string against a correct kernel: the case no longer fails, a verdict (exit 0), not an error.
repro_ok=$(printf "%s" "$repro" | sed "s/builtin:mut_residual_out_missing_bias/builtin:cpu_welford/")
eval "\"$nc\" ${repro_ok#normcheck } --json \"$dir/ok.json\"" > "$dir/repro_ok.log" 2>&1
rc=$?
cat "$dir/repro_ok.log"
[ $rc -eq 0 ] || fail "the reproduce command on a correct kernel exited $rc, expected 0"
grep -q '^PASSED *fused_residual *1 tests' "$dir/repro_ok.log" || fail "the reproduce command on a correct kernel did not say the case passes"
# Its one passed test is the slowest: its time and the case it drew, in the results file.
/usr/bin/python3 - "$dir/ok.json" <<'PY' || fail "slowest_test in the results file"
import json, sys
p = json.load(open(sys.argv[1]))["properties"][0]
s = p["slowest_test"]
assert 0 < s["seconds"] <= p["seconds"], p
assert s["case"].split()[0] in ("layernorm", "rmsnorm") and "shape [" in s["case"], s
PY

# Bad input: exit 2 with a message, nothing written.
"$nc" prop --candidate builtin:no_such_kernel > /dev/null 2>&1; [ $? -eq 2 ] || fail "unknown candidate"
"$nc" prop --candidate builtin:cpu_two_pass --properties 'no_such_*' > /dev/null 2>&1; [ $? -eq 2 ] || fail "glob"
"$nc" prop --candidate builtin:cpu_two_pass --tests 1 --json "$dir/r.json" > /dev/null 2>&1
[ $? -eq 2 ] || fail "an existing results file was not refused without --force"
"$nc" prop --candidate builtin:cpu_two_pass --tests 0 > /dev/null 2>&1; [ $? -eq 2 ] || fail "--tests 0"
"$nc" prop --candidate builtin:cpu_two_pass --properties agreement --reproduce garbage > /dev/null 2>&1
[ $? -eq 2 ] || fail "a bad reproduce string"
echo "OK"
