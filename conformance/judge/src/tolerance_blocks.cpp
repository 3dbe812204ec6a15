// The tolerance model of residual blocks (TOLERANCE.md, "Residual blocks").
#include <algorithm>
#include <cmath>

#include "tolerance_model.hpp"

namespace normcheck::conf::tol {

// One function: the lambdas below (a norm, the FFN's products, their backward passes) share the
// per-row state of every layer, the column bounds of every row and the untrusted count; the
// block types are the cases of one switch forward and one backward.
std::map<std::string, OutputAllowance> Model::derive_block() {
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

}  // namespace normcheck::conf::tol
