#!/usr/bin/env bash
# The HTML report in headless Chromium: for the hand-written results files (every mode) and for
# a real run on the smoke tier (a correct kernel and the one-pass-variance mutant), the page
# draws every candidate's plots (the page's self-test, #selftest, draws each in turn and checks
# that each canvas has pixels), logs no script or console error, and fetches nothing (a page
# that tried would fail: --disable-background-networking, no network in the test). A screenshot
# of each is kept under WORK_DIR as the test's artifact.
# Usage: html_chromium.sh NORMCHECK DATA_DIR SMOKE_FIXTURES XSD WORK_DIR
set -uo pipefail
nc="$1" data="$2" smoke="$3" xsd="$4" work="$5"
rm -rf "$work" && mkdir -p "$work"
source "$(dirname "$0")/chromium_common.sh"

page() {  # page NAME HTML_DIR EXPECTED_MIN_PLOTS
  local name="$1" dir="$2" min="$3"
  check "$name: one file, no external URL" \
    bash -c "test \"\$(ls '$dir')\" = index.html && ! grep -qE '<(script|link|img)[^>]+(src|href)=' '$dir/index.html'"
  timeout 90 "$browser" "${flags[@]}" --enable-logging=stderr --v=0 --dump-dom "file://$dir/index.html#selftest" \
    >"$work/$name.dom.html" 2>"$work/$name.chromium.log"
  check "$name: chromium ran" test -s "$work/$name.dom.html"
  local status
  status="$(grep -o '<p id="nc-status"[^>]*>[^<]*' "$work/$name.dom.html")"
  echo "     $status"
  check "$name: page check ok" grep -q 'data-status="ok"' <<<"$status"
  check "$name: no script or console errors" grep -q 'data-errors="0"' <<<"$status"
  check "$name: no blank plot" grep -q 'data-blank="0"' <<<"$status"
  local plots
  plots="$(sed -n 's/.*data-charts="\([0-9]*\)".*/\1/p' <<<"$status")"
  check "$name: at least $min plots drawn ($plots)" test "${plots:-0}" -ge "$min"
  check "$name: no console error in chromium's log" \
    bash -c "! grep -E 'CONSOLE|Uncaught' '$work/$name.chromium.log' | grep -v 'dbus' | grep -q ."
  timeout 90 "$browser" "${flags[@]}" --hide-scrollbars --window-size=1400,3000 \
    --screenshot="$work/$name.png" "file://$dir/index.html" >/dev/null 2>&1
  check "$name: screenshot kept ($work/$name.png)" test -s "$work/$name.png"
}

# The hand-written results files: every mode, the merge of two shards.
(cd "$data" && "$nc" report kernel_a.json mutant_shard1.json mutant_shard2.json prop.json audit.json \
   --html "$work/inputs" >/dev/null)
check "report --html on the test inputs" test -s "$work/inputs/index.html"
page inputs "$work/inputs" 4

# A real run: the report flags of `run`, on the smoke tier.
"$nc" run --candidate builtin:cpu_welford --candidate builtin:mut_one_pass_variance --fixtures "$smoke" \
  --html "$work/run" --junit "$work/run.xml" >"$work/run.out" 2>&1
check "run --html --junit: exit 1 (the mutant is rejected; the correct kernel conforms)" test $? = 1
check "run: the correct kernel conforms" grep -qE "builtin:cpu_welford +correct .* conforms" "$work/run.out"
check "run --junit: valid against junit.xsd" xmllint --noout --schema "$xsd" "$work/run.xml"
check "run --junit: the mutant's failing cases are in its suite" \
  test "$(xmllint --xpath 'count(//testsuite[@name="builtin:mut_one_pass_variance (mutant)"]/testcase[system-out])' "$work/run.xml")" -ge 1
page run "$work/run" 10

# The report flags of `check`: an outputs file holding the correctly rounded values passes. The
# smoke tier's quantized cases store codes with their format (and NVFP4's packing) in attributes,
# which an outputs file carries the same way (fixtures/SCHEMA.md, "Outputs files").
/usr/bin/python3 - "$smoke" "$work/outputs.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1]) as fx, h5py.File(sys.argv[2], "w") as out:
    for cid, case in fx["cases"].items():
        for name, ds in case["expected"].items():
            o = out.create_dataset(f"cases/{cid}/outputs/{name}", data=ds[...])
            for k in ("dtype", "packing"):
                if ds.dtype.kind in "iu" and k in ds.attrs:  # codes (uint8/int8), not floats
                    o.attrs[k] = ds.attrs[k]
PY
"$nc" check --fixtures "$smoke" --outputs "$work/outputs.h5" --junit "$work/check/junit.xml" \
  --markdown "$work/check/summary.md" >"$work/check.out" 2>&1
check "check --junit --markdown: exit 0" test $? = 0
check "check --junit: valid, no failure" \
  bash -c "xmllint --noout --schema '$xsd' '$work/check/junit.xml' && test \"\$(xmllint --xpath 'string(/testsuites/@failures)' '$work/check/junit.xml')\" = 0"
check "check --markdown: the outputs file conforms" grep -q '^| `outputs:.*| conforms |$' "$work/check/summary.md"

echo "$fails failed"
exit $((fails > 0))
