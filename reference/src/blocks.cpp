// Residual blocks. Inside a layer nothing is rounded; each layer's output but the last is
// rounded to dtype_x (the activation dtype) and feeds the next layer; the block output is
// rounded once. Everything is an MPFR interval at the working precision; when any rounding on
// the way (an intermediate layer output or a final output) is undecided, the whole case is
// evaluated again at twice the precision, up to Options::max_bits.
//
// Backward: the gradient of sum(dy * y) with respect to x and every parameter, the rounding of
// intermediate layer outputs being the identity for the gradient (as in autograd).
//
// Fast path: the same evaluator first runs on balls (a double-double centre and a proved
// radius, ddouble.hpp's Approx); GELU, its derivative and 1/sqrt go through MPFR intervals at
// 128 bits and back. Its result is taken only when every rounding, intermediate and final, is
// decided; otherwise the case is evaluated with MPFR intervals as above.
#include "blocks.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "ddouble.hpp"
#include "exact.hpp"
#include "normcheck/reference/outputs.hpp"

namespace normcheck::ref::detail {
namespace {

using Iv = Enclosure;
using Vec = std::vector<Iv>;

void set(Iv& o, double v) { enclose(o, v); }
void set_zero(Iv& o) {
  mpfr_set_zero(o.lo.get(), 1);
  mpfr_set_zero(o.hi.get(), 1);
}
void copy(Iv& o, const Iv& a) {
  mpfr_set(o.lo.get(), a.lo.get(), MPFR_RNDD);
  mpfr_set(o.hi.get(), a.hi.get(), MPFR_RNDU);
}
void acc(Iv& o, const Iv& a) {  // o += a
  mpfr_add(o.lo.get(), o.lo.get(), a.lo.get(), MPFR_RNDD);
  mpfr_add(o.hi.get(), o.hi.get(), a.hi.get(), MPFR_RNDU);
}
void sub(Iv& o, const Iv& a, const Iv& b) {  // o = a - b (o may alias a, not b)
  mpfr_sub(o.lo.get(), a.lo.get(), b.hi.get(), MPFR_RNDD);
  mpfr_sub(o.hi.get(), a.hi.get(), b.lo.get(), MPFR_RNDU);
}
// o += w * a with w an exact binary64.
void acc_mul_d(Iv& o, double w, const Iv& a, Real& t) {
  if (w >= 0) {
    mpfr_mul_d(t.get(), a.lo.get(), w, MPFR_RNDD);
    mpfr_add(o.lo.get(), o.lo.get(), t.get(), MPFR_RNDD);
    mpfr_mul_d(t.get(), a.hi.get(), w, MPFR_RNDU);
    mpfr_add(o.hi.get(), o.hi.get(), t.get(), MPFR_RNDU);
  } else {
    mpfr_mul_d(t.get(), a.hi.get(), w, MPFR_RNDD);
    mpfr_add(o.lo.get(), o.lo.get(), t.get(), MPFR_RNDD);
    mpfr_mul_d(t.get(), a.lo.get(), w, MPFR_RNDU);
    mpfr_add(o.hi.get(), o.hi.get(), t.get(), MPFR_RNDU);
  }
}
void mul_d(Iv& o, const Iv& a, double w, Real& t) {
  set_zero(o);
  acc_mul_d(o, w, a, t);
}
void div_n(Iv& o, const Iv& a, long n) {  // n > 0
  mpfr_div_si(o.lo.get(), a.lo.get(), n, MPFR_RNDD);
  mpfr_div_si(o.hi.get(), a.hi.get(), n, MPFR_RNDU);
}
void sqr(Iv& o, const Iv& a) {
  if (mpfr_sgn(a.lo.get()) >= 0) {
    mpfr_sqr(o.lo.get(), a.lo.get(), MPFR_RNDD);
    mpfr_sqr(o.hi.get(), a.hi.get(), MPFR_RNDU);
  } else if (mpfr_sgn(a.hi.get()) <= 0) {
    Real t(static_cast<int>(mpfr_get_prec(o.lo.get())));
    mpfr_sqr(t.get(), a.hi.get(), MPFR_RNDD);
    mpfr_sqr(o.hi.get(), a.lo.get(), MPFR_RNDU);
    mpfr_set(o.lo.get(), t.get(), MPFR_RNDD);
  } else {
    Real t(static_cast<int>(mpfr_get_prec(o.lo.get())));
    mpfr_sqr(t.get(), a.lo.get(), MPFR_RNDU);
    mpfr_sqr(o.hi.get(), a.hi.get(), MPFR_RNDU);
    mpfr_max(o.hi.get(), o.hi.get(), t.get(), MPFR_RNDU);
    mpfr_set_zero(o.lo.get(), 1);
  }
}
void rec_sqrt(Iv& o, const Iv& q) {  // q >= 0; an end at 0 gives +inf
  Real lo(static_cast<int>(mpfr_get_prec(o.lo.get())));
  mpfr_rec_sqrt(lo.get(), q.hi.get(), MPFR_RNDD);
  mpfr_rec_sqrt(o.hi.get(), q.lo.get(), MPFR_RNDU);
  mpfr_set(o.lo.get(), lo.get(), MPFR_RNDD);
}
bool width_finite(const Iv& a) { return mpfr_number_p(a.lo.get()) && mpfr_number_p(a.hi.get()); }

// Constants of the GELU, enclosed at the working precision.
struct GeluConstants {
  Iv inv_sqrt2, inv_sqrt_2pi;
  explicit GeluConstants(int bits) : inv_sqrt2(bits), inv_sqrt_2pi(bits) {
    Real two(bits), pi(bits);
    mpfr_set_ui(two.get(), 2, MPFR_RNDN);
    mpfr_rec_sqrt(inv_sqrt2.lo.get(), two.get(), MPFR_RNDD);
    mpfr_rec_sqrt(inv_sqrt2.hi.get(), two.get(), MPFR_RNDU);
    mpfr_const_pi(pi.get(), MPFR_RNDU);  // 1/sqrt(2 pi) is decreasing in pi
    mpfr_mul_2ui(pi.get(), pi.get(), 1, MPFR_RNDU);
    mpfr_rec_sqrt(inv_sqrt_2pi.lo.get(), pi.get(), MPFR_RNDD);
    mpfr_const_pi(pi.get(), MPFR_RNDD);
    mpfr_mul_2ui(pi.get(), pi.get(), 1, MPFR_RNDD);
    mpfr_rec_sqrt(inv_sqrt_2pi.hi.get(), pi.get(), MPFR_RNDU);
  }
};

// Phi(u) = (1 + erf(u / sqrt 2)) / 2: erf is increasing.
void normal_cdf(Iv& o, const Iv& u, const GeluConstants& k) {
  Iv t(static_cast<int>(mpfr_get_prec(o.lo.get())));
  mul(t, u, k.inv_sqrt2);
  mpfr_erf(o.lo.get(), t.lo.get(), MPFR_RNDD);
  mpfr_erf(o.hi.get(), t.hi.get(), MPFR_RNDU);
  mpfr_add_ui(o.lo.get(), o.lo.get(), 1, MPFR_RNDD);
  mpfr_add_ui(o.hi.get(), o.hi.get(), 1, MPFR_RNDU);
  mpfr_div_2ui(o.lo.get(), o.lo.get(), 1, MPFR_RNDD);
  mpfr_div_2ui(o.hi.get(), o.hi.get(), 1, MPFR_RNDU);
}

// `cdf` receives Phi(u) for GELU, for activation_grad at the same u (backward reuses it).
void activation(Iv& o, const Iv& u, Activation act, const GeluConstants& k, Iv& cdf) {
  if (act == Activation::relu) {
    if (mpfr_sgn(u.lo.get()) < 0) mpfr_set_zero(o.lo.get(), 1);
    else mpfr_set(o.lo.get(), u.lo.get(), MPFR_RNDD);
    if (mpfr_sgn(u.hi.get()) < 0) mpfr_set_zero(o.hi.get(), 1);
    else mpfr_set(o.hi.get(), u.hi.get(), MPFR_RNDU);
    return;
  }
  normal_cdf(cdf, u, k);
  mul(o, u, cdf);  // gelu(u) = u Phi(u)
}

// act'(u): relu' = 1 for u > 0, 0 for u <= 0 (0 at 0); gelu' = Phi(u) + u phi(u).
// `cdf` is Phi(u), as activation() left it.
void activation_grad(Iv& o, const Iv& u, Activation act, const GeluConstants& k, const Iv& cdf) {
  if (act == Activation::relu) {
    const bool pos = mpfr_sgn(u.lo.get()) > 0;
    const bool nonpos = mpfr_sgn(u.hi.get()) <= 0;
    mpfr_set_ui(o.lo.get(), pos ? 1 : 0, MPFR_RNDD);
    mpfr_set_ui(o.hi.get(), nonpos ? 0 : 1, MPFR_RNDU);
    return;
  }
  const int bits = static_cast<int>(mpfr_get_prec(o.lo.get()));
  Iv e(bits), t(bits);
  sqr(t, u);  // exp(-u^2/2) is decreasing in u^2
  mpfr_div_2ui(t.lo.get(), t.lo.get(), 1, MPFR_RNDD);
  mpfr_div_2ui(t.hi.get(), t.hi.get(), 1, MPFR_RNDU);
  mpfr_neg(e.lo.get(), t.hi.get(), MPFR_RNDD);
  mpfr_neg(e.hi.get(), t.lo.get(), MPFR_RNDU);
  mpfr_exp(e.lo.get(), e.lo.get(), MPFR_RNDD);
  mpfr_exp(e.hi.get(), e.hi.get(), MPFR_RNDU);
  mul(t, e, k.inv_sqrt_2pi);  // phi(u)
  mul(e, u, t);               // u phi(u)
  add(o, cdf, e);
}

// ---- balls: Approx values (centre hi + lo, radius err) -------------------------------------
struct Ball {
  Approx v;
  explicit Ball(int /*bits*/ = 0) {}
};

constexpr int kBallBits = 128;  // MPFR precision of the steps balls take through intervals

// Exact balls stay exact where two doubles can hold the result: a product of two binary64
// values (TwoProd) and a sum of two double-doubles whose error-free transformations leave no
// third word. Sums of inputs and of their products (dbias is a column sum of dy; with relu,
// dffn_b1 sums products of float32 values) land on ties of the output format, binary64
// included, which no radius can decide. Anything else is Approx's operation with its bound.
Approx ball_sum(const Approx& a, const Approx& b) {
  if (a.err == 0 && b.err == 0) {
    double s, e1, u, e3, t, e2;
    two_sum(a.hi, b.hi, s, e1);
    two_sum(a.lo, b.lo, u, e3);
    two_sum(e1, u, t, e2);
    if (e3 == 0 && e2 == 0 && std::isfinite(s)) {
      double zh, zl;
      two_sum(s, t, zh, zl);  // exact: s + t = a + b
      if (in_safe_range(zh)) return {zh, zl, 0};
    }
  }
  return add(a, b);
}
// x * y exactly as a double-double pair (TwoProd), when no underflow can hide in it.
bool exact_product(double x, double y, Approx& out) {
  double p, e;
  two_prod(x, y, p, e);  // exact when p is in the safe range (e then does not underflow)
  if (!std::isfinite(p) || !in_safe_range(p) || (p == 0 && x != 0 && y != 0)) return false;
  out = {p, e, 0};
  return true;
}
Approx ball_product(const Approx& a, const Approx& b) {
  if (a.err == 0 && b.err == 0 && (a.lo == 0 || b.lo == 0)) {
    const Approx& x = b.lo == 0 ? a : b;  // y is a binary64 value
    const Approx& y = b.lo == 0 ? b : a;
    Approx p1, p2;
    if (exact_product(x.hi, y.hi, p1)) {
      if (x.lo == 0) return p1;
      if (exact_product(x.lo, y.hi, p2)) return ball_sum(p1, p2);  // exact where it can be
    }
  }
  return mul(a, b);
}

void set(Ball& o, double v) { o.v = exact_value(v); }
void set_zero(Ball& o) { o.v = Approx{}; }
void copy(Ball& o, const Ball& a) { o.v = a.v; }
void acc(Ball& o, const Ball& a) { o.v = ball_sum(o.v, a.v); }
void sub(Ball& o, const Ball& a, const Ball& b) { o.v = ball_sum(a.v, neg(b.v)); }
void acc_mul_d(Ball& o, double w, const Ball& a, Real&) { o.v = ball_sum(o.v, ball_product(exact_value(w), a.v)); }
void mul_d(Ball& o, const Ball& a, double w, Real&) { o.v = ball_product(a.v, exact_value(w)); }
void mul(Ball& o, const Ball& a, const Ball& b) { o.v = ball_product(a.v, b.v); }
void add(Ball& o, const Ball& a, const Ball& b) { o.v = ball_sum(a.v, b.v); }
void sqr(Ball& o, const Ball& a) { o.v = ball_product(a.v, a.v); }
bool width_finite(const Ball& a) { return a.v.valid(); }
// An exact value (radius 0) is rounded exactly: Approx's decide keeps a slack that never
// decides an exact 0 (relu's zero gradients) or a tie (a sum of inputs on a midpoint of the
// output format). 0 is +0 and an overflow is inf, as the intervals give them.
bool decide(const Ball& a, DType t, double& out) {
  if (a.v.err == 0) {
    if (a.v.hi == 0) out = 0.0;
    else if (a.v.lo == 0) out = round_to(a.v.hi, t);
    else out = round_rational(exact(a.v.hi) + exact(a.v.lo), t);
    return true;
  }
  return decide(a.v, t, out);
}
double lower_rounding(const Ball& a, DType t) { return round_to(a.v.hi, t); }  // never kept: see run()
double lower_rounding(const Iv& a, DType t) { return round_real(a.lo.get(), t); }

// The interval [c - err, c + err] of a ball (directed roundings; c = hi + lo).
void to_interval(Iv& o, const Ball& a) {
  mpfr_set_d(o.lo.get(), a.v.hi, MPFR_RNDD);
  mpfr_add_d(o.lo.get(), o.lo.get(), a.v.lo, MPFR_RNDD);
  mpfr_sub_d(o.lo.get(), o.lo.get(), a.v.err, MPFR_RNDD);
  mpfr_set_d(o.hi.get(), a.v.hi, MPFR_RNDU);
  mpfr_add_d(o.hi.get(), o.hi.get(), a.v.lo, MPFR_RNDU);
  mpfr_add_d(o.hi.get(), o.hi.get(), a.v.err, MPFR_RNDU);
}

// A ball holding the interval: its midpoint split into hi + lo, the radius rounded up.
void from_interval(Ball& o, const Iv& a, Real& m, Real& t) {
  if (!mpfr_number_p(a.lo.get()) || !mpfr_number_p(a.hi.get())) {
    o.v = invalid();
    return;
  }
  mpfr_add(m.get(), a.lo.get(), a.hi.get(), MPFR_RNDN);
  mpfr_div_2ui(m.get(), m.get(), 1, MPFR_RNDN);
  const double hi = mpfr_get_d(m.get(), MPFR_RNDN);
  mpfr_sub_d(t.get(), m.get(), hi, MPFR_RNDN);
  const double lo = mpfr_get_d(t.get(), MPFR_RNDN);
  if (!std::isfinite(hi) || !in_safe_range(hi)) {
    o.v = invalid();
    return;
  }
  // radius: max(a.hi - (hi + lo), (hi + lo) - a.lo), each bounded from above.
  mpfr_sub_d(t.get(), a.hi.get(), hi, MPFR_RNDU);
  mpfr_sub_d(t.get(), t.get(), lo, MPFR_RNDU);
  const double up = mpfr_get_d(t.get(), MPFR_RNDU);
  mpfr_d_sub(t.get(), hi, a.lo.get(), MPFR_RNDU);
  mpfr_add_d(t.get(), t.get(), lo, MPFR_RNDU);
  const double down = mpfr_get_d(t.get(), MPFR_RNDU);
  const double err = std::max({up, down, 0.0});
  o.v = std::isfinite(err) ? Approx{hi, lo, err} : invalid();
}

struct BallScratch {
  Iv a{kBallBits}, b{kBallBits}, c{kBallBits};
  Real m{2 * kBallBits}, t{2 * kBallBits}, w{kBallBits};
};
BallScratch& ball_scratch() {
  thread_local BallScratch s;
  return s;
}

void div_n(Ball& o, const Ball& a, long n) {  // n > 0
  if ((n & (n - 1)) == 0) {
    o.v = mul(a.v, exact_value(std::ldexp(1.0, -std::countr_zero(static_cast<unsigned long>(n)))));
    return;
  }
  BallScratch& s = ball_scratch();
  mpfr_set_ui(s.a.lo.get(), 1, MPFR_RNDN);
  mpfr_div_si(s.a.lo.get(), s.a.lo.get(), n, MPFR_RNDD);
  mpfr_set_ui(s.a.hi.get(), 1, MPFR_RNDN);
  mpfr_div_si(s.a.hi.get(), s.a.hi.get(), n, MPFR_RNDU);
  Ball inv;
  from_interval(inv, s.a, s.m, s.t);
  o.v = mul(a.v, inv.v);
}
void rec_sqrt(Ball& o, const Ball& q) {
  BallScratch& s = ball_scratch();
  to_interval(s.a, q);
  if (mpfr_sgn(s.a.lo.get()) <= 0) {  // an end at or below 0: leave it to the intervals
    o.v = invalid();
    return;
  }
  rec_sqrt(s.b, s.a);
  from_interval(o, s.b, s.m, s.t);
}
// Phi over the narrow interval of a ball with one erf: erf(t) for t in [t.lo, t.hi] lies in
// [erf(t.lo), erf(t.lo) + (2/sqrt(pi)) (t.hi - t.lo)] (erf is increasing with slope at most
// 2/sqrt(pi) = 1.1283791...), and erf(t.lo) in [y, next above y] for y = erf(t.lo) rounded down.
void normal_cdf_narrow(Iv& o, const Iv& u, const GeluConstants& k) {
  BallScratch& s = ball_scratch();
  Iv& t = s.c;
  mul(t, u, k.inv_sqrt2);
  mpfr_erf(o.lo.get(), t.lo.get(), MPFR_RNDD);
  mpfr_sub(s.w.get(), t.hi.get(), t.lo.get(), MPFR_RNDU);
  mpfr_mul_d(s.w.get(), s.w.get(), 1.1284, MPFR_RNDU);
  mpfr_set(o.hi.get(), o.lo.get(), MPFR_RNDU);
  mpfr_nextabove(o.hi.get());
  mpfr_add(o.hi.get(), o.hi.get(), s.w.get(), MPFR_RNDU);
  mpfr_add_ui(o.lo.get(), o.lo.get(), 1, MPFR_RNDD);
  mpfr_add_ui(o.hi.get(), o.hi.get(), 1, MPFR_RNDU);
  mpfr_div_2ui(o.lo.get(), o.lo.get(), 1, MPFR_RNDD);
  mpfr_div_2ui(o.hi.get(), o.hi.get(), 1, MPFR_RNDU);
}
void activation(Ball& o, const Ball& u, Activation act, const GeluConstants& k, Iv& cdf) {
  BallScratch& s = ball_scratch();
  to_interval(s.a, u);
  if (act == Activation::gelu) {
    normal_cdf_narrow(cdf, s.a, k);
    mul(s.b, s.a, cdf);  // gelu(u) = u Phi(u)
  } else {
    activation(s.b, s.a, act, k, cdf);
  }
  from_interval(o, s.b, s.m, s.t);
}
void activation_grad(Ball& o, const Ball& u, Activation act, const GeluConstants& k, const Iv& cdf) {
  BallScratch& s = ball_scratch();
  to_interval(s.a, u);
  activation_grad(s.b, s.a, act, k, cdf);
  from_interval(o, s.b, s.m, s.t);
}
// scale = offset + w: exact as a TwoSum pair.
void set_sum(Ball& o, double a, double b) {
  double sum, e;
  two_sum(a, b, sum, e);
  o.v = std::isfinite(sum) && in_safe_range(sum) ? Approx{sum, e, 0} : invalid();
}
void set_sum(Iv& s, double a, double b) {
  mpfr_set_d(s.lo.get(), a, MPFR_RNDD);
  mpfr_add_d(s.lo.get(), s.lo.get(), b, MPFR_RNDD);
  mpfr_set_d(s.hi.get(), a, MPFR_RNDU);
  mpfr_add_d(s.hi.get(), s.hi.get(), b, MPFR_RNDU);
}

struct Tensors {
  const Tensor *x, *w1, *b1, *w2, *b2, *weight, *bias, *dy;
};

template <class N>
std::vector<N> make_vec_of(std::size_t n, int bits) {
  std::vector<N> v;
  v.reserve(n);
  for (std::size_t i = 0; i < n; ++i) v.emplace_back(bits);
  return v;
}

// The evaluator on intervals (N = Iv, at `bits`) or on balls (N = Ball: `strict`, so any
// undecided rounding fails the run instead of going on tainted).
template <class N>
class BlockEvaluator {
  using Iv = N;
  using Vec = std::vector<N>;
  static Vec make_vec(std::size_t n, int bits) { return make_vec_of<N>(n, bits); }
  static constexpr bool strict = std::is_same_v<N, Ball>;

