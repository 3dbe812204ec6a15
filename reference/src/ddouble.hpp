// Double-double values with a proved absolute error bound: the reference's fast path.
//
// An Approx (hi, lo, err) stands for an exact real v with |v - (hi + lo)| <= err. The
// operations are the error-free transformations and double-word algorithms of Joldes, Muller
// and Popescu, "Tight and rigorous error bounds for basic building blocks of double-word
// arithmetic" (ACM TOMS 44(2), 2017), with u = 2^-53:
//   AccurateDWPlusDW (their Alg. 6):  relative error <= 3u^2/(1-4u) < 2^-104.4
//   DWTimesDW        (their Alg. 10, with Dekker's product): relative error <= 7u^2 < 2^-103.1
// We charge 2^-103 (sum: relative to |a|+|b|) and 2^-102 (product) per operation, propagate
// the operands' bounds (|ab - a'b'| <= |a|eb + |b|ea + ea eb), and inflate every bound by
// (1 + 2^-45) to cover the rounding of the few double operations that compute the bound.
// The algorithms are exact only without underflow or overflow, so every result's magnitude is
// kept in [2^-900, 2^900] (or exactly zero); outside it the value is marked invalid (err = inf)
// and the element goes to MPFR.
#pragma once

#include <cmath>
#include <limits>

#include "normcheck/reference/dtype.hpp"

namespace normcheck::ref::detail {

struct Approx {
  double hi = 0, lo = 0, err = 0;
  bool valid() const { return err < std::numeric_limits<double>::infinity(); }
  double magnitude() const { return std::fabs(hi) + std::fabs(lo); }
};

inline constexpr double kSafeMin = 0x1p-900;
inline constexpr double kSafeMax = 0x1p900;
inline constexpr double kInflate = 1.0 + 0x1p-45;

inline bool in_safe_range(double v) {
  const double a = std::fabs(v);
  return a == 0.0 || (a >= kSafeMin && a <= kSafeMax);
}

inline Approx invalid() { return {0, 0, std::numeric_limits<double>::infinity()}; }

inline Approx exact_value(double v) {
  if (!in_safe_range(v)) return invalid();
  return {v, 0, 0};
}

inline void two_sum(double a, double b, double& s, double& e) {
  s = a + b;
  const double bb = s - a;
  e = (a - (s - bb)) + (b - bb);
}
inline void fast_two_sum(double a, double b, double& s, double& e) {
  s = a + b;
  e = b - (s - a);
}
// Veltkamp splitting and Dekker's exact product (no FMA needed; exact for |a|,|b| < 2^995 and
// products far from the underflow threshold, which in_safe_range guarantees).
inline void split(double a, double& h, double& l) {
  const double c = 134217729.0 * a;  // 2^27 + 1
  h = c - (c - a);
  l = a - h;
}
inline void two_prod(double a, double b, double& p, double& e) {
  p = a * b;
  double ah, al, bh, bl;
  split(a, ah, al);
  split(b, bh, bl);
  e = ((ah * bh - p) + ah * bl + al * bh) + al * bl;
}

inline Approx add(const Approx& a, const Approx& b) {
  if (!a.valid() || !b.valid()) return invalid();
  double sh, sl, th, tl, vh, vl, zh, zl;
  two_sum(a.hi, b.hi, sh, sl);
  two_sum(a.lo, b.lo, th, tl);
  const double c = sl + th;
  fast_two_sum(sh, c, vh, vl);
  const double w = tl + vl;
  fast_two_sum(vh, w, zh, zl);
  if (!in_safe_range(zh)) return invalid();
  const double err = (a.err + b.err + 0x1p-103 * (a.magnitude() + b.magnitude())) * kInflate;
  return {zh, zl, err};
}

inline Approx mul(const Approx& a, const Approx& b) {
  if (!a.valid() || !b.valid()) return invalid();
  double ch, cl1;
  two_prod(a.hi, b.hi, ch, cl1);
  const double tl = a.hi * b.lo + a.lo * b.hi;
  const double cl2 = cl1 + tl;
  double zh, zl;
  fast_two_sum(ch, cl2, zh, zl);
  if (!in_safe_range(zh) || ((a.hi != 0 && b.hi != 0) && zh == 0)) return invalid();
  const double ma = a.magnitude(), mb = b.magnitude();
  const double err = (ma * b.err + mb * a.err + a.err * b.err + 0x1p-102 * ma * mb) * kInflate;
  return {zh, zl, err};
}

inline Approx neg(const Approx& a) { return {-a.hi, -a.lo, a.err}; }

// Decides the correct rounding of the enclosed value to `t` if the bound allows it.
// Sound because: t = RN_fmt(hi); hi - t is exact (Sterbenz: hi lies within half an ulp of t,
// so t/2 <= hi <= 2t); delta = (hi - t) + lo carries one rounding of relative size 2^-53; the
// enclosed value lies within err + |delta| 2^-52 of t + delta, and if that ball is strictly
// inside (t - gap.below, t + gap.above) every value in it rounds to t.
inline bool decide(const Approx& a, DType fmt, double& out) {
  if (!a.valid()) return false;
  const double t = round_to(a.hi, fmt);
  if (!std::isfinite(t)) return false;
  const double delta = (a.hi - t) + a.lo;
  const double e = a.err + std::fabs(delta) * 0x1p-52 + 0x1p-1070;
  const RoundingGap gap = rounding_gap(t, fmt);
  if (!(delta - e > -gap.below && delta + e < gap.above)) return false;
  out = t;
  return true;
}

}  // namespace normcheck::ref::detail
