#!/usr/bin/python3
"""Which algorithm ONNX Runtime's LayerNormalization and SkipLayerNormalization use for their
statistics: runs both (float32, weight and bias) on one case of a fixture file and compares their
Mean and InvStdDev bit for bit with float32 emulations of candidate algorithms, and with the exact
values of the fixture (docs/FINDINGS.md, "ONNX Runtime: the Skip kernel's error grows with kappa").

    probe_stats.py FIXTURES.h5 CASE_ID       (a float32 layernorm case, affine weight_bias)
"""
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ORT_DIR = os.environ.get("NORMCHECK_ORT_DIR") or os.path.dirname(HERE)  # the folder holding node_modules/
sys.path.insert(0, ORT_DIR)
import ort_models  # noqa: E402

f32 = np.float32

RUN_JS = r"""
const ort = require(process.argv[1] + '/node_modules/onnxruntime-node');
const fs = require('fs');
const [dir, H, R, op] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4]), process.argv[5]];
const rd = (n) => { const b = fs.readFileSync(`${dir}/${n}.bin`); return new Float32Array(b.buffer, b.byteOffset, b.length / 4); };
const T = (a, d) => new ort.Tensor('float32', a, d);
(async () => {
  {
    const s = await ort.InferenceSession.create(`${dir}/${op}.onnx`, {intraOpNumThreads: 1});
    const feeds = op === 'LayerNormalization' ? {X: T(rd('x'), [R, H]), Scale: T(rd('w'), [H]), B: T(rd('b'), [H])}
      : {X: T(rd('x'), [1, R, H]), Skip: T(new Float32Array(R * H), [1, R, H]), Gamma: T(rd('w'), [H]), Beta: T(rd('b'), [H])};
    const o = await s.run(feeds);
    for (const k of ['Y', 'Mean', 'InvStdDev']) fs.writeFileSync(`${dir}/${op}_${k}.bin`, Buffer.from(o[k].data.buffer));
  }
  console.log(ort.env.versions.common);
})();
"""


def welford32(r, eps):
    mean, m2 = f32(0), f32(0)
    for k, v in enumerate(r):
        d = f32(v - mean)
        mean = f32(mean + f32(d / f32(k + 1)))
        m2 = f32(m2 + f32(d * f32(v - mean)))
    return mean, f32(f32(1) / np.sqrt(f32(f32(m2 / f32(len(r))) + eps)))


def one_pass32(r, eps):
    s, q = f32(0), f32(0)
    for v in r:
        s, q = f32(s + v), f32(q + f32(v * v))
    m = f32(s / f32(len(r)))
    with np.errstate(invalid="ignore"):
        return m, f32(f32(1) / np.sqrt(f32(f32(f32(q / f32(len(r))) - f32(m * m)) + eps)))


def two_pass64(r, eps):
    r = r.astype(np.float64)
    m = np.sum(r) / len(r)
    return f32(m), f32(1 / np.sqrt(np.sum((r - m) ** 2) / len(r) + float(eps)))


def ulps(got, exact):
    return np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)


def main():
    fixtures, case_id = sys.argv[1:3]
    with h5py.File(fixtures) as f:
        c = f["cases"][case_id]
        x, w, b = (c["inputs"][k][...].astype(np.float32) for k in ("x", "weight", "bias"))
        eps64 = float(c.attrs["epsilon"])
        exact = {k: c["expected_f64"][k][...].ravel() for k in ("y", "mean", "rstd")}
    x = x.reshape(-1, x.shape[-1])
    rows, hidden = x.shape
    eps = f32(eps64)
    with tempfile.TemporaryDirectory() as d:
        for name, a in (("x", x), ("w", w), ("b", b)):
            a.astype("<f4").tofile(os.path.join(d, name + ".bin"))
        for op, ins in (("LayerNormalization", ["X", "Scale", "B"]), ("SkipLayerNormalization", ["X", "Skip", "Gamma", "Beta"])):
            spec = {"op": op, "dtype": "float32", "stats_dtype": "float32", "rank": 3 if op.startswith("Skip") else 2,
                    "axis": 1, "epsilon_hex": float.hex(eps64), "inputs": ins, "outputs": ["Y", "Mean", "InvStdDev"]}
            with open(os.path.join(d, op + ".onnx"), "wb") as fh:
                fh.write(ort_models.build(spec).SerializeToString())
        got, version, failed = {}, "?", {}
        for op in ("LayerNormalization", "SkipLayerNormalization"):
            p = subprocess.run(["node", "-e", RUN_JS, ORT_DIR, d, str(hidden), str(rows), op], capture_output=True, text=True)
            if p.returncode != 0:
                failed[op] = f"the run failed (exit status {p.returncode}): {p.stderr.strip()[-300:]}"
                continue
            version = p.stdout.strip()
            for k in ("Y", "Mean", "InvStdDev"):
                got[(op, k)] = np.fromfile(os.path.join(d, f"{op}_{k}.bin"), "<f4")
    print(f"ONNX Runtime {version}, case {case_id}: {rows} rows of {hidden}, float32")
    emus = {name: [fn(x[i], eps) for i in range(rows)] for name, fn in
            (("float32 Welford", welford32), ("float32 one-pass", one_pass32), ("double two-pass", two_pass64))}
    for op in ("LayerNormalization", "SkipLayerNormalization"):
        if op in failed:
            print(f"  {op}: {failed[op]}")
            continue
        m, r = got[(op, "Mean")], got[(op, "InvStdDev")]
        print(f"  {op}: Mean max {ulps(m, exact['mean']).max():.3g} ulp, InvStdDev max {ulps(r, exact['rstd']).max():.3g} ulp "
              f"(relative {np.max(np.abs(r / exact['rstd'] - 1)):.3g}), Y max abs "
              f"{np.max(np.abs(got[(op, 'Y')].astype(np.float64) - exact['y'])):.3g} from exact")
        for name, res in emus.items():
            em = np.array([e[0] for e in res], np.float32)
            er = np.array([e[1] for e in res], np.float32)
            print(f"    = {name:17s} bit for bit: Mean {np.sum(em == m)}/{rows} rows, InvStdDev {np.sum(er == r)}/{rows} rows"
                  + ("  (this emulation's InvStdDev is NaN in some rows)" if np.isnan(er).any() else ""))


if __name__ == "__main__":
    main()
