#!/usr/bin/python3
"""Writes the cases of a normcheck results file (reports/RESULTS.md) as CMake set() commands.

usage: results_cases.py RESULTS.json PREFIX OUT.cmake

OUT.cmake sets PREFIX_count and, for each case i, PREFIX_id_<i>, PREFIX_verdict_<i> (in lower
case) and PREFIX_why_<i> (its message, "" when it has none), each a bracket argument, so no
character of a message needs escaping. The plugins' ctest scripts include it
(results_case.cmake): CMake's string(JSON) parses the whole document on every call, and three
calls per case over the ci tier's 520 cases took 22 s where this takes a fraction of one.
"""
import json
import sys


def bracket(text):
    """text as a CMake bracket argument: [=[text]=] with enough '=' that text cannot close it."""
    eq = ""
    while "]" + eq + "]" in text or text.endswith("]" + eq):
        eq += "="
    # A newline right after the opening bracket is dropped by CMake: add one to keep the text's own.
    lead = "\n" if text.startswith("\n") else ""
    return f"[{eq}[{lead}{text}]{eq}]"


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.strip().splitlines()[2])
    path, prefix, out = sys.argv[1:]
    try:
        with open(path, encoding="utf-8") as f:
            cases = json.load(f)["cases"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"{path}: not a normcheck results file ({e})")
    lines = [f"set({prefix}_count {len(cases)})"]
    for i, c in enumerate(cases):
        lines.append(f"set({prefix}_id_{i} {bracket(str(c['case_id']))})")
        lines.append(f"set({prefix}_verdict_{i} {bracket(str(c['verdict']).lower())})")
        lines.append(f"set({prefix}_why_{i} {bracket(str(c.get('message', '')))})")
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
