#!/usr/bin/env bash
# `normcheck run` / `check` end to end on the smoke tier: exit codes, repro lines, results files,
# and bad input (exit 2 with a message naming the problem; never a crash, never a results file
# replaced without --force, never a partly written one).
set -uo pipefail
normcheck="$1"
python="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL $*"; }

# expect NAME CODE STDERR_REGEX -- ARGS...
expect() {
  local name="$1" want="$2" pattern="$3"
  shift 4
  "$normcheck" "$@" >"$tmp/out" 2>"$tmp/err"
  local code=$?
  if [[ $code -eq $want && "$(cat "$tmp/err")" =~ $pattern ]]; then ok; else
    bad "$name: exit $code (want $want), stderr: $(head -c 400 "$tmp/err"), stdout: $(head -c 300 "$tmp/out")"
  fi
}

# The smoke tier: the file ctest shares among the tests ($3, read only), else generated here.
fx="${3:-$tmp/smoke.h5}"
if [[ -z "${3:-}" ]]; then
  "$normcheck" fixtures generate --tier smoke -o "$fx" >/dev/null || { echo "cannot generate smoke"; exit 1; }
fi

# A correct candidate conforms (0), a mutant fails (1) with a repro line, --expect-reject inverts.
expect correct 0 "" -- run --candidate builtin:cpu_two_pass --fixtures "$fx" --json "$tmp/r.json"
"$python" - "$tmp/r.json" <<'PY' && ok || bad "results file"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["format"] == "normcheck-results" and j["format_version"] == 1, j["format"]
assert j["candidate"]["spec"] == "builtin:cpu_two_pass" and j["candidate"]["kind"] == "correct"
assert set(j["summary"]) == {"PASSED", "FAILED", "UNSUPPORTED", "MISTRUSTED", "CRASHED", "TIMEOUT", "MISSING"}
assert j["summary"]["FAILED"] == 0 and j["summary"]["PASSED"] > 0
assert len(j["cases"]) == sum(j["summary"].values())
for c in j["cases"]:
    for o in c["outputs"]:
        assert {"name", "verdict", "dtype", "max_ulp", "max_abs", "max_rel", "max_ratio"} <= set(o)
PY
expect mutant 1 "" -- run --candidate builtin:mut_eps_outside_sqrt --fixtures "$fx" --cases 'ln_*' --verbose
grep -q "repro: normcheck run --candidate builtin:mut_eps_outside_sqrt --fixtures" "$tmp/out" && ok || bad "repro line"
grep -q "worst at \[" "$tmp/out" && ok || bad "worst element coordinates"
expect expect-reject 0 "" -- run --candidate builtin:mut_eps_outside_sqrt --expect-reject --fixtures "$fx"
expect expect-reject-correct 1 "" -- run --candidate builtin:cpu_welford --expect-reject --fixtures "$fx"
expect case-glob 0 "" -- run --candidate builtin:cpu_welford --fixtures "$fx" --cases 'rms_*' --json "$tmp/g.json"
"$python" -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['cases'] and all(c['case_id'].startswith('rms_') for c in j['cases'])" "$tmp/g.json" && ok || bad "case glob"

# Nothing checked is not a pass (a --cases typo, a candidate that declines every case): exit 1
# with "nothing was checked", unless --allow-empty; --builtins candidates that cannot run here
# are shown as "nothing run" and do not fail a run that checked others.
expect empty-glob 1 "nothing was checked: no case of .* matches --cases" -- run --candidate builtin:cpu_welford --fixtures "$fx" --cases 'nmr_*'
expect empty-glob-allowed 0 "" -- run --candidate builtin:cpu_welford --fixtures "$fx" --cases 'nmr_*' --allow-empty
decliner="cmd:$python $(dirname "$0")/../../subprocess/tests/helpers/misbehave.py decline"
expect declines-all 1 "nothing was checked for" -- run --candidate "$decliner" --fixtures "$fx" --cases 'rms_*'
expect declines-all-beside-another 1 "nothing was checked for" -- run --candidate builtin:cpu_welford --candidate "$decliner" --fixtures "$fx" --cases 'rms_*'
expect declines-all-allowed 0 "" -- run --candidate "$decliner" --fixtures "$fx" --cases 'rms_*' --allow-empty
grep -q "nothing run (every case declined)" "$tmp/out" && ok || bad "table says nothing run"

