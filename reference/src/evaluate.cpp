// The certified reference. See ../README.md ("How a value is certified") for the argument.
#include "normcheck/reference/evaluate.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>

#include "blocks.hpp"
#include "quant_eval.hpp"
#include "ddouble.hpp"
#include "exact.hpp"
#include "row_kernel.hpp"
#include "normcheck/reference/contract.hpp"
#include "normcheck/reference/outputs.hpp"

namespace normcheck::ref {
namespace {

using detail::Approx;
using detail::Enclosure;
using detail::Rational;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

using Points = ResolvedPoints;

// Output buffers handed back by the caller of evaluate_into(), for the outputs of this case:
// each request takes the spare of least capacity that holds it (else the largest, which then
// grows), so that a generator evaluating case after case into one Result neither allocates nor
// zero-fills. Stale contents do not matter: every path of the evaluation writes every element
// (the test Forward.ReusedBuffersGiveTheSameResults poisons them to check).
class BufferPool {
 public:
  void give(Result& r) {
    for (auto& [name, o] : r.outputs) {
      (void)name;
      f64_.push_back(std::move(o.value.data));
      f64_.push_back(std::move(o.f64));
      u8_.push_back(std::move(o.certified));
    }
    r.outputs.clear();
  }
  std::vector<double> f64(std::size_t n) { return take(f64_, n); }
  std::vector<std::uint8_t> u8(std::size_t n) { return take(u8_, n); }

 private:
  template <typename T>
  static std::vector<T> take(std::vector<std::vector<T>>& spares, std::size_t n) {
    if (spares.empty()) return {};
    std::size_t best = 0;
    for (std::size_t i = 1; i < spares.size(); ++i) {
      const std::size_t c = spares[i].capacity(), b = spares[best].capacity();
      const bool fits = c >= n, best_fits = b >= n;
      if (fits != best_fits ? fits : (fits ? c < b : c > b)) best = i;
    }
    std::vector<T> v = std::move(spares[best]);
    spares[best] = std::move(spares.back());
    spares.pop_back();
    return v;
  }
  std::vector<std::vector<double>> f64_;
  std::vector<std::vector<std::uint8_t>> u8_;
};

// fill = false: the buffers hold at most n elements (the caller grows them as it writes).
Output make_output(BufferPool& pool, DType t, const std::vector<std::int64_t>& shape, bool fill = true) {
  Output o;
  o.value.dtype = t;
  o.value.shape = shape;
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  const auto size = static_cast<std::size_t>(n);
  o.value.data = pool.f64(size);
  o.f64 = pool.f64(size);
  o.certified = pool.u8(size);
  // Every element is written by every path of the evaluation; the value-initialisation of
  // elements a reused buffer lacks is only there to make them defined.
  if (fill) {
    o.value.data.resize(size);
    o.f64.resize(size);
    o.certified.resize(size);
  } else {
    o.value.data.resize(std::min(o.value.data.size(), size));
    o.f64.resize(std::min(o.f64.size(), size));
    o.certified.resize(std::min(o.certified.size(), size));
  }
  return o;
}

void set_exact(Output& o, std::int64_t i, const Rational& q) {
  o.value.data[i] = detail::round_rational(q, o.value.dtype);
  o.f64[i] = detail::round_rational(q, DType::float64);
  o.certified[i] = 1;
}

void set_ieee(Output& o, std::int64_t i, double v) {  // v exact (a non-finite or exactly known value)
  o.value.data[i] = round_to(v, o.value.dtype);
  o.f64[i] = v;
  o.certified[i] = 1;
}

bool is_perfect_square(const Rational& q) {
  return mpq_sgn(q.backend().data()) >= 0 && mpz_perfect_square_p(mpq_numref(q.backend().data())) &&
         mpz_perfect_square_p(mpq_denref(q.backend().data()));
}

Rational rational_rstd(const Rational& q) {  // q a perfect square of a rational, q > 0
  Rational r;
  mpz_sqrt(mpq_numref(r.backend().data()), mpq_denref(q.backend().data()));
  mpz_sqrt(mpq_denref(r.backend().data()), mpq_numref(q.backend().data()));
  mpq_canonicalize(r.backend().data());
  return r;
}

// h = alpha*x + residual (+ residual_bias) as a binary64 when that is exact.
std::optional<double> exact_h_double(double alpha, double x, double r, double rb) {
  double p, e;
  detail::two_prod(alpha, x, p, e);
  if (!std::isfinite(p) || e != 0 || !detail::in_safe_range(p)) return std::nullopt;
  double s = p, t;
  detail::two_sum(s, r, s, t);
  if (!std::isfinite(s) || t != 0) return std::nullopt;
  detail::two_sum(s, rb, s, t);
  if (!std::isfinite(s) || t != 0) return std::nullopt;
  return s;
}

// Everything known about one row. Fast rows (every h a binary64 in the fast domain) keep
// their exact sums as integers and get mean/q as rationals only when an element needs them.
struct Row {
  bool has_nan = false;
  bool has_inf = false;
  bool all_double = true;            // every h exactly a binary64 in the fast domain
  std::span<const double> h;         // binary64 h (IEEE value where non-finite): into x or h_store
  std::vector<double> h_store;
  std::vector<char> wide;            // 1 where h is not a binary64 in the fast domain
  detail::RowScan scan;              // exponent range of h (fast rows)
  std::vector<Rational> hq;          // all h as rationals, when !all_double
  // Exact sums (fast rows): sum h = zs * 2^es, sum h^2 = zq * 2^eq.
  detail::Integer zs, zq;
  long es = 0, eq = 0;
  bool exact_ready = false;
  Rational mu;                       // LayerNorm mean (0 for RMSNorm)
  Rational q;                        // var + eps  (or mean square + eps)
  bool q_zero = false;
  bool r_rational = false;
  Rational r;                        // rstd when rational
  Approx mu_a, r_a;                  // fast-path approximations (may be invalid)
  // Cached rstd enclosure at the last precision asked for.
  int encl_bits = 0;
  std::optional<Enclosure> r_encl;

