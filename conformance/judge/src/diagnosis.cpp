// The diagnosis panel (DIAGNOSIS.md): the case's semantics with one known fault applied, each
// evaluated by one parameterized model of the norm (`Engine`) in double, with emulated
// float16/bfloat16/float32 arithmetic where the fault is a rounding effect, and scored against
// the candidate's outputs under the checker's allowances.
//
// Accuracy: the engine is not certified. Its value for the spec itself is within a few units of
// long double (2^-64) of the exact value on ordinary rows; to remove even that, a dialect's
// prediction is taken as expected_f64 + (dialect - engine's spec): exactly the certified value
// where the fault does not change an element, and the fault's effect added to it elsewhere.
#include "normcheck/judge/diagnosis.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <functional>
#include <limits>
#include <optional>
#include <set>

#include "normcheck/judge/checker.hpp"
#include "normcheck/reference/contract.hpp"

namespace normcheck::conf {

namespace {

using Wide = long double;
using ref::DType;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- the knobs of the model ----------------------------------------------------------------

enum class EpsPlace { inside, outside_sqrt, in_count };
enum class StatArith { exact, one_pass, accumulate, merge_halves };
enum class WeightMode { normal, missing, swapped, bias_first };
enum class ResMode { normal, not_added, after_norm, alpha_on_residual };
enum class ResOut { normal, missing_bias, holds_y, holds_xhat };
enum class RstdOut { rstd, std_dev, variance };
enum class DxMode { normal, no_mean, no_projection };
// bf16_interval: the column sums are bfloat16 values within the error bound of a bfloat16
// summation in any order (Predictions::slack, grid).
enum class ColSum { normal, bf16_interval, zero_columns };
enum class BlockMode { normal, pre_residual_after_norm, deepnorm_alpha_on_f, post_double_norm };

// One semantics: the spec's values by default; a dialect changes one thing.
struct Knobs {
  bool centre = true;
  double eps = 0;
  EpsPlace eps_place = EpsPlace::inside;
  bool unbiased = false;
  bool pad_lanes = false;
  StatArith arith = StatArith::exact;
  DType arith_dtype = DType::float32;  // one_pass: every statistics operation; accumulate: the sums
  std::optional<std::vector<std::int64_t>> stat_dims;  // statistics over these dims of x instead
  std::optional<DType> rstd_round;
  bool rstd_out_unrounded = false;  // the rstd output holds the value before rstd_round
  WeightMode weight = WeightMode::normal;
  bool bias_missing = false;
  double offset = 0;
  bool weight_flat_index = false;  // parameter index = flat index of x mod the parameter count
  ref::ResolvedPoints pts;
  ResMode res = ResMode::normal;
  bool h_round_x = false;
  ResOut res_out = ResOut::normal;
  RstdOut rstd_out = RstdOut::rstd;
  DxMode dx = DxMode::normal;
  ColSum colsum = ColSum::normal;
  std::map<std::string, std::vector<std::uint8_t>> zero_cols;  // output -> columns left at 0
  std::int64_t rows_limit = -1;  // rows from this one on are not computed (hold `unwritten`)
  double unwritten = 0;
  BlockMode block = BlockMode::normal;
  // dweight's x-hat rebuilt from y with the weight/bias of the row's lane in a tile of this
  // width (DeepSpeed #692): (x-hat_j scale_j + b_j - b_pos) / scale_pos, pos = (j / T) T + row % T.
  std::int64_t dgamma_tile = 0;
};

// DeepSpeed's TILE_DIM in LayerNormBackward1 (#692).
constexpr std::int64_t kDgammaTile = 32;

// Predicted values per output (in the order of a Layout). A dialect that cannot say the order of
// its roundings predicts an interval instead: the values of dtype `grid` within `slack` of the
// predicted value.
struct Predictions {
  std::map<std::string, std::vector<double>> values;
  std::map<std::string, std::vector<double>> slack;
  std::map<std::string, DType> grid;
  std::vector<double>& operator[](const std::string& name) { return values[name]; }
  auto find(const std::string& name) const { return values.find(name); }
  auto end() const { return values.end(); }
};

// ref::round_to, inline where it is cheap (the engine rounds every operation of the emulated
// dialects): binary64 is the identity; a conversion to float is binary32's correctly rounded
// value (nearest-even, overflow to inf, subnormals exact: the default floating-point mode);
// bfloat16 and float16 values in their normal range are rounded on the bits as ref::round_to
// does; the rest (subnormal in the target, not finite, 0) goes to ref::round_to.
inline double rnd(double v, DType t) {
  switch (t) {
    case DType::float64: return v;
    case DType::float32: return static_cast<double>(static_cast<float>(v));
    case DType::bfloat16:
    case DType::float16: {
      const bool bf = t == DType::bfloat16;
      const int min_exp = bf ? -126 : -14, shift = 53 - (bf ? 8 : 11);
      const double max_finite = bf ? 3.3895313892515355e38 : 65504.0;
      const auto u = std::bit_cast<std::uint64_t>(v);
      const int biased = static_cast<int>((u >> 52) & 0x7ff);
      if (biased == 0x7ff || biased - 1023 < min_exp) break;  // not finite, or subnormal/0 there
      const std::uint64_t lsb = (u >> shift) & 1;
      const std::uint64_t r = (u + ((std::uint64_t{1} << (shift - 1)) - 1) + lsb) & ~((std::uint64_t{1} << shift) - 1);
      const double rv = std::bit_cast<double>(r);
      if (std::fabs(rv) > max_finite) return std::copysign(kInf, v);
      return rv;
    }
  }
  return ref::round_to(v, t);
}

const ref::Tensor* input(const ref::Case& c, const char* name) {
  auto it = c.inputs.find(name);
  return it == c.inputs.end() ? nullptr : &it->second;
}

template <class Real>
struct RowStatT {
  Real mean = 0, var = 0, rstd = 0;
  Real rstd_unrounded = 0;  // before rstd_round
};

template <class Real>
RowStatT<Real> finish(RowStatT<Real> s, const Knobs& k) {
  s.rstd_unrounded = s.rstd;
  if (k.rstd_round) s.rstd = rnd(s.rstd, *k.rstd_round);
  return s;
}

// The sum of f(0..n) in four interleaved partial sums (the engine's exact statistics of a case
// computed in a narrower dtype: a correct binary64 kernel's, without one long chain of dependent
// additions).
template <class F>
auto sum4(std::int64_t n, const F& f) {
  decltype(f(0)) a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  std::int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a0 += f(i);
    a1 += f(i + 1);
    a2 += f(i + 2);
    a3 += f(i + 3);
  }
  for (; i < n; ++i) a0 += f(i);
  return (a0 + a1) + (a2 + a3);
}

// Mean, variance (the biased one, or the dialect's) and rstd of h[0..n).
template <class Real>
RowStatT<Real> row_stats(const Real* h, std::int64_t n, const Knobs& k, DType compute) {
  using LD = Real;
  using RowStat = RowStatT<Real>;
  RowStat s;
  const LD N = static_cast<LD>(n);
  if (k.arith == StatArith::one_pass && k.centre) {
    // E[h^2] - E[h]^2 with every operation rounded to arith_dtype (sequential sums).
    const DType t = k.arith_dtype;
    double s1 = 0, s2 = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const double hv = rnd(h[i], t);
      s1 = rnd(static_cast<LD>(s1) + hv, t);
      s2 = rnd(static_cast<LD>(s2) + rnd(static_cast<LD>(hv) * hv, t), t);
    }
    const double m = rnd(s1 / N, t);
    const double var = rnd(rnd(s2 / N, t) - static_cast<LD>(rnd(static_cast<LD>(m) * m, t)), t);
    s.mean = m;
    s.var = var;
    s.rstd = static_cast<LD>(
        rnd(LD(1) / rnd(std::sqrt(static_cast<LD>(rnd(static_cast<LD>(var) + rnd(k.eps, t), t))), t), t));
    return finish(s, k);
  }
  if (k.arith == StatArith::accumulate) {
    // Sums held in arith_dtype between additions (sequential); other operations in the
    // case's compute dtype.
    const DType a = k.arith_dtype, t = compute;
    double acc = 0;
    double m = 0;
    if (k.centre) {
      for (std::int64_t i = 0; i < n; ++i) acc = rnd(static_cast<LD>(acc) + rnd(h[i], t), a);
      m = rnd(acc / N, t);
      acc = 0;
    }
    for (std::int64_t i = 0; i < n; ++i) {
      const double d = rnd(static_cast<LD>(rnd(h[i], t)) - m, t);
      acc = rnd(static_cast<LD>(acc) + rnd(static_cast<LD>(d) * d, t), a);
    }
    const double var = rnd(acc / N, t);
    s.mean = m;
    s.var = var;
    s.rstd = static_cast<LD>(
        rnd(LD(1) / rnd(std::sqrt(static_cast<LD>(rnd(static_cast<LD>(var) + rnd(k.eps, t), t))), t), t));
    return finish(s, k);
  }
  // A float64 case's allowances are a few binary64 ulps: its kernels' sequential sums are
  // modelled as such; for narrower cases four partial sums are as good and faster.
  auto sum_of = [&](std::int64_t len, const auto& f) {
    if (compute != DType::float64) return sum4(len, f);
    LD acc = 0;
    for (std::int64_t i = 0; i < len; ++i) acc += f(i);
    return acc;
  };
  LD ss = 0;
  if (k.arith == StatArith::merge_halves) {
    // Two halves merged as if each held N/2 elements: mean (ma + mb)/2, M2 + delta^2 N/4. An
    // empty half (N = 1) is a partial of zero sums: mean 0, M2 0.
    const std::int64_t half = n / 2;
    auto part = [&](std::int64_t lo, std::int64_t hi, LD& mean, LD& m2) {
      LD sum = 0;
      for (std::int64_t i = lo; i < hi; ++i) sum += h[i];
      mean = hi > lo ? sum / static_cast<LD>(hi - lo) : LD(0);
      m2 = 0;
      for (std::int64_t i = lo; i < hi; ++i) {
        const LD d = k.centre ? h[i] - mean : h[i];
        m2 += d * d;
      }
    };
    LD ma, mb, m2a, m2b;
    part(0, half, ma, m2a);
    part(half, n, mb, m2b);
    if (k.centre) {
      s.mean = (ma + mb) / 2;
      const LD delta = mb - ma;
      ss = m2a + m2b + delta * delta * N / 4;
    } else {
      ss = ((half > 0 ? m2a / static_cast<LD>(half) : LD(0)) + m2b / static_cast<LD>(n - half)) / 2 * N;
    }
  } else {
    if (k.centre) {
      s.mean = sum_of(n, [&](std::int64_t i) { return h[i]; }) / N;
    }
    const LD m = k.centre ? s.mean : LD(0);
    ss = sum_of(n, [&](std::int64_t i) {
      const LD d = h[i] - m;
      return d * d;
    });
    if (k.pad_lanes && k.centre) {
      const auto lanes = static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(n)));
      ss += static_cast<LD>(lanes - n) * s.mean * s.mean;
    }
  }
  const LD div = k.unbiased && k.centre ? N - 1 : N;
  s.var = ss / div;
  switch (k.eps_place) {
    case EpsPlace::inside: s.rstd = LD(1) / std::sqrt(s.var + static_cast<LD>(k.eps)); break;
    case EpsPlace::outside_sqrt: s.rstd = LD(1) / (std::sqrt(s.var) + static_cast<LD>(k.eps)); break;
    case EpsPlace::in_count: s.rstd = LD(1) / std::sqrt(ss / (N + static_cast<LD>(k.eps))); break;
  }
  return finish(s, k);
}

