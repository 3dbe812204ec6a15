#!/usr/bin/env python3
"""`normcheck check` on outputs files of quantized cases (fixtures/SCHEMA.md, "Quantized outputs"
and "Outputs files"), written here with h5py in the schema's dtypes: the certified codes and
scales pass; a code flipped one step away from every boundary FAILS, naming the element, both
codes, the exact value, the allowance and the boundary; a doubled dynamic scale FAILS.

usage: quant_check_outputs.py NORMCHECK QUANT_H5 WORKDIR
"""
import os
import subprocess
import sys

import h5py
import numpy as np


def write_outputs(fixtures, path, edit=None):
    """Copies every case's expected/ outputs (dtypes and attributes as stored) to path."""
    with h5py.File(fixtures, "r") as fx, h5py.File(path, "w") as out:
        for cid, case in fx["cases"].items():
            for name, ds in case["expected"].items():
                data = ds[...]
                if edit:
                    data = edit(cid, name, data, case)
                d = out.create_dataset(f"cases/{cid}/outputs/{name}", data=data)
                for k, v in ds.attrs.items():
                    d.attrs[k] = v


def run(normcheck, fixtures, outputs):
    r = subprocess.run([normcheck, "check", "--fixtures", fixtures, "--outputs", outputs, "--no-diagnosis"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return r.returncode, r.stdout


def far_element(case):
    """Flat index of a certified E4M3 code whose exact value lies mid-way between boundaries."""
    f64 = case["expected_f64/q"][...].ravel()
    cert = case["certified/q"][...].ravel()
    best, best_d = None, -1.0
    for i, v in enumerate(f64):
        if not cert[i] or not np.isfinite(v) or not 2.0 ** -6 <= abs(v) <= 400:
            continue
        e = np.floor(np.log2(abs(v)))
        step = 2.0 ** (e - 3)  # E4M3 spacing in [2^e, 2^(e+1))
        d = abs((abs(v) / step) % 1 - 0.5)  # 0.5 at a code, 0 at a boundary
        if d > best_d:
            best, best_d = i, d
    return best


def main():
    normcheck, fixtures, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    failures = []

    golden = os.path.join(work, "golden.h5")
    write_outputs(fixtures, golden)
    rc, text = run(normcheck, fixtures, golden)
    if rc != 0 or "conforms" not in text:
        failures.append(f"golden outputs: exit {rc}\n{text[-3000:]}")

    target = "q_vllm_static_fp8_bfloat16_normal"
    with h5py.File(fixtures, "r") as fx:
        k = far_element(fx["cases"][target])
        code = int(fx["cases"][target]["expected/q"][...].ravel()[k])

    def flip(cid, name, data, case):
        if cid == target and name == "q":
            data = data.copy()
            data.ravel()[k] = code + 1
        return data

    flipped = os.path.join(work, "flipped.h5")
    write_outputs(fixtures, flipped, flip)
    rc, text = run(normcheck, fixtures, flipped)
    want = f"got 0x{code + 1:02X}, expected 0x{code:02X}; exact "
    if rc != 1 or target not in text or want not in text or "boundary " not in text or "allowance 0x" not in text:
        failures.append(f"flipped code: exit {rc}, wanted 1 and '{want}'\n{text[-3000:]}")

    scaled = "q_vllm_dynamic_fp8_bfloat16_normal"

    def double_scale(cid, name, data, case):
        return data * 2 if cid == scaled and name == "scale" else data

    wrong = os.path.join(work, "wrong_scale.h5")
    write_outputs(fixtures, wrong, double_scale)
    rc, text = run(normcheck, fixtures, wrong)
    if rc != 1 or scaled not in text or "scale FAILED" not in text:
        failures.append(f"doubled scale: exit {rc}\n{text[-3000:]}")

    for f in failures:
        print("FAIL:", f)
    print("quant_check_outputs:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
