// The fault model of the diagnosis (../../DIAGNOSIS.md, "How a dialect is scored"): the knobs a
// dialect turns (one semantics each: the spec's by default, one thing changed), the predictions
// a run of the model gives, and the row statistics every dialect computes its own way. The
// engine that runs the model over a case is engine.hpp.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <string>
#include <vector>

#include "normcheck/reference/case.hpp"
#include "normcheck/reference/contract.hpp"
#include "normcheck/reference/dtype.hpp"

namespace normcheck::conf::diag {

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

// An output predicted as an interval per element, fixed by the dialect from the certified values:
// the values of `grid` within half[i] of v[i] + shift[i], v the certified value of element i
// (flat index of the output). y converted to float16 by truncation: the kernel's value before
// the conversion is known only within its error bound, and its truncations lie in such a set
// (panel.cpp, output_truncated_variants).
struct OutputInterval {
  DType grid = DType::float16;
  std::vector<double> shift, half;
};

// Knobs::sum_lanes of numpy's summation order (numpy_sums).
inline constexpr std::int64_t kNumpySums = -2;

// One semantics: the spec's values by default; a dialect changes one thing.
struct Knobs {
  bool centre = true;
  double eps = 0;
  EpsPlace eps_place = EpsPlace::inside;
  bool unbiased = false;
  bool pad_lanes = false;
  StatArith arith = StatArith::exact;
  DType arith_dtype = DType::float32;  // one_pass: every statistics operation; accumulate: the sums
  // one_pass: the order of its two sums. 0: sequential; P > 0: P strided lanes, each summed in
  // order, folded in halves (lane[i] += lane[i + s], s = P/2 .. 1: a GPU shared-memory tree);
  // -1: pairwise (recursive halves of the row); kNumpySums: numpy's pairwise_sum (numpy_sums).
  std::int64_t sum_lanes = 0;
  // one_pass: a variance that cancels below 0 is clamped to 0 (max(var, 0), what most one-pass
  // kernels do before adding eps) instead of going on negative (var + eps < 0: a NaN rstd).
  bool clamp_var = false;
  std::optional<std::vector<std::int64_t>> stat_dims;  // statistics over these dims of x instead
  std::optional<DType> rstd_round;
  bool rstd_out_unrounded = false;  // the rstd output holds the value before rstd_round
  // The mean and rstd saved in this dtype (FlagGems #221: x's half dtype): the mean/rstd outputs
  // and the statistics the backward reads are rounded to it; the forward's y is not.
  std::optional<DType> saved_stats;
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
  std::int64_t colsum_rows = -1;  // dweight/dbias sum only the rows before this one (-1: every row)
  double unwritten = 0;
  BlockMode block = BlockMode::normal;
  // dweight's x-hat rebuilt from y with the weight/bias of the row's lane in a tile of this
  // width (DeepSpeed #692): (x-hat_j scale_j + b_j - b_pos) / scale_pos, pos = (j / T) T + row % T.
  std::int64_t dgamma_tile = 0;
  // y given as an interval per element (forward; Predictions::slack, grid) instead of the value
  // the other knobs compute; shared by the copies of one dialect's knobs.
  std::shared_ptr<const OutputInterval> y_interval;
};

// The knobs row_stats reads (the statistics of one row), to compare as one: a knob added to
// row_stats is added here, and every test of "same statistics" sees it.
inline auto row_stats_knobs(const Knobs& k) {
  return std::tie(k.centre, k.eps, k.eps_place, k.unbiased, k.pad_lanes, k.arith, k.arith_dtype, k.sum_lanes,
                  k.clamp_var, k.rstd_round);
}

// DeepSpeed's TILE_DIM in LayerNormBackward1 (#692).
constexpr std::int64_t kDgammaTile = 32;

// Predicted values per output (in the order of a Layout). A dialect that cannot say the order of
// its roundings predicts an interval instead: the values of dtype `grid` within `slack` of the
// predicted value.
struct Predictions {
  std::map<std::string, std::vector<double>> values;
  std::map<std::string, std::vector<double>> slack;
  std::map<std::string, DType> grid;
  // A one-pass variance (StatArith::one_pass without clamp_var) went below 0 on some row: where
  // none did, the same knobs with clamp_var predict the same values.
  bool var_below_zero = false;
  std::vector<double>& operator[](const std::string& name) { return values[name]; }
  auto find(const std::string& name) const { return values.find(name); }
  auto end() const { return values.end(); }
};

// ref::round_to, inline where it is cheap (the engine rounds every operation of the emulated
// dialects): binary64 is the identity; a conversion to float is binary32's correctly rounded
// value (nearest-even, overflow to inf, subnormals exact: the default floating-point mode);
// bfloat16 and float16 values in their normal range are rounded on the bits as ref::round_to
// does; the rest (subnormal in the target, not finite, 0) goes to ref::round_to.
inline double rnd_narrow(double v, DType t) {
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
// The two common dtypes inlined into the engine's loops, the 16-bit ones a call.
[[gnu::always_inline]] inline double rnd(double v, DType t) {
  if (t == DType::float64) return v;
  if (t == DType::float32) return static_cast<double>(static_cast<float>(v));
  return rnd_narrow(v, t);
}

inline const ref::Tensor* input(const ref::Case& c, const char* name) {
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

// The sums of h and of h^2 over [lo, hi), every operation rounded to t, in order.
template <class Real>
void seq_sums(const Real* h, std::int64_t lo, std::int64_t hi, std::int64_t step, DType t, double& s1, double& s2) {
  s1 = 0, s2 = 0;
  for (std::int64_t i = lo; i < hi; i += step) {
    const double hv = rnd(h[i], t);
    s1 = rnd(s1 + hv, t);
    s2 = rnd(s2 + rnd(hv * hv, t), t);
  }
}

// The same sums by recursive halves of [lo, hi) (pairwise summation).
template <class Real>
void pairwise_sums(const Real* h, std::int64_t lo, std::int64_t hi, DType t, double& s1, double& s2) {
  if (hi - lo <= 1) return seq_sums(h, lo, hi, 1, t, s1, s2);
  const std::int64_t mid = lo + (hi - lo) / 2;
  double a1, a2, b1, b2;
  pairwise_sums(h, lo, mid, t, a1, a2);
  pairwise_sums(h, mid, hi, t, b1, b2);
  s1 = rnd(a1 + b1, t);
  s2 = rnd(a2 + b2, t);
}

// The same sums in numpy's order (np.add.reduce over a contiguous row: pairwise_sum in
// numpy/core/src/umath/loops_utils.h): fewer than 8 terms in order; up to 128 as 8 strided
// partial sums combined ((0+1)+(2+3))+((4+5)+(6+7)), the last n % 8 terms added after in order;
// more as two halves, the first of n/2 rounded down to a multiple of 8.
template <class Real>
void numpy_sums(const Real* h, std::int64_t lo, std::int64_t n, DType t, double& s1, double& s2) {
  if (n < 8) return seq_sums(h, lo, lo + n, 1, t, s1, s2);
  if (n <= 128) {
    double r1[8], r2[8];
    for (int j = 0; j < 8; ++j) {
      const double hv = rnd(h[lo + j], t);
      r1[j] = hv, r2[j] = rnd(hv * hv, t);
    }
    std::int64_t i = 8;
    for (; i < n - n % 8; i += 8)
      for (int j = 0; j < 8; ++j) {
        const double hv = rnd(h[lo + i + j], t);
        r1[j] = rnd(r1[j] + hv, t), r2[j] = rnd(r2[j] + rnd(hv * hv, t), t);
      }
    auto tree = [t](const double* r) {
      return rnd(rnd(rnd(r[0] + r[1], t) + rnd(r[2] + r[3], t), t) + rnd(rnd(r[4] + r[5], t) + rnd(r[6] + r[7], t), t), t);
    };
    s1 = tree(r1), s2 = tree(r2);
    for (; i < n; ++i) {
      const double hv = rnd(h[lo + i], t);
      s1 = rnd(s1 + hv, t), s2 = rnd(s2 + rnd(hv * hv, t), t);
    }
    return;
  }
  std::int64_t n2 = n / 2;
  n2 -= n2 % 8;
  double a1, a2, b1, b2;
  numpy_sums(h, lo, n2, t, a1, a2);
  numpy_sums(h, lo + n2, n - n2, t, b1, b2);
  s1 = rnd(a1 + b1, t), s2 = rnd(a2 + b2, t);
}

// A one-pass kernel's sums of h and h^2 in the order `lanes` names (Knobs::sum_lanes).
template <class Real>
void one_pass_sums(const Real* h, std::int64_t n, std::int64_t lanes, DType t, double& s1, double& s2) {
  if (lanes == 0) return seq_sums(h, 0, n, 1, t, s1, s2);
  if (lanes == kNumpySums) return numpy_sums(h, 0, n, t, s1, s2);
  if (lanes < 0) return pairwise_sums(h, 0, n, t, s1, s2);
  std::vector<double> a(static_cast<std::size_t>(lanes)), b(static_cast<std::size_t>(lanes));
  for (std::int64_t l = 0; l < lanes; ++l) seq_sums(h, l, n, lanes, t, a[l], b[l]);
  for (std::int64_t s = lanes / 2; s > 0; s /= 2)
    for (std::int64_t i = 0; i < s; ++i) a[i] = rnd(a[i] + a[i + s], t), b[i] = rnd(b[i] + b[i + s], t);
  s1 = a[0], s2 = b[0];
}

// Mean, variance (the biased one, or the dialect's) and rstd of h[0..n).
template <class Real>
RowStatT<Real> row_stats(const Real* h, std::int64_t n, const Knobs& k, DType compute) {
  using LD = Real;
  using RowStat = RowStatT<Real>;
  RowStat s;
  const LD N = static_cast<LD>(n);
  if (k.arith == StatArith::one_pass && k.centre) {
    // E[h^2] - E[h]^2 with every operation rounded to arith_dtype, the sums in k.sum_lanes' order.
    const DType t = k.arith_dtype;
    double s1 = 0, s2 = 0;
    one_pass_sums(h, n, k.sum_lanes, t, s1, s2);
    const double m = rnd(s1 / N, t);
    double var = rnd(rnd(s2 / N, t) - static_cast<LD>(rnd(static_cast<LD>(m) * m, t)), t);
    if (k.clamp_var && var < 0) var = 0;
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

}  // namespace normcheck::conf::diag
