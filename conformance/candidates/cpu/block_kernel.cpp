// Residual blocks (post / pre / sandwich / deepnorm) with a position-wise FFN, forward and
// backward, in the compute dtype; each layer's output but the last rounded to dtype_x, the block
// output to dtype_out (reference/README.md "Residual blocks"). Backward is the gradient of
// sum(dy * y) with the intermediate roundings taken as the identity (as autograd does) and
// relu'(0) = 0. Row statistics and backward row means use the kernel's reduction style; FFN dot
// products and parameter-gradient sums over rows are sequential (two_pass) or the style's
// column sums.
#include <stdexcept>
#include <vector>

#include "kernel_impl.hpp"
#include "row_stats.hpp"

namespace normcheck::conf::cpu::detail {
namespace {

template <class A>
class BlockKernel {
  using T = typename A::T;
  using O = Op<A>;

  struct NormState {
    std::vector<T> xhat;
    T rstd = 0;
  };
  struct LayerState {
    NormState n0, n1;
    std::vector<T> v, a, z;  // FFN input, pre-activation, activation
  };

 public:
  BlockKernel(const ref::Case& c, Reduction red, Fault f) : c_(c), red_(red), f_(f) {
    const ref::Tensor& x = c.inputs.at("x");
    D_ = x.shape.back();
    rows_ = x.numel() / D_;
    L_ = c.layers;
    K_ = c.block == ref::Block::sandwich ? 2 : 1;
    auto it = c.inputs.find("ffn_w1");
    if (it == c.inputs.end() || it->second.shape.size() != 3)
      throw ref::CaseError("inputs/ffn_w1", "missing or not [L, D_ff, D]");
    F_ = it->second.shape[1];
    x_ = input(c, "x", x.numel());
    load(w1_, input(c, "ffn_w1", L_ * F_ * D_));
    load(b1_, input(c, "ffn_b1", L_ * F_));
    load(w2_, input(c, "ffn_w2", L_ * D_ * F_));
    load(b2_, input(c, "ffn_b2", L_ * D_));
    const std::int64_t np = L_ * K_ * D_;
    if (c.affine != ref::Affine::none) {
      load(scale_, input(c, "weight", np));
      if (c.weight_offset != 0)
        for (auto& s : scale_) s = O::add(A::konst(c.weight_offset), s);
    }
    if (c.affine == ref::Affine::weight_bias) load(bias_, input(c, "bias", np));
    if (c.direction == ref::Direction::backward) dy_ = input(c, "dy", x.numel());
    centre_ = c.op == ref::Op::layernorm || f == fault("rms_centred");
    eps_ = A::konst(kernel_epsilon(c.epsilon, f));
    alpha_ = A::konst(c.alpha);
    double_norm_ = f == fault("post_ln_double_norm") && c.block == ref::Block::post;
  }

