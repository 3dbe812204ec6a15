#!/bin/sh
# The progress log of `normcheck prop` when stderr is not a terminal: a line every 1000 passed
# tests, and one every --log-every seconds in between (a slow candidate, a CI system that stops a
# job silent for minutes); counts only grow; --log-every 0 leaves the thousands alone; a
# negative or non-finite interval is bad input. Usage: progress_log_test.sh NORMCHECK WORKDIR
set -u
nc=$1
dir=$2
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }

"$nc" prop --candidate builtin:cpu_welford --properties ln_sum_zero --max-size 10 --tests 300 --seed 1 --log-every 0.001 \
  > "$dir/timed.out" 2> "$dir/timed.err" || { cat "$dir/timed.out" "$dir/timed.err"; fail "the timed run exited $?"; }
cat "$dir/timed.err"
lines=$(grep -c '^builtin:cpu_welford ln_sum_zero: [0-9]* tests passed, [0-9]* s$' "$dir/timed.err")
[ "$lines" -ge 3 ] || fail "expected several timed progress lines at --log-every 0.001, got $lines"
grep -v '^builtin:cpu_welford ln_sum_zero: [0-9]* tests passed, [0-9]* s$' "$dir/timed.err" && fail "a line of another form"
sed 's/.*: \([0-9]*\) tests passed.*/\1/' "$dir/timed.err" | sort -n -c -u || fail "the counts do not grow"
grep -q '^PASSED *ln_sum_zero *300 tests' "$dir/timed.out" || fail "no PASSED line"

"$nc" prop --candidate builtin:cpu_welford --properties ln_sum_zero --max-size 10 --tests 1000 --seed 1 --log-every 0 \
  > "$dir/k.out" 2> "$dir/k.err" || fail "the --log-every 0 run exited $?"
[ "$(cat "$dir/k.err")" = "builtin:cpu_welford ln_sum_zero: 1000 tests passed, $(sed -n 's/.*passed, \([0-9]*\) s$/\1/p' "$dir/k.err") s" ] ||
  { cat "$dir/k.err"; fail "--log-every 0: expected the one line of the thousandth test"; }

for bad in -1 nan inf; do
  "$nc" prop --candidate builtin:cpu_welford --log-every "$bad" > "$dir/bad.out" 2>&1
  rc=$?
  [ $rc -eq 2 ] || fail "--log-every $bad exited $rc, expected 2"
  grep -q -- "--log-every" "$dir/bad.out" || fail "--log-every $bad: the message does not name the option"
done
echo "progress log: OK"
