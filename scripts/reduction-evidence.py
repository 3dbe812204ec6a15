#!/usr/bin/python3
"""The evidence for the declared reduction classes (conformance/TOLERANCE.md, section 9).

usage: reduction-evidence.py FIXTURES.h5 BUILD_DIR [OUT_DIR] [--cases GLOB]

Runs every test kernel of conformance/candidates/reduction/ (BUILD_DIR/reduction_kernels/) over
the fixture file, each under the class it declares, and prints one line per kernel: the correct
ones with their verdict counts (they must have no FAILED case), the faulty ones with the number
of cases that reject them and the largest error / allowance over the cases at hidden size 4096
or more (the issue asks >= 10x there) and over all cases. Exits 1 if a correct kernel fails or a
faulty one is not rejected. Results files go to OUT_DIR (default: a temporary folder). --cases
runs only the cases whose id matches GLOB (CI runs the ci tier's '*prod*' cases: the full tier
takes about 13 CPU s).
"""
import glob
import json
import math
import os
import subprocess
import sys
import tempfile


def ratio(o):
    """An output's largest error / allowance as a float (the results file writes inf as a string)."""
    v = o.get("max_ratio", 0)
    try:
        v = float(v)
    except (TypeError, ValueError):
        return 0.0
    return 0.0 if math.isnan(v) else v


def main():
    args = sys.argv[1:]
    case_args = []
    if "--cases" in args:
        i = args.index("--cases")
        if i + 1 >= len(args):
            print(__doc__, file=sys.stderr)
            return 2
        case_args = ["--cases", args[i + 1]]
        del args[i:i + 2]
    if len(args) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    fixtures, build = args[0], args[1]
    out = args[2] if len(args) == 3 else tempfile.mkdtemp(prefix="reduction-evidence-")
    os.makedirs(out, exist_ok=True)
    exe = os.path.join(build, "bin", "normcheck")
    kernels = sorted(glob.glob(os.path.join(build, "reduction_kernels", "librk_*.so")))
    if not kernels:
        print(f"no kernels in {build}/reduction_kernels (build the rk_* targets)", file=sys.stderr)
        return 2
    bad = False
    for so in kernels:
        name = os.path.basename(so)[len("librk_"):-len(".so")]
        res = os.path.join(out, name + ".json")
        subprocess.run([exe, "run", "--candidate", "plugin:" + so, "--fixtures", fixtures, "--json", res, "--force",
                        "--no-diagnosis", "--max-print", "0", "--allow-empty"] + case_args,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        j = json.load(open(res))
        cases = j["cases"]
        verdicts = {}
        for c in cases:
            verdicts[c["verdict"]] = verdicts.get(c["verdict"], 0) + 1
        red = j["candidate"].get("reduction", "any")
        if name.startswith("fault_"):
            failed = [c for c in cases if c["verdict"] == "FAILED"]

            def best(cs):
                r = [(ratio(o), c["case_id"], o["name"]) for c in cs for o in c.get("outputs", [])]
                return max(r) if r else (0, "-", "-")
            prod = [c for c in failed if "_h4096" in c["case_id"] or "_h8192" in c["case_id"]]
            r_all, r_prod = best(failed), best(prod)
            print(f"{name:24} {red:15} rejected by {len(failed):3} cases; largest ratio at H>=4096 "
                  f"{r_prod[0]:10.3g} ({r_prod[1]} {r_prod[2]}), anywhere {r_all[0]:10.3g} ({r_all[1]} {r_all[2]})")
            bad |= not failed
        else:
            worst = max(((ratio(o), c["case_id"], o["name"]) for c in cases for o in c.get("outputs", [])
                         if c["verdict"] != "UNSUPPORTED"), default=(0, "-", "-"))
            print(f"{name:24} {red:15} " + " ".join(f"{k} {v}" for k, v in sorted(verdicts.items())) +
                  f"; largest ratio {worst[0]:.6g} ({worst[1]} {worst[2]})")
            bad |= verdicts.get("FAILED", 0) > 0
    print(f"results files in {out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
