#!/usr/bin/env python3
"""Serves rmsnorm.RMSNorm to normcheck over the subprocess protocol (conformance/PROTOCOL.md):

    normcheck run --fixtures smoke.h5 --candidate "cmd:/usr/bin/python3 normcheck_candidate.py"

normcheck_protocol comes with normcheck (share/normcheck/python; the CMake function puts it on
PYTHONPATH). The same glue serves a Triton or JAX kernel: only run() changes."""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from normcheck_protocol import serve  # noqa: E402
from rmsnorm import RMSNorm  # noqa: E402

CAPABILITIES = {
    "ops": ["rmsnorm"],
    "dtypes": ["float32"],
    "compute_dtypes": ["float32"],
    "directions": ["forward"],
    "contracts": ["exact"],
    "residual": False,
    "blocks": False,
    "general_axes": False,
    "weight_offset": False,
    "device": "cpu",
}


def run(case, inputs):
    x = torch.from_numpy(np.ascontiguousarray(inputs["x"], dtype=np.float32))
    module = RMSNorm(x.shape[-1], eps=case["epsilon"], bias=case["affine"] == "weight_bias")
    with torch.no_grad():
        if case["affine"] != "none":
            module.weight.copy_(torch.from_numpy(inputs["weight"].astype(np.float32)))
        if module.bias is not None:
            module.bias.copy_(torch.from_numpy(inputs["bias"].astype(np.float32)))
    with torch.no_grad():
        y, rstd = module(x, return_rstd=True)
    return {"y": y.numpy(), "rstd": rstd.numpy()}  # an output left out is reported MISSING


if __name__ == "__main__":
    serve("rmsnorm.RMSNorm (torch)", CAPABILITIES, run, description="the example's PyTorch RMSNorm module")
