#include "panel.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <utility>

#include "normcheck/reference/contract.hpp"

namespace normcheck::conf::diag {

namespace {

std::vector<Variant> one(Knobs k) { return {Variant{std::move(k), {}}}; }

bool has_output(const Ctx& x, const char* name) { return x.fc.expected.count(name) > 0; }

// Epsilon implied by the candidate's outputs: per row 1/rstd^2 - var, with rstd from the rstd
// output or fitted to y by least squares (y - bias)/scale = rstd (h - mean). The row where eps
// weighs most against the variance decides; the fit and its 1- and 2-digit roundings are tried.
std::vector<double> fit_epsilon(const Ctx& x) {
  if (x.c.direction != ref::Direction::forward || x.c.block != ref::Block::none) return {};
  const auto& g = x.g;
  const std::int64_t n = g.cols;
  const bool centre = x.c.op == ref::Op::layernorm;
  const auto* w = x.c.affine != ref::Affine::none ? input(x.c, "weight") : nullptr;
  const auto* b = x.c.affine == ref::Affine::weight_bias ? input(x.c, "bias") : nullptr;
  const auto* r = x.c.residual != ref::Residual::none ? input(x.c, "residual") : nullptr;
  const auto* rb = x.c.residual == ref::Residual::add_bias ? input(x.c, "residual_bias") : nullptr;
  const auto* xin = input(x.c, "x");
  const auto ry = x.got.find("y");
  const auto rr = x.got.find("rstd");
  const bool have_y = ry != x.got.end() && ry->second.data.size() == xin->data.size();
  const bool have_r = rr != x.got.end() && rr->second.data.size() == static_cast<std::size_t>(g.rows);
  std::vector<double> out;
  for (int source = 0; source < 2; ++source) {
    if ((source == 0 && !have_r) || (source == 1 && !have_y)) continue;
    double best_eps = kNaN, best_weight = -1;
    std::vector<Wide> h(n);
    for (std::int64_t row : x.rows) {
      Wide mean = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        const auto i = static_cast<std::size_t>(g.row_base[row] + g.col_delta[j]);
        h[j] =
            static_cast<Wide>(x.c.alpha) * xin->data[i] + (r ? r->data[i] : 0.0) + (rb ? rb->data[j] : 0.0);
        mean += h[j];
      }
      mean = centre ? mean / n : 0;
      Wide var = 0;
      for (std::int64_t j = 0; j < n; ++j) var += (h[j] - mean) * (h[j] - mean);
      var /= n;
      Wide rstd;
      if (source == 0) {
        rstd = rr->second.data[row];
      } else {
        Wide num = 0, den = 0;
        for (std::int64_t j = 0; j < n; ++j) {
          const auto i = static_cast<std::size_t>(g.row_base[row] + g.col_delta[j]);
          const Wide scale = w ? x.c.weight_offset + w->data[j] : 1.0L;
          if (scale == 0) continue;
          const Wide t = (ry->second.data[i] - (b ? b->data[j] : 0.0)) / scale;
          num += t * (h[j] - mean);
          den += (h[j] - mean) * (h[j] - mean);
        }
        if (den == 0) continue;
        rstd = num / den;
      }
      if (!std::isfinite(static_cast<double>(rstd)) || rstd <= 0) continue;
      const Wide eps = 1.0L / (rstd * rstd) - var;
      // How much eps weighs in q = var + eps: rows where it dominates decide.
      const Wide weight = eps / (var + std::fabs(eps));
      if (std::isfinite(static_cast<double>(eps)) && weight > best_weight) {
        best_weight = static_cast<double>(weight);
        best_eps = static_cast<double>(eps);
      }
    }
    if (!(best_eps > 0)) continue;
    out.push_back(best_eps);
    for (int digits : {1, 2}) {
      const double unit = std::pow(10.0, std::floor(std::log10(best_eps)) - (digits - 1));
      out.push_back(std::round(best_eps / unit) * unit);
    }
  }
  std::vector<double> uniq;
  for (double e : out)
    if (e != x.c.epsilon && std::fabs(e - x.c.epsilon) > 1e-3 * x.c.epsilon &&
        std::find(uniq.begin(), uniq.end(), e) == uniq.end())
      uniq.push_back(e);
  return uniq;
}

// Rows from K on that the candidate left unwritten (all 0, or all NaN): K and the value.
std::optional<std::pair<std::int64_t, double>> unwritten_rows(const Ctx& x) {
  const char* name = x.c.direction == ref::Direction::forward ? "y" : "dx";
  const auto it = x.got.find(name);
  if (it == x.got.end() || it->second.data.size() != input(x.c, "x")->data.size()) return std::nullopt;
  const auto& v = it->second.data;
  std::int64_t k = x.g.rows;
  std::optional<bool> nan_fill;
  for (std::int64_t row = x.g.rows; row-- > 0;) {
    bool zero = true, nan = true;
    for (std::int64_t j = 0; j < x.g.cols; ++j) {
      const double e = v[static_cast<std::size_t>(x.g.row_base[row] + x.g.col_delta[j])];
      zero &= e == 0;
      nan &= std::isnan(e);
    }
    if (!zero && !nan) break;
    if (nan_fill && *nan_fill != nan) break;
    nan_fill = nan;
    k = row;
  }
  if (k == x.g.rows || k == 0) return std::nullopt;
  return std::make_pair(k, *nan_fill ? kNaN : 0.0);
}

using K = Knobs;

// Adds one dialect to the panel being built.
struct Add {
  std::vector<Dialect>& v;
  void operator()(const char* name, const char* cls, const char* title,
                  std::function<std::vector<Variant>(const Ctx&)> f) const {
    v.push_back(Dialect{{name, cls, title}, std::move(f)});
  }
};

// A. Epsilon
void add_epsilon_dialects(const Add& add) {
  add("eps_outside_sqrt", "A", "eps added outside the sqrt: 1/(sigma + eps)", [](const Ctx& x) {
    K k = x.spec;
    k.eps_place = EpsPlace::outside_sqrt;
    return one(k);
  });
  add("eps_missing", "A", "eps left out (0)", [](const Ctx& x) -> std::vector<Variant> {
    if (x.c.epsilon == 0) return {};
    K k = x.spec;
    k.eps = 0;
    return one(k);
  });
  add("eps_in_count", "A", "eps added to the count: rsqrt(sum / (N + eps))", [](const Ctx& x) {
    K k = x.spec;
    k.eps_place = EpsPlace::in_count;
    return one(k);
  });
  add("eps_fp16", "A", "eps rounded to float16 before use", [](const Ctx& x) -> std::vector<Variant> {
    const double e = ref::round_to(x.c.epsilon, DType::float16);
    if (e == x.c.epsilon || e == 0) return {};  // 0: that is eps_missing
    K k = x.spec;
    k.eps = e;
    return {Variant{k, {{"epsilon", e}}}};
  });
  add("eps_other_value", "A", "another eps value than the case's (fitted from the outputs)",
      [](const Ctx& x) {
        std::vector<Variant> out;
        std::vector<double> values = fit_epsilon(x);
        if (values.empty())  // backward, or nothing to fit: the values models are configured with
          for (double e : {1e-12, 1e-8, 1e-6, 1e-5, 1e-3})
            if (e != x.c.epsilon) values.push_back(e);
        for (double e : values) {
          K k = x.spec;
          k.eps = e;
          out.push_back(Variant{k, {{"epsilon", e}}});
        }
        return out;
      });
}

// B. Variance and reductions
void add_variance_dialects(const Add& add) {
  add("unbiased_variance", "B", "unbiased variance: sum((h - mean)^2) / (N - 1)",
      [](const Ctx& x) -> std::vector<Variant> {
        if (!x.spec.centre) return {};
        K k = x.spec;
        k.unbiased = true;
        return one(k);
      });
  add("eps_outside_sqrt_unbiased", "A", "eps outside the sqrt of the unbiased (N-1) variance: 1/(s + eps)",
      [](const Ctx& x) -> std::vector<Variant> {
        if (!x.spec.centre) return {};
        K k = x.spec;
        k.eps_place = EpsPlace::outside_sqrt;
        k.unbiased = true;
        return one(k);
      });
  for (auto [name, t, title] : {std::tuple{"one_pass_variance_fp32", DType::float32,
                                           "one-pass variance E[h^2] - E[h]^2 in float32"},
                                std::tuple{"one_pass_variance_fp16", DType::float16,
                                           "one-pass variance E[h^2] - E[h]^2 in float16"},
                                std::tuple{"one_pass_variance_fp64", DType::float64,
                                           "one-pass variance E[h^2] - E[h]^2 in float64"}}) {
    add(name, "B", title, [t](const Ctx& x) -> std::vector<Variant> {
      if (!x.spec.centre) return {};
      // In float64 only where the case computes in float64 (elsewhere it is the float32 one's
      // cancellation, far smaller).
      if (t == DType::float64 && x.c.dtype_compute != DType::float64) return {};
      K k = x.spec;
      k.arith = StatArith::one_pass;
      k.arith_dtype = t;
      return one(k);
    });
  }
  for (auto [name, t, title] :
       {std::tuple{"low_precision_accumulation_fp16", DType::float16, "row sums accumulated in float16"},
        std::tuple{"low_precision_accumulation_bf16", DType::bfloat16,
                   "row sums accumulated in bfloat16"}}) {
    add(name, "B", title, [t](const Ctx& x) {
      K k = x.spec;
      k.arith = StatArith::accumulate;
      k.arith_dtype = t;
      return one(k);
    });
  }
  add("padding_lanes", "B",
      "padding lanes counted: variance over the next power of two lanes, zeros loaded",
      [](const Ctx& x) -> std::vector<Variant> {
        if (!x.spec.centre) return {};
        K k = x.spec;
        k.pad_lanes = true;
        return {Variant{
            k, {{"lanes", static_cast<double>(std::bit_ceil(static_cast<std::uint64_t>(x.g.cols)))}}}};
      });
  add("stats_merged_equal_weights", "B",
      "parallel statistics merged wrongly: two half-row partials merged with equal weights",
      [](const Ctx& x) {
        K k = x.spec;
        k.arith = StatArith::merge_halves;
        return one(k);
      });
  add("rstd_holds_std", "B", "rstd output holds the standard deviation sqrt(var + eps)",
      [](const Ctx& x) -> std::vector<Variant> {
        if (!has_output(x, "rstd")) return {};
        K k = x.spec;
        k.rstd_out = RstdOut::std_dev;
        return one(k);
      });
  add("rstd_holds_variance", "B", "rstd output holds the variance",
      [](const Ctx& x) -> std::vector<Variant> {
        if (!has_output(x, "rstd")) return {};
        K k = x.spec;
        k.rstd_out = RstdOut::variance;
        return one(k);
      });
}

// C. Axis and shape
void add_axis_dialects(const Add& add) {
  add("stats_all_but_batch", "C",
      "statistics over every dim but the first (normalized_shape as 'all but batch')",
      [](const Ctx& x) -> std::vector<Variant> {
        const auto rank = static_cast<std::int64_t>(x.g.shape.size());
        if (rank < 3) return {};
        std::vector<std::int64_t> d;
        for (std::int64_t i = 1; i < rank; ++i) d.push_back(i);
        if (d == x.g.norm_dims) return {};
        K k = x.spec;
        k.stat_dims = d;
        return one(k);
      });
  add("stats_last_dim_only", "C", "statistics over the last dim only (axis not honoured)",
      [](const Ctx& x) -> std::vector<Variant> {
        const auto rank = static_cast<std::int64_t>(x.g.shape.size());
        const std::vector<std::int64_t> d{rank - 1};
        if (d == x.g.norm_dims) return {};
        K k = x.spec;
        k.stat_dims = d;
        return one(k);
      });
  add("rms_centred", "C", "RMSNorm computed with mean centring (a LayerNorm)",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.op != ref::Op::rmsnorm) return {};
        K k = x.spec;
        k.centre = true;
        return one(k);
      });
  add("layernorm_uncentred", "C", "LayerNorm computed without mean centring (an RMSNorm)",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.op != ref::Op::layernorm) return {};
        K k = x.spec;
        k.centre = false;
        return one(k);
      });
  add("weight_not_broadcast", "C",
      "weight/bias laid along x's memory order instead of broadcast over the normalized dims",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.affine == ref::Affine::none) return {};
        K k = x.spec;
        k.weight_flat_index = true;
        return one(k);
      });
}

