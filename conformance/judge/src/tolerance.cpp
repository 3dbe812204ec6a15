// The tolerance model (TOLERANCE.md has the derivation of every line).
//
// Notation: u = unit roundoff of the compute dtype, gam(k) = k u / (1 - k u), eta = half the
// smallest subnormal spacing of the compute dtype (the absolute floor of a rounding). Row
// quantities are evaluated in binary64 from the case's inputs: they are magnitudes that scale
// the bounds, so their own rounding errors (relative 2^-53) do not matter; the comparison itself
// is against the certified expected_f64.
#include "normcheck/judge/tolerance.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "normcheck/reference/outputs.hpp"
#include "normcheck/reference/contract.hpp"

namespace normcheck::conf {

// The table. Each constant is justified in TOLERANCE.md, section "The table".
const BoundConstants kBounds{
    /*welford=*/6.0,   // Chan & Lewis (1979): updating algorithms err by O(n u kappa); 6 covers
                       // |x_k - M_{k-1}| <= 3 rms(d) in the product rule (TOLERANCE.md, 3.2)
    /*sqrt_div=*/4.0,  // 2 ulp: correctly rounded sqrt + division, or CUDA rsqrtf (2 ulp)
    /*mistrust=*/0.5,  // a bound of half the row's standard deviation on x-hat means nothing
};

namespace {

using ref::DType;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

double ulp_of(double v, DType t) {
  const auto f = ref::format_of(t);
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  // The binade from the exponent field (binary64 subnormals are far below every min_exp here).
  int e = static_cast<int>((bits >> 52) & 0x7ff);
  e = e == 0x7ff ? f.max_exp : std::max(e - 1023, f.min_exp);
  const int q = e - f.precision + 1;  // >= -1074 for every format here: a normal binary64 or 2^-1074
  if (q < -1022) return std::ldexp(1.0, q);
  const std::uint64_t r = static_cast<std::uint64_t>(q + 1023) << 52;
  double out;
  std::memcpy(&out, &r, sizeof out);
  return out;
}

namespace {

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
double through_rounding(double v, double e, double slack, DType t) {
  if (e == 0) return 0;
  const double r = ref::round_to(v, t);
  if (std::isfinite(r) && std::isfinite(v)) {
    const auto gap = ref::rounding_gap(r, t);
    const double dist = std::min(v - (r - gap.below), (r + gap.above) - v);
    if (dist > e + slack) return 0;
  }
  return e + ulp_of(std::fabs(v) + e, t);
}

// Relative error of the binary64 evaluation of a row quantity after k operations: 2^-50 per
// operation is four times the unit roundoff of binary64, a margin for the slack above.
double slack_of(double magnitude, double k) { return std::ldexp(k + 4, -50) * magnitude; }

// Final rounding of a value computed with error e to the output dtype t: within e of the exact
// value before rounding, then half an ulp.
double final_allowance(double v, double e, DType t) {
  if (!std::isfinite(e)) return kNaN;
  return e + 0.5 * ulp_of(std::fabs(v) + e, t);
}

const ref::Tensor* find_input(const ref::Case& c, const char* name) {
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
  // Error of our binary64 x-hat: the mean of n terms errs by ~n 2^-53 A, scaled by rstd, plus
  // a few roundings of x-hat itself.
  double slack_xhat(std::int64_t j) const {
    return slack_of(A * rstd, static_cast<double>(h.size())) + slack_of(std::fabs(xhat[j]), 8);
  }
};

class Model {
 public:
  explicit Model(const ref::Case& c)
      : c_(c), g_(ref::geometry_of(c)), pts_(ref::resolve_points(c)) {
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

  std::map<std::string, OutputAllowance> derive() {
    const std::int64_t R = g_.rows, n = g_.cols;
    const bool ln = c_.op == ref::Op::layernorm;
    const bool fwd = c_.direction == ref::Direction::forward;
    std::map<std::string, OutputAllowance> out = empty_allowances();
    // Column (parameter) values shared by all rows.
    std::vector<double> scale(n, 1.0), e_scale(n, 0.0), scale_fwd(n, 1.0), e_scale_fwd(n, 0.0);
    std::vector<double> bias(n, 0.0), e_bias(n, 0.0);
    for (std::int64_t j = 0; j < n; ++j) {
      if (w_) {
        const double w = w_->data[j];
        scale[j] = c_.weight_offset + w;
        e_scale[j] = cp_.conv(w, c_.dtype_param) + (c_.weight_offset != 0 ? cp_.u * std::fabs(scale[j]) : 0.0);
        scale_fwd[j] = scale[j];
        e_scale_fwd[j] = e_scale[j];
        if (pts_.scale) {
          scale_fwd[j] = ref::round_to(scale[j], *pts_.scale);
          e_scale_fwd[j] = through_rounding(scale[j], e_scale[j], slack_of(std::fabs(scale[j]), 1), *pts_.scale);
        }
      }
      if (b_) {
        bias[j] = b_->data[j];
        e_bias[j] = cp_.conv(bias[j], c_.dtype_param);
      }
    }
    // Column sums of the backward pass: sum over rows of |terms| and of propagated errors.
    ColumnBound dw, db, drb;
    dw.resize(n);
    db.resize(n);
    drb.resize(n);
    std::vector<std::uint8_t> col_nonfinite(n, 0);
    std::int64_t untrusted_rows = 0;
    Worst worst;
    RowModel m;
    for (std::int64_t row = 0; row < R; ++row) {
      row_model(row, m);
      worst.see(m);
      if (!m.trusted) ++untrusted_rows;
      const std::int64_t base = g_.row_base[row];
      if (fwd) {
        auto& y = out.at("y");
        for (std::int64_t j = 0; j < n; ++j) {
          const std::size_t k = static_cast<std::size_t>(base + g_.col_delta[j]);
          if (!m.finite) {
            // The finite elements of such a row are the bias (RMSNorm: rstd = 0), which a correct
            // kernel rounds to dtype_out once (found by the property tests: a float64 bias
            // rounded to a float32 y failed the subnormal-sized allowance).
            y.abs[k] = std::max(ieee_allowance(c_.dtype_out),
                                final_allowance(bias[j], e_bias[j] + cp_.eta, c_.dtype_out));
            y.nan_ok[k] = 1;
            continue;
          }
          if (!m.trusted) {
            y.abs[k] = kNaN;
            continue;
          }
          double xh = m.xhat[j], e_xh = m.e_xhat[j];
          if (pts_.xhat) {
            e_xh = through_rounding(xh, e_xh, m.slack_xhat(j), *pts_.xhat);
            xh = ref::round_to(xh, *pts_.xhat);
          }
          double mul = xh, e_mul = e_xh;
          if (w_) {
            mul = xh * scale_fwd[j];
            e_mul = std::fabs(scale_fwd[j]) * e_xh + std::fabs(xh) * e_scale_fwd[j] + e_xh * e_scale_fwd[j] +
                    cp_.u * std::fabs(mul);
          }
          if (pts_.mul) {
            e_mul = through_rounding(
                mul, e_mul, m.slack_xhat(j) * std::fabs(scale_fwd[j]) + slack_of(std::fabs(mul), 1), *pts_.mul);
            mul = ref::round_to(mul, *pts_.mul);
          }
          const double yv = mul + bias[j];
          const double e_y = e_mul + e_bias[j] + (b_ ? cp_.u * std::fabs(yv) + cp_.eta : 0.0);
          y.abs[k] = final_allowance(yv, e_y, c_.dtype_out);
        }
        if (!m.finite) {
          if (ln) out.at("mean").nan_ok[row] = 1;
          out.at("rstd").nan_ok[row] = 1;
        }
        if (ln) out.at("mean").abs[row] = !m.finite  ? ieee_allowance(c_.dtype_compute)
                                          : m.overflow_mean ? kNaN
                                                       : final_allowance(m.mean, m.e_mean, c_.dtype_compute);
        out.at("rstd").abs[row] = !m.finite ? ieee_allowance(c_.dtype_compute)
                                  : m.e_q_rel >= kBounds.mistrust || m.overflow
                                      ? kNaN
                                      : final_allowance(m.rstd, m.rstd * m.e_rstd_rel, c_.dtype_compute);
        if (r_) {
          auto& ro = out.at("residual_out");
          for (std::int64_t j = 0; j < n; ++j) {
            const std::size_t k = static_cast<std::size_t>(base + g_.col_delta[j]);
            // residual_out is h itself: its elements are independent, NaN only where h is NaN, so
            // a finite h in a row holding a NaN or an infinity keeps the allowance of its own
            // roundings (found by the property tests: a correctly rounded x + residual failed).
            // residual_out is h after the contract's h point: where that rounding may go either
            // way (through_rounding), a correct kernel's h is a neighbour (found by the property
            // tests: h summed in float32, then rounded to float16 onto a tie).
            ro.abs[k] = !std::isfinite(m.h[j]) ? ieee_allowance(c_.dtype_residual)
                        : m.h_overflow[j]      ? kNaN
                                               : final_allowance(m.h[j], std::max(m.e_h_pre[j], m.e_h_post[j]),
                                                                 c_.dtype_residual);
          }
        }
        continue;
      }
      // A row whose backward sums may overflow counts as untrusted: its dh enters
      // dresidual_bias, and the column sums are MISTRUSTED with it (dbias excepted, as above).
      if (!backward_row(row, m, scale, e_scale, out, dw, db, drb, col_nonfinite, worst) && m.trusted) ++untrusted_rows;
    }
    if (!fwd) {
      auto column = [&](const char* name, const ColumnBound& cb) {
        auto it = out.find(name);
        if (it == out.end()) return;
        for (std::int64_t j = 0; j < n; ++j) {
          double& a = it->second.abs[static_cast<std::size_t>(j)];
          if (col_nonfinite[j]) {
            // A column sum that a non-finite row enters: the reference gives NaN (its policy),
            // while the IEEE result of a kernel depends on its order and on whether it forms
            // x-hat at all (dbias = sum dy is finite when only x is infinite). Not constrained.
            a = kInf;
            it->second.nan_ok[static_cast<std::size_t>(j)] = 1;
          }
          else if (untrusted_rows > 0 && std::string_view(name) != "dbias") a = kNaN;
          else if (may_overflow(cb.abs[static_cast<std::size_t>(j)] + cb.err[static_cast<std::size_t>(j)], R, worst))
            a = kNaN;
          else a = column_allowance(cb, static_cast<std::size_t>(j), R);
        }
      };
      column("dweight", dw);
      column("dbias", db);
      column("dresidual_bias", drb);
    }
    count_mistrusted(out, worst, untrusted_rows, R, "");
    return out;
  }

  // Section 7: a block of L layers. Each row (a position) is propagated through the layers as
  // values with error bounds; the FFN's products and the activation add theirs. Backward
  // (section 8) walks the layers in reverse with the saved forward states.
  std::map<std::string, OutputAllowance> derive_block() {
    const std::int64_t R = g_.rows, D = g_.cols;
    const std::int64_t L = c_.layers, K = c_.block == ref::Block::sandwich ? 2 : 1;
    const bool bwd = c_.direction == ref::Direction::backward;
    const auto& w1 = c_.inputs.at("ffn_w1");
    const auto& b1 = c_.inputs.at("ffn_b1");
    const auto& w2 = c_.inputs.at("ffn_w2");
    const auto& b2 = c_.inputs.at("ffn_b2");
    const std::int64_t F = b1.shape.back();
    const bool relu = c_.activation == ref::Activation::relu;
    std::map<std::string, OutputAllowance> out = empty_allowances();
    std::int64_t untrusted_rows = 0;
    Worst worst;
    bool back_overflow = false;  // a backward sum of the current row may overflow (section 5)
    // Scales of every norm (offset + weight) and their errors.
    std::vector<double> scale(static_cast<std::size_t>(L * K * D), 1.0), e_scale(scale.size(), 0.0);
    for (std::size_t p = 0; w_ && p < scale.size(); ++p) {
      const double w = w_->data[p];
      scale[p] = c_.weight_offset + w;
      e_scale[p] = cp_.conv(w, c_.dtype_param) + (c_.weight_offset != 0 ? cp_.u * std::fabs(scale[p]) : 0.0);
    }
    struct LayerState {
      RowModel n0, n1;                          // the norms' row models
      std::vector<double> nin, e_nin;           // FFN input
      std::vector<double> z, e_z, a, e_a;       // FFN pre-activation and activation
    };
    std::vector<LayerState> st(static_cast<std::size_t>(L));
    // Norm k of layer l over (in, e_in) into (o, e_o), its row model saved in `m`; false when
    // the row is untrusted (section 5).
    auto norm = [&](std::int64_t l, std::int64_t k, RowModel& m, const std::vector<double>& in,
                    const std::vector<double>& e_in, std::vector<double>& o, std::vector<double>& e_o) {
      m.h = in;
      m.finite = true;
      stats(m, e_in);
      worst.see(m);
      const std::int64_t p = (l * K + k) * D;
      o.resize(D);
      e_o.resize(D);
      for (std::int64_t j = 0; j < D; ++j) {
        const double sc = scale[p + j], e_sc = e_scale[p + j];
        const double bias = b_ ? b_->data[static_cast<std::size_t>(p + j)] : 0.0;
        const double mul = m.xhat[j] * sc;
        o[j] = mul + bias;
        e_o[j] = std::fabs(sc) * m.e_xhat[j] + std::fabs(m.xhat[j]) * e_sc + m.e_xhat[j] * e_sc +
                 (w_ ? cp_.u * std::fabs(mul) : 0.0) +
                 (b_ ? cp_.conv(bias, c_.dtype_param) + cp_.u * std::fabs(o[j]) + cp_.eta : 0.0);
      }
      return m.trusted;
    };
    // A product W x + b of rows of length n (section 7.2): value and bound.
    // A sum of the FFN whose |terms| reach the compute dtype's largest finite value may overflow
    // in a correct kernel: the position is MISTRUSTED (section 5).
    bool ffn_overflow = false;
    auto product = [&](const double* W, double b, const std::vector<double>& x, const std::vector<double>& e_x,
                       std::int64_t n, double& val, double& err, double& mag) {
      double acc = b, abs_sum = std::fabs(b), e = cp_.conv(b, c_.dtype_param);
      for (std::int64_t j = 0; j < n; ++j) {
        acc += W[j] * x[j];
        abs_sum += std::fabs(W[j] * x[j]);
        e += std::fabs(W[j]) * e_x[j] + cp_.conv(W[j], c_.dtype_param) * (std::fabs(x[j]) + e_x[j]);
      }
      val = acc;
      err = e + cp_.gam(static_cast<double>(n + 1)) * abs_sum + static_cast<double>(n + 1) * cp_.eta;
      mag = abs_sum;
      if (may_overflow(abs_sum + err, n, worst)) ffn_overflow = true;
    };
    std::vector<double> f(D), e_f(D), fmag(D);
    // F(in) of layer l: saves z, a in the layer's state; F in f / e_f.
    auto ffn = [&](std::int64_t l, LayerState& s) {
      s.z.resize(F), s.e_z.resize(F), s.a.resize(F), s.e_a.resize(F);
      for (std::int64_t i = 0; i < F; ++i) {
        double mag;
        product(&w1.data[static_cast<std::size_t>((l * F + i) * D)], b1.data[static_cast<std::size_t>(l * F + i)], s.nin,
                s.e_nin, D, s.z[i], s.e_z[i], mag);
        const double zi = s.z[i];
        if (relu) {
          s.a[i] = std::max(zi, 0.0);
          s.e_a[i] = s.e_z[i];  // relu is 1-Lipschitz and exact
        } else {
          s.a[i] = 0.5 * zi * (1 + std::erf(zi / std::sqrt(2.0)));
          // GELU is 1.13-Lipschitz (max of its derivative, at u = 2^0.5); its evaluation (erf to
          // a few ulp, three roundings) within kGeluEval u |u|.
          s.e_a[i] = 1.13 * s.e_z[i] + kGeluEval * cp_.u * std::fabs(zi) + cp_.eta;
        }
      }
      for (std::int64_t j = 0; j < D; ++j)
        product(&w2.data[static_cast<std::size_t>((l * D + j) * F)], b2.data[static_cast<std::size_t>(l * D + j)], s.a,
                s.e_a, F, f[j], e_f[j], fmag[j]);
    };
    // Column bounds of the backward pass.
    ColumnBound dw, db, dw1, db1, dw2, db2;
    if (bwd) {
      dw.resize(scale.size());
      db.resize(scale.size());
      dw1.resize(static_cast<std::size_t>(L * F * D));
      db1.resize(static_cast<std::size_t>(L * F));
      dw2.resize(static_cast<std::size_t>(L * D * F));
      db2.resize(static_cast<std::size_t>(L * D));
    }
    // Backward of F of layer l: upstream gradient gF into the gradient of the FFN input, and
    // the rows' terms of the FFN parameters' gradients (section 8).
    std::vector<double> ga(F), e_ga(F), gz(F), e_gz(F);
    auto ffn_back = [&](std::int64_t l, const LayerState& s, const std::vector<double>& gF,
                        const std::vector<double>& e_gF, std::vector<double>& gin, std::vector<double>& e_gin) {
      for (std::int64_t j = 0; j < D; ++j) {  // dffn_w2[l, j, i] += gF_j a_i, dffn_b2[l, j] += gF_j
        const std::size_t bj = static_cast<std::size_t>(l * D + j);
        db2.abs[bj] += std::fabs(gF[j]);
        db2.err[bj] += e_gF[j];
        for (std::int64_t i = 0; i < F; ++i) {
          const std::size_t k = static_cast<std::size_t>((l * D + j) * F + i);
          const double t = std::fabs(gF[j] * s.a[i]);
          dw2.abs[k] += t;
          dw2.err[k] += std::fabs(gF[j]) * s.e_a[i] + e_gF[j] * (std::fabs(s.a[i]) + s.e_a[i]) + cp_.u * t;
        }
      }
      for (std::int64_t i = 0; i < F; ++i) {  // ga = W2^T gF
        double acc = 0, abs_sum = 0, e = 0;
        for (std::int64_t j = 0; j < D; ++j) {
          const double wv = w2.data[static_cast<std::size_t>((l * D + j) * F + i)];
          acc += wv * gF[j];
          abs_sum += std::fabs(wv * gF[j]);
          e += std::fabs(wv) * e_gF[j] + cp_.conv(wv, c_.dtype_param) * (std::fabs(gF[j]) + e_gF[j]);
        }
        ga[i] = acc;
        e_ga[i] = e + cp_.gam(static_cast<double>(D)) * abs_sum + static_cast<double>(D) * cp_.eta;
        if (may_overflow(abs_sum + e_ga[i], D, worst)) back_overflow = true;
        // gz = ga * act'(z): relu' is 0 or 1, unless the candidate's z may have the other sign;
        // GELU' is within [-0.17, 1.13] and 0.8-Lipschitz (max |GELU''| = 2 phi(0) ~ 0.798).
        const double zi = s.z[i], e_zi = s.e_z[i];
        if (relu) {
          const double d = zi > 0 ? 1.0 : 0.0;
          gz[i] = ga[i] * d;
          e_gz[i] = std::fabs(zi) <= e_zi ? std::fabs(ga[i]) + e_ga[i] : d * e_ga[i];
        } else {
          const double phi = std::exp(-0.5 * zi * zi) / std::sqrt(2 * M_PI);
          const double d = 0.5 * (1 + std::erf(zi / std::sqrt(2.0))) + zi * phi;
          gz[i] = ga[i] * d;
          e_gz[i] = 1.13 * e_ga[i] + (std::fabs(ga[i]) + e_ga[i]) * (0.8 * e_zi + kGeluEval * cp_.u) + cp_.eta;
        }
        const std::size_t bi = static_cast<std::size_t>(l * F + i);
        db1.abs[bi] += std::fabs(gz[i]);
        db1.err[bi] += e_gz[i];
        for (std::int64_t j = 0; j < D; ++j) {  // dffn_w1[l, i, j] += gz_i nin_j
          const std::size_t k = static_cast<std::size_t>((l * F + i) * D + j);
          const double t = std::fabs(gz[i] * s.nin[j]);
          dw1.abs[k] += t;
          dw1.err[k] += std::fabs(gz[i]) * s.e_nin[j] + e_gz[i] * (std::fabs(s.nin[j]) + s.e_nin[j]) + cp_.u * t;
        }
      }
      gin.resize(D);
      e_gin.resize(D);
      for (std::int64_t j = 0; j < D; ++j) {  // gin = W1^T gz
        double acc = 0, abs_sum = 0, e = 0;
        for (std::int64_t i = 0; i < F; ++i) {
          const double wv = w1.data[static_cast<std::size_t>((l * F + i) * D + j)];
          acc += wv * gz[i];
          abs_sum += std::fabs(wv * gz[i]);
          e += std::fabs(wv) * e_gz[i] + cp_.conv(wv, c_.dtype_param) * (std::fabs(gz[i]) + e_gz[i]);
        }
        gin[j] = acc;
        e_gin[j] = e + cp_.gam(static_cast<double>(F)) * abs_sum + static_cast<double>(F) * cp_.eta;
        if (may_overflow(abs_sum + e_gin[j], F, worst)) back_overflow = true;
      }
    };
    auto norm_back_layer = [&](std::int64_t l, std::int64_t k, const RowModel& m, const std::vector<double>& g,
                               const std::vector<double>& e_g, std::vector<double>& gh, std::vector<double>& e_gh) {
      const std::size_t p = static_cast<std::size_t>((l * K + k) * D);
      if (norm_back(m, w_ ? &scale[p] : nullptr, &e_scale[p], g, e_g, gh, e_gh, w_ ? &dw : nullptr, b_ ? &db : nullptr,
                    p, worst))
        back_overflow = true;
    };

    std::vector<double> v(D), e_v(D), o, e_o, g, e_g, t1, e_t1, t2, e_t2;
    for (std::int64_t row = 0; row < R; ++row) {
      const std::int64_t base = g_.row_base[row];
      for (std::int64_t j = 0; j < D; ++j) {
        v[j] = x_->data[static_cast<std::size_t>(base + j)];
        e_v[j] = cp_.conv(v[j], c_.dtype_x);
      }
      bool trusted = true;
      back_overflow = false;
      ffn_overflow = false;
      for (std::int64_t l = 0; l < L; ++l) {
        LayerState& s = st[static_cast<std::size_t>(l)];
        switch (c_.block) {
          case ref::Block::post:
          case ref::Block::deepnorm: {
            s.nin = v;
            s.e_nin = e_v;
            ffn(l, s);
            const double al = c_.block == ref::Block::deepnorm ? c_.alpha : 1.0;
            for (std::int64_t j = 0; j < D; ++j) {
              const double sum = al * v[j] + f[j];
              e_f[j] = std::fabs(al) * e_v[j] + e_f[j] +
                       (al != 1 ? 2 : 1) * cp_.u * (std::fabs(al * v[j]) + std::fabs(f[j]));
              if (may_overflow(std::fabs(al * v[j]) + std::fabs(f[j]) + e_f[j], 2, worst)) ffn_overflow = true;
              f[j] = sum;
            }
            trusted = norm(l, 0, s.n0, f, e_f, v, e_v) && trusted;
            break;
          }
          case ref::Block::pre:
          case ref::Block::sandwich: {
            trusted = norm(l, 0, s.n0, v, e_v, s.nin, s.e_nin) && trusted;
            ffn(l, s);
            if (c_.block == ref::Block::sandwich) {
              trusted = norm(l, 1, s.n1, f, e_f, o, e_o) && trusted;
              f.swap(o);
              e_f.swap(e_o);
            }
            for (std::int64_t j = 0; j < D; ++j) {
              const double sum = v[j] + f[j];
              e_v[j] = e_v[j] + e_f[j] + cp_.u * std::fabs(sum);
              if (may_overflow(std::fabs(v[j]) + std::fabs(f[j]) + e_v[j], 1, worst)) ffn_overflow = true;
              v[j] = sum;
            }
            break;
          }
          case ref::Block::none: break;
        }
        if (l + 1 < L) {
          // Stored activations are rounded to dtype_x (reference/README.md, blocks); our own
          // binary64 evaluation has done O(D + F) operations per value.
          for (std::int64_t j = 0; j < D; ++j) {
            e_v[j] = through_rounding(
                v[j], e_v[j], slack_of(std::fabs(v[j]) + fmag[j] + 1, static_cast<double>(4 * (D + F))), c_.dtype_x);
            v[j] = ref::round_to(v[j], c_.dtype_x);
          }
        }
      }
      trusted = trusted && !ffn_overflow;
      if (!trusted) ++untrusted_rows;
      if (!bwd) {
        auto& y = out.at("y");
        for (std::int64_t j = 0; j < D; ++j)
          y.abs[static_cast<std::size_t>(base + j)] = trusted ? final_allowance(v[j], e_v[j], c_.dtype_out) : kNaN;
        continue;
      }
      // Section 8: the gradient of sum(dy * y) layer by layer; intermediate roundings act as
      // the identity (reference/README.md), so g carries only the compute errors.
      g.resize(D);
      e_g.resize(D);
      for (std::int64_t j = 0; j < D; ++j) {
        g[j] = dy_->data[static_cast<std::size_t>(base + j)];
        e_g[j] = cp_.conv(g[j], c_.dtype_out);
      }
      for (std::int64_t l = L - 1; l >= 0; --l) {
        const LayerState& s = st[static_cast<std::size_t>(l)];
        switch (c_.block) {
          case ref::Block::post:
          case ref::Block::deepnorm: {
            const double al = c_.block == ref::Block::deepnorm ? c_.alpha : 1.0;
            norm_back_layer(l, 0, s.n0, g, e_g, t1, e_t1);  // gradient of the sum
            ffn_back(l, s, t1, e_t1, t2, e_t2);
            for (std::int64_t j = 0; j < D; ++j) {
              g[j] = al * t1[j] + t2[j];
              e_g[j] = std::fabs(al) * e_t1[j] + e_t2[j] + (al != 1 ? 2 : 1) * cp_.u * (std::fabs(al * t1[j]) + std::fabs(t2[j]));
            }
            break;
          }
          case ref::Block::pre:
          case ref::Block::sandwich: {
            std::vector<double> gF = g, e_gF = e_g;
            if (c_.block == ref::Block::sandwich) norm_back_layer(l, 1, s.n1, g, e_g, gF, e_gF);
            ffn_back(l, s, gF, e_gF, t1, e_t1);
            norm_back_layer(l, 0, s.n0, t1, e_t1, t2, e_t2);
            for (std::int64_t j = 0; j < D; ++j) {
              const double sum = g[j] + t2[j];
              e_g[j] = e_g[j] + e_t2[j] + cp_.u * std::fabs(sum);
              g[j] = sum;
            }
            break;
          }
          case ref::Block::none: break;
        }
      }
      if (trusted && back_overflow) {  // a backward sum may overflow: MISTRUSTED, as in the forward
        trusted = false;
        ++untrusted_rows;
      }
      auto& dx = out.at("dx");
      for (std::int64_t j = 0; j < D; ++j)
        dx.abs[static_cast<std::size_t>(base + j)] = trusted ? final_allowance(g[j], e_g[j], c_.dtype_x) : kNaN;
    }
    if (bwd) {
      auto column = [&](const char* name, const ColumnBound& cb) {
        auto it = out.find(name);
        if (it == out.end()) return;
        for (std::size_t k = 0; k < it->second.abs.size(); ++k)
          it->second.abs[k] =
              untrusted_rows > 0 || may_overflow(cb.abs[k] + cb.err[k], R, worst) ? kNaN : column_allowance(cb, k, R);
      };
      column("dweight", dw);
      column("dbias", db);
      column("dffn_w1", dw1);
      column("dffn_b1", db1);
      column("dffn_w2", dw2);
      column("dffn_b2", db2);
    }
    count_mistrusted(out, worst, untrusted_rows, R, " in some layer");
    return out;
  }

 private:
  static constexpr double kGeluEval = 8;  // TOLERANCE.md, The table

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
    void see_overflow(double acc, std::int64_t terms) {
      ++overflow_sums;
      if (acc > overflow_acc) {
        overflow_acc = acc;
        overflow_n = terms;
      }
    }
    void see(const RowModel& m) {
      if (m.overflow) see_overflow(m.acc, static_cast<std::int64_t>(m.h.size()));
      if (m.trusted || (m.overflow && m.e_q_rel < kBounds.mistrust && m.max_e_xhat < kBounds.mistrust) ||
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
    const double e = cb.err[k] + cp_.gam(static_cast<double>(R + 1)) * cb.abs[k] + static_cast<double>(R) * cp_.eta;
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
    }
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
    std::vector<double> e_h(n);
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
      m.e_h_pre[j] = e;
      // Section 5: the terms of h (or x itself) against the compute dtype's range (found by the
      // property tests: 2 x = -105984 in float16 compute gives residual_out = -inf).
      const double terms = r_ ? std::fabs(c_.alpha * x) + std::fabs(value(r_, k)) + (rb_ ? std::fabs(value(rb_, j)) : 0.0)
                              : std::fabs(x);
      if (std::isfinite(terms) && overflows(terms + e, r_ ? 3 : 1)) {
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
      e_h[j] = e;
    }
    if (!m.finite) {
      m.trusted = true;
      return;
    }
    stats(m, e_h);
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
    m.e_mean = ln ? mean_eh + cp_.gam(nd + 1) * (A + mean_eh) + nd * cp_.eta : 0.0;
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
      e_var = kBounds.welford * nd * cp_.u * std::sqrt(mean_sq * var) + cp_.gam(nd + 2) * var +
              m.e_mean * m.e_mean + 2 * sum_d_e / nd + shift * shift + 2 * m.e_mean * shift + nd * cp_.eta;
    } else {
      m.kappa = 1;
      e_var = cp_.gam(nd + 1) * mean_sq + 2 * sum_d_e / nd + max_eh * max_eh + nd * cp_.eta;
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
      const double e_d = e_h[j] + m.e_mean + (ln ? cp_.u * (std::fabs(m.d[j]) + e_h[j] + m.e_mean) : 0.0);
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
    m.trusted = m.e_q_rel < kBounds.mistrust && m.max_e_xhat < kBounds.mistrust && !m.overflow;
  }

  // Whether a sum of `terms` terms whose |terms| (with their errors) add up to `acc` may reach
  // the compute dtype's largest finite value in a correct kernel (each partial sum within
  // gamma(terms) of its exact value).
  bool overflows(double acc, std::int64_t terms) const {
    // A non-finite bound comes from an infinite error bound upstream: that row is untrusted by
    // the first rule already, and nothing is known about its sums.
    if (acc == 0 || !std::isfinite(acc)) return false;
    // Where gamma is unbounded (terms u >= 1/2, float16 rows of 1022 and more) the row is
    // untrusted by the first rule already (its mean and variance bounds are infinite); only a sum
    // whose value itself reaches the limit is called an overflow there.
    const double g = cp_.gam(static_cast<double>(terms));
    return !(acc * (std::isfinite(g) ? 1 + g : 1.0) < ref::max_finite(c_.dtype_compute));
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
    const double e_gbar = ln ? s_eg / nd + cp_.gam(nd + 1) * s_abs_g / nd + nd * cp_.eta : 0.0;
    const double m2 = s_gx / nd;
    const double e_m2 = s_e_gx / nd + cp_.gam(nd + 2) * s_abs_gx / nd + nd * cp_.eta;
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
  Compute cp_{};
  const ref::Tensor *x_ = nullptr, *w_ = nullptr, *b_ = nullptr, *r_ = nullptr, *rb_ = nullptr, *dy_ = nullptr;
};

}  // namespace

std::map<std::string, OutputAllowance> derive_allowances(const ref::Case& c) {
  Model m(c);
  return c.block != ref::Block::none ? m.derive_block() : m.derive();
}

}  // namespace normcheck::conf