// Which elements a prediction covers: `rows` of the case (all of them, or a sample), and for
// each output the flat index of every predicted element, in the order of the prediction's
// vector.
struct Layout {
  std::vector<std::int64_t> rows;
  bool all_rows = true;
  std::map<std::string, std::vector<std::size_t>> flat;
};

// The parameterized model of a case (plain norms forward and backward; blocks forward).
template <class Real>
class Engine {
  using LD = Real;
  using RowStat = RowStatT<Real>;

 public:
  explicit Engine(const ref::Case& c) : c_(c), g_(ref::geometry_of(c)) {
    x_ = input(c, "x");
    w_ = c.affine != ref::Affine::none ? input(c, "weight") : nullptr;
    b_ = c.affine == ref::Affine::weight_bias ? input(c, "bias") : nullptr;
    r_ = c.residual != ref::Residual::none ? input(c, "residual") : nullptr;
    rb_ = c.residual == ref::Residual::add_bias ? input(c, "residual_bias") : nullptr;
    dy_ = c.direction == ref::Direction::backward ? input(c, "dy") : nullptr;
    stats_spec_ = spec();
  }

  Knobs spec() const {
    Knobs k;
    k.centre = c_.op == ref::Op::layernorm;
    k.eps = c_.epsilon;
    k.offset = c_.weight_offset;
    k.pts = ref::resolve_points(c_);
    return k;
  }

  const ref::Geometry& geometry() const { return g_; }

  // The layout of predictions over `rows` (every row: nullptr). Backward column sums are always
  // over every column; on a sample of rows they are predicted only where they follow from the
  // spec's (prime_columns).
  Layout layout(const std::vector<std::int64_t>* rows) const {
    Layout l;
    const bool all = !rows;
    l.all_rows = all;
    if (all) {
      l.rows.resize(static_cast<std::size_t>(g_.rows));
      for (std::int64_t r = 0; r < g_.rows; ++r) l.rows[r] = r;
    } else {
      l.rows = *rows;
    }
    std::vector<std::size_t> elems, per_row, cols;
    for (auto r : l.rows) {
      per_row.push_back(static_cast<std::size_t>(r));
      for (std::int64_t j = 0; j < g_.cols; ++j) elems.push_back(off(r, j));
    }
    for (std::int64_t j = 0; j < g_.cols; ++j) cols.push_back(static_cast<std::size_t>(j));
    for (const auto& [name, spec] : output_specs(c_)) {
      if (c_.block != ref::Block::none) {
        // Blocks: y and dx per element of the rows; the parameter gradients ([L, K, D], the
        // FFN's) over every element, on every row only (a sample scores dx alone).
        if (name == "y" || name == "dx") {
          l.flat[name] = elems;
        } else if (all) {
          std::size_t size = 1;
          for (auto d : spec.shape) size *= static_cast<std::size_t>(d);
          auto& f = l.flat[name];
          f.resize(size);
          for (std::size_t i = 0; i < size; ++i) f[i] = i;
        }
        continue;
      }
      if (name == "mean" || name == "rstd")
        l.flat[name] = per_row;
      else if (name == "dweight" || name == "dbias" || name == "dresidual_bias")
        l.flat[name] = cols;
      else if (c_.block == ref::Block::none || name == "y")
        l.flat[name] = elems;
    }
    return l;
  }

