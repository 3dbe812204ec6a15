#!/bin/sh
# Every counterexample kept in property_tests/findings/ (README.md, "Known limits") was a false
# alarm on the correct kernels that the tolerance model or the reference now handles: each bundled
# correct kernel conforms on each file (exit 0: PASSED or MISTRUSTED, nothing FAILED).
# usage: findings_test.sh NORMCHECK FINDINGS_DIR
set -eu
normcheck=$1
dir=$2
n=0
for f in "$dir"/*.h5; do
  "$normcheck" run --builtins correct --fixtures "$f" --max-print 0 >/dev/null || {
    echo "a correct kernel fails $f:" >&2
    "$normcheck" run --builtins correct --fixtures "$f" >&2 || true
    exit 1
  }
  n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "no findings in $dir" >&2; exit 1; }
echo "the correct kernels conform on all $n findings"
