"""reduction=: a kernel judged under its declared reduction class (conformance/TOLERANCE.md,
section 9), as the CLI's --reduction judges it. A one-pass-variance kernel that every correct
algorithm's bound (`any`) admits fails under `two_pass`, with the reason that the declaration is
what failed and the one-pass variance as the diagnosis; correct two-pass and Welford kernels
pass under their classes; a bad class is a ValueError naming the argument. The means and sizes
are those of the assert_close table (assert_close_table.py, README.md)."""
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import normcheck
from normcheck.testing import assert_norm_close
from kernels import one_pass, one_pass_seq, rows, two_pass, welford

# The table: at H 1024, mean 100, one_pass_seq is PASSED under `any`, FAILED under `two_pass`.
H, MEAN, EPS = 1024, 100.0, 1e-5


@pytest.fixture(scope="module")
def data():
    x = rows(MEAN, (4, H), seed=7)
    w, b = np.ones(H, np.float32), np.zeros(H, np.float32)
    return x, w, b, normcheck.reference("layernorm", x, w, b, eps=EPS, outputs="y")


def test_one_pass_passes_any_fails_two_pass_with_the_reason(data):
    x, w, b, case = data
    y = one_pass_seq(x, w, b, EPS)
    assert normcheck.check(y, case).verdict == "PASSED"  # the bound of any correct algorithm admits it
    r = normcheck.check(y, case, reduction="two_pass")
    assert r.verdict == "FAILED" and r.reduction == "two_pass"
    o = r.outputs["y"]
    assert o.reason.startswith("the declared reduction class two_pass is what failed"), o.reason
    assert o.max_ratio > 1 and o.worst is not None
    top = r.diagnosis[0]
    assert top.dialect.startswith("one_pass_variance") and top.explains, [d.dialect for d in r.diagnosis[:3]]
    assert "declared reduction class two_pass" in r.message and "is what failed" in r.message
    # Case.check is the same judge.
    assert case.check({"y": y}, reduction="two_pass").outputs["y"].reason == o.reason


def test_mistrusted_under_any_is_said():
    # numpy's pairwise one-pass at H 1024, mean 1000: `any` cannot compare y (MISTRUSTED), two_pass
    # can, and fails it; the reason must not claim it is within a bound of `any`.
    x = rows(1000.0, (4, H), seed=7)
    w, b = np.ones(H, np.float32), np.zeros(H, np.float32)
    case = normcheck.reference("layernorm", x, w, b, eps=EPS, outputs="y")
    y = one_pass(x, w, b, EPS)
    assert normcheck.check(y, case).verdict == "MISTRUSTED"
    o = normcheck.check(y, case, reduction="two_pass").outputs["y"]
    assert o.verdict == "FAILED" and o.reason.startswith("the declared reduction class two_pass is what failed")
    assert "this output is MISTRUSTED" in o.reason and "within the bound" not in o.reason, o.reason


def test_correct_kernels_pass_under_their_classes(data):
    x, w, b, case = data
    assert normcheck.check(two_pass(x, w, b, EPS), case, reduction="two_pass").verdict == "PASSED"
    assert normcheck.check(welford(x, w, b, EPS), case, reduction="welford").verdict == "PASSED"
    # The certified outputs conform under every class.
    for red in ("any", "two_pass", "welford", "pairwise:16", "blocked:8", "accumulate_f64"):
        assert normcheck.check(case.expected, case, reduction=red).verdict == "PASSED", red


def test_the_class_narrows_the_allowance(data):
    x, w, b, case = data
    y = two_pass(x, w, b, EPS)
    wide = normcheck.check(y, case).outputs["y"].allowance
    narrow = normcheck.check(y, case, reduction="pairwise:16").outputs["y"].allowance
    assert np.all(narrow <= wide) and np.median(narrow) < np.median(wide)


def test_a_fault_beyond_any_says_so():
    x = rows(0.0, (2, 64))
    case = normcheck.reference("layernorm", x, eps=1e-5, outputs="y")
    y = case.expected["y"] * np.float32(1.01)
    r = normcheck.check(y, case, reduction="two_pass")
    assert r.verdict == "FAILED"
    assert "beyond the bound of any correct algorithm as well" in r.outputs["y"].reason