// D. Mixed precision
void add_precision_dialects(const Add& add) {
  add("contract_point_skipped", "D", "a rounding point of the contract skipped", [](const Ctx& x) {
    std::vector<Variant> out;
    for (int p = 0; p < 4; ++p) {
      K k = x.spec;
      std::optional<DType>* slot[] = {&k.pts.h, &k.pts.xhat, &k.pts.scale, &k.pts.mul};
      if (!*slot[p]) continue;
      *slot[p] = std::nullopt;
      out.push_back(Variant{k, {{"point", static_cast<double>(p)}}});
    }
    return out;
  });
  add("other_contract", "D", "another precision contract (rounding points)", [](const Ctx& x) {
    std::vector<Variant> out;
    for (std::size_t ci = 0; ci < ref::builtin_contracts().size(); ++ci) {
      ref::Case cc;
      cc.contract = ref::builtin_contracts()[ci].name;
      cc.dtype_x = x.c.dtype_x;
      cc.dtype_param = x.c.dtype_param;
      cc.dtype_out = x.c.dtype_out;
      cc.dtype_compute = x.c.dtype_compute;
      cc.dtype_residual = x.c.dtype_residual;
      K k = x.spec;
      k.pts = ref::resolve_points(cc);
      out.push_back(Variant{k, {{"contract", static_cast<double>(ci)}}});
    }
    return out;
  });
  add("scale_rounded_to_param", "D", "offset + weight rounded to the weight dtype before the multiply",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.affine == ref::Affine::none) return {};
        K k = x.spec;
        k.pts.scale = x.c.dtype_param;
        return one(k);
      });
  for (auto [name, t, title] :
       {std::tuple{"rstd_rounded_bf16", DType::bfloat16, "rstd rounded to bfloat16 before the multiply"},
        std::tuple{"rstd_rounded_fp16", DType::float16, "rstd rounded to float16 before the multiply"}}) {
    add(name, "D", title, [t](const Ctx& x) {
      // The rstd output may hold the rounded value or the one before it.
      std::vector<Variant> out;
      for (bool unrounded : {false, true}) {
        K k = x.spec;
        k.rstd_round = t;
        k.rstd_out_unrounded = unrounded;
        out.push_back(Variant{k, {}});
      }
      return out;
    });
  }
}

