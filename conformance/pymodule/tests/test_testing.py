"""normcheck.testing.assert_norm_close: passes a correct kernel (PyTorch's own layer_norm),
fails a faulty one with the worst element, the allowance, the verdict, the diagnosis and a saved
fixture file that the CLI rechecks."""
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import normcheck
from normcheck.testing import assert_norm_close
from kernels import eps_outside_sqrt, rows

torch = pytest.importorskip("torch")


def test_torch_layer_norm_passes():
    x = torch.from_numpy(rows(2.0, (8, 256)))
    w, b = torch.randn(256), torch.randn(256)
    y = torch.nn.functional.layer_norm(x, (256,), w, b, 1e-5)
    r = assert_norm_close(y, op="layernorm", x=x, weight=w, bias=b, eps=1e-5, normalized_shape=(256,))
    assert r.verdict == "PASSED"


def test_bfloat16_rmsnorm_llama_contract_passes():
    x = torch.randn(4, 128).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(128)).to(torch.bfloat16)
    # LLaMA's RMSNorm: float32 statistics, xhat rounded to bfloat16 before the weight.
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16) * w
    assert_norm_close(y, op="rmsnorm", x=x, weight=w, eps=1e-6, contract="llama")


def test_mistrusted_warns_or_fails_on_request():
    x = (np.float32(1e4) + np.random.default_rng(3).standard_normal((2, 64)) * 1e-3).astype(np.float32)
    y = normcheck.reference("layernorm", x, eps=1e-5).expected["y"]
    with pytest.warns(normcheck.MistrustedWarning):
        assert_norm_close(y, op="layernorm", x=x, eps=1e-5)
    with pytest.raises(AssertionError, match="MISTRUSTED"):
        assert_norm_close(y, op="layernorm", x=x, eps=1e-5, allow_mistrusted=False, save_failures=None)


def test_faulty_kernel_message(tmp_path):
    x = rows(0.0, (8, 512))
    w, b = np.ones(512, np.float32), np.zeros(512, np.float32)
    y = eps_outside_sqrt(x, w, b, 1e-2)
    with pytest.raises(AssertionError) as e:
        assert_norm_close(y, op="layernorm", x=x, weight=w, bias=b, eps=1e-2, save_failures=str(tmp_path))
    msg = str(e.value)
    assert "FAILED" in msg and "worst element [" in msg and "allowance" in msg
    assert "eps_outside_sqrt" in msg and "eps added outside the sqrt" in msg and "fitted epsilon" in msg
    fixture = re.search(r"case saved as a fixture file: (\S+)", msg).group(1)
    assert os.path.dirname(fixture) == str(tmp_path) and os.path.exists(fixture)
    f = normcheck.fixtures.open(fixture)
    (case,) = list(f)
    assert case.id == "test_faulty_kernel_message"
    assert case.check({"y": y}).verdict == "FAILED"
    cli = os.environ.get("NORMCHECK_CLI") or shutil.which("normcheck")
    if cli:  # the recheck line runs as printed
        cmd = re.search(r"recheck: (normcheck .*)", msg).group(1).split()
        p = subprocess.run([cli] + cmd[1:], capture_output=True, text=True)
        assert p.returncode == 1 and "FAILED" in p.stdout + p.stderr, p.stdout + p.stderr
    # A second failure does not overwrite the first one's files.
    with pytest.raises(AssertionError) as e2:
        assert_norm_close(y, op="layernorm", x=x, weight=w, bias=b, eps=1e-2, save_failures=str(tmp_path),
                          id="test_faulty_kernel_message")
    assert re.search(r"fixture file: (\S+)", str(e2.value)).group(1) != fixture