# A subprocess candidate that dies or hangs before its hello: a results file with every case
# CRASHED (TIMEOUT), the stderr tail in each message, exit 1 (not a usage error without results).
misbehave="$python $(dirname "$0")/../../subprocess/tests/helpers/misbehave.py"
expect dies-before-hello 1 "exited with status 3 before its hello" -- run --candidate "cmd:$misbehave exit_before_hello" --fixtures "$fx" --cases 'rms_*' --json "$tmp/dead.json"
expect hangs-before-hello 1 "no hello within 0.5 s" -- run --candidate "cmd:$misbehave no_hello" --startup-timeout 0.5 --fixtures "$fx" --cases 'rms_*' --json "$tmp/hung.json"
expect prop-hangs-before-hello 2 "no hello within 0.5 s" -- prop --candidate "cmd:$misbehave no_hello" --startup-timeout 0.5 --tests 1 --properties agreement
"$python" - "$tmp/dead.json" "$tmp/hung.json" <<'PY' && ok || bad "start failures in the results files"
import json, sys
for path, verdict, text in ((sys.argv[1], "CRASHED", "boom: cannot import"), (sys.argv[2], "TIMEOUT", "no hello within 0.5 s")):
    j = json.load(open(path))
    assert j["cases"], path
    for c in j["cases"]:
        assert c["verdict"] == verdict and text in c["message"], (path, c["case_id"], c["verdict"], c.get("message"))
PY

# Bad input: exit 2 with the problem named.
expect no-candidate 2 "give --candidate" -- run --fixtures "$fx"
expect unknown-builtin 2 "no built-in candidate 'nope'" -- run --candidate builtin:nope --fixtures "$fx"
expect bad-spec 2 "expected builtin:NAME" -- run --candidate cpu_two_pass --fixtures "$fx"
expect missing-plugin 2 "no such file" -- run --candidate plugin:/nonexistent.so --fixtures "$fx"
expect missing-fixtures 2 "no such fixture file" -- run --candidate builtin:cpu_welford --fixtures "$tmp/none.h5"
echo "not hdf5" >"$tmp/text.h5"
expect not-hdf5 2 "is not an HDF5 file" -- run --candidate builtin:cpu_welford --fixtures "$tmp/text.h5"
echo "keep me" >"$tmp/keep.json"
expect no-overwrite 2 "exists; pass --force" -- run --candidate builtin:cpu_welford --fixtures "$fx" --json "$tmp/keep.json"
[[ "$(cat "$tmp/keep.json")" == "keep me" ]] && ok || bad "results file replaced without --force"
expect json-many 2 "--json takes one candidate" -- run --builtins correct --fixtures "$fx" --json "$tmp/x.json"
expect builtins-value 2 "--builtins takes" -- run --builtins some --fixtures "$fx"

# check: outputs files written by another program (h5py here). Quantized codes (the smoke tier's
# q_* cases) keep their `dtype` and NVFP4's `packing` attribute, as an outputs file carries them
# (fixtures/SCHEMA.md, "Outputs files").
"$python" - "$fx" "$tmp" <<'PY' || bad "writing outputs files"
import h5py, sys
fx, tmp = sys.argv[1], sys.argv[2]
def put(h, path, ds, data):
    d = h.create_dataset(path, data=data)
    for k in ("dtype", "packing"):
        if ds.dtype.kind in "iu" and k in ds.attrs:  # codes (uint8/int8), not floats
            d.attrs[k] = ds.attrs[k]
