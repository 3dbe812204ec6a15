#!/usr/bin/python3
"""Emulates ggml-vulkan's norm.comp (ggml 0.25.1) in float32 on one row of a fixture case and
prints its y next to the exact one: the evidence that the Vulkan ggml_norm is a one-pass
E[x^2] - E[x]^2 variance over a 512-lane tree reduction (docs/FINDINGS.md).

  vulkan_norm_model.py FIXTURES.h5 CASE ROW COL

norm.comp: lane i sums x[i], x[i]^2 over i = lane, lane + 512, ... (in order); the 512 partials
are added in a halving tree (s = 256, 128, ..., 1); mean = sum / n; var = sum_sq / n - mean^2;
inv_std = inversesqrt(var + eps); y = (x - mean) * inv_std, then ggml_mul / ggml_add nodes.
numpy's float32 arithmetic rounds each operation once, as the shader's does; inversesqrt is
taken correctly rounded here, lavapipe's is within 2 ulp (the model matched ggml-vulkan bit for
bit on ln_f32_h256_mean1000 and ln_f32_rows65537, and within 2 ulp on prop's two-element row).
"""
import sys

import h5py
import numpy as np

f32 = np.float32


def vulkan_norm_row(x, eps, weight=None, bias=None):
    n = x.size
    lanes = 512
    s1 = np.zeros(lanes, f32)
    s2 = np.zeros(lanes, f32)
    for i0 in range(0, n, lanes):
        chunk = x[i0:i0 + lanes]
        s1[:chunk.size] += chunk
        s2[:chunk.size] += chunk * chunk
    s = lanes // 2
    while s > 0:
        s1[:s] += s1[s:2 * s]
        s2[:s] += s2[s:2 * s]
        s //= 2
    mean = f32(s1[0] / f32(n))
    var = f32(f32(s2[0] / f32(n)) - f32(mean * mean))
    inv_std = f32(1.0 / np.sqrt(np.float64(f32(var + eps))))
    y = f32((x - mean) * inv_std)
    if weight is not None:
        y = f32(y * weight)
    if bias is not None:
        y = f32(y + bias)
    return y, mean, var


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    path, case, row, col = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    g = h5py.File(path, "r")["cases/" + case]
    if g.attrs["op"] != b"layernorm" and g.attrs["op"] != "layernorm":
        sys.exit("a layernorm case is needed")
    x = g["inputs/x"][:].astype(f32)
    x = x.reshape(-1, x.shape[-1])[row]
    w = g["inputs/weight"][:].astype(f32) if "weight" in g["inputs"] else None
    b = g["inputs/bias"][:].astype(f32) if "bias" in g["inputs"] else None
    eps = f32(g.attrs["epsilon"])
    y, mean, var = vulkan_norm_row(x, eps, w, b)
    exact = g["expected_f64/y"][:].reshape(-1, x.size)[row]
    d = x.astype(np.float64) - x.astype(np.float64).mean()
    print(f"row {row}: n {x.size}, mean {mean!r}, one-pass variance {var!r}, exact variance {np.mean(d * d)!r}")
    print(f"y[{row}, {col}]: model {y[col]!r} ({float(y[col]).hex()}), exact {exact[col]!r}")


if __name__ == "__main__":
    main()
