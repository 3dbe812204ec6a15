// The tolerance model (TOLERANCE.md has the derivation of every line).
//
// Notation: u = unit roundoff of the compute dtype, gam(k) = k u / (1 - k u), eta = half the
// smallest subnormal spacing of the compute dtype (the absolute floor of a rounding). Row
// quantities are evaluated in binary64 from the case's inputs: they are magnitudes that scale
// the bounds, so their own rounding errors (relative 2^-53) do not matter; the comparison itself
// is against the certified expected_f64.
#include "normcheck/conformance/tolerance.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "normcheck/conformance/candidate.hpp"
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

DType role_dtype(const ref::Case& c, ref::DTypeRole r) {
  switch (r) {
    case ref::DTypeRole::x: return c.dtype_x;
    case ref::DTypeRole::param: return c.dtype_param;
    case ref::DTypeRole::compute: return c.dtype_compute;
    case ref::DTypeRole::out: return c.dtype_out;
    case ref::DTypeRole::residual: return c.dtype_residual;
  }
  return c.dtype_compute;
}

struct Points {
  std::optional<DType> h, xhat, scale, mul;
};

Points points_of(const ref::Case& c) {
  Points p;
  const auto contract = ref::parse_contract(c.contract);
  if (!contract) throw ref::CaseError("contract", "unknown contract " + c.contract);
  for (const auto& rp : contract->points) {
    const DType t = role_dtype(c, rp.to);
    switch (rp.point) {
      case ref::Point::h: p.h = t; break;
      case ref::Point::xhat: p.xhat = t; break;
      case ref::Point::scale: p.scale = t; break;
      case ref::Point::mul: p.mul = t; break;
    }
  }
  return p;
}

// One normalized row: values and error bounds of the intermediates (TOLERANCE.md, section 3).
struct RowModel {
  bool finite = true;
  bool trusted = true;
  double mean = 0, rstd = 0;
  double e_mean = 0, e_rstd_rel = 0, e_q_rel = 0;
  double kappa = 0, max_e_xhat = 0;
  double A = 0;
  std::vector<double> h, e_h_pre, d, xhat, e_xhat;
  // Error of our binary64 x-hat: the mean of n terms errs by ~n 2^-53 A, scaled by rstd, plus
  // a few roundings of x-hat itself.
  double slack_xhat(std::int64_t j) const {
    return slack_of(A * rstd, static_cast<double>(h.size())) + slack_of(std::fabs(xhat[j]), 8);
  }
};

