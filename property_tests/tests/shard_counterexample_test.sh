#!/bin/sh
# A sharded property's counterexample carries its shard plan: the emulation with a planted fault
# (shard:emulation:averaged) fails sharded_agreement; the results file's counterexample has the
# plan and the fault, the printout a "plan:" line, and its replay command (normcheck-shard-check
# --emulate PLAN --fault FAULT on the counterexample file) fails the case again, while the correct
# emulation of the same plan passes it. Bad input exits 2.
# Usage: shard_counterexample_test.sh NORMCHECK NORMCHECK_SHARD_CHECK WORKDIR
set -u
nc=$1
sc=$2
dir=$3
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "FAIL: $*"; exit 1; }

"$nc" prop --candidate shard:emulation:averaged --properties sharded_agreement --tests 300 --seed 1 \
  --save-failures "$dir/cx" --json "$dir/r.json" > "$dir/prop.log" 2>&1
rc=$?
cat "$dir/prop.log"
[ $rc -eq 1 ] || fail "sharded_agreement on the averaging emulation exited $rc, expected 1"
grep -q '^FAILED *sharded_agreement' "$dir/prop.log" || fail "no FAILED line for sharded_agreement"
grep -q '^  plan: .*sp=.*, fault averaged$' "$dir/prop.log" || fail "the printed counterexample has no plan line"
/usr/bin/python3 - "$dir/r.json" "$dir" <<'PY' || fail "results file"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["mode"] == "prop" and j["candidate"]["spec"] == "shard:emulation:averaged", j["candidate"]
assert j["candidate"]["kind"] == "mutant" and j["candidate"]["fault"] == "averaged", j["candidate"]
p = j["properties"][0]
assert p["name"] == "sharded_agreement" and p["verdict"] == "FAILED", p
cx = p["counterexample"]
# averaging shows only under sp ranks, in the gradients of a backward case
assert "sp=" in cx["plan"] and cx["fault"] == "averaged", cx
assert cx["fixture"].endswith(".h5"), cx
assert cx["replay"].startswith("normcheck-shard-check --fixtures ") and "--emulate " in cx["replay"], cx
assert cx["replay"].endswith(" --fault averaged"), cx
open(sys.argv[2] + "/replay", "w").write(cx["replay"])
open(sys.argv[2] + "/plan", "w").write(cx["plan"])
open(sys.argv[2] + "/fixture", "w").write(cx["fixture"])
PY
replay=$(cat "$dir/replay")
plan=$(cat "$dir/plan")
f=$(cat "$dir/fixture")
"$nc" fixtures verify "$f" || fail "the counterexample's expected values do not verify"
# The replay fails the case again, with the fault named ...
eval "\"$sc\" ${replay#normcheck-shard-check }" > "$dir/replay.log" 2>&1
rc=$?
cat "$dir/replay.log"
[ $rc -eq 1 ] || fail "the replay exited $rc, expected 1"
grep -q 'averaged: the all-reduced sum divided by' "$dir/replay.log" || fail "the replay does not diagnose the fault"
# ... and the correct emulation of the same plan passes it.
"$sc" --fixtures "$f" --emulate "$plan" > "$dir/correct.log" 2>&1 ||
  { cat "$dir/correct.log"; fail "the correct emulation of plan $plan does not pass the counterexample"; }

# Bad input: exit 2 with a message.
"$nc" prop --candidate shard:emulation:no_such_fault > "$dir/bad.log" 2>&1
[ $? -eq 2 ] || fail "an unknown emulated fault was not refused"
grep -q "unknown fault 'no_such_fault'" "$dir/bad.log" || fail "no message for the unknown fault"
"$sc" --fixtures "$f" --emulate "tp=1" > /dev/null 2>&1; [ $? -eq 2 ] || fail "a plan of one rank"
"$sc" --fixtures "$f" --emulate "$plan" --fault nonsense > /dev/null 2>&1; [ $? -eq 2 ] || fail "an unknown --fault"
"$sc" --fixtures "$f" > /dev/null 2>&1; [ $? -eq 2 ] || fail "neither outputs nor --emulate"
"$sc" --fixtures "$f" --fault averaged out.h5 > /dev/null 2>&1; [ $? -eq 2 ] || fail "--fault without --emulate"
# A damaged fixture (one bit of a certified binary64 value flipped on disk) is refused, named.
cp "$f" "$dir/damaged.h5"
/usr/bin/python3 - "$dir/damaged.h5" <<'PY' || fail "cannot damage the copy"
import sys, h5py
with h5py.File(sys.argv[1], "r") as h:
    cid = sorted(h["cases"])[0]
    g = h[f"cases/{cid}/expected_f64"]
    off = g[sorted(g)[0]].id.get_offset()
with open(sys.argv[1], "r+b") as fh:
    fh.seek(off + 2)
    b = fh.read(1)
    fh.seek(off + 2)
    fh.write(bytes([b[0] ^ 0x04]))
PY
"$sc" --fixtures "$dir/damaged.h5" --emulate "$plan" > "$dir/damaged.log" 2>&1
[ $? -eq 2 ] || { cat "$dir/damaged.log"; fail "a damaged fixture was not refused with exit 2"; }
grep -q "expected_f64/.*checksum mismatch" "$dir/damaged.log" || { cat "$dir/damaged.log"; fail "no message naming the damaged dataset"; }
echo "OK"