  // One norm over a row, with what backward needs.
  struct NormRow {
    Vec xhat;
    Iv rstd;
    NormRow(std::size_t n, int bits) : xhat(make_vec(n, bits)), rstd(bits) {}
  };

 public:
  BlockEvaluator(const Case& c, int bits)
      : c_(c), bits_(bits), k_(std::max(bits, kBallBits)), t_(std::max(bits, kBallBits)) {
    auto get = [&](const char* n) -> const Tensor* {
      auto it = c.inputs.find(n);
      return it == c.inputs.end() ? nullptr : &it->second;
    };
    in_ = {get("x"), get("ffn_w1"), get("ffn_b1"), get("ffn_w2"), get("ffn_b2"),
           c.affine != Affine::none ? get("weight") : nullptr,
           c.affine == Affine::weight_bias ? get("bias") : nullptr, get("dy")};
    D_ = in_.x->shape.back();
    F_ = in_.w1->shape[1];
    L_ = c.layers;
    K_ = c.block == Block::sandwich ? 2 : 1;
    rows_ = in_.x->numel() / D_;
    make_scales();
  }

  // Runs forward (and backward); returns false if some rounding was undecided (the outputs
  // then hold the lower ends' roundings and certified = 0 where undecided).
  bool run(Result& res) {
    Output y = make(c_.dtype_out, in_.x->shape);
    const bool bwd = c_.direction == Direction::backward;
    Output dx = make(c_.dtype_x, in_.x->shape);
    // Parameter gradient accumulators (intervals), summed over rows.
    Vec gw = make_vec(bwd && in_.weight ? L_ * K_ * D_ : 0, bits_);
    Vec gb = make_vec(bwd && in_.bias ? L_ * K_ * D_ : 0, bits_);
    Vec gw1 = make_vec(bwd ? L_ * F_ * D_ : 0, bits_), gb1 = make_vec(bwd ? L_ * F_ : 0, bits_);
    Vec gw2 = make_vec(bwd ? L_ * D_ * F_ : 0, bits_), gb2 = make_vec(bwd ? L_ * D_ : 0, bits_);
    for (auto* v : {&gw, &gb, &gw1, &gb1, &gw2, &gb2})
      for (auto& e : *v) set_zero(e);
    bool all = true;

    for (std::int64_t row = 0; row < rows_; ++row) {
      // Each layer's saved state for backward (its FFN input, pre-activations, x-hat, rstd).
      std::vector<LayerState> states;
      Vec u = make_vec(D_, bits_);
      for (std::int64_t i = 0; i < D_; ++i) set(u[i], in_.x->data[row * D_ + i]);
      bool tainted = false;
      for (std::int64_t l = 0; l < L_; ++l) {
        states.emplace_back(D_, F_, bits_);
        Vec out = make_vec(D_, bits_);
        layer_forward(l, u, states.back(), out);
        if (l + 1 < L_) {  // round to the activation dtype; that value goes on
          for (std::int64_t i = 0; i < D_; ++i) {
            double v = 0;
            if (!decide(out[i], c_.dtype_x, v)) {
              if (strict) return false;
              tainted = true;
              v = lower_rounding(out[i], c_.dtype_x);
            }
            set(u[i], v);
          }
        } else {
          for (std::int64_t i = 0; i < D_; ++i) all &= put(y, row * D_ + i, out[i], tainted);
          if (strict && !all) return false;
        }
      }
      if (!bwd) continue;
      Vec g = make_vec(D_, bits_);
      for (std::int64_t i = 0; i < D_; ++i) set(g[i], in_.dy->data[row * D_ + i]);
      for (std::int64_t l = L_ - 1; l >= 0; --l) {
        Vec gin = make_vec(D_, bits_);
        layer_backward(l, states[l], g, gin, gw, gb, gw1, gb1, gw2, gb2);
        std::swap(g, gin);
      }
      for (std::int64_t i = 0; i < D_; ++i) all &= put(dx, row * D_ + i, g[i], tainted);
    }
    if (!bwd) {
      res.outputs.emplace("y", std::move(y));
      return all;
    }
    res.outputs.emplace("dx", std::move(dx));
    // The parameter gradients the case has, with their dtype and shape from output_specs.
    const auto specs = output_specs(c_);
    auto emit = [&](const char* name, const Vec& v) {
      if (v.empty()) return;
      const OutputSpec& spec = specs.at(name);
      Output o = make(spec.dtype, spec.shape);
      for (std::size_t i = 0; i < v.size(); ++i) all &= put(o, static_cast<std::int64_t>(i), v[i], false);
      res.outputs.emplace(name, std::move(o));
    };
    emit("dweight", gw);
    emit("dbias", gb);
    emit("dffn_w1", gw1);
    emit("dffn_b1", gb1);
    emit("dffn_w2", gw2);
    emit("dffn_b2", gb2);
    return all;
  }