  // columns_only (backward): the column sums only, no dx (a cheaper bound for a ranking);
  // with only_cols (see subset_bound_ok), dweight and dbias of those columns only, the others
  // without a prediction (infinite slack: not scored).
  Predictions run(const Knobs& k, const Layout& l, bool columns_only = false,
                  const std::vector<std::int64_t>* only_cols = nullptr) const {
    if (c_.block != ref::Block::none) return run_block(k, l);
    const std::int64_t n = g_.cols;
    const auto RS = static_cast<std::int64_t>(l.rows.size());
    const std::size_t NS = static_cast<std::size_t>(RS * n);
    // h of the selected rows (compact: ri * n + j); statistics over other dims need every h.
    const bool groups = k.stat_dims.has_value();
    const LD alpha = c_.alpha;
    auto h_at = [&](std::int64_t row, std::int64_t j, LD* out_h) {
      const std::size_t i = off(row, j);
      const std::size_t pj = k.weight_flat_index ? i % static_cast<std::size_t>(n) : static_cast<std::size_t>(j);
      const LD x = x_->data[i], res = r_ ? r_->data[i] : LD(0), rb = rb_ ? rb_->data[pj] : LD(0);
      LD hv = 0;
      switch (k.res) {
        case ResMode::normal: hv = alpha * x + res + rb; break;
        case ResMode::not_added:
        case ResMode::after_norm: hv = alpha * x + rb; break;
        case ResMode::alpha_on_residual: hv = x + alpha * res + rb; break;
      }
      if (k.pts.h) hv = rnd(hv, *k.pts.h);
      if (k.h_round_x) hv = rnd(hv, c_.dtype_x);
      if (out_h) {
        LD ho = hv;
        if (k.res == ResMode::after_norm) ho = alpha * x + res + rb;
        if (k.res_out == ResOut::missing_bias) ho = alpha * x + res;
        if (k.res == ResMode::after_norm || k.res_out == ResOut::missing_bias) {
          if (k.pts.h) ho = rnd(ho, *k.pts.h);
          if (k.h_round_x) ho = rnd(ho, c_.dtype_x);
        }
        *out_h = ho;
      }
      return hv;
    };
    // h and residual_out's h are shared by every dialect that computes them as the spec does
    // (all but the residual and h-rounding ones); the row statistics of the spec's statistics
    // knobs by every dialect that keeps them (weights, contracts' later points, dx terms,
    // reductions...); both per set of rows (the sample and every row: two slots each).
    const bool h_shared = !groups && same_h(k, stats_spec_) && !(rb_ && k.weight_flat_index);
    const bool shared = h_shared && same_h_and_stats(k, stats_spec_);
    const HCache* hc = nullptr;
    const StatsCache* sc = nullptr;
    if (h_shared)
      for (const auto& slot : h_cache_)
        if (slot && slot->rows == l.rows) hc = &*slot;
    if (shared)
      for (const auto& slot : stats_cache_)
        if (slot && slot->rows == l.rows) sc = &*slot;
    std::vector<LD> h_own, hout_own;
    std::vector<RowStat> st_own;
    std::vector<std::int64_t> group_of;
    if (!hc) {
      h_own.resize(groups ? x_->data.size() : NS);
      hout_own.resize(r_ ? NS : 0);
      if (groups) {
        for (std::int64_t row = 0; row < g_.rows; ++row)
          for (std::int64_t j = 0; j < n; ++j) h_own[off(row, j)] = h_at(row, j, nullptr);
      }
      for (std::int64_t ri = 0; ri < RS; ++ri)
        for (std::int64_t j = 0; j < n; ++j) {
          const std::size_t ci = static_cast<std::size_t>(ri * n + j);
          const LD hv = h_at(l.rows[ri], j, r_ ? &hout_own[ci] : nullptr);
          if (!groups) h_own[ci] = hv;
        }
      if (h_shared) {
        auto& slot = h_cache_[next_h_slot_];
        next_h_slot_ = (next_h_slot_ + 1) % h_cache_.size();
        slot = HCache{l.rows, std::move(h_own), std::move(hout_own)};
        hc = &*slot;
      }
    }
    const std::vector<LD>& h = hc ? hc->h : h_own;
    const std::vector<LD>& hout = hc ? hc->hout : hout_own;
    if (!sc) {
      // Statistics: per selected row, or per group of another set of dims (all groups).
      if (groups) {
        ref::Case lc;
        lc.axes = *k.stat_dims;
        lc.inputs["x"] = ref::Tensor{x_->dtype, x_->shape, {}};
        const auto gs = ref::geometry_of(lc);
        group_of.assign(x_->data.size(), 0);
        std::vector<LD> buf(static_cast<std::size_t>(gs.cols));
        for (std::int64_t gr = 0; gr < gs.rows; ++gr) {
          for (std::int64_t j = 0; j < gs.cols; ++j) {
            const auto i = static_cast<std::size_t>(gs.row_base[gr] + gs.col_delta[j]);
            group_of[i] = gr;
            buf[j] = h[i];
          }
          st_own.push_back(row_stats(buf.data(), gs.cols, k, c_.dtype_compute));
        }
      } else {
        st_own.reserve(static_cast<std::size_t>(RS));
        for (std::int64_t ri = 0; ri < RS; ++ri)
          st_own.push_back(row_stats(&h[static_cast<std::size_t>(ri * n)], n, k, c_.dtype_compute));
      }
      if (shared) {
        auto& slot = stats_cache_[next_slot_];
        next_slot_ = (next_slot_ + 1) % stats_cache_.size();
        slot = StatsCache{l.rows, std::move(st_own)};
        sc = &*slot;
      }
    }
    const std::vector<RowStat>& st = sc ? sc->st : st_own;
    auto h_of = [&](std::int64_t ri, std::int64_t j) {
      return groups ? h[off(l.rows[ri], j)] : h[static_cast<std::size_t>(ri * n + j)];
    };
    auto stat_of = [&](std::int64_t ri, std::int64_t j) -> const RowStat& {
      return groups ? st[group_of[off(l.rows[ri], j)]] : st[ri];
    };
    auto param = [&](const ref::Tensor* t, std::int64_t row, std::int64_t j) -> LD {
      if (!t) return 0;
      if (k.weight_flat_index) return t->data[off(row, j) % static_cast<std::size_t>(n)];
      return t->data[j];
    };
    auto dead = [&](std::int64_t row) { return k.rows_limit >= 0 && row >= k.rows_limit; };

    Predictions p;
    const bool ln = c_.op == ref::Op::layernorm;
    if (c_.direction == ref::Direction::forward) {
      auto& y = p["y"];
      y.assign(NS, 0.0);
      std::vector<double>* rout = nullptr;
      if (r_) {
        rout = &p["residual_out"];
        rout->assign(NS, 0.0);
      }
      // The scale and bias of each column (parameters indexed per element: per element).
      auto scale_bias = [&](std::int64_t row, std::int64_t j, LD& scale, LD& bv) {
        LD wv = param(w_, row, j);
        bv = b_ && !k.bias_missing ? param(b_, row, j) : LD(0);
        if (k.weight == WeightMode::swapped) std::swap(wv, bv);
        scale = k.weight == WeightMode::missing ? LD(1) : k.offset + wv;
        if (k.pts.scale && k.weight != WeightMode::missing) scale = rnd(scale, *k.pts.scale);
      };
      const bool per_col = w_ && !k.weight_flat_index;
      std::vector<LD> col_scale(per_col ? n : 0), col_bias(per_col ? n : 0);
      for (std::int64_t j = 0; per_col && j < n; ++j) scale_bias(0, j, col_scale[j], col_bias[j]);
      for (std::int64_t ri = 0; ri < RS; ++ri) {
        const std::int64_t row = l.rows[ri];
        if (dead(row)) {
          for (std::int64_t j = 0; j < n; ++j) {
            const std::size_t ci = static_cast<std::size_t>(ri * n + j);
            y[ci] = k.unwritten;
            if (rout) (*rout)[ci] = k.unwritten;
          }
          continue;
        }
        for (std::int64_t j = 0; j < n; ++j) {
          const std::size_t ci = static_cast<std::size_t>(ri * n + j);
          const RowStat& s = stat_of(ri, j);
          const LD hv = h_of(ri, j);
          LD xh = (k.centre ? hv - s.mean : hv) * s.rstd;
          if (k.pts.xhat) xh = rnd(xh, *k.pts.xhat);
          LD v = xh;
          if (w_) {
            LD scale, bv;
            if (per_col) {
              scale = col_scale[j];
              bv = col_bias[j];
            } else {
              scale_bias(row, j, scale, bv);
            }
            if (k.weight == WeightMode::bias_first) {
              v = (xh + bv) * scale;
              if (k.pts.mul) v = rnd(v, *k.pts.mul);
            } else {
              v = xh * scale;
              if (k.pts.mul) v = rnd(v, *k.pts.mul);
              v += bv;
            }
          }
          if (k.res == ResMode::after_norm) v += r_->data[off(row, j)];
          y[ci] = static_cast<double>(v);
          if (rout) {
            const LD o = k.res_out == ResOut::holds_y ? v : k.res_out == ResOut::holds_xhat ? xh : hout[ci];
            (*rout)[ci] = static_cast<double>(o);
          }
        }
      }
      auto& rs = p["rstd"];
      std::vector<double>* mean = ln ? &p["mean"] : nullptr;
      rs.assign(static_cast<std::size_t>(RS), 0.0);
      if (mean) mean->assign(static_cast<std::size_t>(RS), 0.0);
      for (std::int64_t ri = 0; ri < RS; ++ri) {
        if (dead(l.rows[ri])) {
          rs[ri] = k.unwritten;
          if (mean) (*mean)[ri] = k.unwritten;
          continue;
        }
        const RowStat& s = stat_of(ri, 0);
        const LD out = k.rstd_out == RstdOut::rstd      ? (k.rstd_out_unrounded ? s.rstd_unrounded : s.rstd)
                       : k.rstd_out == RstdOut::std_dev ? LD(1) / s.rstd
                                                        : s.var;
        rs[ri] = static_cast<double>(out);
        if (mean) (*mean)[ri] = static_cast<double>(s.mean);
      }
      return p;
    }

    // Backward (every row): dh = rstd (g - mean(g) - xhat mean(g xhat)), g = dy scale; column sums.
    std::vector<double> no_dx;
    auto& dx = columns_only ? no_dx : p["dx"];
    if (!columns_only) dx.assign(NS, 0.0);
    std::vector<double>* dres = r_ && !columns_only ? &p["dresidual"] : nullptr;
    if (dres) dres->assign(NS, 0.0);
    // On a sample, column sums are predicted only from the spec's (below): not accumulated.
    const bool sums = l.all_rows;
    const std::size_t nw = sums && w_ ? static_cast<std::size_t>(n) : 0, nb = sums && b_ ? static_cast<std::size_t>(n) : 0,
                      nrb = sums && rb_ ? static_cast<std::size_t>(n) : 0;
    std::vector<LD> dw(nw, 0), db(nb, 0), drb(nrb, 0);
    std::vector<LD> dw_a(nw, 0), db_a(nb, 0), drb_a(nrb, 0);  // sums of |terms|: bf16_interval's bound
    // dweight with the wrong lane's parameters (dgamma_tile; computed too when the spec's column
    // sums are cached for a sample), and the columns whose lane falls beyond the last column
    // (read out of bounds: no prediction).
    const bool priming = l.all_rows && !cols_ && reduction_only(k) && !columns_only;
    const std::int64_t tile =
        w_ && sums && (k.dgamma_tile > 0 || priming) ? (k.dgamma_tile > 0 ? k.dgamma_tile : kDgammaTile) : 0;
    std::vector<LD> dwt(tile ? n : 0, 0);
    std::vector<std::uint8_t> dwt_unknown(tile ? n : 0, 0);
    auto scale_of = [&](std::int64_t row, std::int64_t j) -> LD {
      if (!w_ || k.weight == WeightMode::missing) return 1;
      return k.offset + (k.weight == WeightMode::swapped && b_ ? param(b_, row, j) : param(w_, row, j));
    };
    auto accumulate = [&](std::vector<LD>& acc, std::vector<LD>& abs_sum, std::int64_t j, LD term) {
      acc[j] += term;
      abs_sum[j] += std::fabs(term);
    };
    // Statistics over other dims (stat_dims): the dx terms mean(g) and mean(g x-hat) are means
    // over the same groups as the statistics (a kernel normalizing those dims differentiates its
    // own function), so they need every element: per group, from every row.
    std::vector<LD> grp_gbar, grp_m2;
    if (groups && (!columns_only || (rb_ && sums))) {
      const std::size_t ng = st.size();
      std::vector<LD> gs(ng, 0), gxs(ng, 0), cnt(ng, 0);
      for (std::int64_t row = 0; row < g_.rows; ++row)
        for (std::int64_t j = 0; j < n; ++j) {
          const std::size_t i = off(row, j);
          const auto gr = static_cast<std::size_t>(group_of[i]);
          const RowStat& s = st[gr];
          const LD xv = (k.centre ? h[i] - s.mean : h[i]) * s.rstd;
          LD scale = 1;
          if (w_ && k.weight != WeightMode::missing)
            scale = k.offset + (k.weight == WeightMode::swapped && b_ ? param(b_, row, j) : param(w_, row, j));
          const LD gv = static_cast<LD>(dy_->data[i]) * scale;
          gs[gr] += gv;
          gxs[gr] += gv * xv;
          cnt[gr] += 1;
        }
      grp_gbar.resize(ng);
      grp_m2.resize(ng);
      for (std::size_t gr = 0; gr < ng; ++gr) {
        grp_gbar[gr] = cnt[gr] > 0 ? gs[gr] / cnt[gr] : LD(0);
        grp_m2[gr] = cnt[gr] > 0 ? gxs[gr] / cnt[gr] : LD(0);
      }
    }
    // Column of parameter p that element (row, j) reads and its gradient goes to.
    auto pcol = [&](std::int64_t row, std::int64_t j) -> std::int64_t {
      return k.weight_flat_index ? static_cast<std::int64_t>(off(row, j) % static_cast<std::size_t>(n)) : j;
    };
    // g = dy * scale: the scale of each column (per element where the parameters are remapped).
    auto scale_at = [&](std::int64_t row, std::int64_t j) -> LD {
      if (!w_ || k.weight == WeightMode::missing) return 1;
      return k.offset + (k.weight == WeightMode::swapped && b_ ? param(b_, row, j) : param(w_, row, j));
    };
    const bool bwd_per_col = !k.weight_flat_index;
    std::vector<LD> bwd_scale(bwd_per_col ? n : 0);
    for (std::int64_t j = 0; bwd_per_col && j < n; ++j) bwd_scale[j] = scale_at(0, j);
    const bool subset = only_cols && columns_only && subset_bound_ok(k) && sums && !tile;
    const std::int64_t nj = subset ? static_cast<std::int64_t>(only_cols->size()) : n;
    std::vector<LD> g(n), xh(n);
    for (std::int64_t ri = 0; ri < RS; ++ri) {
      const std::int64_t row = l.rows[ri];
      if (subset) {
        // The chosen columns' terms of dweight and dbias only.
        if (dead(row)) continue;
        for (std::int64_t jj = 0; jj < nj; ++jj) {
          const std::int64_t j = (*only_cols)[static_cast<std::size_t>(jj)];
          const RowStat& s = stat_of(ri, j);
          const LD dyv = dy_->data[off(row, j)];
          const LD hv = h_of(ri, j);
          if (w_) accumulate(dw, dw_a, j, dyv * ((k.centre ? hv - s.mean : hv) * s.rstd));
          if (b_) accumulate(db, db_a, j, dyv);
        }
        continue;
      }
      if (dead(row)) {
        for (std::int64_t j = 0; columns_only ? false : j < n; ++j) {
          dx[static_cast<std::size_t>(ri * n + j)] = k.unwritten;
          if (dres) (*dres)[static_cast<std::size_t>(ri * n + j)] = k.unwritten;
        }
        continue;
      }
      LD gsum = 0, gx = 0;
      for (std::int64_t j = 0; j < n; ++j) {
        const RowStat& s = stat_of(ri, j);
        const LD dyv = dy_->data[off(row, j)];
        const LD hv = h_of(ri, j);
        xh[j] = (k.centre ? hv - s.mean : hv) * s.rstd;
        const LD scale = bwd_per_col ? bwd_scale[j] : scale_at(row, j);
        g[j] = dyv * scale;
        gsum += g[j];
        gx += g[j] * xh[j];
        if (w_ && sums) accumulate(dw, dw_a, pcol(row, j), dyv * xh[j]);
        if (tile) {
          const std::int64_t pos = (j / tile) * tile + row % tile;
          if (pos >= n) {
            dwt_unknown[j] = 1;
          } else {
            LD yv = xh[j] * scale_of(row, j);
            if (b_) yv += param(b_, row, j) - param(b_, row, pos);
            dwt[j] += dyv * (yv / scale_of(row, pos));
          }
        }
        if (b_ && sums) accumulate(db, db_a, pcol(row, j), dyv);
      }
      const LD gbar = gsum / static_cast<LD>(n), m2 = gx / static_cast<LD>(n);
      if (columns_only && !(rb_ && sums)) continue;
      for (std::int64_t j = 0; j < n; ++j) {
        LD K = g[j];
        const LD gb = groups ? grp_gbar[static_cast<std::size_t>(group_of[off(row, j)])] : gbar;
        const LD mm = groups ? grp_m2[static_cast<std::size_t>(group_of[off(row, j)])] : m2;
        if (k.centre && k.dx != DxMode::no_mean) K -= gb;
        if (k.dx != DxMode::no_projection) K -= xh[j] * mm;
        const LD dh = stat_of(ri, j).rstd * K;
        if (!columns_only) dx[static_cast<std::size_t>(ri * n + j)] = static_cast<double>(alpha * dh);
        if (dres) (*dres)[static_cast<std::size_t>(ri * n + j)] = static_cast<double>(dh);
        if (rb_ && sums) accumulate(drb, drb_a, pcol(row, j), dh);
      }
    }
    auto emit = [&](const char* name, const std::vector<LD>& acc, const std::vector<LD>& abs_sum) {
      auto& o = p[name];
      o.assign(static_cast<std::size_t>(n), 0.0);
      const auto zc = k.zero_cols.find(name);
      for (std::int64_t j = 0; j < n; ++j) {
        double v = static_cast<double>(acc[j]);
        if (zc != k.zero_cols.end() && zc->second[j]) v = 0;
        o[j] = v;
      }
      if (k.colsum == ColSum::bf16_interval) {
        // Any order of R additions in bfloat16: |error| <= gamma(R) sum |terms| (Higham 4.2),
        // plus the rounding of each term to bfloat16.
        const LD u = ref::unit_roundoff(DType::bfloat16), R = static_cast<LD>(RS) + 1;
        auto& sl = p.slack[name];
        sl.resize(static_cast<std::size_t>(n));
        for (std::int64_t j = 0; j < n; ++j)
          sl[j] = static_cast<double>(R * u / (1 - R * u) * abs_sum[j] * (1 + u));
        p.grid[name] = DType::bfloat16;
      }
    };
    if (!l.all_rows) {
      // Column sums need every row: on a sample they are predicted only for dialects that change
      // nothing but the reduction (from the spec's full sums), and left out otherwise (the
      // sample score is then over dx alone, still a lower bound of the full score).
      if (!cols_ || !reduction_only(k)) return p;
      dw = cols_->dw, db = cols_->db, drb = cols_->drb;
      dw_a = cols_->dw_a, db_a = cols_->db_a, drb_a = cols_->drb_a;
      dwt = cols_->dwt, dwt_unknown = cols_->dwt_unknown;
    }
    if (k.dgamma_tile > 0 && w_) {
      emit("dweight", dwt, dw_a);
      auto& sl = p.slack["dweight"];
      sl.assign(static_cast<std::size_t>(n), 0.0);
      for (std::int64_t j = 0; j < n; ++j)
        if (dwt_unknown[j]) sl[j] = kInf;
      if (b_) emit("dbias", db, db_a);
      if (rb_) emit("dresidual_bias", drb, drb_a);
      return p;
    }
    if (w_) emit("dweight", dw, dw_a);
    if (b_) emit("dbias", db, db_a);
    if (rb_) emit("dresidual_bias", drb, drb_a);
    if (subset) {
      std::vector<double> none(static_cast<std::size_t>(n), kInf);
      for (auto j : *only_cols) none[static_cast<std::size_t>(j)] = 0;
      if (w_) p.slack["dweight"] = none;
      if (b_) p.slack["dbias"] = none;
    }
    if (priming) cols_ = Columns{dw, db, drb, dw_a, db_a, drb_a, dwt, dwt_unknown};
    return p;
  }