// E. Residual and placement
void add_residual_dialects(const Add& add) {
  add("residual_not_added", "E", "residual not added before the norm",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.residual == ref::Residual::none) return {};
        K k = x.spec;
        k.res = ResMode::not_added;
        return one(k);
      });
  add("residual_after_norm", "E", "residual added after the norm: y = Norm(x) + residual",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.residual == ref::Residual::none || x.c.direction != ref::Direction::forward) return {};
        K k = x.spec;
        k.res = ResMode::after_norm;
        return one(k);
      });
  add("alpha_on_residual", "E", "alpha applied to the residual instead of x: h = x + alpha residual",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.residual == ref::Residual::none || x.c.alpha == 1) return {};
        K k = x.spec;
        k.res = ResMode::alpha_on_residual;
        return one(k);
      });
  add("h_rounded_to_input_dtype", "E", "h = x + residual rounded to the input dtype before the statistics",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.residual == ref::Residual::none) return {};
        K k = x.spec;
        k.h_round_x = true;
        return one(k);
      });
  add("residual_out_missing_bias", "E", "residual_out written without residual_bias",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.residual != ref::Residual::add_bias || !has_output(x, "residual_out")) return {};
        K k = x.spec;
        k.res_out = ResOut::missing_bias;
        return one(k);
      });
  add("residual_out_holds_y", "E", "residual_out overwritten with the norm's output y",
      [](const Ctx& x) -> std::vector<Variant> {
        if (!has_output(x, "residual_out")) return {};
        K k = x.spec;
        k.res_out = ResOut::holds_y;
        return one(k);
      });
  add("residual_out_holds_xhat", "E", "residual_out overwritten with x-hat (normalized in place)",
      [](const Ctx& x) -> std::vector<Variant> {
        if (!has_output(x, "residual_out")) return {};
        K k = x.spec;
        k.res_out = ResOut::holds_xhat;
        return one(k);
      });
}