  Rational h_exact(std::int64_t c) const { return all_double ? detail::exact(h[c]) : hq[c]; }

  const Enclosure& rstd(int bits) {
    if (encl_bits != bits) {
      r_encl.emplace(bits);
      detail::enclose_rstd(*r_encl, q);
      encl_bits = bits;
    }
    return *r_encl;
  }
};

class Evaluator {
 public:
  Evaluator(const Case& c, const Options& opt, bool x_by_rows)
      : c_(c), opt_(opt), g_(geometry_of(c)), pts_(resolve_points(c)), specs_(output_specs(c)) {
    const auto get = [&](const char* name) -> const Tensor* {
      auto it = c.inputs.find(name);
      return it == c.inputs.end() ? nullptr : &it->second;
    };
    x_ = get("x");
    w_ = c.affine != Affine::none ? get("weight") : nullptr;
    b_ = c.affine == Affine::weight_bias ? get("bias") : nullptr;
    res_ = c.residual != Residual::none ? get("residual") : nullptr;
    rb_ = c.residual == Residual::add_bias ? get("residual_bias") : nullptr;
    dy_ = c.direction == Direction::backward ? get("dy") : nullptr;
    n_ = Rational(g_.cols);
    eps_ = detail::exact(c.epsilon);
    alpha_ = detail::exact(c.alpha);
    simple_h_ = !res_ && c.alpha == 1.0 && !pts_.h;
    x_by_rows_ = x_by_rows;
    if (x_by_rows_ && !simple_h_) throw std::logic_error("x checked by rows needs h = x");
    contiguous_ = true;  // row r is the block [r*cols, (r+1)*cols) of x
    for (std::int64_t col = 0; col < g_.cols; ++col) contiguous_ &= g_.col_delta[col] == col;
    for (std::int64_t row = 0; row < g_.rows; ++row) contiguous_ &= g_.row_base[row] == row * g_.cols;
  }

  // Evaluates into res, reusing the buffers of the outputs it holds.
  void run(Result& res) {
    pool_.give(res);
    res.stats = Stats{};
    if (c_.direction == Direction::forward) forward(res);
    else backward(res);
    for (const auto& [name, o] : res.outputs) {
      (void)name;
      res.stats.elements += static_cast<std::int64_t>(o.certified.size());
      res.stats.uncertified += detail::count_zero_bytes(o.certified);
    }
    res.stats.fast = fast_;
    res.stats.slow = slow_;
    res.stats.max_bits_used = max_bits_used_;
  }

 private:
  std::int64_t off(std::int64_t row, std::int64_t col) const { return g_.row_base[row] + g_.col_delta[col]; }

  // An output of the case allocated as output_specs says; one the case does not have (mean of
  // an RMSNorm, residual_out without a residual) is empty and never emitted.
  // The output's buffers come from the pool (reused across cases: ref::evaluate_into).
  Output output_of(const char* name, bool fill = true) {
    const auto it = specs_.find(name);
    if (it == specs_.end()) return make_output(pool_, DType::float32, {0});
    return make_output(pool_, it->second.dtype, it->second.shape, fill);
  }
  // Adds `o` to the result if the case has that output (output_specs).
  void emit(Result& res, const char* name, Output&& o) const {
    if (specs_.count(name)) res.outputs.emplace(name, std::move(o));
  }

  // Builds h for a row (after the contract's h rounding) and its exact statistics.
  Row make_row(std::int64_t row) {
    Row r;
    const auto n = g_.cols;
    // h is kept as binary64 where that is exact and inside the fast domain [2^-480, 2^480]
    // (so h*h splits exactly into two doubles); otherwise as a rational.
    r.wide.assign(n, 0);
    if (simple_h_) {  // h = x: the row is used in place when contiguous; only its domain is checked
      if (contiguous_) {
        r.h = std::span<const double>(x_->data.data() + g_.row_base[row], static_cast<std::size_t>(n));
      } else {
        r.h_store.resize(n);
        for (std::int64_t col = 0; col < n; ++col) r.h_store[col] = x_->data[off(row, col)];
        r.h = r.h_store;
      }
      r.scan = detail::scan_row(r.h.data(), n);
      if (x_by_rows_) check_x_row(r, row);
      const bool special = r.scan.special();
      const bool out_of_domain = !special && !r.scan.in_fast_domain();
      if (special)
        for (const double h : r.h) {
          r.has_nan |= std::isnan(h);
          r.has_inf |= std::isinf(h);
        }
      if (out_of_domain) {
        r.all_double = false;
        r.hq.resize(n);
        for (std::int64_t col = 0; col < n; ++col)
          if (std::isfinite(r.h[col])) r.hq[col] = detail::exact(r.h[col]);
      }
      finish_row(r);
      return r;
    }
    r.h_store.resize(n);
    r.h = r.h_store;
    std::vector<std::optional<Rational>> wide(n);
    bool any_wide = false;
    for (std::int64_t col = 0; col < n; ++col) {
      const auto i = off(row, col);
      const double x = x_->data[i];
      const double rv = res_ ? res_->data[i] : 0.0;
      const double rbv = rb_ ? rb_->data[col] : 0.0;
      if (!std::isfinite(x) || !std::isfinite(rv) || !std::isfinite(rbv)) {
        const double h = c_.alpha * x + rv + rbv;  // IEEE propagation of the non-finite input
        r.h_store[col] = h;
        r.has_nan |= std::isnan(h);
        r.has_inf |= std::isinf(h);
        continue;
      }
      double hv;
      if (auto hd = exact_h_double(c_.alpha, x, rv, rbv)) {
        hv = pts_.h ? round_to(*hd, *pts_.h) : *hd;
      } else {
        Rational hq = alpha_ * detail::exact(x) + detail::exact(rv) + detail::exact(rbv);
        if (!pts_.h) {
          r.h_store[col] = kNaN;  // placeholder: the value is in hq
          r.wide[col] = 1;
          wide[col] = std::move(hq);
          any_wide = true;
          continue;
        }
        hv = detail::round_rational(hq, *pts_.h);  // may overflow to inf, as the kernel's would
      }
      r.h_store[col] = hv;
      if (std::isinf(hv)) {
        r.has_inf = true;
      } else if (hv != 0 && (std::fabs(hv) < 0x1p-480 || std::fabs(hv) > 0x1p480)) {
        wide[col] = detail::exact(hv);
        any_wide = true;
      }
    }
    if (any_wide) {  // non-finite entries keep their IEEE value in h and a placeholder here
      r.all_double = false;
      r.hq.resize(n);
      for (std::int64_t col = 0; col < n; ++col)
        if (wide[col]) r.hq[col] = *wide[col];
        else if (std::isfinite(r.h[col])) r.hq[col] = detail::exact(r.h[col]);
    }
    finish_row(r);
    return r;
  }

