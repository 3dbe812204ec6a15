// The plain LayerNorm/RMSNorm kernels (no block): forward and backward, fused residual add,
// precision contracts, any normalized dims; and the mutants' faults that live here.
#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>

#include "kernel_impl.hpp"
#include "kernels.hpp"
#include "normcheck/reference/contract.hpp"
#include "row_stats.hpp"

namespace normcheck::conf::cpu {

std::string_view name_of(Reduction r) {
  switch (r) {
    case Reduction::two_pass: return "two_pass";
    case Reduction::welford: return "welford";
    case Reduction::pairwise: return "pairwise";
  }
  return "?";
}

namespace detail {

using ref::DType;

// The contract's rounding points, resolved to dtypes of the case.
using Points = ref::ResolvedPoints;
using ref::resolve_points;

const ref::Tensor* input(const ref::Case& c, const char* name, std::int64_t numel) {
  auto it = c.inputs.find(name);
  if (it == c.inputs.end()) throw ref::CaseError(std::string("inputs/") + name, "missing");
  if (static_cast<std::int64_t>(it->second.data.size()) != numel)
    throw ref::CaseError(
        std::string("inputs/") + name,
        "has " + std::to_string(it->second.data.size()) + " values, " + std::to_string(numel) + " expected");
  return &it->second;
}

ref::Tensor make_tensor(DType t, const std::vector<std::int64_t>& shape) {
  ref::Tensor o;
  o.dtype = t;
  o.shape = shape;
  o.data.assign(static_cast<std::size_t>(o.numel()), 0.0);
  return o;
}

namespace {

// Geometry of normalized dims `dims` over x's shape (the mutants that normalize other dims).
ref::Geometry geometry_over(const ref::Case& c, std::vector<std::int64_t> dims) {
  ref::Case tmp;
  tmp.axes = std::move(dims);
  tmp.inputs["x"].shape = c.inputs.at("x").shape;
  return ref::geometry_of(tmp);
}

template <class A>
class NormKernel {
  using T = typename A::T;
  using O = Op<A>;

 public:
  NormKernel(const ref::Case& c, Reduction red, Fault f)
      : c_(c), red_(red), f_(f), g_(ref::geometry_of(c)), pts_(resolve_points(c)) {
    const std::int64_t numel = c.inputs.at("x").numel();
    x_ = input(c, "x", numel);
    if (c.affine != ref::Affine::none) w_ = input(c, "weight", g_.cols);
    if (c.affine == ref::Affine::weight_bias) b_ = input(c, "bias", g_.cols);
    if (c.residual != ref::Residual::none) res_ = input(c, "residual", numel);
    if (c.residual == ref::Residual::add_bias) rb_ = input(c, "residual_bias", g_.cols);
    if (c.direction == ref::Direction::backward) dy_ = input(c, "dy", numel);
    ln_ = c.op == ref::Op::layernorm;
    centre_ = ln_ || f == fault("rms_centred");
    eps_ = A::konst(kernel_epsilon(c.epsilon, f));
    alpha_ = A::konst(c.alpha);
    plain_h_ = !res_ && c.alpha == 1.0 && !pts_.h;
    if (f == fault("weight_before_downcast")) pts_.xhat.reset();
    if (f == fault("h_kept_unrounded")) pts_.h.reset();
    setup_geometry();
    setup_params();
  }

  Outputs run() { return c_.direction == ref::Direction::forward ? forward() : backward(); }