with h5py.File(fx) as f:
    ids = sorted(f["cases"])
    with h5py.File(tmp + "/perfect.h5", "w") as o, h5py.File(tmp + "/partial.h5", "w") as p, \
         h5py.File(tmp + "/shape.h5", "w") as s, h5py.File(tmp + "/alien.h5", "w") as a:
        for i, cid in enumerate(ids):
            for name, ds in f["cases"][cid]["expected"].items():
                put(o, f"cases/{cid}/outputs/{name}", ds, ds[...])
                if i % 2 == 0:
                    put(p, f"cases/{cid}/outputs/{name}", ds, ds[...])
                data = ds[...]
                put(s, f"cases/{cid}/outputs/{name}", ds, data.reshape(-1) if i == 0 else data)
        a.create_dataset("cases/not_a_case/outputs/y", data=[1.0])
PY
expect check-perfect 0 "" -- check --fixtures "$fx" --outputs "$tmp/perfect.h5" --json "$tmp/c.json"
# A declared reduction class (conformance/TOLERANCE.md, section 9): the certified values conform
# under every class (the decided final rounding included); a bad class is a usage error.
for r in two_pass welford pairwise:8 blocked:8 accumulate_f64; do
  expect "check-perfect-$r" 0 "" -- check --fixtures "$fx" --outputs "$tmp/perfect.h5" --reduction "$r"
done
expect reduction-unknown 2 "unknown reduction class 'kahan'" -- run --candidate builtin:cpu_two_pass --fixtures "$fx" --reduction kahan
expect reduction-no-block 2 "needs a block size" -- check --fixtures "$fx" --outputs "$tmp/perfect.h5" --reduction pairwise
expect prop-reduction-unknown 2 "unknown reduction class" -- prop --candidate builtin:cpu_two_pass --reduction nope
expect reduction-declared 0 "" -- run --candidate builtin:cpu_two_pass --fixtures "$fx" --reduction two_pass --json "$tmp/rd.json"
grep -q '"reduction": "two_pass"' "$tmp/rd.json" && ok || bad "reduction-declared: candidate.reduction missing from the results file"
expect check-partial 1 "" -- check --fixtures "$fx" --outputs "$tmp/partial.h5"
grep -q "MISSING" "$tmp/out" && ok || bad "MISSING in the table"
expect check-shape 1 "" -- check --fixtures "$fx" --outputs "$tmp/shape.h5" --verbose
grep -q "shape \[" "$tmp/out" && ok || bad "wrong shape named"
# Outputs stored wider than their dtype (fixtures/SCHEMA.md, "Outputs files"): exact values of the
# dtype as float64 conform; one bfloat16 y value halfway between its certified value and the exact
# one (closer to the exact value, so inside its allowance) is FAILED "not a bfloat16 value" unless the file declares wider_values = 1. Cases and
# outputs marked unsupported are UNSUPPORTED with the reason given, and a file whose every other
# output passes exits 0.
"$python" - "$fx" "$tmp" <<'PY' || bad "writing wide/unsupported outputs files"
import h5py, numpy as np, sys
fx, tmp = sys.argv[1], sys.argv[2]
with h5py.File(fx) as f:
    ids = sorted(f["cases"])
    text = lambda a: a.decode() if isinstance(a, bytes) else str(a)
    bf = [c for c in ids if text(f["cases"][c].attrs["dtype_out"]) == "bfloat16" and
          {"y", "mean"} <= set(f["cases"][c]["expected"])]
    open(tmp + "/bf_case", "w").write(bf[0])
    files = {k: h5py.File(f"{tmp}/{k}.h5", "w") for k in ("wide", "unrounded", "declared", "marked")}
    for cid in ids:
        for name, ds in f["cases"][cid]["expected"].items():
            if ds.dtype.kind in "iu":  # quantized codes (uint8/int8): not a float output, written as they are
                for h in files.values():
                    h.create_dataset(f"cases/{cid}/outputs/{name}", data=ds[...]).attrs["dtype"] = ds.attrs["dtype"]
                    if "packing" in ds.attrs:
                        h[f"cases/{cid}/outputs/{name}"].attrs["packing"] = ds.attrs["packing"]
                continue
            v = exact = ds[...].astype(np.float64)
            files["wide"].create_dataset(f"cases/{cid}/outputs/{name}", data=v)
            if cid == bf[0] and name == "y":  # halfway towards the exact value: closer to it
                f64 = f["cases"][cid]["expected_f64"][name][...]
                k = int(np.flatnonzero(f64 != v)[0])
                v = v.copy(); v.flat[k] = (v.flat[k] + f64.flat[k]) / 2
            files["unrounded"].create_dataset(f"cases/{cid}/outputs/{name}", data=v)
            files["declared"].create_dataset(f"cases/{cid}/outputs/{name}", data=v)
            if cid == bf[1]:
                continue
            d = files["marked"].create_dataset(f"cases/{cid}/outputs/{name}", data=exact if cid != bf[0] or name != "mean" else [0.0])
            if cid == bf[0] and name == "mean":
                d.attrs["unsupported"] = "no mean output in this API"
        if cid == bf[1]:
            files["marked"].create_group(f"cases/{cid}").attrs["unsupported"] = "no bfloat16 path"
    files["declared"].attrs["wider_values"] = 1
    for h in files.values():
        h.close()