  Outputs run() {
    const bool bwd = c_.direction == ref::Direction::backward;
    const std::int64_t np = L_ * K_ * D_;
    ref::Tensor y = make_tensor(c_.dtype_out, x_->shape);
    ref::Tensor dx = make_tensor(c_.dtype_x, x_->shape);
    ColumnSums<A> gw(red_, bwd && !scale_.empty() ? np : 0), gb(red_, bwd && !bias_.empty() ? np : 0);
    ColumnSums<A> gw1(red_, bwd ? L_ * F_ * D_ : 0), gb1(red_, bwd ? L_ * F_ : 0);
    ColumnSums<A> gw2(red_, bwd ? L_ * D_ * F_ : 0), gb2(red_, bwd ? L_ * D_ : 0);
    grads_ = {&gw, &gb, &gw1, &gb1, &gw2, &gb2};

    std::vector<LayerState> states(static_cast<std::size_t>(L_));
    for (auto& s : states) {
      s.n0.xhat.resize(D_);
      s.n1.xhat.resize(D_);
      s.v.resize(D_);
      s.a.resize(F_);
      s.z.resize(F_);
    }
    NormState extra;
    extra.xhat.resize(D_);
    std::vector<T> u(D_), out(D_), g(D_), gin(D_);
    for (std::int64_t row = 0; row < rows_; ++row) {
      const std::int64_t base = row * D_;
      for (std::int64_t i = 0; i < D_; ++i) u[i] = O::in(x_->data[base + i], x_->dtype);
      for (std::int64_t l = 0; l < L_; ++l) {
        layer_forward(l, u, states[l], out);
        if (l + 1 < L_)  // activations are stored in dtype_x between layers
          for (std::int64_t i = 0; i < D_; ++i) u[i] = round_as(out[i], c_.dtype_x);
      }
      if (double_norm_) {  // pytorch #74092: the encoder's own LayerNorm after the last layer's
        norm_forward(-1, 0, out, extra, u);
        out.swap(u);
      }
      if (!bwd) {
        for (std::int64_t i = 0; i < D_; ++i) y.data[base + i] = to_output(out[i], c_.dtype_out);
        continue;
      }
      for (std::int64_t i = 0; i < D_; ++i) g[i] = O::in(dy_->data[base + i], dy_->dtype);
      if (double_norm_) {
        norm_backward(-1, 0, extra, g, gin);
        g.swap(gin);
      }
      for (std::int64_t l = L_ - 1; l >= 0; --l) {
        layer_backward(l, states[l], g, gin);
        g.swap(gin);
      }
      for (std::int64_t i = 0; i < D_; ++i) dx.data[base + i] = to_output(g[i], c_.dtype_x);
      for (auto* s : grads_) s->end_row();
    }
    Outputs res;
    if (!bwd) {
      res["y"] = std::move(y);
      return res;
    }
    res["dx"] = std::move(dx);
    auto emit = [&](const char* name, const ColumnSums<A>& s, const char* like) {
      ref::Tensor t = make_tensor(c_.dtype_param, c_.inputs.at(like).shape);
      const std::vector<T> v = s.finish();
      for (std::size_t i = 0; i < v.size(); ++i) t.data[i] = to_output(v[i], c_.dtype_param);
      res[name] = std::move(t);
    };
    if (!scale_.empty()) emit("dweight", gw, "weight");
    if (!bias_.empty()) emit("dbias", gb, "bias");
    emit("dffn_w1", gw1, "ffn_w1");
    emit("dffn_b1", gb1, "ffn_b1");
    emit("dffn_w2", gw2, "ffn_w2");
    emit("dffn_b2", gb2, "ffn_b2");
    return res;
  }

 private:
  void load(std::vector<T>& out, const ref::Tensor* t) {
    out.resize(t->data.size());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = O::in(t->data[i], t->dtype);
  }

  // Parameters of norm k of layer l start at p; l < 0 is the extra non-affine norm.
  std::int64_t pbase(std::int64_t l, std::int64_t k) const { return (l * K_ + k) * D_; }

  void norm_forward(std::int64_t l, std::int64_t k, const std::vector<T>& in, NormState& st,
                    std::vector<T>& out) {
    const RowStats<A> s = row_stats<A>(in.data(), D_, centre_, red_, f_, eps_);
    st.rstd = f_ == fault("rstd_bf16") ? round_as(s.rstd, ref::DType::bfloat16) : s.rstd;
    const bool affine = l >= 0;
    for (std::int64_t i = 0; i < D_; ++i) {
      T v = O::mul(centre_ ? O::sub(in[i], s.mean) : in[i], st.rstd);
      st.xhat[i] = v;
      if (affine && !scale_.empty()) v = O::mul(v, scale_[pbase(l, k) + i]);
      if (affine && !bias_.empty()) v = O::add(v, bias_[pbase(l, k) + i]);
      out[i] = v;
    }
  }

  // gout -> gin through a norm, accumulating its dweight and dbias.
  void norm_backward(std::int64_t l, std::int64_t k, const NormState& st, const std::vector<T>& gout,
                     std::vector<T>& gin) {
    const bool affine = l >= 0;
    const bool w = affine && !scale_.empty();
    gtmp_.resize(D_);
    for (std::int64_t i = 0; i < D_; ++i) gtmp_[i] = w ? O::mul(gout[i], scale_[pbase(l, k) + i]) : gout[i];
    const T mg = centre_ ? mean_of<A>(red_, D_, [&](std::int64_t i) { return gtmp_[i]; }) : T(0);
    const T mgx = mean_of<A>(red_, D_, [&](std::int64_t i) { return O::mul(gtmp_[i], st.xhat[i]); });
    for (std::int64_t i = 0; i < D_; ++i) {
      T v = gtmp_[i];
      if (centre_) v = O::sub(v, mg);
      gin[i] = O::mul(O::sub(v, O::mul(st.xhat[i], mgx)), st.rstd);
      if (w) grads_[0]->add(pbase(l, k) + i, O::mul(gout[i], st.xhat[i]));
      if (affine && !bias_.empty()) grads_[1]->add(pbase(l, k) + i, gout[i]);
    }
  }

