#!/usr/bin/env bash
# Fails if any of the given object files defines a weak or unique symbol (nm types W, V, u):
# for the per-ISA builds of the hot loops, the linker could keep such an AVX-512 copy of a
# shared inline function for the whole program (src/row_kernel.hpp).
set -uo pipefail
[[ $# -gt 0 ]] || { echo "no object files given"; exit 1; }
status=0
for o in "$@"; do
  [[ -f "$o" ]] || { echo "missing: $o"; exit 1; }
  if weak=$(nm -C "$o" | grep -E ' [WVu] '); then
    echo "$o defines weak symbols:"
    echo "$weak"
    status=1
  fi
done
exit $status