// F. Parameters (checkpoint conventions)
void add_parameters_dialects(const Add& add) {
  add("weight_missing", "F", "weight not applied", [](const Ctx& x) -> std::vector<Variant> {
    if (x.c.affine == ref::Affine::none) return {};
    K k = x.spec;
    k.weight = WeightMode::missing;
    return one(k);
  });
  add("bias_missing", "F", "bias not added", [](const Ctx& x) -> std::vector<Variant> {
    if (x.c.affine != ref::Affine::weight_bias) return {};
    K k = x.spec;
    k.bias_missing = true;
    return one(k);
  });
  add("weight_bias_swapped", "F", "weight and bias swapped", [](const Ctx& x) -> std::vector<Variant> {
    if (x.c.affine != ref::Affine::weight_bias) return {};
    K k = x.spec;
    k.weight = WeightMode::swapped;
    return one(k);
  });
  add("bias_before_weight", "F", "bias added before the weight multiply: (x-hat + bias) * weight",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.affine != ref::Affine::weight_bias) return {};
        K k = x.spec;
        k.weight = WeightMode::bias_first;
        return one(k);
      });
  add("offset_missing", "F", "weight offset (1 + w) left out", [](const Ctx& x) -> std::vector<Variant> {
    if (x.c.affine == ref::Affine::none || x.c.weight_offset == 0) return {};
    K k = x.spec;
    k.offset = 0;
    return one(k);
  });
  add("offset_doubled", "F", "weight offset applied twice (scale offset + offset + w)",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.affine == ref::Affine::none || x.c.weight_offset == 0) return {};
        K k = x.spec;
        k.offset = 2 * x.c.weight_offset;
        return one(k);
      });
  add("offset_spurious", "F", "a weight offset 1 + w applied to weights that hold the scale",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.affine == ref::Affine::none || x.c.weight_offset != 0) return {};
        K k = x.spec;
        k.offset = 1;
        return one(k);
      });
}