  T dot(const T* w, const T* v, std::int64_t n) const {
    T s = 0;
    for (std::int64_t i = 0; i < n; ++i) s = O::add(s, O::mul(w[i], v[i]));
    return s;
  }

  T act(T a) const {
    if (c_.activation == ref::Activation::relu) return a > 0 ? a : T(0);
    // gelu(a) = a/2 (1 + erf(a / sqrt 2)), the exact erf form
    return O::mul(O::mul(a, T(0.5)), O::add(T(1), O::erf(O::mul(a, kInvSqrt2))));
  }
  T act_grad(T a) const {
    if (c_.activation == ref::Activation::relu) return a > 0 ? T(1) : T(0);
    // Phi(a) + a phi(a)
    const T cdf = O::mul(T(0.5), O::add(T(1), O::erf(O::mul(a, kInvSqrt2))));
    const T pdf = O::mul(O::exp(O::mul(O::mul(a, a), T(-0.5))), kInvSqrt2Pi);
    return O::add(cdf, O::mul(a, pdf));
  }

  void ffn_forward(std::int64_t l, const std::vector<T>& v, LayerState& st, std::vector<T>& out) {
    st.v = v;
    for (std::int64_t j = 0; j < F_; ++j) {
      st.a[j] = O::add(dot(&w1_[(l * F_ + j) * D_], v.data(), D_), b1_[l * F_ + j]);
      st.z[j] = act(st.a[j]);
    }
    for (std::int64_t i = 0; i < D_; ++i)
      out[i] = O::add(dot(&w2_[(l * D_ + i) * F_], st.z.data(), F_), b2_[l * D_ + i]);
  }

  // gout (at the FFN output) -> gin (at its input), accumulating the FFN's gradients.
  void ffn_backward(std::int64_t l, const LayerState& st, const std::vector<T>& gout, std::vector<T>& gin) {
    ga_.assign(F_, T(0));
    for (std::int64_t i = 0; i < D_; ++i) {
      grads_[5]->add(l * D_ + i, gout[i]);
      for (std::int64_t j = 0; j < F_; ++j) {
        grads_[4]->add((l * D_ + i) * F_ + j, O::mul(gout[i], st.z[j]));
        ga_[j] = O::add(ga_[j], O::mul(w2_[(l * D_ + i) * F_ + j], gout[i]));  // dL/dz, summed over i
      }
    }
    for (std::int64_t j = 0; j < F_; ++j) {
      ga_[j] = O::mul(ga_[j], act_grad(st.a[j]));
      grads_[3]->add(l * F_ + j, ga_[j]);
    }
    for (std::int64_t i = 0; i < D_; ++i) gin[i] = T(0);
    for (std::int64_t j = 0; j < F_; ++j)
      for (std::int64_t i = 0; i < D_; ++i) {
        grads_[2]->add((l * F_ + j) * D_ + i, O::mul(ga_[j], st.v[i]));
        gin[i] = O::add(gin[i], O::mul(w1_[(l * F_ + j) * D_ + i], ga_[j]));
      }
  }

  bool alpha_on_f() const { return f_ == fault("deepnorm_alpha_on_f") && c_.block == ref::Block::deepnorm; }
  bool pre_after_norm() const {
    return f_ == fault("pre_ln_residual_after_norm") && c_.block == ref::Block::pre;
  }

  void layer_forward(std::int64_t l, const std::vector<T>& u, LayerState& st, std::vector<T>& out) {
    t1_.resize(D_);
    t2_.resize(D_);
    switch (c_.block) {
      case ref::Block::post:
      case ref::Block::deepnorm:  // Norm0(alpha u + F(u))
        ffn_forward(l, u, st, t1_);
        for (std::int64_t i = 0; i < D_; ++i) {
          // labml #145: Norm(u + alpha F(u)), alpha on the sublayer instead of the residual
          if (alpha_on_f())
            t2_[i] = O::add(u[i], O::mul(alpha_, t1_[i]));
          else
            t2_[i] = O::add(c_.alpha != 1.0 ? O::mul(alpha_, u[i]) : u[i], t1_[i]);
        }
        norm_forward(l, 0, t2_, st.n0, out);
        break;
      case ref::Block::pre:  // u + F(Norm0(u))
        norm_forward(l, 0, u, st.n0, t2_);
        ffn_forward(l, t2_, st, t1_);
        // pytorch #61165: src = norm1(src) overwrote the residual: Norm0(u) + F(Norm0(u))
        for (std::int64_t i = 0; i < D_; ++i) out[i] = O::add(pre_after_norm() ? t2_[i] : u[i], t1_[i]);
        break;
      case ref::Block::sandwich:  // u + Norm1(F(Norm0(u)))
        norm_forward(l, 0, u, st.n0, t2_);
        ffn_forward(l, t2_, st, t1_);
        norm_forward(l, 1, t1_, st.n1, t2_);
        for (std::int64_t i = 0; i < D_; ++i) out[i] = O::add(u[i], t2_[i]);
        break;
      case ref::Block::none: throw std::logic_error("not a block");
    }
  }

