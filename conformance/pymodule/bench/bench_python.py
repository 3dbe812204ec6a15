"""Speed of import normcheck, as a kernel's pytest meets it: normcheck.reference on a 1024x4096
float32 LayerNorm against a numpy float64 two-pass of the same rows (same process), the check
of that case (under `any` and under reduction="two_pass"), and the per-call overhead of reference() and check() on tiny cases.
Usage: PYTHONPATH=<build>/python /usr/bin/python3 bench_python.py [--repeat N]"""
import argparse
import time

import numpy as np

import normcheck


def best(f, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times), sorted(times)[len(times) // 2]


def numpy_two_pass(x, w, b, eps):
    x = x.astype(np.float64)
    mean = x.mean(-1, keepdims=True)
    d = x - mean
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + eps) * w + b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1024, 4096)).astype(np.float32)
    w, b = rng.standard_normal(4096).astype(np.float32), rng.standard_normal(4096).astype(np.float32)
    ref = best(lambda: normcheck.reference("layernorm", x, w, b, eps=1e-5), a.repeat)
    npy = best(lambda: numpy_two_pass(x, w, b, 1e-5), a.repeat)
    case = normcheck.reference("layernorm", x, w, b, eps=1e-5)
    y = case.expected["y"]
    chk = best(lambda: normcheck.check({"y": y}, case), a.repeat)
    chk2 = best(lambda: normcheck.check({"y": y}, case, reduction="two_pass"), a.repeat)
    print(f"1024x4096 float32 layernorm (min / median of {a.repeat}):")
    print(f"  normcheck.reference      {ref[0] * 1e3:8.1f} / {ref[1] * 1e3:8.1f} ms")
    print(f"  numpy float64 two-pass   {npy[0] * 1e3:8.1f} / {npy[1] * 1e3:8.1f} ms   (reference / numpy = {ref[0] / npy[0]:.1f}x)")
    print(f"  normcheck.check (y)      {chk[0] * 1e3:8.1f} / {chk[1] * 1e3:8.1f} ms")
    print(f"  same, reduction=two_pass {chk2[0] * 1e3:8.1f} / {chk2[1] * 1e3:8.1f} ms")
    tiny = rng.standard_normal((2, 8)).astype(np.float32)
    n = 2000
    t = best(lambda: [normcheck.reference("layernorm", tiny, eps=1e-5) for _ in range(n)], 3)[0] / n
    tc = normcheck.reference("layernorm", tiny, eps=1e-5)
    c = best(lambda: [normcheck.check(tc.expected, tc) for _ in range(n)], 3)[0] / n
    yt = tc.expected["y"]
    s = best(lambda: [normcheck.testing.assert_norm_close(yt, op="layernorm", x=tiny, eps=1e-5) for _ in range(n)], 3)[0] / n
    print(f"tiny case (2x8 float32), per call over {n} calls:")
    print(f"  normcheck.reference      {t * 1e6:8.1f} us")
    print(f"  normcheck.check          {c * 1e6:8.1f} us")
    print(f"  assert_norm_close        {s * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