class Model {
 public:
  explicit Model(const ref::Case& c)
      : c_(c), g_(ref::geometry_of(c)), pts_(points_of(c)) {
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
    std::map<std::string, OutputAllowance> out;
    for (const auto& [name, spec] : output_specs(c_)) {
      std::int64_t numel = 1;
      for (auto s : spec.shape) numel *= s;
      out[name].abs.assign(static_cast<std::size_t>(numel), 0.0);
      out[name].nan_ok.assign(static_cast<std::size_t>(numel), 0);
    }
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
    RowModel worst;
    bool have_worst = false;

    RowModel m;
    for (std::int64_t row = 0; row < R; ++row) {
      row_model(row, m);
      if (!m.trusted && (!have_worst || m.max_e_xhat > worst.max_e_xhat || m.e_q_rel > worst.e_q_rel)) {
        worst = m;
        have_worst = true;
      }
      if (!m.trusted) ++untrusted_rows;
      const std::int64_t base = g_.row_base[row];
      if (fwd) {
        auto& y = out.at("y");
        for (std::int64_t j = 0; j < n; ++j) {
          const std::size_t k = static_cast<std::size_t>(base + g_.col_delta[j]);
          if (!m.finite) {
            y.abs[k] = ieee_allowance(c_.dtype_out);
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
        if (ln) out.at("mean").abs[row] = m.finite ? final_allowance(m.mean, m.e_mean, c_.dtype_compute)
                                                  : ieee_allowance(c_.dtype_compute);
        out.at("rstd").abs[row] = !m.finite ? ieee_allowance(c_.dtype_compute)
                                  : m.e_q_rel >= kBounds.mistrust
                                      ? kNaN
                                      : final_allowance(m.rstd, m.rstd * m.e_rstd_rel, c_.dtype_compute);
        if (r_) {
          auto& ro = out.at("residual_out");
          for (std::int64_t j = 0; j < n; ++j) {
            const std::size_t k = static_cast<std::size_t>(base + g_.col_delta[j]);
            ro.abs[k] = m.finite ? final_allowance(m.h[j], m.e_h_pre[j], c_.dtype_residual)
                                 : ieee_allowance(c_.dtype_residual);
            // residual_out is h itself: its elements are independent, NaN only where h is NaN.
          }
        }
        continue;
      }
      backward_row(row, m, scale, e_scale, out, dw, db, drb, col_nonfinite);
    }
    if (!fwd) {
      const double gr = cp_.gam(static_cast<double>(R + 1));
      auto column = [&](const char* name, const ColumnBound& cb) {
        const auto& abs = cb.abs;
        const auto& err = cb.err;
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
          else a = final_allowance(abs[j], err[j] + gr * abs[j] + static_cast<double>(R) * cp_.eta, c_.dtype_param);
        }
      };
      column("dweight", dw);
      column("dbias", db);
      column("dresidual_bias", drb);
    }
    for (auto& [name, a] : out) {
      a.mistrusted = std::count_if(a.abs.begin(), a.abs.end(), [](double v) { return std::isnan(v); });
      if (a.mistrusted > 0 && have_worst) {
        a.reason = fmt::format(
            "{} of {} rows too ill-conditioned for {} compute: row length {}, condition {:.3g}, bound on "
            "x-hat error {:.3g} and on the relative variance error {:.3g} (MISTRUSTED at >= {})",
            untrusted_rows, R, ref::name_of(c_.dtype_compute), n, worst.kappa, worst.max_e_xhat, worst.e_q_rel,
            kBounds.mistrust);
      }
    }
    return out;
  }

  // Section 7: a block of L layers, forward. Each row (a position) is propagated through the
  // layers as values with error bounds; the FFN's products and the activation add theirs.
  std::map<std::string, OutputAllowance> derive_block_forward() {
    const std::int64_t R = g_.rows, D = g_.cols;
    const std::int64_t L = c_.layers, K = c_.block == ref::Block::sandwich ? 2 : 1;
    const auto& w1 = c_.inputs.at("ffn_w1");
    const auto& b1 = c_.inputs.at("ffn_b1");
    const auto& w2 = c_.inputs.at("ffn_w2");
    const auto& b2 = c_.inputs.at("ffn_b2");
    const std::int64_t F = b1.shape.back();
    std::map<std::string, OutputAllowance> out;
    auto& y = out["y"];
    y.abs.assign(static_cast<std::size_t>(R * D), 0.0);
    y.nan_ok.assign(static_cast<std::size_t>(R * D), 0);
    std::int64_t untrusted_rows = 0;
    RowModel m, worst;
    bool have_worst = false;
    std::vector<double> v(D), e_v(D), mag(D), nv(D), e_nv(D), a(F), e_a(F), f(D), e_f(D), fmag(D);
    // Norm k of layer l applied to (in, e_in) -> (o, e_o); false when the row is untrusted.
    auto norm = [&](std::int64_t l, std::int64_t k, const std::vector<double>& in, const std::vector<double>& e_in,
                    std::vector<double>& o, std::vector<double>& e_o) {
      m.h = in;
      m.finite = true;
      stats(m, e_in);
      if (!m.trusted && (!have_worst || m.max_e_xhat > worst.max_e_xhat)) {
        worst = m;
        have_worst = true;
      }
      const std::int64_t p = (l * K + k) * D;
      for (std::int64_t j = 0; j < D; ++j) {
        const double w = w_ ? w_->data[static_cast<std::size_t>(p + j)] : 0.0;
        const double scale = w_ ? c_.weight_offset + w : 1.0;
        const double e_sc = w_ ? cp_.conv(w, c_.dtype_param) + (c_.weight_offset != 0 ? cp_.u * std::fabs(scale) : 0.0) : 0.0;
        const double bias = b_ ? b_->data[static_cast<std::size_t>(p + j)] : 0.0;
        const double mul = m.xhat[j] * scale;
        o[j] = mul + bias;
        e_o[j] = std::fabs(scale) * m.e_xhat[j] + std::fabs(m.xhat[j]) * e_sc + m.e_xhat[j] * e_sc +
                 (w_ ? cp_.u * std::fabs(mul) : 0.0) + (b_ ? cp_.conv(bias, c_.dtype_param) + cp_.u * std::fabs(o[j]) + cp_.eta : 0.0);
      }
      return m.trusted;
    };
    // F(in) = W2 act(W1 in + b1) + b2 of layer l, with error bounds (7.2).
    auto ffn = [&](std::int64_t l, const std::vector<double>& in, const std::vector<double>& e_in) {
      for (std::int64_t i = 0; i < F; ++i) {
        double acc = b1.data[static_cast<std::size_t>(l * F + i)], abs_sum = std::fabs(acc), err = cp_.conv(acc, c_.dtype_param);
        const double* row = &w1.data[static_cast<std::size_t>((l * F + i) * D)];
        for (std::int64_t j = 0; j < D; ++j) {
          acc += row[j] * in[j];
          abs_sum += std::fabs(row[j] * in[j]);
          err += std::fabs(row[j]) * e_in[j] + cp_.conv(row[j], c_.dtype_param) * (std::fabs(in[j]) + e_in[j]);
        }
        err += cp_.gam(static_cast<double>(D + 1)) * abs_sum + static_cast<double>(D + 1) * cp_.eta;
        if (c_.activation == ref::Activation::relu) {
          a[i] = std::max(acc, 0.0);
          e_a[i] = err;  // relu is 1-Lipschitz and exact
        } else {
          a[i] = 0.5 * acc * (1 + std::erf(acc / std::sqrt(2.0)));
          // GELU is 1.13-Lipschitz (max of its derivative, at u = 2^0.5); its evaluation (erf to
          // a few ulp, three roundings) within kGeluEval u |u|.
          e_a[i] = 1.13 * err + kGeluEval * cp_.u * std::fabs(acc) + cp_.eta;
        }
      }
      for (std::int64_t j = 0; j < D; ++j) {
        double acc = b2.data[static_cast<std::size_t>(l * D + j)], abs_sum = std::fabs(acc), err = cp_.conv(acc, c_.dtype_param);
        const double* row = &w2.data[static_cast<std::size_t>((l * D + j) * F)];
        for (std::int64_t i = 0; i < F; ++i) {
          acc += row[i] * a[i];
          abs_sum += std::fabs(row[i] * a[i]);
          err += std::fabs(row[i]) * e_a[i] + cp_.conv(row[i], c_.dtype_param) * (std::fabs(a[i]) + e_a[i]);
        }
        f[j] = acc;
        e_f[j] = err + cp_.gam(static_cast<double>(F + 1)) * abs_sum + static_cast<double>(F + 1) * cp_.eta;
        fmag[j] = abs_sum;
      }
    };
    for (std::int64_t row = 0; row < R; ++row) {
      const std::int64_t base = g_.row_base[row];
      for (std::int64_t j = 0; j < D; ++j) {
        v[j] = x_->data[static_cast<std::size_t>(base + j)];
        e_v[j] = cp_.conv(v[j], c_.dtype_x);
      }
      bool trusted = true;
      for (std::int64_t l = 0; l < L && trusted; ++l) {
        switch (c_.block) {
          case ref::Block::post:
          case ref::Block::deepnorm: {
            ffn(l, v, e_v);
            const double al = c_.block == ref::Block::deepnorm ? c_.alpha : 1.0;
            for (std::int64_t j = 0; j < D; ++j) {
              const double sum = al * v[j] + f[j];
              e_f[j] = std::fabs(al) * e_v[j] + e_f[j] + (al != 1 ? 2 : 1) * cp_.u * (std::fabs(al * v[j]) + std::fabs(f[j]));
              f[j] = sum;
            }
            trusted = norm(l, 0, f, e_f, v, e_v);
            break;
          }
          case ref::Block::pre:
          case ref::Block::sandwich: {
            trusted = norm(l, 0, v, e_v, nv, e_nv);
            ffn(l, nv, e_nv);
            if (c_.block == ref::Block::sandwich) {
              trusted = norm(l, 1, f, e_f, nv, e_nv) && trusted;
              f.swap(nv);
              e_f.swap(e_nv);
            }
            for (std::int64_t j = 0; j < D; ++j) {
              const double sum = v[j] + f[j];
              e_v[j] = e_v[j] + e_f[j] + cp_.u * std::fabs(sum);
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
            e_v[j] = through_rounding(v[j], e_v[j], slack_of(std::fabs(v[j]) + fmag[j] + 1, static_cast<double>(4 * (D + F))),
                                      c_.dtype_x);
            v[j] = ref::round_to(v[j], c_.dtype_x);
          }
        }
      }
      if (!trusted) ++untrusted_rows;
      for (std::int64_t j = 0; j < D; ++j)
        y.abs[static_cast<std::size_t>(base + j)] = trusted ? final_allowance(v[j], e_v[j], c_.dtype_out) : kNaN;
    }
    y.mistrusted = std::count_if(y.abs.begin(), y.abs.end(), [](double e) { return std::isnan(e); });
    if (y.mistrusted > 0 && have_worst)
      y.reason = fmt::format(
          "{} of {} rows too ill-conditioned for {} compute in some layer: hidden size {}, condition {:.3g}, bound on "
          "x-hat error {:.3g} (MISTRUSTED at >= {})",
          untrusted_rows, R, ref::name_of(c_.dtype_compute), D, worst.kappa, worst.max_e_xhat, kBounds.mistrust);
    return out;
  }

 private:
  static constexpr double kGeluEval = 8;  // TOLERANCE.md, The table

  // Non-finite rows follow IEEE rules exactly in the reference; a correct kernel may differ by
  // one rounding in the finite elements (e.g. +-0 + bias).
  double ieee_allowance(DType t) const { return 0.5 * ulp_of(0, t) + cp_.eta; }

  double value(const ref::Tensor* t, std::int64_t i) const { return t ? t->data[static_cast<std::size_t>(i)] : 0.0; }

  void row_model(std::int64_t row, RowModel& m) const {
    const std::int64_t n = g_.cols;
    const std::int64_t base = g_.row_base[row];
    m.h.resize(n);
    m.e_h_pre.resize(n);
    m.d.resize(n);
    m.xhat.resize(n);
    m.e_xhat.resize(n);
    m.finite = true;
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
      if (pts_.h) {
        e = through_rounding(h, e, slack_of(std::fabs(c_.alpha * x) + std::fabs(value(r_, k)) + (rb_ ? std::fabs(value(rb_, j)) : 0.0), 3), *pts_.h);
        h = ref::round_to(h, *pts_.h);
      }
      if (!std::isfinite(h)) m.finite = false;
      m.h[j] = h;
      e_h[j] = e;
    }
    if (!m.finite) {
      m.trusted = true;
      return;
    }
    stats(m, e_h);
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
    m.trusted = m.e_q_rel < kBounds.mistrust && m.max_e_xhat < kBounds.mistrust;
  }

  // Section 4: the backward pass of one row, and its contributions to the column sums.
  // Column sums of one parameter tensor: per element, the sum over rows of |term| and of the
  // propagated errors (section 4: allowance = err + gam(R+1) abs + R eta).
  struct ColumnBound {
    std::vector<double> abs, err;
    void resize(std::size_t n) {
      abs.assign(n, 0.0);
      err.assign(n, 0.0);
    }
  };

  // Section 4 for one row: the upstream gradient dy (errors e_dy) through the norm whose row
  // model is m and whose scale is scale (errors e_scale; nullptr: no weight): dh and its
  // errors, and the row's terms of dweight (sum dy x-hat) and dbias (sum dy).
  void norm_back(const RowModel& m, const double* scale, const double* e_scale, const std::vector<double>& dy,
                 const std::vector<double>& e_dy, std::vector<double>& dh, std::vector<double>& e_dh, ColumnBound* dw,
                 ColumnBound* db, std::size_t col0) const {
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
      dh[j] = m.rstd * K;
      e_dh[j] = m.rstd * e_K * (1 + m.e_rstd_rel) + std::fabs(dh[j]) * m.e_rstd_rel + cp_.u * std::fabs(dh[j]);
    }
  }

