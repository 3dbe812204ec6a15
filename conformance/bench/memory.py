#!/usr/bin/python3
"""Peak memory (maximum resident set size, from GNU time) of the commands a
CI job runs, against the size of the largest case they touch and of the whole file:

  1. normcheck fixtures generate --tier TIER      (the certified reference writing the tier)
  2. normcheck check --fixtures F --outputs O     (O: the fixtures' own values, a perfect candidate)
  3. normcheck run --candidate builtin:cpu_welford --fixtures F
  4. normcheck prop --candidate builtin:cpu_welford --properties agreement --tests N

A bound by the largest case (one case in memory at a time, plus the one read ahead) shows as a
peak that stays near the largest case while the file grows; a bound by the file would not.
Prints a Markdown table (conformance/README.md, "Memory").

--scaling N1,N2 measures that directly: two case lists with the same largest case (LayerNorm
float32 128x4096, forward and backward) and N1 or N2 copies of a small one (16x256, forward and
backward), so the second file is about N2/N1 times the first while the largest case stays; the
same three file commands run on each, and prop at --tests/10 and --tests.

usage: memory.py --normcheck build/bin/normcheck [--tier ci] [--tests 10000] [--work DIR]
       memory.py --normcheck build/bin/normcheck --scaling 20,200 [--tests 10000] [--work DIR]
"""
import json
import argparse
import os
import subprocess
import sys
import tempfile
import time

import h5py

TIME = "/usr/bin/time"  # GNU time (Debian's `time`)


def peak(cmd):
    """(wall seconds, peak RSS in MiB, exit status) of cmd, its output discarded. The peak comes
    from GNU time (`/usr/bin/time -f %M`), not from this process's wait4: Linux carries the
    high-water RSS of the image a child replaces at exec into the child's ru_maxrss, and a child
    spawned from this Python (80 MiB after writing an outputs file) would report at least that."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        t0 = time.monotonic()
        p = subprocess.run([TIME, "-f", "%M", "-o", rss.name, *cmd], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
        wall = time.monotonic() - t0
        err = p.stderr.decode(errors="replace")
        code = p.returncode
        if code not in (0, 1):
            sys.exit(f"{' '.join(cmd)} exited {code}:\n{err}")
        kib = int(rss.read().split()[-1])
    return wall, kib / 1024, code


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


def file_commands(nc, source, work, tag):
    """Peaks of generate (from a tier name or a case list path), check and run, on one file."""
    fx, outs = os.path.join(work, f"{tag}.h5"), os.path.join(work, f"{tag}-outputs.h5")
    src = ["--cases", source] if source.endswith(".json") else ["--tier", source]
    rows = [(f"`fixtures generate {' '.join(src) if not source.endswith('.json') else '--cases LIST'}`",
             peak([nc, "fixtures", "generate", *src, "-o", fx, "--force"]))]
    write_outputs(fx, outs)
    rows.append(("`check` (a perfect outputs file)",
                 peak([nc, "check", "--fixtures", fx, "--outputs", outs, "--json",
                       os.path.join(work, f"{tag}-check.json"), "--force"])))
    rows.append(("`run --candidate builtin:cpu_welford`",
                 peak([nc, "run", "--candidate", "builtin:cpu_welford", "--fixtures", fx, "--json",
                       os.path.join(work, f"{tag}-run.json"), "--force"])))
    return fx, rows


def prop_row(nc, tests):
    return (f"`prop --candidate builtin:cpu_welford --properties agreement --tests {tests}`",
            peak([nc, "prop", "--candidate", "builtin:cpu_welford", "--properties", "agreement", "--tests",
                  str(tests), "--seed", "1"]))


def scaling_list(path, copies):
    """A case list: one large case (forward, backward) and `copies` small ones (forward, backward)."""
    dirs = [{"name": "fwd", "direction": "forward"}, {"name": "bwd", "direction": "backward"}]
    doc = {"format": "normcheck-case-list", "version": 1, "tier": f"memory{copies}",
           "description": "memory.py --scaling: one large case and many small ones",
           "cases": [
               {"grid": {"dir": dirs}, "id": "large_{dir}", "category": "hidden_size",
                "description": "the largest case", "op": "layernorm", "affine": "weight_bias",
                "shape": [128, 4096]},
               {"grid": {"copy": list(range(copies)), "dir": dirs}, "id": "small{copy}_{dir}",
                "category": "normal", "description": "one of many small cases", "op": "layernorm",
                "affine": "weight_bias", "shape": [16, 256]}]}
    with open(path, "w") as f:
        json.dump(doc, f)


def describe(fx):
    sizes = case_bytes(fx)
    mib = 1024 * 1024
    return (f"{len(sizes)} cases, {sum(s for s, _ in sizes) / mib:.1f} MiB of datasets uncompressed, "
            f"the file {os.path.getsize(fx) / mib:.1f} MiB; largest case {sizes[0][1]} {sizes[0][0] / mib:.1f} MiB")


def scaling(a, nc, work):
    counts = [int(n) for n in a.scaling.split(",")]
    results = []
    for n in counts:
        lst = os.path.join(work, f"memory{n}.json")
        scaling_list(lst, n)
        fx, rows = file_commands(nc, lst, work, f"memory{n}")
        results.append((n, describe(fx), rows))
    props = [prop_row(nc, max(1, a.tests // 10)), prop_row(nc, a.tests)]
    for n, what, _ in results:
        print(f"{n} small cases: {what}")
    print()
    print("| command | " + " | ".join(f"{n} small cases: peak MiB (wall s)" for n in counts) + " |")
    print("|---|" + "---:|" * len(counts))
    for i, (what, _) in enumerate(results[0][2]):
        cells = [f"{r[2][i][1][1]:.1f} ({r[2][i][1][0]:.1f})" + ("" if r[2][i][1][2] == 0 else f" exit {r[2][i][1][2]}")
                 for r in results]
        print(f"| {what} | " + " | ".join(cells) + " |")
    print()
    print("| command | peak MiB | wall s |")
    print("|---|---:|---:|")
    for what, (wall, rss, code) in props:
        print(f"| {what} | {rss:.1f} | {wall:.1f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--normcheck", required=True)
    ap.add_argument("--tier", default="ci")
    ap.add_argument("--tests", type=int, default=10000)
    ap.add_argument("--scaling", help="N1,N2: files with N1 and N2 small cases beside one large case")
    ap.add_argument("--work")
    a = ap.parse_args()
    if not os.access(TIME, os.X_OK):
        sys.exit(f"memory.py: needs GNU time at {TIME} (apt install time)")
    work = a.work or tempfile.mkdtemp(prefix="normcheck-memory-")
    os.makedirs(work, exist_ok=True)
    nc = a.normcheck
    if a.scaling:
        scaling(a, nc, work)
        return
    fx, rows = file_commands(nc, a.tier, work, a.tier)
    rows.append(prop_row(nc, a.tests))
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