  // Computes the spec's column sums on every row (for dialects evaluated on a sample of rows);
  // returns the spec's predictions on every row.
  Predictions prime_columns(const Knobs& spec, const Layout& all) {
    spec_ = spec;
    return run(spec, all);
  }

  // Whether run(k, every row, columns_only, only_cols) can predict a subset of the column sums:
  // no residual_bias (its sum needs every column's dh), parameters not remapped, sums reduced
  // as the spec's.
  bool subset_bound_ok(const Knobs& k) const {
    return !rb_ && !k.weight_flat_index && k.colsum == ColSum::normal && k.zero_cols.empty() &&
           k.dgamma_tile == 0 && c_.block == ref::Block::none && c_.direction == ref::Direction::backward;
  }

  // Whether k differs from the spec at most in how column sums are reduced.
  bool reduction_only(const Knobs& k) const { return spec_ && same_statistics(k, *spec_); }

  std::size_t off(std::int64_t row, std::int64_t j) const {
    return static_cast<std::size_t>(g_.row_base[row] + g_.col_delta[j]);
  }

 private:
  struct Columns {
    std::vector<LD> dw, db, drb, dw_a, db_a, drb_a, dwt;
    std::vector<std::uint8_t> dwt_unknown;
  };
  // h, residual_out's h and the statistics of the rows `rows` under the spec's statistics knobs.
  struct HCache {
    std::vector<std::int64_t> rows;
    std::vector<LD> h, hout;
  };
  struct StatsCache {
    std::vector<std::int64_t> rows;
    std::vector<RowStat> st;
  };
  mutable std::array<std::optional<HCache>, 2> h_cache_;
  mutable std::size_t next_h_slot_ = 0;
  mutable std::array<std::optional<StatsCache>, 2> stats_cache_;
  mutable std::size_t next_slot_ = 0;
  Knobs stats_spec_;  // spec(), set by the constructor

  // Whether a and b give the same h, residual_out's h and row statistics (Engine::run's first
  // passes read exactly these knobs).
  // Whether a and b give the same h and residual_out's h.
  static bool same_h(const Knobs& a, const Knobs& b) {
    return a.res == b.res && a.pts.h == b.pts.h && a.h_round_x == b.h_round_x && a.res_out == b.res_out;
  }
  static bool same_h_and_stats(const Knobs& a, const Knobs& b) {
    return a.res == b.res && a.pts.h == b.pts.h && a.h_round_x == b.h_round_x && a.res_out == b.res_out &&
           a.centre == b.centre && a.eps == b.eps && a.eps_place == b.eps_place && a.unbiased == b.unbiased &&
           a.pad_lanes == b.pad_lanes && a.arith == b.arith && a.arith_dtype == b.arith_dtype &&
           a.rstd_round == b.rstd_round && a.stat_dims == b.stat_dims;
  }
  mutable std::optional<Columns> cols_;
  std::optional<Knobs> spec_;