  void finish_row(Row& r) {
    if (r.has_nan || r.has_inf) return;  // statistics are not used
    if (!r.all_double) {
      Rational sum, sumsq;
      for (const auto& h : r.hq) {
        sum += h;
        sumsq += h * h;
      }
      set_exact_stats(r, sum, sumsq);
      r.mu_a = r.r_a = detail::invalid();
      return;
    }
    // Exact sums in integer bins; h*h splits exactly into two binary64 values here.
    if (!simple_h_) r.scan = detail::scan_row(r.h.data(), g_.cols);
    detail::row_sums(r.h.data(), g_.cols, r.scan, c_.op == Op::layernorm, sum_, sumsq_, r.zs.backend().data(), r.es,
                     r.zq.backend().data(), r.eq);
    // The double-double mean and rstd (and the q = 0 test that comes with them), for the
    // forward pass and the backward fast path; without the fast path backward works with the
    // exact rationals (ensure_exact) only.
    if (c_.direction == Direction::forward || opt_.fast_path) approximate_stats(r);
    else r.mu_a = r.r_a = detail::invalid();
  }

  void set_exact_stats(Row& r, const Rational& sum, const Rational& sumsq) {
    if (c_.op == Op::layernorm) {
      r.mu = sum / n_;
      r.q = sumsq / n_ - r.mu * r.mu + eps_;
    } else {
      r.q = sumsq / n_ + eps_;
    }
    r.q_zero = mpq_sgn(r.q.backend().data()) == 0;
    if (!r.q_zero && is_perfect_square(r.q)) {
      r.r_rational = true;
      r.r = rational_rstd(r.q);
    }
    r.exact_ready = true;
  }

  static Rational dyadic(const detail::Integer& z, long e) {
    Rational v;
    mpq_set_z(v.backend().data(), z.backend().data());
    if (e >= 0) mpq_mul_2exp(v.backend().data(), v.backend().data(), static_cast<mp_bitcnt_t>(e));
    else mpq_div_2exp(v.backend().data(), v.backend().data(), static_cast<mp_bitcnt_t>(-e));
    return v;
  }

  // The exact mean and q of a fast row, on demand.
  void ensure_exact(Row& r) {
    if (r.exact_ready) return;
    set_exact_stats(r, dyadic(r.zs, r.es), dyadic(r.zq, r.eq));
  }

  // mean and rstd of a fast row to 2^-104 relative, from the exact sums with a few MPFR
  // operations: q = (N*sumsq - sum^2)/N^2 + eps is formed exactly up to one division and one
  // addition at 256 bits (no cancellation is left: both terms are >= 0).
  void approximate_stats(Row& r) {
    const long n = static_cast<long>(g_.cols);
    // The MPFR and GMP temporaries live as long as the evaluator (a row of a few elements
    // otherwise spends most of its time allocating them).
    StatScratch& s = scratch_;
    detail::Real &num = s.num, &t = s.t, &qv = s.qv, &rv = s.rv;
    // numerator N*zq*2^eq - zs^2*2^(2es), formed exactly at a common exponent.
    detail::Integer &a = s.a, &b = s.b;
    long e_common = 0;
    if (c_.op == Op::layernorm) {
      const long e2 = 2 * r.es;
      e_common = std::min(r.eq, e2);
      mpz_mul_si(a.backend().data(), r.zq.backend().data(), n);
      mpz_mul_2exp(a.backend().data(), a.backend().data(), static_cast<mp_bitcnt_t>(r.eq - e_common));
      mpz_mul(b.backend().data(), r.zs.backend().data(), r.zs.backend().data());
      mpz_mul_2exp(b.backend().data(), b.backend().data(), static_cast<mp_bitcnt_t>(e2 - e_common));
      mpz_sub(a.backend().data(), a.backend().data(), b.backend().data());
    } else {
      mpz_set(a.backend().data(), r.zq.backend().data());
      e_common = r.eq;
    }
    const auto bits = std::max<mp_bitcnt_t>(64, mpz_sizeinbase(a.backend().data(), 2) + 1);
    mpfr_set_prec(num.get(), static_cast<mpfr_prec_t>(bits));
    mpfr_set_z_2exp(num.get(), a.backend().data(), e_common, MPFR_RNDN);  // exact
    const long denom = c_.op == Op::layernorm ? n * n : n;
    mpfr_div_si(qv.get(), num.get(), denom, MPFR_RNDN);
    mpfr_add_d(qv.get(), qv.get(), c_.epsilon, MPFR_RNDN);
    r.q_zero = mpfr_zero_p(qv.get());
    if (r.q_zero || mpfr_sgn(qv.get()) < 0) {
      ensure_exact(r);
      r.mu_a = r.r_a = detail::invalid();
      return;
    }
    mpfr_rec_sqrt(rv.get(), qv.get(), MPFR_RNDN);
    r.r_a = split(rv.get(), s.rest);
    if (c_.op == Op::layernorm) {
      mpfr_set_prec(t.get(), 256);
      mpfr_set_z_2exp(t.get(), r.zs.backend().data(), r.es, MPFR_RNDN);
      mpfr_div_si(t.get(), t.get(), n, MPFR_RNDN);
      r.mu_a = split(t.get(), s.rest);
    } else {
      r.mu_a = Approx{};
    }
  }

