// The engine's residual blocks (reference/README.md, "Residual blocks"): a dialect's forward
// function over every layer, and its gradient.
#include <cmath>
#include <cstdint>
#include <vector>

#include "engine.hpp"

namespace normcheck::conf::diag {

// One function: the lambdas below (a norm, the FFN, their gradients) share the layer states of
// the row being computed and the parameter-gradient accumulators of every row; the block types
// are the four cases of one switch forward and one backward.
template <class Real>
Predictions Engine<Real>::run_block(const Knobs& k, const Layout& lay) const {
  Predictions p;
  const bool bwd = c_.direction == ref::Direction::backward;
  const std::int64_t D = g_.cols, L = c_.layers;
  const std::int64_t KN = c_.block == ref::Block::sandwich ? 2 : 1;
  const auto* w1 = input(c_, "ffn_w1");
  const auto* b1 = input(c_, "ffn_b1");
  const auto* w2 = input(c_, "ffn_w2");
  const auto* b2 = input(c_, "ffn_b2");
  const std::int64_t F = b1->shape.back();
  const bool gelu = c_.activation == ref::Activation::gelu;
  struct NormSt {
    std::vector<LD> xh;
    LD rstd = 0;
  };
  struct LayerSt {
    NormSt n0, n1;
    std::vector<LD> v, a, z;  // the FFN's input, pre-activations and activations
  };
  auto scale_at = [&](std::size_t pi) { return w_ ? k.offset + static_cast<LD>(w_->data[pi]) : LD(1); };
  auto norm = [&](const std::vector<LD>& v, std::int64_t l, std::int64_t kk, bool affine, NormSt* st) {
    const RowStat s = row_stats(v.data(), D, k, c_.dtype_compute);
    if (k.arith == StatArith::one_pass && s.var < 0) p.var_below_zero = true;
    std::vector<LD> out(D);
    if (st) {
      st->xh.resize(D);
      st->rstd = s.rstd;
    }
    for (std::int64_t j = 0; j < D; ++j) {
      const LD xh = (k.centre ? v[j] - s.mean : v[j]) * s.rstd;
      if (st) st->xh[j] = xh;
      LD o = xh;
      const auto pi = static_cast<std::size_t>((l * KN + kk) * D + j);
      if (affine && w_) o *= scale_at(pi);
      if (affine && b_) o += b_->data[pi];
      out[j] = o;
    }
    return out;
  };
  auto act = [&](LD t) { return gelu ? t / 2 * (1 + std::erf(t / std::sqrt(LD(2)))) : (t > 0 ? t : LD(0)); };
  auto act_grad = [&](LD t) {
    if (!gelu) return t > 0 ? LD(1) : LD(0);
    const LD cdf = (1 + std::erf(t / std::sqrt(LD(2)))) / 2;
    const LD pdf = std::exp(-t * t / 2) / std::sqrt(2 * std::acos(LD(-1)));
    return cdf + t * pdf;
  };
  auto ffn = [&](const std::vector<LD>& v, std::int64_t l, LayerSt* st) {
    std::vector<LD> a(F), z(F), out(D);
    for (std::int64_t f = 0; f < F; ++f) {
      LD t = b1->data[l * F + f];
      for (std::int64_t j = 0; j < D; ++j) t += static_cast<LD>(w1->data[(l * F + f) * D + j]) * v[j];
      a[f] = t;
      z[f] = act(t);
    }
    for (std::int64_t j = 0; j < D; ++j) {
      LD t = b2->data[l * D + j];
      for (std::int64_t f = 0; f < F; ++f) t += static_cast<LD>(w2->data[(l * D + j) * F + f]) * z[f];
      out[j] = t;
    }
    if (st) {
      st->v = v;
      st->a = std::move(a);
      st->z = std::move(z);
    }
    return out;
  };
  // Parameter gradients (summed over rows; on a sample they are not predicted: not summed).
  const bool grads = bwd && lay.all_rows;
  std::vector<LD> gw(grads && w_ ? L * KN * D : 0, 0), gb(grads && b_ ? L * KN * D : 0, 0);
  std::vector<LD> gw1(grads ? L * F * D : 0, 0), gb1(grads ? L * F : 0, 0), gw2(grads ? L * D * F : 0, 0),
      gb2(grads ? L * D : 0, 0);
  // gout -> gin through norm (l, kk) (affine: accumulating dweight/dbias).
  auto norm_bwd = [&](const NormSt& st, std::int64_t l, std::int64_t kk, bool affine, const std::vector<LD>& gout) {
    std::vector<LD> g(D), gin(D);
    LD mg = 0, mgx = 0;
    for (std::int64_t j = 0; j < D; ++j) {
      const auto pi = static_cast<std::size_t>((l * KN + kk) * D + j);
      g[j] = affine ? gout[j] * scale_at(pi) : gout[j];
      mg += g[j];
      mgx += g[j] * st.xh[j];
      if (affine && w_ && grads) gw[pi] += gout[j] * st.xh[j];
      if (affine && b_ && grads) gb[pi] += gout[j];
    }
    mg = k.centre ? mg / static_cast<LD>(D) : LD(0);
    mgx /= static_cast<LD>(D);
    for (std::int64_t j = 0; j < D; ++j) gin[j] = (g[j] - mg - st.xh[j] * mgx) * st.rstd;
    return gin;
  };
  // gout (at F's output) -> gradient at F's input, accumulating the FFN's gradients.
  auto ffn_bwd = [&](const LayerSt& st, std::int64_t l, const std::vector<LD>& gout) {
    std::vector<LD> ga(F, 0), gin(D, 0);
    for (std::int64_t j = 0; j < D; ++j) {
      if (grads) gb2[l * D + j] += gout[j];
      for (std::int64_t f = 0; f < F; ++f) {
        if (grads) gw2[(l * D + j) * F + f] += gout[j] * st.z[f];
        ga[f] += static_cast<LD>(w2->data[(l * D + j) * F + f]) * gout[j];
      }
    }
    for (std::int64_t f = 0; f < F; ++f) {
      ga[f] *= act_grad(st.a[f]);
      if (grads) gb1[l * F + f] += ga[f];
      for (std::int64_t j = 0; j < D; ++j) {
        if (grads) gw1[(l * F + f) * D + j] += ga[f] * st.v[j];
        gin[j] += static_cast<LD>(w1->data[(l * F + f) * D + j]) * ga[f];
      }
    }
    return gin;
  };
  auto& y = p[bwd ? "dx" : "y"];
  y.assign(lay.rows.size() * static_cast<std::size_t>(D), 0.0);
  const LD alpha = c_.alpha;
  std::vector<LD> u(D), t(D);
  std::vector<LayerSt> sts(static_cast<std::size_t>(L));
  NormSt extra;
  for (std::size_t ri = 0; ri < lay.rows.size(); ++ri) {
    const std::int64_t row = lay.rows[ri];
    for (std::int64_t j = 0; j < D; ++j) u[j] = x_->data[off(row, j)];
    for (std::int64_t l = 0; l < L; ++l) {
      LayerSt* st = bwd ? &sts[static_cast<std::size_t>(l)] : nullptr;
      switch (c_.block) {
        case ref::Block::post: {
          const auto f = ffn(u, l, st);
          for (std::int64_t j = 0; j < D; ++j) t[j] = u[j] + f[j];
          u = norm(t, l, 0, true, st ? &st->n0 : nullptr);
          break;
        }
        case ref::Block::pre: {
          const auto nrm = norm(u, l, 0, true, st ? &st->n0 : nullptr);
          const auto f = ffn(nrm, l, st);
          for (std::int64_t j = 0; j < D; ++j)
            u[j] = (k.block == BlockMode::pre_residual_after_norm ? nrm[j] : u[j]) + f[j];
          break;
        }
        case ref::Block::sandwich: {
          const auto f = norm(ffn(norm(u, l, 0, true, st ? &st->n0 : nullptr), l, st), l, 1, true,
                               st ? &st->n1 : nullptr);
          for (std::int64_t j = 0; j < D; ++j) u[j] += f[j];
          break;
        }
        case ref::Block::deepnorm: {
          const auto f = ffn(u, l, st);
          for (std::int64_t j = 0; j < D; ++j)
            t[j] = k.block == BlockMode::deepnorm_alpha_on_f ? u[j] + alpha * f[j] : alpha * u[j] + f[j];
          u = norm(t, l, 0, true, st ? &st->n0 : nullptr);
          break;
        }
        case ref::Block::none: break;
      }
      if (l + 1 < L)
        for (auto& v : u) v = rnd(v, c_.dtype_x);
    }
    if (k.block == BlockMode::post_double_norm) u = norm(u, 0, 0, false, bwd ? &extra : nullptr);
    if (bwd) {
      std::vector<LD> g(D);
      for (std::int64_t j = 0; j < D; ++j) g[j] = dy_->data[off(row, j)];
      if (k.block == BlockMode::post_double_norm) g = norm_bwd(extra, 0, 0, false, g);
      for (std::int64_t l = L - 1; l >= 0; --l) {
        const LayerSt& st = sts[static_cast<std::size_t>(l)];
        switch (c_.block) {
          case ref::Block::post:
          case ref::Block::deepnorm: {
            const auto gs = norm_bwd(st.n0, l, 0, true, g);  // at s = alpha u + F(u)
            const bool on_f = k.block == BlockMode::deepnorm_alpha_on_f;
            std::vector<LD> gfo = gs;
            if (on_f)
              for (auto& e : gfo) e *= alpha;
            const auto gf = ffn_bwd(st, l, gfo);
            for (std::int64_t j = 0; j < D; ++j) g[j] = (on_f ? gs[j] : alpha * gs[j]) + gf[j];
            break;
          }
          case ref::Block::pre: {
            const auto gf = ffn_bwd(st, l, g);  // at Norm(u)
            if (k.block == BlockMode::pre_residual_after_norm) {
              std::vector<LD> gn(D);
              for (std::int64_t j = 0; j < D; ++j) gn[j] = g[j] + gf[j];
              g = norm_bwd(st.n0, l, 0, true, gn);
            } else {
              const auto gs = norm_bwd(st.n0, l, 0, true, gf);
              for (std::int64_t j = 0; j < D; ++j) g[j] += gs[j];
            }
            break;
          }
          case ref::Block::sandwich: {
            const auto gs = norm_bwd(st.n1, l, 1, true, g);
            const auto gf = ffn_bwd(st, l, gs);
            const auto gs0 = norm_bwd(st.n0, l, 0, true, gf);
            for (std::int64_t j = 0; j < D; ++j) g[j] += gs0[j];
            break;
          }
          case ref::Block::none: break;
        }
      }
      u = std::move(g);
    }
    for (std::int64_t j = 0; j < D; ++j)
      y[ri * static_cast<std::size_t>(D) + j] = static_cast<double>(u[j]);
  }
  if (bwd) {
    auto emit = [&](const char* name, const std::vector<LD>& v) {
      if (v.empty()) return;
      auto& o = p[name];
      o.resize(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) o[i] = static_cast<double>(v[i]);
    };
    emit("dweight", gw);
    emit("dbias", gb);
    emit("dffn_w1", gw1);
    emit("dffn_b1", gb1);
    emit("dffn_w2", gw2);
    emit("dffn_b2", gb2);
  }
  return p;
}

template Predictions Engine<double>::run_block(const Knobs& k, const Layout& lay) const;

}  // namespace normcheck::conf::diag