 private:
  // Statistics may be taken over other dims than the case's, or the parameters indexed
  // otherwise (faults of class C): sg_ is the geometry the statistics use, pmap_ (when
  // remapped) each element's parameter index, srow_ (other dims) each element's statistics row.
  void setup_geometry() {
    sg_ = g_;
    const auto rank = static_cast<std::int64_t>(g_.shape.size());
    if (f_ == fault("wrong_axis") && rank > 2) {
      std::vector<std::int64_t> dims;
      for (std::int64_t d = 1; d < rank; ++d) dims.push_back(d);
      sg_ = geometry_over(c_, dims);
    } else if (f_ == fault("last_dim_only")) {
      sg_ = geometry_over(c_, {rank - 1});
    }
    const bool other_dims = sg_.norm_dims != g_.norm_dims;
    remap_ = other_dims || f_ == fault("weight_not_broadcast");
    if (!remap_) return;
    const std::int64_t numel = x_->numel();
    pmap_.resize(numel);
    for (std::int64_t r = 0; r < g_.rows; ++r)
      for (std::int64_t col = 0; col < g_.cols; ++col) {
        const std::int64_t o = g_.row_base[r] + g_.col_delta[col];
        // keras #19643: gamma laid along x's memory order, as if the normalized dims trailed.
        pmap_[o] = static_cast<std::int32_t>(f_ == fault("weight_not_broadcast") ? o % g_.cols : col);
      }
    if (!other_dims) return;
    srow_.resize(numel);
    for (std::int64_t r = 0; r < sg_.rows; ++r)
      for (std::int64_t col = 0; col < sg_.cols; ++col)
        srow_[sg_.row_base[r] + sg_.col_delta[col]] = static_cast<std::int32_t>(r);
  }

  void setup_params() {
    const auto n = static_cast<std::size_t>(g_.cols);
    const T offset = A::konst(c_.weight_offset);
    if (w_) {
      scale_.resize(n);
      scale_bwd_.resize(n);
      for (std::size_t j = 0; j < n; ++j) {
        T s = O::in(w_->data[j], w_->dtype);
        if (c_.weight_offset != 0) s = O::add(offset, s);
        scale_bwd_[j] = s;  // backward honours no scale rounding point (reference/README.md)
        if (pts_.scale) s = round_as(s, *pts_.scale);
        // transformers #29402: (1 + w) rounded to the weight dtype where fp32 was asked for.
        if (f_ == fault("offset_in_param_dtype") && c_.weight_offset != 0) s = round_as(s, c_.dtype_param);
        scale_[j] = s;
      }
    }
    auto convert = [&](const ref::Tensor* t, std::vector<T>& out) {
      if (!t) return;
      out.resize(n);
      for (std::size_t j = 0; j < n; ++j) out[j] = O::in(t->data[j], t->dtype);
    };
    convert(b_, bias_);
    convert(rb_, rbias_);
  }

  // Offsets and parameter indices of statistics row r.
  void row_layout(std::int64_t r) {
    const auto n = static_cast<std::size_t>(sg_.cols);
    off_.resize(n);
    pidx_.resize(n);
    for (std::size_t j = 0; j < n; ++j) {
      off_[j] = sg_.row_base[r] + sg_.col_delta[j];
      pidx_[j] = remap_ ? pmap_[off_[j]] : static_cast<std::int64_t>(j);
    }
  }

  // h of the current row into h_ (and what residual_out stores into hout_).
  void load_h() {
    const auto n = off_.size();
    h_.resize(n);
    hout_.resize(res_ ? n : 0);
    for (std::size_t j = 0; j < n; ++j) {
      const std::int64_t o = off_[j];
      T h = O::in(x_->data[o], x_->dtype);
      if (!plain_h_) {
        if (c_.alpha != 1.0) h = O::mul(alpha_, h);
        if (res_) h = O::add(h, O::in(res_->data[o], res_->dtype));
        const T before_bias = h;
        if (rb_) h = O::add(h, rbias_[pidx_[j]]);
        // vllm #52104: the fused kernel stores x + residual in the activation dtype first.
        if (f_ == fault("fused_add_rounds_h") && res_) h = round_as(h, c_.dtype_x);
        if (pts_.h) h = round_as(h, *pts_.h);
        if (res_) hout_[j] = f_ == fault("residual_out_missing_bias") ? before_bias : h;  // onnxruntime #14156
      }
      h_[j] = h;
    }
  }

