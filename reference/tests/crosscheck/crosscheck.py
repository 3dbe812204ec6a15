#!/usr/bin/python3
"""Cross-check `normcheck reference` against the independent mpmath reference.

  crosscheck.py --normcheck PATH --cases N --seed S [--blocks-only] [--keep-failures DIR] [--jobs J]
  crosscheck.py --self-test          (tests of the independent reference itself; no binary)

Generates N small random cases deterministically from the seed (case i depends only on (S, i)),
runs `PATH reference --case FILE --json` on each and compares every output element the C++
reference certifies (about 20% of the cases are residual blocks; all with --blocks-only)
with the value computed by mpmath_reference.py: the rounded value and the
binary64 image must both be identical (+0 == -0, NaN == NaN).  Exit status 0 only when there is
no mismatch, every case ran, and at least 95% of the compared elements are certified.
Must run under /usr/bin/python3 (needs mpmath and numpy).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
from fractions import Fraction

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpmath_reference as R  # noqa: E402

DTYPES = ["float64", "float32", "float16", "bfloat16"]
CONTRACTS = ["exact", "llama", "gemma", "te", "te_wdtype", "onnx"]
COMBOS_NORES = ["llama+gemma", "onnx+te_wdtype", "te+llama"]
COMBOS_RES = ["llama+fused_add_lowp", "gemma+fused_add_lowp", "onnx+fused_add_lowp"]

# ----------------------------------------------------------------------------------------------
# Random case generation
# ----------------------------------------------------------------------------------------------


def hexval(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v.hex()


def in_dtype(v: float, dtype: str, limit: float | None = None) -> float:
    """v rounded (exactly, single rounding from the double) to dtype; clamped to stay finite."""
    r = R.round_fraction(v, dtype)
    if math.isinf(r) or (limit is not None and abs(r) > limit):
        cap = float(R.max_finite(dtype)) if limit is None else limit
        r = R.round_fraction(math.copysign(min(abs(v), cap) * 0.5, v), dtype)
    return r


def subnormal(rng: random.Random, dtype: str) -> float:
    p, emin, _ = R.FORMATS[dtype]
    k = rng.randrange(1, 1 << (p - 1))
    if rng.random() < 0.3:
        k = rng.randrange(1, 16)
    return rng.choice((-1.0, 1.0)) * math.ldexp(k, emin - p + 1)


BLOCK_FRACTION = 0.2  # share of residual-block cases in a mixed run


def gen_case(seed: int, index: int, blocks_only: bool = False) -> dict:
    """Case `index` of `seed`: a residual-block case (~20%, or all with blocks_only), else a
    plain norm case.  Which kind is drawn from its own stream, so the plain cases of a seed are
    those it gave before blocks existed."""
    pick = random.Random(f"normcheck-crosscheck/kind/{seed}/{index}").random()
    if blocks_only or pick < BLOCK_FRACTION:
        return gen_block_case(seed, index)
    return gen_plain_case(seed, index)


def gen_block_case(seed: int, index: int) -> dict:
    """A small residual block (post/pre/sandwich/deepnorm), L layers of norm + FFN, finite values
    kept modest (float16 never overflows).  Families: normal; zero_ffn (W1 = W2 = 0: F = b2, and
    `pre` gives y = round(x + sum b2), with x often an exact tie of dtype_out); dead_relu (every
    relu input < 0: exact rational layers, with output ties possible); hidden1 (D = 1); wide
    (D = 8)."""
    rng = random.Random(f"normcheck-crosscheck/block/{seed}/{index}")
    block = rng.choice(list(R.BLOCKS))
    op = rng.choice(["layernorm", "rmsnorm"])
    act = rng.choice(["gelu", "relu"])
    family = rng.choices(["normal", "zero_ffn", "dead_relu", "hidden1", "wide"],
                         weights=[55, 10, 10, 12, 13])[0]
    if family == "dead_relu":
        act = "relu"
    L = rng.randint(1, 3)
    D, Dff = rng.randint(1, 8), rng.randint(1, 8)
    if family == "hidden1":
        D = 1
    elif family == "wide":
        D, Dff = 8, rng.choice([1, 8])
    lead = rng.choice([[], [1], [2], [3], [4], [2, 2], [1, 3], [2, 1, 2], [4, 1]])
    shape = lead + [D]
    rows = math.prod(lead)
    direction = "backward" if rng.random() < 0.4 else "forward"
    dtype_x, dtype_param, dtype_out = rng.choice(DTYPES), rng.choice(DTYPES), rng.choice(DTYPES)
    affine = rng.choice(["none", "weight", "weight_bias"])
    weight_offset = rng.choice([0.0, 1.0])
    alpha = 1.0
    if block == "deepnorm":
        alpha = rng.choice([1.0, 0.5, 2.5, (2.0 * L) ** 0.25, rng.uniform(0.3, 3.0)])
    K = 2 if block == "sandwich" else 1

    def draw(dt, mu, sig, n):
        return [in_dtype(rng.gauss(mu, sig), dt, 1000.0) for _ in range(n)]

    sigma = 10 ** rng.uniform(-1.3, 0.7)
    x = draw(dtype_x, rng.choice([0.0, rng.uniform(-2, 2)]), sigma, rows * D)
    w1 = draw(dtype_param, 0, 1 / math.sqrt(D), L * Dff * D)
    b1 = draw(dtype_param, 0, 0.5, L * Dff)
    w2 = draw(dtype_param, 0, 1 / math.sqrt(Dff), L * D * Dff)
    b2 = draw(dtype_param, 0, 0.5, L * D)
    if family == "zero_ffn":
        w1, w2 = [0.0] * len(w1), [0.0] * len(w2)
        if rng.random() < 0.5:
            b1, b2 = [0.0] * len(b1), [0.0] * len(b2)
            if block == "pre":  # y = round(x): make about half of x exact ties of dtype_out
                for i, v in enumerate(x):
                    t = R.round_fraction(v, dtype_out)
                    m = (Fraction(t) + Fraction(R.next_up(t, dtype_out))) / 2
                    if rng.random() < 0.5 and math.isfinite(R.next_up(t, dtype_out)) and \
                            R.round_fraction(m, dtype_x) == m:
                        x[i] = float(m)
    elif family == "dead_relu":  # |W1 v| <= 0.01 * 8 * |v|, v <= a few units: a < 0
        w1 = [in_dtype(v * 2.0 ** -10, dtype_param) for v in w1]
        b1 = [in_dtype(-rng.uniform(4, 20), dtype_param) for _ in b1]
    inputs = {"x": {"shape": shape, "data": [hexval(v) for v in x]},
              "ffn_w1": {"shape": [L, Dff, D], "data": [hexval(v) for v in w1]},
              "ffn_b1": {"shape": [L, Dff], "data": [hexval(v) for v in b1]},
              "ffn_w2": {"shape": [L, D, Dff], "data": [hexval(v) for v in w2]},
              "ffn_b2": {"shape": [L, D], "data": [hexval(v) for v in b2]}}
    if affine != "none":
        mu = 1.0 - weight_offset
        w = draw(dtype_param, mu, 0.3, L * K * D)
        inputs["weight"] = {"shape": [L, K, D], "data": [hexval(v) for v in w]}
    if affine == "weight_bias":
        inputs["bias"] = {"shape": [L, K, D],
                          "data": [hexval(v) for v in draw(dtype_param, 0, 0.5, L * K * D)]}
    if direction == "backward":
        inputs["dy"] = {"shape": shape,
                        "data": [hexval(v) for v in draw(dtype_out, 0, 1, rows * D)]}
    eps_choice = rng.choice(["1e-5", "1e-6", "0.1", "hex", "zero"])
    if eps_choice == "zero" and (family != "normal" or D < 3):
        eps_choice = "1e-5"
    eps = {"1e-5": 1e-5, "1e-6": 1e-6, "0.1": 0.1, "zero": 0.0,
           "hex": 10 ** rng.uniform(-12, 0)}[eps_choice]
    case = {"op": op, "block": block, "layers": L, "activation": act, "axis": -1,
            "affine": affine, "residual": "none", "alpha": alpha, "direction": direction,
            "contract": "exact", "dtype_x": dtype_x, "dtype_param": dtype_param,
            "dtype_out": dtype_out, "dtype_compute": rng.choice(["float32", "float64"]),
            "dtype_residual": dtype_x,
            "epsilon": eps if (eps_choice != "hex" and rng.random() < 0.5) else hexval(eps),
            "inputs": inputs}
    if affine != "none":
        case["weight_offset"] = weight_offset
    return case


def gen_plain_case(seed: int, index: int) -> dict:
    rng = random.Random(f"normcheck-crosscheck/{seed}/{index}")
    op = rng.choice(["layernorm", "rmsnorm"])
    family = rng.choices(
        ["normal", "large_mean", "constant_rows", "fp16_big", "subnormal", "hidden1", "nan_row",
         "exact_ties"],
        weights=[30, 12, 10, 10, 12, 10, 6, 10])[0]
    direction = "backward" if (family != "nan_row" and rng.random() < 0.3) else "forward"

    dtype_x = rng.choice(DTYPES)
    if family == "large_mean":
        dtype_x = rng.choice(["float32", "float64"])
    if family == "fp16_big":
        dtype_x = "float16"
    dtype_param, dtype_out = rng.choice(DTYPES), rng.choice(DTYPES)
    dtype_compute = rng.choice(["float32", "float64"])
    dtype_residual = dtype_x if rng.random() < 0.6 else rng.choice(DTYPES)

    # shape and normalized dims
    while True:
        rank = rng.randint(1, 4)
        shape = [rng.randint(1, 9) for _ in range(rank)]
        if math.prod(shape) <= 200:
            break
    mode = rng.random()
    axis, axes = -1, None
    if mode < 0.35:
        axis = -1
    elif mode < 0.55:
        axis = rng.randrange(0, rank)
    elif mode < 0.75:
        axis = -rng.randint(1, rank)
    else:
        axes = sorted(rng.sample(range(rank), rng.randint(1, rank)))
        if rng.random() < 0.3:
            rng.shuffle(axes)  # "any order given, used sorted"
    norm = sorted({(a + rank) % rank for a in axes}) if axes is not None else \
        list(range(axis % rank, rank))
    if family == "hidden1":
        for d in norm:
            shape[d] = 1
    elif math.prod(shape[d] for d in norm) == 1 and family == "constant_rows":
        shape[norm[-1]] = rng.randint(2, 9)
        while math.prod(shape) > 200:
            shape = [max(1, s // 2) if i not in norm else s for i, s in enumerate(shape)]
    pshape = [shape[d] for d in norm]
    numel, nparam = math.prod(shape), math.prod(pshape)
    if family == "exact_ties" and op == "layernorm" and nparam % 2:
        family = "normal"  # needs an even row length

    affine = rng.choice(["none", "weight", "weight_bias"])
    weight_offset = rng.choice([0.0, 1.0])
    residual = rng.choice(["none", "add", "add_bias"])
    if family == "exact_ties":
        # rows m +- d (LayerNorm, half each) or +-d (RMSNorm), eps = 0: s = d^2 is a perfect
        # square, xhat = +-1 and y = +-scale + bias is rational; biases of a few half-ulps of
        # dtype_out make many outputs exact rounding ties
        affine, residual = rng.choice(["weight_bias", "weight_bias", "none"]), "none"
    alpha = 1.0
    if residual != "none":
        alpha = rng.choice([1.0, 0.5, 2.5, rng.uniform(0.01, 3.0)])
        if family == "fp16_big":
            alpha = rng.choice([1.0, 0.5])
    contracts = CONTRACTS + COMBOS_NORES + (["fused_add_lowp"] * 2 + COMBOS_RES
                                            if residual != "none" else [])
    contract = rng.choice(contracts)

    # x values
    def draw_x(mu, sigma):
        v = rng.gauss(mu, sigma)
        return in_dtype(v, dtype_x, 60000.0 if dtype_x == "float16" else None)

    rows = numel // nparam
    x = []
    mu = rng.choice([0.0, rng.uniform(-3, 3)])
    sigma = 10 ** rng.uniform(-2, 2)
    for r in range(rows):
        if family == "large_mean":
            m = rng.choice((-1, 1)) * rng.uniform(1e3, 1e4)
            row = [draw_x(m, 1e-3) for _ in range(nparam)]
        elif family == "constant_rows" and rng.random() < 0.6:
            c = draw_x(mu, sigma) if rng.random() < 0.8 else 0.0
            row = [c] * nparam
        elif family == "fp16_big":
            row = [in_dtype(rng.choice((-1, 1)) * rng.uniform(300, 60000), "float16", 60000.0)
                   if rng.random() < 0.8 else draw_x(0, 10) for _ in range(nparam)]
        elif family == "exact_ties":
            e = rng.randint(-6, 6)
            d = 2.0 ** e
            m = rng.randint(-8, 8) * 2.0 ** (e + rng.randint(0, 3)) if op == "layernorm" else 0.0
            signs = [1, -1] * (nparam // 2) + ([rng.choice((1, -1))] if nparam % 2 else [])
            rng.shuffle(signs)
            row = [m + sg * d for sg in signs]
        elif family == "subnormal":
            row = [subnormal(rng, dtype_x) if rng.random() < 0.85 else draw_x(0, 1e-3)
                   for _ in range(nparam)]
        else:
            row = [draw_x(mu, sigma) for _ in range(nparam)]
        x.append(row)
    if family == "nan_row":
        x[rng.randrange(rows)][rng.randrange(nparam)] = float("nan")
    # x is generated row by row in (row, col) order: scatter into row-major layout
    row_base, col_delta, _, _, _ = R.geometry(shape, axis, axes)
    xflat = [0.0] * numel
    for r, base in enumerate(row_base):
        for c, d in enumerate(col_delta):
            xflat[base + d] = x[r][c]

    inputs = {"x": {"shape": shape, "data": [hexval(v) for v in xflat]}}
    lim = lambda dt: 60000.0 if dt == "float16" else None  # noqa: E731
    if affine != "none":
        if weight_offset == 0.0:
            w = [in_dtype(rng.gauss(1.0, 0.5), dtype_param, lim(dtype_param)) for _ in range(nparam)]
        else:
            w = [in_dtype(rng.gauss(0.0, 0.3), dtype_param, lim(dtype_param)) for _ in range(nparam)]
        if rng.random() < 0.1:
            w = [in_dtype(v * 2 ** rng.randint(-30, 10), dtype_param, lim(dtype_param)) for v in w]
        if family == "exact_ties":
            w = [rng.choice([1.0, 1.0, 2.0, 0.5]) - weight_offset for _ in range(nparam)]
        inputs["weight"] = {"shape": pshape, "data": [hexval(v) for v in w]}
    if affine == "weight_bias":
        bsig = rng.choice([1.0, 1e-3, 10.0])
        bias = [in_dtype(rng.gauss(0, bsig), dtype_param) for _ in range(nparam)]
        if family == "exact_ties":
            p_out = R.FORMATS[dtype_out][0]
            bias = [rng.choice((1, -1)) * rng.choice((1, 3, 5)) * 2.0 ** (rng.randint(-1, 1) - p_out)
                    for _ in range(nparam)]
        inputs["bias"] = {"shape": pshape, "data": [hexval(v) for v in bias]}
    if residual != "none":
        rsig = 10.0 if family == "fp16_big" else sigma if family == "normal" else 1.0
        inputs["residual"] = {"shape": shape,
                              "data": [hexval(in_dtype(rng.gauss(0, rsig), dtype_residual,
                                                       lim(dtype_residual)))
                                       for _ in range(numel)]}
    if residual == "add_bias":
        inputs["residual_bias"] = {"shape": pshape,
                                   "data": [hexval(in_dtype(rng.gauss(0, 0.5), dtype_param))
                                            for _ in range(nparam)]}
    if direction == "backward":
        inputs["dy"] = {"shape": shape,
                        "data": [hexval(in_dtype(rng.gauss(0, 1), dtype_out)) for _ in range(numel)]}

    case = {"op": op, "affine": affine, "residual": residual,
            "alpha": alpha, "direction": direction, "contract": contract,
            "dtype_x": dtype_x, "dtype_param": dtype_param, "dtype_out": dtype_out,
            "dtype_compute": dtype_compute, "dtype_residual": dtype_residual, "inputs": inputs}
    if affine != "none":  # weight_offset without a weight is an invalid case
        case["weight_offset"] = weight_offset
    if axes is not None:
        case["axes"] = axes
    else:
        case["axis"] = axis

    # epsilon
    moments = row_moments(case)  # exact var (LN) / mean square (RMS) of each row, eps excluded
    finite_m = [m for m in moments if m is not None]
    choice = rng.choice(["zero", "1e-12", "1e-6", "1e-5", "0.1", "comparable", "comparable"])
    eps = None
    if family == "exact_ties":
        choice = "zero"
    if choice == "zero" and finite_m and min(finite_m) > 0:
        eps = 0.0
    elif choice == "comparable" and finite_m:
        ref = float(finite_m[rng.randrange(len(finite_m))])
        eps = ref * 10 ** rng.uniform(-1, 1)
        if not (eps > 0 and math.isfinite(eps)):
            eps = None
    if eps is None:
        eps = {"1e-12": 1e-12, "1e-6": 1e-6, "0.1": 0.1}.get(choice, 1e-5)
    # JSON number for the plain decimal ones sometimes (tests decimal parsing), hex otherwise
    case["epsilon"] = eps if (choice in ("1e-12", "1e-6", "1e-5", "0.1") and rng.random() < 0.5) \
        else hexval(eps)
    return case


def row_moments(case: dict):
    """Exact per-row variance (LayerNorm) or mean square (RMSNorm) of the h used, without eps.
    None for rows with non-finite values."""
    shape = case["inputs"]["x"]["shape"]
    row_base, col_delta, _, pshape, _ = R.geometry(shape, case.get("axis", -1), case.get("axes"))
    dx, dres = case["dtype_x"], case.get("dtype_residual", case["dtype_x"])
    x = [R.parse_in(v, dx) for v in case["inputs"]["x"]["data"]]
    res = [R.parse_in(v, dres) for v in case["inputs"]["residual"]["data"]] \
        if "residual" in case["inputs"] and case["residual"] != "none" else None
    rb = [R.parse_in(v, case["dtype_param"]) for v in case["inputs"]["residual_bias"]["data"]] \
        if case["residual"] == "add_bias" else None
    alpha = Fraction(case.get("alpha", 1.0))
    lowp_h = "fused_add_lowp" in case["contract"].split("+") and case["direction"] == "forward"
    out = []
    for base in row_base:
        h = []
        for c, d in enumerate(col_delta):
            v = x[base + d]
            if isinstance(v, float):
                h = None
                break
            v = alpha * v + (res[base + d] if res else 0) + (rb[c] if rb else 0)
            if lowp_h:
                v = R.round_fraction(v, dres)
                if math.isinf(v):
                    h = None
                    break
                v = Fraction(v)
            h.append(v)
        if h is None:
            out.append(None)
            continue
        n = len(h)
        if case["op"] == "layernorm":
            m = sum(h, Fraction(0)) / n
            out.append(sum(((v - m) ** 2 for v in h), Fraction(0)) / n)
        else:
            out.append(sum((v * v for v in h), Fraction(0)) / n)
    return out


# ----------------------------------------------------------------------------------------------
# Running and comparing
# ----------------------------------------------------------------------------------------------


def parse_out(v) -> float:
    if isinstance(v, str):
        s = v.strip().lower()
        if s in ("nan", "+nan", "-nan"):
            return float("nan")
        if s.lstrip("+-").startswith("inf"):
            return float("-inf") if s.startswith("-") else float("inf")
        return float(R.parse_hex_exact(s)) if "0x" in s else float(s)
    return float(v)


def fmt(v) -> str:
    return "None" if v is None else hexval(v)


def run_case(binary: str, path: str, case: dict) -> dict:
    """Runs the C++ reference and compares; returns a summary dict (picklable)."""
    rep = {"path": path, "ran": False, "error": None, "mismatches": [], "compared": 0,
           "certified": 0, "elements": 0, "undecided": 0, "skipped": 0, "block_skipped": 0}
    try:
        proc = subprocess.run([binary, "reference", "--case", path, "--json"],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        rep["error"] = f"could not run: {e}"
        return rep
    if proc.returncode != 0:
        rep["error"] = f"exit code {proc.returncode}; stderr: {proc.stderr.strip()[:2000]}"
        return rep
    try:
        got = json.loads(proc.stdout)["outputs"]
    except (ValueError, KeyError) as e:
        rep["error"] = f"bad JSON on stdout ({e}): {proc.stdout[:500]}"
        return rep
    rep["ran"] = True
    und0, bs0 = R.UNDECIDED[0], R.BLOCK_SKIPPED[0]
    try:
        mine = R.evaluate(case)
    except Exception as e:  # noqa: BLE001
        rep["error"] = f"mpmath reference failed: {type(e).__name__}: {e}"
        return rep
    rep["undecided"] = R.UNDECIDED[0] - und0
    rep["block_skipped"] = R.BLOCK_SKIPPED[0] - bs0
    if set(got) != set(mine):
        rep["error"] = f"output names differ: C++ {sorted(got)} vs expected {sorted(mine)}"
        return rep
    for name, exp in mine.items():
        g = got[name]
        if g.get("dtype") != exp["dtype"] or list(g.get("shape", [])) != exp["shape"]:
            rep["error"] = (f"{name}: dtype/shape {g.get('dtype')} {g.get('shape')} vs expected "
                            f"{exp['dtype']} {exp['shape']}")
            return rep
        n = len(exp["values"])
        vals, f64s, cert = g.get("values", []), g.get("f64", []), g.get("certified", [])
        if not (len(vals) == len(f64s) == len(cert) == n):
            rep["error"] = f"{name}: array lengths {len(vals)}/{len(f64s)}/{len(cert)} != {n}"
            return rep
        for i in range(n):
            rep["elements"] += 1
            ev, ef = exp["values"][i], exp["f64"][i]
            if cert[i]:
                rep["certified"] += 1
            if ev is None or ef is None:
                rep["skipped"] += 1
                continue
            if not cert[i]:
                continue
            rep["compared"] += 1
            gv, gf = parse_out(vals[i]), parse_out(f64s[i])
            if not (R.same_value(gv, ev) and R.same_value(gf, ef)):
                rep["mismatches"].append({"output": name, "index": i,
                                          "cpp_value": fmt(gv), "expected_value": fmt(ev),
                                          "cpp_f64": fmt(gf), "expected_f64": fmt(ef)})
    return rep


def crosscheck(args) -> int:
    binary = os.path.abspath(args.normcheck)
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        print(f"crosscheck: {binary} is not an executable file")
        print(f"0 passed, {args.cases} failed")
        return 2
    tmp = tempfile.mkdtemp(prefix="normcheck-crosscheck-")
    cases = []
    for i in range(args.cases):
        case = gen_case(args.seed, i, args.blocks_only)
        path = os.path.join(tmp, f"case_{args.seed}_{i:05d}.json")
        with open(path, "w") as f:
            json.dump(case, f, indent=1)
        cases.append((path, case))
    jobs = args.jobs or os.cpu_count() or 1
    with cf.ProcessPoolExecutor(max_workers=jobs) as ex:
        reps = list(ex.map(run_case, [binary] * len(cases), [p for p, _ in cases],
                           [c for _, c in cases], chunksize=4))

    passed = failed = 0
    tot = {"elements": 0, "certified": 0, "compared": 0, "undecided": 0, "skipped": 0,
           "block_skipped": 0}
    n_mis = n_err = 0
    for (path, case), rep in zip(cases, reps):
        for k in tot:
            tot[k] += rep[k]
        bad = rep["error"] is not None or rep["mismatches"]
        if not bad:
            passed += 1
            continue
        failed += 1
        shown = path
        if args.keep_failures:
            os.makedirs(args.keep_failures, exist_ok=True)
            shown = os.path.join(args.keep_failures, os.path.basename(path))
            shutil.copy(path, shown)
        print("=" * 100)
        blk = case.get("block", "none")
        what = (f"block={blk} L={case['layers']} activation={case['activation']} "
                f"D={case['inputs']['x']['shape'][-1]} "
                f"D_ff={case['inputs']['ffn_w1']['shape'][1]}" if blk != "none" else
                f"contract={case['contract']} residual={case['residual']}/"
                f"{case['dtype_residual']}")
        print(f"FAILED case {shown}  (op={case['op']} {what} "
              f"direction={case['direction']} x={case['dtype_x']} param={case['dtype_param']} "
              f"out={case['dtype_out']} compute={case['dtype_compute']})")
        print(json.dumps(case))
        if rep["error"]:
            n_err += 1
            print(f"  ERROR: {rep['error']}")
        for m in rep["mismatches"]:
            n_mis += 1
            print(f"  MISMATCH {m['output']}[{m['index']}]: value C++ {m['cpp_value']} vs "
                  f"mpmath {m['expected_value']};  f64 C++ {m['cpp_f64']} vs mpmath "
                  f"{m['expected_f64']}")
    shutil.rmtree(tmp, ignore_errors=True)

    frac = tot["certified"] / tot["elements"] if tot["elements"] else 0.0
    print("=" * 100)
    print(f"cases: {len(cases)} (seed {args.seed}); cases with errors: {n_err}")
    print(f"elements: {tot['elements']}, certified by C++: {tot['certified']} ({100 * frac:.2f}%), "
          f"compared: {tot['compared']}, mismatches: {n_mis}")
    print(f"not compared (no expected value): {tot['skipped']} elements; roundings undecided by "
          f"mpmath: {tot['undecided']}")
    n_blk = sum(1 for _, c in cases if c.get("block", "none") != "none")
    print(f"block cases: {n_blk}; not compared (intermediate rounding undecided by mpmath): "
          f"{tot['block_skipped']}")
    ok = n_mis == 0 and n_err == 0 and frac >= 0.95 and len(reps) == args.cases
    if frac < 0.95:
        print(f"FAIL: certified fraction {100 * frac:.2f}% < 95%")
    print(f"{passed} passed, {failed} failed")
    return 0 if ok else 1


# ----------------------------------------------------------------------------------------------
# Self-tests of the independent reference (no binary needed)
# ----------------------------------------------------------------------------------------------


def self_test() -> int:
    import numpy as np
    import mpmath

    rng = random.Random(12345)
    fails = 0

    def check(cond, msg):
        nonlocal fails
        if not cond:
            fails += 1
            print("SELF-TEST FAIL:", msg)

    def bf16_from_f32(f):  # RNE by integer carry on the bit pattern: exact for binary32 input
        b = struct.unpack("<I", struct.pack("<f", f))[0]
        b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        return struct.unpack("<f", struct.pack("<I", (b << 16) & 0xFFFFFFFF))[0]

    def rand_double():
        k = rng.random()
        if k < 0.3:
            while True:
                v = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
                if math.isfinite(v):
                    return v
        if k < 0.6:
            return rng.choice([-1, 1]) * math.ldexp(rng.random() + 0.5, rng.randint(-160, 140))
        if k < 0.8:  # few significant bits: many exact ties
            return rng.choice([-1, 1]) * math.ldexp(rng.getrandbits(rng.randint(1, 30)) | 1,
                                                    rng.randint(-170, 20))
        return rng.choice([-1, 1]) * math.ldexp(rng.random() + 0.5, rng.randint(-30, 17))

    def same_signed(a, b):
        return R.same_value(a, b) and (math.isnan(a) or math.copysign(1, a) == math.copysign(1, b))

    # 1. rounding of doubles vs numpy casts (single correct roundings) and a bf16 bit trick
    with np.errstate(over="ignore"):
        for _ in range(200000):
            v = rand_double()
            a, b = R.round_fraction(v, "float32"), float(np.float32(v))
            check(same_signed(a, b), f"f32 {v.hex()}: {a} vs numpy {b}")
            a, b = R.round_fraction(v, "float16"), float(np.float16(v))
            check(same_signed(a, b), f"f16 {v.hex()}: {a} vs numpy {b}")
            check(R.round_fraction(v, "float64") == v, f"f64 {v.hex()}")
            f = float(np.float32(v))
            if math.isfinite(f):
                a, b = R.round_fraction(f, "bfloat16"), bf16_from_f32(f)
                check(same_signed(a, b), f"bf16 {f.hex()}: {a} vs {b}")
    # 2. next_up vs numpy nextafter
    for _ in range(20000):
        v = rand_double()
        for dt, npt in (("float32", np.float32), ("float16", np.float16), ("float64", np.float64)):
            with np.errstate(over="ignore"):
                t = npt(v)
            if not np.isfinite(t):
                continue
            a = R.next_up(float(t), dt)
            b = float(np.nextafter(t, npt(np.inf)))
            check(a == b, f"next_up {dt} {float(t).hex()}: {a} vs {b}")
    # 3. closed forms on rationals that are not doubles (no double rounding allowed)
    F, two = Fraction, Fraction(2)
    cases = [
        (F(65520), "float16", math.inf), (F(65520) - two ** -200, "float16", 65504.0),
        (F(65504) + 1, "float16", 65504.0),
        ((2 - two ** -24) * two ** 127, "float32", math.inf),
        ((2 - two ** -24) * two ** 127 - two ** -100, "float32", float(R.max_finite("float32"))),
        ((2 - two ** -53) * two ** 1023, "float64", math.inf),
        ((2 - two ** -8) * two ** 127, "bfloat16", math.inf),
        (two ** -25, "float16", 0.0), (two ** -25 + two ** -300, "float16", 2.0 ** -24),
        (3 * two ** -26, "float16", 2.0 ** -24), (3 * two ** -25, "float16", 2.0 ** -23),
        (two ** -150, "float32", 0.0), (two ** -150 + two ** -400, "float32", 2.0 ** -149),
        (two ** -1075, "float64", 0.0), (two ** -1075 * 3, "float64", 2.0 ** -1073),
        (1 + two ** -8, "bfloat16", 1.0), (1 + 3 * two ** -8, "bfloat16", 1 + 2.0 ** -6),
        (1 + two ** -24, "float32", 1.0), (1 + two ** -24 + two ** -1000, "float32", 1 + 2.0 ** -23),
        (1 + two ** -53 + two ** -1000, "float64", 1 + 2.0 ** -52),
        (F(1, 3), "float32", float(np.float32(1 / 3))), (F(-1, 10), "float16", -0.0999755859375),
        (two ** -14 - two ** -25, "float16", 2.0 ** -14),  # rounds up into the normal range
    ]
    for q, dt, want in cases:
        got = R.round_fraction(q, dt)
        check(same_signed(got, want), f"closed form {q} -> {dt}: {got} vs {want}")
        got = R.round_fraction(-q, dt)
        check(same_signed(got, -want), f"closed form {-q} -> {dt}: {got} vs {-want}")
    # 4. irrational values: rounding of A/sqrt(s) + B against brute-force mpmath at 3000 bits,
    #    including values placed within 2^-1000 of a rounding boundary
    for _ in range(3000):
        dt = rng.choice(DTYPES)
        s = F(rng.randrange(1, 1 << 40), rng.randrange(1, 1 << 40)) * two ** rng.randint(-60, 60)
        A = F(rng.randrange(-(1 << 30), 1 << 30), 1 << rng.randint(0, 40))
        B = F(rng.randrange(-(1 << 30), 1 << 30), 1 << rng.randint(0, 40)) if rng.random() < 0.5 \
            else F(0)
        if rng.random() < 0.3 and A != 0:  # move s so that A/sqrt(s)+B is ~ a boundary
            with mpmath.workprec(600):
                v = mpmath.mpf(A.numerator) / A.denominator / mpmath.sqrt(
                    mpmath.mpf(s.numerator) / s.denominator) + mpmath.mpf(B.numerator) / B.denominator
            t = R.round_fraction(R.mpf_to_fraction(v), dt)
            if math.isfinite(t) and t != 0:
                m = (F(t) + F(R.next_up(t, dt))) / 2
                if (m - B) * A > 0:
                    s = (A / (m - B)) ** 2 * (1 + two ** -1000 * rng.choice((-1, 1)))
        val = R.SqrtSum.inv_sqrt(s, A) + B
        got = R.round_value(val, dt)
        with mpmath.workprec(3500):
            v = mpmath.mpf(A.numerator) / A.denominator / mpmath.sqrt(
                mpmath.mpf(s.numerator) / s.denominator) + mpmath.mpf(B.numerator) / B.denominator
        want = R.round_fraction(R.mpf_to_fraction(v), dt)
        check(got is not None and R.same_value(got, want),
              f"A/sqrt(s)+B {A} {s} {B} {dt}: {got} vs {want}")
    # 5. known answers of the reference
    def run(case):
        return R.evaluate(case)

    base = {"op": "layernorm", "epsilon": 0, "affine": "none", "dtype_x": "float64",
            "dtype_param": "float64", "dtype_out": "float64", "dtype_compute": "float64"}
    out = run(dict(base, inputs={"x": {"shape": [2], "data": [1, 3]}}))
    check(out["y"]["values"] == [-1.0, 1.0] and out["mean"]["values"] == [2.0]
          and out["rstd"]["values"] == [1.0], f"[1,3] LN: {out}")
    out = run(dict(base, affine="weight_bias", epsilon=1e-5,
                   inputs={"x": {"shape": [2, 3], "data": [5, 5, 5, 1, 2, 4]},
                           "weight": {"shape": [3], "data": [2, 3, 4]},
                           "bias": {"shape": [3], "data": ["0x1.8p+0", -2, 0.25]}}))
    check(out["y"]["values"][:3] == [1.5, -2.0, 0.25], f"constant row: {out['y']}")
    check(out["rstd"]["values"][0] == float(1 / mpmath.sqrt(mpmath.mpf(1e-5))), "rstd eps")
    out = run(dict(base, op="rmsnorm", inputs={"x": {"shape": [2], "data": [3, 4]}}))
    y = [float(mpmath.mpf(3) / mpmath.sqrt(12.5)), float(mpmath.mpf(4) / mpmath.sqrt(12.5))]
    check(out["y"]["values"] == y and "mean" not in out, f"rms [3,4]: {out}")
    out = run(dict(base, affine="weight_bias", epsilon=0.5,
                   inputs={"x": {"shape": [3, 1], "data": [7, -2, 1e300]},
                           "weight": {"shape": [1], "data": [3]},
                           "bias": {"shape": [1], "data": [0.75]}}))
    check(out["y"]["values"] == [0.75] * 3, f"hidden size 1 LN: {out['y']}")
    # contracts: llama rounds xhat to dtype_x; y = xhat exactly rounded twice
    out = run(dict(base, dtype_x="float16", dtype_out="float64", contract="llama", epsilon=0,
                   op="rmsnorm", inputs={"x": {"shape": [3], "data": [1, 2, 2]}}))
    want = [float(np.float16(float(v))) for v in (1 / mpmath.sqrt(3), 2 / mpmath.sqrt(3))]
    check(out["y"]["values"] == [want[0], want[1], want[1]], f"llama: {out['y']}")
    # fused_add_lowp: h = x + residual rounded to float16 before the statistics
    out = run(dict(base, op="rmsnorm", contract="fused_add_lowp", residual="add",
                   dtype_residual="float16", epsilon=0,
                   inputs={"x": {"shape": [2], "data": [1, 1]},
                           "residual": {"shape": [2], "data": ["0x1p-11", "-0x1p-11"]}}))
    check(out["residual_out"]["values"] == [1.0, 1 - 2.0 ** -11] and
          out["residual_out"]["f64"] == [1.0, 1 - 2.0 ** -11] and  # the h actually used
          out["rstd"]["values"] == [float(1 / mpmath.sqrt((1 + (1 - mpmath.mpf(2) ** -11) ** 2) / 2))],
          f"lowp: {out}")
    # backward against central differences of the exact forward (numerically, in mpmath)
    for trial in range(30):
        case = gen_plain_case(777, trial)
        while case["direction"] != "backward" or \
                math.prod(case["inputs"]["x"]["shape"]) > 40:
            trial += 1000
            case = gen_plain_case(777, trial)
        grad_fd_check(case, check)
    # NaN row: only that row is NaN
    out = run(dict(base, affine="none", epsilon=1e-5,
                   inputs={"x": {"shape": [2, 2], "data": [1, "nan", 1, 2]}}))
    check(all(math.isnan(v) for v in out["y"]["values"][:2]) and out["y"]["values"][2:] ==
          [float(-0.5 / mpmath.sqrt(0.25 + mpmath.mpf(1e-5))),
           float(0.5 / mpmath.sqrt(0.25 + mpmath.mpf(1e-5)))], f"nan row: {out['y']}")
    block_self_test(check)
    print("self-test:", "OK" if fails == 0 else f"{fails} failures")
    return 0 if fails == 0 else 1


def grad_fd_check(case, check):
    """dx, dweight, dbias of R.evaluate vs central differences of a plain mpmath forward."""
    import mpmath
    mp = mpmath.mp
    mp.prec = 2400
    shape = case["inputs"]["x"]["shape"]
    row_base, col_delta, _, _, _ = R.geometry(shape, case.get("axis", -1), case.get("axes"))
    def q2mpf(q):
        return mpmath.mpf(q.numerator) / q.denominator

    def get(n, dt):
        if n not in case["inputs"]:
            return None
        return [q2mpf(R.parse_in(v, dt)) for v in case["inputs"][n]["data"]]

    x = get("x", case["dtype_x"])
    w = get("weight", case["dtype_param"])
    b = get("bias", case["dtype_param"])
    dy = get("dy", case["dtype_out"])
    res = get("residual", case["dtype_residual"]) if case["residual"] != "none" else None
    rb = get("residual_bias", case["dtype_param"])
    eps = q2mpf(R.parse_in(case["epsilon"], "float64"))
    alpha, woff = mpmath.mpf(case["alpha"]), mpmath.mpf(case.get("weight_offset", 0.0))

    # Under fused_add_lowp the backward differentiates at the stored (rounded) h, treating the
    # rounding as the identity: differentiate h + (round(h0) - h0), h0 = h at the given inputs.
    lowp = "fused_add_lowp" in case["contract"].split("+") and case["residual"] != "none"
    shift = {}

    def loss(x, w, b):
        tot = mpmath.mpf(0)
        for base in row_base:
            offs = [base + d for d in col_delta]
            h = [alpha * x[o] + (res[o] if res else 0) + (rb[c] if rb else 0)
                 for c, o in enumerate(offs)]
            if lowp:
                for c, o in enumerate(offs):
                    if o not in shift:  # first call: the unperturbed inputs
                        t = R.round_fraction(R.mpf_to_fraction(h[c]), case["dtype_residual"])
                        shift[o] = q2mpf(Fraction(t)) - h[c]
                    h[c] += shift[o]
            n = len(h)
            if case["op"] == "layernorm":
                m = mpmath.fsum(h) / n
                c_ = [v - m for v in h]
            else:
                c_ = h
            r = 1 / mpmath.sqrt(mpmath.fsum(v * v for v in c_) / n + eps)
            for c, o in enumerate(offs):
                y = c_[c] * r * ((woff + w[c]) if w else 1) + (b[c] if b else 0)
                tot += dy[o] * y
        return tot

    out = R.evaluate(case)
    loss(x, w, b)  # fixes the fused_add_lowp shifts at the unperturbed inputs
    for name, vec in (("dx", x), ("dweight", w), ("dbias", b)):
        if vec is None or name not in out:
            continue
        for i in range(len(vec)):
            old = vec[i]
            delta = (abs(old) if old != 0 else mpmath.mpf(1)) * mpmath.mpf(2) ** -150
            vec[i] = old + delta
            lp = loss(x, w, b)
            vec[i] = old - delta
            lm = loss(x, w, b)
            vec[i] = old
            g = (lp - lm) / (2 * delta)
            got = out[name]["f64"][i]
            tol = mpmath.mpf(2) ** -50 * abs(g) + mpmath.mpf(2) ** -1000
            check(got is not None and abs(mpmath.mpf(got) - g) <= tol,
                  f"gradient {name}[{i}] {got} vs finite difference {g} ({case['op']})")


# ----------------------------------------------------------------------------------------------
# Self-tests of the block reference
# ----------------------------------------------------------------------------------------------


class PlainBlock:
    """A second, deliberately plain evaluation of a block case: ordinary mpmath numbers at a
    fixed high precision (no enclosures, no exact rationals), used to test R.evaluate_block.

    `loss(mode)` is sum(dy * y); `mode` picks what happens between layers: "round" (round to
    dtype_x, as the case defines), "none" (no rounding: a smooth function), "st" (straight-through:
    out + (round(out0) - out0) with out0 the layer output at the unperturbed inputs, a smooth
    function whose exact gradient at the inputs is the gradient the case defines)."""

    NAMES = ("x", "weight", "bias", "ffn_w1", "ffn_b1", "ffn_w2", "ffn_b2")

    def __init__(self, case, prec=1000):
        import mpmath
        self.mp, self.case, self.prec = mpmath, case, prec
        mpmath.mp.prec = prec
        self.t = {}
        for n in self.NAMES + ("dy",):
            if n in case["inputs"]:
                dt = case["dtype_x"] if n == "x" else case["dtype_out"] if n == "dy" \
                    else case["dtype_param"]
                self.t[n] = [self.q(R.parse_in(v, dt)) for v in case["inputs"][n]["data"]]
        if case["affine"] == "none":
            self.t.pop("weight", None)
        if case["affine"] != "weight_bias":
            self.t.pop("bias", None)
        self.L, self.F, self.D = case["inputs"]["ffn_w1"]["shape"]
        self.K = 2 if case["block"] == "sandwich" else 1
        self.eps = self.q(R.parse_in(case.get("epsilon", 1e-5), "float64"))
        self.alpha = self.q(R.parse_in(case.get("alpha", 1.0), "float64"))
        self.woff = self.q(R.parse_in(case.get("weight_offset", 0.0), "float64"))
        self.shift = None
        self.shift = self.shifts()

    def q(self, f):
        return self.mp.mpf(f.numerator) / f.denominator

    def norm(self, h, l, k):
        mp, n, t = self.mp, len(h), self.t
        if self.case["op"] == "layernorm":
            m = mp.fsum(h) / n
            c = [v - m for v in h]
        else:
            c = h
        r = 1 / mp.sqrt(mp.fsum(v * v for v in c) / n + self.eps)
        o = (l * self.K + k) * n
        return [c[i] * r * ((self.woff + t["weight"][o + i]) if "weight" in t else 1) +
                (t["bias"][o + i] if "bias" in t else 0) for i in range(n)]

    def ffn(self, v, l):
        mp, t, D, F = self.mp, self.t, self.D, self.F
        z = []
        for j in range(F):
            a = t["ffn_b1"][l * F + j] + mp.fsum(t["ffn_w1"][(l * F + j) * D + k] * v[k]
                                                  for k in range(D))
            if self.case["activation"] == "relu":
                z.append(a if a > 0 else mp.mpf(0))
            else:
                z.append(a / 2 * (1 + mp.erf(a / mp.sqrt(2))))
        return [t["ffn_b2"][l * D + i] + mp.fsum(t["ffn_w2"][(l * D + i) * F + j] * z[j]
                                                  for j in range(F)) for i in range(D)]

    def layer(self, u, l):
        blk = self.case["block"]
        if blk in ("post", "deepnorm"):
            a = self.alpha if blk == "deepnorm" else 1
            return self.norm([a * p + f for p, f in zip(u, self.ffn(u, l))], l, 0)
        if blk == "pre":
            return [p + f for p, f in zip(u, self.ffn(self.norm(u, l, 0), l))]
        return [p + w for p, w in zip(u, self.norm(self.ffn(self.norm(u, l, 0), l), l, 1))]

    def rnd(self, v):
        return self.q(Fraction(R.round_fraction(R.mpf_to_fraction(v), self.case["dtype_x"])))

    def forward(self, mode="round"):
        D, ys, shifts = self.D, [], []
        x = self.t["x"]
        for r in range(len(x) // D):
            u = x[r * D:(r + 1) * D]
            for l in range(self.L):
                out = self.layer(u, l)
                if l < self.L - 1:
                    if mode == "round":
                        u = [self.rnd(v) for v in out]
                        shifts.append([a - b for a, b in zip(u, out)])
                    elif mode == "st":
                        u = [v + s for v, s in zip(out, self.shift[r * (self.L - 1) + l])]
                    else:
                        u = out
            ys += out
        return ys, shifts

    def shifts(self):
        return self.forward("round")[1]

    def loss(self, mode):
        ys, _ = self.forward(mode)
        return self.mp.fsum(a * b for a, b in zip(ys, self.t["dy"]))


def block_fd_check(case, check, mode, rel_tol, label):
    """Every gradient of R.evaluate(case) against central differences of PlainBlock.loss(mode)."""
    mp = __import__("mpmath")
    out = R.evaluate(case)
    pb = PlainBlock(case)
    grad_name = {"x": "dx", "weight": "dweight", "bias": "dbias", "ffn_w1": "dffn_w1",
                 "ffn_b1": "dffn_b1", "ffn_w2": "dffn_w2", "ffn_b2": "dffn_b2"}
    check(set(out) == {grad_name[n] for n in pb.t if n != "dy"}, f"{label}: outputs {sorted(out)}")
    for n, vec in pb.t.items():
        if n == "dy":
            continue
        got = out[grad_name[n]]["f64"]
        fds = []
        for i in range(len(vec)):
            old = vec[i]
            delta = (abs(old) if old != 0 else mp.mpf(1)) * mp.mpf(2) ** -200
            vec[i] = old + delta
            lp = pb.loss(mode)
            vec[i] = old - delta
            lm = pb.loss(mode)
            vec[i] = old
            fds.append((lp - lm) / (2 * delta))
        scale = max([abs(g) for g in fds] + [mp.mpf(0)])
        for i, g in enumerate(fds):
            tol = rel_tol * (abs(g) + (scale if mode == "none" else 0)) + mp.mpf(2) ** -300
            check(got[i] is not None and abs(mp.mpf(got[i]) - g) <= tol,
                  f"{label}: {grad_name[n]}[{i}] {got[i]} vs finite difference {mp.nstr(g, 20)}")


def _blk_case(block, op, act, L, x, w1, b1, w2, b2, dy=None, eps=0, affine="none", **kw):
    D = len(x) if not isinstance(x[0], list) else len(x[0])
    flat = [v for row in x for v in row] if isinstance(x[0], list) else list(x)
    F = len(b1) // L
    ins = {"x": {"shape": ([len(x)] if isinstance(x[0], list) else []) + [D], "data": flat},
           "ffn_w1": {"shape": [L, F, D], "data": w1}, "ffn_b1": {"shape": [L, F], "data": b1},
           "ffn_w2": {"shape": [L, D, F], "data": w2}, "ffn_b2": {"shape": [L, D], "data": b2}}
    c = {"op": op, "block": block, "layers": L, "activation": act, "epsilon": eps,
         "affine": affine, "dtype_x": "float64", "dtype_param": "float64", "dtype_out": "float64",
         "direction": "forward", "inputs": ins}
    if dy is not None:
        c["direction"] = "backward"
        ins["dy"] = {"shape": ins["x"]["shape"], "data": [v for row in dy for v in row]
                     if isinstance(dy[0], list) else list(dy)}
    c.update(kw)
    return c


def block_self_test(check):
    """Tests of R.evaluate_block: hand-computed ReLU/GELU blocks, zero-FFN identities against
    the plain reference, a plain high-precision forward, and finite differences."""
    F = Fraction

    def vals(out, name, key="f64"):
        return out[name][key]

    # 1. hand-computed blocks (every value rational; derivations in the comments)
    # post rmsnorm relu, eps 0: a = 1+0 = 1, z = 1, h = x + [6,1] = [7,1], rms 5, y = [7/5, 1/5];
    # dy = [1,0]: g = [1,0], mean(g h) = 7/2, dh = (g - h*(7/2)/25)/5 = [1/250, -7/250];
    # dz = 6/250 - 7/250 = -1/250 = da; dx = dh + W1^T da = [0, -8/250]
    c = _blk_case("post", "rmsnorm", "relu", 1, [1, 0], [1, 1], [0], [6, 1], [0, 0])
    out = R.evaluate(c)
    check(vals(out, "y") == [1.4, 0.2] and vals(out, "y", "values") == [1.4, 0.2],
          f"post relu y {out}")
    out = R.evaluate(dict(c, direction="backward",
                          inputs=dict(c["inputs"], dy={"shape": [2], "data": [1, 0]})))
    want = {"dx": [0, F(-8, 250)], "dffn_w1": [F(-1, 250), 0], "dffn_b1": [F(-1, 250)],
            "dffn_w2": [F(1, 250), F(-7, 250)], "dffn_b2": [F(1, 250), F(-7, 250)]}
    for n, w in want.items():
        check(vals(out, n) == [R.round_fraction(F(v), "float64") for v in w],
              f"post relu {n} {out[n]}")
    # pre rmsnorm relu, eps 0: v = x = [1,-1], a = 2-1+1/2 = 3/2, f = [3/2+1/4, -3], y = [11/4, -4];
    # dy = [1,1]: dz = 1-2 = -1 = da, dW1 = -v, dv = [-2,-1], dh = dv - v*mean(dv v) = [-3/2,-3/2],
    # dx = dy + dh = [-1/2,-1/2]
    c = _blk_case("pre", "rmsnorm", "relu", 1, [1, -1], [2, 1], [0.5], [1, -2], [0.25, 0],
                  dy=[1, 1], dtype_x="float16", dtype_out="bfloat16")
    out = R.evaluate(dict(c, direction="forward"))
    check(vals(out, "y") == [2.75, -4.0], f"pre relu y {out}")
    out = R.evaluate(c)
    want = {"dx": [-0.5, -0.5], "dffn_w1": [-1, 1], "dffn_b1": [-1], "dffn_w2": [1.5, 1.5],
            "dffn_b2": [1, 1]}
    for n, w in want.items():
        check(vals(out, n) == w and vals(out, n, "values") == w, f"pre relu {n} {out[n]}")
    # two layers, post layernorm relu: layer 0: a = 0, F = 0, y0 = LN([1,3]) = [-1,1];
    # layer 1: a = -1+1+1 = 1, h = [-1,1] + [1,-1] + [0,4] = [0,4] -> [-1,1];
    # weight [1,2] + offset 1, bias [.5,0]: y = [-2+.5, 3]
    c = _blk_case("post", "layernorm", "relu", 2, [1, 3], [0, 0, 1, 1], [0, 1], [0, 0, 1, -1],
                  [0, 0, 0, 4], affine="weight_bias", weight_offset=1,
                  inputs=None)
    c["inputs"] = _blk_case("post", "layernorm", "relu", 2, [1, 3], [0, 0, 1, 1], [0, 1],
                            [0, 0, 1, -1], [0, 0, 0, 4])["inputs"]
    c["inputs"]["weight"] = {"shape": [2, 1, 2], "data": [0, 0, 1, 2]}
    c["inputs"]["bias"] = {"shape": [2, 1, 2], "data": [0, 0, 0.5, 0]}
    out = R.evaluate(c)
    check(vals(out, "y") == [-1.5, 3.0], f"2-layer post y {out}")
    # gelu at 0: pre rmsnorm, W1 = b1 = 0: gelu(0) = 0, y = x + b2; gelu'(0) = 1/2:
    # da = (W2^T dy)/2 = 3, dW1 = 3 v = [3,-3], dW2 = dy*z = 0, dx = dy
    c = _blk_case("pre", "rmsnorm", "gelu", 1, [1, -1], [0, 0], [0], [2, 4], [0.5, 0.25],
                  dy=[1, 1])
    out = R.evaluate(dict(c, direction="forward"))
    check(vals(out, "y") == [1.5, -0.75], f"pre gelu(0) y {out}")
    out = R.evaluate(c)
    want = {"dx": [1, 1], "dffn_w1": [3, -3], "dffn_b1": [3], "dffn_w2": [0, 0], "dffn_b2": [1, 1]}
    for n, w in want.items():
        check(vals(out, n) == w, f"pre gelu(0) {n} {out[n]}")
    # relu'(0) = 0: pre, W1 = b1 = 0, W2 != 0: dz = W2^T dy = 6 but da = 0, so dW1 = db1 = 0
    c = _blk_case("pre", "rmsnorm", "relu", 1, [1, -1], [0, 0], [0], [2, 4], [0.5, 0.25],
                  dy=[1, 1])
    out = R.evaluate(c)
    want = {"dx": [1, 1], "dffn_w1": [0, 0], "dffn_b1": [0], "dffn_w2": [0, 0], "dffn_b2": [1, 1]}
    for n, w in want.items():
        check(vals(out, n) == w, f"pre relu'(0) {n} {out[n]}")
    # deepnorm, alpha = 1/2, relu dead (a = -1): h = x/2 + b2 = [7,1] -> [7/5,1/5]
    c = _blk_case("deepnorm", "rmsnorm", "relu", 1, [2, 0], [1, 0], [-3], [5, 5], [6, 1],
                  alpha=0.5)
    check(vals(R.evaluate(c), "y") == [1.4, 0.2], "deepnorm relu y")
    # sandwich: Norm1 of F = b2 = [3,-1] (LN, eps 0) is [1,-1]: y = x + [1,-1] * 2 + [0, 1/4]
    c = _blk_case("sandwich", "layernorm", "relu", 1, [0.5, 7], [1, 1], [-100], [1, 1], [3, -1],
                  affine="weight_bias")
    c["inputs"]["weight"] = {"shape": [1, 2, 2], "data": [1, 1, 2, 2]}
    c["inputs"]["bias"] = {"shape": [1, 2, 2], "data": [0, 0, 0, 0.25]}
    check(vals(R.evaluate(c), "y") == [2.5, 5.25], "sandwich relu y")

    # 2. zero FFN: pre gives y = round(x) (dx = dy, dffn_b2 = column sums of dy, the rest 0);
    #    post (all FFN parameters 0) is the plain norm of x, layer by layer
    rng = random.Random(4242)
    n_pre = n_post = 0
    for i in range(400):
        c = gen_block_case(99, i)
        if c["block"] not in ("pre", "post") or (n_pre >= 25 and c["block"] == "pre") or \
                (n_post >= 25 and c["block"] == "post"):
            continue
        for n in ("ffn_w1", "ffn_b1", "ffn_w2", "ffn_b2"):
            c["inputs"][n]["data"] = [0.0] * len(c["inputs"][n]["data"])
        out = R.evaluate(c)
        x = [R.parse_in(v, c["dtype_x"]) for v in c["inputs"]["x"]["data"]]
        D, L = c["inputs"]["x"]["shape"][-1], c["layers"]
        if c["block"] == "pre":
            n_pre += 1
            if c["direction"] == "forward":
                check(vals(out, "y", "values") == [R.round_fraction(v, c["dtype_out"]) for v in x]
                      and vals(out, "y") == [float(v) for v in x], f"pre zero FFN y: {c}")
                continue
            dy = [R.parse_in(v, c["dtype_out"]) for v in c["inputs"]["dy"]["data"]]
            check(vals(out, "dx", "values") == [R.round_fraction(v, c["dtype_x"]) for v in dy],
                  f"pre zero FFN dx: {c}")
            cols = [sum(dy[r * D + k] for r in range(len(dy) // D)) for k in range(D)]
            check(vals(out, "dffn_b2", "values") ==
                  [R.round_fraction(cols[k], c["dtype_param"]) for _ in range(L) for k in range(D)],
                  f"pre zero FFN dffn_b2: {c}")
            for n in ("dffn_w1", "dffn_b1", "dffn_w2", "dweight", "dbias"):
                if n in out:
                    check(all(v == 0 for v in vals(out, n)), f"pre zero FFN {n}: {c}")
            continue
        if L > 2 or (L == 2 and c["direction"] == "backward"):
            continue
        n_post += 1
        plain = {"op": c["op"], "epsilon": c["epsilon"], "affine": c["affine"],
                 "dtype_x": c["dtype_x"], "dtype_param": c["dtype_param"],
                 "dtype_out": c["dtype_out"], "direction": c["direction"], "axis": -1}
        if "weight_offset" in c:
            plain["weight_offset"] = c["weight_offset"]
        xin = c["inputs"]["x"]
        for l in range(L):
            ins = {"x": xin}
            for n in ("weight", "bias"):
                if n in c["inputs"]:
                    ins[n] = {"shape": [D], "data": c["inputs"][n]["data"][l * D:(l + 1) * D]}
            if "dy" in c["inputs"]:
                ins["dy"] = c["inputs"]["dy"]
            p = dict(plain, inputs=ins)
            if l < L - 1:
                p["dtype_out"] = c["dtype_x"]
            ref = R.evaluate(p)
            if l < L - 1:
                xin = {"shape": xin["shape"], "data": [v.hex() for v in ref["y"]["values"]]}
        for n in out:
            if n not in ref:
                continue
            got, exp = out[n], ref[n]
            check(all(a is None or b is None or (R.same_value(a, b))
                      for a, b in zip(got["values"] + got["f64"], exp["values"] + exp["f64"])),
                  f"post zero FFN {n}: {got} vs plain {exp}; {c}")
    check(n_pre >= 20 and n_post >= 15, f"zero-FFN coverage {n_pre} {n_post}")

    # 3. the ball primitives at 640 bits enclose 3000-bit values, on exact and on ball inputs
    import mpmath
    rng = random.Random(777)
    prims = [("erf", R.b_erf, mpmath.erf), ("exp", R.b_exp, mpmath.exp),
             ("inv_sqrt", R.b_inv_sqrt, lambda v: 1 / mpmath.sqrt(v)),
             ("gelu", lambda a: R.act_value("gelu", a),
              lambda v: v / 2 * (1 + mpmath.erf(v / mpmath.sqrt(2)))),
             ("gelu'", lambda a: R.act_deriv("gelu", a),
              lambda v: (1 + mpmath.erf(v / mpmath.sqrt(2))) / 2 +
              v * mpmath.exp(-v * v / 2) / mpmath.sqrt(2 * mpmath.pi)),
             ("relu", lambda a: R.act_value("relu", a), lambda v: max(v, mpmath.mpf(0))),
             ("mul", lambda a: R.b_mul(a, R.b_add(a, F(1, 3))),
              lambda v: v * (v + mpmath.mpf(1) / 3)),
             ("sum", lambda a: R.b_sum([a, F(-1, 7), R.b_neg(a), a]),
              lambda v: v - mpmath.mpf(1) / 7)]
    for i in range(600):
        q = F(rng.randrange(-(1 << 40), 1 << 40), rng.choice([1 << rng.randint(36, 50),
                                                             3 * 7 ** 5 << 30]))  # |q| < 16
        name, fb, fp = prims[i % len(prims)]
        if name == "inv_sqrt":
            q = abs(q) + F(1, 1000)
        if name == "exp":
            q = q * 3
        with mpmath.workprec(3000):
            want = fp(mpmath.mpf(q.numerator) / q.denominator)
        with mpmath.workprec(640):
            R._ball_setup(640)
            a = q
            if i % 2:  # a ball around q: midpoint off by up to 2^-600 relatively
                m = mpmath.mpf(q.numerator) / q.denominator * \
                    (1 + rng.uniform(-1, 1) * mpmath.mpf(2) ** -600)
                e = abs(R.mpf_to_fraction(m) - q)  # exact; the radius is twice its rounding
                a = R.Ball(m, 2 * mpmath.mpf(e.numerator) / e.denominator + mpmath.mpf(2) ** -700)
            v = fb(a)
        wq = R.mpf_to_fraction(want)
        lo, hi = (v, v) if isinstance(v, Fraction) else v.bounds()
        tol = abs(wq) * F(1, 1 << 2900) + F(1, 1 << 2900)  # the 3000-bit value's own error
        narrow = isinstance(v, Fraction) or hi - lo < abs(wq) * F(1, 1 << 500) + F(1, 1 << 550)
        check(lo - tol <= wq <= hi + tol and narrow,
              f"ball primitive {name}({q}) [{float(lo)}, {float(hi)}] does not enclose / too wide")

    # 4. forward values against PlainBlock at 3000 bits (intermediate roundings included), and
    #    the 640-bit enclosures of y contain the 3000-bit values
    n_cmp = n_und = 0
    for i in range(60):
        c = gen_block_case(31337, i)
        c = dict(c, direction="forward")
        out = R.evaluate(c)["y"]
        ys, _ = PlainBlock(c, prec=3000).forward("round")
        try:
            with mpmath.workprec(640):
                balls = R.block_exact(R._BlockCase(c), 640)["y"]
        except R._Undecided:
            balls = None
        for j, v in enumerate(ys):
            q = R.mpf_to_fraction(v)
            if balls is not None:
                b = balls[j]
                lo, hi = (b, b) if isinstance(b, Fraction) else b.bounds()
                tol = abs(q) * F(1, 1 << 2900) + F(1, 1 << 2900)
                check(lo - tol <= q <= hi + tol, f"block y[{j}] enclosure, case {i}: {c}")
            if out["values"][j] is None:
                n_und += 1
                continue
            n_cmp += 1
            check(R.same_value(out["values"][j], R.round_fraction(q, c["dtype_out"])) and
                  R.same_value(out["f64"][j], R.round_fraction(q, "float64")),
                  f"block forward vs plain 3000-bit: case {i} y[{j}] {out['values'][j]} "
                  f"{out['f64'][j]!r} vs {mpmath_str(v)}")
    check(n_cmp > 500 and n_und <= n_cmp // 100, f"plain forward coverage {n_cmp} {n_und}")

    # 5. gradients vs central differences, L = 1 and 2, every block, both activations and ops:
    #    "st": of the straight-through forward (tight), "none": of the forward without the
    #    intermediate roundings (dtype_x float64, so the two differ by ~2^-52 relatively)
    want = [(b, L) for L in (1, 2) for b in R.BLOCKS]
    k = 0
    for i in range(5000):
        if not want:
            break
        c = gen_block_case(2718, i)
        key = (c["block"], c["layers"])
        D, Fh = c["inputs"]["x"]["shape"][-1], c["inputs"]["ffn_w1"]["shape"][1]
        rows = math.prod(c["inputs"]["x"]["shape"][:-1])
        if key not in want or c["direction"] != "backward" or D > 4 or Fh > 4 or rows > 2 or \
                D < 2 or all(parse_out(v) == 0 for v in c["inputs"]["ffn_w1"]["data"]):
            continue
        c["activation"] = ("relu", "gelu")[k % 2]
        c["op"] = ("layernorm", "rmsnorm")[(k // 2) % 2]
        k += 1
        want.remove(key)
        block_fd_check(c, check, "st", mpmath_pow2(-51), f"FD(st) {key} {c['activation']}")
        c64 = dict(c, dtype_x="float64")
        block_fd_check(c64, check, "none", mpmath_pow2(-36 if c["layers"] > 1 else -51),
                       f"FD(no rounding) {key} {c['activation']}")
    check(not want, f"FD coverage: missing {want}")


def mpmath_pow2(e):
    import mpmath
    return mpmath.mpf(2) ** e


def mpmath_str(v):
    import mpmath
    return mpmath.nstr(v, 25)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--normcheck", help="path to the normcheck binary")
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep-failures", metavar="DIR", help="copy failing case files into DIR")
    ap.add_argument("--jobs", type=int, default=0, help="worker processes (default: all CPUs)")
    ap.add_argument("--self-test", action="store_true", help="test the mpmath reference itself")
    ap.add_argument("--blocks-only", action="store_true",
                    help="generate residual-block cases only (default: ~20%% of the cases)")
    ap.add_argument("--dump-cases", metavar="DIR", help="only write the generated cases to DIR")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if args.dump_cases:
        os.makedirs(args.dump_cases, exist_ok=True)
        for i in range(args.cases):
            with open(os.path.join(args.dump_cases, f"case_{args.seed}_{i:05d}.json"), "w") as f:
                json.dump(gen_case(args.seed, i, args.blocks_only), f, indent=1)
        return 0
    if not args.normcheck:
        ap.error("--normcheck is required (or --self-test)")
    return crosscheck(args)


if __name__ == "__main__":
    sys.exit(main())
