#!/usr/bin/env bash
# Installs ggml (llama.cpp's tensor library) for the builtin:ggml-cpu, builtin:ggml-vulkan and
# builtin:ggml-cuda candidates (conformance/candidates/ggml/README.md). Idempotent. Nothing of ggml
# is committed:
#
#  - the prebuilt libraries: npm packages @node-llama-cpp/linux-x64-vulkan and linux-x64-cuda at the
#    version pinned in conformance/candidates/ggml/package-lock.json, `npm ci --ignore-scripts` into
#    conformance/candidates/ggml/node_modules/ (git ignores it). The first carries libggml-base.so,
#    the backend registry libggml.vulkan.v0.5.0.so, libggml-vulkan.so and every CPU variant
#    libggml-cpu-<isa>.so; the second libggml-cuda.so (builtin:ggml-cuda). --ignore-scripts:
#    nothing of the packages runs at install time.
#  - the headers: the npm package node-llama-cpp at the same version carries
#    llama/gitRelease.bundle, a git bundle of the matching llama.cpp source; it is cloned in a
#    temporary folder and only ggml/include is kept, in conformance/candidates/ggml/include-ggml/
#    (git ignores it). Its integrity is npm's (the sha512 of the tarball, pinned below).
#  - the Vulkan driver for the software device: Debian's mesa-vulkan-drivers (lavapipe),
#    libvulkan1 and vulkan-tools (vulkaninfo), listed in scripts/install-deps.sh.
#
# Not being able to install it (no npm, no network) is not an error of the suite: the script says
# so and exits 0, and the ggml-* candidates then make every case UNSUPPORTED with that reason.
# Exit 1 only with --required.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/conformance/candidates/ggml"
required=0
[[ "${1:-}" == "--required" ]] && required=1

# node-llama-cpp@3.22.1's tarball, as `npm view node-llama-cpp@3.22.1 dist.integrity` gives it.
headers_version="3.22.1"
headers_integrity="sha512-bltIipuWmc123H7tMIgDGKSsSrhmhlQYeVUC48XTjVW7XGJJiJJyCdlTMzQ/LiWoPkGDpcL4FviDpgw7qfTiDw=="

fail() {
  echo "install-ggml: $*; the ggml-* candidates will be skipped" >&2
  exit "$required"
}

# Both packages are pinned in package.json and package-lock.json; npm ci installs them together.
# The CUDA one (@node-llama-cpp/linux-x64-cuda, 143 MB) carries libggml-cuda.so, built against
# CUDA 13's runtime; its libggml-base.so is the Vulkan package's, byte for byte (the plugins link
# the Vulkan package's and load libggml-cuda.so from the CUDA package's folder).
missing=()
for p in linux-x64-vulkan linux-x64-cuda; do
  want="$(sed -n "s/^ *\"@node-llama-cpp\/$p\": \"\([0-9.]*\)\".*/\1/p" "$dir/package.json")"
  have="$(sed -n 's/^ *"version": "\([0-9.]*\)".*/\1/p' "$dir/node_modules/@node-llama-cpp/$p/package.json" 2>/dev/null | head -1 || true)"
  if [[ -n "$have" && "$have" == "$want" ]]; then
    echo "install-ggml: @node-llama-cpp/$p $have present"
  else
    missing+=("@node-llama-cpp/$p $want")
  fi
done
if ((${#missing[@]})); then
  command -v npm >/dev/null || fail "npm is not installed (scripts/install-onnxruntime.sh installs Debian's)"
  echo "install-ggml: npm ci --ignore-scripts (${missing[*]}) in $dir"
  (cd "$dir" && timeout 600 npm ci --ignore-scripts --no-audit --no-fund) || fail "npm ci failed"
  [[ -f "$dir/node_modules/@node-llama-cpp/linux-x64-vulkan/bins/linux-x64-vulkan/libggml-base.so" ]] ||
    fail "the package has no bins/linux-x64-vulkan/libggml-base.so"
  [[ -f "$dir/node_modules/@node-llama-cpp/linux-x64-cuda/bins/linux-x64-cuda/libggml-cuda.so" ]] ||
    fail "the package has no bins/linux-x64-cuda/libggml-cuda.so"
fi

inc="$dir/include-ggml"
if [[ -f "$inc/ggml.h" && -s "$inc/GGML_VERSION" && "$(cat "$inc/VERSION" 2>/dev/null)" == "node-llama-cpp@$headers_version" ]]; then
  echo "install-ggml: ggml headers (node-llama-cpp@$headers_version) present"
  exit 0
fi
command -v npm >/dev/null || fail "npm is not installed"
command -v git >/dev/null || fail "git is not installed"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "install-ggml: ggml/include from node-llama-cpp@$headers_version's llama/gitRelease.bundle"
(cd "$tmp" && timeout 600 npm pack --silent "node-llama-cpp@$headers_version" >pack.txt) || fail "npm pack node-llama-cpp failed"
tgz="$tmp/$(tail -1 "$tmp/pack.txt")"
got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
[[ "$got" == "$headers_integrity" ]] || fail "node-llama-cpp@$headers_version's tarball has integrity $got, expected $headers_integrity"
tar -xzf "$tgz" -C "$tmp" package/llama/gitRelease.bundle || fail "no llama/gitRelease.bundle in node-llama-cpp@$headers_version"
git -c advice.detachedHead=false clone -q "$tmp/package/llama/gitRelease.bundle" "$tmp/llama.cpp" || fail "git clone of the bundle failed"
[[ -f "$tmp/llama.cpp/ggml/include/ggml.h" ]] || fail "the bundle has no ggml/include/ggml.h"
rm -rf "$inc.new"
cp -r "$tmp/llama.cpp/ggml/include" "$inc.new"
echo "node-llama-cpp@$headers_version" >"$inc.new/VERSION"
(cd "$tmp/llama.cpp" && git log -1 --format='%H %cd' >"$inc.new/COMMIT")
sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' "$tmp/llama.cpp/ggml/CMakeLists.txt" | paste -sd. >"$inc.new/GGML_VERSION"
rm -rf "$inc"
mv "$inc.new" "$inc"
echo "install-ggml: headers in $inc (llama.cpp $(cut -c1-12 "$inc/COMMIT"))"