 private:
  struct LayerState {
    NormRow n0, n1;
    Vec a, z;     // FFN pre-activation and activation
    Vec f_in;     // the FFN's input
    std::vector<Enclosure> cdf;  // GELU: Phi(a) as activation() computed it, for backward
    LayerState(std::int64_t d, std::int64_t f, int bits)
        : n0(d, bits), n1(d, bits), a(make_vec(f, bits)), z(make_vec(f, bits)), f_in(make_vec(d, bits)),
          cdf(make_vec_of<Enclosure>(f, std::max(bits, kBallBits))) {}
  };

  static Output make(DType t, const std::vector<std::int64_t>& shape) {
    Output o;
    o.value.dtype = t;
    o.value.shape = shape;
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    o.value.data.assign(n, 0.0);
    o.f64.assign(n, 0.0);
    o.certified.assign(n, 0);
    return o;
  }

  // Decides an output element; on failure stores the lower end's rounding, uncertified.
  static bool put(Output& o, std::int64_t i, const Iv& v, bool tainted) {
    double a = 0, b = 0;
    const bool ok = width_finite(v) && decide(v, o.value.dtype, a) && decide(v, DType::float64, b);
    o.value.data[i] = ok ? a : lower_rounding(v, o.value.dtype);
    o.f64[i] = ok ? b : lower_rounding(v, DType::float64);
    o.certified[i] = ok && !tainted;
    return ok;
  }

