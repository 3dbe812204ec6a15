"""Bad input: a ValueError or TypeError naming the argument, never a crash."""
import numpy as np
import pytest

import normcheck

X = np.ones((2, 8), np.float32) + np.arange(8, dtype=np.float32)
W = np.ones(8, np.float32)


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(eps=float("nan")), ValueError, "eps"),
    (dict(eps=-1.0), ValueError, "eps"),
    (dict(eps="1e-5"), TypeError, "eps"),
    (dict(eps=1e-5, weight=np.ones(7, np.float32)), ValueError, "weight"),
    (dict(eps=1e-5, weight=W, bias=np.ones(8, np.float16)), ValueError, "bias"),
    (dict(eps=1e-5, bias=np.ones(8, np.float32)), ValueError, "bias"),
    (dict(eps=1e-5, x=np.ones((2, 8), np.int32)), TypeError, "x"),
    (dict(eps=1e-5, x=np.ones((2, 8), np.uint16)), TypeError, "dtype="),
    (dict(eps=1e-5, x=np.ones((2, 8), np.uint16), dtype="int8"), ValueError, "dtype"),
    (dict(eps=1e-5, x="abc"), TypeError, "x"),
    (dict(eps=1e-5, x=None), TypeError, "x"),
    (dict(eps=1e-5, op="batchnorm"), ValueError, "op"),
    (dict(eps=1e-5, contract="nope"), ValueError, "contract"),
    (dict(eps=1e-5, axis=5), ValueError, "axis"),
    (dict(eps=1e-5, normalized_shape=(4,)), ValueError, "normalized_shape"),
    (dict(eps=1e-5, dtype_compute="float8"), ValueError, "dtype_compute"),
    (dict(eps=1e-5, direction="sideways"), ValueError, "direction"),
    (dict(eps=1e-5, direction="backward"), ValueError, "dy"),
    (dict(eps=1e-5, outputs=["z"]), ValueError, "outputs"),
    (dict(eps=1e-5, weight_offset=1.0), ValueError, "weight_offset"),
])
def test_reference_errors_name_the_argument(kwargs, error, text):
    args = dict(op="layernorm", x=X)
    args.update(kwargs)
    op, x = args.pop("op"), args.pop("x")
    with pytest.raises(error, match=text):
        normcheck.reference(op, x, **args)


def test_check_errors():
    case = normcheck.reference("layernorm", X, eps=1e-5)
    with pytest.raises(TypeError, match="case"):
        normcheck.check(X, "not a case")
    with pytest.raises(ValueError, match="outputs"):
        normcheck.check({"dx": X}, case)
    with pytest.raises(TypeError, match="outputs"):
        normcheck.check((X, X), case)
    with pytest.raises(TypeError, match=r"outputs\['y'\]"):
        normcheck.check({"y": X.astype(np.float16)}, case)
    bf = normcheck.reference("layernorm", np.zeros((1, 4), np.uint16), eps=1e-5, dtype="bfloat16")
    with pytest.raises(ValueError, match="not a bfloat16 value"):
        normcheck.check({"y": np.full((1, 4), 0.1, np.float32)}, bf)


def test_fixture_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="path"):
        normcheck.fixtures.open(tmp_path / "none.h5")
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5")
    with pytest.raises(normcheck.FixtureError):
        normcheck.fixtures.open(junk)
    with pytest.raises(normcheck.FixtureError, match="no_such_tier"):
        normcheck.fixtures.generate("no_such_tier")


@pytest.mark.parametrize("x", [np.float32(1.0) * np.ones((), np.float32), np.ones((0, 8), np.float32),
                               np.ones((2, 0), np.float32)])
def test_degenerate_shapes_are_errors_or_cases_never_crashes(x):
    try:
        case = normcheck.reference("layernorm", x, eps=1e-5)
    except ValueError as e:
        assert str(e).split(":")[0] in ("x", "axis", "axes", "shape"), str(e)
    else:
        assert normcheck.check(case.expected, case).verdict in ("PASSED", "MISTRUSTED")


def test_unknown_case_id_in_a_file(tmp_path):
    case = normcheck.reference("layernorm", X, eps=1e-5, id="one")
    case.save(tmp_path / "one.h5")
    with pytest.raises(ValueError, match="case_id"):
        normcheck.fixtures.open(tmp_path / "one.h5")["two"]
    with pytest.raises(normcheck.FixtureError, match="exist"):
        case.save(tmp_path / "one.h5")  # never replaced silently


def test_random_arguments_raise_only_value_or_type_errors():
    """300 random argument sets (shapes, dtypes, axes, eps, outputs, contracts): each either gives a
    case that checks its own expected outputs as PASSED/MISTRUSTED, or raises ValueError/TypeError."""
    rng = np.random.default_rng(11)
    dtypes = [np.float64, np.float32, np.float16, np.int64, np.uint16]
    for _ in range(300):
        shape = tuple(int(d) for d in rng.integers(0, 5, size=rng.integers(0, 4)))
        x = rng.standard_normal(shape).astype(dtypes[rng.integers(len(dtypes))]) if shape else np.float32(1)
        if rng.random() < 0.2 and x.size and x.dtype.kind == "f":
            x.flat[0] = np.nan
        kw = dict(eps=float(rng.choice([1e-5, 0.0, -1.0, np.nan, np.inf])))
        if rng.random() < 0.5 and shape:
            kw["weight"] = np.ones(shape[-1:], dtypes[rng.integers(3)])
        if rng.random() < 0.3 and shape:
            kw["bias"] = np.zeros(shape[-1:], dtypes[rng.integers(3)])
        if rng.random() < 0.3:
            kw["axis"] = int(rng.integers(-4, 4))
        if rng.random() < 0.2:
            kw["axes"] = [int(a) for a in rng.integers(-3, 3, size=rng.integers(0, 3))]
        if rng.random() < 0.2:
            kw["contract"] = str(rng.choice(["exact", "llama", "gemma", "onnx", "x"]))
        if rng.random() < 0.2:
            kw["outputs"] = [str(rng.choice(["y", "mean", "rstd", "dx"]))]
        if rng.random() < 0.2:
            kw["dtype"] = str(rng.choice(["bfloat16", "float16", "float32"]))
        try:
            case = normcheck.reference(str(rng.choice(["layernorm", "rmsnorm"])), x, **kw)
        except (ValueError, TypeError):
            continue
        assert normcheck.check(case.expected, case).verdict in ("PASSED", "MISTRUSTED"), kw
