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

Residual blocks (`"block"`: post / pre / sandwich / deepnorm, with an FFN and erf/exp) do not
have that form: they are evaluated in exact rationals where possible and otherwise in rigorous
mpmath balls (midpoint, radius) at 640 bits, and at 1280 / 2560 bits while an intermediate
layer rounding is undecided; see "Residual blocks" below.

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
    if case.get("block", "none") != "none":
        return evaluate_block(case)
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


# ----------------------------------------------------------------------------------------------
# Residual blocks (post / pre / sandwich / deepnorm): exact rationals where possible, rigorous
# mpmath balls elsewhere
# ----------------------------------------------------------------------------------------------
#
# A block value involves erf, exp and 1/sqrt of sums of irrational terms, so the SqrtSum form
# above no longer applies.  Every quantity of a layer is held either as an exact `Fraction`
# (inputs, and everything computed from rationals only: sums, products, relu, gelu(0) = 0,
# gelu'(0) = 1/2, 1/sqrt of a perfect square, products with an exact 0) or as a `Ball`
# (mid, rad): an mpmath midpoint at the working precision and a radius that bounds, rigorously,
# |exact - mid|.  Radii propagate first-order terms plus the second-order product term, every
# rounding of a midpoint (2^(2-p) |mid|, 2^(10-p) |mid| for erf and exp) and a factor 1 + 2^-20
# for the roundings of the radius computation itself; erf is Lipschitz with 2/sqrt(pi) < 1.13,
# exp on [m - r, m + r] with exp(m) (e^r - 1) <= 2 r exp(m) (r <= 1/2), 1/sqrt on [lo, hi] with
# lo^(-3/2)/2.  A value is rounded when both ends of its ball (exact rationals) round alike; an
# exact Fraction is rounded exactly (ties included).  The same rule decides each intermediate
# layer output (rounded to dtype_x); when one is undecided the whole case is recomputed at twice
# the precision (640, 1280, 2560 bits), and after that it is not compared (BLOCK_SKIPPED).
# Output elements left undecided at 640 bits are retried at the higher precisions as well.

BLOCKS = ("post", "pre", "sandwich", "deepnorm")
_BLOCK_PRECS = (640, 1280, 2560)
BLOCK_SKIPPED = [0]  # block cases not compared: an intermediate rounding stayed undecided


class _Undecided(Exception):
    """An intermediate decision (layer rounding, sign for relu', q > 0) is open at this prec."""


class _NotCompared(Exception):
    """The case leaves the domain the reference evaluates (non-finite values, q == 0)."""


class Ball:
    """Rigorous enclosure [m - r, m + r] (mpmath mpf midpoint and radius)."""

    __slots__ = ("m", "r")

    def __init__(self, m, r):
        self.m = m
        self.r = r

    def bounds(self):
        """Exact rational ends of the ball."""
        m, r = mpf_to_fraction(self.m), mpf_to_fraction(self.r)
        return m - r, m + r


class _BallCtx:
    """Per-precision constants (set by evaluate_block for each working precision)."""
    prec = 0
    U = K = ZERO = U_FN = None
    C_SQRT1_2 = C_INV_SQRT_2PI = None


_B = _BallCtx()


def _ball_setup(prec: int):
    _B.prec = prec
    _B.U = mpmath.mpf(2) ** (2 - prec)      # bound on one rounding of a midpoint, relative
    _B.U_FN = mpmath.mpf(2) ** (10 - prec)  # the same for erf / exp / 1/sqrt (generous)
    _B.K = 1 + mpmath.mpf(2) ** -20         # covers the roundings of radius computations
    _B.ZERO = mpmath.mpf(0)
    c = 1 / mpmath.sqrt(2)
    _B.C_SQRT1_2 = Ball(c, abs(c) * _B.U_FN)
    c = 1 / mpmath.sqrt(2 * mpmath.pi)
    _B.C_INV_SQRT_2PI = Ball(c, abs(c) * _B.U_FN)


def _as_ball(v) -> Ball:
    if isinstance(v, Ball):
        return v
    n, d = v.numerator, v.denominator
    m = mpmath.mpf(n) / d
    if d & (d - 1) == 0 and abs(n).bit_length() <= _B.prec:
        return Ball(m, _B.ZERO)  # dyadic that fits: exact
    return Ball(m, abs(m) * _B.U)


def b_add(a, b):
    if isinstance(a, Fraction):
        if isinstance(b, Fraction):
            return a + b
        if a == 0:
            return b
    elif isinstance(b, Fraction) and b == 0:
        return a
    a, b = _as_ball(a), _as_ball(b)
    m = a.m + b.m
    return Ball(m, (a.r + b.r) * _B.K + abs(m) * _B.U)


