#!/usr/bin/env bash
# Installs ONNX Runtime for the onnxruntime-* candidates: the npm package onnxruntime-node at the
# version pinned in conformance/candidates/onnxruntime/package-lock.json, into
# conformance/candidates/onnxruntime/node_modules/ (git ignores it). Idempotent.
#
# --ignore-scripts: the package's own install step downloads GPU binaries from elsewhere, which
# the CPU runtime does not need (its libonnxruntime.so for linux x64 is in the package itself).
#
# Not being able to install it (no npm, no network) is not an error of the suite: the script says
# so and exits 0, and the onnxruntime-* candidates then make every case UNSUPPORTED with that
# reason. Exit 1 only with --required.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/conformance/candidates/onnxruntime"
required=0
[[ "${1:-}" == "--required" ]] && required=1

fail() {
  echo "install-onnxruntime: $*; the onnxruntime-* candidates will be skipped" >&2
  exit "$required"
}

want="$(sed -n 's/^ *"onnxruntime-node": "\([0-9.]*\)".*/\1/p' "$dir/package.json")"
have="$(node -p "require('$dir/node_modules/onnxruntime-node/package.json').version" 2>/dev/null || true)"
if [[ -n "$have" && "$have" == "$want" ]]; then
  echo "install-onnxruntime: onnxruntime-node $have present"
  exit 0
fi
command -v node >/dev/null || fail "node is not installed"
if ! command -v npm >/dev/null; then
  # Debian's nodejs comes without npm (NodeSource's nodejs carries its own and conflicts with
  # Debian's npm package, so npm is only asked for when the command is missing).
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
  echo "install-onnxruntime: npm is missing; installing Debian's npm"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends --no-remove npm || true
  command -v npm >/dev/null || fail "npm is not installed"
fi
echo "install-onnxruntime: npm ci --ignore-scripts (onnxruntime-node $want) in $dir"
(cd "$dir" && timeout 600 npm ci --ignore-scripts --no-audit --no-fund) || fail "npm ci failed"
node -e "require('$dir/node_modules/onnxruntime-node')" || fail "onnxruntime-node does not load"
echo "install-onnxruntime: onnxruntime-node $want installed"
