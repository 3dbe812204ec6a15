"""normcheck for Python: the certified reference and the derived tolerance of LayerNorm and
RMSNorm inside a kernel's own test suite.

    import normcheck
    case = normcheck.reference("layernorm", x, weight, bias, eps=1e-5)   # certified outputs
    result = normcheck.check({"y": y}, case)                             # verdicts, diagnosis
    normcheck.testing.assert_norm_close(y, op="layernorm", x=x, weight=weight, bias=bias, eps=1e-5)

Every number comes from normcheck's C++ libraries (the reference, the tolerance model, the
checker and the diagnosis: the same code as the `normcheck` CLI); this package converts arrays
and formats messages. conformance/pymodule/README.md documents it.
"""
import functools
import numbers

from . import _arrays, _core
from ._core import FixtureError

__version__ = _core.__version__
__all__ = ["reference", "check", "Case", "CheckResult", "OutputCheck", "FixtureError", "MistrustedWarning"]

VERDICTS = ("PASSED", "UNSUPPORTED", "MISTRUSTED", "MISSING", "FAILED", "TIMEOUT", "CRASHED")
FAILURES = ("FAILED", "MISSING", "TIMEOUT", "CRASHED")
DECLARATIONS = ("flush_subnormal_outputs",)


class MistrustedWarning(UserWarning):
    """An output was not compared where its comparison cannot be trusted (the reason says why)."""


class Case:
    """One case: its attributes and inputs, and the certified outputs of the reference.

    ``expected[name]`` holds the correctly rounded outputs as numpy arrays of their output dtype
    (bfloat16 outputs as float32 arrays holding bfloat16 values; ``expected_torch(name)`` gives
    a torch.bfloat16 tensor), ``expected_f64[name]`` the exact values rounded to binary64, and
    ``certified[name]`` a bool mask, False where the rounding was left undecided (either
    neighbour is then accepted)."""

    def __init__(self, core):
        self._core = core

    # The C++ case does not change: each view is converted once, when first asked for.
    id = property(lambda self: self._core.id)
    category = property(lambda self: self._core.category)
    description = property(lambda self: self._core.description)
    attributes = functools.cached_property(lambda self: self._core.attributes)
    attributes.__doc__ = "op, epsilon, dtypes, shape ... as in a fixture file"
    inputs = functools.cached_property(lambda self: self._core.inputs)
    inputs.__doc__ = "x, weight, ...: numpy arrays (bfloat16 as float32)"
    input_dtypes = functools.cached_property(lambda self: self._core.input_dtypes)
    expected = functools.cached_property(lambda self: self._core.expected)
    outputs = property(lambda self: self.expected, doc="the same as expected")
    expected_f64 = functools.cached_property(lambda self: self._core.expected_f64)
    certified = functools.cached_property(lambda self: self._core.certified)
    dtypes = functools.cached_property(lambda self: self._core.output_dtypes)
    dtypes.__doc__ = "output name -> dtype name"

    def __getitem__(self, name):
        return self.expected[name]

    def __repr__(self):
        a = self.attributes
        return (f"<normcheck.Case {self.id}: {a['op']} {a['direction']}, x {a['dtype_x']}, compute "
                f"{a['dtype_compute']}, outputs {', '.join(self.dtypes)}>")

    def expected_torch(self, name):
        """The certified output as a torch tensor of its dtype (torch.bfloat16 for bfloat16)."""
        import torch

        values = torch.from_numpy(self.expected[name])
        return values.to(torch.bfloat16) if self.dtypes[name] == "bfloat16" else values

    def check(self, outputs, *, dtype_compute=None, candidate_declares=(), reduction="any", diagnose=True,
              dtype=None):
        """normcheck.check(outputs, self, ...)."""
        return check(outputs, self, dtype_compute=dtype_compute, candidate_declares=candidate_declares,
                     reduction=reduction, diagnose=diagnose, dtype=dtype)

    def save(self, path, *, overwrite=False):
        """Writes the case (inputs and certified outputs) as a one-case fixture file that the
        `normcheck` CLI reads (`normcheck fixtures show`, `normcheck check --fixtures`)."""
        self._core.save(str(path), overwrite, "normcheck.Case.save (Python)")