  RowStats<A> stats() {
    return row_stats<A>(h_.data(), static_cast<std::int64_t>(h_.size()), centre_, red_, f_, eps_);
  }

  // The mean and rstd as saved for the backward and returned: FlagGems #221 saved them in x's
  // half dtype (where that is narrower than the statistics'); the forward's y uses them unrounded.
  RowStats<A> saved(RowStats<A> s) const {
    if (f_ == fault("stats_saved_in_x_dtype") &&
        ref::format_of(c_.dtype_x).precision < ref::format_of(c_.dtype_compute).precision) {
      s.mean = round_as(s.mean, c_.dtype_x);
      s.rstd = round_as(s.rstd, c_.dtype_x);
    }
    return s;
  }

  // Rows the launch never reached (apex #411: a grid of at most 65535 rows).
  bool skipped(std::int64_t r) const { return f_ == fault("rows_beyond_grid_limit") && r >= kGridRowLimit; }

  // ---- forward ---------------------------------------------------------------------------
  Outputs forward() {
    Outputs out;
    ref::Tensor y = make_tensor(c_.dtype_out, g_.shape);
    ref::Tensor mean = make_tensor(c_.dtype_compute, g_.stat_shape);
    ref::Tensor rstd = make_tensor(c_.dtype_compute, g_.stat_shape);
    ref::Tensor rout = res_ ? make_tensor(c_.dtype_residual, g_.shape) : ref::Tensor{};
    std::vector<T> smean(srow_.empty() ? 0 : sg_.rows), srstd(srow_.empty() ? 0 : sg_.rows);
    // nano-vllm #170: in fp32, x.float() is x itself, so normalizing it in place overwrites the
    // residual stream that aliases it: residual_out holds x-hat.
    const bool overwrite = f_ == fault("residual_out_overwritten") && c_.dtype_x == DType::float32 &&
                           c_.dtype_residual == DType::float32;
    for (std::int64_t r = 0; r < sg_.rows; ++r) {
      if (skipped(r)) continue;
      row_layout(r);
      load_h();
      const RowStats<A> st = stats();
      T rs = st.rstd;
      if (f_ == fault("rstd_bf16")) rs = round_as(rs, DType::bfloat16);  // amd/IRON #139
      for (std::size_t j = 0; j < off_.size(); ++j) {
        const std::int64_t p = pidx_[j];
        T v = O::mul(centre_ ? O::sub(h_[j], st.mean) : h_[j], rs);
        if (pts_.xhat) v = round_as(v, *pts_.xhat);
        if (res_) rout.data[off_[j]] = to_output(overwrite ? v : hout_[j], c_.dtype_residual);
        if (w_) {
          v = O::mul(v, scale_[p]);
          if (pts_.mul) v = round_as(v, *pts_.mul);
        }
        if (b_) v = O::add(v, bias_[p]);
        // dmlc/mshadow #368, pocl #2211: the float-to-half conversion drops the extra bits.
        y.data[off_[j]] = f_ == fault("fp16_output_truncated") && c_.dtype_out == DType::float16
                              ? ref::round_toward_zero(static_cast<double>(v), DType::float16)
                              : to_output(v, c_.dtype_out);
      }
      const RowStats<A> kept = saved(st);
      if (!srow_.empty()) {
        smean[r] = kept.mean;
        srstd[r] = kept.rstd;
      } else {
        mean.data[r] = to_output(kept.mean, c_.dtype_compute);
        rstd.data[r] = to_output(kept.rstd, c_.dtype_compute);
      }
    }
    if (!srow_.empty())  // each true row reports the statistics of its first element's row
      for (std::int64_t r = 0; r < g_.rows; ++r) {
        const std::int64_t s = srow_[g_.row_base[r] + g_.col_delta[0]];
        mean.data[r] = to_output(smean[s], c_.dtype_compute);
        rstd.data[r] = to_output(srstd[s], c_.dtype_compute);
      }
    out["y"] = std::move(y);
    if (ln_) out["mean"] = std::move(mean);
    out["rstd"] = std::move(rstd);
    if (res_) out["residual_out"] = std::move(rout);
    return out;
  }

