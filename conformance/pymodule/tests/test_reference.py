"""normcheck.reference against values computed here in binary64 from the same inputs (an
independent two-pass in float64 is within 1e-12 of the exact value for these rows), and its
dtype handling: float16, bfloat16 as torch tensors and as uint16 bit patterns, CPU/CUDA torch."""
import numpy as np
import pytest

import normcheck
from kernels import rows


def layernorm64(x, w, b, eps):
    x = x.astype(np.float64)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b, mean, 1 / np.sqrt(var + eps)


def test_layernorm_float32_matches_binary64_two_pass():
    x = rows(3.0, (8, 256))
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal(256).astype(np.float32), rng.standard_normal(256).astype(np.float32)
    case = normcheck.reference("layernorm", x, w, b, eps=1e-5)
    y64, mean64, rstd64 = layernorm64(x, w, b, 1e-5)
    assert case.expected["y"].dtype == np.float32 and case.expected["y"].shape == (8, 256)
    assert case.expected["mean"].shape == (8, 1) and case.dtypes["rstd"] == "float32"
    np.testing.assert_allclose(case.expected_f64["y"], y64, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(case.expected_f64["mean"], mean64, rtol=1e-12)
    np.testing.assert_allclose(case.expected_f64["rstd"], rstd64, rtol=1e-12)
    # Correct rounding: the float32 output is the nearest float32 of the exact value.
    assert np.array_equal(case.expected["y"], case.expected_f64["y"].astype(np.float32))
    assert case.certified["y"].dtype == np.bool_ and case.certified["y"].all()


def test_rmsnorm_outputs_and_normalized_shape():
    x = rows(0.0, (2, 3, 16))
    case = normcheck.reference("rmsnorm", x, np.ones((3, 16), np.float32), eps=1e-6, normalized_shape=(3, 16))
    assert set(case.dtypes) == {"y", "rstd"}
    ms = (x.astype(np.float64) ** 2).mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(case.expected_f64["y"], x / np.sqrt(ms + 1e-6), rtol=1e-12)
    only_y = normcheck.reference("rmsnorm", x, eps=1e-6, axis=1, outputs="y")
    assert list(only_y.dtypes) == ["y"]


def test_float16_and_dtype_out():
    x = rows(0.0, (4, 64)).astype(np.float16)
    case = normcheck.reference("layernorm", x, eps=1e-5)
    assert case.expected["y"].dtype == np.float16 and case.dtypes["mean"] == "float32"
    wide = normcheck.reference("layernorm", x, eps=1e-5, dtype_out="float32")
    assert wide.expected["y"].dtype == np.float32
    assert np.array_equal(wide.expected["y"].astype(np.float16), case.expected["y"]) or \
        np.abs(wide.expected["y"].astype(np.float64) - case.expected["y"]).max() < 2e-3


def test_bfloat16_torch_and_bits_agree():
    torch = pytest.importorskip("torch")
    xt = torch.from_numpy(rows(1.0, (4, 32))).to(torch.bfloat16)
    wt = torch.ones(32, dtype=torch.bfloat16)
    a = normcheck.reference("rmsnorm", xt, wt, eps=1e-6)
    bits = xt.view(torch.int16).numpy().view(np.uint16)
    wbits = wt.view(torch.int16).numpy().view(np.uint16)
    b = normcheck.reference("rmsnorm", bits, wbits, eps=1e-6, dtype="bfloat16")
    assert a.dtypes["y"] == "bfloat16" and a.attributes["dtype_x"] == "bfloat16"
    assert a.expected["y"].dtype == np.float32  # bfloat16 values held in float32
    assert np.array_equal(a.expected["y"], b.expected["y"])
    assert a.expected_torch("y").dtype == torch.bfloat16
    # Every value is a bfloat16 value: the low 16 bits of its float32 pattern are zero.
    assert not (a.expected["y"].view(np.uint32) & 0xFFFF).any()
    # A bfloat16 kernel output judged as it is.
    y = (xt.float() * torch.rsqrt(xt.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * wt
    assert normcheck.check({"y": y}, a).verdict == "PASSED"


def test_torch_cpu_inputs():
    torch = pytest.importorskip("torch")
    x = rows(0.5, (3, 48))
    a = normcheck.reference("layernorm", torch.from_numpy(x), eps=1e-5)
    b = normcheck.reference("layernorm", x, eps=1e-5)
    assert np.array_equal(a.expected["y"], b.expected["y"])
    # A non-contiguous view (a transpose) is taken as the values it shows.
    t = torch.from_numpy(np.ascontiguousarray(x.T)).T
    assert not t.is_contiguous()
    assert np.array_equal(normcheck.reference("layernorm", t, eps=1e-5).expected["y"], b.expected["y"])


def _cuda_or_skip():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip(f"the CUDA input path (a CUDA tensor copied to the host) is untested here: torch "
                    f"{torch.__version__} sees no CUDA device (README.md, 'Not tested here')")
    return torch


def test_torch_cuda_inputs_and_outputs():
    torch = _cuda_or_skip()
    x = rows(0.5, (3, 48))
    b = normcheck.reference("layernorm", x, eps=1e-5)
    xc = torch.from_numpy(x).cuda()
    c = normcheck.reference("layernorm", xc, eps=1e-5)
    assert np.array_equal(c.expected["y"], b.expected["y"])
    y = torch.nn.functional.layer_norm(xc, (48,), eps=1e-5)
    assert y.is_cuda and normcheck.check({"y": y}, c).verdict in ("PASSED", "MISTRUSTED")
    xb = xc.to(torch.bfloat16)
    cb = normcheck.reference("rmsnorm", xb, eps=1e-6)
    assert np.array_equal(cb.expected["y"], normcheck.reference("rmsnorm", xb.cpu(), eps=1e-6).expected["y"])


def test_backward_dx_dweight():
    x, dy = rows(0.0, (4, 32)), rows(0.0, (4, 32), seed=5)
    w = np.ones(32, np.float32)
    case = normcheck.reference("layernorm", x, w, np.zeros(32, np.float32), eps=1e-5, direction="backward", dy=dy)
    assert {"dx", "dweight", "dbias"} <= set(case.dtypes)
    np.testing.assert_allclose(case.expected_f64["dbias"], dy.astype(np.float64).sum(0), rtol=1e-12, atol=1e-12)


def test_fused_residual():
    x, res = rows(0.0, (2, 16)), rows(0.0, (2, 16), seed=2)
    case = normcheck.reference("rmsnorm", x, eps=1e-6, residual=res)
    h = x.astype(np.float64) + res
    np.testing.assert_array_equal(case.expected_f64["residual_out"], h)


def test_float16_bit_patterns():
    x = rows(0.0, (2, 32)).astype(np.float16)
    a = normcheck.reference("layernorm", x, eps=1e-5)
    b = normcheck.reference("layernorm", x.view(np.uint16), eps=1e-5, dtype="float16")
    assert b.attributes["dtype_x"] == "float16" and np.array_equal(a.expected["y"], b.expected["y"])
    assert normcheck.check({"y": a.expected["y"].view(np.uint16)}, a).verdict == "PASSED"