 public:
  // Whether a and b give the same values for every output of this case (then a dialect need not
  // be evaluated): the knobs that the case's direction and kind read are equal.
  bool same_semantics(const Knobs& a, const Knobs& b) const {
    if (c_.block != ref::Block::none)  // what run_block reads
      return a.centre == b.centre && a.eps == b.eps && a.eps_place == b.eps_place && a.unbiased == b.unbiased &&
             a.pad_lanes == b.pad_lanes && a.arith == b.arith && a.arith_dtype == b.arith_dtype &&
             a.rstd_round == b.rstd_round && a.offset == b.offset && a.block == b.block;
    if (c_.direction == ref::Direction::backward) {
      // Backward reads neither the bias (dbias is sum(dy) either way) nor where it is added.
      auto bwd = [](Knobs k) {
        if (k.weight == WeightMode::bias_first) k.weight = WeightMode::normal;
        k.bias_missing = false;
        return k;
      };
      return same_statistics(bwd(a), bwd(b)) && a.colsum == b.colsum && a.zero_cols == b.zero_cols &&
             a.dgamma_tile == b.dgamma_tile;
    }
    if (!same_statistics(a, b)) return false;
    return a.pts.xhat == b.pts.xhat && a.pts.scale == b.pts.scale && a.pts.mul == b.pts.mul &&
           a.res_out == b.res_out && a.rstd_out == b.rstd_out &&
           a.rstd_out_unrounded == b.rstd_out_unrounded && a.unwritten == b.unwritten;
  }

 private:
  static bool same_statistics(const Knobs& k, const Knobs& s) {
    return k.centre == s.centre && k.eps == s.eps && k.eps_place == s.eps_place && k.unbiased == s.unbiased &&
           k.pad_lanes == s.pad_lanes && k.arith == s.arith && k.arith_dtype == s.arith_dtype &&
           k.stat_dims == s.stat_dims && k.rstd_round == s.rstd_round && k.weight == s.weight &&
           k.bias_missing == s.bias_missing && k.offset == s.offset &&
           k.weight_flat_index == s.weight_flat_index && k.pts.h == s.pts.h && k.res == s.res &&
           k.h_round_x == s.h_round_x && k.dx == s.dx && k.rows_limit == s.rows_limit && k.block == s.block;
  }

