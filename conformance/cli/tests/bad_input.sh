#!/usr/bin/env bash
# Bad input to `normcheck reference` gets exit code 2 and a message naming the problem; never a
# crash (exit code >= 128) and never a partial result on stdout.
set -uo pipefail
normcheck="$1"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

expect() {  # expect NAME EXPECTED_MESSAGE_REGEX -- ARGS...
  local name="$1" pattern="$2"
  shift 3
  local out err code
  out="$("$normcheck" "$@" 2>"$tmp/err")"
  code=$?
  err="$(cat "$tmp/err")"
  if [[ $code -eq 2 && "$err" =~ $pattern && -z "$out" ]]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL $name: exit $code, stderr: $err, stdout: ${out:0:200}"
  fi
}

case_file() {  # case_file NAME JSON
  printf '%s' "$2" >"$tmp/$1.json"
  echo "$tmp/$1.json"
}

good='"inputs": {"x": {"shape": [2, 2], "data": [1, 2, 3, 4]}}'
expect negative-eps "epsilon: .* must be finite and >= 0" -- reference --x 1,2 --eps -1
expect nan-eps "epsilon" -- reference --x 1,2 --eps nan
expect bad-number "--x|inputs/x/data\[1\]" -- reference --x 1,one
expect bad-axis "axis: 3 out of range for rank 2" -- reference --shape 2,2 --x 1,2,3,4 --axis 3
expect shape-mismatch "inputs/x/data: 3 values for 4 elements" -- reference --shape 2,2 --x 1,2,3
expect weight-shape "inputs/weight" -- reference --shape 2,2 --x 1,2,3,4 --weight 1,2,3
expect unknown-contract "unknown contract 'llamma'" -- reference --x 1,2 --contract llamma
expect unknown-dtype "dtype_x: 'float8'" -- reference --x 1,2 --dtype float8
expect bias-without-weight "--bias: needs --weight" -- reference --x 1,2 --bias 0,0
expect missing-file "cannot open case file" -- reference --case "$tmp/nope.json"
expect not-json "is not valid JSON" -- reference --case "$(case_file notjson '{"op": "layernorm", ')"
expect unknown-field "frobnicate: unknown field" -- reference --case "$(case_file unknown "{\"op\": \"layernorm\", \"frobnicate\": 1, $good}")"
expect absurd-shape "inputs/x/shape" -- reference --case "$(case_file absurd '{"op": "rmsnorm", "inputs": {"x": {"shape": [100000, 100000, 100000], "data": []}}}')"
expect zero-dim "inputs/x/shape" -- reference --case "$(case_file zero '{"op": "rmsnorm", "inputs": {"x": {"shape": [0], "data": []}}}')"
expect not-object "case: must be a JSON object" -- reference --case "$(case_file array '[1, 2]')"
expect block-without-ffn "inputs/ffn_w1: missing" -- reference --case "$(case_file block "{\"op\": \"layernorm\", \"block\": \"post\", $good}")"
expect unused-input "inputs/dy: not used" -- reference --case "$(case_file unused "{\"op\": \"layernorm\", \"inputs\": {\"x\": {\"shape\": [2], \"data\": [1, 2]}, \"dy\": {\"shape\": [2], \"data\": [1, 2]}}}")"
expect bad-option "" -- reference --no-such-flag

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