PY
bfcase="$(cat "$tmp/bf_case")"
expect check-wide-exact 0 "" -- check --fixtures "$fx" --outputs "$tmp/wide.h5"
expect check-unrounded 1 "" -- check --fixtures "$fx" --outputs "$tmp/unrounded.h5" --verbose
grep -q "not a bfloat16 value: element \[" "$tmp/out" && grep -q "FAILED *$bfcase" "$tmp/out" && ok ||
  bad "check-unrounded: 'not a bfloat16 value' for $bfcase missing: $(grep -m3 -A3 "$bfcase" "$tmp/out")"
expect check-declared-wider 0 "" -- check --fixtures "$fx" --outputs "$tmp/declared.h5"
expect check-marked 0 "" -- check --fixtures "$fx" --outputs "$tmp/marked.h5" --verbose --json "$tmp/m.json"
"$python" - "$tmp/m.json" "$bfcase" <<'PY' && ok || bad "check-marked: verdicts or reasons"
import json, sys
r = json.load(open(sys.argv[1]))
cases = {c["case_id"]: c for c in r["cases"]}
c = cases[sys.argv[2]]
assert c["verdict"] == "UNSUPPORTED", c["verdict"]
mean = [o for o in c["outputs"] if o["name"] == "mean"][0]
assert mean["verdict"] == "UNSUPPORTED" and mean["reason"] == "no mean output in this API", mean
assert [o for o in c["outputs"] if o["name"] == "y"][0]["verdict"] == "PASSED"
whole = [x for x in r["cases"] if x.get("message") == "no bfloat16 path"]
assert len(whole) == 1 and whole[0]["verdict"] == "UNSUPPORTED", whole
PY
expect check-alien 2 "case not_a_case is not in the fixture file" -- check --fixtures "$fx" --outputs "$tmp/alien.h5"
expect check-not-hdf5 2 "is not an HDF5 file" -- check --fixtures "$fx" --outputs "$tmp/text.h5"
# A damaged fixture file (one bit of a certified binary64 value flipped on disk): check and run
# stop with exit 2 naming the dataset, rather than judge the candidate against changed values.
# damage SRC DST first|middle: a copy of SRC with that case damaged; prints the case's id.
damage() {
  cp "$1" "$2"
  "$python" - "$2" "$3" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    ids = [c for c in sorted(f["cases"]) if "expected_f64" in f["cases"][c]]
    cid = ids[0] if sys.argv[2] == "first" else ids[len(ids) // 2]
    off = f[f"cases/{cid}/expected_f64"][sorted(f[f"cases/{cid}/expected_f64"])[0]].id.get_offset()
with open(sys.argv[1], "r+b") as fh:
    fh.seek(off + 2)
    b = fh.read(1)
    fh.seek(off + 2)
    fh.write(bytes([b[0] ^ 0x04]))
print(cid)
PY
}
# stopped_before RESULTS CASE: the results file holds exactly the cases before CASE, in order,
# and its error names CASE.
stopped_before() {
  "$python" - "$1" "$fx" "$2" <<'PY'
import json, sys, h5py
j = json.load(open(sys.argv[1]))
with h5py.File(sys.argv[2]) as f:
    ids = sorted(f["cases"])
assert [c["case_id"] for c in j["cases"]] == ids[:ids.index(sys.argv[3])], [c["case_id"] for c in j["cases"]][-3:]
assert j["error"].startswith(f"stopped at case {sys.argv[3]}: "), j["error"]
PY
}
damaged_case="$(damage "$fx" "$tmp/damaged.h5" first)"
expect check-damaged-fixture 2 "case $damaged_case: expected_f64/.*checksum mismatch" -- check --fixtures "$tmp/damaged.h5" --outputs "$tmp/perfect.h5"
grep -q "stopped early (run stopped: " "$tmp/out" && ! grep -q "conforms" "$tmp/out" && ok ||
  bad "check-damaged-fixture: the summary does not say the run stopped early: $(tail -c 400 "$tmp/out")"
expect run-damaged-fixture 2 "case $damaged_case: expected_f64/.*checksum mismatch" -- run --fixtures "$tmp/damaged.h5" --candidate builtin:cpu_welford --cases "$damaged_case"
# The same damage in a case in the middle, on 3 threads (cases are read, judged and reported
# through an ordered pipeline): the results file holds exactly the cases before it.
damaged_mid="$(damage "$fx" "$tmp/damaged_mid.h5" middle)"
expect check-damaged-middle 2 "case $damaged_mid: expected_f64/.*checksum mismatch" -- check --fixtures "$tmp/damaged_mid.h5" --outputs "$tmp/perfect.h5" --threads 3 --json "$tmp/dm.json"
stopped_before "$tmp/dm.json" "$damaged_mid" && ok || bad "check-damaged-middle: the results file is not the cases before the damaged one"
expect run-damaged-middle 2 "case $damaged_mid: expected_f64/.*checksum mismatch" -- run --candidate builtin:cpu_welford --fixtures "$tmp/damaged_mid.h5" --threads 3 --json "$tmp/rdm.json" --force
stopped_before "$tmp/rdm.json" "$damaged_mid" && ok || bad "run-damaged-middle: the results file is not the cases before the damaged one"
# `run` on 1 and 3 threads: a mutant (failures, diagnosed) and the correct builtins together
# (each candidate runs one case at a time in case order; candidates and cases overlap): the same
# results files and the same printed verdicts.
for threads in 1 3; do
  mkdir -p "$tmp/rt-$threads"
  "$normcheck" run --candidate builtin:mut_eps_outside_sqrt --fixtures "$fx" --threads "$threads" \
    --json "$tmp/rt-$threads/mutant.json" >"$tmp/rt-$threads/mutant.out" 2>&1
  "$normcheck" run --builtins correct --fixtures "$fx" --threads "$threads" --json-dir "$tmp/rt-$threads/correct" \
    >"$tmp/rt-$threads/correct.out" 2>&1
done
"$python" - "$tmp/rt-1" "$tmp/rt-3" <<'PY' && ok || bad "run-threads: the results on 1 and 3 threads differ"
import glob, json, os, sys
def strip(o):
    if isinstance(o, dict): return {k: strip(v) for k, v in o.items() if k not in ("seconds", "command")}
    if isinstance(o, list): return [strip(v) for v in o]
    return o
one = sorted(os.path.relpath(p, sys.argv[1]) for p in glob.glob(sys.argv[1] + "/**/*.json", recursive=True))
assert len(one) > 2 and "mutant.json" in one, one
for rel in one:
    a, b = (strip(json.load(open(os.path.join(d, rel)))) for d in sys.argv[1:3])
    assert a == b, rel
assert json.load(open(sys.argv[1] + "/mutant.json"))["summary"]["FAILED"] > 0
for name in ("mutant.out", "correct.out"):
    lines = [[l for l in open(os.path.join(d, name)) if "second" not in l] for d in sys.argv[1:3]]
    assert lines[0] == lines[1], name
PY
# The results do not depend on --threads: outputs that fail (every float y times 1 + 2^-9, so
# that the diagnosis runs too) and a partial file, judged on 1 and 3 threads.
"$python" - "$fx" "$tmp/scaled.h5" <<'PY' || bad "writing scaled.h5"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1]) as f, h5py.File(sys.argv[2], "w") as o:
    for cid in sorted(f["cases"]):
        for name, ds in f["cases"][cid]["expected"].items():
            data = ds[...]
            if ds.dtype.kind == "f" and name == "y":
                data = (data.astype(np.float64) * (1 + 2**-9)).astype(ds.dtype)
            d = o.create_dataset(f"cases/{cid}/outputs/{name}", data=data)
            for k in ("dtype", "packing"):
                if ds.dtype.kind in "iu" and k in ds.attrs:
                    d.attrs[k] = ds.attrs[k]
