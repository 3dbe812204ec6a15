#!/usr/bin/env bash
# `normcheck study placement` through the CLI: a small study writes its results file and Markdown
# summary; an existing output is not replaced without --force; bad input exits 2 with a message
# naming the flag and writes nothing.
# Usage: study_cli.sh NORMCHECK PYTHON WORK_DIR
set -uo pipefail
nc="$1" py="$2" work="$3"
rm -rf "$work" && mkdir -p "$work"
fails=0
check() {
  local name="$1"; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}
small=(study placement --layers 2,4 --d-model 8 --d-ff 16 --tokens 4 --steps 2 --lowp-every 1 --lowp float16,bfloat16
       --sweep-steps 4 --seeds 3)

bad() {  # bad NAME FLAG ARGS...: exit 2, the flag in the message, nothing written (checked before any run)
  local name="$1" flag="$2"; shift 2
  rm -rf "$work/bad" && mkdir -p "$work/bad"
  "$nc" study placement "$@" --json "$work/bad/r.json" --markdown "$work/bad/s.md" >"$work/bad.out" 2>"$work/bad.err"
  local rc=$?
  check "$name: exit 2 ($rc)" test "$rc" = 2
  check "$name: the message names $flag" grep -qe "$flag" "$work/bad.err"
  check "$name: nothing written" test -z "$(ls -A "$work/bad")"
}
bad "unknown placement" "--placement" --placement post,postln
bad "unknown norm" "--norm" --norm batchnorm
bad "depth 0" "--layers" --layers 0,6
bad "depth 65" "--layers" --layers 6,65
bad "d 1" "--d-model" --d-model 1
bad "d 9000" "--d-model" --d-model 9000
bad "FFN 0" "--d-ff" --d-ff 0
bad "arrays beyond memory" "--d-ff" --d-model 8192 --d-ff 65536
bad "tokens 0" "--tokens" --tokens 0
bad "negative steps" "--steps" --steps -1
bad "float64 as low precision" "--lowp" --lowp float64
bad "negative lr" "--lr" --lr -0.1
bad "deepnorm alpha 0" "--deepnorm-alpha" --deepnorm-alpha 0
bad "not a number" "--d-model" --d-model abc
bad "unknown model" "--model" --model transformer
bad "heads not dividing d" "--heads" --heads 5
bad "sweep rate 0" "--sweep-lr" --sweep-lr 1e-3,0
bad "sweep rate not a number" "--sweep-lr" --sweep-lr 1e-3,fast
bad "sweep steps 0" "--sweep-steps" --sweep-steps 0
bad "seeds 0" "--seeds" --seeds 0
bad "seeds 65" "--seeds" --seeds 65
bad "seeds not a number" "--seeds" --seeds many
bad "seeds 0 with --full" "--seeds" --full --seeds 0

"$nc" "${small[@]}" --json "$work/r.json" --markdown "$work/s.md" >"$work/run.out" 2>&1
check "small study: exit 0" test $? = 0
check "small study: prints the checks" grep -q "pre_over_post_last_layer_exponent" "$work/run.out"
check "results file: format, version, runs, checks, per-layer arrays" "$py" - "$work/r.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["format"] == "normcheck-study-placement" and j["format_version"] == 4, j["format"]
assert j["options"]["model"] == "attention+ffn" and j["options"]["heads"] == 4, j["options"]
assert len(j["runs"]) == 4 * 2 * 2, len(j["runs"])
sw = j["lr_sweep"]
assert sw["lr"] == [1e-4, 1e-3, 1e-2, 1e-1, 1] and sw["steps"] == 4, sw["lr"]
assert len(sw["runs"]) == 16 and all(len(r["usable"]) == 5 and len(r["losses"][0]) == 5 for r in sw["runs"])
assert [c["id"] for c in j["checks"]][-1] == "pre_usable_lr_above_post"
assert [c["id"] for c in j["checks"]][0] == "post_grad_grows_with_layer"
assert j["options"]["seeds"] == 3 and j["seeds"]["seeds"] == [20260, 20261, 20262], j["seeds"]["seeds"]
assert len(j["seeds"]["runs"]) == 16
for s in j["seeds"]["runs"]:
    assert len(s["grad_w2"]) == 3 and all(len(g) == s["layers"] for g in s["grad_w2"]) and len(s["model_update"]) == 3
    for f in ("grad_w1", "act_in", "act_out"):  # act_in, act_out: version 4
        assert len(s[f]) == 3 and all(len(g) == s["layers"] for g in s[f]), f
    assert len(s["grad_w2_geomean"]) == s["layers"] and s["grad_w2_log_slope_se"] >= 0