  // ---- backward --------------------------------------------------------------------------
  // With g = dy*scale and xhat = (h - mean)*rstd (h*rstd for RMSNorm):
  //   dh = rstd * (g - mean(g) - xhat*mean(g*xhat))   (RMSNorm: no mean(g) term)
  //   dx = alpha*dh, dresidual = dh, dweight = sum_rows dy*xhat, dbias = sum_rows dy,
  //   dresidual_bias = sum_rows dh.
  Outputs backward() {
    Outputs out;
    ref::Tensor dx = make_tensor(c_.dtype_x, g_.shape);
    ref::Tensor dres = res_ ? make_tensor(c_.dtype_residual, g_.shape) : ref::Tensor{};
    ColumnSums<A> dw(red_, g_.cols), db(red_, g_.cols), drb(red_, g_.cols);
    // Liger-Kernel #950: partial dW/dB over a block of 16 rows reduced in bfloat16.
    const bool bf16_partials = f_ == fault("dweight_bf16_reduction");
    constexpr std::int64_t kBlockRows = 16;
    std::vector<T> pw(bf16_partials ? g_.cols : 0, T(0)), pb(bf16_partials ? g_.cols : 0, T(0));
    auto add_partial = [&](std::vector<T>& acc, std::int64_t p, T v) {
      acc[p] = round_as(O::add(acc[p], round_as(v, DType::bfloat16)), DType::bfloat16);
    };
    auto flush_partials = [&] {
      for (std::int64_t p = 0; p < g_.cols; ++p) {
        if (w_) dw.add(p, pw[p]);
        if (b_) db.add(p, pb[p]);
      }
      dw.end_row();
      db.end_row();
      std::fill(pw.begin(), pw.end(), T(0));
      std::fill(pb.begin(), pb.end(), T(0));
    };
    std::vector<T> dyv, xh, gv;
    std::int64_t rows_done = 0;
    for (std::int64_t r = 0; r < sg_.rows; ++r) {
      if (skipped(r)) continue;
      row_layout(r);
      load_h();
      const RowStats<A> st = saved(stats());
      const auto n = static_cast<std::int64_t>(off_.size());
      dyv.resize(n);
      xh.resize(n);
      gv.resize(n);
      for (std::int64_t j = 0; j < n; ++j) {
        dyv[j] = O::in(dy_->data[off_[j]], dy_->dtype);
        xh[j] = O::mul(centre_ ? O::sub(h_[j], st.mean) : h_[j], st.rstd);
        gv[j] = w_ ? O::mul(dyv[j], scale_bwd_[pidx_[j]]) : dyv[j];
      }
      const T mg = centre_ ? mean_of<A>(red_, n, [&](std::int64_t j) { return gv[j]; }) : T(0);
      const T mgx = mean_of<A>(red_, n, [&](std::int64_t j) { return O::mul(gv[j], xh[j]); });
      for (std::int64_t j = 0; j < n; ++j) {
        const std::int64_t p = pidx_[j];
        T k = gv[j];
        if (centre_) k = O::sub(k, mg);
        const T dh = O::mul(O::sub(k, O::mul(xh[j], mgx)), st.rstd);
        dx.data[off_[j]] = to_output(c_.alpha != 1.0 ? O::mul(alpha_, dh) : dh, c_.dtype_x);
        if (res_) dres.data[off_[j]] = to_output(dh, c_.dtype_residual);
        if (rb_) drb.add(p, dh);
        T xw = xh[j];
        if (f_ == fault("dgamma_wrong_index") && w_) {
          // DeepSpeed #692 (invertible LayerNormBackward1): x-hat rebuilt from the output as
          // (y - beta[pos]) / gamma[pos] with pos = tile + threadIdx.y, the row's lane in a
          // 32 x 32 tile, where the column (tile + threadIdx.x) was meant.
          const std::int64_t pos = std::min((p / 32) * 32 + r % 32, g_.cols - 1);
          T yv = O::mul(xh[j], scale_bwd_[p]);
          if (b_) yv = O::sub(O::add(yv, bias_[p]), bias_[pos]);
          xw = O::div(yv, scale_bwd_[pos]);
        }
        if (f_ == fault("dweight_first_rows_only") && r >= kColumnSumRows) {
          // rocm-libraries #10198: the column sums' grid covers the first rows only.
        } else if (bf16_partials) {
          if (w_) add_partial(pw, p, O::mul(dyv[j], xw));
          if (b_) add_partial(pb, p, dyv[j]);
        } else {
          if (w_) dw.add(p, O::mul(dyv[j], xw));
          if (b_) db.add(p, dyv[j]);
        }
      }
      ++rows_done;
      if (bf16_partials) {
        if (rows_done % kBlockRows == 0) flush_partials();
      } else {
        dw.end_row();
        db.end_row();
      }
      drb.end_row();
    }
    if (bf16_partials && rows_done % kBlockRows != 0) flush_partials();
    out["dx"] = std::move(dx);
    if (res_) out["dresidual"] = std::move(dres);
    auto emit = [&](const char* name, const ColumnSums<A>& s) {
      ref::Tensor t = make_tensor(c_.dtype_param, g_.param_shape);
      const std::vector<T> v = s.finish();
      for (std::int64_t p = 0; p < g_.cols; ++p) {
        // pytorch #183861: a block 64 lanes wide on 32-lane warps drops the second warp's
        // partial sums: columns 32..63 of every 64 are never written.
        const bool dropped =
            f_ == fault("dweight_warp_width") && p % 64 >= 32 && std::string_view(name) != "dresidual_bias";
        t.data[p] = dropped ? 0.0 : to_output(v[p], c_.dtype_param);
      }
      out[name] = std::move(t);
    };
    if (w_) emit("dweight", dw);
    if (b_) emit("dbias", db);
    if (rb_) emit("dresidual_bias", drb);
    return out;
  }