PY
for file in scaled partial; do
  for threads in 1 3; do
    "$normcheck" check --fixtures "$fx" --outputs "$tmp/$file.h5" --threads "$threads" --json "$tmp/$file-$threads.json" \
      >"$tmp/$file-$threads.out" 2>&1
    echo $? >"$tmp/$file-$threads.code"
  done
  "$python" - "$tmp/$file-1.json" "$tmp/$file-3.json" <<'PY' && cmp -s "$tmp/$file-1.code" "$tmp/$file-3.code" && ok ||
import json, sys
def strip(o):
    if isinstance(o, dict): return {k: strip(v) for k, v in o.items() if k not in ("seconds", "command")}
    if isinstance(o, list): return [strip(v) for v in o]
    return o
a, b = (strip(json.load(open(p))) for p in sys.argv[1:3])
assert a == b, "results differ"
assert a["summary"]["FAILED"] + a["summary"]["MISSING"] > 0, a["summary"]
PY
    bad "check-threads-$file: the results on 1 and 3 threads differ"
done
expect check-empty-glob 1 "nothing was checked" -- check --fixtures "$fx" --outputs "$tmp/perfect.h5" --cases 'nmr_*'
expect check-empty-glob-allowed 0 "" -- check --fixtures "$fx" --outputs "$tmp/perfect.h5" --cases 'nmr_*' --allow-empty