class Worst:
    """The worst element of an output (largest error / allowance), values in hex and decimal."""

    def __init__(self, o):
        self.index, self.coords = o.worst_index, list(o.worst_coords)
        self.got, self.expected, self.exact, self.allowance = o.worst_got, o.worst_expected, o.worst_exact, o.worst_allowance
        self.dtype = o.dtype

    def hex(self, v):
        return _core.hex_text(v)

    def dec(self, v, dtype=None):
        return _core.decimal_text(v, dtype or self.dtype)

    def __str__(self):
        return (f"[{', '.join(map(str, self.coords))}] (flat {self.index}): got {self.hex(self.got)} "
                f"({self.dec(self.got)}), expected {self.hex(self.expected)} ({self.dec(self.expected)}), exact "
                f"{self.hex(self.exact)} ({self.dec(self.exact, 'float64')}), error "
                f"{self.dec(abs(self.got - self.exact), 'float64')}, allowance {self.dec(self.allowance, 'float64')}")


class OutputCheck:
    """The judge's verdict on one output: PASSED, FAILED or MISTRUSTED (MISSING for an output
    the case has but the caller did not produce) with the reason, the errors in ulps of the
    output dtype and in allowance units (> 1 fails), and the worst element."""

    def __init__(self, o, allowance, error):
        self.name, self.verdict, self.reason, self.dtype = o.name, o.verdict, o.reason, o.dtype
        self.elements, self.failed, self.mistrusted, self.uncertified, self.flushed = (
            o.elements, o.failed, o.mistrusted, o.uncertified, o.flushed)
        self.max_ulp, self.max_ratio, self.max_abs, self.max_rel = o.max_ulp, o.max_ratio, o.max_abs, o.max_rel
        # The smallest relative fault this comparison is sure to catch (inf: none; TOLERANCE.md
        # 6.1), and for rstd the probes: fault name -> certain error over the allowance (> 1: caught).
        self.sensitivity, self.probes = o.sensitivity, dict(o.probes)
        self.worst = Worst(o) if o.worst_index >= 0 else None
        self.allowance = allowance  # per element: the largest error a correct kernel may make (NaN: mistrusted)
        self.error = error          # per element: |got - exact| as the checker measures it

    def __repr__(self):
        return f"<OutputCheck {self.name}: {self.verdict} max {self.max_ulp:.3g} ulp, {self.max_ratio:.3g} of its allowance>"

    def summary(self):
        s = f"{self.name} ({self.dtype}): {self.verdict}"
        if self.reason:
            s += f": {self.reason}"
        if self.elements:
            s += (f"; max error {self.max_ulp:.4g} ulp = {self.max_ratio:.4g} x its allowance over "
                  f"{self.elements} compared elements")
        if self.mistrusted:
            s += f"; {self.mistrusted} not compared"
        return s


class CheckResult:
    """The judge's verdict on a case: ``verdict`` (the most severe of the outputs'), ``outputs``
    (name -> OutputCheck), ``diagnosis`` (for a FAILED case: the known faults that best explain
    the outputs, best first; each with dialect, fault_class, title, score, explains, evidence,
    parameters), ``reduction`` (the declared reduction class it was judged under) and
    ``message``, the whole in words."""

    def __init__(self, case, core_result, allowance, error, not_judged, reduction="any", declares=()):
        self.case = case
        self.reduction, self.declares = reduction, tuple(declares)
        self.verdict = core_result.verdict
        self.outputs = {o.name: OutputCheck(o, allowance.get(o.name), error.get(o.name)) for o in core_result.outputs}
        self.diagnosis = list(core_result.diagnosis)
        self.diagnosis_text = core_result.diagnosis_text
        self.not_judged = not_judged

    @property
    def passed(self):
        return self.verdict not in FAILURES

    def __bool__(self):
        return self.passed

    def __repr__(self):
        return f"<CheckResult {self.case.id}: {self.verdict}>"

    @property
    def message(self):
        a = self.case.attributes
        lines = [f"normcheck: {self.verdict}: case {self.case.id} ({a['op']} {a['direction']}, x {a['dtype_x']}, "
                 f"out {a['dtype_out']}, compute {a['dtype_compute']}, eps {a['epsilon']:.6g}, contract "
                 f"{a['contract']}, x shape {a['shape']}"
                 + ("" if self.reduction == "any" else f", declared reduction class {self.reduction}") + ")"]
        for o in self.outputs.values():
            lines.append("  " + o.summary())
            if o.worst is not None and o.verdict != "PASSED":
                lines.append(f"    worst element {o.worst}")
        if self.diagnosis_text:
            text = self.diagnosis_text
            lines.append("  " + (text if text.startswith("diagnosis") else "diagnosis: " + text))
            for d in self.diagnosis[:3]:
                params = ", ".join(f"fitted {k} {v:.3g}" for k, v in d.parameters.items())
                lines.append(f"    {d.dialect} (class {d.fault_class}, {d.title}): score {d.score:.3g}"
                             f"{'' if d.explains else ' (does not explain it)'}{'; ' + params if params else ''}")
        if self.not_judged:
            lines.append(f"  not judged (not given): {', '.join(self.not_judged)}")
        return "\n".join(lines)

    __str__ = lambda self: self.message