def b_neg(a):
    return -a if isinstance(a, Fraction) else Ball(-a.m, a.r)


def b_sub(a, b):
    return b_add(a, b_neg(b))


def b_mul(a, b):
    if isinstance(a, Fraction):
        if isinstance(b, Fraction):
            return a * b
        if a == 0:
            return Fraction(0)
    elif isinstance(b, Fraction) and b == 0:
        return Fraction(0)
    a, b = _as_ball(a), _as_ball(b)
    m = a.m * b.m
    r = abs(a.m) * b.r + abs(b.m) * a.r + a.r * b.r
    return Ball(m, r * _B.K + abs(m) * _B.U)


def b_sum(vals):
    """Sum; the exact (Fraction) terms are added exactly first."""
    q = Fraction(0)
    balls = []
    for v in vals:
        if isinstance(v, Fraction):
            q += v
        else:
            balls.append(v)
    if not balls:
        return q
    m = mpmath.fsum([b.m for b in balls])
    r = mpmath.fsum([b.r for b in balls])
    acc = Ball(m, r * _B.K + abs(m) * _B.U)
    return b_add(acc, q)


def b_dot(ws, vs):
    return b_sum([b_mul(w, v) for w, v in zip(ws, vs)])


def b_sign(a) -> int:
    """Sign of the exact value; raises _Undecided when the ball contains 0 (and is not 0)."""
    if isinstance(a, Fraction):
        return (a > 0) - (a < 0)
    if a.m > a.r:  # exact mpf comparisons
        return 1
    if -a.m > a.r:
        return -1
    raise _Undecided("sign")


def b_inv_sqrt(q):
    """1/sqrt(q), q > 0."""
    if isinstance(q, Fraction):
        if q <= 0:
            raise _NotCompared("q <= 0 in a norm")
        r = _exact_inv_sqrt(q)
        if r is not None:
            return r
        q = _as_ball(q)
    lo = (q.m - q.r) * (1 - _B.U)
    if not lo > 0:
        raise _Undecided("q")
    m = 1 / mpmath.sqrt(q.m)
    r = q.r / (2 * lo * mpmath.sqrt(lo))
    return Ball(m, r * _B.K * _B.K + abs(m) * _B.U_FN)


def b_erf(a):
    if isinstance(a, Fraction) and a == 0:
        return Fraction(0)
    a = _as_ball(a)
    m = mpmath.erf(a.m)
    return Ball(m, a.r * mpmath.mpf(1.13) * _B.K + abs(m) * _B.U_FN)


def b_exp(a):
    if isinstance(a, Fraction) and a == 0:
        return Fraction(1)
    a = _as_ball(a)
    if a.r > 0.5:
        raise _Undecided("exp of a wide ball")
    m = mpmath.exp(a.m)
    return Ball(m, 2 * a.r * m * _B.K + abs(m) * _B.U_FN)


def act_value(name: str, a):
    if name == "relu":
        if isinstance(a, Fraction):
            return a if a > 0 else Fraction(0)
        if a.m > a.r:
            return a
        if -a.m > a.r:
            return Fraction(0)
        hi = (a.m + a.r) * _B.K  # the exact value is in [0, hi]
        return Ball(hi / 2, hi / 2 * _B.K)
    # gelu(u) = u/2 (1 + erf(u/sqrt 2))
    if isinstance(a, Fraction) and a == 0:
        return Fraction(0)
    e = b_erf(b_mul(a, _B.C_SQRT1_2))
    return b_mul(b_mul(a, Fraction(1, 2)), b_add(Fraction(1), e))


def act_deriv(name: str, a):
    if name == "relu":  # relu'(0) = 0
        if isinstance(a, Fraction):
            return Fraction(1) if a > 0 else Fraction(0)
        if a.m > a.r:
            return Fraction(1)
        if -a.m > a.r:
            return Fraction(0)
        return Ball(mpmath.mpf(0.5), mpmath.mpf(0.5))  # either 0 or 1: enclose both
    # gelu'(u) = Phi(u) + u phi(u)
    if isinstance(a, Fraction) and a == 0:
        return Fraction(1, 2)
    Phi = b_mul(Fraction(1, 2), b_add(Fraction(1), b_erf(b_mul(a, _B.C_SQRT1_2))))
    phi = b_mul(_B.C_INV_SQRT_2PI, b_exp(b_mul(Fraction(-1, 2), b_mul(a, a))))
    return b_add(Phi, b_mul(a, phi))


