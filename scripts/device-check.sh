#!/usr/bin/env bash
# The GPU device check: on a machine with an NVIDIA GPU, builds normcheck and the CUDA plugin,
# generates the ci tier and runs the GPU candidates over it, printing their verdict tables:
#   builtin:cuda                  conformance/candidates/cuda/ (CUDA kernels on GPU 0)
#   PyTorch on CUDA               conformance/candidates/torch/torch_adapter.py --device cuda
#   builtin:ggml-cuda             ggml's CUDA backend (conformance/candidates/ggml/), held to its
#                                 recorded findings; NOT RUN where ggml is not installed here
#                                 (scripts/install-ggml.sh needs the npm registry)
#   builtin:cuda on the quant tier (fused RMSNorm + static / per-token FP8 and int8 quantization)
# Results files: $out/device/cuda.json, cuda_quant.json, torch_cuda.json, ggml-cuda.json.
#
# Exit status: 0 when every candidate that ran conforms (nothing FAILED, CRASHED, TIMEOUT or MISSING, and builtin:cuda
# passed at least one case), 1 when a candidate does not, 2 without a GPU, 3 when the build or
# the fixtures fail. Sized for one go in about 10 minutes on a 16-core machine: only the two
# targets are built (no tests, no benchmarks) and the ci tier is generated with every core.
#
# Environment: NORMCHECK_BUILD_DIR (default build/), NORMCHECK_OUT (default out/),
# NORMCHECK_SKIP_BUILD=1 (use an existing build), NORMCHECK_PYTHON (default /usr/bin/python3, the
# Python with torch), NORMCHECK_CUDA_ARCHITECTURES (default 80-real;90).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build_dir="${NORMCHECK_BUILD_DIR:-$root/build}"
out="${NORMCHECK_OUT:-$root/out}"
python="${NORMCHECK_PYTHON:-/usr/bin/python3}"
normcheck="$build_dir/bin/normcheck"
mkdir -p "$out/device"

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L; then
  echo "device-check: no NVIDIA GPU here (nvidia-smi -L failed or is absent); nothing to check" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader || true
command -v nvcc >/dev/null && nvcc --version | tail -n 2

if [[ "${NORMCHECK_SKIP_BUILD:-0}" != 1 ]]; then
  t0=$SECONDS
  # A fresh build directory is configured without tests and benchmarks (nothing to find for
  # them, e.g. GTest, on a bare GPU machine); an existing one keeps its configuration.
  options=()
  if [[ ! -f "$build_dir/CMakeCache.txt" ]]; then
    options=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DNORMCHECK_BUILD_TESTS=OFF -DNORMCHECK_BUILD_BENCHMARKS=OFF)
    command -v ninja >/dev/null && options+=(-G Ninja)
  fi
  [[ -n "${NORMCHECK_CUDA_ARCHITECTURES:-}" ]] &&
    options+=(-DNORMCHECK_CUDA_ARCHITECTURES="$NORMCHECK_CUDA_ARCHITECTURES")
  cmake -S "$root" -B "$build_dir" "${options[@]}" >/dev/null || {
    echo "device-check: cmake configure failed" >&2
    exit 3
  }
  cmake --build "$build_dir" --parallel "$(nproc)" --target normcheck normcheck_plugin_cuda \
    normcheck_plugin_ggml-cuda || {
    echo "device-check: build failed (normcheck_plugin_cuda exists only where CMake finds nvcc)" >&2
    exit 3
  }
  echo "device-check: built in $((SECONDS - t0)) s"
fi

t0=$SECONDS
"$normcheck" fixtures generate --tier ci -o "$out/ci.h5" --force || {
  echo "device-check: fixtures generate failed" >&2
  exit 3
}
echo "device-check: ci tier generated in $((SECONDS - t0)) s"

# builtin:cuda once bundled plugins are listed as built-ins; the plugin file itself otherwise.
cuda_spec=builtin:cuda
# (grep without -q reads to the end: under pipefail an early exit would fail the pipeline.)
if ! "$normcheck" candidates 2>/dev/null | grep "builtin:cuda" >/dev/null; then
  cuda_spec="plugin:$build_dir/lib/normcheck/plugins/libnormcheck_cuda.so"
fi