def _number(value, arg):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{arg}: expected a real number, got {type(value).__name__}")
    return float(value)


def _dtype_name(value, arg):
    """A dtype given as a name, a numpy dtype or a torch dtype -> its name; None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    name = str(value).replace("torch.", "")
    if name in ("float64", "float32", "float16", "bfloat16"):
        return name
    try:
        import numpy as np

        return {np.dtype(np.float64): "float64", np.dtype(np.float32): "float32",
                np.dtype(np.float16): "float16"}[np.dtype(value)]
    except (TypeError, KeyError):
        raise TypeError(f"{arg}: {value!r} is not a dtype normcheck knows (float64, float32, float16, bfloat16)")


def reference(op, x, weight=None, bias=None, *, eps, axis=-1, normalized_shape=None, axes=None, weight_offset=0,
              residual=None, residual_bias=None, alpha=1, contract="exact", dtype_out=None, dtype_compute=None,
              direction="forward", dy=None, outputs=None, dtype=None, id="python_case"):
    """The certified reference of one LayerNorm/RMSNorm case (forward or backward) -> a Case.

    op: "layernorm" | "rmsnorm". x, weight, bias, residual, residual_bias, dy: numpy arrays or
    torch tensors (CUDA tensors are copied to the host) of float64, float32, float16 or bfloat16;
    each input's dtype is the case's dtype of that input (weight and bias share one). numpy has
    no bfloat16: pass a torch.bfloat16 tensor, or a uint16 array of bit patterns with
    dtype="bfloat16". Normalized dims: axis (ONNX: dims [axis, rank)), or normalized_shape
    (PyTorch: the trailing dims, which must match x's), or axes (explicit dims). weight_offset:
    scale = weight_offset + weight (Gemma: 1). residual (and residual_bias): the fused residual
    h = alpha x + residual (+ residual_bias), with output residual_out. contract: the precision
    contract ("exact", "llama", "gemma", "te", "onnx", "fused_add_lowp", "a+b"). dtype_out: the
    dtype of y (default: x's, or dy's for backward). dtype_compute: the dtype of mean and rstd
    (default float32, float64 for float64 x). outputs: the names to keep (default every output).
    eps is taken as the binary64 number given.
    Raises ValueError or TypeError naming the argument for an invalid case."""
    if not isinstance(op, str):
        raise TypeError(f"op: expected 'layernorm' or 'rmsnorm', got {type(op).__name__}")
    if dtype is not None and dtype not in _arrays.BITS_DTYPES:
        raise ValueError(f"dtype: {dtype!r}: the dtype of uint16 bit-pattern inputs is 'bfloat16' or 'float16'")
    eps = _number(eps, "eps")
    if x is None:
        raise TypeError("x: missing (the input to normalize)")
    inputs = {}
    for name, value in (("x", x), ("weight", weight), ("bias", bias), ("residual", residual),
                        ("residual_bias", residual_bias), ("dy", dy)):
        if value is not None:
            inputs[name] = _arrays.to_core(value, name, dtype)
    shape = inputs["x"][0].shape
    if normalized_shape is not None:
        if axes is not None or axis != -1:
            raise ValueError("normalized_shape: give one of axis, normalized_shape and axes")
        ns = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else tuple(normalized_shape)
        if not ns or len(ns) > len(shape) or tuple(shape[len(shape) - len(ns):]) != ns:
            raise ValueError(f"normalized_shape: {list(ns)} is not the trailing shape of x {list(shape)}")
        axis = -len(ns)
    if axes is not None:
        if axis != -1:
            raise ValueError("axes: give one of axis, normalized_shape and axes")
        axes = [int(d) for d in ([axes] if isinstance(axes, numbers.Integral) else axes)]
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis: expected an int, got {type(axis).__name__}")
    if isinstance(outputs, str):
        outputs = [outputs]
    core = _core.make_case(inputs, op, eps, int(axis), axes, _number(weight_offset, "weight_offset"),
                           _number(alpha, "alpha"), str(contract), _dtype_name(dtype_out, "dtype_out"),
                           _dtype_name(dtype_compute, "dtype_compute"), str(direction), list(outputs or []), str(id))
    return Case(core)


def _outputs_of(outputs, case, dtype):
    """{name: (array, dtype name)} from a dict, or from one array for the case's main output."""
    if not isinstance(outputs, dict):
        if isinstance(outputs, (tuple, list)):
            raise TypeError("outputs: pass a dict {'y': y, 'mean': mean, ...} (a sequence is ambiguous)")
        main = "y" if "y" in case.dtypes else ("dx" if "dx" in case.dtypes else None)
        if main is None:
            raise TypeError(f"outputs: pass a dict of this case's outputs ({', '.join(case.dtypes)})")
        outputs = {main: outputs}
    converted = {}
    for name, value in outputs.items():
        if name not in case.dtypes:
            raise ValueError(f"outputs: '{name}' is not an output of this case ({', '.join(case.dtypes)})")
        bits = dtype or (case.dtypes[name] if case.dtypes[name] in _arrays.BITS_DTYPES else None)
        converted[name] = _arrays.to_core(value, f"outputs['{name}']", bits)
    return converted


def _declarations(candidate_declares):
    declares = [candidate_declares] if isinstance(candidate_declares, str) else list(candidate_declares)
    for d in declares:
        if d not in DECLARATIONS:
            raise ValueError(f"candidate_declares: unknown declaration {d!r} (known: {', '.join(DECLARATIONS)})")
    return declares


def _reduction(reduction):
    """A declared reduction class ("any", "two_pass", "welford", "pairwise:B", "blocked:B",
    "accumulate_f64"; the CLI's --reduction) -> its canonical name; ValueError/TypeError naming
    the argument otherwise."""
    if reduction is None:
        return "any"
    if not isinstance(reduction, str):
        raise TypeError(f"reduction: expected a reduction class name such as 'two_pass' or 'pairwise:128', "
                        f"got {type(reduction).__name__}")
    return _core.reduction_name(reduction)


def check(outputs, case, *, dtype_compute=None, candidate_declares=(), reduction="any", diagnose=True, dtype=None):
    """Judges a kernel's outputs against a case (from reference() or a fixture file) -> CheckResult.

    outputs: a dict name -> array/tensor ("y", "mean", "rstd", "residual_out"; backward "dx",
    "dweight", ...), or one array for y (dx backward). Outputs not given are not judged.
    dtype_compute: the dtype the kernel computes its statistics in, if not the case's (the
    case is then re-evaluated with it). candidate_declares: what the kernel declares that
    changes the comparison: "flush_subnormal_outputs". reduction: the kernel's declared reduction
    class, as the CLI's --reduction ("any", the default: any correct algorithm; "two_pass",
    "welford", "pairwise:B", "blocked:B", "accumulate_f64"; conformance/TOLERANCE.md, section 9):
    the outputs are judged under that class's (narrower) allowances, and an output that fails
    them but not those of "any" has a reason starting "the declared reduction class C is what
    failed". Raises TypeError/ValueError naming the argument for outputs of the wrong kind or a
    bad class; a wrong shape is a FAILED output, not an error."""
    if not isinstance(case, Case):
        raise TypeError(f"case: expected a normcheck.Case (from reference() or a fixture file), got {type(case).__name__}")
    declares = _declarations(candidate_declares)
    reduction = _reduction(reduction)
    dtype_compute = _dtype_name(dtype_compute, "dtype_compute")
    if dtype_compute is not None and dtype_compute != case.attributes["dtype_compute"]:
        case = Case(case._core.with_dtype_compute(dtype_compute))
    return _judge(case, _outputs_of(outputs, case, dtype), declares, diagnose, reduction)


def _judge(case, given, declares, diagnose=True, reduction="any"):
    """check() on outputs already converted by _outputs_of, `reduction` already validated."""
    result, allowance, error = case._core.judge(given, "flush_subnormal_outputs" in declares, bool(diagnose),
                                                reduction)
    return CheckResult(case, result, allowance, error, [n for n in case.dtypes if n not in given], reduction,
                       declares)


from . import fixtures, testing  # noqa: E402  (they use the names above)