assert [c["status"] for c in j["checks"][:2]] == ["not evaluated"] * 2  # Figure 3 wants depths >= 6
for c in j["checks"][2:4]:
    assert c["status"] != "not evaluated" and "over 3 seeds" in c["measured"], c
for r in j["runs"]:
    assert len(r["steps"]) == 3
    post_like = r["placement"] in ("post", "deepnorm")
    assert ("prenorm_recheck" in r) == post_like and r.get("prenorm_recheck", 0) <= 1e-12
    for s in r["steps"]:
        for f in ("grad_w1", "grad_w2", "act_in", "act_out", "block_update", "grad_wq", "grad_wk", "grad_wv", "grad_wo"):
            assert len(s[f]) == r["layers"], (f, r["layers"])
        for f in ("prenorm_attn", "prenorm_ffn"):
            assert len(s.get(f, [])) == (r["layers"] if post_like else 0), (f, r["placement"])
        assert [c["dtype"] for c in s["lowp"]] == ["float16", "bfloat16"]
        assert len(s["lowp"][0]["bwd_inf"]) == r["layers"] + 1
    assert r["steps"][0]["model_update"] == 0 and r["steps"][1]["model_update"] > 0
    assert (r["placement"] == "deepnorm") == (r["alpha"] != 1)
PY
check "markdown: the checks and a row per stack (per stack, across seeds, the sweep)" \
  bash -c "grep -q '## Checked against the papers' '$work/s.md' && grep -q '## Across seeds' '$work/s.md' && grep -q '## Usable learning rates' '$work/s.md' && test \$(grep -c '^| \\(post\\|pre\\|sandwich\\|deepnorm\\) |' '$work/s.md') = 48"

"$nc" study placement --model ffn --layers 2 --d-model 8 --d-ff 16 --tokens 4 --steps 1 --sweep-lr none --lowp none \
  --json "$work/ffn.json" >/dev/null 2>&1
check "--model ffn --sweep-lr none: no attention fields, no sweep" "$py" - "$work/ffn.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["options"]["model"] == "ffn" and "heads" not in j["options"] and "lr_sweep" not in j
assert all("grad_wq" not in s and "prenorm_attn" not in s for r in j["runs"] for s in r["steps"])
assert all(("prenorm_ffn" in r["steps"][0]) == (r["placement"] in ("post", "deepnorm")) for r in j["runs"])
PY

"$nc" study placement --layers 2 --d-model 8 --d-ff 16 --tokens 4 \
  --json "$work/defaults.json" >/dev/null 2>&1
check "defaults: 4 seeds, 1 step, a 1-step sweep of 5 rates, no low precision" "$py" - "$work/defaults.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
o = j["options"]
assert (o["seeds"], o["steps"], o["sweep_steps"], o["lowp"]) == (4, 1, 1, []), o
assert len(j["seeds"]["seeds"]) == 4 and len(j["lr_sweep"]["lr"]) == 5
assert all("lowp" not in s for r in j["runs"] for s in r["steps"])
PY
"$nc" study placement --full --seeds 2 --layers 2 --d-model 8 --d-ff 16 --tokens 4 --json "$work/full.json" >/dev/null 2>&1
check "--full: 4 steps, the 4-step sweep, both dtypes; a given option kept (--seeds 2)" "$py" - "$work/full.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
o = j["options"]
assert (o["seeds"], o["steps"], o["sweep_steps"], o["lowp"]) == (2, 4, 4, ["float16", "bfloat16"]), o
assert o["sweep_lr"] == [1e-4, 1e-3, 1e-2, 1e-1, 1]
PY

sum="$(md5sum <"$work/r.json")"
"$nc" study placement --layers 3 --d-model 8 --d-ff 16 --tokens 4 --steps 1 --json "$work/r.json" >"$work/again.out" 2>&1
check "existing results file without --force: exit 2" test $? = 2
check "existing results file: unchanged" test "$(md5sum <"$work/r.json")" = "$sum"
"$nc" study placement --layers 3 --d-model 8 --d-ff 16 --tokens 4 --steps 1 --json "$work/r.json" --force >/dev/null 2>&1
check "--force: replaced" bash -c "test $? = 0 && test \"\$(md5sum <'$work/r.json')\" != '$sum'"

NORMCHECK_REPORT_WEB_DIR="$work/nothing" "$nc" "${small[@]}" --html "$work/page" --json "$work/nohtml.json" \
  >/dev/null 2>"$work/nohtml.err"
check "--html without Chart.js: exit 2, nothing written" \
  bash -c "test $? = 2 && ! test -e '$work/nohtml.json' && ! test -e '$work/page' && grep -q Chart.js '$work/nohtml.err'"

echo "$fails failed"
exit $((fails > 0))
