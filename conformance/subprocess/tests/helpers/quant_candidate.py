#!/usr/bin/env python3
"""A fused RMSNorm + quantization candidate over the subprocess protocol (PROTOCOL.md,
"Quantized cases"), for the transport's tests: static per-tensor FP8 (E4M3FN, E5M2; reciprocal,
divide or multiply; amax) and MXFP8 (E4M3, E5M2; the OCP floor and the round-up rule), RMSNorm
forward over the last dim, the `exact` norm contract. The norm is evaluated in binary64 and
rounded once to the dtype the contract quantizes; the quantization is float32 arithmetic as
reference/README.md ("Quantized outputs") gives it, the code conversion written here from the
formats' bit layouts.

    --wrong   every nonzero finite code of q moved to its neighbour (must be FAILED)
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python"))
from normcheck_protocol import Declined, serve, bfloat16_to_float32, float32_to_bfloat16  # noqa: E402
from normcheck_protocol import _float64_to_float32_odd  # noqa: E402

WRONG = "--wrong" in sys.argv

CAPABILITIES = {
    "ops": ["rmsnorm"],
    "dtypes": ["float32", "float16", "bfloat16"],
    "compute_dtypes": ["float32"],
    "directions": ["forward"],
    "contracts": ["exact"],
    "residual": False,
    "general_axes": False,
    "weight_offset": False,
    "quant_formats": ["float8_e4m3fn", "float8_e5m2", "mxfp8_e4m3", "mxfp8_e5m2"],
    "quant_scales": ["static_tensor", "mx_block"],
}

# man bits, bias, max, NaN code, emax (OCP MX)
E4M3 = (3, 7, 448.0, 0x7F, 8)
E5M2 = (2, 15, 57344.0, 0x7F, 15)


def round_to(v, dtype):
    """binary64 values -> values of dtype (float32 arrays), rounded once to nearest even."""
    if dtype == "float32":
        return v.astype(np.float32)
    if dtype == "float16":
        return v.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return bfloat16_to_float32(float32_to_bfloat16(_float64_to_float32_odd(v)))
    raise Declined(f"dtype {dtype}")


def to_mini(u, fmt):
    """cvt.rn.satfinite: round to nearest even, saturate to the largest finite value."""
    man, bias, vmax, nan, _ = fmt
    u = np.asarray(u, dtype=np.float64)
    sign = np.where(np.signbit(u), 0x80, 0)
    with np.errstate(invalid="ignore"):
        a = np.minimum(np.abs(np.nan_to_num(u, nan=0.0)), vmax)
        _, e = np.frexp(a)
        binade = np.maximum(e - 1, 1 - bias)
        quantum = np.ldexp(1.0, binade - man)
        r = np.minimum(np.rint(a / quantum) * quantum, vmax)
        _, e2 = np.frexp(r)
        el = e2 - 1
        sub = r < 2.0 ** (1 - bias)
        code_sub = (r / 2.0 ** (1 - bias - man)).astype(np.int64)
        code_norm = ((el + bias) << man) | ((r / np.ldexp(1.0, el - man)).astype(np.int64) - (1 << man))
    code = np.where(r == 0, 0, np.where(sub, code_sub, code_norm)) | sign
    return np.where(np.isnan(u), nan, code).astype(np.int64)


def mx_code(amax, fmt, rule):
    man, bias, vmax, nan, emax = fmt
    if not np.isfinite(amax):
        return 0xFF
    if rule == "floor":
        e = (-126 if amax == 0 else int(np.frexp(np.float64(amax))[1]) - 1) - emax
        return 0xFF if e > 127 else max(e, -127) + 127
    with np.errstate(over="ignore"):
        t = np.float32(amax) * (np.float32(1) / np.float32(vmax))
    if np.isinf(t):
        return 0xFE
    if t <= np.float32(2.0 ** -127):
        return 0
    fr, e = np.frexp(np.float64(t))
    return min(int(e) - 1 if fr == 0.5 else int(e), 127) + 127


def run(case, inputs):
    q = case.get("quant")
    if not q:
        raise Declined("quantized cases only")
    if case["affine"] == "weight_bias":
        raise Declined("no bias")
    x = inputs["x"].astype(np.float64)
    ms = (x * x).mean(axis=-1, keepdims=True)
    eps = float.fromhex(case["epsilon_hex"])
    y = x * (1.0 / np.sqrt(ms + eps))
    if "weight" in inputs:
        y = y * inputs["weight"].astype(np.float64)
    p = round_to(y, "float32" if q["value"] == "float32" else case["dtype_out"])  # float32 array
    fmt = E5M2 if q["format"] in ("float8_e5m2", "mxfp8_e5m2") else E4M3
    out = {}
    f32 = np.float32
    if q["scale"] == "static_tensor":
        s = f32(inputs["scale"].reshape(-1)[0])
        with np.errstate(all="ignore"):
            if q["apply"] == "reciprocal":
                u = p * (f32(1) / s)
            elif q["apply"] == "divide":
                u = p / s
            else:
                u = p * s
        codes = to_mini(u, fmt)
        if "amax" in q["outputs"]:
            out["amax"] = np.array([np.fmax.reduce(np.abs(p).reshape(-1), initial=0.0)], dtype=np.float32)
    elif q["scale"] == "mx_block":
        blocks = p.reshape(-1, 32)
        with np.errstate(invalid="ignore"):
            amax = np.fmax.reduce(np.abs(blocks), axis=1, initial=0.0).astype(np.float32)
        finite = np.isfinite(blocks).all(axis=1)
        e8 = np.array([mx_code(a, fmt, q["mx_rule"]) if f else 0xFF for a, f in zip(amax, finite)], dtype=np.int64)
        with np.errstate(all="ignore"):
            u = np.where((e8 == 0xFF)[:, None], np.float32(np.nan), np.ldexp(blocks, (127 - e8)[:, None]).astype(np.float32))
        codes = to_mini(u, fmt).reshape(p.shape)
        shape = case["outputs"]["scale"]["shape"]
        out["scale"] = e8.reshape(shape)
        if "amax" in q["outputs"]:
            out["amax"] = amax.reshape(shape)
    else:
        raise Declined(f"scale {q['scale']}")
    if WRONG:
        mag = codes & 0x7F
        codes = np.where((mag != 0) & (mag != 0x7F), codes ^ 1, codes)
    out["q"] = codes
    if "y" in case["outputs"]:
        out["y"] = y
    return out


if __name__ == "__main__":
    serve("numpy quant (test)" + (" wrong codes" if WRONG else ""), CAPABILITIES, run,
          description="RMSNorm + static FP8 / MXFP8 in numpy, for the protocol's quantized outputs")
