#!/usr/bin/python3
"""ctest onnxruntime.adapter_protocol: ort_adapter.js (the protocol's Node.js child) driven by a
host written here from conformance/PROTOCOL.md alone: the hello, a run checked against a closed
form, the *_hex values taking precedence, decline and error replies that keep it serving, bye
and end of input, and malformed requests (exit 2); and ort_models.py's models. Without
onnxruntime-node only the model tests run, then exit 77 (SKIPPED).

    ort_adapter_test.py NODE MODEL_CACHE_DIR
"""
import json
import math
import os
import struct
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ADAPTER = os.path.join(os.path.dirname(HERE), "ort_adapter.js")
sys.path.insert(0, os.path.dirname(HERE))
import ort_models  # noqa: E402
NODE, CACHE = "node", "/tmp"


def case(**kw):
    c = {"op": "layernorm", "axis": -1, "norm_dims": [1], "epsilon": 1e-5, "epsilon_hex": float.hex(1e-5),
         "affine": "weight_bias", "weight_offset": 0, "weight_offset_hex": "0x0p+0", "residual": "none",
         "alpha": 1, "alpha_hex": "0x1p+0", "block": "none", "layers": 1, "activation": "gelu",
         "direction": "forward", "contract": "exact", "dtype_x": "float32", "dtype_param": "float32",
         "dtype_out": "float32", "dtype_compute": "float32", "dtype_residual": "float32"}
    c.update(kw)
    return c


def f32(values):
    return struct.pack(f"<{len(values)}f", *values)


def tensor(name, shape, data):
    return {"name": name, "dtype": "float32", "shape": shape, "nbytes": len(data)}