# A real library held to its recorded findings (--known-findings): a wrong kernel (y times 1.01)
# fails two cases; listed as findings they are reported as such and the run passes; a failure
# not listed fails it, and so does a listed finding that no longer shows. Reports agree.
scaler="cmd:$misbehave scale_y"
kf() {  # kf FILE CASE:VERDICT...
  local out="$1"; shift
  "$python" - "$out" "$scaler" "$@" <<'PY'
import json, sys
out, spec, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
entries = [{"case": p.split(":")[0], "verdict": p.split(":")[1], "finding": "docs/FINDINGS.md#test-scale",
            "what": "y times 1.01"} for p in pairs]
json.dump({"format": "normcheck-known-findings", "version": 1, "candidates": {spec: entries}}, open(out, "w"))
PY
}
two=(--cases rms_f32_normal --cases rms_f32_h17)
expect scaled-fails 1 "" -- run --candidate "$scaler" --fixtures "$fx" "${two[@]}"
kf "$tmp/kf-both.json" rms_f32_normal:FAILED rms_f32_h17:FAILED
expect known-findings-pass 0 "" -- run --candidate "$scaler" --fixtures "$fx" "${two[@]}" --known-findings "$tmp/kf-both.json" --json "$tmp/known.json"
grep -q "conforms (2 known findings)" "$tmp/out" && ok || bad "table says conforms (2 known findings): $(tail -3 "$tmp/out")"
grep -q "^\[.*\] FAILED" "$tmp/out" && bad "a known finding printed as a failure: $(cat "$tmp/out")" || ok
"$python" - "$tmp/known.json" <<'PY' && ok || bad "known findings in the results file"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["known_findings"] == 2 and j["stale_findings"] == [], (j.get("known_findings"), j.get("stale_findings"))
for c in j["cases"]:
    assert c["verdict"] == "FAILED" and c["known_finding"] == {"finding": "docs/FINDINGS.md#test-scale", "what": "y times 1.01"}, c
