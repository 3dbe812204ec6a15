"""The assert_close table: correct float32 kernels (two-pass, Welford) and two one-pass-variance
kernels (numpy's pairwise sums, sequential sums) on rows of N(mean, 1), judged by normcheck under
`any` (every correct algorithm's bound, the default), by normcheck under a declared reduction
class (reduction=: the correct kernels under their own classes, the one-pass kernels under
`two_pass`, the class such a kernel claims to be; see
conformance/TOLERANCE.md, section 9) and by torch.testing.assert_close's float32 defaults (rtol
1.3e-6, atol 1e-5) against torch.nn.functional.layer_norm, as a kernel's pytest compares them.
`python3 assert_close_table.py` prints the Markdown of conformance/pymodule/README.md;
test_assert_close_table.py checks that the README shows what this measures."""
import os
import sys

# torch's float32 layer_norm, the assert_close column's expected value, differs in its last bits
# between torch's CPU code paths (measured: the DEFAULT path fails the two-pass kernel at mean
# 100 where AVX2 and AVX512 pass it), so the table is measured on one of them: AVX2, which
# AVX512 machines also run. It must be set before torch is imported (conftest.py sets it too).
os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import normcheck  # noqa: E402
from kernels import one_pass, one_pass_seq, rows, two_pass, welford  # noqa: E402

MEANS = (0, 1, 3, 10, 30, 100, 300, 1000, 3000, 10000)
KERNELS = (two_pass, welford, one_pass, one_pass_seq)
FAULTY = ("one_pass", "one_pass_seq")
DECLARED = {"two_pass": "two_pass", "welford": "welford", "one_pass": "two_pass", "one_pass_seq": "two_pass"}
ROWS, EPS = 4, 1e-5


def judged(result):
    """(verdict, reason of y, top diagnosis's dialect or None, whether it explains the outputs)."""
    top = result.diagnosis[0] if result.diagnosis else None
    return result.verdict, result.outputs["y"].reason, top and top.dialect, bool(top and top.explains)


def measure(hidden):
    """[(mean, {kernel name: {"any": judged, "declared": judged, "torch": 'pass'|'fail'}})]."""
    import torch

    out = []
    for mean in MEANS:
        x = rows(mean, (ROWS, hidden), seed=7)
        w, b = np.ones(hidden, np.float32), np.zeros(hidden, np.float32)
        case = normcheck.reference("layernorm", x, w, b, eps=EPS, outputs="y")
        expected = torch.nn.functional.layer_norm(torch.from_numpy(x), (hidden,), torch.from_numpy(w),
                                                  torch.from_numpy(b), EPS)
        cells = {}
        for k in KERNELS:
            y = k(x, w, b, EPS)
            try:
                torch.testing.assert_close(torch.from_numpy(y), expected)
                tc = "pass"
            except AssertionError:
                tc = "fail"
            cells[k.__name__] = {"any": judged(normcheck.check(y, case)),
                                 "declared": judged(normcheck.check(y, case, reduction=DECLARED[k.__name__])),
                                 "torch": tc}
        out.append((mean, cells))
    return out


def torch_cpu_path():
    """The CPU code path torch runs ("AVX2" where the machine has it), from its build summary."""
    import torch

    for line in torch.__config__.show().splitlines():
        if "CPU capability usage:" in line:
            return line.split(":", 1)[1].strip()
    return "unknown"


def cell(j):
    """A verdict; a FAILED one with the diagnosis: the fault that explains it, or that none does."""
    verdict, _, top, explains = j
    if verdict != "FAILED":
        return verdict
    return f"FAILED ({top})" if explains else "FAILED (no fault explains it)"


def detection(table, kernel, under):
    """In words: the means at which `kernel` is FAILED under `under`, and where it is diagnosed."""
    failed = [m for m, cells in table if cells[kernel][under][0] == "FAILED"]
    if not failed:
        return "never FAILED"
    named = [m for m, cells in table if cells[kernel][under][0] == "FAILED" and cells[kernel][under][3]
             and "one_pass_variance" in cells[kernel][under][2]]
    text = f"FAILED from mean {failed[0]} (at {', '.join(map(str, failed))})"
    return text + (f", diagnosed as the one-pass variance at {', '.join(map(str, named))}" if named
                   else ", never diagnosed as the one-pass variance")


def markdown(hidden, table=None):
    table = table or measure(hidden)
    head = [f"mean (H {hidden})"]
    for k in KERNELS:
        n = k.__name__
        head += [f"{n}: `any`", f"{n}: `{DECLARED[n]}`", "assert_close"]
    lines = ["| " + " | ".join(head) + " |", "|---:|" + "---|---|---|" * len(KERNELS)]
    for mean, cells in table:
        row = [str(mean)]
        for k in KERNELS:
            c = cells[k.__name__]
            row += [cell(c["any"]), cell(c["declared"]), c["torch"]]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for k in FAULTY:
        lines.append(f"- H {hidden}, {k}: under `any` {detection(table, k, 'any')}; under "
                     f"`{DECLARED[k]}` {detection(table, k, 'declared')}.")
    return "\n".join(lines)


if __name__ == "__main__":
    for h in (1024, 4096):
        print(markdown(h) + "\n")