  // hi + lo from a value known to 2^-190 relative: |exact - (hi + lo)| <= 2^-104 |hi|.
  // `rest` is scratch space.
  static Approx split(mpfr_srcptr v, detail::Real& rest) {
    if (mpfr_zero_p(v)) return Approx{};
    const double hi = mpfr_get_d(v, MPFR_RNDN);
    mpfr_set_prec(rest.get(), mpfr_get_prec(v));
    mpfr_sub_d(rest.get(), v, hi, MPFR_RNDN);
    const double lo = mpfr_get_d(rest.get(), MPFR_RNDN);
    if (!std::isfinite(hi) || !detail::in_safe_range(hi)) return detail::invalid();
    return {hi, lo, 0x1p-104 * std::fabs(hi)};
  }

  // Every value of a float32 row of x must be a float32 value (validate() left this out). A
  // row of finite values with at most 24 significant bits and exponents in [-126, 127] is;
  // any other row is checked element by element, with validate()'s error.
  void check_x_row(const Row& r, std::int64_t row) const {
    const detail::RowScan& s = r.scan;
    const bool all_zero = s.emin == 0x7ff && s.emax == 0;
    if (!s.special() && s.narrow_bits && (all_zero || (s.emin >= 1023 - 126 && s.emax <= 1023 + 127))) return;
    for (std::int64_t col = 0; col < g_.cols; ++col)
      if (!representable(r.h[col], DType::float32))
        throw CaseError("inputs/x", "element " + std::to_string(off(row, col)) + " = " + hex_text(r.h[col]) +
                                        " is not a float32 value");
  }

  Rational scale_exact(std::int64_t col) const {
    Rational s = detail::exact(c_.weight_offset) + detail::exact(w_->data[col]);
    if (pts_.scale) s = detail::exact(detail::round_rational(s, *pts_.scale));
    return s;
  }

  // ---- forward ---------------------------------------------------------------------------
  void forward(Result& res) {
    const bool ln = c_.op == Op::layernorm;
    Output y = output_of("y", !contiguous_);
    Output mean = output_of("mean");
    Output rstd = output_of("rstd");
    // Only allocated when there is a residual: 17 bytes an element otherwise wasted.
    Output rout = output_of("residual_out");

    // Scale and bias per column: exact scale as double-double when possible.
    std::vector<Approx> scale_a(g_.cols);
    std::vector<char> param_nonfinite(g_.cols, 0);
    for (std::int64_t col = 0; col < g_.cols; ++col) {
      if (!w_) continue;
      const double w = w_->data[col];
      const double b = b_ ? b_->data[col] : 0.0;
      if (!std::isfinite(w) || !std::isfinite(b)) {
        param_nonfinite[col] = 1;
        continue;
      }
      double s, e;
      detail::two_sum(c_.weight_offset, w, s, e);
      Approx a{s, e, 0};
      if (pts_.scale) {
        double v;
        if (detail::decide(a, *pts_.scale, v)) a = {v, 0, 0};
        else a = detail::exact_value(detail::round_rational(scale_exact(col), DType::float64));
      }
      scale_a[col] = detail::in_safe_range(a.hi) ? a : detail::invalid();
    }
    std::vector<double> s_hi(g_.cols, kNaN), s_lo(g_.cols, 0.0), bias(g_.cols, 0.0);
    for (std::int64_t col = 0; col < g_.cols; ++col) {
      if (w_ && !param_nonfinite[col] && scale_a[col].valid()) {
        s_hi[col] = scale_a[col].hi;
        s_lo[col] = scale_a[col].lo;
      }
      if (b_) bias[col] = b_->data[col];
    }
    // Every scale a binary64 (weight_offset 0, or 1 + a weight that adds exactly): the kernel
    // leaves out the s_lo terms, which are all 0.
    const bool scale_is_double = std::all_of(s_lo.begin(), s_lo.end(), [](double v) { return v == 0.0; });
    const bool kernel_contract = !pts_.xhat && !pts_.mul;
    std::vector<double> ky(g_.cols), ky64(g_.cols);
    std::vector<std::uint8_t> kdecided(g_.cols);

    // Contiguous rows: y's buffers grow row by row (capacity reserved), so each row a fresh
    // buffer lacks is zero-filled just before it is written, while its cache lines are still
    // in cache, rather than all 17 bytes an element up front and again when written
    // (reference/README.md). A reused buffer that holds the row already is not touched.
    if (contiguous_) {
      y.value.data.reserve(static_cast<std::size_t>(g_.rows * g_.cols));
      y.f64.reserve(static_cast<std::size_t>(g_.rows * g_.cols));
      y.certified.reserve(static_cast<std::size_t>(g_.rows * g_.cols));
    }
    for (std::int64_t row = 0; row < g_.rows; ++row) {
      if (contiguous_) {
        const auto end = static_cast<std::size_t>((row + 1) * g_.cols);
        if (y.value.data.size() < end) y.value.data.resize(end);
        if (y.f64.size() < end) y.f64.resize(end);
        if (y.certified.size() < end) y.certified.resize(end);
      }
      Row r = make_row(row);
      // residual_out: h rounded to the residual dtype (h itself if the contract rounded it).
      if (res_)
        for (std::int64_t col = 0; col < g_.cols; ++col) {
          const auto i = off(row, col);
          if (r.wide[col]) set_exact(rout, i, r.hq[col]);
          else set_ieee(rout, i, r.h[col]);
        }

      if (r.has_nan || (r.has_inf && ln)) {
        // IEEE: the mean is the sum of the infinities (NaN if mixed), everything else NaN.
        if (ln) {
          double m = 0;
          // A wide element (h not a binary64: placeholder NaN in r.h, value in r.hq) is finite.
          for (std::int64_t col = 0; col < g_.cols; ++col)
            if (!r.wide[col] && !std::isfinite(r.h[col])) m += r.h[col];
          set_ieee(mean, row, r.has_nan ? kNaN : m);
        }
        set_ieee(rstd, row, kNaN);
        for (std::int64_t col = 0; col < g_.cols; ++col) set_ieee(y, off(row, col), kNaN);
        continue;
      }
      if (r.has_inf) {  // RMSNorm: rstd = 1/sqrt(inf) = 0, finite h give signed zeros
        set_ieee(rstd, row, 0.0);
        for (std::int64_t col = 0; col < g_.cols; ++col) {
          // NaN for the infinite ones; a wide element is finite (its sign from r.hq).
          const double xhat = r.wide[col] ? (r.hq[col] < 0 ? -0.0 : 0.0) : r.h[col] * 0.0;
          double v = xhat;
          if (w_) v = v * (c_.weight_offset + w_->data[col]);
          if (b_) v = v + b_->data[col];
          set_ieee(y, off(row, col), v);
        }
        continue;
      }
      if (r.q_zero) {  // eps = 0 and a constant (or all-zero) row: rstd = inf, y = 0 * inf = NaN
        ensure_exact(r);
        if (ln) set_exact(mean, row, r.mu);
        set_ieee(rstd, row, kInf);
        for (std::int64_t col = 0; col < g_.cols; ++col) set_ieee(y, off(row, col), kNaN);
        continue;
      }
      if (ln && !fast_stat(mean, row, r.mu_a)) {
        ensure_exact(r);
        set_exact(mean, row, r.mu);
      }
      if (!fast_stat(rstd, row, r.r_a)) {
        ensure_exact(r);
        if (r.r_rational) set_exact(rstd, row, r.r);
        else ziv_rstd(rstd, row, r);
      }

      const bool kernel = opt_.fast_path && kernel_contract && r.all_double && r.r_a.valid() && r.mu_a.valid();
      if (kernel) {
        detail::RowKernelArgs k;
        k.n = g_.cols;
        k.h = r.h.data();
        k.mu_hi = r.mu_a.hi;
        k.mu_lo = r.mu_a.lo;
        k.r_hi = r.r_a.hi;
        k.r_lo = r.r_a.lo;
        k.s_hi = w_ ? s_hi.data() : nullptr;
        k.s_lo = w_ && !scale_is_double ? s_lo.data() : nullptr;
        k.b = b_ ? bias.data() : nullptr;
        k.out = detail::FastFormat(c_.dtype_out);
        // Contiguous rows (the normalized dims are the trailing ones): write in place.
        const std::int64_t base = g_.row_base[row];
        k.y = contiguous_ ? y.value.data.data() + base : ky.data();
        k.y64 = contiguous_ ? y.f64.data() + base : ky64.data();
        k.decided = contiguous_ ? y.certified.data() + base : kdecided.data();
        const std::int64_t open = detail::run_row_kernel(k);
        fast_ += g_.cols - open;
        if (contiguous_ && open == 0) continue;
      }
      for (std::int64_t col = 0; col < g_.cols; ++col) {
        const auto i = off(row, col);
        if (kernel && (contiguous_ ? y.certified[i] : kdecided[col])) {
          if (!contiguous_) {
            y.value.data[i] = ky[col];
            y.f64[i] = ky64[col];
            y.certified[i] = 1;
          }
          continue;
        }
        if (w_ && param_nonfinite[col]) {
          nonfinite_param_element(y, i, r, col);
          continue;
        }
        if (opt_.fast_path && fast_element(y, i, r, col, scale_a[col])) continue;  // counted in fast_
        ++slow_;
        slow_element(y, i, r, col);
      }
    }
    emit(res, "y", std::move(y));
    emit(res, "mean", std::move(mean));
    emit(res, "rstd", std::move(rstd));
    emit(res, "residual_out", std::move(rout));
  }

