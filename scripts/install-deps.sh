#!/usr/bin/env bash
# Installs the Debian packages normcheck needs to build and test. Idempotent: packages that are
# already present are not reinstalled, and apt is not touched at all when nothing is missing.
# Usage: scripts/install-deps.sh            (build + test dependencies)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  ccache                                        # compiler cache: a rebuild in another clone reuses objects
  libboost-dev libmpfr-dev libgmp-dev          # certified reference: Boost.Multiprecision over MPFR/GMP
  libhdf5-dev                                   # golden fixtures (C and C++ APIs)
  libgtest-dev libgmock-dev librapidcheck-dev   # tests and property tests
  libbenchmark-dev                              # reference speed benchmark
  libcli11-dev nlohmann-json3-dev libfmt-dev    # CLI, JSON case/results files, formatting
  python3-mpmath python3-numpy python3-h5py     # independent cross-check; h5py reads fixtures (tests)
  libdnnl-dev                                   # bundled candidate: oneDNN layer normalization
  ocl-icd-opencl-dev opencl-headers pocl-opencl-icd  # bundled candidate: OpenCL kernel, run on PoCL
  python3-torch                                 # bundled candidate: the PyTorch adapter (CPU)
  nodejs libxml2-utils chromium                 # reports: Chart.js from npm, xmllint (JUnit schema), headless HTML test
  python3-onnx                                  # bundled candidates: ONNX Runtime (Node adapter, models by onnx.helper)
  mesa-vulkan-drivers libvulkan1 vulkan-tools   # bundled candidate ggml-vulkan: Mesa's software Vulkan device (lavapipe)
  pybind11-dev python3-dev python3-pytest       # the Python module (import normcheck) and its pytest suite
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# ONNX Runtime comes from npm (scripts/install-onnxruntime.sh); failing to get it is not fatal.
# So does ggml (scripts/install-ggml.sh: node-llama-cpp's prebuilt libraries and the headers).
trap '"$(dirname "${BASH_SOURCE[0]}")/install-onnxruntime.sh"; "$(dirname "${BASH_SOURCE[0]}")/install-ggml.sh"' EXIT

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  "$(dirname "${BASH_SOURCE[0]}")/install-report-deps.sh"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
"$(dirname "${BASH_SOURCE[0]}")/install-report-deps.sh"
