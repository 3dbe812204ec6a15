"""The kernels against normcheck's golden cases (the smoke tier unless --normcheck-tier or
--normcheck-fixtures says otherwise) and against the certified reference on our own shapes."""
import pytest
import torch

from normcheck.testing import assert_norm_close

from mykernels import layer_norm, rmsnorm

# The cases our kernels implement: last-dim norms, no fused residual, contract exact.
PLAIN = dict(direction="forward", residual="none", block="none", contract="exact", axis=-1, axes=None)


def tensors(case):
    """The case's inputs as torch tensors of the case's dtypes."""
    out = {}
    for name, values in case.inputs.items():
        t = torch.from_numpy(values)
        out[name] = t.to(torch.bfloat16) if case.input_dtypes[name] == "bfloat16" else t
    return out


@pytest.mark.normcheck(op="rmsnorm", **PLAIN)
def test_rmsnorm_golden(normcheck_case):
    t, a = tensors(normcheck_case), normcheck_case.attributes
    y = rmsnorm(t["x"], t.get("weight"), t.get("bias"), a["epsilon"], a["weight_offset"])
    result = normcheck_case.check({"y": y})
    assert result.passed, result.message


# PyTorch 1.13's CPU layer_norm: no float16 kernel, and its bfloat16 kernel rounds more often
# than once (mean and rstd in bfloat16): a recorded finding of normcheck (docs/FINDINGS.md), so
# this suite takes its float32 and float64 cases.
@pytest.mark.normcheck(op="layernorm", weight_offset=0.0, dtype_x=("float32", "float64"), **PLAIN)
def test_layer_norm_golden(normcheck_case):
    t, a = tensors(normcheck_case), normcheck_case.attributes
    result = normcheck_case.check({"y": layer_norm(t["x"], t.get("weight"), t.get("bias"), a["epsilon"])})
    assert result.passed, result.message


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hidden", [64, 4096])
def test_rmsnorm_against_reference(dtype, hidden):
    torch.manual_seed(0)
    x = torch.randn(4, hidden).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden)).to(dtype)
    assert_norm_close(rmsnorm(x, w, eps=1e-6), op="rmsnorm", x=x, weight=w, eps=1e-6)