  // mean or rstd of a row decided from its double-double approximation, when the bound allows.
  bool fast_stat(Output& o, std::int64_t row, const Approx& a) const {
    double v, v64;
    if (!opt_.fast_path || !a.valid() || !detail::decide(a, o.value.dtype, v) || !detail::decide(a, DType::float64, v64))
      return false;
    o.value.data[row] = v;
    o.f64[row] = v64;
    o.certified[row] = 1;
    return true;
  }

  void ziv_rstd(Output& o, std::int64_t i, Row& r) {
    for (int bits = opt_.start_bits;; bits *= 2) {
      max_bits_used_ = std::max(max_bits_used_, bits);
      if (store_enclosure(o, i, r.rstd(bits), bits * 2 > opt_.max_bits)) return;
    }
  }

  bool fast_element(Output& y, std::int64_t i, const Row& r, std::int64_t col, const Approx& scale) {
    if (!r.all_double || !r.r_a.valid()) return false;
    Approx d = detail::exact_value(r.h[col]);
    if (c_.op == Op::layernorm) d = detail::add(d, detail::neg(r.mu_a));
    Approx v = detail::mul(d, r.r_a);
    double t;
    if (pts_.xhat) {
      if (!detail::decide(v, *pts_.xhat, t)) return false;
      v = detail::exact_value(t);
    }
    if (w_) {
      v = detail::mul(v, scale);
      if (pts_.mul) {
        if (!detail::decide(v, *pts_.mul, t)) return false;
        v = detail::exact_value(t);
      }
    }
    if (b_) v = detail::add(v, detail::exact_value(b_->data[col]));
    return decide_into(y, i, v);
  }

