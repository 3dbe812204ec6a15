#!/usr/bin/python3
"""Independent reference for normcheck: LayerNorm / RMSNorm evaluated exactly, rounded exactly.

Written from the mathematical specification (CASE_JSON.md and the comments of
reference/include/normcheck/reference/*.hpp), NOT from the C++ reference, so that it can serve
as a golden-value cross-check for it.

How values are represented
--------------------------
Every input is a binary floating-point value, so everything rational (h, mean, variance, sums,
products with weights, ...) is held exactly as a `fractions.Fraction`.  The only irrational
operation is r = 1/sqrt(s) with s = var + eps (or ms + eps), rational.  Every output of the
forward and backward passes therefore has the exact form

        B + sum_k A_k / sqrt(s_k)          (A_k, B, s_k rational)           -- `SqrtSum`

(one term for forward outputs, dx and dresidual; one term per row for dweight and
dresidual_bias).  Rounding such a value to a format:

  1. mpmath evaluates each 1/sqrt(s_k) at `prec` >= 420 bits; the result is turned into an exact
     rational enclosure [r_lo, r_hi] which is *verified* with exact arithmetic
     (r_lo^2 * s <= 1 <= r_hi^2 * s), so correctness does not depend on trusting mpmath;
  2. the enclosure of the whole value, [lo, hi], is rounded at both ends with the exact
     integer-based RNE rounding `round_fraction`; if both ends round to the same value (+0 and -0
     counted equal) the rounding is decided;
  3. otherwise, for a single-term value A/sqrt(s) + B, the rounding boundary m between the two
     candidates is compared with the exact value using rational arithmetic only
     (sign(A/sqrt(s) - (m - B)) via squares), which decides every case, exact ties included;
  4. otherwise the precision is doubled (up to 3360 bits) and, if still open, the element is
     reported as undecided (None).  Perfect-square s are detected, making 1/sqrt(s) rational.

Public entry point: `evaluate(case_dict) -> {name: {"dtype", "shape", "values", "f64"}}` where
`values` / `f64` hold Python floats (exact binary64 images of the rounded values) or None where
the element is undecided or deliberately not compared (non-finite rows, see below).
"""

from __future__ import annotations

import itertools
import math
import re
from decimal import Decimal
from fractions import Fraction

import mpmath

# ----------------------------------------------------------------------------------------------
# Formats and exact rounding
# ----------------------------------------------------------------------------------------------

# name -> (precision p incl. hidden bit, min normal exponent, max exponent)
FORMATS = {
    "float64": (53, -1022, 1023),
    "float32": (24, -126, 127),
    "float16": (11, -14, 15),
    "bfloat16": (8, -126, 127),
}

NAN = float("nan")
INF = float("inf")


def _floor_log2(n: int, d: int) -> int:
    """e with 2^e <= n/d < 2^(e+1), for positive integers n, d."""
    e = n.bit_length() - d.bit_length()
    if e >= 0:
        if n < (d << e):
            e -= 1
    else:
        if (n << -e) < d:
            e -= 1
    return e


def round_fraction(q, dtype: str) -> float:
    """Round the exact rational q to `dtype` (RNE, gradual underflow, overflow to inf).

    Pure integer arithmetic; the result is returned as the (exactly equal) Python float.
    Non-finite floats pass through.
    """
    if isinstance(q, float):
        if not math.isfinite(q) or q == 0:
            return q
        q = Fraction(q)
    p, emin, emax = FORMATS[dtype]
    if q == 0:
        return 0.0
    neg = q < 0
    a = -q if neg else q
    n, d = a.numerator, a.denominator
    e = _floor_log2(n, d)
    E = max(e, emin) - (p - 1)  # exponent of the quantum (ulp) at this binade
    if E >= 0:
        num, den = n, d << E
    else:
        num, den = n << -E, d
    k, rem = divmod(num, den)
    c = 2 * rem - den
    if c > 0 or (c == 0 and (k & 1)):
        k += 1
    if k == 0:
        return -0.0 if neg else 0.0
    if E + k.bit_length() - 1 > emax:  # k*2^E >= 2^(emax+1): beyond max finite + half ulp
        return -INF if neg else INF
    r = math.ldexp(k, E)  # exact: k <= 2^p <= 2^53 and E >= -1074
    return -r if neg else r


