// The tolerance model's internals (TOLERANCE.md): the compute dtype's constants, the row model
// and the Model class that derives every allowance of a case. tolerance.cpp holds the plain
// norms' derivation and the entry point, tolerance_blocks.cpp the residual blocks'.
#pragma once

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "normcheck/judge/tolerance.hpp"
#include "normcheck/reference/contract.hpp"
#include "normcheck/reference/outputs.hpp"

namespace normcheck::conf::tol {

using ref::DType;

inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Everything the bounds need about the compute dtype.
struct Compute {
  DType t;
  double u;
  double eta;
  double gam(double k) const {
    const double ku = k * u;
    return ku >= 0.5 ? kInf : ku / (1 - ku);
  }
  // Error of converting v into the compute dtype (0 when it is a value of it).
  double conv(double v, DType from) const {
    if (holds(from)) return 0.0;
    return ref::representable(v, t) || !std::isfinite(v) ? 0.0 : 0.5 * ulp_of(v, t);
  }
  // Whether every value of dtype `from` is a value of the compute dtype (then conv is 0).
  bool holds(DType from) const {
    const auto a = ref::format_of(from), b = ref::format_of(t);
    return a.precision <= b.precision && a.min_exp >= b.min_exp && a.max_exp <= b.max_exp;
  }
};

// Error after a contract rounding point to dtype t of a value v computed with error e: the
// reference rounds the exact v, the candidate rounds its v + e. When v lies farther than e from
// every rounding boundary of t, both land on the same value and the error is gone; otherwise
// they may be neighbours: e plus one ulp. `slack` bounds the error of our binary64 evaluation of
// v, so the boundary test holds for the exact v as well. Nothing changes when e = 0.
inline double through_rounding(double v, double e, double slack, DType t) {
  if (e == 0) return 0;
  const double r = ref::round_to(v, t);
  if (std::isfinite(r) && std::isfinite(v)) {
    const auto gap = ref::rounding_gap(r, t);
    const double dist = std::min(v - (r - gap.below), (r + gap.above) - v);
    if (dist > e + slack) return 0;
  }
  return e + ulp_of(std::fabs(v) + e, t);
}

// Our binary64 value of a quantity against the reference's after a contract rounding point to t
// (section 9.4 compares the two): where our value lies within `slack` of a rounding boundary of
// t, the two may round to neighbours, `slack` plus one ulp of t apart; elsewhere they round alike.
inline double point_slack(double v, double slack, DType t) {
  const double r = ref::round_to(v, t);
  if (!std::isfinite(r) || !std::isfinite(v)) return slack;
  const auto gap = ref::rounding_gap(r, t);
  const double dist = std::min(v - (r - gap.below), (r + gap.above) - v);
  return dist > slack ? 0.0 : slack + ulp_of(std::fabs(v) + slack, t);
}

// Relative error of the binary64 evaluation of a row quantity after k operations: 2^-50 per
// operation is four times the unit roundoff of binary64, a margin for the slack above.
inline double slack_of(double magnitude, double k) { return std::ldexp(k + 4, -50) * magnitude; }

// Final rounding of a value computed with error e to the output dtype t: within e of the exact
// value before rounding, then half an ulp.
inline double final_allowance(double v, double e, DType t) {
  if (!std::isfinite(e)) return kNaN;
  return e + 0.5 * ulp_of(std::fabs(v) + e, t);
}

inline const ref::Tensor* find_input(const ref::Case& c, const char* name) {
  auto it = c.inputs.find(name);
  return it == c.inputs.end() ? nullptr : &it->second;
}

using Points = ref::ResolvedPoints;

// One normalized row: values and error bounds of the intermediates (TOLERANCE.md, section 3).
struct RowModel {
  bool finite = true;
  bool trusted = true;
  // A sum a correct kernel forms (sum of |h|; of squared deviations, or of squares for RMSNorm)
  // may reach the compute dtype's largest finite value: `acc` bounds it (section 5).
  bool overflow = false, overflow_mean = false;  // any of them; sum |h| (the mean's sum)
  double acc = 0;
  double mean = 0, rstd = 0;
  double e_mean = 0, e_rstd_rel = 0, e_q_rel = 0;
  double kappa = 0, max_e_xhat = 0;
  double A = 0;
  std::vector<double> h, e_h_pre, e_h_post, d, xhat, e_xhat;
  // 1 where forming h (alpha x + residual (+ bias), or x converted) may reach the compute dtype's
  // largest finite value: a correct kernel's h, residual_out included, may be infinite there.
  std::vector<std::uint8_t> h_overflow;
  // Section 11: a value the statistics' all-reduce rounds to its dtype may reach that dtype's
  // largest finite value (a float16 all-reduce): any row sum, the mean's sum; `ar_acc` bounds it.
  bool ar_overflow = false, ar_overflow_mean = false;
  double ar_acc = 0;
  // Error of our binary64 x-hat: the mean of n terms errs by ~n 2^-53 A, scaled by rstd, plus
  // a few roundings of x-hat itself.
  double slack_xhat(std::int64_t j) const {
    return slack_of(A * rstd, static_cast<double>(h.size())) + slack_of(std::fabs(xhat[j]), 8);
  }
};

// Exponent of the lowest set bit of a finite non-zero v: v is an integer multiple of 2^lowbit(v).
inline int lowbit_exp(double v) {
  int e = 0;
  const double m = std::frexp(std::fabs(v), &e);  // v = m 2^e, 0.5 <= m < 1
  auto k = static_cast<std::uint64_t>(std::ldexp(m, 53));
  int tz = 0;
  while ((k & 1u) == 0) {
    k >>= 1;
    ++tz;
  }
  return e - 53 + tz;
}

// Section 9: whether every partial sum of the terms t (exact values of the compute dtype), in
// any order and any grouping, is exact in a dtype of `precision` bits whose smallest subnormal is
// 2^q_min: the terms are multiples of a common 2^e with e >= q_min and sum |t| < 2^(precision + e).
// `scale_exp` > 0 also asks it of the terms scaled by 2^-scale_exp (a kernel that divides each term
// by n = 2^scale_exp before summing). Our own binary64 sums of such terms are exact as well.
struct ExactSum {
  bool exact = false;
  int e = 0;  // the common power of two (meaningless when every term is 0)
  double sum = 0, sum_abs = 0;
};
inline ExactSum exact_sum(const std::vector<double>& t, int precision, int q_min, int scale_exp) {
  ExactSum r;
  int e = std::numeric_limits<int>::max();
  for (double v : t) {
    if (!std::isfinite(v)) return r;
    if (v != 0) e = std::min(e, lowbit_exp(v));
    r.sum_abs += std::fabs(v);
  }
  if (e == std::numeric_limits<int>::max()) {  // all zero
    r.exact = true;
    return r;
  }
  r.e = e;
  if (e - scale_exp < q_min || !(r.sum_abs < std::ldexp(1.0, precision + e))) return r;
  for (double v : t) r.sum += v;  // exact: each partial sum is a multiple of 2^e below 2^(53+e)
  r.exact = true;
  return r;
}

class Model {
 public:
  explicit Model(const ref::Case& c, const Reduction& red = {}, const StatsAllReduce& ar = {})
      : c_(c), g_(ref::geometry_of(c)), pts_(ref::resolve_points(c)), red_(red), ar_(ar) {
    const DType ct = c.dtype_compute;
    const auto f = ref::format_of(ct);
    // eta: one full subnormal spacing per rounding (twice the half-spacing a correctly rounded
    // operation can lose), a margin for kernels that flush or round subnormal results twice.
    cp_ = {ct, ref::unit_roundoff(ct), std::ldexp(1.0, f.min_exp - f.precision + 1)};
    x_ = &c.inputs.at("x");
    w_ = c.affine != ref::Affine::none ? find_input(c, "weight") : nullptr;
    b_ = c.affine == ref::Affine::weight_bias ? find_input(c, "bias") : nullptr;
    r_ = c.residual != ref::Residual::none ? find_input(c, "residual") : nullptr;
    rb_ = c.residual == ref::Residual::add_bias ? find_input(c, "residual_bias") : nullptr;
    dy_ = c.direction == ref::Direction::backward ? find_input(c, "dy") : nullptr;
  }