# PASSED count of a results file (0 when it cannot be read).
passed() {
  # The summary's keys are the verdicts in capitals ("PASSED"); older files wrote them in lower case.
  "$python" -c 'import json,sys; s=json.load(open(sys.argv[1]))["summary"]; print(s.get("PASSED", s.get("passed", 0)))' "$1" 2>/dev/null ||
    grep -io '"passed": *[0-9]*' "$1" 2>/dev/null | grep -o '[0-9]*$' || echo 0
}

status=0
verdicts=()
# run_cuda LABEL FIXTURES JSON TIMEOUT: the CUDA candidate over one fixture file, its verdict.
run_cuda() {
  local label=$1 fixtures=$2 json=$3 limit=$4 t0=$SECONDS code=0
  timeout "$limit" "$normcheck" run --candidate "$cuda_spec" --fixtures "$fixtures" --json "$json" --force || code=$?
  if [[ $code -ne 0 ]]; then
    verdicts+=("$label: FAILED (exit $code)")
    status=1
  elif [[ "$(passed "$json")" -gt 0 ]]; then
    verdicts+=("$label: conforms ($((SECONDS - t0)) s)")
  else
    # On a GPU machine every case UNSUPPORTED means init failed (no driver, no kernel image).
    verdicts+=("$label: NO CASE PASSED (see the UNSUPPORTED reason above)")
    status=1
  fi
}

echo
echo "=== $cuda_spec"
run_cuda "$cuda_spec" "$out/ci.h5" "$out/device/cuda.json" 300

echo
echo "=== $cuda_spec on the quant tier (fused RMSNorm + FP8/int8 quantization; MX and NVFP4 UNSUPPORTED)"
if ! "$normcheck" fixtures generate --tier quant -o "$out/quant.h5" --force >/dev/null; then
  verdicts+=("$cuda_spec quant: NOT RUN (fixtures generate --tier quant failed)")
  status=1
else
  run_cuda "$cuda_spec quant" "$out/quant.h5" "$out/device/cuda_quant.json" 120
fi

echo
echo "=== PyTorch on CUDA ($python conformance/candidates/torch/torch_adapter.py --device cuda)"
t0=$SECONDS
timeout 420 "$normcheck" run --candidate "cmd:$python conformance/candidates/torch/torch_adapter.py --device cuda" \
  --fixtures "$out/ci.h5" --json "$out/device/torch_cuda.json" --force
rc=$?
if ((rc == 0)) && [[ "$(passed "$out/device/torch_cuda.json")" -gt 0 ]]; then
  verdicts+=("torch cuda: conforms ($((SECONDS - t0)) s)")
elif ((rc == 0 || rc == 2)); then
  # 2: the adapter could not start (no torch, or a torch without CUDA): no verdict on PyTorch,
  # so it does not fail the check; the line above the summary says why.
  verdicts+=("torch cuda: NOT RUN (the adapter could not start or declined every case; see above)")
else
  verdicts+=("torch cuda: FAILED (exit $rc)")
  status=1
fi

echo
echo "=== builtin:ggml-cuda (ggml's CUDA backend, held to conformance/candidates/ggml/known_findings.json)"
t0=$SECONDS
timeout 420 "$normcheck" run --candidate builtin:ggml-cuda --fixtures "$out/ci.h5" --allow-empty \
  --known-findings conformance/candidates/ggml/known_findings.json --json "$out/device/ggml-cuda.json" --force
rc=$?
if ((rc == 0)) && [[ "$(passed "$out/device/ggml-cuda.json")" -gt 0 ]]; then
  verdicts+=("builtin:ggml-cuda: conforms, its recorded findings aside ($((SECONDS - t0)) s)")
elif ((rc == 0)); then
  # Every case declined: ggml not installed on this machine, or no CUDA device for it.
  verdicts+=("builtin:ggml-cuda: NOT RUN (every case declined; the reason is above)")
else
  # A failure that is no recorded finding: a finding of ggml to record, or a suite bug.
  verdicts+=("builtin:ggml-cuda: FAILED beyond its recorded findings (exit $rc; docs/FINDINGS.md)")
  status=1
fi

echo
echo "=== device-check summary"
printf '  %s\n' "${verdicts[@]}"
exit "$status"
