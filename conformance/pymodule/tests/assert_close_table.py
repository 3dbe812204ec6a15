"""The assert_close table: correct float32 kernels (two-pass, Welford) and a one-pass-variance
kernel on rows of N(mean, 1), judged by normcheck and by torch.testing.assert_close's float32
defaults (rtol 1.3e-6, atol 1e-5) against torch.nn.functional.layer_norm, as a kernel's pytest
compares them. `python3 assert_close_table.py` prints the Markdown of conformance/pymodule/README.md;
test_assert_close_table.py checks that the README shows what this measures."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import normcheck  # noqa: E402
from kernels import one_pass, rows, two_pass, welford  # noqa: E402

MEANS = (0, 1, 10, 100, 300, 1000, 3000, 10000)
KERNELS = (two_pass, welford, one_pass)
ROWS, EPS = 4, 1e-5


def measure(hidden):
    """[(mean, {kernel name: (normcheck verdict, reason, torch 'pass'|'fail')})]."""
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
            r = normcheck.check(y, case)
            try:
                torch.testing.assert_close(torch.from_numpy(y), expected)
                tc = "pass"
            except AssertionError:
                tc = "fail"
            cells[k.__name__] = (r.verdict, r.outputs["y"].reason, tc, r.diagnosis)
        out.append((mean, cells))
    return out


def markdown(hidden, table=None):
    table = table or measure(hidden)
    lines = [f"| mean (H {hidden}) | " + " | ".join(f"{k.__name__}: normcheck | assert_close" for k in KERNELS) + " |",
             "|---:|" + "---|---|" * len(KERNELS)]
    for mean, cells in table:
        lines.append(f"| {mean} | " + " | ".join(f"{cells[k.__name__][0]} | {cells[k.__name__][2]}"
                                                for k in KERNELS) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    for h in (1024, 4096):
        print(markdown(h) + "\n")