  // The plain norms, forward and backward (tolerance.cpp).
  std::map<std::string, OutputAllowance> derive();

  // Section 7: a block of L layers. Each row (a position) is propagated through the layers as
  // values with error bounds; the FFN's products and the activation add theirs. Backward
  // (section 8) walks the layers in reverse with the saved forward states.
  // tolerance_blocks.cpp.
  std::map<std::string, OutputAllowance> derive_block();

 private:
  static constexpr double kGeluEval = 8;  // TOLERANCE.md, The table

  // Section 9: the declared reduction class. Depth of a sum of n terms: the most roundings any
  // term goes through (Higham, eq. 4.3: the error is <= sum |t_i| gamma(depth_i)).
  double depth(double n) const {
    const double b = std::min(static_cast<double>(std::max<std::int64_t>(red_.block, 1)), n);
    const double groups = std::ceil(n / b);
    double d = n - 1;
    if (red_.kind == ReductionKind::pairwise) d = (b - 1) + std::ceil(std::log2(groups));
    if (red_.kind == ReductionKind::blocked) d = (b - 1) + (groups - 1);
    return std::min(d, n - 1);
  }
  // The relative bound of a sum of n terms followed by `extra` roundings (a division, a square,
  // a subtraction), against the sum of |terms|: section 3's gamma(n + extra) for the classes whose
  // sums are in any order (`any`, `two_pass`, `welford`: exactly today's term), gamma(depth + 1 +
  // extra) for a pairwise or blocked order, and for binary64 accumulation binary64's gamma plus
  // the one rounding of the result into the compute dtype (kBounds.f64_result).
  double sum_gam(double n, double extra) const {
    switch (red_.kind) {
      case ReductionKind::pairwise:
      case ReductionKind::blocked: return cp_.gam(depth(n) + 1 + extra);
      case ReductionKind::accumulate_f64: {
        const double ku = (n + extra) * std::ldexp(1.0, -53);
        return (ku >= 0.5 ? kInf : ku / (1 - ku)) + kBounds.f64_result * cp_.u;
      }
      default: return cp_.gam(n + extra);
    }
  }
  // Section 9.4, the final rounding decided: where the computed value (within e of the exact v)
  // cannot cross a rounding boundary of t, a correct kernel returns round(v) itself, so the
  // allowance is that rounding's own error |round(v) - v| (plus `slack`, our binary64 error of v,
  // and the binary64 rounding of the certified value); elsewhere section 2's e + half an ulp.
  // Only for a declared class: `any` keeps today's allowances exactly.
  double final_out(double v, double e, double slack, DType t) const {
    if (red_.is_any() || !std::isfinite(e) || !std::isfinite(v)) return final_allowance(v, e, t);
    const double r = ref::round_to(v, t);
    if (std::isfinite(r)) {
      const auto gap = ref::rounding_gap(r, t);
      const double dist = std::min(v - (r - gap.below), (r + gap.above) - v);
      // + (n + 8) 2^-50 |v|: a margin on our binary64 row statistics (a sum of n terms) beyond
      // `slack`, and the binary64 rounding of the certified value.
      const double s = slack + std::ldexp(std::fabs(v) * (static_cast<double>(g_.cols) + 8), -50);
      if (dist > e + s) return std::fabs(r - v) + s;
    }
    return final_allowance(v, e, t);
  }
  // Whether the class's statistics are plain sums of the row's terms (no running mean): the
  // exactness of section 9 applies to them.
  bool plain_sums() const { return red_.kind != ReductionKind::any && red_.kind != ReductionKind::welford; }
  // Welford's first-order term (3.3) applies to the classes that allow a running mean.
  double welford_u() const {
    if (red_.kind == ReductionKind::any || red_.kind == ReductionKind::welford) return cp_.u;
    if (red_.kind == ReductionKind::accumulate_f64) return std::ldexp(1.0, -53);
    return 0;
  }