  // scale = weight_offset + weight, enclosed: the sum of two binary64 values need not be one.
  const Iv& scale(std::int64_t l, std::int64_t k, std::int64_t i) const { return scales_[(l * K_ + k) * D_ + i]; }

  void make_scales() {
    scales_ = make_vec(static_cast<std::size_t>(L_ * K_ * D_), bits_);
    for (std::size_t p = 0; p < scales_.size(); ++p) {
      Iv& s = scales_[p];
      if (!in_.weight) {
        set(s, 1.0);
        continue;
      }
      set_sum(s, c_.weight_offset, in_.weight->data[p]);
    }
  }

  // v -> Norm_k of layer l (into out), saving x-hat and rstd.
  void norm_forward(std::int64_t l, std::int64_t k, const Vec& v, NormRow& st, Vec& out) {
    Iv mean(bits_), q(bits_), t(bits_);
    set_zero(mean);
    if (c_.op == Op::layernorm) {
      for (const auto& e : v) acc(mean, e);
      div_n(mean, mean, static_cast<long>(D_));
    }
    Vec d = make_vec(D_, bits_);
    set_zero(q);
    for (std::int64_t i = 0; i < D_; ++i) {
      // With one element, v - mean(v) is exactly 0; intervals cannot see that (v and its mean
      // are the same uncertain number), so it is set, or a y equal to the bias could never be
      // decided when the bias is a midpoint of the output dtype.
      if (c_.op == Op::layernorm && D_ == 1) set_zero(d[i]);
      else sub(d[i], v[i], mean);
      sqr(t, d[i]);
      acc(q, t);
    }
    div_n(q, q, static_cast<long>(D_));
    set(t, c_.epsilon);
    acc(q, t);
    rec_sqrt(st.rstd, q);
    for (std::int64_t i = 0; i < D_; ++i) {
      mul(st.xhat[i], d[i], st.rstd);
      mul(out[i], st.xhat[i], scale(l, k, i));
      if (in_.bias) {
        set(t, in_.bias->data[(l * K_ + k) * D_ + i]);
        acc(out[i], t);
      }
    }
  }

