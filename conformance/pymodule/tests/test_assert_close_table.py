"""The assert_close table as a test (assert_close_table.py measures it): correct kernels are
never FAILED at any mean, under `any` or under their declared reduction class (PASSED, or
MISTRUSTED with the reason); a one-pass-variance kernel FAILED under `two_pass` where `any`
admits it is said to fail its declaration, and every FAILED cell is explained by the one-pass
variance; and the README shows exactly the table measured here."""
import os

import pytest

from assert_close_table import DECLARED, FAULTY, markdown, measure, torch_cpu_path

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")


@pytest.mark.parametrize("hidden", [1024, 4096])
def test_table(hidden):
    pytest.importorskip("torch")
    table = measure(hidden)
    for mean, cells in table:
        for kernel in ("two_pass", "welford"):
            for under in ("any", "declared"):
                verdict, reason, _, _ = cells[kernel][under]
                assert verdict in ("PASSED", "MISTRUSTED"), (hidden, mean, kernel, under, verdict, reason)
                if verdict == "MISTRUSTED":
                    assert reason, (hidden, mean, kernel, under)
        for kernel in FAULTY:
            for under in ("any", "declared"):
                verdict, reason, top, explains = cells[kernel][under]
                if verdict != "FAILED":
                    continue
                # Every FAILED cell is explained, by the one-pass variance (its sums in the
                # kernel's order: numpy's pairwise or sequential; clamped at 0 where it cancels).
                assert explains and top.startswith("one_pass_variance"), (hidden, mean, kernel, under, top)
                if under == "declared" and cells[kernel]["any"][0] != "FAILED":
                    assert reason.startswith(f"the declared reduction class {DECLARED[kernel]} is what failed"), reason
    if torch_cpu_path() != "AVX2":
        pytest.skip(f"README.md's table was measured on torch's AVX2 path; this machine runs {torch_cpu_path()}")
    text = open(README).read()
    assert markdown(hidden, table) in text, "README.md's assert_close table differs from the measurement:\n" + \
        markdown(hidden, table)