  // Residual blocks (reference/README.md, "Residual blocks"): L layers over rows of D, FFN
  // F(v) = W2 act(W1 v + b1) + b2, each layer's output but the last rounded to dtype_x. Backward
  // is the gradient of the dialect's forward function (the intermediate roundings acting as the
  // identity, as in the reference and autograd), each norm's backward the usual
  // rstd (g - mean(g) - x-hat mean(g x-hat)) with the dialect's statistics.
  Predictions run_block(const Knobs& k, const Layout& lay) const {
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

  const ref::Case& c_;
  ref::Geometry g_;
  const ref::Tensor *x_ = nullptr, *w_ = nullptr, *b_ = nullptr, *r_ = nullptr, *rb_ = nullptr,
                    *dy_ = nullptr;
};

// ---- scoring ---------------------------------------------------------------------------------

// Columns of a backward case's cheap column-sum bound (worst_spec_columns).
constexpr std::size_t kBoundColumns = 16;

// Predictions closer than this many allowances everywhere cannot be told apart by the outputs.
constexpr double kSameWithin = 0.5;

struct Score {
  double score = 0;
  std::int64_t beyond = 0;  // elements beyond their allowance (ranks dialects of equal score)
  bool distinct = false;    // some element tells the dialect from the spec (see distinguishable)
  std::int64_t unpredicted = 0;  // elements the dialect makes no prediction for (not scored)
  std::string worst_output;
  std::int64_t worst_index = -1;
};

// The prediction for element i: the certified value where the dialect agrees with the engine's
// spec, the certified value plus the fault's effect where both are finite, the dialect's own
// value otherwise.
double predicted(double dialect, double spec, double exact, bool wide) {
  if (std::bit_cast<std::uint64_t>(dialect) == std::bit_cast<std::uint64_t>(spec) ||
      (std::isnan(dialect) && std::isnan(spec)))
    return exact;
  if (std::isfinite(dialect) && std::isfinite(spec) && std::isfinite(exact)) {
    // Summed in binary64 the prediction errs by half a binary64 ulp, far below the allowance of
    // any narrower output; float64 outputs (`wide`) take the long double sum.
    if (!wide) return exact + (dialect - spec);
    return static_cast<double>(static_cast<Wide>(exact) +
                               (static_cast<Wide>(dialect) - static_cast<Wide>(spec)));
  }
  return dialect;
}

bool scorable(const ref::Output& exp, const Outputs& got, const std::string& name,
              const std::map<std::string, OutputAllowance>& allow) {
  const auto it = got.find(name);
  const auto at = allow.find(name);
  return it != got.end() && at != allow.end() && it->second.shape == exp.value.shape &&
         it->second.dtype == exp.value.dtype && it->second.data.size() == exp.value.data.size() &&
         at->second.abs.size() == exp.value.data.size();
}

// The error the checker measures; `expected` (the prediction rounded to the output dtype) only
// matters to element_error where it is NaN or infinite, so finite in-range predictions skip the
// rounding.
double error_against(double got, double p, DType t) {
  if (std::isfinite(got) && std::isfinite(p)) return std::fabs(got - p);  // element_error then is this
  const double expected = std::isfinite(p) && std::fabs(p) <= ref::max_finite(t) ? p : ref::round_to(p, t);
  return element_error(got, p, expected, t);
}

// The checker's allowance of element i (NaN: mistrusted), one ulp more where the reference's
// rounding is undecided.
double a_abs(const OutputAllowance& a, const ref::Output& exp, std::size_t i, DType t) {
  double allowance = a.abs[i];
  if (!std::isnan(allowance) && !exp.certified[i]) allowance += ulp_of(exp.f64[i], t);
  return allowance;
}

// Largest error / allowance of a dialect's predictions over the elements of `lay` (dialect ==
// nullptr: the certified values over every element).
// The score of one output, and the running maximum it is merged into (see score_of).
struct OutputScore {
  Score s;
  double worst = -1;  // the largest ratio seen (-1: no scored element)
};
// Per output, the spec's own contribution over a layout: an output a dialect predicts exactly as
// the engine's spec (bit for bit) scores exactly this, and is not scored again.
using SpecScores = std::map<std::string, OutputScore>;

Score score_of(const fix::FixtureCase& fc, const Outputs& got,
               const std::map<std::string, OutputAllowance>& allow, const Layout* lay,
               const Predictions* dialect, const Predictions* spec, SpecScores* same_as_spec = nullptr,
               const std::string& only = {}, bool need_distinct = true) {
  OutputScore total;
  auto see = [](OutputScore& acc, double ratio, const std::string& name, std::size_t i) {
    if (ratio > 1) ++acc.s.beyond;
    if (ratio > acc.worst) {
      acc.worst = ratio;
      acc.s.score = ratio;
      acc.s.worst_output = name;
      acc.s.worst_index = static_cast<std::int64_t>(i);
    }
  };
  auto merge = [&](const OutputScore& o) {
    total.s.beyond += o.s.beyond;
    total.s.unpredicted += o.s.unpredicted;
    total.s.distinct = total.s.distinct || o.s.distinct;
    if (o.worst > total.worst) {
      total.worst = o.worst;
      total.s.score = o.s.score;
      total.s.worst_output = o.s.worst_output;
      total.s.worst_index = o.s.worst_index;
    }
  };
  for (const auto& [name, exp] : fc.expected) {
    if (!only.empty() && name != only) continue;
    if (!scorable(exp, got, name, allow)) continue;
    const auto& gv = got.at(name).data;
    const auto& a = allow.at(name);
    const DType t = exp.value.dtype;
    auto ratio_at = [&](std::size_t i, double p) {
      const double allowance = a_abs(a, exp, i, t);
      if (std::isnan(allowance)) return -1.0;
      const double g = gv[i];
      const double err = std::isnan(g) && a.nan_ok[i] ? 0.0 : error_against(g, p, t);
      return err == 0 ? 0.0 : (allowance > 0 ? err / allowance : kInf);
    };
    OutputScore acc;
    if (!dialect) {
      for (std::size_t i = 0; i < gv.size(); ++i) see(acc, ratio_at(i, exp.f64[i]), name, i);
      merge(acc);
      continue;
    }
    const auto fi = lay->flat.find(name);
    const auto di = dialect->find(name), si = spec->find(name);
    if (fi == lay->flat.end() || di == dialect->end() || si == spec->end()) continue;
    const auto& flat = fi->second;
    const auto sl = dialect->slack.find(name);
    const auto gr = dialect->grid.find(name);
    const bool identical = same_as_spec && sl == dialect->slack.end() && gr == dialect->grid.end() &&
                           di->second.size() == si->second.size() &&
                           std::memcmp(di->second.data(), si->second.data(), di->second.size() * sizeof(double)) == 0;
    if (identical) {
      const auto it = same_as_spec->find(name);
      if (it != same_as_spec->end()) {
        merge(it->second);
        continue;
      }
    }
    if (gr != dialect->grid.end()) acc.s.distinct = true;  // an interval prediction
    for (std::size_t ci = 0; ci < flat.size(); ++ci) {
      const std::size_t i = flat[ci];
      const double p = predicted(di->second[ci], si->second[ci], exp.f64[i], t == DType::float64);
      const bool has_slack = sl != dialect->slack.end();
      if (has_slack && gr == dialect->grid.end() && std::isinf(sl->second[ci])) {  // no prediction
        ++acc.s.unpredicted;
        continue;
      }
      if (need_distinct && !(total.s.distinct || acc.s.distinct) &&
          !(std::fabs(p - exp.f64[i]) <= kSameWithin * a.abs[i]) &&
          !std::isnan(a.abs[i])) {
        const double rp = ref::round_to(p, t), re = ref::round_to(exp.f64[i], t);
        acc.s.distinct = !(rp == re || (std::isnan(rp) && std::isnan(re)));
      }
      if (has_slack && gr != dialect->grid.end() && std::isfinite(gv[i])) {
        // An interval prediction: the values of the grid within the slack of p. The error is
        // the distance from got to that set: at least its distance to the grid.
        const double al = a_abs(a, exp, i, t);
        if (std::isnan(al)) continue;
        const double off_grid = std::fabs(gv[i] - ref::round_to(gv[i], gr->second));
        const double err = std::max({0.0, std::fabs(gv[i] - p) - sl->second[ci], off_grid});
        see(acc, err == 0 ? 0.0 : (al > 0 ? err / al : kInf), name, i);
        continue;
      }
      see(acc, ratio_at(i, p), name, i);
    }
    if (identical) same_as_spec->emplace(name, acc);
    merge(acc);
  }
  return total.s;
}

// Largest error / allowance of the certified values per row (per-element and per-row outputs):
// the rows where the candidate departs most from the spec, where faults show.
std::vector<double> spec_row_ratios(const fix::FixtureCase& fc, const Outputs& got,
                                    const std::map<std::string, OutputAllowance>& allow,
                                    const ref::Geometry& g, const Layout& all, double* spec_max,
                                    double* spec_others = nullptr) {
  std::vector<double> r(static_cast<std::size_t>(g.rows), 0.0);
  double others = 0;  // outputs not per row (column sums): their largest ratio
  for (const auto& [name, exp] : fc.expected) {
    if (!scorable(exp, got, name, allow)) continue;
    const auto fi = all.flat.find(name);
    const std::size_t cols_all = static_cast<std::size_t>(g.cols);
    const bool per_row = fi != all.flat.end() && fi->second.size() == r.size() && (name == "mean" || name == "rstd");
    if (fi == all.flat.end() || (!per_row && fi->second.size() != r.size() * cols_all)) {
      others = std::max(others, score_of(fc, got, allow, nullptr, nullptr, nullptr, nullptr, name).score);
      continue;
    }
    const auto& flat = fi->second;
    const std::size_t cols = per_row ? 1 : cols_all;
    const auto& gv = got.at(name).data;
    const auto& a = allow.at(name);
    for (std::size_t ci = 0; ci < flat.size(); ++ci) {
      const std::size_t i = flat[ci];
      const double al = a_abs(a, exp, i, exp.value.dtype);
      if (std::isnan(al)) continue;
      const double g0 = gv[i];
      const double err = std::isnan(g0) && a.nan_ok[i] ? 0.0 : error_against(g0, exp.f64[i], exp.value.dtype);
      const double ratio = err == 0 ? 0.0 : (al > 0 ? err / al : kInf);
      double& row = r[ci / cols];
      row = std::max(row, ratio);
    }
  }
  if (spec_others) *spec_others = others;
  if (spec_max) {
    *spec_max = others;
    for (double v : r) *spec_max = std::max(*spec_max, v);
  }
  return r;
}

// The `k` columns where the certified dweight and dbias depart most from the candidate's (in
// allowances; ascending order), or none when there are not more than 2k columns: the columns a
// cheap bound of a backward dialect's column sums looks at first.
std::vector<std::int64_t> worst_spec_columns(const fix::FixtureCase& fc, const Outputs& got,
                                             const std::map<std::string, OutputAllowance>& allow,
                                             std::int64_t cols, std::size_t k) {
  if (static_cast<std::size_t>(cols) <= 2 * k) return {};
  std::vector<double> r(static_cast<std::size_t>(cols), 0.0);
  for (const char* name : {"dweight", "dbias"}) {
    const auto e = fc.expected.find(name);
    if (e == fc.expected.end() || !scorable(e->second, got, name, allow)) continue;
    const auto& exp = e->second;
    if (exp.value.data.size() != r.size()) return {};
    const auto& gv = got.at(name).data;
    const auto& a = allow.at(name);
    for (std::size_t i = 0; i < r.size(); ++i) {
      const double al = a_abs(a, exp, i, exp.value.dtype);
      if (std::isnan(al)) continue;
      const double err =
          std::isnan(gv[i]) && a.nan_ok[i] ? 0.0 : error_against(gv[i], exp.f64[i], exp.value.dtype);
      r[i] = std::max(r[i], err == 0 ? 0.0 : (al > 0 ? err / al : kInf));
    }
  }
  std::vector<std::int64_t> order(r.size());
  for (std::size_t i = 0; i < r.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](std::int64_t x, std::int64_t y) { return r[x] > r[y] || (r[x] == r[y] && x < y); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

// Whether some element of `lay` tells predictions a and b apart (b == nullptr: the certified
// values): they differ by more than kSameWithin allowance and round to different values of the output's
// dtype. A fault whose values round like the spec's (a rounding point to the output dtype just
// before the output's own rounding) cannot be seen in the outputs.
// Whether two scores are those of identical predictions could be (a cheap test before hashing).
bool same_score(const Score& a, const Score& b) {
  const bool nan_a = std::isnan(a.score), nan_b = std::isnan(b.score);
  return (a.score == b.score || (nan_a && nan_b)) && a.beyond == b.beyond && a.worst_index == b.worst_index &&
         a.worst_output == b.worst_output && a.distinct == b.distinct;
}

bool distinguishable(const fix::FixtureCase& fc, const Outputs& got,
                     const std::map<std::string, OutputAllowance>& allow, const Layout& lay,
                     const Predictions* a, const Predictions* b, const Predictions& spec) {
  if (a->grid != (b ? b->grid : spec.grid)) return true;  // an interval prediction
  for (const auto& [name, exp] : fc.expected) {
    if (!scorable(exp, got, name, allow)) continue;
    const auto fi = lay.flat.find(name);
    const auto si = spec.find(name);
    const auto ai = a->find(name);
    if (fi == lay.flat.end() || si == spec.end() || ai == a->end()) continue;
    const std::vector<double>* bv = nullptr;
    if (b) {
      const auto bi = b->find(name);
      if (bi == b->end()) continue;
      bv = &bi->second;
    }
    const auto& al = allow.at(name);
    const DType t = exp.value.dtype;
    const auto& flat = fi->second;
    for (std::size_t ci = 0; ci < flat.size(); ++ci) {
      const std::size_t i = flat[ci];
      if (std::isnan(al.abs[i])) continue;
      const double exact = exp.f64[i];
      const double pa = predicted(ai->second[ci], si->second[ci], exact, t == DType::float64);
      const double pb = bv ? predicted((*bv)[ci], si->second[ci], exact, t == DType::float64) : exact;
      if (std::fabs(pa - pb) <= kSameWithin * al.abs[i]) continue;
      const double ra = ref::round_to(pa, t), rb = ref::round_to(pb, t);
      if (ra == rb || (std::isnan(ra) && std::isnan(rb))) continue;
      return true;
    }
  }
  return false;
}

std::uint64_t hash_of(const Predictions& p) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto* m : {&p.values, &p.slack})
    for (const auto& [name, v] : *m) {
      for (char ch : name) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
      for (double d : v) {
        const std::uint64_t b = std::isnan(d) ? 0x7ff8000000000000ull : std::bit_cast<std::uint64_t>(d);
        h = (h ^ b) * 1099511628211ull;
      }
    }
  return h;
}

// ---- the panel -------------------------------------------------------------------------------

// What a dialect builder sees.
struct Ctx {
  const fix::FixtureCase& fc;
  const ref::Case& c;
  const Outputs& got;
  const Knobs& spec;
  const ref::Geometry& g;
  const std::vector<std::int64_t>& rows;  // the rows a fit looks at (all, or the sample)
};

// A dialect may come in variants (fitted parameter values): each gives knobs and parameters.
struct Variant {
  Knobs k;
  std::map<std::string, double> parameters;
};

struct Dialect {
  DialectInfo info;
  std::function<std::vector<Variant>(const Ctx&)> variants;
};

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

const std::vector<Dialect>& panel() {
  using K = Knobs;
  static const std::vector<Dialect> table = [] {
    std::vector<Dialect> v;
    auto add = [&](const char* name, const char* cls, const char* title,
                   std::function<std::vector<Variant>(const Ctx&)> f) {
      v.push_back(Dialect{{name, cls, title}, std::move(f)});
    };
    // A. Epsilon
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
    // B. Variance and reductions
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
    // C. Axis and shape
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
    // D. Mixed precision
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
    // E. Residual and placement
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
    // F. Parameters (checkpoint conventions)
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
    // E. Placement in residual blocks
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
    // G. Backward and launch limits
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
    return v;
  }();
  return table;
}

std::string contract_name(std::size_t i) { return ref::builtin_contracts()[i].name; }

std::string point_name(int p) {
  static const char* n[] = {"h", "xhat", "scale", "mul"};
  return n[p];
}

std::string short_number(double v) {
  if (std::isinf(v)) return "inf";
  if (std::isnan(v)) return "nan";
  return fmt::format("{:.3g}", v);
}

}  // namespace

const std::vector<DialectInfo>& dialect_panel() {
  static const std::vector<DialectInfo> v = [] {
    std::vector<DialectInfo> out;
    for (const auto& d : panel()) out.push_back(d.info);
    return out;
  }();
  return v;
}