  // gout -> gradient with respect to the norm's input (gin), accumulating dweight/dbias.
  void norm_backward(std::int64_t l, std::int64_t k, const NormRow& st, const Vec& gout, Vec& gin, Vec& gw,
                     Vec& gb) {
    Vec g = make_vec(D_, bits_);
    Iv gmean(bits_), gx(bits_), t(bits_);
    set_zero(gmean);
    set_zero(gx);
    for (std::int64_t i = 0; i < D_; ++i) {
      mul(g[i], gout[i], scale(l, k, i));
      acc(gmean, g[i]);
      mul(t, g[i], st.xhat[i]);
      acc(gx, t);
      const std::int64_t p = (l * K_ + k) * D_ + i;
      if (!gw.empty()) {
        mul(t, gout[i], st.xhat[i]);
        acc(gw[p], t);
      }
      if (!gb.empty()) acc(gb[p], gout[i]);
    }
    div_n(gmean, gmean, static_cast<long>(D_));
    div_n(gx, gx, static_cast<long>(D_));
    for (std::int64_t i = 0; i < D_; ++i) {
      if (c_.op == Op::layernorm && D_ == 1) {  // g - mean(g) = 0 and xhat = 0 exactly
        set_zero(gin[i]);
        continue;
      }
      // r * (g - mean(g) - xhat * mean(g xhat)); RMSNorm without the mean(g) term
      mul(t, st.xhat[i], gx);
      sub(g[i], g[i], t);
      if (c_.op == Op::layernorm) sub(g[i], g[i], gmean);
      mul(gin[i], g[i], st.rstd);
    }
  }

