#!/usr/bin/python3
"""Evidence for property_tests/README.md: which property catches each bundled mutant, after how
many tests, and how small the shrunk counterexample is; and that the correct candidates pass.

    property_tests/evidence.py --normcheck build/bin/normcheck --mutants --tests 1000 --out DIR
    property_tests/evidence.py --normcheck build/bin/normcheck --correct --tests 10000 --out DIR

Mutants: the properties are tried in order (agreement first) and the first that fails is
reported (a mutant needs only one). Correct candidates: every property must pass. Each run of
`normcheck prop` writes its results file (normcheck-results v1, mode prop) into DIR; a Markdown
table goes to stdout. Exit 0 when every mutant is caught and no correct candidate fails.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def candidates(normcheck, kind):
    out = subprocess.run([normcheck, "candidates", "--json"], check=True, capture_output=True, text=True).stdout
    return [c["name"] for c in json.loads(out) if c["kind"] == kind]


def properties(normcheck):
    out = subprocess.run([normcheck, "prop", "--list"], check=True, capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def run_prop(normcheck, cand, props, tests, seed, out_json, save_dir):
    cmd = [normcheck, "prop", "--candidate", cand, "--tests", str(tests), "--seed", str(seed), "--json", out_json,
           "--force", "--save-failures", save_dir]
    for p in props:
        cmd += ["--properties", p]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    secs = time.time() - t0
    if r.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    with open(out_json) as f:
        return json.load(f), secs, r.stdout


def rows_x_cols(pr):
    """'R rows of N' of a failed property's shrunk counterexample (from its case summary)."""
    summary = (pr.get("counterexample") or {}).get("summary", "")
    return summary.split("(")[1].split(")")[0] if "(" in summary else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--normcheck", required=True)
    ap.add_argument("--tests", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mutants", action="store_true")
    ap.add_argument("--correct", action="store_true")
    ap.add_argument("--reference-free", action="store_true",
                    help="mutants against every property but agreement: which relations catch them without the reference")
    ap.add_argument("--only", action="append", default=[], help="only these candidates (builtin:NAME)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    save = os.path.join(a.out, "counterexamples")
    os.makedirs(save, exist_ok=True)
    props = properties(a.normcheck)
    ok = True
    if a.mutants:
        print(f"| mutant | caught by | tests needed | shrunk x shape | rows x row length | seconds |")
        print("|---|---|---|---|---|---|")
        for m in a.only or candidates(a.normcheck, "mutant"):
            caught = None
            total = 0.0
            for p in props:
                res, secs, _ = run_prop(a.normcheck, m, [p], a.tests, a.seed,
                                        os.path.join(a.out, m.replace(":", "_") + f".{p}.json"), save)
                total += secs
                pr = res["properties"][0]
                if pr["verdict"] in ("FAILED", "CRASHED"):
                    caught = pr
                    break
            if caught is None:
                ok = False
                print(f"| `{m}` | NOT CAUGHT | > {a.tests} per property | | | {total:.1f} |", flush=True)
                continue
            cx = caught["counterexample"] or {}
            rows_cols = rows_x_cols(caught)
            print(f"| `{m}` | {caught['name']} | {caught['tests'] + 1} | {cx.get('shape')} | {rows_cols} | "
                  f"{total:.1f} |", flush=True)
    if a.reference_free:
        others = [p for p in props if p != "agreement"]
        print("| mutant | properties that catch it (tests needed; shrunk counterexample) | seconds |")
        print("|---|---|---|")
        for m in a.only or candidates(a.normcheck, "mutant"):
            res, secs, _ = run_prop(a.normcheck, m, others, a.tests, a.seed,
                                    os.path.join(a.out, m.replace(":", "_") + ".reference_free.json"), save)
            caught = [f"{pr['name']} ({pr['tests'] + 1}; {rows_x_cols(pr)})" for pr in res["properties"]
                      if pr["verdict"] in ("FAILED", "CRASHED")]
            print(f"| `{m}` | {', '.join(caught) if caught else 'none'} | {secs:.1f} |", flush=True)
    if a.correct:
        print("| candidate | property | verdict | tests | seconds |")
        print("|---|---|---|---|---|")
        for c in a.only or candidates(a.normcheck, "correct"):
            res, secs, stdout = run_prop(a.normcheck, c, [], a.tests, a.seed,
                                         os.path.join(a.out, c.replace(":", "_") + ".json"), save)
            for pr in res["properties"]:
                if pr["verdict"] in ("FAILED", "CRASHED"):
                    ok = False
                print(f"| `{c}` | {pr['name']} | {pr['verdict']} | {pr['tests']} | {pr['seconds']:.1f} |", flush=True)
            if any(pr["verdict"] in ("FAILED", "CRASHED") for pr in res["properties"]):
                print(stdout, file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
