#!/usr/bin/python3
"""Peak memory (maximum resident set size, ru_maxrss of the child from wait4) of the commands a
CI job runs, against the size of the largest case they touch and of the whole file:

  1. normcheck fixtures generate --tier TIER      (the certified reference writing the tier)
  2. normcheck check --fixtures F --outputs O     (O: the fixtures' own values, a perfect candidate)
  3. normcheck run --candidate builtin:cpu_welford --fixtures F
  4. normcheck prop --candidate builtin:cpu_welford --properties agreement --tests N

A bound by the largest case (one case in memory at a time, plus the one read ahead) shows as a
peak that stays near the largest case while the file grows; a bound by the file would not.
Prints a Markdown table (conformance/README.md, "Memory").

usage: memory.py --normcheck build/bin/normcheck [--tier ci] [--tests 10000] [--work DIR]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import h5py


def peak(cmd):
    """(wall seconds, peak RSS in MiB, exit status) of cmd, its output discarded."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        sys.exit(f"{' '.join(cmd)} exited {code}:\n{err}")
    return wall, usage.ru_maxrss / 1024, code


def case_bytes(fixtures):
    """Bytes of the datasets of each case (uncompressed), largest first."""
    sizes = []
    with h5py.File(fixtures, "r") as f:
        for cid, case in f["cases"].items():
            n = 0
            def add(_, obj):
                nonlocal n
                if isinstance(obj, h5py.Dataset):
                    n += obj.size * obj.dtype.itemsize
            case.visititems(add)
            sizes.append((n, cid))
    return sorted(sizes, reverse=True)


def write_outputs(fixtures, path):
    with h5py.File(fixtures, "r") as fx, h5py.File(path, "w") as out:
        for cid, case in fx["cases"].items():
            for name, ds in case["expected"].items():
                out.create_dataset(f"cases/{cid}/outputs/{name}", data=ds[...])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--normcheck", required=True)
    ap.add_argument("--tier", default="ci")
    ap.add_argument("--tests", type=int, default=10000)
    ap.add_argument("--work")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="normcheck-memory-")
    os.makedirs(work, exist_ok=True)
    fx, outs = os.path.join(work, f"{a.tier}.h5"), os.path.join(work, "outputs.h5")
    nc = a.normcheck
    rows = []
    rows.append((f"`fixtures generate --tier {a.tier}`",
                 peak([nc, "fixtures", "generate", "--tier", a.tier, "-o", fx, "--force"])))
    write_outputs(fx, outs)
    rows.append(("`check` (a perfect outputs file)",
                 peak([nc, "check", "--fixtures", fx, "--outputs", outs, "--json", os.path.join(work, "check.json"),
                       "--force"])))
    rows.append(("`run --candidate builtin:cpu_welford`",
                 peak([nc, "run", "--candidate", "builtin:cpu_welford", "--fixtures", fx, "--json",
                       os.path.join(work, "run.json"), "--force"])))
    rows.append((f"`prop --candidate builtin:cpu_welford --properties agreement --tests {a.tests}`",
                 peak([nc, "prop", "--candidate", "builtin:cpu_welford", "--properties", "agreement", "--tests",
                       str(a.tests), "--seed", "1"])))
    sizes = case_bytes(fx)
    mib = 1024 * 1024
    print(f"{a.tier} tier: {len(sizes)} cases, {sum(s for s, _ in sizes) / mib:.1f} MiB of datasets uncompressed, "
          f"the file {os.path.getsize(fx) / mib:.1f} MiB; largest case {sizes[0][1]} {sizes[0][0] / mib:.1f} MiB, "
          f"second {sizes[1][1]} {sizes[1][0] / mib:.1f} MiB")
    print()
    print("| command | wall s | peak RSS MiB | exit |")
    print("|---|---:|---:|---:|")
    for what, (wall, rss, code) in rows:
        print(f"| {what} | {wall:.1f} | {rss:.1f} | {code} |")


if __name__ == "__main__":
    main()