def test_a_malformed_output_is_not_diagnosed():
    # conf::diagnosable: a wrong shape FAILS, but there is nothing for the panel to explain.
    x = rows(0.0, (2, 64))
    case = normcheck.reference("layernorm", x, eps=1e-5, outputs="y")
    r = normcheck.check(case.expected["y"][:, :32].copy(), case, reduction="two_pass")
    assert r.verdict == "FAILED" and r.diagnosis == [] and not r.diagnosis_text


@pytest.mark.parametrize("value, error, text", [
    ("pairwise", ValueError, r"^reduction: reduction class 'pairwise' needs a block size"),
    ("blocked:0", ValueError, r"^reduction: .*block size must be >= 1"),
    ("pairwise:x", ValueError, r"^reduction: .*not a positive integer"),
    ("two_pass:8", ValueError, r"^reduction: reduction class 'two_pass' takes no block size"),
    ("kahan", ValueError, r"^reduction: unknown reduction class 'kahan'"),
    ("", ValueError, r"^reduction: unknown reduction class ''"),
    (3, TypeError, r"^reduction: expected a reduction class name"),
])
def test_bad_classes_name_the_argument(value, error, text):
    x = rows(0.0, (2, 8))
    case = normcheck.reference("layernorm", x, eps=1e-5)
    with pytest.raises(error, match=text):
        normcheck.check(case.expected, case, reduction=value)
    with pytest.raises(error, match=text):
        case.check(case.expected, reduction=value)
    with pytest.raises(error, match=text):
        assert_norm_close(case.expected["y"], op="layernorm", x=x, eps=1e-5, reduction=value)


def test_canonical_names():
    case = normcheck.reference("layernorm", rows(0.0, (2, 8)), eps=1e-5)
    for red in ("any", "two_pass", "welford", "pairwise:128", "blocked:8", "accumulate_f64"):
        assert normcheck.check(case.expected, case, reduction=red).reduction == red
    assert normcheck.check(case.expected, case, reduction=None).reduction == "any"


def test_assert_norm_close_message_and_cli_recheck(data, tmp_path):
    x, w, b, _ = data
    y = one_pass_seq(x, w, b, EPS)
    assert_norm_close(y, op="layernorm", x=x, weight=w, bias=b, eps=EPS)  # any: passes
    with pytest.raises(AssertionError) as e:
        assert_norm_close(y, op="layernorm", x=x, weight=w, bias=b, eps=EPS, reduction="two_pass",
                          save_failures=str(tmp_path))
    msg = str(e.value)
    assert "the declared reduction class two_pass is what failed" in msg and "explained by one_pass_variance" in msg
    recheck = re.search(r"recheck: (normcheck .*)", msg).group(1)
    assert recheck.endswith("--reduction two_pass"), recheck
    cli = os.environ.get("NORMCHECK_CLI") or shutil.which("normcheck")
    if not cli:
        pytest.skip("no normcheck CLI (NORMCHECK_CLI) to run the recheck line")
    # The CLI judges the saved case as Python did: FAILED under two_pass, PASSED under any.
    args = recheck.split()[1:]
    p = subprocess.run([cli] + args, capture_output=True, text=True)
    assert p.returncode == 1 and "is what failed" in p.stdout + p.stderr, p.stdout + p.stderr
    p = subprocess.run([cli] + args[:-2], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_sensitivity_and_probes_are_reported(data):
    # An output scaled by 1 + d, |d| just above its sensitivity, fails (TOLERANCE.md 6.1); rstd
    # carries the probes; a declared class is at least as sensitive as `any`.
    x, w, b, _ = data
    case = normcheck.reference("layernorm", x, w, b, eps=EPS, outputs=("y", "rstd"))
    exact = {"y": case.expected["y"], "rstd": case.expected["rstd"]}
    for reduction in ("any", "two_pass"):
        r = normcheck.check(exact, case, reduction=reduction)
        assert r.verdict == "PASSED"
        for name, o in r.outputs.items():
            assert 0 < o.sensitivity < 1, (name, o.sensitivity)
            scaled = dict(exact)
            scaled[name] = (case.expected_f64[name] * (1 + 1.01 * o.sensitivity)).astype(np.float32)
            assert normcheck.check(scaled, case, reduction=reduction).outputs[name].verdict == "FAILED", name
        assert set(r.outputs["rstd"].probes) == {"variance_over_n_minus_1", "eps_1e-6"}
    s_any = normcheck.check(exact, case).outputs["y"].sensitivity
    assert normcheck.check(exact, case, reduction="two_pass").outputs["y"].sensitivity <= s_any