  void ffn_forward(std::int64_t l, const Vec& v, LayerState& st, Vec& out) {
    for (std::int64_t i = 0; i < D_; ++i) copy(st.f_in[i], v[i]);
    for (std::int64_t j = 0; j < F_; ++j) {
      set(st.a[j], in_.b1->data[l * F_ + j]);
      for (std::int64_t i = 0; i < D_; ++i) acc_mul_d(st.a[j], in_.w1->data[(l * F_ + j) * D_ + i], v[i], t_);
      activation(st.z[j], st.a[j], c_.activation, k_, st.cdf[j]);
    }
    for (std::int64_t i = 0; i < D_; ++i) {
      set(out[i], in_.b2->data[l * D_ + i]);
      for (std::int64_t j = 0; j < F_; ++j) acc_mul_d(out[i], in_.w2->data[(l * D_ + i) * F_ + j], st.z[j], t_);
    }
  }

  void ffn_backward(std::int64_t l, const LayerState& st, const Vec& gout, Vec& gin, Vec& gw1, Vec& gb1, Vec& gw2,
                    Vec& gb2) {
    Iv t(bits_), ga(bits_), d(bits_);
    Vec gz = make_vec(F_, bits_);
    for (auto& e : gz) set_zero(e);
    for (std::int64_t i = 0; i < D_; ++i) {
      acc(gb2[l * D_ + i], gout[i]);
      for (std::int64_t j = 0; j < F_; ++j) {
        mul(t, gout[i], st.z[j]);
        acc(gw2[(l * D_ + i) * F_ + j], t);
        acc_mul_d(gz[j], in_.w2->data[(l * D_ + i) * F_ + j], gout[i], t_);
      }
    }
    for (auto& e : gin) set_zero(e);
    for (std::int64_t j = 0; j < F_; ++j) {
      activation_grad(d, st.a[j], c_.activation, k_, st.cdf[j]);
      mul(ga, gz[j], d);
      acc(gb1[l * F_ + j], ga);
      for (std::int64_t i = 0; i < D_; ++i) {
        mul(t, ga, st.f_in[i]);
        acc(gw1[(l * F_ + j) * D_ + i], t);
        acc_mul_d(gin[i], in_.w1->data[(l * F_ + j) * D_ + i], ga, t_);
      }
    }
  }

