#!/usr/bin/env python3
"""Runs the ```sh blocks of a Markdown file, in order, as one bash script from the repository
root, so that a guide cannot drift from the tool. Usage: doc-blocks.py GUIDE.md BUILD_DIR
A ```python block runs in that sequence too, as its own /usr/bin/python3 process in the shell's
current directory, with BUILD_DIR/python (import normcheck) on PYTHONPATH.

Markers (HTML comments, invisible where the Markdown is rendered):
  <!-- doc-test: skip -->              before a block: do not run it (e.g. the build itself)
  <!-- doc-test: python-module -->     before a block: it needs import normcheck; skipped, with a
                                       note, where the build has no Python module (as are the
                                       ```python blocks)
  <!-- doc-test-expect: TEXT -->       after a block: its output must contain TEXT
Blocks run with `set -eu` (a failing command fails the test; pipes into head are fine), with
BUILD_DIR/bin first on PATH. Exit 0 when every block ran and every expectation held."""
import os
import re
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```(\w*)")


def blocks(text):
    """(language, code, skip, [expected texts]) for each fenced block."""
    lines = text.splitlines()
    out, i, pending_skip = [], 0, False
    while i < len(lines):
        line = lines[i]
        if line.strip() == "<!-- doc-test: skip -->":
            pending_skip = True
        if line.strip() == "<!-- doc-test: python-module -->":
            pending_skip = "python-module"
        m = FENCE.match(line)
        if m:
            lang, body = m.group(1), []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            expects = []
            j = i + 1
            while j < len(lines) and (lines[j].strip() == "" or lines[j].startswith("<!-- doc-test-expect:")):
                e = re.match(r"<!-- doc-test-expect: (.*) -->$", lines[j].strip())
                if e:
                    expects.append(e.group(1))
                j += 1
            if lang == "python" and not pending_skip:
                pending_skip = "python-module"
            out.append((lang, "\n".join(body), pending_skip, expects))
            pending_skip = False
        i += 1
    return out


def main():
    guide, build_dir = sys.argv[1], os.path.abspath(sys.argv[2])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    have_module = os.path.exists(os.path.join(build_dir, "python", "normcheck", "__init__.py"))
    found = blocks(open(guide).read())
    runnable = [b for b in found if b[0] in ("sh", "python") and (not b[2] or (b[2] == "python-module" and have_module))]
    if not have_module and any(b[2] == "python-module" for b in found):
        print(f"{guide}: the blocks that need import normcheck are skipped: {build_dir} has no Python module")
    if not runnable:
        sys.exit(f"{guide}: no ```sh blocks to run")
    with tempfile.TemporaryDirectory() as logs:
        script = ["set -eu", f"cd {root!r}"]
        for n, (lang, code, _, _) in enumerate(runnable):
            log = os.path.join(logs, f"{n}.log")
            script.append(f"echo '--- block {n + 1}'")
            # Each block's output goes to the console and to its log; the block runs in this
            # shell (not a subshell) so that cd and variables carry over to the next one.
            script.append(f"exec 3>&1 4>&2 > >(tee {log!r}) 2>&1")
            script.append(code if lang == "sh" else f"/usr/bin/python3 - <<'DOC_BLOCK_PY'\n{code}\nDOC_BLOCK_PY")
            script.append("exec 1>&3 2>&4; sleep 0.1")
        env = dict(os.environ, PATH=os.path.join(build_dir, "bin") + ":" + os.environ["PATH"])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(build_dir, "python"), env.get("PYTHONPATH")) if p)
        r = subprocess.run(["bash", "-c", "\n".join(script)], env=env)
        if r.returncode != 0:
            sys.exit(f"{guide}: a block failed (exit status {r.returncode}); see the output above")
        failed = []
        for n, (_, code, _, expects) in enumerate(runnable):
            text = open(os.path.join(logs, f"{n}.log")).read()
            if "internal error" in text:
                failed.append(f"block {n + 1}: normcheck reported an internal error")
            failed += [f"block {n + 1}: output lacks {e!r}" for e in expects if e not in text]
        if failed:
            sys.exit(f"{guide}:\n  " + "\n  ".join(failed))
    print(f"{guide}: {len(runnable)} blocks ran, every expectation held")


if __name__ == "__main__":
    main()