PY
expect known-findings-report 0 "" -- report "$tmp/known.json" --junit "$tmp/known.xml" --markdown "$tmp/known.md"
grep -q 'message="known finding docs/FINDINGS.md#test-scale: y times 1.01 (FAILED)"' "$tmp/known.xml" && ! grep -q "<failure" "$tmp/known.xml" && ok || bad "JUnit of known findings: $(cat "$tmp/known.xml")"
grep -q "conforms (2 known findings)" "$tmp/known.md" && grep -q "FAILED (known finding: docs/FINDINGS.md#test-scale)" "$tmp/known.md" && ok || bad "Markdown of known findings"
kf "$tmp/kf-one.json" rms_f32_normal:FAILED
expect known-findings-unlisted 1 "" -- run --candidate "$scaler" --fixtures "$fx" "${two[@]}" --known-findings "$tmp/kf-one.json"
grep -q "FAILED (1 known finding)" "$tmp/out" && ok || bad "table with an unlisted failure: $(tail -2 "$tmp/out")"
kf "$tmp/kf-stale.json" rms_f32_normal:FAILED rms_f32_h17:CRASHED
expect known-findings-stale 1 "" -- run --candidate "$scaler" --fixtures "$fx" "${two[@]}" --known-findings "$tmp/kf-stale.json" --json "$tmp/stale.json"
grep -q "recorded finding no longer shows: rms_f32_h17" "$tmp/out" && ok || bad "table with a stale finding: $(tail -2 "$tmp/out")"
expect known-findings-stale-report 1 "" -- report "$tmp/stale.json" --markdown "$tmp/stale.md"
echo '{"format": "normcheck-known-findings", "version": 1, "candidates": {"x": [{"case": "a", "verdict": "PASSED", "finding": "f"}]}}' >"$tmp/kf-bad.json"
expect known-findings-bad-verdict 2 "kf-bad.json: not a known-findings file: candidates\[\"x\"\]\[0\].verdict must be FAILED" -- run --candidate "$scaler" --fixtures "$fx" "${two[@]}" --known-findings "$tmp/kf-bad.json"
echo 'not json' >"$tmp/kf-text.json"
expect known-findings-not-json 2 "kf-text.json: not a known-findings file: not JSON" -- run --candidate "$scaler" --fixtures "$fx" "${two[@]}" --known-findings "$tmp/kf-text.json"
expect known-findings-other-spec 1 "known-findings names cmd:.* scale_y, which this run does not have" -- run --candidate "cmd:$misbehave scale_y " --fixtures "$fx" "${two[@]}" --known-findings "$tmp/kf-both.json"
expect known-findings-missing 2 "cannot read the known-findings file" -- run --candidate "$scaler" --fixtures "$fx" --known-findings "$tmp/none.json"

echo "run_check: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
