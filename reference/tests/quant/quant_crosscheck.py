#!/usr/bin/python3
"""Independent cross-check of the reference's quantization codec (reference/src/quant.cpp).

The expected codes come from a second, deliberately different implementation written from the
format definitions: every code is decoded from its bit fields (sign, exponent, mantissa, bias;
OCP 8-bit FP spec and OCP MX spec v1.0 for E2M1), and a value is encoded by brute force over all
finite codes with exact rational arithmetic (fractions.Fraction): the nearest value, ties to the
code with an even mantissa, saturation to the largest finite value (SATFINITE), NaN to the
canonical NaN code. int8 uses Python's round() (half to even) clamped to +-127.

Values checked, as float32 values (the cvt input is always a float32): every code's value,
every midpoint between adjacent codes and its float32 neighbours (two ulps each side), the
saturation region, +-0, +-Inf, NaN, and random float32 bit patterns across the whole range.
"""
import argparse
import math
import random
import struct
import subprocess
import sys
from fractions import Fraction

FORMATS = {  # name: (exponent bits, mantissa bits, bias, NaN rule)
    "e4m3fn": (4, 3, 7, "fn"),
    "e5m2": (5, 2, 15, "ieee"),
    "e2m1": (2, 1, 1, "none"),
}


def decode_bits(fmt, code):
    """Value of a code from its bit fields: Fraction, or 'nan' / 'inf' / '-inf'."""
    eb, mb, bias, rule = FORMATS[fmt]
    width = 1 + eb + mb
    sign = -1 if (code >> (width - 1)) & 1 else 1
    e = (code >> mb) & ((1 << eb) - 1)
    m = code & ((1 << mb) - 1)
    if rule == "fn" and e == (1 << eb) - 1 and m == (1 << mb) - 1:
        return "nan"
    if rule == "ieee" and e == (1 << eb) - 1:
        return ("inf" if sign > 0 else "-inf") if m == 0 else "nan"
    if e == 0:
        v = Fraction(m, 1 << mb) * Fraction(2) ** (1 - bias)
    else:
        v = (1 + Fraction(m, 1 << mb)) * Fraction(2) ** (e - bias)
    return sign * v, sign < 0


_FINITE = {}


def finite_codes(fmt):
    if fmt in _FINITE:
        return _FINITE[fmt]
    eb, mb, _, _ = FORMATS[fmt]
    out = []
    for code in range(1 << (1 + eb + mb)):
        d = decode_bits(fmt, code)
        if isinstance(d, tuple):
            out.append((code, d[0], d[1]))
    _FINITE[fmt] = out
    return out


def encode_brute(fmt, x):
    """x: float (a float32 value). Brute force over all finite codes."""
    if fmt == "int8":
        if math.isnan(x):
            return 0
        if math.isinf(x):
            return 127 if x > 0 else -127
        return max(-127, min(127, round(Fraction(x))))
    eb, mb, _, rule = FORMATS[fmt]
    if math.isnan(x):
        return 0x7F if rule != "none" else 0
    codes = finite_codes(fmt)
    neg = math.copysign(1.0, x) < 0
    same_sign = [(c, v) for c, v, s in codes if s == neg]
    vmax = max(abs(v) for _, v in same_sign)
    if math.isinf(x) or abs(Fraction(x)) >= vmax:
        return next(c for c, v in same_sign if abs(v) == vmax)
    fx = Fraction(x)
    best = min(abs(v - fx) for _, v in same_sign)
    near = [c for c, v in same_sign if abs(v - fx) == best]
    if len(near) > 1:
        near = [c for c in near if (c & 1) == 0]  # the even mantissa
    assert len(near) == 1, (fmt, x, near)
    return near[0]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_neighbours(x, k):
    """x (a float32 value) and its k float32 neighbours each side."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    out = []
    for d in range(-k, k + 1):
        b = bits + d
        if 0 <= b < 0x7F800000:
            out.append(struct.unpack("<f", struct.pack("<I", b))[0])
    return out


def values_for(fmt, rng, n_random):
    vals = set()
    if fmt == "int8":
        for k in range(-130, 131):
            for v in (k, k + 0.5):
                vals.update(f32_neighbours(abs(v), 2))
                vals.update(-w for w in f32_neighbours(abs(v), 2))
    else:
        pos = sorted({v for _, v, s in finite_codes(fmt) if not s})
        for a, b in zip(pos, pos[1:]):
            for v in (a, (a + b) / 2):
                vals.update(f32_neighbours(float(v), 2))
        top = float(pos[-1])
        for v in (top, top * 1.0625, top * 1.125, top * 2, 3.0e38):
            vals.update(f32_neighbours(f32(v), 2))
        vals.update([-v for v in list(vals)])
    vals.update([0.0, -0.0, math.inf, -math.inf, math.nan])
    for _ in range(n_random):
        b = rng.getrandbits(32)
        v = struct.unpack("<f", struct.pack("<I", b))[0]
        if not math.isnan(v):
            vals.add(v)
    return sorted(vals, key=lambda v: (math.isnan(v), v if not math.isnan(v) else 0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--random", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=20261202)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    lines, expect = [], []
    for fmt in ("e4m3fn", "e5m2", "e2m1"):
        for code in range(1 << (1 + sum(FORMATS[fmt][:2]))):
            d = decode_bits(fmt, code)
            lines.append(f"dec {fmt} {code}")
            if isinstance(d, tuple):
                v = float(d[0])
                if v == 0 and d[1]:
                    v = -0.0
                expect.append(("dec", fmt, code, v))
            else:
                expect.append(("dec", fmt, code, d))
    for fmt in ("e4m3fn", "e5m2", "e2m1", "int8"):
        for v in values_for(fmt, rng, a.random):
            lines.append(f"enc {fmt} {v.hex() if math.isfinite(v) else repr(v)}")
            expect.append(("enc", fmt, v, encode_brute(fmt, v)))
    out = subprocess.run([a.tool], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
    got = out.stdout.split("\n")
    bad = 0
    for (kind, fmt, arg, want), g in zip(expect, got):
        if kind == "dec":
            if isinstance(want, str):
                ok = g == want
            else:
                gv = float.fromhex(g) if g not in ("nan", "inf", "-inf") else float(g)
                ok = gv == want and math.copysign(1, gv) == math.copysign(1, want)
        else:
            ok = int(g) == want
        if not ok:
            bad += 1
            if bad <= 20:
                print(f"MISMATCH {kind} {fmt} {arg!r}: reference {g}, independent {want}")
    n = len(expect)
    print(f"quant codec cross-check: {n - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