double spec_score(const fix::FixtureCase& fc, const Outputs& got,
                  const std::map<std::string, OutputAllowance>& allow) {
  return score_of(fc, got, allow, nullptr, nullptr, nullptr).score;
}

std::vector<Diagnosis> diagnose(const fix::FixtureCase& fc, const Outputs& got, const DiagnoseOptions& opt) {
  return diagnose(fc, got, derive_allowances(fc.c), opt);
}

namespace {

// The panel with the engine computing in Real. double: the model's own rounding errors are
// those of a correct binary64 kernel, within the allowance even of a float64 case, and mostly
// cancel in the prediction (certified value + dialect - model's spec), where dialect and spec
// share every operation but the fault's. (Measured on the ci tier, long double ranked no better
// and took 1.2x the time.)
template <class Real>
std::vector<Diagnosis> diagnose_as(const fix::FixtureCase& fc, const Outputs& got,
                                   const std::map<std::string, OutputAllowance>& allow,
                                   const DiagnoseOptions& opt) {
  const ref::Case& c = fc.c;
  std::optional<Engine<Real>> engine;
  try {
    engine.emplace(c);
  } catch (const std::exception&) {
    return {};
  }
  const Knobs spec = engine->spec();
  const ref::Geometry& g = engine->geometry();
  // Large forward cases are ranked on a sample of rows (the rows where the candidate departs
  // most from the spec, and rows spread over the case); the best are then scored on every row.
  const Layout all = engine->layout(nullptr);
  Layout sample;  // the screened rows, where the case is screened
  double s_spec = 0;
  double s_spec_columns = kInf;  // the spec's score on the outputs not per row (column sums)
  std::optional<Predictions> full_spec;  // the spec on every row, when a sample is scored
  const std::size_t numel = input(c, "x")->data.size();
  // The sample: the rows where the outputs depart most from the spec (at most sample_rows, and
  // at most an eighth of the rows, at least one) and as many spread over the case when it has
  // 16 rows or more.
  const auto R = static_cast<std::size_t>(g.rows);
  const std::size_t worst = std::min(opt.sample_rows, std::max<std::size_t>(1, R / 8));
  const std::size_t spread = R >= 16 ? worst : 0;
  // Backward: the column sums (and a block's parameter gradients), where the reduction faults
  // show, are predicted on a sample only for dialects that change nothing else (scored exactly,
  // every row); for the others the sample score (dx of the sampled rows) is still a lower bound.
  // Blocks are screened on a sample at any size: every dialect is a run of the FFNs.
  if ((numel > opt.sample_above || c.block != ref::Block::none) && worst + spread < R) {
    const auto ratios = spec_row_ratios(fc, got, allow, g, all, &s_spec, &s_spec_columns);
    if (c.direction == ref::Direction::backward) full_spec = engine->prime_columns(spec, all);
    std::vector<std::int64_t> order(R);
    for (std::size_t r = 0; r < R; ++r) order[r] = static_cast<std::int64_t>(r);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(worst), order.end(),
                      [&](std::int64_t x, std::int64_t y) { return ratios[x] > ratios[y]; });
    std::vector<std::int64_t> rows(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(worst));
    for (std::size_t i = 0; i < spread; ++i)
      rows.push_back(static_cast<std::int64_t>(i * (R - 1) / std::max<std::size_t>(1, spread - 1)));
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    sample = engine->layout(&rows);
  } else {
    s_spec = spec_score(fc, got, allow);
  }
  // Fits (eps_other_value) look at the screened rows: the rows where the candidate departs most
  // from the spec, where a wrong eps shows (on a sample, a fit from every row would cost more
  // than the rest of the screen).
  const Layout& lay = sample.rows.empty() ? all : sample;
  const Ctx ctx{fc, c, got, spec, g, lay.rows};
  const bool sampled = !lay.all_rows;
  const Predictions spec_pred = engine->run(spec, lay);
  // Whether the outputs tell a dialect from the spec: its predictions differ from the spec's by
  // more than the outputs resolve somewhere (Score::distinct), or it explains the outputs (score
  // <= 1) where the spec does not. The latter is a fault whose effect is below half an allowance
  // everywhere (N - 1 for N = 768 moves a bfloat16 dx by a fraction of its ulp) that still
  // brings the elements the spec fails on within their allowance: the spec is rejected and the
  // dialect accepted by the same outputs.
  // A dialect that makes no prediction for some elements (there the spec may be the one failing)
  // is not told apart this way.
  auto explains_alone = [&](const Score& sc) {
    return !(std::isnan(sc.score) || sc.score > 1) && s_spec > 1 && sc.unpredicted == 0;
  };
  auto told_apart = [&](const Score& sc) { return sc.distinct || explains_alone(sc); };
  // The spec's own score per output, on the sample and on every row (sampled cases: against the
  // full spec), for outputs a dialect does not change.
  SpecScores same_lay, same_all;

