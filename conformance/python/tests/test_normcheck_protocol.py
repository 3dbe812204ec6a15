#!/usr/bin/env python3
"""Tests of normcheck_protocol.py: bfloat16 conversions against exact rational arithmetic, and
numpy_candidate.py driven by a host written here from PROTOCOL.md alone."""
import json
import math
import os
import struct
import subprocess
import sys
import unittest
from fractions import Fraction

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import normcheck_protocol as ncp  # noqa: E402

BF16_MAX = float(Fraction(2**8 - 1, 2**7) * 2**127)


def exact_bf16(v):
    """Correct rounding of a binary64 to bfloat16 (nearest, ties to even), by rationals."""
    if math.isnan(v) or math.isinf(v) or v == 0:
        return v
    _, e = math.frexp(abs(v))  # |v| = f * 2^e, f in [0.5, 1): leading bit 2^(e-1)
    quantum = Fraction(2) ** (max(e - 1, -126) - 7)
    r = round(Fraction(abs(v)) / quantum) * quantum  # round() of a Fraction: ties to even
    out = math.inf if r > Fraction(BF16_MAX) else float(r)
    return math.copysign(out, v)


def bf16_bits(v):
    return (struct.unpack("<I", struct.pack("<f", v))[0] >> 16) if not math.isinf(v) else (
        0x7F80 | (0x8000 if v < 0 else 0))


class Bfloat16(unittest.TestCase):
    def test_every_pattern_round_trips(self):
        bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
        f = ncp.bfloat16_to_float32(bits)
        back = ncp.float32_to_bfloat16(f)
        nan = np.isnan(f)
        np.testing.assert_array_equal(back[~nan], bits[~nan])
        self.assertTrue(np.all((back[nan] & 0x7FC0) == 0x7FC0))

    def values(self, dtype):
        rng = np.random.default_rng(7)
        v = [0.0, -0.0, 1.0, BF16_MAX, -BF16_MAX, 2.0**-133, 2.0**-134, 3 * 2.0**-135, 2.0**-126,
             float(Fraction(2**9 - 1, 2**8) * 2**127),  # the overflow threshold: a tie, goes to inf
             1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8 + 2.0**-30), 3.4e38, -3.4e38, 1e-45, 1e-39]
        # Ties and near-ties of bfloat16 in float32 and float64, normal and subnormal.
        base = rng.integers(0, 1 << 16, 2000).astype(np.uint32) << 16
        for low in (0x8000, 0x7FFF, 0x8001, 0x0001, 0xFFFF):
            v += [float(x) for x in (base | low).view(np.float32) if np.isfinite(x)]
        v += list(rng.standard_normal(2000) * np.exp2(rng.integers(-140, 128, 2000)))
        if dtype == np.float64:
            v += [float(x) * (1 + 2.0**-40) for x in v[:3000]]  # float64 just off float32 ties
        return np.array([x for x in v if abs(x) < 1e300], dtype=dtype)

    def check(self, dtype):
        v = self.values(dtype)
        with np.errstate(over="ignore"):
            data = ncp.to_wire("y", v, "bfloat16", v.shape)
        got = np.frombuffer(data, dtype="<u2")
        for x, g in zip(v, got):
            want = bf16_bits(exact_bf16(float(x)))
            self.assertEqual(int(g), want, f"{float(x).hex()} ({dtype.__name__}): got {int(g):#06x}, want {want:#06x}")

    def test_float32_to_bfloat16_is_correctly_rounded(self):
        self.check(np.float32)

    def test_float64_to_bfloat16_is_correctly_rounded(self):
        self.check(np.float64)

    def test_nan_keeps_its_sign(self):
        got = ncp.float32_to_bfloat16(np.array([np.nan, -np.nan], dtype=np.float32))
        self.assertEqual(got[0] & 0x7FC0, 0x7FC0)


class Conversions(unittest.TestCase):
    def test_float16_from_float64_rounds_once(self):
        v = np.array([1 + 2.0**-11 + 2.0**-40, 1 + 2.0**-11, 65520.0, 2.0**-25], dtype=np.float64)
        got = np.frombuffer(ncp.to_wire("y", v, "float16", [4]), dtype="<f2")
        np.testing.assert_array_equal(got, np.array([1 + 2.0**-10, 1.0, np.inf, 0.0], dtype=np.float16))

    def test_shape_must_match(self):
        with self.assertRaises(ValueError):
            ncp.to_wire("y", np.zeros(4), "float32", [2, 2])


