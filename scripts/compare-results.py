#!/usr/bin/python3
"""Compares two folders of normcheck outputs: the proof that a refactoring changed no behaviour.

usage: compare-results.py BEFORE_DIR AFTER_DIR

Both folders must hold the same file names. Results files (*.json, reports/RESULTS.md) must be
equal after removing what legitimately differs between two runs of the same command:

  * every "seconds" field (wall times of the run and of each case);
  * the top-level "generator_version" (the version of the normcheck that wrote the file);
  * in every string (the top-level "command", each case's "repro" line), the folder compared
    (BEFORE_DIR or AFTER_DIR, as given, absolute or normalized), replaced by "<DIR>": the
    runs may read their fixture file from, and write into, the folder they are compared in.

Everything else — verdicts, reasons, every error number, histograms, per-row errors, worst
elements, diagnoses with their scores and evidence — must be identical. Any other file (fixture
files *.h5, text output *.txt) must be identical byte for byte (a fixture file records no output
path and no time: SCHEMA.md). Prints each difference (the first few per file) and exits 1 if there
is any, 0 if the folders are equal, 2 on bad usage.
"""
import json
import os
import sys


def strip(v):
    """A copy of the JSON value v without any "seconds" key, at any depth."""
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items() if k != "seconds"}
    if isinstance(v, list):
        return [strip(x) for x in v]
    return v


def normalize(doc, folder):
    doc = strip(doc)
    if isinstance(doc, dict):
        doc.pop("generator_version", None)
    forms = sorted({folder.rstrip("/"), os.path.abspath(folder), os.path.normpath(folder)}, key=len, reverse=True)

    def paths(v):
        if isinstance(v, dict):
            return {k: paths(x) for k, x in v.items()}
        if isinstance(v, list):
            return [paths(x) for x in v]
        if isinstance(v, str):
            for f in forms:
                v = v.replace(f, "<DIR>")
        return v

    return paths(doc)


def diff(a, b, path, out, limit=5):
    """Appends to out the paths where a and b differ (at most limit of them)."""
    if len(out) >= limit:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'after' if k not in a else 'before'}")
            else:
                diff(a[k], b[k], f"{path}.{k}", out, limit)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} elements before, {len(b)} after")
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{path}[{i}]", out, limit)
    elif a != b or type(a) is not type(b):
        out.append(f"{path}: {json.dumps(a)[:200]} before, {json.dumps(b)[:200]} after")


def main():
    if len(sys.argv) != 3 or not all(os.path.isdir(d) for d in sys.argv[1:]):
        print(__doc__, file=sys.stderr)
        return 2
    before, after = sys.argv[1], sys.argv[2]
    names_b = set(os.listdir(before))
    names_a = set(os.listdir(after))
    problems = 0
    for n in sorted(names_b ^ names_a):
        print(f"{n}: only in {'before' if n in names_b else 'after'}")
        problems += 1
    compared = 0
    for n in sorted(names_b & names_a):
        pb, pa = os.path.join(before, n), os.path.join(after, n)
        if not os.path.isfile(pb) or not os.path.isfile(pa):
            continue
        compared += 1
        if n.endswith(".json"):
            try:
                jb, ja = json.load(open(pb)), json.load(open(pa))
            except ValueError as e:
                print(f"{n}: not JSON: {e}")
                problems += 1
                continue
            out = []
            diff(normalize(jb, before), normalize(ja, after), "", out)
            for line in out:
                print(f"{n}: {line}")
            problems += bool(out)
        else:
            with open(pb, "rb") as fb, open(pa, "rb") as fa:
                if fb.read() != fa.read():
                    print(f"{n}: the bytes differ")
                    problems += 1
    print(f"{compared} files compared, {problems} differ" if problems else f"{compared} files compared: identical")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