def max_finite(dtype: str) -> Fraction:
    p, _, emax = FORMATS[dtype]
    return Fraction((1 << p) - 1) * Fraction(2) ** (emax - p + 1)


def overflow_threshold(dtype: str) -> Fraction:
    """(2 - 2^-p) * 2^emax: at and beyond this, RNE gives infinity."""
    p, _, emax = FORMATS[dtype]
    return Fraction((1 << (p + 1)) - 1) * Fraction(2) ** (emax - p)


def next_up(t: float, dtype: str) -> float:
    """The next value of `dtype` above t (t a value of dtype, finite or -inf); inf above max."""
    p, emin, emax = FORMATS[dtype]
    if t == -INF:
        return -float(max_finite(dtype))
    if t == INF:
        return INF
    q = Fraction(t)
    if q >= 0:
        if q == 0:
            ulp = Fraction(2) ** (emin - p + 1)
        else:
            e = _floor_log2(q.numerator, q.denominator)
            ulp = Fraction(2) ** (max(e, emin) - p + 1)
        r = q + ulp
        if r > max_finite(dtype):
            return INF
        return float(r)
    # negative: step toward zero; the ulp is that of the binade *below* |q| when |q| is a power
    # of two (and above the subnormal range)
    a = -q
    e = _floor_log2(a.numerator, a.denominator)
    if a == Fraction(2) ** e and e > emin:
        ulp = Fraction(2) ** (e - 1 - p + 1)
    else:
        ulp = Fraction(2) ** (max(e, emin) - p + 1)
    r = a - ulp
    return -float(r) if r != 0 else -0.0


def boundary_between(t_lo: float, t_hi: float, dtype: str) -> Fraction:
    """Exact rounding boundary between adjacent values t_lo < t_hi of dtype (may be +-inf)."""
    if t_hi == INF:
        return overflow_threshold(dtype)
    if t_lo == -INF:
        return -overflow_threshold(dtype)
    return (Fraction(t_lo) + Fraction(t_hi)) / 2


