#!/usr/bin/env bash
# The examples as a user meets them: install normcheck from BUILD_DIR into a fresh prefix, then
# configure, build and test each example project against that prefix alone. The kernel library
# must conform; the same library built with a planted fault must fail its conformance test; the
# Python kernel must conform. Usage: test_examples.sh BUILD_DIR
set -euo pipefail
build_dir="$(cd "$1" && pwd)"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)

fail() { echo "FAIL: $*" >&2; exit 1; }

echo "--- install into $prefix"
cmake --install "$build_dir" --prefix "$prefix" >/dev/null
for f in bin/normcheck include/normcheck/candidate.h share/normcheck/python/normcheck_protocol.py \
         share/normcheck/python/torch_adapter.py \
         share/normcheck/cases/smoke.json lib/cmake/normcheck/normcheckConfig.cmake \
         lib/cmake/normcheck/NormcheckConformanceTest.cmake; do
  [[ -e "$prefix/$f" ]] || fail "the install lacks $f"
done
# The installed CLI finds its case lists under the prefix first (the message for an unknown
# tier lists where it looked).
msg="$("$prefix/bin/normcheck" fixtures generate --tier no_such_tier -o "$work/x.h5" 2>&1 || true)"
[[ "$msg" == *"$prefix/share/normcheck/cases"* ]] || fail "installed normcheck does not look in its prefix: $msg"

configure() {  # configure SRC BIN [cmake args...]
  local src="$1" bin="$2"; shift 2
  cmake -S "$src" -B "$bin" "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix" "$@" >/dev/null
  cmake --build "$bin" >/dev/null
}
passed_cases() {  # passed_cases RESULTS.json -> number of PASSED cases
  /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["PASSED"])' "$1"
}

echo "--- kernel-library: the RMSNorm plugin must conform"
configure "$here/kernel-library" "$work/kl"
ctest --test-dir "$work/kl" --output-on-failure || fail "kernel-library's conformance tests failed"
# (The listing is read whole: grep -q would stop reading early, and under pipefail the SIGPIPE
# that ctest then gets would fail the check at random.)
listed="$(ctest --test-dir "$work/kl" -N)"
[[ "$listed" == *"tiny_rmsnorm.conformance.properties"* ]] || fail "no property test registered"
n="$(passed_cases "$work/kl/normcheck-results/tiny_rmsnorm.json")"
(( n >= 5 )) || fail "kernel-library: only $n cases passed; the kernel was hardly exercised"
echo "kernel-library: $n cases passed"
junit="$work/kl/normcheck-junit/tiny_rmsnorm.xml"
[[ -s "$junit" ]] || fail "kernel-library: no JUnit file"
if command -v xmllint >/dev/null; then
  xmllint --noout --schema "$here/../../reports/junit.xsd" "$junit" || fail "kernel-library: JUnit not valid"
fi

# The installed CLI writes the HTML report with its own copy of Chart.js.
env -u NORMCHECK_REPORT_WEB_DIR "$prefix/bin/normcheck" report "$work/kl/normcheck-results/tiny_rmsnorm.json" \
  --html "$work/report" --markdown "$work/summary.md" >/dev/null || fail "installed normcheck report failed"
grep -q "Chart.js" "$work/report/index.html" || fail "the installed report lacks Chart.js"

echo "--- kernel-library with eps outside the sqrt: its conformance test must fail"
configure "$here/kernel-library" "$work/kl-fault" -DTINY_PLANT_FAULT=ON
if ctest --test-dir "$work/kl-fault" >"$work/fault.log" 2>&1; then
  cat "$work/fault.log"; fail "the planted fault passed the conformance test"
fi
/usr/bin/python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["summary"]; assert s["FAILED"] > 0, s' \
  "$work/kl-fault/normcheck-results/tiny_rmsnorm.json" || fail "the planted fault produced no FAILED case"
echo "kernel-library with the planted fault: rejected, as it must be"

echo "--- python-kernel: the PyTorch RMSNorm module must conform"
configure "$here/python-kernel" "$work/py"
ctest --test-dir "$work/py" --output-on-failure || fail "python-kernel's conformance test failed"
n="$(passed_cases "$work/py/normcheck-results/rmsnorm_torch.json")"
(( n >= 5 )) || fail "python-kernel: only $n cases passed"
echo "python-kernel: $n cases passed"
if [[ -d "$here/pytest" ]] && compgen -G "$build_dir/python/normcheck/_core*.so" >/dev/null; then
  echo "--- pytest: a kernel repository's own pytest suite with import normcheck, from the install"
  # The CMake package says where the module is; the suite imports it from there alone.
  mkdir -p "$work/findpy"
  printf 'cmake_minimum_required(VERSION 3.25)\nproject(p NONE)\nfind_package(normcheck CONFIG REQUIRED)\nmessage(STATUS "PYDIR=${NORMCHECK_PYTHON_MODULE_DIR}")\n' \
    > "$work/findpy/CMakeLists.txt"
  pydir="$(cmake -S "$work/findpy" -B "$work/findpy/b" -DCMAKE_PREFIX_PATH="$prefix" | sed -n 's/^-- PYDIR=//p')"
  [[ "$pydir" == "$prefix"/lib/python3*/dist-packages && -d "$pydir/normcheck" ]] \
    || fail "the CMake package does not give the installed Python module: '$pydir'"
  cp -r "$here/pytest" "$work/pytest"
  pyrun() { (cd "$work/pytest" && env PYTHONPATH="$pydir" PYTHONDONTWRITEBYTECODE=1 "$@"); }
  where="$(pyrun /usr/bin/python3 -c 'import normcheck, normcheck.fixtures as f; print(normcheck.__file__, f.tier_path("smoke"))')"
  [[ "$where" == "$pydir/normcheck/__init__.py $prefix/share/normcheck/cases/smoke.json" ]] \
    || fail "import normcheck does not come from the install: $where"
  pyrun /usr/bin/python3 -m pytest -p no:cacheprovider -q tests || fail "the pytest example's suite failed"
  if pyrun env NORMCHECK_EXAMPLE_FAULTY=1 NORMCHECK_SAVE_FAILURES="$work/failures" \
       /usr/bin/python3 -m pytest -p no:cacheprovider -q tests/test_faulty.py >"$work/faulty.log" 2>&1; then
    cat "$work/faulty.log"; fail "the faulty kernel passed its pytest"
  fi
  grep -q "eps added outside the sqrt" "$work/faulty.log" || { cat "$work/faulty.log"; fail "no diagnosis in the faulty kernel's failure"; }
  grep -q "recheck: normcheck check --fixtures $work/failures/" "$work/faulty.log" || fail "no recheck line"
  echo "pytest example: the suite passes; the faulty kernel fails with the diagnosis, as it must"
fi
echo "examples: OK"