  // Section 4: the backward pass of one row, and its contributions to the column sums.
  void backward_row(std::int64_t row, const RowModel& m, const std::vector<double>& scale,
                    const std::vector<double>& e_scale, std::map<std::string, OutputAllowance>& out, ColumnBound& dw,
                    ColumnBound& db, ColumnBound& drb, std::vector<std::uint8_t>& col_nonfinite) const {
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
      return;
    }
    std::vector<double> dy(n), e_dy(n), dh, e_dh;
    for (std::int64_t j = 0; j < n; ++j) {
      dy[j] = value(dy_, base + g_.col_delta[j]);
      e_dy[j] = cp_.conv(dy[j], c_.dtype_out);
    }
    norm_back(m, w_ ? scale.data() : nullptr, e_scale.data(), dy, e_dy, dh, e_dh, &dw, &db, 0);
    for (std::int64_t j = 0; j < n; ++j) {
      const std::size_t k = static_cast<std::size_t>(base + g_.col_delta[j]);
      if (!m.trusted) {
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
  }

  const ref::Case& c_;
  ref::Geometry g_;
  Points pts_;
  Compute cp_{};
  const ref::Tensor *x_ = nullptr, *w_ = nullptr, *b_ = nullptr, *r_ = nullptr, *rb_ = nullptr, *dy_ = nullptr;
};

}  // namespace

std::map<std::string, OutputAllowance> derive_allowances(const ref::Case& c) {
  if (c.block != ref::Block::none && c.direction == ref::Direction::forward) return Model(c).derive_block_forward();
  if (c.block != ref::Block::none) {
    // Blocks: no derived bound yet (TOLERANCE.md, "Not covered"): every output MISTRUSTED.
    std::map<std::string, OutputAllowance> out;
    for (const auto& [name, spec] : output_specs(c)) {
      std::int64_t numel = 1;
      for (auto s : spec.shape) numel *= s;
      auto& a = out[name];
      a.abs.assign(static_cast<std::size_t>(numel), kNaN);
      a.nan_ok.assign(static_cast<std::size_t>(numel), 0);
      a.mistrusted = numel;
      a.reason = "no error bound derived for the gradients of residual blocks yet (TOLERANCE.md, \"Not covered\")";
    }
    return out;
  }
  return Model(c).derive();
}

}  // namespace normcheck::conf