  void layer_forward(std::int64_t l, const Vec& u, LayerState& st, Vec& out) {
    Vec f = make_vec(D_, bits_), s = make_vec(D_, bits_);
    switch (c_.block) {
      case Block::post:  // Norm(u + F(u))
      case Block::deepnorm:  // Norm(alpha u + F(u))
        ffn_forward(l, u, st, f);
        for (std::int64_t i = 0; i < D_; ++i) {
          mul_d(s[i], u[i], c_.alpha, t_);
          acc(s[i], f[i]);
        }
        norm_forward(l, 0, s, st.n0, out);
        break;
      case Block::pre:  // u + F(Norm(u))
        norm_forward(l, 0, u, st.n0, s);
        ffn_forward(l, s, st, f);
        for (std::int64_t i = 0; i < D_; ++i) add(out[i], u[i], f[i]);
        break;
      case Block::sandwich:  // u + Norm1(F(Norm0(u)))
        norm_forward(l, 0, u, st.n0, s);
        ffn_forward(l, s, st, f);
        norm_forward(l, 1, f, st.n1, s);
        for (std::int64_t i = 0; i < D_; ++i) add(out[i], u[i], s[i]);
        break;
      case Block::none: break;
    }
  }

  void layer_backward(std::int64_t l, const LayerState& st, const Vec& gout, Vec& gin, Vec& gw, Vec& gb,
                      Vec& gw1, Vec& gb1, Vec& gw2, Vec& gb2) {
    Vec gs = make_vec(D_, bits_), gf = make_vec(D_, bits_);
    switch (c_.block) {
      case Block::post:
      case Block::deepnorm:
        norm_backward(l, 0, st.n0, gout, gs, gw, gb);  // gradient at s = alpha u + F(u)
        ffn_backward(l, st, gs, gf, gw1, gb1, gw2, gb2);
        for (std::int64_t i = 0; i < D_; ++i) {
          mul_d(gin[i], gs[i], c_.alpha, t_);
          acc(gin[i], gf[i]);
        }
        break;
      case Block::pre:
        ffn_backward(l, st, gout, gf, gw1, gb1, gw2, gb2);  // gradient at Norm(u)
        norm_backward(l, 0, st.n0, gf, gs, gw, gb);
        for (std::int64_t i = 0; i < D_; ++i) add(gin[i], gout[i], gs[i]);
        break;
      case Block::sandwich:
        norm_backward(l, 1, st.n1, gout, gs, gw, gb);  // gradient at F's output
        ffn_backward(l, st, gs, gf, gw1, gb1, gw2, gb2);  // at Norm0(u)
        norm_backward(l, 0, st.n0, gf, gs, gw, gb);
        for (std::int64_t i = 0; i < D_; ++i) add(gin[i], gout[i], gs[i]);
        break;
      case Block::none: break;
    }
  }