  // Column sums of one parameter tensor: per element, the sum over rows of |term| and of the
  // propagated errors (section 4: allowance = err + gam(R+1) abs + R eta).
  struct ColumnBound {
    std::vector<double> abs, err;
    void resize(std::size_t n) {
      abs.assign(n, 0.0);
      err.assign(n, 0.0);
    }
  };

  // The most ill-conditioned untrusted row seen, and the largest sum that may overflow, for the
  // MISTRUSTED reason.
  struct Worst {
    bool seen = false;
    std::int64_t n = 0;
    double kappa = 0, e_xhat = 0, e_q = 0;
    std::int64_t overflow_sums = 0, overflow_n = 0;
    double overflow_acc = 0;
    std::int64_t ar_sums = 0;  // section 11: row sums whose all-reduce may overflow its dtype
    double ar_acc = 0;
    void see_ar(double acc) {
      ++ar_sums;
      ar_acc = std::max(ar_acc, acc);
    }
    void see_overflow(double acc, std::int64_t terms) {
      ++overflow_sums;
      if (acc > overflow_acc) {
        overflow_acc = acc;
        overflow_n = terms;
      }
    }
    void see(const RowModel& m) {
      if (m.overflow) see_overflow(m.acc, static_cast<std::int64_t>(m.h.size()));
      if (m.ar_overflow) see_ar(m.ar_acc);
      if (m.trusted || ((m.overflow || m.ar_overflow) && m.e_q_rel < kBounds.mistrust && m.max_e_xhat < kBounds.mistrust) ||
          (seen && m.max_e_xhat <= e_xhat && m.e_q_rel <= e_q))
        return;
      seen = true;
      n = static_cast<std::int64_t>(m.h.size());
      kappa = m.kappa;
      e_xhat = m.max_e_xhat;
      e_q = m.e_q_rel;
    }
  };

  std::map<std::string, OutputAllowance> empty_allowances() const {
    std::map<std::string, OutputAllowance> out;
    for (const auto& [name, spec] : output_specs(c_)) {
      std::int64_t numel = 1;
      for (auto d : spec.shape) numel *= d;
      out[name].abs.assign(static_cast<std::size_t>(numel), 0.0);
      out[name].nan_ok.assign(static_cast<std::size_t>(numel), 0);
    }
    return out;
  }

  // Section 4: a column sum over R rows, from its rows' |terms| and propagated errors.
  double column_allowance(const ColumnBound& cb, std::size_t k, std::int64_t R) const {
    const double e = cb.err[k] + sum_gam(static_cast<double>(R), 1) * cb.abs[k] + static_cast<double>(R) * cp_.eta;
    return final_allowance(cb.abs[k], e, c_.dtype_param);
  }

  // Section 5: counts the MISTRUSTED elements of every output and gives them the reason.
  void count_mistrusted(std::map<std::string, OutputAllowance>& out, const Worst& worst, std::int64_t untrusted_rows,
                        std::int64_t R, std::string_view where) const {
    for (auto& [name, a] : out) {
      a.mistrusted = std::count_if(a.abs.begin(), a.abs.end(), [](double v) { return std::isnan(v); });
      if (a.mistrusted == 0) continue;
      if (worst.seen)
        a.reason = fmt::format(
            "{} of {} rows too ill-conditioned for {} compute{}: row length {}, condition {:.3g}, bound on x-hat "
            "error {:.3g} and on the relative variance error {:.3g} (MISTRUSTED at >= {})",
            untrusted_rows, R, ref::name_of(c_.dtype_compute), where, worst.n, worst.kappa, worst.e_xhat, worst.e_q,
            kBounds.mistrust);
      if (worst.overflow_sums > 0)
        a.reason += fmt::format(
            "{}{} sum{}{} may overflow the {} accumulator of a correct kernel: a sum of {} terms whose |terms| add up "
            "to {:.6g}, against the largest finite {} {:.6g}",
            a.reason.empty() ? "" : "; ", worst.overflow_sums, worst.overflow_sums == 1 ? "" : "s", where,
            ref::name_of(c_.dtype_compute), worst.overflow_n, worst.overflow_acc, ref::name_of(c_.dtype_compute),
            ref::max_finite(c_.dtype_compute));
      if (worst.ar_sums > 0)
        a.reason += fmt::format(
            "{}{} row sum{} may overflow the {} all-reduce of a correct implementation over {} tp ranks: partials "
            "whose |terms| add up to {:.6g} (with their errors), against the largest finite {} {:.6g}",
            a.reason.empty() ? "" : "; ", worst.ar_sums, worst.ar_sums == 1 ? "" : "s", ref::name_of(ar_.dtype),
            ar_.ranks, worst.ar_acc, ref::name_of(ar_.dtype), ref::max_finite(ar_.dtype));
    }
  }