def round_block_value(v, dtype: str):
    """Decided rounding of a Fraction or Ball; None when the ball straddles a boundary."""
    if isinstance(v, Fraction):
        return round_fraction(v, dtype)
    lo, hi = v.bounds()
    t_lo, t_hi = round_fraction(lo, dtype), round_fraction(hi, dtype)
    return t_hi if t_lo == t_hi else None  # +0 == -0 deliberately


class _BlockCase:
    """Parsed inputs of a block case (exact Fractions), independent of the precision."""

    def __init__(self, case: dict):
        self.block = case["block"]
        if self.block not in BLOCKS:
            raise ValueError(f"unknown block {self.block!r}")
        self.op = case["op"]
        assert self.op in ("layernorm", "rmsnorm")
        if case.get("axes") is not None or case.get("axis", -1) != -1:
            raise ValueError("blocks normalize axis -1 only")
        if case.get("residual", "none") != "none":
            raise ValueError("blocks require residual none")
        if case.get("contract", "exact") != "exact":
            raise ValueError("blocks require contract exact")
        self.act = case.get("activation", "gelu")
        if self.act not in ("gelu", "relu"):
            raise ValueError(f"unknown activation {self.act!r}")
        self.dx = case.get("dtype_x", "float32")
        self.dparam = case.get("dtype_param", "float32")
        self.dout = case.get("dtype_out", "float32")
        self.eps = parse_in(case.get("epsilon", 1e-5), "float64")
        self.alpha = parse_in(case.get("alpha", 1.0), "float64")
        if self.block != "deepnorm" and self.alpha != 1:
            raise ValueError("alpha must be 1 outside deepnorm")
        self.woff = parse_in(case.get("weight_offset", 0.0), "float64")
        self.affine = case.get("affine", "weight_bias")
        self.direction = case.get("direction", "forward")
        ins = case["inputs"]
        self.shape = list(ins["x"]["shape"])
        D = self.D = self.shape[-1]
        self.rows = math.prod(self.shape[:-1])
        w1s = list(ins["ffn_w1"]["shape"])
        if len(w1s) != 3 or w1s[2] != D:
            raise ValueError("ffn_w1 must be [L, D_ff, D]")
        L, F = self.L, self.F = w1s[0], w1s[1]
        if int(case.get("layers", L)) != L or L < 1:
            raise ValueError("layers does not match ffn_w1")
        self.K = 2 if self.block == "sandwich" else 1
        p = self.dparam
        self.x = _tensor(case, "x", self.dx, self.shape)
        self.w1 = _tensor(case, "ffn_w1", p, [L, F, D])
        self.b1 = _tensor(case, "ffn_b1", p, [L, F])
        self.w2 = _tensor(case, "ffn_w2", p, [L, D, F])
        self.b2 = _tensor(case, "ffn_b2", p, [L, D])
        has_w = self.affine in ("weight", "weight_bias")
        self.w = _tensor(case, "weight", p, [L, self.K, D]) if has_w else None
        self.b = _tensor(case, "bias", p, [L, self.K, D]) if self.affine == "weight_bias" else None
        self.dy = _tensor(case, "dy", self.dout, self.shape) if self.direction == "backward" \
            else None
        self.finite = all(_finite(v) for t in (self.x, self.w1, self.b1, self.w2, self.b2,
                                               self.w or [], self.b or [], self.dy or [])
                          for v in t) and _finite(self.eps) and _finite(self.alpha)

    def scale(self, l, k):
        D = self.D
        if self.w is None:
            return [Fraction(1)] * D
        return [self.woff + v for v in self.w[(l * self.K + k) * D:(l * self.K + k + 1) * D]]

    def shift(self, l, k):
        D = self.D
        if self.b is None:
            return None
        return self.b[(l * self.K + k) * D:(l * self.K + k + 1) * D]


def _norm_fwd(bc, l, k, h):
    """Plain norm of one row h (Fractions / Balls) with weight[l][k], bias[l][k]."""
    D = len(h)
    if bc.op == "layernorm":
        if D == 1:
            cen = [Fraction(0)]  # h - mean(h) is exactly 0
        else:
            mean = b_mul(b_sum(h), Fraction(1, D))
            cen = [b_sub(v, mean) for v in h]
    else:
        cen = list(h)
    q = b_add(b_mul(b_sum([b_mul(c, c) for c in cen]), Fraction(1, D)), bc.eps)
    rstd = b_inv_sqrt(q)
    xhat = [b_mul(c, rstd) for c in cen]
    sc, sh = bc.scale(l, k), bc.shift(l, k)
    y = [b_mul(xh, s) for xh, s in zip(xhat, sc)]
    if sh is not None:
        y = [b_add(v, s) for v, s in zip(y, sh)]
    return y, (cen, q, rstd, xhat)