  void layer_backward(std::int64_t l, const LayerState& st, const std::vector<T>& gout, std::vector<T>& gin) {
    t1_.resize(D_);
    t2_.resize(D_);
    switch (c_.block) {
      case ref::Block::post:
      case ref::Block::deepnorm:
        norm_backward(l, 0, st.n0, gout, t1_);  // at s = alpha u + F(u)
        if (alpha_on_f()) {
          for (std::int64_t i = 0; i < D_; ++i) t2_[i] = O::mul(alpha_, t1_[i]);
          ffn_backward(l, st, t2_, gin);
          for (std::int64_t i = 0; i < D_; ++i) gin[i] = O::add(t1_[i], gin[i]);
        } else {
          ffn_backward(l, st, t1_, gin);
          for (std::int64_t i = 0; i < D_; ++i)
            gin[i] = O::add(c_.alpha != 1.0 ? O::mul(alpha_, t1_[i]) : t1_[i], gin[i]);
        }
        break;
      case ref::Block::pre:
        ffn_backward(l, st, gout, t1_);  // at Norm0(u)
        if (pre_after_norm()) {
          for (std::int64_t i = 0; i < D_; ++i) t1_[i] = O::add(gout[i], t1_[i]);
          norm_backward(l, 0, st.n0, t1_, gin);
        } else {
          norm_backward(l, 0, st.n0, t1_, t2_);
          for (std::int64_t i = 0; i < D_; ++i) gin[i] = O::add(gout[i], t2_[i]);
        }
        break;
      case ref::Block::sandwich:
        norm_backward(l, 1, st.n1, gout, t1_);  // at F's output
        ffn_backward(l, st, t1_, t2_);          // at Norm0(u)
        norm_backward(l, 0, st.n0, t2_, t1_);
        for (std::int64_t i = 0; i < D_; ++i) gin[i] = O::add(gout[i], t1_[i]);
        break;
      case ref::Block::none: throw std::logic_error("not a block");
    }
  }

  const ref::Case& c_;
  Reduction red_;
  Fault f_;
  const ref::Tensor *x_ = nullptr, *dy_ = nullptr;
  std::int64_t D_ = 0, F_ = 0, L_ = 0, K_ = 1, rows_ = 0;
  std::vector<T> w1_, b1_, w2_, b2_, scale_, bias_;
  T eps_ = 0, alpha_ = 1;
  bool centre_ = true, double_norm_ = false;
  const T kInvSqrt2 = A::konst(0.70710678118654752440);
  const T kInvSqrt2Pi = A::konst(0.39894228040143267794);
  std::vector<ColumnSums<A>*> grads_;   // dweight, dbias, dffn_w1, dffn_b1, dffn_w2, dffn_b2
  std::vector<T> t1_, t2_, gtmp_, ga_;  // scratch
};

template <class A>
Outputs run(const ref::Case& c, Reduction r, Fault f) {
  return BlockKernel<A>(c, r, f).run();
}

}  // namespace

Outputs run_block(const ref::Case& c, Reduction r, Fault f) {
  using ref::DType;
  switch (c.dtype_compute) {
    case DType::float32: return run<Arith<DType::float32>>(c, r, f);
    case DType::float64: return run<Arith<DType::float64>>(c, r, f);
    case DType::float16: return run<Arith<DType::float16>>(c, r, f);
    case DType::bfloat16: return run<Arith<DType::bfloat16>>(c, r, f);
  }
  throw std::logic_error("unknown compute dtype");
}

}  // namespace normcheck::conf::cpu::detail
