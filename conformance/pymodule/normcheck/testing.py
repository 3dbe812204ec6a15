"""assert_norm_close: the drop-in for torch.testing.assert_close in a normalization kernel's
pytest, with the certified reference as the expected value and the derived tolerance (any
correct algorithm in the compute dtype) instead of a hand-picked atol/rtol."""
import os
import re
import tempfile
import warnings

import normcheck


def _case_id():
    """An id from the running pytest test (PYTEST_CURRENT_TEST), else 'python_case'."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0].split("::")[-1]
    return re.sub(r"[^A-Za-z0-9_]+", "_", test).strip("_")[:100] or "python_case"


def save_failure(case, outputs, directory=None):
    """Writes the case as a one-case fixture file and the kernel's outputs as an outputs file
    (fixtures/SCHEMA.md) into `directory` (default: $NORMCHECK_SAVE_FAILURES, else a new
    temporary directory); returns (fixture path, outputs path or None without h5py)."""
    directory = directory or os.environ.get("NORMCHECK_SAVE_FAILURES") or tempfile.mkdtemp(prefix="normcheck-")
    os.makedirs(directory, exist_ok=True)
    base = os.path.join(directory, case.id)
    fixture, out_path = base + ".h5", base + ".outputs.h5"
    n = 1
    while os.path.exists(fixture) or os.path.exists(out_path):  # never overwrite what is there
        n += 1
        fixture, out_path = f"{base}.{n}.h5", f"{base}.{n}.outputs.h5"
    case.save(fixture)
    try:
        import h5py
    except ImportError:
        return fixture, None
    import numpy as np

    with h5py.File(out_path, "w") as f:
        for name, (values, dtype) in outputs.items():
            if dtype == "bfloat16":  # bit patterns -> the float32 values they are
                values = (values.astype(np.uint32) << 16).view(np.float32)
            elif values.dtype == np.uint16:
                values = values.view(np.float16)
            f.create_dataset(f"cases/{case.id}/outputs/{name}", data=values)
    return fixture, out_path


def _recheck_flags(result):
    """The CLI flags that judge the saved case as this check did."""
    flags = "" if result.reduction == "any" else f" --reduction {result.reduction}"
    return flags + (" --flush-subnormal-outputs" if "flush_subnormal_outputs" in result.declares else "")


def assert_norm_close(actual, *, op, x, eps, weight=None, bias=None, dtype_compute=None, candidate_declares=(),
                      reduction="any", allow_mistrusted=True, save_failures=None, dtype=None, **reference_args):
    """Asserts that a kernel's output(s) conform to the certified reference of the case.

    actual: the kernel's y (dx for direction="backward"), or a dict of outputs ({"y": y,
    "mean": mean, "rstd": rstd, ...}); only the outputs given are judged. The case is
    normcheck.reference(op, x, weight, bias, eps=eps, dtype_compute=..., **reference_args) (axis,
    normalized_shape, axes, residual, contract, dtype_out, direction, dy ...). reduction: the
    kernel's declared reduction class ("two_pass", "welford", "pairwise:B", ...; default "any",
    every correct algorithm), judged as normcheck.check(reduction=) does. Passes when every
    judged output is PASSED; a MISTRUSTED output (its comparison cannot be trusted: the reason
    says why) passes with a MistrustedWarning unless allow_mistrusted=False. On failure raises
    AssertionError with the worst element, its allowance, the verdict, the diagnosis and where
    the case was saved as a fixture file (see save_failure) with the command that rechecks it.
    Returns the CheckResult."""
    reference_args.setdefault("id", _case_id())
    declares = normcheck._declarations(candidate_declares)
    reduction = normcheck._reduction(reduction)  # a bad class is an error before the reference runs
    case = normcheck.reference(op, x, weight, bias, eps=eps, dtype_compute=dtype_compute, dtype=dtype,
                               **reference_args)
    given = normcheck._outputs_of(actual, case, dtype)
    result = normcheck._judge(case, given, declares, True, reduction)
    mistrusted = [o for o in result.outputs.values() if o.verdict == "MISTRUSTED"]
    if result.passed and (allow_mistrusted or not mistrusted):
        for o in mistrusted:
            warnings.warn(normcheck.MistrustedWarning(f"normcheck: {case.id}: {o.summary()}"), stacklevel=2)
        return result
    lines = [result.message]
    try:
        saved = case
        if set(given) != set(case.dtypes):  # the saved case holds the outputs judged here, so that
            # the CLI's recheck judges what this check judged (not MISSING for the others)
            saved = normcheck.reference(op, x, weight, bias, eps=eps, dtype_compute=dtype_compute, dtype=dtype,
                                        **dict(reference_args, outputs=list(given)))
        fixture, outputs = save_failure(saved, given, save_failures)
        lines.append(f"  case saved as a fixture file: {fixture}")
        if outputs:
            lines.append(f"  recheck: normcheck check --fixtures {fixture} --outputs {outputs}{_recheck_flags(result)}")
        lines.append(f"  in Python: normcheck.fixtures.open({fixture!r})[{case.id!r}]")
    except Exception as e:  # the assertion must say what failed even where it cannot save
        lines.append(f"  (the case could not be saved: {e})")
    raise AssertionError("\n".join(lines))

