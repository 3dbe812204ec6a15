"""The assert_close table as a test (assert_close_table.py measures it): correct kernels are
never FAILED at any mean (PASSED, or MISTRUSTED with the reason), and the README shows exactly
the table measured here."""
import os
import re

import pytest

from assert_close_table import markdown, measure

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")


@pytest.mark.parametrize("hidden", [1024, 4096])
def test_table(hidden):
    pytest.importorskip("torch")
    table = measure(hidden)
    for mean, cells in table:
        for kernel in ("two_pass", "welford"):
            verdict, reason, _, _ = cells[kernel]
            assert verdict in ("PASSED", "MISTRUSTED"), (hidden, mean, kernel, verdict, reason)
            if verdict == "MISTRUSTED":
                assert reason, (hidden, mean, kernel)
        verdict, reason, _, diagnosis = cells["one_pass"]
        # Under today's model (any correct reduction, Welford's n u kappa term) the one-pass
        # variance's error stays inside the allowance until the rows are MISTRUSTED; a FAILED
        # verdict must name the one-pass variance.
        if verdict == "FAILED":
            assert diagnosis and "one_pass_variance" in diagnosis[0].dialect, diagnosis
    text = open(README).read()
    assert markdown(hidden, table) in text, "README.md's assert_close table differs from the measurement:\n" + \
        markdown(hidden, table)
