"""The deliberately faulty kernel: run with NORMCHECK_EXAMPLE_FAULTY=1 to see its test fail with
normcheck's diagnosis ("eps added outside the sqrt"); skipped otherwise so the suite is green."""
import os

import pytest
import torch

from normcheck.testing import assert_norm_close

from mykernels import faulty_rmsnorm


@pytest.mark.skipif(os.environ.get("NORMCHECK_EXAMPLE_FAULTY") != "1", reason="the faulty kernel (NORMCHECK_EXAMPLE_FAULTY=1)")
def test_faulty_rmsnorm():
    torch.manual_seed(0)
    x = 3e-3 * torch.randn(8, 1024)  # activations of rms 3e-3: eps 1e-5 is not negligible there
    w = torch.ones(1024)
    assert_norm_close(faulty_rmsnorm(x, w, eps=1e-5), op="rmsnorm", x=x, weight=w, eps=1e-5)