// E. Placement in residual blocks
void add_blocks_dialects(const Add& add) {
  add("block_pre_residual_after_norm", "E",
      "Pre-LN residual taken after the norm: u' = Norm(u) + F(Norm(u))",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.block != ref::Block::pre) return {};
        K k = x.spec;
        k.block = BlockMode::pre_residual_after_norm;
        return one(k);
      });
  add("block_deepnorm_alpha_on_f", "E", "DeepNorm alpha applied to the sublayer: Norm(u + alpha F(u))",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.block != ref::Block::deepnorm || x.c.alpha == 1) return {};
        K k = x.spec;
        k.block = BlockMode::deepnorm_alpha_on_f;
        return one(k);
      });
  add("block_post_double_norm", "E", "Post-LN output normalized again by an extra (non-affine) norm",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.block != ref::Block::post) return {};
        K k = x.spec;
        k.block = BlockMode::post_double_norm;
        return one(k);
      });
}

// G. Backward and launch limits
void add_backward_dialects(const Add& add) {
  add("rows_not_computed", "G", "rows from a limit on never computed (launch grid limit)",
      [](const Ctx& x) -> std::vector<Variant> {
        const auto u = unwritten_rows(x);
        if (!u) return {};
        K k = x.spec;
        k.rows_limit = u->first;
        k.unwritten = u->second;
        return {Variant{k, {{"first_row_not_computed", static_cast<double>(u->first)}}}};
      });
  add("dx_without_mean_term", "G", "dx without the mean(g) term", [](const Ctx& x) -> std::vector<Variant> {
    if (x.c.direction != ref::Direction::backward || !x.spec.centre) return {};
    K k = x.spec;
    k.dx = DxMode::no_mean;
    return one(k);
  });
  add("dx_without_projection_term", "G", "dx without the x-hat * mean(g x-hat) term",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.direction != ref::Direction::backward) return {};
        K k = x.spec;
        k.dx = DxMode::no_projection;
        return one(k);
      });
  add("column_sums_bf16", "G", "dweight/dbias reduced in bfloat16",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.direction != ref::Direction::backward || x.c.affine == ref::Affine::none) return {};
        K k = x.spec;
        k.colsum = ColSum::bf16_interval;
        return one(k);
      });
  add("column_sums_columns_dropped", "G", "dweight/dbias of some columns never reduced (left 0)",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.direction != ref::Direction::backward) return {};
        K k = x.spec;
        double dropped = 0;
        for (const char* name : {"dweight", "dbias", "dresidual_bias"}) {
          const auto e = x.fc.expected.find(name);
          const auto gt = x.got.find(name);
          if (e == x.fc.expected.end() || gt == x.got.end() ||
              gt->second.data.size() != e->second.f64.size())
            continue;
          std::vector<std::uint8_t> mask(e->second.f64.size(), 0);
          bool any = false;
          for (std::size_t j = 0; j < mask.size(); ++j)
            if (gt->second.data[j] == 0 && e->second.f64[j] != 0) {
              mask[j] = 1;
              any = true;
              dropped += 1;
            }
          if (any) k.zero_cols[name] = std::move(mask);
        }
        if (k.zero_cols.empty()) return {};
        return {Variant{k, {{"columns_dropped", dropped}}}};
      });
  add("dweight_wrong_lane_params", "G",
      "dweight's x-hat rebuilt from y with the weight/bias of the row's tile lane (DeepSpeed #692)",
      [](const Ctx& x) -> std::vector<Variant> {
        if (x.c.direction != ref::Direction::backward || x.c.affine == ref::Affine::none ||
            x.c.block != ref::Block::none)
          return {};
        K k = x.spec;
        k.dgamma_tile = kDgammaTile;
        return {Variant{k, {{"tile", static_cast<double>(kDgammaTile)}}}};
      });
}

}  // namespace

// The panel in the order of its classes (A-G, the residual-block placements after F).
const std::vector<Dialect>& panel() {
  static const std::vector<Dialect> table = [] {
    std::vector<Dialect> v;
    const Add add{v};
    add_epsilon_dialects(add);
    add_variance_dialects(add);
    add_axis_dialects(add);
    add_precision_dialects(add);
    add_residual_dialects(add);
    add_parameters_dialects(add);
    add_blocks_dialects(add);
    add_backward_dialects(add);
    return v;
  }();
  return table;
}

std::string contract_name(std::size_t i) { return ref::builtin_contracts()[i].name; }

std::string point_name(int p) {
  static const char* n[] = {"h", "xhat", "scale", "mul"};
  return n[p];
}
}  // namespace normcheck::conf::diag
