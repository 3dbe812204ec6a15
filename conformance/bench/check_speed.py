#!/usr/bin/python3
"""Speed of `normcheck check` against the h5py + numpy.allclose baseline (issue: check speed).

Writes an outputs file holding the fixtures' own correctly rounded values (a perfect candidate),
then times, on the same datasets:
  1. normcheck check --fixtures F --outputs O   (certified values, derived per-element allowance,
     verdicts, metrics)
  2. h5py reads of the same datasets (inputs/, expected/, expected_f64/, certified/, outputs/)
     per case, then numpy.allclose(got, exact) (the usual test: fixed rtol/atol, no verdicts)
  3. with --read-baseline: fixtures_read_baseline, plain H5Dread of every dataset of every case
     of both files, the bytes as stored (the I/O floor: no checksum, no conversion, no verdicts)
and prints elements compared per second for each.

usage: check_speed.py --normcheck build/bin/normcheck --fixtures out/ci.h5 [--repeat 3]
                      [--read-baseline build/fixtures/bench/fixtures_read_baseline]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np


def write_outputs(fixtures, path):
    elements = 0
    with h5py.File(fixtures, "r") as fx, h5py.File(path, "w") as out:
        for cid, case in fx["cases"].items():
            for name, ds in case["expected"].items():
                data = ds[...]
                o = out.create_dataset(f"cases/{cid}/outputs/{name}", data=data)
                if "dtype" in ds.attrs:  # quantized codes name their format (fixtures/SCHEMA.md)
                    o.attrs["dtype"] = ds.attrs["dtype"]
                elements += data.size
    return elements


def numpy_baseline(fixtures, outputs):
    """Reads the same datasets `normcheck check` reads (inputs/, expected/, expected_f64/,
    certified/ of every case, and outputs/) and compares with numpy.allclose."""
    elements = 0
    ok = True
    with h5py.File(fixtures, "r") as fx, h5py.File(outputs, "r") as out:
        for cid, case in fx["cases"].items():
            for name, ds in case["inputs"].items():
                ds[...]
            for name in case["expected"]:
                case[f"expected/{name}"][...]
                case[f"certified/{name}"][...]
                got = out[f"cases/{cid}/outputs/{name}"][...].astype(np.float64)
                exact = case[f"expected_f64/{name}"][...]
                # NVFP4 codes are stored packed, two to a byte (fixtures/SCHEMA.md): read, not compared
                if got.shape == exact.shape:
                    ok &= bool(np.allclose(got, exact, rtol=1.3e-6, atol=1e-5, equal_nan=True))
                elements += exact.size
    return elements, ok


def best_of(fn, repeat):
    best = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t0
        best = dt if best is None or dt < best else best
    return best, result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--normcheck", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--read-baseline", help="fixtures_read_baseline executable: also time the I/O floor")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        outputs = os.path.join(tmp, "outputs.h5")
        elements = write_outputs(a.fixtures, outputs)

        def run_check():
            r = subprocess.run([a.normcheck, "check", "--fixtures", a.fixtures, "--outputs", outputs],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if r.returncode != 0:
                sys.exit(f"normcheck check failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
            return r

        t_check, _ = best_of(run_check, a.repeat)
        t_np, (n_np, ok) = best_of(lambda: numpy_baseline(a.fixtures, outputs), a.repeat)
        t_floor = None
        if a.read_baseline:
            r = subprocess.run([a.read_baseline, a.fixtures, outputs, "--repeat", str(a.repeat)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if r.returncode != 0:
                sys.exit(f"read baseline failed ({r.returncode}): {r.stderr.strip()}")
            fields = dict(kv.split("=") for kv in r.stdout.split())
            t_floor = float(fields["read_seconds"])
            floor_bytes = int(fields["bytes"])
    print(f"fixtures: {a.fixtures}, {elements} output elements, best of {a.repeat}")
    print(f"normcheck check:        {t_check:7.2f} s  {elements / t_check / 1e6:8.2f} M elements/s")
    print(f"h5py + numpy.allclose:  {t_np:7.2f} s  {n_np / t_np / 1e6:8.2f} M elements/s  (all close: {ok})")
    print(f"ratio (normcheck / numpy speed): {t_np / t_check:.2f}")
    if t_floor is not None:
        print(f"I/O floor (H5Dread of every dataset of both files as stored, {floor_bytes / 2**20:.1f} MiB): {t_floor:7.2f} s")
        print(f"ratio (normcheck check / I/O floor): {t_check / t_floor:.2f}")


if __name__ == "__main__":
    main()