class Codes(unittest.TestCase):
    """Quantized outputs (PROTOCOL.md, "Quantized cases"): integer codes, NVFP4 packing."""

    def test_nvfp4_packing_is_low_nibble_first(self):
        codes = np.array([[1, 2, 15, 0], [7, 8, 3, 12]])
        packed = ncp.pack_nvfp4(codes)
        self.assertEqual(packed.tolist(), [[0x21, 0x0F], [0x87, 0xC3]])
        np.testing.assert_array_equal(ncp.unpack_nvfp4(packed), codes)
        with self.assertRaises(ValueError):
            ncp.pack_nvfp4(np.zeros((2, 3)))

    def test_codes_cross_as_bytes_and_are_never_wrapped(self):
        self.assertEqual(ncp.to_wire("q", [[0, 255, 127]], "uint8", [1, 3]), bytes([0, 255, 127]))
        self.assertEqual(ncp.to_wire("q", np.array([-128, -1, 127]), "int8", [3]), bytes([0x80, 0xFF, 0x7F]))
        self.assertEqual(ncp.to_wire("q", np.array([3.0, 4.0]), "uint8", [2]), bytes([3, 4]))  # integral floats
        for value, dtype, why in (([256], "uint8", "256"), ([-1], "uint8", "-1"), ([128], "int8", "128"),
                                  ([0.5], "uint8", "0.5"), ([float("nan")], "uint8", "nan")):
            with self.assertRaises(ValueError) as e:
                ncp.to_wire("q", value, dtype, [1])
            self.assertIn(f"is not a {dtype} code", str(e.exception))
            self.assertIn(why, str(e.exception))
        a = ncp.from_wire({"dtype": "int8", "shape": [2]}, bytes([0xFF, 0x01]))
        self.assertEqual(a.tolist(), [-1, 1])


class Host:
    """A minimal host, from PROTOCOL.md."""

    def __init__(self, argv):
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def read(self):
        header = json.loads(self.p.stdout.readline())
        payload = {}
        for e in header.get("outputs", []) if header["type"] == "result" else []:
            payload[e["name"]] = self.p.stdout.read(e["nbytes"])
        return header, payload

    def send(self, header, tensors=()):
        self.p.stdin.write((json.dumps(header) + "\n").encode())
        for t in tensors:
            self.p.stdin.write(t)
        self.p.stdin.flush()


class NumpyCandidate(unittest.TestCase):
    def test_conversation(self):
        host = Host([sys.executable, os.path.join(os.path.dirname(HERE), "numpy_candidate.py")])
        hello, _ = host.read()
        self.assertEqual((hello["protocol"], hello["version"], hello["type"]), ("normcheck-subprocess", 1, "hello"))
        x = np.array([[1, 2, 3, 4], [-1, 0, 1, 2]], dtype="<f4")
        case = {"op": "rmsnorm", "axis": -1, "norm_dims": [1], "epsilon": 0, "epsilon_hex": "0x0p+0",
                "affine": "none", "weight_offset": 0, "weight_offset_hex": "0x0p+0", "residual": "none",
                "alpha": 1, "alpha_hex": "0x1p+0", "block": "none", "layers": 1, "activation": "gelu",
                "direction": "forward", "contract": "exact", "dtype_x": "float32", "dtype_param": "float32",
                "dtype_out": "bfloat16", "dtype_compute": "float32", "dtype_residual": "float32"}
        req = {"type": "run", "request": 1, "case": case,
               "inputs": [{"name": "x", "dtype": "float32", "shape": [2, 4], "nbytes": 32}],
               "outputs": [{"name": "y", "dtype": "bfloat16", "shape": [2, 4]},
                           {"name": "rstd", "dtype": "float32", "shape": [2, 1]}]}
        host.send(req, [x.tobytes()])
        reply, payload = host.read()
        self.assertEqual(reply["type"], "result", reply)
        self.assertEqual(reply["request"], 1)
        y = ncp.bfloat16_to_float32(np.frombuffer(payload["y"], dtype="<u2")).reshape(2, 4)
        rms = np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True))
        want = np.array([[exact_bf16(v) for v in row] for row in x / rms])
        np.testing.assert_array_equal(y, want)
        # A candidate that fails on a request answers error and goes on serving.
        bad = dict(req, case={k: v for k, v in case.items() if k != "norm_dims"})
        host.send(bad, [x.tobytes()])
        reply, _ = host.read()
        self.assertEqual(reply["type"], "error")
        self.assertIn("KeyError", reply["message"])
        host.send(req, [x.tobytes()])
        self.assertEqual(host.read()[0]["type"], "result")
        host.send({"type": "bye"})
        self.assertEqual(host.p.wait(timeout=10), 0)


if __name__ == "__main__":
    unittest.main()
