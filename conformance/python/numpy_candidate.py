#!/usr/bin/env python3
"""A complete normcheck candidate in plain numpy, as an example of the subprocess protocol:
LayerNorm and RMSNorm forward, computed in float32, the `exact` contract (every output is
rounded once, to its dtype, by the protocol module), any normalized axes, fused residual add.

    normcheck ... --candidate "cmd:/usr/bin/python3 conformance/python/numpy_candidate.py"
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from normcheck_protocol import serve  # noqa: E402

CAPABILITIES = {
    "ops": ["layernorm", "rmsnorm"],
    "dtypes": ["float32", "float16", "bfloat16"],  # bfloat16 arrives as float32 values
    "compute_dtypes": ["float32"],
    "directions": ["forward"],
    "contracts": ["exact"],
    "residual": True,
    "blocks": False,
    "general_axes": True,
    "weight_offset": True,
    "device": "cpu",
}


def run(case, inputs):
    f32 = np.float32
    x = inputs["x"].astype(f32)
    axes = tuple(case["norm_dims"])
    # Parameters have the extents of the normalized dims: give them x's rank to broadcast.
    pshape = [n if i in axes else 1 for i, n in enumerate(x.shape)]
    param = lambda name: inputs[name].astype(f32).reshape(pshape)  # noqa: E731
    out = {}
    h = x
    if case["residual"] != "none":
        h = f32(case["alpha"]) * x + inputs["residual"].astype(f32)
        if case["residual"] == "add_bias":
            h = h + param("residual_bias")
        out["residual_out"] = h
    if case["op"] == "layernorm":
        mean = h.mean(axis=axes, keepdims=True, dtype=f32)
        out["mean"] = mean
        d = h - mean
    else:
        d = h
    var = (d * d).mean(axis=axes, keepdims=True, dtype=f32)
    rstd = f32(1) / np.sqrt(var + f32(case["epsilon"]))
    out["rstd"] = rstd
    y = d * rstd
    if case["affine"] != "none":
        y = y * (f32(case["weight_offset"]) + param("weight"))
    if case["affine"] == "weight_bias":
        y = y + param("bias")
    out["y"] = y
    return out


if __name__ == "__main__":
    serve("numpy float32 (example)", CAPABILITIES, run,
          description="LayerNorm/RMSNorm forward in numpy, float32 compute, one rounding per output")