def same_value(a: float, b: float) -> bool:
    """Equality for comparisons: +0 == -0, NaN == NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


# ----------------------------------------------------------------------------------------------
# Parsing of case values
# ----------------------------------------------------------------------------------------------

_HEX_RE = re.compile(r"^([+-]?)0x([0-9a-f]*)(?:\.([0-9a-f]*))?(?:p([+-]?\d+))?$")


def parse_hex_exact(s: str) -> Fraction:
    m = _HEX_RE.match(s.strip().lower())
    if not m or (not m.group(2) and not m.group(3)):
        raise ValueError(f"bad hex float {s!r}")
    sign, ip, fp, ex = m.group(1), m.group(2) or "", m.group(3) or "", m.group(4) or "0"
    mant = int(ip + fp, 16) if (ip + fp) else 0
    v = Fraction(mant) * Fraction(2) ** (int(ex) - 4 * len(fp))
    return -v if sign == "-" else v


def parse_number(v):
    """Exact value of a JSON element: Fraction, or float nan/inf."""
    if isinstance(v, bool):
        raise ValueError("boolean is not a number")
    if isinstance(v, Fraction):
        return v
    if isinstance(v, int):
        return Fraction(v)
    if isinstance(v, float):
        return v if not math.isfinite(v) else Fraction(v)
    if isinstance(v, Decimal):
        return Fraction(v) if v.is_finite() else float(v)
    if isinstance(v, str):
        s = v.strip().lower()
        if s in ("nan", "+nan", "-nan"):
            return NAN
        if s in ("inf", "+inf", "infinity", "+infinity"):
            return INF
        if s in ("-inf", "-infinity"):
            return -INF
        if "0x" in s:
            return parse_hex_exact(s)
        return Fraction(s)
    raise ValueError(f"cannot parse element {v!r}")


def parse_in(v, dtype: str):
    """Element value rounded correctly to dtype: Fraction if finite, else float nan/inf."""
    q = parse_number(v)
    if isinstance(q, float):
        return q
    r = round_fraction(q, dtype)
    return Fraction(r) if math.isfinite(r) else r


# ----------------------------------------------------------------------------------------------
# Exact values of the form B + sum_k A_k / sqrt(s_k)
# ----------------------------------------------------------------------------------------------

_PREC_START = 420
_PREC_MAX = 3360


def _exact_inv_sqrt(s: Fraction):
    """1/sqrt(s) as a Fraction when s is the square of a rational, else None."""
    n, d = s.numerator, s.denominator
    rn, rd = math.isqrt(n), math.isqrt(d)
    if rn * rn == n and rd * rd == d:
        return Fraction(rd, rn)
    return None


def mpf_to_fraction(v) -> Fraction:
    """Exact value of a finite mpmath mpf."""
    sign, man, exp, _ = v._mpf_
    if not man:
        if exp:  # special values have man == 0 and exp != 0 (inf / nan)
            raise ValueError("non-finite mpf")
        return Fraction(0)
    q = Fraction(man) * (Fraction(2) ** exp)
    return -q if sign else q


_enclosure_cache: dict = {}


def inv_sqrt_enclosure(s: Fraction, prec: int):
    """Rational [lo, hi] containing 1/sqrt(s) (s > 0), from mpmath at `prec` bits, verified."""
    key = (s, prec)
    hit = _enclosure_cache.get(key)
    if hit is not None:
        return hit
    with mpmath.workprec(prec + 10):
        r = 1 / mpmath.sqrt(mpmath.mpf(s.numerator) / mpmath.mpf(s.denominator))
    rq = mpf_to_fraction(r)
    slack = Fraction(1, 1 << (prec - 4))
    lo, hi = rq * (1 - slack), rq * (1 + slack)
    # verify exactly: lo^2 * s <= 1 <= hi^2 * s
    if not (lo * lo * s <= 1 <= hi * hi * s):
        raise AssertionError("mpmath enclosure of 1/sqrt(s) failed verification")
    _enclosure_cache[key] = (lo, hi)
    if len(_enclosure_cache) > 20000:
        _enclosure_cache.clear()
    return lo, hi


class SqrtSum:
    """Exact value B + sum A_k / sqrt(s_k)."""

    __slots__ = ("B", "terms")

    def __init__(self, B=Fraction(0), terms=None):
        self.B = Fraction(B)
        self.terms = dict(terms) if terms else {}

    @staticmethod
    def inv_sqrt(s: Fraction, A=Fraction(1)) -> "SqrtSum":
        """A / sqrt(s)."""
        r = _exact_inv_sqrt(s)
        if r is not None:
            return SqrtSum(A * r)
        return SqrtSum(0, {s: Fraction(A)} if A != 0 else None)

    def is_rational(self) -> bool:
        return not self.terms

    def __add__(self, other):
        if not isinstance(other, SqrtSum):
            return SqrtSum(self.B + other, self.terms)
        t = dict(self.terms)
        for s, a in other.terms.items():
            v = t.get(s, 0) + a
            if v == 0:
                t.pop(s, None)
            else:
                t[s] = v
        return SqrtSum(self.B + other.B, t)

    def scale(self, c: Fraction) -> "SqrtSum":
        c = Fraction(c)
        if c == 0:
            return SqrtSum(0)
        return SqrtSum(self.B * c, {s: a * c for s, a in self.terms.items()})

    def enclosure(self, prec: int):
        lo = hi = self.B
        for s, a in self.terms.items():
            rlo, rhi = inv_sqrt_enclosure(s, prec)
            if a > 0:
                lo += a * rlo
                hi += a * rhi
            else:
                lo += a * rhi
                hi += a * rlo
        return lo, hi

    def sign_minus(self, m: Fraction) -> int:
        """Exact sign of (self - m); only for at most one sqrt term."""
        assert len(self.terms) <= 1
        D = m - self.B
        if not self.terms:
            return (D < 0) - (D > 0)
        (s, A), = self.terms.items()
        # sign(A/sqrt(s) - D)
        sa = 1 if A > 0 else -1
        if D == 0 or (D > 0) != (sa > 0):
            return sa
        d = A * A - D * D * s  # sign(A^2/s - D^2) == sign(A^2 - D^2 s)
        sd = (d > 0) - (d < 0)
        return sd if sa > 0 else -sd


UNDECIDED = [0]  # number of roundings left undecided (None) so far in this process


def round_value(v, dtype: str):
    """Correct RNE rounding of an exact value (SqrtSum, Fraction or non-finite float) to dtype.

    Returns a Python float, or None when the rounding could not be decided.
    """
    if isinstance(v, float):
        return v  # nan / inf pass through
    if isinstance(v, Fraction):
        return round_fraction(v, dtype)
    if v.is_rational():
        return round_fraction(v.B, dtype)
    prec = _PREC_START
    while prec <= _PREC_MAX:
        lo, hi = v.enclosure(prec)
        t_lo, t_hi = round_fraction(lo, dtype), round_fraction(hi, dtype)
        if t_lo == t_hi:  # +0 == -0 deliberately
            return t_hi  # (when both are zeros their signs may differ: +0 and -0 compare equal)
        if len(v.terms) == 1 and next_up(t_lo, dtype) == t_hi:
            m = boundary_between(t_lo, t_hi, dtype)
            sgn = v.sign_minus(m)
            if sgn > 0:
                return t_hi
            if sgn < 0:
                return t_lo
            return round_fraction(m, dtype)  # exact tie: RNE picks the even neighbour (or inf)
        prec *= 2
    UNDECIDED[0] += 1
    return None


def to_exact(v):
    """SqrtSum/Fraction/float -> a value usable again in exact arithmetic after a rounding."""
    if isinstance(v, float):
        return Fraction(v) if math.isfinite(v) else v
    return v


# ----------------------------------------------------------------------------------------------
# Case interpretation
# ----------------------------------------------------------------------------------------------

CONTRACT_POINTS = {
    # name -> list of (point, dtype role), in computation order
    "exact": [],
    "llama": [("xhat", "x")],
    "gemma": [("scale", "compute")],
    "te": [("scale", "compute")],
    "te_wdtype": [("scale", "param")],
    "onnx": [("xhat", "x"), ("mul", "x")],
    "fused_add_lowp": [("h", "residual")],
}


def parse_contract(spec: str):
    pts = set()
    for name in spec.split("+"):
        name = name.strip()
        if name not in CONTRACT_POINTS:
            raise ValueError(f"unknown contract {name!r}")
        pts.update(CONTRACT_POINTS[name])
    return dict(pts)  # point -> role


def geometry(shape, axis=-1, axes=None):
    """(rows, cols, norm_dims, param_shape, stat_shape) with rows/cols as offset lists."""
    rank = len(shape)
    if axes is not None:
        dims = sorted({(a + rank if a < 0 else a) for a in axes})
        if not dims or dims[0] < 0 or dims[-1] >= rank:
            raise ValueError("bad axes")
    else:
        a = axis + rank if axis < 0 else axis
        if not 0 <= a < rank:
            raise ValueError("bad axis")
        dims = list(range(a, rank))
    strides = [1] * rank
    for i in range(rank - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    other = [d for d in range(rank) if d not in dims]

    def offsets(ds):
        return [sum(i * strides[d] for i, d in zip(idx, ds))
                for idx in itertools.product(*[range(shape[d]) for d in ds])]

    row_base = offsets(other)
    col_delta = offsets(dims)
    param_shape = [shape[d] for d in dims]
    stat_shape = [1 if d in dims else shape[d] for d in range(rank)]
    return row_base, col_delta, dims, param_shape, stat_shape


def _tensor(case, name, dtype, shape):
    t = case["inputs"].get(name)
    if t is None:
        raise ValueError(f"missing input {name}")
    if list(t["shape"]) != list(shape):
        raise ValueError(f"input {name}: shape {t['shape']} != {shape}")
    data = [parse_in(v, dtype) for v in t["data"]]
    if len(data) != math.prod(shape):
        raise ValueError(f"input {name}: wrong element count")
    return data


def _finite(v) -> bool:
    return not isinstance(v, float)


def evaluate(case: dict) -> dict:
    op = case["op"]
    assert op in ("layernorm", "rmsnorm")
    dx_ = case.get("dtype_x", "float32")
    dparam = case.get("dtype_param", "float32")
    dout = case.get("dtype_out", "float32")
    dcomp = case.get("dtype_compute", "float32")
    dres = case.get("dtype_residual", dx_)
    roles = {"x": dx_, "param": dparam, "compute": dcomp, "out": dout, "residual": dres}
    eps = parse_in(case.get("epsilon", 1e-5), "float64")
    alpha = parse_in(case.get("alpha", 1.0), "float64")
    woff = parse_in(case.get("weight_offset", 0.0), "float64")
    affine = case.get("affine", "weight_bias")
    residual = case.get("residual", "none")
    direction = case.get("direction", "forward")
    points = parse_contract(case.get("contract", "exact"))

    shape = list(case["inputs"]["x"]["shape"])
    row_base, col_delta, _, pshape, sshape = geometry(shape, case.get("axis", -1), case.get("axes"))
    N = len(col_delta)
    numel = math.prod(shape)

    x = _tensor(case, "x", dx_, shape)
    w = _tensor(case, "weight", dparam, pshape) if affine in ("weight", "weight_bias") else None
    b = _tensor(case, "bias", dparam, pshape) if affine == "weight_bias" else None
    res = _tensor(case, "residual", dres, shape) if residual in ("add", "add_bias") else None
    rb = _tensor(case, "residual_bias", dparam, pshape) if residual == "add_bias" else None
    dy = _tensor(case, "dy", dout, shape) if direction == "backward" else None

    def h_exact(off, c):
        terms = [x[off]]
        if res is not None:
            terms.append(res[off])
        if rb is not None:
            terms.append(rb[c])
        if not all(_finite(t) for t in terms):
            return float(alpha) * float(terms[0]) + sum(float(t) for t in terms[1:])  # nan/inf
        v = alpha * x[off]
        if res is not None:
            v += res[off]
        if rb is not None:
            v += rb[c]
        return v

    def scale_exact(c):
        return woff + w[c] if w is not None else Fraction(1)

    def entry(dtype, shp):
        n = math.prod(shp)
        return {"dtype": dtype, "shape": list(shp), "values": [None] * n, "f64": [None] * n}

    def put(out, idx, v, dtype):
        out["values"][idx] = round_value(v, dtype)
        out["f64"][idx] = round_value(v, "float64")

    outputs = {}
    rows = []  # per row: (offsets, h list, finite?, s)
    for rbase in row_base:
        offs = [rbase + d for d in col_delta]
        h = [h_exact(o, c) for c, o in enumerate(offs)]
        rows.append((offs, h))

    if direction == "forward":
        y = entry(dout, shape)
        mean_o = entry(dcomp, sshape) if op == "layernorm" else None
        rstd_o = entry(dcomp, sshape)
        rout = entry(dres, shape) if res is not None else None
        for ri, (offs, h) in enumerate(rows):
            if "h" in points:
                h = [to_exact(round_fraction(v, roles[points["h"]])) if _finite(v) else v for v in h]
            if rout is not None:
                # residual_out is the h the computation goes on with: after the h rounding point
                # (fused_add_lowp), so its f64 is then that rounded h
                for o, hv in zip(offs, h):
                    put(rout, o, hv, dres)
            if not all(_finite(v) for v in h):
                has_nan = any(isinstance(v, float) and math.isnan(v) for v in h)
                if has_nan or op == "layernorm":
                    for o in offs:
                        y["values"][o] = y["f64"][o] = NAN
                    rstd_o["values"][ri] = rstd_o["f64"][ri] = NAN
                continue  # everything else in this row: not compared
            if op == "layernorm":
                mean = sum(h, Fraction(0)) / N
                cen = [v - mean for v in h]
                put(mean_o, ri, mean, dcomp)
            else:
                cen = h
            s = sum((v * v for v in cen), Fraction(0)) / N + eps
            if s == 0:
                continue  # 0/0: not compared (generator avoids it)
            r = SqrtSum.inv_sqrt(s)
            put(rstd_o, ri, r, dcomp)
            for c, o in enumerate(offs):
                xhat = r.scale(cen[c])
                if "xhat" in points:
                    xhat = to_exact(round_value(xhat, roles[points["xhat"]]))
                sc = scale_exact(c)
                if "scale" in points:
                    sc = to_exact(round_fraction(sc, roles[points["scale"]]))
                if isinstance(xhat, float) or isinstance(sc, float):
                    continue  # an intermediate rounding overflowed: not compared
                mul = xhat.scale(sc) if isinstance(xhat, SqrtSum) else SqrtSum(xhat * sc)
                if "mul" in points:
                    mul = to_exact(round_value(mul, roles[points["mul"]]))
                    if isinstance(mul, float):
                        yv = mul  # +-inf (+ finite bias) stays +-inf
                        y["values"][o] = round_value(yv, dout)
                        y["f64"][o] = yv
                        continue
                    mul = SqrtSum(mul)
                yv = mul + (b[c] if b is not None else Fraction(0))
                put(y, o, yv, dout)
        outputs["y"] = y
        if mean_o is not None:
            outputs["mean"] = mean_o
        outputs["rstd"] = rstd_o
        if rout is not None:
            outputs["residual_out"] = rout
        return outputs

    # ---------------- backward: exact gradient of the forward (h as stored) ----------------
    dxo = entry(dx_, shape)
    dres_o = entry(dres, shape) if res is not None else None
    dw = [SqrtSum(0) for _ in range(N)] if w is not None else None
    db = [Fraction(0) for _ in range(N)] if b is not None else None
    drb = [SqrtSum(0) for _ in range(N)] if rb is not None else None
    bad_cols = False
    for offs, h in rows:
        # A backward kernel recomputes the statistics from the h the forward stored: under an
        # h rounding point (fused_add_lowp) that is the rounded h. Other points do not apply.
        if "h" in points:
            h = [to_exact(round_fraction(v, roles[points["h"]])) if _finite(v) else v for v in h]
        dyr = [dy[o] for o in offs]
        if not all(_finite(v) for v in h) or not all(_finite(v) for v in dyr):
            bad_cols = True
            continue
        if op == "layernorm":
            mean = sum(h, Fraction(0)) / N
            cen = [v - mean for v in h]
        else:
            cen = h
        s = sum((v * v for v in cen), Fraction(0)) / N + eps
        if s == 0:
            bad_cols = True
            continue
        g = [dyr[c] * scale_exact(c) for c in range(N)]
        mgc = sum((g[c] * cen[c] for c in range(N)), Fraction(0)) / N  # = mean(g*xhat)/r
        mg = sum(g, Fraction(0)) / N if op == "layernorm" else Fraction(0)
        for c, o in enumerate(offs):
            K = g[c] - mg - cen[c] * mgc / s
            dh = SqrtSum.inv_sqrt(s, K)
            put(dxo, o, dh.scale(alpha), dx_)
            if dres_o is not None:
                put(dres_o, o, dh, dres)
            if dw is not None:
                dw[c] = dw[c] + SqrtSum.inv_sqrt(s, dyr[c] * cen[c])
            if db is not None:
                db[c] += dyr[c]
            if drb is not None:
                drb[c] = drb[c] + dh
    outputs["dx"] = dxo
    for name, acc in (("dweight", dw), ("dbias", db), ("dresidual", None), ("dresidual_bias", drb)):
        if name == "dresidual":
            if dres_o is not None:
                outputs["dresidual"] = dres_o
            continue
        if acc is None:
            continue
        e = entry(dparam, pshape)
        if not bad_cols:
            for c in range(N):
                put(e, c, acc[c], dparam)
        outputs[name] = e
    return outputs
