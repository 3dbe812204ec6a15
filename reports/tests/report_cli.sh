#!/usr/bin/env bash
# normcheck report on hand-written results files (data/): the Markdown and JSON summaries match
# the reviewed goldens (expected/), the JUnit XML is valid against reports/junit.xsd with the
# expected counts, shards merge, and bad input (another format or version, truncated JSON, a
# summary that disagrees with the cases, a field of the wrong type, a case in two shards, an
# existing output without --force) gives exit 2, a message naming the problem, and no output.
# Usage: report_cli.sh NORMCHECK DATA_DIR EXPECTED_DIR XSD WORK_DIR
set -uo pipefail
nc="$1" data="$2" expected="$3" xsd="$4" work="$5"
rm -rf "$work" && mkdir -p "$work"
fails=0
check() {  # check NAME CONDITION...
  local name="$1"; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}

cd "$data"  # the results files are named relative to it in the reports
inputs=(kernel_a.json mutant_shard1.json mutant_shard2.json prop.json audit.json)
"$nc" report "${inputs[@]}" --markdown "$work/report.md" --summary-json "$work/summary.json" \
  --junit "$work/junit.xml" >"$work/out.txt" 2>"$work/err.txt"
rc=$?
check "report exits 1: an external kernel failed, a property failed, the audit found an error" test "$rc" = 1
check "markdown matches the golden" diff -u "$expected/report.md" "$work/report.md"
check "summary json matches the golden" diff -u "$expected/summary.json" "$work/summary.json"
check "junit valid against junit.xsd" xmllint --noout --schema "$xsd" "$work/junit.xml"
xp() { xmllint --xpath "$1" "$work/junit.xml" 2>/dev/null; }
check "junit totals: 16 tests, 3 failures, 1 error, 2 skipped" \
  test "$(xp 'string(/testsuites/@tests)') $(xp 'string(/testsuites/@failures)') $(xp 'string(/testsuites/@errors)') $(xp 'string(/testsuites/@skipped)')" = "16 3 1 2"
check "junit failure carries the worst element in hex, the diagnosis and the repro" \
  bash -c "xmllint --xpath 'string(//testcase[@name=\"ln_f32_large_mean\"]/failure)' '$work/junit.xml' | grep -q 'got 1.0000057 (0x1.000060p+0).*' && \
           xmllint --xpath 'string(//testcase[@name=\"ln_f32_large_mean\"]/failure)' '$work/junit.xml' | grep -q 'one_pass_variance (class B' && \
           xmllint --xpath 'string(//testcase[@name=\"ln_f32_large_mean\"]/failure)' '$work/junit.xml' | grep -q 'repro: normcheck run --candidate plugin:./libkernel_a.so --fixtures out/smoke.h5 --cases ln_f32_large_mean'"
check "junit: the merged mutant is one suite of 4 cases + 'rejected', all passing" \
  test "$(xp 'string(//testsuite[@name="builtin:mut_eps_dropped (mutant)"]/@tests)') $(xp 'string(//testsuite[@name="builtin:mut_eps_dropped (mutant)"]/@failures)')" = "5 0"
check "junit: the crash is an error with the escaped stderr" \
  bash -c "xmllint --xpath 'string(//testcase[@name=\"rms_f32_backward\"]/error/@message)' '$work/junit.xml' | grep -qF '<kernel_a> bad & \"worse\" | pipe'"

# A mutant that no case caught fails its 'rejected' testcase and the report exits 1.
"$nc" report mutant_shard1.json --junit "$work/one_shard.xml" >/dev/null 2>&1
check "one shard of the mutant: still rejected, exit 0" test $? = 0
/usr/bin/python3 - "$data/mutant_shard1.json" "$work/not_rejected.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["cases"] = [c for c in d["cases"] if c["verdict"] == "PASSED"]
d["summary"]["FAILED"] = 0
json.dump(d, open(sys.argv[2], "w"))
PY
"$nc" report "$work/not_rejected.json" --junit "$work/not_rejected.xml" >/dev/null 2>&1
check "a mutant that passes everything: exit 1" test $? = 1
check "... and its 'rejected' testcase fails" \
  test "$(xmllint --xpath 'count(//testcase[@name="rejected"]/failure)' "$work/not_rejected.xml")" = 1
check "not-rejected junit valid" xmllint --noout --schema "$xsd" "$work/not_rejected.xml"

# Bad input: exit 2, the message names the problem, nothing written.
bad() {  # bad NAME PATTERN ARGS...
  local name="$1" pattern="$2"; shift 2
  rm -f "$work/bad.md" "$work/bad.xml"
  "$nc" report "$@" --markdown "$work/bad.md" --junit "$work/bad.xml" >"$work/bad.out" 2>&1
  local code=$?
  check "$name: exit 2" test "$code" = 2
  check "$name: message" grep -qE "$pattern" "$work/bad.out"
  check "$name: nothing written" test ! -e "$work/bad.md" -a ! -e "$work/bad.xml"
}
bad "another format" 'bad_format.json: not a results file: format is "normcheck-fixtures"' bad_format.json
bad "another version" 'bad_version.json: format_version 2 is not supported' kernel_a.json bad_version.json
bad "truncated JSON" 'bad_truncated.json: not a results file: invalid or truncated JSON' bad_truncated.json
bad "summary against cases" 'bad_summary.json: summary.PASSED: says 2 but the file holds 1 PASSED case' bad_summary.json
bad "wrong field type" 'bad_field.json: cases\[2\]\.outputs\[0\]\.max_ulp: expected a number' bad_field.json
bad "the same case in two files" 'case ln_f32_constant_rows of builtin:mut_eps_dropped is also in' mutant_shard1.json mutant_shard1.json
bad "no such file" 'nope.json: cannot open' nope.json

# --html without the plotting library: exit 2, says how to install it, writes nothing at all.
NORMCHECK_REPORT_WEB_DIR="$work/no_such_dir" "$nc" report kernel_a.json --html "$work/nolib" \
  --markdown "$work/nolib.md" >"$work/nolib.out" 2>&1
check "no plotting library: exit 2" test $? = 2
check "no plotting library: message" grep -q 'the HTML report needs Chart.js.*scripts/install-deps.sh' "$work/nolib.out"
check "no plotting library: nothing written" test ! -e "$work/nolib/index.html" -a ! -e "$work/nolib.md"

# Existing outputs are kept without --force, replaced with it.
echo keep >"$work/exists.md"
"$nc" report kernel_a.json --markdown "$work/exists.md" >"$work/force.out" 2>&1
check "existing output without --force: exit 2" test $? = 2
check "existing output without --force: message" grep -q 'exists; pass --force to replace it' "$work/force.out"
check "existing output without --force: kept" test "$(cat "$work/exists.md")" = keep
"$nc" report kernel_a.json --markdown "$work/exists.md" --force >/dev/null 2>&1
check "with --force: replaced" grep -q '^# normcheck report' "$work/exists.md"
"$nc" report kernel_a.json >"$work/none.out" 2>&1
check "no output asked for: exit 2" test $? = 2
check "no temporary files left" test -z "$(find "$work" -name '*.tmp.*')"

echo "$fails failed"
exit $((fails > 0))
