#!/usr/bin/python3
"""The harness's own evidence over a tier: false alarms, mutation score, separation margin.

Runs every built-in candidate (correct kernels and mutants) over a fixture file with
`normcheck run --builtins all --json-dir`, then reads the results files (reports/RESULTS.md):

  * correct candidates: FAILED/CRASHED/TIMEOUT/MISSING counts (must be 0) and their largest error
    in tolerance units (max_ratio) over every compared output;
  * mutants: rejected or not (mutation score), how many cases reveal each, and the smallest
    error in tolerance units among the outputs that reveal it (its case's largest ratio);
  * separation margin: the smallest revealing mutant ratio over the largest correct ratio.

usage: evidence.py --normcheck build/bin/normcheck --fixtures out/ci.h5 [--out DIR] [--markdown]
Exit status 1 if a correct candidate fails or a mutant escapes.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

FAIL = {"FAILED", "CRASHED", "TIMEOUT", "MISSING"}


def ratio(o):
    r = o.get("max_ratio", 0)
    return float("inf") if r == "inf" else float(r)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--normcheck", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--out", help="keep the results files here")
    ap.add_argument("--markdown", action="store_true", help="print tables in Markdown")
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="normcheck-evidence-")
    os.makedirs(out, exist_ok=True)
    cmd = [a.normcheck, "run", "--builtins", "all", "--fixtures", a.fixtures, "--json-dir", out, "--force",
           "--max-print", "0"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode not in (0, 1):
        sys.exit(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    correct, mutants = [], []
    for name in sorted(os.listdir(out)):
        if not name.endswith(".json"):
            continue
        j = json.load(open(os.path.join(out, name)))
        cand = j["candidate"]
        s = j["summary"]
        if cand["kind"] == "external":
            continue  # real libraries with recorded findings (builtin:ggml-*): held to known_findings.json
        if cand["kind"] == "mutant":
            revealing = [c for c in j["cases"] if c["verdict"] in FAIL]
            # The closest call: over revealing cases, the largest ratio of the case (what made it
            # fail), and the smallest of those over cases.
            per_case = [max((ratio(o) for o in c["outputs"]), default=float("inf")) for c in revealing]
            closest = min(per_case, default=None)
            clearest = max(per_case, default=None)
            mutants.append((cand["spec"], cand.get("fault_class", "?"), len(revealing), closest, clearest, s))
        else:
            worst = max((ratio(o) for c in j["cases"] for o in c["outputs"] if o["verdict"] in ("PASSED", "FAILED")),
                        default=0.0)
            fails = sum(s[k] for k in FAIL)
            correct.append((cand["spec"], fails, worst, s))
    bar = "|" if a.markdown else " "
    print(f"fixtures: {a.fixtures}\n")
    print("correct candidates (must have 0 failures):")
    if a.markdown:
        print("\n| candidate | PASSED | MISTRUSTED | UNSUPPORTED | failures | largest error / allowance |\n|---|---|---|---|---|---|")
    for spec, fails, worst, s in correct:
        if a.markdown:
            print(f"| `{spec}` | {s['PASSED']} | {s['MISTRUSTED']} | {s['UNSUPPORTED']} | {fails} | {worst:.3g} |")
        else:
            print(f"  {spec:<36} passed {s['PASSED']:>4}  mistrusted {s['MISTRUSTED']:>3}  unsupported "
                  f"{s['UNSUPPORTED']:>3}  failures {fails:>3}  largest error/allowance {worst:.3g}")
    rejected = sum(1 for m in mutants if m[2] > 0)
    print(f"\nmutants: {rejected} of {len(mutants)} rejected "
          f"(mutation score {100.0 * rejected / max(1, len(mutants)):.1f} %)")
    if a.markdown:
        print("\n| mutant | class | revealing cases | error / allowance on its clearest case | on its closest case |"
              "\n|---|---|---|---|---|")
    for spec, cls, n, closest, clearest, s in mutants:
        c = "-" if closest is None else f"{closest:.3g}"
        cl = "-" if clearest is None else f"{clearest:.3g}"
        if a.markdown:
            print(f"| `{spec}` | {cls} | {n} | {cl} | {c} |")
        else:
            print(f"  {spec:<40} class {cls}  revealing cases {n:>4}  error/allowance: clearest {cl:>9}  closest {c}")
    worst_correct = max((c[2] for c in correct), default=0.0)
    weakest = min((m[4] for m in mutants if m[4] is not None), default=None)
    if weakest is not None and worst_correct > 0:
        print(f"\nseparation: largest error of a correct candidate {worst_correct:.3g} x its allowance; the least "
              f"visible mutant reaches {weakest:.3g} x on its clearest case: margin {weakest / worst_correct:.3g}x")
    print(f"results files: {out}")
    bad = any(c[1] for c in correct) or rejected < len(mutants)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