  // Exact rationals when rstd is rational; otherwise MPFR enclosures, precision doubled until
  // every rounding on the way is decided (Ziv).
  void slow_element(Output& y, std::int64_t i, Row& r, std::int64_t col) {
    ensure_exact(r);
    Rational d = r.h_exact(col);
    if (c_.op == Op::layernorm) d -= r.mu;
    if (r.r_rational) {
      Rational v = d * r.r;
      if (pts_.xhat) v = detail::exact(detail::round_rational(v, *pts_.xhat));
      if (w_) {
        v *= scale_exact(col);
        if (pts_.mul) v = detail::exact(detail::round_rational(v, *pts_.mul));
      }
      if (b_) v += detail::exact(b_->data[col]);
      set_exact(y, i, v);
      return;
    }
    for (int bits = opt_.start_bits;; bits *= 2) {
      max_bits_used_ = std::max(max_bits_used_, bits);
      const bool last = bits * 2 > opt_.max_bits;
      Enclosure v(bits), t(bits);
      detail::enclose(t, d);
      detail::mul(v, t, r.rstd(bits));
      double rounded;
      bool open = false;
      if (pts_.xhat) {
        if (detail::decide(v, *pts_.xhat, rounded)) detail::enclose(v, rounded);
        else open = true;
      }
      if (w_ && !open) {
        detail::enclose(t, scale_exact(col));
        Enclosure m(bits);
        detail::mul(m, v, t);
        std::swap(v, m);
        if (pts_.mul) {
          if (detail::decide(v, *pts_.mul, rounded)) detail::enclose(v, rounded);
          else open = true;
        }
      }
      if (b_ && !open) {
        detail::enclose(t, b_->data[col]);
        Enclosure s(bits);
        detail::add(s, v, t);
        std::swap(v, s);
      }
      double out = 0, out64 = 0;
      const bool ok = !open && detail::decide(v, y.value.dtype, out) && detail::decide(v, DType::float64, out64);
      if (ok || last) {
        y.value.data[i] = ok ? out : detail::round_real(v.lo.get(), y.value.dtype);
        y.f64[i] = ok ? out64 : detail::round_real(v.lo.get(), DType::float64);
        y.certified[i] = ok;
        return;
      }
    }
  }

  // A non-finite weight or bias: the result is non-finite whatever xhat's magnitude, so IEEE
  // arithmetic on any value with xhat's sign (and zero-ness) gives it exactly.
  void nonfinite_param_element(Output& y, std::int64_t i, Row& r, std::int64_t col) {
    ensure_exact(r);
    Rational d = r.h_exact(col);
    if (c_.op == Op::layernorm) d -= r.mu;
    const int sign = mpq_sgn(d.backend().data());
    double v = sign == 0 ? 0.0 : (sign > 0 ? 1.0 : -1.0);
    v = v * (c_.weight_offset + w_->data[col]);
    if (b_) v = v + b_->data[col];
    set_ieee(y, i, v);
  }

  // ---- backward --------------------------------------------------------------------------
  // With g = dy*scale and d = h - mean (h for RMSNorm), the exact gradient is
  //   dh_i = rstd * K_i,   K_i = g_i - mean(g) - d_i * mean(g*d) / q    (LayerNorm)
  //                        K_i = g_i - d_i * mean(g*d) / q              (RMSNorm)
  // since xhat*mean(g*xhat) = d * rstd^2 * mean(g*d) and rstd^2 = 1/q is rational. So every
  // per-element gradient is an exact rational times rstd, and column sums are sums of such
  // products, grouped by equal q so that identical rows combine exactly.
  //
  // The fast path (opt_.fast_path, a row whose h are binary64 values in the fast domain): g, d,
  // the row's sums mean(g) and c and every K in double-double with propagated bounds
  // (ddouble.hpp), from the double-double mean and rstd of approximate_stats(); each dx and
  // dresidual element is decided from its Approx (the same test as the forward pass), and an
  // element the bound leaves open is evaluated exactly as below. The column sums are
  // accumulated the same way and decided at the end; a column left open (or every column, once
  // a row could not be approximated) is summed exactly in a second pass over the rows.
  struct ColumnSum {
    Rational rational_part;
    std::map<Rational, Rational> by_q;  // q -> coefficient of 1/sqrt(q)
  };

  void add_term(ColumnSum& s, const Row& r, const Rational& coef) {
    if (r.r_rational) s.rational_part += coef * r.r;
    else s.by_q[r.q] += coef;
  }

  // The exact terms of a finite row's gradient: g and d per element, mean(g) and c.
  struct ExactTerms {
    std::vector<Rational> dy, gq, d;
    Rational gbar, c;
  };

  void exact_terms(Row& r, std::int64_t row, ExactTerms& e) {
    ensure_exact(r);
    const auto n = g_.cols;
    e.dy.resize(n);
    e.gq.resize(n);
    e.d.resize(n);
    Rational gsum, gdsum;
    for (std::int64_t col = 0; col < n; ++col) {
      e.dy[col] = detail::exact(dy_->data[off(row, col)]);
      e.gq[col] = w_ ? e.dy[col] * (detail::exact(c_.weight_offset) + detail::exact(w_->data[col])) : e.dy[col];
      e.d[col] = r.h_exact(col);
      if (c_.op == Op::layernorm) e.d[col] -= r.mu;
      gsum += e.gq[col];
      gdsum += e.gq[col] * e.d[col];
    }
    e.gbar = gsum / n_;
    e.c = gdsum / n_ / r.q;
  }

  Rational exact_k(const ExactTerms& e, std::int64_t col) const {
    Rational k = e.gq[col] - e.d[col] * e.c;
    if (c_.op == Op::layernorm) k -= e.gbar;
    return k;
  }

  // Stores the correct roundings of the value `a` encloses, if its bound decides them.
  bool decide_into(Output& o, std::int64_t i, const Approx& a) {
    double out, out64;
    if (!detail::decide(a, o.value.dtype, out) || !detail::decide(a, DType::float64, out64)) return false;
    o.value.data[i] = out;
    o.f64[i] = out64;
    o.certified[i] = 1;
    ++fast_;
    return true;
  }

  // A finite row whose h and statistics have double-double forms.
  bool fast_row(const Row& r) const {
    return opt_.fast_path && r.all_double && r.r_a.valid() && (c_.op == Op::rmsnorm || r.mu_a.valid());
  }