  const Case& c_;
  int bits_;
  GeluConstants k_;
  Real t_;  // scratch
  Tensors in_{};
  Vec scales_;
  std::int64_t D_ = 0, F_ = 0, L_ = 0, K_ = 1, rows_ = 0;
};

}  // namespace

Result evaluate_block(const Case& c, const Options& opt) {
  Result res;
  if (opt.fast_path) {  // balls first: taken only when every rounding is decided
    BlockEvaluator<Ball> ev(c, kBallBits);
    if (ev.run(res)) {
      for (const auto& [name, o] : res.outputs) {
        res.stats.elements += static_cast<std::int64_t>(o.certified.size());
        res.stats.uncertified += count_zero_bytes(o.certified);
      }
      res.stats.fast = res.stats.elements;
      return res;
    }
    res = Result{};
  }
  // Blocks chain many operations: start at 128 bits at least.
  for (int bits = std::max(opt.start_bits, 128);; bits *= 2) {
    Result attempt;
    BlockEvaluator<Iv> ev(c, bits);
    const bool ok = ev.run(attempt);
    attempt.stats.max_bits_used = bits;
    if (ok || bits * 2 > opt.max_bits) {
      res = std::move(attempt);
      break;
    }
  }
  for (const auto& [name, o] : res.outputs) {
    res.stats.elements += static_cast<std::int64_t>(o.certified.size());
    res.stats.uncertified += count_zero_bytes(o.certified);
  }
  res.stats.slow = res.stats.elements;
  return res;
}

}  // namespace normcheck::ref::detail
