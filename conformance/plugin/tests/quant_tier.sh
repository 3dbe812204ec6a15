#!/usr/bin/env bash
# Fused norm + quantization over both transports, end to end on the quant tier (issue #19): the
# test plugin (quant_plugin.cpp, candidate.h nc_quant) and the Python child
# (../../subprocess/tests/helpers/quant_candidate.py, PROTOCOL.md "Quantized cases") conform with
# 0 FAILED on the static FP8, MXFP8 and NVFP4 cases they declare; their deliberately wrong
# variants (every nonzero code moved to its neighbour) are FAILED; the plugin and a builtin under --isolate
# (serve.cpp's side of the protocol) passes every quantized case; and candidates without quant
# (a descriptor built before nc_quant, numpy_candidate.py) get them UNSUPPORTED with the reason.
set -uo pipefail
normcheck="$1" plugin="$2" wrong="$3" old="$4" python="$5" source="$6"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failed=0
bad() { failed=$((failed + 1)); echo "FAIL $*"; }
"$normcheck" fixtures generate --tier quant -o "$tmp/quant.h5" >/dev/null || exit 1

# verdict FILE CASE_ID: the case's verdict in a results file; summary FILE VERDICT: the count.
verdict() {
  "$python" -c "import json,sys; print(next(c['verdict'] for c in json.load(open(sys.argv[1]))['cases'] if c['case_id'] == sys.argv[2]))" "$1" "$2"
}
summary() { "$python" -c "import json,sys; print(json.load(open(sys.argv[1]))['summary'][sys.argv[2]])" "$1" "$2"; }
message() {
  "$python" -c "import json,sys; print(next(c.get('message', '') for c in json.load(open(sys.argv[1]))['cases'] if c['case_id'] == sys.argv[2]))" "$1" "$2"
}
run() {  # run NAME SPEC [ARGS...]: results in $tmp/NAME.json, exit status in $code
  local name="$1" spec="$2"
  shift 2
  "$normcheck" run --fixtures "$tmp/quant.h5" --candidate "$spec" --json "$tmp/$name.json" "$@" >"$tmp/$name.out" 2>&1
  code=$?
}

# static FP8 (E4M3 reciprocal and multiply, E5M2), MXFP8 (both rules), NVFP4 (packed)
plugin_cases=(q_flashinfer_fp8_bfloat16_normal q_te_delayed_fp8_float16_normal q_static_e5m2_bfloat16_normal
              q_te_mxfp8_bf16_straddle_saturation q_ocp_mxfp8_bf16_tied_amax q_te_nvfp4_bfloat16_normal
              q_te_nvfp4_bf16_tied_amax)
python_cases=(q_flashinfer_fp8_bfloat16_normal q_static_e5m2_float16_normal q_te_mxfp8_bfloat16_normal
              q_ocp_mxfp8_e5m2_bfloat16_normal)

run plugin "plugin:$plugin"
[[ $code -eq 0 ]] || bad "quant plugin: exit $code (want 0)"
[[ "$(summary "$tmp/plugin.json" FAILED)" -eq 0 ]] || bad "quant plugin: FAILED cases"
[[ "$(summary "$tmp/plugin.json" PASSED)" -ge 30 ]] || bad "quant plugin: fewer than 30 cases PASSED"
for c in "${plugin_cases[@]}"; do
  [[ "$(verdict "$tmp/plugin.json" "$c")" == PASSED ]] || bad "quant plugin: $c not PASSED"
done

# The same plugin in a `normcheck worker` child: the codes cross the protocol too.
run plugin_isolated "plugin:$plugin" --isolate
[[ $code -eq 0 ]] || bad "isolated quant plugin: exit $code (want 0)"
[[ "$(summary "$tmp/plugin_isolated.json" PASSED)" -eq "$(summary "$tmp/plugin.json" PASSED)" ]] ||
  bad "isolated quant plugin: not as many PASSED as in process"

run wrong "plugin:$wrong" --expect-reject
[[ $code -eq 0 ]] || bad "wrong quant plugin: --expect-reject exit $code (want 0: rejected)"
for c in q_flashinfer_fp8_bfloat16_normal q_te_mxfp8_bfloat16_normal q_te_nvfp4_bfloat16_normal; do
  [[ "$(verdict "$tmp/wrong.json" "$c")" == FAILED ]] || bad "wrong quant plugin: $c not FAILED"
done

run python "cmd:$python $source/conformance/subprocess/tests/helpers/quant_candidate.py"
[[ $code -eq 0 ]] || bad "python quant candidate: exit $code (want 0)"
[[ "$(summary "$tmp/python.json" FAILED)" -eq 0 ]] || bad "python quant candidate: FAILED cases"
for c in "${python_cases[@]}"; do
  [[ "$(verdict "$tmp/python.json" "$c")" == PASSED ]] || bad "python quant candidate: $c not PASSED"
done
[[ "$(verdict "$tmp/python.json" q_te_nvfp4_bfloat16_normal)" == UNSUPPORTED ]] ||
  bad "python quant candidate: NVFP4, which it does not declare, not UNSUPPORTED"

run python_wrong "cmd:$python $source/conformance/subprocess/tests/helpers/quant_candidate.py --wrong"
[[ $code -eq 1 ]] || bad "wrong python quant candidate: exit $code (want 1)"
for c in "${python_cases[@]}"; do
  [[ "$(verdict "$tmp/python_wrong.json" "$c")" == FAILED ]] || bad "wrong python quant candidate: $c not FAILED"
done

run isolated builtin:cpu_two_pass --isolate
[[ $code -eq 0 ]] || bad "isolated builtin: exit $code (want 0)"
[[ "$(summary "$tmp/isolated.json" PASSED)" -eq "$("$python" -c "import json,sys; print(len(json.load(open(sys.argv[1]))['cases']))" "$tmp/isolated.json")" ]] ||
  bad "isolated builtin: not every quantized case PASSED through the protocol"

run old "plugin:$old"
run numpy "cmd:$python $source/conformance/python/numpy_candidate.py"
for r in old numpy; do
  [[ "$(summary "$tmp/$r.json" UNSUPPORTED)" -eq "$("$python" -c "import json,sys; print(len(json.load(open(sys.argv[1]))['cases']))" "$tmp/$r.json")" ]] ||
    bad "$r: quantized cases not all UNSUPPORTED"
  message "$tmp/$r.json" q_flashinfer_fp8_bfloat16_normal | grep -q "quantized outputs (q, scale) not supported" ||
    bad "$r: the UNSUPPORTED reason does not say quantized outputs are not supported"
done

if [[ $failed -ne 0 ]]; then
  for f in "$tmp"/*.out; do echo "== $f"; tail -5 "$f"; done
  exit 1
fi
echo "quant tier over the plugin ABI and the protocol: all checks passed"