  // Section 11: the statistics' all-reduce over tp ranks. Its relative part: gamma(T, u_a + 2 u_c)
  // for a dtype narrower than the compute dtype (each add done in the compute dtype and rounded to
  // the narrow one rounds twice), none for the compute dtype itself (one more summation order);
  // its floor: T s_a (2T - 1 roundings of at most s_a / 2 each with gradual underflow, and the
  // compute adds' own floor), or 2T m_a where the all-reduce flushes (a rounding may lose up to
  // the smallest normal m_a).
  bool ar_on() const { return ar_.active(cp_.t); }
  double ar_rel() const {
    if (ref::unit_roundoff(ar_.dtype) <= cp_.u) return 0;
    const double ku = ar_.ranks * (ref::unit_roundoff(ar_.dtype) + 2 * cp_.u);
    return ku >= 0.5 ? kInf : ku / (1 - ku);
  }
  double ar_floor() const {
    const auto f = ref::format_of(ar_.dtype);
    if (ar_.flush_subnormals) return 2.0 * ar_.ranks * std::ldexp(1.0, f.min_exp);
    return ref::unit_roundoff(ar_.dtype) <= cp_.u ? 0.0 : ar_.ranks * std::ldexp(1.0, f.min_exp - f.precision + 1);
  }
  // The error the all-reduce adds to a row statistic sum / n, given `partials`, a bound on the
  // sum over ranks of |computed partial| (1 + gamma(n + 3) times the sum of |terms| with their
  // errors); (1 + u): the division by n rounds it once more.
  double ar_extra(double partials, double nd) const {
    return (ar_rel() * partials + ar_floor()) / nd * (1 + cp_.u);
  }
  // The bound on every value the all-reduce rounds (each partial and each partial sum), and
  // whether it may reach the dtype's largest finite value.
  double ar_bound(double partials) const { return partials * (1 + ar_rel()) + ar_floor(); }
  bool ar_overflows(double partials) const {
    return std::isfinite(partials) && !(ar_bound(partials) < ref::max_finite(ar_.dtype));
  }

  // Non-finite rows follow IEEE rules exactly in the reference; a correct kernel may differ by
  // one rounding in the finite elements (e.g. +-0 + bias).
  double ieee_allowance(DType t) const { return 0.5 * ulp_of(0, t) + cp_.eta; }

  double value(const ref::Tensor* t, std::int64_t i) const { return t ? t->data[static_cast<std::size_t>(i)] : 0.0; }

  void row_model(std::int64_t row, RowModel& m) const {
    const std::int64_t n = g_.cols;
    const std::int64_t base = g_.row_base[row];
    m.h.resize(n);
    m.e_h_pre.resize(n);
    m.e_h_post.resize(n);
    m.d.resize(n);
    m.xhat.resize(n);
    m.e_xhat.resize(n);
    m.finite = true;
    m.h_overflow.assign(n, 0);
    bool any_h_overflow = false;
    double h_terms = 0;
    // overflows(acc, terms) for the terms of h, its factor taken once per row.
    const double h_factor = overflow_factor(r_ ? 3 : 1), max_compute = ref::max_finite(c_.dtype_compute);
    // 3.1 h and its error (fused residual: up to three roundings, plus conversions).
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t k = base + g_.col_delta[j];
      const double x = x_->data[static_cast<std::size_t>(k)];
      double h = x, e = cp_.conv(x, c_.dtype_x);
      if (r_) {
        const double ax = c_.alpha * x, res = value(r_, k), rb = rb_ ? value(rb_, j) : 0.0;
        h = ax + res + rb;
        const int ops = (c_.alpha != 1 ? 1 : 0) + 1 + (rb_ ? 1 : 0);
        e = std::fabs(c_.alpha) * cp_.conv(x, c_.dtype_x) + cp_.conv(res, c_.dtype_residual) + (rb_ ? cp_.conv(rb, c_.dtype_param) : 0.0) +
            cp_.gam(ops) * (std::fabs(ax) + std::fabs(res) + std::fabs(rb)) + ops * cp_.eta;
      }
      // Section 9.2: a declared class, and h = alpha x + residual (+ bias) exact in any order of
      // its additions (inputs values of the compute dtype, alpha a power of two, every partial
      // sum a value of it): a correct kernel's h is the exact h.
      if (r_ && !red_.is_any() && e > 0) {
        const double ax = c_.alpha * x, res = value(r_, k), rb = rb_ ? value(rb_, j) : 0.0;
        // A sum is tested on its binary64 value only where that value is exact (TwoSum's error 0).
        const auto is = [&](double v) { return std::isfinite(v) && ref::representable(v, cp_.t); };
        const auto sum_is = [&](double a, double b) {
          const double s = a + b, bb = s - a;
          return (a - (s - bb)) + (b - bb) == 0 && is(s);
        };
        int ae = 0;
        const bool pow2_alpha = std::frexp(std::fabs(c_.alpha), &ae) == 0.5 && ax / c_.alpha == x;
        if (pow2_alpha && is(x) && is(ax) && is(res) && is(rb) && sum_is(ax, res) && sum_is(ax, rb) &&
            sum_is(res, rb) && sum_is(ax + res, rb))
          e = 0;
      }
      m.e_h_pre[j] = e;
      // Section 5: the terms of h (or x itself) against the compute dtype's range (found by the
      // property tests: 2 x = -105984 in float16 compute gives residual_out = -inf).
      const double terms = r_ ? std::fabs(c_.alpha * x) + std::fabs(value(r_, k)) + (rb_ ? std::fabs(value(rb_, j)) : 0.0)
                              : std::fabs(x);
      if (std::isfinite(terms) && overflows_by(terms + e, h_factor, max_compute)) {
        m.h_overflow[j] = 1;
        any_h_overflow = true;
        h_terms = std::max(h_terms, terms + e);
      }
      if (pts_.h) {
        e = through_rounding(h, e, slack_of(std::fabs(c_.alpha * x) + std::fabs(value(r_, k)) + (rb_ ? std::fabs(value(rb_, j)) : 0.0), 3), *pts_.h);
        h = ref::round_to(h, *pts_.h);
      }
      if (!std::isfinite(h)) m.finite = false;
      m.h[j] = h;
      m.e_h_post[j] = e;
    }
    if (!m.finite) {
      m.trusted = true;
      return;
    }
    stats(m, m.e_h_post);  // stats reads e_h and writes other fields of m
    if (any_h_overflow) {  // the row's h, and so its statistics, may be infinite in a kernel
      m.overflow = m.overflow_mean = true;
      m.trusted = false;
      m.acc = std::max(m.acc, h_terms);
    }
  }