class Child:
    def __init__(self, kernel="layernorm"):
        self.p = subprocess.Popen([NODE, ADAPTER, "--kernel", kernel, "--cache", CACHE], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def send(self, header, payload=b""):
        line = header if isinstance(header, bytes) else json.dumps(header).encode() + b"\n"
        self.p.stdin.write(line + payload)
        self.p.stdin.flush()

    def read(self):
        h = json.loads(self.p.stdout.readline())
        outs = {}
        for e in h.get("outputs", []) if h.get("type") == "result" else []:
            data = self.p.stdout.read(e["nbytes"])
            outs[e["name"]] = struct.unpack(f"<{e['nbytes'] // 4}f", data)
        return h, outs

    def close(self):
        self.p.stdin.close()
        rc = self.p.wait(timeout=30)
        self.p.stdout.close()
        self.p.stderr.close()
        return rc


def run_request(request, c, x, w, b):
    data = [f32(x), f32(w), f32(b)]
    rows, n = len(x) // len(w), len(w)
    header = {"type": "run", "request": request, "case": c,
              "inputs": [tensor("x", [rows, n], data[0]), tensor("weight", [n], data[1]), tensor("bias", [n], data[2])],
              "outputs": [{"name": "y", "dtype": "float32", "shape": [rows, n]},
                          {"name": "mean", "dtype": "float32", "shape": [rows, 1]},
                          {"name": "rstd", "dtype": "float32", "shape": [rows, 1]}]}
    return header, b"".join(data)


class AdapterProtocol(unittest.TestCase):
    def setUp(self):
        self.child = Child()
        self.hello, _ = self.child.read()

    def tearDown(self):
        if self.child.p.poll() is None:
            self.child.p.kill()
            self.child.p.wait()
        for stream in (self.child.p.stdin, self.child.p.stdout, self.child.p.stderr):
            stream.close()

    def test_hello(self):
        h = self.hello
        self.assertEqual((h["protocol"], h["version"], h["type"]), ("normcheck-subprocess", 1, "hello"))
        self.assertIn("LayerNormalization", h["name"])
        self.assertEqual(h["capabilities"]["directions"], ["forward"])
        self.assertFalse(h["capabilities"]["residual"])

    def test_run_matches_closed_form_and_hex_wins(self):
        # x = 1, 2, 3, 4: mean 2.5, variance 1.25. epsilon's decimal field says 0, its hex field 4:
        # the adapter must use the hex one, so rstd = 1/sqrt(5.25).
        c = case(epsilon=0, epsilon_hex="0x1p+2")
        header, payload = run_request(7, c, [1, 2, 3, 4], [1, 1, 1, 1], [0, 0, 0, 0])
        self.child.send(header, payload)
        h, outs = self.child.read()
        self.assertEqual((h["type"], h["request"]), ("result", 7))
        self.assertEqual(outs["mean"][0], 2.5)
        r = 1 / math.sqrt(5.25)
        self.assertLess(abs(outs["rstd"][0] - r), 4 * 2**-24 * r)
        for xi, yi in zip([1, 2, 3, 4], outs["y"]):
            self.assertLess(abs(yi - (xi - 2.5) * r), 8 * 2**-24)
        self.assertEqual(self.child.close(), 0)  # end of input at a message boundary

    def test_decline_and_error_keep_serving(self):
        header, payload = run_request(1, case(direction="backward"), [1, 2], [1, 1], [0, 0])
        self.child.send(header, payload)
        h, _ = self.child.read()
        self.assertEqual(h["type"], "decline")
        self.assertIn("no backward", h["reason"])
        header, payload = run_request(2, case(op="rmsnorm"), [1, 2], [1, 1], [0, 0])
        self.child.send(header, payload)
        self.assertEqual(self.child.read()[0]["type"], "decline")
        # A case the adapter cannot read (no norm_dims) is an error reply, not the end.
        c = case()
        del c["norm_dims"]
        header, payload = run_request(3, c, [1, 2], [1, 1], [0, 0])
        self.child.send(header, payload)
        self.assertEqual(self.child.read()[0]["type"], "error")
        header, payload = run_request(4, case(), [3, 5], [1, 1], [0, 0])
        self.child.send(header, payload)
        h, outs = self.child.read()
        self.assertEqual((h["type"], outs["mean"][0]), ("result", 4.0))
        self.child.send({"type": "bye"})
        self.assertEqual(self.child.close(), 0)

    def assert_gives_up(self, raw_header, payload=b""):
        self.child.send(raw_header, payload)
        self.child.p.stdin.close()
        h = json.loads(self.child.p.stdout.readline())
        self.assertEqual(h["type"], "error")
        self.assertIn("malformed request", h["message"])
        self.assertEqual(self.child.p.wait(timeout=30), 2)
        self.child.p.stdout.close()
        self.child.p.stderr.close()

    def test_not_json(self):
        self.assert_gives_up(b"{not json\n")

    def test_unknown_type(self):
        self.assert_gives_up(b'{"type": "frobnicate"}\n')

    def test_nbytes_not_matching_shape(self):
        header, payload = run_request(1, case(), [1, 2], [1, 1], [0, 0])
        header["inputs"][0]["nbytes"] = 4
        self.assert_gives_up(json.dumps(header).encode() + b"\n", payload)

    def test_payload_cut_short(self):
        header, payload = run_request(1, case(), [1, 2], [1, 1], [0, 0])
        self.assert_gives_up(json.dumps(header).encode() + b"\n", payload[:-3])


class Models(unittest.TestCase):
    """ort_models.py alone (no ONNX Runtime needed)."""

    def spec(self, **kw):
        s = {"op": "SkipLayerNormalization", "dtype": "float16", "stats_dtype": "float32", "rank": 3, "axis": 2,
             "epsilon_hex": "0x1.4f8b588e368f1p-17", "inputs": ["X", "Skip", "Gamma", "Bias"], "outputs": ["Y", "Sum"]}
        s.update(kw)
        return s

    def test_absent_optional_slots_stay_empty(self):
        node = ort_models.build(self.spec()).graph.node[0]
        self.assertEqual(list(node.input), ["X", "Skip", "Gamma", "", "Bias"])  # Beta absent, Bias in slot 4
        self.assertEqual(list(node.output), ["Y", "", "", "Sum"])
        self.assertEqual(node.domain, "com.microsoft")
        eps = [a.f for a in node.attribute if a.name == "epsilon"][0]
        self.assertEqual(eps, struct.unpack("<f", struct.pack("<f", 1e-5))[0])  # float32 attribute

    def test_layernorm_axis_and_stats(self):
        m = ort_models.build(self.spec(op="LayerNormalization", dtype="float32", rank=4, axis=2, axis_attr=-2,
                                       inputs=["X", "Scale"], outputs=["Y", "InvStdDev"]))
        attrs = {a.name: a for a in m.graph.node[0].attribute}
        self.assertEqual((attrs["axis"].i, attrs["stash_type"].i), (-2, 1))
        stat = [o for o in m.graph.output if o.name == "InvStdDev"][0].type.tensor_type
        self.assertEqual([d.dim_value or d.dim_param for d in stat.shape.dim], ["d0", "d1", 1, 1])

    def test_bad_specs(self):
        for bad in (dict(op="GroupNormalization"), dict(inputs=["X", "Skip", "Gamma", "Scale"]),
                    dict(op="LayerNormalization", inputs=["X", "Scale"], outputs=["Y"], axis=1, axis_attr=-1)):
            with self.assertRaises(ValueError):
                ort_models.build(self.spec(**bad))


if __name__ == "__main__":
    NODE, CACHE = sys.argv[1], sys.argv[2]
    pkg = os.path.join(os.path.dirname(HERE), "node_modules", "onnxruntime-node", "package.json")
    if not os.path.exists(pkg):
        result = unittest.main(argv=sys.argv[:1] + ["Models"], exit=False).result
        if not result.wasSuccessful():
            sys.exit(1)
        print(f"SKIPPED (the adapter's tests): {pkg} is missing (scripts/install-onnxruntime.sh)")
        sys.exit(77)
    result = unittest.main(argv=sys.argv[:1], exit=False).result
    sys.exit(0 if result.wasSuccessful() else 1)