def _norm_bwd(bc, l, k, cache, dyn, grads):
    """dh of one norm row; accumulates dweight[l][k], dbias[l][k]."""
    cen, q, rstd, xhat = cache
    D = len(cen)
    sc = bc.scale(l, k)
    base = (l * bc.K + k) * D
    if grads.get("dweight") is not None:
        for c in range(D):
            grads["dweight"][base + c].append(b_mul(dyn[c], xhat[c]))
    if grads.get("dbias") is not None:
        for c in range(D):
            grads["dbias"][base + c].append(dyn[c])
    if bc.op == "layernorm" and D == 1:
        return [Fraction(0)]  # y does not depend on h
    g = [b_mul(d, s) for d, s in zip(dyn, sc)]
    invq = Fraction(1) / q if isinstance(q, Fraction) else b_mul(rstd, rstd)
    mgc = b_mul(b_dot(g, cen), Fraction(1, D))  # mean(g*cen)
    t = b_mul(mgc, invq)
    mg = b_mul(b_sum(g), Fraction(1, D)) if bc.op == "layernorm" else Fraction(0)
    return [b_mul(rstd, b_sub(b_sub(g[c], mg), b_mul(cen[c], t))) for c in range(D)]


def _ffn_fwd(bc, l, v):
    D, F = bc.D, bc.F
    a = []
    for j in range(F):
        row = bc.w1[(l * F + j) * D:(l * F + j + 1) * D]
        a.append(b_add(b_dot(row, v), bc.b1[l * F + j]))
    z = [act_value(bc.act, aj) for aj in a]
    f = []
    for i in range(D):
        row = bc.w2[(l * D + i) * F:(l * D + i + 1) * F]
        f.append(b_add(b_dot(row, z), bc.b2[l * D + i]))
    return f, (v, a, z)


def _ffn_bwd(bc, l, cache, df, grads):
    v, a, z = cache
    D, F = bc.D, bc.F
    for i in range(D):
        grads["dffn_b2"][l * D + i].append(df[i])
        for j in range(F):
            grads["dffn_w2"][(l * D + i) * F + j].append(b_mul(df[i], z[j]))
    da = []
    for j in range(F):
        dz = b_dot([bc.w2[(l * D + i) * F + j] for i in range(D)], df)
        da.append(b_mul(dz, act_deriv(bc.act, a[j])) if not (isinstance(dz, Fraction) and dz == 0)
                  else Fraction(0))
    for j in range(F):
        grads["dffn_b1"][l * F + j].append(da[j])
        for k in range(D):
            grads["dffn_w1"][(l * F + j) * D + k].append(b_mul(da[j], v[k]))
    return [b_dot([bc.w1[(l * F + j) * D + k] for j in range(F)], da) for k in range(D)]


def _layer_fwd(bc, l, u):
    blk = bc.block
    if blk == "post":
        f, fc = _ffn_fwd(bc, l, u)
        out, nc = _norm_fwd(bc, l, 0, [b_add(a, b) for a, b in zip(u, f)])
        return out, (fc, nc)
    if blk == "deepnorm":
        f, fc = _ffn_fwd(bc, l, u)
        out, nc = _norm_fwd(bc, l, 0, [b_add(b_mul(bc.alpha, a), b) for a, b in zip(u, f)])
        return out, (fc, nc)
    if blk == "pre":
        v, nc = _norm_fwd(bc, l, 0, u)
        f, fc = _ffn_fwd(bc, l, v)
        return [b_add(a, b) for a, b in zip(u, f)], (fc, nc)
    # sandwich
    v, nc0 = _norm_fwd(bc, l, 0, u)
    f, fc = _ffn_fwd(bc, l, v)
    w, nc1 = _norm_fwd(bc, l, 1, f)
    return [b_add(a, b) for a, b in zip(u, w)], (fc, nc0, nc1)


def _layer_bwd(bc, l, cache, dout, grads):
    blk = bc.block
    if blk in ("post", "deepnorm"):
        fc, nc = cache
        dh = _norm_bwd(bc, l, 0, nc, dout, grads)
        dv = _ffn_bwd(bc, l, fc, dh, grads)
        c = bc.alpha if blk == "deepnorm" else Fraction(1)
        return [b_add(b_mul(c, a), b) for a, b in zip(dh, dv)]
    if blk == "pre":
        fc, nc = cache
        dv = _ffn_bwd(bc, l, fc, dout, grads)
        return [b_add(a, b) for a, b in zip(dout, _norm_bwd(bc, l, 0, nc, dv, grads))]
    fc, nc0, nc1 = cache
    df = _norm_bwd(bc, l, 1, nc1, dout, grads)
    dv = _ffn_bwd(bc, l, fc, df, grads)
    return [b_add(a, b) for a, b in zip(dout, _norm_bwd(bc, l, 0, nc0, dv, grads))]