  // Sections 3.2-3.6 for a row whose values m.h (finite) carry the errors e_h.
  void stats(RowModel& m, const std::vector<double>& e_h) const {
    const auto n = static_cast<std::int64_t>(m.h.size());
    const double nd = static_cast<double>(n);
    const bool ln = c_.op == ref::Op::layernorm;
    m.d.resize(n);
    m.xhat.resize(n);
    m.e_xhat.resize(n);
    double sum = 0, sum_abs = 0, sum_sq = 0, sum_eh = 0, max_eh = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      sum += m.h[j];
      sum_abs += std::fabs(m.h[j]);
      sum_sq += m.h[j] * m.h[j];
      sum_eh += e_h[j];
      max_eh = std::max(max_eh, e_h[j]);
    }
    const double A = sum_abs / nd, mean_sq = sum_sq / nd, mean_eh = sum_eh / nd;
    m.A = A;
    const double mu = ln ? sum / nd : 0.0;
    // 3.2 the mean: any summation order, or Welford's running mean.
    m.mean = mu;
    m.e_mean = ln ? mean_eh + sum_gam(nd, 1) * (A + mean_eh) + nd * cp_.eta : 0.0;
    // Section 9: sums that are exact in any order (the class's sums are plain sums, h is exact).
    const Exactness ex = exactness(m, max_eh);
    if (ex.mean_exact) m.e_mean = 0;
    // Section 11: the sum of h all-reduced over tp ranks in a narrower dtype (or flushing).
    m.ar_overflow = m.ar_overflow_mean = false;
    m.ar_acc = 0;
    if (ar_on() && ln) {
      double s = 0;
      for (std::int64_t j = 0; j < n; ++j) s += std::fabs(m.h[j]) + e_h[j];
      const double partials = (1 + cp_.gam(nd + 3)) * s;
      m.e_mean += ar_extra(partials, nd);
      if (ar_overflows(partials)) {
        m.ar_overflow = m.ar_overflow_mean = true;
        m.ar_acc = ar_bound(partials);
      }
    }
    double var = 0, sum_d_e = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      m.d[j] = m.h[j] - mu;
      var += m.d[j] * m.d[j];
      sum_d_e += std::fabs(m.d[j]) * (e_h[j] + (ln ? mean_eh : 0.0));
    }
    var /= nd;
    // 3.3 the variance (LayerNorm: mean of squared deviations; RMSNorm: mean of squares).
    double e_var;
    if (ln) {
      m.kappa = var > 0 ? std::sqrt(mean_sq / var) : kInf;
      const double shift = max_eh + mean_eh;
      e_var = kBounds.welford * nd * welford_u() * std::sqrt(mean_sq * var) + sum_gam(nd, 2) * var +
              m.e_mean * m.e_mean + 2 * sum_d_e / nd + shift * shift + 2 * m.e_mean * shift + nd * cp_.eta;
    } else {
      m.kappa = 1;
      e_var = sum_gam(nd, 1) * mean_sq + 2 * sum_d_e / nd + max_eh * max_eh + nd * cp_.eta;
    }
    // Section 9: the sum of squares (of deviations, or of h for RMSNorm) is exact; only the
    // division by n (or the product with 1/n) rounds, and not at all when n is a power of two.
    if (ex.squares_exact) e_var = kBounds.exact_round * cp_.u * var + cp_.eta;
    // Section 11: the sum of squared deviations (RMSNorm: of squares) all-reduced as well; each
    // computed square is at most (|d| + e_h + e_mean)^2 (1 + u)^2.
    if (ar_on()) {
      double s = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        const double dj = std::fabs(m.d[j]) + e_h[j] + m.e_mean;
        s += dj * dj;
      }
      const double partials = (1 + cp_.gam(nd + 3)) * s;
      e_var += ar_extra(partials, nd);
      if (ar_overflows(partials)) {
        m.ar_overflow = true;
        m.ar_acc = std::max(m.ar_acc, ar_bound(partials));
      }
    }
    const double q = var + c_.epsilon;
    const double e_q = e_var + cp_.u * q + cp_.conv(c_.epsilon, DType::float64);
    m.e_q_rel = q > 0 ? e_q / q : kInf;
    m.rstd = q > 0 ? 1 / std::sqrt(q) : kInf;
    m.e_rstd_rel = m.e_q_rel >= kBounds.mistrust ? kInf
                                                 : 0.5 * m.e_q_rel / (1 - m.e_q_rel) + kBounds.sqrt_div * cp_.u;
    // 3.4 x-hat = d * rstd, with d carrying the error of h and of the mean.
    m.max_e_xhat = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      // (an exact deviation of section 9 carries no error: its subtraction is exact)
      const double e_d = ex.deviations_exact ? 0.0
                         : e_h[j] + m.e_mean + (ln ? cp_.u * (std::fabs(m.d[j]) + e_h[j] + m.e_mean) : 0.0);
      m.xhat[j] = m.d[j] * m.rstd;
      m.e_xhat[j] = (e_d * m.rstd + std::fabs(m.xhat[j]) * m.e_rstd_rel) * (1 + m.e_rstd_rel) +
                    cp_.u * std::fabs(m.xhat[j]) + cp_.eta;
      if (!std::isfinite(m.rstd)) m.e_xhat[j] = kInf;
      m.max_e_xhat = std::max(m.max_e_xhat, m.e_xhat[j]);
    }
    // Section 5: the sums a correct kernel accumulates in the compute dtype are bounded by sum |h|
    // (the mean) and sum d^2 (the variance: two-pass, or Welford's M2, whose prefixes never exceed
    // it; RMSNorm: sum h^2), each with its propagated errors. Where one may reach the largest
    // finite value, a correct kernel's sum may be infinite (found by the property tests: a
    // float16 DeepNorm block, property_tests/findings/).
    double s1 = 0, s2 = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      s1 += std::fabs(m.h[j]) + e_h[j];
      const double dj = std::fabs(m.d[j]) + e_h[j] + m.e_mean;
      s2 += dj * dj;
    }
    m.acc = std::max(s1, s2);
    m.overflow_mean = overflows(s1, n + 1);
    m.overflow = m.overflow_mean || overflows(s2, n + 2);
    m.trusted = m.e_q_rel < kBounds.mistrust && m.max_e_xhat < kBounds.mistrust && !m.overflow && !m.ar_overflow;
  }

  // Section 9: what the data make exact for a class whose sums are plain sums.
  struct Exactness {
    bool sum_exact = false;         // sum h is exact in any order
    bool mean_exact = false;        // and so is the mean (n a power of two): e_mean = 0
    bool deviations_exact = false;  // LayerNorm: every h - mean is exact
    bool squares_exact = false;     // the sum of squared deviations (RMSNorm: of h) is exact
    bool pow2 = false;              // n is a power of two (nothing is exact otherwise)
  };
  Exactness exactness(const RowModel& m, double max_eh) const {
    Exactness ex;
    if (!plain_sums() || max_eh != 0) return ex;  // h itself carries an error
    const auto f = ref::format_of(cp_.t);
    const int p = f.precision, q_min = f.min_exp - f.precision + 1;
    const auto n = static_cast<std::int64_t>(m.h.size());
    int k = 0;
    // Only n = 2^k: the division by n (or the product with 1/n, or terms scaled by 1/n before
    // they are summed) is then exact, whatever the kernel's form of it.
    ex.pow2 = n > 0 && (n & (n - 1)) == 0;
    if (!ex.pow2) return ex;
    while ((std::int64_t{1} << k) < n) ++k;
    const int scale = k;
    const bool ln = c_.op == ref::Op::layernorm;
    if (ln) {
      const ExactSum s = exact_sum(m.h, p, q_min, scale);
      ex.sum_exact = s.exact;
      // The mean sum / n (or sum * (1/n), or a sum of h / n) is exact: n = 2^k and the scaled
      // terms are multiples of a representable 2^(e-k) (exact_sum checked e - k >= q_min).
      ex.mean_exact = s.exact;
      if (!ex.mean_exact) return ex;
      // Deviations h - mean: multiples of 2^min(e, lowbit(mean)); each representable when below
      // 2^(p + that), so a correct subtraction is exact.
      const double mu = s.sum / static_cast<double>(n);
      int ed = s.e;
      if (mu != 0) ed = std::min(ed, lowbit_exp(mu));
      double max_d = 0;
      for (double h : m.h) max_d = std::max(max_d, std::fabs(h - mu));
      if (max_d == 0) {  // a constant row: every deviation is 0, and so is every square
        ex.deviations_exact = ex.squares_exact = true;
        return ex;
      }
      if (ed < q_min || !(max_d < std::ldexp(1.0, p + ed))) return ex;
      ex.deviations_exact = true;
      // Squares: representable when (max |d| / 2^ed)^2 < 2^p; then the sum of squares by exact_sum.
      const double kmax = std::ldexp(max_d, -ed);
      if (!(kmax * kmax < std::ldexp(1.0, p))) return ex;
      std::vector<double> sq(m.h.size());
      for (std::size_t j = 0; j < sq.size(); ++j) sq[j] = (m.h[j] - mu) * (m.h[j] - mu);
      ex.squares_exact = exact_sum(sq, p, q_min, scale).exact;
      return ex;
    }
    // RMSNorm: the sum of squares of h.
    double max_h = 0;
    int e = std::numeric_limits<int>::max();
    for (double h : m.h) {
      max_h = std::max(max_h, std::fabs(h));
      if (h != 0) e = std::min(e, lowbit_exp(h));
    }
    if (max_h == 0) {
      ex.squares_exact = true;
      return ex;
    }
    const double kmax = std::ldexp(max_h, -e);
    if (!(kmax * kmax < std::ldexp(1.0, p))) return ex;
    std::vector<double> sq(m.h.size());
    for (std::size_t j = 0; j < sq.size(); ++j) sq[j] = m.h[j] * m.h[j];
    ex.squares_exact = exact_sum(sq, p, q_min, scale).exact;
    return ex;
  }

  // Whether a sum of `terms` terms whose |terms| (with their errors) add up to `acc` may reach
  // the compute dtype's largest finite value in a correct kernel (each partial sum within
  // gamma(terms) of its exact value).
  bool overflows(double acc, std::int64_t terms) const {
    return overflows_by(acc, overflow_factor(terms), ref::max_finite(c_.dtype_compute));
  }
  // Where gamma is unbounded (terms u >= 1/2, float16 rows of 1022 and more) the row is
  // untrusted by the first rule already (its mean and variance bounds are infinite); only a sum
  // whose value itself reaches the limit is called an overflow there.
  double overflow_factor(std::int64_t terms) const {
    const double g = cp_.gam(static_cast<double>(terms));
    return std::isfinite(g) ? 1 + g : 1.0;
  }
  // overflows() with its factor and the largest finite value given (taken once for many sums).
  static bool overflows_by(double acc, double factor, double max_finite) {
    // A non-finite bound comes from an infinite error bound upstream: that row is untrusted by
    // the first rule already, and nothing is known about its sums.
    if (acc == 0 || !std::isfinite(acc)) return false;
    return !(acc * factor < max_finite);
  }
  // overflows(), and when it holds, the sum noted in `worst` for the MISTRUSTED reason.
  bool may_overflow(double acc, std::int64_t terms, Worst& worst) const {
    if (!overflows(acc, terms)) return false;
    worst.see_overflow(acc, terms);
    return true;
  }

  // Section 4 for one row: the upstream gradient dy (errors e_dy) through the norm whose row
  // model is m and whose scale is scale (errors e_scale; nullptr: no weight): dh and its
  // errors, and the row's terms of dweight (sum dy x-hat) and dbias (sum dy).
  // Section 5 for it: returns true, and tells `worst`, when a sum or product of the row's
  // backward (g = dy scale, sum g, sum g x-hat, K = g - gbar - x-hat m2) may overflow the compute
  // dtype in a correct kernel: its dx is then MISTRUSTED.
  bool norm_back(const RowModel& m, const double* scale, const double* e_scale, const std::vector<double>& dy,
                 const std::vector<double>& e_dy, std::vector<double>& dh, std::vector<double>& e_dh, ColumnBound* dw,
                 ColumnBound* db, std::size_t col0, Worst& worst) const {
    bool overflow = false;
    const auto see = [&](double acc, std::int64_t terms) { overflow = may_overflow(acc, terms, worst) || overflow; };
    const auto n = static_cast<std::int64_t>(dy.size());
    const double nd = static_cast<double>(n);
    const bool ln = c_.op == ref::Op::layernorm;
    std::vector<double> gv(n), e_g(n);
    double s_g = 0, s_abs_g = 0, s_eg = 0, s_gx = 0, s_abs_gx = 0, s_e_gx = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      const double sc = scale ? scale[j] : 1.0, e_sc = scale ? e_scale[j] : 0.0;
      gv[j] = dy[j] * sc;
      e_g[j] = std::fabs(dy[j]) * e_sc + e_dy[j] * std::fabs(sc) + (scale ? cp_.u * std::fabs(gv[j]) : 0.0);
      s_g += gv[j];
      s_abs_g += std::fabs(gv[j]);
      s_eg += e_g[j];
      s_gx += gv[j] * m.xhat[j];
      s_abs_gx += std::fabs(gv[j] * m.xhat[j]);
      s_e_gx += std::fabs(gv[j]) * m.e_xhat[j] + std::fabs(m.xhat[j]) * e_g[j] + e_g[j] * m.e_xhat[j];
      see(std::fabs(gv[j]) + e_g[j], 1);
      const std::size_t c = col0 + static_cast<std::size_t>(j);
      if (dw) {
        dw->abs[c] += std::fabs(dy[j] * m.xhat[j]);
        dw->err[c] += std::fabs(dy[j]) * m.e_xhat[j] + e_dy[j] * (std::fabs(m.xhat[j]) + m.e_xhat[j]) +
                      cp_.u * std::fabs(dy[j] * m.xhat[j]);
      }
      if (db) {
        db->abs[c] += std::fabs(dy[j]);
        db->err[c] += e_dy[j];
      }
    }
    if (ln) see(s_abs_g + s_eg, n);
    see(s_abs_gx + s_e_gx, n);
    const double gbar = ln ? s_g / nd : 0.0;
    double e_gbar = ln ? s_eg / nd + sum_gam(nd, 1) * s_abs_g / nd + nd * cp_.eta : 0.0;
    const double m2 = s_gx / nd;
    double e_m2 = s_e_gx / nd + sum_gam(nd, 2) * s_abs_gx / nd + nd * cp_.eta;
    // Section 11: the backward's row sums all-reduced over tp ranks too.
    if (ar_on()) {
      const double pg = (1 + cp_.gam(nd + 3)) * (s_abs_g + s_eg), pgx = (1 + cp_.gam(nd + 3)) * (s_abs_gx + s_e_gx);
      const auto see_ar = [&](double partials) {
        if (!ar_overflows(partials)) return;
        overflow = true;
        worst.see_ar(ar_bound(partials));
      };
      if (ln) {
        e_gbar += ar_extra(pg, nd);
        see_ar(pg);
      }
      e_m2 += ar_extra(pgx, nd);
      see_ar(pgx);
    }
    dh.resize(n);
    e_dh.resize(n);
    for (std::int64_t j = 0; j < n; ++j) {
      const double xh = m.xhat[j], e_xh = m.e_xhat[j];
      const double K = gv[j] - gbar - xh * m2;
      const double e_K = e_g[j] + e_gbar + std::fabs(xh) * e_m2 + e_xh * std::fabs(m2) + e_xh * e_m2 +
                         cp_.gam(3) * (std::fabs(gv[j]) + std::fabs(gbar) + std::fabs(xh * m2));
      see(std::fabs(gv[j]) + std::fabs(gbar) + std::fabs(xh * m2) + e_K, 3);
      dh[j] = m.rstd * K;
      e_dh[j] = m.rstd * e_K * (1 + m.e_rstd_rel) + std::fabs(dh[j]) * m.e_rstd_rel + cp_.u * std::fabs(dh[j]);
    }
    return overflow;
  }

  // Section 4: the backward pass of one row, and its contributions to the column sums. Returns
  // false when a sum of it may overflow the compute dtype (its dx MISTRUSTED, section 5).
  bool backward_row(std::int64_t row, const RowModel& m, const std::vector<double>& scale,
                    const std::vector<double>& e_scale, std::map<std::string, OutputAllowance>& out, ColumnBound& dw,
                    ColumnBound& db, ColumnBound& drb, std::vector<std::uint8_t>& col_nonfinite, Worst& worst) const {
    const std::int64_t n = g_.cols;
    const std::int64_t base = g_.row_base[row];
    auto& dx = out.at("dx");
    auto* dres = r_ ? &out.at("dresidual") : nullptr;
    bool finite = m.finite;
    for (std::int64_t j = 0; j < n && finite; ++j)
      finite = std::isfinite(value(dy_, base + g_.col_delta[j]));
    if (!finite) {
      for (std::int64_t j = 0; j < n; ++j) {
        const std::size_t k = static_cast<std::size_t>(base + g_.col_delta[j]);
        dx.abs[k] = ieee_allowance(c_.dtype_x);
        dx.nan_ok[k] = 1;
        if (dres) {
          dres->abs[k] = ieee_allowance(c_.dtype_residual);
          dres->nan_ok[k] = 1;
        }
        col_nonfinite[j] = 1;
      }
      return true;
    }
    std::vector<double> dy(n), e_dy(n), dh, e_dh;
    for (std::int64_t j = 0; j < n; ++j) {
      dy[j] = value(dy_, base + g_.col_delta[j]);
      e_dy[j] = cp_.conv(dy[j], c_.dtype_out);
    }
    const bool overflow = norm_back(m, w_ ? scale.data() : nullptr, e_scale.data(), dy, e_dy, dh, e_dh, &dw, &db, 0, worst);
    for (std::int64_t j = 0; j < n; ++j) {
      const std::size_t k = static_cast<std::size_t>(base + g_.col_delta[j]);
      if (!m.trusted || overflow) {
        dx.abs[k] = kNaN;
        if (dres) dres->abs[k] = kNaN;
        continue;
      }
      const double dxv = c_.alpha * dh[j];
      const double e_dx = std::fabs(c_.alpha) * e_dh[j] + (c_.alpha != 1 ? cp_.u * std::fabs(dxv) : 0.0);
      dx.abs[k] = final_allowance(dxv, e_dx, c_.dtype_x);
      if (dres) dres->abs[k] = final_allowance(dh[j], e_dh[j], c_.dtype_residual);
      drb.abs[j] += std::fabs(dh[j]);
      drb.err[j] += e_dh[j];
    }
    return !overflow;
  }

  const ref::Case& c_;
  ref::Geometry g_;
  Points pts_;
  Reduction red_;
  StatsAllReduce ar_;
  Compute cp_{};
  const ref::Tensor *x_ = nullptr, *w_ = nullptr, *b_ = nullptr, *r_ = nullptr, *rb_ = nullptr, *dy_ = nullptr;
};

}  // namespace normcheck::conf::tol