  const ref::Case& c_;
  Reduction red_;
  Fault f_;
  ref::Geometry g_, sg_;
  Points pts_;
  const ref::Tensor *x_ = nullptr, *w_ = nullptr, *b_ = nullptr, *res_ = nullptr, *rb_ = nullptr,
                    *dy_ = nullptr;
  bool ln_ = true, centre_ = true, plain_h_ = true, remap_ = false;
  T eps_ = 0, alpha_ = 1;
  std::vector<T> scale_, scale_bwd_, bias_, rbias_;
  std::vector<std::int32_t> pmap_, srow_;  // numel <= 2^31: indices fit
  // Per-row scratch, reused: no allocation per element.
  std::vector<std::int64_t> off_, pidx_;
  std::vector<T> h_, hout_;
};

template <class A>
Outputs run_norm(const ref::Case& c, Reduction r, Fault f) {
  return NormKernel<A>(c, r, f).run();
}

}  // namespace
}  // namespace detail

Outputs run_kernel(const ref::Case& c, Reduction r, Fault f) {
  using ref::DType;
  if (c.quant) return detail::run_quant(c, r, f);
  if (c.block != ref::Block::none) return detail::run_block(c, r, f);
  switch (c.dtype_compute) {
    case DType::float32: return detail::run_norm<detail::Arith<DType::float32>>(c, r, f);
    case DType::float64: return detail::run_norm<detail::Arith<DType::float64>>(c, r, f);
    case DType::float16: return detail::run_norm<detail::Arith<DType::float16>>(c, r, f);
    case DType::bfloat16: return detail::run_norm<detail::Arith<DType::bfloat16>>(c, r, f);
  }
  throw std::logic_error("unknown compute dtype");
}

}  // namespace normcheck::conf::cpu