def block_exact(bc: _BlockCase, prec: int, round_between=True):
    """Exact values (Fractions / Balls at `prec`) of every output of a block case.

    Returns {name: list of values} in row-major order; raises _Undecided when an intermediate
    rounding (or a sign it needs) is not decided at this precision.  With round_between=False
    the intermediate roundings to dtype_x are skipped (used by the self-tests only).
    """
    _ball_setup(prec)
    D, L = bc.D, bc.L
    y = []
    dx = []
    grads = None
    if bc.direction == "backward":
        grads = {"dffn_w1": [[] for _ in range(L * bc.F * D)],
                 "dffn_b1": [[] for _ in range(L * bc.F)],
                 "dffn_w2": [[] for _ in range(L * D * bc.F)],
                 "dffn_b2": [[] for _ in range(L * D)],
                 "dweight": [[] for _ in range(L * bc.K * D)] if bc.w is not None else None,
                 "dbias": [[] for _ in range(L * bc.K * D)] if bc.b is not None else None}
    for r in range(bc.rows):
        u = bc.x[r * D:(r + 1) * D]
        caches = []
        for l in range(L):
            out, cache = _layer_fwd(bc, l, u)
            caches.append(cache)
            if l < L - 1:
                if round_between:
                    nxt = []
                    for v in out:
                        t = round_block_value(v, bc.dx)
                        if t is None:
                            raise _Undecided("intermediate layer rounding")
                        if not math.isfinite(t):
                            raise _NotCompared("intermediate layer output overflows dtype_x")
                        nxt.append(Fraction(t))
                    u = nxt
                else:
                    u = out
            else:
                y.extend(out)
        if grads is not None:
            d = bc.dy[r * D:(r + 1) * D]
            for l in range(L - 1, -1, -1):
                d = _layer_bwd(bc, l, caches[l], d, grads)
            dx.extend(d)
    if grads is None:
        return {"y": y}
    res = {"dx": dx}
    for name in ("dweight", "dbias", "dffn_w1", "dffn_b1", "dffn_w2", "dffn_b2"):
        if grads[name] is not None:
            res[name] = [b_sum(terms) for terms in grads[name]]
    return res


def evaluate_block(case: dict) -> dict:
    bc = _BlockCase(case)
    D, L, F, K = bc.D, bc.L, bc.F, bc.K
    if bc.direction == "forward":
        spec = {"y": (bc.dout, bc.shape)}
    else:
        spec = {"dx": (bc.dx, bc.shape)}
        if bc.w is not None:
            spec["dweight"] = (bc.dparam, [L, K, D])
        if bc.b is not None:
            spec["dbias"] = (bc.dparam, [L, K, D])
        spec.update({"dffn_w1": (bc.dparam, [L, F, D]), "dffn_b1": (bc.dparam, [L, F]),
                     "dffn_w2": (bc.dparam, [L, D, F]), "dffn_b2": (bc.dparam, [L, D])})
    outputs = {n: {"dtype": dt, "shape": list(s), "values": [None] * math.prod(s),
                   "f64": [None] * math.prod(s)} for n, (dt, s) in spec.items()}
    if not bc.finite:
        return outputs  # not evaluated for blocks: nothing compared
    open_ = {n: set(range(len(o["values"]))) for n, o in outputs.items()}
    skipped = False
    for prec in _BLOCK_PRECS:
        try:
            with mpmath.workprec(prec):
                vals = block_exact(bc, prec)
        except _NotCompared:
            skipped = True
            break
        except _Undecided:
            if prec == _BLOCK_PRECS[-1]:
                skipped = True
            continue
        for n, o in outputs.items():
            for i in list(open_[n]):
                v = vals[n][i]
                a, b = round_block_value(v, o["dtype"]), round_block_value(v, "float64")
                if a is not None and b is not None:
                    o["values"][i], o["f64"][i] = a, b
                    open_[n].discard(i)
        if not any(open_.values()):
            break
    if skipped:
        BLOCK_SKIPPED[0] += 1
        for o in outputs.values():
            o["values"] = [None] * len(o["values"])
            o["f64"] = [None] * len(o["f64"])
        return outputs
    UNDECIDED[0] += sum(len(s) for s in open_.values())
    return outputs