  struct Entry {
    Diagnosis d;
    Knobs k;
    std::size_t panel_index = 0;
    std::optional<std::uint64_t> hash;  // of the predictions on `lay`; computed where scores tie
    bool full = true;   // scored on every row (else a lower bound from the sample)
    bool gone = false;  // scored on every row and indistinguishable from the spec there
    Score score;
    std::optional<Predictions> pred;  // on every row, where entries are compared
    std::optional<Predictions> spred;  // on the sample (sampled cases)
    bool columns_bound = false;  // backward: the score includes the column sums on every row
    bool subset_bound = false;   // backward: it includes those of the worst_spec_columns
  };
  std::vector<Entry> all_entries;
  auto name_entry = [&](const Dialect& d, const Variant& var) {
    Diagnosis r;
    r.dialect = d.info.name;
    r.fault_class = d.info.fault_class;
    r.title = d.info.title;
    r.parameters = var.parameters;
    // Variants named by what they change.
    if (r.dialect == "contract_point_skipped") {
      const int pt = static_cast<int>(var.parameters.at("point"));
      r.title = fmt::format("the contract's {} rounding skipped", point_name(pt));
      r.parameters.clear();
    } else if (r.dialect == "other_contract") {
      const auto ci = static_cast<std::size_t>(var.parameters.at("contract"));
      r.title = fmt::format("contract '{}' instead of '{}'", contract_name(ci), c.contract);
      r.parameters.clear();
    } else if (r.dialect == "rstd_rounded_bf16" || r.dialect == "rstd_rounded_fp16") {
      r.parameters.clear();
    }
    return r;
  };
  const auto& dialects = panel();
  for (std::size_t di = 0; di < dialects.size(); ++di) {
    const auto& d = dialects[di];
    std::vector<Variant> vars;
    try {
      vars = d.variants(ctx);
    } catch (const std::exception&) {
      continue;
    }
    std::optional<Entry> best;
    std::vector<const Knobs*> run_already;  // this dialect's variants evaluated so far
    for (const auto& var : vars) {
      if (engine->same_semantics(var.k, spec)) continue;  // the spec itself on this case
      // A variant that reads like an earlier one on this case (rstd_rounded_*'s two rstd outputs
      // in backward, contracts that differ only in forward rounding points) predicts the same
      // values: it scores the same and cannot be better.
      if (std::any_of(run_already.begin(), run_already.end(),
                      [&](const Knobs* k) { return engine->same_semantics(var.k, *k) && var.k.unwritten == k->unwritten; }))
        continue;
      run_already.push_back(&var.k);
      Predictions p;
      try {
        p = engine->run(var.k, lay);
      } catch (const std::exception&) {
        continue;
      }
      std::optional<std::uint64_t> h;
      Score sc;
      bool full = !sampled;
      std::optional<Predictions> spred;
      if (sampled && full_spec && engine->reduction_only(var.k)) {
        spred = p;
        // Backward, a dialect of the column reductions only: its dx is the spec's on every row
        // and its column sums are over every row already, so it is scored exactly on every row.
        Predictions pf = *full_spec;
        for (const auto& [name, v] : p.values)
          if (name == "dweight" || name == "dbias" || name == "dresidual_bias") pf.values[name] = v;
        pf.slack = p.slack;
        pf.grid = p.grid;
        p = std::move(pf);
        sc = score_of(fc, got, allow, &all, &p, &*full_spec, &same_all);
        full = true;
      } else {
        // On a sample, whether the dialect differs from the spec is decided on every row.
        sc = score_of(fc, got, allow, &lay, &p, &spec_pred, &same_lay, {}, !sampled);
      }
      // A dialect no output of this case can tell from the spec (the spec itself among them) is
      // not a diagnosis, unless it explains the outputs where the spec does not (told_apart).
      // On a sample that is decided on every row, if it comes to that.
      if (full && !told_apart(sc)) continue;
      if (sampled) {
        // Every variant is a candidate of its own: the best on the sample need not be the best.
        if (!full) spred = std::move(p);
        all_entries.push_back(Entry{name_entry(d, var), var.k, di, std::nullopt, full, false, sc,
                                    full ? std::optional<Predictions>(std::move(p)) : std::nullopt,
                                    std::move(spred)});
        continue;
      }
      if (best && !(sc.score < best->score.score)) continue;
      // Hashes of the predictions are taken only where they are needed: two dialects whose
      // predictions are identical score identically.
      const bool tie = std::any_of(all_entries.begin(), all_entries.end(), [&](const Entry& e) {
        return same_score(e.score, sc);
      });
      if (tie) h = hash_of(p);
      best = Entry{name_entry(d, var), var.k, di, h, true, false, sc, std::nullopt, std::nullopt};
    }
    if (!best) continue;
    auto dup = all_entries.end();
    if (best->hash) {
      for (auto it = all_entries.begin(); it != all_entries.end() && dup == all_entries.end(); ++it) {
        if (!same_score(it->score, best->score)) continue;
        if (!it->hash) it->hash = hash_of(engine->run(it->k, lay));
        if (*it->hash == *best->hash) dup = it;
      }
    }
    if (dup != all_entries.end()) {
      dup->d.same_as.push_back(best->d.dialect);
      continue;
    }
    all_entries.push_back(std::move(*best));
  }
  auto key = [](double v) { return std::isnan(v) ? kInf : v; };
  auto by_score = [&](const Entry& a, const Entry& b) {
    const double sa = key(a.score.score), sb = key(b.score.score);
    return sa != sb ? sa < sb : a.score.beyond < b.score.beyond;
  };
  // Dialects the outputs cannot tell apart (every element within kSameWithin allowance or
  // rounding to the same value) are one diagnosis: the one earlier in the panel names it, the
  // others are listed in same_as. Compared on every row, and remembered.
  if (sampled && !full_spec) full_spec = engine->run(spec, all);
  const Predictions& cmp_spec = sampled ? *full_spec : spec_pred;
  std::map<std::pair<std::size_t, std::size_t>, bool> same_memo;
  auto same_group = [&](std::size_t a, std::size_t b) {
    const auto memo_key = std::minmax(a, b);
    const auto it = same_memo.find(memo_key);
    if (it != same_memo.end()) return it->second;
    Entry& ea = all_entries[a];
    Entry& eb = all_entries[b];
    if (!ea.pred) ea.pred = engine->run(ea.k, all);
    if (!eb.pred) eb.pred = engine->run(eb.k, all);
    const bool same = !distinguishable(fc, got, allow, all, &*ea.pred, &*eb.pred, cmp_spec);
    same_memo[memo_key] = same;
    return same;
  };
  std::map<std::pair<std::size_t, std::size_t>, bool> apart_memo;
  auto apart_on_sample = [&](std::size_t a, std::size_t b) {
    const auto memo_key = std::minmax(a, b);
    const auto it = apart_memo.find(memo_key);
    if (it != apart_memo.end()) return it->second;
    const Entry& ea = all_entries[a];
    const Entry& eb = all_entries[b];
    const bool apart = ea.spred && eb.spred && distinguishable(fc, got, allow, lay, &*ea.spred, &*eb.spred, spec_pred);
    apart_memo[memo_key] = apart;
    return apart;
  };
  // The groups of the best entries in ranking order: each group's first entry (its best
  // score) and its members. Walks the ranking until `keep` groups are formed or an entry scored
  // on a sample only comes first (`blocker`): its score is a lower bound, so every entry after
  // it is worse than it may be, and it must be scored on every row before the walk can pass it.
  struct Group {
    std::size_t first;
    std::vector<std::size_t> members;
  };
  std::vector<std::size_t> order(all_entries.size());
  std::vector<Group> groups;
  std::size_t blocker = 0;
  std::optional<std::vector<std::int64_t>> bound_cols;  // worst_spec_columns, when first needed
  for (;;) {
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return by_score(all_entries[a], all_entries[b]); });
    groups.clear();
    blocker = all_entries.size();
    std::set<std::string> seen;  // dialects in a group already (by their best variant)
    for (std::size_t idx : order) {
      const Entry& e = all_entries[idx];
      if (e.gone || seen.count(e.d.dialect)) continue;
      if (!e.full) {
        // Also scored in full: an entry that may join the best group (within one allowance of
        // its score; see the merge below), so that the best diagnosis names all its aliases.
        // Two entries told apart on the sample are told apart on every row: such an entry cannot.
        // Otherwise it is run on every row and compared with the best first (most are told
        // apart at once); only one that cannot be told apart is scored there.
        const bool may_join_best =
            !groups.empty() && key(e.score.score) <= key(all_entries[groups.front().first].score.score) + 1.0 &&
            !apart_on_sample(groups.front().first, idx) && same_group(groups.front().first, idx);
        if (groups.size() < opt.exact_top || may_join_best) {
          blocker = idx;
          break;
        }
        // Below the exact top: listed with its lower bound, not merged.
        seen.insert(e.d.dialect);
        groups.push_back(Group{idx, {idx}});
        if (groups.size() >= opt.keep) break;
        continue;
      }
      seen.insert(e.d.dialect);
      bool merged = false;
      for (auto& gr : groups) {
        if (!all_entries[gr.first].full) continue;
        const double sg = key(all_entries[gr.first].score.score), se = key(e.score.score);
        if (std::fabs(sg - se) > 1.0 && !(std::isinf(sg) && std::isinf(se))) continue;
        // One that explains the outputs and one that does not are told apart by them.
        if ((sg <= 1) != (se <= 1)) continue;
        if (!same_group(gr.first, idx)) continue;
        gr.members.push_back(idx);
        merged = true;
        break;
      }
      if (!merged) groups.push_back(Group{idx, {idx}});
      if (groups.size() >= opt.keep) break;
    }
    if (blocker == all_entries.size()) break;
    // Score the blocker on every row. Backward, where the spec's column sums fail, its column
    // sums first (a run without dx): the sample score with them is a tighter bound, and often
    // enough to pass it by (where they pass, a dialect's seldom fail by more).
    Entry& e = all_entries[blocker];
    if (c.direction == ref::Direction::backward && c.block == ref::Block::none && !e.columns_bound &&
        !e.pred && s_spec_columns > 1) {
      // First the columns where the spec's sums fail most (a fraction of the work: the row
      // statistics and those columns' terms), then every column.
      if (!bound_cols) bound_cols = worst_spec_columns(fc, got, allow, g.cols, kBoundColumns);
      if (!e.subset_bound && !bound_cols->empty() && engine->subset_bound_ok(e.k)) {
        e.subset_bound = true;
        const Predictions pc = engine->run(e.k, all, true, &*bound_cols);
        const Score cs = score_of(fc, got, allow, &all, &pc, &*full_spec);
        if (key(cs.score) > key(e.score.score)) {
          e.score.score = cs.score;
          e.score.worst_output = cs.worst_output;
          e.score.worst_index = cs.worst_index;
        }
        continue;
      }
      e.columns_bound = true;
      const Predictions pc = engine->run(e.k, all, true);
      const Score cs = score_of(fc, got, allow, &all, &pc, &*full_spec);
      e.score.beyond += cs.beyond;
      if (key(cs.score) > key(e.score.score)) {
        e.score.score = cs.score;
        e.score.worst_output = cs.worst_output;
        e.score.worst_index = cs.worst_index;
      }
      continue;
    }
    if (!e.pred) e.pred = engine->run(e.k, all);
    e.score = score_of(fc, got, allow, &all, &*e.pred, &*full_spec, &same_all);
    e.full = true;
    if (!told_apart(e.score)) {
      e.gone = true;
      e.pred.reset();
    }
  }
  std::vector<Diagnosis> out;
  for (const auto& gr : groups) {
    if (out.size() >= opt.keep) break;
    // Named by the member earliest in the panel; the others in same_as.
    std::size_t name_idx = gr.first;
    for (std::size_t m : gr.members)
      if (all_entries[m].panel_index < all_entries[name_idx].panel_index) name_idx = m;
    Diagnosis r = all_entries[name_idx].d;
    for (std::size_t m : gr.members) {
      if (m == name_idx) continue;
      r.same_as.push_back(all_entries[m].d.dialect);
      const auto& more = all_entries[m].d.same_as;
      r.same_as.insert(r.same_as.end(), more.begin(), more.end());
    }
    const Score& sc = all_entries[gr.first].score;
    const bool full = all_entries[gr.first].full;
    r.score = sc.score;
    r.explains = full && r.score <= 1.0;
    r.evidence =
        full ? fmt::format("max {} tolerance units from this dialect (worst: {}[{}]), {} from the spec",
                           short_number(r.score), sc.worst_output, sc.worst_index, short_number(s_spec))
             : fmt::format(
                   "at least {} tolerance units from this dialect (worst: {}[{}]; over {} of {} rows), {} "
                   "from the spec",
                   short_number(r.score), sc.worst_output, sc.worst_index, lay.rows.size(), g.rows,
                   short_number(s_spec));
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

std::vector<Diagnosis> diagnose(const fix::FixtureCase& fc, const Outputs& got,
                                const std::map<std::string, OutputAllowance>& allow,
                                const DiagnoseOptions& opt) {
  const ref::Case& c = fc.c;
  const auto x = c.inputs.find("x");
  if (x == c.inputs.end() || x->second.data.size() > opt.max_elements) return {};
  // A diagnosis never changes a case's verdict: whatever goes wrong in it gives no diagnosis.
  try {
    return diagnose_as<double>(fc, got, allow, opt);
  } catch (const std::exception&) {
    return {};
  }
}

std::string describe_diagnosis(const std::vector<Diagnosis>& d) {
  if (d.empty())
    return "diagnosis: the panel does not cover this case (no dialect applies, or more "
           "than 2^24 elements)";
  const Diagnosis& b = d.front();
  std::string params;
  for (const auto& [k, v] : b.parameters)
    params += fmt::format("{}{} = {}", params.empty() ? "" : ", ", k, fmt::format("{:.6g}", v));
  if (!params.empty()) params = " (" + params + ")";
  if (!b.explains)
    return fmt::format("diagnosis: no dialect explains the outputs; closest: {} [{}] {}{}: {}", b.dialect,
                       b.fault_class, b.title, params, b.evidence);
  return fmt::format("diagnosis: explained by {} [{}] {}{}: {}", b.dialect, b.fault_class, b.title, params,
                     b.evidence);
}

}  // namespace normcheck::conf