  void backward(Result& res) {
    Output dx = output_of("dx");
    Output dres = output_of("dresidual");
    const bool ln = c_.op == Op::layernorm;
    const auto n = g_.cols;
    // Column sums: double-double accumulators, and which columns are NaN.
    std::vector<Approx> dweight(w_ ? n : 0), dresb(rb_ ? n : 0), dbias(b_ ? n : 0);
    bool sums_fast = opt_.fast_path;  // false once a row was evaluated exactly
    bool columns_nan = false;         // a non-finite row makes every dweight/dresidual_bias NaN
    std::vector<char> dbias_nan(b_ ? n : 0, 0);
    std::vector<double> dbias_ieee(b_ ? n : 0, 0.0);
    // offset + weight exactly as a double-double, per column (invalid outside the fast domain).
    std::vector<Approx> scale(w_ ? n : 0);
    for (std::int64_t col = 0; col < static_cast<std::int64_t>(scale.size()); ++col) {
      double s, e;
      detail::two_sum(c_.weight_offset, w_->data[col], s, e);
      scale[col] = std::isfinite(s) && detail::in_safe_range(s) ? Approx{s, e, 0} : detail::invalid();
    }
    const Approx alpha = detail::exact_value(c_.alpha);
    const Approx inv_n = reciprocal(n);
    std::vector<Approx> g(n), d(n), dya(n);
    ExactTerms ex;

    for (std::int64_t row = 0; row < g_.rows; ++row) {
      Row r = make_row(row);
      // q = 0 is known once the exact statistics or their double-double forms are.
      if (!r.has_nan && !r.has_inf && !r.r_a.valid()) ensure_exact(r);
      bool row_nonfinite = r.has_nan || r.has_inf || r.q_zero;
      for (std::int64_t col = 0; col < n; ++col) {
        const double dy = dy_->data[off(row, col)];
        if (!std::isfinite(dy)) row_nonfinite = true;
        if (b_) {
          if (std::isfinite(dy)) dbias[col] = detail::add(dbias[col], detail::exact_value(dy));
          else {
            dbias_nan[col] = 1;
            dbias_ieee[col] += dy;
          }
        }
      }
      if (w_)
        for (std::int64_t col = 0; col < n; ++col)
          if (!std::isfinite(w_->data[col])) row_nonfinite = true;
      if (row_nonfinite) {
        for (std::int64_t col = 0; col < n; ++col) {
          set_ieee(dx, off(row, col), kNaN);
          if (res_) set_ieee(dres, off(row, col), kNaN);
        }
        columns_nan = true;
        continue;
      }
      bool fast = fast_row(r) && alpha.valid();
      Approx gsum{}, gdsum{};
      if (fast) {
        for (std::int64_t col = 0; col < n; ++col) {
          dya[col] = detail::exact_value(dy_->data[off(row, col)]);
          g[col] = w_ ? detail::mul(dya[col], scale[col]) : dya[col];
          d[col] = detail::exact_value(r.h[col]);
          if (ln) d[col] = detail::add(d[col], detail::neg(r.mu_a));
          gsum = detail::add(gsum, g[col]);
          gdsum = detail::add(gdsum, detail::mul(g[col], d[col]));
        }
        fast = gsum.valid() && gdsum.valid();
      }
      if (!fast) {  // every element exactly; the column sums then need the exact pass
        sums_fast = false;
        exact_terms(r, row, ex);
        for (std::int64_t col = 0; col < n; ++col) {
          const Rational k = exact_k(ex, col);
          if (res_) times_rstd(dres, off(row, col), r, k);
          times_rstd(dx, off(row, col), r, alpha_ * k);
        }
        continue;
      }
      const Approx gbar = detail::mul(gsum, inv_n);
      const Approx c = detail::mul(detail::mul(detail::mul(gdsum, inv_n), r.r_a), r.r_a);
      bool have_exact = false;
      for (std::int64_t col = 0; col < n; ++col) {
        Approx k = detail::add(g[col], detail::neg(detail::mul(d[col], c)));
        if (ln) k = detail::add(k, detail::neg(gbar));
        const Approx kr = detail::mul(k, r.r_a);  // dresidual; dx = alpha * dresidual
        const auto i = off(row, col);
        const bool open_res = res_ && !decide_into(dres, i, kr);
        const bool open_dx = !decide_into(dx, i, detail::mul(kr, alpha));
        if (open_res || open_dx) {
          if (!have_exact) exact_terms(r, row, ex);
          have_exact = true;
          const Rational ke = exact_k(ex, col);
          if (open_res) times_rstd(dres, i, r, ke);
          if (open_dx) times_rstd(dx, i, r, alpha_ * ke);
        }
        if (w_) dweight[col] = detail::add(dweight[col], detail::mul(detail::mul(dya[col], d[col]), r.r_a));
        if (rb_) dresb[col] = detail::add(dresb[col], kr);
      }
    }
    emit(res, "dx", std::move(dx));
    emit(res, "dresidual", std::move(dres));

    // Columns: decided from the accumulators where the bound allows, exactly otherwise.
    Output ow = output_of("dweight"), orb = output_of("dresidual_bias"), ob = output_of("dbias");
    std::vector<char> need_w(w_ ? n : 0, 0), need_rb(rb_ ? n : 0, 0);
    for (std::int64_t col = 0; col < n; ++col) {
      if (w_) {
        if (columns_nan) set_ieee(ow, col, kNaN);
        else if (!sums_fast || !decide_into(ow, col, dweight[col])) need_w[col] = 1;
      }
      if (rb_) {
        if (columns_nan) set_ieee(orb, col, kNaN);
        else if (!sums_fast || !decide_into(orb, col, dresb[col])) need_rb[col] = 1;
      }
      if (b_) {
        if (dbias_nan[col]) set_ieee(ob, col, dbias_ieee[col]);
        else if (!opt_.fast_path || !decide_into(ob, col, dbias[col])) {
          Rational s;
          for (std::int64_t row = 0; row < g_.rows; ++row) s += detail::exact(dy_->data[off(row, col)]);
          ++slow_;
          set_exact(ob, col, s);
        }
      }
    }
    if (std::ranges::count(need_w, 1) + std::ranges::count(need_rb, 1) > 0) exact_columns(need_w, need_rb, ow, orb);
    if (w_) emit(res, "dweight", std::move(ow));
    if (b_) emit(res, "dbias", std::move(ob));
    if (rb_) emit(res, "dresidual_bias", std::move(orb));
  }

