// The shard plans' arithmetic in float32 without processes, for tests and property tests: what
// torch_dist/sharded_norms.py computes, rank by rank (README.md, "Emulation").
#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>

#include "normcheck/sharding/shard.hpp"

namespace normcheck::shard {
namespace {

using Vec = std::vector<float>;

// Sum over the ranks, in rank order, each partial and every add rounded to `t` (float32: one
// float32 add each); `flush`: every rounded value below t's smallest normal becomes a zero of its
// sign, as a flushing all-reduce gives (README.md, "Flushing all-reduces").
float reduce(const std::vector<float>& partials, ref::DType t, bool flush = false) {
  if (partials.size() == 1) return partials[0];  // one rank: no all-reduce, nothing rounded
  const double tiny = std::ldexp(1.0, ref::format_of(t).min_exp);
  auto rn = [&](float v) {
    const double r = t == ref::DType::float32 ? static_cast<double>(v) : ref::round_to(v, t);
    return static_cast<float>(flush && std::fabs(r) < tiny ? std::copysign(0.0, r) : r);
  };
  float acc = rn(partials[0]);
  for (std::size_t k = 1; k < partials.size(); ++k) acc = rn(acc + rn(partials[k]));
  return acc;
}

}  // namespace

ShardedOutputs emulate(const ref::Case& c, const Plan& p, const std::string& fault) {
  if (c.residual != ref::Residual::none || c.block != ref::Block::none ||
      c.dtype_compute != ref::DType::float32)
    throw std::invalid_argument("the emulation runs plain norms in float32 compute");
  const ref::Geometry g = ref::geometry_of(c);
  const Layout lay = layout_of(c, p);
  const auto& x = c.inputs.at("x").data;
  const auto* w = c.inputs.count("weight") ? &c.inputs.at("weight").data : nullptr;
  const auto* b = c.inputs.count("bias") ? &c.inputs.at("bias").data : nullptr;
  const auto* dy = c.inputs.count("dy") ? &c.inputs.at("dy").data : nullptr;
  const bool bwd = c.direction == ref::Direction::backward, ln = c.op == ref::Op::layernorm;
  const bool local = fault == "rank_local";
  const auto rows = static_cast<std::size_t>(g.rows), cols = static_cast<std::size_t>(g.cols);
  const auto T = static_cast<std::size_t>(p.tp), S = static_cast<std::size_t>(p.sp);
  auto at = [&](std::size_t r, std::size_t j) {
    return static_cast<std::size_t>(g.row_base[r] + g.col_delta[j]);
  };
  auto shard = [&](std::size_t j) { return static_cast<std::size_t>(lay.col_shard[j]); };
  const float eps = static_cast<float>(c.epsilon);
  std::vector<float> scale(cols, 1.0f);
  for (std::size_t j = 0; j < cols && w; ++j)
    scale[j] = static_cast<float>((*w)[j]) + static_cast<float>(c.weight_offset);

  ShardedOutputs out;
  ref::Tensor y{bwd ? c.dtype_x : c.dtype_out, g.shape, std::vector<double>(rows * cols)};
  std::vector<ref::Tensor> mean(T, ref::Tensor{c.dtype_compute, g.stat_shape, std::vector<double>(rows)});
  std::vector<ref::Tensor> rstd = mean;
  // per sp rank, its rows' float32 partial sums of dy xhat and dy
  std::vector<Vec> pw(S, Vec(cols, 0.0f)), pb(S, Vec(cols, 0.0f));
  for (std::size_t r = 0; r < rows; ++r) {
    // per tp rank: its partial sums, then what the all-reduce gives every rank of the group
    auto all_reduce = [&](const Vec& part, std::size_t t) {
      return local ? part[t] : reduce(part, p.stats_reduce, p.flush_subnormals);
    };
    auto n_of = [&](std::size_t t) { return static_cast<float>(local ? lay.n_local[t] : g.cols); };
    Vec s1(T, 0.0f), s2(T, 0.0f);
    for (std::size_t j = 0; j < cols; ++j) s1[shard(j)] += static_cast<float>(x[at(r, j)]);
    Vec mu(T, 0.0f), rs(T, 0.0f);
    for (std::size_t t = 0; t < T; ++t) mu[t] = ln ? all_reduce(s1, t) / n_of(t) : 0.0f;
    for (std::size_t j = 0; j < cols; ++j) {
      const float d = static_cast<float>(x[at(r, j)]) - mu[shard(j)];
      s2[shard(j)] += d * d;
    }
    if (fault == "div_world") {
      Vec ms(T);
      for (std::size_t t = 0; t < T; ++t) ms[t] = s2[t] / static_cast<float>(lay.n_local[t]);
      for (std::size_t t = 0; t < T; ++t)
        rs[t] = 1.0f / std::sqrt(reduce(ms, p.stats_reduce, p.flush_subnormals) / static_cast<float>(T) + eps);
    } else {
      for (std::size_t t = 0; t < T; ++t) rs[t] = 1.0f / std::sqrt(all_reduce(s2, t) / n_of(t) + eps);
    }
    for (std::size_t t = 0; t < T; ++t) {
      mean[t].data[r] = mu[t];
      rstd[t].data[r] = rs[t];
    }
    Vec sg(T, 0.0f), sgx(T, 0.0f);
    for (std::size_t j = 0; j < cols; ++j) {
      const std::size_t t = shard(j);
      const float xh = (static_cast<float>(x[at(r, j)]) - mu[t]) * rs[t];
      if (!bwd) {
        float v = xh * scale[j];
        if (b) v += static_cast<float>((*b)[j]);
        y.data[at(r, j)] = ref::round_to(v, c.dtype_out);
        continue;
      }
      const float dyj = static_cast<float>((*dy)[at(r, j)]), gj = dyj * scale[j];
      sg[t] += gj;
      sgx[t] += gj * xh;
      const auto s = static_cast<std::size_t>(lay.row_shard[r]);
      pw[s][j] += dyj * xh;
      pb[s][j] += dyj;
    }
    if (!bwd) continue;
    for (std::size_t j = 0; j < cols; ++j) {
      const std::size_t t = shard(j);
      const float n = fault == "div_world" ? static_cast<float>(g.cols) : n_of(t);
      const float xh = (static_cast<float>(x[at(r, j)]) - mu[t]) * rs[t];
      const float gj = static_cast<float>((*dy)[at(r, j)]) * scale[j];
      float k =
          gj - xh * ((fault == "div_world" ? reduce(sgx, p.stats_reduce, p.flush_subnormals) : all_reduce(sgx, t)) / n);
      if (ln) k -= all_reduce(sg, t) / n;
      y.data[at(r, j)] = ref::round_to(rs[t] * k, c.dtype_x);
    }
  }
  if (!bwd) {
    out.gathered["y"] = y;
    if (ln) out.gathered["mean"] = mean[0];
    out.gathered["rstd"] = rstd[0];
    if (T > 1) {
      if (ln) out.copies["mean"] = mean;
      out.copies["rstd"] = rstd;
    }
    return out;
  }
  out.gathered["dx"] = y;
  auto grads = [&](const std::vector<Vec>& part, const char* name) {
    std::vector<ref::Tensor> copies(S, ref::Tensor{c.dtype_param, g.param_shape, std::vector<double>(cols)});
    for (std::size_t j = 0; j < cols; ++j) {
      std::vector<float> col(S);
      for (std::size_t s = 0; s < S; ++s) col[s] = part[s][j];
      if (fault == "reduced_twice") {
        const float once = reduce(col, ref::DType::float32);
        for (auto& v : col) v = once;
      }
      const float total = reduce(col, p.reduce, p.flush_subnormals);
      for (std::size_t s = 0; s < S; ++s) {
        float v = fault == "not_reduced" ? col[s] : total;
        if (fault == "averaged") v /= static_cast<float>(S);
        copies[s].data[j] = ref::round_to(v, c.dtype_param);
      }
    }
    out.gathered[name] = copies[0];
    if (S > 1) out.copies[name] = copies;
  };
  if (w) grads(pw, "dweight");
  if (b) grads(pb, "dbias");
  return out;
}

const std::vector<EmulatedFault>& emulated_faults() {
  static const std::vector<EmulatedFault> all{
      {"rank_local", "rank-local statistics", true, false},
      {"div_world", "sum of squares divided by the world size", true, true},
      {"not_reduced", ": rank-local: the sum over sp rank", false, false},
      {"averaged", ": averaged:", false, false},
      {"reduced_twice", ": multiplied by", false, false}};
  return all;
}

std::string fault_inapplicable(const EmulatedFault& f, const ref::Case& c, const Plan& p) {
  if (f.tp) {
    if (p.tp < 2) return "no tp ranks";
    if (f.rms_only && c.op != ref::Op::rmsnorm) return "MiniMax's TP norm is an RMSNorm";
    if (f.rms_only) {
      const auto n = layout_of(c, p).n_local;
      if (std::adjacent_find(n.begin(), n.end(), std::not_equal_to<>()) == n.end())
        return "equal shards: the division by the world size is exact there";
    }
    return "";
  }
  if (p.sp < 2) return "no sp ranks";
  if (c.direction != ref::Direction::backward || c.affine == ref::Affine::none)
    return "no parameter gradients (forward, or no affine parameters)";
  return "";
}

}  // namespace normcheck::shard