  // dweight = sum over rows of dy*d*rstd and dresidual_bias = sum of K*rstd for the columns
  // marked, exactly: per-row terms as rationals, grouped by equal q so that identical rows
  // combine exactly, then an MPFR enclosure (Ziv). Every row is finite here.
  void exact_columns(const std::vector<char>& need_w, const std::vector<char>& need_rb, Output& ow, Output& orb) {
    const auto n = g_.cols;
    std::vector<ColumnSum> dweight(need_w.size()), dresb(need_rb.size());
    ExactTerms ex;
    for (std::int64_t row = 0; row < g_.rows; ++row) {
      Row r = make_row(row);
      exact_terms(r, row, ex);
      for (std::int64_t col = 0; col < n; ++col) {
        if (w_ && need_w[col]) add_term(dweight[col], r, ex.dy[col] * ex.d[col]);
        if (rb_ && need_rb[col]) add_term(dresb[col], r, exact_k(ex, col));
      }
    }
    for (std::int64_t col = 0; col < n; ++col) {
      if (w_ && need_w[col]) column_sum(ow, col, dweight[col]);
      if (rb_ && need_rb[col]) column_sum(orb, col, dresb[col]);
    }
  }

  // 1/n as a double-double (exact when n is a power of two).
  static Approx reciprocal(std::int64_t n) {
    detail::Real v(192), rest(192);
    mpfr_set_si(v.get(), 1, MPFR_RNDN);
    mpfr_div_si(v.get(), v.get(), static_cast<long>(n), MPFR_RNDN);
    return split(v.get(), rest);
  }

  void times_rstd(Output& o, std::int64_t i, Row& r, const Rational& k) {
    ++slow_;
    if (r.r_rational || mpq_sgn(k.backend().data()) == 0) {
      set_exact(o, i, r.r_rational ? Rational(k * r.r) : Rational(0));
      return;
    }
    for (int bits = opt_.start_bits;; bits *= 2) {
      max_bits_used_ = std::max(max_bits_used_, bits);
      Enclosure v(bits), t(bits);
      detail::enclose(t, k);
      detail::mul(v, t, r.rstd(bits));
      if (store_enclosure(o, i, v, bits * 2 > opt_.max_bits)) return;
    }
  }

  // Stores the roundings of the value e encloses when they are decided, or at the last
  // precision the lower end's, uncertified; true when the element is done.
  bool store_enclosure(Output& o, std::int64_t i, const Enclosure& e, bool last) {
    double out, out64;
    const bool ok = detail::decide(e, o.value.dtype, out) && detail::decide(e, DType::float64, out64);
    if (!ok && !last) return false;
    o.value.data[i] = ok ? out : detail::round_real(e.lo.get(), o.value.dtype);
    o.f64[i] = ok ? out64 : detail::round_real(e.lo.get(), DType::float64);
    o.certified[i] = ok;
    return true;
  }

  void column_sum(Output& o, std::int64_t col, const ColumnSum& s) {
    ++slow_;
    bool all_zero = true;
    for (const auto& [q, coef] : s.by_q) all_zero &= mpq_sgn(coef.backend().data()) == 0;
    if (all_zero) {
      set_exact(o, col, s.rational_part);
      return;
    }
    for (int bits = opt_.start_bits;; bits *= 2) {
      max_bits_used_ = std::max(max_bits_used_, bits);
      Enclosure acc(bits), t(bits), term(bits), rs(bits);
      detail::enclose(acc, s.rational_part);
      for (const auto& [q, coef] : s.by_q) {
        detail::enclose(t, coef);
        detail::enclose_rstd(rs, q);
        detail::mul(term, t, rs);
        Enclosure next(bits);
        detail::add(next, acc, term);
        std::swap(acc, next);
      }
      if (store_enclosure(o, col, acc, bits * 2 > opt_.max_bits)) return;
    }
  }

  const Case& c_;
  const Options& opt_;
  Geometry g_;
  Points pts_;
  std::map<std::string, OutputSpec> specs_;  // the outputs of the case
  const Tensor *x_ = nullptr, *w_ = nullptr, *b_ = nullptr, *res_ = nullptr, *rb_ = nullptr, *dy_ = nullptr;
  Rational n_, eps_, alpha_;
  bool simple_h_ = false;  // h = x: no residual, alpha = 1, no h rounding
  bool x_by_rows_ = false;  // x's float32 values are checked row by row (check_x_row)
  bool contiguous_ = false;  // each row's elements are adjacent
  detail::BinnedSum sum_, sumsq_;
  struct StatScratch {  // approximate_stats' temporaries
    detail::Real num{64}, t{256}, qv{256}, rv{192}, rest{256};
    detail::Integer a, b;
  } scratch_;
  BufferPool pool_;
  std::int64_t fast_ = 0, slow_ = 0;
  int max_bits_used_ = 0;
};

}  // namespace

Result evaluate(const Case& c, const Options& opt) {
  Result r;
  evaluate_into(c, opt, r);
  return r;
}

void evaluate_into(const Case& c, const Options& opt, Result& out) {
  if (c.quant) {  // fused quantization: the norm part is evaluated as a case of its own
    validate(c);
    detail::evaluate_quant(c, opt, out);
    return;
  }
  // float32 x in plain rows (h = x: no residual, alpha 1, no h rounding point; forward) is
  // checked row by row from the row scan (Evaluator::check_x_row) instead of here. The same
  // flag decides both, so no row escapes both checks.
  const auto contract = parse_contract(c.contract);
  bool h_point = false;
  if (contract)
    for (const auto& p : contract->points) h_point |= p.point == Point::h;
  const bool x_by_rows = contract && !h_point && c.block == Block::none && c.dtype_x == DType::float32 &&
                         c.residual == Residual::none && c.alpha == 1.0 && c.direction == Direction::forward;
  detail::validate(c, !x_by_rows);
  if (opt.start_bits < 64 || opt.max_bits < opt.start_bits)
    throw CaseError("options", "start_bits must be >= 64 and max_bits >= start_bits");
  if (c.block != Block::none) {
    out = detail::evaluate_block(c, opt);
    return;
  }
  Evaluator(c, opt, x_by_rows).run(out);
}

}  // namespace normcheck::ref
